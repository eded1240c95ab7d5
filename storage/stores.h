// Typed access to the scheduler's tables, one store per table family. Stores
// hold no state beyond the Database pointer; transactions belong to the
// caller (the scheduler opens one per state change and calls several stores
// inside it).
//
// Thread safety: as Database (caller serialises). Ownership: stores borrow
// the Database, which must outlive them.
#ifndef DEPTHBENCH_STORAGE_STORES_H_
#define DEPTHBENCH_STORAGE_STORES_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "storage/records.h"
#include "storage/sqlite.h"

namespace depthbench::storage {

class SweepStore {
 public:
  explicit SweepStore(Database* db) : db_(db) {}
  // AlreadyExists when the name is taken.
  absl::StatusOr<int64_t> Insert(const SweepRecord& sweep);
  absl::StatusOr<std::optional<SweepRecord>> FindByName(const std::string& name);
  absl::StatusOr<std::optional<SweepRecord>> Get(int64_t id);
  absl::StatusOr<std::vector<SweepRecord>> List();
  // Up to `limit` sweeps with id > after_id, by id (ListSweeps paging).
  absl::StatusOr<std::vector<SweepRecord>> ListPage(int64_t after_id, int64_t limit);
  absl::Status SetCancelled(int64_t id, bool cancelled);
  // Deletes the sweep and everything of its jobs: metric points,
  // diagnostics, attempts, results rows, the jobs, the sweep row. The caller
  // holds the transaction that makes this all-or-nothing.
  absl::Status Delete(int64_t id);

 private:
  Database* db_;
};

struct JobFilter {
  int64_t sweep_id = 0;  // 0: any
  depthbench::v1::JobState state = depthbench::v1::JOB_STATE_UNSPECIFIED;  // any
  std::string arch;      // empty: any
  int64_t after_id = 0;  // pagination cursor
  int64_t limit = 100;
};

struct SweepStateCount {
  std::string sweep;
  depthbench::v1::JobState state = depthbench::v1::JOB_STATE_UNSPECIFIED;
  int64_t count = 0;
};

class JobStore {
 public:
  explicit JobStore(Database* db) : db_(db) {}
  // Inserts with job.id when it is > 0 (AlreadyExists when taken), else
  // with the next free id; returns the id.
  absl::StatusOr<int64_t> Insert(const JobRecord& job);
  // The largest job id (0 when none).
  absl::StatusOr<int64_t> MaxId();
  // NotFound names the id.
  absl::StatusOr<JobRecord> Get(int64_t id);
  // Writes every mutable column of `job` (matched by id).
  absl::Status Update(const JobRecord& job);
  // Sets only the is_best flag (NotFound when no such job).
  absl::Status SetBest(int64_t id, bool is_best);
  // The id of the oldest pending job runnable at `now_wall_ms` whose
  // resource needs fit and whose label requirements (a JSON object) `accept`
  // approves, looking at no more than `scan_limit` runnable jobs; nullopt
  // when none. Reads only the pending-jobs index (schema v4).
  absl::StatusOr<std::optional<int64_t>> FindRunnable(
      int64_t now_wall_ms, int64_t devices, int64_t memory_mb,
      const std::function<bool(const std::string& req_labels)>& accept,
      int64_t scan_limit);
  absl::StatusOr<std::vector<JobRecord>> List(const JobFilter& filter);
  absl::StatusOr<std::vector<JobRecord>> ListInStates(
      const std::vector<depthbench::v1::JobState>& states);
  absl::StatusOr<std::vector<JobRecord>> ListBySweep(int64_t sweep_id);
  // Train jobs of one (arch, shape) group of a sweep, by id: the columns
  // best-LR selection needs.
  // The config of one train job of the group (they share shape and
  // budget); "{}" when the group has none.
  absl::StatusOr<std::string> GroupConfig(int64_t sweep_id, const std::string& arch,
                                          int64_t layers, int64_t d_model);
  absl::StatusOr<std::vector<GroupMember>> ListGroup(int64_t sweep_id,
                                                     const std::string& arch,
                                                     int64_t layers,
                                                     int64_t d_model);
  // Train jobs of a sweep with id > after_id, by id, at most `limit`.
  absl::StatusOr<std::vector<RunRecord>> ListRuns(int64_t sweep_id, int64_t after_id,
                                                  int64_t limit);
  // Whether any job names `parent_job_id` as its parent.
  absl::StatusOr<bool> HasChildren(int64_t parent_job_id);
  // Count of jobs by state for a sweep.
  absl::StatusOr<std::map<depthbench::v1::JobState, int64_t>> CountByState(int64_t sweep_id);
  // Count of jobs by (sweep name, state) over every sweep, ordered by sweep
  // name then state (one GROUP BY; for the metrics exporter).
  absl::StatusOr<std::vector<SweepStateCount>> CountBySweepAndState();

  absl::StatusOr<int64_t> InsertAttempt(const AttemptRecord& attempt);
  absl::StatusOr<std::optional<AttemptRecord>> GetAttempt(int64_t attempt_id);
  absl::Status EndAttempt(int64_t attempt_id, int64_t end_ms,
                          const std::string& outcome, const std::string& reason);
  absl::StatusOr<std::vector<AttemptRecord>> ListAttempts(int64_t job_id);
  // Records where the attempt's trainer started (schema v5).
  absl::Status SetResumedFromStep(int64_t attempt_id, int64_t step);
  absl::StatusOr<int64_t> CountAttempts(int64_t job_id);

 private:
  absl::StatusOr<std::vector<JobRecord>> ReadJobs(Query& query);
  Database* db_;
};

class WorkerStore {
 public:
  explicit WorkerStore(Database* db) : db_(db) {}
  absl::Status Upsert(const WorkerRecord& worker);
  absl::StatusOr<std::optional<WorkerRecord>> Get(const std::string& id);
  absl::Status Touch(const std::string& id, int64_t now_ms);

 private:
  Database* db_;
};

struct InsertCounts {
  int64_t accepted = 0;
  int64_t duplicates = 0;
};

// The job's canonical history (schema v5): every point not superseded. A
// point of attempt A at step S is superseded once a later attempt B of the
// same job resumed from a step below S (Supersede); it stays stored under A.
class MetricStore {
 public:
  explicit MetricStore(Database* db) : db_(db) {}
  // Idempotent on (job, attempt, step, name): a point already stored is
  // counted as a duplicate and left unchanged. A point with step <=
  // `replay_through` (an attempt re-publishing a step it resumed past) is
  // stored only when the canonical history has no point of that (job, step,
  // name); otherwise it counts as a duplicate. -1: no replayed steps.
  // `stored`, when given, gets the points inserted (not the duplicates)
  // with their row ids.
  absl::StatusOr<InsertCounts> Insert(const std::vector<MetricRecord>& points,
                                      int64_t replay_through = -1,
                                      std::vector<MetricRecord>* stored = nullptr);
  // Attempt `attempt_id` of `job_id` resumed from `step`: marks the canonical
  // points of earlier attempts with a later step as superseded by it.
  // Returns how many. Idempotent.
  absl::StatusOr<int64_t> Supersede(int64_t job_id, int64_t attempt_id, int64_t step);
  // Points of `job_id` with row_id > after_row_id and step >= from_step, in
  // insertion order: the canonical history when attempt_id is 0, else every
  // stored point of that attempt (superseded ones included).
  absl::StatusOr<std::vector<MetricRecord>> Read(int64_t job_id,
                                                 int64_t after_row_id,
                                                 int64_t from_step,
                                                 int64_t limit,
                                                 int64_t attempt_id = 0);
  // Stored points of one attempt (superseded ones included).
  absl::StatusOr<int64_t> Count(int64_t job_id, int64_t attempt_id);
  // Writes and removes a 64 KiB row inside the caller's transaction: new
  // pages that a full disk (or max_page_count) refuses. Committing it tells
  // whether writes succeed again; it leaves no row behind.
  absl::Status ProbeWrite();

 private:
  Database* db_;
};

class ResultStore {
 public:
  explicit ResultStore(Database* db) : db_(db) {}
  // Inserts the row, or updates the existing row of its (sweep, arch,
  // layers, d_model) in place.
  absl::Status Upsert(const ResultRecord& row);
  absl::StatusOr<std::optional<ResultRecord>> Get(int64_t sweep_id,
                                                  const std::string& arch,
                                                  int64_t layers,
                                                  int64_t d_model);
  absl::StatusOr<std::vector<ResultRecord>> List(int64_t sweep_id);
  absl::Status InsertDiagnostic(const DiagnosticRecord& diagnostic);

  // Per-LR tallies (table result_lrs). AddLrJobs counts `count` new train
  // jobs at the tally's (group, lr), creating the row.
  absl::Status AddLrJobs(const LrTally& key, int64_t count);
  // Adds the counts and loss_sum of `delta` to its (group, lr) row and
  // offers delta.best_job_id/best_val_loss as the LR's best run (kept when
  // its loss is lower, or equal with a lower id). NotFound when no row.
  absl::Status ApplyLrDelta(const LrTally& delta);
  // Replaces the row's counts by `tally`'s (recomputation).
  absl::Status SetLrTally(const LrTally& tally);
  // The group's tallies, ascending LR.
  absl::StatusOr<std::vector<LrTally>> ListLrs(int64_t sweep_id, const std::string& arch,
                                               int64_t layers, int64_t d_model);
  absl::StatusOr<std::vector<DiagnosticRecord>> ListDiagnostics(int64_t job_id);
  // Successive-halving decisions (table rung_results, schema v7).
  // AlreadyExists-like failure (constraint) when the run has one at the rung.
  absl::Status InsertRung(const RungRecord& rung);
  // A paused run's row at `rung` gets its final decision ("promote" or
  // "prune"); NotFound when the run has no row there.
  absl::Status UpdateRungDecision(int64_t job_id, int rung, const std::string& decision,
                                  int64_t decided_ms);
  // Every decision of the group's train runs, by (job id, rung).
  absl::StatusOr<std::vector<RungRecord>> ListGroupRungs(int64_t sweep_id,
                                                         const std::string& arch,
                                                         int64_t layers, int64_t d_model);

 private:
  Database* db_;
};

}  // namespace depthbench::storage

#endif  // DEPTHBENCH_STORAGE_STORES_H_
