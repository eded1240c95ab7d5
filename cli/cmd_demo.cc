// depthbench demo [--workdir DIR] [--archs a,b,...] [--steps N] [--keep]
//
// The README's one command: starts a depthbench-scheduler on a temp SQLite
// file (free loopback port), two depthbench-workers (1 slot, 1 thread each),
// submits the embedded demo sweep (examples/demo_sweep.yaml, compiled in),
// shows progress, prints the results table and where everything lives,
// then stops the daemons. The binaries are looked up next to this one
// (install layout), in the build tree (../scheduler, ../worker) and on PATH.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cli/commands.h"
#include "cli/demo_sweep_yaml.h"
#include "cli/output.h"
#include "cli/results_doc.h"
#include "cli/spec_reader.h"
#include "common/child_process.h"
#include "common/free_port.h"
#include "common/run_protocol.h"
#include "common/status_macros.h"

namespace depthbench::cli {

namespace {

namespace v1 = ::depthbench::v1;
namespace fs = std::filesystem;

volatile sig_atomic_t g_interrupted = 0;

// A daemon of the demo: its stdout+stderr appended to `log`, SIGTERM if the
// demo dies (its daemons stop with it). In its own process group, so the
// terminal's Ctrl-C reaches the demo only, which then stops it.
absl::StatusOr<std::unique_ptr<ChildProcess>> StartDaemon(std::vector<std::string> args,
                                                          const std::string& log) {
  ChildSpec spec;
  spec.argv = std::move(args);
  spec.parent_death_signal = SIGTERM;
  spec.output = ChildSpec::Output::kLogFile;
  spec.log_file = log;
  return ChildProcess::Spawn(spec);
}

std::string SelfDir() {
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : self.parent_path().string();
}

// <self dir>/NAME, <self dir>/../SUBDIR/NAME, then PATH.
absl::StatusOr<std::string> FindBinary(const std::string& name, const std::string& subdir) {
  auto executable = [](const fs::path& p) {
    std::error_code ec;
    return fs::is_regular_file(p, ec) && access(p.c_str(), X_OK) == 0;
  };
  fs::path dir = SelfDir();
  for (const fs::path& p : {dir / name, dir / ".." / subdir / name}) {
    if (executable(p)) return fs::weakly_canonical(p).string();
  }
  const char* path = std::getenv("PATH");
  for (absl::string_view d : absl::StrSplit(path ? path : "", ':')) {
    if (!d.empty() && executable(fs::path(std::string(d)) / name)) {
      return (fs::path(std::string(d)) / name).string();
    }
  }
  return absl::NotFoundError(absl::StrCat(name, " not found next to depthbench (", dir.string(),
                                          "), in ../", subdir, " or on PATH"));
}

// A free loopback TCP port (0 when none can be had: the daemon then fails
// to start and says so).
int FreePort() { return FreeLoopbackPort().value_or(0); }

std::string Counts(const v1::Sweep& s) {
  std::vector<std::string> parts;
  for (const char* state : {"pending", "leased", "running", "succeeded", "diverged", "failed",
                            "cancelled"}) {
    auto it = s.job_counts().find(state);
    int64_t n = it == s.job_counts().end() ? 0 : it->second;
    if (n > 0 || std::string(state) == "running" || std::string(state) == "succeeded") {
      parts.push_back(absl::StrCat(n, " ", state));
    }
  }
  return absl::StrCat(s.done_jobs(), "/", s.total_jobs(), " done (", absl::StrJoin(parts, ", "),
                      ")");
}

struct DemoArgs {
  std::string workdir;
  std::string archs;
  int64_t steps = 0;
  bool keep = false;
  int64_t timeout_s = 900;
};

// What one demo run holds: where its files are, its daemons and the client.
// The members stop in reverse order: the client, the workers, then the
// scheduler.
struct Demo {
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  std::string dir;  // absolute
  bool temp_dir = false;
  std::string db, ckpt_root, port_file, web_port_file, address;
  int web_port = 0;  // the scheduler's web view, 0 when it has none
  std::unique_ptr<ChildProcess> scheduler;
  std::vector<std::unique_ptr<ChildProcess>> workers;
  std::vector<std::string> metrics_urls;
  std::unique_ptr<SchedulerClient> client;

  // On an early return: the workers, then the scheduler, each given 10 s.
  ~Demo() {
    client.reset();
    for (auto& w : workers) w->Stop(10000);
    if (scheduler) scheduler->Stop(10000);
  }

  double ElapsedS() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
};

// The embedded example spec with the --archs / --steps overrides.
absl::StatusOr<v1::SweepSpec> DemoSpec(const DemoArgs& args) {
  absl::StatusOr<v1::SweepSpec> spec = ParseSpecYaml(kDemoSweepYaml);
  if (!spec.ok()) return spec.status();
  if (!args.archs.empty()) {
    std::vector<std::string> archs = absl::StrSplit(args.archs, ',', absl::SkipEmpty());
    // Every arch gets the grid of the spec's first architecture.
    v1::LrGrid grid = spec->lr_grids().at(spec->architectures(0));
    spec->clear_architectures();
    spec->clear_lr_grids();
    for (const std::string& a : archs) {
      spec->add_architectures(a);
      (*spec->mutable_lr_grids())[a] = grid;
    }
  }
  if (args.steps > 0) {
    spec->mutable_training()->set_steps(args.steps);
    int64_t ckpt = spec->training().checkpoint_interval();
    if (ckpt >= args.steps) spec->mutable_training()->set_checkpoint_interval(std::max<int64_t>(1, args.steps / 3));
  }
  return spec;
}

// --workdir, or a fresh temp dir; with checkpoints/ inside.
absl::Status MakeWorkDir(const DemoArgs& args, Demo* demo) {
  demo->temp_dir = args.workdir.empty();
  std::string dir = args.workdir;
  if (demo->temp_dir) {
    std::string templ = (fs::temp_directory_path() / "depthbench-demo-XXXXXX").string();
    if (mkdtemp(templ.data()) == nullptr) {
      return absl::InternalError("cannot create a temp directory");
    }
    dir = templ;
  }
  std::error_code ec;
  fs::create_directories(fs::path(dir) / "checkpoints", ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("--workdir ", dir, ": ", ec.message()));
  demo->dir = fs::absolute(dir).string();
  demo->db = demo->dir + "/demo.sqlite";
  demo->ckpt_root = demo->dir + "/checkpoints";
  demo->port_file = demo->dir + "/scheduler.port";
  demo->web_port_file = demo->dir + "/web.port";
  fs::remove(demo->port_file, ec);
  fs::remove(demo->web_port_file, ec);
  return absl::OkStatus();
}

// The scheduler on a free loopback port (read back from its port file).
absl::Status StartScheduler(const std::string& bin, Demo* demo) {
  absl::StatusOr<std::unique_ptr<ChildProcess>> started =
      StartDaemon({bin, "--db", demo->db, "--listen", "127.0.0.1:0", "--port-file",
                   demo->port_file, "--web-listen", "127.0.0.1:0", "--web-port-file",
                   demo->web_port_file},
                  demo->dir + "/scheduler.log");
  if (!started.ok()) {
    return absl::InternalError(
        absl::StrCat("cannot start depthbench-scheduler: ", started.status().message()));
  }
  demo->scheduler = std::move(*started);
  int port = 0;
  for (int i = 0; i < 500 && port <= 0; ++i) {
    std::ifstream in(demo->port_file);
    if (!(in >> port)) port = 0;
    if (port > 0) break;
    if (demo->scheduler->Exited()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (port <= 0) {
    return absl::UnavailableError(absl::StrCat("depthbench-scheduler did not start; see ",
                                               demo->dir, "/scheduler.log"));
  }
  demo->address = absl::StrCat("127.0.0.1:", port);
  // The scheduler writes the web port before the gRPC one.
  if (std::ifstream web_in(demo->web_port_file); !(web_in >> demo->web_port)) demo->web_port = 0;
  return absl::OkStatus();
}

// Two workers, one slot and one thread each, with their metrics endpoints.
absl::Status StartWorkers(const std::string& bin, Demo* demo) {
  for (int i = 1; i <= 2; ++i) {
    std::string metrics = absl::StrCat("127.0.0.1:", FreePort());
    absl::StatusOr<std::unique_ptr<ChildProcess>> w =
        StartDaemon({bin, "--scheduler", demo->address, "--checkpoint-root", demo->ckpt_root,
                     "--slots", "1", "--threads-per-slot", "1", "--name",
                     absl::StrCat("demo-worker-", i), "--metrics-listen", metrics,
                     "--grace-ms", "5000", "--poll-ms", "200"},
                    absl::StrCat(demo->dir, "/worker-", i, ".log"));
    if (!w.ok()) {
      return absl::InternalError(
          absl::StrCat("cannot start depthbench-worker: ", w.status().message()));
    }
    demo->workers.push_back(std::move(*w));
    demo->metrics_urls.push_back(absl::StrCat("http://", metrics, "/metrics"));
  }
  return absl::OkStatus();
}

// Connects to the demo's scheduler and submits the spec.
absl::Status Submit(const ClientOptions& options, const v1::SweepSpec& spec, Demo* demo,
                    std::ostream& out) {
  ClientOptions client_options = options;
  client_options.address = demo->address;
  auto client = SchedulerClient::Connect(client_options);
  if (!client.ok()) return client.status();
  demo->client = std::move(*client);
  ASSIGN_OR_RETURN(const v1::SubmitSweepResponse submitted, demo->client->SubmitSweep(spec));
  out << "submitted sweep \"" << spec.name() << "\": " << submitted.sweep().total_jobs()
      << " jobs (" << absl::StrJoin(spec.architectures(), ", ") << " x suite "
      << spec.shapes().suite() << " x " << spec.lr_grids().begin()->second.lrs_size()
      << " LRs, " << spec.training().steps() << " steps)\n";
  out.flush();
  return absl::OkStatus();
}

// Prints progress until the sweep leaves RUNNING and returns it. Cancelled
// on Ctrl-C / SIGTERM.
absl::StatusOr<v1::Sweep> WaitForSweep(Demo& demo, const std::string& name, int64_t timeout_s,
                                       std::ostream& out) {
  const bool tty = &out == &std::cout && isatty(STDOUT_FILENO);
  std::string last_line;
  double last_print = -1e9;
  v1::Sweep sweep;
  while (true) {
    if (g_interrupted) return absl::CancelledError("interrupted");
    absl::StatusOr<v1::Sweep> got = demo.client->GetSweep(name);
    if (got.ok()) {
      sweep = *std::move(got);
      std::string line = Counts(sweep);
      double t = demo.ElapsedS();
      if (tty) {
        out << "\r[" << FormatDouble(t, 3) << " s] " << line << "\033[K" << std::flush;
      } else if (line != last_line || t - last_print > 15) {
        out << "[" << static_cast<int64_t>(t) << " s] " << line << "\n" << std::flush;
        last_print = t;
      }
      last_line = line;
      if (sweep.state() != v1::SWEEP_RUNNING) break;
    } else if (demo.scheduler->Exited()) {
      return absl::UnavailableError(
          absl::StrCat("the scheduler exited; see ", demo.dir, "/scheduler.log"));
    }
    if (demo.ElapsedS() > static_cast<double>(timeout_s)) {
      return absl::DeadlineExceededError(absl::StrCat(
          "the sweep did not finish within ", timeout_s, " s; logs in ", demo.dir));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(tty ? 250 : 1000));
  }
  if (tty) out << "\n";
  return sweep;
}

// One line per distinct (arch, first line of the failure, the trainer's
// own error), and where the failed jobs' stderr is.
void PrintFailures(Demo& demo, const v1::Sweep& sweep, const std::string& name,
                   std::ostream& out) {
  int failed = 0;
  auto count = sweep.job_counts().find("failed");
  if (count != sweep.job_counts().end()) failed = static_cast<int>(count->second);
  if (failed == 0) return;
  v1::ListJobsRequest lreq;
  lreq.set_sweep(name);
  lreq.set_state(v1::FAILED);
  lreq.set_page_size(1000);
  absl::StatusOr<v1::ListJobsResponse> failed_jobs = demo.client->ListJobs(lreq);
  if (failed_jobs.ok()) {
    std::set<std::string> reasons;
    for (const v1::Job& j : failed_jobs->jobs()) {
      const run_protocol::FailureDetail detail = run_protocol::ParseFailureDetail(j.reason());
      std::string line = detail.summary.substr(0, detail.summary.find('\n'));
      // The trainer's own error line is the most telling part of the tail.
      if (detail.has_trainer_error) line += ": " + detail.trainer_error;
      reasons.insert(absl::StrCat(j.arch(), ": ", line));
    }
    out << "\nFailed runs:\n";
    for (const std::string& r : reasons) out << "  " << r << "\n";
  }
  out << "\n" << failed << " job(s) failed; `depthbench --scheduler " << demo.address
      << " jobs --sweep " << name << " --state failed` lists them while the scheduler runs, "
      << "and their stderr is in " << demo.ckpt_root << "/<sweep>/<job>/attempt-*.stderr.log\n";
}

absl::Status PrintResults(Demo& demo, const v1::Sweep& sweep, const std::string& name,
                          std::ostream& out) {
  auto queried = demo.client->QueryResults(name);
  if (!queried.ok()) return queried.status();
  const v1::QueryResultsResponse& results = *queried;
  out << "\nResults: best LR per (arch, shape) by final validation loss (nats/byte); "
         "\"div\" = diverged, \"-\" = no finished run; TOKENS/STEPS: the shape's token "
         "budget (20 per Pre-LN parameter unless the spec fixes the steps), the same for "
         "every design\n";
  ResultsTable(results).Print(out);
  if (AnyLegacy(results)) out << "\n" << kLegacyFootnote << "\n";
  PrintFailures(demo, sweep, name, out);
  return absl::OkStatus();
}

// Stops the daemons (workers first: nothing runs now), then says where the
// files are, or removes the temp dir.
void Finish(const DemoArgs& args, const std::string& name, Demo& demo, std::ostream& out) {
  for (auto& w : demo.workers) w->Stop(15000);
  demo.scheduler->Stop(10000);
  const std::string& dir = demo.dir;
  out << "\nDone in " << FormatDouble(demo.ElapsedS(), 3) << " s.\n";
  if (args.keep || !demo.temp_dir) {
    out << "  database:    " << demo.db << "  (serve it again: depthbench-scheduler --db "
        << demo.db << " --listen 127.0.0.1:7070; then `depthbench results " << name << "`)\n"
        << "  checkpoints: " << demo.ckpt_root << "/" << name << "/<job>/checkpoint.pt\n"
        << "  metrics:     per-step points in the database (table metric_points; "
        << "`depthbench watch JOB`); the workers' Prometheus endpoints ("
        << absl::StrJoin(demo.metrics_urls, ", ") << ") lived while the demo ran\n"
        << "  logs:        " << dir << "/scheduler.log, " << dir << "/worker-{1,2}.log\n";
  } else {
    std::error_code ec;
    fs::remove_all(dir, ec);
    out << "  (the temp directory " << dir << " with the database, checkpoints and logs was "
        << "removed; pass --keep or --workdir DIR to keep them)\n";
  }
}

int RunDemo(CommandEnv& env, const DemoArgs& args) {
  std::ostream& out = *env.out;
  Demo demo;
  absl::StatusOr<v1::SweepSpec> spec = DemoSpec(args);
  if (!spec.ok()) return env.Fail(spec.status());
  auto scheduler_bin = FindBinary("depthbench-scheduler", "scheduler");
  if (!scheduler_bin.ok()) return env.Fail(scheduler_bin.status());
  auto worker_bin = FindBinary("depthbench-worker", "worker");
  if (!worker_bin.ok()) return env.Fail(worker_bin.status());
  if (absl::Status s = MakeWorkDir(args, &demo); !s.ok()) return env.Fail(s);
  out << "depthbench demo: working in " << demo.dir << "\n";

  // Ctrl-C: stop cleanly (daemons are stopped by the destructors).
  struct sigaction sa {};
  sa.sa_handler = [](int) { g_interrupted = 1; };
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  if (absl::Status s = StartScheduler(*scheduler_bin, &demo); !s.ok()) return env.Fail(s);
  out << "scheduler on " << demo.address << " (database " << demo.db << ")\n";
  if (demo.web_port > 0) {
    out << "web view (sweep, results, live loss curves): http://127.0.0.1:" << demo.web_port
        << "/#/sweep/" << spec->name() << "\n";
  }
  if (absl::Status s = StartWorkers(*worker_bin, &demo); !s.ok()) return env.Fail(s);
  out << "2 workers (1 slot, 1 thread each); metrics while running: "
      << absl::StrJoin(demo.metrics_urls, ", ") << "\n";
  if (absl::Status s = Submit(env.client, *spec, &demo, out); !s.ok()) return env.Fail(s);

  absl::StatusOr<v1::Sweep> sweep = WaitForSweep(demo, spec->name(), args.timeout_s, out);
  if (absl::IsCancelled(sweep.status())) {
    out << "\ninterrupted; stopping the daemons\n";
    return kExitFailure;
  }
  if (!sweep.ok()) return env.Fail(sweep.status());
  if (absl::Status s = PrintResults(demo, *sweep, spec->name(), out); !s.ok()) return env.Fail(s);
  Finish(args, spec->name(), demo, out);
  return g_interrupted ? kExitFailure : kExitOk;
}

}  // namespace

void AddDemoCommand(CLI::App& app, CommandEnv& env) {
  auto args = std::make_shared<DemoArgs>();
  auto* cmd = app.add_subcommand(
      "demo", "run the demo sweep end to end: local scheduler + 2 workers, progress, results");
  cmd->add_option("--workdir", args->workdir,
                  "directory for the database, checkpoints and logs (kept; default: a temp dir)");
  cmd->add_option("--archs", args->archs,
                  "comma-separated architectures instead of the spec's");
  cmd->add_option("--steps", args->steps, "training steps per run instead of the spec's")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--keep", args->keep, "keep the temp directory");
  cmd->add_option("--timeout-s", args->timeout_s, "give up after this long")
      ->capture_default_str()->check(CLI::PositiveNumber);
  cmd->callback([&env, args] {
    env.run = [args](CommandEnv& env) -> int { return RunDemo(env, *args); };
  });
}

}  // namespace depthbench::cli
