// Connection to depthbench-scheduler for the CLI: channel (TLS when a CA
// file is given), bearer token metadata and a deadline on every call.
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
#include "depthbench/v1/sweep_service.grpc.pb.h"

namespace depthbench::cli {

struct ClientOptions {
  std::string address = "127.0.0.1:7070";
  std::string token;        // sent as `authorization: Bearer TOKEN`
  std::string tls_ca_file;  // non-empty: TLS, trusting this PEM
  int64_t timeout_ms = 10000;
};

// grpc::Status -> absl::Status (same codes).
absl::Status FromGrpc(const grpc::Status& status);

class SchedulerClient {
 public:
  static absl::StatusOr<std::unique_ptr<SchedulerClient>> Connect(const ClientOptions& options);
  // A context with the deadline (timeout_ms, or `timeout_ms` when > 0) and
  // the bearer token.
  std::unique_ptr<grpc::ClientContext> Context(int64_t timeout_ms = 0) const;
  depthbench::v1::SweepService::Stub* sweeps() { return sweeps_.get(); }
  // QueryResults for one sweep with the default deadline (results, report
  // and demo all print from it).
  absl::StatusOr<depthbench::v1::QueryResultsResponse> QueryResults(const std::string& sweep);

 private:
  ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<depthbench::v1::SweepService::Stub> sweeps_;
};

}  // namespace depthbench::cli

#endif  // DEPTHBENCH_CLI_CLIENT_H_
