// depthbench jobs | job ID | retry (ID | --sweep S) | watch (ID | --sweep S)
#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "cli/commands.h"
#include "cli/output.h"

namespace depthbench::cli {
namespace {

namespace v1 = ::depthbench::v1;

std::string StateName(v1::JobState s) {
  std::string name = v1::JobState_Name(s);
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name;
}

absl::StatusOr<v1::JobState> ParseState(const std::string& text) {
  std::string upper = text;
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  v1::JobState state;
  if (text.empty()) return v1::JOB_STATE_UNSPECIFIED;
  if (!v1::JobState_Parse(upper, &state) || state == v1::JOB_STATE_UNSPECIFIED) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--state: unknown state \"", text,
        "\" (valid: pending, leased, running, succeeded, diverged, failed, cancelled, pruned, held, skipped, paused)"));
  }
  return state;
}


struct WatchArgs {
  int64_t job_id = 0;
  std::string sweep;
  int64_t from_step = 0;
  int64_t attempt_id = 0;
  std::vector<std::string> only;
  bool progress = false;
  int64_t interval_s = 2;
  int64_t timeout_s = 86400;
};

// The latest of one followed job, for `watch --sweep --progress`.
struct JobProgress {
  int64_t step = 0;
  bool has_loss = false, has_val = false;
  double loss = 0, val_loss = 0;
  v1::JobState state = v1::JOB_STATE_UNSPECIFIED;
  bool changed = false;
};

// Streams one job's WatchJob events: printed one line each (prefixed with
// the job id when following a sweep), or folded into `progress`.
absl::Status FollowJob(SchedulerClient& client, const WatchArgs& a, int64_t job_id, bool prefix,
                       CommandEnv& env, std::mutex& out_mu, JobProgress* progress) {
  v1::WatchJobRequest req;
  req.set_job_id(job_id);
  req.set_from_step(a.from_step);
  req.set_attempt_id(a.attempt_id);
  auto ctx = client.Context(a.timeout_s * 1000);
  auto reader = client.WatchJob(ctx.get(), req);
  const std::set<std::string> only(a.only.begin(), a.only.end());
  const std::string head = prefix ? absl::StrCat("job ", job_id, " ") : "";
  v1::WatchJobEvent event;
  while (reader->Read(&event)) {
    if (event.has_point() && !only.empty() && only.count(event.point().name()) == 0) continue;
    std::lock_guard<std::mutex> lock(out_mu);
    if (progress != nullptr) {
      if (event.has_point()) {
        const v1::MetricPoint& p = event.point();
        progress->step = std::max(progress->step, p.step());
        if (p.name() == "loss") {
          progress->has_loss = true;
          progress->loss = p.value();
        } else if (p.name() == "val_loss") {
          progress->has_val = true;
          progress->val_loss = p.value();
        }
      } else if (event.has_resumed()) {
        progress->step = event.resumed().step();
      } else {
        progress->state = event.state();
      }
      progress->changed = true;
      continue;
    }
    if (env.json) {
      std::string line = ToJson(event);
      line.erase(std::remove(line.begin(), line.end(), '\n'), line.end());
      if (prefix) line = absl::StrCat("{\"job_id\":", job_id, ",", line.substr(1));
      *env.out << line << "\n";
    } else if (event.has_point()) {
      *env.out << head << "attempt " << event.attempt_id() << " step " << event.point().step()
               << " " << event.point().name() << " " << FormatDouble(event.point().value())
               << "\n";
    } else if (event.has_resumed()) {
      *env.out << head << "attempt " << event.attempt_id() << " resumed from step "
               << event.resumed().step()
               << " (earlier attempts' later steps are not part of the history)\n";
    } else {
      *env.out << head << "state " << StateName(event.state()) << "\n";
    }
    env.out->flush();
  }
  return FromGrpc(reader->Finish());
}

// Follows every leased or running job of a sweep (found by listing them
// every second) with one WatchJob stream each, until the sweep ends.
absl::Status FollowSweep(SchedulerClient& client, const WatchArgs& a, CommandEnv& env,
                         std::mutex& out_mu) {
  struct Follow {
    std::thread thread;
    JobProgress progress;  // guarded by out_mu
    absl::Status status;   // set by the thread before it ends
  };
  std::map<int64_t, std::unique_ptr<Follow>> follows;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(a.timeout_s);
  auto next_view = std::chrono::steady_clock::now();
  absl::Status failure;
  auto print_progress = [&](bool all) {
    std::lock_guard<std::mutex> lock(out_mu);
    for (auto& [id, f] : follows) {
      JobProgress& p = f->progress;
      if (!all && !p.changed) continue;
      p.changed = false;
      *env.out << "job " << id << " step " << p.step << " loss "
               << (p.has_loss ? FormatDouble(p.loss, 5) : "-") << " val_loss "
               << (p.has_val ? FormatDouble(p.val_loss, 5) : "-") << " "
               << (p.state == v1::JOB_STATE_UNSPECIFIED ? "" : StateName(p.state)) << "\n";
    }
    env.out->flush();
  };
  while (failure.ok()) {
    absl::StatusOr<v1::Sweep> sweep = client.GetSweep(a.sweep);
    if (!sweep.ok()) {
      failure = sweep.status();
      break;
    }
    for (v1::JobState state : {v1::LEASED, v1::RUNNING}) {
      v1::ListJobsRequest req;
      req.set_sweep(a.sweep);
      req.set_state(state);
      req.set_page_size(1000);
      while (failure.ok()) {
        absl::StatusOr<v1::ListJobsResponse> page = client.ListJobs(req);
        if (!page.ok()) {
          failure = page.status();
          break;
        }
        for (const v1::Job& job : page->jobs()) {
          if (follows.count(job.id()) > 0) continue;
          auto f = std::make_unique<Follow>();
          Follow* raw = f.get();
          const int64_t id = job.id();
          f->thread = std::thread([&client, &a, &env, &out_mu, raw, id] {
            raw->status =
                FollowJob(client, a, id, true, env, out_mu, a.progress ? &raw->progress : nullptr);
          });
          follows[id] = std::move(f);
        }
        if (page->next_page_token().empty()) break;
        req.set_page_token(page->next_page_token());
      }
    }
    if (!failure.ok() || sweep->state() != v1::SWEEP_RUNNING) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      failure = absl::DeadlineExceededError("watch: --timeout-s passed");
      break;
    }
    if (a.progress && std::chrono::steady_clock::now() >= next_view) {
      print_progress(false);
      next_view = std::chrono::steady_clock::now() + std::chrono::seconds(a.interval_s);
    }
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  // Each stream ends once its job ends (or at the timeout).
  for (auto& [id, f] : follows) {
    if (f->thread.joinable()) f->thread.join();
    if (failure.ok() && !f->status.ok()) failure = f->status;
  }
  if (a.progress) print_progress(true);
  return failure;
}

struct JobsArgs {
  std::string sweep, state, arch;
  int limit = 100;
  bool all = false;
};

// `jobs`: the filtered list, one page or (--all) every page.
int RunJobs(CommandEnv& env, const JobsArgs& args) {
  auto state = ParseState(args.state);
  if (!state.ok()) return env.Fail(state.status());
  auto client = env.Client();
  if (!client.ok()) return env.Fail(client.status());
  v1::ListJobsRequest req;
  req.set_sweep(args.sweep);
  req.set_state(*state);
  req.set_arch(args.arch);
  req.set_page_size(args.limit);
  v1::ListJobsResponse all;
  while (true) {
    auto page = (*client)->ListJobs(req);
    if (!page.ok()) return env.Fail(page.status());
    for (auto& j : *page->mutable_jobs()) *all.add_jobs() = std::move(j);
    all.set_next_page_token(page->next_page_token());
    if (!args.all || page->next_page_token().empty()) break;
    req.set_page_token(page->next_page_token());
  }
  if (env.json) {
    *env.out << ToJson(all) << "\n";
    return kExitOk;
  }
  Table table({"ID", "SWEEP", "KIND", "ARCH", "L", "D", "LR", "SEED", "STATE", "ATTEMPTS",
               "VAL_LOSS", "BEST"});
  for (const auto& j : all.jobs()) {
    table.AddRow({std::to_string(j.id()), j.sweep_name(),
                  j.kind() == v1::DIAGNOSE ? "diagnose" : "train", j.arch(),
                  std::to_string(j.layers()), std::to_string(j.d_model()),
                  FormatDouble(j.lr(), 4), std::to_string(j.seed()), StateName(j.state()),
                  absl::StrCat(j.attempts_used(), "/", j.max_attempts()),
                  j.has_val_loss() ? FormatDouble(j.final_val_loss(), 5) : "-",
                  j.is_best() ? "*" : ""});
  }
  table.Print(*env.out);
  if (!all.next_page_token().empty()) {
    *env.out << "(more: --all, or narrow with --sweep/--state/--arch)\n";
  }
  return kExitOk;
}

void PrintJob(const v1::Job& j, std::ostream& out) {
  Table fields({"FIELD", "VALUE"});
  fields.AddRow({"id", std::to_string(j.id())});
  fields.AddRow({"sweep", j.sweep_name()});
  fields.AddRow({"kind", j.kind() == v1::DIAGNOSE ? "diagnose" : "train"});
  fields.AddRow({"state", StateName(j.state())});
  fields.AddRow({"arch", j.arch()});
  fields.AddRow({"shape", absl::StrCat(j.layers(), "x", j.d_model())});
  fields.AddRow({"lr", FormatDouble(j.lr())});
  fields.AddRow({"seed", std::to_string(j.seed())});
  fields.AddRow({"attempts", absl::StrCat(j.attempts_used(), "/", j.max_attempts())});
  fields.AddRow({"val_loss", j.has_val_loss() ? FormatDouble(j.final_val_loss()) : "-"});
  fields.AddRow({"best", j.is_best() ? "yes" : "no"});
  fields.AddRow({"checkpoint_dir", j.checkpoint_dir()});
  if (!j.reason().empty()) fields.AddRow({"reason", j.reason()});
  fields.AddRow({"config", j.config_json()});
  fields.Print(out);
  if (j.attempts_size() > 0) {
    out << "\n";
    Table attempts({"ATTEMPT", "N", "WORKER", "OUTCOME", "REASON"});
    for (const auto& a : j.attempts()) {
      attempts.AddRow({std::to_string(a.attempt_id()), std::to_string(a.number()),
                       a.worker_id(), a.outcome(), a.reason()});
    }
    attempts.Print(out);
  }
}

// `job ID`: its fields and attempts.
int RunJob(CommandEnv& env, int64_t job_id) {
  auto client = env.Client();
  if (!client.ok()) return env.Fail(client.status());
  auto job = (*client)->GetJob(job_id);
  if (!job.ok()) return env.Fail(job.status());
  if (env.json) {
    *env.out << ToJson(*job) << "\n";
  } else {
    PrintJob(*job, *env.out);
  }
  return kExitOk;
}

struct RetryArgs {
  int64_t job_id = 0;
  std::string sweep;
};

// `retry ID | --sweep S`.
int RunRetry(CommandEnv& env, const RetryArgs& args) {
  if ((args.job_id == 0) == args.sweep.empty()) {
    *env.err << "error: retry needs a job id or --sweep NAME\n";
    return kExitUsage;
  }
  auto client = env.Client();
  if (!client.ok()) return env.Fail(client.status());
  v1::RetryJobRequest req;
  req.set_job_id(args.job_id);
  req.set_sweep(args.sweep);
  auto retried = (*client)->RetryJob(req);
  if (!retried.ok()) return env.Fail(retried.status());
  const v1::RetryJobResponse& resp = *retried;
  if (env.json) {
    *env.out << ToJson(resp) << "\n";
  } else {
    *env.out << "re-queued " << resp.job_ids_size() << " job(s)";
    for (int64_t id : resp.job_ids()) *env.out << " " << id;
    *env.out << "\n";
  }
  return kExitOk;
}

// `watch ID | --sweep S`.
int RunWatch(CommandEnv& env, const WatchArgs& a) {
  if ((a.job_id > 0) == !a.sweep.empty()) {
    return env.Fail(absl::InvalidArgumentError("watch: give a job id or --sweep NAME (not both)"));
  }
  if (!a.sweep.empty() && (a.attempt_id > 0 || a.from_step > 0)) {
    return env.Fail(absl::InvalidArgumentError(
        "watch: --attempt and --from-step apply to one job, not to --sweep"));
  }
  if (a.progress && a.sweep.empty()) {
    return env.Fail(absl::InvalidArgumentError("watch: --progress needs --sweep"));
  }
  auto client = env.Client();
  if (!client.ok()) return env.Fail(client.status());
  std::mutex out_mu;
  absl::Status status =
      a.sweep.empty()
          ? FollowJob(**client, a, a.job_id, /*prefix=*/false, env, out_mu, nullptr)
          : FollowSweep(**client, a, env, out_mu);
  if (!status.ok()) return env.Fail(status);
  return kExitOk;
}

void AddJobsCommand(CLI::App& app, CommandEnv& env) {
  auto args = std::make_shared<JobsArgs>();
  auto* jobs = app.add_subcommand("jobs", "list jobs (filters: --sweep, --state, --arch)");
  jobs->add_option("--sweep", args->sweep, "only this sweep");
  jobs->add_option("--state", args->state, "only this state");
  jobs->add_option("--arch", args->arch, "only this architecture");
  jobs->add_option("--limit", args->limit, "page size (1..1000)")->capture_default_str()
      ->check(CLI::Range(1, 1000));
  jobs->add_flag("--all", args->all, "follow pages until the end");
  jobs->callback([&env, args] {
    env.run = [args](CommandEnv& env) -> int { return RunJobs(env, *args); };
  });
}

void AddJobCommand(CLI::App& app, CommandEnv& env) {
  auto job_id = std::make_shared<int64_t>(0);
  auto* job = app.add_subcommand("job", "one job with its attempts");
  job->add_option("id", *job_id, "job id")->required()->check(CLI::PositiveNumber);
  job->callback([&env, job_id] {
    env.run = [job_id](CommandEnv& env) -> int { return RunJob(env, *job_id); };
  });
}

void AddRetryCommand(CLI::App& app, CommandEnv& env) {
  auto retry_args = std::make_shared<RetryArgs>();
  auto* retry = app.add_subcommand("retry", "retry a failed/cancelled job, or every failed job of --sweep");
  auto* id_opt = retry->add_option("id", retry_args->job_id, "job id")->check(CLI::PositiveNumber);
  auto* sweep_opt = retry->add_option("--sweep", retry_args->sweep, "retry every failed job of this sweep");
  id_opt->excludes(sweep_opt);
  retry->callback([&env, retry_args] {
    env.run = [retry_args](CommandEnv& env) -> int { return RunRetry(env, *retry_args); };
  });
}

void AddWatchCommand(CLI::App& app, CommandEnv& env) {
  auto watch_args = std::make_shared<WatchArgs>();
  auto* watch = app.add_subcommand(
      "watch",
      "stream a job's metric points as workers relay them (within about a second of the "
      "trainer logging them) and its state changes until it ends; --sweep follows every "
      "running job of a sweep");
  watch->add_option("id", watch_args->job_id, "job id")->check(CLI::PositiveNumber);
  watch->add_option("--sweep", watch_args->sweep,
                    "follow every job of this sweep that is leased or running, until the "
                    "sweep ends");
  watch->add_option("--from-step", watch_args->from_step, "resume from this step")->check(CLI::NonNegativeNumber);
  watch->add_option("--attempt", watch_args->attempt_id,
                    "only this attempt's stored points, including those a later attempt "
                    "abandoned (default: the job's history, each step once)")
      ->check(CLI::PositiveNumber);
  watch->add_option("--only", watch_args->only, "only points with these names (e.g. loss val_loss)");
  watch->add_flag("--progress", watch_args->progress,
                  "with --sweep: one line per job and interval (latest step, loss, "
                  "val_loss, state) instead of one line per point");
  watch->add_option("--interval-s", watch_args->interval_s, "--progress: seconds between views")
      ->capture_default_str()->check(CLI::PositiveNumber);
  watch->add_option("--timeout-s", watch_args->timeout_s, "give up after this long")
      ->capture_default_str()->check(CLI::PositiveNumber);
  watch->callback([&env, watch_args] {
    env.run = [watch_args](CommandEnv& env) -> int { return RunWatch(env, *watch_args); };
  });
}

}  // namespace

void AddJobCommands(CLI::App& app, CommandEnv& env) {
  AddJobsCommand(app, env);
  AddJobCommand(app, env);
  AddRetryCommand(app, env);
  AddWatchCommand(app, env);
}

}  // namespace depthbench::cli
