// Registration helpers: build the scheduler's and the worker's metric
// families from the table in common/metric_names.h, so names, labels and
// help text cannot drift from the dashboards.
//
//   MetricsRegistry registry;
//   ASSIGN_OR_RETURN(SchedulerMetrics m,
//       RegisterSchedulerMetrics(&registry, "0.1.0", jobs_by_sweep_and_state));
//   m.leases_granted->Increment();
//   m.RecordRpc("AcquireJob", "OK", 0.0012);
//
// Thread safety: the structs are plain bundles of pointers into the registry;
// every pointee is thread-safe (see common/metrics.h). Copy them freely.
// Ownership: the registry owns everything pointed to and must outlive the
// bundles.
#ifndef DEPTHBENCH_COMMON_DAEMON_METRICS_H_
#define DEPTHBENCH_COMMON_DAEMON_METRICS_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/metric_names.h"
#include "common/metrics.h"

namespace depthbench {

// Looks `name` up in kMetricSpecs; null if absent.
const MetricSpec* FindMetricSpec(const std::string& name);

// Every metric name the code exports, including histogram `_bucket`, `_sum`
// and `_count` series names. Used to check dashboard queries.
std::vector<std::string> AllExportedSeriesNames();

struct SchedulerMetrics {
  CounterFamily* jobs_finished = nullptr;    // {state}
  Counter* leases_granted = nullptr;
  Counter* leases_expired = nullptr;
  CounterFamily* job_retries = nullptr;      // {reason}
  CounterFamily* rpcs = nullptr;             // {method, code}
  HistogramFamily* rpc_duration = nullptr;   // {method, code}, seconds
  Counter* metric_points_ingested = nullptr;
  Counter* metric_points_duplicate = nullptr;
  HistogramFamily* sqlite_transaction_duration = nullptr;  // {txn}, seconds
  Gauge* workers_connected = nullptr;

  // Counts one finished RPC in `rpcs` and observes it in `rpc_duration`.
  void RecordRpc(const std::string& method, const std::string& code,
                 double seconds) const;
};

// Registers every scheduler metric plus depthbench_build_info{component=
// "scheduler"}. `jobs_by_sweep_and_state` is called at each scrape and
// returns one sample per (sweep, state) with label values in that order
// (typically a `SELECT sweep, state, COUNT(*) ... GROUP BY` on SQLite); it
// must be thread-safe. Fails if any of the names is already registered.
absl::StatusOr<SchedulerMetrics> RegisterSchedulerMetrics(
    MetricsRegistry* registry, const std::string& version,
    CollectCallback jobs_by_sweep_and_state);

// Label values identifying one job's series on a worker.
struct JobLabels {
  std::string job_id;
  std::string sweep;
  std::string arch;
  std::vector<std::string> Values() const { return {job_id, sweep, arch}; }
};

struct WorkerMetrics {
  GaugeFamily* slots = nullptr;                  // {state}: busy, free
  GaugeFamily* job_training_loss = nullptr;      // {job_id, sweep, arch}
  GaugeFamily* job_validation_loss = nullptr;    // {job_id, sweep, arch}
  GaugeFamily* job_tokens_per_second = nullptr;  // {job_id, sweep, arch}
  GaugeFamily* job_step = nullptr;               // {job_id, sweep, arch}
  Counter* child_restarts = nullptr;
  Gauge* relay_backlog_points = nullptr;
  Histogram* checkpoint_duration = nullptr;      // seconds

  // Sets slots{state="busy"} and slots{state="free"}.
  void SetSlots(int busy, int free) const;
  // Updates a running job's step, loss and throughput (one `step` event).
  void RecordStep(const JobLabels& job, int64_t step, double loss,
                  double tokens_per_second) const;
  // Updates a running job's validation loss (one `eval` event).
  void RecordEval(const JobLabels& job, double val_loss) const;
  // Observes one checkpoint write (a `checkpoint` event's `seconds`).
  void RecordCheckpoint(double seconds) const;
  // Drops every per-job series of a job that ended on this worker, so that
  // finished jobs stop being exported (and "no progress" alerts stop).
  void RemoveJob(const JobLabels& job) const;
};

// Registers every worker metric plus depthbench_build_info{component=
// "worker"}. `heartbeat_age_seconds` is called at each scrape (e.g. clock
// now minus the last acknowledged heartbeat); it must be thread-safe.
absl::StatusOr<WorkerMetrics> RegisterWorkerMetrics(
    MetricsRegistry* registry, const std::string& version,
    std::function<double()> heartbeat_age_seconds);

}  // namespace depthbench

#endif  // DEPTHBENCH_COMMON_DAEMON_METRICS_H_
