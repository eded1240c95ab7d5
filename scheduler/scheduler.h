// The scheduler's core: sweeps in, jobs out under leases, metrics and
// results back. Every state change is one SQLite transaction; the gRPC
// services (sweep_service.h, worker_service.h) are thin wrappers over these
// Status-returning methods, which speak the depthbench.v1 messages.
//
// Job states: pending -> leased -> running -> succeeded | diverged | failed |
// cancelled. An acquired attempt counts against max_attempts; a failed
// attempt or an expired lease re-queues the job with exponential backoff
// until the attempts are used up (then `failed`); divergence is final; an
// interrupted attempt (worker shutting down) re-queues at once and does not
// count. Reports from an attempt that no longer holds its job's lease are
// refused with FailedPrecondition.
//
// Restart: Create() on an existing file re-grants every leased/running job a
// fresh lease TTL; workers re-attach by listing their running attempts in
// RegisterWorker/Heartbeat, and unclaimed leases expire normally.
//
// Thread safety: every public method is safe to call concurrently; one
// mutex serialises access to the database and the lease table. Ownership:
// owns the Database; borrows the Clock, which must outlive it.
#ifndef DEPTHBENCH_SCHEDULER_SCHEDULER_H_
#define DEPTHBENCH_SCHEDULER_SCHEDULER_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "depthbench/v1/sweep_service.pb.h"
#include "depthbench/v1/worker_service.pb.h"
#include "scheduler/lease_manager.h"
#include "storage/sqlite.h"
#include "storage/stores.h"

namespace depthbench::scheduler {

// Told about the events that SchedulerCounters counts, as they happen, so a
// metrics exporter (scheduler/scheduler_metrics.h) can follow them without
// the core depending on the metrics library. Every method has an empty
// default.
//
// Thread safety: the Scheduler calls these with its mutex held, from any of
// its callers' threads. Implementations must be thread-safe, fast and
// non-blocking (atomic increments), and must not call back into the
// Scheduler. Events of a state change are reported just before its
// transaction commits; a failed commit (rare: disk full, I/O error) can
// therefore over-count by that change.
class SchedulerObserver {
 public:
  virtual ~SchedulerObserver() = default;
  // AcquireJob granted a lease.
  virtual void OnLeaseGranted() {}
  // `count` leases expired without heartbeats.
  virtual void OnLeasesExpired(int64_t count) { (void)count; }
  // An attempt was re-queued for another try. `reason` is one of
  // "lease_expired", "failed", "interrupted", "manual" (RetryJob).
  virtual void OnJobRetried(const std::string& reason) { (void)reason; }
  // A job reached the terminal `state`: "succeeded", "diverged", "failed"
  // (attempts exhausted) or "cancelled".
  virtual void OnJobFinished(const std::string& state) { (void)state; }
  // Metric points stored (new keys) and skipped as duplicates.
  virtual void OnMetricPoints(int64_t accepted, int64_t duplicates) {
    (void)accepted;
    (void)duplicates;
  }
  // One SQLite transaction of kind `txn` (e.g. "acquire_job") took
  // `seconds` from BEGIN to COMMIT (or to ROLLBACK when it failed).
  virtual void OnTransaction(const char* txn, double seconds) {
    (void)txn;
    (void)seconds;
  }
  // Workers heard from (RegisterWorker, Heartbeat, AcquireJob) within the
  // last lease TTL; reported by every ExpireLeases() call.
  virtual void OnWorkersConnected(int64_t count) { (void)count; }
};

struct SchedulerOptions {
  int64_t lease_ttl_ms = 30000;
  int64_t heartbeat_interval_ms = 10000;
  // Borrowed; null for none. Must outlive the Scheduler.
  SchedulerObserver* observer = nullptr;
};

// Monotonic counters, read with Scheduler::Counters(). The metrics exporter
// follows the same events through SchedulerObserver.
struct SchedulerCounters {
  int64_t sweeps_submitted = 0;
  int64_t jobs_created = 0;
  int64_t leases_granted = 0;
  int64_t leases_expired = 0;
  int64_t jobs_succeeded = 0;
  int64_t jobs_diverged = 0;
  int64_t jobs_failed = 0;       // final failures
  int64_t jobs_cancelled = 0;
  int64_t attempts_retried = 0;  // failed or expired attempts re-queued
  int64_t attempts_interrupted = 0;
  int64_t points_accepted = 0;
  int64_t points_duplicate = 0;
  int64_t stale_reports = 0;     // refused: attempt not current
  int64_t active_leases = 0;     // gauge
};

// One read of WatchJob's stream.
struct WatchBatch {
  std::vector<storage::MetricRecord> points;
  depthbench::v1::JobState state = depthbench::v1::JOB_STATE_UNSPECIFIED;
  int64_t attempt_id = 0;  // the job's current attempt
  // The step the current attempt resumed from when it is a retry (number >
  // 1) whose start was reported; -1 otherwise.
  int64_t resumed_from_step = -1;
};

class Scheduler {
 public:
  // Migrates the schema and reloads leases of running jobs.
  static absl::StatusOr<std::unique_ptr<Scheduler>> Create(
      std::unique_ptr<storage::Database> db, Clock* clock,
      SchedulerOptions options = {});
  // Opens (creating) the file at `path`, then Create().
  static absl::StatusOr<std::unique_ptr<Scheduler>> Open(
      const std::string& path, Clock* clock, SchedulerOptions options = {});

  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // --- SweepService -------------------------------------------------------
  absl::StatusOr<depthbench::v1::SubmitSweepResponse> SubmitSweep(
      const depthbench::v1::SweepSpec& spec);
  absl::StatusOr<depthbench::v1::Sweep> GetSweep(const std::string& name);
  absl::StatusOr<depthbench::v1::ListSweepsResponse> ListSweeps();
  absl::StatusOr<depthbench::v1::CancelSweepResponse> CancelSweep(
      const std::string& name);
  absl::StatusOr<depthbench::v1::ListJobsResponse> ListJobs(
      const depthbench::v1::ListJobsRequest& request);
  absl::StatusOr<depthbench::v1::Job> GetJob(int64_t job_id);
  absl::StatusOr<depthbench::v1::RetryJobResponse> RetryJob(
      const depthbench::v1::RetryJobRequest& request);
  absl::StatusOr<depthbench::v1::QueryResultsResponse> QueryResults(
      const std::string& sweep);
  // Points of the job after `after_row_id` with step >= from_step, plus its
  // state: the canonical history (each step once; storage/stores.h
  // MetricStore) when attempt_id is 0, else every stored point of that
  // attempt. NotFound for an unknown job, or an attempt not of this job.
  absl::StatusOr<WatchBatch> ReadWatch(int64_t job_id, int64_t after_row_id,
                                       int64_t from_step, int64_t limit,
                                       int64_t attempt_id = 0);
  // A counter bumped on every metric insert and state change.
  uint64_t ChangeVersion() const { return change_version_.load(); }
  // Blocks until ChangeVersion() != seen or the timeout passes (real time;
  // used by streaming handlers only).
  void WaitForChange(uint64_t seen, absl::Duration timeout);

  // --- WorkerService ------------------------------------------------------
  absl::StatusOr<depthbench::v1::RegisterWorkerResponse> RegisterWorker(
      const depthbench::v1::RegisterWorkerRequest& request);
  absl::StatusOr<depthbench::v1::HeartbeatResponse> Heartbeat(
      const depthbench::v1::HeartbeatRequest& request);
  absl::StatusOr<depthbench::v1::AcquireJobResponse> AcquireJob(
      const depthbench::v1::AcquireJobRequest& request);
  // One chunk of a ReportMetrics stream. Concurrent calls are group
  // committed: whichever caller finds no commit in progress stores every
  // chunk queued so far in one transaction, so many workers' small live
  // batches cost one commit, not one each; each call returns once its chunk
  // is committed (or refused). A chunk with resumed_from_step records where
  // the attempt started and moves earlier attempts' later points out of the
  // canonical history.
  absl::StatusOr<depthbench::v1::ReportMetricsResponse> ReportMetrics(
      const depthbench::v1::ReportMetricsRequest& request);
  absl::StatusOr<depthbench::v1::FinishJobResponse> FinishJob(
      const depthbench::v1::FinishJobRequest& request);

  // Expires leases whose TTL passed (driven by the Clock; the server calls
  // it periodically, tests after FakeClock::AdvanceMs). Returns how many.
  // Also reports ConnectedWorkers() to the observer.
  absl::StatusOr<int64_t> ExpireLeases();

  // Workers that called RegisterWorker, Heartbeat or AcquireJob within the
  // last lease TTL (monotonic clock). Not persisted: after a restart a
  // worker counts once it is heard from again.
  int64_t ConnectedWorkers() const;

  // Jobs by (sweep name, state): one GROUP BY under the mutex (for the
  // metrics exporter's scrape-time gauge).
  absl::StatusOr<std::vector<storage::SweepStateCount>> CountJobsBySweepAndState();
  // OK when the database answers a query and its schema is at the version
  // this binary migrates to; Unavailable otherwise (for /readyz).
  absl::Status CheckDatabase();

  SchedulerCounters Counters() const;
  const SchedulerOptions& options() const { return options_; }

 private:
  Scheduler(std::unique_ptr<storage::Database> db, Clock* clock,
            SchedulerOptions options);

  absl::Status LoadLeases() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<int64_t> ExpireLeasesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The sweep's spec, cached; the pointer stays valid while mu_ is held.
  absl::StatusOr<const depthbench::v1::SweepSpec*> SpecFor(int64_t sweep_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<storage::SweepRecord> SweepByName(const std::string& name)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<depthbench::v1::Sweep> SweepProto(const storage::SweepRecord& s)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<storage::WorkerRecord> Worker(const std::string& id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Checks (job, attempt) pairs a worker says it runs: renews valid leases,
  // returns cancellations for the rest.
  std::vector<depthbench::v1::Cancellation> Reattach(
      const std::string& worker_id,
      const google::protobuf::RepeatedPtrField<depthbench::v1::RunningAttempt>& running)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Re-queues (with backoff) or fails a job whose attempt ended badly.
  // `reason` is recorded on the job; `retry_reason` labels the retry for
  // the observer ("failed", "lease_expired"). Caller holds a transaction.
  absl::Status RequeueOrFail(storage::JobRecord& job, const std::string& reason,
                             const std::string& retry_reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts a transaction whose BEGIN..COMMIT/ROLLBACK time is reported to
  // the observer under `txn`.
  class TimedTransaction;
  absl::StatusOr<TimedTransaction> BeginTransaction(const char* txn)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Notes that `worker_id` was heard from now.
  void SawWorker(const std::string& worker_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t ConnectedWorkersLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Recomputes the results row of the job's (arch, shape) group, marks the
  // best run and queues diagnostics once the group is complete. Caller holds
  // a transaction.
  absl::Status UpdateGroup(const storage::JobRecord& job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status RecordDiagnostics(const storage::JobRecord& job,
                                 const depthbench::v1::FinishJobRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Bumps ChangeVersion() and wakes WaitForChange().
  void Bump();
  // Stores a group of queued reports in one transaction and sets each one's
  // result (the group-commit leader calls it, without ingest_mu_).
  struct PendingReport;
  void CommitReports(const std::vector<PendingReport*>& group) ABSL_LOCKS_EXCLUDED(mu_);
  // The step `attempt_id` resumed from, -1 when not yet reported (cached).
  absl::StatusOr<int64_t> ResumedFromLocked(int64_t attempt_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stores an attempt's points (caller holds a transaction): records
  // `resumed_from_step` when given (and supersedes earlier attempts' later
  // points), and stores points at or before the attempt's resume step only
  // where the canonical history lacks them. Returns that step (-1: unknown).
  absl::StatusOr<int64_t> StorePointsLocked(int64_t job_id, int64_t attempt_id,
                                            std::optional<int64_t> resumed_from_step,
                                            const std::vector<storage::MetricRecord>& points,
                                            storage::InsertCounts* counts)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Clock* const clock_;
  const SchedulerOptions options_;
  SchedulerObserver* const observer_;  // options_.observer or a no-op

  mutable absl::Mutex mu_;
  std::unique_ptr<storage::Database> db_ ABSL_GUARDED_BY(mu_);
  storage::SweepStore sweeps_ ABSL_GUARDED_BY(mu_);
  storage::JobStore jobs_ ABSL_GUARDED_BY(mu_);
  storage::WorkerStore workers_ ABSL_GUARDED_BY(mu_);
  storage::MetricStore metrics_ ABSL_GUARDED_BY(mu_);
  storage::ResultStore results_ ABSL_GUARDED_BY(mu_);
  LeaseManager leases_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, depthbench::v1::SweepSpec> spec_cache_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, storage::WorkerRecord> worker_cache_ ABSL_GUARDED_BY(mu_);
  SchedulerCounters counters_ ABSL_GUARDED_BY(mu_);
  // Attempt id -> the step it resumed from (-1: not reported); a cache of
  // attempts.resumed_from_step for the ingestion path.
  std::map<int64_t, int64_t> resumed_from_ ABSL_GUARDED_BY(mu_);
  // Worker id -> monotonic ms it was last heard from.
  std::map<std::string, int64_t> last_contact_ms_ ABSL_GUARDED_BY(mu_);

  // Group commit of ReportMetrics (see there). Never held with mu_ taken
  // first: the leader releases it before taking mu_.
  absl::Mutex ingest_mu_;
  std::vector<PendingReport*> ingest_queue_ ABSL_GUARDED_BY(ingest_mu_);
  bool ingest_leader_ ABSL_GUARDED_BY(ingest_mu_) = false;

  std::atomic<uint64_t> change_version_{0};
  absl::Mutex change_mu_;
  absl::CondVar change_cv_;
};

// "pending" <-> PENDING etc.
std::string JobStateName(depthbench::v1::JobState state);
depthbench::v1::JobState JobStateFromName(const std::string& name);

}  // namespace depthbench::scheduler

#endif  // DEPTHBENCH_SCHEDULER_SCHEDULER_H_
