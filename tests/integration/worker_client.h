// A scripted WorkerService client for integration tests: each call is one
// RPC with a deadline, so a test decides exactly which leases are granted,
// which attempts fail, diverge or go silent.
//
// Thread safety: one WorkerClient per thread (the stub itself is
// thread-safe). Test-only.
#ifndef DEPTHBENCH_TESTS_INTEGRATION_WORKER_CLIENT_H_
#define DEPTHBENCH_TESTS_INTEGRATION_WORKER_CLIENT_H_

#include <chrono>
#include <map>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "depthbench/v1/worker_service.grpc.pb.h"

namespace depthbench::testing {

class WorkerClient {
 public:
  WorkerClient(const std::string& address, std::string name)
      : name_(std::move(name)),
        stub_(depthbench::v1::WorkerService::NewStub(
            grpc::CreateChannel(address, grpc::InsecureChannelCredentials()))) {}

  const std::string& name() const { return name_; }

  grpc::Status Register(int slots = 1, const std::map<std::string, std::string>& labels = {}) {
    depthbench::v1::RegisterWorkerRequest req;
    req.set_name(name_);
    req.mutable_resources()->set_slots(slots);
    for (const auto& [k, v] : labels) (*req.mutable_resources()->mutable_labels())[k] = v;
    depthbench::v1::RegisterWorkerResponse resp;
    auto ctx = Context();
    return stub_->RegisterWorker(ctx.get(), req, &resp);
  }

  grpc::Status Heartbeat() {
    depthbench::v1::HeartbeatRequest req;
    req.set_worker_id(name_);
    depthbench::v1::HeartbeatResponse resp;
    auto ctx = Context();
    return stub_->Heartbeat(ctx.get(), req, &resp);
  }

  grpc::Status Acquire(depthbench::v1::AcquireJobResponse* lease) {
    depthbench::v1::AcquireJobRequest req;
    req.set_worker_id(name_);
    auto ctx = Context();
    return stub_->AcquireJob(ctx.get(), req, lease);
  }

  // Reports loss points for steps first..last in one stream.
  grpc::Status Report(const depthbench::v1::AcquireJobResponse& lease, int first, int last,
                      depthbench::v1::ReportMetricsResponse* resp = nullptr) {
    depthbench::v1::ReportMetricsRequest chunk;
    chunk.set_job_id(lease.job_id());
    chunk.set_attempt_id(lease.attempt_id());
    for (int s = first; s <= last; ++s) {
      auto* p = chunk.add_points();
      p->set_step(s);
      p->set_name("loss");
      p->set_value(5.0 - 0.01 * s);
    }
    depthbench::v1::ReportMetricsResponse local;
    auto ctx = Context();
    auto writer = stub_->ReportMetrics(ctx.get(), resp != nullptr ? resp : &local);
    writer->Write(chunk);
    writer->WritesDone();
    return writer->Finish();
  }

  grpc::Status Finish(const depthbench::v1::AcquireJobResponse& lease,
                      depthbench::v1::FinishStatus status, double val_loss = 3.0) {
    depthbench::v1::FinishJobRequest req;
    req.set_job_id(lease.job_id());
    req.set_attempt_id(lease.attempt_id());
    req.set_status(status);
    if (status == depthbench::v1::FINISH_SUCCEEDED) {
      req.set_has_val_loss(true);
      req.set_final_val_loss(val_loss);
    }
    if (status == depthbench::v1::FINISH_FAILED) req.set_reason("exit code 1");
    if (status == depthbench::v1::FINISH_DIVERGED) req.set_reason("loss exploded");
    depthbench::v1::FinishJobResponse resp;
    auto ctx = Context();
    return stub_->FinishJob(ctx.get(), req, &resp);
  }

  depthbench::v1::WorkerService::Stub* stub() { return stub_.get(); }

 private:
  static std::unique_ptr<grpc::ClientContext> Context() {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    return ctx;
  }

  std::string name_;
  std::unique_ptr<depthbench::v1::WorkerService::Stub> stub_;
};

}  // namespace depthbench::testing

#endif  // DEPTHBENCH_TESTS_INTEGRATION_WORKER_CLIENT_H_
