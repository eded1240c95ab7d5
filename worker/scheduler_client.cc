#include "worker/scheduler_client.h"

#include "common/grpc_client.h"

namespace depthbench::worker {

namespace v1 = ::depthbench::v1;

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
  auto channel =
      grpc::CreateCustomChannel(options.address, ChannelCredentials(options.tls_ca_pem), args);
  stub_ = v1::WorkerService::NewStub(channel);
}

SchedulerClient::SchedulerClient(std::unique_ptr<v1::WorkerService::StubInterface> stub,
                                 int64_t rpc_timeout_ms)
    : rpc_timeout_ms_(rpc_timeout_ms), stub_(std::move(stub)) {}

std::unique_ptr<grpc::ClientContext> SchedulerClient::Context() const {
  return CallContext(rpc_timeout_ms_, token_);
}

template <typename Response, typename Request, typename Method>
absl::StatusOr<Response> SchedulerClient::Call(Method method, const Request& request) const {
  Response response;
  auto ctx = Context();
  absl::Status s = FromGrpc((stub_.get()->*method)(ctx.get(), request, &response));
  if (!s.ok()) return s;
  return response;
}

absl::StatusOr<v1::RegisterWorkerResponse> SchedulerClient::RegisterWorker(
    const v1::RegisterWorkerRequest& request) const {
  return Call<v1::RegisterWorkerResponse>(&v1::WorkerService::StubInterface::RegisterWorker,
                                          request);
}

absl::StatusOr<v1::HeartbeatResponse> SchedulerClient::Heartbeat(
    const v1::HeartbeatRequest& request) const {
  return Call<v1::HeartbeatResponse>(&v1::WorkerService::StubInterface::Heartbeat, request);
}

absl::StatusOr<v1::AcquireJobResponse> SchedulerClient::AcquireJob(
    const v1::AcquireJobRequest& request) const {
  return Call<v1::AcquireJobResponse>(&v1::WorkerService::StubInterface::AcquireJob, request);
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
  return Call<v1::FinishJobResponse>(&v1::WorkerService::StubInterface::FinishJob, request);
}

}  // namespace depthbench::worker
