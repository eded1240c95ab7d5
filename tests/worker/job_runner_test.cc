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
#include "common/run_protocol.h"
#include "tests/worker/fake_worker_service.h"

namespace depthbench::worker {
namespace {

namespace v1 = ::depthbench::v1;
namespace fs = std::filesystem;

class JobRunnerReportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = FreshTestDir("job_runner_test");
    client_ = std::make_unique<SchedulerClient>(
        SchedulerClientOptions{server_.address(), "", 5000, ""});
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }

  // A runner of one attempt of a trainer that writes bad UTF-8 to stderr
  // and exits `exit_code`, waiting on `clock`.
  std::unique_ptr<JobRunner> FailingRunner(Clock* clock, int exit_code = 1) {
    std::string script = dir_ + "/trainer.sh";
    std::ofstream(script) << "#!/bin/sh\nprintf 'bad \\377\\n' >&2\n"
                          << "echo 'depthbench-train: error: --config: lr must be positive' >&2\n"
                          << "exit " << exit_code << "\n";
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
    return std::make_unique<JobRunner>(client_.get(), clock, nullptr, options, lease, nullptr);
  }

  // Runs FailingRunner on the real clock; returns what the runner reported.
  v1::FinishStatus RunFailingTrainer() {
    std::unique_ptr<JobRunner> runner = FailingRunner(RealClock::Default());
    runner->Start();
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!runner->done() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_TRUE(runner->done()) << "the runner kept retrying its report";
    return runner->reported();  // the destructor joins the thread
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

// The report's retries wait on the runner's Clock: with a FakeClock nothing
// is retried until the test advances it, and the gaps are 100, 200, 400 ms.
TEST_F(JobRunnerReportTest, TransientFinishErrorsRetryWithBackoffOnTheClock) {
  FakeClock clock;
  server_.service().set_clock(&clock);
  server_.service().FailNextFinishes(3, grpc::StatusCode::UNAVAILABLE);
  std::unique_ptr<JobRunner> runner = FailingRunner(&clock);
  runner->Start();
  ASSERT_TRUE(clock.WaitForPendingWaiters(1, 30000)) << "the report never waited on the clock";
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(server_.service().finishes().size(), 1u) << "retried without the clock moving";
  for (int step = 0; step < 100 && !runner->done(); ++step) {
    if (!clock.WaitForPendingWaiters(1, 2000)) continue;  // reporting, or done
    clock.AdvanceMs(50);
  }
  ASSERT_TRUE(runner->done());
  EXPECT_EQ(runner->reported(), v1::FINISH_FAILED);
  const std::vector<v1::FinishJobRequest> finishes = server_.service().finishes();
  ASSERT_EQ(finishes.size(), 4u);
  EXPECT_EQ(finishes[3].reason(), finishes[0].reason());  // the same report each time
  const std::vector<int64_t> t = server_.service().finish_times();
  ASSERT_EQ(t.size(), 4u);
  EXPECT_EQ((std::vector<int64_t>{t[1] - t[0], t[2] - t[1], t[3] - t[2]}),
            (std::vector<int64_t>{100, 200, 400}));
}

// The failure detail is written through the run protocol: the CLI reads the
// exit code's meaning, the stderr tail and the trainer's own error back.
TEST_F(JobRunnerReportTest, FailureReasonCarriesTheProtocolsFailureDetail) {
  std::unique_ptr<JobRunner> runner = FailingRunner(RealClock::Default(), /*exit_code=*/2);
  runner->Start();
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!runner->done() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(runner->done());
  const std::vector<v1::FinishJobRequest> finishes = server_.service().finishes();
  ASSERT_EQ(finishes.size(), 1u);
  EXPECT_EQ(finishes[0].status(), v1::FINISH_FAILED);
  const run_protocol::FailureDetail detail = run_protocol::ParseFailureDetail(finishes[0].reason());
  EXPECT_EQ(detail.summary, "depthbench-train exit code 2 (invalid input) at step 0");
  EXPECT_NE(detail.stderr_tail.find("bad "), std::string::npos) << detail.stderr_tail;
  ASSERT_TRUE(detail.has_trainer_error);
  EXPECT_EQ(detail.trainer_error, "--config: lr must be positive");
}

}  // namespace
}  // namespace depthbench::worker
