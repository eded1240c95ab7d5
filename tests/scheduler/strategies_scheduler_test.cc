// Successive halving and LR transfer through the Scheduler (issue 15): a
// real SQLite file, a fake clock, hand-written losses.
#include <map>
#include <optional>
#include <string>

#include <gtest/gtest.h>

#include "scheduler/scheduler.h"
#include "tests/scheduler/test_util.h"

namespace depthbench::scheduler {
namespace {

namespace v1 = ::depthbench::v1;
using depthbench::testing::SmallSpec;
using depthbench::testing::TempDb;

class StrategiesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = TempDb(std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) +
                   ".db");
    Reopen();
  }
  void Reopen() {
    scheduler_.reset();
    SchedulerOptions options;
    options.lease_ttl_ms = 10000;
    auto s = Scheduler::Open(path_, &clock_, options);
    ASSERT_TRUE(s.ok()) << s.status();
    scheduler_ = std::move(*s);
  }
  v1::AcquireJobResponse Acquire(const std::string& worker) {
    return depthbench::testing::AcquireFor(*scheduler_, worker);
  }
  absl::StatusOr<v1::ReportMetricsResponse> ReportVal(const v1::AcquireJobResponse& lease,
                                                      int64_t step, double loss) {
    v1::ReportMetricsRequest req;
    req.set_job_id(lease.job_id());
    req.set_attempt_id(lease.attempt_id());
    auto* p = req.add_points();
    p->set_step(step);
    p->set_name("val_loss");
    p->set_value(loss);
    return scheduler_->ReportMetrics(req);
  }
  absl::StatusOr<v1::FinishJobResponse> Finish(const v1::AcquireJobResponse& lease,
                                               v1::FinishStatus status, double loss,
                                               int64_t final_step) {
    v1::FinishJobRequest req;
    req.set_job_id(lease.job_id());
    req.set_attempt_id(lease.attempt_id());
    req.set_status(status);
    req.set_has_val_loss(status == v1::FINISH_SUCCEEDED);
    req.set_final_val_loss(loss);
    req.set_final_step(final_step);
    return scheduler_->FinishJob(req);
  }
  // The next train job for `worker` (diagnose jobs leased on the way are
  // left running); an empty lease when none is runnable.
  v1::AcquireJobResponse AcquireTrain(const std::string& worker) {
    while (true) {
      v1::AcquireJobResponse lease = Acquire(worker);
      if (!lease.has_job() || lease.kind() == v1::TRAIN) return lease;
    }
  }
  v1::Job Job(int64_t id) {
    auto job = scheduler_->GetJob(id);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : v1::Job();
  }
  const v1::ResultRow* Row(const v1::QueryResultsResponse& r, int64_t layers) {
    for (const auto& row : r.rows()) {
      if (row.layers() == layers) return &row;
    }
    return nullptr;
  }
  int CountDiagnose(const std::string& sweep) {
    v1::ListJobsRequest req;
    req.set_sweep(sweep);
    req.set_page_size(1000);
    auto jobs = scheduler_->ListJobs(req);
    EXPECT_TRUE(jobs.ok());
    int n = 0;
    if (jobs.ok()) {
      for (const auto& j : jobs->jobs()) n += j.kind() == v1::DIAGNOSE;
    }
    return n;
  }

  FakeClock clock_;
  std::string path_;
  std::unique_ptr<Scheduler> scheduler_;
};

// 5 LRs, 90 steps evaluated every 10: rungs 1/9, 1/3 at steps 10 and 30.
v1::SweepSpec HalvingSpec(const std::string& name) {
  v1::SweepSpec spec = SmallSpec(name, {"pre_ln"}, {1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2});
  spec.mutable_training()->set_steps(90);
  spec.mutable_training()->set_eval_interval(10);
  spec.mutable_strategy()->set_kind("successive_halving");
  return spec;
}

TEST_F(StrategiesTest, InvalidStrategyNamesTheFieldAndCreatesNothing) {
  v1::SweepSpec spec = HalvingSpec("bad");
  spec.mutable_strategy()->set_reduction_factor(1);
  auto r = scheduler_->SubmitSweep(spec);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("spec.strategy.reduction_factor"), std::string::npos)
      << r.status();
  spec = HalvingSpec("bad2");
  spec.mutable_training()->set_eval_interval(40);  // 1/9 and 1/3 both round to 40
  r = scheduler_->SubmitSweep(spec);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("spec.strategy.rungs[1]"), std::string::npos)
      << r.status();
  EXPECT_FALSE(scheduler_->GetSweep("bad").ok());
  EXPECT_FALSE(scheduler_->GetSweep("bad2").ok());
}

TEST_F(StrategiesTest, EvalIntervalIsSetSoEveryRungIsEvaluated) {
  v1::SweepSpec spec = HalvingSpec("evals");
  spec.mutable_training()->clear_eval_interval();  // trainer default: end only
  ASSERT_TRUE(scheduler_->SubmitSweep(spec).ok());
  depthbench::testing::RegisterWorker(*scheduler_, "w", 1);
  auto lease = Acquire("w");
  ASSERT_TRUE(lease.has_job());
  EXPECT_NE(lease.config_json().find("\"eval_interval\":10"), std::string::npos)
      << lease.config_json();
}

TEST_F(StrategiesTest, PrunesLosersAtRungsFreesTheSlotAndSurvivesARestart) {
  ASSERT_TRUE(scheduler_->SubmitSweep(HalvingSpec("sh")).ok());
  depthbench::testing::RegisterWorker(*scheduler_, "w", 4);
  std::vector<v1::AcquireJobResponse> leases;
  for (int i = 0; i < 4; ++i) leases.push_back(Acquire("w"));
  EXPECT_FALSE(Acquire("w").has_job());  // 4 slots full; the 5th LR waits

  // Rung 0: the first arrival continues; a worse second one is pruned.
  auto a = ReportVal(leases[0], 10, 5.0);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->stop_reason(), "");
  auto b = ReportVal(leases[1], 10, 6.0);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NE(b->stop_reason().find("pruned at rung 0 (step 10)"), std::string::npos)
      << b->stop_reason();
  v1::Job pruned = Job(leases[1].job_id());
  EXPECT_EQ(pruned.state(), v1::PRUNED);
  EXPECT_EQ(pruned.final_step(), 10);
  EXPECT_DOUBLE_EQ(pruned.final_val_loss(), 6.0);
  EXPECT_EQ(pruned.attempts_used(), 1);
  ASSERT_FALSE(pruned.checkpoint_dir().empty());
  // Its later reports are refused; its worker is told to stop it.
  EXPECT_EQ(ReportVal(leases[1], 20, 5.9).status().code(),
            absl::StatusCode::kFailedPrecondition);
  v1::HeartbeatRequest hb;
  hb.set_worker_id("w");
  auto* run = hb.add_running();
  run->set_job_id(leases[1].job_id());
  run->set_attempt_id(leases[1].attempt_id());
  auto beat = scheduler_->Heartbeat(hb);
  ASSERT_TRUE(beat.ok());
  ASSERT_EQ(beat->cancellations_size(), 1);
  EXPECT_EQ(beat->cancellations(0).reason(), "job already pruned");
  // Its slot runs the next job.
  auto fifth = Acquire("w");
  ASSERT_TRUE(fifth.has_job());

  // Restart in the middle: decisions are durable and not repeated.
  Reopen();
  auto replay = ReportVal(leases[0], 10, 5.0);  // a resumed attempt re-sends it
  ASSERT_TRUE(replay.ok()) << replay.status();
  EXPECT_EQ(replay->stop_reason(), "");
  EXPECT_EQ(Job(leases[0].job_id()).state(), v1::RUNNING);
  // n = 3 at rung 0 (A 5.0, B 6.0, C 4.0): C is the best, continues.
  auto c = ReportVal(leases[2], 10, 4.0);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->stop_reason(), "");
  // Divergence: D and E diverge before rung 0 (losers at every rung; the
  // worker relays no non-finite loss, the trainer's diverged flag comes
  // with FinishJob).
  ASSERT_TRUE(Finish(leases[3], v1::FINISH_DIVERGED, 0, 7).ok());
  ASSERT_TRUE(Finish(fifth, v1::FINISH_DIVERGED, 0, 5).ok());
  // Rung 1: C arrives first (continues; n 3 with D and E), then A (n 4,
  // rank 2, quota 1: pruned).
  EXPECT_EQ(ReportVal(leases[2], 30, 3.0)->stop_reason(), "");
  EXPECT_NE(ReportVal(leases[0], 30, 3.5)->stop_reason().find("pruned at rung 1 (step 30)"),
            std::string::npos);
  // The group is decided once C ends: best LR is C's.
  auto before = scheduler_->QueryResults("sh");
  ASSERT_TRUE(before.ok());
  EXPECT_FALSE(before->rows(0).complete());
  ASSERT_TRUE(Finish(leases[2], v1::FINISH_SUCCEEDED, 2.5, 90).ok());
  auto results = scheduler_->QueryResults("sh");
  ASSERT_TRUE(results.ok()) << results.status();
  const v1::ResultRow& row = results->rows(0);
  EXPECT_TRUE(row.complete());
  EXPECT_TRUE(row.has_best());
  EXPECT_DOUBLE_EQ(row.best_lr(), 4e-3);
  std::map<double, v1::LrLoss> by_lr;
  for (const auto& l : row.lrs()) by_lr[l.lr()] = l;
  EXPECT_EQ(by_lr[1e-3].pruned_runs(), 1);  // A at rung 1
  EXPECT_EQ(by_lr[1e-3].pruned_rung(), 1);
  EXPECT_EQ(by_lr[2e-3].pruned_runs(), 1);  // B at rung 0
  EXPECT_EQ(by_lr[2e-3].pruned_rung(), 0);
  EXPECT_EQ(by_lr[4e-3].succeeded(), 1);
  EXPECT_EQ(by_lr[4e-3].pruned_rung(), -1);
  EXPECT_EQ(by_lr[8e-3].diverged_runs(), 1);
  EXPECT_EQ(by_lr[1.6e-2].diverged_runs(), 1);
  EXPECT_EQ(by_lr[1.6e-2].pruned_runs(), 0);
  // Tokens: steps trained 30 + 10 + 90 + 7 + 5 of 5 x 90, 16 x 32 tokens a step.
  const int64_t per_step = 16 * 32;
  EXPECT_EQ(row.grid_tokens(), 5 * 90 * per_step);
  EXPECT_EQ(row.tokens_trained(), (30 + 10 + 90 + 7 + 5) * per_step);
  EXPECT_EQ(by_lr[1e-3].tokens_trained(), 30 * per_step);
}

TEST_F(StrategiesTest, ARunFinishingAtARungStillCountsThereButIsNotPruned) {
  ASSERT_TRUE(scheduler_->SubmitSweep(HalvingSpec("fin")).ok());
  depthbench::testing::RegisterWorker(*scheduler_, "w", 2);
  auto first = Acquire("w");
  auto second = Acquire("w");
  ASSERT_TRUE(ReportVal(first, 10, 4.0).ok());
  // The second run's rung-0 loss comes with its FinishJob: recorded, not pruned.
  v1::FinishJobRequest req;
  req.set_job_id(second.job_id());
  req.set_attempt_id(second.attempt_id());
  req.set_status(v1::FINISH_SUCCEEDED);
  req.set_has_val_loss(true);
  req.set_final_val_loss(3.0);
  req.set_final_step(90);
  auto* p = req.add_points();
  p->set_step(10);
  p->set_name("val_loss");
  p->set_value(9.0);
  ASSERT_TRUE(scheduler_->FinishJob(req).ok());
  EXPECT_EQ(Job(second.job_id()).state(), v1::SUCCEEDED);
  // It counts at rung 0: a third run at 5.0 ranks 2 of 3 and is pruned.
  auto third = Acquire("w");
  ASSERT_TRUE(third.has_job());
  EXPECT_NE(ReportVal(third, 10, 5.0)->stop_reason(), "");
}

// Two shapes (2x64 reference, 4x64), five LRs.
v1::SweepSpec TransferSpec(const std::string& name) {
  v1::SweepSpec spec = SmallSpec(name, {"pre_ln"}, {1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2});
  auto* other = spec.mutable_shapes()->add_explicit_shapes();
  other->set_layers(4);
  other->set_d_model(64);
  spec.mutable_strategy()->set_kind("lr_transfer");
  spec.mutable_diagnostics()->add_kinds("angular");
  return spec;
}

TEST_F(StrategiesTest, LrTransferRunsTheNeighbourhoodWidensAtAnEdgeAndSkipsTheRest) {
  ASSERT_TRUE(scheduler_->SubmitSweep(TransferSpec("tr")).ok());
  depthbench::testing::RegisterWorker(*scheduler_, "w", 32);
  // Only the reference shape's five LRs can be leased.
  std::map<double, v1::AcquireJobResponse> ref;
  for (int i = 0; i < 5; ++i) {
    auto lease = AcquireTrain("w");
    ASSERT_TRUE(lease.has_job());
    v1::Job job = Job(lease.job_id());
    EXPECT_EQ(job.layers(), 2);
    ref[job.lr()] = lease;
  }
  EXPECT_FALSE(AcquireTrain("w").has_job());
  // The reference's best is the top LR (a grid edge).
  const std::map<double, double> ref_loss = {
      {1e-3, 3.0}, {2e-3, 2.8}, {4e-3, 2.6}, {8e-3, 2.4}, {1.6e-2, 2.2}};
  for (auto& [lr, lease] : ref) ASSERT_TRUE(Finish(lease, v1::FINISH_SUCCEEDED, ref_loss.at(lr), 10).ok());
  EXPECT_EQ(CountDiagnose("tr"), 1);  // the reference group is decided
  // 4x64 starts on 4e-3, 8e-3, 1.6e-2 (best and neighbours, shifted in).
  std::map<double, v1::AcquireJobResponse> other;
  for (int i = 0; i < 3; ++i) {
    auto lease = AcquireTrain("w");
    ASSERT_TRUE(lease.has_job());
    other[Job(lease.job_id()).lr()] = lease;
  }
  EXPECT_FALSE(AcquireTrain("w").has_job());
  ASSERT_EQ(other.size(), 3u);
  EXPECT_TRUE(other.count(4e-3) && other.count(8e-3) && other.count(1.6e-2));
  // Its best is 4e-3, the sub-grid's lower edge: widen to 2e-3.
  ASSERT_TRUE(Finish(other[8e-3], v1::FINISH_SUCCEEDED, 2.5, 10).ok());
  ASSERT_TRUE(Finish(other[1.6e-2], v1::FINISH_DIVERGED, 0, 4).ok());
  ASSERT_TRUE(Finish(other[4e-3], v1::FINISH_SUCCEEDED, 2.3, 10).ok());
  EXPECT_EQ(CountDiagnose("tr"), 1);  // a widening is pending: not decided
  auto widened = AcquireTrain("w");
  ASSERT_TRUE(widened.has_job());
  EXPECT_DOUBLE_EQ(Job(widened.job_id()).lr(), 2e-3);
  auto mid = scheduler_->QueryResults("tr");
  ASSERT_TRUE(mid.ok());
  EXPECT_FALSE(Row(*mid, 4)->complete());
  // 2e-3 is worse: the group is decided; 1e-3 is never run.
  ASSERT_TRUE(Finish(widened, v1::FINISH_SUCCEEDED, 2.4, 10).ok());
  EXPECT_FALSE(AcquireTrain("w").has_job());
  EXPECT_EQ(CountDiagnose("tr"), 2);
  auto results = scheduler_->QueryResults("tr");
  ASSERT_TRUE(results.ok());
  const v1::ResultRow* row = Row(*results, 4);
  ASSERT_NE(row, nullptr);
  EXPECT_TRUE(row->complete());
  EXPECT_DOUBLE_EQ(row->best_lr(), 4e-3);
  std::map<double, v1::LrLoss> by_lr;
  for (const auto& l : row->lrs()) by_lr[l.lr()] = l;
  EXPECT_EQ(by_lr[1e-3].never_run(), 1);
  EXPECT_EQ(by_lr[2e-3].never_run(), 0);
  const int64_t per_step = 16 * 32;
  EXPECT_EQ(row->grid_tokens(), 5 * 10 * per_step);
  EXPECT_EQ(row->tokens_trained(), (10 + 10 + 4 + 10) * per_step);
  auto sweep = scheduler_->GetSweep("tr");
  ASSERT_TRUE(sweep.ok());
  EXPECT_EQ(sweep->job_counts().at("skipped"), 1);
}

TEST_F(StrategiesTest, LrTransferAndHalvingCompose) {
  v1::SweepSpec spec = TransferSpec("both");
  spec.mutable_training()->set_steps(90);
  spec.mutable_training()->set_eval_interval(10);
  spec.mutable_strategy()->set_kind("successive_halving+lr_transfer");
  spec.mutable_strategy()->set_reference_shape("4x64");
  ASSERT_TRUE(scheduler_->SubmitSweep(spec).ok());
  depthbench::testing::RegisterWorker(*scheduler_, "w", 32);
  std::vector<v1::AcquireJobResponse> ref;
  for (int i = 0; i < 5; ++i) {
    ref.push_back(AcquireTrain("w"));
    EXPECT_EQ(Job(ref.back().job_id()).layers(), 4);  // the named reference
  }
  // Rung 0 in LR order, each worse than the first: all but 1e-3 pruned.
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(ReportVal(ref[i], 10, 3.0 + i).ok());
  for (int i = 1; i < 5; ++i) EXPECT_EQ(Job(ref[i].job_id()).state(), v1::PRUNED);
  EXPECT_FALSE(AcquireTrain("w").has_job());  // the reference is not decided yet
  ASSERT_TRUE(Finish(ref[0], v1::FINISH_SUCCEEDED, 2.0, 90).ok());
  // 2x64 starts on the three lowest LRs.
  int started = 0;
  while (AcquireTrain("w").has_job()) ++started;
  EXPECT_EQ(started, 3);
}

}  // namespace
}  // namespace depthbench::scheduler
