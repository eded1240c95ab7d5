// gRPC handlers for SweepService and WorkerService: decode, check the bearer
// token, call the Scheduler, map absl::Status to grpc::Status. No logic here.
//
// Thread safety: handlers run concurrently on gRPC's thread pool; all state
// lives in the Scheduler (thread-safe). Ownership: borrow the Scheduler,
// which must outlive the server.
#ifndef DEPTHBENCH_SCHEDULER_GRPC_SERVICES_H_
#define DEPTHBENCH_SCHEDULER_GRPC_SERVICES_H_

#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "depthbench/v1/sweep_service.grpc.pb.h"
#include "depthbench/v1/worker_service.grpc.pb.h"
#include "scheduler/scheduler.h"

namespace depthbench::scheduler {

grpc::Status ToGrpcStatus(const absl::Status& status);

// Checks `authorization: Bearer <token>` metadata; an empty token disables
// the check. UNAUTHENTICATED when missing or wrong.
grpc::Status CheckAuth(grpc::ServerContext* context, const std::string& token);

class SweepServiceImpl final : public depthbench::v1::SweepService::Service {
 public:
  SweepServiceImpl(Scheduler* scheduler, std::string token)
      : scheduler_(scheduler), token_(std::move(token)) {}

  grpc::Status SubmitSweep(grpc::ServerContext* ctx, const depthbench::v1::SubmitSweepRequest* req,
                           depthbench::v1::SubmitSweepResponse* resp) override;
  grpc::Status GetSweep(grpc::ServerContext* ctx, const depthbench::v1::GetSweepRequest* req,
                        depthbench::v1::Sweep* resp) override;
  grpc::Status ListSweeps(grpc::ServerContext* ctx, const depthbench::v1::ListSweepsRequest* req,
                          depthbench::v1::ListSweepsResponse* resp) override;
  grpc::Status CancelSweep(grpc::ServerContext* ctx, const depthbench::v1::CancelSweepRequest* req,
                           depthbench::v1::CancelSweepResponse* resp) override;
  grpc::Status DeleteSweep(grpc::ServerContext* ctx, const depthbench::v1::DeleteSweepRequest* req,
                           depthbench::v1::DeleteSweepResponse* resp) override;
  grpc::Status ListJobs(grpc::ServerContext* ctx, const depthbench::v1::ListJobsRequest* req,
                        depthbench::v1::ListJobsResponse* resp) override;
  grpc::Status GetJob(grpc::ServerContext* ctx, const depthbench::v1::GetJobRequest* req,
                      depthbench::v1::Job* resp) override;
  grpc::Status RetryJob(grpc::ServerContext* ctx, const depthbench::v1::RetryJobRequest* req,
                        depthbench::v1::RetryJobResponse* resp) override;
  grpc::Status WatchJob(grpc::ServerContext* ctx, const depthbench::v1::WatchJobRequest* req,
                        grpc::ServerWriter<depthbench::v1::WatchJobEvent>* writer) override;
  grpc::Status QueryResults(grpc::ServerContext* ctx, const depthbench::v1::QueryResultsRequest* req,
                            depthbench::v1::QueryResultsResponse* resp) override;

 private:
  Scheduler* scheduler_;
  const std::string token_;
};

class WorkerServiceImpl final : public depthbench::v1::WorkerService::Service {
 public:
  WorkerServiceImpl(Scheduler* scheduler, std::string token)
      : scheduler_(scheduler), token_(std::move(token)) {}

  grpc::Status RegisterWorker(grpc::ServerContext* ctx, const depthbench::v1::RegisterWorkerRequest* req,
                              depthbench::v1::RegisterWorkerResponse* resp) override;
  grpc::Status Heartbeat(grpc::ServerContext* ctx, const depthbench::v1::HeartbeatRequest* req,
                         depthbench::v1::HeartbeatResponse* resp) override;
  grpc::Status AcquireJob(grpc::ServerContext* ctx, const depthbench::v1::AcquireJobRequest* req,
                          depthbench::v1::AcquireJobResponse* resp) override;
  grpc::Status ReportMetrics(grpc::ServerContext* ctx,
                             grpc::ServerReader<depthbench::v1::ReportMetricsRequest>* reader,
                             depthbench::v1::ReportMetricsResponse* resp) override;
  grpc::Status FinishJob(grpc::ServerContext* ctx, const depthbench::v1::FinishJobRequest* req,
                         depthbench::v1::FinishJobResponse* resp) override;

 private:
  Scheduler* scheduler_;
  const std::string token_;
};

}  // namespace depthbench::scheduler

#endif  // DEPTHBENCH_SCHEDULER_GRPC_SERVICES_H_
