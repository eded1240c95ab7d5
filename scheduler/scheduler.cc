#include "scheduler/scheduler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <tuple>
#include <utility>

#include <google/protobuf/util/message_differencer.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "scheduler/best_lr.h"
#include "scheduler/sweep_expander.h"
#include "storage/job_text.h"
#include "storage/migrations.h"
#include "trainer_core/arch.h"
#include "trainer_core/train_config.h"

namespace depthbench::scheduler {

namespace v1 = ::depthbench::v1;
using storage::AttemptRecord;
using storage::JobRecord;
using storage::Transaction;

namespace {

// A run's learning rate and seed live in jobs.lr and jobs.seed. The copies
// inside config_json (written at submission, so the stored text stays what
// older binaries wrote and read) are not read: every config the scheduler
// parses or hands out passes through here and takes them from the columns.
// A config that is not a JSON object is returned as stored, for its reader
// to refuse with its own error.
std::string JobConfigJson(const JobRecord& job) {
  nlohmann::json j = nlohmann::json::parse(job.config_json, nullptr, false);
  if (!j.is_object()) return job.config_json;
  j["lr"] = job.lr;
  j["seed"] = job.seed;
  return j.dump();
}

v1::Job JobProto(const JobRecord& r, const std::string& sweep_name) {
  v1::Job j;
  j.set_id(r.id);
  j.set_sweep_id(r.sweep_id);
  j.set_sweep_name(sweep_name);
  j.set_kind(r.kind);
  j.set_state(r.state);
  j.set_arch(r.arch);
  j.set_layers(r.layers);
  j.set_d_model(r.d_model);
  j.set_lr(r.lr);
  j.set_seed(r.seed);
  j.set_config_json(JobConfigJson(r));
  j.set_attempts_used(static_cast<int32_t>(r.attempts_used));
  j.set_max_attempts(static_cast<int32_t>(r.max_attempts));
  j.set_current_attempt_id(r.current_attempt_id);
  j.set_worker_id(r.worker_id);
  j.set_has_val_loss(r.val_loss.has_value());
  j.set_final_val_loss(r.val_loss.value_or(0));
  j.set_final_step(r.final_step);
  j.set_reason(r.reason);
  j.set_checkpoint_dir(r.checkpoint_dir);
  j.set_is_best(r.is_best);
  j.set_parent_job_id(r.parent_job_id);
  j.set_not_before_ms(r.not_before_ms);
  return j;
}

bool LabelsMatch(const std::string& required_json, const std::string& worker_json) {
  if (required_json == "{}") return true;  // the common case: no requirements
  nlohmann::json required = nlohmann::json::parse(required_json, nullptr, false);
  if (!required.is_object() || required.empty()) return true;
  nlohmann::json have = nlohmann::json::parse(worker_json, nullptr, false);
  if (!have.is_object()) return false;
  for (auto& [key, value] : required.items()) {
    if (!have.contains(key) || have[key] != value) return false;
  }
  return true;
}

std::string LabelsJson(const google::protobuf::Map<std::string, std::string>& labels) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [k, v] : labels) j[k] = v;
  return j.dump();
}

// AcquireJob looks at no more than this many runnable pending jobs (oldest
// first) for one whose label requirements the worker meets.
constexpr int64_t kAcquireScanLimit = 1024;

SchedulerObserver* NoopObserver() {
  static SchedulerObserver* const kNoop = new SchedulerObserver();
  return kNoop;
}

v1::ResultRow ResultRowProto(const storage::ResultRecord& r) {
  v1::ResultRow row;
  row.set_arch(r.arch);
  row.set_layers(r.layers);
  row.set_d_model(r.d_model);
  row.set_aspect_ratio(r.aspect_ratio);
  row.set_params(r.params);
  row.set_has_best(r.best_lr.has_value());
  row.set_best_lr(r.best_lr.value_or(0));
  row.set_best_val_loss(r.best_val_loss.value_or(0));
  row.set_best_job_id(r.best_job_id);
  row.set_diagnostics_json(r.diagnostics_json);
  row.set_complete(r.complete);
  for (const storage::LrSummary& s : r.lrs) {
    v1::LrLoss* l = row.add_lrs();
    l->set_lr(s.lr);
    if (s.mean_val_loss) {
      l->set_has_loss(true);
      l->set_val_loss(*s.mean_val_loss);
    }
    l->set_diverged(s.diverged > 0);
    l->set_succeeded(s.succeeded);
    l->set_diverged_runs(s.diverged);
    l->set_failed_runs(s.failed);
  }
  return row;
}

v1::RunSummary RunSummaryProto(const storage::RunRecord& job) {
  v1::RunSummary run;
  run.set_job_id(job.id);
  run.set_arch(job.arch);
  run.set_layers(job.layers);
  run.set_d_model(job.d_model);
  run.set_lr(job.lr);
  run.set_seed(job.seed);
  run.set_state(job.state);
  run.set_has_val_loss(job.val_loss.has_value());
  run.set_final_val_loss(job.val_loss.value_or(0));
  run.set_final_step(job.final_step);
  run.set_is_best(job.is_best);
  return run;
}

absl::StatusOr<storage::SweepRecord> FindSweep(storage::Database* db,
                                               const std::string& name) {
  if (name.empty()) return absl::InvalidArgumentError("sweep: a sweep name is required");
  storage::SweepStore sweeps(db);
  ASSIGN_OR_RETURN(std::optional<storage::SweepRecord> sweep, sweeps.FindByName(name));
  if (!sweep) return absl::NotFoundError(absl::StrCat("sweep \"", name, "\" not found"));
  return *sweep;
}

// The step the job's current attempt resumed from when it is a retry whose
// start was reported; -1 otherwise (WatchBatch::resumed_from_step).
absl::StatusOr<int64_t> ResumeStepOfCurrentAttempt(storage::JobStore& jobs, const JobRecord& job) {
  if (job.current_attempt_id == 0) return -1;
  ASSIGN_OR_RETURN(std::optional<AttemptRecord> current, jobs.GetAttempt(job.current_attempt_id));
  if (current && current->number > 1 && current->resumed_from_step) {
    return *current->resumed_from_step;
  }
  return -1;
}

absl::StatusOr<v1::SweepSpec> ParseSpec(const storage::SweepRecord& sweep) {
  v1::SweepSpec spec;
  if (!spec.ParseFromString(sweep.spec)) {
    return absl::DataLossError(absl::StrCat("sweep ", sweep.id, ": stored spec is unreadable"));
  }
  return spec;
}

// The Sweep message of `s` with job counts read through `db`.
absl::StatusOr<v1::Sweep> SweepProtoFrom(storage::Database* db, const storage::SweepRecord& s,
                                         const v1::SweepSpec& spec) {
  v1::Sweep out;
  out.set_id(s.id);
  out.set_name(s.name);
  *out.mutable_spec() = spec;
  out.set_created_ms(s.created_ms);
  storage::JobStore jobs(db);
  ASSIGN_OR_RETURN(auto counts, jobs.CountByState(s.id));
  int64_t total = 0, done = 0;
  for (const auto& [state, n] : counts) {
    (*out.mutable_job_counts())[storage::JobStateText(state)] = n;
    total += n;
    if (IsTerminalState(state)) done += n;
  }
  out.set_total_jobs(total);
  out.set_done_jobs(done);
  if (done < total) {
    out.set_state(v1::SWEEP_RUNNING);
  } else {
    out.set_state(s.cancelled ? v1::SWEEP_CANCELLED : v1::SWEEP_COMPLETED);
  }
  return out;
}

// Parses a page token (the last id of the previous page) of `method`.
absl::StatusOr<int64_t> ParsePageToken(const std::string& token, const char* method) {
  int64_t after_id = 0;
  if (!token.empty() && (!absl::SimpleAtoi(token, &after_id) || after_id < 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page_token: not a token from ", method, ": \"", token, "\""));
  }
  return after_id;
}

absl::StatusOr<int64_t> PageLimit(int32_t page_size) {
  if (page_size < 0 || page_size > 1000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page_size: must be in 0..1000, got ", page_size));
  }
  return page_size == 0 ? 100 : page_size;
}

}  // namespace

template <typename F>
auto Scheduler::Read(F&& read) -> decltype(read(static_cast<storage::Database*>(nullptr))) {
  if (readers_ != nullptr) {
    ASSIGN_OR_RETURN(storage::ReaderPool::Snapshot snapshot, readers_->Begin());
    return read(snapshot.db());
  }
  absl::MutexLock lock(&mu_);
  return read(db_.get());
}

// A storage::Transaction that reports BEGIN..COMMIT (or ..ROLLBACK) time to
// the observer. Measures a duration for reporting only, so it reads
// steady_clock rather than the injected Clock (milliseconds only).
//
// It also owns the transaction's effects on memory and metrics (leases,
// caches, counters, observer events) queued with Scheduler::AfterCommit():
// they run only once COMMIT succeeded, and are dropped on rollback, so a
// failed commit (full disk) changes nothing but the database's health.
class Scheduler::TimedTransaction {
 public:
  TimedTransaction(storage::Transaction txn, Scheduler* scheduler,
                   const char* name, std::chrono::steady_clock::time_point start)
      : txn_(std::move(txn)), scheduler_(scheduler), observer_(scheduler->observer_),
        name_(name), start_(start) {}
  TimedTransaction(TimedTransaction&& other) noexcept
      : txn_(std::move(other.txn_)),
        scheduler_(std::exchange(other.scheduler_, nullptr)),
        observer_(std::exchange(other.observer_, nullptr)),
        name_(other.name_),
        start_(other.start_) {
    other.txn_.reset();
  }
  TimedTransaction& operator=(TimedTransaction&&) = delete;
  TimedTransaction(const TimedTransaction&) = delete;
  ~TimedTransaction() {
    bool open = txn_.has_value();
    txn_.reset();  // rolls back unless committed
    Report();
    if (open && scheduler_ != nullptr) {
      scheduler_->after_commit_.clear();
      scheduler_->NoteStorageHealth();
    }
  }

  absl::Status Commit() {
    absl::Status status = txn_->Commit();
    txn_.reset();
    Report();
    if (scheduler_ == nullptr) return status;
    std::vector<std::function<void()>> effects;
    effects.swap(scheduler_->after_commit_);
    if (status.ok()) {
      for (auto& effect : effects) effect();
    }
    scheduler_->NoteStorageHealth();
    return status;
  }

 private:
  void Report() {
    if (observer_ == nullptr) return;
    std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start_;
    observer_->OnTransaction(name_, elapsed.count());
    observer_ = nullptr;
  }

  std::optional<storage::Transaction> txn_;
  Scheduler* scheduler_;         // null once moved from
  SchedulerObserver* observer_;  // null once reported or moved from
  const char* name_;
  std::chrono::steady_clock::time_point start_;
};

absl::StatusOr<Scheduler::TimedTransaction> Scheduler::BeginTransaction(const char* txn) {
  auto start = std::chrono::steady_clock::now();
  absl::StatusOr<Transaction> t = Transaction::Begin(db_.get());
  if (!t.ok()) {
    NoteStorageHealth();
    return t.status();
  }
  after_commit_.clear();
  return TimedTransaction(std::move(*t), this, txn, start);
}

void Scheduler::AfterCommit(std::function<void()> effect) {
  after_commit_.push_back(std::move(effect));
}

void Scheduler::NoteStorageHealth() {
  const absl::Status& health = db_->WriteHealth();
  if (health.ok() == storage_writable_) return;
  storage_writable_ = health.ok();
  if (storage_writable_) {
    spdlog::info("database writable again: commits succeed");
  } else {
    counters_.storage_failures++;
    spdlog::error("database not writable (disk full or I/O error?): {}; state changes are "
                  "refused and retried, /readyz reports unready until a commit succeeds",
                  health.ToString());
  }
  observer_->OnStorageWritable(storage_writable_);
}

void Scheduler::SawWorker(const std::string& worker_id) {
  last_contact_ms_[worker_id] = clock_->NowMonotonicMs();
}

int64_t Scheduler::ConnectedWorkersLocked() const {
  int64_t now = clock_->NowMonotonicMs();
  int64_t count = 0;
  for (const auto& [id, ms] : last_contact_ms_) {
    if (now - ms < options_.lease_ttl_ms) ++count;
  }
  return count;
}

int64_t Scheduler::ConnectedWorkers() const {
  absl::MutexLock lock(&mu_);
  return ConnectedWorkersLocked();
}

Scheduler::Scheduler(std::unique_ptr<storage::Database> db, Clock* clock,
                     SchedulerOptions options)
    : clock_(clock),
      options_(options),
      observer_(options.observer != nullptr ? options.observer : NoopObserver()),
      db_(std::move(db)),
      sweeps_(db_.get()),
      jobs_(db_.get()),
      workers_(db_.get()),
      metrics_(db_.get()),
      results_(db_.get()),
      leases_(options.lease_ttl_ms),
      hub_(std::max<size_t>(1, options.watch_ring_points)) {}

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::Create(
    std::unique_ptr<storage::Database> db, Clock* clock, SchedulerOptions options) {
  if (options.lease_ttl_ms <= 0) {
    return absl::InvalidArgumentError("lease_ttl_ms: must be positive");
  }
  if (options.reader_connections < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("reader_connections: must be >= 1, got ", options.reader_connections));
  }
  RETURN_IF_ERROR(storage::Migrate(db.get()));
  std::unique_ptr<storage::ReaderPool> readers;
  if (!storage::Database::IsInMemory(db->path()) && !db->exclusive_lock()) {
    ASSIGN_OR_RETURN(readers, storage::ReaderPool::Open(db->path(), options.reader_connections));
  }
  std::unique_ptr<Scheduler> s(new Scheduler(std::move(db), clock, options));
  s->readers_ = std::move(readers);
  absl::MutexLock lock(&s->mu_);
  RETURN_IF_ERROR(s->LoadLeases());
  return s;
}

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::Open(
    const std::string& path, Clock* clock, SchedulerOptions options) {
  storage::DatabaseOptions db_options;
  db_options.durability = options.durability;
  ASSIGN_OR_RETURN(std::unique_ptr<storage::Database> db,
                   storage::Database::Open(path, db_options));
  return Create(std::move(db), clock, options);
}

absl::Status Scheduler::LoadLeases() {
  ASSIGN_OR_RETURN(std::vector<JobRecord> active, jobs_.ListInStates({v1::LEASED, v1::RUNNING}));
  int64_t now = clock_->NowMonotonicMs();
  for (const JobRecord& job : active) {
    leases_.Grant(job.id, job.current_attempt_id, job.worker_id, now,
                  job.state == v1::RUNNING);
  }
  counters_.active_leases = static_cast<int64_t>(leases_.size());
  return absl::OkStatus();
}

void Scheduler::Bump(bool state_changed) {
  if (state_changed) hub_.StateChanged();
  absl::MutexLock lock(&change_mu_);
  change_version_.fetch_add(1);
  change_cv_.SignalAll();
}

void Scheduler::WaitForChange(uint64_t seen, absl::Duration timeout) {
  absl::MutexLock lock(&change_mu_);
  absl::Time deadline = absl::Now() + timeout;
  while (change_version_.load() == seen) {
    if (change_cv_.WaitWithDeadline(&change_mu_, deadline)) break;
  }
}

absl::StatusOr<std::vector<storage::SweepStateCount>> Scheduler::CountJobsBySweepAndState() {
  return Read([](storage::Database* db) { return storage::JobStore(db).CountBySweepAndState(); });
}

absl::Status Scheduler::CheckDatabase() {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<int64_t> version = storage::SchemaVersion(db_.get());
  if (!version.ok()) {
    return absl::UnavailableError(
        absl::StrCat("database not readable: ", version.status().message()));
  }
  if (*version != storage::LatestSchemaVersion()) {
    return absl::UnavailableError(absl::StrCat("database schema at version ", *version,
                                               ", expected ", storage::LatestSchemaVersion()));
  }
  if (!db_->WriteHealth().ok()) {
    return absl::UnavailableError(absl::StrCat("database not writable: ",
                                               db_->WriteHealth().message()));
  }
  return absl::OkStatus();
}

SchedulerCounters Scheduler::Counters() const {
  absl::MutexLock lock(&mu_);
  SchedulerCounters c = counters_;
  c.active_leases = static_cast<int64_t>(leases_.size());
  return c;
}

absl::StatusOr<const v1::SweepSpec*> Scheduler::SpecFor(int64_t sweep_id) {
  auto it = spec_cache_.find(sweep_id);
  if (it != spec_cache_.end()) return &it->second;
  ASSIGN_OR_RETURN(std::optional<storage::SweepRecord> sweep, sweeps_.Get(sweep_id));
  if (!sweep) return absl::NotFoundError(absl::StrCat("sweep ", sweep_id, " not found"));
  ASSIGN_OR_RETURN(v1::SweepSpec spec, ParseSpec(*sweep));
  return &(spec_cache_[sweep_id] = std::move(spec));
}

absl::StatusOr<storage::SweepRecord> Scheduler::SweepByName(const std::string& name) {
  return FindSweep(db_.get(), name);
}

absl::StatusOr<v1::Sweep> Scheduler::SweepProto(const storage::SweepRecord& s) {
  ASSIGN_OR_RETURN(const v1::SweepSpec* spec, SpecFor(s.id));
  return SweepProtoFrom(db_.get(), s, *spec);
}

// --- SweepService -----------------------------------------------------------

absl::StatusOr<v1::SubmitSweepResponse> Scheduler::SubmitSweep(const v1::SweepSpec& spec) {
  ASSIGN_OR_RETURN(ExpandedSweep expanded, ExpandSweep(spec));
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(std::optional<storage::SweepRecord> existing, sweeps_.FindByName(spec.name()));
  v1::SubmitSweepResponse response;
  if (existing) {
    ASSIGN_OR_RETURN(const v1::SweepSpec* stored, SpecFor(existing->id));
    if (!google::protobuf::util::MessageDifferencer::Equals(*stored, spec)) {
      return absl::AlreadyExistsError(absl::StrCat(
          "sweep \"", spec.name(), "\" already exists with a different spec"));
    }
    ASSIGN_OR_RETURN(*response.mutable_sweep(), SweepProto(*existing));
    response.set_created(false);
    return response;
  }
  int64_t now = clock_->NowWallMs();
  ASSIGN_OR_RETURN(TimedTransaction txn, BeginTransaction("submit_sweep"));
  storage::SweepRecord sweep;
  sweep.name = spec.name();
  spec.SerializeToString(&sweep.spec);
  sweep.created_ms = now;
  ASSIGN_OR_RETURN(sweep.id, sweeps_.Insert(sweep));
  RETURN_IF_ERROR(InsertPlannedJobs(sweep, spec, expanded, now));
  RETURN_IF_ERROR(InsertPlannedResults(sweep.id, expanded));
  RETURN_IF_ERROR(txn.Commit());
  spec_cache_[sweep.id] = spec;
  counters_.sweeps_submitted++;
  counters_.jobs_created += static_cast<int64_t>(expanded.jobs.size());
  ASSIGN_OR_RETURN(*response.mutable_sweep(), SweepProto(sweep));
  response.set_created(true);
  Bump();
  return response;
}

absl::Status Scheduler::InsertPlannedJobs(const storage::SweepRecord& sweep,
                                          const v1::SweepSpec& spec,
                                          const ExpandedSweep& expanded, int64_t now) {
  std::string labels = LabelsJson(spec.resources().labels());
  ASSIGN_OR_RETURN(int64_t next_id, jobs_.MaxId());
  for (const PlannedJob& planned : expanded.jobs) {
    JobRecord job;
    job.sweep_id = sweep.id;
    job.kind = v1::TRAIN;
    job.state = planned.held ? v1::HELD : v1::PENDING;
    job.arch = planned.arch;
    job.layers = planned.shape.layers;
    job.d_model = planned.shape.d_model;
    job.lr = planned.lr;
    job.seed = planned.seed;
    job.config_json = planned.config_json;
    job.max_attempts = expanded.retry.max_attempts;
    job.req_devices = spec.resources().devices();
    job.req_memory_mb = spec.resources().memory_mb();
    job.req_labels = labels;
    job.created_ms = job.updated_ms = now;
    // Ids chosen here (this transaction is the only writer) so that the
    // checkpoint dir, named after the id, goes in with the row: one write
    // per job rather than an insert and an update.
    job.id = ++next_id;
    job.checkpoint_dir = absl::StrCat(sweep.name, "/", job.id);
    RETURN_IF_ERROR(jobs_.Insert(job).status());
  }
  return absl::OkStatus();
}

absl::Status Scheduler::InsertPlannedResults(int64_t sweep_id, const ExpandedSweep& expanded) {
  std::map<std::tuple<std::string, int64_t, int64_t, double>, int64_t> per_lr;
  for (const PlannedJob& planned : expanded.jobs) {
    ++per_lr[{planned.arch, planned.shape.layers, planned.shape.d_model, planned.lr}];
  }
  for (const auto& [key, count] : per_lr) {
    storage::LrTally tally;
    tally.sweep_id = sweep_id;
    std::tie(tally.arch, tally.layers, tally.d_model, tally.lr) = key;
    RETURN_IF_ERROR(results_.AddLrJobs(tally, count));
  }
  for (const PlannedGroup& group : expanded.groups) {
    storage::ResultRecord row;
    row.sweep_id = sweep_id;
    row.arch = group.arch;
    row.layers = group.shape.layers;
    row.d_model = group.shape.d_model;
    row.aspect_ratio = group.shape.aspect_ratio();
    row.params = group.params;
    std::vector<LrSummary> lrs;
    for (double lr : group.lrs) {
      LrSummary s;
      s.lr = lr;
      lrs.push_back(s);
    }
    std::sort(lrs.begin(), lrs.end(), [](auto& a, auto& b) { return a.lr < b.lr; });
    row.lrs = std::move(lrs);
    RETURN_IF_ERROR(results_.Upsert(row));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::Sweep> Scheduler::GetSweep(const std::string& name) {
  return Read([&](storage::Database* db) -> absl::StatusOr<v1::Sweep> {
    ASSIGN_OR_RETURN(storage::SweepRecord sweep, FindSweep(db, name));
    ASSIGN_OR_RETURN(v1::SweepSpec spec, ParseSpec(sweep));
    return SweepProtoFrom(db, sweep, spec);
  });
}

absl::StatusOr<v1::ListSweepsResponse> Scheduler::ListSweeps(
    const v1::ListSweepsRequest& request) {
  if (request.page_size() < 0 || request.page_size() > 1000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page_size: must be in 0..1000, got ", request.page_size()));
  }
  int64_t limit = request.page_size() == 0 ? 100 : request.page_size();
  int64_t after_id = 0;
  if (!request.page_token().empty() &&
      (!absl::SimpleAtoi(request.page_token(), &after_id) || after_id < 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page_token: not a token from ListSweeps: \"", request.page_token(), "\""));
  }
  return Read([&](storage::Database* db) -> absl::StatusOr<v1::ListSweepsResponse> {
    // One extra row tells whether another page exists.
    ASSIGN_OR_RETURN(std::vector<storage::SweepRecord> page,
                     storage::SweepStore(db).ListPage(after_id, limit + 1));
    v1::ListSweepsResponse out;
    size_t bytes = 0;
    for (size_t i = 0; i < page.size(); ++i) {
      if (static_cast<int64_t>(i) == limit) {
        out.set_next_page_token(absl::StrCat(page[i - 1].id));
        break;
      }
      ASSIGN_OR_RETURN(v1::SweepSpec spec, ParseSpec(page[i]));
      ASSIGN_OR_RETURN(v1::Sweep sweep, SweepProtoFrom(db, page[i], spec));
      size_t size = sweep.ByteSizeLong();
      if (i > 0 && bytes + size > kListPageBytes) {
        out.set_next_page_token(absl::StrCat(page[i - 1].id));
        break;
      }
      bytes += size;
      *out.add_sweeps() = std::move(sweep);
    }
    return out;
  });
}

absl::StatusOr<v1::DeleteSweepResponse> Scheduler::DeleteSweep(
    const v1::DeleteSweepRequest& request) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(storage::SweepRecord sweep, SweepByName(request.name()));
  ASSIGN_OR_RETURN(std::vector<JobRecord> jobs, jobs_.ListBySweep(sweep.id));
  std::vector<int64_t> active;
  for (const JobRecord& job : jobs) {
    if (job.state == v1::LEASED || job.state == v1::RUNNING) active.push_back(job.id);
  }
  if (!active.empty() && !request.force()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "sweep \"", sweep.name, "\" has ", active.size(),
        " leased or running job(s); cancel it first or delete with force (--force)"));
  }
  ASSIGN_OR_RETURN(TimedTransaction txn, BeginTransaction("delete_sweep"));
  RETURN_IF_ERROR(sweeps_.Delete(sweep.id));
  int64_t cancelled = static_cast<int64_t>(active.size());
  AfterCommit([this, active, id = sweep.id] {
    for (int64_t job : active) {
      leases_.Release(job);
      counters_.jobs_cancelled++;
      observer_->OnJobFinished(v1::CANCELLED);
    }
    spec_cache_.erase(id);
  });
  RETURN_IF_ERROR(txn.Commit());
  Bump();
  v1::DeleteSweepResponse out;
  out.set_deleted_jobs(static_cast<int64_t>(jobs.size()));
  out.set_cancelled_jobs(cancelled);
  return out;
}

absl::StatusOr<v1::CancelSweepResponse> Scheduler::CancelSweep(const std::string& name) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(storage::SweepRecord sweep, SweepByName(name));
  ASSIGN_OR_RETURN(std::vector<JobRecord> jobs, jobs_.ListBySweep(sweep.id));
  int64_t now = clock_->NowWallMs();
  ASSIGN_OR_RETURN(TimedTransaction txn, BeginTransaction("cancel_sweep"));
  int64_t cancelled = 0;
  std::vector<int64_t> released;
  std::vector<std::pair<size_t, v1::JobState>> changed;  // (index, state before)
  for (size_t i = 0; i < jobs.size(); ++i) {
    JobRecord& job = jobs[i];
    if (IsTerminalState(job.state)) continue;
    changed.emplace_back(i, job.state);
    if (job.state == v1::LEASED || job.state == v1::RUNNING) {
      RETURN_IF_ERROR(jobs_.EndAttempt(job.current_attempt_id, now, "cancelled",
                                       "sweep cancelled"));
      released.push_back(job.id);
    }
    job.state = v1::CANCELLED;
    job.reason = "sweep cancelled";
    job.updated_ms = now;
    RETURN_IF_ERROR(jobs_.Update(job));
    ++cancelled;
    AfterCommit([this] {
      counters_.jobs_cancelled++;
      observer_->OnJobFinished(v1::CANCELLED);
    });
  }
  RETURN_IF_ERROR(sweeps_.SetCancelled(sweep.id, true));
  for (const auto& [i, from_state] : changed) {
    if (jobs[i].kind == v1::TRAIN) RETURN_IF_ERROR(UpdateGroup(jobs[i], from_state));
  }
  RETURN_IF_ERROR(txn.Commit());
  for (int64_t id : released) leases_.Release(id);
  Bump();
  v1::CancelSweepResponse out;
  out.set_cancelled_jobs(cancelled);
  return out;
}

absl::StatusOr<v1::ListJobsResponse> Scheduler::ListJobs(const v1::ListJobsRequest& request) {
  storage::JobFilter filter;
  ASSIGN_OR_RETURN(filter.limit, PageLimit(request.page_size()));
  ASSIGN_OR_RETURN(filter.after_id, ParsePageToken(request.page_token(), "ListJobs"));
  if (request.state() != v1::JOB_STATE_UNSPECIFIED) {
    if (!v1::JobState_IsValid(request.state())) {
      return absl::InvalidArgumentError("state: unknown job state");
    }
    filter.state = request.state();
  }
  if (!request.arch().empty()) {
    absl::StatusOr<Arch> arch = ParseArch(request.arch());
    if (!arch.ok()) return absl::InvalidArgumentError(absl::StrCat("arch: ", arch.status().message()));
    filter.arch = request.arch();
  }
  return Read([&](storage::Database* db) -> absl::StatusOr<v1::ListJobsResponse> {
    std::map<int64_t, std::string> names;
    if (!request.sweep().empty()) {
      ASSIGN_OR_RETURN(storage::SweepRecord sweep, FindSweep(db, request.sweep()));
      filter.sweep_id = sweep.id;
    }
    ASSIGN_OR_RETURN(std::vector<storage::SweepRecord> all, storage::SweepStore(db).List());
    for (const auto& s : all) names[s.id] = s.name;
    ++filter.limit;  // one extra row tells whether another page exists
    ASSIGN_OR_RETURN(std::vector<JobRecord> jobs, storage::JobStore(db).List(filter));
    v1::ListJobsResponse out;
    size_t bytes = 0;
    for (size_t i = 0; i < jobs.size(); ++i) {
      if (static_cast<int64_t>(i) == filter.limit - 1) {
        out.set_next_page_token(absl::StrCat(jobs[i - 1].id));
        break;
      }
      v1::Job job = JobProto(jobs[i], names[jobs[i].sweep_id]);
      size_t size = job.ByteSizeLong();
      if (i > 0 && bytes + size > kListPageBytes) {  // page early, by bytes
        out.set_next_page_token(absl::StrCat(jobs[i - 1].id));
        break;
      }
      bytes += size;
      *out.add_jobs() = std::move(job);
    }
    return out;
  });
}

absl::StatusOr<v1::Job> Scheduler::GetJob(int64_t job_id) {
  return Read([&](storage::Database* db) -> absl::StatusOr<v1::Job> {
    storage::JobStore jobs(db);
    ASSIGN_OR_RETURN(JobRecord job, jobs.Get(job_id));
    ASSIGN_OR_RETURN(std::optional<storage::SweepRecord> sweep,
                     storage::SweepStore(db).Get(job.sweep_id));
    v1::Job out = JobProto(job, sweep ? sweep->name : "");
    ASSIGN_OR_RETURN(std::vector<AttemptRecord> attempts, jobs.ListAttempts(job_id));
    for (const AttemptRecord& a : attempts) {
      v1::Attempt* p = out.add_attempts();
      p->set_attempt_id(a.id);
      p->set_number(static_cast<int32_t>(a.number));
      p->set_worker_id(a.worker_id);
      p->set_start_ms(a.start_ms);
      p->set_end_ms(a.end_ms);
      p->set_outcome(a.outcome);
      p->set_reason(a.reason);
      if (a.resumed_from_step) p->set_resumed_from_step(*a.resumed_from_step);
    }
    return out;
  });
}

absl::StatusOr<v1::RetryJobResponse> Scheduler::RetryJob(const v1::RetryJobRequest& request) {
  if ((request.job_id() != 0) == !request.sweep().empty()) {
    return absl::InvalidArgumentError("exactly one of job_id or sweep is required");
  }
  absl::MutexLock lock(&mu_);
  std::vector<JobRecord> targets;
  if (request.job_id() != 0) {
    ASSIGN_OR_RETURN(JobRecord job, jobs_.Get(request.job_id()));
    if (job.state != v1::FAILED && job.state != v1::CANCELLED) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", job.id, " is ", storage::JobStateText(job.state), "; only failed or cancelled jobs can be retried"));
    }
    targets.push_back(job);
  } else {
    ASSIGN_OR_RETURN(storage::SweepRecord sweep, SweepByName(request.sweep()));
    ASSIGN_OR_RETURN(std::vector<JobRecord> jobs, jobs_.ListBySweep(sweep.id));
    for (const JobRecord& job : jobs) {
      if (job.state == v1::FAILED) targets.push_back(job);
    }
  }
  int64_t now = clock_->NowWallMs();
  ASSIGN_OR_RETURN(TimedTransaction txn, BeginTransaction("retry_job"));
  v1::RetryJobResponse out;
  for (JobRecord& job : targets) {
    const v1::JobState from_state = job.state;
    job.state = v1::PENDING;
    job.attempts_used = 0;
    job.not_before_ms = 0;
    job.reason.clear();
    job.worker_id.clear();
    job.updated_ms = now;
    RETURN_IF_ERROR(jobs_.Update(job));
    RETURN_IF_ERROR(sweeps_.SetCancelled(job.sweep_id, false));
    if (job.kind == v1::TRAIN) RETURN_IF_ERROR(UpdateGroup(job, from_state));
    out.add_job_ids(job.id);
    AfterCommit([this] { observer_->OnJobRetried("manual"); });
  }
  RETURN_IF_ERROR(txn.Commit());
  Bump();
  return out;
}

absl::StatusOr<v1::QueryResultsResponse> Scheduler::QueryResults(const std::string& name) {
  v1::QueryResultsRequest request;
  request.set_sweep(name);
  return QueryResults(request);
}

namespace {

// The row's token budget from its group's config (the same for every run
// of a group: one config per group, O(groups) not O(jobs)); nullopt when
// the config does not parse.
absl::StatusOr<std::optional<TrainConfig>> SetBudget(storage::JobStore& jobs,
                                                     const storage::ResultRecord& r,
                                                     v1::ResultRow* row) {
  ASSIGN_OR_RETURN(std::string config_text,
                   jobs.GroupConfig(r.sweep_id, r.arch, r.layers, r.d_model));
  const nlohmann::json config_json = nlohmann::json::parse(config_text, nullptr, false);
  absl::StatusOr<TrainConfig> config = TrainConfigFromJson(config_json);
  if (!config.ok()) return std::optional<TrainConfig>();
  // Jobs submitted before budget_params existed trained on the design's
  // own count, which the row's params is.
  if (!config_json.contains("budget_params") && r.params > 0) {
    config->budget_params = r.params;
  }
  const TokenBudget budget = ResolveTokenBudget(*config);
  row->set_budget_params(budget.params);
  row->set_budget_tokens(budget.tokens);
  row->set_budget_steps(budget.steps);
  return std::optional<TrainConfig>(*config);
}

// Strategies (issue 15): per LR, runs pruned (and the highest rung one was
// pruned at), never run, and tokens trained; per group, tokens trained
// against the full grid's (every run to the end).
absl::Status SetStrategyColumns(storage::JobStore& jobs, storage::ResultStore& results,
                                const v1::SweepSpec& spec, const storage::ResultRecord& r,
                                int64_t per_step, v1::ResultRow* row) {
  ASSIGN_OR_RETURN(std::vector<storage::GroupMember> members,
                   jobs.ListGroup(r.sweep_id, r.arch, r.layers, r.d_model));
  std::vector<storage::RungRecord> rungs;
  if (spec.strategy().kind().find("successive_halving") != std::string::npos) {
    ASSIGN_OR_RETURN(rungs, results.ListGroupRungs(r.sweep_id, r.arch, r.layers, r.d_model));
  }
  std::map<int64_t, int> pruned_at;
  for (const storage::RungRecord& rung : rungs) {
    if (rung.decision == "prune") pruned_at[rung.job_id] = rung.rung;
  }
  const int64_t total_steps = row->budget_steps();
  std::map<double, v1::LrLoss*> by_lr;
  for (v1::LrLoss& l : *row->mutable_lrs()) {
    l.set_pruned_rung(-1);
    by_lr[l.lr()] = &l;
  }
  int64_t trained = 0;
  for (const storage::GroupMember& m : members) {
    v1::LrLoss*& l = by_lr[m.lr];
    if (l == nullptr) {
      l = row->add_lrs();
      l->set_lr(m.lr);
      l->set_pruned_rung(-1);
    }
    const int64_t tokens = std::clamp<int64_t>(m.final_step, 0, total_steps) * per_step;
    l->set_tokens_trained(l->tokens_trained() + tokens);
    trained += tokens;
    if (m.state == v1::PRUNED) {
      l->set_pruned_runs(l->pruned_runs() + 1);
      auto at = pruned_at.find(m.id);
      if (at != pruned_at.end()) l->set_pruned_rung(std::max(l->pruned_rung(), at->second));
    } else if (m.state == v1::HELD || m.state == v1::SKIPPED) {
      l->set_never_run(l->never_run() + 1);
    }
  }
  row->set_tokens_trained(trained);
  row->set_grid_tokens(static_cast<int64_t>(members.size()) * total_steps * per_step);
  return absl::OkStatus();
}

// One results row as QueryResults shows it.
absl::StatusOr<v1::ResultRow> ResultRowFor(storage::Database* db, const v1::SweepSpec& spec,
                                           const storage::ResultRecord& r) {
  storage::ResultStore results(db);
  storage::JobStore jobs(db);
  v1::ResultRow row = ResultRowProto(r);
  ASSIGN_OR_RETURN(std::optional<TrainConfig> config, SetBudget(jobs, r, &row));
  const int64_t per_step = config ? config->batch * config->seq_len : 0;
  RETURN_IF_ERROR(SetStrategyColumns(jobs, results, spec, r, per_step, &row));
  ASSIGN_OR_RETURN(std::vector<storage::LrTally> tallies,
                   results.ListLrs(r.sweep_id, r.arch, r.layers, r.d_model));
  const double fixed_lr = spec.diagnostics().fixed_lr();
  const GroupSelection selection = SelectBestFromTallies(tallies);
  const int64_t target = DiagnosisTargetFromTallies(selection, tallies, fixed_lr);
  row.set_diagnosed_job_id(target);
  if (target != 0) row.set_diagnosed_lr(fixed_lr > 0 ? fixed_lr : selection.best_lr.value_or(0));
  return row;
}

}  // namespace

absl::StatusOr<v1::QueryResultsResponse> Scheduler::QueryResults(
    const v1::QueryResultsRequest& request) {
  ASSIGN_OR_RETURN(int64_t limit, PageLimit(request.page_size()));
  ASSIGN_OR_RETURN(int64_t after_id, ParsePageToken(request.page_token(), "QueryResults"));
  return Read([&](storage::Database* db) -> absl::StatusOr<v1::QueryResultsResponse> {
    ASSIGN_OR_RETURN(storage::SweepRecord sweep, FindSweep(db, request.sweep()));
    v1::QueryResultsResponse out;
    if (request.page_token().empty()) {
      ASSIGN_OR_RETURN(v1::SweepSpec spec, ParseSpec(sweep));
      ASSIGN_OR_RETURN(std::vector<storage::ResultRecord> rows,
                       storage::ResultStore(db).List(sweep.id));
      for (const storage::ResultRecord& r : rows) {
        ASSIGN_OR_RETURN(*out.add_rows(), ResultRowFor(db, spec, r));
      }
    }
    // One extra row tells whether another page exists.
    ASSIGN_OR_RETURN(std::vector<storage::RunRecord> runs,
                     storage::JobStore(db).ListRuns(sweep.id, after_id, limit + 1));
    for (size_t i = 0; i < runs.size() && static_cast<int64_t>(i) < limit; ++i) {
      *out.add_runs() = RunSummaryProto(runs[i]);
    }
    if (static_cast<int64_t>(runs.size()) > limit) {
      out.set_next_page_token(absl::StrCat(out.runs(out.runs_size() - 1).job_id()));
    }
    return out;
  });
}

absl::StatusOr<WatchBatch> Scheduler::ReadWatch(int64_t job_id, int64_t after_row_id,
                                                int64_t from_step, int64_t limit,
                                                int64_t attempt_id) {
  return Read([&](storage::Database* db) -> absl::StatusOr<WatchBatch> {
    storage::JobStore jobs(db);
    ASSIGN_OR_RETURN(JobRecord job, jobs.Get(job_id));
    if (attempt_id != 0) {
      ASSIGN_OR_RETURN(std::optional<AttemptRecord> attempt, jobs.GetAttempt(attempt_id));
      if (!attempt || attempt->job_id != job_id) {
        return absl::NotFoundError(absl::StrCat("attempt_id: ", attempt_id,
                                                " is not an attempt of job ", job_id));
      }
    }
    WatchBatch batch;
    batch.state = job.state;
    batch.attempt_id = job.current_attempt_id;
    ASSIGN_OR_RETURN(batch.resumed_from_step, ResumeStepOfCurrentAttempt(jobs, job));
    ASSIGN_OR_RETURN(batch.points, storage::MetricStore(db).Read(job_id, after_row_id, from_step,
                                                                 limit, attempt_id));
    return batch;
  });
}

std::unique_ptr<JobWatch> Scheduler::Watch(int64_t job_id, int64_t from_step) {
  return std::unique_ptr<JobWatch>(new JobWatch(this, job_id, from_step));
}

absl::StatusOr<WatchBatch> JobWatch::Next(int64_t limit, absl::Duration wait) {
  Scheduler* s = scheduler_;
  while (!live_) {
    // From storage. Under the scheduler's mutex, so every point committed
    // later is published to the channel subscribed here.
    WatchBatch batch;
    {
      absl::MutexLock lock(&s->mu_);
      seen_epoch_ = s->hub_.state_epoch();
      ASSIGN_OR_RETURN(JobRecord job, s->jobs_.Get(job_id_));
      batch.state = job.state;
      batch.attempt_id = job.current_attempt_id;
      ASSIGN_OR_RETURN(resumed_from_step_, ResumeStepOfCurrentAttempt(s->jobs_, job));
      batch.resumed_from_step = resumed_from_step_;
      ASSIGN_OR_RETURN(batch.points, s->metrics_.Read(job_id_, cursor_, from_step_, limit));
      if (channel_ == nullptr) channel_ = s->hub_.Subscribe(job_id_);
      // Rows skipped by from_step still move the cursor.
      if (static_cast<int64_t>(batch.points.size()) < limit) live_ = true;
    }
    if (!batch.points.empty()) cursor_ = batch.points.back().row_id;
    state_ = batch.state;
    attempt_id_ = batch.attempt_id;
    return batch;
  }
  WatchHub::Taken taken = s->hub_.Wait(*channel_, cursor_, from_step_, limit, seen_epoch_, wait);
  if (taken.epoch != seen_epoch_) {
    // A state changed somewhere: read this job's state first, then take
    // the ring again, so that points committed with the state come along.
    {
      absl::MutexLock lock(&s->mu_);
      seen_epoch_ = s->hub_.state_epoch();
      ASSIGN_OR_RETURN(JobRecord job, s->jobs_.Get(job_id_));
      state_ = job.state;
      attempt_id_ = job.current_attempt_id;
      ASSIGN_OR_RETURN(resumed_from_step_, ResumeStepOfCurrentAttempt(s->jobs_, job));
    }
    taken = s->hub_.Wait(*channel_, cursor_, from_step_, limit, taken.epoch, absl::ZeroDuration());
  }
  if (taken.lost) {  // fell behind the ring: catch up from storage
    live_ = false;
    return Next(limit, wait);
  }
  cursor_ = taken.cursor;
  WatchBatch batch;
  batch.points = std::move(taken.points);
  batch.state = state_;
  batch.attempt_id = attempt_id_;
  batch.resumed_from_step = resumed_from_step_;
  return batch;
}

absl::StatusOr<int64_t> Scheduler::ResumedFromLocked(int64_t attempt_id) {
  auto it = resumed_from_.find(attempt_id);
  if (it != resumed_from_.end()) return it->second;
  // Not seen since this scheduler started (or never announced).
  ASSIGN_OR_RETURN(std::optional<AttemptRecord> attempt, jobs_.GetAttempt(attempt_id));
  const int64_t step = attempt && attempt->resumed_from_step ? *attempt->resumed_from_step : -1;
  if (resumed_from_.size() >= 8192) resumed_from_.clear();  // bounded; refilled on demand
  resumed_from_[attempt_id] = step;
  return step;
}

absl::StatusOr<int64_t> Scheduler::StorePointsLocked(
    int64_t job_id, int64_t attempt_id, std::optional<int64_t> resumed_from_step,
    const std::vector<storage::MetricRecord>& points, storage::InsertCounts* counts,
    std::vector<storage::MetricRecord>* stored) {
  int64_t replay_through = -1;
  if (resumed_from_step) {
    // The attempt's trainer says where it started: earlier attempts' points
    // after that step leave the canonical history (kept per attempt).
    RETURN_IF_ERROR(jobs_.SetResumedFromStep(attempt_id, *resumed_from_step));
    RETURN_IF_ERROR(metrics_.Supersede(job_id, attempt_id, *resumed_from_step).status());
    replay_through = *resumed_from_step;
  } else {
    ASSIGN_OR_RETURN(replay_through, ResumedFromLocked(attempt_id));
  }
  if (!points.empty()) {
    ASSIGN_OR_RETURN(*counts, metrics_.Insert(points, replay_through, stored));
  }
  return replay_through;
}

// --- WorkerService ----------------------------------------------------------

absl::StatusOr<storage::WorkerRecord> Scheduler::Worker(const std::string& id) {
  if (id.empty()) return absl::InvalidArgumentError("worker_id: required");
  auto it = worker_cache_.find(id);
  if (it != worker_cache_.end()) return it->second;
  ASSIGN_OR_RETURN(std::optional<storage::WorkerRecord> w, workers_.Get(id));
  if (!w) {
    return absl::NotFoundError(absl::StrCat(
        "worker \"", id, "\" is not registered; call RegisterWorker"));
  }
  worker_cache_[id] = *w;
  return *w;
}

std::vector<v1::Cancellation> Scheduler::Reattach(
    const std::string& worker_id,
    const google::protobuf::RepeatedPtrField<v1::RunningAttempt>& running) {
  std::vector<v1::Cancellation> out;
  int64_t now = clock_->NowMonotonicMs();
  for (const v1::RunningAttempt& r : running) {
    Lease* lease = leases_.Find(r.job_id(), r.attempt_id());
    if (lease != nullptr && lease->worker_id == worker_id) {
      leases_.Renew(r.job_id(), r.attempt_id(), now);
      continue;
    }
    v1::Cancellation c;
    c.set_job_id(r.job_id());
    c.set_attempt_id(r.attempt_id());
    absl::StatusOr<JobRecord> job = jobs_.Get(r.job_id());
    if (!job.ok()) {
      c.set_reason("unknown job");
    } else if (job->state == v1::CANCELLED) {
      c.set_reason("job cancelled");
    } else if (job->current_attempt_id != r.attempt_id()) {
      c.set_reason("attempt superseded (lease expired)");
    } else if (IsTerminalState(job->state) || job->state == v1::PAUSED) {
      c.set_reason(absl::StrCat("job already ", storage::JobStateText(job->state)));
    } else {
      c.set_reason("lease held by another worker");
    }
    out.push_back(std::move(c));
  }
  return out;
}

absl::StatusOr<v1::RegisterWorkerResponse> Scheduler::RegisterWorker(
    const v1::RegisterWorkerRequest& request) {
  const std::string& name = request.name();
  if (name.empty() || name.size() > 128) {
    return absl::InvalidArgumentError("name: must be 1-128 characters");
  }
  const auto& res = request.resources();
  if (res.devices() < 0) return absl::InvalidArgumentError("resources.devices: must be >= 0");
  if (res.memory_mb() < 0) return absl::InvalidArgumentError("resources.memory_mb: must be >= 0");
  if (res.slots() < 0) return absl::InvalidArgumentError("resources.slots: must be >= 0");
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(ExpireLeasesLocked().status());
  storage::WorkerRecord w;
  w.id = name;
  w.devices = res.devices();
  w.memory_mb = res.memory_mb();
  w.slots = std::max<int64_t>(1, res.slots());
  w.labels_json = LabelsJson(res.labels());
  w.registered_ms = w.last_seen_ms = clock_->NowWallMs();
  RETURN_IF_ERROR(workers_.Upsert(w));
  worker_cache_[w.id] = w;
  SawWorker(w.id);
  v1::RegisterWorkerResponse out;
  out.set_worker_id(w.id);
  out.set_lease_ttl_ms(options_.lease_ttl_ms);
  out.set_heartbeat_interval_ms(options_.heartbeat_interval_ms);
  for (auto& c : Reattach(w.id, request.running())) *out.add_cancellations() = c;
  return out;
}

absl::StatusOr<v1::HeartbeatResponse> Scheduler::Heartbeat(const v1::HeartbeatRequest& request) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(storage::WorkerRecord worker, Worker(request.worker_id()));
  SawWorker(worker.id);
  // Renew first: a heartbeat that arrives in time must not lose to expiry.
  v1::HeartbeatResponse out;
  for (auto& c : Reattach(worker.id, request.running())) *out.add_cancellations() = c;
  // A heartbeat writes nothing itself: when the expiry of others' leases
  // cannot be committed (disk full; reported by CheckDatabase), the renewal
  // above still stands and the expiry is retried later.
  absl::Status expiry = ExpireLeasesLocked().status();
  if (!expiry.ok() && db_->WriteHealth().ok()) return expiry;
  out.set_lease_ttl_ms(options_.lease_ttl_ms);
  return out;
}

absl::StatusOr<v1::AcquireJobResponse> Scheduler::AcquireJob(const v1::AcquireJobRequest& request) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(storage::WorkerRecord worker, Worker(request.worker_id()));
  SawWorker(worker.id);
  RETURN_IF_ERROR(ExpireLeasesLocked().status());
  v1::AcquireJobResponse out;
  out.set_lease_ttl_ms(options_.lease_ttl_ms);
  if (leases_.CountForWorker(worker.id) >= worker.slots) return out;
  int64_t now_wall = clock_->NowWallMs();
  ASSIGN_OR_RETURN(std::optional<int64_t> runnable,
                   jobs_.FindRunnable(now_wall, worker.devices, worker.memory_mb,
                                      [&worker](const std::string& required) {
                                        return LabelsMatch(required, worker.labels_json);
                                      },
                                      kAcquireScanLimit));
  if (!runnable) return out;
  ASSIGN_OR_RETURN(JobRecord job, jobs_.Get(*runnable));
  ASSIGN_OR_RETURN(int64_t previous, jobs_.CountAttempts(job.id));
  ASSIGN_OR_RETURN(TimedTransaction txn, BeginTransaction("acquire_job"));
  AttemptRecord attempt;
  attempt.job_id = job.id;
  attempt.number = previous + 1;
  attempt.worker_id = worker.id;
  attempt.start_ms = now_wall;
  ASSIGN_OR_RETURN(attempt.id, jobs_.InsertAttempt(attempt));
  job.state = v1::LEASED;
  job.attempts_used++;
  job.current_attempt_id = attempt.id;
  job.worker_id = worker.id;
  job.updated_ms = now_wall;
  RETURN_IF_ERROR(jobs_.Update(job));
  RETURN_IF_ERROR(txn.Commit());
  leases_.Grant(job.id, attempt.id, worker.id, clock_->NowMonotonicMs());
  counters_.leases_granted++;
  observer_->OnLeaseGranted();
  ASSIGN_OR_RETURN(const v1::SweepSpec* spec, SpecFor(job.sweep_id));
  out.set_has_job(true);
  out.set_job_id(job.id);
  out.set_attempt_id(attempt.id);
  out.set_kind(job.kind);
  out.set_config_json(JobConfigJson(job));
  out.set_checkpoint_dir(job.checkpoint_dir);
  out.set_resume(previous > 0);
  out.set_attempt_number(static_cast<int32_t>(attempt.number));
  out.set_sweep_name(spec->name());
  Bump();
  return out;
}

// One ReportMetrics call in the group-commit queue. `done` and `result`
// are written by the leader that committed it, under ingest_mu_.
struct Scheduler::PendingReport {
  int64_t job_id = 0;
  int64_t attempt_id = 0;
  std::optional<int64_t> resumed;
  std::vector<storage::MetricRecord> points;
  absl::StatusOr<v1::ReportMetricsResponse> result = absl::UnknownError("not committed");
  bool done = false;
};

absl::StatusOr<v1::ReportMetricsResponse> Scheduler::ReportMetrics(
    const v1::ReportMetricsRequest& request) {
  PendingReport me;
  me.job_id = request.job_id();
  me.attempt_id = request.attempt_id();
  me.points.reserve(request.points_size());
  int64_t now_wall = clock_->NowWallMs();
  for (int i = 0; i < request.points_size(); ++i) {
    const v1::MetricPoint& p = request.points(i);
    if (p.name().empty()) {
      return absl::InvalidArgumentError(absl::StrCat("points[", i, "].name: required"));
    }
    if (p.step() < 0) {
      return absl::InvalidArgumentError(absl::StrCat("points[", i, "].step: must be >= 0"));
    }
    me.points.push_back({0, request.job_id(), request.attempt_id(), p.step(), p.name(),
                         p.value(), p.wall_ms() != 0 ? p.wall_ms() : now_wall});
  }
  if (request.has_resumed_from_step()) {
    if (request.resumed_from_step() < 0) {
      return absl::InvalidArgumentError("resumed_from_step: must be >= 0");
    }
    me.resumed = request.resumed_from_step();
  }
  // Group commit: live relays send many small reports; the first caller to
  // find no leader stores every report queued so far in one transaction
  // while later callers queue behind it (one leader at a time; a waiter
  // whose report is still queued when the leader finishes takes over).
  absl::MutexLock lock(&ingest_mu_);
  ingest_queue_.push_back(&me);
  auto done_or_free = [this, &me]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ingest_mu_) {
    return me.done || !ingest_leader_;
  };
  ingest_mu_.Await(absl::Condition(&done_or_free));
  if (me.done) return std::move(me.result);
  ingest_leader_ = true;
  std::vector<PendingReport*> group;
  group.swap(ingest_queue_);  // holds `me`
  ingest_mu_.Unlock();
  CommitReports(group);
  ingest_mu_.Lock();
  for (PendingReport* r : group) r->done = true;
  ingest_leader_ = false;
  return std::move(me.result);
}

void Scheduler::CommitReports(const std::vector<PendingReport*>& group) {
  absl::MutexLock lock(&mu_);
  std::vector<std::pair<PendingReport*, Lease*>> live = LiveReports(group);
  if (live.empty()) return;
  auto fail_all = [&live](const absl::Status& status) {
    for (auto& [r, lease] : live) r->result = status;
  };
  absl::StatusOr<TimedTransaction> txn = BeginTransaction("report_metrics");
  if (!txn.ok()) return fail_all(txn.status());
  const int64_t now_wall = clock_->NowWallMs();
  std::vector<ReportOutcome> outcomes(live.size());
  bool state_changed = false;
  for (size_t i = 0; i < live.size(); ++i) {
    absl::Status stored =
        StoreReport(*live[i].first, *live[i].second, now_wall, &outcomes[i], &state_changed);
    if (!stored.ok()) return fail_all(stored);  // rolls back
  }
  absl::Status committed = txn->Commit();
  if (!committed.ok()) return fail_all(committed);
  int64_t accepted = 0, duplicates = 0;
  const bool any_stopped = std::any_of(outcomes.begin(), outcomes.end(),
                                       [](const auto& o) { return o.stopped.has_value(); });
  for (size_t i = 0; i < live.size(); ++i) {
    auto& [r, lease] = live[i];
    // A prune released its job's lease: a later report of the same attempt
    // in this group must not touch the released entry.
    if (any_stopped) lease = leases_.Find(r->job_id, r->attempt_id);
    accepted += outcomes[i].counts.accepted;
    duplicates += outcomes[i].counts.duplicates;
    AnswerReport(*r, lease, outcomes[i]);
  }
  counters_.points_accepted += accepted;
  counters_.points_duplicate += duplicates;
  observer_->OnMetricPoints(accepted, duplicates);
  Bump(/*state_changed=*/state_changed);
}

std::vector<std::pair<Scheduler::PendingReport*, Lease*>> Scheduler::LiveReports(
    const std::vector<PendingReport*>& group) {
  std::vector<std::pair<PendingReport*, Lease*>> live;
  const int64_t now_mono = clock_->NowMonotonicMs();
  for (PendingReport* r : group) {
    Lease* lease = leases_.Find(r->job_id, r->attempt_id);
    if (lease == nullptr) {
      counters_.stale_reports++;
      r->result = absl::FailedPreconditionError(absl::StrCat(
          "attempt ", r->attempt_id, " of job ", r->job_id,
          " does not hold a lease (expired, superseded, cancelled or finished)"));
      continue;
    }
    leases_.Renew(r->job_id, r->attempt_id, now_mono);
    live.emplace_back(r, lease);
  }
  return live;
}

absl::Status Scheduler::StoreReport(const PendingReport& r, const Lease& lease, int64_t now_wall,
                                    ReportOutcome* out, bool* state_changed) {
  ASSIGN_OR_RETURN(out->replay_through,
                   StorePointsLocked(r.job_id, r.attempt_id, r.resumed, r.points, &out->counts,
                                     &out->stored));
  if (!lease.running) {
    ASSIGN_OR_RETURN(JobRecord job, jobs_.Get(r.job_id));
    if (job.state == v1::LEASED) {
      job.state = v1::RUNNING;
      job.updated_ms = now_wall;
      RETURN_IF_ERROR(jobs_.Update(job));
      *state_changed = true;
    }
  }
  // Successive halving: a validation loss at a rung step is decided in
  // this transaction (job reads only when such a point came).
  const bool has_val = std::any_of(out->stored.begin(), out->stored.end(),
                                   [](const storage::MetricRecord& p) {
                                     return p.name == "val_loss";
                                   });
  if (!has_val) return absl::OkStatus();
  ASSIGN_OR_RETURN(JobRecord job, jobs_.Get(r.job_id));
  rungs_changed_ = false;
  ASSIGN_OR_RETURN(out->stopped,
                   DecideRungs(job, out->stored, /*finished=*/false, &out->stop_is_prune));
  if (out->stopped || rungs_changed_) *state_changed = true;
  return absl::OkStatus();
}

void Scheduler::AnswerReport(PendingReport& r, Lease* lease, ReportOutcome& outcome) {
  if (r.resumed) resumed_from_[r.attempt_id] = outcome.replay_through;
  hub_.Publish(r.job_id, outcome.stored);  // one copy; wakes this job's watchers only
  v1::ReportMetricsResponse out;
  out.set_accepted(outcome.counts.accepted);
  out.set_duplicates(outcome.counts.duplicates);
  if (outcome.stopped) {
    // Paused or pruned: the lease goes now (its slot is free); the
    // worker stops the trainer (which writes its checkpoint) on this
    // answer, or on its next heartbeat's cancellation, or when its next
    // report is refused. A paused job is re-queued when promoted.
    out.set_stop_reason(*outcome.stopped);
    leases_.ReleaseAttempt(r.job_id, r.attempt_id);
    resumed_from_.erase(r.attempt_id);
    if (outcome.stop_is_prune) {
      rung_steps_.erase(r.job_id);
      counters_.jobs_pruned++;
      observer_->OnJobFinished(v1::PRUNED);
    }
  } else if (lease != nullptr) {
    lease->running = true;
  }
  r.result = std::move(out);
}

absl::Status Scheduler::RequeueOrFail(JobRecord& job, const std::string& reason,
                                      const std::string& retry_reason) {
  int64_t now = clock_->NowWallMs();
  const v1::JobState from_state = job.state;
  job.reason = reason;
  job.worker_id.clear();
  job.updated_ms = now;
  if (job.attempts_used >= job.max_attempts) {
    job.state = v1::FAILED;
    job.reason = absl::StrCat(reason, " (attempts exhausted: ", job.attempts_used,
                              " of ", job.max_attempts, ")");
    AfterCommit([this] {
      counters_.jobs_failed++;
      observer_->OnJobFinished(v1::FAILED);
    });
    RETURN_IF_ERROR(jobs_.Update(job));
    if (job.kind == v1::TRAIN) RETURN_IF_ERROR(UpdateGroup(job, from_state));
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(const v1::SweepSpec* spec, SpecFor(job.sweep_id));
  RetrySettings retry = RetryFromSpec(spec->retry());
  job.state = v1::PENDING;
  job.not_before_ms = now + BackoffMs(job.attempts_used, retry.initial_backoff_ms,
                                      retry.backoff_multiplier, retry.max_backoff_ms);
  AfterCommit([this, retry_reason] {
    counters_.attempts_retried++;
    observer_->OnJobRetried(retry_reason);
  });
  return jobs_.Update(job);
}

absl::StatusOr<v1::FinishJobResponse> Scheduler::FinishJob(const v1::FinishJobRequest& request) {
  if (request.status() == v1::FINISH_STATUS_UNSPECIFIED) {
    return absl::InvalidArgumentError("status: required");
  }
  absl::MutexLock lock(&mu_);
  if (leases_.Find(request.job_id(), request.attempt_id()) == nullptr) {
    return RepeatedFinish(request);
  }
  ASSIGN_OR_RETURN(JobRecord job, jobs_.Get(request.job_id()));
  const v1::JobState from_state = job.state;
  int64_t now = clock_->NowWallMs();
  ASSIGN_OR_RETURN(TimedTransaction txn, BeginTransaction("finish_job"));
  if (request.points_size() > 0 || request.has_resumed_from_step()) {
    RETURN_IF_ERROR(StoreFinalPoints(job, request, now));
  }
  job.updated_ms = now;
  job.worker_id.clear();
  if (request.has_val_loss()) job.val_loss = request.final_val_loss();
  if (request.final_step() > 0) job.final_step = request.final_step();
  RETURN_IF_ERROR(ApplyFinish(job, from_state, request, now));
  RETURN_IF_ERROR(txn.Commit());
  resumed_from_.erase(request.attempt_id());
  rung_steps_.erase(job.id);
  leases_.Release(job.id);
  Bump();
  v1::FinishJobResponse out;
  out.set_state(job.state);
  return out;
}

absl::StatusOr<v1::FinishJobResponse> Scheduler::RepeatedFinish(
    const v1::FinishJobRequest& request) {
  v1::FinishJobResponse out;
  // A FinishJob re-sent after a lost reply is answered again, not refused.
  ASSIGN_OR_RETURN(std::optional<AttemptRecord> attempt, jobs_.GetAttempt(request.attempt_id()));
  static const std::map<v1::FinishStatus, std::string> kOutcome = {
      {v1::FINISH_SUCCEEDED, "succeeded"}, {v1::FINISH_DIVERGED, "diverged"},
      {v1::FINISH_FAILED, "failed"}, {v1::FINISH_INTERRUPTED, "interrupted"}};
  if (attempt && attempt->job_id == request.job_id() &&
      attempt->outcome == kOutcome.at(request.status())) {
    ASSIGN_OR_RETURN(JobRecord job, jobs_.Get(request.job_id()));
    out.set_state(job.state);
    return out;
  }
  counters_.stale_reports++;
  return absl::FailedPreconditionError(absl::StrCat(
      "attempt ", request.attempt_id(), " of job ", request.job_id(),
      " does not hold a lease (expired, superseded, cancelled or finished)"));
}

absl::Status Scheduler::StoreFinalPoints(JobRecord& job, const v1::FinishJobRequest& request,
                                         int64_t now) {
  std::vector<storage::MetricRecord> points;
  for (const v1::MetricPoint& p : request.points()) {
    points.push_back({0, job.id, request.attempt_id(), p.step(), p.name(), p.value(),
                      p.wall_ms() != 0 ? p.wall_ms() : now});
  }
  std::optional<int64_t> resumed;
  if (request.has_resumed_from_step() && request.resumed_from_step() >= 0) {
    resumed = request.resumed_from_step();
  }
  storage::InsertCounts counts;
  auto stored = std::make_shared<std::vector<storage::MetricRecord>>();
  RETURN_IF_ERROR(StorePointsLocked(job.id, request.attempt_id(), resumed, points, &counts,
                                    stored.get())
                      .status());
  if (job.kind == v1::TRAIN && request.status() == v1::FINISH_SUCCEEDED) {
    // Rungs this run reached with its last points count for the runs
    // still to arrive there; a finished run is not stopped.
    RETURN_IF_ERROR(DecideRungs(job, *stored, /*finished=*/true).status());
  }
  AfterCommit([this, counts, stored, job_id = job.id] {
    hub_.Publish(job_id, *stored);
    counters_.points_accepted += counts.accepted;
    counters_.points_duplicate += counts.duplicates;
    observer_->OnMetricPoints(counts.accepted, counts.duplicates);
  });
  return absl::OkStatus();
}

absl::Status Scheduler::ApplyFinish(JobRecord& job, v1::JobState from_state,
                                    const v1::FinishJobRequest& request, int64_t now) {
  switch (request.status()) {
    case v1::FINISH_SUCCEEDED:
      RETURN_IF_ERROR(jobs_.EndAttempt(request.attempt_id(), now, "succeeded", request.reason()));
      job.state = v1::SUCCEEDED;
      job.reason = request.reason();
      AfterCommit([this] {
        counters_.jobs_succeeded++;
        observer_->OnJobFinished(v1::SUCCEEDED);
      });
      RETURN_IF_ERROR(jobs_.Update(job));
      if (job.kind == v1::TRAIN) {
        RETURN_IF_ERROR(UpdateGroup(job, from_state));
      } else {
        RETURN_IF_ERROR(RecordDiagnostics(job, request));
      }
      break;
    case v1::FINISH_DIVERGED:
      RETURN_IF_ERROR(jobs_.EndAttempt(request.attempt_id(), now, "diverged", request.reason()));
      job.state = v1::DIVERGED;
      job.reason = request.reason().empty() ? "diverged" : request.reason();
      AfterCommit([this] {
        counters_.jobs_diverged++;
        observer_->OnJobFinished(v1::DIVERGED);
      });
      RETURN_IF_ERROR(jobs_.Update(job));
      if (job.kind == v1::TRAIN) {
        RETURN_IF_ERROR(RecordDivergedRungs(job));
        RETURN_IF_ERROR(UpdateGroup(job, from_state));
      }
      break;
    case v1::FINISH_FAILED: {
      std::string reason = request.reason().empty() ? "failed" : request.reason();
      RETURN_IF_ERROR(jobs_.EndAttempt(request.attempt_id(), now, "failed", reason));
      RETURN_IF_ERROR(RequeueOrFail(job, reason, "failed"));
      break;
    }
    case v1::FINISH_INTERRUPTED:
      RETURN_IF_ERROR(jobs_.EndAttempt(request.attempt_id(), now, "interrupted", request.reason()));
      job.state = v1::PENDING;
      job.attempts_used = std::max<int64_t>(0, job.attempts_used - 1);
      job.not_before_ms = 0;
      AfterCommit([this] {
        counters_.attempts_interrupted++;
        observer_->OnJobRetried("interrupted");
      });
      RETURN_IF_ERROR(jobs_.Update(job));
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat("status: unknown value ", request.status()));
  }
  return absl::OkStatus();
}

absl::Status Scheduler::RecordDiagnostics(const JobRecord& job,
                                          const v1::FinishJobRequest& request) {
  int64_t now = clock_->NowWallMs();
  nlohmann::json merged = nlohmann::json::object();
  for (const v1::DiagnosticResult& d : request.diagnostics()) {
    RETURN_IF_ERROR(results_.InsertDiagnostic({job.id, d.kind(), d.data_json(), now}));
    nlohmann::json data = nlohmann::json::parse(d.data_json(), nullptr, false);
    merged[d.kind()] = data.is_discarded() ? nlohmann::json(d.data_json()) : data;
  }
  ASSIGN_OR_RETURN(std::optional<storage::ResultRecord> row,
                   results_.Get(job.sweep_id, job.arch, job.layers, job.d_model));
  // Only the diagnostics of the group's current diagnosis target (the best
  // run, or the run at spec.diagnostics.fixed_lr) reach the results row.
  ASSIGN_OR_RETURN(std::vector<storage::GroupMember> group,
                   jobs_.ListGroup(job.sweep_id, job.arch, job.layers, job.d_model));
  ASSIGN_OR_RETURN(const v1::SweepSpec* spec, SpecFor(job.sweep_id));
  const int64_t target =
      DiagnosisTarget(SelectBest(group), group, spec->diagnostics().fixed_lr());
  if (!row || target == 0 || target != job.parent_job_id) return absl::OkStatus();
  nlohmann::json existing = nlohmann::json::parse(row->diagnostics_json, nullptr, false);
  if (!existing.is_object()) existing = nlohmann::json::object();
  for (auto& [kind, data] : merged.items()) existing[kind] = data;
  row->diagnostics_json = existing.dump();
  return results_.Upsert(*row);
}

absl::Status Scheduler::RecountLr(const JobRecord& job) {
  ASSIGN_OR_RETURN(std::vector<storage::GroupMember> group,
                   jobs_.ListGroup(job.sweep_id, job.arch, job.layers, job.d_model));
  storage::LrTally tally;
  tally.sweep_id = job.sweep_id;
  tally.arch = job.arch;
  tally.layers = job.layers;
  tally.d_model = job.d_model;
  tally.lr = job.lr;
  for (const storage::GroupMember& m : group) {  // by id: ties go to the lowest
    if (m.lr != job.lr) continue;
    ++tally.jobs;
    Accumulate(&tally, TallyOf(m.state, m.val_loss, m.id));
  }
  return results_.SetLrTally(tally);
}

absl::Status Scheduler::ApplyLrDelta(const JobRecord& job, storage::LrTally delta) {
  delta.sweep_id = job.sweep_id;
  delta.arch = job.arch;
  delta.layers = job.layers;
  delta.d_model = job.d_model;
  delta.lr = job.lr;
  absl::Status applied = results_.ApplyLrDelta(delta);
  if (absl::IsNotFound(applied)) applied = RecountLr(job);
  return applied;
}

absl::Status Scheduler::UpdateGroup(const JobRecord& changed, v1::JobState from_state) {
  // The run's LR tally: what its new state adds less what its old one did.
  // A success is final, so its loss never has to be taken back out; should
  // one ever be left, the LR is recounted from its jobs.
  if (from_state == v1::SUCCEEDED) {
    RETURN_IF_ERROR(RecountLr(changed));
  } else {
    storage::LrTally delta = TallyOf(changed.state, changed.val_loss, changed.id);
    storage::LrTally before = TallyOf(from_state, std::nullopt, 0);
    delta.ended -= before.ended;
    delta.succeeded -= before.succeeded;
    delta.diverged -= before.diverged;
    delta.failed -= before.failed;
    RETURN_IF_ERROR(ApplyLrDelta(changed, delta));
  }
  RETURN_IF_ERROR(AdvanceTransfer(changed));
  // Successive halving: a run that ended (or was skipped) may complete a
  // rung that paused runs wait on.
  RETURN_IF_ERROR(ResolveGroupRungs(changed, 0));
  ASSIGN_OR_RETURN(std::vector<storage::LrTally> tallies,
                   results_.ListLrs(changed.sweep_id, changed.arch, changed.layers,
                                    changed.d_model));
  const GroupSelection selection = SelectBestFromTallies(tallies);
  RETURN_IF_ERROR(WriteGroupResult(changed, selection));
  return QueueDiagnosis(changed, selection, tallies);
}

absl::Status Scheduler::WriteGroupResult(const JobRecord& changed,
                                         const GroupSelection& selection) {
  ASSIGN_OR_RETURN(std::optional<storage::ResultRecord> existing,
                   results_.Get(changed.sweep_id, changed.arch, changed.layers, changed.d_model));
  storage::ResultRecord row;
  if (existing) row = *existing;
  row.sweep_id = changed.sweep_id;
  row.arch = changed.arch;
  row.layers = changed.layers;
  row.d_model = changed.d_model;
  if (!existing) row.aspect_ratio = static_cast<double>(changed.d_model) / changed.layers;
  row.lrs = selection.lrs;
  row.complete = selection.complete;
  row.best_lr = selection.complete ? selection.best_lr : std::nullopt;
  row.best_val_loss = selection.complete ? selection.best_val_loss : std::nullopt;
  int64_t best_job = selection.complete ? selection.best_job_id : 0;
  int64_t previous_best = row.best_job_id;
  if (previous_best != best_job) row.diagnostics_json = "{}";
  row.best_job_id = best_job;
  RETURN_IF_ERROR(results_.Upsert(row));
  // The results row names the one run marked best; move the mark with it.
  if (previous_best != best_job) {
    if (previous_best != 0) RETURN_IF_ERROR(jobs_.SetBest(previous_best, false));
    if (best_job != 0) RETURN_IF_ERROR(jobs_.SetBest(best_job, true));
  }
  return absl::OkStatus();
}

absl::Status Scheduler::QueueDiagnosis(const JobRecord& changed, const GroupSelection& selection,
                                       const std::vector<storage::LrTally>& tallies) {
  // Any change to the group's runs passes through an incomplete group (best
  // 0), which cleared the diagnostics (WriteGroupResult); so they always
  // belong to the current target, in either mode.
  ASSIGN_OR_RETURN(const v1::SweepSpec* spec, SpecFor(changed.sweep_id));
  if (spec->diagnostics().kinds_size() == 0) return absl::OkStatus();
  const DiagnoseSettings settings = DiagnoseSettingsFromSpec(spec->diagnostics());
  const int64_t target = DiagnosisTargetFromTallies(selection, tallies, settings.fixed_lr);
  if (target == 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::optional<storage::SweepRecord> sweep, sweeps_.Get(changed.sweep_id));
  if (!sweep || sweep->cancelled) return absl::OkStatus();
  ASSIGN_OR_RETURN(bool queued, jobs_.HasChildren(target));
  if (queued) return absl::OkStatus();
  ASSIGN_OR_RETURN(JobRecord best, jobs_.Get(target));
  JobRecord diag = best;
  diag.id = 0;
  diag.kind = v1::DIAGNOSE;
  diag.state = v1::PENDING;
  diag.config_json = DiagnoseConfigJson(JobConfigJson(best), best.checkpoint_dir, settings);
  diag.attempts_used = 0;
  diag.max_attempts = RetryFromSpec(spec->retry()).max_attempts;
  diag.current_attempt_id = 0;
  diag.worker_id.clear();
  diag.not_before_ms = 0;
  diag.val_loss.reset();
  diag.final_step = 0;
  diag.reason.clear();
  diag.is_best = false;
  diag.parent_job_id = best.id;
  diag.created_ms = diag.updated_ms = clock_->NowWallMs();
  ASSIGN_OR_RETURN(diag.id, jobs_.Insert(diag));
  diag.checkpoint_dir = absl::StrCat(sweep->name, "/", diag.id);
  RETURN_IF_ERROR(jobs_.Update(diag));
  AfterCommit([this] { counters_.jobs_created++; });
  return absl::OkStatus();
}

absl::StatusOr<int64_t> Scheduler::ExpireLeases() {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<int64_t> expired = ExpireLeasesLocked();
  if (expired.ok() && !db_->WriteHealth().ok()) {
    // Nothing else to write: probe whether space came back, so that
    // readiness recovers without waiting for the next state change.
    absl::StatusOr<TimedTransaction> txn = BeginTransaction("write_probe");
    if (txn.ok() && metrics_.ProbeWrite().ok()) txn->Commit().IgnoreError();
  }
  observer_->OnWorkersConnected(ConnectedWorkersLocked());
  return expired;
}

absl::StatusOr<int64_t> Scheduler::ExpireLeasesLocked() {
  // Leases leave memory only once the expiry is committed: after a failed
  // commit (disk full) they are still here, expired, and the next call
  // retries them.
  std::vector<Lease> expired = leases_.Expired(clock_->NowMonotonicMs());
  if (expired.empty()) return 0;
  int64_t now = clock_->NowWallMs();
  ASSIGN_OR_RETURN(TimedTransaction txn, BeginTransaction("expire_leases"));
  int64_t count = 0;
  for (const Lease& lease : expired) {
    ASSIGN_OR_RETURN(JobRecord job, jobs_.Get(lease.job_id));
    if ((job.state != v1::LEASED && job.state != v1::RUNNING) ||
        job.current_attempt_id != lease.attempt_id) {
      continue;
    }
    RETURN_IF_ERROR(jobs_.EndAttempt(lease.attempt_id, now, "expired",
                                     "lease expired: no heartbeat"));
    RETURN_IF_ERROR(RequeueOrFail(job, "lease expired: no heartbeat", "lease_expired"));
    ++count;
  }
  AfterCommit([this, expired, count] {
    for (const Lease& lease : expired) leases_.ReleaseAttempt(lease.job_id, lease.attempt_id);
    counters_.leases_expired += count;
    if (count > 0) observer_->OnLeasesExpired(count);
  });
  RETURN_IF_ERROR(txn.Commit());
  Bump();
  return count;
}

// --- Strategies (issue 15) ---------------------------------------------------

absl::StatusOr<const strategies::StrategySettings*> Scheduler::StrategyFor(int64_t sweep_id) {
  auto it = strategy_cache_.find(sweep_id);
  if (it != strategy_cache_.end()) return &it->second;
  ASSIGN_OR_RETURN(const v1::SweepSpec* spec, SpecFor(sweep_id));
  ASSIGN_OR_RETURN(strategies::StrategySettings settings,
                   strategies::StrategyFromSpec(spec->strategy()));
  return &strategy_cache_.emplace(sweep_id, std::move(settings)).first->second;
}

absl::StatusOr<std::vector<int64_t>> Scheduler::RungStepsFor(const JobRecord& job) {
  auto it = rung_steps_.find(job.id);
  if (it != rung_steps_.end()) return it->second;
  ASSIGN_OR_RETURN(const strategies::StrategySettings* st, StrategyFor(job.sweep_id));
  const nlohmann::json j = nlohmann::json::parse(JobConfigJson(job), nullptr, false);
  ASSIGN_OR_RETURN(TrainConfig config, TrainConfigFromJson(j));
  ASSIGN_OR_RETURN(std::vector<int64_t> steps,
                   strategies::RungSteps(st->rungs, ResolveTotalSteps(config),
                                         config.eval_interval));
  rung_steps_[job.id] = steps;
  return steps;
}

namespace {

strategies::Verdict VerdictOf(const std::string& decision) {
  if (decision == "pause") return strategies::Verdict::kPause;
  if (decision == "promote") return strategies::Verdict::kPromote;
  return strategies::Verdict::kPrune;  // "prune", "diverged"
}

}  // namespace

absl::StatusOr<std::vector<strategies::RungEntry>> Scheduler::GroupRungEntries(
    const JobRecord& job) {
  ASSIGN_OR_RETURN(std::vector<storage::RungRecord> recorded,
                   results_.ListGroupRungs(job.sweep_id, job.arch, job.layers, job.d_model));
  std::vector<strategies::RungEntry> entries;
  entries.reserve(recorded.size());
  for (const storage::RungRecord& r : recorded) {
    entries.push_back({r.job_id, r.rung,
                       r.val_loss.value_or(std::numeric_limits<double>::infinity()),
                       VerdictOf(r.decision)});
  }
  return entries;
}

absl::StatusOr<std::optional<std::string>> Scheduler::DecideRungs(
    JobRecord& job, const std::vector<storage::MetricRecord>& points, bool finished,
    bool* pruned) {
  if (pruned != nullptr) *pruned = false;
  // A paused job was stopped (by an earlier report of the same batch):
  // nothing it sent after is decided.
  if (job.kind != v1::TRAIN || IsTerminalState(job.state) || job.state == v1::PAUSED) {
    return std::nullopt;
  }
  ASSIGN_OR_RETURN(const strategies::StrategySettings* st, StrategyFor(job.sweep_id));
  if (!st->successive_halving) return std::nullopt;
  absl::StatusOr<std::vector<int64_t>> rung_steps = RungStepsFor(job);
  if (!rung_steps.ok()) {
    // Validated at submit, so not expected; never let one job's config
    // refuse the other reports committed with it.
    spdlog::warn("job {}: no rung decisions: {}", job.id, rung_steps.status().ToString());
    return std::nullopt;
  }
  const std::vector<int64_t> steps = *rung_steps;
  const int64_t now = clock_->NowWallMs();
  for (const storage::MetricRecord& p : points) {
    if (p.name != "val_loss" || std::find(steps.begin(), steps.end(), p.step) == steps.end()) {
      continue;
    }
    ASSIGN_OR_RETURN(std::vector<strategies::RungEntry> entries, GroupRungEntries(job));
    strategies::RungDecision d =
        strategies::DecideAtStep(steps, st->eta, entries, job.id, p.step, p.value);
    if (d.verdict == strategies::Verdict::kWait) continue;  // decided before
    storage::RungRecord rec;
    rec.job_id = job.id;
    rec.rung = d.rung;
    rec.step = d.step;
    if (std::isfinite(p.value)) rec.val_loss = p.value;
    // A run that ended with this point counts at the rung but is not
    // stopped (nothing is left to save by it).
    rec.decision = finished || d.verdict == strategies::Verdict::kPromote ? "promote"
                   : d.verdict == strategies::Verdict::kPause           ? "pause"
                                                                        : "prune";
    rec.decided_ms = now;
    RETURN_IF_ERROR(results_.InsertRung(rec));
    if (finished) continue;  // FinishJob's UpdateGroup resolves the group
    // The arrival may complete the rung or lift paused runs into the quota,
    // this one included: resolve the group now, in this transaction.
    RETURN_IF_ERROR(ResolveGroupRungs(job, job.id));
    ASSIGN_OR_RETURN(entries, GroupRungEntries(job));
    strategies::Verdict now_verdict = strategies::Verdict::kPromote;
    for (const strategies::RungEntry& e : entries) {
      if (e.job_id == job.id && e.rung == d.rung) now_verdict = e.decision;
    }
    if (now_verdict == strategies::Verdict::kPromote) continue;
    if (now_verdict == strategies::Verdict::kPrune && d.verdict == strategies::Verdict::kPause) {
      // Pruned by the resolution at once (the rung was complete): its
      // final rank is the resolution's.
      d.verdict = strategies::Verdict::kPrune;
      d.quota = strategies::PromotionQuota(d.n, st->eta, /*complete=*/true);
    }
    const bool prune = now_verdict == strategies::Verdict::kPrune;
    const std::string reason = d.Reason();
    RETURN_IF_ERROR(StopAtRung(job, prune, reason, rec.val_loss, d.step, now));
    if (pruned != nullptr) *pruned = prune;
    return reason;
  }
  return std::nullopt;
}

absl::Status Scheduler::StopAtRung(JobRecord& job, bool prune, const std::string& reason,
                                   std::optional<double> val_loss, int64_t step, int64_t now) {
  const v1::JobState from_state = job.state;
  RETURN_IF_ERROR(
      jobs_.EndAttempt(job.current_attempt_id, now, prune ? "pruned" : "paused", reason));
  job.state = prune ? v1::PRUNED : v1::PAUSED;
  job.reason = reason;
  job.val_loss = val_loss;
  job.final_step = step;
  job.worker_id.clear();
  job.updated_ms = now;
  if (!prune) {
    // A pause is no failed attempt: it does not count against
    // max_attempts (as an interruption does not).
    job.attempts_used = std::max<int64_t>(0, job.attempts_used - 1);
    job.val_loss.reset();
  }
  RETURN_IF_ERROR(jobs_.Update(job));
  if (prune) RETURN_IF_ERROR(UpdateGroup(job, from_state));
  spdlog::info("job {}: {}", job.id, reason);
  return absl::OkStatus();
}

absl::Status Scheduler::ResolveGroupRungs(const JobRecord& group_of, int64_t reporting_job) {
  if (resolving_rungs_) return absl::OkStatus();
  ASSIGN_OR_RETURN(const strategies::StrategySettings* st, StrategyFor(group_of.sweep_id));
  if (!st->successive_halving || group_of.kind != v1::TRAIN) return absl::OkStatus();
  absl::StatusOr<std::vector<int64_t>> steps = RungStepsFor(group_of);
  if (!steps.ok()) return absl::OkStatus();  // logged by DecideRungs
  resolving_rungs_ = true;
  absl::Status status = [&]() -> absl::Status {
    const int64_t now = clock_->NowWallMs();
    // A prune can complete a later rung (the run held it open): repeat
    // until nothing changes (each pass changes a paused run for good).
    for (;;) {
      ASSIGN_OR_RETURN(std::vector<strategies::RungEntry> entries, GroupRungEntries(group_of));
      ASSIGN_OR_RETURN(std::vector<storage::GroupMember> members,
                       jobs_.ListGroup(group_of.sweep_id, group_of.arch, group_of.layers,
                                       group_of.d_model));
      std::vector<int64_t> open;
      for (const storage::GroupMember& m : members) {
        // A run LR transfer holds has not started and may never: it does not
        // hold a rung open (the transfer in turn waits for the paused runs
        // to end). Released later, it is ranked on arrival against the
        // recorded runs, at a rung that is complete without it.
        if (IsTerminalState(m.state) || m.state == v1::HELD) continue;
        // The reporting run is still "running" in the table while its own
        // prune is decided: a prune row ends it here.
        const bool pruned_row =
            m.id == reporting_job &&
            std::any_of(entries.begin(), entries.end(), [&](const strategies::RungEntry& e) {
              return e.job_id == m.id && e.decision == strategies::Verdict::kPrune;
            });
        if (!pruned_row) open.push_back(m.id);
      }
      std::vector<strategies::RungDecision> changes =
          strategies::ResolveRungs(*steps, st->eta, entries, open);
      if (changes.empty()) return absl::OkStatus();
      for (const strategies::RungDecision& c : changes) {
        const bool prune = c.verdict == strategies::Verdict::kPrune;
        RETURN_IF_ERROR(
            results_.UpdateRungDecision(c.job_id, c.rung, prune ? "prune" : "promote", now));
        if (c.job_id == reporting_job) continue;  // DecideRungs acts on it
        ASSIGN_OR_RETURN(JobRecord job, jobs_.Get(c.job_id));
        if (job.state != v1::PAUSED) continue;  // e.g. cancelled meanwhile
        const std::string reason = c.Reason();
        job.reason = reason;
        job.updated_ms = now;
        if (prune) {
          job.state = v1::PRUNED;
          if (std::isfinite(c.loss)) job.val_loss = c.loss;
          RETURN_IF_ERROR(jobs_.Update(job));
          RETURN_IF_ERROR(UpdateGroup(job, v1::PAUSED));
          counters_.jobs_pruned++;
          observer_->OnJobFinished(v1::PRUNED);
        } else {
          // Re-queued: the next attempt resumes from the checkpoint the
          // trainer wrote when it was stopped.
          job.state = v1::PENDING;
          job.not_before_ms = 0;
          RETURN_IF_ERROR(jobs_.Update(job));
        }
        rungs_changed_ = true;
        spdlog::info("job {}: {}", job.id, reason);
      }
    }
  }();
  resolving_rungs_ = false;
  return status;
}

absl::Status Scheduler::RecordDivergedRungs(const JobRecord& job) {
  ASSIGN_OR_RETURN(const strategies::StrategySettings* st, StrategyFor(job.sweep_id));
  if (!st->successive_halving) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::vector<int64_t> steps, RungStepsFor(job));
  ASSIGN_OR_RETURN(std::vector<storage::RungRecord> recorded,
                   results_.ListGroupRungs(job.sweep_id, job.arch, job.layers, job.d_model));
  const int64_t now = clock_->NowWallMs();
  for (size_t rung = 0; rung < steps.size(); ++rung) {
    const bool has = std::any_of(recorded.begin(), recorded.end(), [&](const auto& r) {
      return r.job_id == job.id && r.rung == static_cast<int>(rung);
    });
    if (has) continue;
    storage::RungRecord rec;
    rec.job_id = job.id;
    rec.rung = static_cast<int>(rung);
    rec.step = steps[rung];
    rec.decision = "diverged";
    rec.decided_ms = now;
    RETURN_IF_ERROR(results_.InsertRung(rec));
  }
  return absl::OkStatus();
}

absl::Status Scheduler::ReleaseHeld(const JobRecord& group_of, const std::vector<double>& lrs) {
  ASSIGN_OR_RETURN(std::vector<storage::GroupMember> members,
                   jobs_.ListGroup(group_of.sweep_id, group_of.arch, group_of.layers,
                                   group_of.d_model));
  const int64_t now = clock_->NowWallMs();
  for (const storage::GroupMember& m : members) {
    if (m.state != v1::HELD || std::find(lrs.begin(), lrs.end(), m.lr) == lrs.end()) continue;
    ASSIGN_OR_RETURN(JobRecord job, jobs_.Get(m.id));
    job.state = v1::PENDING;
    job.not_before_ms = 0;
    job.updated_ms = now;
    RETURN_IF_ERROR(jobs_.Update(job));
  }
  return absl::OkStatus();
}

namespace {

// The distinct learning rates of a group, ascending.
std::vector<double> LrGrid(const std::vector<storage::GroupMember>& members) {
  std::vector<double> grid;
  for (const storage::GroupMember& m : members) {
    if (std::find(grid.begin(), grid.end(), m.lr) == grid.end()) grid.push_back(m.lr);
  }
  std::sort(grid.begin(), grid.end());
  return grid;
}

int IndexOf(const std::vector<double>& grid, double lr) {
  return static_cast<int>(std::lower_bound(grid.begin(), grid.end(), lr) - grid.begin());
}

// The spec's reference shape for LR transfer (validated at submit: it
// exists; the first shape otherwise).
ModelShape ReferenceShape(const std::vector<ModelShape>& shapes,
                          const strategies::StrategySettings& st) {
  for (const ModelShape& shape : shapes) {
    if (absl::StrCat(shape.layers, "x", shape.d_model) == st.reference_shape) return shape;
  }
  return shapes.front();
}

}  // namespace

absl::Status Scheduler::AdvanceTransfer(const JobRecord& changed) {
  ASSIGN_OR_RETURN(const strategies::StrategySettings* st, StrategyFor(changed.sweep_id));
  if (!st->lr_transfer) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::optional<storage::SweepRecord> sweep, sweeps_.Get(changed.sweep_id));
  if (!sweep || sweep->cancelled) return absl::OkStatus();
  ASSIGN_OR_RETURN(const v1::SweepSpec* spec, SpecFor(changed.sweep_id));
  ASSIGN_OR_RETURN(std::vector<ModelShape> shapes, SpecShapes(*spec));
  if (shapes.empty()) return absl::OkStatus();
  const ModelShape ref = ReferenceShape(shapes, *st);
  ASSIGN_OR_RETURN(std::vector<storage::GroupMember> members,
                   jobs_.ListGroup(changed.sweep_id, changed.arch, changed.layers,
                                   changed.d_model));
  std::vector<storage::GroupMember> active;
  bool any_held = false, active_done = true;
  for (const storage::GroupMember& m : members) {
    if (m.state == v1::HELD) {
      any_held = true;
      continue;
    }
    active.push_back(m);
    if (!IsTerminalState(m.state)) active_done = false;
  }
  if (!active_done || active.empty()) return absl::OkStatus();
  const GroupSelection selection = SelectBest(active);
  if (changed.layers == ref.layers && changed.d_model == ref.d_model) {
    return StartTransferredShapes(changed, shapes, ref, selection);
  }
  if (!any_held) return absl::OkStatus();
  const std::vector<double> grid = LrGrid(members);
  std::vector<double> release;
  if (!selection.best_lr) {
    for (const auto& m : members) {
      if (m.state == v1::HELD) release.push_back(m.lr);  // nothing trained well: the full grid
    }
  } else {
    std::vector<int> active_idx;
    for (const auto& m : active) active_idx.push_back(IndexOf(grid, m.lr));
    std::optional<int> widen = strategies::WidenIndex(
        active_idx, IndexOf(grid, *selection.best_lr), static_cast<int>(grid.size()));
    if (widen) release.push_back(grid[*widen]);
  }
  if (!release.empty()) return ReleaseHeld(changed, release);
  return SkipHeld(members, *selection.best_lr);
}

absl::Status Scheduler::StartTransferredShapes(const JobRecord& changed,
                                               const std::vector<ModelShape>& shapes,
                                               const ModelShape& ref,
                                               const GroupSelection& selection) {
  // The reference group is decided: start every other shape of the design
  // that is still wholly held on the best LR's neighbourhood.
  for (const ModelShape& shape : shapes) {
    if (shape.layers == ref.layers && shape.d_model == ref.d_model) continue;
    ASSIGN_OR_RETURN(std::vector<storage::GroupMember> other,
                     jobs_.ListGroup(changed.sweep_id, changed.arch, shape.layers,
                                     shape.d_model));
    if (other.empty() || std::any_of(other.begin(), other.end(),
                                     [](const auto& m) { return m.state != v1::HELD; })) {
      continue;
    }
    const std::vector<double> other_grid = LrGrid(other);
    std::vector<double> lrs = other_grid;  // no best LR: the full grid
    if (selection.best_lr) {
      lrs.clear();
      for (int i : strategies::TransferSubGrid(static_cast<int>(other_grid.size()),
                                                IndexOf(other_grid, *selection.best_lr))) {
        lrs.push_back(other_grid[i]);
      }
    }
    JobRecord key = changed;
    key.layers = shape.layers;
    key.d_model = shape.d_model;
    RETURN_IF_ERROR(ReleaseHeld(key, lrs));
  }
  return absl::OkStatus();
}

absl::Status Scheduler::SkipHeld(const std::vector<storage::GroupMember>& members,
                                 double best_lr) {
  // Decided: the LRs still held are never run.
  const int64_t now = clock_->NowWallMs();
  for (const auto& m : members) {
    if (m.state != v1::HELD) continue;
    ASSIGN_OR_RETURN(JobRecord job, jobs_.Get(m.id));
    job.state = v1::SKIPPED;
    job.reason = absl::StrCat("lr_transfer: group decided (best lr ", best_lr,
                              ") without this LR");
    job.updated_ms = now;
    RETURN_IF_ERROR(jobs_.Update(job));
    RETURN_IF_ERROR(ApplyLrDelta(job, TallyOf(v1::SKIPPED, std::nullopt, 0)));
  }
  return absl::OkStatus();
}

}  // namespace depthbench::scheduler
