#!/usr/bin/env bash
# Fetches the charting library of the scheduler's web view (scheduler/web/):
# uPlot as packaged on npm (uplot 1.6.32, MIT licence), pinned by version and
# SHA-256, into third_party/uplot/ (git-ignored). CMake embeds its minified
# script, its stylesheet and its LICENSE into depthbench-scheduler. Idempotent;
# called by scripts/setup.sh and, when the files are missing, by CMake.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${1:-$root/third_party/uplot}"
version="1.6.32"
sha256="4b8a8191e425658e3ea8c8c1314b0fc679c861ee3a1af2b20c7b16ba50b5133d"

if [[ -f "$dest/.complete" ]]; then
  exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# shellcheck source=scripts/npm_fetch.sh
source "$root/scripts/npm_fetch.sh"
npm_fetch uplot "$version" "$sha256" "$tmp/x"
mkdir -p "$dest"
cp "$tmp/x/dist/uPlot.iife.min.js" "$tmp/x/dist/uPlot.min.css" "$tmp/x/LICENSE" "$dest/"
touch "$dest/.complete"
echo "fetch_uplot: uPlot $version in $dest" >&2
