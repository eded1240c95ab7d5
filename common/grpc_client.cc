#include "common/grpc_client.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"

namespace depthbench {

absl::Status FromGrpc(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(const std::string& tls_ca_pem) {
  if (tls_ca_pem.empty()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = tls_ca_pem;
  return grpc::SslCredentials(ssl);
}

std::unique_ptr<grpc::ClientContext> CallContext(int64_t timeout_ms, const std::string& token) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
  if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
  return ctx;
}

absl::StatusOr<std::string> ReadPemCertificates(const std::string& flag, const std::string& path) {
  std::string pem;
  if (!ReadWholeFile(path, &pem)) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": cannot read ", path));
  }
  if (pem.find("-----BEGIN CERTIFICATE-----") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", path, " holds no PEM certificate"));
  }
  return pem;
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& flag, const std::string& path) {
  std::string token;
  if (!ReadWholeFile(path, &token)) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": cannot read ", path));
  }
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r' || token.back() == ' ')) {
    token.pop_back();
  }
  return token;
}

}  // namespace depthbench
