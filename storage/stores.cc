#include "storage/stores.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "storage/job_text.h"

namespace depthbench::storage {
namespace {

constexpr char kJobColumns[] =
    "id, sweep_id, kind, state, arch, layers, d_model, lr, seed, config_json, "
    "attempts_used, max_attempts, current_attempt_id, worker_id, "
    "not_before_ms, val_loss, final_step, reason, checkpoint_dir, is_best, "
    "parent_job_id, req_devices, req_memory_mb, req_labels, created_ms, "
    "updated_ms";

namespace v1 = ::depthbench::v1;

// Row mappers either cannot fail (T) or can, on a stored value outside its
// enum (absl::StatusOr<T>); ReadOne / ReadAll take both.
template <typename T>
absl::StatusOr<T> AsStatusOr(T value) {
  return value;
}
template <typename T>
absl::StatusOr<T> AsStatusOr(absl::StatusOr<T> value) {
  return value;
}
template <typename Mapper>
using RowOf = typename decltype(AsStatusOr(std::declval<Mapper>()(std::declval<const Query&>())))::value_type;

// The next row of `q` through `map`; nullopt when there is none.
template <typename Mapper>
absl::StatusOr<std::optional<RowOf<Mapper>>> ReadOne(Query& q, Mapper map) {
  ASSIGN_OR_RETURN(bool row, q.Step());
  if (!row) return std::optional<RowOf<Mapper>>();
  ASSIGN_OR_RETURN(RowOf<Mapper> value, AsStatusOr(map(q)));
  return std::optional<RowOf<Mapper>>(std::move(value));
}

// Every remaining row of `q` through `map`.
template <typename Mapper>
absl::StatusOr<std::vector<RowOf<Mapper>>> ReadAll(Query& q, Mapper map) {
  std::vector<RowOf<Mapper>> out;
  while (true) {
    ASSIGN_OR_RETURN(std::optional<RowOf<Mapper>> value, ReadOne(q, map));
    if (!value) break;
    out.push_back(std::move(*value));
  }
  return out;
}

absl::StatusOr<JobRecord> JobFromRow(const Query& q) {
  JobRecord job;
  job.id = q.ColumnInt(0);
  job.sweep_id = q.ColumnInt(1);
  ASSIGN_OR_RETURN(job.kind, ParseJobKind(q.ColumnText(2)));
  ASSIGN_OR_RETURN(job.state, ParseJobState(q.ColumnText(3)));
  job.arch = q.ColumnText(4);
  job.layers = q.ColumnInt(5);
  job.d_model = q.ColumnInt(6);
  job.lr = q.ColumnDouble(7);
  job.seed = q.ColumnInt(8);
  job.config_json = q.ColumnText(9);
  job.attempts_used = q.ColumnInt(10);
  job.max_attempts = q.ColumnInt(11);
  job.current_attempt_id = q.ColumnInt(12);
  job.worker_id = q.ColumnText(13);
  job.not_before_ms = q.ColumnInt(14);
  if (!q.ColumnIsNull(15)) job.val_loss = q.ColumnDouble(15);
  job.final_step = q.ColumnInt(16);
  job.reason = q.ColumnText(17);
  job.checkpoint_dir = q.ColumnText(18);
  job.is_best = q.ColumnInt(19) != 0;
  job.parent_job_id = q.ColumnInt(20);
  job.req_devices = q.ColumnInt(21);
  job.req_memory_mb = q.ColumnInt(22);
  job.req_labels = q.ColumnText(23);
  job.created_ms = q.ColumnInt(24);
  job.updated_ms = q.ColumnInt(25);
  return job;
}

SweepRecord SweepFromRow(const Query& q) {
  SweepRecord s;
  s.id = q.ColumnInt(0);
  s.name = q.ColumnText(1);
  s.spec = q.ColumnBlob(2);
  s.created_ms = q.ColumnInt(3);
  s.cancelled = q.ColumnInt(4) != 0;
  return s;
}

AttemptRecord AttemptFromRow(const Query& q) {
  AttemptRecord a;
  a.id = q.ColumnInt(0);
  a.job_id = q.ColumnInt(1);
  a.number = q.ColumnInt(2);
  a.worker_id = q.ColumnText(3);
  a.start_ms = q.ColumnInt(4);
  a.end_ms = q.ColumnInt(5);
  a.outcome = q.ColumnText(6);
  a.reason = q.ColumnText(7);
  if (!q.ColumnIsNull(8)) a.resumed_from_step = q.ColumnInt(8);
  return a;
}

// results.lrs_json: [{"lr":..,"val_loss":..|null,"diverged":bool,
// "succeeded":n,"diverged_runs":n,"failed_runs":n}, ...]. "diverged" is
// written for readers of the raw table; a reader here takes the counts.
std::string LrsToJson(const std::vector<LrSummary>& lrs) {
  nlohmann::json arr = nlohmann::json::array();
  for (const LrSummary& s : lrs) {
    nlohmann::json j;
    j["lr"] = s.lr;
    j["val_loss"] = s.mean_val_loss.has_value() ? nlohmann::json(*s.mean_val_loss)
                                                : nlohmann::json(nullptr);
    j["diverged"] = s.diverged > 0;
    j["succeeded"] = s.succeeded;
    j["diverged_runs"] = s.diverged;
    j["failed_runs"] = s.failed;
    arr.push_back(j);
  }
  return arr.dump();
}

absl::StatusOr<std::vector<LrSummary>> LrsFromJson(const std::string& text) {
  const nlohmann::json arr = nlohmann::json::parse(text, nullptr, false);
  if (!arr.is_array()) {
    return absl::DataLossError(absl::StrCat("results.lrs_json: not a JSON array: ", text));
  }
  std::vector<LrSummary> out;
  for (const nlohmann::json& j : arr) {
    if (!j.is_object() || !j.contains("lr") || !j["lr"].is_number()) {
      return absl::DataLossError(absl::StrCat("results.lrs_json: an entry has no numeric lr: ",
                                              j.dump()));
    }
    LrSummary s;
    s.lr = j["lr"].get<double>();
    if (j.contains("val_loss") && j["val_loss"].is_number()) {
      s.mean_val_loss = j["val_loss"].get<double>();
    }
    s.succeeded = j.value("succeeded", 0);
    // Rows from before the run counts carry only the flag.
    s.diverged = j.contains("diverged_runs") ? j.value("diverged_runs", 0)
                                             : (j.value("diverged", false) ? 1 : 0);
    s.failed = j.value("failed_runs", 0);
    out.push_back(s);
  }
  return out;
}

absl::StatusOr<ResultRecord> ResultFromRow(const Query& q) {
  ResultRecord r;
  r.sweep_id = q.ColumnInt(0);
  r.arch = q.ColumnText(1);
  r.layers = q.ColumnInt(2);
  r.d_model = q.ColumnInt(3);
  r.aspect_ratio = q.ColumnDouble(4);
  r.params = q.ColumnInt(5);
  if (!q.ColumnIsNull(6)) r.best_lr = q.ColumnDouble(6);
  if (!q.ColumnIsNull(7)) r.best_val_loss = q.ColumnDouble(7);
  r.best_job_id = q.ColumnInt(8);
  ASSIGN_OR_RETURN(r.lrs, LrsFromJson(q.ColumnText(9)));
  r.complete = q.ColumnInt(10) != 0;
  r.diagnostics_json = q.ColumnText(11);
  return r;
}

constexpr char kSweepColumns[] = "id, name, spec, created_ms, cancelled";
constexpr char kAttemptColumns[] =
    "id, job_id, number, worker_id, start_ms, end_ms, outcome, reason, "
    "resumed_from_step";
constexpr char kResultColumns[] =
    "sweep_id, arch, layers, d_model, aspect_ratio, params, best_lr, "
    "best_val_loss, best_job_id, lrs_json, complete, diagnostics_json";

}  // namespace

// --- SweepStore -------------------------------------------------------------

absl::StatusOr<int64_t> SweepStore::Insert(const SweepRecord& sweep) {
  ASSIGN_OR_RETURN(Query q, db_->Prepare(
      "INSERT INTO sweeps(name, spec, created_ms, cancelled) VALUES (?,?,?,?)"));
  q.Bind(1, sweep.name).BindBlob(2, sweep.spec).Bind(3, sweep.created_ms)
      .Bind(4, static_cast<int64_t>(sweep.cancelled));
  RETURN_IF_ERROR(q.Run());
  return db_->LastInsertRowId();
}

absl::StatusOr<std::optional<SweepRecord>> SweepStore::FindByName(
    const std::string& name) {
  ASSIGN_OR_RETURN(Query q, db_->Prepare(absl::StrCat(
      "SELECT ", kSweepColumns, " FROM sweeps WHERE name = ?")));
  q.Bind(1, name);
  return ReadOne(q, SweepFromRow);
}

absl::StatusOr<std::optional<SweepRecord>> SweepStore::Get(int64_t id) {
  ASSIGN_OR_RETURN(Query q, db_->Prepare(absl::StrCat(
      "SELECT ", kSweepColumns, " FROM sweeps WHERE id = ?")));
  q.Bind(1, id);
  return ReadOne(q, SweepFromRow);
}

absl::StatusOr<std::vector<SweepRecord>> SweepStore::List() {
  ASSIGN_OR_RETURN(Query q, db_->Prepare(absl::StrCat(
      "SELECT ", kSweepColumns, " FROM sweeps ORDER BY id")));
  return ReadAll(q, SweepFromRow);
}

absl::StatusOr<std::vector<SweepRecord>> SweepStore::ListPage(int64_t after_id,
                                                             int64_t limit) {
  ASSIGN_OR_RETURN(Query q, db_->Prepare(absl::StrCat(
      "SELECT ", kSweepColumns, " FROM sweeps WHERE id > ? ORDER BY id LIMIT ?")));
  q.Bind(1, after_id).Bind(2, limit);
  return ReadAll(q, SweepFromRow);
}

absl::Status SweepStore::Delete(int64_t id) {
  // Children first (attempts and jobs reference their parents).
  for (const char* sql : {
           "DELETE FROM metric_points WHERE job_id IN (SELECT id FROM jobs WHERE sweep_id = ?)",
           "DELETE FROM diagnostics WHERE job_id IN (SELECT id FROM jobs WHERE sweep_id = ?)",
           "DELETE FROM attempts WHERE job_id IN (SELECT id FROM jobs WHERE sweep_id = ?)",
           "DELETE FROM rung_results WHERE job_id IN (SELECT id FROM jobs WHERE sweep_id = ?)",
           "DELETE FROM results WHERE sweep_id = ?",
           "DELETE FROM result_lrs WHERE sweep_id = ?",
           "DELETE FROM jobs WHERE sweep_id = ?",
           "DELETE FROM sweeps WHERE id = ?"}) {
    ASSIGN_OR_RETURN(Query q, db_->Prepare(sql));
    RETURN_IF_ERROR(q.Bind(1, id).Run());
  }
  return absl::OkStatus();
}

absl::Status SweepStore::SetCancelled(int64_t id, bool cancelled) {
  ASSIGN_OR_RETURN(Query q, db_->Prepare("UPDATE sweeps SET cancelled = ? WHERE id = ?"));
  return q.Bind(1, static_cast<int64_t>(cancelled)).Bind(2, id).Run();
}

// --- JobStore ---------------------------------------------------------------

absl::StatusOr<int64_t> JobStore::Insert(const JobRecord& job) {
  // Column 26, id: NULL lets SQLite pick the next one.
  ASSIGN_OR_RETURN(Query q, db_->Prepare(
      "INSERT INTO jobs(sweep_id, kind, state, arch, layers, d_model, lr, seed, "
      "config_json, attempts_used, max_attempts, current_attempt_id, worker_id, "
      "not_before_ms, val_loss, final_step, reason, checkpoint_dir, is_best, "
      "parent_job_id, req_devices, req_memory_mb, req_labels, created_ms, "
      "updated_ms, id) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"));
  if (job.id > 0) {
    q.Bind(26, job.id);
  } else {
    q.BindNull(26);
  }
  q.Bind(1, job.sweep_id).Bind(2, JobKindText(job.kind))
      .Bind(3, JobStateText(job.state)).Bind(4, job.arch)
      .Bind(5, job.layers).Bind(6, job.d_model).Bind(7, job.lr).Bind(8, job.seed)
      .Bind(9, job.config_json).Bind(10, job.attempts_used)
      .Bind(11, job.max_attempts).Bind(12, job.current_attempt_id)
      .Bind(13, job.worker_id).Bind(14, job.not_before_ms).Bind(15, job.val_loss)
      .Bind(16, job.final_step).Bind(17, job.reason).Bind(18, job.checkpoint_dir)
      .Bind(19, static_cast<int64_t>(job.is_best)).Bind(20, job.parent_job_id)
      .Bind(21, job.req_devices).Bind(22, job.req_memory_mb)
      .Bind(23, job.req_labels).Bind(24, job.created_ms).Bind(25, job.updated_ms);
  RETURN_IF_ERROR(q.Run());
  return db_->LastInsertRowId();
}

absl::StatusOr<int64_t> JobStore::MaxId() {
  ASSIGN_OR_RETURN(Query q, db_->Prepare("SELECT COALESCE(MAX(id), 0) FROM jobs"));
  ASSIGN_OR_RETURN(bool row, q.Step());
  return row ? q.ColumnInt(0) : 0;
}

absl::StatusOr<JobRecord> JobStore::Get(int64_t id) {
  ASSIGN_OR_RETURN(Query q, db_->Prepare(absl::StrCat(
      "SELECT ", kJobColumns, " FROM jobs WHERE id = ?")));
  q.Bind(1, id);
  ASSIGN_OR_RETURN(std::optional<JobRecord> job, ReadOne(q, JobFromRow));
  if (!job) return absl::NotFoundError(absl::StrCat("job ", id, " not found"));
  return *std::move(job);
}

absl::Status JobStore::Update(const JobRecord& job) {
  ASSIGN_OR_RETURN(Query q, db_->Prepare(
      "UPDATE jobs SET state = ?, config_json = ?, attempts_used = ?, "
      "max_attempts = ?, current_attempt_id = ?, worker_id = ?, "
      "not_before_ms = ?, val_loss = ?, final_step = ?, reason = ?, "
      "checkpoint_dir = ?, is_best = ?, updated_ms = ? WHERE id = ?"));
  q.Bind(1, JobStateText(job.state)).Bind(2, job.config_json).Bind(3, job.attempts_used)
      .Bind(4, job.max_attempts).Bind(5, job.current_attempt_id)
      .Bind(6, job.worker_id).Bind(7, job.not_before_ms).Bind(8, job.val_loss)
      .Bind(9, job.final_step).Bind(10, job.reason).Bind(11, job.checkpoint_dir)
      .Bind(12, static_cast<int64_t>(job.is_best)).Bind(13, job.updated_ms)
      .Bind(14, job.id);
  RETURN_IF_ERROR(q.Run());
  if (db_->Changes() != 1) {
    return absl::NotFoundError(absl::StrCat("job ", job.id, " not found"));
  }
  return absl::OkStatus();
}

absl::Status JobStore::SetBest(int64_t id, bool is_best) {
  ASSIGN_OR_RETURN(Query q, db_->Prepare("UPDATE jobs SET is_best = ? WHERE id = ?"));
  RETURN_IF_ERROR(q.Bind(1, static_cast<int64_t>(is_best)).Bind(2, id).Run());
  if (db_->Changes() != 1) return absl::NotFoundError(absl::StrCat("job ", id, " not found"));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<JobRecord>> JobStore::ReadJobs(Query& q) {
  return ReadAll(q, JobFromRow);
}

absl::StatusOr<std::optional<int64_t>> JobStore::FindRunnable(
    int64_t now_wall_ms, int64_t devices, int64_t memory_mb,
    const std::function<bool(const std::string& req_labels)>& accept,
    int64_t scan_limit) {
  // The state stays a literal in the SQL: the pending-jobs partial index
  // (schema v4) is only used when the query names its WHERE clause.
  ASSIGN_OR_RETURN(Query q, db_->Prepare(absl::StrCat(
      "SELECT id, req_labels FROM jobs WHERE state = ", SqlLiteral(v1::PENDING), " AND "
      "not_before_ms <= ? AND req_devices <= ? AND req_memory_mb <= ? "
      "ORDER BY id LIMIT ?")));
  q.Bind(1, now_wall_ms).Bind(2, devices).Bind(3, memory_mb).Bind(4, scan_limit);
  while (true) {
    ASSIGN_OR_RETURN(bool row, q.Step());
    if (!row) return std::optional<int64_t>();
    if (accept(q.ColumnText(1))) return std::optional<int64_t>(q.ColumnInt(0));
  }
}

absl::StatusOr<std::vector<JobRecord>> JobStore::List(const JobFilter& f) {
  ASSIGN_OR_RETURN(Query q, db_->Prepare(absl::StrCat(
      "SELECT ", kJobColumns, " FROM jobs WHERE id > ? AND "
      "(? = 0 OR sweep_id = ?) AND (? = '' OR state = ?) AND "
      "(? = '' OR arch = ?) ORDER BY id LIMIT ?")));
  q.Bind(1, f.after_id).Bind(2, f.sweep_id).Bind(3, f.sweep_id)
      .Bind(4, JobStateText(f.state)).Bind(5, JobStateText(f.state))
      .Bind(6, f.arch).Bind(7, f.arch)
      .Bind(8, f.limit);
  return ReadJobs(q);
}

absl::StatusOr<std::vector<JobRecord>> JobStore::ListInStates(
    const std::vector<v1::JobState>& states) {
  if (states.empty()) return std::vector<JobRecord>();
  std::vector<std::string> marks(states.size(), "?");
  ASSIGN_OR_RETURN(Query q, db_->Prepare(absl::StrCat(
      "SELECT ", kJobColumns, " FROM jobs WHERE state IN (",
      absl::StrJoin(marks, ","), ") ORDER BY id")));
  for (size_t i = 0; i < states.size(); ++i) q.Bind(static_cast<int>(i + 1), JobStateText(states[i]));
  return ReadJobs(q);
}

absl::StatusOr<std::vector<JobRecord>> JobStore::ListBySweep(int64_t sweep_id) {
  ASSIGN_OR_RETURN(Query q, db_->Prepare(absl::StrCat(
      "SELECT ", kJobColumns, " FROM jobs WHERE sweep_id = ? ORDER BY id")));
  q.Bind(1, sweep_id);
  return ReadJobs(q);
}

absl::StatusOr<std::string> JobStore::GroupConfig(int64_t sweep_id, const std::string& arch,
                                                   int64_t layers, int64_t d_model) {
  ASSIGN_OR_RETURN(Query q, db_->Prepare(absl::StrCat(
      "SELECT config_json FROM jobs WHERE sweep_id = ? AND arch = ? AND layers = ? AND "
      "d_model = ? AND kind = ", SqlLiteral(v1::TRAIN), " LIMIT 1")));
  q.Bind(1, sweep_id).Bind(2, arch).Bind(3, layers).Bind(4, d_model);
  ASSIGN_OR_RETURN(bool row, q.Step());
  return row ? q.ColumnText(0) : std::string("{}");
}

absl::StatusOr<std::vector<GroupMember>> JobStore::ListGroup(
    int64_t sweep_id, const std::string& arch, int64_t layers, int64_t d_model) {
  ASSIGN_OR_RETURN(Query q, db_->Prepare(absl::StrCat(
      "SELECT id, state, lr, val_loss, is_best, final_step FROM jobs WHERE sweep_id = ? AND "
      "kind = ", SqlLiteral(v1::TRAIN), " AND arch = ? AND layers = ? AND d_model = ? "
      "ORDER BY id")));
  q.Bind(1, sweep_id).Bind(2, arch).Bind(3, layers).Bind(4, d_model);
  return ReadAll(q, [](const Query& row) -> absl::StatusOr<GroupMember> {
    GroupMember m;
    m.id = row.ColumnInt(0);
    ASSIGN_OR_RETURN(m.state, ParseJobState(row.ColumnText(1)));
    m.lr = row.ColumnDouble(2);
    if (!row.ColumnIsNull(3)) m.val_loss = row.ColumnDouble(3);
    m.is_best = row.ColumnInt(4) != 0;
    m.final_step = row.ColumnInt(5);
    return m;
  });
}

absl::StatusOr<std::vector<RunRecord>> JobStore::ListRuns(int64_t sweep_id,
                                                          int64_t after_id,
                                                          int64_t limit) {
  ASSIGN_OR_RETURN(Query q, db_->Prepare(absl::StrCat(
      "SELECT id, arch, layers, d_model, lr, seed, state, val_loss, final_step, "
      "is_best FROM jobs WHERE sweep_id = ? AND id > ? AND kind = ", SqlLiteral(v1::TRAIN),
      " ORDER BY id LIMIT ?")));
  q.Bind(1, sweep_id).Bind(2, after_id).Bind(3, limit);
  return ReadAll(q, [](const Query& row) -> absl::StatusOr<RunRecord> {
    RunRecord r;
    r.id = row.ColumnInt(0);
    r.arch = row.ColumnText(1);
    r.layers = row.ColumnInt(2);
    r.d_model = row.ColumnInt(3);
    r.lr = row.ColumnDouble(4);
    r.seed = row.ColumnInt(5);
    ASSIGN_OR_RETURN(r.state, ParseJobState(row.ColumnText(6)));
    if (!row.ColumnIsNull(7)) r.val_loss = row.ColumnDouble(7);
    r.final_step = row.ColumnInt(8);
    r.is_best = row.ColumnInt(9) != 0;
    return r;
  });
}

absl::StatusOr<bool> JobStore::HasChildren(int64_t parent_job_id) {
  ASSIGN_OR_RETURN(Query q, db_->Prepare(
      "SELECT 1 FROM jobs WHERE parent_job_id = ? LIMIT 1"));
  q.Bind(1, parent_job_id);
  return q.Step();
}

absl::StatusOr<std::map<v1::JobState, int64_t>> JobStore::CountByState(
    int64_t sweep_id) {
  ASSIGN_OR_RETURN(Query q, db_->Prepare(
      "SELECT state, COUNT(*) FROM jobs WHERE sweep_id = ? GROUP BY state"));
  q.Bind(1, sweep_id);
  std::map<v1::JobState, int64_t> out;
  while (true) {
    ASSIGN_OR_RETURN(bool row, q.Step());
    if (!row) break;
    ASSIGN_OR_RETURN(v1::JobState state, ParseJobState(q.ColumnText(0)));
    out[state] = q.ColumnInt(1);
  }
  return out;
}

absl::StatusOr<std::vector<SweepStateCount>> JobStore::CountBySweepAndState() {
  ASSIGN_OR_RETURN(Query q, db_->Prepare(
      "SELECT s.name, j.state, COUNT(*) FROM jobs j JOIN sweeps s ON s.id = j.sweep_id "
      "GROUP BY s.name, j.state ORDER BY s.name, j.state"));
  return ReadAll(q, [](const Query& row) -> absl::StatusOr<SweepStateCount> {
    ASSIGN_OR_RETURN(v1::JobState state, ParseJobState(row.ColumnText(1)));
    return SweepStateCount{row.ColumnText(0), state, row.ColumnInt(2)};
  });
}

absl::StatusOr<int64_t> JobStore::InsertAttempt(const AttemptRecord& a) {
  ASSIGN_OR_RETURN(Query q, db_->Prepare(
      "INSERT INTO attempts(job_id, number, worker_id, start_ms, end_ms, "
      "outcome, reason) VALUES (?,?,?,?,?,?,?)"));
  q.Bind(1, a.job_id).Bind(2, a.number).Bind(3, a.worker_id).Bind(4, a.start_ms)
      .Bind(5, a.end_ms).Bind(6, a.outcome).Bind(7, a.reason);
  RETURN_IF_ERROR(q.Run());
  return db_->LastInsertRowId();
}

absl::StatusOr<std::optional<AttemptRecord>> JobStore::GetAttempt(int64_t id) {
  ASSIGN_OR_RETURN(Query q, db_->Prepare(absl::StrCat(
      "SELECT ", kAttemptColumns, " FROM attempts WHERE id = ?")));
  q.Bind(1, id);
  return ReadOne(q, AttemptFromRow);
}

absl::Status JobStore::EndAttempt(int64_t attempt_id, int64_t end_ms,
                                  const std::string& outcome,
                                  const std::string& reason) {
  ASSIGN_OR_RETURN(Query q, db_->Prepare(
      "UPDATE attempts SET end_ms = ?, outcome = ?, reason = ? WHERE id = ?"));
  return q.Bind(1, end_ms).Bind(2, outcome).Bind(3, reason).Bind(4, attempt_id).Run();
}

absl::StatusOr<std::vector<AttemptRecord>> JobStore::ListAttempts(int64_t job_id) {
  ASSIGN_OR_RETURN(Query q, db_->Prepare(absl::StrCat(
      "SELECT ", kAttemptColumns, " FROM attempts WHERE job_id = ? ORDER BY id")));
  q.Bind(1, job_id);
  return ReadAll(q, AttemptFromRow);
}

absl::Status JobStore::SetResumedFromStep(int64_t attempt_id, int64_t step) {
  ASSIGN_OR_RETURN(Query q, db_->Prepare(
      "UPDATE attempts SET resumed_from_step = ? WHERE id = ?"));
  RETURN_IF_ERROR(q.Bind(1, step).Bind(2, attempt_id).Run());
  if (db_->Changes() != 1) {
    return absl::NotFoundError(absl::StrCat("attempt ", attempt_id, " not found"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> JobStore::CountAttempts(int64_t job_id) {
  ASSIGN_OR_RETURN(Query q, db_->Prepare("SELECT COUNT(*) FROM attempts WHERE job_id = ?"));
  q.Bind(1, job_id);
  ASSIGN_OR_RETURN(bool row, q.Step());
  return row ? q.ColumnInt(0) : 0;
}

// --- WorkerStore ------------------------------------------------------------

absl::Status WorkerStore::Upsert(const WorkerRecord& w) {
  ASSIGN_OR_RETURN(Query q, db_->Prepare(
      "INSERT INTO workers(id, devices, memory_mb, slots, labels_json, "
      "registered_ms, last_seen_ms) VALUES (?,?,?,?,?,?,?) ON CONFLICT(id) DO "
      "UPDATE SET devices = excluded.devices, memory_mb = excluded.memory_mb, "
      "slots = excluded.slots, labels_json = excluded.labels_json, "
      "registered_ms = excluded.registered_ms, last_seen_ms = excluded.last_seen_ms"));
  return q.Bind(1, w.id).Bind(2, w.devices).Bind(3, w.memory_mb).Bind(4, w.slots)
      .Bind(5, w.labels_json).Bind(6, w.registered_ms).Bind(7, w.last_seen_ms)
      .Run();
}

absl::StatusOr<std::optional<WorkerRecord>> WorkerStore::Get(const std::string& id) {
  ASSIGN_OR_RETURN(Query q, db_->Prepare(
      "SELECT id, devices, memory_mb, slots, labels_json, registered_ms, "
      "last_seen_ms FROM workers WHERE id = ?"));
  q.Bind(1, id);
  ASSIGN_OR_RETURN(bool row, q.Step());
  if (!row) return std::optional<WorkerRecord>();
  WorkerRecord w;
  w.id = q.ColumnText(0);
  w.devices = q.ColumnInt(1);
  w.memory_mb = q.ColumnInt(2);
  w.slots = q.ColumnInt(3);
  w.labels_json = q.ColumnText(4);
  w.registered_ms = q.ColumnInt(5);
  w.last_seen_ms = q.ColumnInt(6);
  return std::optional<WorkerRecord>(std::move(w));
}

absl::Status WorkerStore::Touch(const std::string& id, int64_t now_ms) {
  ASSIGN_OR_RETURN(Query q, db_->Prepare("UPDATE workers SET last_seen_ms = ? WHERE id = ?"));
  return q.Bind(1, now_ms).Bind(2, id).Run();
}

// --- MetricStore ------------------------------------------------------------

absl::StatusOr<InsertCounts> MetricStore::Insert(
    const std::vector<MetricRecord>& points, int64_t replay_through,
    std::vector<MetricRecord>* stored) {
  ASSIGN_OR_RETURN(Query q, db_->Prepare(
      "INSERT OR IGNORE INTO metric_points(job_id, attempt_id, step, name, "
      "value, wall_ms) VALUES (?,?,?,?,?,?)"));
  InsertCounts counts;
  for (const MetricRecord& p : points) {
    if (p.step <= replay_through) {
      // Rare (a resumed attempt re-publishing lost points): a separate
      // statement, so the common path stays one probe of the unique index.
      ASSIGN_OR_RETURN(Query r, db_->Prepare(
          "INSERT OR IGNORE INTO metric_points(job_id, attempt_id, step, name, "
          "value, wall_ms) SELECT ?1, ?2, ?3, ?4, ?5, ?6 WHERE NOT EXISTS ("
          "SELECT 1 FROM metric_points WHERE job_id = ?1 AND step = ?3 AND "
          "name = ?4 AND superseded_by = 0)"));
      r.Bind(1, p.job_id).Bind(2, p.attempt_id).Bind(3, p.step).Bind(4, p.name)
          .Bind(5, p.value).Bind(6, p.wall_ms);
      RETURN_IF_ERROR(r.Run());
    } else {
      q.Reset();
      q.Bind(1, p.job_id).Bind(2, p.attempt_id).Bind(3, p.step).Bind(4, p.name)
          .Bind(5, p.value).Bind(6, p.wall_ms);
      RETURN_IF_ERROR(q.Run());
    }
    if (db_->Changes() == 1) {
      ++counts.accepted;
      if (stored != nullptr) {
        stored->push_back(p);
        stored->back().row_id = db_->LastInsertRowId();
      }
    } else {
      ++counts.duplicates;
    }
  }
  return counts;
}

absl::StatusOr<int64_t> MetricStore::Supersede(int64_t job_id, int64_t attempt_id,
                                               int64_t step) {
  ASSIGN_OR_RETURN(Query q, db_->Prepare(
      "UPDATE metric_points SET superseded_by = ? WHERE job_id = ? AND step > ? "
      "AND attempt_id < ? AND superseded_by = 0"));
  RETURN_IF_ERROR(q.Bind(1, attempt_id).Bind(2, job_id).Bind(3, step).Bind(4, attempt_id).Run());
  return db_->Changes();
}

absl::StatusOr<std::vector<MetricRecord>> MetricStore::Read(
    int64_t job_id, int64_t after_row_id, int64_t from_step, int64_t limit,
    int64_t attempt_id) {
  ASSIGN_OR_RETURN(Query q, db_->Prepare(
      attempt_id == 0
          ? "SELECT id, job_id, attempt_id, step, name, value, wall_ms, superseded_by "
            "FROM metric_points WHERE job_id = ? AND id > ? AND step >= ? AND "
            "superseded_by = 0 ORDER BY id LIMIT ?"
          : "SELECT id, job_id, attempt_id, step, name, value, wall_ms, superseded_by "
            "FROM metric_points WHERE job_id = ? AND id > ? AND step >= ? AND "
            "attempt_id = ? ORDER BY id LIMIT ?"));
  q.Bind(1, job_id).Bind(2, after_row_id).Bind(3, from_step);
  if (attempt_id == 0) {
    q.Bind(4, limit);
  } else {
    q.Bind(4, attempt_id).Bind(5, limit);
  }
  return ReadAll(q, [](const Query& row) {
    MetricRecord m;
    m.row_id = row.ColumnInt(0);
    m.job_id = row.ColumnInt(1);
    m.attempt_id = row.ColumnInt(2);
    m.step = row.ColumnInt(3);
    m.name = row.ColumnText(4);
    m.value = row.ColumnDouble(5);
    m.wall_ms = row.ColumnInt(6);
    m.superseded_by = row.ColumnInt(7);
    return m;
  });
}

absl::StatusOr<int64_t> MetricStore::Count(int64_t job_id, int64_t attempt_id) {
  ASSIGN_OR_RETURN(Query q, db_->Prepare(
      "SELECT COUNT(*) FROM metric_points WHERE job_id = ? AND attempt_id = ?"));
  q.Bind(1, job_id).Bind(2, attempt_id);
  ASSIGN_OR_RETURN(bool row, q.Step());
  return row ? q.ColumnInt(0) : 0;
}

absl::Status MetricStore::ProbeWrite() {
  // Job id 0 never exists (ids start at 1).
  ASSIGN_OR_RETURN(Query insert, db_->Prepare(
      "INSERT INTO metric_points(job_id, attempt_id, step, name, value, wall_ms) "
      "VALUES (0, 0, 0, zeroblob(65536), 0, 0)"));
  RETURN_IF_ERROR(insert.Run());
  ASSIGN_OR_RETURN(Query remove, db_->Prepare("DELETE FROM metric_points WHERE job_id = 0"));
  return remove.Run();
}

// --- ResultStore ------------------------------------------------------------

absl::Status ResultStore::Upsert(const ResultRecord& r) {
  // An in-place UPDATE on conflict, not INSERT OR REPLACE (a delete and a
  // re-insert of the row and its primary-key index entry on every finish).
  ASSIGN_OR_RETURN(Query q, db_->Prepare(absl::StrCat(
      "INSERT INTO results(", kResultColumns,
      ") VALUES (?,?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT(sweep_id, arch, layers, "
      "d_model) DO UPDATE SET aspect_ratio = excluded.aspect_ratio, "
      "params = excluded.params, best_lr = excluded.best_lr, "
      "best_val_loss = excluded.best_val_loss, best_job_id = excluded.best_job_id, "
      "lrs_json = excluded.lrs_json, complete = excluded.complete, "
      "diagnostics_json = excluded.diagnostics_json")));
  return q.Bind(1, r.sweep_id).Bind(2, r.arch).Bind(3, r.layers)
      .Bind(4, r.d_model).Bind(5, r.aspect_ratio).Bind(6, r.params)
      .Bind(7, r.best_lr).Bind(8, r.best_val_loss).Bind(9, r.best_job_id)
      .Bind(10, LrsToJson(r.lrs)).Bind(11, static_cast<int64_t>(r.complete))
      .Bind(12, r.diagnostics_json).Run();
}

absl::StatusOr<std::optional<ResultRecord>> ResultStore::Get(
    int64_t sweep_id, const std::string& arch, int64_t layers, int64_t d_model) {
  ASSIGN_OR_RETURN(Query q, db_->Prepare(absl::StrCat(
      "SELECT ", kResultColumns, " FROM results WHERE sweep_id = ? AND arch = ? "
      "AND layers = ? AND d_model = ?")));
  q.Bind(1, sweep_id).Bind(2, arch).Bind(3, layers).Bind(4, d_model);
  return ReadOne(q, ResultFromRow);
}

absl::StatusOr<std::vector<ResultRecord>> ResultStore::List(int64_t sweep_id) {
  ASSIGN_OR_RETURN(Query q, db_->Prepare(absl::StrCat(
      "SELECT ", kResultColumns, " FROM results WHERE sweep_id = ? "
      "ORDER BY rowid")));
  q.Bind(1, sweep_id);
  return ReadAll(q, ResultFromRow);
}

absl::Status ResultStore::InsertDiagnostic(const DiagnosticRecord& d) {
  ASSIGN_OR_RETURN(Query q, db_->Prepare(
      "INSERT OR REPLACE INTO diagnostics(job_id, kind, data_json, created_ms) "
      "VALUES (?,?,?,?)"));
  return q.Bind(1, d.job_id).Bind(2, d.kind).Bind(3, d.data_json)
      .Bind(4, d.created_ms).Run();
}

absl::StatusOr<std::vector<DiagnosticRecord>> ResultStore::ListDiagnostics(
    int64_t job_id) {
  ASSIGN_OR_RETURN(Query q, db_->Prepare(
      "SELECT job_id, kind, data_json, created_ms FROM diagnostics WHERE "
      "job_id = ? ORDER BY kind"));
  q.Bind(1, job_id);
  return ReadAll(q, [](const Query& row) {
    return DiagnosticRecord{row.ColumnInt(0), row.ColumnText(1), row.ColumnText(2), row.ColumnInt(3)};
  });
}

absl::Status ResultStore::AddLrJobs(const LrTally& k, int64_t count) {
  ASSIGN_OR_RETURN(Query q, db_->Prepare(
      "INSERT INTO result_lrs(sweep_id, arch, layers, d_model, lr, jobs) "
      "VALUES (?,?,?,?,?,?) ON CONFLICT(sweep_id, arch, layers, d_model, lr) "
      "DO UPDATE SET jobs = jobs + excluded.jobs"));
  return q.Bind(1, k.sweep_id).Bind(2, k.arch).Bind(3, k.layers).Bind(4, k.d_model)
      .Bind(5, k.lr).Bind(6, count).Run();
}

absl::Status ResultStore::ApplyLrDelta(const LrTally& d) {
  ASSIGN_OR_RETURN(Query q, db_->Prepare(
      "UPDATE result_lrs SET ended = ended + ?1, succeeded = succeeded + ?2, "
      "diverged = diverged + ?3, failed = failed + ?4, loss_sum = loss_sum + ?5, "
      "best_job_id = CASE WHEN ?6 != 0 AND (best_val_loss IS NULL OR ?7 < best_val_loss "
      "OR (?7 = best_val_loss AND ?6 < best_job_id)) THEN ?6 ELSE best_job_id END, "
      "best_val_loss = CASE WHEN ?6 != 0 AND (best_val_loss IS NULL OR ?7 < best_val_loss "
      "OR (?7 = best_val_loss AND ?6 < best_job_id)) THEN ?7 ELSE best_val_loss END "
      "WHERE sweep_id = ?8 AND arch = ?9 AND layers = ?10 AND d_model = ?11 AND lr = ?12"));
  q.Bind(1, d.ended).Bind(2, d.succeeded).Bind(3, d.diverged).Bind(4, d.failed)
      .Bind(5, d.loss_sum).Bind(6, d.best_job_id).Bind(7, d.best_val_loss)
      .Bind(8, d.sweep_id).Bind(9, d.arch).Bind(10, d.layers).Bind(11, d.d_model)
      .Bind(12, d.lr);
  RETURN_IF_ERROR(q.Run());
  if (db_->Changes() != 1) {
    return absl::NotFoundError(absl::StrCat("no result_lrs row for sweep ", d.sweep_id, " ",
                                            d.arch, " ", d.layers, "x", d.d_model,
                                            " lr ", d.lr));
  }
  return absl::OkStatus();
}

absl::Status ResultStore::SetLrTally(const LrTally& t) {
  ASSIGN_OR_RETURN(Query q, db_->Prepare(
      "INSERT INTO result_lrs(sweep_id, arch, layers, d_model, lr, jobs, ended, "
      "succeeded, diverged, failed, loss_sum, best_job_id, best_val_loss) "
      "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT(sweep_id, arch, layers, "
      "d_model, lr) DO UPDATE SET jobs = excluded.jobs, ended = excluded.ended, "
      "succeeded = excluded.succeeded, diverged = excluded.diverged, "
      "failed = excluded.failed, loss_sum = excluded.loss_sum, "
      "best_job_id = excluded.best_job_id, best_val_loss = excluded.best_val_loss"));
  return q.Bind(1, t.sweep_id).Bind(2, t.arch).Bind(3, t.layers).Bind(4, t.d_model)
      .Bind(5, t.lr).Bind(6, t.jobs).Bind(7, t.ended).Bind(8, t.succeeded)
      .Bind(9, t.diverged).Bind(10, t.failed).Bind(11, t.loss_sum)
      .Bind(12, t.best_job_id).Bind(13, t.best_val_loss).Run();
}

absl::StatusOr<std::vector<LrTally>> ResultStore::ListLrs(int64_t sweep_id,
                                                          const std::string& arch,
                                                          int64_t layers, int64_t d_model) {
  ASSIGN_OR_RETURN(Query q, db_->Prepare(
      "SELECT lr, jobs, ended, succeeded, diverged, failed, loss_sum, best_job_id, "
      "best_val_loss FROM result_lrs WHERE sweep_id = ? AND arch = ? AND layers = ? "
      "AND d_model = ? ORDER BY lr"));
  q.Bind(1, sweep_id).Bind(2, arch).Bind(3, layers).Bind(4, d_model);
  return ReadAll(q, [&](const Query& row) {
    LrTally t;
    t.sweep_id = sweep_id;
    t.arch = arch;
    t.layers = layers;
    t.d_model = d_model;
    t.lr = row.ColumnDouble(0);
    t.jobs = row.ColumnInt(1);
    t.ended = row.ColumnInt(2);
    t.succeeded = row.ColumnInt(3);
    t.diverged = row.ColumnInt(4);
    t.failed = row.ColumnInt(5);
    t.loss_sum = row.ColumnDouble(6);
    t.best_job_id = row.ColumnInt(7);
    if (!row.ColumnIsNull(8)) t.best_val_loss = row.ColumnDouble(8);
    return t;
  });
}

}  // namespace depthbench::storage

namespace depthbench::storage {

absl::Status ResultStore::InsertRung(const RungRecord& r) {
  ASSIGN_OR_RETURN(Query q, db_->Prepare(
      "INSERT INTO rung_results(job_id, rung, step, val_loss, decision, decided_ms) "
      "VALUES (?, ?, ?, ?, ?, ?)"));
  q.Bind(1, r.job_id).Bind(2, static_cast<int64_t>(r.rung)).Bind(3, r.step);
  if (r.val_loss) {
    q.Bind(4, *r.val_loss);
  } else {
    q.BindNull(4);
  }
  return q.Bind(5, r.decision).Bind(6, r.decided_ms).Run();
}

absl::Status ResultStore::UpdateRungDecision(int64_t job_id, int rung,
                                             const std::string& decision, int64_t decided_ms) {
  ASSIGN_OR_RETURN(Query q, db_->Prepare(
      "UPDATE rung_results SET decision = ?, decided_ms = ? WHERE job_id = ? AND rung = ?"));
  RETURN_IF_ERROR(
      q.Bind(1, decision).Bind(2, decided_ms).Bind(3, job_id).Bind(4, static_cast<int64_t>(rung))
          .Run());
  if (db_->Changes() == 0) {
    return absl::NotFoundError(absl::StrCat("rung_results: no row for job ", job_id, " rung ",
                                            rung));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<RungRecord>> ResultStore::ListGroupRungs(int64_t sweep_id,
                                                                    const std::string& arch,
                                                                    int64_t layers,
                                                                    int64_t d_model) {
  ASSIGN_OR_RETURN(Query q, db_->Prepare(absl::StrCat(
      "SELECT r.job_id, r.rung, r.step, r.val_loss, r.decision, r.decided_ms "
      "FROM rung_results r JOIN jobs j ON j.id = r.job_id "
      "WHERE j.sweep_id = ? AND j.arch = ? AND j.layers = ? AND j.d_model = ? "
      "AND j.kind = ", SqlLiteral(v1::TRAIN), " ORDER BY r.job_id, r.rung")));
  q.Bind(1, sweep_id).Bind(2, arch).Bind(3, layers).Bind(4, d_model);
  return ReadAll(q, [](const Query& row) {
    RungRecord r;
    r.job_id = row.ColumnInt(0);
    r.rung = static_cast<int>(row.ColumnInt(1));
    r.step = row.ColumnInt(2);
    if (!row.ColumnIsNull(3)) r.val_loss = row.ColumnDouble(3);
    r.decision = row.ColumnText(4);
    r.decided_ms = row.ColumnInt(5);
    return r;
  });
}

}  // namespace depthbench::storage
