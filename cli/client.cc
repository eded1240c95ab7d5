#include "cli/client.h"

#include <chrono>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace depthbench::cli {

absl::Status FromGrpc(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

absl::StatusOr<std::unique_ptr<SchedulerClient>> SchedulerClient::Connect(
    const ClientOptions& options) {
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (!options.tls_ca_file.empty()) {
    std::ifstream in(options.tls_ca_file);
    if (!in) return absl::InvalidArgumentError(absl::StrCat("--tls-ca: cannot read ", options.tls_ca_file));
    std::stringstream ss;
    ss << in.rdbuf();
    if (ss.str().find("-----BEGIN CERTIFICATE-----") == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tls-ca: ", options.tls_ca_file, " holds no PEM certificate"));
    }
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = ss.str();
    creds = grpc::SslCredentials(ssl);
  } else {
    creds = grpc::InsecureChannelCredentials();
  }
  auto client = std::unique_ptr<SchedulerClient>(new SchedulerClient());
  client->options_ = options;
  client->channel_ = grpc::CreateChannel(options.address, creds);
  client->sweeps_ = depthbench::v1::SweepService::NewStub(client->channel_);
  return client;
}

std::unique_ptr<grpc::ClientContext> SchedulerClient::Context(int64_t timeout_ms) const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  int64_t ms = timeout_ms > 0 ? timeout_ms : options_.timeout_ms;
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(ms));
  if (!options_.token.empty()) ctx->AddMetadata("authorization", "Bearer " + options_.token);
  return ctx;
}

absl::StatusOr<depthbench::v1::QueryResultsResponse> SchedulerClient::QueryResults(
    const std::string& sweep) {
  depthbench::v1::QueryResultsRequest req;
  req.set_sweep(sweep);
  depthbench::v1::QueryResultsResponse resp;
  auto ctx = Context();
  absl::Status status = FromGrpc(sweeps_->QueryResults(ctx.get(), req, &resp));
  if (!status.ok()) return status;
  return resp;
}

}  // namespace depthbench::cli
