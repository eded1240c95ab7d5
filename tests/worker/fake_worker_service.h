// An in-process WorkerService on a loopback port with fault injection, for
// the worker's unit tests (a fake, not a mock: it stores what it is sent
// and answers like the scheduler would).
#ifndef DEPTHBENCH_TESTS_WORKER_FAKE_WORKER_SERVICE_H_
#define DEPTHBENCH_TESTS_WORKER_FAKE_WORKER_SERVICE_H_

#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/synchronization/mutex.h"
#include "depthbench/v1/worker_service.grpc.pb.h"

namespace depthbench::worker {

class FakeWorkerService final : public depthbench::v1::WorkerService::Service {
 public:
  // Points stored, keyed like the scheduler's table.
  using Key = std::tuple<int64_t, int64_t, int64_t, std::string>;  // job, attempt, step, name

  // The next `n` ReportMetrics calls fail with `code` (after reading).
  void FailNextReports(int n, grpc::StatusCode code) {
    absl::MutexLock lock(&mu_);
    fail_reports_ = n;
    fail_code_ = code;
  }
  // The next `n` FinishJob calls fail with `code` (they are still recorded
  // in finishes()).
  void FailNextFinishes(int n, grpc::StatusCode code) {
    absl::MutexLock lock(&mu_);
    fail_finishes_ = n;
    fail_finish_code_ = code;
  }
  // ReportMetrics answers FAILED_PRECONDITION from now on.
  void MakeStale() {
    absl::MutexLock lock(&mu_);
    stale_ = true;
  }
  size_t stored() const {
    absl::MutexLock lock(&mu_);
    return points_.size();
  }
  int64_t duplicates() const {
    absl::MutexLock lock(&mu_);
    return duplicates_;
  }
  int report_calls() const {
    absl::MutexLock lock(&mu_);
    return report_calls_;
  }
  std::vector<int64_t> Steps(const std::string& name) const {
    absl::MutexLock lock(&mu_);
    std::vector<int64_t> out;
    for (const auto& [k, v] : points_) {
      if (std::get<3>(k) == name) out.push_back(std::get<2>(k));
    }
    return out;
  }
  // resumed_from_step of every accepted chunk that carried one, in order.
  std::vector<int64_t> resumes() const {
    absl::MutexLock lock(&mu_);
    return resumes_;
  }
  std::vector<depthbench::v1::FinishJobRequest> finishes() const {
    absl::MutexLock lock(&mu_);
    return finishes_;
  }

  grpc::Status ReportMetrics(grpc::ServerContext*,
                             grpc::ServerReader<depthbench::v1::ReportMetricsRequest>* reader,
                             depthbench::v1::ReportMetricsResponse* resp) override {
    depthbench::v1::ReportMetricsRequest chunk;
    std::vector<depthbench::v1::ReportMetricsRequest> chunks;
    while (reader->Read(&chunk)) chunks.push_back(chunk);
    absl::MutexLock lock(&mu_);
    ++report_calls_;
    if (stale_) return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "stale attempt");
    if (fail_reports_ > 0) {
      --fail_reports_;
      return grpc::Status(fail_code_, "injected failure");
    }
    for (const auto& c : chunks) {
      if (c.has_resumed_from_step()) resumes_.push_back(c.resumed_from_step());
      for (const auto& p : c.points()) {
        Key k{c.job_id(), c.attempt_id(), p.step(), p.name()};
        if (points_.emplace(k, p.value()).second) {
          resp->set_accepted(resp->accepted() + 1);
        } else {
          ++duplicates_;
          resp->set_duplicates(resp->duplicates() + 1);
        }
      }
    }
    return grpc::Status::OK;
  }

  grpc::Status FinishJob(grpc::ServerContext*, const depthbench::v1::FinishJobRequest* req,
                         depthbench::v1::FinishJobResponse* resp) override {
    absl::MutexLock lock(&mu_);
    finishes_.push_back(*req);
    if (fail_finishes_ > 0) {
      --fail_finishes_;
      return grpc::Status(fail_finish_code_, "injected failure");
    }
    for (const auto& p : req->points()) {
      points_.emplace(Key{req->job_id(), req->attempt_id(), p.step(), p.name()}, p.value());
    }
    resp->set_state(depthbench::v1::SUCCEEDED);
    return grpc::Status::OK;
  }

 private:
  mutable absl::Mutex mu_;
  std::map<Key, double> points_;
  std::vector<depthbench::v1::FinishJobRequest> finishes_;
  std::vector<int64_t> resumes_;
  int fail_reports_ = 0;
  grpc::StatusCode fail_code_ = grpc::StatusCode::UNAVAILABLE;
  int fail_finishes_ = 0;
  grpc::StatusCode fail_finish_code_ = grpc::StatusCode::UNAVAILABLE;
  bool stale_ = false;
  int64_t duplicates_ = 0;
  int report_calls_ = 0;
};

// Runs a FakeWorkerService on 127.0.0.1:0.
class FakeSchedulerServer {
 public:
  FakeSchedulerServer() {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
  }
  ~FakeSchedulerServer() { server_->Shutdown(); }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  FakeWorkerService& service() { return service_; }

 private:
  FakeWorkerService service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace depthbench::worker

#endif  // DEPTHBENCH_TESTS_WORKER_FAKE_WORKER_SERVICE_H_
