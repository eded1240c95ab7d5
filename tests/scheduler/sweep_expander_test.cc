#include "scheduler/sweep_expander.h"

#include <map>
#include <set>

#include <google/protobuf/descriptor.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/scheduler/test_util.h"
#include "trainer_core/arch.h"
#include "trainer_core/train_config.h"

namespace depthbench::scheduler {
namespace {

using depthbench::v1::SweepSpec;

TEST(SweepExpanderTest, SuiteGridCountsAndDefaultLrGrids) {
  SweepSpec spec;
  spec.set_name("grid");
  spec.add_architectures("pre_ln");
  spec.add_architectures("lns");
  spec.add_architectures("hc");
  spec.mutable_shapes()->set_suite("tiny");
  spec.add_seeds(0);
  spec.add_seeds(1);
  auto expanded = ExpandSweep(spec);
  ASSERT_TRUE(expanded.ok()) << expanded.status();
  // 3 archs x 3 tiny shapes x 4 default LRs x 2 seeds.
  EXPECT_EQ(expanded->jobs.size(), 3u * 3u * 4u * 2u);
  EXPECT_EQ(expanded->groups.size(), 9u);
  std::set<double> lns_lrs, pre_lrs;
  for (const PlannedJob& job : expanded->jobs) {
    if (job.arch == "lns") lns_lrs.insert(job.lr);
    if (job.arch == "pre_ln") pre_lrs.insert(job.lr);
  }
  auto lns_default = DefaultLrGrid(Arch::kLns);
  auto pre_default = DefaultLrGrid(Arch::kPreLn);
  EXPECT_EQ(lns_lrs, std::set<double>(lns_default.begin(), lns_default.end()));
  EXPECT_EQ(pre_lrs, std::set<double>(pre_default.begin(), pre_default.end()));
  EXPECT_EQ(lns_lrs.count(2e-2), 1u);
  // Shapes are the solver's.
  auto suite = NamedSuite("tiny");
  auto rows = SolveSuite(*suite);
  ASSERT_TRUE(rows.ok());
  for (size_t i = 0; i < rows->size(); ++i) {
    EXPECT_EQ(expanded->groups[i].shape.layers, (*rows)[i].shape.layers);
    EXPECT_EQ(expanded->groups[i].shape.d_model, (*rows)[i].shape.d_model);
  }
  // hc carries its extra parameters.
  const PlannedGroup& hc = expanded->groups[6];
  EXPECT_EQ(hc.arch, "hc");
  EXPECT_GT(hc.params, TotalParams(hc.shape));
  EXPECT_EQ(expanded->groups[0].params, TotalParams(expanded->groups[0].shape));
}

TEST(SweepExpanderTest, SolverShapesAndConfigKeys) {
  SweepSpec spec;
  spec.set_name("solver");
  spec.add_architectures("keel");
  auto* solver = spec.mutable_shapes()->mutable_solver();
  solver->set_ref_layers(4);
  solver->set_ref_d_model(128);
  solver->add_layers(2);
  solver->add_layers(4);
  solver->add_layers(8);
  solver->set_heads(4);
  (*spec.mutable_lr_grids())["keel"].add_lrs(1e-3);
  spec.mutable_training()->set_data("brown");
  spec.mutable_training()->set_steps(50);
  spec.mutable_training()->set_eval_interval(10);
  auto expanded = ExpandSweep(spec);
  ASSERT_TRUE(expanded.ok()) << expanded.status();
  ASSERT_EQ(expanded->jobs.size(), 3u);
  EXPECT_EQ(expanded->jobs[1].shape.d_model, 128);  // reference depth
  EXPECT_GT(expanded->jobs[0].shape.d_model, 128);
  EXPECT_LT(expanded->jobs[2].shape.d_model, 128);
  auto config = nlohmann::json::parse(expanded->jobs[0].config_json);
  EXPECT_EQ(config["arch"], "keel");
  EXPECT_EQ(config["layers"], 2);
  EXPECT_EQ(config["heads"], 4);
  EXPECT_EQ(config["vocab"], 256);
  EXPECT_DOUBLE_EQ(config["lr"].get<double>(), 1e-3);
  EXPECT_EQ(config["steps"], 50);
  EXPECT_EQ(config["eval_interval"], 10);
  EXPECT_EQ(config["data"], "brown");
  EXPECT_FALSE(config.contains("batch"));  // unset: trainer default
  EXPECT_EQ(config["seed"], 0);
}

// Every TrainingSettings field reaches the job config under its own name,
// which the trainer's parser accepts; the JSON is exactly what the trainer
// reads (byte for byte what the scheduler wrote before it used the
// trainer's parser). A new TrainingSettings field fails here until it is
// set below, which checks that the trainer knows its name.
TEST(SweepExpanderTest, EveryTrainingSettingIsATrainerKey) {
  SweepSpec spec = depthbench::testing::SmallSpec("all", {"hc"}, {3e-3});
  spec.add_seeds(7);
  auto* shape = spec.mutable_shapes()->mutable_explicit_shapes(0);
  shape->set_layers(4);
  shape->set_d_model(96);
  shape->set_heads(4);
  shape->set_kv_heads(2);
  auto* t = spec.mutable_training();
  t->set_data("brown");
  t->set_seq_len(64);
  t->set_batch(8);
  t->set_tokens_per_param(20.5);
  t->set_steps(120);
  t->set_tokens(100000);
  t->set_eval_interval(20);
  t->set_eval_batches(4);
  t->set_checkpoint_interval(40);
  t->set_checkpoint_minutes(7.5);
  t->set_threads(2);
  t->set_warmup_frac(0.05);
  t->set_min_lr_frac(0.1);
  t->set_weight_decay(0.01);
  t->set_grad_clip(0.5);
  t->set_explode_threshold(12.5);
  t->set_hc_streams(4);
  t->set_hc_form("code");
  t->set_log_interval(5);
  auto expanded = ExpandSweep(spec);
  ASSERT_TRUE(expanded.ok()) << expanded.status();
  ASSERT_EQ(expanded->jobs.size(), 1u);
  const std::string& config = expanded->jobs[0].config_json;
  EXPECT_EQ(config,
            R"({"arch":"hc","batch":8,"budget_params":455520,"checkpoint_interval":40,)"
            R"("checkpoint_minutes":7.5,)"
            R"("d_ff":256,"d_model":96,)"
            R"("data":"brown","eval_batches":4,"eval_interval":20,"explode_threshold":12.5,)"
            R"("grad_clip":0.5,"hc_form":"code","hc_streams":4,"heads":4,"kv_heads":2,)"
            R"("layers":4,"log_interval":5,"lr":0.003,"min_lr_frac":0.1,"seed":7,)"
            R"("seq_len":64,"steps":120,"threads":2,"tokens":100000,"tokens_per_param":20.5,)"
            R"("vocab":256,"warmup_frac":0.05,"weight_decay":0.01})");
  auto parsed = TrainConfigFromJson(nlohmann::json::parse(config));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->hc_code_form);
  EXPECT_DOUBLE_EQ(parsed->checkpoint_minutes, 7.5);
  EXPECT_DOUBLE_EQ(parsed->grad_clip, 0.5);
  EXPECT_EQ(parsed->shape.kv_heads, 2);
  const google::protobuf::Descriptor* fields = depthbench::v1::TrainingSettings::descriptor();
  nlohmann::json keys = nlohmann::json::parse(config);
  for (int i = 0; i < fields->field_count(); ++i) {
    EXPECT_TRUE(keys.contains(fields->field(i)->name()))
        << "TrainingSettings." << fields->field(i)->name() << " is not set in this test";
  }
}

TEST(SweepExpanderTest, DiagnoseConfigAddsCheckpointKindsAndSettings) {
  DiagnoseSettings settings;
  settings.kinds = {"angular", "deff"};
  std::string config = DiagnoseConfigJson(R"({"arch":"hc","layers":2})", "s/7", settings);
  auto j = nlohmann::json::parse(config);
  EXPECT_EQ(j["checkpoint"], "s/7");
  EXPECT_EQ(j["kinds"], nlohmann::json({"angular", "deff"}));
  EXPECT_EQ(j["arch"], "hc");
  EXPECT_EQ(j["layers"], 2);
  // Defaults: automatic N, per-token causal score.
  EXPECT_FALSE(j.contains("num_sequences"));  // auto: the trainer's default
  EXPECT_EQ(j["allow_small_n"], false);
  EXPECT_EQ(j["causal_form"], "per_token");

  // The spec's settings reach the diagnose config under the trainer's keys.
  SweepSpec spec = depthbench::testing::SmallSpec("diag", {"pre_ln"}, {1e-3, 2e-3});
  auto* d = spec.mutable_diagnostics();
  d->add_kinds("deff");
  d->set_num_sequences(8);
  d->set_allow_small_n(true);
  d->set_causal_form("ratio_of_means");
  d->set_fixed_lr(2e-3);
  auto expanded = ExpandSweep(spec);
  ASSERT_TRUE(expanded.ok()) << expanded.status();
  EXPECT_EQ(expanded->diagnose.fixed_lr, 2e-3);
  auto k = nlohmann::json::parse(DiagnoseConfigJson(expanded->jobs[0].config_json, "s/1",
                                                    expanded->diagnose));
  EXPECT_EQ(k["num_sequences"], 8);
  EXPECT_EQ(k["allow_small_n"], true);
  EXPECT_EQ(k["causal_form"], "ratio_of_means");
  EXPECT_EQ(k["kinds"], nlohmann::json({"deff"}));
  EXPECT_FALSE(k.contains("fixed_lr"));  // a scheduling choice, not the trainer's
}

// Spec section 5: the token budget is 20 tokens per Pre-LN parameter of the
// shape for every design; mhc's and moda's extra parameters buy no tokens.
// Every job config carries the budget; every design at a shape resolves to
// the same steps.
TEST(SweepExpanderTest, SameShapeSameTokenBudgetForEveryDesign) {
  SweepSpec spec;
  spec.set_name("budget");
  for (const char* arch : {"pre_ln", "mhc", "moda"}) spec.add_architectures(arch);
  spec.mutable_shapes()->set_suite("tiny");
  spec.mutable_training()->set_seq_len(64);
  spec.mutable_training()->set_batch(8);
  auto expanded = ExpandSweep(spec);
  ASSERT_TRUE(expanded.ok()) << expanded.status();
  std::map<int64_t, std::set<int64_t>> steps_by_layers, budget_by_layers;
  for (const PlannedJob& job : expanded->jobs) {
    auto config = TrainConfigFromJson(nlohmann::json::parse(job.config_json));
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ(nlohmann::json::parse(job.config_json)["budget_params"], TotalParams(job.shape));
    const int64_t want = (20 * TotalParams(job.shape) + 8 * 64 - 1) / (8 * 64);
    EXPECT_EQ(ResolveTotalSteps(*config), want) << job.arch << " L=" << job.shape.layers;
    steps_by_layers[job.shape.layers].insert(ResolveTotalSteps(*config));
  }
  ASSERT_EQ(steps_by_layers.size(), 3u);
  for (const auto& [layers, steps] : steps_by_layers) {
    EXPECT_EQ(steps.size(), 1u) << "L=" << layers << ": designs train different lengths";
  }
  for (const PlannedGroup& g : expanded->groups) {
    EXPECT_EQ(g.budget_params, TotalParams(g.shape));
    EXPECT_EQ(g.budget_tokens, 20 * TotalParams(g.shape));
    EXPECT_EQ(g.budget_steps, *steps_by_layers[g.shape.layers].begin());
    if (g.arch != "pre_ln") {
      EXPECT_GT(g.params, g.budget_params) << g.arch;
    }
  }
}

struct BadSpecCase {
  std::string label;
  std::function<void(SweepSpec*)> mutate;
  std::string error;  // exact message prefix
};

class SpecValidationTest : public ::testing::TestWithParam<BadSpecCase> {};

TEST_P(SpecValidationTest, NamesTheField) {
  SweepSpec spec = depthbench::testing::SmallSpec("ok", {"pre_ln", "hc"}, {1e-3});
  ASSERT_TRUE(ExpandSweep(spec).ok());
  GetParam().mutate(&spec);
  auto result = ExpandSweep(spec);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(result.status().message()).substr(0, GetParam().error.size()),
            GetParam().error)
      << result.status().message();
}

INSTANTIATE_TEST_SUITE_P(
    Cases, SpecValidationTest,
    ::testing::Values(
        BadSpecCase{"unknown_arch",
                    [](SweepSpec* s) { s->add_architectures("hcc"); },
                    "spec.architectures[2]: unknown architecture \"hcc\""},
        BadSpecCase{"duplicate_arch",
                    [](SweepSpec* s) { s->add_architectures("hc"); },
                    "spec.architectures[2]: duplicate architecture \"hc\""},
        BadSpecCase{"no_archs", [](SweepSpec* s) { s->clear_architectures(); s->clear_lr_grids(); },
                    "spec.architectures: at least one"},
        BadSpecCase{"bad_name", [](SweepSpec* s) { s->set_name("a/b"); }, "spec.name: must be"},
        BadSpecCase{"two_shape_sources",
                    [](SweepSpec* s) { s->mutable_shapes()->set_suite("tiny"); },
                    "spec.shapes: exactly one of"},
        BadSpecCase{"unknown_suite",
                    [](SweepSpec* s) {
                      s->mutable_shapes()->Clear();
                      s->mutable_shapes()->set_suite("huge");
                    },
                    "spec.shapes.suite: unknown suite \"huge\""},
        BadSpecCase{"explicit_bad_width",
                    [](SweepSpec* s) {
                      s->mutable_shapes()->mutable_explicit_shapes(0)->set_d_model(100);
                    },
                    "spec.shapes.explicit_shapes[0].heads: 16 must divide d_model 100"},
        BadSpecCase{"solver_no_layers",
                    [](SweepSpec* s) {
                      s->mutable_shapes()->Clear();
                      s->mutable_shapes()->mutable_solver()->set_ref_layers(4);
                      s->mutable_shapes()->mutable_solver()->set_ref_d_model(128);
                    },
                    "spec.shapes.solver.layers: at least one depth"},
        BadSpecCase{"lr_grid_unknown_arch",
                    [](SweepSpec* s) { (*s->mutable_lr_grids())["moda"].add_lrs(1e-3); },
                    "spec.lr_grids[\"moda\"]: architecture is not in spec.architectures"},
        BadSpecCase{"negative_lr",
                    [](SweepSpec* s) { (*s->mutable_lr_grids())["hc"].add_lrs(-1); },
                    "spec.lr_grids[\"hc\"].lrs[1]: must be a positive finite number"},
        BadSpecCase{"duplicate_seed",
                    [](SweepSpec* s) { s->add_seeds(3); s->add_seeds(3); },
                    "spec.seeds[1]: duplicate seed 3"},
        BadSpecCase{"zero_seq_len",
                    [](SweepSpec* s) { s->mutable_training()->set_seq_len(0); },
                    "spec.training.seq_len: must be positive, got 0"},
        BadSpecCase{"bad_hc_form",
                    [](SweepSpec* s) { s->mutable_training()->set_hc_form("mine"); },
                    "spec.training.hc_form: must be \"paper\" or \"code\""},
        BadSpecCase{"checkpoint_minutes",
                    [](SweepSpec* s) { s->mutable_training()->set_checkpoint_minutes(-5); },
                    "spec.training.checkpoint_minutes: must be >= 0, got -5"},
        BadSpecCase{"warmup",
                    [](SweepSpec* s) { s->mutable_training()->set_warmup_frac(1.5); },
                    "spec.training.warmup_frac: must be in [0, 1)"},
        // Refused by the trainer's own checks (TrainConfigFromJson), which
        // the spec's range checks let through: the trainer needs a positive
        // clipping norm.
        BadSpecCase{"grad_clip_zero",
                    [](SweepSpec* s) { s->mutable_training()->set_grad_clip(0); },
                    "spec.training.grad_clip: must be positive, got 0"},
        BadSpecCase{"max_attempts",
                    [](SweepSpec* s) { s->mutable_retry()->set_max_attempts(-1); },
                    "spec.retry.max_attempts: must be in 1..100"},
        BadSpecCase{"multiplier",
                    [](SweepSpec* s) { s->mutable_retry()->set_backoff_multiplier(0.5); },
                    "spec.retry.backoff_multiplier: must be >= 1"},
        BadSpecCase{"diag_kind",
                    [](SweepSpec* s) { s->mutable_diagnostics()->add_kinds("Bad Kind"); },
                    "spec.diagnostics.kinds[0]: must be a lowercase identifier"},
        BadSpecCase{"diag_small_n",
                    [](SweepSpec* s) {
                      s->mutable_diagnostics()->add_kinds("deff");
                      s->mutable_diagnostics()->set_num_sequences(32);
                    },
                    "spec.diagnostics.num_sequences: 32 sequences is below d_model"},
        BadSpecCase{"diag_negative_n",
                    [](SweepSpec* s) { s->mutable_diagnostics()->set_num_sequences(-1); },
                    "spec.diagnostics.num_sequences: must be >= 0 (0 = auto), got -1"},
        BadSpecCase{"diag_causal_form",
                    [](SweepSpec* s) { s->mutable_diagnostics()->set_causal_form("median"); },
                    "spec.diagnostics.causal_form: must be \"per_token\" or \"ratio_of_means\", "
                    "got \"median\""},
        BadSpecCase{"diag_fixed_lr_not_in_grid",
                    [](SweepSpec* s) { s->mutable_diagnostics()->set_fixed_lr(2e-3); },
                    "spec.diagnostics.fixed_lr: 0.002 is not in the LR grid of pre_ln (0.001)"},
        BadSpecCase{"diag_fixed_lr_negative",
                    [](SweepSpec* s) { s->mutable_diagnostics()->set_fixed_lr(-1e-3); },
                    "spec.diagnostics.fixed_lr: must be 0"},
        BadSpecCase{"devices",
                    [](SweepSpec* s) { s->mutable_resources()->set_devices(-2); },
                    "spec.resources.devices: must be >= 0"}),
    [](const auto& info) { return info.param.label; });

}  // namespace
}  // namespace depthbench::scheduler
