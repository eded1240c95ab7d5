// Connects the scheduler to its Prometheus metrics (common/daemon_metrics.h):
//
//   SchedulerMetricsObserver  a SchedulerObserver that turns the core's events
//                             into counter, gauge and histogram updates;
//   SchedulerScrapeSource     what is read at scrape time (jobs by sweep and
//                             state, /readyz) from the Scheduler.
//
//   MetricsRegistry registry;
//   SchedulerScrapeSource source;
//   ASSIGN_OR_RETURN(SchedulerMetrics metrics, RegisterSchedulerMetrics(
//       &registry, version, [&source] { return source.JobsBySweepAndState(); }));
//   SchedulerMetricsObserver observer(metrics);
//   options.observer = &observer;   // then Scheduler::Open(db_path, ...)
//   source.Attach(scheduler.get());
//   server_options.rpc_observer = [metrics](auto& m, auto& c, double s) {
//     metrics.RecordRpc(m, c, s); };
//
// Thread safety: both classes are safe to use from any thread. Ownership:
// the observer copies the SchedulerMetrics bundle (pointers into a registry
// that must outlive it); the source borrows the Scheduler.
#ifndef DEPTHBENCH_SCHEDULER_SCHEDULER_METRICS_H_
#define DEPTHBENCH_SCHEDULER_SCHEDULER_METRICS_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/daemon_metrics.h"
#include "common/metrics.h"
#include "scheduler/scheduler.h"

namespace depthbench::scheduler {

// Label values of the scheduler's labelled counters. Their children are
// created at 0 up front so that increase()/rate() see the first event.
inline constexpr const char* kTerminalJobStates[] = {"succeeded", "diverged",
                                                     "failed", "cancelled"};
inline constexpr const char* kRetryReasons[] = {"lease_expired", "failed",
                                                "interrupted", "manual"};
// Every job state, in lifecycle order (labels of depthbench_scheduler_jobs).
inline constexpr const char* kJobStates[] = {"pending",   "leased",  "running",
                                             "succeeded", "diverged", "failed",
                                             "cancelled"};

class SchedulerMetricsObserver final : public SchedulerObserver {
 public:
  explicit SchedulerMetricsObserver(SchedulerMetrics metrics);

  void OnLeaseGranted() override;
  void OnLeasesExpired(int64_t count) override;
  void OnJobRetried(const std::string& reason) override;
  void OnJobFinished(depthbench::v1::JobState state) override;
  void OnMetricPoints(int64_t accepted, int64_t duplicates) override;
  void OnTransaction(const char* txn, double seconds) override;
  void OnWorkersConnected(int64_t count) override;

 private:
  const SchedulerMetrics metrics_;
};

// What is read at scrape time, from the Scheduler once attached: jobs by
// (sweep, state) and readiness. The scheduler's SQLite connection holds the
// file in exclusive locking mode, so there is no second read connection;
// each scrape takes the scheduler's mutex for one GROUP BY (the collect
// callback runs with no registry lock held, and the scheduler takes registry
// locks only inside observer calls, so the lock order is acyclic).
class SchedulerScrapeSource {
 public:
  SchedulerScrapeSource() = default;
  SchedulerScrapeSource(const SchedulerScrapeSource&) = delete;
  SchedulerScrapeSource& operator=(const SchedulerScrapeSource&) = delete;

  // Borrowed; must outlive every later call. Call before serving HTTP.
  void Attach(Scheduler* scheduler) { scheduler_.store(scheduler); }

  // One sample per (sweep, state) for every sweep that has jobs and every
  // state in kJobStates (0 where no job is in that state), so a state
  // emptying shows as 0 rather than as a vanished series. Unavailable before
  // Attach().
  absl::StatusOr<std::vector<CollectedSample>> JobsBySweepAndState() const;

  // Scheduler::CheckDatabase(); Unavailable before Attach().
  absl::Status CheckReady() const;

 private:
  std::atomic<Scheduler*> scheduler_{nullptr};
};

}  // namespace depthbench::scheduler

#endif  // DEPTHBENCH_SCHEDULER_SCHEDULER_METRICS_H_
