#!/usr/bin/env python3
"""Issue 15: the ceiling on one-survivor successive halving, from the cached
curves of strategies_bench (--cache FILE).

For each eval step s, in how many groups the LR leading at s (top 1), or
either of the two leading (top 2), "agrees" with the grid's final winner:
it is the winner or finishes within 0.01 nats of it (the bench's rule).
A rule that keeps one run per group after a cut at step s cannot agree in
more groups than the top-1 count at s.

    python3 bench/strategies/leader_agreement.py /tmp/strategies_curves.json
"""
import json
import sys

TOL = 0.01


def main(path):
    with open(path) as f:
        cache = json.load(f)
    groups = {}
    steps = set()
    for key, curve in cache.items():
        cfg = json.loads(key)
        groups.setdefault((cfg["arch"], cfg["layers"], cfg["d_model"]), []).append((cfg["lr"], curve))
        steps.update(int(s) for s in curve["val"])
    end = max(steps)
    inf = float("inf")
    print(f"{len(groups)} groups; final step {end}")
    print("step  top1  top2")
    for s in sorted(steps):
        if s >= end:
            continue
        top1 = top2 = 0
        for runs in groups.values():
            final = {lr: (inf if c["diverged"] else c["val"].get(str(end), inf)) for lr, c in runs}
            best = min(final.values())
            at = {lr: c["val"].get(str(s), inf) for lr, c in runs}
            order = sorted(at, key=lambda lr: (at[lr], lr))
            agrees = [final[lr] - best <= TOL for lr in order]
            top1 += agrees[0]
            top2 += any(agrees[:2])
        print(f"{s:4d}  {top1:4d}  {top2:4d}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/strategies_curves.json")
