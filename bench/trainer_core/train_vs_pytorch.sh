#!/usr/bin/env bash
# Issue-2 benchmark: depthbench-train vs the same Pre-LN model in PyTorch
# eager Python (bench/trainer_core/pytorch_peer.py, Debian python3-torch),
# same shape, threads and steps, alternated ROUNDS times in one run. Prints
# the median tokens/s of each and their ratio, and the peak RSS of each
# process (GNU time). A third column runs depthbench-train with glibc's
# dynamic malloc thresholds (DEPTHBENCH_MALLOC=default), to show what
# pinning them (common/malloc_tuning.h) is worth.
#
#   bench/trainer_core/train_vs_pytorch.sh [BUILD_DIR] [ROUNDS]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# Both sides on the same OpenBLAS kernels (scripts/blas_env.sh).
source "$root/scripts/blas_env.sh"
build="${1:-$root/build}"
rounds="${2:-3}"
L=4 D=128 H=4 T=128 B=16 STEPS=30 THREADS=2 SKIP=3
train="$build/trainer_core/depthbench-train"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

cpp_rate() {
  # Median tokens/s over the steps after SKIP, from the JSON step events.
  /usr/bin/python3 -c '
import json, statistics, sys
skip = int(sys.argv[1])
rates = [e["tokens_per_s"] for e in map(json.loads, sys.stdin) if e.get("event") == "step" and e["step"] > skip]
print(statistics.median(rates))' "$SKIP"
}

declare -a cpp py cpp_mem py_mem dflt
for r in $(seq 1 "$rounds"); do
  rm -rf "$tmp/run"
  DEPTHBENCH_MALLOC=default "$train" train --arch pre_ln --layers $L --d-model $D --heads $H \
    --seq-len $T --batch $B --steps $STEPS --lr 1e-3 --threads $THREADS --eval-batches 1 \
    --out "$tmp/run" 2>/dev/null >"$tmp/dflt.jsonl"
  dflt+=("$(cpp_rate <"$tmp/dflt.jsonl")")
  rm -rf "$tmp/run"
  /usr/bin/time -f "%M" -o "$tmp/cpp_mem" "$train" train --arch pre_ln --layers $L --d-model $D --heads $H \
    --seq-len $T --batch $B --steps $STEPS --lr 1e-3 --threads $THREADS --eval-batches 1 \
    --out "$tmp/run" 2>/dev/null >"$tmp/cpp.jsonl"
  cpp+=("$(cpp_rate <"$tmp/cpp.jsonl")")
  cpp_mem+=("$(cat "$tmp/cpp_mem")")
  /usr/bin/time -f "%M" -o "$tmp/py_mem" /usr/bin/python3 "$root/bench/trainer_core/pytorch_peer.py" \
    --layers $L --d-model $D --heads $H --seq-len $T --batch $B --steps $STEPS --threads $THREADS \
    --skip $SKIP >"$tmp/py.json"
  py+=("$(/usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["median_tokens_per_s"])' <"$tmp/py.json")")
  py_mem+=("$(cat "$tmp/py_mem")")
  echo "round $r: depthbench-train ${cpp[-1]} tok/s (peak RSS ${cpp_mem[-1]} KiB), pytorch ${py[-1]} tok/s (peak RSS ${py_mem[-1]} KiB), depthbench-train with glibc-default malloc ${dflt[-1]} tok/s"
done
/usr/bin/python3 - "${cpp[*]}" "${py[*]}" "${cpp_mem[*]}" "${py_mem[*]}" "${dflt[*]}" <<'PY'
import statistics, sys
cpp, py, cm, pm, df = (list(map(float, a.split())) for a in sys.argv[1:6])
c, p = statistics.median(cpp), statistics.median(py)
print(f"median tokens/s: depthbench-train {c:.0f}, pytorch eager {p:.0f}, ratio {c/p:.2f}x (goal >= 1.2x)")
print(f"depthbench-train with glibc-default malloc: {statistics.median(df):.0f} tokens/s, ratio {statistics.median(df)/p:.2f}x")
print(f"median peak RSS: depthbench-train {statistics.median(cm)/1024:.0f} MiB, pytorch {statistics.median(pm)/1024:.0f} MiB")
PY
