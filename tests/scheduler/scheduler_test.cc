#include "scheduler/scheduler.h"

#include <future>
#include <random>
#include <map>
#include <optional>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "scheduler/best_lr.h"
#include "scheduler/lease_manager.h"
#include "storage/sqlite.h"
#include "storage/stores.h"
#include "tests/scheduler/test_util.h"
#include "trainer_core/shapes.h"

namespace depthbench::scheduler {
namespace {

namespace v1 = ::depthbench::v1;
using depthbench::testing::SmallSpec;
using depthbench::testing::TempDb;

class SchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = TempDb(std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + ".db");
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
  void Register(const std::string& name, int slots = 4) {
    depthbench::testing::RegisterWorker(*scheduler_, name, slots);
  }
  v1::AcquireJobResponse Acquire(const std::string& worker) {
    return depthbench::testing::AcquireFor(*scheduler_, worker);
  }
  absl::StatusOr<v1::FinishJobResponse> Finish(const v1::AcquireJobResponse& lease,
                                               v1::FinishStatus status,
                                               double loss = 0, bool has_loss = true) {
    v1::FinishJobRequest req;
    req.set_job_id(lease.job_id());
    req.set_attempt_id(lease.attempt_id());
    req.set_status(status);
    req.set_has_val_loss(has_loss);
    req.set_final_val_loss(loss);
    req.set_final_step(10);
    req.set_reason(status == v1::FINISH_FAILED ? "exit code 1" : "");
    return scheduler_->FinishJob(req);
  }
  absl::StatusOr<v1::ReportMetricsResponse> Report(const v1::AcquireJobResponse& lease,
                                                   int64_t first_step, int64_t last_step,
                                                   std::optional<int64_t> resumed = {}) {
    v1::ReportMetricsRequest req;
    req.set_job_id(lease.job_id());
    req.set_attempt_id(lease.attempt_id());
    if (resumed) req.set_resumed_from_step(*resumed);
    for (int64_t s = first_step; s <= last_step; ++s) {
      auto* p = req.add_points();
      p->set_step(s);
      p->set_name("loss");
      p->set_value(5.0 - 0.1 * s);
    }
    return scheduler_->ReportMetrics(req);
  }
  v1::JobState State(int64_t job_id) {
    auto job = scheduler_->GetJob(job_id);
    EXPECT_TRUE(job.ok());
    return job.ok() ? job->state() : v1::JOB_STATE_UNSPECIFIED;
  }

  FakeClock clock_;
  std::string path_;
  std::unique_ptr<Scheduler> scheduler_;
};

TEST_F(SchedulerTest, SubmitIsIdempotentOnNameAndSpec) {
  auto spec = SmallSpec("s1", {"pre_ln", "hc"}, {1e-3, 2e-3});
  auto first = scheduler_->SubmitSweep(spec);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->created());
  EXPECT_EQ(first->sweep().total_jobs(), 4);
  auto again = scheduler_->SubmitSweep(spec);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->created());
  EXPECT_EQ(again->sweep().id(), first->sweep().id());
  EXPECT_EQ(again->sweep().total_jobs(), 4);
  spec.mutable_training()->set_steps(11);
  auto changed = scheduler_->SubmitSweep(spec);
  EXPECT_EQ(changed.status().code(), absl::StatusCode::kAlreadyExists);
  auto list = scheduler_->ListSweeps();
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->sweeps_size(), 1);
}

TEST_F(SchedulerTest, InvalidSpecCreatesNothing) {
  auto spec = SmallSpec("bad", {"pre_ln"}, {1e-3});
  spec.add_architectures("hcc");
  auto r = scheduler_->SubmitSweep(spec);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(scheduler_->ListSweeps()->sweeps_size(), 0);
  EXPECT_EQ(scheduler_->ListJobs(v1::ListJobsRequest())->jobs_size(), 0);
}

// A training setting the trainer would refuse fails the submission (with
// the field named), not the jobs later: nothing is created.
TEST_F(SchedulerTest, SettingTheTrainerRefusesCreatesNothing) {
  auto spec = SmallSpec("clip", {"pre_ln", "hc"}, {1e-3, 3e-3});
  spec.mutable_training()->set_grad_clip(0);
  auto r = scheduler_->SubmitSweep(spec);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(r.status().message()), "spec.training.grad_clip: must be positive, got 0");
  EXPECT_EQ(scheduler_->ListSweeps()->sweeps_size(), 0);
  EXPECT_EQ(scheduler_->ListJobs(v1::ListJobsRequest())->jobs_size(), 0);
  EXPECT_EQ(scheduler_->GetSweep("clip").status().code(), absl::StatusCode::kNotFound);
  // The same spec with a valid setting goes through.
  spec.mutable_training()->set_grad_clip(0.5);
  auto ok = scheduler_->SubmitSweep(spec);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->sweep().total_jobs(), 4);
}

// jobs.lr and jobs.seed are the home of a run's learning rate and seed: a
// config_json whose copies disagree (here edited behind the scheduler's
// back) is handed out, shown and diagnosed with the columns' values.
TEST_F(SchedulerTest, TheLrAndSeedColumnsWinOverTheConfigCopies) {
  ASSERT_TRUE(scheduler_->SubmitSweep(SmallSpec("s", {"pre_ln"}, {1e-3})).ok());
  scheduler_.reset();
  {
    auto db = storage::Database::Open(path_);
    ASSERT_TRUE(db.ok()) << db.status();
    ASSERT_TRUE((*db)->Exec("UPDATE jobs SET config_json = "
                            "json_set(config_json, '$.lr', 9.0, '$.seed', 77)").ok());
  }
  Reopen();
  Register("w1");
  auto lease = Acquire("w1");
  ASSERT_TRUE(lease.has_job());
  auto job = scheduler_->GetJob(lease.job_id());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_DOUBLE_EQ(job->lr(), 1e-3);
  for (const std::string& text : {lease.config_json(), job->config_json()}) {
    auto config = nlohmann::json::parse(text);
    EXPECT_DOUBLE_EQ(config["lr"].get<double>(), 1e-3) << text;
    EXPECT_EQ(config["seed"].get<int64_t>(), job->seed()) << text;
  }
}

TEST_F(SchedulerTest, StateMachineLeasedRunningSucceeded) {
  ASSERT_TRUE(scheduler_->SubmitSweep(SmallSpec("s", {"pre_ln"}, {1e-3})).ok());
  Register("w1");
  auto lease = Acquire("w1");
  ASSERT_TRUE(lease.has_job());
  EXPECT_EQ(lease.attempt_number(), 1);
  EXPECT_FALSE(lease.resume());
  EXPECT_EQ(lease.checkpoint_dir(), "s/" + std::to_string(lease.job_id()));
  auto config = nlohmann::json::parse(lease.config_json());
  EXPECT_EQ(config["arch"], "pre_ln");
  EXPECT_EQ(State(lease.job_id()), v1::LEASED);
  ASSERT_TRUE(Report(lease, 1, 5).ok());
  EXPECT_EQ(State(lease.job_id()), v1::RUNNING);
  auto done = Finish(lease, v1::FINISH_SUCCEEDED, 2.5);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::SUCCEEDED);
  // A re-sent FinishJob gets the same answer; a different one is refused.
  EXPECT_TRUE(Finish(lease, v1::FINISH_SUCCEEDED, 2.5).ok());
  EXPECT_EQ(Finish(lease, v1::FINISH_FAILED).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Report(lease, 6, 6).status().code(), absl::StatusCode::kFailedPrecondition);
  auto job = scheduler_->GetJob(lease.job_id());
  ASSERT_TRUE(job.ok());
  EXPECT_DOUBLE_EQ(job->final_val_loss(), 2.5);
  ASSERT_EQ(job->attempts_size(), 1);
  EXPECT_EQ(job->attempts(0).outcome(), "succeeded");
  EXPECT_EQ(job->attempts(0).worker_id(), "w1");
  EXPECT_TRUE(job->is_best());  // only LR of its group
  auto sweep = scheduler_->GetSweep("s");
  EXPECT_EQ(sweep->state(), v1::SWEEP_COMPLETED);
  EXPECT_FALSE(Acquire("w1").has_job());
}

TEST_F(SchedulerTest, UnknownWorkerIsNotFound) {
  v1::AcquireJobRequest req;
  req.set_worker_id("ghost");
  EXPECT_EQ(scheduler_->AcquireJob(req).status().code(), absl::StatusCode::kNotFound);
  v1::HeartbeatRequest hb;
  hb.set_worker_id("ghost");
  EXPECT_EQ(scheduler_->Heartbeat(hb).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SchedulerTest, LeaseExpiresWithoutHeartbeatAndLateReportsAreRefused) {
  ASSERT_TRUE(scheduler_->SubmitSweep(SmallSpec("s", {"pre_ln"}, {1e-3})).ok());
  Register("w1");
  Register("w2");
  auto lease = Acquire("w1");
  ASSERT_TRUE(lease.has_job());
  // Heartbeats keep it alive past the TTL.
  for (int i = 0; i < 5; ++i) {
    clock_.AdvanceMs(6000);
    v1::HeartbeatRequest hb;
    hb.set_worker_id("w1");
    auto* r = hb.add_running();
    r->set_job_id(lease.job_id());
    r->set_attempt_id(lease.attempt_id());
    auto reply = scheduler_->Heartbeat(hb);
    ASSERT_TRUE(reply.ok());
    EXPECT_EQ(reply->cancellations_size(), 0);
    EXPECT_EQ(*scheduler_->ExpireLeases(), 0);
  }
  // Silence: the lease expires, the job is pending again (after backoff).
  clock_.AdvanceMs(10001);
  EXPECT_EQ(*scheduler_->ExpireLeases(), 1);
  EXPECT_EQ(State(lease.job_id()), v1::PENDING);
  auto job = scheduler_->GetJob(lease.job_id());
  EXPECT_EQ(job->attempts_used(), 1);
  EXPECT_EQ(job->attempts(0).outcome(), "expired");
  EXPECT_FALSE(Acquire("w2").has_job());  // backoff 1000 ms
  clock_.AdvanceMs(1000);
  auto second = Acquire("w2");
  ASSERT_TRUE(second.has_job());
  EXPECT_EQ(second.job_id(), lease.job_id());
  EXPECT_NE(second.attempt_id(), lease.attempt_id());
  EXPECT_TRUE(second.resume());
  EXPECT_EQ(second.attempt_number(), 2);
  // The stale worker's reports are refused by attempt id; its heartbeat is
  // told to stop.
  EXPECT_EQ(Report(lease, 1, 3).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Finish(lease, v1::FINISH_SUCCEEDED, 1.0).status().code(),
            absl::StatusCode::kFailedPrecondition);
  v1::HeartbeatRequest hb;
  hb.set_worker_id("w1");
  auto* r = hb.add_running();
  r->set_job_id(lease.job_id());
  r->set_attempt_id(lease.attempt_id());
  auto reply = scheduler_->Heartbeat(hb);
  ASSERT_EQ(reply->cancellations_size(), 1);
  EXPECT_EQ(reply->cancellations(0).attempt_id(), lease.attempt_id());
  ASSERT_TRUE(Finish(second, v1::FINISH_SUCCEEDED, 2.0).ok());
  EXPECT_EQ(State(lease.job_id()), v1::SUCCEEDED);
}

TEST_F(SchedulerTest, FailuresRetryWithExponentialBackoffUntilExhausted) {
  ASSERT_TRUE(scheduler_->SubmitSweep(SmallSpec("s", {"pre_ln"}, {1e-3})).ok());
  Register("w1");
  auto a1 = Acquire("w1");
  ASSERT_TRUE(Finish(a1, v1::FINISH_FAILED).ok());
  auto job = scheduler_->GetJob(a1.job_id());
  EXPECT_EQ(job->state(), v1::PENDING);
  EXPECT_EQ(job->not_before_ms(), clock_.NowWallMs() + 1000);
  clock_.AdvanceMs(999);
  EXPECT_FALSE(Acquire("w1").has_job());
  clock_.AdvanceMs(1);
  auto a2 = Acquire("w1");
  ASSERT_TRUE(a2.has_job());
  ASSERT_TRUE(Finish(a2, v1::FINISH_FAILED).ok());
  job = scheduler_->GetJob(a1.job_id());
  EXPECT_EQ(job->not_before_ms(), clock_.NowWallMs() + 2000);  // doubled
  clock_.AdvanceMs(2000);
  auto a3 = Acquire("w1");
  ASSERT_TRUE(a3.has_job());
  auto last = Finish(a3, v1::FINISH_FAILED);
  ASSERT_TRUE(last.ok());
  EXPECT_EQ(last->state(), v1::FAILED);
  job = scheduler_->GetJob(a1.job_id());
  EXPECT_EQ(job->attempts_used(), 3);
  EXPECT_NE(job->reason().find("attempts exhausted"), std::string::npos);
  clock_.AdvanceMs(100000);
  EXPECT_FALSE(Acquire("w1").has_job());
  // RetryJob brings it back with a fresh attempt budget.
  v1::RetryJobRequest retry;
  retry.set_job_id(a1.job_id());
  auto retried = scheduler_->RetryJob(retry);
  ASSERT_TRUE(retried.ok()) << retried.status();
  EXPECT_EQ(retried->job_ids_size(), 1);
  auto a4 = Acquire("w1");
  ASSERT_TRUE(a4.has_job());
  EXPECT_EQ(a4.attempt_number(), 4);
  // Retrying a job that is not failed/cancelled is refused.
  EXPECT_EQ(scheduler_->RetryJob(retry).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(SchedulerTest, DivergenceIsFinalAndInterruptionDoesNotCount) {
  ASSERT_TRUE(scheduler_->SubmitSweep(SmallSpec("s", {"pre_ln"}, {1e-3, 5e-3})).ok());
  Register("w1");
  auto a = Acquire("w1");
  auto b = Acquire("w1");
  ASSERT_TRUE(Finish(a, v1::FINISH_DIVERGED, 0, false).ok());
  EXPECT_EQ(State(a.job_id()), v1::DIVERGED);
  auto interrupted = Finish(b, v1::FINISH_INTERRUPTED, 0, false);
  ASSERT_TRUE(interrupted.ok());
  EXPECT_EQ(interrupted->state(), v1::PENDING);
  auto job = scheduler_->GetJob(b.job_id());
  EXPECT_EQ(job->attempts_used(), 0);
  auto again = Acquire("w1");  // no backoff for an interruption
  ASSERT_TRUE(again.has_job());
  EXPECT_EQ(again.job_id(), b.job_id());
  EXPECT_TRUE(again.resume());
  EXPECT_FALSE(Acquire("w1").has_job());  // the diverged one never returns
}

TEST_F(SchedulerTest, BestLrSkipsDivergedAndQueuesDiagnostics) {
  auto spec = SmallSpec("s", {"deepnorm"}, {1e-3, 2e-3, 5e-3});
  spec.mutable_diagnostics()->add_kinds("angular");
  spec.mutable_diagnostics()->add_kinds("deff");
  ASSERT_TRUE(scheduler_->SubmitSweep(spec).ok());
  Register("w1", 8);
  std::map<double, v1::AcquireJobResponse> by_lr;
  for (int i = 0; i < 3; ++i) {
    auto lease = Acquire("w1");
    auto job = scheduler_->GetJob(lease.job_id());
    by_lr[job->lr()] = lease;
  }
  // 5e-3 diverged with the lowest reported loss: not eligible.
  ASSERT_TRUE(Finish(by_lr[5e-3], v1::FINISH_DIVERGED, 0.1).ok());
  ASSERT_TRUE(Finish(by_lr[1e-3], v1::FINISH_SUCCEEDED, 3.0).ok());
  auto partial = scheduler_->QueryResults("s");
  ASSERT_TRUE(partial.ok());
  ASSERT_EQ(partial->rows_size(), 1);
  EXPECT_FALSE(partial->rows(0).complete());
  EXPECT_FALSE(partial->rows(0).has_best());
  EXPECT_FALSE(Acquire("w1").has_job());  // no diagnostics before the group ends
  ASSERT_TRUE(Finish(by_lr[2e-3], v1::FINISH_SUCCEEDED, 2.7).ok());
  auto results = scheduler_->QueryResults("s");
  ASSERT_TRUE(results.ok());
  const v1::ResultRow& row = results->rows(0);
  EXPECT_TRUE(row.complete());
  EXPECT_TRUE(row.has_best());
  EXPECT_DOUBLE_EQ(row.best_lr(), 2e-3);
  EXPECT_DOUBLE_EQ(row.best_val_loss(), 2.7);
  EXPECT_EQ(row.best_job_id(), by_lr[2e-3].job_id());
  EXPECT_EQ(row.layers(), 2);
  EXPECT_EQ(row.d_model(), 64);
  EXPECT_DOUBLE_EQ(row.aspect_ratio(), 32.0);
  EXPECT_GT(row.params(), 0);
  ASSERT_EQ(row.lrs_size(), 3);
  EXPECT_TRUE(row.lrs(2).diverged());
  EXPECT_FALSE(row.lrs(2).has_loss());
  EXPECT_DOUBLE_EQ(row.lrs(0).val_loss(), 3.0);
  EXPECT_EQ(results->runs_size(), 3);
  // The diagnostic job is queued against the best run's checkpoint dir.
  auto diag = Acquire("w1");
  ASSERT_TRUE(diag.has_job());
  EXPECT_EQ(diag.kind(), v1::DIAGNOSE);
  auto config = nlohmann::json::parse(diag.config_json());
  EXPECT_EQ(config["checkpoint"], "s/" + std::to_string(by_lr[2e-3].job_id()));
  EXPECT_EQ(config["kinds"], nlohmann::json({"angular", "deff"}));
  EXPECT_EQ(config["arch"], "deepnorm");
  v1::FinishJobRequest finish;
  finish.set_job_id(diag.job_id());
  finish.set_attempt_id(diag.attempt_id());
  finish.set_status(v1::FINISH_SUCCEEDED);
  auto* d = finish.add_diagnostics();
  d->set_kind("deff");
  d->set_data_json(R"({"d_eff":1.5,"d_eff_over_l":0.75})");
  ASSERT_TRUE(scheduler_->FinishJob(finish).ok());
  results = scheduler_->QueryResults("s");
  auto diag_json = nlohmann::json::parse(results->rows(0).diagnostics_json());
  EXPECT_DOUBLE_EQ(diag_json["deff"]["d_eff_over_l"].get<double>(), 0.75);
  EXPECT_EQ(scheduler_->GetSweep("s")->state(), v1::SWEEP_COMPLETED);
}

// spec.diagnostics.fixed_lr (the paper's Figures 5-6 at 2e-3): the diagnose
// job goes to the run at that LR although another LR is best; its
// diagnostics reach the row, which names the diagnosed run and LR; the
// settings reach the diagnose config; the row shows the token budget.
TEST_F(SchedulerTest, FixedLrQueuesDiagnosticsOnThatLrsRun) {
  auto spec = SmallSpec("fixed", {"pre_ln"}, {1e-3, 2e-3, 5e-3});
  spec.mutable_training()->clear_steps();
  spec.mutable_training()->set_batch(4);
  spec.mutable_diagnostics()->add_kinds("causal");
  spec.mutable_diagnostics()->set_fixed_lr(2e-3);
  spec.mutable_diagnostics()->set_num_sequences(128);
  spec.mutable_diagnostics()->set_causal_form("ratio_of_means");
  ASSERT_TRUE(scheduler_->SubmitSweep(spec).ok());
  Register("w1", 8);
  std::map<double, v1::AcquireJobResponse> by_lr;
  for (int i = 0; i < 3; ++i) {
    auto lease = Acquire("w1");
    by_lr[scheduler_->GetJob(lease.job_id())->lr()] = lease;
  }
  ASSERT_TRUE(Finish(by_lr[1e-3], v1::FINISH_SUCCEEDED, 2.5).ok());  // the best LR
  ASSERT_TRUE(Finish(by_lr[2e-3], v1::FINISH_SUCCEEDED, 2.9).ok());
  EXPECT_FALSE(Acquire("w1").has_job());  // not before the group ends
  ASSERT_TRUE(Finish(by_lr[5e-3], v1::FINISH_SUCCEEDED, 3.1).ok());
  auto diag = Acquire("w1");
  ASSERT_TRUE(diag.has_job());
  EXPECT_EQ(diag.kind(), v1::DIAGNOSE);
  EXPECT_FALSE(Acquire("w1").has_job());  // exactly one diagnose job
  auto config = nlohmann::json::parse(diag.config_json());
  EXPECT_EQ(config["checkpoint"], "fixed/" + std::to_string(by_lr[2e-3].job_id()));
  EXPECT_DOUBLE_EQ(config["lr"].get<double>(), 2e-3);
  EXPECT_EQ(config["num_sequences"], 128);
  EXPECT_EQ(config["allow_small_n"], false);
  EXPECT_EQ(config["causal_form"], "ratio_of_means");
  v1::FinishJobRequest finish;
  finish.set_job_id(diag.job_id());
  finish.set_attempt_id(diag.attempt_id());
  finish.set_status(v1::FINISH_SUCCEEDED);
  auto* d = finish.add_diagnostics();
  d->set_kind("causal");
  d->set_data_json(R"({"r_causal":0.25,"form":"ratio_of_means"})");
  ASSERT_TRUE(scheduler_->FinishJob(finish).ok());
  auto results = scheduler_->QueryResults("fixed");
  ASSERT_TRUE(results.ok());
  const v1::ResultRow& row = results->rows(0);
  EXPECT_DOUBLE_EQ(row.best_lr(), 1e-3);
  EXPECT_EQ(row.best_job_id(), by_lr[1e-3].job_id());
  EXPECT_EQ(row.diagnosed_job_id(), by_lr[2e-3].job_id());
  EXPECT_DOUBLE_EQ(row.diagnosed_lr(), 2e-3);
  auto diag_json = nlohmann::json::parse(row.diagnostics_json());
  EXPECT_DOUBLE_EQ(diag_json["causal"]["r_causal"].get<double>(), 0.25);
  // The budget: 20 tokens per Pre-LN parameter of the 2x64 shape.
  const int64_t pre_ln = TotalParams(MakeShape(2, 64, 256));
  EXPECT_EQ(row.budget_params(), pre_ln);
  EXPECT_EQ(row.budget_tokens(), 20 * pre_ln);
  EXPECT_EQ(row.budget_steps(), (20 * pre_ln + 4 * 32 - 1) / (4 * 32));
}

// One train run of a group as best-LR selection reads it.
storage::GroupMember Member(int64_t id, double lr, v1::JobState state, std::optional<double> loss) {
  storage::GroupMember j;
  j.id = id;
  j.lr = lr;
  j.state = state;
  j.val_loss = loss;
  return j;
}

TEST(BestLrTest, DiagnosisTargetBestOrFixedLr) {
  std::vector<storage::GroupMember> jobs = {
      Member(1, 1e-3, v1::SUCCEEDED, 2.5), Member(2, 2e-3, v1::SUCCEEDED, 2.9),
      Member(3, 2e-3, v1::SUCCEEDED, 2.8), Member(4, 5e-3, v1::DIVERGED, std::nullopt)};
  GroupSelection sel = SelectBest(jobs);
  EXPECT_EQ(DiagnosisTarget(sel, jobs, 0), 1);     // the best run
  EXPECT_EQ(DiagnosisTarget(sel, jobs, 2e-3), 3);  // that LR's best seed
  EXPECT_EQ(DiagnosisTarget(sel, jobs, 5e-3), 0);  // diverged: nothing to diagnose
  jobs.push_back(Member(5, 2e-3, v1::RUNNING, std::nullopt));
  EXPECT_EQ(DiagnosisTarget(SelectBest(jobs), jobs, 2e-3), 0);  // group not complete
}

TEST(BestLrTest, MeansOverSeedsAndMarksDivergedLrs) {
  GroupSelection s = SelectBest({Member(1, 1e-3, v1::SUCCEEDED, 3.0), Member(2, 1e-3, v1::SUCCEEDED, 2.0),
                                 Member(3, 2e-3, v1::SUCCEEDED, 2.4), Member(4, 2e-3, v1::DIVERGED, std::nullopt),
                                 Member(5, 5e-3, v1::SUCCEEDED, 2.6), Member(6, 5e-3, v1::SUCCEEDED, 2.6)});
  EXPECT_TRUE(s.complete);
  ASSERT_EQ(s.lrs.size(), 3u);
  EXPECT_DOUBLE_EQ(*s.lrs[0].mean_val_loss, 2.5);
  EXPECT_EQ(s.lrs[1].diverged, 1);
  // 2e-3 has the lowest mean among succeeded seeds but one seed diverged.
  EXPECT_DOUBLE_EQ(*s.best_lr, 1e-3);
  EXPECT_DOUBLE_EQ(*s.best_val_loss, 2.5);
  EXPECT_EQ(s.best_job_id, 2);  // best seed at the best LR
  GroupSelection open = SelectBest({Member(1, 1e-3, v1::RUNNING, std::nullopt)});
  EXPECT_FALSE(open.complete);
  GroupSelection all_diverged = SelectBest({Member(1, 1e-3, v1::DIVERGED, std::nullopt)});
  EXPECT_TRUE(all_diverged.complete);
  EXPECT_FALSE(all_diverged.best_lr.has_value());
}

struct BackoffCase {
  int64_t attempts;
  int64_t expected;
};
class BackoffTest : public ::testing::TestWithParam<BackoffCase> {};
TEST_P(BackoffTest, Exponential) {
  EXPECT_EQ(BackoffMs(GetParam().attempts, 1000, 2.0, 10000), GetParam().expected);
}
INSTANTIATE_TEST_SUITE_P(Table, BackoffTest,
                         ::testing::Values(BackoffCase{0, 0}, BackoffCase{1, 1000},
                                           BackoffCase{2, 2000}, BackoffCase{3, 4000},
                                           BackoffCase{4, 8000}, BackoffCase{5, 10000},
                                           BackoffCase{60, 10000}),
                         [](const ::testing::TestParamInfo<BackoffCase>& info) {
                           return "attempts" + std::to_string(info.param.attempts);
                         });

TEST_F(SchedulerTest, RestartResumesLeasesAndWorkersReattach) {
  ASSERT_TRUE(scheduler_->SubmitSweep(SmallSpec("s", {"pre_ln"}, {1e-3, 2e-3})).ok());
  Register("w1");
  Register("w2");
  auto kept = Acquire("w1");
  auto lost = Acquire("w2");
  ASSERT_TRUE(Report(kept, 1, 3).ok());
  Reopen();  // same file, leases rebuilt with a fresh TTL
  EXPECT_EQ(State(kept.job_id()), v1::RUNNING);
  EXPECT_EQ(State(lost.job_id()), v1::LEASED);
  // w1 re-attaches; w2 never comes back.
  v1::RegisterWorkerRequest again;
  again.set_name("w1");
  again.mutable_resources()->set_slots(4);
  auto* running = again.add_running();
  running->set_job_id(kept.job_id());
  running->set_attempt_id(kept.attempt_id());
  auto reply = scheduler_->RegisterWorker(again);
  ASSERT_TRUE(reply.ok());
  EXPECT_EQ(reply->cancellations_size(), 0);
  clock_.AdvanceMs(6000);
  v1::HeartbeatRequest hb;
  hb.set_worker_id("w1");
  *hb.add_running() = *running;
  ASSERT_TRUE(scheduler_->Heartbeat(hb).ok());
  clock_.AdvanceMs(6000);
  EXPECT_EQ(*scheduler_->ExpireLeases(), 1);
  EXPECT_EQ(State(lost.job_id()), v1::PENDING);
  EXPECT_EQ(State(kept.job_id()), v1::RUNNING);
  // Points re-sent after the restart are not duplicated.
  auto resent = Report(kept, 1, 5);
  ASSERT_TRUE(resent.ok());
  EXPECT_EQ(resent->accepted(), 2);
  EXPECT_EQ(resent->duplicates(), 3);
  ASSERT_TRUE(Finish(kept, v1::FINISH_SUCCEEDED, 2.0).ok());
  EXPECT_EQ(State(kept.job_id()), v1::SUCCEEDED);
}

TEST_F(SchedulerTest, CancelSweepStopsRunningJobs) {
  ASSERT_TRUE(scheduler_->SubmitSweep(SmallSpec("s", {"pre_ln"}, {1e-3, 2e-3, 5e-3})).ok());
  Register("w1");
  auto lease = Acquire("w1");
  auto cancelled = scheduler_->CancelSweep("s");
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->cancelled_jobs(), 3);
  EXPECT_EQ(State(lease.job_id()), v1::CANCELLED);
  v1::HeartbeatRequest hb;
  hb.set_worker_id("w1");
  auto* r = hb.add_running();
  r->set_job_id(lease.job_id());
  r->set_attempt_id(lease.attempt_id());
  auto reply = scheduler_->Heartbeat(hb);
  ASSERT_EQ(reply->cancellations_size(), 1);
  EXPECT_EQ(reply->cancellations(0).reason(), "job cancelled");
  EXPECT_FALSE(Acquire("w1").has_job());
  EXPECT_EQ(scheduler_->GetSweep("s")->state(), v1::SWEEP_CANCELLED);
  EXPECT_EQ(scheduler_->CancelSweep("nope").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SchedulerTest, ListJobsFiltersAndPaginates) {
  ASSERT_TRUE(scheduler_->SubmitSweep(SmallSpec("a", {"pre_ln", "hc"}, {1e-3, 2e-3, 5e-3})).ok());
  ASSERT_TRUE(scheduler_->SubmitSweep(SmallSpec("b", {"pre_ln"}, {1e-3})).ok());
  v1::ListJobsRequest req;
  req.set_sweep("a");
  req.set_page_size(4);
  auto page1 = scheduler_->ListJobs(req);
  ASSERT_TRUE(page1.ok());
  EXPECT_EQ(page1->jobs_size(), 4);
  ASSERT_FALSE(page1->next_page_token().empty());
  req.set_page_token(page1->next_page_token());
  auto page2 = scheduler_->ListJobs(req);
  EXPECT_EQ(page2->jobs_size(), 2);
  EXPECT_TRUE(page2->next_page_token().empty());
  v1::ListJobsRequest by_arch;
  by_arch.set_arch("pre_ln");
  EXPECT_EQ(scheduler_->ListJobs(by_arch)->jobs_size(), 4);
  v1::ListJobsRequest by_state;
  by_state.set_state(v1::PENDING);
  EXPECT_EQ(scheduler_->ListJobs(by_state)->jobs_size(), 7);
  by_state.set_state(v1::RUNNING);
  EXPECT_EQ(scheduler_->ListJobs(by_state)->jobs_size(), 0);
  v1::ListJobsRequest bad;
  bad.set_arch("hcc");
  EXPECT_EQ(scheduler_->ListJobs(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad.Clear();
  bad.set_page_token("xyz");
  EXPECT_EQ(scheduler_->ListJobs(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(SchedulerTest, AcquireMatchesResourcesAndSlots) {
  auto spec = SmallSpec("gpu", {"pre_ln"}, {1e-3});
  spec.mutable_resources()->set_devices(1);
  (*spec.mutable_resources()->mutable_labels())["zone"] = "a";
  ASSERT_TRUE(scheduler_->SubmitSweep(spec).ok());
  ASSERT_TRUE(scheduler_->SubmitSweep(SmallSpec("cpu", {"pre_ln"}, {1e-3, 2e-3})).ok());
  Register("cpu-only", 1);
  auto first = Acquire("cpu-only");
  ASSERT_TRUE(first.has_job());
  EXPECT_EQ(first.sweep_name(), "cpu");
  EXPECT_FALSE(Acquire("cpu-only").has_job());  // its one slot is busy
  v1::RegisterWorkerRequest gpu;
  gpu.set_name("gpu-b");
  gpu.mutable_resources()->set_devices(1);
  gpu.mutable_resources()->set_slots(4);
  (*gpu.mutable_resources()->mutable_labels())["zone"] = "b";
  ASSERT_TRUE(scheduler_->RegisterWorker(gpu).ok());
  auto wrong_zone = Acquire("gpu-b");
  ASSERT_TRUE(wrong_zone.has_job());
  EXPECT_EQ(wrong_zone.sweep_name(), "cpu");
  EXPECT_FALSE(Acquire("gpu-b").has_job());
  (*gpu.mutable_resources()->mutable_labels())["zone"] = "a";
  gpu.set_name("gpu-a");
  ASSERT_TRUE(scheduler_->RegisterWorker(gpu).ok());
  auto match = Acquire("gpu-a");
  ASSERT_TRUE(match.has_job());
  EXPECT_EQ(match.sweep_name(), "gpu");
}

TEST_F(SchedulerTest, WatchReadsPointsFromAStep) {
  ASSERT_TRUE(scheduler_->SubmitSweep(SmallSpec("s", {"pre_ln"}, {1e-3})).ok());
  Register("w1");
  auto lease = Acquire("w1");
  uint64_t before = scheduler_->ChangeVersion();
  ASSERT_TRUE(Report(lease, 1, 10).ok());
  EXPECT_GT(scheduler_->ChangeVersion(), before);
  auto batch = scheduler_->ReadWatch(lease.job_id(), 0, 7, 100);
  ASSERT_TRUE(batch.ok());
  ASSERT_EQ(batch->points.size(), 4u);
  EXPECT_EQ(batch->points[0].step, 7);
  EXPECT_EQ(batch->state, v1::RUNNING);
  auto rest = scheduler_->ReadWatch(lease.job_id(), batch->points.back().row_id, 0, 100);
  EXPECT_TRUE(rest->points.empty());
  EXPECT_EQ(scheduler_->ReadWatch(12345, 0, 0, 10).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SchedulerTest, QueryResultsPagesRunsAndNamesBadInput) {
  ASSERT_TRUE(scheduler_->SubmitSweep(SmallSpec("s", {"hc"}, {1e-3, 2e-3, 3e-3, 4e-3, 5e-3})).ok());
  v1::QueryResultsRequest req;
  req.set_sweep("s");
  req.set_page_size(2);
  std::vector<int64_t> ids;
  int rows = 0, pages = 0;
  do {
    auto page = scheduler_->QueryResults(req);
    ASSERT_TRUE(page.ok()) << page.status();
    rows += page->rows_size();
    for (const auto& run : page->runs()) ids.push_back(run.job_id());
    req.set_page_token(page->next_page_token());
    ++pages;
  } while (!req.page_token().empty() && pages < 10);
  EXPECT_EQ(pages, 3);
  EXPECT_EQ(rows, 1);  // rows come with the first page only
  ASSERT_EQ(ids.size(), 5u);
  EXPECT_TRUE(std::is_sorted(ids.begin(), ids.end()));
  EXPECT_EQ(std::adjacent_find(ids.begin(), ids.end()), ids.end());

  struct Bad {
    int32_t page_size;
    std::string token;
    std::string sweep;
    absl::StatusCode code;
    std::string names;
  };
  for (const Bad& b : std::vector<Bad>{
           {-1, "", "s", absl::StatusCode::kInvalidArgument, "page_size"},
           {1001, "", "s", absl::StatusCode::kInvalidArgument, "page_size"},
           {0, "abc", "s", absl::StatusCode::kInvalidArgument, "page_token"},
           {0, "-5", "s", absl::StatusCode::kInvalidArgument, "page_token"},
           {0, "", "", absl::StatusCode::kInvalidArgument, "sweep"},
           {0, "", "nope", absl::StatusCode::kNotFound, "nope"},
       }) {
    v1::QueryResultsRequest bad;
    bad.set_sweep(b.sweep);
    bad.set_page_size(b.page_size);
    bad.set_page_token(b.token);
    auto r = scheduler_->QueryResults(bad);
    EXPECT_EQ(r.status().code(), b.code) << b.names;
    EXPECT_NE(r.status().message().find(b.names), std::string::npos) << r.status();
  }
}

// The results rows kept up to date as each run ends (tallies, O(LRs) per
// run) equal a recount of the group's jobs after every kind of ending:
// success, divergence, failure after retries, cancellation and a manual
// retry of the failed runs.
TEST_F(SchedulerTest, IncrementalResultsEqualARecountOfTheJobs) {
  auto spec = SmallSpec("s", {"pre_ln", "hc"}, {1e-3, 2e-3, 3e-3});
  for (int seed = 0; seed < 4; ++seed) spec.add_seeds(seed);
  spec.mutable_retry()->set_max_attempts(1);
  ASSERT_TRUE(scheduler_->SubmitSweep(spec).ok());
  storage::DatabaseOptions read_only;
  read_only.read_only = true;
  auto recount_db = storage::Database::Open(path_, read_only);  // a second connection
  ASSERT_TRUE(recount_db.ok()) << recount_db.status();
  storage::JobStore jobs((*recount_db).get());
  auto check = [&](const std::string& when) {
    auto results = scheduler_->QueryResults("s");
    ASSERT_TRUE(results.ok()) << results.status();
    ASSERT_EQ(results->rows_size(), 2) << when;
    for (const v1::ResultRow& row : results->rows()) {
      auto group = jobs.ListGroup(1, row.arch(), row.layers(), row.d_model());
      ASSERT_TRUE(group.ok());
      GroupSelection want = SelectBest(*group);
      EXPECT_EQ(row.complete(), want.complete) << when << " " << row.arch();
      EXPECT_EQ(row.has_best(), want.complete && want.best_lr.has_value()) << when;
      if (row.has_best()) {
        EXPECT_DOUBLE_EQ(row.best_lr(), *want.best_lr) << when;
        EXPECT_NEAR(row.best_val_loss(), *want.best_val_loss, 1e-12) << when;
        EXPECT_EQ(row.best_job_id(), want.best_job_id) << when;
      }
      ASSERT_EQ(row.lrs_size(), static_cast<int>(want.lrs.size())) << when;
      for (int i = 0; i < row.lrs_size(); ++i) {
        EXPECT_EQ(row.lrs(i).succeeded(), want.lrs[i].succeeded) << when;
        EXPECT_EQ(row.lrs(i).diverged_runs(), want.lrs[i].diverged) << when;
        EXPECT_EQ(row.lrs(i).failed_runs(), want.lrs[i].failed) << when;
        EXPECT_EQ(row.lrs(i).has_loss(), want.lrs[i].mean_val_loss.has_value()) << when;
        if (row.lrs(i).has_loss()) {
          EXPECT_NEAR(row.lrs(i).val_loss(), *want.lrs[i].mean_val_loss, 1e-12) << when;
        }
      }
      // Exactly the best run is marked.
      for (const storage::GroupMember& m : *group) {
        EXPECT_EQ(m.is_best, row.has_best() && m.id == row.best_job_id()) << when << " job " << m.id;
      }
    }
  };
  Register("w1", 100);
  std::mt19937 rng(7);
  std::vector<v1::AcquireJobResponse> leases;
  for (auto lease = Acquire("w1"); lease.has_job(); lease = Acquire("w1")) leases.push_back(lease);
  ASSERT_EQ(leases.size(), 24u);
  std::shuffle(leases.begin(), leases.end(), rng);
  for (size_t i = 0; i < leases.size(); ++i) {
    const auto& lease = leases[i];
    if (i == 20) {
      // The last four stay running until the sweep is cancelled.
      check("before cancel");
      ASSERT_TRUE(scheduler_->CancelSweep("s").ok());
      check("after cancel");
      break;
    }
    double loss = 2.0 + std::uniform_real_distribution<double>(0, 1)(rng);
    v1::FinishStatus status = i % 7 == 3   ? v1::FINISH_DIVERGED
                              : i % 5 == 1 ? v1::FINISH_FAILED
                                           : v1::FINISH_SUCCEEDED;
    ASSERT_TRUE(Finish(lease, status, loss, /*has_loss=*/i != 2).ok());
    check("after finish " + std::to_string(i));
  }
  v1::RetryJobRequest retry;
  retry.set_sweep("s");
  auto retried = scheduler_->RetryJob(retry);
  ASSERT_TRUE(retried.ok()) << retried.status();
  EXPECT_GT(retried->job_ids_size(), 0);
  check("after retry");
  for (auto lease = Acquire("w1"); lease.has_job(); lease = Acquire("w1")) {
    ASSERT_TRUE(Finish(lease, v1::FINISH_SUCCEEDED, 1.5).ok());
  }
  check("after the retried runs");
  auto results = scheduler_->QueryResults("s");
  for (const auto& row : results->rows()) EXPECT_TRUE(row.complete());
}

// Reads run on their own connections: they answer while a state change
// holds the scheduler's mutex, and see the last commit, not the change in
// progress.
TEST(SchedulerReadTest, ReadsAnswerWhileAStateChangeHoldsTheMutex) {
  class Hook : public SchedulerObserver {
   public:
    void OnJobFinished(v1::JobState) override {
      if (during_finish) during_finish();
    }
    std::function<void()> during_finish;
  };
  Hook hook;
  FakeClock clock;
  SchedulerOptions options;
  options.observer = &hook;
  auto opened = Scheduler::Open(depthbench::testing::TempDb("reads_off_mutex.db"), &clock, options);
  ASSERT_TRUE(opened.ok()) << opened.status();
  Scheduler* scheduler = opened->get();
  ASSERT_TRUE(scheduler->SubmitSweep(SmallSpec("s", {"hc"}, {1e-3})).ok());
  v1::RegisterWorkerRequest reg;
  reg.set_name("w1");
  ASSERT_TRUE(scheduler->RegisterWorker(reg).ok());
  v1::AcquireJobRequest acquire;
  acquire.set_worker_id("w1");
  auto lease = scheduler->AcquireJob(acquire);
  ASSERT_TRUE(lease.ok() && lease->has_job());

  bool answered = false;
  v1::JobState seen = v1::JOB_STATE_UNSPECIFIED;
  int rows = -1;
  std::promise<void> read_done;
  std::thread reader;
  hook.during_finish = [&] {
    // Inside FinishJob, under the mutex, just after its commit (observer
    // events run only once a commit succeeded). Were reads to need the
    // mutex, this wait would time out (and the reader finish once FinishJob
    // returns), so the test fails rather than hangs.
    reader = std::thread([&] {
      auto job = scheduler->GetJob(lease->job_id());
      auto results = scheduler->QueryResults("s");
      auto sweep = scheduler->GetSweep("s");
      seen = job.ok() ? job->state() : v1::JOB_STATE_UNSPECIFIED;
      rows = results.ok() && sweep.ok() ? results->rows_size() : -1;
      read_done.set_value();
    });
    answered = read_done.get_future().wait_for(std::chrono::seconds(20)) ==
               std::future_status::ready;
  };
  v1::FinishJobRequest finish;
  finish.set_job_id(lease->job_id());
  finish.set_attempt_id(lease->attempt_id());
  finish.set_status(v1::FINISH_SUCCEEDED);
  finish.set_has_val_loss(true);
  finish.set_final_val_loss(2.5);
  ASSERT_TRUE(scheduler->FinishJob(finish).ok());
  ASSERT_TRUE(reader.joinable());
  reader.join();
  EXPECT_TRUE(answered) << "a read waited for the write mutex";
  EXPECT_EQ(seen, v1::SUCCEEDED);  // committed, though FinishJob still holds the mutex
  EXPECT_EQ(rows, 1);
  hook.during_finish = nullptr;
  EXPECT_EQ(scheduler->GetJob(lease->job_id())->state(), v1::SUCCEEDED);
}

// A database in memory has no second connection: reads share the writer.
TEST(SchedulerReadTest, InMemoryDatabaseReadsThroughTheWriter) {
  FakeClock clock;
  auto db = storage::Database::Open(":memory:");
  ASSERT_TRUE(db.ok());
  auto scheduler = Scheduler::Create(std::move(*db), &clock);
  ASSERT_TRUE(scheduler.ok()) << scheduler.status();
  ASSERT_TRUE((*scheduler)->SubmitSweep(SmallSpec("s", {"hc"}, {1e-3, 2e-3})).ok());
  EXPECT_EQ((*scheduler)->GetSweep("s")->total_jobs(), 2);
  EXPECT_EQ((*scheduler)->QueryResults("s")->runs_size(), 2);
  SchedulerOptions bad;
  bad.reader_connections = 0;
  auto again = storage::Database::Open(":memory:");
  EXPECT_EQ(Scheduler::Create(std::move(*again), &clock, bad).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The job's canonical "loss" steps (ReadWatch with attempt 0), by step:
// the attempt that each step's point came from.
std::map<int64_t, std::vector<int64_t>> CanonicalSteps(Scheduler& s, int64_t job_id) {
  std::map<int64_t, std::vector<int64_t>> out;
  auto batch = s.ReadWatch(job_id, 0, 0, 100000);
  EXPECT_TRUE(batch.ok()) << batch.status();
  if (!batch.ok()) return out;
  for (const auto& p : batch->points) {
    if (p.name == "loss") out[p.step].push_back(p.attempt_id);
  }
  return out;
}

// Issue 19: points are relayed live, so a retried attempt that resumes
// from an earlier checkpoint re-logs steps the lost attempt stored. The
// canonical history keeps each step once (the earlier attempt's up to the
// resume step, the retry's after it); the abandoned points stay readable
// under their attempt.
TEST_F(SchedulerTest, ResumedAttemptSupersedesAbandonedPointsAndKeepsThemPerAttempt) {
  ASSERT_TRUE(scheduler_->SubmitSweep(SmallSpec("s", {"pre_ln"}, {1e-3})).ok());
  Register("w1");
  Register("w2");
  auto first = Acquire("w1");
  ASSERT_TRUE(Report(first, 1, 0, /*resumed=*/0).ok());  // the trainer's start
  ASSERT_TRUE(Report(first, 1, 30).ok());                // live, past its checkpoint at 20
  // w1 is lost: its lease expires; w2 resumes from the checkpoint at step 20.
  clock_.AdvanceMs(10001);
  ASSERT_EQ(*scheduler_->ExpireLeases(), 1);
  clock_.AdvanceMs(1000);
  auto second = Acquire("w2");
  ASSERT_EQ(second.job_id(), first.job_id());
  uint64_t version = scheduler_->ChangeVersion();
  ASSERT_TRUE(Report(second, 1, 0, /*resumed=*/20).ok());
  EXPECT_GT(scheduler_->ChangeVersion(), version);
  // A watcher learns where the retry resumed.
  auto watch = scheduler_->ReadWatch(first.job_id(), 0, 0, 1000);
  ASSERT_TRUE(watch.ok());
  EXPECT_EQ(watch->attempt_id, second.attempt_id());
  EXPECT_EQ(watch->resumed_from_step, 20);
  // Steps 21..30 of the first attempt left the history.
  auto steps = CanonicalSteps(*scheduler_, first.job_id());
  ASSERT_EQ(steps.size(), 20u);
  EXPECT_EQ(steps.rbegin()->first, 20);
  // The retry re-runs 21..40; each step once, from the attempt that made it.
  ASSERT_TRUE(Report(second, 21, 40).ok());
  steps = CanonicalSteps(*scheduler_, first.job_id());
  ASSERT_EQ(steps.size(), 40u);
  for (const auto& [step, attempts] : steps) {
    ASSERT_EQ(attempts.size(), 1u) << "step " << step;
    EXPECT_EQ(attempts[0], step <= 20 ? first.attempt_id() : second.attempt_id()) << step;
  }
  // Per attempt, nothing was lost: the first attempt's 30 points are stored.
  auto mine = scheduler_->ReadWatch(first.job_id(), 0, 0, 1000, first.attempt_id());
  ASSERT_TRUE(mine.ok());
  ASSERT_EQ(mine->points.size(), 30u);
  EXPECT_EQ(mine->points.back().step, 30);
  EXPECT_EQ(mine->points.back().superseded_by, second.attempt_id());
  EXPECT_EQ(mine->points.front().superseded_by, 0);
  // GetJob shows where each attempt started.
  auto job = scheduler_->GetJob(first.job_id());
  ASSERT_EQ(job->attempts_size(), 2);
  EXPECT_EQ(job->attempts(0).resumed_from_step(), 0);
  EXPECT_EQ(job->attempts(1).resumed_from_step(), 20);
  // An attempt of another job is refused, naming the field.
  auto other = scheduler_->ReadWatch(first.job_id(), 0, 0, 10, 999999);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(std::string(other.status().message()).find("attempt_id"), std::string::npos);
  // A negative resume step is bad input.
  EXPECT_EQ(Report(second, 41, 41, -1).status().code(), absl::StatusCode::kInvalidArgument);
}

// A retry re-publishes what the lost attempt logged up to the resume step
// but never delivered (the worker's replay): stored where the history lacks
// the step, a duplicate where it has it, also after a scheduler restart.
TEST_F(SchedulerTest, ReplayedPointsFillGapsOnly) {
  ASSERT_TRUE(scheduler_->SubmitSweep(SmallSpec("s", {"pre_ln"}, {1e-3})).ok());
  Register("w1");
  Register("w2");
  auto first = Acquire("w1");
  ASSERT_TRUE(Report(first, 1, 15, /*resumed=*/0).ok());  // 16..20 lost in w1's relay
  clock_.AdvanceMs(10001);
  ASSERT_EQ(*scheduler_->ExpireLeases(), 1);
  clock_.AdvanceMs(1000);
  auto second = Acquire("w2");
  ASSERT_TRUE(Report(second, 1, 0, /*resumed=*/20).ok());
  Reopen();  // the cache of resume steps is rebuilt from the database
  Register("w2");
  v1::HeartbeatRequest hb;
  hb.set_worker_id("w2");
  hb.add_running()->set_job_id(second.job_id());
  hb.mutable_running(0)->set_attempt_id(second.attempt_id());
  ASSERT_TRUE(scheduler_->Heartbeat(hb).ok());
  auto replay = Report(second, 11, 20);  // 11..15 stored already
  ASSERT_TRUE(replay.ok()) << replay.status();
  EXPECT_EQ(replay->accepted(), 5);
  EXPECT_EQ(replay->duplicates(), 5);
  ASSERT_TRUE(Report(second, 21, 25).ok());
  auto steps = CanonicalSteps(*scheduler_, first.job_id());
  ASSERT_EQ(steps.size(), 25u);
  for (const auto& [step, attempts] : steps) {
    ASSERT_EQ(attempts.size(), 1u) << "step " << step;
    EXPECT_EQ(attempts[0], step <= 15 ? first.attempt_id() : second.attempt_id()) << step;
  }
  // FinishJob's trailing points follow the same rule.
  v1::FinishJobRequest fin;
  fin.set_job_id(second.job_id());
  fin.set_attempt_id(second.attempt_id());
  fin.set_status(v1::FINISH_SUCCEEDED);
  fin.set_resumed_from_step(20);
  for (int64_t s : {14, 26}) {
    auto* p = fin.add_points();
    p->set_step(s);
    p->set_name("loss");
    p->set_value(1);
  }
  ASSERT_TRUE(scheduler_->FinishJob(fin).ok());
  steps = CanonicalSteps(*scheduler_, first.job_id());
  ASSERT_EQ(steps.size(), 26u);
  EXPECT_EQ(steps[14], std::vector<int64_t>{first.attempt_id()});
}

}  // namespace
}  // namespace depthbench::scheduler
