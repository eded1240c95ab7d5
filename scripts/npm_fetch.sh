# Sourced by the fetch_*.sh scripts: fetches one npm package pinned by
# version and SHA-256.
#
# npm_fetch NAME VERSION SHA256 DIR
#   Packs NAME@VERSION from the npm registry into a temporary directory,
#   checks the tarball against SHA256 (fails, unpacking nothing, on a
#   mismatch) and unpacks the package's files (its package/ folder stripped)
#   into DIR. The temporary directory is removed however it ends.
npm_fetch() (
  set -euo pipefail
  local_name="$1" local_version="$2" local_sha256="$3" local_dir="$4"
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && npm pack --silent "$local_name@$local_version" >/dev/null)
  tarball="$tmp/$local_name-$local_version.tgz"
  echo "$local_sha256  $tarball" | sha256sum -c --quiet -
  mkdir -p "$local_dir"
  tar -xzf "$tarball" -C "$local_dir" --strip-components=1
)
