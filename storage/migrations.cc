#include "storage/migrations.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "storage/views.h"

namespace depthbench::storage {
namespace {

// 1: the initial schema.
constexpr char kV1InitialSchema[] = R"sql(
CREATE TABLE sweeps(
  id INTEGER PRIMARY KEY,
  name TEXT NOT NULL UNIQUE,
  spec BLOB NOT NULL,
  created_ms INTEGER NOT NULL,
  cancelled INTEGER NOT NULL DEFAULT 0);
CREATE TABLE jobs(
  id INTEGER PRIMARY KEY,
  sweep_id INTEGER NOT NULL REFERENCES sweeps(id),
  kind TEXT NOT NULL,
  state TEXT NOT NULL,
  arch TEXT NOT NULL,
  layers INTEGER NOT NULL,
  d_model INTEGER NOT NULL,
  lr REAL NOT NULL,
  seed INTEGER NOT NULL,
  config_json TEXT NOT NULL,
  attempts_used INTEGER NOT NULL DEFAULT 0,
  max_attempts INTEGER NOT NULL,
  current_attempt_id INTEGER NOT NULL DEFAULT 0,
  worker_id TEXT NOT NULL DEFAULT '',
  not_before_ms INTEGER NOT NULL DEFAULT 0,
  val_loss REAL,
  final_step INTEGER NOT NULL DEFAULT 0,
  reason TEXT NOT NULL DEFAULT '',
  checkpoint_dir TEXT NOT NULL,
  is_best INTEGER NOT NULL DEFAULT 0,
  parent_job_id INTEGER NOT NULL DEFAULT 0,
  req_devices INTEGER NOT NULL DEFAULT 0,
  req_memory_mb INTEGER NOT NULL DEFAULT 0,
  req_labels TEXT NOT NULL DEFAULT '{}',
  created_ms INTEGER NOT NULL,
  updated_ms INTEGER NOT NULL);
CREATE INDEX jobs_by_state ON jobs(state, id);
CREATE INDEX jobs_by_sweep ON jobs(sweep_id, id);
CREATE TABLE attempts(
  id INTEGER PRIMARY KEY,
  job_id INTEGER NOT NULL REFERENCES jobs(id),
  number INTEGER NOT NULL,
  worker_id TEXT NOT NULL,
  start_ms INTEGER NOT NULL,
  end_ms INTEGER NOT NULL DEFAULT 0,
  outcome TEXT NOT NULL DEFAULT 'running',
  reason TEXT NOT NULL DEFAULT '');
CREATE INDEX attempts_by_job ON attempts(job_id, id);
CREATE TABLE workers(
  id TEXT PRIMARY KEY,
  devices INTEGER NOT NULL,
  memory_mb INTEGER NOT NULL,
  slots INTEGER NOT NULL,
  registered_ms INTEGER NOT NULL,
  last_seen_ms INTEGER NOT NULL);
CREATE TABLE metric_points(
  id INTEGER PRIMARY KEY,
  job_id INTEGER NOT NULL,
  attempt_id INTEGER NOT NULL,
  step INTEGER NOT NULL,
  name TEXT NOT NULL,
  value REAL NOT NULL,
  wall_ms INTEGER NOT NULL,
  UNIQUE(job_id, attempt_id, step, name));
CREATE TABLE results(
  sweep_id INTEGER NOT NULL,
  arch TEXT NOT NULL,
  layers INTEGER NOT NULL,
  d_model INTEGER NOT NULL,
  aspect_ratio REAL NOT NULL,
  params INTEGER NOT NULL,
  best_lr REAL,
  best_val_loss REAL,
  best_job_id INTEGER NOT NULL DEFAULT 0,
  lrs_json TEXT NOT NULL DEFAULT '[]',
  complete INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY(sweep_id, arch, layers, d_model));
CREATE TABLE diagnostics(
  job_id INTEGER NOT NULL,
  kind TEXT NOT NULL,
  data_json TEXT NOT NULL,
  created_ms INTEGER NOT NULL,
  PRIMARY KEY(job_id, kind));
)sql";

// 2: worker labels, room for diagnostics summaries on results rows
// (R_causal, R_perm, D_eff/L: issue 6), and step-ordered reads of a
// job's points for WatchJob resume.
constexpr char kV2LabelsAndDiagnostics[] = R"sql(
ALTER TABLE workers ADD COLUMN labels_json TEXT NOT NULL DEFAULT '{}';
ALTER TABLE results ADD COLUMN diagnostics_json TEXT NOT NULL DEFAULT '{}';
CREATE INDEX metric_points_by_job_step ON metric_points(job_id, step);
)sql";

// 3: group and parent lookups run on every finished job; without
// these they scan the whole sweep (O(jobs) per FinishJob).
constexpr char kV3GroupAndParentIndexes[] = R"sql(
CREATE INDEX jobs_by_group ON jobs(sweep_id, arch, layers, d_model);
CREATE INDEX jobs_by_parent ON jobs(parent_job_id);
)sql";

// 4: fewer index pages written per lease. jobs_by_state held every job,
// so each AcquireJob and each FinishJob moved an entry between two
// parts of it (two more WAL frames per commit). AcquireJob reads only
// pending jobs: a partial index over them is left alone by a job's
// later leased -> running -> finished changes, and covers AcquireJob's
// query (SQLite 3.40 reads the table for `state` unless it is a column).
constexpr char kV4PendingJobsIndex[] = R"sql(
DROP INDEX jobs_by_state;
CREATE INDEX jobs_pending
  ON jobs(state, id, not_before_ms, req_devices, req_memory_mb, req_labels)
  WHERE state = 'pending';
)sql";

// 5: per-(group, LR) tallies kept up to date as each run ends, so a
// finished run updates its group's results row in O(LRs) instead of
// re-reading the group's runs (issue 14). Filled from the jobs of
// sweeps submitted before this version.
constexpr char kV5LrTallies[] = R"sql(
CREATE TABLE result_lrs(
  sweep_id INTEGER NOT NULL,
  arch TEXT NOT NULL,
  layers INTEGER NOT NULL,
  d_model INTEGER NOT NULL,
  lr REAL NOT NULL,
  jobs INTEGER NOT NULL DEFAULT 0,
  ended INTEGER NOT NULL DEFAULT 0,
  succeeded INTEGER NOT NULL DEFAULT 0,
  diverged INTEGER NOT NULL DEFAULT 0,
  failed INTEGER NOT NULL DEFAULT 0,
  loss_sum REAL NOT NULL DEFAULT 0,
  best_job_id INTEGER NOT NULL DEFAULT 0,
  best_val_loss REAL,
  PRIMARY KEY(sweep_id, arch, layers, d_model, lr));
INSERT INTO result_lrs(sweep_id, arch, layers, d_model, lr, jobs, ended,
                       succeeded, diverged, failed, loss_sum, best_job_id,
                       best_val_loss)
SELECT sweep_id, arch, layers, d_model, lr, COUNT(*),
  SUM(state IN ('succeeded', 'diverged', 'failed', 'cancelled')),
  SUM(state = 'succeeded' AND val_loss IS NOT NULL),
  SUM(state = 'diverged'),
  SUM(state IN ('failed', 'cancelled') OR (state = 'succeeded' AND val_loss IS NULL)),
  TOTAL(CASE WHEN state = 'succeeded' THEN val_loss END),
  COALESCE((SELECT b.id FROM jobs b WHERE b.sweep_id = j.sweep_id AND
            b.kind = 'train' AND b.arch = j.arch AND b.layers = j.layers AND
            b.d_model = j.d_model AND b.lr = j.lr AND b.state = 'succeeded' AND
            b.val_loss IS NOT NULL ORDER BY b.val_loss, b.id LIMIT 1), 0),
  MIN(CASE WHEN state = 'succeeded' THEN val_loss END)
FROM jobs j WHERE kind = 'train'
GROUP BY sweep_id, arch, layers, d_model, lr;
)sql";

// 6: live points with exactly-once history (issue 19). Workers relay
// every point as it is logged, so a retried attempt that resumes from
// an earlier checkpoint re-logs steps an earlier attempt already
// stored. attempts.resumed_from_step is the step the attempt resumed
// from (NULL until its first report says); metric_points.superseded_by
// names the later attempt whose resume abandoned the point (0: part of
// the job's canonical history). Abandoned points stay readable per
// attempt. canonical_metric_points is the history every reader
// (WatchJob, reports, SQL users) should count.
constexpr char kV6SupersededPoints[] = R"sql(
ALTER TABLE attempts ADD COLUMN resumed_from_step INTEGER;
ALTER TABLE metric_points ADD COLUMN superseded_by INTEGER NOT NULL DEFAULT 0;
CREATE VIEW canonical_metric_points AS
  SELECT id, job_id, attempt_id, step, name, value, wall_ms
  FROM metric_points WHERE superseded_by = 0;
)sql";

// 7: successive halving (issue 15). One row per decision a train run
// got at a rung, written in the transaction that acts on it (prunes the
// job, or lets it go on), so a restart neither loses nor repeats one.
// val_loss NULL: the run diverged (a loser at every rung it missed).
// decision: 'promote', 'prune', 'diverged', or (issue 15 follow-up)
// 'pause' until the run is promoted or pruned (the row is updated).
constexpr char kV7RungResults[] = R"sql(
CREATE TABLE rung_results(
  job_id INTEGER NOT NULL,
  rung INTEGER NOT NULL,
  step INTEGER NOT NULL,
  val_loss REAL,
  decision TEXT NOT NULL,
  decided_ms INTEGER NOT NULL,
  PRIMARY KEY(job_id, rung));
)sql";

// Migrations()[i] takes the schema from version i to i + 1. Never edit a
// shipped step: databases at every version must migrate alike.
const std::vector<std::string>& Migrations() {
  static const auto* migrations = new std::vector<std::string>{
      kV1InitialSchema,
      kV2LabelsAndDiagnostics,
      kV3GroupAndParentIndexes,
      kV4PendingJobsIndex,
      kV5LrTallies,
      kV6SupersededPoints,
      kV7RungResults,
  };
  return *migrations;
}

}  // namespace

int64_t LatestSchemaVersion() { return static_cast<int64_t>(Migrations().size()); }

absl::StatusOr<int64_t> SchemaVersion(Database* db) {
  RETURN_IF_ERROR(db->Exec(
      "CREATE TABLE IF NOT EXISTS schema_version(version INTEGER NOT NULL)"));
  ASSIGN_OR_RETURN(Query query,
                   db->Prepare("SELECT COALESCE(MAX(version), 0) FROM schema_version"));
  ASSIGN_OR_RETURN(bool row, query.Step());
  return row ? query.ColumnInt(0) : 0;
}

absl::Status Migrate(Database* db, int64_t target) {
  if (target < 0) target = LatestSchemaVersion();
  ASSIGN_OR_RETURN(int64_t version, SchemaVersion(db));
  if (version > LatestSchemaVersion()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "database ", db->path(), " has schema version ", version,
        " but this binary knows only up to ", LatestSchemaVersion()));
  }
  // The public views (storage/views.h) name tables and columns; a
  // migration that rebuilds a table must not find them in its way.
  if (version < target) RETURN_IF_ERROR(DropViews(db));
  for (int64_t v = version; v < target; ++v) {
    ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db));
    absl::Status status = db->Exec(Migrations()[v]);
    if (!status.ok()) {
      return absl::Status(status.code(), absl::StrCat("migration to version ",
                                                      v + 1, ": ", status.message()));
    }
    RETURN_IF_ERROR(db->Exec("DELETE FROM schema_version"));
    ASSIGN_OR_RETURN(Query bump,
                     db->Prepare("INSERT INTO schema_version(version) VALUES (?)"));
    RETURN_IF_ERROR(bump.Bind(1, v + 1).Run());
    RETURN_IF_ERROR(txn.Commit());
  }
  if (target == LatestSchemaVersion()) RETURN_IF_ERROR(InstallViews(db));
  return absl::OkStatus();
}

}  // namespace depthbench::storage
