#include "scheduler/scheduler_metrics.h"

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "storage/job_text.h"
#include "storage/stores.h"

namespace depthbench::scheduler {

SchedulerMetricsObserver::SchedulerMetricsObserver(SchedulerMetrics metrics)
    : metrics_(metrics) {
  for (const char* state : kTerminalJobStates) {
    metrics_.jobs_finished->WithLabelValues({state});
  }
  for (const char* reason : kRetryReasons) {
    metrics_.job_retries->WithLabelValues({reason});
  }
}

void SchedulerMetricsObserver::OnLeaseGranted() { metrics_.leases_granted->Increment(); }

void SchedulerMetricsObserver::OnLeasesExpired(int64_t count) {
  metrics_.leases_expired->Increment(static_cast<double>(count));
}

void SchedulerMetricsObserver::OnJobRetried(const std::string& reason) {
  metrics_.job_retries->WithLabelValues({reason}).Increment();
}

void SchedulerMetricsObserver::OnJobFinished(depthbench::v1::JobState state) {
  metrics_.jobs_finished->WithLabelValues({storage::JobStateText(state)}).Increment();
}

void SchedulerMetricsObserver::OnMetricPoints(int64_t accepted, int64_t duplicates) {
  metrics_.metric_points_ingested->Increment(static_cast<double>(accepted));
  metrics_.metric_points_duplicate->Increment(static_cast<double>(duplicates));
}

void SchedulerMetricsObserver::OnTransaction(const char* txn, double seconds) {
  metrics_.sqlite_transaction_duration->WithLabelValues({txn}).Observe(seconds);
}

void SchedulerMetricsObserver::OnWorkersConnected(int64_t count) {
  metrics_.workers_connected->Set(static_cast<double>(count));
}

absl::StatusOr<std::vector<CollectedSample>> SchedulerScrapeSource::JobsBySweepAndState()
    const {
  Scheduler* scheduler = scheduler_.load();
  if (scheduler == nullptr) return absl::UnavailableError("scheduler not started yet");
  ASSIGN_OR_RETURN(std::vector<storage::SweepStateCount> counts,
                   scheduler->CountJobsBySweepAndState());
  std::map<std::string, std::map<std::string, int64_t>> by_sweep;
  for (const storage::SweepStateCount& c : counts) by_sweep[c.sweep][storage::JobStateText(c.state)] = c.count;
  std::vector<CollectedSample> out;
  for (const auto& [sweep, states] : by_sweep) {
    std::map<std::string, int64_t> all = states;
    for (const char* state : kJobStates) all.emplace(state, 0);
    for (const auto& [state, n] : all) {
      out.push_back({{sweep, state}, static_cast<double>(n)});
    }
  }
  return out;
}

absl::Status SchedulerScrapeSource::CheckReady() const {
  Scheduler* scheduler = scheduler_.load();
  if (scheduler == nullptr) return absl::UnavailableError("scheduler not started yet");
  return scheduler->CheckDatabase();
}

}  // namespace depthbench::scheduler
