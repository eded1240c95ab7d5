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

// The scenario of the next test in four steps (leases_ A..E: the five LRs
// in ascending order, on one worker with four slots).
class HalvingScenarioTest : public StrategiesTest {
 protected:
  // Rung 0: the first arrival pauses, its reports are refused, its worker
  // is told to stop it, and its slot runs the fifth_ LR.
  void PauseFirstArrivalAndReuseItsSlot() {
    // Rung 0: the first arrival is 1 of 1, top floor(1/3) = 0: paused.
    auto a = ReportVal(leases_[0], 10, 5.0);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_NE(a->stop_reason().find("paused at rung 0 (step 10)"), std::string::npos)
        << a->stop_reason();
    v1::Job paused = Job(a_id_);
    EXPECT_EQ(paused.state(), v1::PAUSED);
    EXPECT_EQ(paused.final_step(), 10);
    EXPECT_EQ(paused.attempts_used(), 0);  // a pause uses no attempt
    // Its later reports are refused; its worker is told to stop it.
    EXPECT_EQ(ReportVal(leases_[0], 20, 4.9).status().code(),
              absl::StatusCode::kFailedPrecondition);
    v1::HeartbeatRequest hb;
    hb.set_worker_id("w");
    auto* run = hb.add_running();
    run->set_job_id(a_id_);
    run->set_attempt_id(leases_[0].attempt_id());
    auto beat = scheduler_->Heartbeat(hb);
    ASSERT_TRUE(beat.ok());
    ASSERT_EQ(beat->cancellations_size(), 1);
    EXPECT_EQ(beat->cancellations(0).reason(), "job already paused");
    // Its slot runs the next job, not the paused one.
    fifth_ = Acquire("w");
    ASSERT_TRUE(fifth_.has_job());
    EXPECT_NE(fifth_.job_id(), a_id_);
    EXPECT_FALSE(Acquire("w").has_job());
    EXPECT_NE(ReportVal(leases_[1], 10, 6.0)->stop_reason().find("paused"), std::string::npos);
  }

  // A restart keeps the pauses; a later, worse arrival promotes A, which
  // resumes from its checkpoint; E completes rung 0 and prunes the rest.
  void RestartPromoteAndCompleteRungZero() {
    // Restart in the middle: decisions (pauses included) are durable.
    Reopen();
    EXPECT_EQ(Job(a_id_).state(), v1::PAUSED);
    // C arrives worse (n 3, top 1): paused, and A, now first of 3, is
    // promoted: pending again, leased again, resuming from its checkpoint.
    EXPECT_NE(ReportVal(leases_[2], 10, 7.0)->stop_reason().find("paused"), std::string::npos);
    v1::Job promoted = Job(a_id_);
    EXPECT_EQ(promoted.state(), v1::PENDING);
    EXPECT_NE(promoted.reason().find("promoted at rung 0"), std::string::npos)
        << promoted.reason();
    a2_ = Acquire("w");
    ASSERT_EQ(a2_.job_id(), a_id_);
    EXPECT_NE(a2_.attempt_id(), leases_[0].attempt_id());
    EXPECT_EQ(a2_.checkpoint_dir(), leases_[0].checkpoint_dir());  // where it resumes
    EXPECT_EQ(Job(a_id_).attempts_used(), 1);
    ASSERT_TRUE(ReportVal(a2_, 20, 4.5).ok());
    // The rung-0 point a resumed attempt re-sends is not decided again.
    EXPECT_EQ(ReportVal(a2_, 10, 5.0)->stop_reason(), "");
    // D is the best so far (n 4, top 1): it continues at once.
    EXPECT_EQ(ReportVal(leases_[3], 10, 4.0)->stop_reason(), "");
    // E completes rung 0 (n 5, top max(1, 1)): A and D continue, every paused
    // run is pruned, E too.
    auto e = ReportVal(fifth_, 10, 8.0);
    ASSERT_TRUE(e.ok());
    EXPECT_NE(e->stop_reason().find("pruned at rung 0 (step 10)"), std::string::npos)
        << e->stop_reason();
    v1::Job pruned = Job(leases_[1].job_id());
    EXPECT_EQ(pruned.state(), v1::PRUNED);
    EXPECT_EQ(pruned.final_step(), 10);
    EXPECT_DOUBLE_EQ(pruned.final_val_loss(), 6.0);
    EXPECT_NE(pruned.reason().find("ranks 3 of 5, top 1"), std::string::npos) << pruned.reason();
    EXPECT_EQ(Job(leases_[2].job_id()).state(), v1::PRUNED);
    EXPECT_EQ(Job(fifth_.job_id()).state(), v1::PRUNED);
    EXPECT_EQ(Job(leases_[3].job_id()).state(), v1::RUNNING);
  }

  // Rung 1: D paused first, then promoted when A completes the rung.
  void CompleteRungOne() {
    // Rung 1: D arrives first (paused, A still to come); A completes it:
    // D promoted, A pruned.
    EXPECT_NE(ReportVal(leases_[3], 30, 3.0)->stop_reason().find("paused at rung 1"),
              std::string::npos);
    EXPECT_NE(ReportVal(a2_, 30, 3.5)->stop_reason().find("pruned at rung 1 (step 30)"),
              std::string::npos);
    EXPECT_EQ(Job(leases_[3].job_id()).state(), v1::PENDING);
    d2_ = Acquire("w");
    ASSERT_EQ(d2_.job_id(), leases_[3].job_id());
  }

  // D ends: the group is decided, with pruned rungs and tokens per LR.
  void FinishAndCheckTheDecidedGroup() {
    // The group is decided once D ends: best LR is D's.
    auto before = scheduler_->QueryResults("sh");
    ASSERT_TRUE(before.ok());
    EXPECT_FALSE(before->rows(0).complete());
    ASSERT_TRUE(Finish(d2_, v1::FINISH_SUCCEEDED, 2.5, 90).ok());
    auto results = scheduler_->QueryResults("sh");
    ASSERT_TRUE(results.ok()) << results.status();
    const v1::ResultRow& row = results->rows(0);
    EXPECT_TRUE(row.complete());
    EXPECT_TRUE(row.has_best());
    EXPECT_DOUBLE_EQ(row.best_lr(), 8e-3);
    std::map<double, v1::LrLoss> by_lr;
    for (const auto& l : row.lrs()) by_lr[l.lr()] = l;
    EXPECT_EQ(by_lr[1e-3].pruned_runs(), 1);  // A at rung 1
    EXPECT_EQ(by_lr[1e-3].pruned_rung(), 1);
    EXPECT_EQ(by_lr[2e-3].pruned_runs(), 1);  // B at rung 0
    EXPECT_EQ(by_lr[2e-3].pruned_rung(), 0);
    EXPECT_EQ(by_lr[8e-3].succeeded(), 1);
    EXPECT_EQ(by_lr[8e-3].pruned_rung(), -1);
    EXPECT_EQ(by_lr[1.6e-2].pruned_runs(), 1);
    // Tokens: steps trained 30 + 10 + 10 + 90 + 10 of 5 x 90 (a resumed run
    // is counted once), 16 x 32 tokens a step.
    const int64_t per_step = 16 * 32;
    EXPECT_EQ(row.grid_tokens(), 5 * 90 * per_step);
    EXPECT_EQ(row.tokens_trained(), (30 + 10 + 10 + 90 + 10) * per_step);
    EXPECT_EQ(by_lr[1e-3].tokens_trained(), 30 * per_step);
  }

  std::vector<v1::AcquireJobResponse> leases_;
  v1::AcquireJobResponse fifth_, a2_, d2_;
  int64_t a_id_ = 0;
};

TEST_F(HalvingScenarioTest, PausesPromotesAndPrunesAtRungsFreesTheSlotAndSurvivesARestart) {
  ASSERT_TRUE(scheduler_->SubmitSweep(HalvingSpec("sh")).ok());
  depthbench::testing::RegisterWorker(*scheduler_, "w", 4);
  // A..E: the five LRs in ascending order.
  for (int i = 0; i < 4; ++i) leases_.push_back(Acquire("w"));
  EXPECT_FALSE(Acquire("w").has_job());  // 4 slots full; the 5th LR waits
  a_id_ = leases_[0].job_id();

  PauseFirstArrivalAndReuseItsSlot();
  if (HasFatalFailure()) return;
  RestartPromoteAndCompleteRungZero();
  if (HasFatalFailure()) return;
  CompleteRungOne();
  if (HasFatalFailure()) return;
  FinishAndCheckTheDecidedGroup();
}

TEST_F(StrategiesTest, ARunEndingCompletesARungAndResolvesThePausedRuns) {
  v1::SweepSpec spec = HalvingSpec("end");
  auto& grid = (*spec.mutable_lr_grids())["pre_ln"];
  grid.clear_lrs();
  for (double lr : {1e-3, 2e-3, 4e-3}) grid.add_lrs(lr);
  ASSERT_TRUE(scheduler_->SubmitSweep(spec).ok());
  depthbench::testing::RegisterWorker(*scheduler_, "w", 3);
  auto a = Acquire("w");
  auto b = Acquire("w");
  auto c = Acquire("w");
  EXPECT_NE(ReportVal(a, 10, 5.0)->stop_reason(), "");  // paused, 1 of 1
  EXPECT_NE(ReportVal(b, 10, 4.0)->stop_reason(), "");  // paused, 2 of 2
  // C diverges before rung 0: a loser there (n 3, complete, top 1): B is
  // promoted, A pruned.
  ASSERT_TRUE(Finish(c, v1::FINISH_DIVERGED, 0, 5).ok());
  EXPECT_EQ(Job(b.job_id()).state(), v1::PENDING);
  EXPECT_EQ(Job(a.job_id()).state(), v1::PRUNED);
}

TEST_F(StrategiesTest, ARunFinishingAtARungStillCountsThereButIsNotPruned) {
  ASSERT_TRUE(scheduler_->SubmitSweep(HalvingSpec("fin")).ok());
  depthbench::testing::RegisterWorker(*scheduler_, "w", 2);
  auto first = Acquire("w");
  auto second = Acquire("w");
  // The first run pauses at rung 0 (1 of 1).
  EXPECT_NE(ReportVal(first, 10, 4.0)->stop_reason().find("paused"), std::string::npos);
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
  // It counts at rung 0: with a third run at 5.0, n is 3, top 1: the first
  // run is promoted; the third (2 of 3) and the finished one are behind it.
  auto third = Acquire("w");
  ASSERT_TRUE(third.has_job());
  EXPECT_NE(ReportVal(third, 10, 5.0)->stop_reason().find("paused"), std::string::npos);
  EXPECT_EQ(Job(first.job_id()).state(), v1::PENDING);
  EXPECT_EQ(Job(second.job_id()).state(), v1::SUCCEEDED);
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
  // Rung 0 in LR order, each worse than the first: 1e-3 pauses, is
  // promoted by the third arrival; the rung completes with the fifth (the
  // held 2x64 runs do not hold it open): all but 1e-3 pruned.
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(ReportVal(ref[i], 10, 3.0 + i).ok());
  for (int i = 1; i < 5; ++i) EXPECT_EQ(Job(ref[i].job_id()).state(), v1::PRUNED);
  auto resumed = AcquireTrain("w");
  ASSERT_EQ(resumed.job_id(), ref[0].job_id());
  EXPECT_FALSE(AcquireTrain("w").has_job());  // the reference is not decided yet
  ASSERT_TRUE(Finish(resumed, v1::FINISH_SUCCEEDED, 2.0, 90).ok());
  // 2x64 starts on the three lowest LRs.
  int started = 0;
  while (AcquireTrain("w").has_job()) ++started;
  EXPECT_EQ(started, 3);
}

}  // namespace
}  // namespace depthbench::scheduler
