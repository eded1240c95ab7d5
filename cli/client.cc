#include "cli/client.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace depthbench::cli {

namespace v1 = ::depthbench::v1;

absl::StatusOr<std::unique_ptr<SchedulerClient>> SchedulerClient::Connect(
    const ClientOptions& options) {
  std::string pem;
  if (!options.tls_ca_file.empty()) {
    ASSIGN_OR_RETURN(pem, ReadPemCertificates("--tls-ca", options.tls_ca_file));
  }
  auto client = std::unique_ptr<SchedulerClient>(new SchedulerClient());
  client->options_ = options;
  client->channel_ = grpc::CreateChannel(options.address, ChannelCredentials(pem));
  client->sweeps_ = depthbench::v1::SweepService::NewStub(client->channel_);
  return client;
}

std::unique_ptr<grpc::ClientContext> SchedulerClient::Context(int64_t timeout_ms) const {
  return CallContext(timeout_ms > 0 ? timeout_ms : options_.timeout_ms, options_.token);
}

template <typename Response, typename Request, typename Method>
absl::StatusOr<Response> SchedulerClient::Call(Method method, const Request& request) {
  Response response;
  auto ctx = Context();
  absl::Status status = FromGrpc((sweeps_.get()->*method)(ctx.get(), request, &response));
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<v1::SubmitSweepResponse> SchedulerClient::SubmitSweep(const v1::SweepSpec& spec) {
  v1::SubmitSweepRequest req;
  *req.mutable_spec() = spec;
  return Call<v1::SubmitSweepResponse>(&v1::SweepService::Stub::SubmitSweep, req);
}

absl::StatusOr<v1::Sweep> SchedulerClient::GetSweep(const std::string& name) {
  v1::GetSweepRequest req;
  req.set_name(name);
  return Call<v1::Sweep>(&v1::SweepService::Stub::GetSweep, req);
}

absl::StatusOr<v1::ListSweepsResponse> SchedulerClient::ListAllSweeps() {
  v1::ListSweepsResponse all;
  v1::ListSweepsRequest req;
  while (true) {
    absl::StatusOr<v1::ListSweepsResponse> page =
        Call<v1::ListSweepsResponse>(&v1::SweepService::Stub::ListSweeps, req);
    if (!page.ok()) return page.status();
    for (auto& s : *page->mutable_sweeps()) *all.add_sweeps() = std::move(s);
    if (page->next_page_token().empty()) return all;
    req.set_page_token(page->next_page_token());
  }
}

absl::StatusOr<v1::CancelSweepResponse> SchedulerClient::CancelSweep(const std::string& name) {
  v1::CancelSweepRequest req;
  req.set_name(name);
  return Call<v1::CancelSweepResponse>(&v1::SweepService::Stub::CancelSweep, req);
}

absl::StatusOr<v1::DeleteSweepResponse> SchedulerClient::DeleteSweep(const std::string& name,
                                                                     bool force) {
  v1::DeleteSweepRequest req;
  req.set_name(name);
  req.set_force(force);
  return Call<v1::DeleteSweepResponse>(&v1::SweepService::Stub::DeleteSweep, req);
}

absl::StatusOr<v1::ListJobsResponse> SchedulerClient::ListJobs(const v1::ListJobsRequest& request) {
  return Call<v1::ListJobsResponse>(&v1::SweepService::Stub::ListJobs, request);
}

absl::StatusOr<v1::Job> SchedulerClient::GetJob(int64_t job_id) {
  v1::GetJobRequest req;
  req.set_job_id(job_id);
  return Call<v1::Job>(&v1::SweepService::Stub::GetJob, req);
}

absl::StatusOr<v1::RetryJobResponse> SchedulerClient::RetryJob(const v1::RetryJobRequest& request) {
  return Call<v1::RetryJobResponse>(&v1::SweepService::Stub::RetryJob, request);
}

std::unique_ptr<grpc::ClientReader<v1::WatchJobEvent>> SchedulerClient::WatchJob(
    grpc::ClientContext* ctx, const v1::WatchJobRequest& request) {
  return sweeps_->WatchJob(ctx, request);
}

absl::StatusOr<v1::QueryResultsResponse> SchedulerClient::QueryResults(const std::string& sweep) {
  v1::QueryResultsRequest req;
  req.set_sweep(sweep);
  return Call<v1::QueryResultsResponse>(&v1::SweepService::Stub::QueryResults, req);
}

}  // namespace depthbench::cli
