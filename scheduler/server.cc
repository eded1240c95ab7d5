#include "scheduler/server.h"

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"

namespace depthbench::scheduler {

SchedulerServer::SchedulerServer(Scheduler* scheduler, ServerOptions options)
    : scheduler_(scheduler),
      options_(std::move(options)),
      sweep_service_(scheduler, options_.auth_token),
      worker_service_(scheduler, options_.auth_token) {}

SchedulerServer::~SchedulerServer() { Shutdown(); }

absl::Status SchedulerServer::Start() {
  std::shared_ptr<grpc::ServerCredentials> creds;
  if (!options_.tls_cert_pem.empty() || !options_.tls_key_pem.empty()) {
    if (options_.tls_cert_pem.empty() || options_.tls_key_pem.empty()) {
      return absl::InvalidArgumentError("--tls-cert and --tls-key must be given together");
    }
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({options_.tls_key_pem, options_.tls_cert_pem});
    creds = grpc::SslServerCredentials(ssl);
  } else {
    creds = grpc::InsecureServerCredentials();
  }
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options_.listen, creds, &port_);
  builder.RegisterService(&sweep_service_);
  builder.RegisterService(&worker_service_);
  if (options_.rpc_observer) {
    builder.experimental().SetInterceptorCreators(
        MakeRpcMetricsInterceptors(options_.rpc_observer));
  }
  // Keep idle handler threads around: with many concurrent workers the
  // default (at most 2 idle pollers) creates and destroys a thread per burst.
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MIN_POLLERS, 2);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS,
                              options_.max_idle_threads);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options_.listen));
  }
  ticker_ = std::thread([this] {
    std::string last_error;  // logged once while it repeats (e.g. disk full)
    while (!stop_.WaitForNotificationWithTimeout(
        absl::Milliseconds(options_.expiry_interval_ms))) {
      absl::StatusOr<int64_t> expired = scheduler_->ExpireLeases();
      if (!expired.ok()) {
        std::string error = expired.status().ToString();
        if (error != last_error) spdlog::error("lease expiry (retried every tick): {}", error);
        last_error = error;
        continue;
      }
      if (!last_error.empty()) spdlog::info("lease expiry succeeds again");
      last_error.clear();
      if (*expired > 0) {
        spdlog::info("expired {} lease(s)", *expired);
      }
    }
  });
  return absl::OkStatus();
}

std::string SchedulerServer::address() const {
  std::string host = options_.listen.substr(0, options_.listen.rfind(':'));
  return absl::StrCat(host, ":", port_);
}

void SchedulerServer::Wait() {
  if (server_ != nullptr) server_->Wait();
}

void SchedulerServer::Shutdown() {
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (ticker_.joinable()) ticker_.join();
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    server_.reset();
  }
}

}  // namespace depthbench::scheduler
