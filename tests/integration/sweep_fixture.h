// The fixture the worker integration tests share (worker_integration_test,
// worker_faults_test; scheduler_tls_test takes OneJobSpec): a temp dir with a checkpoint root, the real
// depthbench-scheduler on a loopback port over a SQLite file there, and the
// SweepService calls the tests make against it.
#ifndef DEPTHBENCH_TESTS_INTEGRATION_SWEEP_FIXTURE_H_
#define DEPTHBENCH_TESTS_INTEGRATION_SWEEP_FIXTURE_H_

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>

#include "depthbench/v1/sweep_service.grpc.pb.h"
#include "tests/integration/scheduler_process.h"

namespace depthbench::testing {

// A sweep of one job: pre_ln, 2 x 64, lr 1e-3, 1 step.
inline ::depthbench::v1::SweepSpec OneJobSpec(const std::string& name) {
  ::depthbench::v1::SweepSpec spec;
  spec.set_name(name);
  spec.add_architectures("pre_ln");
  (*spec.mutable_lr_grids())["pre_ln"].add_lrs(1e-3);
  auto* shape = spec.mutable_shapes()->add_explicit_shapes();
  shape->set_layers(2);
  shape->set_d_model(64);
  spec.mutable_training()->set_steps(1);
  return spec;
}

class SweepFixture : public ::testing::Test {
 protected:
  // dir_ = a fresh temp dir named `prefix` + the test's name; root_ =
  // dir_/checkpoints (created).
  void MakeDirs(const std::string& prefix) {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = MakeTempDir(prefix + info->name());
    root_ = dir_ + "/checkpoints";
    std::filesystem::create_directories(root_);
  }

  // The scheduler on dir_/s.db with the given lease TTL, and stub_ to it.
  void StartScheduler(int64_t lease_ttl_ms) {
    server_ = std::make_unique<SchedulerProcess>(
        dir_ + "/s.db", dir_,
        std::vector<std::string>{"--lease-ttl-ms", std::to_string(lease_ttl_ms)});
    ASSERT_TRUE(server_->Start()) << "scheduler did not start; see " << dir_;
    Connect();
  }

  // A new channel to the scheduler (after it restarted).
  void Connect() {
    stub_ = ::depthbench::v1::SweepService::NewStub(
        grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  }

  void Submit(const ::depthbench::v1::SweepSpec& spec) {
    ::depthbench::v1::SubmitSweepRequest req;
    *req.mutable_spec() = spec;
    ::depthbench::v1::SubmitSweepResponse resp;
    grpc::Status s = stub_->SubmitSweep(Ctx().get(), req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }

  std::optional<::depthbench::v1::Sweep> GetSweep(const std::string& name) {
    ::depthbench::v1::GetSweepRequest req;
    req.set_name(name);
    ::depthbench::v1::Sweep sweep;
    if (!stub_->GetSweep(Ctx(2000).get(), req, &sweep).ok()) return std::nullopt;
    return sweep;
  }

  std::vector<::depthbench::v1::Job> Jobs(const std::string& sweep) {
    ::depthbench::v1::ListJobsRequest req;
    req.set_sweep(sweep);
    req.set_page_size(1000);
    ::depthbench::v1::ListJobsResponse resp;
    grpc::Status s = stub_->ListJobs(Ctx().get(), req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return {resp.jobs().begin(), resp.jobs().end()};
  }

  ::depthbench::v1::Job GetJob(int64_t id) {
    ::depthbench::v1::GetJobRequest req;
    req.set_job_id(id);
    ::depthbench::v1::Job job;
    grpc::Status s = stub_->GetJob(Ctx().get(), req, &job);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return job;
  }

  std::string dir_, root_;
  std::unique_ptr<SchedulerProcess> server_;
  std::unique_ptr<::depthbench::v1::SweepService::Stub> stub_;
};

}  // namespace depthbench::testing

#endif  // DEPTHBENCH_TESTS_INTEGRATION_SWEEP_FIXTURE_H_
