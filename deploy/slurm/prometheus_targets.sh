#!/usr/bin/env bash
# Writes a Prometheus file_sd target list for the workers of a SLURM job, so
# dashboards/prometheus.yml picks them up:
#
#   deploy/slurm/prometheus_targets.sh JOBID > dashboards/targets/workers.json
set -euo pipefail
job_id="${1:?usage: prometheus_targets.sh SLURM_JOB_ID [PORT]}"
port="${2:-9102}"
nodelist="$(squeue --noheader --jobs "$job_id" --format=%N)"
mapfile -t hosts < <(scontrol show hostnames "$nodelist")
printf '[\n  {\n    "targets": ['
sep=""
for h in "${hosts[@]}"; do
  printf '%s"%s:%s"' "$sep" "$h" "$port"
  sep=", "
done
printf '],\n    "labels": {"component": "worker", "slurm_job": "%s"}\n  }\n]\n' "$job_id"
