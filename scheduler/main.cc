// depthbench-scheduler: the scheduler daemon.
//   depthbench-scheduler --db PATH --listen HOST:PORT
//     [--metrics-listen H:P [--metrics-port-file F]]
//     [--web-listen H:P [--web-port-file F]]
//     [--auth-token-file F] [--tls-cert F --tls-key F] [--port-file F]
//     [--lease-ttl-ms N] [--heartbeat-interval-ms N] [--durability normal|full]
// With --metrics-listen, serves /metrics, /healthz and /readyz there
// (common/metrics_http_server.h); --metrics-port-file gets the bound port
// before --port-file gets the gRPC one.
// With --web-listen, serves the web view (scheduler/web_api.h, docs/WEB.md):
// HTTPS with --tls-cert/--tls-key, the token of --auth-token-file required by
// its JSON endpoints; --web-port-file gets its port before --port-file too.
// --durability (README.md "The database"): normal (synchronous=NORMAL, the
// default) keeps every commit through a crash of the process but can lose
// the last commits on a power loss; full (synchronous=FULL) fsyncs each
// commit. bench/RESULTS.md has what full costs in leases/s.
// Exit codes: 0 clean shutdown (SIGINT/SIGTERM), 2 bad usage, 1 other.
#include <csignal>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include <CLI/CLI.hpp>

#include "absl/synchronization/mutex.h"
#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/daemon_metrics.h"
#include "common/file_util.h"
#include "common/fd_limit_log.h"
#include "common/shutdown_signals.h"
#include "common/metrics.h"
#include "common/metrics_http_server.h"
#include "common/status_macros.h"
#include "scheduler/scheduler.h"
#include "scheduler/scheduler_metrics.h"
#include "scheduler/server.h"
#include "scheduler/web_api.h"
#include "scheduler/web_server.h"

#ifndef DEPTHBENCH_VERSION
#define DEPTHBENCH_VERSION "unknown"
#endif

namespace {

// Writes "PORT\n" to `path` atomically (write + rename).
void WritePortFile(const std::string& path, int port) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << port << "\n";
  }
  std::rename(tmp.c_str(), path.c_str());
}

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

struct Flags {
  std::string db_path, listen = "127.0.0.1:7070", metrics_listen, token_file, tls_cert, tls_key,
              port_file, metrics_port_file, web_listen, web_port_file;
  int64_t lease_ttl_ms = 30000, heartbeat_ms = 0;
  std::string durability = "normal";
};

void AddFlags(CLI::App& app, Flags* f) {
  app.add_option("--db", f->db_path, "SQLite file (created and migrated if needed)")->required();
  app.add_option("--listen", f->listen, "gRPC address HOST:PORT (port 0 picks a free port)")
      ->capture_default_str();
  app.add_option("--metrics-listen", f->metrics_listen,
                 "serve Prometheus /metrics, /healthz and /readyz on HOST:PORT (port 0 picks "
                 "a free port)");
  app.add_option("--metrics-port-file", f->metrics_port_file,
                 "write the bound metrics port to this file once serving")
      ->needs("--metrics-listen");
  app.add_option("--web-listen", f->web_listen,
                 "serve the web view (sweeps, results, live curves; docs/WEB.md) on HOST:PORT "
                 "(port 0 picks a free port); HTTPS with --tls-cert, token of --auth-token-file");
  app.add_option("--web-port-file", f->web_port_file,
                 "write the bound web view port to this file once serving")
      ->needs("--web-listen");
  app.add_option("--auth-token-file", f->token_file,
                 "file holding a shared token; clients must send 'authorization: Bearer TOKEN'")
      ->check(CLI::ExistingFile);
  app.add_option("--tls-cert", f->tls_cert, "PEM certificate chain (TLS with --tls-key)")
      ->check(CLI::ExistingFile);
  app.add_option("--tls-key", f->tls_key, "PEM private key (TLS with --tls-cert)")
      ->check(CLI::ExistingFile);
  app.add_option("--port-file", f->port_file, "write the bound port to this file once listening");
  app.add_option("--lease-ttl-ms", f->lease_ttl_ms, "lease time-to-live renewed by heartbeats")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--heartbeat-interval-ms", f->heartbeat_ms,
                 "heartbeat interval told to workers (default: TTL / 3)")
      ->check(CLI::PositiveNumber);
  app.add_option("--durability", f->durability,
                 "normal: commits survive a crash of this process, the last ones may be lost "
                 "on power loss; full: fsync every commit (survives power loss, fewer leases/s)")
      ->capture_default_str();
}

// The token and TLS files into `options`; false (after an error on stderr)
// when one cannot be read or the token is empty.
bool LoadSecrets(const Flags& f, depthbench::scheduler::ServerOptions* options) {
  if (f.tls_cert.empty() != f.tls_key.empty()) {
    std::fprintf(stderr, "error: --tls-cert and --tls-key must be given together\n");
    return false;
  }
  if (!f.token_file.empty()) {
    if (!depthbench::ReadWholeFile(f.token_file, &options->auth_token)) {
      std::fprintf(stderr, "error: --auth-token-file: cannot read %s\n", f.token_file.c_str());
      return false;
    }
    options->auth_token = Trim(options->auth_token);
    if (options->auth_token.empty()) {
      std::fprintf(stderr, "error: --auth-token-file: %s is empty\n", f.token_file.c_str());
      return false;
    }
  }
  if (!f.tls_cert.empty() && (!depthbench::ReadWholeFile(f.tls_cert, &options->tls_cert_pem) ||
                              !depthbench::ReadWholeFile(f.tls_key, &options->tls_key_pem))) {
    std::fprintf(stderr, "error: cannot read --tls-cert/--tls-key\n");
    return false;
  }
  return true;
}

// false (after an error on stderr) for an unknown --durability.
bool SchedulerOptionsFrom(const Flags& f, depthbench::scheduler::SchedulerObserver* observer,
                          depthbench::scheduler::SchedulerOptions* options) {
  absl::StatusOr<depthbench::storage::Durability> durability =
      depthbench::storage::ParseDurability(f.durability, "--durability");
  if (!durability.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(durability.status().message()).c_str());
    return false;
  }
  options->durability = *durability;
  options->observer = observer;
  options->lease_ttl_ms = f.lease_ttl_ms;
  options->heartbeat_interval_ms =
      f.heartbeat_ms > 0 ? f.heartbeat_ms : std::max<int64_t>(1, f.lease_ttl_ms / 3);
  return true;
}

// /metrics, /healthz and /readyz (ready: the database is, and the gRPC
// port still accepts).
absl::StatusOr<std::unique_ptr<depthbench::MetricsHttpServer>> StartMetricsHttp(
    const Flags& f, depthbench::MetricsRegistry* registry,
    depthbench::scheduler::SchedulerScrapeSource* source,
    depthbench::scheduler::SchedulerServer* server) {
  depthbench::MetricsHttpServerOptions http_options;
  http_options.listen = f.metrics_listen;
  ASSIGN_OR_RETURN(std::unique_ptr<depthbench::MetricsHttpServer> http,
                   depthbench::MetricsHttpServer::Start(
                       http_options, registry, [source, server]() -> absl::Status {
                         absl::Status db = source->CheckReady();
                         if (!db.ok()) return db;
                         return server->CheckAccepting(1000);
                       }));
  std::fprintf(stderr, "metrics on http://%s/metrics\n", http->bound_address().ToString().c_str());
  if (!f.metrics_port_file.empty()) WritePortFile(f.metrics_port_file, http->port());
  return http;
}

absl::StatusOr<std::unique_ptr<depthbench::scheduler::WebServer>> StartWeb(
    const Flags& f, const depthbench::scheduler::ServerOptions& server_options,
    depthbench::scheduler::WebApi* api) {
  depthbench::scheduler::WebServerOptions web_options;
  web_options.listen = f.web_listen;
  web_options.tls_cert_pem = server_options.tls_cert_pem;
  web_options.tls_key_pem = server_options.tls_key_pem;
  ASSIGN_OR_RETURN(std::unique_ptr<depthbench::scheduler::WebServer> web,
                   depthbench::scheduler::WebServer::Start(
                       web_options, [api](const depthbench::scheduler::WebRequest& r) {
                         return api->Handle(r);
                       }));
  std::fprintf(stderr, "web view on %s\n", web->url().c_str());
  if (!f.web_port_file.empty()) WritePortFile(f.web_port_file, web->port());
  return web;
}

// The optional HTTP endpoints: /metrics (with --metrics-listen) and the web
// view (with --web-listen).
struct Endpoints {
  std::unique_ptr<depthbench::MetricsHttpServer> http;
  std::unique_ptr<depthbench::scheduler::WebApi> web_api;
  std::unique_ptr<depthbench::scheduler::WebServer> web;
  void Stop() {
    if (web != nullptr) web->Stop();
    if (http != nullptr) http->Stop();
  }
};

// false (after an error on stderr, the endpoints and `server` stopped) when
// one cannot start.
bool StartEndpoints(const Flags& f, const depthbench::scheduler::ServerOptions& server_options,
                    depthbench::MetricsRegistry* registry,
                    depthbench::scheduler::SchedulerScrapeSource* source,
                    depthbench::scheduler::Scheduler* scheduler,
                    depthbench::scheduler::SchedulerServer* server, Endpoints* out) {
  if (!f.metrics_listen.empty()) {
    auto http_started = StartMetricsHttp(f, registry, source, server);
    if (!http_started.ok()) {
      std::fprintf(stderr, "error: --metrics-listen: %s\n",
                   http_started.status().ToString().c_str());
      server->Shutdown();
      return false;
    }
    out->http = std::move(http_started).value();
  }
  if (!f.web_listen.empty()) {
    out->web_api = std::make_unique<depthbench::scheduler::WebApi>(
        scheduler, depthbench::RealClock::Default(), server_options.auth_token);
    auto web_started = StartWeb(f, server_options, out->web_api.get());
    if (!web_started.ok()) {
      std::fprintf(stderr, "error: --web-listen: %s\n", web_started.status().ToString().c_str());
      out->Stop();
      server->Shutdown();
      return false;
    }
    out->web = std::move(web_started).value();
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"depthbench-scheduler: runs DepthBench sweeps (SweepService + WorkerService over gRPC)"};
  Flags f;
  AddFlags(app, &f);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  // Debian builds Abseil with mutex deadlock detection on; it costs CPU on
  // every lock and the scheduler has one lock order.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // SIGINT/SIGTERM blocked before anything an outsider can observe (the
  // raised descriptor limit, the port file): a stop is then always clean.
  const sigset_t signals = depthbench::BlockShutdownSignals();
  // One EMFILE stops gRPC's listener for good: use every descriptor the
  // hard limit allows (the metrics endpoint caps its own connections).
  depthbench::RaiseFdLimitAndLog();
  depthbench::scheduler::ServerOptions server_options;
  server_options.listen = f.listen;
  if (!LoadSecrets(f, &server_options)) return 2;

  // Metrics: the registry and the observer exist even without
  // --metrics-listen (updates are cheap atomics); the HTTP endpoint only
  // with it.
  depthbench::MetricsRegistry registry;
  depthbench::scheduler::SchedulerScrapeSource source;
  depthbench::CollectCallback jobs_by_sweep_and_state = [&source] {
    return source.JobsBySweepAndState();
  };
  absl::StatusOr<depthbench::SchedulerMetrics> metrics = depthbench::RegisterSchedulerMetrics(
      &registry, DEPTHBENCH_VERSION, std::move(jobs_by_sweep_and_state));
  if (!metrics.ok()) {
    std::fprintf(stderr, "error: %s\n", metrics.status().ToString().c_str());
    return 1;
  }
  depthbench::scheduler::SchedulerMetricsObserver observer(*metrics);
  server_options.rpc_observer = [m = *metrics](const std::string& method,
                                               const std::string& code, double seconds) {
    m.RecordRpc(method, code, seconds);
  };

  depthbench::scheduler::SchedulerOptions options;
  if (!SchedulerOptionsFrom(f, &observer, &options)) return 2;
  auto scheduler = depthbench::scheduler::Scheduler::Open(
      f.db_path, depthbench::RealClock::Default(), options);
  if (!scheduler.ok()) {
    std::fprintf(stderr, "error: %s\n", scheduler.status().ToString().c_str());
    return 1;
  }
  source.Attach(scheduler->get());
  server_options.expiry_interval_ms = std::min<int64_t>(200, std::max<int64_t>(10, f.lease_ttl_ms / 10));
  depthbench::scheduler::SchedulerServer server(scheduler->get(), server_options);
  absl::Status started = server.Start();
  if (!started.ok()) {
    std::fprintf(stderr, "error: %s\n", started.ToString().c_str());
    return 1;
  }
  Endpoints endpoints;
  if (!StartEndpoints(f, server_options, &registry, &source, scheduler->get(), &server,
                      &endpoints)) {
    return 1;
  }
  std::fprintf(stderr, "listening on %s\n", server.address().c_str());
  std::fflush(stderr);
  if (!f.port_file.empty()) WritePortFile(f.port_file, server.port());
  int sig = 0;
  sigwait(&signals, &sig);
  spdlog::info("signal {}: shutting down", sig);
  // Stop scraping first: /readyz probes the gRPC server, and the scheduler
  // and the registry go after it.
  endpoints.Stop();
  server.Shutdown();
  return 0;
}
