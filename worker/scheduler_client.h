// The worker's side of WorkerService: one channel to the scheduler (TLS when
// root certificates are given), a deadline on every call, the bearer token
// on every call, grpc::Status converted to absl::Status (same codes) at
// this edge.
//
// gRPC reconnects the channel by itself after the scheduler restarts; the
// callers (Worker, MetricRelay) retry UNAVAILABLE / DEADLINE_EXCEEDED with
// backoff and re-register on NOT_FOUND.
//
// Thread safety: every method may be called concurrently (the stub is
// thread-safe; the object is immutable after construction). Ownership: owns
// the channel.
#ifndef DEPTHBENCH_WORKER_SCHEDULER_CLIENT_H_
#define DEPTHBENCH_WORKER_SCHEDULER_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "depthbench/v1/worker_service.grpc.pb.h"

namespace depthbench::worker {

struct SchedulerClientOptions {
  std::string address;   // HOST:PORT
  std::string token;     // empty: no authorization metadata
  int64_t rpc_timeout_ms = 10000;
  // PEM root certificates the scheduler's TLS certificate must chain to;
  // empty: a plaintext channel.
  std::string tls_ca_pem;
};

// True for errors worth retrying with the same request (scheduler down or
// slow): UNAVAILABLE, DEADLINE_EXCEEDED, and the transient ones.
bool IsTransient(const absl::Status& status);

class SchedulerClient {
 public:
  explicit SchedulerClient(const SchedulerClientOptions& options);
  // For tests: an existing stub.
  SchedulerClient(std::unique_ptr<depthbench::v1::WorkerService::StubInterface> stub,
                  int64_t rpc_timeout_ms);
  SchedulerClient(const SchedulerClient&) = delete;
  SchedulerClient& operator=(const SchedulerClient&) = delete;

  absl::StatusOr<depthbench::v1::RegisterWorkerResponse> RegisterWorker(
      const depthbench::v1::RegisterWorkerRequest& request) const;
  absl::StatusOr<depthbench::v1::HeartbeatResponse> Heartbeat(
      const depthbench::v1::HeartbeatRequest& request) const;
  absl::StatusOr<depthbench::v1::AcquireJobResponse> AcquireJob(
      const depthbench::v1::AcquireJobRequest& request) const;
  // One ReportMetrics stream carrying `chunks` (each one request message).
  absl::StatusOr<depthbench::v1::ReportMetricsResponse> ReportMetrics(
      const std::vector<depthbench::v1::ReportMetricsRequest>& chunks) const;
  absl::StatusOr<depthbench::v1::FinishJobResponse> FinishJob(
      const depthbench::v1::FinishJobRequest& request) const;

 private:
  std::unique_ptr<grpc::ClientContext> Context() const;
  // One unary call of the stub's `method` with Context().
  template <typename Response, typename Request, typename Method>
  absl::StatusOr<Response> Call(Method method, const Request& request) const;

  const std::string token_;
  const int64_t rpc_timeout_ms_;
  std::unique_ptr<depthbench::v1::WorkerService::StubInterface> stub_;
};

}  // namespace depthbench::worker

#endif  // DEPTHBENCH_WORKER_SCHEDULER_CLIENT_H_
