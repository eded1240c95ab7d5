#include "trainer_core/diagnostics/run.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/run_protocol.h"
#include "common/status_macros.h"
#include "trainer_core/batcher.h"
#include "trainer_core/checkpoint.h"
#include "trainer_core/data.h"
#include "trainer_core/diagnostics/result_json.h"
#include "trainer_core/flops.h"

namespace depthbench {
namespace diagnostics {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

nlohmann::json NotApplicable(const std::string& reason) {
  return {{"applicable", false}, {"reason", reason}};
}

bool Wants(const std::set<std::string>& kinds, const char* kind) {
  return kinds.count(kind) > 0;
}

// Summed next-token cross-entropy (so micro-batches of any size average
// exactly).
double SumCrossEntropy(const torch::Tensor& logits, const torch::Tensor& targets) {
  namespace F = torch::nn::functional;
  return F::cross_entropy(logits.reshape({-1, logits.size(-1)}).to(torch::kFloat32),
                          targets.reshape({-1}),
                          F::CrossEntropyFuncOptions().reduction(torch::kSum))
      .item<double>();
}

// Drives the design step by step over the micro-batches; see run.h.
class Runner {
 public:
  Runner(LanguageModelImpl& model, const torch::Tensor& tokens, int64_t micro_batch,
         bool reuse_prefix)
      : model_(model),
        design_(model.design()),
        num_layers_(design_.num_blocks()),
        reuse_prefix_(reuse_prefix) {
    InputsTargets split = SplitInputsTargets(tokens);
    for (int64_t start = 0; start < tokens.size(0); start += micro_batch) {
      const int64_t n = std::min(micro_batch, tokens.size(0) - start);
      inputs_.push_back(split.inputs.narrow(0, start, n));
      targets_.push_back(split.targets.narrow(0, start, n));
    }
    num_tokens_ = split.targets.numel();
  }

  int64_t num_layers() const { return num_layers_; }
  int64_t num_micro_batches() const { return static_cast<int64_t>(inputs_.size()); }
  // ApplyBlock calls per micro-batch (every micro-batch runs the same schedule).
  int64_t layer_forwards() const { return block_calls_ / num_micro_batches(); }
  const std::vector<torch::Tensor>& base_states() const { return base_states_; }
  double base_loss() const { return base_loss_; }

  // The intact forward: states h_0..h_L (concatenated over micro-batches),
  // cached prefixes, base loss and (if asked) the logit-lens profile.
  absl::Status BasePass(bool logit_lens, std::vector<double>* kl) {
    const int64_t L = num_layers_;
    std::vector<std::vector<torch::Tensor>> reps(L + 1);
    double loss_sum = 0;
    if (logit_lens) kl->assign(L + 1, 0.0);
    for (size_t m = 0; m < inputs_.size(); ++m) {
      DepthState s = design_.Begin(model_.embed->forward(inputs_[m]));
      std::vector<DepthState> prefix;
      std::vector<torch::Tensor> lens;
      for (int64_t l = 0; l <= L; ++l) {
        if (l > 0) ApplyBlock(l - 1, l - 1, s);
        if (reuse_prefix_) prefix.push_back(s);
        reps[l].push_back(design_.Representation(s, l));
        if (logit_lens) lens.push_back(design_.LensHidden(s, l));
      }
      torch::Tensor logits = model_.Logits(design_.Finish(s));
      loss_sum += SumCrossEntropy(logits, targets_[m]);
      if (logit_lens) {
        const double weight =
            static_cast<double>(targets_[m].numel()) / static_cast<double>(num_tokens_);
        for (int64_t l = 0; l <= L; ++l) {
          torch::Tensor probe = model_.Logits(design_.final_norm->forward(lens[l]));
          ASSIGN_OR_RETURN(double v, LogitLensKl(logits, probe));
          (*kl)[l] += weight * v;
        }
      }
      if (reuse_prefix_) prefixes_.push_back(std::move(prefix));
    }
    for (auto& r : reps) base_states_.push_back(torch::cat(r, 0));
    base_loss_ = loss_sum / static_cast<double>(num_tokens_);
    return absl::OkStatus();
  }

  // Block s replaced by the identity: hbar_0..hbar_L (if `states`) and the
  // loss of the same forward.
  absl::Status SkipPass(int64_t s, std::vector<torch::Tensor>* states, double* loss) {
    const int64_t L = num_layers_;
    std::vector<std::vector<torch::Tensor>> reps(L + 1);
    double loss_sum = 0;
    for (size_t m = 0; m < inputs_.size(); ++m) {
      DepthState st = Start(m, s, states ? &reps : nullptr);
      design_.SkipBlock(s, st);
      if (states) reps[s + 1].push_back(design_.Representation(st, s + 1));
      for (int64_t p = s + 1; p < L; ++p) {
        ApplyBlock(p, p, st);
        if (states) reps[p + 1].push_back(design_.Representation(st, p + 1));
      }
      loss_sum += SumCrossEntropy(model_.Logits(design_.Finish(st)), targets_[m]);
    }
    if (states) {
      states->clear();
      for (int64_t l = 0; l <= L; ++l) {
        // With prefix reuse the states up to s are the base ones.
        states->push_back(reps[l].empty() ? base_states_[l] : torch::cat(reps[l], 0));
      }
    }
    *loss = loss_sum / static_cast<double>(num_tokens_);
    return absl::OkStatus();
  }

  // Loss with the weights of blocks l1 < l2 exchanged.
  double SwapLoss(int64_t l1, int64_t l2) {
    double loss_sum = 0;
    for (size_t m = 0; m < inputs_.size(); ++m) {
      DepthState st = Start(m, l1, nullptr);
      for (int64_t p = l1; p < num_layers_; ++p) {
        ApplyBlock(p, p == l1 ? l2 : (p == l2 ? l1 : p), st);
      }
      loss_sum += SumCrossEntropy(model_.Logits(design_.Finish(st)), targets_[m]);
    }
    return loss_sum / static_cast<double>(num_tokens_);
  }

  // One intact forward of the first micro-batch with the design recording
  // its routing (HC/mHC maps, AttnRes mixing weights).
  void RecordingPass(std::vector<torch::Tensor>* maps, std::vector<MixingRecord>* mixing) {
    design_.set_record_diagnostics(true);
    DepthState s = design_.Begin(model_.embed->forward(inputs_[0]));
    for (int64_t l = 0; l < num_layers_; ++l) design_.ApplyBlock(l, l, s);
    model_.Logits(design_.Finish(s));
    design_.set_record_diagnostics(false);
    *maps = design_.ResidualMaps();
    *mixing = design_.MixingWeights();
  }

  int64_t block_calls() const { return block_calls_; }

 private:
  void ApplyBlock(int64_t position, int64_t weights, DepthState& s) {
    design_.ApplyBlock(position, weights, s);
    ++block_calls_;
  }

  // The state before position `from` of micro-batch m: the cached snapshot,
  // or (naive form) a fresh forward from the embedding, whose states are
  // appended to `reps` when given.
  DepthState Start(size_t m, int64_t from, std::vector<std::vector<torch::Tensor>>* reps) {
    if (reuse_prefix_) return prefixes_[m][from];
    DepthState s = design_.Begin(model_.embed->forward(inputs_[m]));
    if (reps) (*reps)[0].push_back(design_.Representation(s, 0));
    for (int64_t p = 0; p < from; ++p) {
      ApplyBlock(p, p, s);
      if (reps) (*reps)[p + 1].push_back(design_.Representation(s, p + 1));
    }
    return s;
  }

  LanguageModelImpl& model_;
  DesignImpl& design_;
  int64_t num_layers_;
  bool reuse_prefix_;
  std::vector<torch::Tensor> inputs_, targets_;
  int64_t num_tokens_ = 0;
  std::vector<std::vector<DepthState>> prefixes_;  // [micro-batch][l]
  std::vector<torch::Tensor> base_states_;         // h_0..h_L
  double base_loss_ = 0;
  int64_t block_calls_ = 0;
};

nlohmann::json DeffJson(const EffectiveDepthResult& r, int64_t sequences) {
  nlohmann::json out = EffectiveDepthJson(r);
  out["layers"] = r.num_layers;
  out["sequences"] = sequences;
  out["num_sequences"] = sequences;
  return out;
}

absl::Status ValidateRunInputs(const std::set<std::string>& kinds, const torch::Tensor& tokens,
                               const RunOptions& options) {
  if (options.micro_batch < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("micro_batch: must be >= 1, got ", options.micro_batch));
  }
  if (!tokens.defined() || tokens.dim() != 2 || tokens.size(0) < 1 || tokens.size(1) < 2 ||
      tokens.scalar_type() != torch::kInt64) {
    return absl::InvalidArgumentError("tokens: need an int64 [N, T+1] tensor, N >= 1, T >= 1");
  }
  if (Wants(kinds, "deff") && tokens.size(0) < 2) {
    return absl::InvalidArgumentError("deff: needs at least 2 sequences");
  }
  return absl::OkStatus();
}

// The skip passes: one per block, feeding both the causal rows and the
// pruning losses.
absl::Status RunSkipPasses(Runner& runner, bool want_causal, CausalForm form,
                           RunReport& report) {
  const int64_t L = runner.num_layers();
  const std::vector<torch::Tensor>& h = report.states;
  const auto start = Clock::now();
  const int64_t before = runner.layer_forwards();
  report.causal.assign(L, std::vector<double>(L, std::nan("")));
  report.pruning_loss.assign(L, 0.0);
  for (int64_t s = 0; s < L; ++s) {
    // Skipping the last block changes no later block: its causal row is
    // undefined, but its pruning loss is still measured.
    const bool rows = want_causal && s + 1 < L;
    std::vector<torch::Tensor> skipped;
    RETURN_IF_ERROR(runner.SkipPass(s, rows ? &skipped : nullptr, &report.pruning_loss[s]));
    if (rows) {
      ASSIGN_OR_RETURN(report.causal[s], CausalScoreRow(h, skipped, s, form));
    }
  }
  report.skip_layer_forwards = runner.layer_forwards() - before;
  report.skip_seconds = SecondsSince(start);
  if (!want_causal) report.causal.clear();
  return absl::OkStatus();
}

absl::Status RunPermutationPasses(Runner& runner, RunReport& report) {
  const auto start = Clock::now();
  const int64_t before = runner.layer_forwards();
  ASSIGN_OR_RETURN(report.permutation,
                   PermutationScoreMatrix(runner.num_layers(), report.base_loss,
                                          [&runner](int64_t l1, int64_t l2) -> absl::StatusOr<double> {
                                            return runner.SwapLoss(l1, l2);
                                          }));
  report.permutation_layer_forwards = runner.layer_forwards() - before;
  report.permutation_seconds = SecondsSince(start);
  return absl::OkStatus();
}

nlohmann::json CostJson(LanguageModelImpl& model, int64_t T, int64_t layer_forwards,
                        double seconds) {
  const DesignOptions& d = model.options().design;
  const FlopsBreakdown f = ForwardFlops(model.options().arch, d.shape, T, d.hc_streams);
  const int64_t total = model.ParameterCount();
  const int64_t pre_ln = TotalParams(d.shape);
  return {{"params", {{"total", total}, {"pre_ln_total", pre_ln}, {"extra", total - pre_ln}}},
          {"seq_len", T},
          {"flops",
           {{"body", f.body},
            {"design", f.design},
            {"head_all_positions", f.head_all_positions},
            {"total_all_positions", f.total_all_positions},
            {"per_token", f.total_all_positions / static_cast<double>(T)}}},
          {"kv_cache_bytes", f.kv_cache_bytes},
          {"diagnostic_layer_forwards", layer_forwards},
          {"diagnostic_seconds", seconds}};
}

// What the kinds' result documents are built from, besides the report.
struct KindInputs {
  LanguageModelImpl& model;
  const Runner& runner;
  const RunOptions& options;
  int64_t num_sequences;
  int64_t T;
  Clock::time_point all_start;
  std::vector<torch::Tensor> maps;
  std::vector<MixingRecord> mixing;
};

absl::StatusOr<nlohmann::json> KindJson(const std::string& kind, const RunReport& report,
                                        const KindInputs& in) {
  const int64_t L = report.num_layers;
  if (kind == "angular") {
    return nlohmann::json{{"matrix", MatrixJson(report.angular)},
                          {"layers", L},
                          {"tokens", in.num_sequences * in.T}};
  }
  if (kind == "causal") {
    ASSIGN_OR_RETURN(double r, RCausal(report.causal, L));
    return nlohmann::json{{"matrix", MatrixJson(report.causal)},
                          {"form", CausalFormName(in.options.causal_form)},
                          {"r_causal", Num(r)},
                          {"threshold", kCausalThreshold},
                          {"late_start", LateStart(L)},
                          {"layer_forwards", report.skip_layer_forwards},
                          {"naive_layer_forwards", NaiveSkipLayerForwards(L)},
                          {"seconds", report.skip_seconds}};
  }
  if (kind == "permutation") {
    ASSIGN_OR_RETURN(double r, RPerm(report.permutation, L));
    return nlohmann::json{{"matrix", MatrixJson(report.permutation)},
                          {"r_perm", Num(r)},
                          {"threshold", kPermThreshold},
                          {"late_start", LateStart(L)},
                          {"base_loss", Num(report.base_loss)},
                          {"layer_forwards", report.permutation_layer_forwards},
                          {"naive_layer_forwards", NaivePermutationLayerForwards(L)},
                          {"seconds", report.permutation_seconds}};
  }
  if (kind == "logit_lens") return nlohmann::json{{"kl", VectorJson(report.logit_lens_kl)}};
  if (kind == "pruning") {
    std::vector<double> delta;
    for (double v : report.pruning_loss) delta.push_back(v - report.base_loss);
    return nlohmann::json{{"base_loss", Num(report.base_loss)},
                          {"loss", VectorJson(report.pruning_loss)},
                          {"delta", VectorJson(delta)}};
  }
  if (kind == "deff") {
    std::vector<torch::Tensor> outputs(report.states.begin() + 1, report.states.end());
    ASSIGN_OR_RETURN(EffectiveDepthResult r, EffectiveDepth(outputs));
    return DeffJson(r, in.num_sequences);
  }
  if (kind == "transport") return TransportSummary(in.maps);
  if (kind == "block_alpha") return BlockAlphaSummary(in.mixing);
  if (kind == "cost") {
    return CostJson(in.model, in.T, in.runner.layer_forwards(), SecondsSince(in.all_start));
  }
  return absl::InternalError(absl::StrCat("diagnostics: no result builder for kind ", kind));
}

absl::StatusOr<RunReport> RunDiagnosticsImpl(LanguageModelImpl& model,
                                             const torch::Tensor& tokens,
                                             const RunOptions& options) {
  const std::vector<std::string>& requested =
      options.kinds.empty() ? AllKinds() : options.kinds;
  RETURN_IF_ERROR(ValidateKinds(requested));
  const std::set<std::string> kinds(requested.begin(), requested.end());
  RETURN_IF_ERROR(ValidateRunInputs(kinds, tokens, options));
  torch::NoGradGuard no_grad;
  model.eval();
  Runner runner(model, tokens, options.micro_batch, options.reuse_prefix);
  RunReport report;
  report.num_layers = runner.num_layers();
  KindInputs in{model, runner, options, tokens.size(0), tokens.size(1) - 1, Clock::now(), {}, {}};

  const auto start = Clock::now();
  RETURN_IF_ERROR(runner.BasePass(Wants(kinds, "logit_lens"), &report.logit_lens_kl));
  report.base_loss = runner.base_loss();
  report.base_layer_forwards = runner.layer_forwards();
  report.base_seconds = SecondsSince(start);
  report.states = runner.base_states();

  if (Wants(kinds, "angular")) {
    ASSIGN_OR_RETURN(report.angular, AngularDistanceMatrix(report.states));
  }
  if (Wants(kinds, "causal") || Wants(kinds, "pruning")) {
    RETURN_IF_ERROR(RunSkipPasses(runner, Wants(kinds, "causal"), options.causal_form, report));
  }
  if (Wants(kinds, "permutation")) RETURN_IF_ERROR(RunPermutationPasses(runner, report));
  if (Wants(kinds, "transport") || Wants(kinds, "block_alpha")) {
    runner.RecordingPass(&in.maps, &in.mixing);
  }

  // Results in AllKinds() order.
  for (const std::string& kind : AllKinds()) {
    if (!kinds.count(kind)) continue;
    ASSIGN_OR_RETURN(nlohmann::json data, KindJson(kind, report, in));
    report.results.push_back({kind, std::move(data)});
  }
  return report;
}

}  // namespace

const std::vector<std::string>& AllKinds() {
  static const auto* kinds = new std::vector<std::string>{
      "angular", "causal", "permutation", "logit_lens", "pruning",
      "deff",    "transport", "block_alpha", "cost"};
  return *kinds;
}

absl::Status ValidateKinds(const std::vector<std::string>& kinds) {
  std::set<std::string> seen;
  const std::set<std::string> known(AllKinds().begin(), AllKinds().end());
  for (size_t i = 0; i < kinds.size(); ++i) {
    if (!known.count(kinds[i])) {
      std::string all;
      for (const auto& k : AllKinds()) absl::StrAppend(&all, all.empty() ? "" : " ", k);
      return absl::InvalidArgumentError(
          absl::StrCat("kinds[", i, "]: unknown kind \"", kinds[i], "\" (known: ", all, ")"));
    }
    if (!seen.insert(kinds[i]).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("kinds[", i, "]: duplicate kind \"", kinds[i], "\""));
    }
  }
  return absl::OkStatus();
}

int64_t NaiveSkipLayerForwards(int64_t L) { return L * (L - 1); }
int64_t ReusedSkipLayerForwards(int64_t L) { return L * (L - 1) / 2; }
int64_t NaivePermutationLayerForwards(int64_t L) { return L * (L * (L - 1) / 2); }
int64_t ReusedPermutationLayerForwards(int64_t L) {
  int64_t n = 0;
  for (int64_t l1 = 0; l1 < L; ++l1) n += (L - 1 - l1) * (L - l1);
  return n;
}

absl::StatusOr<RunReport> RunDiagnostics(LanguageModelImpl& model,
                                         const torch::Tensor& tokens,
                                         const RunOptions& options) {
  try {
    return RunDiagnosticsImpl(model, tokens, options);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("diagnostics: ", e.what_without_backtrace()));
  }
}

absl::StatusOr<nlohmann::json> TransportSummary(const std::vector<torch::Tensor>& maps) {
  if (maps.empty()) {
    return NotApplicable("the design records no residual maps (hc and mhc only)");
  }
  const int64_t n = maps[0].size(-1);
  std::vector<torch::Tensor> flat;
  for (const auto& m : maps) flat.push_back(m.reshape({-1, m.size(-2), m.size(-1)}));
  ASSIGN_OR_RETURN(std::vector<double> ranks, ComposedEffectiveRanks(flat));
  return nlohmann::json{{"applicable", true},
                        {"streams", n},
                        {"sub_layers", static_cast<int64_t>(maps.size())},
                        {"effective_rank", VectorJson(ranks)},
                        {"final_effective_rank", Num(ranks.back())}};
}

absl::StatusOr<nlohmann::json> BlockAlphaSummary(const std::vector<MixingRecord>& records) {
  std::vector<torch::Tensor> weights;
  std::vector<int64_t> index;
  nlohmann::json sites = nlohmann::json::array();
  for (const MixingRecord& r : records) {
    if (!r.has_running_sum) continue;
    weights.push_back(r.weights);
    index.push_back(-1);  // the running sum is the last source
    sites.push_back(r.site);
  }
  if (weights.empty()) {
    return NotApplicable("no mixing site has a running sum (attnres_block only)");
  }
  ASSIGN_OR_RETURN(std::vector<double> shares, RunningSumShares(weights, index));
  double mean = 0;
  for (double s : shares) mean += s;
  mean /= static_cast<double>(shares.size());
  return nlohmann::json{{"applicable", true},
                        {"sites", std::move(sites)},
                        {"share", VectorJson(shares)},
                        {"mean_share", Num(mean)}};
}

// ---------------------------------------------------------- diagnose jobs --

absl::StatusOr<DiagnoseConfig> DiagnoseConfigFromJson(const nlohmann::json& j) {
  if (!j.is_object()) return absl::InvalidArgumentError("config: expected a JSON object");
  DiagnoseConfig c;
  auto str = [&](const char* key, std::string* out) -> absl::Status {
    if (!j.contains(key)) return absl::OkStatus();
    if (!j[key].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat("config.", key, ": expected a string"));
    }
    *out = j[key].get<std::string>();
    return absl::OkStatus();
  };
  auto integer = [&](const char* key, int64_t min, int64_t* out) -> absl::Status {
    if (!j.contains(key)) return absl::OkStatus();
    if (!j[key].is_number_integer()) {
      return absl::InvalidArgumentError(absl::StrCat("config.", key, ": expected an integer"));
    }
    *out = j[key].get<int64_t>();
    if (*out < min) {
      return absl::InvalidArgumentError(
          absl::StrCat("config.", key, ": must be >= ", min, ", got ", *out));
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(str("checkpoint", &c.checkpoint));
  if (c.checkpoint.empty()) {
    return absl::InvalidArgumentError("config.checkpoint: required (run directory or checkpoint file)");
  }
  RETURN_IF_ERROR(str("data", &c.data));
  RETURN_IF_ERROR(str("data_dir", &c.data_dir));
  RETURN_IF_ERROR(integer("num_sequences", 0, &c.num_sequences));
  if (j.contains("allow_small_n")) {
    if (!j["allow_small_n"].is_boolean()) {
      return absl::InvalidArgumentError("config.allow_small_n: expected a boolean");
    }
    c.allow_small_n = j["allow_small_n"].get<bool>();
  }
  if (j.contains("causal_form")) {
    if (!j["causal_form"].is_string()) {
      return absl::InvalidArgumentError(
          "config.causal_form: expected a string (per_token or ratio_of_means)");
    }
    auto form = ParseCausalForm(j["causal_form"].get<std::string>());
    if (!form.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("config.causal_form: ", form.status().message()));
    }
    c.causal_form = *form;
  }
  RETURN_IF_ERROR(integer("seq_len", 0, &c.seq_len));
  RETURN_IF_ERROR(integer("threads", 0, &c.threads));
  RETURN_IF_ERROR(integer("micro_batch", 1, &c.micro_batch));
  if (j.contains("kinds")) {
    if (!j["kinds"].is_array()) {
      return absl::InvalidArgumentError("config.kinds: expected a list of strings");
    }
    for (size_t i = 0; i < j["kinds"].size(); ++i) {
      if (!j["kinds"][i].is_string()) {
        return absl::InvalidArgumentError(absl::StrCat("config.kinds[", i, "]: expected a string"));
      }
      c.kinds.push_back(j["kinds"][i].get<std::string>());
    }
    absl::Status st = ValidateKinds(c.kinds);
    if (!st.ok()) return absl::InvalidArgumentError(absl::StrCat("config.", st.message()));
  }
  return c;
}

int64_t DefaultNumSequences(int64_t d_model) {
  return std::max(kMinAutoSequences, 4 * d_model);
}

absl::StatusOr<int64_t> ResolveNumSequences(const DiagnoseConfig& config, int64_t d_model) {
  if (config.num_sequences < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.num_sequences: must be >= 0 (0 = auto), got ", config.num_sequences));
  }
  if (config.num_sequences == 0) return DefaultNumSequences(d_model);
  if (config.num_sequences < d_model && !config.allow_small_n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.num_sequences: ", config.num_sequences, " is below d_model (", d_model,
        "): pooled-state CKA (deff) is biased towards 1 when N is small against d; use "
        "0 (auto = max(", kMinAutoSequences, ", 4 * d_model) = ", DefaultNumSequences(d_model),
        ") or set allow_small_n: true to override"));
  }
  return config.num_sequences;
}

absl::StatusOr<nlohmann::json> RunDiagnoseJob(const DiagnoseConfig& config,
                                              const std::string& out_dir,
                                              const DiagnosticsSink& sink) {
  if (config.threads > 0) at::set_num_threads(static_cast<int>(config.threads));
  ASSIGN_OR_RETURN(LoadedModel loaded, LoadModelCheckpoint(config.checkpoint));
  const TrainConfig& train = loaded.config;
  ASSIGN_OR_RETURN(const int64_t num_sequences,
                   ResolveNumSequences(config, train.shape.d_model));
  DataOptions data_options;
  data_options.data = config.data.empty() ? train.data : config.data;
  data_options.vocab = train.shape.vocab;
  data_options.brown_dir = config.data_dir;
  ASSIGN_OR_RETURN(TokenDataset dataset, LoadDataset(data_options));
  const int64_t seq_len = config.seq_len > 0 ? config.seq_len : train.seq_len;
  ASSIGN_OR_RETURN(std::vector<Batch> batches,
                   MakeValidationBatches(dataset.val, seq_len, num_sequences, 1));
  torch::Tensor tokens = BatchToTensor(batches[0]);

  RunOptions options;
  options.kinds = config.kinds;
  options.micro_batch = config.micro_batch;
  options.causal_form = config.causal_form;
  ASSIGN_OR_RETURN(RunReport report, RunDiagnostics(*loaded.model, tokens, options));

  nlohmann::json doc;
  doc["schema"] = "depthbench.diagnostics.v1";
  doc["checkpoint"] = config.checkpoint;
  doc["arch"] = std::string(ArchName(train.arch));
  doc["layers"] = train.shape.layers;
  doc["d_model"] = train.shape.d_model;
  doc["step"] = loaded.meta.step;
  doc["data"] = data_options.data;
  doc["num_sequences"] = num_sequences;
  doc["causal_form"] = CausalFormName(config.causal_form);
  doc["seq_len"] = seq_len;
  doc["kinds"] = nlohmann::json::object();
  for (const KindResult& r : report.results) {
    if (sink) sink(run_protocol::DiagnosticsEvent(r.kind, r.data));
    doc["kinds"][r.kind] = r.data;
  }
  if (!out_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(out_dir, ec);
    if (ec) {
      return absl::InternalError(absl::StrCat("--out: cannot create ", out_dir, ": ", ec.message()));
    }
    const std::string path = (std::filesystem::path(out_dir) / "diagnostics.json").string();
    const std::string tmp = path + ".tmp";
    {
      std::ofstream out(tmp);
      out << doc.dump(1) << "\n";
      if (!out) return absl::InternalError(absl::StrCat("cannot write ", tmp));
    }
    std::filesystem::rename(tmp, path, ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot rename ", tmp, ": ", ec.message()));
  }
  return doc;
}

}  // namespace diagnostics
}  // namespace depthbench
