// The scheduler's core: sweeps in, jobs out under leases, metrics and
// results back. Every state change is one SQLite transaction; the gRPC
// services (grpc_services.h: SweepServiceImpl, WorkerServiceImpl) are thin
// wrappers over these Status-returning methods, which speak the
// depthbench.v1 messages.
//
// Job states: pending -> leased -> running -> succeeded | diverged | failed |
// cancelled | pruned (successive halving stopped it at a rung: terminal,
// never retried). Successive halving also pauses a run at a rung (paused:
// stopped, not leased, not an attempt used) until it is promoted (back to
// pending, resuming from its checkpoint) or pruned. LR transfer creates jobs `held` (not leased) that become
// pending when their group's sub-grid reaches their LR, or `skipped`
// (terminal, never run) once the group is decided without them. An acquired attempt counts against max_attempts; a failed
// attempt or an expired lease re-queues the job with exponential backoff
// until the attempts are used up (then `failed`); divergence is final; an
// interrupted attempt (worker shutting down) re-queues at once and does not
// count. Reports from an attempt that no longer holds its job's lease are
// refused with FailedPrecondition.
//
// Failed commits (disk full, I/O error): memory (leases, caches), counters
// and observer events change only after a transaction commits, so a failed
// one changes nothing; its RPC fails and may be re-sent, and lease expiry is
// retried by the next ExpireLeases(). CheckDatabase() reports the database
// unwritable (and the log says so) until a commit succeeds again;
// ExpireLeases() probes for that while nothing else writes.
//
// Restart: Create() on an existing file re-grants every leased/running job a
// fresh lease TTL; workers re-attach by listing their running attempts in
// RegisterWorker/Heartbeat, and unclaimed leases expire normally.
//
// Reads (GetSweep, ListSweeps, ListJobs, GetJob, QueryResults, ReadWatch,
// CountJobsBySweepAndState) run on read-only connections (storage::
// ReaderPool), each on a WAL snapshot, and never take the mutex that the
// lease path (AcquireJob, Heartbeat, ReportMetrics, FinishJob) and every
// other state change hold; a read sees every change whose call returned
// before it started. A database in memory, or one opened with an exclusive
// lock (storage::DatabaseOptions), has no second connection: there reads
// share the writer connection under the mutex.
//
// Thread safety: every public method is safe to call concurrently; one
// mutex serialises state changes (the read-write connection and the lease
// table). Ownership: owns the Database and the readers; borrows the Clock,
// which must outlive it.
#ifndef DEPTHBENCH_SCHEDULER_SCHEDULER_H_
#define DEPTHBENCH_SCHEDULER_SCHEDULER_H_

#include <atomic>
#include <cstdint>
#include <functional>
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
#include "scheduler/best_lr.h"
#include "scheduler/lease_manager.h"
#include "scheduler/strategies/asha.h"
#include "scheduler/sweep_expander.h"
#include "scheduler/watch_hub.h"
#include "storage/reader_pool.h"
#include "storage/sqlite.h"
#include "storage/stores.h"
#include "trainer_core/shapes.h"

namespace depthbench::scheduler {

// Told about the events that SchedulerCounters counts, as they happen, so a
// metrics exporter (scheduler/scheduler_metrics.h) can follow them without
// the core depending on the metrics library. Every method has an empty
// default.
//
// Thread safety: the Scheduler calls these with its mutex held, from any of
// its callers' threads. Implementations must be thread-safe, fast and
// non-blocking (atomic increments), and must not call back into the
// Scheduler. Events of a state change are reported once its transaction
// has committed; a failed commit (disk full, I/O error) reports none.
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
  // (attempts exhausted), "cancelled" or "pruned".
  virtual void OnJobFinished(depthbench::v1::JobState state) { (void)state; }
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
  // The database stopped (false) or started again (true) accepting writes
  // (disk full, I/O error; see Scheduler::CheckDatabase).
  virtual void OnStorageWritable(bool writable) { (void)writable; }
};

// List responses (ListJobs, ListSweeps) end their page before the next item
// would take them past this many bytes (gRPC's default limit is 4 MiB).
inline constexpr size_t kListPageBytes = 1 << 20;

struct SchedulerOptions {
  int64_t lease_ttl_ms = 30000;
  int64_t heartbeat_interval_ms = 10000;
  // For Open(): synchronous=NORMAL or FULL (storage/sqlite.h states what
  // each keeps through a crash or a power loss).
  storage::Durability durability = storage::Durability::kNormal;
  // Read-only connections for the read methods (>= 1); unused for a
  // database in memory.
  int reader_connections = 4;
  // Borrowed; null for none. Must outlive the Scheduler.
  SchedulerObserver* observer = nullptr;
  // Live points kept per watched job for WatchJob streams (watch_hub.h); a
  // stream further behind reads SQLite.
  size_t watch_ring_points = 2048;  // ~150 KB per watched job
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
  int64_t jobs_pruned = 0;       // stopped by successive halving
  int64_t attempts_retried = 0;  // failed or expired attempts re-queued
  int64_t attempts_interrupted = 0;
  int64_t points_accepted = 0;
  int64_t points_duplicate = 0;
  int64_t stale_reports = 0;     // refused: attempt not current
  int64_t storage_failures = 0;  // times the database stopped accepting writes
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

class Scheduler;

// One WatchJob stream: the job's stored points first (SQLite, under the
// scheduler's mutex, in pages), then live points from the WatchHub ring
// that ingestion fills after each commit, so that watchers cost ingestion
// one copy per batch and no lock wait; back to SQLite if the stream falls
// behind the ring. A state read takes the scheduler's mutex only after a
// state change.
//
// Thread safety: one thread at a time per JobWatch. Ownership: borrows the
// Scheduler, which must outlive it.
class JobWatch {
 public:
  JobWatch(const JobWatch&) = delete;
  JobWatch& operator=(const JobWatch&) = delete;

  // The next points (at most `limit`) and the job's current state; when
  // caught up, waits up to `wait` (real time) for a new point or state
  // change first. A job's points committed with a state change (e.g. the
  // final points of FinishJob) come no later than that state. NotFound for
  // an unknown (or deleted) job.
  absl::StatusOr<WatchBatch> Next(int64_t limit, absl::Duration wait);

 private:
  friend class Scheduler;
  JobWatch(Scheduler* scheduler, int64_t job_id, int64_t from_step)
      : scheduler_(scheduler), job_id_(job_id), from_step_(from_step) {}

  Scheduler* const scheduler_;
  const int64_t job_id_;
  const int64_t from_step_;
  int64_t cursor_ = 0;  // row id of the last point seen
  bool live_ = false;   // caught up with storage: reading the ring
  uint64_t seen_epoch_ = 0;
  depthbench::v1::JobState state_ = depthbench::v1::JOB_STATE_UNSPECIFIED;
  int64_t attempt_id_ = 0;
  int64_t resumed_from_step_ = -1;  // of the current attempt (WatchBatch)
  std::shared_ptr<WatchHub::Channel> channel_;
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
  // Pages by page_size and by bytes (kListPageBytes).
  absl::StatusOr<depthbench::v1::ListSweepsResponse> ListSweeps(
      const depthbench::v1::ListSweepsRequest& request = {});
  absl::StatusOr<depthbench::v1::CancelSweepResponse> CancelSweep(
      const std::string& name);
  // Deletes the sweep, its jobs, attempts, points and results in one
  // transaction. FailedPrecondition while any job is leased or running,
  // unless `force`, which cancels them (their workers are told by the next
  // heartbeat) in the same transaction.
  absl::StatusOr<depthbench::v1::DeleteSweepResponse> DeleteSweep(
      const depthbench::v1::DeleteSweepRequest& request);
  absl::StatusOr<depthbench::v1::ListJobsResponse> ListJobs(
      const depthbench::v1::ListJobsRequest& request);
  absl::StatusOr<depthbench::v1::Job> GetJob(int64_t job_id);
  absl::StatusOr<depthbench::v1::RetryJobResponse> RetryJob(
      const depthbench::v1::RetryJobRequest& request);
  // Rows of every group (first page) and one page of runs; InvalidArgument
  // names a bad page_size or page_token.
  absl::StatusOr<depthbench::v1::QueryResultsResponse> QueryResults(
      const depthbench::v1::QueryResultsRequest& request);
  // The first page with the default page size.
  absl::StatusOr<depthbench::v1::QueryResultsResponse> QueryResults(
      const std::string& sweep);
  // Points of the job after `after_row_id` with step >= from_step, plus its
  // state: the canonical history (each step once; storage/stores.h
  // MetricStore) when attempt_id is 0, else every stored point of that
  // attempt. NotFound for an unknown job, or an attempt not of this job.
  absl::StatusOr<WatchBatch> ReadWatch(int64_t job_id, int64_t after_row_id,
                                       int64_t from_step, int64_t limit,
                                       int64_t attempt_id = 0);
  // A reader for one WatchJob stream of the job's canonical history
  // (points with step >= from_step).
  std::unique_ptr<JobWatch> Watch(int64_t job_id, int64_t from_step);
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

  // Jobs by (sweep name, state): one GROUP BY on a reader (for the metrics
  // exporter's scrape-time gauge).
  absl::StatusOr<std::vector<storage::SweepStateCount>> CountJobsBySweepAndState();
  // OK when the database answers a query, its schema is at the version
  // this binary migrates to, and its last write did not fail for want of
  // space or I/O (until a later commit succeeds); Unavailable otherwise (for
  // /readyz).
  absl::Status CheckDatabase();

  SchedulerCounters Counters() const;
  const SchedulerOptions& options() const { return options_; }

 private:
  Scheduler(std::unique_ptr<storage::Database> db, Clock* clock,
            SchedulerOptions options);

  // Runs `read(storage::Database*)` on a reader snapshot, or under mu_ on
  // the writer connection when there are no readers (in-memory database).
  template <typename F>
  auto Read(F&& read) -> decltype(read(static_cast<storage::Database*>(nullptr)));

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
  // Queues an effect on memory or metrics of the open transaction's change;
  // it runs after the commit succeeds, never after a rollback.
  void AfterCommit(std::function<void()> effect) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Logs and reports a change of the database's write health.
  void NoteStorageHealth() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Notes that `worker_id` was heard from now.
  void SawWorker(const std::string& worker_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t ConnectedWorkersLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Called when train job `job` moved from `from_state` to job.state:
  // updates its LR's tally (O(1)), then the results row of its (arch, shape)
  // group from the group's tallies (O(LRs)), moves the best-run mark and
  // queues diagnostics once the group is complete. Caller holds a
  // transaction.
  absl::Status UpdateGroup(const storage::JobRecord& job, depthbench::v1::JobState from_state)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Recounts the tally of the job's (group, lr) from its jobs.
  // FinishJob's steps: the answer to a re-sent FinishJob (or its refusal);
  // the request's last points (and the rungs they decide); the job's new
  // state from the request's status. The caller holds a transaction.
  absl::StatusOr<depthbench::v1::FinishJobResponse> RepeatedFinish(
      const depthbench::v1::FinishJobRequest& request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status StoreFinalPoints(storage::JobRecord& job,
                                const depthbench::v1::FinishJobRequest& request, int64_t now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ApplyFinish(storage::JobRecord& job, depthbench::v1::JobState from_state,
                           const depthbench::v1::FinishJobRequest& request, int64_t now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // SubmitSweep's steps, in its transaction: the planned jobs (ids chosen
  // here), then each LR's job count and each group's empty results row.
  absl::Status InsertPlannedJobs(const storage::SweepRecord& sweep,
                                 const depthbench::v1::SweepSpec& spec,
                                 const ExpandedSweep& expanded, int64_t now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status InsertPlannedResults(int64_t sweep_id, const ExpandedSweep& expanded)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // DecideRungs' last step: `job` pruned (terminal; its group updated) or
  // paused at the rung reached at `step`, with `reason`.
  absl::Status StopAtRung(storage::JobRecord& job, bool prune, const std::string& reason,
                          std::optional<double> val_loss, int64_t step, int64_t now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status RecountLr(const storage::JobRecord& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds `delta` (its group key filled from `job`) to job's LR tally;
  // recounts the LR from its jobs when it has no tally row yet.
  absl::Status ApplyLrDelta(const storage::JobRecord& job, storage::LrTally delta)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // UpdateGroup's steps: the group's results row (and the best-run mark)
  // from `selection`, then the diagnose job of the group's target, if due.
  absl::Status WriteGroupResult(const storage::JobRecord& changed,
                                const GroupSelection& selection)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status QueueDiagnosis(const storage::JobRecord& changed, const GroupSelection& selection,
                              const std::vector<storage::LrTally>& tallies)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status RecordDiagnostics(const storage::JobRecord& job,
                                 const depthbench::v1::FinishJobRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // --- Strategies (issue 15; scheduler/strategies/asha.h) ---
  // The sweep's strategy (validated at submit), cached.
  absl::StatusOr<const strategies::StrategySettings*> StrategyFor(int64_t sweep_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The decision steps of a successive-halving train job (from its config),
  // cached.
  absl::StatusOr<std::vector<int64_t>> RungStepsFor(const storage::JobRecord& job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Successive halving: decides every rung that `points` (just stored for
  // `job`'s current attempt) reach, recording each decision in rung_results
  // in the caller's transaction, and resolves the group's paused runs
  // (ResolveGroupRungs). When the job is paused (state paused, attempt
  // outcome paused, not counted against max_attempts) or pruned (state
  // pruned, its group updated), returns the reason and sets *pruned for a
  // prune; the caller releases the lease once committed. `finished`: the
  // run ended with these points (FinishJob): its decisions are recorded as
  // promotions and never stop it.
  absl::StatusOr<std::optional<std::string>> DecideRungs(
      storage::JobRecord& job, const std::vector<storage::MetricRecord>& points, bool finished,
      bool* pruned = nullptr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The group's recorded rung decisions (rung_results) as the rung rule
  // reads them.
  absl::StatusOr<std::vector<strategies::RungEntry>> GroupRungEntries(
      const storage::JobRecord& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Successive halving: applies strategies::ResolveRungs to `group_of`'s
  // group until nothing changes: a paused run promoted becomes pending
  // (resumes from its checkpoint), one pruned becomes pruned; both update
  // its rung_results row in the caller's transaction and set
  // rungs_changed_. `reporting_job` (0: none) is the run whose report is
  // being decided: only its rows change here, DecideRungs acts on it.
  // Reentry (through UpdateGroup) is a no-op.
  absl::Status ResolveGroupRungs(const storage::JobRecord& group_of, int64_t reporting_job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A diverged successive-halving run is a loser at every rung it has no
  // decision at (recorded as "diverged", loss NULL).
  absl::Status RecordDivergedRungs(const storage::JobRecord& job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // LR transfer, after a train job of `changed`'s group ended: releases the
  // other shapes' sub-grids once the reference group is decided, widens a
  // group whose best LR is on an edge of its sub-grid, and marks the LRs a
  // decided group never needs as skipped. Caller holds a transaction.
  absl::Status AdvanceTransfer(const storage::JobRecord& changed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // AdvanceTransfer's steps: the decided reference group releases the other
  // shapes' sub-grids; a decided group skips the LRs it still holds.
  absl::Status StartTransferredShapes(const storage::JobRecord& changed,
                                      const std::vector<ModelShape>& shapes,
                                      const ModelShape& ref, const GroupSelection& selection)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status SkipHeld(const std::vector<storage::GroupMember>& members, double best_lr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Held jobs of the group at `lrs` -> pending.
  absl::Status ReleaseHeld(const storage::JobRecord& group_of, const std::vector<double>& lrs)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Bumps ChangeVersion() and wakes WaitForChange(); unless only metric
  // points were added, also tells the WatchHub that a state changed.
  void Bump(bool state_changed = true);

  friend class JobWatch;
  // Stores a group of queued reports in one transaction and sets each one's
  // result (the group-commit leader calls it, without ingest_mu_).
  struct PendingReport;
  void CommitReports(const std::vector<PendingReport*>& group) ABSL_LOCKS_EXCLUDED(mu_);
  // CommitReports' steps: the reports whose attempt holds a lease (the
  // others are refused, the live leases renewed); one report's points and
  // state changes in the group's transaction; its answer once committed.
  struct ReportOutcome {
    storage::InsertCounts counts;
    std::vector<storage::MetricRecord> stored;
    int64_t replay_through = -1;
    std::optional<std::string> stopped;  // paused/pruned: why
    bool stop_is_prune = false;
  };
  std::vector<std::pair<PendingReport*, Lease*>> LiveReports(
      const std::vector<PendingReport*>& group) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status StoreReport(const PendingReport& r, const Lease& lease, int64_t now_wall,
                           ReportOutcome* out, bool* state_changed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AnswerReport(PendingReport& r, Lease* lease, ReportOutcome& outcome)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The step `attempt_id` resumed from, -1 when not yet reported (cached).
  absl::StatusOr<int64_t> ResumedFromLocked(int64_t attempt_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stores an attempt's points (caller holds a transaction): records
  // `resumed_from_step` when given (and supersedes earlier attempts' later
  // points), and stores points at or before the attempt's resume step only
  // where the canonical history lacks them. Returns that step (-1: unknown).
  // `stored` (optional) gets the points actually inserted, for the WatchHub.
  absl::StatusOr<int64_t> StorePointsLocked(int64_t job_id, int64_t attempt_id,
                                            std::optional<int64_t> resumed_from_step,
                                            const std::vector<storage::MetricRecord>& points,
                                            storage::InsertCounts* counts,
                                            std::vector<storage::MetricRecord>* stored = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Clock* const clock_;
  const SchedulerOptions options_;
  SchedulerObserver* const observer_;  // options_.observer or a no-op

  // Thread-safe on its own; null for a database in memory.
  std::unique_ptr<storage::ReaderPool> readers_;

  mutable absl::Mutex mu_;
  std::unique_ptr<storage::Database> db_ ABSL_GUARDED_BY(mu_);
  storage::SweepStore sweeps_ ABSL_GUARDED_BY(mu_);
  storage::JobStore jobs_ ABSL_GUARDED_BY(mu_);
  storage::WorkerStore workers_ ABSL_GUARDED_BY(mu_);
  storage::MetricStore metrics_ ABSL_GUARDED_BY(mu_);
  storage::ResultStore results_ ABSL_GUARDED_BY(mu_);
  LeaseManager leases_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, depthbench::v1::SweepSpec> spec_cache_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, strategies::StrategySettings> strategy_cache_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, std::vector<int64_t>> rung_steps_ ABSL_GUARDED_BY(mu_);  // by job id
  bool resolving_rungs_ ABSL_GUARDED_BY(mu_) = false;
  bool rungs_changed_ ABSL_GUARDED_BY(mu_) = false;  // a paused run promoted/pruned
  std::map<std::string, storage::WorkerRecord> worker_cache_ ABSL_GUARDED_BY(mu_);
  SchedulerCounters counters_ ABSL_GUARDED_BY(mu_);
  // Attempt id -> the step it resumed from (-1: not reported); a cache of
  // attempts.resumed_from_step for the ingestion path.
  std::map<int64_t, int64_t> resumed_from_ ABSL_GUARDED_BY(mu_);
  // Worker id -> monotonic ms it was last heard from.
  std::map<std::string, int64_t> last_contact_ms_ ABSL_GUARDED_BY(mu_);
  // AfterCommit() effects of the open transaction.
  std::vector<std::function<void()>> after_commit_ ABSL_GUARDED_BY(mu_);
  bool storage_writable_ ABSL_GUARDED_BY(mu_) = true;

  WatchHub hub_;  // its own lock; Publish/StateChanged run under mu_
  // Group commit of ReportMetrics (see there). Never held with mu_ taken
  // first: the leader releases it before taking mu_.
  absl::Mutex ingest_mu_;
  std::vector<PendingReport*> ingest_queue_ ABSL_GUARDED_BY(ingest_mu_);
  bool ingest_leader_ ABSL_GUARDED_BY(ingest_mu_) = false;

  std::atomic<uint64_t> change_version_{0};
  absl::Mutex change_mu_;
  absl::CondVar change_cv_;
};


}  // namespace depthbench::scheduler

#endif  // DEPTHBENCH_SCHEDULER_SCHEDULER_H_
