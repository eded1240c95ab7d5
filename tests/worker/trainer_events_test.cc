#include "worker/trainer_events.h"

#include <gtest/gtest.h>

namespace depthbench::worker {
namespace {

struct Case {
  std::string line;
  bool ok;
  EventKind kind;
  int64_t step;
  std::vector<std::string> point_names;
};

class TrainerEventsTest : public ::testing::TestWithParam<Case> {};

TEST_P(TrainerEventsTest, ParsesAndMapsToPoints) {
  const Case& c = GetParam();
  absl::StatusOr<TrainerEvent> e = ParseTrainerEvent(c.line);
  ASSERT_EQ(e.ok(), c.ok) << c.line;
  if (!c.ok) return;
  EXPECT_EQ(e->kind, c.kind);
  EXPECT_EQ(e->step, c.step);
  std::vector<std::string> names;
  for (const auto& p : PointsFor(*e, 123)) {
    names.push_back(p.name());
    EXPECT_EQ(p.step(), c.step);
    EXPECT_EQ(p.wall_ms(), 123);
  }
  EXPECT_EQ(names, c.point_names);
}

// "step_1", "eval_3", "malformed_8": the kind the line should parse to, then
// the case's index.
std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  static const char* const kKinds[] = {"start", "step",        "eval",
                                       "checkpoint",  "done",  "interrupted",
                                       "diagnostics", "other"};
  static_assert(sizeof(kKinds) / sizeof(kKinds[0]) ==
                    static_cast<size_t>(EventKind::kOther) + 1,
                "one name per EventKind, in order");
  const Case& c = info.param;
  const std::string kind = c.ok ? kKinds[static_cast<int>(c.kind)] : "malformed";
  return kind + "_" + std::to_string(info.index);
}

INSTANTIATE_TEST_SUITE_P(
    Lines, TrainerEventsTest,
    ::testing::Values(
        Case{R"({"event":"start","config":{},"resumed_from_step":40})", true, EventKind::kStart, 0, {}},
        Case{R"({"event":"step","step":3,"loss":5.1,"lr":0.001,"grad_norm":0.7,"tokens_per_s":1e4})",
             true, EventKind::kStep, 3, {"loss", "lr", "grad_norm", "tokens_per_s"}},
        // A diverged step: non-finite values are null and not stored.
        Case{R"({"event":"step","step":9,"loss":null,"lr":1000,"grad_norm":null,"tokens_per_s":0})",
             true, EventKind::kStep, 9, {"lr", "tokens_per_s"}},
        Case{R"({"event":"eval","step":20,"val_loss":4.5})", true, EventKind::kEval, 20, {"val_loss"}},
        Case{R"({"event":"checkpoint","step":20,"path":"/r/checkpoint.pt"})", true,
             EventKind::kCheckpoint, 20, {"checkpoint"}},
        Case{R"({"event":"checkpoint","step":40,"path":"/r/checkpoint.pt","seconds":0.25})", true,
             EventKind::kCheckpoint, 40, {"checkpoint", "checkpoint_seconds"}},
        Case{R"({"event":"done","status":"succeeded","step":60,"val_loss":3.2})", true,
             EventKind::kDone, 60, {}},
        Case{R"({"event":"interrupted","step":7})", true, EventKind::kInterrupted, 7, {}},
        Case{R"({"event":"future_thing","step":1})", true, EventKind::kOther, 1, {}},
        Case{R"(not json)", false, EventKind::kOther, 0, {}},
        Case{R"([1,2])", false, EventKind::kOther, 0, {}},
        Case{R"({"step":1})", false, EventKind::kOther, 0, {}}),
    CaseName);

TEST(TrainerEventsTest, DoneAndDiagnosticsFields) {
  auto done = ParseTrainerEvent(
      R"({"event":"done","status":"diverged","step":5,"val_loss":null,"reason":"loss is not finite"})");
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->status, "diverged");
  EXPECT_EQ(done->reason, "loss is not finite");
  EXPECT_FALSE(done->has_val_loss);
  auto diag = ParseTrainerEvent(R"({"event":"diagnostics","kind":"angular","data":{"a":[1,2]}})");
  ASSERT_TRUE(diag.ok());
  EXPECT_EQ(diag->kind, EventKind::kDiagnostics);
  EXPECT_EQ(diag->diag_kind, "angular");
  EXPECT_EQ(diag->diag_data, R"({"a":[1,2]})");
  auto start = ParseTrainerEvent(R"({"event":"start","resumed_from_step":40})");
  ASSERT_TRUE(start.ok());
  EXPECT_EQ(start->resumed_from_step, 40);
}

TEST(TrainerEventsTest, TrainerTimestampAndCheckpointDuration) {
  auto step = ParseTrainerEvent(
      R"({"event":"step","step":4,"loss":5.0,"lr":0.1,"grad_norm":1,"tokens_per_s":9,"time_ms":1700000000123})");
  ASSERT_TRUE(step.ok());
  EXPECT_EQ(step->time_ms, 1700000000123);
  // The trainer's timestamp wins over the time the worker read the line.
  for (const auto& p : PointsFor(*step, 5)) EXPECT_EQ(p.wall_ms(), 1700000000123);
  auto ckpt = ParseTrainerEvent(R"({"event":"checkpoint","step":40,"path":"p","seconds":1.5})");
  ASSERT_TRUE(ckpt.ok());
  ASSERT_TRUE(ckpt->has_checkpoint_seconds);
  EXPECT_DOUBLE_EQ(ckpt->checkpoint_seconds, 1.5);
  std::vector<depthbench::v1::MetricPoint> points = PointsFor(*ckpt, 7);
  ASSERT_EQ(points.size(), 2u);
  EXPECT_EQ(points[1].name(), "checkpoint_seconds");
  EXPECT_DOUBLE_EQ(points[1].value(), 1.5);
  EXPECT_EQ(points[1].step(), 40);
  // A negative or missing duration is not a point.
  auto bad = ParseTrainerEvent(R"({"event":"checkpoint","step":40,"path":"p","seconds":-1})");
  ASSERT_TRUE(bad.ok());
  EXPECT_FALSE(bad->has_checkpoint_seconds);
  EXPECT_EQ(PointsFor(*bad, 7).size(), 1u);
}

}  // namespace
}  // namespace depthbench::worker
