#!/usr/bin/env python3
# A scripted stand-in for depthbench-train in the web view's end-to-end test
# (web_view_e2e_test.cc): it speaks the JSON-line events of
# trainer_core/README.md with outcomes chosen by the job's config, so the
# pages show every case quickly and deterministically on a 2-core machine:
#   pre_ln, L=2, lr 3e-3   trains slowly (50 steps, 0.3 s each): its loss
#                          curve grows while the browser watches
#   hc, lr 1e-2            diverges (exit code 3)
#   hc, L=4, lr 3e-3       crashes on its first attempt, succeeds on the next
#   anything else          8 quick steps, then succeeds
#   diagnose               angular / causal / permutation / deff results
# The validation loss depends on the shape and LR, so each group has a best LR.
import json
import math
import os
import sys
import time


def emit(**event):
    print(json.dumps(event), flush=True)


def main():
    args = sys.argv[1:]
    mode = args[0]
    with open(args[args.index("--config") + 1]) as f:
        cfg = json.load(f)
    out = args[args.index("--out") + 1]
    layers = int(cfg.get("layers", 2))
    if mode == "diagnose":
        emit(event="start", step=0)
        n = layers + 1
        angular = [[abs(i - j) / n for j in range(n)] for i in range(n)]
        causal = [[(0.8 - 0.1 * (l - s) if l > s else None) for l in range(layers)]
                  for s in range(layers)]
        perm = [[abs(a - b) * 0.05 for b in range(layers)] for a in range(layers)]
        emit(event="diagnostics", kind="angular", data={"matrix": angular})
        emit(event="diagnostics", kind="causal",
             data={"matrix": causal, "r_causal": 0.5, "form": "per_token"})
        emit(event="diagnostics", kind="permutation",
             data={"matrix": perm, "r_perm": 0.25, "base_loss": 2.0})
        emit(event="diagnostics", kind="deff",
             data={"deff_over_l": 0.75, "num_sequences": 256})
        emit(event="done", step=0, status="succeeded")
        return 0

    arch = cfg.get("arch", "")
    lr = float(cfg.get("lr", 0.0))
    slow = arch == "pre_ln" and layers == 2 and abs(lr - 3e-3) < 1e-9
    diverge = arch == "hc" and abs(lr - 1e-2) < 1e-9
    crash_once = arch == "hc" and layers == 4 and abs(lr - 3e-3) < 1e-9
    steps, pause = (50, 0.3) if slow else (8, 0.05)
    # Designs differ a little, so Figure 2 shows one line per design.
    final = (2.0 + 0.03 * layers + 0.2 * abs(math.log10(lr) + 2.3) -
             (0.02 * layers if arch == "hc" else 0.0))
    emit(event="start", step=0)
    marker = os.path.join(out, "crashed-once")
    for step in range(1, steps + 1):
        if crash_once and step == 3 and not os.path.exists(marker):
            open(marker, "w").close()
            print("simulated crash: segmentation fault in the data loader", file=sys.stderr,
                  flush=True)
            return 1
        if diverge and step == 5:
            emit(event="step", step=step, loss=None, lr=lr, grad_norm=None, tokens_per_s=1000)
            emit(event="done", step=step, status="diverged", reason="loss is NaN at step 5")
            return 3
        loss = final + 2.5 * math.exp(-step / 6.0)
        emit(event="step", step=step, loss=loss, lr=lr, grad_norm=1.0 / step,
             tokens_per_s=1000)
        time.sleep(pause)
    emit(event="eval", step=steps, val_loss=final)
    emit(event="done", step=steps, status="succeeded", val_loss=final)
    return 0


if __name__ == "__main__":
    sys.exit(main())
