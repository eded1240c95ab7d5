// CPU tests of the fused causal self-attention (cuda_ops/cpu_fused_attn.cc):
// values and gradients equal the composite (batched GEMMs, softmax with the
// additive mask, by query chunks) evaluated in double, for head dims on the
// vector path (8, 16, 32, 64) and off it (12, 20), lengths 1 to 128, GQA,
// the model's strided q/k/v views and MoDA's depth keys; one and two threads
// give bit-identical results; a finite-difference gradcheck in double; the
// dispatcher takes it for CPU tensors and the composite when disabled; bad
// shapes are named. The same for the packed form with the rotary embedding
// applied inside (CausalAttentionQkv) against RopeRotate + the composite.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "cuda_ops/cpu_fused.h"
#include "cuda_ops/cpu_fused_isa.h"
#include "cuda_ops/ops.h"
#include "tests/cuda_ops/gradcheck.h"
#include "tests/cuda_ops/isa_builds.h"
#include "trainer_core/model/layers.h"

namespace depthbench {
namespace {

using testing::Build;
using testing::BuildName;
using testing::GradCheck;
using testing::kNoWideBuild;
using testing::WideBuilds;
using testing::MaxAbsDiff;

struct AttnCase {
  int64_t B, H, KV, T, hd, S;  // S: depth keys per token (0: none)
};

std::string Describe(const AttnCase& c) {
  return "B=" + std::to_string(c.B) + " H=" + std::to_string(c.H) + " KV=" + std::to_string(c.KV) +
         " T=" + std::to_string(c.T) + " hd=" + std::to_string(c.hd) + " S=" + std::to_string(c.S);
}

// q, k, v as the model makes them: heads split out of [B, T, heads, hd]
// memory (strided views), plus depth keys/values [B, H, T, S, hd].
std::vector<torch::Tensor> Inputs(const AttnCase& c, torch::ScalarType dtype = torch::kFloat32) {
  const auto o = torch::TensorOptions().dtype(dtype);
  std::vector<torch::Tensor> in = {torch::randn({c.B, c.T, c.H, c.hd}, o).transpose(1, 2),
                                   torch::randn({c.B, c.T, c.KV, c.hd}, o).transpose(1, 2),
                                   torch::randn({c.B, c.T, c.KV, c.hd}, o).transpose(1, 2)};
  if (c.S > 0) {
    in.push_back(torch::randn({c.B, c.H, c.T, c.S, c.hd}, o));
    in.push_back(torch::randn({c.B, c.H, c.T, c.S, c.hd}, o));
  } else {
    in.emplace_back();
    in.emplace_back();
  }
  return in;
}

struct Outcome {
  torch::Tensor y;
  std::vector<torch::Tensor> grads;  // q, k, v, depth keys, depth values
};

// Output and gradients of sum(f * probe); the leaves keep the inputs'
// strides (clone preserves them).
Outcome RunAttention(const std::vector<torch::Tensor>& inputs, const torch::Tensor& probe, bool fused) {
  std::vector<torch::Tensor> leaves;
  for (const auto& t : inputs) {
    leaves.push_back(t.defined() ? t.detach().clone().requires_grad_(true) : torch::Tensor());
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(leaves[0].size(3)));
  torch::Tensor y;
  if (fused) {
    y = cpu_fused::CausalAttention(leaves[0], leaves[1], leaves[2], leaves[3], leaves[4], scale);
  } else {
    SetFusedOpsEnabled(false);
    y = CausalAttentionOp(leaves[0], leaves[1], leaves[2], leaves[3], leaves[4], scale);
    SetFusedOpsEnabled(true);
  }
  (y * probe.to(y.scalar_type())).sum().backward();
  Outcome r{y.detach(), {}};
  for (const auto& l : leaves) r.grads.push_back(l.defined() ? l.grad() : torch::Tensor());
  return r;
}

const std::vector<AttnCase>& Cases() {
  static const std::vector<AttnCase> cases = {
      {2, 4, 4, 128, 16, 0},  // the benchmark's head dim, 4 x 32-key blocks
      {1, 2, 2, 1, 16, 0},    // one token
      {2, 4, 2, 33, 32, 0},   // GQA, a partial key block
      {1, 8, 2, 70, 64, 0},   // four query heads per key/value head
      {2, 2, 1, 40, 8, 0},    // head dim 8: one vector
      {2, 3, 3, 19, 12, 0},   // head dim off the vector path
      {1, 2, 2, 65, 20, 0},
      {2, 4, 4, 37, 16, 3},   // MoDA depth keys
      {1, 2, 1, 9, 12, 2},    // depth keys with GQA and a scalar head dim
  };
  return cases;
}

class CpuFusedAttention : public testing::ThreadsTest {};

// run() at the test's thread count and at the other one (1 <-> 2): each
// (batch, key/value head) is one task with a fixed loop order, so the
// outputs and gradients must be bit-identical.
void ExpectSameAtOtherThreadCount(int threads, const std::function<Outcome()>& run) {
  const Outcome here = run();
  const int saved = torch::get_num_threads();
  torch::set_num_threads(threads == 1 ? 2 : 1);
  const Outcome other = run();
  torch::set_num_threads(saved);
  EXPECT_TRUE(torch::equal(here.y, other.y));
  for (size_t i = 0; i < here.grads.size(); ++i) {
    EXPECT_TRUE(torch::equal(here.grads[i], other.grads[i])) << "gradient of input " << i;
  }
}

// The float kernel's output and gradients against the double composite's:
// within y_rel / grad_rel of each tensor's largest magnitude, at least 1
// (with one key the score gradients are exactly zero in double and ~1e-7 in
// float); a gradient is defined in both or in neither.
void ExpectCloseToDouble(const Outcome& fused, const Outcome& ref, double y_rel, double grad_rel) {
  auto tol = [](const torch::Tensor& t, double rel) {
    return rel * std::max(1.0, t.abs().max().item<double>());
  };
  ASSERT_EQ(fused.y.sizes(), ref.y.sizes());
  EXPECT_LE(MaxAbsDiff(fused.y.to(torch::kFloat64), ref.y), tol(ref.y, y_rel)) << "forward";
  ASSERT_EQ(fused.grads.size(), ref.grads.size());
  for (size_t i = 0; i < ref.grads.size(); ++i) {
    ASSERT_EQ(fused.grads[i].defined(), ref.grads[i].defined()) << "input " << i;
    if (!ref.grads[i].defined()) continue;
    ASSERT_EQ(fused.grads[i].sizes(), ref.grads[i].sizes()) << "input " << i;
    EXPECT_LE(MaxAbsDiff(fused.grads[i].to(torch::kFloat64), ref.grads[i]), tol(ref.grads[i], grad_rel))
        << "gradient of input " << i;
  }
}

TEST_P(CpuFusedAttention, EqualsTheCompositeInDouble) {
  torch::manual_seed(80);
  for (const AttnCase& c : Cases()) {
    SCOPED_TRACE(Describe(c));
    std::vector<torch::Tensor> in = Inputs(c);
    torch::Tensor probe = torch::randn({c.B, c.T, c.H * c.hd});
    std::vector<torch::Tensor> in64;
    for (const auto& t : in) in64.push_back(t.defined() ? t.to(torch::kFloat64) : t);
    ExpectCloseToDouble(RunAttention(in, probe, true), RunAttention(in64, probe, false), 2e-6, 1e-5);
  }
}

// Each (batch, key/value head) is one task with a fixed loop order: the
// thread count does not change a bit.
TEST_P(CpuFusedAttention, ThreadCountDoesNotChangeTheResult) {
  torch::manual_seed(81);
  const AttnCase c{3, 4, 2, 50, 16, 2};
  std::vector<torch::Tensor> in = Inputs(c);
  torch::Tensor probe = torch::randn({c.B, c.T, c.H * c.hd});
  ExpectSameAtOtherThreadCount(GetParam(), [&] { return RunAttention(in, probe, true); });
}

INSTANTIATE_TEST_SUITE_P(Threads, CpuFusedAttention, ::testing::Values(1, 2),
                         [](const auto& info) { return "threads" + std::to_string(info.param); });

TEST(CpuFusedAttentionGradcheck, SequenceGqaAndDepthKeys) {
  torch::manual_seed(82);
  for (const AttnCase& c : {AttnCase{1, 2, 1, 5, 4, 0}, AttnCase{2, 2, 2, 4, 8, 2}}) {
    SCOPED_TRACE(Describe(c));
    std::vector<torch::Tensor> in = Inputs(c, torch::kFloat64), leaves;
    for (const auto& t : in) {
      // Contiguous: GradCheck perturbs the inputs through a flat view.
      if (t.defined()) leaves.push_back(t.detach().contiguous().requires_grad_(true));
    }
    const bool depth = c.S > 0;
    EXPECT_EQ(GradCheck([depth](const auto& x) {
                return cpu_fused::CausalAttention(x[0], x[1], x[2], depth ? x[3] : torch::Tensor(),
                                                  depth ? x[4] : torch::Tensor(), 0.7);
              }, leaves),
              "");
  }
}

// A wider build's outputs a against the baseline build's g: FMA contracts
// a*b+c into one rounding, so equal up to float rounding.
void ExpectBuildsAgree(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& g) {
  ASSERT_EQ(a.size(), g.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_LE(MaxAbsDiff(a[i], g[i]), 1e-5 * g[i].abs().max().item<double>() + 1e-7) << "tensor " << i;
  }
}

TEST(CpuFusedAttentionIsa, WideAndBaselineBuildsAgree) {
  const std::vector<Build> wide = WideBuilds();
  if (wide.empty()) GTEST_SKIP() << kNoWideBuild;
  torch::manual_seed(83);
  for (const AttnCase& c : {AttnCase{2, 4, 2, 45, 16, 0}, AttnCase{1, 2, 2, 20, 12, 2}}) {
    SCOPED_TRACE(Describe(c));
    std::vector<torch::Tensor> in = Inputs(c);
    torch::Tensor probe = torch::randn({c.B, c.T, c.H * c.hd});
    auto run = [&](Build b) {
      std::vector<torch::Tensor> l;
      for (const auto& t : in) l.push_back(t.defined() ? t.clone().requires_grad_(true) : t);
      torch::Tensor y = DB_BUILD_CALL(b, CausalAttention, l[0], l[1], l[2], l[3], l[4], 0.25);
      (y * probe).sum().backward();
      std::vector<torch::Tensor> out = {y.detach()};
      for (const auto& t : l) {
        if (t.defined()) out.push_back(t.grad());
      }
      return out;
    };
    for (Build b : wide) {
      SCOPED_TRACE(BuildName(b));
      ExpectBuildsAgree(run(b), run(Build::kGeneric));
    }
  }
}

TEST(CpuFusedAttentionDispatch, OpUsesTheKernelOnCpuAndTheCompositeWhenDisabled) {
  torch::manual_seed(84);
  const AttnCase c{2, 4, 2, 70, 16, 0};
  std::vector<torch::Tensor> in = Inputs(c);
  const double scale = 0.25;
  EXPECT_TRUE(torch::equal(CausalAttentionOp(in[0], in[1], in[2], {}, {}, scale),
                           cpu_fused::CausalAttention(in[0], in[1], in[2], {}, {}, scale)));
  // Empty depth lists (a MoDA layer with no earlier sub-layers) are no depth.
  torch::Tensor none = torch::empty({c.B, c.H, c.T, 0, c.hd});
  EXPECT_TRUE(torch::equal(CausalAttentionOp(in[0], in[1], in[2], none, none, scale),
                           cpu_fused::CausalAttention(in[0], in[1], in[2], {}, {}, scale)));
  EXPECT_NE(FusedOpsDescription().find("causal attention"), std::string::npos)
      << FusedOpsDescription();
  SetFusedOpsEnabled(false);
  torch::Tensor composite = CausalAttentionOp(in[0], in[1], in[2], {}, {}, scale);
  SetFusedOpsEnabled(true);
  EXPECT_FALSE(torch::equal(composite, cpu_fused::CausalAttention(in[0], in[1], in[2], {}, {}, scale)))
      << "the composite sums in another order; equal bits would mean it did not run";
  EXPECT_LE(MaxAbsDiff(composite, cpu_fused::CausalAttention(in[0], in[1], in[2], {}, {}, scale)), 1e-5);
}

TEST(CpuFusedAttentionDispatch, BadShapesAreRejectedWithTheFieldNamed) {
  auto expect_error = [](const std::function<void()>& f, const std::string& want) {
    try {
      f();
      FAIL() << "no error, expected " << want;
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  torch::Tensor q = torch::randn({2, 4, 10, 8}), kv = torch::randn({2, 2, 10, 8});
  expect_error([&] { CausalAttentionOp(q.flatten(2), kv, kv, {}, {}, 1.0); },
               "CausalAttentionOp: q, k and v");
  expect_error([&] { CausalAttentionOp(q, torch::randn({2, 3, 10, 8}), torch::randn({2, 3, 10, 8}), {}, {}, 1.0); },
               "CausalAttentionOp: k");
  expect_error([&] { CausalAttentionOp(q, kv, torch::randn({2, 2, 10, 4}), {}, {}, 1.0); },
               "CausalAttentionOp: k");
  expect_error([&] { CausalAttentionOp(q, kv, kv, torch::randn({2, 4, 10, 2, 8}), {}, 1.0); },
               "CausalAttentionOp: depth keys and values");
  expect_error([&] {
    torch::Tensor d = torch::randn({2, 4, 9, 2, 8});
    CausalAttentionOp(q, kv, kv, d, d, 1.0);
  }, "CausalAttentionOp: depth keys");
  expect_error([&] { cpu_fused::CausalAttention(q, kv.narrow(3, 0, 4), kv.narrow(3, 0, 4), {}, {}, 1.0); },
               "CausalAttention: k");
}

// The packed form: qkv [B, T, H + 2 KV, hd] with rope tables [T, hd] and
// S depth slots of keys and values.
struct QkvInputs {
  torch::Tensor qkv, cos, sin;
  std::vector<torch::Tensor> dk, dv;
};

// The model's tables (trainer_core's Rope) or random ones: any values without
// depth slots, random rotations with them.
QkvInputs MakeQkv(const AttnCase& c, bool model_tables, torch::ScalarType dtype = torch::kFloat32) {
  const auto o = torch::TensorOptions().dtype(dtype);
  QkvInputs in;
  in.qkv = torch::randn({c.B, c.T, c.H + 2 * c.KV, c.hd}, o);
  if (model_tables) {
    const Rope rope(c.hd, c.T + 5);
    rope.Tables(c.T, in.qkv, &in.cos, &in.sin);
  } else if (c.S > 0) {
    // Random angles: still a rotation, which the depth keys' equivalence
    // (unrotated keys against the unrotated query) needs.
    torch::Tensor angles = torch::rand({c.T, c.hd / 2}, o) * 6.3;
    in.cos = torch::cat({angles, angles}, -1).cos();
    in.sin = torch::cat({-angles.sin(), angles.sin()}, -1);
  } else {
    // Any tables at all: the kernel applies x cos + swap(x) sin.
    in.cos = torch::randn({c.T, c.hd}, o);
    in.sin = torch::randn({c.T, c.hd}, o);
  }
  // Slots as MoDA makes them: key/value-head views of a [B, T, heads, hd]
  // projection, alternating with query-head slots (contiguous).
  for (int64_t j = 0; j < c.S; ++j) {
    for (auto* list : {&in.dk, &in.dv}) {
      list->push_back(j % 2 == 0 ? torch::randn({c.B, c.T, c.KV, c.hd}, o).transpose(1, 2)
                                 : torch::randn({c.B, c.H, c.T, c.hd}, o));
    }
  }
  return in;
}

QkvInputs ToDouble(const QkvInputs& in) {
  auto d = [](const torch::Tensor& t) { return t.to(torch::kFloat64); };
  QkvInputs out{d(in.qkv), d(in.cos), d(in.sin), {}, {}};
  for (const auto& t : in.dk) out.dk.push_back(d(t));
  for (const auto& t : in.dv) out.dv.push_back(d(t));
  return out;
}

// Output and the gradients of qkv and every depth slot; fused: the kernel,
// else the op with fused ops disabled (RopeRotate, the slots stacked with
// their keys rotated, and the composite). The slots also come back passed
// through (MoDA's later layers read those) and are probed again: their
// gradients must join the slots' (the composite returns the slots
// themselves, for autograd to add).
Outcome RunQkv(const AttnCase& c, const QkvInputs& in, const torch::Tensor& probe, bool fused) {
  // Leaves keep the inputs' strides (clone preserves them).
  auto leaf = [](const torch::Tensor& t) { return t.detach().clone().requires_grad_(true); };
  torch::Tensor qkv = leaf(in.qkv);
  std::vector<torch::Tensor> dk, dv;
  for (const auto& t : in.dk) dk.push_back(leaf(t));
  for (const auto& t : in.dv) dv.push_back(leaf(t));
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.hd));
  // With MoDA's own keys and values returned and used (probed) too.
  torch::Tensor y;
  std::pair<torch::Tensor, torch::Tensor> own;
  DepthSlotLists passed;
  if (fused) {
    std::vector<torch::Tensor> r =
        cpu_fused::CausalAttentionQkv(qkv, c.H, c.KV, in.cos, in.sin, dk, dv, scale, true, true);
    y = r[0];
    own = {r[1], r[2]};
    passed.first.assign(r.begin() + 3, r.begin() + 3 + c.S);
    passed.second.assign(r.begin() + 3 + c.S, r.end());
  } else {
    SetFusedOpsEnabled(false);
    y = CausalAttentionQkvOp(qkv, c.H, c.KV, in.cos, in.sin, dk, dv, scale, &own, &passed);
    SetFusedOpsEnabled(true);
  }
  // Position-dependent probes of the returned k and v, and of the passed
  // slots (slot 1's values left unread: autograd hands the backward zeros).
  torch::Tensor pk = torch::arange(c.T, torch::kFloat64).div(c.T).view({1, 1, c.T, 1});
  torch::Tensor loss = (y * probe.to(y.scalar_type())).sum() +
                       (own.first * pk.to(y.scalar_type())).sum() +
                       (own.second * (1 - pk).to(y.scalar_type())).sum();
  EXPECT_EQ(static_cast<int64_t>(passed.first.size()), c.S);
  for (int64_t j = 0; j < c.S; ++j) {
    loss = loss + (passed.first[j] * (pk + j).to(y.scalar_type())).sum();
    if (j != 1) loss = loss + (passed.second[j] * (2 - pk).to(y.scalar_type())).sum();
  }
  loss.backward();
  Outcome r{y.detach(), {qkv.grad()}};
  for (const auto& t : dk) r.grads.push_back(t.grad());
  for (const auto& t : dv) r.grads.push_back(t.grad());
  return r;
}

class CpuFusedAttentionQkv : public testing::ThreadsTest {};

TEST_P(CpuFusedAttentionQkv, EqualsRopeThenTheCompositeInDouble) {
  torch::manual_seed(85);
  for (const AttnCase& c : Cases()) {
    if (c.hd % 2 != 0) continue;
    for (bool model_tables : {true, false}) {
      SCOPED_TRACE(Describe(c) + (model_tables ? " model tables" : " random tables"));
      const QkvInputs in = MakeQkv(c, model_tables);
      torch::Tensor probe = torch::randn({c.B, c.T, c.H * c.hd});
      ExpectCloseToDouble(RunQkv(c, in, probe, true), RunQkv(c, ToDouble(in), probe, false), 4e-6,
                          2e-5);
    }
  }
}

TEST_P(CpuFusedAttentionQkv, ThreadCountDoesNotChangeTheResult) {
  torch::manual_seed(86);
  const AttnCase c{3, 4, 2, 50, 16, 2};
  const QkvInputs in = MakeQkv(c, true);
  torch::Tensor probe = torch::randn({c.B, c.T, c.H * c.hd});
  ExpectSameAtOtherThreadCount(GetParam(), [&] { return RunQkv(c, in, probe, true); });
}

INSTANTIATE_TEST_SUITE_P(Threads, CpuFusedAttentionQkv, ::testing::Values(1, 2),
                         [](const auto& info) { return "threads" + std::to_string(info.param); });

TEST(CpuFusedAttentionQkvCheck, GradcheckWithRandomTables) {
  torch::manual_seed(87);
  for (const AttnCase& c : {AttnCase{1, 2, 1, 5, 4, 0}, AttnCase{2, 2, 2, 4, 8, 2}}) {
    SCOPED_TRACE(Describe(c));
    const QkvInputs in = MakeQkv(c, false, torch::kFloat64);
    // Contiguous leaves: GradCheck perturbs the inputs through a flat view.
    std::vector<torch::Tensor> leaves = {in.qkv.detach().clone().requires_grad_(true)};
    for (const auto* list : {&in.dk, &in.dv}) {
      for (const auto& t : *list) leaves.push_back(t.detach().contiguous().requires_grad_(true));
    }
    const size_t S = in.dk.size();
    EXPECT_EQ(GradCheck([&](const auto& x) {
                const std::vector<torch::Tensor> dk(x.begin() + 1, x.begin() + 1 + S),
                    dv(x.begin() + 1 + S, x.end());
                // With the slots passed through and read again, scaled per
                // slot (their gradients join the slots').
                std::vector<torch::Tensor> r =
                    cpu_fused::CausalAttentionQkv(x[0], c.H, c.KV, in.cos, in.sin, dk, dv, 0.7, false, true);
                std::vector<torch::Tensor> parts = {r[0].flatten()};
                for (size_t j = 1; j < r.size(); ++j) parts.push_back(r[j].flatten() * (0.5 * j));
                return torch::cat(parts);
              }, leaves),
              "");
  }
}

TEST(CpuFusedAttentionQkvCheck, WideAndBaselineBuildsAgree) {
  const std::vector<Build> wide = WideBuilds();
  if (wide.empty()) GTEST_SKIP() << kNoWideBuild;
  torch::manual_seed(88);
  for (const AttnCase& c : {AttnCase{2, 4, 2, 45, 16, 0}, AttnCase{1, 2, 2, 20, 12, 2}}) {
    SCOPED_TRACE(Describe(c));
    const QkvInputs in = MakeQkv(c, true);
    torch::Tensor probe = torch::randn({c.B, c.T, c.H * c.hd});
    auto run = [&](Build b) {
      torch::Tensor qkv = in.qkv.clone().requires_grad_(true);
      torch::Tensor y = DB_BUILD_CALL(b, CausalAttentionQkv, qkv, c.H, c.KV, in.cos, in.sin, in.dk,
                                      in.dv, 0.25, false, false)[0];
      (y * probe).sum().backward();
      return std::vector<torch::Tensor>{y.detach(), qkv.grad()};
    };
    for (Build b : wide) {
      SCOPED_TRACE(BuildName(b));
      ExpectBuildsAgree(run(b), run(Build::kGeneric));
    }
  }
}

// The packed op equals the rotation as separate ops followed by the
// unpacked kernel (the model's earlier path), and takes the composite when
// fused ops are off.
TEST(CpuFusedAttentionQkvCheck, OpUsesTheKernelAndMatchesRotateThenAttend) {
  torch::manual_seed(89);
  const AttnCase c{2, 4, 2, 70, 16, 0};
  const QkvInputs in = MakeQkv(c, true);
  const double scale = 0.25;
  torch::Tensor packed = CausalAttentionQkvOp(in.qkv, c.H, c.KV, in.cos, in.sin, {}, {}, scale);
  EXPECT_TRUE(torch::equal(packed, cpu_fused::CausalAttentionQkv(in.qkv, c.H, c.KV, in.cos, in.sin,
                                                                 {}, {}, scale)[0]));
  // MoDA's own slots: the unrotated keys and the values, as views of qkv
  // (no copies).
  std::pair<torch::Tensor, torch::Tensor> own;
  EXPECT_TRUE(torch::equal(CausalAttentionQkvOp(in.qkv, c.H, c.KV, in.cos, in.sin, {}, {}, scale, &own),
                           packed));
  EXPECT_TRUE(torch::equal(own.first, in.qkv.narrow(2, c.H, c.KV).transpose(1, 2)));
  EXPECT_TRUE(torch::equal(own.second, in.qkv.narrow(2, c.H + c.KV, c.KV).transpose(1, 2)));
  EXPECT_EQ(own.first.data_ptr(), in.qkv.narrow(2, c.H, c.KV).data_ptr());
  EXPECT_EQ(own.second.data_ptr(), in.qkv.narrow(2, c.H + c.KV, c.KV).data_ptr());
  EXPECT_EQ(own.first.strides(), in.qkv.narrow(2, c.H, c.KV).transpose(1, 2).strides());
  // A depth slot of another dtype (a skipped MoDA block's zeros beside
  // autocast projections) takes the composite, cast to qkv's dtype.
  const AttnCase cd{2, 4, 2, 20, 16, 2};
  const QkvInputs dq = MakeQkv(cd, true);
  std::vector<torch::Tensor> mixed = {dq.dk[0], dq.dk[1].to(torch::kFloat64)};
  torch::Tensor y_mixed = CausalAttentionQkvOp(dq.qkv, cd.H, cd.KV, dq.cos, dq.sin, mixed, dq.dv, scale);
  EXPECT_LE(MaxAbsDiff(y_mixed, CausalAttentionQkvOp(dq.qkv, cd.H, cd.KV, dq.cos, dq.sin, dq.dk, dq.dv,
                                                     scale)),
            1e-5);
  torch::Tensor q = RopeRotate(in.qkv.narrow(2, 0, c.H).transpose(1, 2), in.cos, in.sin);
  torch::Tensor k = RopeRotate(in.qkv.narrow(2, c.H, c.KV).transpose(1, 2), in.cos, in.sin);
  torch::Tensor v = in.qkv.narrow(2, c.H + c.KV, c.KV).transpose(1, 2);
  EXPECT_LE(MaxAbsDiff(packed, cpu_fused::CausalAttention(q, k, v, {}, {}, scale)), 1e-5);
  EXPECT_NE(FusedOpsDescription().find("RoPE on the packed"), std::string::npos)
      << FusedOpsDescription();
  SetFusedOpsEnabled(false);
  torch::Tensor composite = CausalAttentionQkvOp(in.qkv, c.H, c.KV, in.cos, in.sin, {}, {}, scale);
  SetFusedOpsEnabled(true);
  EXPECT_FALSE(torch::equal(composite, packed))
      << "the composite sums in another order; equal bits would mean it did not run";
  EXPECT_LE(MaxAbsDiff(composite, packed), 1e-5);
}

TEST(CpuFusedAttentionQkvCheck, BadShapesAreRejectedWithTheFieldNamed) {
  auto expect_error = [](const std::function<void()>& f, const std::string& want) {
    try {
      f();
      FAIL() << "no error, expected " << want;
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  torch::Tensor qkv = torch::randn({2, 10, 8, 8}), cs = torch::randn({10, 8});
  expect_error([&] { CausalAttentionQkvOp(qkv, 4, 3, cs, cs, {}, {}, 1.0); },
               "CausalAttentionQkvOp: heads (4) must be a positive multiple of kv_heads (3)");
  expect_error([&] { CausalAttentionQkvOp(qkv, 2, 2, cs, cs, {}, {}, 1.0); },
               "CausalAttentionQkvOp: qkv needs [B, T, heads + 2 kv_heads = 6");
  expect_error([&] { CausalAttentionQkvOp(qkv.narrow(3, 0, 7), 4, 2, cs.narrow(1, 0, 7), cs.narrow(1, 0, 7), {}, {}, 1.0); },
               "CausalAttentionQkvOp: the rotary embedding needs an even head_dim");
  expect_error([&] { CausalAttentionQkvOp(qkv, 4, 2, cs.narrow(0, 0, 9), cs.narrow(0, 0, 9), {}, {}, 1.0); },
               "CausalAttentionQkvOp: cos [9, 8] and sin [9, 8] must be [T = 10");
  expect_error([&] { CausalAttentionQkvOp(qkv, 4, 2, cs.to(torch::kFloat64), cs.to(torch::kFloat64), {}, {}, 1.0); },
               "CausalAttentionQkvOp: cos and sin must have qkv's dtype");
  expect_error([&] {
    torch::Tensor t = cs.clone().requires_grad_(true);
    cpu_fused::CausalAttentionQkv(qkv, 4, 2, t, t, {}, {}, 1.0);
  }, "CausalAttentionQkv: cos and sin are tables");
  expect_error([&] {
    torch::Tensor d = torch::randn({2, 4, 9, 8});
    CausalAttentionQkvOp(qkv, 4, 2, cs, cs, {d}, {d}, 1.0);
  }, "CausalAttentionQkvOp: depth key slot 0 has [2, 4, 9, 8], expected [B = 2, heads 4 or kv_heads 2, T = 10");
  expect_error([&] {
    torch::Tensor d = torch::randn({2, 3, 10, 8});
    CausalAttentionQkvOp(qkv, 4, 2, cs, cs, {d}, {d}, 1.0);
  }, "CausalAttentionQkvOp: depth key slot 0");
  expect_error([&] {
    torch::Tensor d = torch::randn({2, 2, 10, 8});
    CausalAttentionQkvOp(qkv, 4, 2, cs, cs, {d, d}, {d}, 1.0);
  }, "CausalAttentionQkvOp: 2 depth key slots but 1 value slots");
  expect_error([&] {
    torch::Tensor d = torch::randn({2, 2, 10, 8});
    cpu_fused::CausalAttentionQkv(qkv, 4, 2, cs, cs, {d}, {d.to(torch::kFloat64)}, 1.0);
  }, "CausalAttentionQkv: depth slot 0 has dtypes Float / Double, qkv Float");
}

}  // namespace
}  // namespace depthbench
