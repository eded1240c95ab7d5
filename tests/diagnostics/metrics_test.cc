#include "trainer_core/diagnostics/metrics.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <vector>

namespace depthbench {
namespace diagnostics {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

class MetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    at::set_num_threads(1);
    torch::manual_seed(1234);
  }
};

// ------------------------------------------------------------- angular ----

TEST_F(MetricsTest, AngularIdenticalStatesAreZeroAndLayoutIsDocumented) {
  torch::Tensor h = torch::randn({2, 5, 16});  // [B, T, d]
  std::vector<torch::Tensor> states(5, h);     // L = 4
  auto m = AngularDistanceMatrix(states);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->size(), 5u);
  for (int64_t l = 0; l <= 4; ++l) {
    ASSERT_EQ((*m)[l].size(), 5u);
    for (int64_t n = 0; n <= 4; ++n) {
      const bool defined = n >= 1 && l + n <= 4;
      if (defined) {
        EXPECT_NEAR((*m)[l][n], 0.0, 1e-6) << l << "," << n;
      } else {
        EXPECT_TRUE(std::isnan((*m)[l][n])) << l << "," << n;
      }
    }
  }
}

TEST_F(MetricsTest, AngularOrthogonalStatesAreHalf) {
  // Token t of state l is a random scale times basis vector e_l.
  const int64_t num_states = 4, tokens = 7, d = 6;
  std::vector<torch::Tensor> states;
  for (int64_t l = 0; l < num_states; ++l) {
    torch::Tensor h = torch::zeros({tokens, d});
    h.select(1, l).copy_(torch::rand({tokens}) + 0.5);
    states.push_back(h);
  }
  auto m = AngularDistanceMatrix(states);
  ASSERT_TRUE(m.ok()) << m.status();
  for (int64_t l = 0; l < num_states - 1; ++l) {
    for (int64_t n = 1; l + n < num_states; ++n) {
      EXPECT_NEAR((*m)[l][n], 0.5, 1e-12);
    }
  }
}

TEST_F(MetricsTest, AngularKnownAnglesAverageOverTokens) {
  // Token 0: 60 degrees (1/3); token 1: 180 degrees (1). Mean 2/3.
  torch::Tensor h0 = torch::tensor({{1.0, 0.0}, {2.0, 0.0}});
  torch::Tensor h1 = torch::tensor({{0.5, std::sqrt(3.0) / 2}, {-1.0, 0.0}});
  auto m = AngularDistanceMatrix({h0, h1});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_NEAR((*m)[0][1], 2.0 / 3.0, 1e-6);
}

TEST_F(MetricsTest, AngularRejectsBadInput) {
  EXPECT_FALSE(AngularDistanceMatrix({torch::ones({3, 4})}).ok());
  EXPECT_FALSE(
      AngularDistanceMatrix({torch::ones({3, 4}), torch::ones({3, 5})}).ok());
}

// -------------------------------------------------------------- causal ----

// A toy residual model: h_{l+1} = h_l + tanh(h_l W_l); skipping block s is
// replacing it by the identity.
struct ToyModel {
  std::vector<torch::Tensor> weights;

  std::vector<torch::Tensor> Forward(const torch::Tensor& h0, int64_t skip,
                                     int64_t swap_a = -1,
                                     int64_t swap_b = -1) const {
    std::vector<torch::Tensor> states = {h0};
    for (int64_t l = 0; l < static_cast<int64_t>(weights.size()); ++l) {
      int64_t w = l == swap_a ? swap_b : (l == swap_b ? swap_a : l);
      const torch::Tensor& h = states.back();
      states.push_back(l == skip ? h : h + torch::tanh(h.matmul(weights[w])));
    }
    return states;
  }
  // A stand-in loss: positive, depends on the final state.
  double Loss(const std::vector<torch::Tensor>& states) const {
    return states.back().pow(2).mean().item<double>() + 1.0;
  }
};

ToyModel MakeToy(int64_t num_layers, int64_t d, int64_t zeroed) {
  ToyModel toy;
  for (int64_t l = 0; l < num_layers; ++l) {
    toy.weights.push_back(l == zeroed ? torch::zeros({d, d})
                                      : torch::randn({d, d}) / std::sqrt(d));
  }
  return toy;
}

TEST_F(MetricsTest, CausalScoreFormsPerTokenDefaultAndRatioOfMeans) {
  // Token norms: base deltas 1 and 3, differences 1 and 0.
  torch::Tensor base = torch::tensor({{1.0}, {3.0}});
  torch::Tensor skipped = torch::tensor({{2.0}, {3.0}});
  // Default, per token: mean(1/1, 0/3) = 0.5.
  auto c = CausalScore(base, skipped);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_NEAR(*c, 0.5, 1e-12);
  // Ratio of means: mean|D'-D| / mean|D| = 0.5 / 2 = 0.25.
  auto r = CausalScore(base, skipped, CausalForm::kRatioOfMeans);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NEAR(*r, 0.25, 1e-12);
  for (CausalForm f : {CausalForm::kPerToken, CausalForm::kRatioOfMeans}) {
    auto same = CausalScore(base, base, f);
    ASSERT_TRUE(same.ok());
    EXPECT_EQ(*same, 0.0);
    auto zero = CausalScore(torch::zeros({2, 1}), torch::zeros({2, 1}), f);
    ASSERT_TRUE(zero.ok());
    EXPECT_EQ(*zero, 0.0);
  }
  // Per token, a zero base delta is divided by the 1e-8 floor, not by 0.
  auto floor = CausalScore(torch::tensor({{0.0}, {2.0}}), torch::tensor({{1e-9}, {2.0}}));
  ASSERT_TRUE(floor.ok());
  EXPECT_NEAR(*floor, 0.5 * (1e-9 / 1e-8), 1e-8);  // 1e-9 in float32
  auto inf = CausalScore(torch::zeros({2, 1}), torch::ones({2, 1}), CausalForm::kRatioOfMeans);
  ASSERT_TRUE(inf.ok());
  EXPECT_TRUE(std::isinf(*inf));
  EXPECT_STREQ(CausalFormName(CausalForm::kPerToken), "per_token");
  EXPECT_EQ(*ParseCausalForm("ratio_of_means"), CausalForm::kRatioOfMeans);
  EXPECT_FALSE(ParseCausalForm("mean").ok());
}

TEST_F(MetricsTest, CausalRowZeroWhenSkippedStatesEqualBase) {
  std::vector<torch::Tensor> base;
  for (int i = 0; i < 5; ++i) base.push_back(torch::randn({4, 3, 8}));
  auto row = CausalScoreRow(base, base, 1);
  ASSERT_TRUE(row.ok()) << row.status();
  ASSERT_EQ(row->size(), 4u);
  EXPECT_TRUE(std::isnan((*row)[0]));
  EXPECT_TRUE(std::isnan((*row)[1]));
  EXPECT_EQ((*row)[2], 0.0);
  EXPECT_EQ((*row)[3], 0.0);
  EXPECT_FALSE(CausalScoreRow(base, base, 4).ok());
  EXPECT_FALSE(CausalScoreRow(base, {base[0], base[1]}, 0).ok());
}

TEST_F(MetricsTest, CausalMatrixZeroRowForZeroedBlockOnly) {
  const int64_t num_layers = 5, d = 8;
  ToyModel toy = MakeToy(num_layers, d, /*zeroed=*/2);
  torch::Tensor h0 = torch::randn({16, d});
  std::vector<torch::Tensor> base = toy.Forward(h0, -1);
  int calls = 0;
  auto c = CausalScoreMatrix(
      base, [&](int64_t s) -> absl::StatusOr<std::vector<torch::Tensor>> {
        ++calls;
        return toy.Forward(h0, s);
      });
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(calls, num_layers - 1);
  ASSERT_EQ(c->size(), static_cast<size_t>(num_layers));
  for (int64_t s = 0; s < num_layers; ++s) {
    ASSERT_EQ((*c)[s].size(), static_cast<size_t>(num_layers));
    for (int64_t l = 0; l < num_layers; ++l) {
      if (l <= s) {
        EXPECT_TRUE(std::isnan((*c)[s][l])) << s << "," << l;
      } else if (s == 2) {
        EXPECT_EQ((*c)[s][l], 0.0) << "zeroed block changes nothing";
      } else if (l == 2) {
        // The zeroed block's own update is 0 with or without the skip.
        EXPECT_EQ((*c)[s][l], 0.0);
      } else {
        EXPECT_GT((*c)[s][l], 1e-3) << s << "," << l;
      }
    }
  }
}

// ---------------------------------------------------------- permutation ----

TEST_F(MetricsTest, PermutationScoreValues) {
  EXPECT_EQ(*PermutationScore(2.5, 2.5), 0.0);
  EXPECT_NEAR(*PermutationScore(2.0, 2.5), 0.25, 1e-15);
  EXPECT_NEAR(*PermutationScore(2.0, 1.5), 0.25, 1e-15);
  EXPECT_TRUE(std::isinf(*PermutationScore(2.0, kNaN)));
  EXPECT_FALSE(PermutationScore(0.0, 1.0).ok());
  EXPECT_FALSE(PermutationScore(kNaN, 1.0).ok());
}

TEST_F(MetricsTest, PermutationMatrixZeroForIdenticalBlocks) {
  const int64_t num_layers = 4, d = 8;
  ToyModel toy = MakeToy(num_layers, d, -1);
  toy.weights[3] = toy.weights[1].clone();  // blocks 1 and 3 identical
  torch::Tensor h0 = torch::randn({16, d});
  const double base = toy.Loss(toy.Forward(h0, -1));
  auto p = PermutationScoreMatrix(
      num_layers, base, [&](int64_t a, int64_t b) -> absl::StatusOr<double> {
        return toy.Loss(toy.Forward(h0, -1, a, b));
      });
  ASSERT_TRUE(p.ok()) << p.status();
  for (int64_t a = 0; a < num_layers; ++a) {
    for (int64_t b = 0; b < num_layers; ++b) {
      if (b <= a) {
        EXPECT_TRUE(std::isnan((*p)[a][b]));
      } else if (a == 1 && b == 3) {
        EXPECT_EQ((*p)[a][b], 0.0);
      } else {
        EXPECT_GT((*p)[a][b], 0.0) << a << "," << b;
      }
    }
  }
}

// ------------------------------------------------------------ summaries ----

TEST_F(MetricsTest, LateStartIsCeilQuarterOfZeroIndexedBlocks) {
  EXPECT_EQ(LateStart(32), 8);
  EXPECT_EQ(LateStart(8), 2);
  EXPECT_EQ(LateStart(5), 2);
  EXPECT_EQ(LateStart(4), 1);
  EXPECT_EQ(LateStart(1), 1);
}

TEST_F(MetricsTest, RSummariesOnHandMadeMatrix) {
  // L = 8: late pairs are 2 <= a < b < 8, 15 of them.
  const int64_t num_layers = 8;
  Matrix m(num_layers, std::vector<double>(num_layers, kNaN));
  for (int64_t a = 0; a < num_layers; ++a) {
    for (int64_t b = a + 1; b < num_layers; ++b) m[a][b] = 0.0;
  }
  // Early pairs above every threshold must not count.
  m[0][1] = m[0][7] = m[1][5] = 0.9;
  // Late pairs: 0.5 > 0.45 and > 0.15; 0.3 only > 0.15; 0.45 / 0.15
  // exactly on a threshold do not count for that threshold; inf counts.
  m[2][3] = 0.5;
  m[4][7] = 0.5;
  m[3][6] = 0.3;
  m[5][6] = 0.45;
  m[6][7] = 0.15;
  m[2][7] = std::numeric_limits<double>::infinity();
  auto rc = RCausal(m, num_layers);
  ASSERT_TRUE(rc.ok()) << rc.status();
  EXPECT_NEAR(*rc, 3.0 / 15.0, 1e-15);  // 0.5, 0.5, inf
  auto rp = RPerm(m, num_layers);
  ASSERT_TRUE(rp.ok()) << rp.status();
  EXPECT_NEAR(*rp, 5.0 / 15.0, 1e-15);  // + 0.3, 0.45
  auto custom = LateFractionAbove(m, num_layers, 0.0);
  ASSERT_TRUE(custom.ok());
  EXPECT_NEAR(*custom, 6.0 / 15.0, 1e-15);

  Matrix with_nan = m;
  with_nan[3][4] = kNaN;
  EXPECT_FALSE(RCausal(with_nan, num_layers).ok());
  // No late pair (L <= 2): undefined, reported as NaN rather than an error.
  auto shallow = RCausal(m, 2);
  ASSERT_TRUE(shallow.ok()) << shallow.status();
  EXPECT_TRUE(std::isnan(*shallow));
  EXPECT_FALSE(RCausal(Matrix(3, std::vector<double>(3, 0.0)), 8).ok());
}

// ----------------------------------------------------------- logit lens ----

TEST_F(MetricsTest, LogitLensKlKnownValues) {
  torch::Tensor f = torch::randn({3, 5, 11});
  EXPECT_NEAR(*LogitLensKl(f, f), 0.0, 1e-12);
  EXPECT_NEAR(*LogitLensKl(f, f + 3.0), 0.0, 1e-9);  // shift invariant
  // p = (1/2, 1/2), q = (3/4, 1/4): KL = 0.5 ln(4/3).
  torch::Tensor p = torch::tensor({{0.0, 0.0}});
  torch::Tensor q = torch::tensor({{std::log(3.0), 0.0}}, torch::kFloat64);
  EXPECT_NEAR(*LogitLensKl(p, q.to(torch::kFloat32)), 0.5 * std::log(4.0 / 3),
              1e-6);
  auto profile = LogitLensKlProfile(f, {f, f * 0.5, f * 0.0});
  ASSERT_TRUE(profile.ok()) << profile.status();
  ASSERT_EQ(profile->size(), 3u);
  EXPECT_NEAR((*profile)[0], 0.0, 1e-12);
  EXPECT_GT((*profile)[2], (*profile)[1]);
  EXPECT_FALSE(LogitLensKl(f, torch::randn({3, 5, 12})).ok());
}

// ------------------------------------------------------------------ CKA ----

double ReferenceCka(torch::Tensor x, torch::Tensor y) {
  x = x.to(torch::kFloat64);
  y = y.to(torch::kFloat64);
  x = x - x.mean(0, true);
  y = y - y.mean(0, true);
  const double num = y.t().matmul(x).norm().pow(2).item<double>();
  return num / (x.t().matmul(x).norm().item<double>() *
                y.t().matmul(y).norm().item<double>());
}

TEST_F(MetricsTest, CkaSelfIsOneAndInvariances) {
  // Feature path (N > d) and Gram path (N <= d).
  for (auto [n, d] : {std::pair<int64_t, int64_t>{50, 8}, {6, 40}}) {
    torch::Tensor x = torch::randn({n, d}, torch::kFloat64);
    torch::Tensor y = torch::randn({n, d}, torch::kFloat64) + 0.5 * x;
    EXPECT_NEAR(*LinearCka(x, x), 1.0, 1e-12);
    const double base = *LinearCka(x, y);
    EXPECT_NEAR(base, ReferenceCka(x, y), 1e-12);
    EXPECT_GT(base, 0.0);
    EXPECT_LT(base, 1.0);
    torch::Tensor q =
        std::get<0>(at::linalg_qr(torch::randn({d, d}, torch::kFloat64)));
    EXPECT_NEAR(*LinearCka(x.matmul(q), y), base, 1e-12) << "orthogonal";
    EXPECT_NEAR(*LinearCka(x * 3.7, y), base, 1e-12) << "isotropic scale";
    EXPECT_NEAR(*LinearCka(x + 5.0, y), base, 1e-12) << "translation";
    EXPECT_NEAR(*LinearCka(y, x), base, 1e-12) << "symmetry";
  }
  // Different widths are fine; row counts must agree.
  torch::Tensor a = torch::randn({20, 3});
  EXPECT_TRUE(LinearCka(a, torch::randn({20, 7})).ok());
  EXPECT_FALSE(LinearCka(a, torch::randn({21, 3})).ok());
  // A constant matrix has no variance.
  EXPECT_FALSE(LinearCka(torch::full({20, 3}, 0.1), a).ok());
}

// -------------------------------------------------------------- D_eff ----

// L layers of pooled states whose column spaces (in R^N) are mutually
// orthogonal and orthogonal to the all-ones vector: every cross-layer CKA is
// exactly 0 (up to rounding).
std::vector<torch::Tensor> OrthogonalLayers(int64_t num_layers, int64_t d) {
  const int64_t n = 2 * num_layers + 1;
  torch::Tensor a = torch::randn({n, n}, torch::kFloat64);
  a.select(1, 0).fill_(1.0);
  torch::Tensor q = std::get<0>(at::linalg_qr(a));  // q[:,0] ~ ones
  std::vector<torch::Tensor> layers;
  for (int64_t l = 0; l < num_layers; ++l) {
    torch::Tensor basis = q.slice(1, 1 + 2 * l, 3 + 2 * l);  // [n, 2]
    layers.push_back(basis.matmul(torch::randn({2, d}, torch::kFloat64)) + 2.0);
  }
  return layers;
}

TEST_F(MetricsTest, DeffOfOrthogonalStatesIsL) {
  for (int64_t d : {4, 64}) {  // feature path and Gram path
    const int64_t num_layers = 6;
    auto r = EffectiveDepth(OrthogonalLayers(num_layers, d));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_NEAR(r->deff, 6.0, 1e-9);
    EXPECT_NEAR(r->deff_over_l, 1.0, 1e-9);
    EXPECT_NEAR(r->rho_bar1, 0.0, 1e-9);
    EXPECT_NEAR(r->f_l, 12.0 / 7.0, 1e-15);
    EXPECT_NEAR(r->gap_pct, 100.0 * (12.0 / 7.0 - 6.0) / (12.0 / 7.0), 1e-6);
    EXPECT_EQ(r->max_lag, 5);
    ASSERT_EQ(r->lag_profile.size(), 6u);
    EXPECT_EQ(r->lag_profile[0], 1.0);
    ASSERT_EQ(r->cka.size(), 6u);
    EXPECT_EQ(r->cka[2][2], 1.0);
    EXPECT_NEAR(r->cka[1][4], 0.0, 1e-12);
  }
}

TEST_F(MetricsTest, DeffOfIdenticalStatesIsOne) {
  torch::Tensor x = torch::randn({10, 12});
  auto r = EffectiveDepth(std::vector<torch::Tensor>(8, x));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NEAR(r->deff, 1.0, 1e-9);
  EXPECT_NEAR(r->rho_bar1, 1.0, 1e-12);
  EXPECT_NEAR(r->gap_pct, 100.0 * (16.0 / 9.0 - 1.0) / (16.0 / 9.0), 1e-6);
}

TEST_F(MetricsTest, DeffPoolsTokensAndHonoursMaxLag) {
  const int64_t num_layers = 5;
  std::vector<torch::Tensor> unpooled, pooled;
  torch::Tensor h = torch::randn({9, 4, 6}, torch::kFloat64);
  for (int64_t l = 0; l < num_layers; ++l) {
    h = h + 0.7 * torch::randn({9, 4, 6}, torch::kFloat64);
    unpooled.push_back(h);
    pooled.push_back(h.mean(1));
  }
  auto a = EffectiveDepth(unpooled);
  auto b = EffectiveDepthFromPooled(torch::stack(pooled));
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NEAR(a->deff, b->deff, 1e-12);
  EXPECT_GT(a->deff, 1.0);
  EXPECT_LT(a->deff, 5.0);
  // K = 1 by hand from the lag profile.
  auto k1 = EffectiveDepth(unpooled, 1);
  ASSERT_TRUE(k1.ok());
  EXPECT_NEAR(k1->deff, 5.0 / (1.0 + 2.0 * (1.0 - 1.0 / 5) * a->lag_profile[1]),
              1e-12);
  auto k0 = EffectiveDepth(unpooled, 0);
  ASSERT_TRUE(k0.ok());
  EXPECT_NEAR(k0->deff, 5.0, 1e-12);
  EXPECT_FALSE(EffectiveDepth(unpooled, 5).ok());
  EXPECT_FALSE(EffectiveDepth(unpooled, -2).ok());
  EXPECT_FALSE(EffectiveDepth({}).ok());
  EXPECT_FALSE(EffectiveDepth({pooled[0], pooled[1].slice(0, 0, 8)}).ok());
}

// ------------------------------------------------------- effective rank ----

TEST_F(MetricsTest, EffectiveRankKnownValues) {
  EXPECT_NEAR(*EffectiveRank(torch::eye(4)), 4.0, 1e-12);
  torch::Tensor u = torch::randn({5, 1}), v = torch::randn({1, 3});
  EXPECT_NEAR(*EffectiveRank(u.matmul(v)), 1.0, 1e-5);
  EXPECT_NEAR(*EffectiveRank(torch::diag(torch::tensor({2.0, 2.0, 0.0}))), 2.0,
              1e-12);
  // Batched: mean of 4 and 1.
  torch::Tensor batch = torch::stack({torch::eye(4), torch::zeros({4, 4})});
  batch[1][0][0] = 1.0;
  EXPECT_NEAR(*EffectiveRank(batch), 2.5, 1e-12);
  EXPECT_FALSE(EffectiveRank(torch::zeros({3, 3})).ok());
  EXPECT_FALSE(EffectiveRank(torch::zeros({3})).ok());
}

TEST_F(MetricsTest, ComposedEffectiveRanksAlongForwardPass) {
  torch::Tensor eye = torch::eye(4);
  torch::Tensor perm = eye.index_select(0, torch::tensor({2, 0, 3, 1}));
  torch::Tensor uniform = torch::full({4, 4}, 0.25);  // mHC's limit U
  auto r = ComposedEffectiveRanks({eye, perm, uniform, eye});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 4u);
  EXPECT_NEAR((*r)[0], 4.0, 1e-9);
  EXPECT_NEAR((*r)[1], 4.0, 1e-9);
  EXPECT_NEAR((*r)[2], 1.0, 1e-6);
  EXPECT_NEAR((*r)[3], 1.0, 1e-6);
  // Long products of scaled maps stay finite (renormalised as they go).
  std::vector<torch::Tensor> many(200, eye * 3.0);
  auto big = ComposedEffectiveRanks(many);
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_NEAR(big->back(), 4.0, 1e-9);
  EXPECT_FALSE(ComposedEffectiveRanks({eye, torch::eye(3)}).ok());
}

TEST_F(MetricsTest, RunningSumShare) {
  torch::Tensor w = torch::tensor({{0.2, 0.8}, {0.6, 0.4}});
  EXPECT_NEAR(*RunningSumShare(w, -1), 0.6, 1e-7);
  EXPECT_NEAR(*RunningSumShare(w, 0), 0.4, 1e-7);
  // Rows need not be normalised: shares 3/4 and 4/10.
  torch::Tensor raw = torch::tensor({{1.0, 3.0}, {6.0, 4.0}});
  EXPECT_NEAR(*RunningSumShare(raw, 1), 0.575, 1e-7);
  auto shares = RunningSumShares({w, raw}, {1, 0});
  ASSERT_TRUE(shares.ok());
  EXPECT_NEAR((*shares)[0], 0.6, 1e-7);
  EXPECT_NEAR((*shares)[1], 0.425, 1e-7);
  EXPECT_FALSE(RunningSumShare(w, 2).ok());
  EXPECT_FALSE(RunningSumShare(-w, 0).ok());
  EXPECT_FALSE(RunningSumShares({w}, {0, 1}).ok());
}

}  // namespace
}  // namespace diagnostics
}  // namespace depthbench
