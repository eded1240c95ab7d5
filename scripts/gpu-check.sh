#!/usr/bin/env bash
# GPU node check (issues 8 and 21): one prepared run on a bare CUDA node -- a
# CUDA toolkit, cmake, ninja and a Python with a CUDA PyTorch 2.x, no apt, no
# registry -- building only the trainer against the dependency bundle of
# scripts/gpu-bundle.sh (Abseil, nlohmann-json, CLI11, GoogleTest).
#
#   scripts/gpu-check.sh [OUT]            # on the GPU node
#   scripts/gpu-check.sh --dry-run [OUT]  # here, on Debian, without a GPU
#
# GPU run (budget: under 12 minutes on a 16-core H200 node):
#   1. configures DEPTHBENCH_TRAINER_ONLY=ON in a clean BUILD_DIR against
#      BUNDLE and the PyTorch's LibTorch (torch.utils.cmake_prefix_path), sm_90,
#      NCCL from the nvidia-nccl wheel; builds only the needed targets;
#   2. runs the GPU tests (fused ops vs CPU references, raw kernels, the
#      one-GPU NCCL smoke test) with their CPU twins;
#   3. trains the 400M L=24 pre_ln, hc and attnres_full models (bf16, seq
#      2048): tokens/s and MFU against PEAK_TFLOPS (default 989, H100/H200 SXM
#      dense bf16);
#   4. fused vs composite AttnRes speed-up (fused_vs_composite_bench).
# Every figure goes to OUT/gpu-check-results.txt; logs to OUT/logs/.
#
# Dry run (issue 21's proof, and ctest gpu_check_dry_run): the same configure
# and build in a clean BUILD_DIR against BUNDLE (made with gpu-bundle.sh when
# missing or stale) and Debian's CPU LibTorch, then proves nothing came from
# the system's -dev packages (scripts/gpu_bundle_check.py: a negative control,
# the CMake cache, every header the compilers read per their depfiles, the
# link lines and DT_NEEDED), runs the CPU twins of the GPU tests (the GPU
# tests skip with a message) and a tiny CPU training run and bench.
#
# Environment: BUNDLE (default build/gpu-bundle), BUILD_DIR (default
# build/gpu-dry-run or build-gpu; OUT defaults to BUILD_DIR-out), JOBS (default nproc), BATCH (8), STEPS (6),
# PEAK_TFLOPS (989), CUDA_ARCHS (90), NCCL_ROOT (default: the nvidia-nccl
# wheel's folder), SKIP_BUILD=1 (reuse BUILD_DIR instead of a clean build).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dry_run=0
if [[ "${1:-}" == "--dry-run" ]]; then
  dry_run=1
  shift
fi
if [[ "${1:-}" == -* ]]; then
  echo "usage: scripts/gpu-check.sh [--dry-run] [OUT]" >&2
  exit 2
fi
bundle="${BUNDLE:-$root/build/gpu-bundle}"
if ((dry_run)); then
  build_dir="${BUILD_DIR:-$root/build/gpu-dry-run}"
else
  build_dir="${BUILD_DIR:-$root/build-gpu}"
fi
out="${1:-$build_dir-out}"
jobs="${JOBS:-$(nproc)}"
batch="${BATCH:-8}"
steps="${STEPS:-6}"
peak_tflops="${PEAK_TFLOPS:-989}"
seq_len=2048
vocab=50280
archs=(pre_ln hc attnres_full)
started=$(date +%s)

mkdir -p "$out/logs" "$build_dir"
out="$(cd "$out" && pwd)"
case "$out/" in
  "$(cd "$build_dir" && pwd)/"*) echo "gpu-check: OUT must not be inside BUILD_DIR (it is rebuilt clean)" >&2; exit 2 ;;
esac
results="$out/gpu-check-results.txt"
: >"$results"
log() { echo "gpu-check: $*" >&2; }
record() { echo "$*" >>"$results"; log "$*"; }
die() { record "FAILED: $*"; exit 1; }
elapsed() { echo $(($(date +%s) - started)); }

record "mode: $( ((dry_run)) && echo dry-run || echo gpu )"
record "date: $(date -u +%FT%TZ)  host: ${HOSTNAME:-?}  cores: $(nproc)"
if command -v nvidia-smi >/dev/null 2>&1; then
  record "device: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -n1)"
fi
command -v ninja >/dev/null 2>&1 || die "ninja not found (the header check reads its depfile log)"

# ---- the bundle ----
if ((dry_run)); then
  "$root/scripts/gpu-bundle.sh" "$bundle" >/dev/null
fi
[[ -f "$bundle/BUNDLE.txt" ]] ||
  die "no dependency bundle at $bundle: make it with scripts/gpu-bundle.sh on a Debian 12 machine and copy it here (BUNDLE=...)"
bundle="$(cd "$bundle" && pwd)"
libdir="$(dirname "$(find "$bundle/usr/lib" -name abslConfig.cmake | head -n1)")/.."
record "bundle: $bundle, $(du -sb "$bundle" | cut -f1) bytes ($(sed -n '/^packages:$/,/^$/p' "$bundle/BUNDLE.txt" | grep -c '=') packages)"

# ---- LibTorch ----
cmake_args=()
if ((dry_run)); then
  torch_config="$(find /usr/lib /usr/share -path '*/cmake/Torch/TorchConfig.cmake' 2>/dev/null | head -n1)"
  [[ -n "$torch_config" ]] || die "no Debian LibTorch (libtorch-dev)"
  torch_prefix=""
  cmake_args+=(-DTorch_DIR="$(dirname "$torch_config")")
  record "libtorch: Debian's CPU LibTorch ($(dirname "$torch_config"))"
else
  command -v python3 >/dev/null 2>&1 || die "python3 not found"
  torch_info="$(python3 - <<'PY'
import os, torch
nccl = ""
try:
    import nvidia.nccl
    nccl = list(nvidia.nccl.__path__)[0]
except Exception:
    pass
print(torch.utils.cmake_prefix_path)
print(torch.__version__)
print(torch.version.cuda or "")
print(int(torch._C._GLIBCXX_USE_CXX11_ABI))
print(nccl)
PY
)" || die "python3 cannot import torch"
  mapfile -t info <<<"$torch_info"  # $(...) drops trailing empty lines: index, not read
  torch_prefix="${info[0]:-}" torch_version="${info[1]:-}" torch_cuda="${info[2]:-}"
  torch_abi="${info[3]:-}" wheel_nccl="${info[4]:-}"
  record "libtorch: $torch_prefix (torch $torch_version, CUDA ${torch_cuda:-none}, cxx11 ABI $torch_abi)"
  [[ -n "$torch_cuda" ]] || die "python3's torch has no CUDA: this check needs a CUDA LibTorch"
  # The bundle's static Abseil and GoogleTest use the C++11 std::string ABI;
  # PyTorch wheels before 2.7 were built with the old one and cannot link.
  [[ "$torch_abi" == 1 ]] ||
    die "torch $torch_version uses the pre-C++11 ABI (_GLIBCXX_USE_CXX11_ABI=0); the bundle needs a cxx11-ABI LibTorch (PyTorch >= 2.7 wheels, or the cxx11-abi LibTorch zip)"
  nccl_root="${NCCL_ROOT:-$wheel_nccl}"
  record "nccl: ${nccl_root:-not found (NCCL smoke test will skip)}"
  # LibTorch's CMake wants its arch list too (90 -> 9.0, 100 -> 10.0).
  arch_list=""
  archs_sp="${CUDA_ARCHS:-90}"
  for a in ${archs_sp//;/ }; do arch_list+="${arch_list:+ }${a:0:-1}.${a: -1}"; done
  export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-$arch_list}"
  cmake_args+=(-DDEPTHBENCH_CUDA=ON -DDEPTHBENCH_CUDA_ARCHS="${CUDA_ARCHS:-90}"
               -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-90}")
  [[ -n "$nccl_root" ]] && cmake_args+=(-DNCCL_ROOT="$nccl_root")
fi

# ---- 1. configure + build, only the needed targets ----
targets=(depthbench-train cuda_ops_reference_test cuda_ops_fused_test cuda_ops_cpu_fused_test
         nccl_smoke_test fused_vs_composite_bench)
if [[ -n "${SKIP_BUILD:-}" ]]; then
  record "build: reused $build_dir (SKIP_BUILD: not a clean build)"
else
  rm -rf "$build_dir"
  t0=$(date +%s)
  cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DDEPTHBENCH_TRAINER_ONLY=ON -DDEPTHBENCH_BUILD_TESTS=ON -DDEPTHBENCH_BUILD_BENCH=ON \
    -DDEPTHBENCH_ONEDNN=OFF \
    -DCMAKE_PREFIX_PATH="$bundle/usr${torch_prefix:+;$torch_prefix}" \
    -Dabsl_DIR="$libdir/cmake/absl" -DGTest_DIR="$libdir/cmake/GTest" \
    -Dnlohmann_json_DIR="$bundle/usr/share/cmake/nlohmann_json" \
    -DCLI11_DIR="$bundle/usr/share/cmake/CLI11" \
    -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF \
    "${cmake_args[@]}" >"$out/logs/cmake.log" 2>&1 || {
    tail -n 30 "$out/logs/cmake.log" >&2
    die "cmake configure (log: $out/logs/cmake.log)"
  }
  grep -E '^-- depthbench:' "$out/logs/cmake.log" | sed 's/^-- /cmake: /' >>"$results" || true
  if ! ((dry_run)); then
    grep -q "fused CUDA ops enabled" "$out/logs/cmake.log" ||
      die "CMake did not enable the fused ops (see $out/logs/cmake.log)"
  fi
  if ninja -C "$build_dir" -t targets all 2>/dev/null | grep -q '^cuda_kernels_test:'; then
    targets+=(cuda_kernels_test)
  fi
  cmake --build "$build_dir" -j "$jobs" --target "${targets[@]}" >"$out/logs/build.log" 2>&1 || {
    grep -E 'error|Error' "$out/logs/build.log" | head -n 30 >&2
    die "build (log: $out/logs/build.log)"
  }
  record "build: $(( $(date +%s) - t0 )) s for ${#targets[@]} targets with -j $jobs ($(grep -c '^\[' "$out/logs/build.log") steps)"
fi

# ---- dry run: prove the build used the bundle only ----
check="$root/scripts/gpu_bundle_check.py"
binaries=("$build_dir/trainer_core/depthbench-train" "$build_dir/tests/cuda_ops/cuda_ops_fused_test"
          "$build_dir/tests/cuda_ops/cuda_ops_reference_test" "$build_dir/tests/trainer_core/nccl_smoke_test"
          "$build_dir/bench/cuda_ops/fused_vs_composite_bench")
if ((dry_run)); then
  python3 "$check" selftest "$bundle" 2>&1 | tee -a "$results" >&2 || die "bundle check: selftest"
  python3 "$check" cache "$build_dir" "$bundle" 2>&1 | tee -a "$results" >&2 || die "bundle check: cache"
  python3 "$check" headers "$build_dir" "$bundle" 2>&1 | tee -a "$results" >&2 || die "bundle check: headers"
  python3 "$check" link --torch-dir="$(dirname "$torch_config")" "$build_dir" "$bundle" "${binaries[@]}" 2>&1 | tee -a "$results" >&2 ||
    die "bundle check: link"
fi

# ---- 2. tests ----
test_status=0
for t in cuda_ops_reference_test cuda_ops_cpu_fused_test cuda_ops_fused_test cuda_kernels_test nccl_smoke_test; do
  case "$t" in
    nccl_smoke_test) bin="$build_dir/tests/trainer_core/$t" ;;
    *) bin="$build_dir/tests/cuda_ops/$t" ;;
  esac
  if [[ ! -x "$bin" ]]; then
    [[ "$t" == cuda_kernels_test ]] && { record "test $t: not built (no nvcc)"; continue; }
    record "test $t: NOT BUILT"
    test_status=1
    continue
  fi
  if "$bin" >"$out/logs/$t.log" 2>&1; then
    # Per-test lines end in "(N ms)"; gtest's summary repeats SKIPPED names without.
    ok=$(grep -c '^\[       OK \] .* ([0-9]* ms)$' "$out/logs/$t.log" || true)
    skipped=$(grep -c '^\[  SKIPPED \] .* ([0-9]* ms)$' "$out/logs/$t.log" || true)
    why="$(grep -h -B1 '^\[  SKIPPED \]' "$out/logs/$t.log" | grep -v -e '^\[' -e '^--$' |
           sort | uniq -c | sed 's/^ *//' | paste -sd ';' - || true)"
    record "test $t: passed, $ok ok, $skipped skipped${why:+ ($why)}"
    # Dry run: the fused-op and raw-kernel tests are GPU-only (their CPU twins
    # are cuda_ops_reference_test and cuda_ops_cpu_fused_test) and all skip.
    if ((ok == 0)) && ! { ((dry_run)) && [[ "$t" == cuda_ops_fused_test || "$t" == cuda_kernels_test ]]; }; then
      record "test $t: no test ran"
      test_status=1
    fi
    if ! ((dry_run)) && grep -qE 'no CUDA device visible|fused ops not compiled|no c10d NCCL backend' \
        "$out/logs/$t.log"; then
      record "test $t: GPU tests skipped on a GPU node"
      test_status=1
    fi
  else
    record "test $t: FAILED (log: $out/logs/$t.log)"
    grep -E '^\[  FAILED  \]|Failure|max abs diff' "$out/logs/$t.log" | head -n 20 >&2 || true
    test_status=1
  fi
done

# Random tokens (throughput does not depend on the text): a uint16 .npy made
# with the standard library (a node's Python may lack numpy).
tokens_npy() {
  python3 - "$1" "$2" "$3" <<'PY'
import array, random, sys
path, vocab, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(0)
data = array.array("H", (rng.randrange(vocab) for _ in range(n)))
header = "{'descr': '<u2', 'fortran_order': False, 'shape': (%d,), }" % n
header += " " * (63 - (10 + len(header)) % 64) + "\n"
with open(path, "wb") as f:
    f.write(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode())
    f.write(data.tobytes())
PY
}
train_bin="$build_dir/trainer_core/depthbench-train"
bench_bin="$build_dir/bench/cuda_ops/fused_vs_composite_bench"

if ((dry_run)); then
  # ---- dry run: the binaries run (tiny CPU shapes) ----
  tokens_npy "$build_dir/tokens.npy" 256 200000
  if "$train_bin" train --arch attnres_full --layers 2 --d-model 64 --heads 4 --vocab 256 \
      --data "$build_dir/tokens.npy" --seq-len 32 --batch 4 --steps 3 --lr 3e-3 --threads 2 \
      --eval-batches 1 --device cpu --out "$build_dir/train-smoke" \
      >"$out/logs/train-smoke.jsonl" 2>"$out/logs/train-smoke.stderr" &&
     [[ $(grep -c '"event":"step"' "$out/logs/train-smoke.jsonl") -eq 3 ]]; then
    record "train smoke (cpu, attnres_full L=2 d=64): 3 steps; $(grep -o '"fused_ops_detail":"[^"]*"' "$out/logs/train-smoke.jsonl" | head -n1 | tr -d '"')"
  else
    tail -n 5 "$out/logs/train-smoke.stderr" >&2 || true
    record "train smoke: FAILED (log: $out/logs/train-smoke.stderr)"
    test_status=1
  fi
  if line="$("$bench_bin" --arch attnres_full --layers 2 --d 64 --heads 4 --vocab 256 --seq 32 \
      --batch 2 --device cpu --rounds 1 --steps 1 --threads 2 2>"$out/logs/bench-smoke.stderr")"; then
    record "bench smoke (cpu): $line"
  else
    record "bench smoke: FAILED (log: $out/logs/bench-smoke.stderr)"
    test_status=1
  fi
else
  # ---- 3. tokens/s and MFU, 400M L=24 d=1024, bf16, seq 2048 ----
  data="$build_dir/bench-tokens.npy"
  [[ -f "$data" ]] || tokens_npy "$data" "$vocab" 2000000
  record "== training throughput: batch $batch x $seq_len, bf16, $steps steps (median after 2), peak $peak_tflops TFLOP/s =="
  for arch in "${archs[@]}"; do
    flops_json="$("$train_bin" flops --arch "$arch" --layers 24 --d-model 1024 --seq "$seq_len" \
      --vocab "$vocab" --json)"
    fwd_flops_per_seq="$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["total_all_positions"])' "$flops_json")"
    rm -rf "$build_dir/bench-$arch"
    if ! "$train_bin" train --arch "$arch" --layers 24 --d-model 1024 --vocab "$vocab" \
        --data "$data" --seq-len "$seq_len" --batch "$batch" --steps "$steps" --lr 2e-3 \
        --device cuda --precision bf16 --eval-batches 1 --out "$build_dir/bench-$arch" \
        >"$out/logs/train-$arch.jsonl" 2>"$out/logs/train-$arch.stderr"; then
      tail -n 5 "$out/logs/train-$arch.stderr" >&2 || true
      record "train $arch: FAILED (log: $out/logs/train-$arch.stderr)"
      test_status=1
      continue
    fi
    line="$(python3 - "$out/logs/train-$arch.jsonl" "$fwd_flops_per_seq" "$seq_len" "$peak_tflops" <<'PY'
import json, statistics, sys
path, fwd, seq, peak = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
events = [json.loads(l) for l in open(path) if l.startswith("{")]
start = next(e for e in events if e["event"] == "start")
tps = [e["tokens_per_s"] for e in events if e["event"] == "step"][2:] or [0.0]
tok_s = statistics.median(tps)
train_flops_per_token = 3.0 * fwd / seq          # forward + backward = 3x forward
mfu = tok_s * train_flops_per_token / (peak * 1e12)
print(f"train {start['config']['arch']:<13} tokens/s {tok_s:>10.0f}  MFU {100*mfu:5.1f}%  "
      f"fused_ops={start.get('fused_ops')} params={start['params']['total']} "
      f"({start.get('fused_ops_detail', '')})")
PY
)"
    record "$line"
  done
  # ---- 4. fused vs composite AttnRes ----
  if line="$("$bench_bin" --arch attnres_full --layers 24 --d 1024 --heads 16 --vocab "$vocab" \
      --seq "$seq_len" --batch 4 --device cuda --bf16 --rounds 3 --steps 2 \
      2>"$out/logs/fused-bench.stderr")"; then
    record "attnres_full fused vs composite (fwd+bwd, bf16, batch 4 x $seq_len): $line"
  else
    record "fused vs composite bench: FAILED (log: $out/logs/fused-bench.stderr)"
    test_status=1
  fi
fi

record "total: $(elapsed) s"
if ((test_status != 0)); then
  record "RESULT: FAILED (logs in $out/logs)"
  exit 1
fi
record "RESULT: passed"
