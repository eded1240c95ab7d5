// What every gRPC client of the scheduler shares (the CLI's SweepService
// client, cli/client.h, and the worker's WorkerService client,
// worker/scheduler_client.h), set up in one place: the channel credentials
// (TLS trusting a CA, or plaintext), the per-call context (deadline and
// bearer token), reading the --tls-ca and token files, and the status
// mapping.
//
//   ASSIGN_OR_RETURN(std::string pem, ReadPemCertificates("--tls-ca", path));
//   auto channel = grpc::CreateChannel(address, ChannelCredentials(pem));
//   auto ctx = CallContext(timeout_ms, token);
//   RETURN_IF_ERROR(FromGrpc(stub->Call(ctx.get(), request, &response)));
//
// Thread safety: stateless functions.
#ifndef DEPTHBENCH_COMMON_GRPC_CLIENT_H_
#define DEPTHBENCH_COMMON_GRPC_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace depthbench {

// grpc::Status -> absl::Status (same code, same message).
absl::Status FromGrpc(const grpc::Status& status);

// TLS trusting the PEM root certificates `tls_ca_pem`; plaintext when it is
// empty.
std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(const std::string& tls_ca_pem);

// A call context: deadline now + `timeout_ms`, and `authorization: Bearer
// TOKEN` metadata when `token` is not empty.
std::unique_ptr<grpc::ClientContext> CallContext(int64_t timeout_ms, const std::string& token);

// The PEM text of the file a flag names. InvalidArgument "<flag>: cannot
// read PATH" or "<flag>: PATH holds no PEM certificate".
absl::StatusOr<std::string> ReadPemCertificates(const std::string& flag, const std::string& path);

// A token file's content without trailing newlines and spaces (may be
// empty). InvalidArgument "<flag>: cannot read PATH".
absl::StatusOr<std::string> ReadTokenFile(const std::string& flag, const std::string& path);

}  // namespace depthbench

#endif  // DEPTHBENCH_COMMON_GRPC_CLIENT_H_
