// The worker daemon's core: registers with the scheduler, heartbeats, keeps
// one job per slot running as a `depthbench-train` child (worker/job_runner.h)
// and shuts down cleanly.
//
//   Worker worker(options, &client, RealClock::Default(), &metrics);
//   std::thread signals([&] { sigwait(...); worker.Shutdown(); });
//   worker.Run();  // returns after Shutdown(), children reported
//
// Threads: Run() is the acquire loop (a free slot -> AcquireJob, polling
// every `acquire_poll_ms` while the scheduler has nothing); a heartbeat
// thread renews the leases of every attempt still held (running, or
// waiting to report its end) and stops the attempts the scheduler lists as
// cancellations; each JobRunner has its own thread.
//
// Scheduler outages: every RPC failing with UNAVAILABLE/DEADLINE_EXCEEDED is
// retried with exponential backoff (capped at `max_backoff_ms`); children
// keep training meanwhile and their metrics wait in the relays. NOT_FOUND
// for the worker id (the scheduler lost it) triggers RegisterWorker with the
// running attempts, so their leases stay alive; attempts the scheduler no
// longer recognises come back as cancellations and are stopped.
//
// Shutdown(): stop acquiring, SIGTERM every child (each checkpoints and
// exits 4), report them INTERRUPTED (re-queued without using an attempt),
// then Run() returns.
//
// Thread safety: Shutdown() and the accessors may be called from any
// thread; Run() once. Ownership: borrows the client, clock and metrics
// (nullable), which must outlive the Worker; owns the runners.
#ifndef DEPTHBENCH_WORKER_WORKER_H_
#define DEPTHBENCH_WORKER_WORKER_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/daemon_metrics.h"
#include "worker/job_runner.h"
#include "worker/scheduler_client.h"

namespace depthbench::worker {

struct WorkerOptions {
  std::string name;  // worker id (stable across restarts)
  int slots = 1;
  int threads_per_slot = 0;  // > 0: set each job's `threads`
  int gpus = 0;              // > 0: slot i gets CUDA_VISIBLE_DEVICES=i % gpus
  int64_t memory_mb = 0;
  std::map<std::string, std::string> labels;
  std::string train_binary;
  std::string checkpoint_root;
  int64_t grace_ms = 10000;
  int64_t acquire_poll_ms = 500;
  int64_t initial_backoff_ms = 100;
  int64_t max_backoff_ms = 5000;
  // Per-attempt stderr/events log cap (JobRunnerOptions).
  int64_t attempt_log_max_bytes = 64 * 1024 * 1024;
  MetricRelayOptions relay;
};

class Worker {
 public:
  Worker(WorkerOptions options, const SchedulerClient* client, Clock* clock,
         const WorkerMetrics* metrics);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Blocks until Shutdown(); then interrupts and reports the running jobs
  // and returns OK. Returns early with the error if the first registration
  // fails permanently (e.g. UNAUTHENTICATED: a wrong token).
  absl::Status Run();
  void Shutdown();

  // Monotonic ms of the last acknowledged heartbeat/registration (0: none).
  int64_t last_heartbeat_ms() const { return last_ack_ms_.load(); }

 private:
  struct Slot {
    int index = 0;
    std::unique_ptr<JobRunner> runner;  // null: free
  };

  // RegisterWorker with the attempts held now; retries transient errors
  // with backoff until it succeeds (or the worker is stopping with nothing
  // left to keep alive). Returns a permanent error as is.
  absl::Status Register();
  bool HeldAttemptsEmptyLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HeartbeatLoop();
  // Fills free slots with acquired jobs until Shutdown() (polling while
  // idle, backing off on errors, re-registering when forgotten).
  void AcquireLoop();
  // A free slot; null when none is free or the worker is stopping.
  Slot* FreeSlot();
  // Interrupts the running jobs and waits until each is reported.
  void DrainSlots();
  // Joins and frees slots whose runner is done.
  void ReapFinished();
  void StartJob(Slot* slot, depthbench::v1::AcquireJobResponse lease)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<depthbench::v1::RunningAttempt> HeldAttempts() const;
  void ApplyCancellations(
      const google::protobuf::RepeatedPtrField<depthbench::v1::Cancellation>& cancellations);
  void UpdateSlotMetrics() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sleeps up to `ms` or until Shutdown()/a slot frees.
  void Pause(int64_t ms);

  const WorkerOptions options_;
  const SchedulerClient* const client_;
  Clock* const clock_;
  const WorkerMetrics* const metrics_;
  std::atomic<int64_t> last_ack_ms_{0};
  std::atomic<int64_t> heartbeat_interval_ms_{1000};

  absl::Mutex register_mu_;  // one RegisterWorker at a time

  mutable absl::Mutex mu_;
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool wake_ ABSL_GUARDED_BY(mu_) = false;  // a slot freed
  bool heartbeat_stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread heartbeat_;
};

}  // namespace depthbench::worker

#endif  // DEPTHBENCH_WORKER_WORKER_H_
