// The rung rule of scheduler/strategies/asha.h with hand-written losses.
#include "scheduler/strategies/asha.h"

#include <cmath>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

namespace depthbench::scheduler::strategies {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
const std::vector<int64_t> kRungs = {10, 30};  // of a 90-step run, eta 3

// Feeds arrivals in order, recording each decision as the scheduler does.
struct Group {
  std::vector<RungEntry> recorded;
  RungDecision Arrive(int64_t job, int64_t step, double loss, double eta = 3) {
    RungDecision d = DecideAtStep(kRungs, eta, recorded, job, step, loss);
    if (d.verdict != Verdict::kWait) recorded.push_back({job, d.rung, loss});
    return d;
  }
};

TEST(AshaTest, QuotaIsFloorOfNOverEtaButAtLeastOne) {
  EXPECT_EQ(PromotionQuota(1, 3), 1);
  EXPECT_EQ(PromotionQuota(2, 3), 1);
  EXPECT_EQ(PromotionQuota(5, 3), 1);
  EXPECT_EQ(PromotionQuota(6, 3), 2);
  EXPECT_EQ(PromotionQuota(9, 3), 3);
  EXPECT_EQ(PromotionQuota(4, 2), 2);
}

TEST(AshaTest, PromotesTheBestAndPrunesTheRest) {
  Group g;
  EXPECT_EQ(g.Arrive(1, 10, 5.0).verdict, Verdict::kPromote);  // 1 of 1
  EXPECT_EQ(g.Arrive(2, 10, 6.0).verdict, Verdict::kPrune);    // 2 of 2, quota 1
  RungDecision third = g.Arrive(3, 10, 4.0);                   // beats all
  EXPECT_EQ(third.verdict, Verdict::kPromote);
  EXPECT_EQ(third.rank, 0);
  EXPECT_EQ(third.n, 3);
  RungDecision fourth = g.Arrive(4, 10, 4.5);                  // 2nd of 4, quota 1
  EXPECT_EQ(fourth.verdict, Verdict::kPrune);
  EXPECT_EQ(fourth.rank, 1);
  EXPECT_EQ(fourth.quota, 1);
  EXPECT_EQ(fourth.rung, 0);
  EXPECT_EQ(fourth.step, 10);
  EXPECT_NE(fourth.Reason().find("pruned at rung 0 (step 10)"), std::string::npos)
      << fourth.Reason();
  EXPECT_NE(fourth.Reason().find("ranks 2 of 4"), std::string::npos) << fourth.Reason();
}

TEST(AshaTest, SixRunsAtARungLetTwoContinue) {
  Group g;
  for (int64_t job = 1; job <= 5; ++job) g.Arrive(job, 10, 10.0 - job);  // each beats the last
  // n = 6, quota 2: second best continues, third best does not.
  RungDecision second = DecideAtStep(kRungs, 3, g.recorded, 6, 10, 5.5);
  EXPECT_EQ(second.verdict, Verdict::kPromote);
  EXPECT_EQ(second.rank, 1);
  RungDecision third = DecideAtStep(kRungs, 3, g.recorded, 6, 10, 6.5);
  EXPECT_EQ(third.verdict, Verdict::kPrune);
  EXPECT_EQ(third.rank, 2);
}

TEST(AshaTest, TiesGoToTheLowerJobId) {
  Group g;
  g.Arrive(7, 10, 3.0);
  // Same loss, higher id: ranks behind 7 -> pruned.
  EXPECT_EQ(g.Arrive(9, 10, 3.0).verdict, Verdict::kPrune);
  // Same loss, lower id (arrived late): ranks ahead of 7 and 9 -> promoted.
  RungDecision d = g.Arrive(5, 10, 3.0);
  EXPECT_EQ(d.verdict, Verdict::kPromote);
  EXPECT_EQ(d.rank, 0);
}

TEST(AshaTest, DivergedRunsAreLosers) {
  Group g;
  // A non-finite loss is pruned even as the first arrival.
  EXPECT_EQ(g.Arrive(1, 10, std::nan("")).verdict, Verdict::kPrune);
  EXPECT_EQ(g.Arrive(2, 10, kInf).verdict, Verdict::kPrune);
  // A run that diverged before the rung is recorded there with +inf: it
  // ranks last and raises n, so a finite run still wins.
  g.recorded.push_back({3, 0, kInf});
  RungDecision d = g.Arrive(4, 10, 9.0);
  EXPECT_EQ(d.verdict, Verdict::kPromote);
  EXPECT_EQ(d.n, 4);
  EXPECT_EQ(d.rank, 0);
  EXPECT_NE(DecideAtStep(kRungs, 3, {}, 1, 10, kInf).Reason().find("diverged"),
            std::string::npos);
}

TEST(AshaTest, RungsAreIndependentAndOnlyRungStepsDecide) {
  Group g;
  EXPECT_EQ(g.Arrive(1, 5, 1.0).verdict, Verdict::kWait);   // not a rung step
  EXPECT_EQ(g.Arrive(1, 90, 1.0).verdict, Verdict::kWait);  // the end: no decision
  g.Arrive(1, 10, 5.0);
  g.Arrive(2, 10, 4.0);
  // At rung 1 only rung-1 entries count: job 1 is alone there.
  RungDecision d = g.Arrive(1, 30, 4.9);
  EXPECT_EQ(d.verdict, Verdict::kPromote);
  EXPECT_EQ(d.rung, 1);
  EXPECT_EQ(d.n, 1);
}

TEST(AshaTest, OutOfOrderArrivalDecidesEachRunOnceAgainstWhoIsThere) {
  // Job 3 reaches rung 1 before jobs 1 and 2 reach rung 0.
  Group g;
  g.Arrive(3, 10, 4.0);
  EXPECT_EQ(g.Arrive(3, 30, 3.5).verdict, Verdict::kPromote);
  EXPECT_EQ(g.Arrive(2, 10, 3.9).verdict, Verdict::kPromote);  // beats job 3 at rung 0
  EXPECT_EQ(g.Arrive(1, 10, 4.2).verdict, Verdict::kPrune);
  EXPECT_EQ(g.Arrive(2, 30, 3.6).verdict, Verdict::kPrune);    // behind job 3 at rung 1
  // A decision is never taken back: job 3 stays promoted though job 2 was
  // better at rung 0.
  EXPECT_EQ(g.recorded.size(), 5u);
}

TEST(AshaTest, RestartInTheMiddleNeitherRepeatsNorLosesADecision) {
  // The decisions recorded before a restart are what the scheduler reloads
  // from rung_results; a replayed point (a resumed attempt re-logs its
  // steps) is not decided again, and later arrivals rank against them.
  Group before;
  before.Arrive(1, 10, 5.0);
  before.Arrive(2, 10, 4.0);
  std::vector<RungEntry> reloaded = before.recorded;  // "durable"
  Group after;
  after.recorded = reloaded;
  EXPECT_EQ(after.Arrive(1, 10, 5.0).verdict, Verdict::kWait);  // replay: decided before
  EXPECT_EQ(after.Arrive(2, 10, 4.0).verdict, Verdict::kWait);
  RungDecision third = after.Arrive(3, 10, 4.5);  // rank 1 of 3, quota 1
  EXPECT_EQ(third.verdict, Verdict::kPrune);
  EXPECT_EQ(third.n, 3);
}

TEST(AshaTest, EtaTwoKeepsHalf) {
  Group g;
  g.Arrive(1, 10, 1.0, 2);
  g.Arrive(2, 10, 2.0, 2);  // n 2, quota 1: pruned
  g.Arrive(3, 10, 3.0, 2);  // n 3, quota 1: pruned
  RungDecision d = g.Arrive(4, 10, 1.5, 2);  // n 4, quota 2: rank 1 -> promoted
  EXPECT_EQ(d.verdict, Verdict::kPromote);
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
