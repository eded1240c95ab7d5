#include "worker/scheduler_client.h"

#include <chrono>

namespace depthbench::worker {

namespace v1 = ::depthbench::v1;

namespace {

absl::Status FromGrpc(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

}  // namespace

bool IsTransient(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kInternal:   // e.g. a busy SQLite on the scheduler
    case absl::StatusCode::kCancelled:  // connection torn down mid-call
    case absl::StatusCode::kUnknown:
      return true;
    default:
      return false;
  }
}

SchedulerClient::SchedulerClient(const SchedulerClientOptions& options)
    : token_(options.token), rpc_timeout_ms_(options.rpc_timeout_ms) {
  grpc::ChannelArguments args;
  // Reconnect quickly after a scheduler restart (the default backoff grows
  // to two minutes, longer than a lease TTL: the restarted scheduler would
  // expire every lease before the first heartbeat got through).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (!options.tls_ca_pem.empty()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options.tls_ca_pem;
    creds = grpc::SslCredentials(ssl);
  } else {
    creds = grpc::InsecureChannelCredentials();
  }
  auto channel = grpc::CreateCustomChannel(options.address, creds, args);
  stub_ = v1::WorkerService::NewStub(channel);
}

SchedulerClient::SchedulerClient(std::unique_ptr<v1::WorkerService::StubInterface> stub,
                                 int64_t rpc_timeout_ms)
    : rpc_timeout_ms_(rpc_timeout_ms), stub_(std::move(stub)) {}

std::unique_ptr<grpc::ClientContext> SchedulerClient::Context() const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::milliseconds(rpc_timeout_ms_));
  if (!token_.empty()) ctx->AddMetadata("authorization", "Bearer " + token_);
  return ctx;
}

absl::StatusOr<v1::RegisterWorkerResponse> SchedulerClient::RegisterWorker(
    const v1::RegisterWorkerRequest& request) const {
  v1::RegisterWorkerResponse resp;
  auto ctx = Context();
  absl::Status s = FromGrpc(stub_->RegisterWorker(ctx.get(), request, &resp));
  if (!s.ok()) return s;
  return resp;
}

absl::StatusOr<v1::HeartbeatResponse> SchedulerClient::Heartbeat(
    const v1::HeartbeatRequest& request) const {
  v1::HeartbeatResponse resp;
  auto ctx = Context();
  absl::Status s = FromGrpc(stub_->Heartbeat(ctx.get(), request, &resp));
  if (!s.ok()) return s;
  return resp;
}

absl::StatusOr<v1::AcquireJobResponse> SchedulerClient::AcquireJob(
    const v1::AcquireJobRequest& request) const {
  v1::AcquireJobResponse resp;
  auto ctx = Context();
  absl::Status s = FromGrpc(stub_->AcquireJob(ctx.get(), request, &resp));
  if (!s.ok()) return s;
  return resp;
}

absl::StatusOr<v1::ReportMetricsResponse> SchedulerClient::ReportMetrics(
    const std::vector<v1::ReportMetricsRequest>& chunks) const {
  v1::ReportMetricsResponse resp;
  auto ctx = Context();
  std::unique_ptr<grpc::ClientWriterInterface<v1::ReportMetricsRequest>> writer =
      stub_->ReportMetrics(ctx.get(), &resp);
  for (const v1::ReportMetricsRequest& chunk : chunks) {
    if (!writer->Write(chunk)) break;  // the stream broke: Finish() says why
  }
  writer->WritesDone();
  absl::Status s = FromGrpc(writer->Finish());
  if (!s.ok()) return s;
  return resp;
}

absl::StatusOr<v1::FinishJobResponse> SchedulerClient::FinishJob(
    const v1::FinishJobRequest& request) const {
  v1::FinishJobResponse resp;
  auto ctx = Context();
  absl::Status s = FromGrpc(stub_->FinishJob(ctx.get(), request, &resp));
  if (!s.ok()) return s;
  return resp;
}

}  // namespace depthbench::worker
