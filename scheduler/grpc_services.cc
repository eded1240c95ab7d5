#include "scheduler/grpc_services.h"

#include <utility>

#include "absl/time/time.h"

namespace depthbench::scheduler {

namespace v1 = ::depthbench::v1;

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

grpc::Status CheckAuth(grpc::ServerContext* context, const std::string& token) {
  if (token.empty()) return grpc::Status::OK;
  const auto& metadata = context->client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "missing authorization metadata (Bearer token)");
  }
  std::string value(it->second.data(), it->second.size());
  if (value != "Bearer " + token) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "invalid bearer token");
  }
  return grpc::Status::OK;
}

namespace {

// Runs `call` (returning StatusOr<T>) after the auth check, storing the value.
template <typename T, typename Call>
grpc::Status Handle(grpc::ServerContext* ctx, const std::string& token, T* out,
                    Call&& call) {
  grpc::Status auth = CheckAuth(ctx, token);
  if (!auth.ok()) return auth;
  auto result = call();
  if (!result.ok()) return ToGrpcStatus(result.status());
  *out = std::move(result).value();
  return grpc::Status::OK;
}

}  // namespace

grpc::Status SweepServiceImpl::SubmitSweep(grpc::ServerContext* ctx, const v1::SubmitSweepRequest* req,
                                           v1::SubmitSweepResponse* resp) {
  return Handle(ctx, token_, resp, [&] { return scheduler_->SubmitSweep(req->spec()); });
}
grpc::Status SweepServiceImpl::GetSweep(grpc::ServerContext* ctx, const v1::GetSweepRequest* req,
                                        v1::Sweep* resp) {
  return Handle(ctx, token_, resp, [&] { return scheduler_->GetSweep(req->name()); });
}
grpc::Status SweepServiceImpl::ListSweeps(grpc::ServerContext* ctx, const v1::ListSweepsRequest* req,
                                          v1::ListSweepsResponse* resp) {
  return Handle(ctx, token_, resp, [&] { return scheduler_->ListSweeps(*req); });
}
grpc::Status SweepServiceImpl::DeleteSweep(grpc::ServerContext* ctx, const v1::DeleteSweepRequest* req,
                                           v1::DeleteSweepResponse* resp) {
  return Handle(ctx, token_, resp, [&] { return scheduler_->DeleteSweep(*req); });
}
grpc::Status SweepServiceImpl::CancelSweep(grpc::ServerContext* ctx, const v1::CancelSweepRequest* req,
                                           v1::CancelSweepResponse* resp) {
  return Handle(ctx, token_, resp, [&] { return scheduler_->CancelSweep(req->name()); });
}
grpc::Status SweepServiceImpl::ListJobs(grpc::ServerContext* ctx, const v1::ListJobsRequest* req,
                                        v1::ListJobsResponse* resp) {
  return Handle(ctx, token_, resp, [&] { return scheduler_->ListJobs(*req); });
}
grpc::Status SweepServiceImpl::GetJob(grpc::ServerContext* ctx, const v1::GetJobRequest* req,
                                      v1::Job* resp) {
  return Handle(ctx, token_, resp, [&] { return scheduler_->GetJob(req->job_id()); });
}
grpc::Status SweepServiceImpl::RetryJob(grpc::ServerContext* ctx, const v1::RetryJobRequest* req,
                                        v1::RetryJobResponse* resp) {
  return Handle(ctx, token_, resp, [&] { return scheduler_->RetryJob(*req); });
}
grpc::Status SweepServiceImpl::QueryResults(grpc::ServerContext* ctx, const v1::QueryResultsRequest* req,
                                            v1::QueryResultsResponse* resp) {
  return Handle(ctx, token_, resp, [&] { return scheduler_->QueryResults(*req); });
}

grpc::Status SweepServiceImpl::WatchJob(grpc::ServerContext* ctx, const v1::WatchJobRequest* req,
                                        grpc::ServerWriter<v1::WatchJobEvent>* writer) {
  grpc::Status auth = CheckAuth(ctx, token_);
  if (!auth.ok()) return auth;
  // Stored points, then live ones from the scheduler's WatchHub: ingestion
  // never waits for this stream (scheduler/watch_hub.h).
  constexpr int64_t kBatch = 1000;
  // The canonical history streams through a JobWatch; one attempt's own
  // points (abandoned ones included, `attempt_id`) are read from storage,
  // waiting for the scheduler's change version between pages.
  std::unique_ptr<JobWatch> watch =
      req->attempt_id() == 0 ? scheduler_->Watch(req->job_id(), req->from_step()) : nullptr;
  int64_t cursor = 0;
  uint64_t version = 0;
  bool caught_up = false;
  auto next = [&]() -> absl::StatusOr<WatchBatch> {
    if (watch != nullptr) return watch->Next(kBatch, absl::Milliseconds(500));
    if (caught_up) scheduler_->WaitForChange(version, absl::Milliseconds(500));
    version = scheduler_->ChangeVersion();
    absl::StatusOr<WatchBatch> batch = scheduler_->ReadWatch(
        req->job_id(), cursor, req->from_step(), kBatch, req->attempt_id());
    if (batch.ok() && !batch->points.empty()) cursor = batch->points.back().row_id;
    caught_up = batch.ok() && static_cast<int64_t>(batch->points.size()) < kBatch;
    return batch;
  };
  v1::JobState last_state = v1::JOB_STATE_UNSPECIFIED;
  int64_t resumed_attempt = 0;  // the attempt whose resume was last sent
  while (!ctx->IsCancelled()) {
    absl::StatusOr<WatchBatch> batch = next();
    if (!batch.ok()) return ToGrpcStatus(batch.status());
    // Before the points read with it: a canonical watcher learns that
    // earlier attempts' points after this step were abandoned.
    if (req->attempt_id() == 0 && batch->resumed_from_step >= 0 &&
        batch->attempt_id != resumed_attempt) {
      v1::WatchJobEvent event;
      event.set_attempt_id(batch->attempt_id);
      event.mutable_resumed()->set_step(batch->resumed_from_step);
      if (!writer->Write(event)) return grpc::Status::OK;
      resumed_attempt = batch->attempt_id;
    }
    for (size_t i = 0; i < batch->points.size(); ++i) {
      const storage::MetricRecord& p = batch->points[i];
      v1::WatchJobEvent event;
      event.set_attempt_id(p.attempt_id);
      v1::MetricPoint* point = event.mutable_point();
      point->set_step(p.step);
      point->set_name(p.name);
      point->set_value(p.value);
      point->set_wall_ms(p.wall_ms);
      // No WriteOptions::set_buffer_hint() here: on the sync server a
      // buffered write's completion waits for a later flush, so Write()
      // blocks for good (gRPC 1.51) and the stream stalls.
      if (!writer->Write(event)) return grpc::Status::OK;
    }
    if (batch->state != last_state) {
      v1::WatchJobEvent event;
      event.set_state(batch->state);
      event.set_attempt_id(batch->attempt_id);
      if (!writer->Write(event)) return grpc::Status::OK;
      last_state = batch->state;
    }
    bool terminal = batch->state == v1::SUCCEEDED || batch->state == v1::DIVERGED ||
                    batch->state == v1::FAILED || batch->state == v1::CANCELLED;
    if (static_cast<int64_t>(batch->points.size()) == kBatch) continue;  // more to send
    if (terminal) return grpc::Status::OK;
  }
  return grpc::Status(grpc::StatusCode::CANCELLED, "client cancelled the watch");
}

grpc::Status WorkerServiceImpl::RegisterWorker(grpc::ServerContext* ctx,
                                               const v1::RegisterWorkerRequest* req,
                                               v1::RegisterWorkerResponse* resp) {
  return Handle(ctx, token_, resp, [&] { return scheduler_->RegisterWorker(*req); });
}
grpc::Status WorkerServiceImpl::Heartbeat(grpc::ServerContext* ctx, const v1::HeartbeatRequest* req,
                                          v1::HeartbeatResponse* resp) {
  return Handle(ctx, token_, resp, [&] { return scheduler_->Heartbeat(*req); });
}
grpc::Status WorkerServiceImpl::AcquireJob(grpc::ServerContext* ctx, const v1::AcquireJobRequest* req,
                                           v1::AcquireJobResponse* resp) {
  return Handle(ctx, token_, resp, [&] { return scheduler_->AcquireJob(*req); });
}
grpc::Status WorkerServiceImpl::FinishJob(grpc::ServerContext* ctx, const v1::FinishJobRequest* req,
                                          v1::FinishJobResponse* resp) {
  return Handle(ctx, token_, resp, [&] { return scheduler_->FinishJob(*req); });
}

grpc::Status WorkerServiceImpl::ReportMetrics(grpc::ServerContext* ctx,
                                              grpc::ServerReader<v1::ReportMetricsRequest>* reader,
                                              v1::ReportMetricsResponse* resp) {
  grpc::Status auth = CheckAuth(ctx, token_);
  if (!auth.ok()) return auth;
  v1::ReportMetricsRequest chunk;
  int64_t job_id = 0, attempt_id = 0;
  while (reader->Read(&chunk)) {
    if (job_id == 0) {
      job_id = chunk.job_id();
      attempt_id = chunk.attempt_id();
    } else if (chunk.job_id() != job_id || chunk.attempt_id() != attempt_id) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "job_id/attempt_id: one ReportMetrics stream carries one attempt");
    }
    absl::StatusOr<v1::ReportMetricsResponse> result = scheduler_->ReportMetrics(chunk);
    if (!result.ok()) return ToGrpcStatus(result.status());
    resp->set_accepted(resp->accepted() + result->accepted());
    resp->set_duplicates(resp->duplicates() + result->duplicates());
  }
  return grpc::Status::OK;
}

}  // namespace depthbench::scheduler
