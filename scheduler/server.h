// Hosts the Scheduler behind a gRPC server (both services, optional bearer
// token and TLS) plus a ticker thread that expires leases. Used by the
// depthbench-scheduler binary and in-process by the benchmark.
//
// The server also answers the standard gRPC health service
// (grpc.health.v1.Health/Check, no token needed), which CheckAccepting()
// calls over a fresh connection: a listener that stopped accepting (gRPC
// 1.51 gives up on its listening socket after one failed accept(), e.g.
// EMFILE) makes it fail, so readiness can say so.
//
// Thread safety: Start/Shutdown from one thread; the server's handlers run
// on gRPC's pool. Ownership: borrows the Scheduler (must outlive this).
#ifndef DEPTHBENCH_SCHEDULER_SERVER_H_
#define DEPTHBENCH_SCHEDULER_SERVER_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "scheduler/grpc_services.h"
#include "scheduler/rpc_metrics_interceptor.h"
#include "scheduler/scheduler.h"

namespace depthbench::scheduler {

struct ServerOptions {
  std::string listen = "127.0.0.1:7070";  // port 0 picks a free port
  std::string auth_token;                 // empty: no token required
  std::string tls_cert_pem;               // both set: TLS
  std::string tls_key_pem;
  int64_t expiry_interval_ms = 200;       // how often leases are checked
  int max_idle_threads = 64;              // gRPC sync-server pollers kept idle
  // Told about every finished RPC (rpc_metrics_interceptor.h); null: none.
  RpcObserver rpc_observer;
};

class SchedulerServer {
 public:
  SchedulerServer(Scheduler* scheduler, ServerOptions options);
  ~SchedulerServer();
  SchedulerServer(const SchedulerServer&) = delete;
  SchedulerServer& operator=(const SchedulerServer&) = delete;

  // Binds and starts serving; Unavailable when the address cannot be bound.
  absl::Status Start();
  int port() const { return port_; }
  // "host:port" with the bound port.
  std::string address() const;
  void Wait();
  void Shutdown();

  // OK if a new connection to the bound port is accepted and answered
  // within `timeout_ms`; Unavailable (saying so) otherwise. Makes one
  // short-lived connection; safe from any thread after Start().
  absl::Status CheckAccepting(int64_t timeout_ms) const;

 private:
  Scheduler* scheduler_;
  ServerOptions options_;
  SweepServiceImpl sweep_service_;
  WorkerServiceImpl worker_service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  absl::Notification stop_;
  std::thread ticker_;
};

}  // namespace depthbench::scheduler

#endif  // DEPTHBENCH_SCHEDULER_SERVER_H_
