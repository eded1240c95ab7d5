#include "trainer_core/diagnostics/metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace depthbench {
namespace diagnostics {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kPi = 3.14159265358979323846;
// Rows processed at once where a [rows, features] float64 temporary is made.
constexpr int64_t kChunkRows = 1024;

// Runs `f`, turning a LibTorch exception into a Status: the only place this
// module lets c10::Error surface.
template <typename F>
auto Guarded(const char* what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat(what, ": LibTorch error: ", e.what_without_backtrace()));
  }
}

std::string ShapeString(const torch::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) {
    absl::StrAppend(&s, i == 0 ? "" : ", ", t.size(i));
  }
  return s + "]";
}

// [..., d] -> [rows, d] float64.
torch::Tensor Rows(const torch::Tensor& t) {
  return t.reshape({-1, t.size(-1)}).to(torch::kFloat64);
}

absl::Status CheckSameShape(const torch::Tensor& a, const torch::Tensor& b,
                            const std::string& what) {
  if (!a.defined() || !b.defined()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": undefined tensor"));
  }
  if (a.dim() < 1 || a.numel() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": need a non-empty tensor [..., d], got ", ShapeString(a)));
  }
  if (!a.sizes().equals(b.sizes())) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": shape mismatch ", ShapeString(a), " vs ", ShapeString(b)));
  }
  return absl::OkStatus();
}

absl::Status CheckStates(const std::vector<torch::Tensor>& states,
                         const std::string& what) {
  if (states.size() < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": need L+1 >= 2 states (h_0 .. h_L), got ", states.size()));
  }
  for (size_t i = 1; i < states.size(); ++i) {
    RETURN_IF_ERROR(CheckSameShape(states[0], states[i],
                                   absl::StrCat(what, " (state ", i, ")")));
  }
  return absl::OkStatus();
}

Matrix NaNMatrix(int64_t rows, int64_t cols) {
  return Matrix(static_cast<size_t>(rows),
                std::vector<double>(static_cast<size_t>(cols), kNaN));
}

// Column-centred float64 copy of a [N, d] matrix, with what the CKA needs.
struct CkaOperand {
  torch::Tensor centred;  // [N, d]
  torch::Tensor gram;     // [N, N] when using the Gram form, else undefined
  double self_norm = 0;   // ||X^T X||_F (= ||X X^T||_F)
};

// Gram (N x N) form when N <= d: ||Y^T X||_F^2 = <X X^T, Y Y^T>_F.
absl::StatusOr<CkaOperand> MakeCkaOperand(const torch::Tensor& x, bool use_gram,
                                          const std::string& what) {
  if (!x.defined() || x.dim() != 2 || x.size(0) < 2 || x.size(1) < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": need a [N >= 2, d >= 1] matrix, got ",
                     x.defined() ? ShapeString(x) : std::string("undefined")));
  }
  CkaOperand op;
  torch::Tensor xd = x.to(torch::kFloat64);
  op.centred = xd - xd.mean(0, /*keepdim=*/true);
  const double raw = xd.norm().item<double>();
  const double cen = op.centred.norm().item<double>();
  if (!std::isfinite(raw) || !std::isfinite(cen)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": non-finite values"));
  }
  // Centring a constant column leaves rounding residue ~1e-17 relative.
  if (cen <= 1e-12 * raw || cen == 0.0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": zero variance after centring columns"));
  }
  if (use_gram) {
    op.gram = op.centred.matmul(op.centred.t());
    op.self_norm = op.gram.norm().item<double>();
  } else {
    op.self_norm = op.centred.t().matmul(op.centred).norm().item<double>();
  }
  return op;
}

double CkaOf(const CkaOperand& x, const CkaOperand& y) {
  double hsic;
  if (x.gram.defined() && y.gram.defined()) {
    hsic = (x.gram * y.gram).sum().item<double>();
  } else {
    const double f = y.centred.t().matmul(x.centred).norm().item<double>();
    hsic = f * f;
  }
  return hsic / (x.self_norm * y.self_norm);
}

// Effective rank of each matrix of a [B, r, c] float64 batch, averaged.
absl::StatusOr<double> MeanEffectiveRank(const torch::Tensor& batch) {
  torch::Tensor s = at::linalg_svdvals(batch);  // [B, k]
  torch::Tensor total = s.sum(-1, /*keepdim=*/true);
  if (!(total > 0).all().item<bool>() ||
      !torch::isfinite(total).all().item<bool>()) {
    return absl::InvalidArgumentError(
        "EffectiveRank: matrix is zero or non-finite");
  }
  torch::Tensor p = s / total;
  // 0 log 0 = 0.
  torch::Tensor plogp = torch::where(p > 0, p * p.log(), torch::zeros_like(p));
  return (-plogp.sum(-1)).exp().mean().item<double>();
}

}  // namespace

// ---------------------------------------------------------------- angular --

absl::StatusOr<Matrix> AngularDistanceMatrix(
    const std::vector<torch::Tensor>& states) {
  return Guarded("AngularDistanceMatrix", [&]() -> absl::StatusOr<Matrix> {
    RETURN_IF_ERROR(CheckStates(states, "AngularDistanceMatrix"));
    torch::NoGradGuard no_grad;
    const int64_t num_states = static_cast<int64_t>(states.size());  // L+1
    const int64_t num_layers = num_states - 1;
    // 1/||h|| per token; 0 for zero vectors so their cosine is 0.
    std::vector<torch::Tensor> inv_norm;
    inv_norm.reserve(states.size());
    for (const torch::Tensor& h : states) {
      torch::Tensor n = Rows(h).norm(2, /*dim=*/1);
      inv_norm.push_back(
          torch::where(n > 0, n.reciprocal(), torch::zeros_like(n)));
    }
    const int64_t rows = inv_norm[0].size(0);
    Matrix m = NaNMatrix(num_states, num_states);
    for (int64_t l = 0; l < num_layers; ++l) {
      torch::Tensor a = states[l].reshape({-1, states[l].size(-1)});
      for (int64_t n = 1; l + n <= num_layers; ++n) {
        torch::Tensor b = states[l + n].reshape({-1, states[l + n].size(-1)});
        double acc = 0.0;
        for (int64_t r0 = 0; r0 < rows; r0 += kChunkRows) {
          const int64_t r1 = std::min(rows, r0 + kChunkRows);
          torch::Tensor dot = (a.slice(0, r0, r1).to(torch::kFloat64) *
                               b.slice(0, r0, r1).to(torch::kFloat64))
                                  .sum(1);
          torch::Tensor cos = (dot * inv_norm[l].slice(0, r0, r1) *
                               inv_norm[l + n].slice(0, r0, r1))
                                  .clamp(-1.0, 1.0);
          acc += cos.acos().sum().item<double>();
        }
        m[l][n] = acc / static_cast<double>(rows) / kPi;
      }
    }
    return m;
  });
}

// ----------------------------------------------------------------- causal --

const char* CausalFormName(CausalForm form) {
  return form == CausalForm::kPerToken ? "per_token" : "ratio_of_means";
}

absl::StatusOr<CausalForm> ParseCausalForm(const std::string& name) {
  if (name == "per_token") return CausalForm::kPerToken;
  if (name == "ratio_of_means") return CausalForm::kRatioOfMeans;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown causal form \"", name, "\" (per_token or ratio_of_means)"));
}

absl::StatusOr<double> CausalScore(const torch::Tensor& base_delta,
                                   const torch::Tensor& skipped_delta,
                                   CausalForm form) {
  return Guarded("CausalScore", [&]() -> absl::StatusOr<double> {
    RETURN_IF_ERROR(CheckSameShape(base_delta, skipped_delta, "CausalScore"));
    torch::NoGradGuard no_grad;
    torch::Tensor base = Rows(base_delta);
    torch::Tensor skipped = Rows(skipped_delta);
    torch::Tensor num_tok = (skipped - base).norm(2, 1);
    torch::Tensor den_tok = base.norm(2, 1);
    if (form == CausalForm::kPerToken) {
      return (num_tok / den_tok.clamp_min(kCausalDenominatorFloor)).mean().item<double>();
    }
    const double num = num_tok.mean().item<double>();
    const double den = den_tok.mean().item<double>();
    if (den == 0.0) return num == 0.0 ? 0.0 : kInf;
    return num / den;
  });
}

absl::StatusOr<std::vector<double>> CausalScoreRow(
    const std::vector<torch::Tensor>& base_states,
    const std::vector<torch::Tensor>& skipped_states, int64_t s,
    CausalForm form) {
  RETURN_IF_ERROR(CheckStates(base_states, "CausalScoreRow base"));
  if (skipped_states.size() != base_states.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CausalScoreRow: ", base_states.size(), " base states but ",
        skipped_states.size(), " skipped states"));
  }
  const int64_t num_layers = static_cast<int64_t>(base_states.size()) - 1;
  if (s < 0 || s >= num_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CausalScoreRow: skipped block ", s, " outside [0, ", num_layers, ")"));
  }
  std::vector<double> row(static_cast<size_t>(num_layers), kNaN);
  for (int64_t l = s + 1; l < num_layers; ++l) {
    auto score = Guarded("CausalScoreRow", [&]() -> absl::StatusOr<double> {
      RETURN_IF_ERROR(
          CheckSameShape(base_states[l], skipped_states[l], "CausalScoreRow"));
      RETURN_IF_ERROR(CheckSameShape(base_states[l + 1], skipped_states[l + 1],
                                     "CausalScoreRow"));
      return CausalScore(base_states[l + 1] - base_states[l],
                         skipped_states[l + 1] - skipped_states[l], form);
    });
    if (!score.ok()) return score.status();
    row[l] = *score;
  }
  return row;
}

absl::StatusOr<Matrix> CausalScoreMatrix(
    const std::vector<torch::Tensor>& base_states,
    const SkippedStatesFn& skipped_states, CausalForm form) {
  RETURN_IF_ERROR(CheckStates(base_states, "CausalScoreMatrix"));
  const int64_t num_layers = static_cast<int64_t>(base_states.size()) - 1;
  Matrix c = NaNMatrix(num_layers, num_layers);
  for (int64_t s = 0; s + 1 < num_layers; ++s) {
    ASSIGN_OR_RETURN(std::vector<torch::Tensor> skipped, skipped_states(s));
    ASSIGN_OR_RETURN(c[s], CausalScoreRow(base_states, skipped, s, form));
  }
  return c;
}

// ------------------------------------------------------------ permutation --

absl::StatusOr<double> PermutationScore(double base_loss, double swapped_loss) {
  if (!std::isfinite(base_loss) || base_loss <= 0.0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PermutationScore: base loss must be finite and > 0, got ", base_loss));
  }
  if (!std::isfinite(swapped_loss)) return kInf;
  return std::fabs(swapped_loss - base_loss) / base_loss;
}

absl::StatusOr<Matrix> PermutationScoreMatrix(
    int64_t num_blocks, double base_loss, const SwappedLossFn& swapped_loss) {
  if (num_blocks < 1) {
    return absl::InvalidArgumentError("PermutationScoreMatrix: need L >= 1");
  }
  Matrix p = NaNMatrix(num_blocks, num_blocks);
  for (int64_t l1 = 0; l1 < num_blocks; ++l1) {
    for (int64_t l2 = l1 + 1; l2 < num_blocks; ++l2) {
      ASSIGN_OR_RETURN(double loss, swapped_loss(l1, l2));
      ASSIGN_OR_RETURN(p[l1][l2], PermutationScore(base_loss, loss));
    }
  }
  return p;
}

// ---------------------------------------------------- late-layer summaries --

int64_t LateStart(int64_t num_layers) {
  return num_layers <= 0 ? 0 : (num_layers + 3) / 4;
}

absl::StatusOr<double> LateFractionAbove(const Matrix& m, int64_t num_layers,
                                         double threshold) {
  if (num_layers < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("late-layer summary: need L >= 2, got ", num_layers));
  }
  if (static_cast<int64_t>(m.size()) < num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("late-layer summary: matrix has ", m.size(),
                     " rows, need ", num_layers));
  }
  int64_t total = 0;
  int64_t above = 0;
  for (int64_t a = LateStart(num_layers); a < num_layers; ++a) {
    if (static_cast<int64_t>(m[a].size()) < num_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("late-layer summary: row ", a, " has ", m[a].size(),
                       " entries, need ", num_layers));
    }
    for (int64_t b = a + 1; b < num_layers; ++b) {
      const double v = m[a][b];
      if (std::isnan(v)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "late-layer summary: entry (", a, ", ", b, ") is NaN"));
      }
      ++total;
      if (v > threshold) ++above;
    }
  }
  if (total == 0) {
    // Fewer than two late layers (L <= 2): the summary is undefined, not an
    // error; it is reported as NaN (null in JSON).
    return std::numeric_limits<double>::quiet_NaN();
  }
  return static_cast<double>(above) / static_cast<double>(total);
}

absl::StatusOr<double> RCausal(const Matrix& causal, int64_t num_layers,
                               double threshold) {
  return LateFractionAbove(causal, num_layers, threshold);
}

absl::StatusOr<double> RPerm(const Matrix& perm, int64_t num_layers,
                             double threshold) {
  return LateFractionAbove(perm, num_layers, threshold);
}

// -------------------------------------------------------------- logit lens --

absl::StatusOr<double> LogitLensKl(const torch::Tensor& final_logits,
                                   const torch::Tensor& layer_logits) {
  return Guarded("LogitLensKl", [&]() -> absl::StatusOr<double> {
    RETURN_IF_ERROR(CheckSameShape(final_logits, layer_logits, "LogitLensKl"));
    torch::NoGradGuard no_grad;
    const int64_t vocab = final_logits.size(-1);
    torch::Tensor f = final_logits.reshape({-1, vocab});
    torch::Tensor g = layer_logits.reshape({-1, vocab});
    const int64_t rows = f.size(0);
    double acc = 0.0;
    for (int64_t r0 = 0; r0 < rows; r0 += kChunkRows) {
      const int64_t r1 = std::min(rows, r0 + kChunkRows);
      torch::Tensor logp =
          torch::log_softmax(f.slice(0, r0, r1).to(torch::kFloat64), -1);
      torch::Tensor logq =
          torch::log_softmax(g.slice(0, r0, r1).to(torch::kFloat64), -1);
      acc += (logp.exp() * (logp - logq)).sum().item<double>();
    }
    return acc / static_cast<double>(rows);
  });
}

absl::StatusOr<std::vector<double>> LogitLensKlProfile(
    const torch::Tensor& final_logits,
    const std::vector<torch::Tensor>& layer_logits) {
  std::vector<double> out;
  out.reserve(layer_logits.size());
  for (const torch::Tensor& l : layer_logits) {
    ASSIGN_OR_RETURN(double kl, LogitLensKl(final_logits, l));
    out.push_back(kl);
  }
  return out;
}

// ----------------------------------------------------- CKA / effective depth

absl::StatusOr<double> LinearCka(const torch::Tensor& x,
                                 const torch::Tensor& y) {
  return Guarded("LinearCka", [&]() -> absl::StatusOr<double> {
    torch::NoGradGuard no_grad;
    if (!x.defined() || !y.defined() || x.dim() != 2 || y.dim() != 2) {
      return absl::InvalidArgumentError("LinearCka: need two 2-D matrices");
    }
    if (x.size(0) != y.size(0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("LinearCka: row counts differ: ", ShapeString(x), " vs ",
                       ShapeString(y)));
    }
    const bool gram = x.size(0) <= std::max(x.size(1), y.size(1));
    ASSIGN_OR_RETURN(CkaOperand a, MakeCkaOperand(x, gram, "LinearCka X"));
    ASSIGN_OR_RETURN(CkaOperand b, MakeCkaOperand(y, gram, "LinearCka Y"));
    return CkaOf(a, b);
  });
}

absl::StatusOr<EffectiveDepthResult> EffectiveDepthFromCka(Matrix cka,
                                                          int64_t max_lag) {
  const int64_t num_layers = static_cast<int64_t>(cka.size());
  if (num_layers < 1) {
    return absl::InvalidArgumentError("EffectiveDepth: no layer states");
  }
  for (const auto& row : cka) {
    if (static_cast<int64_t>(row.size()) != num_layers) {
      return absl::InvalidArgumentError(
          "EffectiveDepth: the CKA matrix must be square");
    }
  }
  if (max_lag == -1) max_lag = num_layers - 1;
  if (max_lag < 0 || max_lag > num_layers - 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("EffectiveDepth: max lag ", max_lag, " outside [0, ",
                     num_layers - 1, "]"));
  }
  EffectiveDepthResult r;
  r.num_layers = num_layers;
  r.max_lag = max_lag;
  r.cka = std::move(cka);
  r.lag_profile.assign(static_cast<size_t>(num_layers), 0.0);
  for (int64_t k = 0; k < num_layers; ++k) {
    double sum = 0.0;
    for (int64_t i = 0; i + k < num_layers; ++i) sum += r.cka[i][i + k];
    r.lag_profile[k] = sum / static_cast<double>(num_layers - k);
  }
  const double l_d = static_cast<double>(num_layers);
  double acc = 0.0;
  for (int64_t k = 1; k <= max_lag; ++k) {
    acc += (1.0 - static_cast<double>(k) / l_d) * r.lag_profile[k];
  }
  r.deff = l_d / (1.0 + 2.0 * acc);
  r.deff_over_l = r.deff / l_d;
  r.rho_bar1 = num_layers > 1 ? r.lag_profile[1] : kNaN;
  r.f_l = 2.0 * l_d / (l_d + 1.0);
  r.gap_pct = 100.0 * (r.f_l - r.deff) / r.f_l;
  return r;
}

absl::StatusOr<EffectiveDepthResult> EffectiveDepth(
    const std::vector<torch::Tensor>& layer_states, int64_t max_lag,
    const CkaOptions& options) {
  return Guarded(
      "EffectiveDepth", [&]() -> absl::StatusOr<EffectiveDepthResult> {
        torch::NoGradGuard no_grad;
        const int64_t num_layers = static_cast<int64_t>(layer_states.size());
        if (num_layers < 1) {
          return absl::InvalidArgumentError("EffectiveDepth: no layer states");
        }
        if (max_lag < -1 || max_lag > num_layers - 1) {
          return absl::InvalidArgumentError(
              absl::StrCat("EffectiveDepth: max lag ", max_lag, " outside [0, ",
                           num_layers - 1, "]"));
        }
        // Pooled over tokens (in float64) where the states are [N, T, d];
        // already pooled [N, d] states go to the kernel as they are.
        std::vector<torch::Tensor> pooled;
        pooled.reserve(layer_states.size());
        for (int64_t l = 0; l < num_layers; ++l) {
          const torch::Tensor& h = layer_states[l];
          if (!h.defined() || (h.dim() != 2 && h.dim() != 3)) {
            return absl::InvalidArgumentError(
                absl::StrCat("EffectiveDepth: layer ", l + 1,
                             " must be [N, T, d] or [N, d]"));
          }
          torch::Tensor p = h.dim() == 3 ? h.to(torch::kFloat64).mean(1) : h;
          if (!p.is_floating_point()) p = p.to(torch::kFloat64);
          if (p.size(0) != layer_states[0].size(0)) {
            return absl::InvalidArgumentError(absl::StrCat(
                "EffectiveDepth: layer ", l + 1, " has ", p.size(0),
                " sequences, layer 1 has ", layer_states[0].size(0)));
          }
          if (p.size(0) < 2 || p.size(1) < 1) {
            return absl::InvalidArgumentError(absl::StrCat(
                "EffectiveDepth: layer ", l + 1,
                ": need a [N >= 2, d >= 1] matrix, got ", ShapeString(p)));
          }
          if (p.scalar_type() != torch::kFloat32 &&
              p.scalar_type() != torch::kFloat64) {
            p = p.to(torch::kFloat64);
          }
          pooled.push_back(p.contiguous());
        }
        TensorLayerRows rows(std::move(pooled));
        ASSIGN_OR_RETURN(CkaResult cka,
                         LinearCkaMatrix(rows, options, "EffectiveDepth"));
        return EffectiveDepthFromCka(std::move(cka.cka), max_lag);
      });
}

absl::StatusOr<EffectiveDepthResult> EffectiveDepthFromPooled(
    const torch::Tensor& pooled, int64_t max_lag) {
  if (!pooled.defined() || pooled.dim() != 3) {
    return absl::InvalidArgumentError(
        "EffectiveDepthFromPooled: need an [L, N, d] tensor");
  }
  std::vector<torch::Tensor> layers = pooled.unbind(0);
  return EffectiveDepth(layers, max_lag);
}

// -------------------------------------------------------- HC / mHC / AttnRes

absl::StatusOr<double> EffectiveRank(const torch::Tensor& m) {
  return Guarded("EffectiveRank", [&]() -> absl::StatusOr<double> {
    torch::NoGradGuard no_grad;
    if (!m.defined() || (m.dim() != 2 && m.dim() != 3) || m.numel() == 0) {
      return absl::InvalidArgumentError(
          "EffectiveRank: need a non-empty [r, c] or [B, r, c] tensor");
    }
    torch::Tensor md = m.to(torch::kFloat64);
    return MeanEffectiveRank(md.dim() == 2 ? md.unsqueeze(0) : md);
  });
}

absl::StatusOr<std::vector<double>> ComposedEffectiveRanks(
    const std::vector<torch::Tensor>& maps) {
  return Guarded(
      "ComposedEffectiveRanks", [&]() -> absl::StatusOr<std::vector<double>> {
        torch::NoGradGuard no_grad;
        std::vector<double> out;
        out.reserve(maps.size());
        torch::Tensor composed;
        for (size_t k = 0; k < maps.size(); ++k) {
          const torch::Tensor& a = maps[k];
          if (!a.defined() || (a.dim() != 2 && a.dim() != 3) ||
              a.size(-1) != a.size(-2) || a.numel() == 0) {
            return absl::InvalidArgumentError(
                absl::StrCat("ComposedEffectiveRanks: map ", k,
                             " must be [n, n] or [B, n, n]"));
          }
          torch::Tensor ad = a.to(torch::kFloat64);
          if (k == 0) {
            composed = ad;
          } else {
            if (a.size(-1) != composed.size(-1)) {
              return absl::InvalidArgumentError(absl::StrCat(
                  "ComposedEffectiveRanks: map ", k, " has n = ", a.size(-1),
                  ", earlier maps n = ", composed.size(-1)));
            }
            composed = composed.matmul(ad);
          }
          // Effective rank is scale-free; renormalise so long products neither
          // overflow nor underflow.
          torch::Tensor scale = composed.abs().amax({-2, -1}, /*keepdim=*/true);
          composed = composed /
                     torch::where(scale > 0, scale, torch::ones_like(scale));
          ASSIGN_OR_RETURN(double r, EffectiveRank(composed));
          out.push_back(r);
        }
        return out;
      });
}

absl::StatusOr<double> RunningSumShare(const torch::Tensor& weights,
                                       int64_t running_index) {
  return Guarded("RunningSumShare", [&]() -> absl::StatusOr<double> {
    torch::NoGradGuard no_grad;
    if (!weights.defined() || weights.dim() < 1 || weights.numel() == 0) {
      return absl::InvalidArgumentError(
          "RunningSumShare: need non-empty weights [..., S]");
    }
    const int64_t sources = weights.size(-1);
    const int64_t idx =
        running_index < 0 ? sources + running_index : running_index;
    if (idx < 0 || idx >= sources) {
      return absl::InvalidArgumentError(
          absl::StrCat("RunningSumShare: source index ", running_index,
                       " outside ", sources, " sources"));
    }
    torch::Tensor w = Rows(weights);
    if ((w < 0).any().item<bool>() || !torch::isfinite(w).all().item<bool>()) {
      return absl::InvalidArgumentError(
          "RunningSumShare: weights must be finite and >= 0");
    }
    torch::Tensor total = w.sum(1);
    if ((total <= 0).any().item<bool>()) {
      return absl::InvalidArgumentError(
          "RunningSumShare: a mixing site has all-zero weights");
    }
    return (w.select(1, idx) / total).mean().item<double>();
  });
}

absl::StatusOr<std::vector<double>> RunningSumShares(
    const std::vector<torch::Tensor>& weights,
    const std::vector<int64_t>& running_index) {
  if (weights.size() != running_index.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("RunningSumShares: ", weights.size(),
                     " weight tensors but ", running_index.size(), " indices"));
  }
  std::vector<double> out;
  out.reserve(weights.size());
  for (size_t i = 0; i < weights.size(); ++i) {
    ASSIGN_OR_RETURN(double share,
                     RunningSumShare(weights[i], running_index[i]));
    out.push_back(share);
  }
  return out;
}

}  // namespace diagnostics
}  // namespace depthbench
