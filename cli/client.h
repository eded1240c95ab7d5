// The CLI's one client of depthbench-scheduler's SweepService: channel (TLS
// when a CA file is given), bearer token metadata and a deadline on every
// call (set up by common/grpc_client.h, shared with the worker's client);
// one StatusOr-returning method per unary call.
//
// Thread safety: stubs are thread-safe; Context() is const. Ownership:
// owns the channel and stubs.
#ifndef DEPTHBENCH_CLI_CLIENT_H_
#define DEPTHBENCH_CLI_CLIENT_H_

#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/grpc_client.h"
#include "depthbench/v1/sweep_service.grpc.pb.h"

namespace depthbench::cli {

struct ClientOptions {
  std::string address = "127.0.0.1:7070";
  std::string token;        // sent as `authorization: Bearer TOKEN`
  std::string tls_ca_file;  // non-empty: TLS, trusting this PEM
  int64_t timeout_ms = 10000;
};

// grpc::Status -> absl::Status (same codes); common/grpc_client.h.
using ::depthbench::FromGrpc;

class SchedulerClient {
 public:
  static absl::StatusOr<std::unique_ptr<SchedulerClient>> Connect(const ClientOptions& options);
  // A context with the deadline (timeout_ms, or `timeout_ms` when > 0) and
  // the bearer token.
  std::unique_ptr<grpc::ClientContext> Context(int64_t timeout_ms = 0) const;
  // The unary SweepService calls, with the default deadline and the token;
  // a gRPC error comes back as the absl::Status of the same code.
  absl::StatusOr<depthbench::v1::SubmitSweepResponse> SubmitSweep(
      const depthbench::v1::SweepSpec& spec);
  absl::StatusOr<depthbench::v1::Sweep> GetSweep(const std::string& name);
  // Every page (the scheduler pages by count and by bytes).
  absl::StatusOr<depthbench::v1::ListSweepsResponse> ListAllSweeps();
  absl::StatusOr<depthbench::v1::CancelSweepResponse> CancelSweep(const std::string& name);
  absl::StatusOr<depthbench::v1::DeleteSweepResponse> DeleteSweep(const std::string& name,
                                                                  bool force);
  // One page.
  absl::StatusOr<depthbench::v1::ListJobsResponse> ListJobs(
      const depthbench::v1::ListJobsRequest& request);
  absl::StatusOr<depthbench::v1::Job> GetJob(int64_t job_id);
  absl::StatusOr<depthbench::v1::RetryJobResponse> RetryJob(
      const depthbench::v1::RetryJobRequest& request);
  // The WatchJob stream under `ctx` (from Context(), with the caller's
  // deadline): Read() events until false, then Finish().
  std::unique_ptr<grpc::ClientReader<depthbench::v1::WatchJobEvent>> WatchJob(
      grpc::ClientContext* ctx, const depthbench::v1::WatchJobRequest& request);
  // QueryResults for one sweep (results, report and demo all print from it).
  absl::StatusOr<depthbench::v1::QueryResultsResponse> QueryResults(const std::string& sweep);

 private:
  // One unary call of the stub's `method` with Context().
  template <typename Response, typename Request, typename Method>
  absl::StatusOr<Response> Call(Method method, const Request& request);

  ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<depthbench::v1::SweepService::Stub> sweeps_;
};

}  // namespace depthbench::cli

#endif  // DEPTHBENCH_CLI_CLIENT_H_
