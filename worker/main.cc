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

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <thread>

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/daemon_metrics.h"
#include "common/fd_limit_log.h"
#include "common/shutdown_signals.h"
#include "common/grpc_client.h"
#include "common/metrics.h"
#include "common/metrics_http_server.h"
#include "worker/host_info.h"
#include "worker/scheduler_client.h"
#include "worker/worker.h"

namespace {

constexpr char kVersion[] = "0.1.0";

struct Flags {
  std::string scheduler, checkpoint_root, metrics_listen, labels_text, token_file, tls_ca,
      train_binary, name;
  int slots = 0, threads_per_slot = 0;
  int64_t grace_ms = 10000, poll_ms = 500, rpc_timeout_ms = 10000;
  int64_t attempt_log_max_bytes = 64 * 1024 * 1024;
  bool verbose = false;
};

void AddFlags(CLI::App& app, Flags& f) {
  app.add_option("--scheduler", f.scheduler, "scheduler address HOST:PORT")->required();
  app.add_option("--checkpoint-root", f.checkpoint_root,
                 "directory shared by the workers; each job runs in <root>/<sweep>/<job>")
      ->required();
  app.add_option("--slots", f.slots,
                 "concurrent jobs (default: one per GPU, else 1)")->check(CLI::PositiveNumber);
  app.add_option("--threads-per-slot", f.threads_per_slot,
                 "LibTorch threads per job (CPU default: cores / slots)")
      ->check(CLI::PositiveNumber);
  app.add_option("--metrics-listen", f.metrics_listen,
                 "serve /metrics, /healthz, /readyz on HOST:PORT");
  app.add_option("--labels", f.labels_text, "worker labels k=v,... (matched by sweep resources)");
  app.add_option("--auth-token-file", f.token_file,
                 "file holding the scheduler's shared token (sent as a Bearer token)")
      ->check(CLI::ExistingFile);
  app.add_option("--tls-ca", f.tls_ca,
                 "PEM root certificate(s): connect to the scheduler with TLS, trusting them "
                 "(for a scheduler started with --tls-cert/--tls-key; the certificate must "
                 "name the --scheduler host)")
      ->check(CLI::ExistingFile);
  app.add_option("--train-binary", f.train_binary,
                 "depthbench-train to run (default: next to this binary, the build tree, PATH)");
  app.add_option("--name", f.name, "worker id, stable across restarts (default: hostname)");
  app.add_option("--grace-ms", f.grace_ms, "SIGTERM -> SIGKILL grace period for a stopped job")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--poll-ms", f.poll_ms, "AcquireJob polling interval while idle")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--rpc-timeout-ms", f.rpc_timeout_ms, "deadline of each scheduler RPC")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--attempt-log-max-bytes", f.attempt_log_max_bytes,
                 "cap of each attempt's stderr log and events log in the run directory")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_flag("-v,--verbose", f.verbose, "debug logging");
}

// The flags and this host (GPUs, cores, memory) as WorkerOptions; the
// checkpoint root is created.
absl::StatusOr<depthbench::worker::WorkerOptions> WorkerOptionsFrom(const Flags& f) {
  namespace worker = depthbench::worker;
  worker::WorkerOptions options;
  options.name = f.name.empty() ? worker::HostName() : f.name;
  options.gpus = worker::CountCudaGpus();
  options.slots = f.slots > 0 ? f.slots : std::max(1, options.gpus);
  if (f.threads_per_slot > 0) {
    options.threads_per_slot = f.threads_per_slot;
  } else if (options.gpus == 0) {
    int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    options.threads_per_slot = std::max(1, cores / options.slots);
  }
  options.memory_mb = worker::PhysicalMemoryMb();
  options.grace_ms = f.grace_ms;
  options.acquire_poll_ms = f.poll_ms;
  options.attempt_log_max_bytes = f.attempt_log_max_bytes;
  auto labels = worker::ParseLabels(f.labels_text);
  if (!labels.ok()) return labels.status();
  options.labels = *labels;
  auto binary = worker::FindTrainBinary(f.train_binary);
  if (!binary.ok()) return binary.status();
  options.train_binary = *binary;
  std::error_code ec;
  std::filesystem::create_directories(f.checkpoint_root, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("--checkpoint-root ", f.checkpoint_root, ": ", ec.message()));
  }
  options.checkpoint_root = std::filesystem::absolute(f.checkpoint_root).string();
  return options;
}

// The scheduler's address, deadline, token and TLS roots from the flags.
absl::StatusOr<depthbench::worker::SchedulerClientOptions> ClientOptionsFrom(const Flags& f) {
  depthbench::worker::SchedulerClientOptions client_options;
  client_options.address = f.scheduler;
  client_options.rpc_timeout_ms = f.rpc_timeout_ms;
  if (!f.token_file.empty()) {
    absl::StatusOr<std::string> token = depthbench::ReadTokenFile("--auth-token-file", f.token_file);
    if (!token.ok() || token->empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--auth-token-file: cannot read a token from ", f.token_file));
    }
    client_options.token = *token;
  }
  if (!f.tls_ca.empty()) {
    absl::StatusOr<std::string> pem = depthbench::ReadPemCertificates("--tls-ca", f.tls_ca);
    if (!pem.ok()) return pem.status();
    client_options.tls_ca_pem = *pem;
  }
  return client_options;
}

// /metrics, /healthz and /readyz (ready once registered) on --metrics-listen.
absl::StatusOr<std::unique_ptr<depthbench::MetricsHttpServer>> StartMetricsHttp(
    const std::string& listen, depthbench::MetricsRegistry* registry,
    std::atomic<depthbench::worker::Worker*>* daemon_ptr) {
  depthbench::MetricsHttpServerOptions http_options;
  http_options.listen = listen;
  auto started = depthbench::MetricsHttpServer::Start(http_options, registry, [daemon_ptr]() {
    depthbench::worker::Worker* w = daemon_ptr->load();
    if (w == nullptr || w->last_heartbeat_ms() == 0) {
      return absl::UnavailableError("not registered with the scheduler yet");
    }
    return absl::OkStatus();
  });
  if (started.ok()) {
    spdlog::info("metrics on http://{}/metrics", (*started)->bound_address().ToString());
  }
  return started;
}

int Usage(const absl::Status& status) {
  std::fprintf(stderr, "error: %s\n", std::string(status.message()).c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace depthbench;
  CLI::App app{"depthbench-worker: runs depthbench-train jobs leased from a depthbench-scheduler"};
  Flags flags;
  AddFlags(app, flags);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  if (flags.verbose) spdlog::set_level(spdlog::level::debug);
  // Block SIGINT/SIGTERM before anything an outsider can observe (the raised
  // descriptor limit, the log): from then on a stop request is a clean
  // shutdown, never death by the default action.
  sigset_t signals = depthbench::BlockShutdownSignals();
  // Descriptors: the metrics endpoint, scheduler channels and each child's
  // pipes and logs must not hit the soft default while the hard limit allows
  // more.
  depthbench::RaiseFdLimitAndLog();
  absl::StatusOr<worker::WorkerOptions> options = WorkerOptionsFrom(flags);
  if (!options.ok()) return Usage(options.status());
  absl::StatusOr<worker::SchedulerClientOptions> client_options = ClientOptionsFrom(flags);
  if (!client_options.ok()) return Usage(client_options.status());

  signal(SIGPIPE, SIG_IGN);  // a closed pipe from a dying child is an error return, not death

  Clock* clock = RealClock::Default();
  worker::SchedulerClient client(*client_options);
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
  daemon = std::make_unique<worker::Worker>(*options, &client, clock, &*metrics);
  daemon_ptr.store(daemon.get());

  std::unique_ptr<MetricsHttpServer> http;
  if (!flags.metrics_listen.empty()) {
    auto started = StartMetricsHttp(flags.metrics_listen, &registry, &daemon_ptr);
    if (!started.ok()) {
      std::fprintf(stderr, "error: --metrics-listen: %s\n", started.status().ToString().c_str());
      return started.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
    }
    http = std::move(*started);
  }

  spdlog::info("worker \"{}\": scheduler {}, {} slot(s), {} thread(s)/slot, {} GPU(s), root {}, "
               "trainer {}",
               options->name, flags.scheduler, options->slots, options->threads_per_slot,
               options->gpus, options->checkpoint_root, options->train_binary);
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
