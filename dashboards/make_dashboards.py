#!/usr/bin/env python3
"""Writes the Grafana dashboards in dashboards/grafana/dashboards/.

The JSON files are committed; edit this script and re-run it rather than
editing the JSON by hand:

    python3 dashboards/make_dashboards.py

Every metric name used here must be one the daemons export
(common/metric_names.h); tests/common/dashboards_test.cc checks that.
"""
import json
import pathlib

DATASOURCE = {"type": "prometheus", "uid": "depthbench-prometheus"}
OUT = pathlib.Path(__file__).resolve().parent / "grafana" / "dashboards"


def target(expr, legend="", ref="A", instant=False):
    t = {"datasource": DATASOURCE, "expr": expr, "legendFormat": legend,
         "refId": ref}
    if instant:
        t["instant"] = True
        t["range"] = False
    return t


def panel(pid, title, kind, targets, x, y, w=12, h=8, unit=None,
          stacked=False, description=""):
    p = {
        "id": pid,
        "title": title,
        "description": description,
        "type": kind,
        "datasource": DATASOURCE,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "targets": [target(*t) if isinstance(t, tuple) else t
                    for t in targets],
        "fieldConfig": {"defaults": {}, "overrides": []},
        "options": {},
    }
    if unit:
        p["fieldConfig"]["defaults"]["unit"] = unit
    if kind == "timeseries":
        p["fieldConfig"]["defaults"]["custom"] = {
            "stacking": {"mode": "normal" if stacked else "none"},
            "fillOpacity": 30 if stacked else 0,
        }
        p["options"] = {"legend": {"displayMode": "table",
                                   "placement": "bottom"},
                        "tooltip": {"mode": "multi"}}
    return p


def query_var(name, label, query, multi=True):
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "query": {"query": query, "refId": f"{name}-var"},
        "definition": query,
        "refresh": 2,  # on time range change
        "multi": multi,
        "includeAll": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
    }


def dashboard(uid, title, panels, variables=(), refresh="30s"):
    return {
        "uid": uid,
        "title": title,
        "tags": ["depthbench"],
        "timezone": "browser",
        "schemaVersion": 38,
        "version": 1,
        "editable": True,
        "refresh": refresh,
        "time": {"from": "now-6h", "to": "now"},
        "templating": {"list": list(variables)},
        "annotations": {"list": []},
        "links": [{"type": "dashboards", "tags": ["depthbench"],
                   "asDropdown": True, "title": "depthbench"}],
        "panels": panels,
    }


SWEEP_SEL = 'sweep=~"$sweep"'

sweeps = dashboard(
    "depthbench-sweeps", "depthbench / Sweep overview",
    variables=[query_var("sweep", "Sweep",
                         "label_values(depthbench_scheduler_jobs, sweep)")],
    panels=[
        panel(1, "Jobs by state", "timeseries",
              [(f"sum by (state) (depthbench_scheduler_jobs{{{SWEEP_SEL}}})",
                "{{state}}")], 0, 0, w=16, stacked=True,
              description="Jobs per state in the selected sweeps, read from "
                          "the scheduler's database at each scrape."),
        panel(2, "Jobs now", "stat",
              [(f"sum by (state) (depthbench_scheduler_jobs{{{SWEEP_SEL}}})",
                "{{state}}", "A", True)], 16, 0, w=8),
        panel(3, "Throughput: jobs finished per hour", "timeseries",
              [("sum by (state) (rate(depthbench_scheduler_jobs_finished_total"
                "[$__rate_interval])) * 3600", "{{state}}")], 0, 8,
              unit="short"),
        panel(4, "Training throughput (all running jobs)", "timeseries",
              [(f"sum by (sweep) (depthbench_worker_job_tokens_per_second"
                f"{{{SWEEP_SEL}}})", "{{sweep}}")], 12, 8, unit="short"),
        panel(5, "Failures and retries", "timeseries",
              [("sum(increase(depthbench_scheduler_jobs_finished_total"
                "{state=\"failed\"}[1h]))", "failed jobs (1h)", "A"),
               ("sum by (reason) (increase(depthbench_scheduler_job_retries_"
                "total[1h]))", "retries: {{reason}} (1h)", "B"),
               ("sum(increase(depthbench_scheduler_leases_expired_total[1h]))",
                "leases expired (1h)", "C")], 0, 16),
        panel(6, "Leases granted per second", "timeseries",
              [("sum(rate(depthbench_scheduler_leases_granted_total"
                "[$__rate_interval]))", "granted")], 12, 16, unit="reqps"),
        panel(7, "Metric points ingested per second", "timeseries",
              [("sum(rate(depthbench_scheduler_metric_points_ingested_total"
                "[$__rate_interval]))", "stored", "A"),
               ("sum(rate(depthbench_scheduler_metric_points_duplicate_total"
                "[$__rate_interval]))", "duplicate (resent)", "B")], 0, 24),
        panel(8, "RPC rate by method and code", "timeseries",
              [("sum by (method, code) (rate(depthbench_scheduler_rpcs_total"
                "[$__rate_interval]))", "{{method}} {{code}}")], 12, 24,
              unit="reqps"),
        panel(9, "RPC latency p99 by method", "timeseries",
              [("histogram_quantile(0.99, sum by (le, method) (rate("
                "depthbench_scheduler_rpc_duration_seconds_bucket"
                "[$__rate_interval])))", "{{method}}")], 0, 32, unit="s"),
        panel(10, "SQLite transaction latency p99", "timeseries",
              [("histogram_quantile(0.99, sum by (le, txn) (rate("
                "depthbench_scheduler_sqlite_transaction_duration_seconds_"
                "bucket[$__rate_interval])))", "{{txn}}", "A"),
               ("sum(rate(depthbench_scheduler_sqlite_transaction_duration_"
                "seconds_sum[$__rate_interval])) / sum(rate(depthbench_"
                "scheduler_sqlite_transaction_duration_seconds_count"
                "[$__rate_interval]))", "mean (all)", "B")], 12, 32, unit="s"),
    ])

JOB_SEL = 'sweep=~"$sweep",arch=~"$arch",job_id=~"$job"'
training = dashboard(
    "depthbench-training", "depthbench / Per-job training",
    variables=[
        query_var("sweep", "Sweep",
                  "label_values(depthbench_worker_job_step, sweep)"),
        query_var("arch", "Architecture",
                  'label_values(depthbench_worker_job_step{sweep=~"$sweep"}, '
                  'arch)'),
        query_var("job", "Job",
                  'label_values(depthbench_worker_job_step{sweep=~"$sweep",'
                  'arch=~"$arch"}, job_id)'),
    ],
    refresh="10s",
    panels=[
        panel(1, "Training loss", "timeseries",
              [(f"depthbench_worker_job_training_loss{{{JOB_SEL}}}",
                "{{arch}} {{job_id}}")], 0, 0, w=24, h=10),
        panel(2, "Validation loss", "timeseries",
              [(f"depthbench_worker_job_validation_loss{{{JOB_SEL}}}",
                "{{arch}} {{job_id}}")], 0, 10),
        panel(3, "Tokens per second", "timeseries",
              [(f"depthbench_worker_job_tokens_per_second{{{JOB_SEL}}}",
                "{{arch}} {{job_id}}")], 12, 10, unit="short"),
        panel(4, "Step", "timeseries",
              [(f"depthbench_worker_job_step{{{JOB_SEL}}}",
                "{{arch}} {{job_id}}")], 0, 18),
        panel(5, "Mean tokens per second by architecture", "timeseries",
              [(f"avg by (arch) (depthbench_worker_job_tokens_per_second"
                f"{{{JOB_SEL}}})", "{{arch}}")], 12, 18, unit="short"),
    ])

fleet = dashboard(
    "depthbench-fleet", "depthbench / Fleet",
    panels=[
        panel(1, "Workers", "timeseries",
              [('sum(up{job="depthbench-worker"})', "scraped and up", "A"),
               ("sum(depthbench_scheduler_workers_connected)",
                "connected (scheduler's view)", "B")], 0, 0),
        panel(2, "Slot use", "timeseries",
              [("sum by (state) (depthbench_worker_slots)", "{{state}}")],
              12, 0, stacked=True),
        panel(3, "Slot utilisation", "gauge",
              [('sum(depthbench_worker_slots{state="busy"}) / '
                "clamp_min(sum(depthbench_worker_slots), 1)", "busy",
                "A", True)], 0, 8, w=6, unit="percentunit"),
        panel(4, "Busy slots per worker", "timeseries",
              [('depthbench_worker_slots{state="busy"}', "{{instance}}")],
              6, 8, w=18),
        panel(5, "Last heartbeat age", "timeseries",
              [("depthbench_worker_last_heartbeat_age_seconds",
                "{{instance}}")], 0, 16, unit="s"),
        panel(6, "Metric relay backlog", "timeseries",
              [("depthbench_worker_relay_backlog_points", "{{instance}}")],
              12, 16),
        panel(7, "Trainer child restarts (1h)", "timeseries",
              [("increase(depthbench_worker_child_restarts_total[1h])",
                "{{instance}}")], 0, 24),
        panel(8, "Versions", "table",
              [("depthbench_build_info", "", "A", True)], 12, 24),
        panel(9, "Checkpoint write time (p50 / p99, 1h)", "timeseries",
              [("histogram_quantile(0.5, sum by (le, instance) (rate("
                "depthbench_worker_checkpoint_duration_seconds_bucket[1h])))",
                "p50 {{instance}}", "A"),
               ("histogram_quantile(0.99, sum by (le, instance) (rate("
                "depthbench_worker_checkpoint_duration_seconds_bucket[1h])))",
                "p99 {{instance}}", "B")], 0, 32, unit="s",
              description="Trainer checkpoint writes (temp file, fsync, "
                          "rename). A lost worker costs at most one "
                          "checkpoint period of training."),
    ])

for name, dash in [("sweep_overview", sweeps), ("job_training", training),
                   ("fleet", fleet)]:
    path = OUT / f"{name}.json"
    path.write_text(json.dumps(dash, indent=2) + "\n")
    print(path)
