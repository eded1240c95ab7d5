// The scheduler's metrics wiring in-process: SchedulerObserver events as
// rendered by the registry (FakeClock, no sleeps), the jobs gauge
// (from SQLite at render time) and readiness, and the RPC method-name
// helper.
#include "scheduler/scheduler_metrics.h"

#include <gtest/gtest.h>

#include "common/daemon_metrics.h"
#include "common/metrics.h"
#include "scheduler/rpc_metrics_interceptor.h"
#include "scheduler/scheduler.h"
#include "tests/integration/metrics_scrape.h"
#include "tests/scheduler/test_util.h"

namespace depthbench::scheduler {
namespace {

namespace v1 = ::depthbench::v1;
using depthbench::testing::SampleValue;
using depthbench::testing::TempDb;

class SchedulerMetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = TempDb(std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) +
                   ".db");
    auto metrics = RegisterSchedulerMetrics(&registry_, "test",
                                            [this] { return source_.JobsBySweepAndState(); });
    ASSERT_TRUE(metrics.ok()) << metrics.status();
    observer_ = std::make_unique<SchedulerMetricsObserver>(*metrics);
    SchedulerOptions options;
    options.lease_ttl_ms = 10000;
    options.observer = observer_.get();
    auto s = Scheduler::Open(path_, &clock_, options);
    ASSERT_TRUE(s.ok()) << s.status();
    scheduler_ = std::move(*s);
    source_.Attach(scheduler_.get());
  }

  v1::AcquireJobResponse Acquire(const std::string& worker) {
    v1::AcquireJobRequest req;
    req.set_worker_id(worker);
    auto r = scheduler_->AcquireJob(req);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : v1::AcquireJobResponse();
  }
  void Finish(const v1::AcquireJobResponse& lease, v1::FinishStatus status) {
    v1::FinishJobRequest req;
    req.set_job_id(lease.job_id());
    req.set_attempt_id(lease.attempt_id());
    req.set_status(status);
    req.set_has_val_loss(status == v1::FINISH_SUCCEEDED);
    req.set_final_val_loss(3.0);
    ASSERT_TRUE(scheduler_->FinishJob(req).ok());
  }
  v1::ReportMetricsResponse Report(const v1::AcquireJobResponse& lease, int first, int last) {
    v1::ReportMetricsRequest req;
    req.set_job_id(lease.job_id());
    req.set_attempt_id(lease.attempt_id());
    for (int s = first; s <= last; ++s) {
      auto* p = req.add_points();
      p->set_step(s);
      p->set_name("loss");
      p->set_value(1.0);
    }
    auto r = scheduler_->ReportMetrics(req);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : v1::ReportMetricsResponse();
  }
  double Value(const std::string& series) {
    std::optional<double> v = SampleValue(registry_.Render(), series);
    EXPECT_TRUE(v.has_value()) << "no series " << series << " in\n" << registry_.Render();
    return v.value_or(-1);
  }

  std::string path_;
  FakeClock clock_;
  MetricsRegistry registry_;
  SchedulerScrapeSource source_;
  std::unique_ptr<SchedulerMetricsObserver> observer_;
  std::unique_ptr<Scheduler> scheduler_;
};

TEST_F(SchedulerMetricsTest, LabelledCountersStartAtZero) {
  for (const char* state : kTerminalJobStates) {
    EXPECT_EQ(Value(std::string("depthbench_scheduler_jobs_finished_total{state=\"") + state +
                    "\"}"),
              0);
  }
  for (const char* reason : kRetryReasons) {
    EXPECT_EQ(Value(std::string("depthbench_scheduler_job_retries_total{reason=\"") + reason +
                    "\"}"),
              0);
  }
  EXPECT_EQ(Value("depthbench_scheduler_leases_granted_total"), 0);
  EXPECT_EQ(Value("depthbench_scheduler_workers_connected"), 0);
}

TEST_F(SchedulerMetricsTest, EventsOfASweepReachTheRegistry) {
  ASSERT_TRUE(scheduler_->SubmitSweep(depthbench::testing::SmallSpec(
                                          "m", {"pre_ln"}, {1e-3, 2e-3, 4e-3}))
                  .ok());
  v1::RegisterWorkerRequest reg;
  reg.set_name("w1");
  reg.mutable_resources()->set_slots(4);
  ASSERT_TRUE(scheduler_->RegisterWorker(reg).ok());
  ASSERT_TRUE(scheduler_->ExpireLeases().ok());
  EXPECT_EQ(Value("depthbench_scheduler_workers_connected"), 1);

  v1::AcquireJobResponse a = Acquire("w1");
  ASSERT_TRUE(a.has_job());
  EXPECT_EQ(Report(a, 1, 5).accepted(), 5);
  EXPECT_EQ(Report(a, 3, 6).duplicates(), 3);
  Finish(a, v1::FINISH_SUCCEEDED);
  v1::AcquireJobResponse b = Acquire("w1");
  Finish(b, v1::FINISH_FAILED);  // re-queued with 1 s backoff
  v1::AcquireJobResponse c = Acquire("w1");
  ASSERT_NE(c.job_id(), b.job_id());
  Finish(c, v1::FINISH_DIVERGED);
  clock_.AdvanceMs(1001);
  v1::AcquireJobResponse b2 = Acquire("w1");
  ASSERT_EQ(b2.job_id(), b.job_id());
  clock_.AdvanceMs(10001);  // no heartbeat: the lease expires, w1 is gone
  ASSERT_EQ(*scheduler_->ExpireLeases(), 1);
  ASSERT_TRUE(scheduler_->CancelSweep("m").ok());

  EXPECT_EQ(Value("depthbench_scheduler_leases_granted_total"), 4);
  EXPECT_EQ(Value("depthbench_scheduler_leases_expired_total"), 1);
  EXPECT_EQ(Value("depthbench_scheduler_job_retries_total{reason=\"failed\"}"), 1);
  EXPECT_EQ(Value("depthbench_scheduler_job_retries_total{reason=\"lease_expired\"}"), 1);
  EXPECT_EQ(Value("depthbench_scheduler_jobs_finished_total{state=\"succeeded\"}"), 1);
  EXPECT_EQ(Value("depthbench_scheduler_jobs_finished_total{state=\"diverged\"}"), 1);
  EXPECT_EQ(Value("depthbench_scheduler_jobs_finished_total{state=\"cancelled\"}"), 1);
  EXPECT_EQ(Value("depthbench_scheduler_jobs_finished_total{state=\"failed\"}"), 0);
  EXPECT_EQ(Value("depthbench_scheduler_metric_points_ingested_total"), 6);
  EXPECT_EQ(Value("depthbench_scheduler_metric_points_duplicate_total"), 3);
  EXPECT_EQ(Value("depthbench_scheduler_workers_connected"), 0);
  EXPECT_EQ(Value("depthbench_scheduler_sqlite_transaction_duration_seconds_count"
                  "{txn=\"acquire_job\"}"),
            4);
  EXPECT_EQ(Value("depthbench_scheduler_sqlite_transaction_duration_seconds_count"
                  "{txn=\"finish_job\"}"),
            3);
  EXPECT_EQ(Value("depthbench_scheduler_sqlite_transaction_duration_seconds_count"
                  "{txn=\"report_metrics\"}"),
            2);
  for (const char* txn : {"submit_sweep", "expire_leases", "cancel_sweep"}) {
    EXPECT_EQ(Value(std::string("depthbench_scheduler_sqlite_transaction_duration_seconds_count"
                                "{txn=\"") + txn + "\"}"),
              1)
        << txn;
  }
  // Read from SQLite at render time.
  EXPECT_EQ(Value("depthbench_scheduler_jobs{sweep=\"m\",state=\"succeeded\"}"), 1);
  EXPECT_EQ(Value("depthbench_scheduler_jobs{sweep=\"m\",state=\"diverged\"}"), 1);
  EXPECT_EQ(Value("depthbench_scheduler_jobs{sweep=\"m\",state=\"cancelled\"}"), 1);
  EXPECT_EQ(Value("depthbench_scheduler_jobs{sweep=\"m\",state=\"pending\"}"), 0);
  // Scheduler counters and the exported counters agree.
  SchedulerCounters counters = scheduler_->Counters();
  EXPECT_EQ(counters.leases_granted, 4);
  EXPECT_EQ(counters.jobs_cancelled, 1);
}

TEST_F(SchedulerMetricsTest, ManualRetryAndInterruptionAreRetryReasons) {
  auto spec = depthbench::testing::SmallSpec("r", {"pre_ln"}, {1e-3});
  spec.mutable_retry()->set_max_attempts(1);
  ASSERT_TRUE(scheduler_->SubmitSweep(spec).ok());
  v1::RegisterWorkerRequest reg;
  reg.set_name("w");
  ASSERT_TRUE(scheduler_->RegisterWorker(reg).ok());
  v1::AcquireJobResponse a = Acquire("w");
  Finish(a, v1::FINISH_INTERRUPTED);  // does not use up the attempt
  v1::AcquireJobResponse b = Acquire("w");
  Finish(b, v1::FINISH_FAILED);  // the only attempt: final failure
  EXPECT_EQ(Value("depthbench_scheduler_jobs_finished_total{state=\"failed\"}"), 1);
  EXPECT_EQ(Value("depthbench_scheduler_job_retries_total{reason=\"interrupted\"}"), 1);
  EXPECT_EQ(Value("depthbench_scheduler_job_retries_total{reason=\"failed\"}"), 0);
  v1::RetryJobRequest retry;
  retry.set_job_id(b.job_id());
  ASSERT_TRUE(scheduler_->RetryJob(retry).ok());
  EXPECT_EQ(Value("depthbench_scheduler_job_retries_total{reason=\"manual\"}"), 1);
  EXPECT_EQ(Value("depthbench_scheduler_jobs{sweep=\"r\",state=\"pending\"}"), 1);
}

TEST_F(SchedulerMetricsTest, ScrapeSourceIsReadyOnceAttached) {
  EXPECT_TRUE(source_.CheckReady().ok());
  EXPECT_TRUE(scheduler_->CheckDatabase().ok());
  auto none = source_.JobsBySweepAndState();
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());  // no sweeps yet
  SchedulerScrapeSource detached;
  EXPECT_EQ(detached.CheckReady().code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(detached.JobsBySweepAndState().ok());
}

TEST(RpcMethodNameTest, StripsServicePrefix) {
  EXPECT_EQ(RpcMethodName("/depthbench.v1.WorkerService/AcquireJob"), "AcquireJob");
  EXPECT_EQ(RpcMethodName("Bare"), "Bare");
  EXPECT_EQ(RpcMethodName(nullptr), "unknown");
}

}  // namespace
}  // namespace depthbench::scheduler
