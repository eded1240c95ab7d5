#include "scheduler/scheduler.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <tuple>
#include <utility>

#include <google/protobuf/util/message_differencer.h>
#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "scheduler/best_lr.h"
#include "scheduler/sweep_expander.h"
#include "storage/migrations.h"
#include "trainer_core/arch.h"
#include "trainer_core/train_config.h"

namespace depthbench::scheduler {

namespace v1 = ::depthbench::v1;
using storage::AttemptRecord;
using storage::JobRecord;
using storage::Transaction;

std::string JobStateName(v1::JobState state) {
  switch (state) {
    case v1::PENDING: return "pending";
    case v1::LEASED: return "leased";
    case v1::RUNNING: return "running";
    case v1::SUCCEEDED: return "succeeded";
    case v1::DIVERGED: return "diverged";
    case v1::FAILED: return "failed";
    case v1::CANCELLED: return "cancelled";
    default: return "";
  }
}

v1::JobState JobStateFromName(const std::string& name) {
  for (v1::JobState s : {v1::PENDING, v1::LEASED, v1::RUNNING, v1::SUCCEEDED,
                         v1::DIVERGED, v1::FAILED, v1::CANCELLED}) {
    if (JobStateName(s) == name) return s;
  }
  return v1::JOB_STATE_UNSPECIFIED;
}

namespace {

v1::Job JobProto(const JobRecord& r, const std::string& sweep_name) {
  v1::Job j;
  j.set_id(r.id);
  j.set_sweep_id(r.sweep_id);
  j.set_sweep_name(sweep_name);
  j.set_kind(r.kind == "diagnose" ? v1::DIAGNOSE : v1::TRAIN);
  j.set_state(JobStateFromName(r.state));
  j.set_arch(r.arch);
  j.set_layers(r.layers);
  j.set_d_model(r.d_model);
  j.set_lr(r.lr);
  j.set_seed(r.seed);
  j.set_config_json(r.config_json);
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

}  // namespace

// A storage::Transaction that reports BEGIN..COMMIT (or ..ROLLBACK) time to
// the observer. Measures a duration for reporting only, so it reads
// steady_clock rather than the injected Clock (milliseconds only).
class Scheduler::TimedTransaction {
 public:
  TimedTransaction(storage::Transaction txn, SchedulerObserver* observer,
                   const char* name, std::chrono::steady_clock::time_point start)
      : txn_(std::move(txn)), observer_(observer), name_(name), start_(start) {}
  TimedTransaction(TimedTransaction&& other) noexcept
      : txn_(std::move(other.txn_)),
        observer_(std::exchange(other.observer_, nullptr)),
        name_(other.name_),
        start_(other.start_) {
    other.txn_.reset();
  }
  TimedTransaction& operator=(TimedTransaction&&) = delete;
  TimedTransaction(const TimedTransaction&) = delete;
  ~TimedTransaction() {
    txn_.reset();  // rolls back unless committed
    Report();
  }

  absl::Status Commit() {
    absl::Status status = txn_->Commit();
    txn_.reset();
    Report();
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
  SchedulerObserver* observer_;  // null once reported or moved from
  const char* name_;
  std::chrono::steady_clock::time_point start_;
};

absl::StatusOr<Scheduler::TimedTransaction> Scheduler::BeginTransaction(const char* txn) {
  auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(Transaction t, Transaction::Begin(db_.get()));
  return TimedTransaction(std::move(t), observer_, txn, start);
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
      leases_(options.lease_ttl_ms) {}

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::Create(
    std::unique_ptr<storage::Database> db, Clock* clock, SchedulerOptions options) {
  if (options.lease_ttl_ms <= 0) {
    return absl::InvalidArgumentError("lease_ttl_ms: must be positive");
  }
  RETURN_IF_ERROR(storage::Migrate(db.get()));
  std::unique_ptr<Scheduler> s(new Scheduler(std::move(db), clock, options));
  absl::MutexLock lock(&s->mu_);
  RETURN_IF_ERROR(s->LoadLeases());
  return s;
}

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::Open(
    const std::string& path, Clock* clock, SchedulerOptions options) {
  ASSIGN_OR_RETURN(std::unique_ptr<storage::Database> db, storage::Database::Open(path));
  return Create(std::move(db), clock, options);
}

absl::Status Scheduler::LoadLeases() {
  ASSIGN_OR_RETURN(std::vector<JobRecord> active, jobs_.ListInStates({"leased", "running"}));
  int64_t now = clock_->NowMonotonicMs();
  for (const JobRecord& job : active) {
    leases_.Grant(job.id, job.current_attempt_id, job.worker_id, now,
                  job.state == "running");
  }
  counters_.active_leases = static_cast<int64_t>(leases_.size());
  return absl::OkStatus();
}

void Scheduler::Bump() {
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
  absl::MutexLock lock(&mu_);
  return jobs_.CountBySweepAndState();
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
  v1::SweepSpec spec;
  if (!spec.ParseFromString(sweep->spec)) {
    return absl::DataLossError(absl::StrCat("sweep ", sweep_id, ": stored spec is unreadable"));
  }
  return &(spec_cache_[sweep_id] = std::move(spec));
}

absl::StatusOr<storage::SweepRecord> Scheduler::SweepByName(const std::string& name) {
  if (name.empty()) return absl::InvalidArgumentError("sweep: a sweep name is required");
  ASSIGN_OR_RETURN(std::optional<storage::SweepRecord> sweep, sweeps_.FindByName(name));
  if (!sweep) return absl::NotFoundError(absl::StrCat("sweep \"", name, "\" not found"));
  return *sweep;
}

absl::StatusOr<v1::Sweep> Scheduler::SweepProto(const storage::SweepRecord& s) {
  v1::Sweep out;
  out.set_id(s.id);
  out.set_name(s.name);
  ASSIGN_OR_RETURN(const v1::SweepSpec* spec, SpecFor(s.id));
  *out.mutable_spec() = *spec;
  out.set_created_ms(s.created_ms);
  ASSIGN_OR_RETURN(auto counts, jobs_.CountByState(s.id));
  int64_t total = 0, done = 0;
  for (const auto& [state, n] : counts) {
    (*out.mutable_job_counts())[state] = n;
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
  std::string labels = LabelsJson(spec.resources().labels());
  for (const PlannedJob& planned : expanded.jobs) {
    JobRecord job;
    job.sweep_id = sweep.id;
    job.kind = "train";
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
    ASSIGN_OR_RETURN(job.id, jobs_.Insert(job));
    job.checkpoint_dir = absl::StrCat(sweep.name, "/", job.id);
    RETURN_IF_ERROR(jobs_.Update(job));
  }
  for (const PlannedGroup& group : expanded.groups) {
    storage::ResultRecord row;
    row.sweep_id = sweep.id;
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
    row.lrs_json = LrsToJson(lrs);
    RETURN_IF_ERROR(results_.Upsert(row));
  }
  RETURN_IF_ERROR(txn.Commit());
  spec_cache_[sweep.id] = spec;
  counters_.sweeps_submitted++;
  counters_.jobs_created += static_cast<int64_t>(expanded.jobs.size());
  ASSIGN_OR_RETURN(*response.mutable_sweep(), SweepProto(sweep));
  response.set_created(true);
  Bump();
  return response;
}

absl::StatusOr<v1::Sweep> Scheduler::GetSweep(const std::string& name) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(storage::SweepRecord sweep, SweepByName(name));
  return SweepProto(sweep);
}

absl::StatusOr<v1::ListSweepsResponse> Scheduler::ListSweeps() {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(std::vector<storage::SweepRecord> all, sweeps_.List());
  v1::ListSweepsResponse out;
  for (const auto& s : all) {
    ASSIGN_OR_RETURN(*out.add_sweeps(), SweepProto(s));
  }
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
  for (JobRecord& job : jobs) {
    if (IsTerminalState(job.state)) continue;
    if (job.state == "leased" || job.state == "running") {
      RETURN_IF_ERROR(jobs_.EndAttempt(job.current_attempt_id, now, "cancelled",
                                       "sweep cancelled"));
      released.push_back(job.id);
    }
    job.state = "cancelled";
    job.reason = "sweep cancelled";
    job.updated_ms = now;
    RETURN_IF_ERROR(jobs_.Update(job));
    ++cancelled;
    counters_.jobs_cancelled++;
    observer_->OnJobFinished("cancelled");
  }
  RETURN_IF_ERROR(sweeps_.SetCancelled(sweep.id, true));
  for (JobRecord& job : jobs) {
    if (job.kind == "train" && job.state == "cancelled") RETURN_IF_ERROR(UpdateGroup(job));
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
  if (request.page_size() < 0 || request.page_size() > 1000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page_size: must be in 0..1000, got ", request.page_size()));
  }
  filter.limit = request.page_size() == 0 ? 100 : request.page_size();
  if (!request.page_token().empty() &&
      (!absl::SimpleAtoi(request.page_token(), &filter.after_id) || filter.after_id < 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page_token: not a token from ListJobs: \"", request.page_token(), "\""));
  }
  if (request.state() != v1::JOB_STATE_UNSPECIFIED) {
    filter.state = JobStateName(request.state());
    if (filter.state.empty()) return absl::InvalidArgumentError("state: unknown job state");
  }
  if (!request.arch().empty()) {
    absl::StatusOr<Arch> arch = ParseArch(request.arch());
    if (!arch.ok()) return absl::InvalidArgumentError(absl::StrCat("arch: ", arch.status().message()));
    filter.arch = request.arch();
  }
  absl::MutexLock lock(&mu_);
  std::map<int64_t, std::string> names;
  if (!request.sweep().empty()) {
    ASSIGN_OR_RETURN(storage::SweepRecord sweep, SweepByName(request.sweep()));
    filter.sweep_id = sweep.id;
  }
  ASSIGN_OR_RETURN(std::vector<storage::SweepRecord> all, sweeps_.List());
  for (const auto& s : all) names[s.id] = s.name;
  ++filter.limit;  // one extra row tells whether another page exists
  ASSIGN_OR_RETURN(std::vector<JobRecord> jobs, jobs_.List(filter));
  v1::ListJobsResponse out;
  for (size_t i = 0; i < jobs.size() && static_cast<int64_t>(i) < filter.limit - 1; ++i) {
    *out.add_jobs() = JobProto(jobs[i], names[jobs[i].sweep_id]);
  }
  if (static_cast<int64_t>(jobs.size()) == filter.limit) {
    out.set_next_page_token(absl::StrCat(out.jobs(out.jobs_size() - 1).id()));
  }
  return out;
}

absl::StatusOr<v1::Job> Scheduler::GetJob(int64_t job_id) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(JobRecord job, jobs_.Get(job_id));
  ASSIGN_OR_RETURN(std::optional<storage::SweepRecord> sweep, sweeps_.Get(job.sweep_id));
  v1::Job out = JobProto(job, sweep ? sweep->name : "");
  ASSIGN_OR_RETURN(std::vector<AttemptRecord> attempts, jobs_.ListAttempts(job_id));
  for (const AttemptRecord& a : attempts) {
    v1::Attempt* p = out.add_attempts();
    p->set_attempt_id(a.id);
    p->set_number(static_cast<int32_t>(a.number));
    p->set_worker_id(a.worker_id);
    p->set_start_ms(a.start_ms);
    p->set_end_ms(a.end_ms);
    p->set_outcome(a.outcome);
    p->set_reason(a.reason);
  }
  return out;
}

absl::StatusOr<v1::RetryJobResponse> Scheduler::RetryJob(const v1::RetryJobRequest& request) {
  if ((request.job_id() != 0) == !request.sweep().empty()) {
    return absl::InvalidArgumentError("exactly one of job_id or sweep is required");
  }
  absl::MutexLock lock(&mu_);
  std::vector<JobRecord> targets;
  if (request.job_id() != 0) {
    ASSIGN_OR_RETURN(JobRecord job, jobs_.Get(request.job_id()));
    if (job.state != "failed" && job.state != "cancelled") {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", job.id, " is ", job.state, "; only failed or cancelled jobs can be retried"));
    }
    targets.push_back(job);
  } else {
    ASSIGN_OR_RETURN(storage::SweepRecord sweep, SweepByName(request.sweep()));
    ASSIGN_OR_RETURN(std::vector<JobRecord> jobs, jobs_.ListBySweep(sweep.id));
    for (const JobRecord& job : jobs) {
      if (job.state == "failed") targets.push_back(job);
    }
  }
  int64_t now = clock_->NowWallMs();
  ASSIGN_OR_RETURN(TimedTransaction txn, BeginTransaction("retry_job"));
  v1::RetryJobResponse out;
  for (JobRecord& job : targets) {
    job.state = "pending";
    job.attempts_used = 0;
    job.not_before_ms = 0;
    job.reason.clear();
    job.worker_id.clear();
    job.updated_ms = now;
    RETURN_IF_ERROR(jobs_.Update(job));
    RETURN_IF_ERROR(sweeps_.SetCancelled(job.sweep_id, false));
    if (job.kind == "train") RETURN_IF_ERROR(UpdateGroup(job));
    out.add_job_ids(job.id);
    observer_->OnJobRetried("manual");
  }
  RETURN_IF_ERROR(txn.Commit());
  Bump();
  return out;
}

absl::StatusOr<v1::QueryResultsResponse> Scheduler::QueryResults(const std::string& name) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(storage::SweepRecord sweep, SweepByName(name));
  ASSIGN_OR_RETURN(std::vector<storage::ResultRecord> rows, results_.List(sweep.id));
  ASSIGN_OR_RETURN(std::vector<JobRecord> jobs, jobs_.ListBySweep(sweep.id));
  ASSIGN_OR_RETURN(const v1::SweepSpec* spec, SpecFor(sweep.id));
  const double fixed_lr = spec->diagnostics().fixed_lr();
  // Per (arch, L, d): the train runs and one of their configs (the token
  // budget is the same for every run of a group).
  struct GroupInfo {
    std::vector<storage::GroupMember> members;
    std::string config_json;
  };
  std::map<std::tuple<std::string, int64_t, int64_t>, GroupInfo> groups;
  for (const JobRecord& job : jobs) {
    if (job.kind != "train") continue;
    GroupInfo& g = groups[{job.arch, job.layers, job.d_model}];
    storage::GroupMember m;
    m.id = job.id;
    m.state = job.state;
    m.lr = job.lr;
    m.val_loss = job.val_loss;
    m.is_best = job.is_best;
    g.members.push_back(m);
    if (g.config_json.empty()) g.config_json = job.config_json;
  }
  v1::QueryResultsResponse out;
  for (const storage::ResultRecord& r : rows) {
    v1::ResultRow* row = out.add_rows();
    auto g = groups.find({r.arch, r.layers, r.d_model});
    if (g != groups.end()) {
      const nlohmann::json config_json =
          nlohmann::json::parse(g->second.config_json, nullptr, false);
      absl::StatusOr<TrainConfig> config = TrainConfigFromJson(config_json);
      if (config.ok()) {
        // Jobs submitted before budget_params existed trained on the
        // design's own count, which the row's params is.
        if (!config_json.contains("budget_params") && r.params > 0) config->budget_params = r.params;
        const TokenBudget budget = ResolveTokenBudget(*config);
        row->set_budget_params(budget.params);
        row->set_budget_tokens(budget.tokens);
        row->set_budget_steps(budget.steps);
      }
      const int64_t target =
          DiagnosisTarget(SelectBest(g->second.members), g->second.members, fixed_lr);
      row->set_diagnosed_job_id(target);
      for (const storage::GroupMember& m : g->second.members) {
        if (m.id == target) row->set_diagnosed_lr(m.lr);
      }
    }
    row->set_arch(r.arch);
    row->set_layers(r.layers);
    row->set_d_model(r.d_model);
    row->set_aspect_ratio(r.aspect_ratio);
    row->set_params(r.params);
    row->set_has_best(r.best_lr.has_value());
    row->set_best_lr(r.best_lr.value_or(0));
    row->set_best_val_loss(r.best_val_loss.value_or(0));
    row->set_best_job_id(r.best_job_id);
    row->set_diagnostics_json(r.diagnostics_json);
    row->set_complete(r.complete);
    nlohmann::json lrs = nlohmann::json::parse(r.lrs_json, nullptr, false);
    if (lrs.is_array()) {
      for (const auto& j : lrs) {
        v1::LrLoss* l = row->add_lrs();
        l->set_lr(j.value("lr", 0.0));
        if (j.contains("val_loss") && j["val_loss"].is_number()) {
          l->set_has_loss(true);
          l->set_val_loss(j["val_loss"].get<double>());
        }
        l->set_diverged(j.value("diverged", false));
        l->set_succeeded(j.value("succeeded", 0));
        l->set_diverged_runs(j.value("diverged_runs", 0));
        l->set_failed_runs(j.value("failed_runs", 0));
      }
    }
  }
  for (const JobRecord& job : jobs) {
    if (job.kind != "train") continue;
    v1::RunSummary* run = out.add_runs();
    run->set_job_id(job.id);
    run->set_arch(job.arch);
    run->set_layers(job.layers);
    run->set_d_model(job.d_model);
    run->set_lr(job.lr);
    run->set_seed(job.seed);
    run->set_state(JobStateFromName(job.state));
    run->set_has_val_loss(job.val_loss.has_value());
    run->set_final_val_loss(job.val_loss.value_or(0));
    run->set_final_step(job.final_step);
    run->set_is_best(job.is_best);
  }
  return out;
}

absl::StatusOr<WatchBatch> Scheduler::ReadWatch(int64_t job_id, int64_t after_row_id,
                                                int64_t from_step, int64_t limit) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(JobRecord job, jobs_.Get(job_id));
  WatchBatch batch;
  batch.state = JobStateFromName(job.state);
  batch.attempt_id = job.current_attempt_id;
  ASSIGN_OR_RETURN(batch.points, metrics_.Read(job_id, after_row_id, from_step, limit));
  return batch;
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
    } else if (job->state == "cancelled") {
      c.set_reason("job cancelled");
    } else if (job->current_attempt_id != r.attempt_id()) {
      c.set_reason("attempt superseded (lease expired)");
    } else if (IsTerminalState(job->state)) {
      c.set_reason(absl::StrCat("job already ", job->state));
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
  RETURN_IF_ERROR(ExpireLeasesLocked().status());
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
  job.state = "leased";
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
  out.set_kind(job.kind == "diagnose" ? v1::DIAGNOSE : v1::TRAIN);
  out.set_config_json(job.config_json);
  out.set_checkpoint_dir(job.checkpoint_dir);
  out.set_resume(previous > 0);
  out.set_attempt_number(static_cast<int32_t>(attempt.number));
  out.set_sweep_name(spec->name());
  Bump();
  return out;
}

absl::StatusOr<v1::ReportMetricsResponse> Scheduler::ReportMetrics(
    const v1::ReportMetricsRequest& request) {
  std::vector<storage::MetricRecord> points;
  points.reserve(request.points_size());
  int64_t now_wall = clock_->NowWallMs();
  for (int i = 0; i < request.points_size(); ++i) {
    const v1::MetricPoint& p = request.points(i);
    if (p.name().empty()) {
      return absl::InvalidArgumentError(absl::StrCat("points[", i, "].name: required"));
    }
    if (p.step() < 0) {
      return absl::InvalidArgumentError(absl::StrCat("points[", i, "].step: must be >= 0"));
    }
    points.push_back({0, request.job_id(), request.attempt_id(), p.step(), p.name(),
                      p.value(), p.wall_ms() != 0 ? p.wall_ms() : now_wall});
  }
  absl::MutexLock lock(&mu_);
  Lease* lease = leases_.Find(request.job_id(), request.attempt_id());
  if (lease == nullptr) {
    counters_.stale_reports++;
    return absl::FailedPreconditionError(absl::StrCat(
        "attempt ", request.attempt_id(), " of job ", request.job_id(),
        " does not hold a lease (expired, superseded, cancelled or finished)"));
  }
  leases_.Renew(request.job_id(), request.attempt_id(), clock_->NowMonotonicMs());
  ASSIGN_OR_RETURN(TimedTransaction txn, BeginTransaction("report_metrics"));
  ASSIGN_OR_RETURN(storage::InsertCounts counts, metrics_.Insert(points));
  bool became_running = false;
  if (!lease->running) {
    ASSIGN_OR_RETURN(JobRecord job, jobs_.Get(request.job_id()));
    if (job.state == "leased") {
      job.state = "running";
      job.updated_ms = now_wall;
      RETURN_IF_ERROR(jobs_.Update(job));
    }
    became_running = true;
  }
  RETURN_IF_ERROR(txn.Commit());
  if (became_running) lease->running = true;
  counters_.points_accepted += counts.accepted;
  counters_.points_duplicate += counts.duplicates;
  observer_->OnMetricPoints(counts.accepted, counts.duplicates);
  Bump();
  v1::ReportMetricsResponse out;
  out.set_accepted(counts.accepted);
  out.set_duplicates(counts.duplicates);
  return out;
}

absl::Status Scheduler::RequeueOrFail(JobRecord& job, const std::string& reason,
                                      const std::string& retry_reason) {
  int64_t now = clock_->NowWallMs();
  job.reason = reason;
  job.worker_id.clear();
  job.updated_ms = now;
  if (job.attempts_used >= job.max_attempts) {
    job.state = "failed";
    job.reason = absl::StrCat(reason, " (attempts exhausted: ", job.attempts_used,
                              " of ", job.max_attempts, ")");
    counters_.jobs_failed++;
    observer_->OnJobFinished("failed");
    RETURN_IF_ERROR(jobs_.Update(job));
    if (job.kind == "train") RETURN_IF_ERROR(UpdateGroup(job));
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(const v1::SweepSpec* spec, SpecFor(job.sweep_id));
  RetrySettings retry = RetryFromSpec(spec->retry());
  job.state = "pending";
  job.not_before_ms = now + BackoffMs(job.attempts_used, retry.initial_backoff_ms,
                                      retry.backoff_multiplier, retry.max_backoff_ms);
  counters_.attempts_retried++;
  observer_->OnJobRetried(retry_reason);
  return jobs_.Update(job);
}

absl::StatusOr<v1::FinishJobResponse> Scheduler::FinishJob(const v1::FinishJobRequest& request) {
  if (request.status() == v1::FINISH_STATUS_UNSPECIFIED) {
    return absl::InvalidArgumentError("status: required");
  }
  absl::MutexLock lock(&mu_);
  v1::FinishJobResponse out;
  Lease* lease = leases_.Find(request.job_id(), request.attempt_id());
  if (lease == nullptr) {
    // A FinishJob re-sent after a lost reply is answered again, not refused.
    ASSIGN_OR_RETURN(std::optional<AttemptRecord> attempt, jobs_.GetAttempt(request.attempt_id()));
    static const std::map<v1::FinishStatus, std::string> kOutcome = {
        {v1::FINISH_SUCCEEDED, "succeeded"}, {v1::FINISH_DIVERGED, "diverged"},
        {v1::FINISH_FAILED, "failed"}, {v1::FINISH_INTERRUPTED, "interrupted"}};
    if (attempt && attempt->job_id == request.job_id() &&
        attempt->outcome == kOutcome.at(request.status())) {
      ASSIGN_OR_RETURN(JobRecord job, jobs_.Get(request.job_id()));
      out.set_state(JobStateFromName(job.state));
      return out;
    }
    counters_.stale_reports++;
    return absl::FailedPreconditionError(absl::StrCat(
        "attempt ", request.attempt_id(), " of job ", request.job_id(),
        " does not hold a lease (expired, superseded, cancelled or finished)"));
  }
  ASSIGN_OR_RETURN(JobRecord job, jobs_.Get(request.job_id()));
  int64_t now = clock_->NowWallMs();
  ASSIGN_OR_RETURN(TimedTransaction txn, BeginTransaction("finish_job"));
  if (request.points_size() > 0) {
    std::vector<storage::MetricRecord> points;
    for (const v1::MetricPoint& p : request.points()) {
      points.push_back({0, job.id, request.attempt_id(), p.step(), p.name(), p.value(),
                        p.wall_ms() != 0 ? p.wall_ms() : now});
    }
    ASSIGN_OR_RETURN(storage::InsertCounts counts, metrics_.Insert(points));
    counters_.points_accepted += counts.accepted;
    counters_.points_duplicate += counts.duplicates;
    observer_->OnMetricPoints(counts.accepted, counts.duplicates);
  }
  job.updated_ms = now;
  job.worker_id.clear();
  if (request.has_val_loss()) job.val_loss = request.final_val_loss();
  if (request.final_step() > 0) job.final_step = request.final_step();
  switch (request.status()) {
    case v1::FINISH_SUCCEEDED:
      RETURN_IF_ERROR(jobs_.EndAttempt(request.attempt_id(), now, "succeeded", request.reason()));
      job.state = "succeeded";
      job.reason = request.reason();
      counters_.jobs_succeeded++;
      observer_->OnJobFinished("succeeded");
      RETURN_IF_ERROR(jobs_.Update(job));
      if (job.kind == "train") {
        RETURN_IF_ERROR(UpdateGroup(job));
      } else {
        RETURN_IF_ERROR(RecordDiagnostics(job, request));
      }
      break;
    case v1::FINISH_DIVERGED:
      RETURN_IF_ERROR(jobs_.EndAttempt(request.attempt_id(), now, "diverged", request.reason()));
      job.state = "diverged";
      job.reason = request.reason().empty() ? "diverged" : request.reason();
      counters_.jobs_diverged++;
      observer_->OnJobFinished("diverged");
      RETURN_IF_ERROR(jobs_.Update(job));
      if (job.kind == "train") RETURN_IF_ERROR(UpdateGroup(job));
      break;
    case v1::FINISH_FAILED: {
      std::string reason = request.reason().empty() ? "failed" : request.reason();
      RETURN_IF_ERROR(jobs_.EndAttempt(request.attempt_id(), now, "failed", reason));
      RETURN_IF_ERROR(RequeueOrFail(job, reason, "failed"));
      break;
    }
    case v1::FINISH_INTERRUPTED:
      RETURN_IF_ERROR(jobs_.EndAttempt(request.attempt_id(), now, "interrupted", request.reason()));
      job.state = "pending";
      job.attempts_used = std::max<int64_t>(0, job.attempts_used - 1);
      job.not_before_ms = 0;
      counters_.attempts_interrupted++;
      observer_->OnJobRetried("interrupted");
      RETURN_IF_ERROR(jobs_.Update(job));
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat("status: unknown value ", request.status()));
  }
  RETURN_IF_ERROR(txn.Commit());
  leases_.Release(job.id);
  Bump();
  out.set_state(JobStateFromName(job.state));
  return out;
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

absl::Status Scheduler::UpdateGroup(const JobRecord& changed) {
  ASSIGN_OR_RETURN(std::vector<storage::GroupMember> group,
                   jobs_.ListGroup(changed.sweep_id, changed.arch, changed.layers, changed.d_model));
  GroupSelection selection = SelectBest(group);
  ASSIGN_OR_RETURN(std::optional<storage::ResultRecord> existing,
                   results_.Get(changed.sweep_id, changed.arch, changed.layers, changed.d_model));
  storage::ResultRecord row;
  if (existing) row = *existing;
  row.sweep_id = changed.sweep_id;
  row.arch = changed.arch;
  row.layers = changed.layers;
  row.d_model = changed.d_model;
  if (!existing) row.aspect_ratio = static_cast<double>(changed.d_model) / changed.layers;
  row.lrs_json = LrsToJson(selection.lrs);
  row.complete = selection.complete;
  row.best_lr = selection.complete ? selection.best_lr : std::nullopt;
  row.best_val_loss = selection.complete ? selection.best_val_loss : std::nullopt;
  int64_t best_job = selection.complete ? selection.best_job_id : 0;
  if (row.best_job_id != best_job) row.diagnostics_json = "{}";
  row.best_job_id = best_job;
  RETURN_IF_ERROR(results_.Upsert(row));
  for (const storage::GroupMember& member : group) {
    bool best = member.id == best_job;
    if (member.is_best != best) RETURN_IF_ERROR(jobs_.SetBest(member.id, best));
  }
  // Any change to the group's runs passes through an incomplete group (best
  // 0), which cleared the diagnostics above; so they always belong to the
  // current target, in either mode.
  ASSIGN_OR_RETURN(const v1::SweepSpec* spec, SpecFor(changed.sweep_id));
  if (spec->diagnostics().kinds_size() == 0) return absl::OkStatus();
  const DiagnoseSettings settings = DiagnoseSettingsFromSpec(spec->diagnostics());
  const int64_t target = DiagnosisTarget(selection, group, settings.fixed_lr);
  if (target == 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::optional<storage::SweepRecord> sweep, sweeps_.Get(changed.sweep_id));
  if (!sweep || sweep->cancelled) return absl::OkStatus();
  ASSIGN_OR_RETURN(bool queued, jobs_.HasChildren(target));
  if (queued) return absl::OkStatus();
  ASSIGN_OR_RETURN(JobRecord best, jobs_.Get(target));
  JobRecord diag = best;
  diag.id = 0;
  diag.kind = "diagnose";
  diag.state = "pending";
  diag.config_json = DiagnoseConfigJson(best.config_json, best.checkpoint_dir, settings);
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
  counters_.jobs_created++;
  return absl::OkStatus();
}

absl::StatusOr<int64_t> Scheduler::ExpireLeases() {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<int64_t> expired = ExpireLeasesLocked();
  observer_->OnWorkersConnected(ConnectedWorkersLocked());
  return expired;
}

absl::StatusOr<int64_t> Scheduler::ExpireLeasesLocked() {
  std::vector<Lease> expired = leases_.TakeExpired(clock_->NowMonotonicMs());
  if (expired.empty()) return 0;
  int64_t now = clock_->NowWallMs();
  ASSIGN_OR_RETURN(TimedTransaction txn, BeginTransaction("expire_leases"));
  int64_t count = 0;
  for (const Lease& lease : expired) {
    ASSIGN_OR_RETURN(JobRecord job, jobs_.Get(lease.job_id));
    if ((job.state != "leased" && job.state != "running") ||
        job.current_attempt_id != lease.attempt_id) {
      continue;
    }
    RETURN_IF_ERROR(jobs_.EndAttempt(lease.attempt_id, now, "expired",
                                     "lease expired: no heartbeat"));
    RETURN_IF_ERROR(RequeueOrFail(job, "lease expired: no heartbeat", "lease_expired"));
    ++count;
  }
  RETURN_IF_ERROR(txn.Commit());
  counters_.leases_expired += count;
  if (count > 0) observer_->OnLeasesExpired(count);
  Bump();
  return count;
}

}  // namespace depthbench::scheduler
