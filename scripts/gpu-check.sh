#!/usr/bin/env bash
# GPU node check for issue 8, one prepared run:
#   1. builds depthbench-train and the cuda_ops tests against this node's CUDA
#      LibTorch (the PyTorch install's torch.utils.cmake_prefix_path);
#   2. runs the GPU tests (fused ops vs CPU references, raw kernels) and the
#      CPU twins;
#   3. benchmarks training steps of the 400M L=24 pre_ln, hc and attnres_full
#      models (bf16, seq 2048) and prints tokens/s and MFU against the
#      device's dense bf16 peak (PEAK_TFLOPS, default 989: H100/H200 SXM).
#
#   scripts/gpu-check.sh                 # all three steps
#   BATCH=8 STEPS=6 scripts/gpu-check.sh # per-step batch (sequences), steps timed
#   SKIP_BUILD=1 scripts/gpu-check.sh    # reuse BUILD_DIR
#
# Needs: nvcc, a CUDA-enabled PyTorch for python3, cmake, ninja (or make),
# the project's C++ dependencies (scripts/setup.sh lists them), numpy.
# Prints a final summary table; the log of each step is in $LOG_DIR.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${BUILD_DIR:-$root/build-gpu}"
log_dir="${LOG_DIR:-$build_dir/gpu-check-logs}"
jobs="${JOBS:-$(nproc)}"
batch="${BATCH:-8}"
steps="${STEPS:-6}"
seq_len=2048
vocab=50280
peak_tflops="${PEAK_TFLOPS:-989}"
archs=(pre_ln hc attnres_full)

mkdir -p "$log_dir"
log() { echo "gpu-check: $*" >&2; }

if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader |
    sed 's/^/gpu-check: device: /' >&2
else
  log "nvidia-smi not found"
fi

torch_prefix="$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')"
torch_cuda="$(python3 -c 'import torch; print(torch.version.cuda or "")')"
if [[ -z "$torch_cuda" ]]; then
  log "python3's torch has no CUDA: this script needs a CUDA LibTorch"
  exit 2
fi
log "LibTorch at $torch_prefix (CUDA $torch_cuda)"

# ---- 1. build ----
if [[ -z "${SKIP_BUILD:-}" ]]; then
  generator=()
  command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
  cmake -S "$root" -B "$build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$torch_prefix" -DDEPTHBENCH_CUDA=ON \
    -DDEPTHBENCH_CUDA_ARCHS="${CUDA_ARCHS:-90}" -DDEPTHBENCH_BUILD_BENCH=OFF \
    2>&1 | tee "$log_dir/cmake.log" >&2
  grep -q "fused CUDA ops enabled" "$log_dir/cmake.log" ||
    log "WARNING: CMake did not enable the fused ops (see $log_dir/cmake.log)"
  cmake --build "$build_dir" -j "$jobs" --target depthbench-train cuda_ops_fused_test \
    cuda_ops_reference_test cuda_kernels_test 2>&1 | tail -n 20 >&2
fi
train_bin="$build_dir/trainer_core/depthbench-train"

# ---- 2. tests ----
test_status=0
for t in cuda_kernels_test cuda_ops_fused_test cuda_ops_reference_test; do
  bin="$build_dir/tests/cuda_ops/$t"
  if [[ ! -x "$bin" ]]; then
    log "$t: not built"
    test_status=1
    continue
  fi
  if "$bin" >"$log_dir/$t.log" 2>&1; then
    log "$t: passed ($(grep -c '^\[       OK \]' "$log_dir/$t.log") ok, $(grep -c '^\[  SKIPPED \]' "$log_dir/$t.log") skipped)"
  else
    log "$t: FAILED (see $log_dir/$t.log)"
    grep -E '^\[  FAILED  \]|Failure|max abs diff' "$log_dir/$t.log" | head -n 20 >&2 || true
    test_status=1
  fi
done

# ---- 3. benchmark one training step per design ----
# Random tokens (throughput does not depend on the text): a uint16 .npy.
data="$build_dir/bench-tokens.npy"
if [[ ! -f "$data" ]]; then
  python3 - "$data" "$vocab" <<'PY'
import sys
import numpy as np
rng = np.random.default_rng(0)
np.save(sys.argv[1], rng.integers(0, int(sys.argv[2]), size=8_000_000, dtype=np.uint16))
PY
fi

summary=()
for arch in "${archs[@]}"; do
  out="$build_dir/bench-$arch"
  rm -rf "$out"
  flops_json="$("$train_bin" flops --arch "$arch" --layers 24 --d-model 1024 --seq "$seq_len" \
    --vocab "$vocab" --json)"
  fwd_flops_per_seq="$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["total_all_positions"])' "$flops_json")"
  log "$arch: training $steps steps of batch $batch x $seq_len (bf16)"
  if ! "$train_bin" train --arch "$arch" --layers 24 --d-model 1024 --vocab "$vocab" \
      --data "$data" --seq-len "$seq_len" --batch "$batch" --steps "$steps" --lr 2e-3 \
      --device cuda --precision bf16 --eval-batches 1 --out "$out" \
      >"$log_dir/bench-$arch.jsonl" 2>"$log_dir/bench-$arch.stderr"; then
    log "$arch: training FAILED (see $log_dir/bench-$arch.stderr)"
    tail -n 5 "$log_dir/bench-$arch.stderr" >&2 || true
    summary+=("$arch failed")
    continue
  fi
  # Median tokens/s over the steps after the first two (warm-up, autotuning).
  line="$(python3 - "$log_dir/bench-$arch.jsonl" "$fwd_flops_per_seq" "$seq_len" "$peak_tflops" <<'PY'
import json, statistics, sys
path, fwd, seq, peak = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
events = [json.loads(l) for l in open(path) if l.startswith("{")]
start = next(e for e in events if e["event"] == "start")
tps = [e["tokens_per_s"] for e in events if e["event"] == "step"][2:] or [0.0]
tok_s = statistics.median(tps)
train_flops_per_token = 3.0 * fwd / seq          # forward + backward = 3x forward
mfu = tok_s * train_flops_per_token / (peak * 1e12)
print(f"{start['config']['arch']:<13} tokens/s {tok_s:>10.0f}  MFU {100*mfu:5.1f}%  "
      f"fused_ops={start.get('fused_ops')} params={start['params']['total']}")
PY
)"
  log "$line"
  summary+=("$line")
done

echo "== gpu-check summary (peak ${peak_tflops} TFLOP/s bf16, batch $batch x $seq_len) =="
for s in "${summary[@]}"; do echo "$s"; done
if [[ $test_status -ne 0 ]]; then
  echo "GPU tests: FAILED (logs in $log_dir)"
  exit 1
fi
echo "GPU tests: passed (logs in $log_dir)"
