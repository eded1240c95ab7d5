// The rung rule of scheduler/strategies/asha.h with hand-written losses.
#include "scheduler/strategies/asha.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

namespace depthbench::scheduler::strategies {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
const std::vector<int64_t> kRungs = {10, 30};  // of a 90-step run, eta 3

// Feeds arrivals in order, recording each decision and applying the
// resolution as the scheduler does. `open` is the group's runs that have
// not ended (the scheduler's non-terminal jobs).
struct Group {
  std::vector<RungEntry> recorded;
  std::vector<int64_t> open = {1, 2, 3, 4};
  std::vector<RungDecision> changes;  // of the last Arrive/Resolve
  RungDecision Arrive(int64_t job, int64_t step, double loss, double eta = 3) {
    RungDecision d = DecideAtStep(kRungs, eta, recorded, job, step, loss);
    if (d.verdict != Verdict::kWait) recorded.push_back({job, d.rung, loss, d.verdict});
    if (d.verdict == Verdict::kPrune) End(job);
    Resolve(eta);
    return d;
  }
  void End(int64_t job) { open.erase(std::remove(open.begin(), open.end(), job), open.end()); }
  void Resolve(double eta = 3) {
    changes.clear();
    for (;;) {
      std::vector<RungDecision> c = ResolveRungs(kRungs, eta, recorded, open);
      if (c.empty()) return;
      for (const RungDecision& d : c) {
        for (RungEntry& e : recorded) {
          if (e.job_id == d.job_id && e.rung == d.rung) e.decision = d.verdict;
        }
        if (d.verdict == Verdict::kPrune) End(d.job_id);
        changes.push_back(d);
      }
    }
  }
  Verdict Now(int64_t job, int rung) const {
    for (const RungEntry& e : recorded) {
      if (e.job_id == job && e.rung == rung) return e.decision;
    }
    return Verdict::kWait;
  }
};

TEST(AshaTest, QuotaIsFloorOfNOverEtaAndAtLeastOneOnceComplete) {
  EXPECT_EQ(PromotionQuota(1, 3), 1);
  EXPECT_EQ(PromotionQuota(2, 3), 1);
  EXPECT_EQ(PromotionQuota(5, 3), 1);
  EXPECT_EQ(PromotionQuota(6, 3), 2);
  EXPECT_EQ(PromotionQuota(9, 3), 3);
  EXPECT_EQ(PromotionQuota(4, 2), 2);
  EXPECT_EQ(PromotionQuota(1, 3, /*complete=*/false), 0);
  EXPECT_EQ(PromotionQuota(2, 3, false), 0);
  EXPECT_EQ(PromotionQuota(3, 3, false), 1);
  EXPECT_EQ(PromotionQuota(6, 3, false), 2);
}

TEST(AshaTest, EarlyArrivalsPauseInsteadOfContinuing) {
  Group g;
  RungDecision first = g.Arrive(1, 10, 5.0);  // 1 of 1: floor(1/3) = 0 continue
  EXPECT_EQ(first.verdict, Verdict::kPause);
  EXPECT_EQ(first.quota, 0);
  EXPECT_NE(first.Reason().find("paused at rung 0 (step 10)"), std::string::npos)
      << first.Reason();
  EXPECT_EQ(g.Arrive(2, 10, 6.0).verdict, Verdict::kPause);  // 2 of 2
  EXPECT_TRUE(g.changes.empty());
  EXPECT_EQ(g.Now(1, 0), Verdict::kPause);
}

TEST(AshaTest, ALaterArrivalPromotesAPausedRunIntoTheQuota) {
  Group g;
  g.open = {1, 2, 3, 4, 5, 6, 7};
  g.Arrive(1, 10, 5.0);
  g.Arrive(2, 10, 6.0);
  // n = 3: quota 1; the newcomer is worse, so the best paused run (job 1)
  // is promoted by it.
  RungDecision third = g.Arrive(3, 10, 7.0);
  EXPECT_EQ(third.verdict, Verdict::kPause);
  ASSERT_EQ(g.changes.size(), 1u);
  EXPECT_EQ(g.changes[0].job_id, 1);
  EXPECT_EQ(g.changes[0].verdict, Verdict::kPromote);
  EXPECT_EQ(g.changes[0].rank, 0);
  EXPECT_EQ(g.changes[0].n, 3);
  EXPECT_EQ(g.Now(1, 0), Verdict::kPromote);
  EXPECT_EQ(g.Now(2, 0), Verdict::kPause);
  // n = 6: quota 2. A newcomer ranking first continues at once; job 1
  // stays promoted (never taken back); job 2 (3rd) still waits.
  g.Arrive(4, 10, 8.0);
  g.Arrive(5, 10, 9.0);
  RungDecision sixth = g.Arrive(6, 10, 1.0);
  EXPECT_EQ(sixth.verdict, Verdict::kPromote);
  EXPECT_EQ(sixth.rank, 0);
  EXPECT_EQ(sixth.quota, 2);
  EXPECT_TRUE(g.changes.empty());
  EXPECT_EQ(g.Now(1, 0), Verdict::kPromote);
  EXPECT_EQ(g.Now(2, 0), Verdict::kPause);
}

TEST(AshaTest, ACompleteRungPromotesTheTopAndPrunesThePausedRest) {
  Group g;  // 4 runs, eta 3
  g.Arrive(1, 10, 5.0);
  g.Arrive(2, 10, 4.0);
  RungDecision third = g.Arrive(3, 10, 6.0);  // n 3, quota 1: job 2 promoted
  EXPECT_EQ(third.verdict, Verdict::kPause);
  EXPECT_EQ(g.Now(2, 0), Verdict::kPromote);
  // The last run arrives: the rung is complete, quota max(1, floor(4/3)) = 1
  // is taken by job 2: every paused run, the newcomer too, is pruned.
  RungDecision fourth = g.Arrive(4, 10, 4.5);
  EXPECT_EQ(fourth.verdict, Verdict::kPause);
  EXPECT_EQ(g.Now(1, 0), Verdict::kPrune);
  EXPECT_EQ(g.Now(3, 0), Verdict::kPrune);
  EXPECT_EQ(g.Now(4, 0), Verdict::kPrune);
  ASSERT_EQ(g.changes.size(), 3u);
  for (const RungDecision& c : g.changes) {
    EXPECT_EQ(c.quota, 1);
    EXPECT_EQ(c.n, 4);
    EXPECT_NE(c.Reason().find("pruned at rung 0 (step 10)"), std::string::npos) << c.Reason();
  }
  EXPECT_EQ(g.open, (std::vector<int64_t>{2}));
}

TEST(AshaTest, ARunEndingCompletesTheRungForThePausedOnes) {
  Group g;
  g.open = {1, 2, 3};
  g.Arrive(1, 10, 5.0);
  g.Arrive(2, 10, 4.0);
  EXPECT_TRUE(g.changes.empty());
  // Job 3 fails before the rung (ends): the rung is complete with n = 2,
  // quota max(1, 0) = 1: job 2 is promoted, job 1 pruned.
  g.End(3);
  g.Resolve();
  EXPECT_EQ(g.Now(2, 0), Verdict::kPromote);
  EXPECT_EQ(g.Now(1, 0), Verdict::kPrune);
  // Job 1 was pruned, so job 2 is the only open run: arriving at rung 1 it
  // pauses (floor(1/3) = 0) and the rung, complete at once, promotes it.
  g.Arrive(2, 30, 3.0);
  EXPECT_EQ(g.Now(2, 1), Verdict::kPromote);
}

TEST(AshaTest, TiesGoToTheLowerJobId) {
  Group g;
  g.open = {5, 7, 9, 11};
  g.Arrive(7, 10, 3.0);
  g.Arrive(9, 10, 3.0);
  // n = 3, quota 1: the same loss, the lower id (5, arrived late) ranks
  // first and continues; 7 and 9 stay paused.
  RungDecision d = g.Arrive(5, 10, 3.0);
  EXPECT_EQ(d.verdict, Verdict::kPromote);
  EXPECT_EQ(d.rank, 0);
  EXPECT_EQ(g.Now(7, 0), Verdict::kPause);
  EXPECT_EQ(g.Now(9, 0), Verdict::kPause);
}

TEST(AshaTest, DivergedRunsAreLosers) {
  Group g;
  // A non-finite loss is pruned even as the first arrival.
  EXPECT_EQ(g.Arrive(1, 10, std::nan("")).verdict, Verdict::kPrune);
  EXPECT_EQ(g.Arrive(2, 10, kInf).verdict, Verdict::kPrune);
  // A run that diverged before the rung is recorded there with +inf: it
  // ranks last and raises n, so the finite run completes the rung and wins.
  g.recorded.push_back({3, 0, kInf, Verdict::kPrune});
  g.End(3);
  RungDecision d = g.Arrive(4, 10, 9.0);
  EXPECT_EQ(d.n, 4);
  EXPECT_EQ(d.rank, 0);
  EXPECT_EQ(d.verdict, Verdict::kPromote);  // floor(4/3) = 1
  EXPECT_NE(DecideAtStep(kRungs, 3, {}, 1, 10, kInf).Reason().find("diverged"),
            std::string::npos);
  // A paused run never gets promoted with a non-finite loss, even when the
  // complete rung's quota would take it.
  std::vector<RungEntry> only_bad = {{1, 0, kInf, Verdict::kPause}};
  std::vector<RungDecision> c = ResolveRungs(kRungs, 3, only_bad, {1});
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].verdict, Verdict::kPrune);
}

TEST(AshaTest, RungsAreIndependentAndOnlyRungStepsDecide) {
  Group g;
  g.open = {1, 2};
  EXPECT_EQ(g.Arrive(1, 5, 1.0).verdict, Verdict::kWait);   // not a rung step
  EXPECT_EQ(g.Arrive(1, 90, 1.0).verdict, Verdict::kWait);  // the end: no decision
  g.Arrive(1, 10, 5.0);
  g.Arrive(2, 10, 4.0);  // complete: job 2 promoted, job 1 pruned
  EXPECT_EQ(g.Now(1, 0), Verdict::kPrune);
  // At rung 1 only rung-1 entries count: job 2 is alone there.
  RungDecision d = g.Arrive(2, 30, 4.9);
  EXPECT_EQ(d.rung, 1);
  EXPECT_EQ(d.n, 1);
  EXPECT_EQ(g.Now(2, 1), Verdict::kPromote);
}

TEST(AshaTest, OutOfOrderArrivalDecidesEachRunOnceAgainstWhoIsThere) {
  // Jobs 3 and 4 are past rung 0 (promoted there, recorded) and job 3
  // reaches rung 1 before jobs 1 and 2 reach rung 0: it waits there while
  // 4 is still open.
  Group g;
  g.recorded = {{3, 0, 4.0, Verdict::kPromote}, {4, 0, 4.1, Verdict::kPromote}};
  EXPECT_EQ(g.Arrive(3, 30, 3.5).verdict, Verdict::kPause);
  EXPECT_EQ(g.Arrive(2, 10, 3.9).verdict, Verdict::kPromote);  // n 3, first: quota 1
  // Job 1 completes rung 0 (n 4, quota 1): it is pruned; jobs 3 and 4 stay
  // promoted though job 2 was better (never taken back).
  g.Arrive(1, 10, 4.2);
  EXPECT_EQ(g.Now(1, 0), Verdict::kPrune);
  EXPECT_EQ(g.Now(3, 0), Verdict::kPromote);
  EXPECT_EQ(g.Now(4, 0), Verdict::kPromote);
  EXPECT_EQ(g.Now(3, 1), Verdict::kPause);  // 2 and 4 still to come to rung 1
  g.Arrive(2, 30, 3.6);
  g.Arrive(4, 30, 3.7);  // rung 1 complete: n 3, quota 1: job 3
  EXPECT_EQ(g.Now(3, 1), Verdict::kPromote);
  EXPECT_EQ(g.Now(2, 1), Verdict::kPrune);
  EXPECT_EQ(g.Now(4, 1), Verdict::kPrune);
}

TEST(AshaTest, RestartInTheMiddleNeitherRepeatsNorLosesADecision) {
  // The decisions recorded before a restart are what the scheduler reloads
  // from rung_results (pauses included); a replayed point (a resumed
  // attempt re-logs its steps) is not decided again, resolving again
  // changes nothing, and later arrivals rank against them.
  Group before;
  before.Arrive(1, 10, 5.0);
  before.Arrive(2, 10, 4.0);
  before.Arrive(3, 10, 6.0);  // job 2 promoted; 1 and 3 paused
  Group after;
  after.recorded = before.recorded;  // "durable"
  after.Resolve();
  EXPECT_TRUE(after.changes.empty());
  EXPECT_EQ(after.Arrive(1, 10, 5.0).verdict, Verdict::kWait);  // replay: decided before
  EXPECT_EQ(after.Arrive(2, 10, 4.0).verdict, Verdict::kWait);
  EXPECT_EQ(after.Now(2, 0), Verdict::kPromote);
  after.Arrive(4, 10, 4.5);  // complete: 1, 3, 4 pruned, once each
  EXPECT_EQ(after.changes.size(), 3u);
  after.Resolve();
  EXPECT_TRUE(after.changes.empty());
}

TEST(AshaTest, EtaTwoKeepsHalf) {
  Group g;
  g.Arrive(1, 10, 1.0, 2);                   // n 1, quota 0: paused
  EXPECT_EQ(g.Now(1, 0), Verdict::kPause);
  g.Arrive(2, 10, 2.0, 2);                   // n 2, quota 1: promotes job 1
  EXPECT_EQ(g.Now(1, 0), Verdict::kPromote);
  g.Arrive(3, 10, 3.0, 2);                   // n 3, quota 1
  g.Arrive(4, 10, 1.5, 2);                   // n 4, complete, quota 2: rank 1
  EXPECT_EQ(g.Now(4, 0), Verdict::kPromote);
  EXPECT_EQ(g.Now(2, 0), Verdict::kPrune);
  EXPECT_EQ(g.Now(3, 0), Verdict::kPrune);
}

TEST(RungStepsTest, RoundsToTheEvalIntervalAndRefusesCollisions) {
  auto steps = RungSteps({1.0 / 9, 1.0 / 3, 1.0}, 90, 10);
  ASSERT_TRUE(steps.ok()) << steps.status();
  EXPECT_EQ(*steps, (std::vector<int64_t>{10, 30}));
  steps = RungSteps({1.0 / 9, 1.0 / 3, 1.0}, 100, 0);  // end only: interval = 11
  ASSERT_TRUE(steps.ok()) << steps.status();
  EXPECT_EQ(*steps, (std::vector<int64_t>{11, 33}));
  EXPECT_EQ(RungEvalInterval({1.0 / 9, 1.0}, 100, 0), 11);
  steps = RungSteps({0.1, 0.12, 1.0}, 100, 10);
  ASSERT_FALSE(steps.ok());
  EXPECT_NE(steps.status().message().find("spec.strategy.rungs[1]"), std::string::npos)
      << steps.status();
  steps = RungSteps({0.9, 1.0}, 10, 10);  // rounds onto the end
  ASSERT_FALSE(steps.ok());
  EXPECT_NE(steps.status().message().find("the end of the run"), std::string::npos);
}

TEST(StrategySpecTest, ValidatesAndNamesTheField) {
  v1::StrategySpec spec;
  auto s = StrategyFromSpec(spec);
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->grid());
  EXPECT_EQ(StrategyName(*s), "grid");
  spec.set_kind("successive_halving+lr_transfer");
  s = StrategyFromSpec(spec);
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->successive_halving && s->lr_transfer);
  EXPECT_EQ(s->eta, 3);
  EXPECT_EQ(s->rungs.size(), 3u);
  spec.add_rungs(0.25);
  spec.add_rungs(0.5);
  spec.set_reduction_factor(2);
  spec.set_reference_shape("4x64");
  s = StrategyFromSpec(spec);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->rungs, (std::vector<double>{0.25, 0.5, 1.0}));
  EXPECT_EQ(s->eta, 2);

  auto error = [](const v1::StrategySpec& bad) {
    auto r = StrategyFromSpec(bad);
    return r.ok() ? std::string("ok") : std::string(r.status().message());
  };
  v1::StrategySpec bad;
  bad.set_kind("hyperband");
  EXPECT_NE(error(bad).find("spec.strategy.kind: unknown strategy \"hyperband\""),
            std::string::npos);
  bad.set_kind("successive_halving");
  bad.add_rungs(0.5);
  bad.add_rungs(0.5);
  EXPECT_NE(error(bad).find("spec.strategy.rungs[1]"), std::string::npos) << error(bad);
  bad.clear_rungs();
  bad.add_rungs(1.5);
  EXPECT_NE(error(bad).find("spec.strategy.rungs[0]"), std::string::npos);
  bad.clear_rungs();
  bad.set_reduction_factor(1.5);
  EXPECT_NE(error(bad).find("spec.strategy.reduction_factor"), std::string::npos);
  bad.set_reduction_factor(0);
  bad.set_reference_shape("4x64");
  EXPECT_NE(error(bad).find("spec.strategy.reference_shape: only applies to lr_transfer"),
            std::string::npos);
  bad.set_kind("lr_transfer");
  bad.set_reference_shape("4 by 64");
  EXPECT_NE(error(bad).find("spec.strategy.reference_shape: must be LAYERSxD_MODEL"),
            std::string::npos);
  v1::StrategySpec grid_with_rungs;
  grid_with_rungs.add_rungs(0.5);
  EXPECT_NE(error(grid_with_rungs).find("spec.strategy.rungs: only applies"),
            std::string::npos);
}

TEST(TransferTest, SubGridIsTheBestAndItsNeighbours) {
  EXPECT_EQ(TransferSubGrid(4, 1), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(TransferSubGrid(4, 2), (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(TransferSubGrid(4, 0), (std::vector<int>{0, 1, 2}));  // grid edge: shifted in
  EXPECT_EQ(TransferSubGrid(4, 3), (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(TransferSubGrid(2, 1), (std::vector<int>{0, 1}));
}

TEST(TransferTest, WidensOnlyAtAnInnerEdgeOfTheSubGrid) {
  EXPECT_EQ(WidenIndex({1, 2, 3}, 1, 5), std::optional<int>(0));
  EXPECT_EQ(WidenIndex({1, 2, 3}, 3, 5), std::optional<int>(4));
  EXPECT_EQ(WidenIndex({1, 2, 3}, 2, 5), std::nullopt);  // best inside: decided
  EXPECT_EQ(WidenIndex({0, 1, 2}, 0, 5), std::nullopt);  // the grid's own edge
  EXPECT_EQ(WidenIndex({0, 1, 2, 3}, 3, 5), std::optional<int>(4));
  EXPECT_EQ(WidenIndex({0, 1, 2, 3, 4}, 4, 5), std::nullopt);
}

}  // namespace
}  // namespace depthbench::scheduler::strategies
