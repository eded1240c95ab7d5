#!/usr/bin/env bash
# Issue-18 goal 2: depthbench-train vs the same Pre-LN model in PyTorch eager
# (bench/trainer_core/pytorch_peer.py) at several shapes, the peer at its
# best: the best median of three peer variants run alternately in the same
# rounds (glibc-default malloc; malloc thresholds pinned through the
# MALLOC_*_ environment as depthbench-train pins them; pinned + fused
# Q/K/V and gate/up GEMMs + zero_grad(set_to_none=True), as depthbench-train
# drops its gradients between steps). PyTorch 1.13 has no fused CPU AdamW
# (foreach=True, tried, was no faster on CPU). Also prints the achieved training FLOP/s
# (3 x the Appendix-D forward FLOPs of `depthbench-train flops`, per token,
# times tokens/s) as a fraction of the measured sgemm peak (2048^3 fp32
# matmul at the same thread count, the faster of LibTorch's, on OpenBLAS,
# and oneDNN's sgemm, which depthbench-train's dense layers call).
#
#   bench/trainer_core/train_shapes_vs_pytorch.sh [BUILD_DIR] [ROUNDS] [SHAPES...]
#
# SHAPES: "L:D:H:T:B:STEPS" each; default the three of issue 18 at T=128
# plus d=256/16 heads and d=512/8 heads at T=256. THREADS (environment, default 2): intra-op
# threads of both. On a machine shared with other jobs use THREADS=1: with
# two OpenMP threads on two busy cores every barrier waits for a descheduled
# thread and both programs slow down tens of times, erratically.
# CLOCK=cpu (environment): instead of the median wall-clock step rate, each
# program runs twice, with SKIP and SKIP + STEPS steps, under GNU time, and
# the rate is STEPS x tokens per step over the difference of their user +
# system CPU seconds (start-up, model build and the final evaluation cancel
# out). With THREADS=1 that counts work, not time-sharing: the steadier
# figure on a shared machine. The sgemm peak is then measured in CPU time too.
# A second depthbench-train column shows what one of its pieces is worth:
# SECOND=one-batch (default) runs it with DEPTHBENCH_CPU_MICROBATCH=off (the
# whole batch as one forward and backward, every op on all threads, instead of
# one single-threaded micro-batch per thread: trainer_core/micro_batch.h);
# SECOND=composite with DEPTHBENCH_CPU_ATTENTION=composite (attention as ATen
# batched GEMMs and softmax by causal query chunks instead of the fused CPU
# kernel); SECOND=blas with DEPTHBENCH_CPU_GEMM=blas (the dense layers'
# GEMMs on OpenBLAS, as the peer's, instead of oneDNN's sgemm: cuda_ops/cpu_gemm.h).
# The peer's fourth variant does what depthbench-train does on the CPU: the
# batch as THREADS micro-batches in Python threads of single-threaded ops
# (pinned + fused too); the fifth adds oneDNN's sgemm for every linear layer,
# as depthbench-train's (pytorch_peer.py --onednn-gemm).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# Both sides on the same OpenBLAS kernels (scripts/blas_env.sh).
source "$root/scripts/blas_env.sh"
build="${1:-$root/build}"
rounds="${2:-3}"
shift $(( $# >= 2 ? 2 : $# ))
shapes=("$@")
if [ ${#shapes[@]} -eq 0 ]; then
  shapes=("4:128:4:128:16:20" "4:256:16:128:16:14" "4:512:8:128:16:10" "4:256:16:256:8:14"
          "4:512:8:256:8:10")
fi
THREADS="${THREADS:-2}" SKIP="${SKIP:-3}" CLOCK="${CLOCK:-wall}" SECOND="${SECOND:-one-batch}"
case "$SECOND" in
  one-batch) second_env=(env DEPTHBENCH_CPU_MICROBATCH=off); second_name="one batch" ;;
  composite) second_env=(env DEPTHBENCH_CPU_ATTENTION=composite); second_name="composite attention" ;;
  blas) second_env=(env DEPTHBENCH_CPU_GEMM=blas); second_name="GEMMs on OpenBLAS" ;;
  *) echo "SECOND must be one-batch, composite or blas, not '$SECOND'" >&2; exit 2 ;;
esac
train="$build/trainer_core/depthbench-train"
py=/usr/bin/python3
peer="$root/bench/trainer_core/pytorch_peer.py"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# glibc's tunables as environment variables: the same values
# common/malloc_tuning.cc sets with mallopt.
pinned_env=(env MALLOC_MMAP_THRESHOLD_=268435456 MALLOC_TRIM_THRESHOLD_=1073741824)

peak=$("$py" - "$THREADS" "$CLOCK" <<'PY'
import sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
clock = time.process_time if sys.argv[2] == "cpu" else time.perf_counter
n = 2048
a, b = torch.randn(n, n), torch.randn(n, n)
def best_of(f):
    for _ in range(2): f()
    best = 0.0
    for _ in range(5):
        t = clock(); f(); dt = clock() - t
        best = max(best, 2 * n ** 3 / dt)
    return best
blas = best_of(lambda: a @ b)
# oneDNN's sgemm (what depthbench-train's dense layers call, cuda_ops/cpu_gemm.h)
# through ctypes on the same OpenMP team; 0 where libdnnl is not installed.
dnnl = 0.0
try:
    import ctypes
    lib = ctypes.CDLL("libdnnl.so.2")
    c = torch.empty(n, n)
    i64, fl, ptr = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
    lib.dnnl_sgemm.argtypes = [ctypes.c_char, ctypes.c_char, i64, i64, i64, fl, ptr, i64,
                               ptr, i64, fl, ptr, i64]
    def sgemm():
        status = lib.dnnl_sgemm(b"N", b"N", n, n, n, 1.0, a.data_ptr(), n, b.data_ptr(), n,
                                0.0, c.data_ptr(), n)
        assert status == 0, f"dnnl_sgemm status {status}"
    dnnl = best_of(sgemm)
except OSError:
    pass
print(f"{max(blas, dnnl)} {blas} {dnnl}")
PY
)
read -r peak blas_peak dnnl_peak <<<"$peak"
echo "threads $THREADS, $rounds rounds; load average $(cut -d' ' -f1-3 /proc/loadavg)"
# The peak is the faster library's: OpenBLAS (the peer's GEMMs) or oneDNN.
echo "sgemm peak (2048^3 fp32, $THREADS threads, best of 5, $CLOCK clock): $(awk -v p="$peak" 'BEGIN{printf "%.1f", p/1e9}') GFLOP/s (OpenBLAS $(awk -v p="$blas_peak" 'BEGIN{printf "%.1f", p/1e9}'), oneDNN $(awk -v p="$dnnl_peak" 'BEGIN{printf "%.1f", p/1e9}'))"

cpp_rate() {
  "$py" -c '
import json, statistics, sys
skip = int(sys.argv[1])
rates = [e["tokens_per_s"] for e in map(json.loads, sys.stdin) if e.get("event") == "step" and e["step"] > skip]
print(statistics.median(rates))' "$SKIP"
}
py_rate() { "$py" -c 'import json,sys; print(json.load(sys.stdin)["median_tokens_per_s"])'; }

# CPU mode: user + system seconds of one command (GNU time).
cpu_of() { /usr/bin/time -f "%U %S" -o "$tmp/t" "$@" >/dev/null 2>&1; awk '{print $1 + $2}' "$tmp/t"; }
# tokens per CPU-second of STEPS steps: runs "$@" with a steps flag twice.
cpu_rate() {
  local kind="$1"; shift
  local lo hi
  if [ "$kind" = cpp ]; then
    rm -rf "$tmp/run"; lo=$(cpu_of "$@" --steps "$SKIP" --out "$tmp/run")
    rm -rf "$tmp/run"; hi=$(cpu_of "$@" --steps $((SKIP + STEPS)) --out "$tmp/run")
  else
    lo=$(cpu_of "$@" --steps "$SKIP" --skip 0)
    hi=$(cpu_of "$@" --steps $((SKIP + STEPS)) --skip 0)
  fi
  awk -v lo="$lo" -v hi="$hi" -v n="$STEPS" -v tok="$((B * T))" 'BEGIN{print n * tok / (hi - lo)}'
}

# The fifth peer variant: the fourth (or pinned + fused where there are no
# micro-batches) with every linear layer on oneDNN's sgemm through ctypes,
# the GEMM library depthbench-train's dense layers call (pytorch_peer.py
# --onednn-gemm). Left out where libdnnl.so.2 is not installed (the peak
# measurement above then printed 0.0 for oneDNN).
dnnl_ok=""
[ "$dnnl_peak" != 0.0 ] && dnnl_ok=1
summary=()
for shape in "${shapes[@]}"; do
  IFS=: read -r L D H T B STEPS <<<"$shape"
  flops_tok=$("$train" flops --arch pre_ln --layers "$L" --d-model "$D" --heads "$H" --seq "$T" \
    --vocab 256 --json | "$py" -c "import json,sys; print(3 * json.load(sys.stdin)['total_all_positions'] / $T)")
  ours=() one=() pd=() pp=() pf=() pm=() pn=()
  # The micro-batch peer where depthbench-train splits too (micro_batch.h).
  micro=(); [ "$THREADS" -gt 1 ] && [ $((B % THREADS)) -eq 0 ] && micro=(--micro-batch-threads "$THREADS")
  dnnl_name="pinned+fused$([ ${#micro[@]} -gt 0 ] && echo +micro-batches)+oneDNN GEMMs"
  for r in $(seq 1 "$rounds"); do
    if [ "$CLOCK" = cpu ]; then
      targs=(train --arch pre_ln --layers "$L" --d-model "$D" --heads "$H" --seq-len "$T"
             --batch "$B" --lr 1e-3 --threads "$THREADS" --eval-batches 1)
      pargs=(--layers "$L" --d-model "$D" --heads "$H" --seq-len "$T" --batch "$B" --threads "$THREADS")
      ours+=("$(cpu_rate cpp "$train" "${targs[@]}")")
      one+=("$(cpu_rate cpp "${second_env[@]}" "$train" "${targs[@]}")")
      pd+=("$(cpu_rate py "$py" "$peer" "${pargs[@]}")")
      pp+=("$(cpu_rate py "${pinned_env[@]}" "$py" "$peer" "${pargs[@]}")")
      pf+=("$(cpu_rate py "${pinned_env[@]}" "$py" "$peer" "${pargs[@]}" --fused-qkv --set-to-none)")
      [ ${#micro[@]} -gt 0 ] && pm+=("$(cpu_rate py "${pinned_env[@]}" "$py" "$peer" "${pargs[@]}" --fused-qkv --set-to-none "${micro[@]}")")
      [ -n "$dnnl_ok" ] && pn+=("$(cpu_rate py "${pinned_env[@]}" "$py" "$peer" "${pargs[@]}" --fused-qkv --set-to-none "${micro[@]}" --onednn-gemm)")
      echo "L=$L d=$D heads=$H T=$T B=$B round $r (tokens per CPU-second): depthbench-train ${ours[-1]} ($second_name ${one[-1]}), pytorch default ${pd[-1]}, pinned ${pp[-1]}, pinned+fused ${pf[-1]}, pinned+fused+micro-batches ${pm[-1]:-n/a}, $dnnl_name ${pn[-1]:-n/a}"
      continue
    fi
    rm -rf "$tmp/run"
    "$train" train --arch pre_ln --layers "$L" --d-model "$D" --heads "$H" --seq-len "$T" \
      --batch "$B" --steps "$STEPS" --lr 1e-3 --threads "$THREADS" --eval-batches 1 \
      --out "$tmp/run" 2>/dev/null >"$tmp/cpp.jsonl"
    ours+=("$(cpp_rate <"$tmp/cpp.jsonl")")
    rm -rf "$tmp/run"
    "${second_env[@]}" "$train" train --arch pre_ln --layers "$L" --d-model "$D" --heads "$H" \
      --seq-len "$T" --batch "$B" --steps "$STEPS" --lr 1e-3 --threads "$THREADS" --eval-batches 1 \
      --out "$tmp/run" 2>/dev/null >"$tmp/cpp1.jsonl"
    one+=("$(cpp_rate <"$tmp/cpp1.jsonl")")
    args=(--layers "$L" --d-model "$D" --heads "$H" --seq-len "$T" --batch "$B" --steps "$STEPS"
          --threads "$THREADS" --skip "$SKIP")
    pd+=("$("$py" "$peer" "${args[@]}" | py_rate)")
    pp+=("$("${pinned_env[@]}" "$py" "$peer" "${args[@]}" | py_rate)")
    pf+=("$("${pinned_env[@]}" "$py" "$peer" "${args[@]}" --fused-qkv --set-to-none | py_rate)")
    [ ${#micro[@]} -gt 0 ] && pm+=("$("${pinned_env[@]}" "$py" "$peer" "${args[@]}" --fused-qkv --set-to-none "${micro[@]}" | py_rate)")
    [ -n "$dnnl_ok" ] && pn+=("$("${pinned_env[@]}" "$py" "$peer" "${args[@]}" --fused-qkv --set-to-none "${micro[@]}" --onednn-gemm | py_rate)")
    echo "L=$L d=$D heads=$H T=$T B=$B round $r: depthbench-train ${ours[-1]} ($second_name ${one[-1]}), pytorch default ${pd[-1]}, pinned ${pp[-1]}, pinned+fused ${pf[-1]}, pinned+fused+micro-batches ${pm[-1]:-n/a}, $dnnl_name ${pn[-1]:-n/a} tokens/s"
  done
  line=$("$py" - "${ours[*]}" "${pd[*]}" "${pp[*]}" "${pf[*]}" "$flops_tok" "$peak" "L=$L d=$D heads=$H T=$T B=$B" "${one[*]}" "$second_name" "${pm[*]}" "${pn[*]}" "$dnnl_name" <<'PY'
import statistics, sys
o, d, p, f = (list(map(float, a.split())) for a in sys.argv[1:5])
flops_tok, peak, label = float(sys.argv[5]), float(sys.argv[6]), sys.argv[7]
one = list(map(float, sys.argv[8].split()))
second_name = sys.argv[9]
m = list(map(float, sys.argv[10].split())) if sys.argv[10] else [0.0] * len(o)
n = list(map(float, sys.argv[11].split())) if sys.argv[11] else [0.0] * len(o)
med = statistics.median
peers = {"default": med(d), "pinned": med(p), "pinned+fused": med(f)}
if sys.argv[10]:
    peers["pinned+fused+micro-batches"] = med(m)
if sys.argv[11]:
    peers[sys.argv[12]] = med(n)
best = max(peers, key=peers.get)
ratio = med(o) / peers[best]
# Spread: per-round ratio to the best peer variant of that round.
rr = [oi / max(di, pi, fi, mi, ni) for oi, di, pi, fi, mi, ni in zip(o, d, p, f, m, n)]
ok = "meets" if ratio >= 1.2 else "does NOT meet"
print(f"{label}: depthbench-train {med(o):.0f} tok/s, best peer ({best}) {peers[best]:.0f} tok/s "
      f"-> {ratio:.2f}x (per round {min(rr):.2f}-{max(rr):.2f}; {ok} 1.2x); training FLOP/s "
      f"{med(o) * flops_tok / 1e9:.1f} G = {med(o) * flops_tok / peak:.2f} of sgemm peak "
      f"(peer {peers[best] * flops_tok / peak:.2f}); {second_name} {med(one):.0f} tok/s "
      f"= {med(one) / peers[best]:.2f}x")
# The same against stock PyTorch alone (its own GEMM path, OpenBLAS), when
# the oneDNN variant was the best one.
stock = {k: v for k, v in peers.items() if k != sys.argv[12]} if sys.argv[11] else peers
sbest = max(stock, key=stock.get)
if sbest != best:
    print(f"  against the best stock PyTorch variant ({sbest}, {stock[sbest]:.0f} tok/s, "
          f"{stock[sbest] * flops_tok / peak:.2f} of sgemm peak): {med(o) / stock[sbest]:.2f}x")
PY
)
  summary+=("$line")
done
echo
printf '%s\n' "${summary[@]}"
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
