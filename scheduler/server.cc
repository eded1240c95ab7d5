#include "scheduler/server.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"

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
  // grpc.health.v1.Health for CheckAccepting() and outside probes.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options_.listen, creds, &port_);
  builder.RegisterService(&sweep_service_);
  builder.RegisterService(&worker_service_);
  if (options_.rpc_observer) {
    // Health probes are not the API's traffic: not counted.
    RpcObserver observer = [inner = options_.rpc_observer](const std::string& method,
                                                           const std::string& code,
                                                           double seconds) {
      if (method != "Check") inner(method, code, seconds);
    };
    builder.experimental().SetInterceptorCreators(MakeRpcMetricsInterceptors(observer));
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

absl::Status SchedulerServer::CheckAccepting(int64_t timeout_ms) const {
  if (server_ == nullptr || port_ == 0) return absl::UnavailableError("gRPC server not started");
  std::string host = options_.listen.substr(0, options_.listen.rfind(':'));
  if (host.empty() || host == "0.0.0.0") host = "127.0.0.1";
  if (host == "[::]" || host == "::") host = "[::1]";
  const std::string target = absl::StrCat(host, ":", port_);
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (!options_.tls_cert_pem.empty()) {
    // Our own server: the handshake is what is checked, not its identity.
    grpc::experimental::TlsChannelCredentialsOptions tls;
    tls.set_verify_server_certs(false);
    tls.set_check_call_host(false);
    tls.set_certificate_verifier(std::make_shared<grpc::experimental::NoOpCertificateVerifier>());
    creds = grpc::experimental::TlsCredentials(tls);
  } else {
    creds = grpc::InsecureChannelCredentials();
  }
  grpc::ChannelArguments args;
  // A connection of its own: one shared with earlier probes (or clients)
  // would still work after the listener died.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  auto channel = grpc::CreateCustomChannel(target, creds, args);
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
  ctx.set_wait_for_ready(true);  // wait for the connection within the deadline
  // An empty HealthCheckRequest (zero bytes; a ByteBuffer without a slice
  // is not a message): the server as a whole.
  grpc::Slice empty(std::string{});
  grpc::ByteBuffer request(&empty, 1), response;
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request,
                 &response, [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  if (!status.ok()) {
    return absl::UnavailableError(absl::StrCat("gRPC port ", port_, " does not answer (",
                                               status.error_message(), ")"));
  }
  return absl::OkStatus();
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
