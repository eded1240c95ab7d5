// The run protocol (common/run_protocol.h): what the trainer's builders
// write is what the worker's parser reads, and a failure reason written by
// the worker reads back as the same fields in the CLI.
#include "common/run_protocol.h"

#include <cmath>
#include <limits>

#include <gtest/gtest.h>

namespace depthbench::run_protocol {
namespace {

TrainerEvent RoundTrip(const nlohmann::json& event) {
  absl::StatusOr<TrainerEvent> e = ParseTrainerEvent(event.dump());
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? *e : TrainerEvent{};
}

TEST(RunProtocolTest, EventNamesRoundTrip) {
  for (EventKind k : {EventKind::kStart, EventKind::kStep, EventKind::kEval, EventKind::kCheckpoint,
                      EventKind::kDone, EventKind::kInterrupted, EventKind::kDiagnostics}) {
    EXPECT_FALSE(EventName(k).empty());
    EXPECT_EQ(EventKindFromName(EventName(k)), k) << EventName(k);
  }
  EXPECT_EQ(EventKindFromName("spline"), EventKind::kOther);
  EXPECT_EQ(EventKindFromName(""), EventKind::kOther);
}

TEST(RunProtocolTest, StepEventWritesNullForNonFiniteAndReadsBack) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  nlohmann::json j = StepEvent(7, nan, 0.01, std::numeric_limits<double>::infinity(), 0.0);
  EXPECT_EQ(j["event"], "step");
  EXPECT_TRUE(j["loss"].is_null());
  EXPECT_TRUE(j["grad_norm"].is_null());
  TrainerEvent e = RoundTrip(j);
  EXPECT_EQ(e.kind, EventKind::kStep);
  EXPECT_EQ(e.step, 7);
  EXPECT_TRUE(std::isnan(e.loss));
  EXPECT_DOUBLE_EQ(e.lr, 0.01);
  EXPECT_TRUE(std::isnan(e.grad_norm));
  EXPECT_DOUBLE_EQ(e.tokens_per_s, 0.0);
}

TEST(RunProtocolTest, DoneEventsCarryStatusLossAndReason) {
  TrainerEvent ok = RoundTrip(SucceededEvent(100, 1.25, 1.5));
  EXPECT_EQ(ok.kind, EventKind::kDone);
  EXPECT_EQ(ok.status, kDoneSucceeded);
  EXPECT_TRUE(ok.has_val_loss);
  EXPECT_DOUBLE_EQ(ok.val_loss, 1.25);
  EXPECT_EQ(ok.step, 100);

  nlohmann::json div = DivergedEvent(12, "loss is not finite");
  EXPECT_TRUE(div["val_loss"].is_null());
  TrainerEvent d = RoundTrip(div);
  EXPECT_EQ(d.status, kDoneDiverged);
  EXPECT_FALSE(d.has_val_loss);
  EXPECT_EQ(d.reason, "loss is not finite");
}

TEST(RunProtocolTest, CheckpointEvalInterruptedStartDiagnostics) {
  TrainerEvent c = RoundTrip(CheckpointEvent(40, "/ck/a.pt", 0.5, "time"));
  EXPECT_EQ(c.kind, EventKind::kCheckpoint);
  EXPECT_EQ(c.path, "/ck/a.pt");
  EXPECT_TRUE(c.has_checkpoint_seconds);
  EXPECT_DOUBLE_EQ(c.checkpoint_seconds, 0.5);

  TrainerEvent v = RoundTrip(EvalEvent(40, 2.5));
  EXPECT_EQ(v.kind, EventKind::kEval);
  EXPECT_TRUE(v.has_val_loss);

  EXPECT_EQ(RoundTrip(InterruptedEvent(41)).kind, EventKind::kInterrupted);

  nlohmann::json s = StartEvent({{"resumed_from_step", 30}, {"total_steps", 100}});
  EXPECT_EQ(s["event"], "start");
  EXPECT_EQ(s["total_steps"], 100);
  EXPECT_EQ(RoundTrip(s).resumed_from_step, 30);

  TrainerEvent g = RoundTrip(DiagnosticsEvent("deff", {{"a", 1}}));
  EXPECT_EQ(g.kind, EventKind::kDiagnostics);
  EXPECT_EQ(g.diag_kind, "deff");
  EXPECT_EQ(g.diag_data, "{\"a\":1}");
}

TEST(RunProtocolTest, RejectsLinesThatAreNotEvents) {
  EXPECT_FALSE(ParseTrainerEvent("step 3 loss 2.0").ok());
  EXPECT_FALSE(ParseTrainerEvent("[1,2]").ok());
  EXPECT_FALSE(ParseTrainerEvent("{\"event\": 3}").ok());
  EXPECT_EQ(ParseTrainerEvent("{\"event\": \"later\"}")->kind, EventKind::kOther);
}

TEST(RunProtocolTest, ExitCodesAreDistinctAndDescribed) {
  EXPECT_EQ(kExitOk, 0);
  EXPECT_EQ(ExitCodeMeaning(kExitUsage), "invalid input");
  EXPECT_EQ(ExitCodeMeaning(kExitDiverged), "diverged");
  EXPECT_EQ(ExitCodeMeaning(kExitInterrupted), "interrupted");
  EXPECT_EQ(ExitCodeMeaning(kExitFailure), "");
}

TEST(RunProtocolTest, FailureReasonRoundTripsWithTrainerError) {
  FailureDetail in;
  in.summary = "depthbench-train exit code 2 (invalid input) at step 0";
  in.stderr_tail = "loading\ndepthbench-train: error: --config: lr must be positive\nbye";
  const std::string reason = FormatFailureReason(in);
  FailureDetail out = ParseFailureDetail(reason);
  EXPECT_EQ(out.summary, in.summary);
  EXPECT_EQ(out.stderr_tail, in.stderr_tail);
  ASSERT_TRUE(out.has_trainer_error);
  EXPECT_EQ(out.trainer_error, "--config: lr must be positive");
}

TEST(RunProtocolTest, ReasonWithoutTailIsAllSummary) {
  FailureDetail d = ParseFailureDetail("attempts exhausted (3 of 3)");
  EXPECT_EQ(d.summary, "attempts exhausted (3 of 3)");
  EXPECT_EQ(d.stderr_tail, "");
  EXPECT_FALSE(d.has_trainer_error);

  FailureDetail e = ParseFailureDetail("depthbench-train signal 9; stderr tail:\n");
  EXPECT_EQ(e.summary, "depthbench-train signal 9");
  EXPECT_FALSE(e.has_trainer_error);
}

}  // namespace
}  // namespace depthbench::run_protocol
