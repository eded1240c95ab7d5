// Recipe, config and training-loop tests: LR schedule values, clipping,
// config validation naming the field, checkpoint-resume equality, and loss
// falling on the Brown corpus.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <random>
#include <sstream>

#include "trainer_core/checkpoint.h"
#include "trainer_core/model/model.h"
#include "trainer_core/optim.h"
#include "trainer_core/schedule.h"
#include "trainer_core/train_config.h"
#include "trainer_core/tools.h"
#include "trainer_core/trainer.h"

namespace depthbench {
namespace {

std::string TempDir(const std::string& name) {
  std::random_device rd;
  auto dir = std::filesystem::temp_directory_path() /
             ("depthbench_" + name + "_" + std::to_string(rd()));
  std::filesystem::create_directories(dir);
  return dir.string();
}

TEST(ScheduleTest, WarmupEndMidpointAndEnd) {
  const int64_t total = 1000;
  const double peak = 2e-3;
  EXPECT_EQ(WarmupSteps(total, 0.1), 100);
  EXPECT_DOUBLE_EQ(LearningRateAt(0, total, peak, 0.1, 0.1), peak / 100);
  EXPECT_DOUBLE_EQ(LearningRateAt(49, total, peak, 0.1, 0.1), peak * 50 / 100);
  EXPECT_DOUBLE_EQ(LearningRateAt(99, total, peak, 0.1, 0.1), peak);  // warmup end
  // Cosine midpoint: halfway between peak and the 10% floor.
  const int64_t mid = 100 + (total - 1 - 100) / 2;
  EXPECT_NEAR(LearningRateAt(mid, total, peak, 0.1, 0.1), 0.55 * peak, 2e-3 * peak);
  EXPECT_DOUBLE_EQ(LearningRateAt(total - 1, total, peak, 0.1, 0.1), 0.1 * peak);  // end
  // Monotone decay after warmup.
  for (int64_t t = 100; t < total - 1; ++t) {
    EXPECT_GE(LearningRateAt(t, total, peak, 0.1, 0.1), LearningRateAt(t + 1, total, peak, 0.1, 0.1));
  }
}

TEST(OptimTest, ClippingScalesToMaxNormAndReportsPreClipNorm) {
  torch::Tensor a = torch::zeros({2}, torch::requires_grad());
  torch::Tensor b = torch::zeros({1}, torch::requires_grad());
  a.mutable_grad() = torch::tensor({3.0f, 0.0f});
  b.mutable_grad() = torch::tensor({4.0f});
  const double norm = ClipGradNorm({a, b}, 1.0);
  EXPECT_NEAR(norm, 5.0, 1e-6);
  const double after = std::sqrt(a.grad().pow(2).sum().item<double>() + b.grad().pow(2).sum().item<double>());
  EXPECT_NEAR(after, 1.0, 1e-5);
  EXPECT_NEAR(a.grad()[0].item<double>(), 0.6, 1e-5);
  // Below the limit nothing changes.
  a.mutable_grad() = torch::tensor({0.3f, 0.0f});
  b.mutable_grad() = torch::tensor({0.4f});
  EXPECT_NEAR(ClipGradNorm({a, b}, 1.0), 0.5, 1e-6);
  EXPECT_NEAR(b.grad()[0].item<double>(), 0.4, 1e-6);
}

TEST(OptimTest, AdamWGroupsCarryTheRecipe) {
  torch::Tensor w = torch::randn({4, 4}, torch::requires_grad());
  torch::Tensor g = torch::ones({4}, torch::requires_grad());
  auto opt = MakeAdamW(ParamGroups{{w}, {g}}, 1e-3, 0.1);
  ASSERT_EQ(opt->param_groups().size(), 2u);
  auto& o0 = static_cast<torch::optim::AdamWOptions&>(opt->param_groups()[0].options());
  auto& o1 = static_cast<torch::optim::AdamWOptions&>(opt->param_groups()[1].options());
  EXPECT_DOUBLE_EQ(o0.weight_decay(), 0.1);
  EXPECT_DOUBLE_EQ(o1.weight_decay(), 0.0);
  EXPECT_DOUBLE_EQ(std::get<0>(o0.betas()), 0.9);
  EXPECT_DOUBLE_EQ(std::get<1>(o0.betas()), 0.95);
  EXPECT_DOUBLE_EQ(o0.eps(), 1e-8);
  SetLearningRate(*opt, 5e-4);
  EXPECT_DOUBLE_EQ(o1.lr(), 5e-4);
}

// FusedAdamW (one pass per parameter) against the stock torch::optim::AdamW
// it replaces, over steps that cover every path: float32 parameters of
// several sizes (whole vectors and a tail), a no-decay group, a float64
// parameter (the stock ops: bit-identical), a parameter whose gradient is
// cleared after its first step (stepped with a zero gradient, as the stock
// optimiser steps it after zero_grad()) and one that never gets a gradient
// (never stepped, no state). The fused update agrees to float rounding.
TEST(OptimTest, FusedAdamWMatchesStockAdamW) {
  torch::manual_seed(3);
  const std::vector<std::vector<int64_t>> shapes = {{64, 48}, {3, 37}, {1}, {16}};
  std::vector<torch::Tensor> a, b;  // stock, fused
  auto add = [&](torch::Tensor init) {
    a.push_back(init.clone().requires_grad_());
    b.push_back(init.clone().requires_grad_());
  };
  for (const auto& s : shapes) add(torch::randn(s));
  add(torch::randn({5, 7}, torch::kFloat64));
  add(torch::randn({9}));  // gradient only at the first step
  add(torch::randn({4}));  // never a gradient
  const size_t cleared = a.size() - 2, unused = a.size() - 1;
  auto groups = [](const std::vector<torch::Tensor>& p) {
    ParamGroups g;
    for (size_t i = 0; i < p.size(); ++i) (i == 3 ? g.no_decay : g.decay).push_back(p[i]);
    return g;
  };
  const ParamGroups ga = groups(a), gb = groups(b);
  torch::optim::AdamW stock(
      {torch::optim::OptimizerParamGroup(
           ga.decay, std::make_unique<torch::optim::AdamWOptions>(
                         torch::optim::AdamWOptions(3e-3).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1))),
       torch::optim::OptimizerParamGroup(
           ga.no_decay, std::make_unique<torch::optim::AdamWOptions>(
                            torch::optim::AdamWOptions(3e-3).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.0)))},
      torch::optim::AdamWOptions(3e-3));
  auto fused = MakeAdamW(gb, 3e-3, 0.1);
  ASSERT_NE(dynamic_cast<FusedAdamW*>(fused.get()), nullptr);
  for (int step = 0; step < 6; ++step) {
    stock.zero_grad();
    ClearGradients(b);
    for (size_t i = 0; i < a.size(); ++i) {
      if (i == unused || (i == cleared && step > 0)) continue;
      torch::Tensor g = torch::randn_like(a[i]) * (step % 2 ? 1e-3 : 1.0);
      a[i].mutable_grad() = g.clone();
      b[i].mutable_grad() = g.clone();
    }
    if (step == 2) {
      SetLearningRate(stock, 1e-3);
      SetLearningRate(*fused, 1e-3);
    }
    stock.step();
    fused->step();
    for (size_t i = 0; i < a.size(); ++i) {
      SCOPED_TRACE(::testing::Message() << "step " << step << ", parameter " << i);
      if (a[i].scalar_type() == torch::kFloat64) {
        EXPECT_TRUE(torch::equal(a[i], b[i]));
      } else {
        // A few float ulps of the parameter, far below one step (lr 1e-3).
        EXPECT_LE((a[i] - b[i]).abs().max().item<double>(),
                  4e-7 * (1 + a[i].abs().max().item<double>()));
      }
    }
  }
  EXPECT_EQ(fused->state().size(), a.size() - 1);  // all but the unused one
  EXPECT_TRUE(torch::equal(b[unused], a[unused]));
  // The state under the stock optimiser's keys, matching its moments.
  for (size_t i = 0; i < b.size(); ++i) {
    if (i == unused) continue;
    SCOPED_TRACE(::testing::Message() << "state of parameter " << i);
    const std::string ka = c10::guts::to_string(a[i].unsafeGetTensorImpl());
    const std::string kb = c10::guts::to_string(b[i].unsafeGetTensorImpl());
    auto& sa = static_cast<torch::optim::AdamWParamState&>(*stock.state().at(ka));
    auto& sb = static_cast<torch::optim::AdamWParamState&>(*fused->state().at(kb));
    EXPECT_EQ(sa.step(), sb.step());
    // Absolute tolerances: a moment near zero is a difference of terms ~0.1.
    EXPECT_TRUE(torch::allclose(sa.exp_avg(), sb.exp_avg(), 1e-5, 1e-7));
    EXPECT_TRUE(torch::allclose(sa.exp_avg_sq(), sb.exp_avg_sq(), 1e-5, 1e-9));
  }
}

TEST(OptimTest, ClearGradientsLeavesTheNextBackwardToStoreItsOwn) {
  torch::Tensor w = torch::ones({3}, torch::requires_grad());
  (w * 2).sum().backward();
  ASSERT_TRUE(w.grad().defined());
  ClearGradients({w});
  EXPECT_FALSE(w.grad().defined());
  (w * 3).sum().backward();
  EXPECT_TRUE(torch::equal(w.grad(), torch::full({3}, 3.0f)));  // not 2 + 3
}

TEST(OptimTest, FusedAdamWStateSavesAndLoadsAsStockAdamW) {
  torch::Tensor w = torch::randn({8, 8}, torch::requires_grad());
  auto fused = MakeAdamW(ParamGroups{{w}, {}}, 1e-3, 0.1);
  w.mutable_grad() = torch::randn({8, 8});
  fused->step();
  std::stringstream buf;
  {
    torch::serialize::OutputArchive out;
    fused->save(out);
    out.save_to(buf);
  }
  torch::Tensor w2 = w.detach().clone().requires_grad_();
  torch::optim::AdamW stock({w2}, torch::optim::AdamWOptions(1e-3).weight_decay(0.1));
  torch::serialize::InputArchive in;
  in.load_from(buf);
  stock.load(in);
  ASSERT_EQ(stock.state().size(), 1u);
  auto& st = static_cast<torch::optim::AdamWParamState&>(*stock.state().begin()->second);
  EXPECT_EQ(st.step(), 1);
  EXPECT_GT(st.exp_avg_sq().abs().sum().item<double>(), 0.0);
}

nlohmann::json With(nlohmann::json j, const std::string& key, const nlohmann::json& value) {
  j[key] = value;
  return j;
}

TEST(TrainConfigTest, ErrorsNameTheField) {
  struct Case {
    nlohmann::json config;
    std::string want;
  };
  const nlohmann::json base = {{"arch", "pre_ln"}, {"layers", 2}, {"d_model", 64}, {"heads", 4}, {"lr", 1e-3}};
  std::vector<Case> cases = {
      {{{"layers", 2}, {"d_model", 64}, {"lr", 1e-3}}, "config.arch: required"},
      {With(base, "arch", "hcc"), "config.arch: unknown architecture \"hcc\""},
      {With(base, "lr", -1.0), "config.lr: must be positive"},
      {With(base, "lr", "fast"), "config.lr: expected a number"},
      {With(base, "heads", 5), "config.heads:"},
      {With(base, "warmup_frac", 1.5), "config.warmup_frac: must be in [0, 1]"},
      {With(base, "bogus", 1), "config.bogus: unknown key"},
      {With(base, "data", "/x.bin"), "config.vocab: required"},
      {With(base, "hc_form", "other"), "config.hc_form:"},
      {With(base, "checkpoint_minutes", -1.0), "config.checkpoint_minutes: must be >= 0"},
      {With(base, "checkpoint_minutes", "often"), "config.checkpoint_minutes: expected a number"},
  };
  for (const Case& c : cases) {
    auto parsed = TrainConfigFromJson(c.config);
    ASSERT_FALSE(parsed.ok()) << c.config.dump();
    EXPECT_NE(std::string(parsed.status().message()).find(c.want), std::string::npos)
        << parsed.status().message() << " vs " << c.want;
  }
  auto ok = TrainConfigFromJson(base);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->shape.vocab, 256);
  EXPECT_EQ(ok->shape.d_ff, 176);  // ceil16(8 * 64 / 3)
  // Round trip through ToJson is stable.
  auto again = TrainConfigFromJson(ok->ToJson());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->ToJson(), ok->ToJson());
}

TEST(TrainConfigTest, TotalStepsFromTokensPerParam) {
  TrainConfig c;
  c.shape = MakeShape(2, 32, 256, FfnRule::kSwiGlu83, 4, 4);
  c.batch = 4;
  c.seq_len = 10;
  c.tokens_per_param = 20;
  // Default budget: the shape's Pre-LN count.
  TokenBudget b = ResolveTokenBudget(c);
  EXPECT_EQ(b.params, TotalParams(c.shape));
  EXPECT_EQ(b.tokens, 20 * TotalParams(c.shape));
  EXPECT_EQ(b.steps, (20 * TotalParams(c.shape) + 39) / 40);
  c.budget_params = 1000;
  EXPECT_EQ(ResolveTotalSteps(c), 500);  // 20000 tokens / 40 per step
  c.tokens = 400;
  EXPECT_EQ(ResolveTotalSteps(c), 10);
  c.steps = 7;
  EXPECT_EQ(ResolveTotalSteps(c), 7);
  // Fixed steps override the tokens: the budget shows what is trained.
  EXPECT_EQ(ResolveTokenBudget(c).tokens, 7 * 40);
  c.tokens.reset();
  EXPECT_EQ(ResolveTokenBudget(c).tokens, 7 * 40);
}

// Spec section 5: the token budget is per shape, not per design. pre_ln, mhc
// and moda at one shape train for the same number of steps (20 tokens per
// Pre-LN parameter of the shape), although mhc and moda have more parameters.
TEST(TrainerTest, SameShapeSameStepsWhateverTheDesign) {
  Trainer::ClearStop();
  std::vector<int64_t> steps, params;
  for (const char* arch : {"pre_ln", "mhc", "moda"}) {
    nlohmann::json j = {{"arch", arch}, {"layers", 2}, {"d_model", 32}, {"heads", 4},
                        {"seq_len", 32}, {"batch", 4}, {"tokens_per_param", 0.02},
                        {"lr", 3e-3}, {"threads", 1}, {"seed", 7}, {"eval_batches", 1}};
    auto config = TrainConfigFromJson(j);
    ASSERT_TRUE(config.ok()) << config.status();
    std::vector<nlohmann::json> events;
    Trainer t(*config, TrainerOptions{TempDir(std::string("budget_") + arch), false, ""},
              [&](const nlohmann::json& e) { events.push_back(e); });
    auto result = t.Run();
    ASSERT_TRUE(result.ok()) << arch << ": " << result.status();
    ASSERT_FALSE(events.empty());
    const nlohmann::json& start = events.front();
    ASSERT_EQ(start["event"], "start");
    EXPECT_EQ(start["budget"]["params"], TotalParams(config->shape)) << arch;
    EXPECT_EQ(start["budget"]["steps"], start["total_steps"]) << arch;
    EXPECT_EQ(result->steps_done, start["total_steps"].get<int64_t>()) << arch;
    steps.push_back(result->steps_done);
    params.push_back(start["params"]["total"].get<int64_t>());
  }
  // ceil(0.02 * TotalParams / (4 * 32)) for every design.
  const int64_t total = TotalParams(MakeShape(2, 32, 256, FfnRule::kSwiGlu83, 4, 4));
  const int64_t want = static_cast<int64_t>(std::ceil(std::ceil(0.02 * total) / 128.0));
  EXPECT_EQ(steps, std::vector<int64_t>({want, want, want}));
  EXPECT_GT(params[1], params[0]);  // mhc's routing parameters
  EXPECT_GT(params[2], params[0]);  // moda's FFN depth K/V projections
}

// `depthbench-train shapes --suite ladder500M` prints the paper's deep 500M
// shape (34 x 992, the authors' llama_500m_L34 config) first.
TEST(ToolsTest, ShapesLadder500MGivesThePapersDeepShape) {
  ToolFlags flags;
  flags.suite = "ladder500M";
  flags.json = true;
  std::ostringstream out;
  ASSERT_TRUE(RunShapesCommand(flags, out).ok());
  nlohmann::json j = nlohmann::json::parse(out.str());
  ASSERT_EQ(j["shapes"].size(), 3u);
  EXPECT_EQ(j["shapes"][0]["layers"], 34);
  EXPECT_EQ(j["shapes"][0]["d_model"], 992);
  EXPECT_EQ(j["shapes"][0]["d_ff"], 2656);
  EXPECT_EQ(j["shapes"][1]["layers"], 26);
  EXPECT_EQ(j["shapes"][1]["d_model"], 1120);
  EXPECT_EQ(j["shapes"][2]["layers"], 17);
  EXPECT_EQ(j["shapes"][2]["d_model"], 1344);
}

TrainConfig TinyConfig(int64_t steps) {
  nlohmann::json j = {{"arch", "pre_ln"}, {"layers", 2}, {"d_model", 32}, {"heads", 4},
                      {"seq_len", 32}, {"batch", 4}, {"steps", steps}, {"lr", 3e-3},
                      {"threads", 1}, {"seed", 7}, {"eval_batches", 2}};
  auto c = TrainConfigFromJson(j);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

std::vector<double> StepLosses(const std::vector<nlohmann::json>& events) {
  std::vector<double> losses;
  for (const auto& e : events) {
    if (e["event"] == "step") losses.push_back(e["loss"].get<double>());
  }
  return losses;
}

TEST(TrainerTest, ResumeReproducesUninterruptedLossesExactly) {
  Trainer::ClearStop();
  const TrainConfig config = TinyConfig(10);
  // Uninterrupted run.
  std::vector<nlohmann::json> full_events;
  Trainer full(config, TrainerOptions{TempDir("full"), false, ""},
               [&](const nlohmann::json& e) { full_events.push_back(e); });
  auto full_result = full.Run();
  ASSERT_TRUE(full_result.ok()) << full_result.status();
  const std::vector<double> full_losses = StepLosses(full_events);
  ASSERT_EQ(full_losses.size(), 10u);

  // Interrupted after step 4 (as SIGTERM would), then resumed.
  const std::string dir = TempDir("resume");
  std::vector<nlohmann::json> first_events;
  Trainer first(config, TrainerOptions{dir, false, ""}, [&](const nlohmann::json& e) {
    first_events.push_back(e);
    if (e["event"] == "step" && e["step"] == 4) Trainer::RequestStop();
  });
  auto first_result = first.Run();
  Trainer::ClearStop();
  ASSERT_TRUE(first_result.ok()) << first_result.status();
  EXPECT_EQ(first_result->status, RunStatus::kInterrupted);
  EXPECT_EQ(first_result->steps_done, 4);
  ASSERT_TRUE(std::filesystem::exists(CheckpointPath(dir)));

  std::vector<nlohmann::json> second_events;
  Trainer second(config, TrainerOptions{dir, true, ""},
                 [&](const nlohmann::json& e) { second_events.push_back(e); });
  auto second_result = second.Run();
  ASSERT_TRUE(second_result.ok()) << second_result.status();
  EXPECT_EQ(second_events.front()["resumed_from_step"], 4);
  std::vector<double> resumed = StepLosses(first_events);
  for (double l : StepLosses(second_events)) resumed.push_back(l);
  ASSERT_EQ(resumed.size(), full_losses.size());
  for (size_t i = 0; i < resumed.size(); ++i) {
    EXPECT_EQ(resumed[i], full_losses[i]) << "step " << i + 1;  // bit-exact
  }
  EXPECT_EQ(second_result->val_loss, full_result->val_loss);
}

// Monotonic time that moves `step_ms` forward at every reading (each step
// "takes" that long); wall time stands still.
class SteppingClock final : public Clock {
 public:
  explicit SteppingClock(int64_t step_ms) : step_ms_(step_ms) {}
  int64_t NowMonotonicMs() const override { return now_ms_.fetch_add(step_ms_); }
  int64_t NowWallMs() const override { return 1'700'000'000'000; }

 private:
  const int64_t step_ms_;
  mutable std::atomic<int64_t> now_ms_{0};
};

std::vector<std::pair<int64_t, std::string>> Checkpoints(const std::vector<nlohmann::json>& events) {
  std::vector<std::pair<int64_t, std::string>> out;
  for (const auto& e : events) {
    if (e["event"] != "checkpoint") continue;
    out.emplace_back(e["step"].get<int64_t>(), e["trigger"].get<std::string>());
    EXPECT_GE(e["seconds"].get<double>(), 0.0);
  }
  return out;
}

// Issue 19: checkpoints by training time, on by default, with their write
// time in the event (and every event stamped with the wall clock).
TEST(TrainerTest, CheckpointsByTimeAndReportsTheirDuration) {
  Trainer::ClearStop();
  TrainConfig config = TinyConfig(10);
  EXPECT_DOUBLE_EQ(config.checkpoint_minutes, 10.0);  // the default
  config.checkpoint_minutes = 2;
  SteppingClock clock(60'000);  // a minute per reading
  std::vector<nlohmann::json> events;
  TrainerOptions options{TempDir("ckpt_time"), false, ""};
  options.clock = &clock;
  Trainer trainer(config, options, [&](const nlohmann::json& e) { events.push_back(e); });
  ASSERT_TRUE(trainer.Run().ok());
  // Readings: the start, then one per step and one after each checkpoint,
  // so two minutes pass between checkpoints every second step.
  using Ckpt = std::pair<int64_t, std::string>;
  EXPECT_EQ(Checkpoints(events), (std::vector<Ckpt>{{2, "time"}, {4, "time"}, {6, "time"},
                                                    {8, "time"}, {10, "final"}}));
  for (const auto& e : events) EXPECT_EQ(e["time_ms"], 1'700'000'000'000) << e.dump();
  ASSERT_TRUE(std::filesystem::exists(CheckpointPath(options.out_dir)));
  EXPECT_FALSE(std::filesystem::exists(CheckpointPath(options.out_dir) + ".tmp"));

  // 0 turns them off; the step interval still applies.
  config.checkpoint_minutes = 0;
  config.checkpoint_interval = 4;
  events.clear();
  options.out_dir = TempDir("ckpt_off");
  Trainer off(config, options, [&](const nlohmann::json& e) { events.push_back(e); });
  ASSERT_TRUE(off.Run().ok());
  EXPECT_EQ(Checkpoints(events), (std::vector<Ckpt>{{4, "steps"}, {8, "steps"}, {10, "final"}}));
}

TEST(TrainerTest, ResumeRefusesACheckpointOfAnotherShape) {
  Trainer::ClearStop();
  const std::string dir = TempDir("mismatch");
  Trainer first(TinyConfig(2), TrainerOptions{dir, false, ""}, [](const nlohmann::json&) {});
  ASSERT_TRUE(first.Run().ok());
  TrainConfig other = TinyConfig(2);
  other.shape.layers = 3;
  Trainer second(other, TrainerOptions{dir, true, ""}, [](const nlohmann::json&) {});
  auto result = second.Run();
  ASSERT_FALSE(result.ok());
  EXPECT_NE(std::string(result.status().message()).find("layers"), std::string::npos);
}

TEST(TrainerTest, LossFallsClearlyOnBrown) {
  Trainer::ClearStop();
  TrainConfig config = TinyConfig(60);
  config.shape.d_model = 64;
  config.shape.d_ff = 176;
  config.batch = 8;
  config.seq_len = 64;
  std::vector<nlohmann::json> events;
  Trainer t(config, TrainerOptions{TempDir("falls"), false, ""},
            [&](const nlohmann::json& e) { events.push_back(e); });
  auto result = t.Run();
  ASSERT_TRUE(result.ok()) << result.status();
  const std::vector<double> losses = StepLosses(events);
  ASSERT_EQ(losses.size(), 60u);
  // Byte-level uniform prediction is ln 256 = 5.55 nats.
  EXPECT_GT(losses.front(), 5.0);
  EXPECT_LT(result->val_loss, losses.front() - 1.5);
  EXPECT_EQ(result->status, RunStatus::kSucceeded);
}

TEST(TrainerTest, AbsurdLearningRateDiverges) {
  Trainer::ClearStop();
  TrainConfig config = TinyConfig(40);
  config.lr = 50.0;
  config.warmup_frac = 0.0;
  std::vector<nlohmann::json> events;
  Trainer t(config, TrainerOptions{TempDir("diverge"), false, ""},
            [&](const nlohmann::json& e) { events.push_back(e); });
  auto result = t.Run();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->status, RunStatus::kDiverged);
  EXPECT_EQ(events.back()["event"], "done");
  EXPECT_EQ(events.back()["status"], "diverged");
}

TEST(TrainerTest, MissingDataFileIsAPreciseError) {
  Trainer::ClearStop();
  TrainConfig config = TinyConfig(2);
  config.data = "/nonexistent/tokens.bin";
  Trainer t(config, TrainerOptions{TempDir("nodata"), false, ""}, [](const nlohmann::json&) {});
  auto result = t.Run();
  ASSERT_FALSE(result.ok());
  EXPECT_NE(std::string(result.status().message()).find("/nonexistent/tokens.bin"), std::string::npos);
}

}  // namespace
}  // namespace depthbench
