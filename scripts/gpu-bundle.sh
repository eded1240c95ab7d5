#!/usr/bin/env bash
# Prepares, on a Debian 12 machine with its package registry, the C++
# dependencies a bare CUDA node lacks for the trainer-only build
# (DEPTHBENCH_TRAINER_ONLY=ON): Abseil, nlohmann-json, CLI11 and GoogleTest/
# GoogleMock, as one relocatable prefix. A CUDA node brings the rest (nvcc,
# cmake, ninja, a PyTorch whose torch.utils.cmake_prefix_path is a LibTorch).
#
#   scripts/gpu-bundle.sh [DEST]      # default DEST: build/gpu-bundle
#   FORCE=1 scripts/gpu-bundle.sh     # rebuild even if DEST is up to date
#
# How: `apt-get download` (no root; run `apt-get update` first if apt has no
# package lists) and `dpkg -x` into DEST/usr. Abseil is turned into static
# libraries (libabsl-dev ships the .a files; its CMake export names the .so
# files, so the export is rewritten to the .a ones): the trainer then needs
# no libabsl*.so at run time, no rpath and no symlinks, and the folder can be
# copied anywhere (rsync, tar, a carried path). Docs, lintian files and the
# googletest sources are dropped; the bundle holds no symbolic links.
#
# Writes DEST/BUNDLE.txt (package versions, .deb SHA-256s) and prints the
# size; fails if it exceeds 40 MB. Use it with scripts/gpu-check.sh
# (BUNDLE=DEST, the default).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${1:-$root/build/gpu-bundle}"
limit_bytes=$((40 * 1000 * 1000))
packages=(libabsl-dev nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev)
log() { echo "gpu-bundle: $*" >&2; }

for tool in apt-get apt-cache dpkg-deb sha256sum; do
  command -v "$tool" >/dev/null 2>&1 || { log "needs $tool (a Debian machine)"; exit 2; }
done

# Versions the registry offers now: the bundle is rebuilt when they change.
want=""
for p in "${packages[@]}"; do
  v="$(apt-cache policy "$p" 2>/dev/null | awk '/Candidate:/ {print $2}')"
  if [[ -z "$v" || "$v" == "(none)" ]]; then
    log "apt knows no candidate for $p: run 'apt-get update' (as root) first"
    exit 2
  fi
  want+="$p=$v"$'\n'
done
if [[ -z "${FORCE:-}" && -f "$dest/BUNDLE.txt" ]] &&
   [[ "$(sed -n '/^packages:$/,/^$/p' "$dest/BUNDLE.txt" | sed '1d;$d')" == "${want%$'\n'}" ]]; then
  log "$dest is up to date ($(du -sb "$dest" | cut -f1) bytes)"
  exit 0
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/debs" "$work/root"
mapfile -t specs <<<"${want%$'\n'}"
(cd "$work/debs" && apt-get download "${specs[@]}" >"$work/download.log" 2>&1) || {
  cat "$work/download.log" >&2
  log "apt-get download failed"
  exit 1
}
for deb in "$work"/debs/*.deb; do
  dpkg-deb -x "$deb" "$work/root"
done

prefix="$work/root/usr"
multiarch=""
for d in "$prefix"/lib/*-linux-gnu; do
  [[ -d "$d" ]] && multiarch="$(basename "$d")" && break
done
libdir="$prefix/lib/$multiarch"
[[ -n "$multiarch" && -d "$libdir/cmake/absl" ]] || { log "unexpected libabsl-dev layout"; exit 1; }

# Abseil: static libraries only. SHARED IMPORTED -> STATIC IMPORTED, each
# libabsl_X.so.<ver> -> libabsl_X.a, no IMPORTED_SONAME.
sed -i 's/ SHARED IMPORTED)/ STATIC IMPORTED)/' "$libdir/cmake/absl/abslTargets.cmake"
sed -i -e 's#\(/libabsl_[A-Za-z0-9_]*\)\.so\.[0-9.]*"#\1.a"#' -e '/IMPORTED_SONAME_/d' \
  "$libdir"/cmake/absl/abslTargets-*.cmake
if grep -q '\.so' "$libdir"/cmake/absl/abslTargets-*.cmake ||
   grep -q 'SHARED IMPORTED' "$libdir/cmake/absl/abslTargets.cmake"; then
  log "the Abseil CMake export still names shared libraries"
  exit 1
fi
while read -r lib; do
  [[ -f "$libdir/$lib" ]] || { log "Abseil export names $lib, not in libabsl-dev"; exit 1; }
done < <(grep -ho 'libabsl_[A-Za-z0-9_]*\.a' "$libdir"/cmake/absl/abslTargets-*.cmake | sort -u)
find "$libdir" -maxdepth 1 -name 'libabsl_*.so*' -delete

rm -rf "$prefix/share/doc" "$prefix/share/lintian" "$prefix/src"
if [[ -n "$(find "$work/root" -type l)" ]]; then
  find "$work/root" -type l >&2
  log "symbolic links left in the bundle"
  exit 1
fi

{
  echo "# depthbench GPU-node dependency bundle (scripts/gpu-bundle.sh)"
  echo "# Debian $(cat /etc/debian_version 2>/dev/null || echo '?'), $(uname -m), made $(date -u +%FT%TZ)"
  echo "# CMake: -DCMAKE_PREFIX_PATH=<this folder>/usr; Abseil is static."
  echo "packages:"
  printf '%s' "$want"
  echo
  echo "debs (sha256):"
  (cd "$work/debs" && sha256sum ./*.deb | sed 's#  \./#  #')
} >"$work/root/BUNDLE.txt"

size="$(du -sb "$work/root" | cut -f1)"
if ((size > limit_bytes)); then
  log "bundle is $size bytes, over the 40 MB limit"
  exit 1
fi
rm -rf "$dest"
mkdir -p "$(dirname "$dest")"
mv "$work/root" "$dest"
log "wrote $dest: $size bytes ($(find "$dest" -type f | wc -l) files; $(tr '\n' ' ' <<<"${want%$'\n'}"))"
echo "$size"
