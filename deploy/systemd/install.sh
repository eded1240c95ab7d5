#!/usr/bin/env bash
# Installs the depthbench systemd units on this host (run as root from the
# repository root after building):
#
#   sudo deploy/systemd/install.sh scheduler      # and/or: worker
#
# Copies the binaries from build/ (BUILD_DIR to override), the units, the
# sysusers entry and, if absent, the /etc/default files; then enables and
# starts the services.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build_dir="${BUILD_DIR:-$root/build}"
[[ $# -ge 1 ]] || { echo "usage: $0 scheduler|worker ..." >&2; exit 2; }

install -m 0644 "$root/deploy/systemd/depthbench.sysusers.conf" /usr/lib/sysusers.d/depthbench.conf
systemd-sysusers
install -d -m 0750 -o depthbench -g depthbench /etc/depthbench

for role in "$@"; do
  case "$role" in
    scheduler) bins=(scheduler/depthbench-scheduler) ;;
    worker) bins=(worker/depthbench-worker trainer_core/depthbench-train) ;;
    *) echo "unknown role: $role" >&2; exit 2 ;;
  esac
  for b in "${bins[@]}"; do
    install -m 0755 "$build_dir/$b" "/usr/local/bin/$(basename "$b")"
  done
  install -m 0644 "$root/deploy/systemd/depthbench-$role.service" /etc/systemd/system/
  if [[ ! -e "/etc/default/depthbench-$role" ]]; then
    install -m 0644 "$root/deploy/systemd/depthbench-$role.default" "/etc/default/depthbench-$role"
  fi
done
systemctl daemon-reload
for role in "$@"; do
  systemctl enable --now "depthbench-$role.service"
done
