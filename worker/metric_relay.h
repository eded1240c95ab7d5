// Relays one attempt's metric points to the scheduler over ReportMetrics:
// batched, bounded, and loss-free while the scheduler is briefly away.
//
//   MetricRelay relay(&client, job_id, attempt_id, options, hooks);
//   relay.Push(points);                   // blocks while the buffer is full
//   ...
//   std::vector<MetricPoint> rest = relay.Close();  // -> FinishJob.points
//
// Delivery: a sender thread takes up to `batch` points from the front of the
// buffer once `batch` have gathered or `flush_ms` passed, sends them in one
// ReportMetrics stream and drops them from the buffer only when the call
// succeeded. A transient failure (scheduler down, deadline) keeps them and
// retries with exponential backoff; the scheduler ignores re-sent points
// (idempotent on job, attempt, step, name), so "at least once" here is
// "exactly once" in the database. FAILED_PRECONDITION means the attempt lost
// its lease: the relay turns stale, drops its buffer and calls
// hooks.on_stale once (the job runner then stops the child). So does an
// answer with a stop_reason (successive halving pruned the job with the
// points just sent; issue 15).
//
// Back-pressure: Push() blocks while the buffer holds `capacity` points, so
// a scheduler outage stalls the trainer's stdout pipe (and with it the
// trainer) instead of growing memory without bound. Unblock() lifts the
// bound for a child that is being stopped, so it can reach its checkpoint.
//
// Thread safety: every public method is thread-safe. Hooks run on the
// sender thread, without the relay's lock held. Ownership: borrows the
// client, which must outlive the relay.
#ifndef DEPTHBENCH_WORKER_METRIC_RELAY_H_
#define DEPTHBENCH_WORKER_METRIC_RELAY_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "depthbench/v1/types.pb.h"
#include "worker/scheduler_client.h"

namespace depthbench::worker {

struct MetricRelayOptions {
  size_t capacity = 20000;   // points buffered before Push() blocks
  size_t batch = 512;        // points per ReportMetrics call
  // A partial batch waits at most this long: points reach the scheduler
  // within about this plus one RPC of being logged (issue 19's live view).
  int64_t flush_ms = 250;
  int64_t initial_backoff_ms = 100;
  int64_t max_backoff_ms = 3000;
  // The flush and backoff waits are on this clock (nullptr: real time).
  const Clock* clock = nullptr;
};

struct MetricRelayHooks {
  // Buffer size changed by `delta` points (feeds relay_backlog_points).
  std::function<void(int64_t delta)> on_backlog;
  // The scheduler refused the attempt (stale lease).
  std::function<void(const std::string& reason)> on_stale;
  // Every point with step <= `step` pushed so far is stored (points are
  // pushed in nondecreasing step order).
  std::function<void(int64_t step)> on_acked;
};

class MetricRelay {
 public:
  MetricRelay(const SchedulerClient* client, int64_t job_id, int64_t attempt_id,
              MetricRelayOptions options, MetricRelayHooks hooks);
  ~MetricRelay();  // Close()
  MetricRelay(const MetricRelay&) = delete;
  MetricRelay& operator=(const MetricRelay&) = delete;

  // Appends points; blocks while full (unless unblocked, closed or stale).
  // Returns false once the relay is stale or closed (points dropped).
  bool Push(std::vector<depthbench::v1::MetricPoint> points);

  // Sends one report soon (even with nothing buffered): tells the
  // scheduler the attempt is running before any point is published. With
  // `resumed_from_step`, the report carries it (ReportMetricsRequest); it is
  // re-sent with the next report until one carrying it is acknowledged.
  void Announce(std::optional<int64_t> resumed_from_step = std::nullopt);

  // Lets Push() exceed the capacity from now on.
  void Unblock();

  // Stops the sender (waiting for an in-flight call) and returns the points
  // not acknowledged by the scheduler, oldest first. Idempotent (later calls
  // return nothing).
  std::vector<depthbench::v1::MetricPoint> Close();

  bool stale() const;
  int64_t sent_points() const;  // acknowledged so far

 private:
  void SenderLoop();
  // Waits `backoff_ms` (0: for points, then a full batch or flush_ms) and
  // fills `chunk` with the next batch; false once closing or stale.
  bool NextChunk(int64_t backoff_ms, depthbench::v1::ReportMetricsRequest* chunk);
  // `chunk` was stored: drops it from the buffer, reports the backlog and
  // the step stored through.
  void Acknowledge(const depthbench::v1::ReportMetricsRequest& chunk);
  // The scheduler refused the attempt: drops the buffer, calls on_stale.
  void BecomeStale(const absl::Status& status);

  const SchedulerClient* const client_;
  const int64_t job_id_;
  const int64_t attempt_id_;
  const MetricRelayOptions options_;
  const MetricRelayHooks hooks_;

  mutable absl::Mutex mu_;
  std::deque<depthbench::v1::MetricPoint> buffer_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool stale_ ABSL_GUARDED_BY(mu_) = false;
  bool unblocked_ ABSL_GUARDED_BY(mu_) = false;
  bool announce_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<int64_t> resume_owed_ ABSL_GUARDED_BY(mu_);
  int64_t sent_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread sender_;
};

}  // namespace depthbench::worker

#endif  // DEPTHBENCH_WORKER_METRIC_RELAY_H_
