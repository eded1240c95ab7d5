#!/usr/bin/env bash
# The README's main command: set up (packages, corpus, Release build) and run
# the demo sweep. Extra arguments go to `depthbench demo`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup.sh"
exec "${BUILD_DIR:-$root/build}/cli/depthbench" demo "$@"
