// Every metric depthbench exports, in one table, so that the daemons, the
// Grafana dashboards and the alert rules (dashboards/) agree on names, types
// and labels. The registration helpers in common/daemon_metrics.h build the
// families from this table; tests/common/dashboards_test.cc checks that every
// PromQL expression in dashboards/ names only metrics listed here.
//
// All names carry the `depthbench_` prefix. Counters end in `_total`;
// durations are in seconds (`_seconds`). Histogram names are the base name:
// Prometheus exposes `<name>_bucket`, `<name>_sum` and `<name>_count`.
//
// Label values the daemons use:
//   state (scheduler jobs)   pending, leased, running, succeeded, diverged,
//                            failed, cancelled
//   state (worker slots)     busy, free
//   code (RPCs)              grpc::StatusCode name: OK, NOT_FOUND, ...
//   method (RPCs)            RPC method name: AcquireJob, Heartbeat, ...
//
// Thread safety: constants only.
#ifndef DEPTHBENCH_COMMON_METRIC_NAMES_H_
#define DEPTHBENCH_COMMON_METRIC_NAMES_H_

#include <cstddef>

namespace depthbench {

// --- Both daemons -----------------------------------------------------------
// gauge {component, version}: always 1; component is "scheduler"/"worker".
inline constexpr char kBuildInfo[] = "depthbench_build_info";
// counter {family}: collect-on-scrape callbacks that failed (registry-owned).
inline constexpr char kMetricsCollectErrors[] =
    "depthbench_metrics_collect_errors_total";

// --- Scheduler --------------------------------------------------------------
// gauge {sweep, state}: jobs per sweep and state, read from SQLite per scrape.
inline constexpr char kSchedulerJobs[] = "depthbench_scheduler_jobs";
// counter {state}: jobs reaching a terminal state (succeeded, diverged,
// failed after its last attempt, cancelled).
inline constexpr char kSchedulerJobsFinished[] =
    "depthbench_scheduler_jobs_finished_total";
// counter: leases handed out by AcquireJob.
inline constexpr char kSchedulerLeasesGranted[] =
    "depthbench_scheduler_leases_granted_total";
// counter: leases that expired because heartbeats stopped.
inline constexpr char kSchedulerLeasesExpired[] =
    "depthbench_scheduler_leases_expired_total";
// counter {reason}: attempts re-queued (lease_expired, failed, interrupted,
// manual).
inline constexpr char kSchedulerJobRetries[] =
    "depthbench_scheduler_job_retries_total";
// counter {method, code}: finished RPCs.
inline constexpr char kSchedulerRpcs[] = "depthbench_scheduler_rpcs_total";
// histogram {method, code}: RPC handling time in seconds.
inline constexpr char kSchedulerRpcDuration[] =
    "depthbench_scheduler_rpc_duration_seconds";
// counter: metric points stored (new (job, attempt, step, name) keys).
inline constexpr char kSchedulerMetricPointsIngested[] =
    "depthbench_scheduler_metric_points_ingested_total";
// counter: metric points received again and skipped (idempotent resend).
inline constexpr char kSchedulerMetricPointsDuplicate[] =
    "depthbench_scheduler_metric_points_duplicate_total";
// histogram {txn}: SQLite transaction time in seconds, by transaction kind.
inline constexpr char kSchedulerSqliteTransactionDuration[] =
    "depthbench_scheduler_sqlite_transaction_duration_seconds";
// gauge: registered workers whose heartbeats are current.
inline constexpr char kSchedulerWorkersConnected[] =
    "depthbench_scheduler_workers_connected";

// --- Worker -----------------------------------------------------------------
// gauge {state}: job slots busy / free.
inline constexpr char kWorkerSlots[] = "depthbench_worker_slots";
// gauge {job_id, sweep, arch}: last training loss of a running job.
inline constexpr char kWorkerJobTrainingLoss[] =
    "depthbench_worker_job_training_loss";
// gauge {job_id, sweep, arch}: last validation loss of a running job.
inline constexpr char kWorkerJobValidationLoss[] =
    "depthbench_worker_job_validation_loss";
// gauge {job_id, sweep, arch}: last reported training throughput.
inline constexpr char kWorkerJobTokensPerSecond[] =
    "depthbench_worker_job_tokens_per_second";
// gauge {job_id, sweep, arch}: last reported optimiser step.
inline constexpr char kWorkerJobStep[] = "depthbench_worker_job_step";
// gauge: seconds since the last acknowledged heartbeat (computed per scrape).
inline constexpr char kWorkerLastHeartbeatAge[] =
    "depthbench_worker_last_heartbeat_age_seconds";
// counter: trainer child processes started again for the same job.
inline constexpr char kWorkerChildRestarts[] =
    "depthbench_worker_child_restarts_total";
// gauge: metric points buffered by the relay, not yet acknowledged.
inline constexpr char kWorkerRelayBacklog[] =
    "depthbench_worker_relay_backlog_points";
// Histogram: how long the trainers' checkpoint writes took (issue 19).
inline constexpr char kWorkerCheckpointDuration[] =
    "depthbench_worker_checkpoint_duration_seconds";

// Per-job label names of the worker's job gauges, in order.
inline constexpr const char* kJobLabelNames[] = {"job_id", "sweep", "arch"};

// One row per metric: the single source of names, types, labels and help.
struct MetricSpec {
  const char* name;
  const char* type;    // "counter", "gauge" or "histogram"
  const char* labels;  // comma-separated label names, "" for none
  const char* help;
};

inline constexpr MetricSpec kMetricSpecs[] = {
    {kBuildInfo, "gauge", "component,version",
     "Always 1; labels carry the daemon kind and its version."},
    {kMetricsCollectErrors, "counter", "family",
     "Collect-on-scrape callbacks that failed, by metric family."},
    {kSchedulerJobs, "gauge", "sweep,state",
     "Jobs by sweep and state, read from the database at scrape time."},
    {kSchedulerJobsFinished, "counter", "state",
     "Jobs that reached a terminal state, by state."},
    {kSchedulerLeasesGranted, "counter", "", "Job leases granted."},
    {kSchedulerLeasesExpired, "counter", "",
     "Job leases that expired without heartbeats."},
    {kSchedulerJobRetries, "counter", "reason",
     "Job attempts re-queued for another try, by reason."},
    {kSchedulerRpcs, "counter", "method,code",
     "RPCs handled, by method and status code."},
    {kSchedulerRpcDuration, "histogram", "method,code",
     "RPC handling time in seconds, by method and status code."},
    {kSchedulerMetricPointsIngested, "counter", "",
     "Training metric points stored."},
    {kSchedulerMetricPointsDuplicate, "counter", "",
     "Training metric points received again and skipped (idempotent)."},
    {kSchedulerSqliteTransactionDuration, "histogram", "txn",
     "SQLite transaction time in seconds, by transaction kind."},
    {kSchedulerWorkersConnected, "gauge", "",
     "Registered workers with current heartbeats."},
    {kWorkerSlots, "gauge", "state", "Job slots by state (busy, free)."},
    {kWorkerJobTrainingLoss, "gauge", "job_id,sweep,arch",
     "Last training loss reported by a running job."},
    {kWorkerJobValidationLoss, "gauge", "job_id,sweep,arch",
     "Last validation loss reported by a running job."},
    {kWorkerJobTokensPerSecond, "gauge", "job_id,sweep,arch",
     "Last training throughput of a running job in tokens per second."},
    {kWorkerJobStep, "gauge", "job_id,sweep,arch",
     "Last optimiser step reported by a running job."},
    {kWorkerLastHeartbeatAge, "gauge", "",
     "Seconds since the scheduler last acknowledged a heartbeat."},
    {kWorkerChildRestarts, "counter", "",
     "Trainer child processes started again for the same job."},
    {kWorkerRelayBacklog, "gauge", "",
     "Metric points buffered by the relay and not yet acknowledged."},
    {kWorkerCheckpointDuration, "histogram", "",
     "Time the trainers took to write a checkpoint (temp file, fsync, rename), in seconds."},
};
inline constexpr size_t kMetricSpecCount =
    sizeof(kMetricSpecs) / sizeof(kMetricSpecs[0]);

}  // namespace depthbench

#endif  // DEPTHBENCH_COMMON_METRIC_NAMES_H_
