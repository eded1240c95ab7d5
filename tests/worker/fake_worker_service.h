// An in-process WorkerService on a loopback port with fault injection, for
// the worker's unit tests (a fake, not a mock: it stores what it is sent
// and answers like the scheduler would).
#ifndef DEPTHBENCH_TESTS_WORKER_FAKE_WORKER_SERVICE_H_
#define DEPTHBENCH_TESTS_WORKER_FAKE_WORKER_SERVICE_H_

#include <unistd.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>

#include "absl/synchronization/mutex.h"
#include "common/clock.h"
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

  // Calls are stamped with this clock's monotonic time (Worker tests).
  void set_clock(const Clock* clock) {
    absl::MutexLock lock(&mu_);
    clock_ = clock;
  }
  // RegisterWorker answers with this heartbeat interval.
  void set_heartbeat_interval_ms(int64_t ms) {
    absl::MutexLock lock(&mu_);
    heartbeat_interval_ms_ = ms;
  }
  // The next `n` AcquireJob calls fail with `code`.
  void FailNextAcquires(int n, grpc::StatusCode code) {
    absl::MutexLock lock(&mu_);
    fail_acquires_ = n;
    fail_acquire_code_ = code;
  }
  // The next AcquireJob hands out this lease (once).
  void OfferLease(depthbench::v1::AcquireJobResponse lease) {
    absl::MutexLock lock(&mu_);
    offered_.push_back(std::move(lease));
  }
  std::vector<int64_t> register_times() const {
    absl::MutexLock lock(&mu_);
    return register_times_;
  }
  std::vector<int64_t> heartbeat_times() const {
    absl::MutexLock lock(&mu_);
    return heartbeat_times_;
  }
  std::vector<int64_t> finish_times() const {
    absl::MutexLock lock(&mu_);
    return finish_times_;
  }
  std::vector<int64_t> acquire_times() const {
    absl::MutexLock lock(&mu_);
    return acquire_times_;
  }
  // The attempts listed as running by the last heartbeat.
  int last_heartbeat_running() const {
    absl::MutexLock lock(&mu_);
    return last_heartbeat_running_;
  }

  grpc::Status RegisterWorker(grpc::ServerContext*,
                              const depthbench::v1::RegisterWorkerRequest* req,
                              depthbench::v1::RegisterWorkerResponse* resp) override {
    absl::MutexLock lock(&mu_);
    register_times_.push_back(Now());
    resp->set_worker_id(req->name());
    resp->set_heartbeat_interval_ms(heartbeat_interval_ms_);
    resp->set_lease_ttl_ms(3 * heartbeat_interval_ms_);
    return grpc::Status::OK;
  }

  grpc::Status Heartbeat(grpc::ServerContext*, const depthbench::v1::HeartbeatRequest* req,
                         depthbench::v1::HeartbeatResponse*) override {
    absl::MutexLock lock(&mu_);
    heartbeat_times_.push_back(Now());
    last_heartbeat_running_ = req->running_size();
    return grpc::Status::OK;
  }

  grpc::Status AcquireJob(grpc::ServerContext*, const depthbench::v1::AcquireJobRequest*,
                          depthbench::v1::AcquireJobResponse* resp) override {
    absl::MutexLock lock(&mu_);
    acquire_times_.push_back(Now());
    if (fail_acquires_ > 0) {
      --fail_acquires_;
      return grpc::Status(fail_acquire_code_, "injected failure");
    }
    if (!offered_.empty()) {
      *resp = offered_.front();
      offered_.erase(offered_.begin());
    }
    return grpc::Status::OK;
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
    finish_times_.push_back(Now());
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
  int64_t Now() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return clock_ != nullptr ? clock_->NowMonotonicMs() : 0;
  }

  mutable absl::Mutex mu_;
  const Clock* clock_ = nullptr;
  int64_t heartbeat_interval_ms_ = 1000;
  int fail_acquires_ = 0;
  grpc::StatusCode fail_acquire_code_ = grpc::StatusCode::UNAVAILABLE;
  std::vector<depthbench::v1::AcquireJobResponse> offered_;
  std::vector<int64_t> register_times_, heartbeat_times_, acquire_times_, finish_times_;
  int last_heartbeat_running_ = 0;
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

// An empty temp folder named after `prefix`, this process and the running
// test (for a test's run directories and trainer scripts).
inline std::string FreshTestDir(const std::string& prefix) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      (prefix + "_" + std::to_string(getpid()) + "_" +
       ::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

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
