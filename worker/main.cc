// depthbench-worker: runs DepthBench jobs for a depthbench-scheduler.
//   depthbench-worker --scheduler HOST:PORT --checkpoint-root DIR [--slots N]
//     [--threads-per-slot N] [--metrics-listen HOST:PORT] [--labels k=v,...]
//     [--auth-token-file F] [--tls-ca F] [--train-binary PATH] [--name NAME]
//     [--grace-ms N] [--poll-ms N] [--attempt-log-max-bytes N]
// SIGTERM/SIGINT: stop taking jobs, interrupt the children (they checkpoint
// and exit 4), report them INTERRUPTED, exit 0.
// Exit codes: 0 clean shutdown, 2 bad usage, 1 other (e.g. the scheduler
// refused the registration permanently).
#include <signal.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include "common/clock.h"
#include "common/daemon_metrics.h"
#include "common/fd_limit.h"
#include "common/metrics.h"
#include "common/metrics_http_server.h"
#include "worker/host_info.h"
#include "worker/scheduler_client.h"
#include "worker/worker.h"

namespace {

constexpr char kVersion[] = "0.1.0";

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::stringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return true;
}

bool ReadToken(const std::string& path, std::string* out) {
  if (!ReadFile(path, out)) return false;
  while (!out->empty() && (out->back() == '\n' || out->back() == '\r' || out->back() == ' ')) {
    out->pop_back();
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace depthbench;
  CLI::App app{"depthbench-worker: runs depthbench-train jobs leased from a depthbench-scheduler"};
  std::string scheduler, checkpoint_root, metrics_listen, labels_text, token_file, tls_ca,
      train_binary, name;
  int slots = 0, threads_per_slot = 0;
  int64_t grace_ms = 10000, poll_ms = 500, rpc_timeout_ms = 10000;
  int64_t attempt_log_max_bytes = 64 * 1024 * 1024;
  bool verbose = false;
  app.add_option("--scheduler", scheduler, "scheduler address HOST:PORT")->required();
  app.add_option("--checkpoint-root", checkpoint_root,
                 "directory shared by the workers; each job runs in <root>/<sweep>/<job>")
      ->required();
  app.add_option("--slots", slots,
                 "concurrent jobs (default: one per GPU, else 1)")->check(CLI::PositiveNumber);
  app.add_option("--threads-per-slot", threads_per_slot,
                 "LibTorch threads per job (CPU default: cores / slots)")
      ->check(CLI::PositiveNumber);
  app.add_option("--metrics-listen", metrics_listen,
                 "serve /metrics, /healthz, /readyz on HOST:PORT");
  app.add_option("--labels", labels_text, "worker labels k=v,... (matched by sweep resources)");
  app.add_option("--auth-token-file", token_file,
                 "file holding the scheduler's shared token (sent as a Bearer token)")
      ->check(CLI::ExistingFile);
  app.add_option("--tls-ca", tls_ca,
                 "PEM root certificate(s): connect to the scheduler with TLS, trusting them "
                 "(for a scheduler started with --tls-cert/--tls-key; the certificate must "
                 "name the --scheduler host)")
      ->check(CLI::ExistingFile);
  app.add_option("--train-binary", train_binary,
                 "depthbench-train to run (default: next to this binary, the build tree, PATH)");
  app.add_option("--name", name, "worker id, stable across restarts (default: hostname)");
  app.add_option("--grace-ms", grace_ms, "SIGTERM -> SIGKILL grace period for a stopped job")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--poll-ms", poll_ms, "AcquireJob polling interval while idle")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--rpc-timeout-ms", rpc_timeout_ms, "deadline of each scheduler RPC")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--attempt-log-max-bytes", attempt_log_max_bytes,
                 "cap of each attempt's stderr log and events log in the run directory")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_flag("-v,--verbose", verbose, "debug logging");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  if (verbose) spdlog::set_level(spdlog::level::debug);
  // Descriptors: the metrics endpoint, scheduler channels and each child's
  // pipes and logs must not hit the soft default while the hard limit
  // allows more.
  if (absl::StatusOr<FdLimit> fds = RaiseFdLimit(); fds.ok()) {
    if (fds->soft != fds->previous_soft) {
      spdlog::info("open-file limit raised from {} to {}", fds->previous_soft, fds->soft);
    }
  } else {
    spdlog::warn("{}", fds.status().ToString());
  }

  worker::WorkerOptions options;
  options.name = name.empty() ? worker::HostName() : name;
  options.gpus = worker::CountCudaGpus();
  options.slots = slots > 0 ? slots : std::max(1, options.gpus);
  if (threads_per_slot > 0) {
    options.threads_per_slot = threads_per_slot;
  } else if (options.gpus == 0) {
    int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    options.threads_per_slot = std::max(1, cores / options.slots);
  }
  options.memory_mb = worker::PhysicalMemoryMb();
  options.grace_ms = grace_ms;
  options.acquire_poll_ms = poll_ms;
  options.attempt_log_max_bytes = attempt_log_max_bytes;
  auto labels = worker::ParseLabels(labels_text);
  if (!labels.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(labels.status().message()).c_str());
    return 2;
  }
  options.labels = *labels;
  auto binary = worker::FindTrainBinary(train_binary);
  if (!binary.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(binary.status().message()).c_str());
    return 2;
  }
  options.train_binary = *binary;
  std::error_code ec;
  std::filesystem::create_directories(checkpoint_root, ec);
  if (ec) {
    std::fprintf(stderr, "error: --checkpoint-root %s: %s\n", checkpoint_root.c_str(),
                 ec.message().c_str());
    return 2;
  }
  options.checkpoint_root = std::filesystem::absolute(checkpoint_root).string();

  worker::SchedulerClientOptions client_options;
  client_options.address = scheduler;
  client_options.rpc_timeout_ms = rpc_timeout_ms;
  if (!token_file.empty()) {
    if (!ReadToken(token_file, &client_options.token) || client_options.token.empty()) {
      std::fprintf(stderr, "error: --auth-token-file: cannot read a token from %s\n",
                   token_file.c_str());
      return 2;
    }
  }
  if (!tls_ca.empty() &&
      (!ReadFile(tls_ca, &client_options.tls_ca_pem) ||
       client_options.tls_ca_pem.find("-----BEGIN CERTIFICATE-----") == std::string::npos)) {
    std::fprintf(stderr, "error: --tls-ca: %s holds no PEM certificate\n", tls_ca.c_str());
    return 2;
  }

  // Block the shutdown signals in every thread (children get an empty mask
  // back in ChildProcess::Spawn); a dedicated thread waits for them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  Clock* clock = RealClock::Default();
  worker::SchedulerClient client(client_options);
  MetricsRegistry registry;
  std::unique_ptr<worker::Worker> daemon;
  std::atomic<worker::Worker*> daemon_ptr{nullptr};
  auto metrics = RegisterWorkerMetrics(&registry, kVersion, [&daemon_ptr, clock]() -> double {
    worker::Worker* w = daemon_ptr.load();
    if (w == nullptr || w->last_heartbeat_ms() == 0) return 0.0;
    return static_cast<double>(clock->NowMonotonicMs() - w->last_heartbeat_ms()) / 1000.0;
  });
  if (!metrics.ok()) {
    std::fprintf(stderr, "error: %s\n", metrics.status().ToString().c_str());
    return 1;
  }
  daemon = std::make_unique<worker::Worker>(options, &client, clock, &*metrics);
  daemon_ptr.store(daemon.get());

  std::unique_ptr<MetricsHttpServer> http;
  if (!metrics_listen.empty()) {
    MetricsHttpServerOptions http_options;
    http_options.listen = metrics_listen;
    auto started = MetricsHttpServer::Start(http_options, &registry, [&daemon_ptr]() {
      worker::Worker* w = daemon_ptr.load();
      if (w == nullptr || w->last_heartbeat_ms() == 0) {
        return absl::UnavailableError("not registered with the scheduler yet");
      }
      return absl::OkStatus();
    });
    if (!started.ok()) {
      std::fprintf(stderr, "error: --metrics-listen: %s\n", started.status().ToString().c_str());
      return started.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
    }
    http = std::move(*started);
    spdlog::info("metrics on http://{}/metrics", http->bound_address().ToString());
  }

  spdlog::info("worker \"{}\": scheduler {}, {} slot(s), {} thread(s)/slot, {} GPU(s), root {}, "
               "trainer {}",
               options.name, scheduler, options.slots, options.threads_per_slot, options.gpus,
               options.checkpoint_root, options.train_binary);
  std::thread signal_thread([&signals, &daemon] {
    int sig = 0;
    sigwait(&signals, &sig);
    if (sig != 0) spdlog::info("signal {}: stopping", sig);
    daemon->Shutdown();
  });
  absl::Status run = daemon->Run();
  // Wake the signal thread if Run() ended on its own (a registration error).
  if (!run.ok()) kill(getpid(), SIGTERM);
  signal_thread.join();
  if (http) http->Stop();
  daemon_ptr.store(nullptr);
  daemon.reset();
  if (!run.ok()) {
    spdlog::error("{}", run.ToString());
    return 1;
  }
  return 0;
}
