#!/usr/bin/env bash
# Runs the whole test suite (GoogleTest through ctest) on the Release build.
# Assumes scripts/setup.sh has run.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${BUILD_DIR:-$root/build}"
cmake --build "$build_dir" -j "$(nproc)"
cd "$build_dir"
# The test binaries that run LibTorch get OpenBLAS's kernels for this CPU.
source "$root/scripts/blas_env.sh"
ctest --output-on-failure --timeout 900 -j 2 "$@"
