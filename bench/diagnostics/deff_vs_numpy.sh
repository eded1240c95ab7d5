#!/usr/bin/env bash
# D_eff on external states (issue 18 goal 1): `depthbench-train diagnose deff`
# (memory-mapped, GEMM kernel of trainer_core/diagnostics/cka_kernel.h) against
# a NumPy peer (bench/diagnostics/deff_numpy_peer.py, float32 BLAS, both its
# forms: the per-pair feature form and the same N x N tiling as ours) on the
# same random float32 .npy file, at each size. Prints per size: seconds,
# GFLOP, GFLOP/s, peak RSS of each, the ratio peer_best / ours (> 1: ours is
# faster), our fraction of the sgemm peak, and D_eff/L and rho_bar(1) of both
# (random independent states: Table S1's 0.258 / 0.093 at 32 x 10,000 x 1,024).
#
#   bench/diagnostics/deff_vs_numpy.sh [BUILD_DIR]
#   SIZES="32x10000x1024 16x4000x512" THREADS=2 PEER_FORMS="gram feature" ...
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
peer_forms=${PEER_FORMS:-"gram feature"}
[[ -x $bin ]] || { echo "no $bin (cmake --build $build --target depthbench-train)" >&2; exit 2; }
[[ -x /usr/bin/time ]] || { echo "needs GNU time at /usr/bin/time" >&2; exit 2; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/deff_bench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads

rss_mib() {  # peak RSS from GNU time -v output, MiB
  awk -F: '/Maximum resident set size/ {printf "%.0f", $2 / 1024}' "$1"
}

echo "threads=$threads  $(date -u +%FT%TZ)  $(nproc) cores, load: $(cut -d' ' -f1-3 /proc/loadavg)"
for size in $sizes; do
  IFS=x read -r L N D <<<"$size"
  f=$tmp/states_$size.npy
  $py "$peer" generate --shape "$L" "$N" "$D" --out "$f"
  cat "$f" >/dev/null  # both sides start from a warm page cache
  /usr/bin/time -v -o "$tmp/ours.time" "$bin" diagnose deff --states "$f" \
    --json --perf --threads "$threads" >"$tmp/ours.json" 2>"$tmp/ours.err"
  tile=$($py -c 'import json,sys; print(json.load(open(sys.argv[1]))["perf"]["tile_rows"] or 1024)' "$tmp/ours.json")
  for form in $peer_forms; do
    /usr/bin/time -v -o "$tmp/peer_$form.time" "$py" "$peer" run --states "$f" \
      --form "$form" --tile "$tile" >"$tmp/peer_$form.json"
  done
  $py "$peer" peak >"$tmp/numpy_peak.json"
  grep -E '^deff: done' "$tmp/ours.err" || true
  $py - "$size" "$tmp" "$peer_forms" \
    "$(rss_mib "$tmp/ours.time")" \
    "$(for form in $peer_forms; do echo -n "$form=$(rss_mib "$tmp/peer_$form.time") "; done)" <<'EOF'
import json, sys
size, tmp, forms, ours_rss, peer_rss = sys.argv[1:6]
rss = dict(kv.split("=") for kv in peer_rss.split())
ours = json.load(open(f"{tmp}/ours.json"))
perf = ours["perf"]
npk = json.load(open(f"{tmp}/numpy_peak.json"))["sgemm_peak_gflops"]
print(f"== {size}: ours {perf['form']} form {perf['precision']}, "
      f"{perf['seconds']:.2f} s, {perf['gflop']:.0f} GFLOP, "
      f"{perf['gflops']:.1f} GFLOP/s = {100*perf['fraction_of_peak']:.0f}% of "
      f"sgemm peak {perf['sgemm_peak_gflops']:.1f} (NumPy's: {npk:.1f}); "
      f"peak RSS {ours_rss} MiB; D_eff/L {ours['deff_over_l']:.4f} "
      f"rho_bar(1) {ours['rho_bar1']:.4f}")
best = None
for form in forms.split():
    p = json.load(open(f"{tmp}/peer_{form}.json"))
    print(f"   numpy {form:7s}: {p['seconds']:.2f} s, {p['gflop']:.0f} GFLOP, "
          f"{p['gflop']/p['seconds']:.1f} GFLOP/s, peak RSS {rss[form]} MiB; "
          f"D_eff/L {p['deff_over_l']:.4f} rho_bar(1) {p['rho_bar1']:.4f}; "
          f"ratio numpy/ours {p['seconds']/perf['seconds']:.2f}")
    if abs(p["deff_over_l"] - ours["deff_over_l"]) > 1e-4:
        print(f"   MISMATCH: D_eff/L differs from ours by more than 1e-4")
    if best is None or p["seconds"] < best[1]:
        best = (form, p["seconds"])
print(f"   => numpy at its best ({best[0]}) / ours = "
      f"{best[1]/perf['seconds']:.2f}x")
EOF
  rm -f "$f"
done
