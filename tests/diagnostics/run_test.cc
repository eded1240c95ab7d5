// The model side of the diagnostics (trainer_core/diagnostics/run.h) on a tiny
// random Pre-LN model (L=4, d=32, 4 heads, vocab 256) with known answers: a
// zeroed block, two identical blocks, prefix reuse vs a naive reference built
// on LanguageModel::Forward(ForwardControl), and a checkpoint round trip
// through the Trainer and `depthbench-train diagnose`.
#include "trainer_core/diagnostics/run.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include <sys/wait.h>
#include <unistd.h>

#include "trainer_core/batcher.h"
#include "trainer_core/model/model.h"
#include "trainer_core/train_config.h"
#include "trainer_core/trainer.h"

namespace depthbench::diagnostics {
namespace {

constexpr int64_t kLayers = 4;
constexpr int64_t kSeq = 8;
constexpr int64_t kT = 16;

LanguageModel TinyModel(uint64_t seed = 1) {
  torch::manual_seed(seed);
  ModelOptions options;
  options.arch = Arch::kPreLn;
  options.design.shape = MakeShape(kLayers, 32, 256, FfnRule::kSwiGlu83, 4, 4);
  options.design.max_seq_len = 64;
  auto model = BuildModel(options);
  EXPECT_TRUE(model.ok()) << model.status();
  return *model;
}

torch::Tensor Tokens(int64_t n = kSeq, int64_t t = kT) {
  torch::manual_seed(7);
  return torch::randint(0, 256, {n, t + 1}, torch::kInt64);
}

torch::Tensor Param(LanguageModel& model, const std::string& name) {
  for (auto& p : model->named_parameters()) {
    if (p.key() == name) return p.value();
  }
  ADD_FAILURE() << "no parameter " << name;
  return torch::Tensor();
}

void ZeroBlockOutputs(LanguageModel& model, int64_t block) {
  torch::NoGradGuard no_grad;
  const std::string b = "design.block_" + std::to_string(block);
  Param(model, b + ".attn.o_proj.weight").zero_();
  Param(model, b + ".ffn.down_proj.weight").zero_();
}

double MeanLoss(LanguageModel& model, const torch::Tensor& tokens, const ForwardControl& c) {
  InputsTargets it = SplitInputsTargets(tokens);
  return LanguageModelImpl::CrossEntropy(model->Forward(it.inputs, c), it.targets).item<double>();
}

// hbar_0..hbar_L with block s skipped: a full forward from the embedding.
std::vector<torch::Tensor> NaiveSkippedStates(LanguageModel& model, const torch::Tensor& inputs,
                                              int64_t s) {
  DesignImpl& d = model->design();
  DepthState st = d.Begin(model->embed->forward(inputs));
  std::vector<torch::Tensor> out = {d.Representation(st, 0)};
  for (int64_t p = 0; p < d.num_blocks(); ++p) {
    if (p == s) {
      d.SkipBlock(p, st);
    } else {
      d.ApplyBlock(p, p, st);
    }
    out.push_back(d.Representation(st, p + 1));
  }
  return out;
}

bool SameOrBothNan(double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

TEST(RunDiagnosticsTest, StatesAndShapes) {
  LanguageModel model = TinyModel();
  auto report = RunDiagnostics(*model, Tokens(), RunOptions{});
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->states.size(), static_cast<size_t>(kLayers + 1));
  for (const auto& h : report->states) EXPECT_EQ(h.sizes(), (std::vector<int64_t>{kSeq, kT, 32}));
  EXPECT_EQ(report->angular.size(), static_cast<size_t>(kLayers + 1));
  EXPECT_EQ(report->causal.size(), static_cast<size_t>(kLayers));
  EXPECT_EQ(report->permutation.size(), static_cast<size_t>(kLayers));
  EXPECT_EQ(report->logit_lens_kl.size(), static_cast<size_t>(kLayers + 1));
  EXPECT_EQ(report->pruning_loss.size(), static_cast<size_t>(kLayers));
  // The last probe is the model's own output distribution.
  EXPECT_NEAR(report->logit_lens_kl.back(), 0.0, 1e-5);
  EXPECT_GT(report->logit_lens_kl.front(), 1e-3);
  std::vector<std::string> kinds;
  for (const auto& r : report->results) kinds.push_back(r.kind);
  EXPECT_EQ(kinds, AllKinds());
  // Pre-LN has no residual maps or mixing weights.
  for (const auto& r : report->results) {
    if (r.kind == "transport" || r.kind == "block_alpha") {
      EXPECT_FALSE(r.data["applicable"].get<bool>()) << r.kind;
    }
  }
}

TEST(RunDiagnosticsTest, ZeroedBlockHasZeroCausalRowAndUnchangedPruningLoss) {
  LanguageModel model = TinyModel();
  ZeroBlockOutputs(model, 1);
  RunOptions options;
  options.kinds = {"causal", "pruning"};
  options.micro_batch = 3;  // uneven micro-batches on purpose
  auto report = RunDiagnostics(*model, Tokens(), options);
  ASSERT_TRUE(report.ok()) << report.status();
  for (int64_t l = 2; l < kLayers; ++l) EXPECT_NEAR(report->causal[1][l], 0.0, 1e-6) << l;
  EXPECT_DOUBLE_EQ(report->pruning_loss[1], report->base_loss);
  // The other blocks do matter.
  EXPECT_EQ(report->causal[0][1], 0.0);  // block 1 adds nothing in either run
  EXPECT_GT(report->causal[0][2], 1e-3);
  EXPECT_NE(report->pruning_loss[0], report->base_loss);
}

TEST(RunDiagnosticsTest, IdenticalBlocksHaveZeroPermutationScore) {
  LanguageModel model = TinyModel();
  {
    torch::NoGradGuard no_grad;
    for (auto& p : model->named_parameters()) {
      const std::string prefix = "design.block_2.";
      if (p.key().rfind(prefix, 0) != 0) continue;
      std::string src = "design.block_1." + p.key().substr(prefix.size());
      p.value().copy_(Param(model, src));
    }
  }
  RunOptions options;
  options.kinds = {"permutation"};
  auto report = RunDiagnostics(*model, Tokens(), options);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->permutation[1][2], 0.0);
  EXPECT_GT(report->permutation[0][3], 1e-4);
  EXPECT_TRUE(std::isnan(report->permutation[2][1]));
}

TEST(RunDiagnosticsTest, PrefixReuseMatchesNaiveWithFewerLayerForwards) {
  LanguageModel model = TinyModel(3);
  const torch::Tensor tokens = Tokens();
  RunOptions reuse;
  reuse.kinds = {"causal", "permutation", "pruning"};
  reuse.micro_batch = kSeq;
  RunOptions naive = reuse;
  naive.reuse_prefix = false;
  auto a = RunDiagnostics(*model, tokens, reuse);
  auto b = RunDiagnostics(*model, tokens, naive);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  for (int64_t i = 0; i < kLayers; ++i) {
    for (int64_t j = 0; j < kLayers; ++j) {
      EXPECT_TRUE(SameOrBothNan(a->causal[i][j], b->causal[i][j])) << i << "," << j;
      EXPECT_TRUE(SameOrBothNan(a->permutation[i][j], b->permutation[i][j])) << i << "," << j;
    }
    EXPECT_EQ(a->pruning_loss[i], b->pruning_loss[i]);
  }
  EXPECT_EQ(a->skip_layer_forwards, ReusedSkipLayerForwards(kLayers));
  EXPECT_EQ(b->skip_layer_forwards, NaiveSkipLayerForwards(kLayers));
  EXPECT_EQ(a->permutation_layer_forwards, ReusedPermutationLayerForwards(kLayers));
  EXPECT_EQ(b->permutation_layer_forwards, NaivePermutationLayerForwards(kLayers));
  EXPECT_LT(a->skip_layer_forwards, b->skip_layer_forwards);
  EXPECT_LT(a->permutation_layer_forwards, b->permutation_layer_forwards);

  // An independent reference: LanguageModel::Forward with ForwardControl for
  // losses, a from-scratch step-wise forward for the skipped states.
  torch::NoGradGuard no_grad;
  InputsTargets it = SplitInputsTargets(tokens);
  const double base = MeanLoss(model, tokens, ForwardControl{});
  EXPECT_NEAR(a->base_loss, base, 1e-5);
  for (int64_t s = 0; s < kLayers; ++s) {
    EXPECT_NEAR(a->pruning_loss[s], MeanLoss(model, tokens, ForwardControl{{}, {s}}), 1e-5);
    if (s + 1 < kLayers) {
      auto row = CausalScoreRow(a->states, NaiveSkippedStates(model, it.inputs, s), s);
      ASSERT_TRUE(row.ok());
      for (int64_t l = s + 1; l < kLayers; ++l) EXPECT_NEAR(a->causal[s][l], (*row)[l], 1e-5);
    }
  }
  for (int64_t l1 = 0; l1 < kLayers; ++l1) {
    for (int64_t l2 = l1 + 1; l2 < kLayers; ++l2) {
      std::vector<int64_t> order = {0, 1, 2, 3};
      std::swap(order[l1], order[l2]);
      const double swapped = MeanLoss(model, tokens, ForwardControl{order, {}});
      EXPECT_NEAR(a->permutation[l1][l2], std::fabs(swapped - base) / base, 1e-5);
    }
  }
}

TEST(RunDiagnosticsTest, RejectsBadKindsAndTokens) {
  LanguageModel model = TinyModel();
  RunOptions options;
  options.kinds = {"angular", "nope"};
  EXPECT_EQ(RunDiagnostics(*model, Tokens(), options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.kinds = {"deff"};
  EXPECT_EQ(RunDiagnostics(*model, Tokens(1), options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.kinds = {};
  EXPECT_EQ(RunDiagnostics(*model, Tokens().to(torch::kFloat32), options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SummaryTest, TransportOfIdentityAndRankOneMaps) {
  std::vector<torch::Tensor> maps(4, torch::eye(4).expand({2, 3, 4, 4}));
  auto s = TransportSummary(maps);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE((*s)["applicable"].get<bool>());
  ASSERT_EQ((*s)["effective_rank"].size(), 4u);
  for (const auto& r : (*s)["effective_rank"]) EXPECT_NEAR(r.get<double>(), 4.0, 1e-9);
  maps[2] = torch::ones({2, 3, 4, 4});  // rank one from here on
  s = TransportSummary(maps);
  ASSERT_TRUE(s.ok());
  EXPECT_NEAR((*s)["effective_rank"][1].get<double>(), 4.0, 1e-9);
  EXPECT_NEAR((*s)["effective_rank"][3].get<double>(), 1.0, 1e-6);
  auto none = TransportSummary({});
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE((*none)["applicable"].get<bool>());
}

TEST(SummaryTest, BlockAlphaSharesOnTheRunningSum) {
  MixingRecord a{1, torch::tensor({0.25, 0.75}).expand({2, 3, 2}), true};
  MixingRecord b{2, torch::tensor({0.5, 0.25, 0.25}).expand({2, 3, 3}), true};
  MixingRecord full{3, torch::tensor({0.5, 0.5}).expand({2, 3, 2}), false};
  auto s = BlockAlphaSummary({a, full, b});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)["sites"], nlohmann::json({1, 2}));
  EXPECT_NEAR((*s)["share"][0].get<double>(), 0.75, 1e-9);
  EXPECT_NEAR((*s)["share"][1].get<double>(), 0.25, 1e-9);
  EXPECT_NEAR((*s)["mean_share"].get<double>(), 0.5, 1e-9);
  auto none = BlockAlphaSummary({full});
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE((*none)["applicable"].get<bool>());
}

TEST(DiagnoseConfigTest, KeysAndErrors) {
  auto c = DiagnoseConfigFromJson({{"checkpoint", "/x"}, {"kinds", {"angular", "cost"}},
                                   {"num_sequences", 4}, {"lr", 0.001}, {"arch", "pre_ln"}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->kinds, (std::vector<std::string>{"angular", "cost"}));
  EXPECT_EQ(c->num_sequences, 4);
  EXPECT_EQ(DiagnoseConfigFromJson({{"kinds", {"angular"}}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto bad = DiagnoseConfigFromJson({{"checkpoint", "/x"}, {"kinds", {"angular", "foo"}}});
  EXPECT_NE(bad.status().message().find("config.kinds[1]"), std::string::npos) << bad.status();
  EXPECT_FALSE(DiagnoseConfigFromJson({{"checkpoint", "/x"}, {"num_sequences", -1}}).ok());
  // Defaults: auto N, no override, the per-token causal form.
  auto d = DiagnoseConfigFromJson({{"checkpoint", "/x"}});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->num_sequences, 0);
  EXPECT_FALSE(d->allow_small_n);
  EXPECT_EQ(d->causal_form, CausalForm::kPerToken);
  auto r = DiagnoseConfigFromJson({{"checkpoint", "/x"}, {"causal_form", "ratio_of_means"},
                                   {"allow_small_n", true}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->causal_form, CausalForm::kRatioOfMeans);
  EXPECT_TRUE(r->allow_small_n);
  auto form = DiagnoseConfigFromJson({{"checkpoint", "/x"}, {"causal_form", "mean"}});
  EXPECT_EQ(form.status().message().rfind("config.causal_form:", 0), 0u) << form.status();
  EXPECT_FALSE(DiagnoseConfigFromJson({{"checkpoint", "/x"}, {"allow_small_n", 1}}).ok());
}

// Sample size (issue 12): auto N = max(256, 4 d); an explicit N below d is
// refused naming the field unless allow_small_n says the user knows.
TEST(DiagnoseConfigTest, NumSequencesAutoAndSmallNRefused) {
  EXPECT_EQ(DefaultNumSequences(32), 256);
  EXPECT_EQ(DefaultNumSequences(96), 384);
  EXPECT_EQ(DefaultNumSequences(1024), 4096);
  DiagnoseConfig c;
  c.checkpoint = "/x";
  EXPECT_EQ(*ResolveNumSequences(c, 96), 384);
  c.num_sequences = 96;
  EXPECT_EQ(*ResolveNumSequences(c, 96), 96);
  c.num_sequences = 16;
  auto refused = ResolveNumSequences(c, 96);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string msg(refused.status().message());
  EXPECT_EQ(msg.rfind("config.num_sequences:", 0), 0u) << msg;
  EXPECT_NE(msg.find("below d_model"), std::string::npos) << msg;
  EXPECT_NE(msg.find("allow_small_n"), std::string::npos) << msg;
  c.allow_small_n = true;
  EXPECT_EQ(*ResolveNumSequences(c, 96), 16);
}

// Pooled-state CKA is biased towards 1 when N is small against d: for
// independent random states E[CKA] is about d / (N + d), 0.86 at N = 16,
// d = 96, so D_eff collapses towards 1; at N = 4 d (the default) it is about
// 0.2 and D_eff is far from 1.
TEST(DeffSampleSizeTest, SmallNIsBiasedAndTheDefaultIsNot) {
  constexpr int64_t d = 96, L = 6;
  auto deff_at = [&](int64_t n) {
    torch::manual_seed(n);
    std::vector<torch::Tensor> layers;
    for (int64_t l = 0; l < L; ++l) layers.push_back(torch::randn({n, 4, d}));
    auto r = EffectiveDepth(layers);
    EXPECT_TRUE(r.ok()) << r.status();
    return *r;
  };
  const EffectiveDepthResult small = deff_at(16);
  EXPECT_GT(small.rho_bar1, 0.8);
  EXPECT_LT(small.deff_over_l, 0.25);  // D_eff ~ 1.1 of 6: looks one layer deep
  DiagnoseConfig c;
  c.checkpoint = "/x";
  const int64_t n = *ResolveNumSequences(c, d);
  EXPECT_GE(n, 4 * d);
  const EffectiveDepthResult big = deff_at(n);
  EXPECT_LT(big.rho_bar1, 0.3);
  EXPECT_GT(big.deff_over_l, 0.4);
  EXPECT_GT(big.deff, 2.0 * small.deff);
}

// Trains a 5-step pre_ln model into dir/run; returns its config.
TrainConfig TrainTinyCheckpoint(const std::filesystem::path& dir) {
  auto config = TrainConfigFromJson({{"arch", "pre_ln"}, {"layers", 4}, {"d_model", 32},
                                     {"heads", 4}, {"lr", 0.003}, {"steps", 5},
                                     {"seq_len", 32}, {"batch", 4}, {"threads", 2},
                                     {"eval_batches", 1}});
  EXPECT_TRUE(config.ok()) << config.status();
  if (!config.ok()) return TrainConfig{};
  Trainer trainer(*config, TrainerOptions{(dir / "run").string(), false, ""},
                  [](const nlohmann::json&) {});
  auto run = trainer.Run();
  EXPECT_TRUE(run.ok()) << run.status();
  if (run.ok()) {
    EXPECT_EQ(run->status, RunStatus::kSucceeded);
  }
  return *config;
}

void WriteJsonFile(const std::filesystem::path& path, const nlohmann::json& j) {
  std::ofstream out(path);
  out << j.dump();
}

// `depthbench-train diagnose --config CONFIG --out OUT REDIRECTS`: the shell
// command line.
std::string DiagnoseCommand(const std::filesystem::path& config, const std::filesystem::path& out,
                            const std::string& redirects) {
  return std::string(DEPTHBENCH_TRAIN_BIN) + " diagnose --config " + config.string() +
         " --out " + out.string() + " " + redirects;
}

// The per-kind checks on one diagnostics event's data (4 layers).
void ExpectKindDataSane(const std::string& kind, const nlohmann::json& d) {
  if (kind == "causal") {
    ASSERT_TRUE(d["r_causal"].is_number());
    EXPECT_EQ(d["matrix"].size(), 4u);
    for (int s = 0; s < 3; ++s) {
      for (int l = s + 1; l < 4; ++l) EXPECT_TRUE(d["matrix"][s][l].is_number()) << s << l;
    }
    EXPECT_TRUE(d["matrix"][3][3].is_null());  // NaN -> null
  }
  if (kind == "permutation") {
    EXPECT_TRUE(d["r_perm"].is_number());
  }
  if (kind == "deff") {
    EXPECT_TRUE(d["deff_over_l"].is_number());
    EXPECT_GT(d["deff"].get<double>(), 0.0);
  }
  if (kind == "pruning") {
    for (const auto& v : d["loss"]) EXPECT_TRUE(v.is_number() && std::isfinite(v.get<double>()));
  }
  if (kind == "logit_lens") {
    EXPECT_EQ(d["kl"].size(), 5u);
    for (const auto& v : d["kl"]) EXPECT_TRUE(v.is_number());
  }
  if (kind == "cost") {
    EXPECT_GT(d["params"]["total"].get<int64_t>(), 0);
  }
}

// Every kind is reported once as a diagnostics event, all before a
// succeeded done event.
void ExpectEventsCoverEveryKind(const std::filesystem::path& path) {
  std::ifstream events(path);
  std::string line;
  std::set<std::string> kinds;
  bool done = false;
  while (std::getline(events, line)) {
    nlohmann::json e = nlohmann::json::parse(line);
    if (e["event"] == "done") {
      done = true;
      EXPECT_EQ(e["status"], "succeeded");
      continue;
    }
    ASSERT_EQ(e["event"], "diagnostics") << line;
    ASSERT_FALSE(done) << "diagnostics after done";
    kinds.insert(e["kind"].get<std::string>());
    ASSERT_NO_FATAL_FAILURE(ExpectKindDataSane(e["kind"].get<std::string>(), e["data"]));
  }
  EXPECT_TRUE(done);
  EXPECT_EQ(kinds, std::set<std::string>(AllKinds().begin(), AllKinds().end()));
}

void ExpectDiagnosticsDocument(const std::filesystem::path& path) {
  std::ifstream doc_in(path);
  nlohmann::json doc = nlohmann::json::parse(doc_in);
  EXPECT_EQ(doc["schema"], "depthbench.diagnostics.v1");
  EXPECT_EQ(doc["kinds"].size(), AllKinds().size());
  EXPECT_EQ(doc["step"], 5);
  EXPECT_EQ(doc["num_sequences"], 6);
  EXPECT_EQ(doc["causal_form"], "per_token");
  EXPECT_EQ(doc["kinds"]["causal"]["form"], "per_token");
  EXPECT_EQ(doc["kinds"]["deff"]["num_sequences"], 6);
}

// Trains 5 steps into a temp dir, then runs `depthbench-train diagnose` on
// the checkpoint: every kind is reported and finite where applicable.
TEST(DiagnoseJobTest, CheckpointRoundTrip) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("diag_run_test_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const TrainConfig config = TrainTinyCheckpoint(dir);
  ASSERT_FALSE(HasFailure()) << "training the checkpoint failed";

  // The scheduler's diagnose config: the train config plus checkpoint/kinds.
  nlohmann::json job = config.ToJson();
  job["checkpoint"] = (dir / "run").string();
  job["num_sequences"] = 6;
  job["allow_small_n"] = true;  // 6 < d_model = 32: a smoke test, not a measurement
  WriteJsonFile(dir / "job.json", job);
  const std::string cmd =
      DiagnoseCommand(dir / "job.json", dir / "diag", "> " + (dir / "events.jsonl").string());
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;

  ASSERT_NO_FATAL_FAILURE(ExpectEventsCoverEveryKind(dir / "events.jsonl"));
  ExpectDiagnosticsDocument(dir / "diag" / "diagnostics.json");

  // An explicit N below d_model without allow_small_n is a config error (2).
  job.erase("allow_small_n");
  WriteJsonFile(dir / "small.json", job);
  EXPECT_EQ(WEXITSTATUS(std::system(DiagnoseCommand(dir / "small.json", dir / "small",
                                                    ">/dev/null 2>" + (dir / "small.err").string())
                                        .c_str())),
            2);
  std::ifstream err_in(dir / "small.err");
  const std::string err((std::istreambuf_iterator<char>(err_in)), std::istreambuf_iterator<char>());
  EXPECT_NE(err.find("config.num_sequences:"), std::string::npos) << err;

  // Usage errors exit 2.
  EXPECT_EQ(WEXITSTATUS(std::system((std::string(DEPTHBENCH_TRAIN_BIN) +
                                     " diagnose --out /tmp 2>/dev/null").c_str())), 2);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace depthbench::diagnostics
