#include "worker/job_runner.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "worker/trainer_events.h"

namespace depthbench::worker {

namespace v1 = ::depthbench::v1;
namespace fs = std::filesystem;

namespace {

constexpr char kMarkerFile[] = "published_step";

// The step through which the scheduler stored every point of this job
// (0: unknown / none).
int64_t ReadMarker(const std::string& run_dir) {
  std::ifstream in(fs::path(run_dir) / kMarkerFile);
  int64_t step = 0;
  if (!(in >> step)) return 0;
  return step;
}

void WriteMarker(const std::string& run_dir, int64_t attempt_id, int64_t step) {
  fs::path tmp = fs::path(run_dir) / absl::StrCat(kMarkerFile, ".tmp.", attempt_id);
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << step << "\n";
    if (!out) return;
  }
  std::error_code ec;
  fs::rename(tmp, fs::path(run_dir) / kMarkerFile, ec);
}

// Codes that refuse this particular request for good (retrying the same
// bytes cannot help); INTERNAL also covers a busy database, so it counts
// only after a few tries.
bool RefusesRequest(const absl::Status& status, int internal_errors) {
  switch (status.code()) {
    case absl::StatusCode::kResourceExhausted:  // larger than the receive limit
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return true;
    case absl::StatusCode::kInternal:  // e.g. a string that is not UTF-8
      return internal_errors >= 3;
    default:
      return false;
  }
}

}  // namespace

void SanitizeFinishReport(v1::FinishJobRequest* request) {
  request->set_reason(SanitizeUtf8(request->reason(), kMaxReasonBytes));
  request->set_checkpoint_path(SanitizeUtf8(request->checkpoint_path(), 4096));
  for (v1::DiagnosticResult& d : *request->mutable_diagnostics()) {
    d.set_kind(SanitizeUtf8(d.kind(), 256));
    // Replaces invalid bytes only: a cut would break the JSON (a report
    // too large as a whole is handled by the caller).
    d.set_data_json(SanitizeUtf8(d.data_json(), d.data_json().size() * 3 + 3));
  }
  for (v1::MetricPoint& p : *request->mutable_points()) {
    if (!p.name().empty()) p.set_name(SanitizeUtf8(p.name(), 256));
  }
}

v1::FinishJobRequest MinimalFinishReport(const v1::FinishJobRequest& request,
                                         const std::string& why) {
  v1::FinishJobRequest m;
  m.set_job_id(request.job_id());
  m.set_attempt_id(request.attempt_id());
  m.set_status(request.status());
  m.set_final_step(request.final_step());
  if (request.has_val_loss()) {
    m.set_has_val_loss(true);
    m.set_final_val_loss(request.final_val_loss());
  }
  if (request.checkpoint_path().size() <= 1024) {
    m.set_checkpoint_path(SanitizeUtf8(request.checkpoint_path(), 1024));
  }
  const std::string note = SanitizeUtf8(absl::StrCat("full report undeliverable: ", why), 512);
  if (request.status() == v1::FINISH_SUCCEEDED && request.diagnostics_size() > 0) {
    m.set_status(v1::FINISH_FAILED);
    m.set_reason(absl::StrCat("diagnostics could not be reported (", note, ")"));
  } else if (request.reason().empty()) {
    m.set_reason(note);
  } else {
    m.set_reason(absl::StrCat(SanitizeUtf8(request.reason(), 1024), " [", note, "]"));
  }
  return m;
}

JobRunner::JobRunner(const SchedulerClient* client, Clock* clock, const WorkerMetrics* metrics,
                     JobRunnerOptions options, v1::AcquireJobResponse lease,
                     std::function<void(JobRunner*)> on_done)
    : client_(client),
      clock_(clock),
      metrics_(metrics),
      options_(std::move(options)),
      lease_(std::move(lease)),
      on_done_(std::move(on_done)) {
  labels_.job_id = std::to_string(lease_.job_id());
  labels_.sweep = lease_.sweep_name();
  nlohmann::json config = nlohmann::json::parse(lease_.config_json(), nullptr, false);
  if (config.is_object() && config.contains("arch") && config["arch"].is_string()) {
    labels_.arch = config["arch"].get<std::string>();
  }
  run_dir_ = (fs::path(options_.checkpoint_root) / lease_.checkpoint_dir()).string();
}

JobRunner::~JobRunner() {
  if (thread_.joinable()) thread_.join();
}

void JobRunner::Start() {
  thread_ = std::thread([this] { Run(); });
}

bool JobRunner::done() const {
  absl::MutexLock lock(&mu_);
  return done_;
}

v1::FinishStatus JobRunner::reported() const {
  absl::MutexLock lock(&mu_);
  return reported_;
}

void JobRunner::Cancel(const std::string& reason) { StopChild(false, reason); }

void JobRunner::Interrupt() { StopChild(true, "worker shutting down"); }

void JobRunner::StopChild(bool interrupt, const std::string& reason) {
  MetricRelay* relay = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (interrupt) {
      if (interrupted_ || cancelled_) return;
      interrupted_ = true;
    } else {
      if (cancelled_) return;
      cancelled_ = true;
      cancel_reason_ = reason;
    }
    if (kill_at_ms_ == 0) kill_at_ms_ = clock_->NowMonotonicMs() + options_.grace_ms;
    if (child_ != nullptr) child_->SignalGroup(SIGTERM);
    relay = relay_;
    // Lift back-pressure so a child blocked on its stdout pipe can reach
    // its checkpoint. (Unblock() only takes the relay's own lock.)
    if (relay != nullptr) relay->Unblock();
  }
  spdlog::info("job {} attempt {}: stopping the trainer ({}); SIGKILL in {} ms", job_id(),
               attempt_id(), reason, options_.grace_ms);
}

absl::StatusOr<std::vector<std::string>> JobRunner::Prepare() {
  if (lease_.checkpoint_dir().empty() || fs::path(lease_.checkpoint_dir()).is_absolute() ||
      lease_.checkpoint_dir().find("..") != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint_dir \"", lease_.checkpoint_dir(), "\" must be a relative path inside the root"));
  }
  std::error_code ec;
  fs::create_directories(run_dir_, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat("cannot create ", run_dir_, ": ", ec.message()));
  }
  nlohmann::json config = nlohmann::json::parse(lease_.config_json(), nullptr, false);
  if (!config.is_object()) {
    return absl::InvalidArgumentError("config_json: not a JSON object");
  }
  if (options_.threads > 0) config["threads"] = options_.threads;
  const bool diagnose = lease_.kind() == v1::DIAGNOSE;
  if (diagnose && config.contains("checkpoint") && config["checkpoint"].is_string()) {
    // The scheduler names the train job's directory relative to the root.
    fs::path ckpt = config["checkpoint"].get<std::string>();
    if (ckpt.is_relative()) config["checkpoint"] = (fs::path(options_.checkpoint_root) / ckpt).string();
  }
  std::string config_path =
      (fs::path(run_dir_) / absl::StrCat("attempt-", attempt_id(), ".config.json")).string();
  {
    std::ofstream out(config_path, std::ios::trunc);
    out << config.dump(2) << "\n";
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", config_path));
  }
  std::string log_path =
      (fs::path(run_dir_) / absl::StrCat("attempt-", attempt_id(), ".stderr.log")).string();
  stderr_log_.Open(log_path, options_.attempt_log_max_bytes);
  std::string events_path =
      (fs::path(run_dir_) / absl::StrCat("attempt-", attempt_id(), ".events.jsonl")).string();
  events_log_.Open(events_path, options_.attempt_log_max_bytes);
  published_through_.store(ReadMarker(run_dir_));
  if (diagnose) {
    return std::vector<std::string>{options_.train_binary, "diagnose", "--config", config_path,
                                    "--out", run_dir_};
  }
  return std::vector<std::string>{options_.train_binary, "train", "--config", config_path,
                                  "--out", run_dir_, "--resume"};
}

void JobRunner::HandleStdoutLine(const std::string& line, MetricRelay* relay) {
  if (line.empty()) return;
  const int64_t wall_ms = clock_->NowWallMs();
  absl::StatusOr<TrainerEvent> event = ParseTrainerEvent(line);
  if (!event.ok()) {
    // Rate-limited: garbage on stdout must not become the worker's log.
    ++non_event_lines_;
    if (stdout_warnings_.Allow(clock_->NowMonotonicMs())) {
      const int64_t suppressed = stdout_warnings_.TakeSuppressed();
      spdlog::warn("job {}: ignoring a stdout line that is not an event{}: {}", job_id(),
                   suppressed > 0 ? absl::StrCat(" (", suppressed, " more not shown)") : "",
                   SanitizeUtf8(line, 200));
    }
    return;
  }
  // "<wall_ms> <event>": replayed by a resumed attempt. Events only (the
  // replay reads nothing else), and bounded.
  events_log_.Write(absl::StrCat(wall_ms, " ", line, "\n"));
  const TrainerEvent& e = *event;
  std::vector<v1::MetricPoint> points = PointsFor(e, wall_ms);
  switch (e.kind) {
    case EventKind::kStart: {
      resumed_from_step_ = e.resumed_from_step;
      relay->Announce(e.resumed_from_step);
      // Steps after the resume point belong to an abandoned trajectory:
      // what the scheduler holds of the resumed one ends at most there.
      const int64_t stored_through = std::min(ReadMarker(run_dir_), e.resumed_from_step);
      published_through_.store(stored_through);
      WriteMarker(run_dir_, attempt_id(), stored_through);
      if (e.resumed_from_step > 0) {
        spdlog::info("job {} attempt {}: resumed from step {}", job_id(), attempt_id(),
                     e.resumed_from_step);
        Replay(stored_through, e.resumed_from_step, relay);
      }
      break;
    }
    case EventKind::kStep:
      last_step_ = std::max(last_step_, e.step);
      if (metrics_ != nullptr) metrics_->RecordStep(labels_, e.step, e.loss, e.tokens_per_s);
      break;
    case EventKind::kEval:
      if (e.has_val_loss) {
        has_val_loss_ = true;
        val_loss_ = e.val_loss;
        if (metrics_ != nullptr) metrics_->RecordEval(labels_, e.val_loss);
      }
      break;
    case EventKind::kCheckpoint:
      checkpoint_path_ = e.path;
      if (metrics_ != nullptr && e.has_checkpoint_seconds) {
        metrics_->RecordCheckpoint(e.checkpoint_seconds);
      }
      break;
    case EventKind::kDone:
      saw_done_ = true;
      done_status_ = e.status;
      done_reason_ = e.reason;
      last_step_ = std::max(last_step_, e.step);
      if (e.has_val_loss) {
        has_val_loss_ = true;
        val_loss_ = e.val_loss;
      }
      break;
    case EventKind::kDiagnostics: {
      v1::DiagnosticResult d;
      d.set_kind(e.diag_kind);
      d.set_data_json(e.diag_data);
      diagnostics_.push_back(std::move(d));
      break;
    }
    case EventKind::kInterrupted:
    case EventKind::kOther:
      break;
  }
  // Live: the relay batches and delivers within about flush_ms (it blocks
  // here only while the scheduler is unreachable and its buffer is full).
  if (!points.empty()) relay->Push(std::move(points));
}

void JobRunner::Replay(int64_t stored_through, int64_t resumed_from_step,
                       MetricRelay* relay) {
  if (stored_through >= resumed_from_step) return;
  // Earlier attempts' event logs, oldest first; a later attempt's point
  // for the same (step, name) wins (it is on the trajectory resumed here).
  std::map<int64_t, fs::path> logs;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(run_dir_, ec)) {
    const std::string name = entry.path().filename().string();
    int64_t id = 0;
    if (name.rfind("attempt-", 0) != 0 || name.size() < 22 ||
        name.substr(name.size() - 13) != ".events.jsonl" ||
        !absl::SimpleAtoi(name.substr(8, name.size() - 8 - 13), &id) || id == attempt_id()) {
      continue;
    }
    logs[id] = entry.path();
  }
  std::map<std::pair<int64_t, std::string>, v1::MetricPoint> points;
  for (const auto& [id, path] : logs) {
    std::ifstream in(path);
    std::string record;
    while (std::getline(in, record)) {
      size_t space = record.find(' ');
      int64_t wall_ms = 0;
      if (space == std::string::npos || !absl::SimpleAtoi(record.substr(0, space), &wall_ms)) {
        continue;
      }
      absl::StatusOr<TrainerEvent> e = ParseTrainerEvent(record.substr(space + 1));
      if (!e.ok() || e->step <= stored_through || e->step > resumed_from_step) continue;
      for (v1::MetricPoint& p : PointsFor(*e, wall_ms)) {
        points[{p.step(), p.name()}] = std::move(p);
      }
    }
  }
  std::vector<v1::MetricPoint> replay;
  for (auto& [key, p] : points) replay.push_back(std::move(p));
  spdlog::info("job {} attempt {}: replaying {} point(s) of steps {}..{} from earlier attempts' "
               "logs (not stored by the scheduler before they ended)",
               job_id(), attempt_id(), replay.size(), stored_through + 1, resumed_from_step);
  relay->Push(std::move(replay));
}

void JobRunner::HandleStderrLine(const std::string& line) {
  // Sanitized here: the tail goes into a protobuf string (UTF-8 only).
  stderr_tail_.push_back(SanitizeUtf8(line, kMaxTailLineBytes));
  while (stderr_tail_.size() > static_cast<size_t>(kStderrTailLines)) stderr_tail_.pop_front();
}

void JobRunner::Supervise(ChildProcess* child, MetricRelay* relay) {
  LineSplitter out_lines(options_.max_stdout_line_bytes);
  LineSplitter err_lines(kMaxStderrLineBytes);
  RateLimiter cut_warnings(3, 0.1);
  const LineSplitter::Callback on_stdout = [&](std::string_view line, bool cut) {
    if (cut) {  // a cut event is not valid JSON: drop it, say so (rarely)
      if (cut_warnings.Allow(clock_->NowMonotonicMs())) {
        spdlog::warn("job {} attempt {}: dropping a stdout line longer than {} bytes", job_id(),
                     attempt_id(), options_.max_stdout_line_bytes);
      }
      return;
    }
    HandleStdoutLine(std::string(line), relay);
  };
  const LineSplitter::Callback on_stderr = [&](std::string_view line, bool /*cut*/) {
    HandleStderrLine(std::string(line));  // a cut line keeps its head
  };
  bool out_open = true, err_open = true;
  bool exited = false;
  int64_t drain_until = 0;
  char buf[65536];
  while (out_open || err_open) {
    // The trainer's exit ends supervision, not its pipes' EOF: a
    // descendant may hold them open for ever.
    if (!exited && child->Exited()) {
      exited = true;
      KillLeftovers(child);
      drain_until = clock_->NowMonotonicMs() + options_.drain_ms;
    }
    if (exited && clock_->NowMonotonicMs() >= drain_until) {
      spdlog::warn("job {} attempt {}: the trainer's output is still open {} ms after it "
                   "exited; not reading further",
                   job_id(), attempt_id(), options_.drain_ms);
      break;
    }
    pollfd fds[2];
    int n = 0;
    int out_idx = -1, err_idx = -1;
    if (out_open) {
      out_idx = n;
      fds[n++] = {child->stdout_fd(), POLLIN, 0};
    }
    if (err_open) {
      err_idx = n;
      fds[n++] = {child->stderr_fd(), POLLIN, 0};
    }
    int rc = poll(fds, n, 100);
    if (rc < 0 && errno != EINTR) break;
    KillIfGraceOver(child);
    if (rc <= 0) continue;
    auto drain = [&](int idx, int fd, LineSplitter* lines, bool* open, bool is_stdout) {
      if (idx < 0 || !(fds[idx].revents & (POLLIN | POLLHUP | POLLERR))) return;
      ssize_t got = read(fd, buf, sizeof(buf));
      if (got < 0 && (errno == EINTR || errno == EAGAIN)) return;
      const LineSplitter::Callback& on_line = is_stdout ? on_stdout : on_stderr;
      if (got <= 0) {
        *open = false;
        lines->Finish(on_line);
        return;
      }
      if (!is_stdout) stderr_log_.Write(std::string_view(buf, static_cast<size_t>(got)));
      lines->Feed(buf, static_cast<size_t>(got), on_line);
    };
    drain(out_idx, child->stdout_fd(), &out_lines, &out_open, true);
    drain(err_idx, child->stderr_fd(), &err_lines, &err_open, false);
  }
  if (out_open) out_lines.Finish(on_stdout);
  if (err_open) err_lines.Finish(on_stderr);
  WarnAboutOutput();
}

void JobRunner::KillLeftovers(ChildProcess* child) {
  int others = child->KillTree();
  if (others > 0) {
    spdlog::warn("job {} attempt {}: killed {} leftover process(es) of the trainer", job_id(),
                 attempt_id(), others);
  }
}

void JobRunner::KillIfGraceOver(ChildProcess* child) {
  absl::MutexLock lock(&mu_);
  if (kill_at_ms_ > 0 && clock_->NowMonotonicMs() >= kill_at_ms_) {
    spdlog::warn("job {} attempt {}: grace period over: SIGKILL", job_id(), attempt_id());
    child->KillTree();  // the group and any descendant that left it
    kill_at_ms_ = -1;   // sent once
  }
}

void JobRunner::WarnAboutOutput() {
  if (non_event_lines_ > 0) {
    spdlog::warn("job {} attempt {}: {} stdout line(s) were not events (ignored)", job_id(),
                 attempt_id(), non_event_lines_);
  }
  if (stderr_log_.dropped() > 0 || events_log_.dropped() > 0) {
    spdlog::warn("job {} attempt {}: per-attempt logs capped at {} bytes ({} stderr and {} "
                 "event bytes dropped)",
                 job_id(), attempt_id(), options_.attempt_log_max_bytes, stderr_log_.dropped(),
                 events_log_.dropped());
  }
}

absl::StatusOr<std::unique_ptr<ChildProcess>> JobRunner::SpawnTrainer() {
  absl::StatusOr<std::vector<std::string>> argv = Prepare();
  if (!argv.ok()) return argv.status();
  ChildSpec spec;
  spec.argv = *argv;
  if (!options_.cuda_visible_devices.empty()) {
    spec.env["CUDA_VISIBLE_DEVICES"] = options_.cuda_visible_devices;
  }
  if (options_.threads > 0) {
    spec.env["OMP_NUM_THREADS"] = std::to_string(options_.threads);
    spec.env["MKL_NUM_THREADS"] = std::to_string(options_.threads);
  }
  return ChildProcess::Spawn(spec);
}

MetricRelayHooks JobRunner::RelayHooks() {
  MetricRelayHooks hooks;
  if (metrics_ != nullptr) {
    hooks.on_backlog = [m = metrics_](int64_t delta) {
      m->relay_backlog_points->Increment(static_cast<double>(delta));
    };
  }
  hooks.on_acked = [this](int64_t step) { MarkPublished(step); };
  hooks.on_stale = [this](const std::string& reason) {
    StopChild(false, absl::StrCat("lease lost: ", reason));
  };
  return hooks;
}

void JobRunner::Run() {
  spdlog::info("job {} attempt {} (#{}, {}): starting in {}", job_id(), attempt_id(),
               lease_.attempt_number(), labels_.arch, run_dir_);
  v1::FinishJobRequest finish;
  finish.set_job_id(job_id());
  finish.set_attempt_id(attempt_id());
  absl::StatusOr<std::unique_ptr<ChildProcess>> spawned = SpawnTrainer();
  if (!spawned.ok()) {
    spdlog::error("job {} attempt {}: {}", job_id(), attempt_id(), spawned.status().ToString());
    finish.set_status(v1::FINISH_FAILED);
    finish.set_reason(absl::StrCat("worker could not start the trainer: ",
                                   std::string(spawned.status().message())));
    Report(std::move(finish));
    return;
  }
  std::unique_ptr<ChildProcess> child = std::move(*spawned);
  MetricRelayOptions relay_options = options_.relay;
  if (relay_options.clock == nullptr) relay_options.clock = clock_;
  MetricRelay relay(client_, job_id(), attempt_id(), relay_options, RelayHooks());
  {
    absl::MutexLock lock(&mu_);
    child_ = child.get();
    relay_ = &relay;
    // A stop that arrived while the child was being spawned.
    if (cancelled_ || interrupted_) {
      child->SignalGroup(SIGTERM);
      relay.Unblock();
    }
  }
  Supervise(child.get(), &relay);
  ExitInfo exit = child->Wait();
  {
    absl::MutexLock lock(&mu_);
    child_ = nullptr;
    relay_ = nullptr;
  }
  stderr_log_.Close();
  events_log_.Close();
  std::vector<v1::MetricPoint> rest = relay.Close();
  bool cancelled, interrupted;
  std::string cancel_reason;
  {
    absl::MutexLock lock(&mu_);
    cancelled = cancelled_;
    interrupted = interrupted_;
    cancel_reason = cancel_reason_;
  }
  spdlog::info("job {} attempt {}: trainer ended ({}) at step {}", job_id(), attempt_id(),
               exit.Describe(), last_step_);
  if (cancelled || relay.stale()) {
    spdlog::info("job {} attempt {}: not reported ({})", job_id(), attempt_id(),
                 cancel_reason.empty() ? "lease lost" : cancel_reason);
    Finish(v1::FINISH_STATUS_UNSPECIFIED);
    return;
  }
  for (v1::MetricPoint& p : rest) *finish.add_points() = std::move(p);
  FillReport(exit, interrupted, &finish);
  Report(std::move(finish));
}

void JobRunner::FillReport(const ExitInfo& exit, bool interrupted, v1::FinishJobRequest* finish) {
  if (resumed_from_step_) finish->set_resumed_from_step(*resumed_from_step_);
  finish->set_final_step(last_step_);
  if (has_val_loss_) {
    finish->set_has_val_loss(true);
    finish->set_final_val_loss(val_loss_);
  }
  if (!checkpoint_path_.empty()) {
    std::error_code ec;
    fs::path rel = fs::relative(checkpoint_path_, options_.checkpoint_root, ec);
    finish->set_checkpoint_path(ec ? checkpoint_path_ : rel.string());
  }
  auto tail = [this] {
    return absl::StrJoin(stderr_tail_.begin(), stderr_tail_.end(), "\n");
  };
  namespace rp = run_protocol;
  if (exit.exited && exit.code == rp::kExitOk && saw_done_ && done_status_ == rp::kDoneSucceeded) {
    finish->set_status(v1::FINISH_SUCCEEDED);
    for (v1::DiagnosticResult& d : diagnostics_) *finish->add_diagnostics() = std::move(d);
  } else if (exit.exited && exit.code == rp::kExitDiverged) {
    finish->set_status(v1::FINISH_DIVERGED);
    finish->set_reason(done_reason_.empty() ? "diverged" : done_reason_);
  } else if (interrupted) {
    // Only a stop the worker asked for re-queues without using an attempt.
    finish->set_status(v1::FINISH_INTERRUPTED);
    finish->set_reason(absl::StrCat("worker shutting down; trainer ", exit.Describe(),
                                   " at step ", last_step_));
  } else {
    finish->set_status(v1::FINISH_FAILED);
    std::string what = exit.exited && exit.code == rp::kExitOk
                           ? std::string("exit code 0 without a done event")
                           : exit.Describe();
    if (exit.exited && exit.code == rp::kExitUsage) {
      absl::StrAppend(&what, " (", std::string(rp::ExitCodeMeaning(exit.code)), ")");
    }
    if (exit.exited && exit.code == rp::kExitInterrupted) {
      what += " (interrupted, but the worker did not stop it)";
    }
    rp::FailureDetail detail;
    detail.summary = absl::StrCat("depthbench-train ", what, " at step ", last_step_);
    detail.stderr_tail = tail();
    finish->set_reason(rp::FormatFailureReason(detail));
  }
}

void JobRunner::Report(v1::FinishJobRequest request) {
  SanitizeFinishReport(&request);
  if (request.ByteSizeLong() > kMaxReportBytes && request.points_size() > 0) {
    // The points go ahead on their own; the report follows without them.
    std::vector<v1::MetricPoint> points(request.points().begin(), request.points().end());
    request.clear_points();
    if (!DeliverPoints(points)) {
      spdlog::warn("job {} attempt {}: some trailing points could not be delivered", job_id(),
                   attempt_id());
    }
  }
  bool minimal = false;
  if (request.ByteSizeLong() > kMaxReportBytes) {
    const std::string why = absl::StrCat("the report is ", request.ByteSizeLong(),
                                         " bytes, above the limit of ", kMaxReportBytes);
    spdlog::warn("job {} attempt {}: {}; sending a minimal report", job_id(), attempt_id(), why);
    request = MinimalFinishReport(request, why);
    minimal = true;
  }
  int64_t last_point_step = 0;
  for (const v1::MetricPoint& p : request.points()) last_point_step = std::max(last_point_step, p.step());
  int64_t backoff_ms = 100;
  int64_t give_up_at = 0;
  int internal_errors = 0;
  bool delivered = false;
  while (true) {
    absl::StatusOr<v1::FinishJobResponse> resp = client_->FinishJob(request);
    if (resp.ok()) {
      if (last_point_step > 0) MarkPublished(last_point_step);
      spdlog::info("job {} attempt {}: reported {}{} -> job {}", job_id(), attempt_id(),
                   v1::FinishStatus_Name(request.status()), minimal ? " (minimal report)" : "",
                   v1::JobState_Name(resp->state()));
      delivered = true;
      break;
    }
    if (resp.status().code() == absl::StatusCode::kInternal) ++internal_errors;
    if (RefusesRequest(resp.status(), internal_errors)) {
      if (!minimal) {
        // Never retry what the scheduler refuses for good: fall back once
        // to a report that always fits.
        spdlog::warn("job {} attempt {}: FinishJob refused the report ({}); sending a minimal "
                     "report", job_id(), attempt_id(), resp.status().ToString());
        request = MinimalFinishReport(request, resp.status().ToString());
        minimal = true;
        last_point_step = 0;
        internal_errors = 0;
        backoff_ms = 100;
        continue;
      }
      spdlog::error("job {} attempt {}: FinishJob refused even the minimal report: {}; the "
                    "lease will expire", job_id(), attempt_id(), resp.status().ToString());
      break;
    }
    bool interrupted;
    {
      absl::MutexLock lock(&mu_);
      interrupted = interrupted_;
    }
    if (!IsTransient(resp.status())) {
      spdlog::warn("job {} attempt {}: FinishJob refused: {}", job_id(), attempt_id(),
                   resp.status().ToString());
      break;
    }
    if (interrupted) {
      int64_t now = clock_->NowMonotonicMs();
      if (give_up_at == 0) give_up_at = now + options_.shutdown_report_ms;
      if (now >= give_up_at) {
        spdlog::error("job {} attempt {}: giving up reporting {} while shutting down: {}",
                      job_id(), attempt_id(), v1::FinishStatus_Name(request.status()),
                      resp.status().ToString());
        break;
      }
    }
    clock_->SleepFor(backoff_ms);
    backoff_ms = std::min<int64_t>(backoff_ms * 2, 2000);
  }
  Finish(delivered ? request.status() : v1::FINISH_STATUS_UNSPECIFIED);
}

bool JobRunner::DeliverPoints(const std::vector<v1::MetricPoint>& points) {
  const size_t batch = std::max<size_t>(1, options_.relay.batch);
  for (size_t start = 0; start < points.size(); start += batch) {
    v1::ReportMetricsRequest chunk;
    chunk.set_job_id(job_id());
    chunk.set_attempt_id(attempt_id());
    const size_t end = std::min(points.size(), start + batch);
    for (size_t i = start; i < end; ++i) *chunk.add_points() = points[i];
    int64_t backoff_ms = 100;
    for (int tries = 0;; ++tries) {
      absl::StatusOr<v1::ReportMetricsResponse> sent = client_->ReportMetrics({chunk});
      if (sent.ok()) {
        MarkPublished(points[end - 1].step());
        break;
      }
      // Bounded: the report must still go out (and a stale lease refuses
      // it as well).
      if (!IsTransient(sent.status()) || tries >= 8) return false;
      clock_->SleepFor(backoff_ms);
      backoff_ms = std::min<int64_t>(backoff_ms * 2, 2000);
    }
  }
  return true;
}

void JobRunner::MarkPublished(int64_t step) {
  int64_t seen = published_through_.load();
  while (step > seen) {
    if (published_through_.compare_exchange_weak(seen, step)) {
      WriteMarker(run_dir_, attempt_id(), step);
      return;
    }
  }
}

void JobRunner::Finish(v1::FinishStatus reported) {
  if (metrics_ != nullptr) metrics_->RemoveJob(labels_);
  {
    absl::MutexLock lock(&mu_);
    reported_ = reported;
    done_ = true;
  }
  if (on_done_) on_done_(this);
}

}  // namespace depthbench::worker
