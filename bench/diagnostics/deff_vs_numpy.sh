#!/usr/bin/env bash
# D_eff on external states (issue 18 goal 1): `depthbench-train diagnose deff`
# (memory-mapped, GEMM kernel of trainer_core/diagnostics/cka_kernel.h) against
# a NumPy peer (bench/diagnostics/deff_numpy_peer.py, float32 BLAS, in each
# of its forms: the per-pair feature form, the same N x N tiling as ours, and
# that tiling with its off-diagonal GEMMs on oneDNN's sgemm, as ours runs
# them where it is built with oneDNN) on the same random float32 .npy file, at each size. Prints per size: seconds,
# GFLOP, GFLOP/s, peak RSS of each, the ratio peer_best / ours (> 1: ours is
# faster), our fraction of the sgemm peak, and D_eff/L and rho_bar(1) of both
# (random independent states: Table S1's 0.258 / 0.093 at 32 x 10,000 x 1,024).
#
#   bench/diagnostics/deff_vs_numpy.sh [BUILD_DIR]
#   SIZES="32x10000x1024 16x4000x512" THREADS=2 PEER_FORMS="gram gram_dnnl feature" ROUNDS=3 ...
#
# ROUNDS runs ours and the peer forms alternately that many times per size and
# compares medians (with the per-round ratios).
#
# Needs /usr/bin/python3 with numpy (python3-numpy) and GNU time
# (/usr/bin/time, package `time`) for the peak RSS. The files go to a temp dir
# (1.3 GB for the big size) and are removed at exit.
set -euo pipefail
cd "$(dirname "$0")/../.."
# Both sides on the same OpenBLAS kernels (scripts/blas_env.sh).
source scripts/blas_env.sh
build=${1:-build}
bin=$build/trainer_core/depthbench-train
peer=bench/diagnostics/deff_numpy_peer.py
py=/usr/bin/python3
sizes=${SIZES:-"16x4000x512 32x10000x1024"}
threads=${THREADS:-$(nproc)}
peer_forms=${PEER_FORMS:-"gram gram_dnnl feature"}
rounds=${ROUNDS:-1}
[[ -x $bin ]] || { echo "no $bin (cmake --build $build --target depthbench-train)" >&2; exit 2; }
[[ -x /usr/bin/time ]] || { echo "needs GNU time at /usr/bin/time" >&2; exit 2; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/deff_bench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads

echo "threads=$threads  $(date -u +%FT%TZ)  $(nproc) cores, load: $(cut -d' ' -f1-3 /proc/loadavg)"
for size in $sizes; do
  IFS=x read -r L N D <<<"$size"
  f=$tmp/states_$size.npy
  $py "$peer" generate --shape "$L" "$N" "$D" --out "$f"
  cat "$f" >/dev/null  # both sides start from a warm page cache
  # Alternating rounds, so drift on a shared machine hits both sides alike.
  for ((r = 1; r <= rounds; r++)); do
    /usr/bin/time -v -o "$tmp/ours_$r.time" "$bin" diagnose deff --states "$f" \
      --json --perf --threads "$threads" >"$tmp/ours_$r.json" 2>"$tmp/ours.err"
    grep -E '^deff: done' "$tmp/ours.err" || true
    tile=$($py -c 'import json,sys; print(json.load(open(sys.argv[1]))["perf"]["tile_rows"] or 1024)' "$tmp/ours_$r.json")
    for form in $peer_forms; do
      /usr/bin/time -v -o "$tmp/peer_${form}_$r.time" "$py" "$peer" run --states "$f" \
        --form "$form" --tile "$tile" >"$tmp/peer_${form}_$r.json"
    done
  done
  $py "$peer" peak >"$tmp/numpy_peak.json"
  $py - "$size" "$tmp" "$peer_forms" "$rounds" <<'EOF'
import json, statistics, sys
size, tmp, forms, rounds = sys.argv[1], sys.argv[2], sys.argv[3].split(), int(sys.argv[4])


def rss_mib(path):  # peak RSS from GNU time -v output
    for line in open(path):
        if "Maximum resident set size" in line:
            return int(line.split(":")[1]) / 1024
    return float("nan")


def peak_rss(prefix):
    return max(rss_mib(f"{tmp}/{prefix}_{r}.time") for r in range(1, rounds + 1))


ours = [json.load(open(f"{tmp}/ours_{r}.json")) for r in range(1, rounds + 1)]
secs = [o["perf"]["seconds"] for o in ours]
o, perf = ours[0], ours[0]["perf"]
med = statistics.median(secs)
npk = json.load(open(f"{tmp}/numpy_peak.json"))["sgemm_peak_gflops"]
phases = {k: statistics.median(x["perf"]["phase_seconds"][k] for x in ours)
          for k in perf["phase_seconds"]}
print(f"== {size}: ours {perf['form']} form {perf['precision']}, median of {rounds}: "
      f"{med:.2f} s ({', '.join(f'{s:.2f}' for s in secs)}), {perf['gflop']:.0f} GFLOP, "
      f"{perf['gflop'] / med:.1f} GFLOP/s = "
      f"{100 * perf['gflop'] / med / perf['sgemm_peak_gflops']:.0f}% of "
      f"sgemm peak {perf['sgemm_peak_gflops']:.1f} (NumPy's: {npk:.1f}); "
      f"peak RSS {peak_rss('ours'):.0f} MiB; "
      f"D_eff/L {o['deff_over_l']:.4f} rho_bar(1) {o['rho_bar1']:.4f}")
print("   ours, median seconds per phase: " + ", ".join(f"{k} {v:.2f}" for k, v in phases.items()))
best = None
for form in forms:
    ps = [json.load(open(f"{tmp}/peer_{form}_{r}.json")) for r in range(1, rounds + 1)]
    psecs = [p["seconds"] for p in ps]
    pmed, p = statistics.median(psecs), ps[0]
    ratios = [b / a for a, b in zip(secs, psecs)]
    print(f"   numpy {form:7s}: median {pmed:.2f} s ({', '.join(f'{s:.2f}' for s in psecs)}), "
          f"{p['gflop']:.0f} GFLOP, {p['gflop'] / pmed:.1f} GFLOP/s, "
          f"peak RSS {peak_rss('peer_' + form):.0f} MiB; "
          f"D_eff/L {p['deff_over_l']:.4f} rho_bar(1) {p['rho_bar1']:.4f}; "
          f"ratio numpy/ours {pmed / med:.2f} (per round {', '.join(f'{x:.2f}' for x in ratios)})")
    if abs(p["deff_over_l"] - o["deff_over_l"]) > 1e-4:
        print("   MISMATCH: D_eff/L differs from ours by more than 1e-4")
    if best is None or pmed < best[1]:
        best = (form, pmed)
print(f"   => numpy at its best ({best[0]}) / ours = {best[1] / med:.2f}x (medians)")
EOF
  rm -f "$f"
done
