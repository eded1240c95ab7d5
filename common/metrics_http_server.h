// The daemons' monitoring HTTP endpoint (Boost.Beast over Asio):
//
//   GET /metrics  200, MetricsRegistry::Render(), Content-Type
//                 "text/plain; version=0.0.4; charset=utf-8"
//   GET /healthz  200 "ok\n" while the process serves HTTP (liveness)
//   GET /readyz   200 "ready\n" if the readiness check returns OK (or none was
//                 given), else 503 with the status message (readiness)
//   HEAD on these paths: same status and headers, no body
//   other methods on these paths: 405; any other path: 404
//
// Query strings are ignored ("/metrics?x=1" is "/metrics"). Connections are
// HTTP/1.1 keep-alive; a request must arrive within `io_timeout_ms` and its
// headers may not exceed 8 KiB (no request bodies are accepted). At most
// `max_connections` are kept open: a new one closes the oldest, so idle
// clients can neither lock out a scrape nor use up the process's file
// descriptors (which the daemon's gRPC listener needs too).
//
//   MetricsHttpServerOptions options;
//   options.listen = "0.0.0.0:9100";
//   ASSIGN_OR_RETURN(std::unique_ptr<MetricsHttpServer> http,
//       MetricsHttpServer::Start(options, &registry,
//                                [&] { return db.CheckMigrated(); }));
//   LOG << "metrics on " << http->bound_address().ToString();
//   ...
//   http->Stop();  // or let the destructor do it
//
// Thread safety: Start() returns a running server whose own threads serve
// requests; port(), bound_address() and Stop() are safe from any thread.
// The readiness check and the registry's collect callbacks run on a server
// thread, possibly concurrently with the daemon's threads (never with each
// other when num_threads == 1).
// Ownership: the server does not own `registry`; it must outlive the server
// (more precisely, Stop()). Beast/Asio types stay in the .cc file, so
// including this header is cheap.
#ifndef DEPTHBENCH_COMMON_METRICS_HTTP_SERVER_H_
#define DEPTHBENCH_COMMON_METRICS_HTTP_SERVER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/base/thread_annotations.h"
#include "common/host_port.h"
#include "common/metrics.h"

namespace depthbench {

struct MetricsHttpServerOptions {
  // HOST:PORT to bind (common/host_port.h syntax); port 0 picks a free port,
  // reported by port() / bound_address().
  std::string listen = "127.0.0.1:0";
  // Threads serving connections.
  int num_threads = 1;
  // A connection idle (or a request/response not progressing) this long is
  // closed.
  int64_t io_timeout_ms = 10'000;
  // Open connections kept; must be positive.
  int max_connections = 64;
};

class MetricsHttpServer {
 public:
  // Readiness for /readyz: OK means ready; anything else is "not ready" and
  // its message goes into the 503 body. Must be quick and thread-safe.
  using ReadinessCheck = std::function<absl::Status()>;

  // Binds, listens and starts serving. InvalidArgument for a bad `listen`
  // or options; Unavailable if the address cannot be resolved or bound.
  // `readiness` may be null (always ready).
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const MetricsHttpServerOptions& options, const MetricsRegistry* registry,
      ReadinessCheck readiness = nullptr);

  ~MetricsHttpServer();  // Stop()
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  // The bound port (the real one when options.listen asked for port 0).
  uint16_t port() const;
  // The bound address, e.g. {"127.0.0.1", 40123}.
  HostPort bound_address() const;

  // Stops accepting, closes open connections and joins the server threads.
  // Idempotent. Must not be called from a readiness check or collect
  // callback (it would wait for its own thread).
  void Stop();

 private:
  class Impl;
  explicit MetricsHttpServer(std::unique_ptr<Impl> impl);

  const HostPort bound_;  // immutable after Start()
  absl::Mutex mu_;
  std::unique_ptr<Impl> impl_ ABSL_GUARDED_BY(mu_);  // null once stopped
};

}  // namespace depthbench

#endif  // DEPTHBENCH_COMMON_METRICS_HTTP_SERVER_H_
