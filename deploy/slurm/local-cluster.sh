#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, for trying the sbatch script and
# for tests/integration/slurm_e2e_test.cc. Everything (munge key and socket,
# slurm.conf, state, spool, logs) lives under DIR; nothing in /etc changes.
# Needs root (slurmd runs jobs as their submitting user) and Debian's
# slurm-wlm and munge packages.
#
#   deploy/slurm/local-cluster.sh start DIR   # prints `export SLURM_CONF=...`
#   SLURM_CONF=DIR/slurm.conf sbatch ...      # use it
#   deploy/slurm/local-cluster.sh stop DIR
#
# The node is a CPU node with every core of this machine; no cgroups
# (ProctrackType=proctrack/linuxproc, TaskPlugin=task/none), so it works in
# a container. Ports: SLURM_LOCAL_CTLD_PORT / SLURM_LOCAL_SLURMD_PORT
# (defaults 26817 / 26818).
set -euo pipefail

usage() { echo "usage: $0 start|stop DIR" >&2; exit 2; }
[[ $# -eq 2 ]] || usage
cmd="$1"
dir="$(mkdir -p "$2" && cd "$2" && pwd)"
ctld_port="${SLURM_LOCAL_CTLD_PORT:-26817}"
slurmd_port="${SLURM_LOCAL_SLURMD_PORT:-26818}"
node="$(hostname -s)"

stop() {
  # End every job first, so that no slurmstepd outlives its slurmd.
  if [[ -f "$dir/slurmctld.pid" ]] && kill -0 "$(cat "$dir/slurmctld.pid")" 2>/dev/null; then
    export SLURM_CONF="$dir/slurm.conf"
    scancel --full --signal=KILL --user="$(id -un)" 2>/dev/null || true
    for _ in $(seq 100); do
      [[ -z "$(squeue -h 2>/dev/null)" ]] && break
      sleep 0.1
    done
  fi
  for pidfile in slurmd.pid slurmctld.pid munged.pid; do
    if [[ -f "$dir/$pidfile" ]]; then
      pid="$(cat "$dir/$pidfile")"
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
      rm -f "$dir/$pidfile"
    fi
  done
}

start() {
  for bin in munged slurmctld slurmd sinfo; do
    command -v "$bin" >/dev/null 2>&1 || PATH="$PATH:/usr/sbin"
    command -v "$bin" >/dev/null 2>&1 || { echo "local-cluster: $bin not installed (apt-get install slurm-wlm munge)" >&2; exit 3; }
  done
  [[ $(id -u) -eq 0 ]] || { echo "local-cluster: must run as root" >&2; exit 3; }
  mkdir -p "$dir/state" "$dir/spool" "$dir/log"
  # munge: a fresh key, our own socket.
  dd if=/dev/urandom of="$dir/munge.key" bs=1024 count=1 status=none
  chmod 400 "$dir/munge.key"
  munged --force --key-file="$dir/munge.key" --socket="$dir/munge.socket" \
    --pid-file="$dir/munged.pid" --log-file="$dir/log/munged.log" \
    --seed-file="$dir/munge.seed"
  cpus="$(nproc)"
  mem_mb="$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 512 ))"
  cat > "$dir/slurm.conf" <<CONF
ClusterName=depthbench-local
SlurmctldHost=${node}(127.0.0.1)
SlurmctldPort=${ctld_port}
SlurmdPort=${slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=${dir}/munge.socket
StateSaveLocation=${dir}/state
SlurmdSpoolDir=${dir}/spool/slurmd-%n
SlurmctldPidFile=${dir}/slurmctld.pid
SlurmdPidFile=${dir}/slurmd.pid
SlurmctldLogFile=${dir}/log/slurmctld.log
SlurmdLogFile=${dir}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
KillWait=30
InactiveLimit=0
MinJobAge=300
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=${node} NodeAddr=127.0.0.1 CPUs=${cpus} RealMemory=${mem_mb} State=UNKNOWN
PartitionName=local Nodes=${node} Default=YES MaxTime=INFINITE State=UP
CONF
  export SLURM_CONF="$dir/slurm.conf"
  slurmctld -i -f "$SLURM_CONF"
  slurmd -f "$SLURM_CONF"
  for _ in $(seq 100); do
    state="$(sinfo -h -N -o '%T' 2>/dev/null | head -1 || true)"
    if [[ "$state" == idle* ]]; then
      echo "export SLURM_CONF=$SLURM_CONF"
      return 0
    fi
    sleep 0.2
  done
  echo "local-cluster: node did not become idle (state '${state:-none}'); logs in $dir/log" >&2
  stop
  exit 1
}

case "$cmd" in
  start) start ;;
  stop) stop ;;
  *) usage ;;
esac
