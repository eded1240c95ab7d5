// JobRunner's FinishJob delivery against a fault-injecting fake
// WorkerService (issue 20): a report the scheduler refuses for good is
// replaced once by a minimal report, never retried for ever. The trainer
// is a /bin/sh script.
#include "worker/job_runner.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "common/clock.h"
#include "tests/worker/fake_worker_service.h"

namespace depthbench::worker {
namespace {

namespace v1 = ::depthbench::v1;
namespace fs = std::filesystem;

class JobRunnerReportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("job_runner_test_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    client_ = std::make_unique<SchedulerClient>(
        SchedulerClientOptions{server_.address(), "", 5000, ""});
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }

  // Runs one attempt of a trainer that writes bad UTF-8 to stderr and exits
  // 1; returns what the runner reported.
  v1::FinishStatus RunFailingTrainer() {
    std::string script = dir_ + "/trainer.sh";
    std::ofstream(script) << "#!/bin/sh\nprintf 'bad \\377\\n' >&2\nexit 1\n";
    chmod(script.c_str(), 0755);
    JobRunnerOptions options;
    options.train_binary = script;
    options.checkpoint_root = dir_;
    v1::AcquireJobResponse lease;
    lease.set_job_id(1);
    lease.set_attempt_id(2);
    lease.set_config_json("{}");
    lease.set_checkpoint_dir("s/1");
    lease.set_kind(v1::TRAIN);
    JobRunner runner(client_.get(), RealClock::Default(), nullptr, options, lease, nullptr);
    runner.Start();
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!runner.done() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_TRUE(runner.done()) << "the runner kept retrying its report";
    return runner.reported();  // the destructor joins the thread
  }

  std::string dir_;
  FakeSchedulerServer server_;
  std::unique_ptr<SchedulerClient> client_;
};

TEST_F(JobRunnerReportTest, ResourceExhaustedFallsBackToAMinimalReport) {
  server_.service().FailNextFinishes(1, grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(RunFailingTrainer(), v1::FINISH_FAILED);
  auto finishes = server_.service().finishes();
  ASSERT_EQ(finishes.size(), 2u);
  EXPECT_NE(finishes[0].reason().find("bad \xEF\xBF\xBD"), std::string::npos)
      << finishes[0].reason();  // sanitized at the edge
  EXPECT_NE(finishes[1].reason().find("full report undeliverable: RESOURCE_EXHAUSTED"),
            std::string::npos)
      << finishes[1].reason();
  EXPECT_EQ(finishes[1].status(), v1::FINISH_FAILED);
}

TEST_F(JobRunnerReportTest, RepeatedInternalFallsBackAfterThreeTries) {
  server_.service().FailNextFinishes(3, grpc::StatusCode::INTERNAL);
  EXPECT_EQ(RunFailingTrainer(), v1::FINISH_FAILED);
  auto finishes = server_.service().finishes();
  ASSERT_EQ(finishes.size(), 4u);
  EXPECT_EQ(finishes[2].reason(), finishes[0].reason());  // retried as is twice
  EXPECT_NE(finishes[3].reason().find("full report undeliverable: INTERNAL"), std::string::npos)
      << finishes[3].reason();
}

TEST_F(JobRunnerReportTest, RefusedMinimalReportEndsTheAttemptUnreported) {
  server_.service().FailNextFinishes(100, grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(RunFailingTrainer(), v1::FINISH_STATUS_UNSPECIFIED);
  EXPECT_EQ(server_.service().finishes().size(), 2u);  // full, minimal, then stop
}

}  // namespace
}  // namespace depthbench::worker
