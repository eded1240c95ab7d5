# shellcheck shell=bash
# Sourced by the fetch_*.sh scripts: fetches one npm package pinned by
# version and SHA-256.
#
# npm_fetch NAME VERSION SHA256 DIR
#   Packs NAME@VERSION from the npm registry into a temporary directory,
#   checks the tarball against SHA256 (fails, unpacking nothing, on a
#   mismatch) and unpacks the package's files (its package/ folder stripped)
#   into DIR. Runs in a subshell; the temporary directory is removed however
#   it ends.
npm_fetch() (
  set -euo pipefail
  npm_name="$1" npm_version="$2" npm_sha256="$3" npm_dir="$4"
  pack_dir="$(mktemp -d)"
  trap 'rm -rf "$pack_dir"' EXIT
  (cd "$pack_dir" && npm pack --silent "$npm_name@$npm_version" >/dev/null)
  tarball="$pack_dir/$npm_name-$npm_version.tgz"
  echo "$npm_sha256  $tarball" | sha256sum -c --quiet -
  mkdir -p "$npm_dir"
  tar -xzf "$tarball" -C "$npm_dir" --strip-components=1
)
