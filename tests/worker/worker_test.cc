// Worker against the fake WorkerService with a FakeClock: polling, backoff
// and heartbeats wait on the injected clock (common/clock.h), so the test
// sees a minute-long poll or a 4 s backoff happen by advancing fake time,
// and sees nothing happen while it does not.
#include "worker/worker.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/clock.h"
#include "tests/worker/fake_worker_service.h"

namespace depthbench::worker {
namespace {

namespace v1 = ::depthbench::v1;
namespace fs = std::filesystem;

constexpr int64_t kLong = 600'000;  // a wait the test never lets pass

class WorkerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = FreshTestDir("worker_test");
    server_.service().set_clock(&clock_);
    client_ = std::make_unique<SchedulerClient>(
        SchedulerClientOptions{server_.address(), "", 5000, ""});
    options_.name = "w1";
    options_.slots = 1;
    options_.checkpoint_root = dir_;
    options_.train_binary = Script("#!/bin/sh\nexit 0\n");
    options_.acquire_poll_ms = kLong;
    options_.initial_backoff_ms = 1000;
    options_.max_backoff_ms = 4000;
    server_.service().set_heartbeat_interval_ms(kLong);
  }

  void TearDown() override {
    Stop();
    if (!HasFailure()) fs::remove_all(dir_);
  }

  std::string Script(const std::string& body) {
    const std::string path = dir_ + "/trainer.sh";
    std::ofstream(path) << body;
    chmod(path.c_str(), 0755);
    return path;
  }

  void Start() {
    worker_ = std::make_unique<Worker>(options_, client_.get(), &clock_, nullptr);
    thread_ = std::thread([this] { run_status_ = worker_->Run(); });
  }

  void Stop() {
    if (!worker_) return;
    worker_->Shutdown();
    thread_.join();
    EXPECT_TRUE(run_status_.ok()) << run_status_;
    worker_.reset();
  }

  // Advances the fake clock in `step_ms` steps, each once the worker's two
  // threads (acquire loop, heartbeats) are blocked on it again, until
  // `done()` or `max_ms` of fake time.
  template <typename Done>
  void AdvanceUntil(Done done, int64_t step_ms, int64_t max_ms) {
    for (int64_t t = 0; t < max_ms && !done(); t += step_ms) {
      ASSERT_TRUE(clock_.WaitForPendingWaiters(2)) << "the worker is not waiting on the clock";
      clock_.AdvanceMs(step_ms);
    }
    ASSERT_TRUE(clock_.WaitForPendingWaiters(2));
  }

  static std::vector<int64_t> Gaps(const std::vector<int64_t>& times) {
    std::vector<int64_t> out;
    for (size_t i = 1; i < times.size(); ++i) out.push_back(times[i] - times[i - 1]);
    return out;
  }

  std::string dir_;
  FakeClock clock_;
  FakeSchedulerServer server_;
  std::unique_ptr<SchedulerClient> client_;
  WorkerOptions options_;
  std::unique_ptr<Worker> worker_;
  std::thread thread_;
  absl::Status run_status_;
};

TEST_F(WorkerTest, IdlePollWaitsForTheFakeClock) {
  options_.acquire_poll_ms = 5000;
  Start();
  ASSERT_TRUE(clock_.WaitForPendingWaiters(2));
  ASSERT_EQ(server_.service().acquire_times().size(), 1u);
  clock_.AdvanceMs(4999);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(server_.service().acquire_times().size(), 1u) << "polled before the fake 5 s passed";
  clock_.AdvanceMs(1);
  ASSERT_TRUE(clock_.WaitForPendingWaiters(2));
  EXPECT_EQ(Gaps(server_.service().acquire_times()), (std::vector<int64_t>{5000}));
}

TEST_F(WorkerTest, TransientAcquireErrorsBackOffExponentiallyUpToTheCap) {
  server_.service().FailNextAcquires(4, grpc::StatusCode::UNAVAILABLE);
  Start();
  AdvanceUntil([&] { return server_.service().acquire_times().size() >= 5; }, 500, 60'000);
  // 1 s, 2 s, 4 s, then the 4 s cap; the fifth call succeeds (no job) and
  // the worker goes back to its (long) poll.
  EXPECT_EQ(Gaps(server_.service().acquire_times()),
            (std::vector<int64_t>{1000, 2000, 4000, 4000}));
}

TEST_F(WorkerTest, HeartbeatsFollowTheIntervalTheSchedulerGave) {
  server_.service().set_heartbeat_interval_ms(2000);
  Start();
  AdvanceUntil([&] { return server_.service().heartbeat_times().size() >= 3; }, 250, 30'000);
  const std::vector<int64_t> beats = server_.service().heartbeat_times();
  ASSERT_GE(beats.size(), 3u);
  ASSERT_EQ(server_.service().register_times().size(), 1u);
  EXPECT_EQ(beats[0] - server_.service().register_times()[0], 2000);
  EXPECT_EQ(Gaps(beats), (std::vector<int64_t>{2000, 2000}));
}

TEST_F(WorkerTest, ShutdownEndsLongWaitsWithoutTheClockMoving) {
  Start();
  ASSERT_TRUE(clock_.WaitForPendingWaiters(2));
  const auto start = std::chrono::steady_clock::now();
  Stop();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(clock_.PendingWaiters(), 0);
}

TEST_F(WorkerTest, LeasedJobRunsAndIsReportedSucceeded) {
  options_.train_binary = Script(
      "#!/bin/sh\n"
      "echo '{\"event\":\"start\",\"step\":0}'\n"
      "echo '{\"event\":\"step\",\"step\":1,\"loss\":2.0,\"lr\":0.001,\"grad_norm\":1,"
      "\"tokens_per_s\":10}'\n"
      "echo '{\"event\":\"done\",\"step\":1,\"status\":\"succeeded\",\"val_loss\":1.5}'\n");
  v1::AcquireJobResponse lease;
  lease.set_has_job(true);
  lease.set_job_id(7);
  lease.set_attempt_id(9);
  lease.set_config_json("{}");
  lease.set_checkpoint_dir("s/7");
  lease.set_kind(v1::TRAIN);
  server_.service().OfferLease(lease);
  Start();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (server_.service().finishes().empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const std::vector<v1::FinishJobRequest> finishes = server_.service().finishes();
  ASSERT_EQ(finishes.size(), 1u);
  EXPECT_EQ(finishes[0].job_id(), 7);
  EXPECT_EQ(finishes[0].status(), v1::FINISH_SUCCEEDED) << finishes[0].reason();
  EXPECT_TRUE(finishes[0].has_val_loss());
  EXPECT_DOUBLE_EQ(finishes[0].final_val_loss(), 1.5);
  EXPECT_TRUE(fs::is_directory(dir_ + "/s/7"));
}

}  // namespace
}  // namespace depthbench::worker
