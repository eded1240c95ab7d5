// depthbench demo [--workdir DIR] [--archs a,b,...] [--steps N] [--keep]
//
// The README's one command: starts a depthbench-scheduler on a temp SQLite
// file (free loopback port), two depthbench-workers (1 slot, 1 thread each),
// submits the embedded demo sweep (examples/demo_sweep.yaml, compiled in),
// shows progress, prints the results table and where everything lives,
// then stops the daemons. The binaries are looked up next to this one
// (install layout), in the build tree (../scheduler, ../worker) and on PATH.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <arpa/inet.h>
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

namespace depthbench::cli {

namespace {

namespace v1 = ::depthbench::v1;
namespace fs = std::filesystem;

volatile sig_atomic_t g_interrupted = 0;

// A daemon started by the demo: own stdout/stderr log, SIGTERM to stop.
class DemoProcess {
 public:
  DemoProcess() = default;
  DemoProcess(const DemoProcess&) = delete;
  DemoProcess& operator=(const DemoProcess&) = delete;
  ~DemoProcess() { Stop(10000); }

  bool Start(std::vector<std::string> args, const std::string& log) {
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t parent = getpid();
    pid_ = fork();
    if (pid_ < 0) return false;
    if (pid_ == 0) {
      // Async-signal-safe calls only until execv().
      prctl(PR_SET_PDEATHSIG, SIGTERM);  // the demo dies -> its daemons stop
      if (getppid() != parent) _exit(127);
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      signal(SIGINT, SIG_IGN);  // Ctrl-C goes to the demo, which stops us
      int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        dup2(fd, STDOUT_FILENO);
        dup2(fd, STDERR_FILENO);
      }
      execv(argv[0], argv.data());
      _exit(127);
    }
    return true;
  }

  bool Alive() {
    if (pid_ <= 0) return false;
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return false;
    }
    return true;
  }

  // SIGTERM, then SIGKILL after `grace_ms`.
  void Stop(int64_t grace_ms) {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(grace_ms);
    int status = 0;
    while (waitpid(pid_, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() >= deadline) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
};

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

// A free loopback TCP port (bound and released; fine for a local demo).
int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

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

int RunDemo(CommandEnv& env, const DemoArgs& args) {
  std::ostream& out = *env.out;
  auto start_time = std::chrono::steady_clock::now();
  auto elapsed_s = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_time).count();
  };

  // The spec: the embedded example, with the overrides.
  absl::StatusOr<v1::SweepSpec> spec = ParseSpecYaml(kDemoSweepYaml);
  if (!spec.ok()) return env.Fail(spec.status());
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

  auto scheduler_bin = FindBinary("depthbench-scheduler", "scheduler");
  if (!scheduler_bin.ok()) return env.Fail(scheduler_bin.status());
  auto worker_bin = FindBinary("depthbench-worker", "worker");
  if (!worker_bin.ok()) return env.Fail(worker_bin.status());

  // The work directory.
  bool temp_dir = args.workdir.empty();
  std::string dir = args.workdir;
  if (temp_dir) {
    std::string templ = (fs::temp_directory_path() / "depthbench-demo-XXXXXX").string();
    if (mkdtemp(templ.data()) == nullptr) {
      return env.Fail(absl::InternalError("cannot create a temp directory"));
    }
    dir = templ;
  }
  std::error_code ec;
  fs::create_directories(fs::path(dir) / "checkpoints", ec);
  if (ec) return env.Fail(absl::InvalidArgumentError(absl::StrCat("--workdir ", dir, ": ", ec.message())));
  dir = fs::absolute(dir).string();
  const std::string db = dir + "/demo.sqlite";
  const std::string ckpt_root = dir + "/checkpoints";
  const std::string port_file = dir + "/scheduler.port";
  const std::string web_port_file = dir + "/web.port";
  fs::remove(port_file, ec);
  fs::remove(web_port_file, ec);
  out << "depthbench demo: working in " << dir << "\n";

  // Ctrl-C: stop cleanly (daemons are stopped by the destructors).
  struct sigaction sa {};
  sa.sa_handler = [](int) { g_interrupted = 1; };
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  DemoProcess scheduler;
  if (!scheduler.Start({*scheduler_bin, "--db", db, "--listen", "127.0.0.1:0", "--port-file",
                        port_file, "--web-listen", "127.0.0.1:0", "--web-port-file",
                        web_port_file},
                       dir + "/scheduler.log")) {
    return env.Fail(absl::InternalError("cannot start depthbench-scheduler"));
  }
  int port = 0;
  for (int i = 0; i < 500 && port <= 0; ++i) {
    std::ifstream in(port_file);
    if (!(in >> port)) port = 0;
    if (port > 0) break;
    if (!scheduler.Alive()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (port <= 0) {
    return env.Fail(absl::UnavailableError(absl::StrCat(
        "depthbench-scheduler did not start; see ", dir, "/scheduler.log")));
  }
  const std::string address = absl::StrCat("127.0.0.1:", port);
  out << "scheduler on " << address << " (database " << db << ")\n";
  // The scheduler writes the web port before the gRPC one.
  int web_port = 0;
  if (std::ifstream web_in(web_port_file); !(web_in >> web_port)) web_port = 0;
  if (web_port > 0) {
    out << "web view (sweep, results, live loss curves): http://127.0.0.1:" << web_port
        << "/#/sweep/" << spec->name() << "\n";
  }

  std::vector<std::unique_ptr<DemoProcess>> workers;
  std::vector<std::string> metrics_urls;
  for (int i = 1; i <= 2; ++i) {
    int metrics_port = FreePort();
    std::string metrics = absl::StrCat("127.0.0.1:", metrics_port);
    auto w = std::make_unique<DemoProcess>();
    if (!w->Start({*worker_bin, "--scheduler", address, "--checkpoint-root", ckpt_root,
                   "--slots", "1", "--threads-per-slot", "1", "--name",
                   absl::StrCat("demo-worker-", i), "--metrics-listen", metrics,
                   "--grace-ms", "5000", "--poll-ms", "200"},
                  absl::StrCat(dir, "/worker-", i, ".log"))) {
      return env.Fail(absl::InternalError("cannot start depthbench-worker"));
    }
    workers.push_back(std::move(w));
    metrics_urls.push_back(absl::StrCat("http://", metrics, "/metrics"));
  }
  out << "2 workers (1 slot, 1 thread each); metrics while running: "
      << absl::StrJoin(metrics_urls, ", ") << "\n";

  ClientOptions client_options = env.client;
  client_options.address = address;
  auto client = SchedulerClient::Connect(client_options);
  if (!client.ok()) return env.Fail(client.status());
  v1::SubmitSweepRequest submit;
  *submit.mutable_spec() = *spec;
  v1::SubmitSweepResponse submitted;
  {
    auto ctx = (*client)->Context();
    absl::Status s = FromGrpc((*client)->sweeps()->SubmitSweep(ctx.get(), submit, &submitted));
    if (!s.ok()) return env.Fail(s);
  }
  out << "submitted sweep \"" << spec->name() << "\": " << submitted.sweep().total_jobs()
      << " jobs (" << absl::StrJoin(spec->architectures(), ", ") << " x suite "
      << spec->shapes().suite() << " x " << spec->lr_grids().begin()->second.lrs_size()
      << " LRs, " << spec->training().steps() << " steps)\n";
  out.flush();

  // Progress until the sweep completes.
  const bool tty = &out == &std::cout && isatty(STDOUT_FILENO);
  std::string last_line;
  double last_print = -1e9;
  v1::Sweep sweep;
  while (true) {
    if (g_interrupted) {
      out << "\ninterrupted; stopping the daemons\n";
      return kExitFailure;
    }
    v1::GetSweepRequest req;
    req.set_name(spec->name());
    auto ctx = (*client)->Context();
    absl::Status s = FromGrpc((*client)->sweeps()->GetSweep(ctx.get(), req, &sweep));
    if (s.ok()) {
      std::string line = Counts(sweep);
      double t = elapsed_s();
      if (tty) {
        out << "\r[" << FormatDouble(t, 3) << " s] " << line << "\033[K" << std::flush;
      } else if (line != last_line || t - last_print > 15) {
        out << "[" << static_cast<int64_t>(t) << " s] " << line << "\n" << std::flush;
        last_print = t;
      }
      last_line = line;
      if (sweep.state() != v1::SWEEP_RUNNING) break;
    } else if (!scheduler.Alive()) {
      return env.Fail(absl::UnavailableError(absl::StrCat(
          "the scheduler exited; see ", dir, "/scheduler.log")));
    }
    if (elapsed_s() > static_cast<double>(args.timeout_s)) {
      return env.Fail(absl::DeadlineExceededError(absl::StrCat(
          "the sweep did not finish within ", args.timeout_s, " s; logs in ", dir)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(tty ? 250 : 1000));
  }
  if (tty) out << "\n";

  auto queried = (*client)->QueryResults(spec->name());
  if (!queried.ok()) return env.Fail(queried.status());
  const v1::QueryResultsResponse& results = *queried;
  out << "\nResults: best LR per (arch, shape) by final validation loss (nats/byte); "
         "\"div\" = diverged, \"-\" = no finished run; TOKENS/STEPS: the shape's token "
         "budget (20 per Pre-LN parameter unless the spec fixes the steps), the same for "
         "every design\n";
  ResultsTable(results).Print(out);
  if (AnyLegacy(results)) out << "\n" << kLegacyFootnote << "\n";
  int failed = 0;
  {
    auto it = sweep.job_counts().find("failed");
    if (it != sweep.job_counts().end()) failed = static_cast<int>(it->second);
  }
  if (failed > 0) {
    // One line per distinct (arch, first line of the reason).
    v1::ListJobsRequest lreq;
    lreq.set_sweep(spec->name());
    lreq.set_state(v1::FAILED);
    lreq.set_page_size(1000);
    v1::ListJobsResponse failed_jobs;
    auto ctx = (*client)->Context();
    if ((*client)->sweeps()->ListJobs(ctx.get(), lreq, &failed_jobs).ok()) {
      std::set<std::string> reasons;
      for (const v1::Job& j : failed_jobs.jobs()) {
        std::string reason = j.reason();
        size_t tail = reason.find("; stderr tail:");
        std::string line = reason.substr(0, std::min(reason.find('\n'), tail));
        // The trainer's own error line is the most telling part of the tail.
        size_t err = reason.find("error: ", tail == std::string::npos ? 0 : tail);
        if (err != std::string::npos) {
          line += ": " + reason.substr(err + 7, reason.find('\n', err) - err - 7);
        }
        reasons.insert(absl::StrCat(j.arch(), ": ", line));
      }
      out << "\nFailed runs:\n";
      for (const std::string& r : reasons) out << "  " << r << "\n";
    }
    out << "\n" << failed << " job(s) failed; `depthbench --scheduler " << address
        << " jobs --sweep " << spec->name()
        << " --state failed` lists them while the scheduler runs, "
        << "and their stderr is in " << ckpt_root << "/<sweep>/<job>/attempt-*.stderr.log\n";
  }

  // Stop the workers first (nothing runs now), then the scheduler.
  for (auto& w : workers) w->Stop(15000);
  scheduler.Stop(10000);

  const double wall = elapsed_s();
  const bool keep = args.keep || !temp_dir;
  out << "\nDone in " << FormatDouble(wall, 3) << " s.\n";
  if (keep) {
    out << "  database:    " << db << "  (serve it again: depthbench-scheduler --db " << db
        << " --listen 127.0.0.1:7070; then `depthbench results " << spec->name() << "`)\n"
        << "  checkpoints: " << ckpt_root << "/" << spec->name() << "/<job>/checkpoint.pt\n"
        << "  metrics:     per-step points in the database (table metric_points; "
        << "`depthbench watch JOB`); the workers' Prometheus endpoints (" 
        << absl::StrJoin(metrics_urls, ", ") << ") lived while the demo ran\n"
        << "  logs:        " << dir << "/scheduler.log, " << dir << "/worker-{1,2}.log\n";
  } else {
    fs::remove_all(dir, ec);
    out << "  (the temp directory " << dir << " with the database, checkpoints and logs was "
        << "removed; pass --keep or --workdir DIR to keep them)\n";
  }
  if (g_interrupted) return kExitFailure;
  return kExitOk;
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
