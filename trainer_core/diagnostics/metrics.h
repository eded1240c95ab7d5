// Layer diagnostics of spec section 7: pure functions on tensors.
//
// Everything here is model-independent: the caller (the diagnose job) runs the
// model, collects hidden states / logits / losses / mixing weights, and hands
// them over. Accumulation is in float64 wherever a sum over tokens or features
// is taken, so results do not depend on the input dtype beyond its rounding.
//
// Index conventions (used by every function and by the stored matrices):
//   * Blocks are 0-indexed: block b maps state h_b to h_{b+1}. A model with L
//     blocks has L+1 states h_0 .. h_L, h_0 being the embedding output (for
//     HC/mHC the n streams concatenated; for AttnRes the mixture a layer
//     consumes: whatever the caller decides is "the state").
//   * The paper's 1-indexed "layer l" is block l-1 here.
//   * Matrices are std::vector<std::vector<double>> (row-major, rows first);
//     entries outside the defined region are NaN (serialised as JSON null).
//
// Errors: shape/size mismatches and other bad input give InvalidArgument; no
// function throws (c10::Error is caught and converted at this boundary).
//
// Thread safety: all functions are pure and may be called concurrently; they
// use LibTorch's intra-op thread pool like any other op.
#ifndef DEPTHBENCH_TRAINER_CORE_DIAGNOSTICS_METRICS_H_
#define DEPTHBENCH_TRAINER_CORE_DIAGNOSTICS_METRICS_H_

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer_core/diagnostics/cka_kernel.h"

namespace depthbench {
namespace diagnostics {

using Matrix = std::vector<std::vector<double>>;

// ---------------------------------------------------------------- angular --

// Angular distance matrix of spec section 7.
// `states`: L+1 tensors h_0..h_L, each [..., d] with the same shape (all
// leading dims are tokens, e.g. [N_tokens, d] or [B, T, d]).
// Returns an (L+1) x (L+1) matrix M with
//   M[l][n] = mean over tokens of arccos(cos(h_l, h_{l+n})) / pi
// for 0 <= l <= L-1 and 1 <= n <= L-l; every other entry (column 0, row L,
// l+n > L) is NaN. Values lie in [0, 1]; identical states give 0, orthogonal
// states 0.5. A zero vector has cosine 0 with everything (distance 0.5).
absl::StatusOr<Matrix> AngularDistanceMatrix(
    const std::vector<torch::Tensor>& states);

// ----------------------------------------------------------------- causal --

// How per-token causal effects are aggregated (spec section 9):
//   kPerToken    (default; the authors' latest analysis code):
//                mean_tok( ||skipped_delta - base_delta|| /
//                          max(||base_delta||, 1e-8) )
//   kRatioOfMeans (the authors' older helper):
//                mean_tok ||skipped_delta - base_delta|| / mean_tok ||base_delta||
enum class CausalForm { kPerToken, kRatioOfMeans };
inline constexpr double kCausalDenominatorFloor = 1e-8;
// "per_token" / "ratio_of_means".
const char* CausalFormName(CausalForm form);
// InvalidArgument for any other name.
absl::StatusOr<CausalForm> ParseCausalForm(const std::string& name);

// The causal score for one later block, in `form`. The norm is the L2 norm
// over the last dim; means run over all leading dims. Deltas are [..., d]
// with equal shapes. Ratio of means: if the base deltas are all zero the
// score is +inf, or 0 when the skipped deltas are zero too (nothing changed).
// Per token: a token whose base delta is (near) zero is divided by 1e-8.
absl::StatusOr<double> CausalScore(const torch::Tensor& base_delta,
                                   const torch::Tensor& skipped_delta,
                                   CausalForm form = CausalForm::kPerToken);

// Row s of the causal matrix. `base_states` are h_0..h_L of the intact model,
// `skipped_states` hbar_0..hbar_L of the model with block s (0-indexed)
// replaced by the identity (so hbar_{s+1} = hbar_s). Returns a vector of
// length L with
//   row[l] = CausalScore(h_{l+1} - h_l, hbar_{l+1} - hbar_l, form)  for s < l < L,
// and NaN for l <= s. Requires 0 <= s < L.
absl::StatusOr<std::vector<double>> CausalScoreRow(
    const std::vector<torch::Tensor>& base_states,
    const std::vector<torch::Tensor>& skipped_states, int64_t s,
    CausalForm form = CausalForm::kPerToken);

// Produces hbar_0..hbar_L with block s skipped. A caller that reuses the
// cached prefix may return the base tensors for indices <= s.
using SkippedStatesFn =
    std::function<absl::StatusOr<std::vector<torch::Tensor>>(int64_t s)>;

// Assembles the L x L causal matrix C[s][l] (0-indexed blocks; NaN for
// l <= s) by calling `skipped_states(s)` once per s = 0..L-2 (skipping the
// last block has no later block, so row L-1 is all NaN and not computed).
absl::StatusOr<Matrix> CausalScoreMatrix(
    const std::vector<torch::Tensor>& base_states,
    const SkippedStatesFn& skipped_states,
    CausalForm form = CausalForm::kPerToken);

// ------------------------------------------------------------ permutation --

// P = |swapped_loss - base_loss| / base_loss. base_loss must be finite and
// > 0. A non-finite swapped loss (the swap broke the model) gives +inf.
absl::StatusOr<double> PermutationScore(double base_loss, double swapped_loss);

// Loss of the model with blocks l1 < l2 (0-indexed) exchanged.
using SwappedLossFn =
    std::function<absl::StatusOr<double>(int64_t l1, int64_t l2)>;

// L x L matrix P[l1][l2] for 0 <= l1 < l2 < L (NaN elsewhere), one call of
// `swapped_loss` per pair.
absl::StatusOr<Matrix> PermutationScoreMatrix(
    int64_t num_blocks, double base_loss, const SwappedLossFn& swapped_loss);

// ---------------------------------------------------- late-layer summaries --

inline constexpr double kCausalThreshold = 0.45;
inline constexpr double kPermThreshold = 0.15;

// First late block: ceil(L/4), 0-indexed. The paper's sets
// S_late = {(s, l): s >= ceil(L/4), l > s} are read with 0-indexed blocks,
// which makes them exactly the last three quarters of the network when 4 | L
// (L=32: blocks 8..31, i.e. 1-indexed layers 9..32).
int64_t LateStart(int64_t num_layers);

// Fraction of pairs (a, b) with LateStart(L) <= a < b < L whose entry
// m[a][b] exceeds `threshold` (strictly). `m` must be at least L x L.
// +inf counts as exceeding. InvalidArgument if a required entry is NaN or
// the matrix is too small; NaN (undefined) when there is no late pair
// (L <= 2), so shallow models still get their other diagnostics.
absl::StatusOr<double> LateFractionAbove(const Matrix& m, int64_t num_layers,
                                         double threshold);
// R_causal = LateFractionAbove(C, L, 0.45).
absl::StatusOr<double> RCausal(const Matrix& causal, int64_t num_layers,
                               double threshold = kCausalThreshold);
// R_perm = LateFractionAbove(P, L, 0.15).
absl::StatusOr<double> RPerm(const Matrix& perm, int64_t num_layers,
                             double threshold = kPermThreshold);

// -------------------------------------------------------------- logit lens --

// KL(p_final || softmax(layer_logits)) per token, averaged over tokens (all
// leading dims); both [..., V] with equal shapes. Natural log (nats).
absl::StatusOr<double> LogitLensKl(const torch::Tensor& final_logits,
                                   const torch::Tensor& layer_logits);
// One KL per entry of `layer_logits` (index = whatever probe order the caller
// uses, normally probe state after block l at index l).
absl::StatusOr<std::vector<double>> LogitLensKlProfile(
    const torch::Tensor& final_logits,
    const std::vector<torch::Tensor>& layer_logits);

// ----------------------------------------------------- CKA / effective depth

// Linear CKA of X [N, d1] and Y [N, d2] (rows = samples): columns centred,
//   ||Y^T X||_F^2 / (||X^T X||_F ||Y^T Y||_F),
// computed in float64. InvalidArgument if N differs, N < 2, or either matrix
// has zero variance after centring.
absl::StatusOr<double> LinearCka(const torch::Tensor& x,
                                 const torch::Tensor& y);

struct EffectiveDepthResult {
  int64_t num_layers = 0;  // L
  int64_t max_lag = 0;     // K
  double deff = 0.0;       // L / (1 + 2 sum_{k=1..K} (1 - k/L) rho_bar(k))
  double deff_over_l = 0.0;
  double rho_bar1 = 0.0;  // rho_bar(1); NaN when L == 1
  double f_l = 0.0;       // orthogonal-update reference 2L / (L+1)
  double gap_pct = 0.0;   // 100 (F_L - D_eff) / F_L (positive: below F_L)
  // lag_profile[k] = rho_bar(k) for k = 0..L-1 (lag_profile[0] = 1). The
  // profile always covers every lag, whatever K is.
  std::vector<double> lag_profile;
  // cka[i][j] = rho(i, j) over the L pooled layers (symmetric, diagonal 1).
  Matrix cka;
};

// D_eff (Gahtan et al.) from the L block outputs h_1..h_L. Each tensor is
// either [N_seq, T, d] (mean-pooled over T here) or already pooled [N_seq, d];
// N_seq must agree (d may differ). `max_lag` K: -1 means L-1; otherwise
// 0 <= K <= L-1. The CKA matrix comes from the GEMM kernel of cka_kernel.h
// (the one `depthbench-deff` uses on a mapped file); small inputs are
// computed in float64, large ones in float32 GEMMs (see there).
absl::StatusOr<EffectiveDepthResult> EffectiveDepth(
    const std::vector<torch::Tensor>& layer_states, int64_t max_lag = -1,
    const CkaOptions& options = {});
// The D_eff summary of a given L x L CKA matrix (rho, diagonal 1).
absl::StatusOr<EffectiveDepthResult> EffectiveDepthFromCka(Matrix cka,
                                                          int64_t max_lag = -1);
// Same from one pooled tensor [L, N, d] (the `.npy` layout).
absl::StatusOr<EffectiveDepthResult> EffectiveDepthFromPooled(
    const torch::Tensor& pooled, int64_t max_lag = -1);

// -------------------------------------------------------- HC / mHC / AttnRes

// exp(entropy of the normalised singular values) of a 2-D matrix: n for an
// n x n matrix with equal singular values (e.g. identity), 1 for rank 1.
// A batched input [B, r, c] gives the mean over the batch. InvalidArgument
// for an all-zero matrix.
absl::StatusOr<double> EffectiveRank(const torch::Tensor& m);

// Composed residual transport of HC/mHC. `maps[k]` is the n x n residual map
// A_k of sub-layer k in forward order (H_{k+1} = A_k^T H_k + ..., streams as
// rows), optionally batched per token [B, n, n]. Returns, for each k, the
// effective rank of the composed map P_k = A_0 A_1 ... A_k (its transpose is
// the transport H_0 -> H_{k+1}; both have the same singular values).
absl::StatusOr<std::vector<double>> ComposedEffectiveRanks(
    const std::vector<torch::Tensor>& maps);

// Block AttnRes: mean over tokens of the share of mixing weight on the
// running sum. `weights` is [..., S] (S sources, weights >= 0; each row is
// normalised by its sum, so softmax outputs and raw weights both work);
// `running_index` selects the running-sum source (negative counts from the
// end, -1 = last).
absl::StatusOr<double> RunningSumShare(const torch::Tensor& weights,
                                       int64_t running_index);
// One share per mixing site (sub-layer), in the order given.
absl::StatusOr<std::vector<double>> RunningSumShares(
    const std::vector<torch::Tensor>& weights,
    const std::vector<int64_t>& running_index);

}  // namespace diagnostics
}  // namespace depthbench

#endif  // DEPTHBENCH_TRAINER_CORE_DIAGNOSTICS_METRICS_H_
