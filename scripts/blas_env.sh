# shellcheck shell=bash
# Sourced by scripts/test.sh and the benchmarks that run a PyTorch or NumPy
# peer: exports OPENBLAS_CORETYPE for this CPU when unset, so OpenBLAS loads
# its AVX-512 / AVX2 kernels rather than the generic fallback Debian 12's
# 0.3.21 picks on this machine's Xeon (common/blas_tuning.h; depthbench-train
# does the same for itself). Peers and our binaries then run the same kernels.
# DEPTHBENCH_BLAS=default leaves the choice to OpenBLAS.
if [[ -z "${OPENBLAS_CORETYPE:-}" && "${DEPTHBENCH_BLAS:-}" != default ]]; then
  if grep -qw avx512bw /proc/cpuinfo; then export OPENBLAS_CORETYPE=SkylakeX
  elif grep -qw avx2 /proc/cpuinfo; then export OPENBLAS_CORETYPE=Haswell; fi
fi
