// CPU tests of the fused multi-stream kernels (cuda_ops/cpu_fused.h: HC/mHC
// routing projection, coefficients, read and write, Sinkhorn, AttnRes mix):
// values and gradients equal the composite references (autograd through
// them) and the hand-written backward formulas the CUDA kernels implement
// (reference::*Backward), on one and two threads, odd sizes and the model's broadcast (expanded) streams; a
// finite-difference gradcheck of each in double; the dispatcher takes them
// for CPU float tensors and falls back to the references when disabled, for
// bf16 and for Sinkhorn logits too large for the exp domain.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

#include "cuda_ops/cpu_fused.h"
#include "cuda_ops/cpu_fused_isa.h"
#include "cuda_ops/cpu_gemm.h"
#include "cuda_ops/ops.h"
#include "cuda_ops/reference.h"
#include "tests/cuda_ops/gradcheck.h"
#include "tests/cuda_ops/isa_builds.h"

namespace depthbench {
namespace {

using testing::AllClose;
using testing::Build;
using testing::BuildName;
using testing::kNoWideBuild;
using testing::WideBuilds;
using testing::GradCheck;
using testing::MaxAbsDiff;
using testing::ThreadsTest;

using Fn = std::function<torch::Tensor(const std::vector<torch::Tensor>&)>;

// Output and gradients of sum(f(inputs) * probe) w.r.t. every defined input.
struct Outcome {
  torch::Tensor y;
  std::vector<torch::Tensor> grads;
};
Outcome Evaluate(const Fn& f, const std::vector<torch::Tensor>& inputs, const torch::Tensor& probe) {
  std::vector<torch::Tensor> leaves;
  for (const auto& t : inputs) {
    leaves.push_back(t.defined() ? t.detach().clone().requires_grad_(true) : torch::Tensor());
  }
  torch::Tensor y = f(leaves);
  (y * probe).sum().backward();
  Outcome r{y.detach(), {}};
  for (const auto& l : leaves) r.grads.push_back(l.defined() ? l.grad() : torch::Tensor());
  return r;
}

void ExpectSame(const Outcome& fused, const Outcome& ref, double rtol, double atol, const std::string& what) {
  EXPECT_TRUE(AllClose(fused.y, ref.y, rtol, atol))
      << what << " forward, max abs diff " << MaxAbsDiff(fused.y, ref.y);
  ASSERT_EQ(fused.grads.size(), ref.grads.size());
  for (size_t i = 0; i < ref.grads.size(); ++i) {
    if (!ref.grads[i].defined()) continue;
    ASSERT_TRUE(fused.grads[i].defined()) << what << " input " << i << " has no gradient";
    EXPECT_TRUE(AllClose(fused.grads[i], ref.grads[i], rtol, atol))
        << what << " gradient of input " << i << ", max abs diff "
        << MaxAbsDiff(fused.grads[i], ref.grads[i]);
  }
}

// ---- HC read / write ----

class CpuFusedHc : public ThreadsTest {};

TEST_P(CpuFusedHc, ReadAndWriteEqualTheReference) {
  torch::manual_seed(10 + GetParam());
  // (B, T, n, d): the model's n = 4 at d = 128 with 1k tokens (several
  // parallel chunks), n = 2 and an odd n = 3 / d = 33.
  const std::vector<std::vector<int64_t>> shapes = {{2, 512, 4, 128}, {3, 5, 2, 16}, {2, 7, 3, 33}};
  for (const auto& sh : shapes) {
    const int64_t B = sh[0], T = sh[1], n = sh[2], d = sh[3];
    SCOPED_TRACE(::testing::Message() << "B=" << B << " T=" << T << " n=" << n << " d=" << d);
    for (bool broadcast : {false, true}) {
      // broadcast: the first block's streams, the embedding expanded n times
      // inside the differentiated function (as HcDesign::Begin does).
      torch::Tensor h = broadcast ? torch::randn({B, T, 1, d}) : torch::randn({B, T, n, d});
      auto H = [=](const torch::Tensor& t) { return broadcast ? t.expand({B, T, n, d}) : t; };
      torch::Tensor read = torch::rand({B, T, n});
      torch::Tensor a = torch::randn({B, T, n, n}) * 0.5, b = torch::rand({B, T, n}) + 0.5;
      torch::Tensor y = torch::randn({B, T, d});
      torch::Tensor probe_x = torch::randn({B, T, d}), probe_h = torch::randn({B, T, n, d});
      ExpectSame(Evaluate([=](auto& in) { return cpu_fused::HcRead(H(in[0]), in[1]); }, {h, read}, probe_x),
                 Evaluate([=](auto& in) { return reference::HcRead(H(in[0]), in[1]); }, {h, read}, probe_x),
                 1e-5, 1e-5, "HcRead");
      ExpectSame(Evaluate([=](auto& in) { return cpu_fused::HcWrite(H(in[0]), in[1], in[2], in[3]); },
                          {h, a, b, y}, probe_h),
                 Evaluate([=](auto& in) { return reference::HcWrite(H(in[0]), in[1], in[2], in[3]); },
                          {h, a, b, y}, probe_h),
                 1e-5, 1e-5, "HcWrite");
      // The HC code form: identity residual map.
      ExpectSame(
          Evaluate([=](auto& in) { return cpu_fused::HcWrite(H(in[0]), torch::Tensor(), in[1], in[2]); },
                   {h, b, y}, probe_h),
          Evaluate([=](auto& in) { return reference::HcWrite(H(in[0]), torch::Tensor(), in[1], in[2]); },
                   {h, b, y}, probe_h),
          1e-5, 1e-5, "HcWrite identity");
    }
  }
}

TEST_P(CpuFusedHc, GradientsEqualTheHandWrittenReferenceBackward) {
  // reference::Hc*Backward is the math hc_connector.cu implements.
  torch::manual_seed(20 + GetParam());
  const int64_t B = 2, T = 9, n = 4, d = 40;
  torch::Tensor h = torch::randn({B, T, n, d}), read = torch::rand({B, T, n});
  torch::Tensor a = torch::randn({B, T, n, n}), b = torch::rand({B, T, n});
  torch::Tensor y = torch::randn({B, T, d});
  torch::Tensor gx = torch::randn({B, T, d}), gh = torch::randn({B, T, n, d});
  Outcome r = Evaluate([](auto& in) { return cpu_fused::HcRead(in[0], in[1]); }, {h, read}, gx);
  reference::HcReadGrads rg = reference::HcReadBackward(gx, h, read);
  EXPECT_TRUE(AllClose(r.grads[0], rg.dh, 1e-5, 1e-5));
  EXPECT_TRUE(AllClose(r.grads[1], rg.dread, 1e-5, 1e-5));
  Outcome w = Evaluate([](auto& in) { return cpu_fused::HcWrite(in[0], in[1], in[2], in[3]); },
                   {h, a, b, y}, gh);
  reference::HcWriteGrads wg = reference::HcWriteBackward(gh, h, a, b, y);
  EXPECT_TRUE(AllClose(w.grads[0], wg.dh, 1e-5, 1e-5));
  EXPECT_TRUE(AllClose(w.grads[1], wg.da, 1e-5, 1e-5));
  EXPECT_TRUE(AllClose(w.grads[2], wg.db, 1e-5, 1e-5));
  EXPECT_TRUE(AllClose(w.grads[3], wg.dy, 1e-5, 1e-5));
}

INSTANTIATE_TEST_SUITE_P(Threads, CpuFusedHc, ::testing::Values(1, 2),
                         [](const auto& info) { return "threads" + std::to_string(info.param); });

// ---- routing projection ----

class CpuFusedRmsProject : public ThreadsTest {};

// The composite it replaces: affine-free RMS normalisation, then the matmul.
torch::Tensor RmsProjectComposite(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  return torch::matmul(reference::RmsNorm(x, torch::ones({x.size(-1)}, x.options()), eps), w);
}

TEST_P(CpuFusedRmsProject, EqualsNormaliseThenMatmul) {
  torch::manual_seed(30 + GetParam());
  // (rows shape, K, m): HC's per-stream form at d = 128 (m = n + 2), mHC's
  // flattened n*d form (m = n^2 + 2n) over 1k tokens, odd sizes; K = 48 and
  // 40 with odd m and a partial last group of rows take the register-blocked
  // float paths (K a multiple of 16: both ways; of 8: the forward only).
  struct Case {
    std::vector<int64_t> lead;
    int64_t k, m;
  };
  const std::vector<Case> cases = {
      {{2, 512, 4}, 128, 6}, {{2, 512}, 512, 24}, {{3, 7}, 33, 5}, {{5}, 1, 1},
      {{3, 9}, 48, 5},       {{2, 5}, 40, 3}};
  for (const auto& c : cases) {
    std::vector<int64_t> xs = c.lead;
    xs.push_back(c.k);
    std::vector<int64_t> us = c.lead;
    us.push_back(c.m);
    SCOPED_TRACE(::testing::Message() << "K=" << c.k << " m=" << c.m);
    torch::Tensor x = torch::randn(xs) * 3, w = torch::randn({c.k, c.m}) * 0.1;
    torch::Tensor probe = torch::randn(us);
    // Against the composite in double: dw sums up to 4k rows (entries up to
    // ~60) in float GEMMs, as the float composite does, whose rounding is
    // ~1e-6 of the sum.
    ExpectSame(Evaluate([](auto& in) { return cpu_fused::RmsProject(in[0], in[1], 1e-6); }, {x, w}, probe),
               Evaluate([](auto& in) {
                 return RmsProjectComposite(in[0].to(torch::kFloat64), in[1].to(torch::kFloat64), 1e-6)
                     .to(torch::kFloat32);
               }, {x, w}, probe),
               1e-4, 2e-4, "RmsProject");
  }
  // The model's broadcast first-block streams and a transposed (strided) w.
  torch::Tensor e = torch::randn({2, 9, 1, 16}), wt = torch::randn({6, 16});
  torch::Tensor probe = torch::randn({2, 9, 4, 6});
  ExpectSame(Evaluate([](auto& in) { return cpu_fused::RmsProject(in[0].expand({2, 9, 4, 16}), in[1].t(), 1e-6); },
                      {e, wt}, probe),
             Evaluate([](auto& in) { return RmsProjectComposite(in[0].expand({2, 9, 4, 16}), in[1].t(), 1e-6); },
                      {e, wt}, probe),
             1e-5, 1e-5, "RmsProject broadcast");
}

INSTANTIATE_TEST_SUITE_P(Threads, CpuFusedRmsProject, ::testing::Values(1, 2),
                         [](const auto& info) { return "threads" + std::to_string(info.param); });

// ---- HC / mHC coefficients ----

// Runs f with the fused ops on (the CPU kernels) or off (the composites).
torch::Tensor WithFused(bool on, const std::function<torch::Tensor()>& f) {
  SetFusedOpsEnabled(on);
  torch::Tensor out = f();
  SetFusedOpsEnabled(true);
  return out;
}

class CpuFusedCoefficients : public ThreadsTest {};

TEST_P(CpuFusedCoefficients, EqualTheComposites) {
  torch::manual_seed(40 + GetParam());
  for (int64_t n : {4, 2, 3}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    const int64_t B = 2, T = n == 4 ? 512 : 7;
    torch::Tensor u = torch::randn({B, T, n, n + 2}) * 2;
    torch::Tensor sa = torch::randn({n, n + 1}), sb = torch::randn({n});
    torch::Tensor ga = torch::rand({1}) + 0.1, gb = torch::rand({1}) + 0.1;
    torch::Tensor pa = torch::randn({B, T, n, n + 1}), pb = torch::randn({B, T, n});
    // Both outputs into one probe; then only b (a's gradient arrives undefined).
    for (bool only_b : {false, true}) {
      auto f = [&](bool on) {
        return [=](auto& in) {
          return WithFused(on, [&] {
            HcCoefficientTensors c = HcCoefficientsOp(in[0], in[1], in[2], in[3], in[4]);
            torch::Tensor y = (c.b * pb).sum(-1, true);
            return only_b ? y : y + (c.a * pa).sum({-2, -1}).unsqueeze(-1);
          });
        };
      };
      torch::Tensor probe = torch::randn({B, T, 1});
      ExpectSame(Evaluate(f(true), {u, sa, sb, ga, gb}, probe),
                 Evaluate(f(false), {u, sa, sb, ga, gb}, probe), 1e-4, 1e-4, "HcCoefficients");
    }
    const int64_t m = n * n + 2 * n;
    torch::Tensor um = torch::randn({B, T, m}) * 2;
    torch::Tensor gains = torch::rand({3}) + 0.1, bias = torch::randn({m});
    torch::Tensor pr = torch::randn({B, T, n}), pw = torch::randn({B, T, n}), pl = torch::randn({B, T, n, n});
    for (int skip = -1; skip < 3; ++skip) {  // every output, then each left out in turn
      auto f = [&](bool on) {
        return [=](auto& in) {
          return WithFused(on, [&] {
            MhcCoefficientTensors c = MhcCoefficientsOp(in[0], in[1], in[2], n);
            torch::Tensor y = torch::zeros({B, T});
            if (skip != 0) y = y + (c.read * pr).sum(-1);
            if (skip != 1) y = y + (c.write * pw).sum(-1);
            if (skip != 2) y = y + (c.logits * pl).sum({-2, -1});
            return y;
          });
        };
      };
      torch::Tensor probe = torch::randn({B, T});
      ExpectSame(Evaluate(f(true), {um, gains, bias}, probe), Evaluate(f(false), {um, gains, bias}, probe),
                 1e-4, 1e-4, "MhcCoefficients");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, CpuFusedCoefficients, ::testing::Values(1, 2),
                         [](const auto& info) { return "threads" + std::to_string(info.param); });

// HC's coefficients take tanh 8 lanes at a time (Tanh8: a polynomial below
// |u| = 0.625, exp-based above): with zero static part and unit gain, a is
// tanh(u) itself, which must match libm's in double to float precision over
// the whole range: zero, tiny, both sides of the switch, saturated, and the
// partial last vector of a row count that is not a multiple of 8.
TEST(CpuFusedCoefficientsRange, TanhOverItsWholeRange) {
  const int64_t n = 3, m = n + 2;
  std::vector<float> values = {0.0f,  -0.0f,   1e-30f, -1e-20f, 1e-4f,   -0.3f,  0.6249f,
                               0.625f, -0.6251f, 0.9f,   -2.0f,   5.0f,    -9.0f,  20.0f,
                               -45.0f, 88.0f,   -100.0f, 1e30f};
  for (int i = 0; i <= 400; ++i) values.push_back(-20.0f + 0.1f * static_cast<float>(i));
  while (values.size() % (n * m) != 0) values.push_back(0.37f);
  const int64_t rows = static_cast<int64_t>(values.size()) / (n * m);
  torch::Tensor u = torch::tensor(values).view({rows, n, m});
  std::vector<torch::Tensor> ab = cpu_fused::HcCoefficients(u, torch::zeros({n, n + 1}), torch::zeros({n}),
                                                            torch::ones({1}), torch::ones({1}));
  torch::Tensor got = torch::cat({ab[0], ab[1].unsqueeze(-1)}, -1).to(torch::kFloat64);
  torch::Tensor want = torch::tanh(u.to(torch::kFloat64));
  torch::Tensor err = (got - want).abs() / want.abs().clamp_min(1e-30);
  EXPECT_LE(err.max().item<double>(), 3e-7) << "worst at u = "
                                           << u.flatten()[err.flatten().argmax()].item<float>();
  EXPECT_TRUE(torch::equal(got.sign(), want.sign()));
}

// ---- mHC route: projection, coefficients and read as one function ----

const auto kF64 = torch::TensorOptions().dtype(torch::kFloat64);

// The route's projections to test: the fused loops always, oneDNN's GEMMs
// where this build and environment use oneDNN (cpu_gemm::Enabled(); the
// build installs libdnnl-dev, scripts/setup.sh).
std::vector<cpu_fused::RouteProjection> RouteProjections() {
  std::vector<cpu_fused::RouteProjection> p = {cpu_fused::RouteProjection::kFused};
  if (cpu_gemm::Enabled()) p.push_back(cpu_fused::RouteProjection::kGemm);
  return p;
}
const char* ProjectionName(cpu_fused::RouteProjection p) {
  return p == cpu_fused::RouteProjection::kGemm ? "GEMM projection" : "fused projection";
}

class CpuFusedMhcRoute : public ThreadsTest {};

// MhcRouteOp's CPU function equals the three ops it fuses (RmsProjectOp,
// MhcCoefficientsOp, HcReadOp) run as composites in double: values and the
// gradients of h, phi, gains and bias, with every output used and with each
// left out (its gradient arrives undefined), for the model's broadcast
// first-block streams too. The fourth output passes h through: its gradient
// must join h's (the composite returns h itself, for autograd to add).
TEST_P(CpuFusedMhcRoute, EqualsTheThreeOpsInDouble) {
  torch::manual_seed(90 + GetParam());
  for (cpu_fused::RouteProjection projection : RouteProjections()) {
  SCOPED_TRACE(ProjectionName(projection));
  for (int64_t n : {4, 2, 3}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    const int64_t B = 2, T = n == 4 ? 256 : 9, d = n == 4 ? 128 : 20, m = n * n + 2 * n;
    torch::Tensor h = torch::randn({B, T, n, d}) * 2, phi = torch::randn({n * d, m}) * 0.05;
    torch::Tensor gains = torch::rand({3}) + 0.1, bias = torch::randn({m});
    torch::Tensor px = torch::randn({B, T, d}), pw = torch::randn({B, T, n}),
                  pl = torch::randn({B, T, n, n}), ph = torch::randn({B, T, n, d});
    for (bool broadcast : {false, true}) {
      for (int skip = -1; skip < 4; ++skip) {  // every output, then each left out in turn
        SCOPED_TRACE(::testing::Message() << "broadcast=" << broadcast << " skip=" << skip);
        auto f = [&](bool fused) {
          return [=](auto& in) {
            torch::Tensor hh = broadcast ? in[0].narrow(2, 0, 1).expand({B, T, n, d}) : in[0];
            MhcRouteTensors r;
            if (fused) {
              std::vector<torch::Tensor> v =
                  cpu_fused::MhcRoute(hh, in[1], in[2], in[3], n, 1e-6, projection);
              r = {v[0], v[1], v[2], v[3]};
            } else {
              SetFusedOpsEnabled(false);
              auto c = [&](const torch::Tensor& t) { return t.to(torch::kFloat64); };
              r = MhcRouteOp(c(hh), c(in[1]), c(in[2]), c(in[3]), n, 1e-6);
              SetFusedOpsEnabled(true);
            }
            torch::Tensor y = torch::zeros({B, T}, r.x.options());
            if (skip != 0) y = y + (r.x * px.to(r.x.scalar_type())).sum(-1);
            if (skip != 1) y = y + (r.write * pw.to(r.x.scalar_type())).sum(-1);
            if (skip != 2) y = y + (r.logits * pl.to(r.x.scalar_type())).sum({-2, -1});
            if (skip != 3) y = y + (r.h.to(r.x.scalar_type()) * ph.to(r.x.scalar_type())).sum({-2, -1});
            return y.to(torch::kFloat32);
          };
        };
        torch::Tensor probe = torch::randn({B, T});
        ExpectSame(Evaluate(f(true), {h, phi, gains, bias}, probe),
                   Evaluate(f(false), {h, phi, gains, bias}, probe), 1e-4, 2e-4, "MhcRoute");
      }
    }
  }
  }
}

// A chain of three mHC connectors as the model runs them (MhcRoute, Sinkhorn
// on its logits, HcWrite of a branch output into the streams the route
// passed through): each write's backward returns a stream gradient of its
// own that the route before it takes over and adds into in place
// (TakeOwnedGradient). With either projection, the inputs' gradients equal
// the composites' in double.
TEST_P(CpuFusedMhcRoute, ChainOfConnectorsEqualsTheCompositesInDouble) {
  torch::manual_seed(95 + GetParam());
  const int64_t B = 2, T = 70, n = 4, d = 64, m = n * n + 2 * n, links = 3;
  std::vector<torch::Tensor> in = {torch::randn({B, T, n, d})};
  for (int64_t k = 0; k < links; ++k) {
    in.push_back(torch::randn({n * d, m}) * 0.05);  // phi
    in.push_back(torch::rand({3}) + 0.1);           // gains
    in.push_back(torch::randn({m}));                // bias
    in.push_back(torch::randn({B, T, d}));          // the branch's own term
  }
  torch::Tensor probe = torch::randn({B, T, n, d});
  for (cpu_fused::RouteProjection projection : RouteProjections()) {
    SCOPED_TRACE(ProjectionName(projection));
    auto chain = [projection](bool fused) {
      return [=](const std::vector<torch::Tensor>& x) {
        auto c = [&](const torch::Tensor& t) { return fused ? t : t.to(torch::kFloat64); };
        if (!fused) SetFusedOpsEnabled(false);
        torch::Tensor h = c(x[0]);
        for (int64_t k = 0; k < links; ++k) {
          const torch::Tensor &phi = x[1 + 4 * k], &gains = x[2 + 4 * k], &bias = x[3 + 4 * k],
                              &branch = x[4 + 4 * k];
          MhcRouteTensors r;
          if (fused) {
            std::vector<torch::Tensor> v =
                cpu_fused::MhcRoute(h, phi, gains, bias, n, 1e-6, projection);
            r = {v[0], v[1], v[2], v[3]};
            const torch::Tensor map = cpu_fused::Sinkhorn(r.logits, 20, 1e-6);
            h = cpu_fused::HcWrite(r.h, map, r.write, r.x * c(branch));
          } else {
            r = MhcRouteOp(h, c(phi), c(gains), c(bias), n, 1e-6);
            h = HcWriteOp(r.h, SinkhornOp(r.logits, 20, 1e-6), r.write, r.x * c(branch));
          }
        }
        if (!fused) SetFusedOpsEnabled(true);
        return h.to(torch::kFloat32);
      };
    };
    ExpectSame(Evaluate(chain(true), in, probe), Evaluate(chain(false), in, probe), 1e-4, 2e-4,
               "mHC connector chain");
  }
}

// kAuto in float32 takes the GEMMs on one thread (with oneDNN in use) and
// the fused loops on two: bit for bit the same as asking for each.
TEST(CpuFusedMhcRouteProjection, AutoTakesTheGemmsOnOneThreadOnly) {
  if (!cpu_gemm::Enabled()) {
    GTEST_SKIP() << "oneDNN is not in use here (" << cpu_gemm::Description()
                 << "): kAuto is kFused, as EqualsTheThreeOpsInDouble checks";
  }
  torch::manual_seed(97);
  torch::Tensor h = torch::randn({2, 33, 4, 32}), phi = torch::randn({128, 24}) * 0.05;
  torch::Tensor gains = torch::rand({3}) + 0.1, bias = torch::randn({24});
  auto x = [&](cpu_fused::RouteProjection p) {
    return cpu_fused::MhcRoute(h, phi, gains, bias, 4, 1e-6, p)[0];
  };
  const int threads = at::get_num_threads();
  const bool differ = !torch::equal(x(cpu_fused::RouteProjection::kGemm),
                                    x(cpu_fused::RouteProjection::kFused));
  at::set_num_threads(1);
  EXPECT_TRUE(torch::equal(x(cpu_fused::RouteProjection::kAuto), x(cpu_fused::RouteProjection::kGemm)));
  at::set_num_threads(2);
  EXPECT_TRUE(torch::equal(x(cpu_fused::RouteProjection::kAuto), x(cpu_fused::RouteProjection::kFused)));
  at::set_num_threads(threads);
  // The check has teeth only if the two projections round differently here.
  EXPECT_TRUE(differ) << "the GEMM and fused projections gave identical bits";
}

// The GEMM projection is float32 only: asked for in double it is refused
// with the reason; kAuto takes the fused projection there.
TEST(CpuFusedMhcRouteProjection, GemmProjectionRefusesDoubleWithTheReason) {
  torch::Tensor h = torch::randn({2, 3, 4, 8}, kF64), phi = torch::randn({32, 24}, kF64);
  torch::Tensor gains = torch::rand({3}, kF64), bias = torch::randn({24}, kF64);
  try {
    cpu_fused::MhcRoute(h, phi, gains, bias, 4, 1e-6, cpu_fused::RouteProjection::kGemm);
    FAIL() << "no error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("projection kGemm needs float32 h and phi"),
              std::string::npos)
        << e.what();
  }
  torch::Tensor x = cpu_fused::MhcRoute(h, phi, gains, bias, 4, 1e-6)[0];
  EXPECT_EQ(x.scalar_type(), torch::kFloat64);
  EXPECT_TRUE(torch::equal(
      x, cpu_fused::MhcRoute(h, phi, gains, bias, 4, 1e-6, cpu_fused::RouteProjection::kFused)[0]));
}

INSTANTIATE_TEST_SUITE_P(Threads, CpuFusedMhcRoute, ::testing::Values(1, 2),
                         [](const auto& info) { return "threads" + std::to_string(info.param); });

// ---- HC route: per-stream projection, coefficients and read as one function ----

class CpuFusedHcRoute : public ThreadsTest {};

// HcRouteOp's CPU function equals the three ops it fuses (RmsProjectOp,
// HcCoefficientsOp, HcReadOp) run as composites in double: values and the
// gradients of h, w, static_a, static_b and the two gains, with every
// output used and with each left out, for broadcast streams too; the fourth
// output is h passed through, as MhcRoute's.
TEST_P(CpuFusedHcRoute, EqualsTheThreeOpsInDouble) {
  torch::manual_seed(95 + GetParam());
  for (int64_t n : {4, 2, 3}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    const int64_t B = 2, T = n == 4 ? 256 : 9, d = n == 4 ? 128 : 20;
    torch::Tensor h = torch::randn({B, T, n, d}) * 2, w = torch::randn({d, n + 2}) * 0.1;
    torch::Tensor sa = torch::randn({n, n + 1}), sb = torch::rand({n}) + 0.5;
    torch::Tensor ga = torch::rand({1}) + 0.1, gb = torch::rand({1}) + 0.1;
    torch::Tensor px = torch::randn({B, T, d}), pa = torch::randn({B, T, n, n}),
                  pb = torch::randn({B, T, n}), ph = torch::randn({B, T, n, d});
    for (bool broadcast : {false, true}) {
      for (int skip = -1; skip < 4; ++skip) {
        SCOPED_TRACE(::testing::Message() << "broadcast=" << broadcast << " skip=" << skip);
        auto f = [&](bool fused) {
          return [=](auto& in) {
            torch::Tensor hh = broadcast ? in[0].narrow(2, 0, 1).expand({B, T, n, d}) : in[0];
            HcRouteTensors r;
            if (fused) {
              std::vector<torch::Tensor> v = cpu_fused::HcRoute(hh, in[1], in[2], in[3], in[4], in[5], 1e-6);
              r = {v[0], v[1], v[2], v[3]};
            } else {
              SetFusedOpsEnabled(false);
              auto c = [&](const torch::Tensor& t) { return t.to(torch::kFloat64); };
              r = HcRouteOp(c(hh), c(in[1]), c(in[2]), c(in[3]), c(in[4]), c(in[5]), 1e-6);
              SetFusedOpsEnabled(true);
            }
            torch::Tensor y = torch::zeros({B, T}, r.x.options());
            if (skip != 0) y = y + (r.x * px.to(r.x.scalar_type())).sum(-1);
            if (skip != 1) y = y + (r.ar * pa.to(r.x.scalar_type())).sum({-2, -1});
            if (skip != 2) y = y + (r.b * pb.to(r.x.scalar_type())).sum(-1);
            if (skip != 3) y = y + (r.h.to(r.x.scalar_type()) * ph.to(r.x.scalar_type())).sum({-2, -1});
            return y.to(torch::kFloat32);
          };
        };
        torch::Tensor probe = torch::randn({B, T});
        ExpectSame(Evaluate(f(true), {h, w, sa, sb, ga, gb}, probe),
                   Evaluate(f(false), {h, w, sa, sb, ga, gb}, probe), 1e-4, 2e-4, "HcRoute");
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, CpuFusedHcRoute, ::testing::Values(1, 2),
                         [](const auto& info) { return "threads" + std::to_string(info.param); });

// ---- HC write + next route as one function ----

class CpuFusedHcWriteRoute : public ThreadsTest {};

// cpu_fused::HcWriteRoute equals HcRouteOp(HcWriteOp(...)) run as the
// composites in double: every output (x, ar, b and the new streams) and the
// gradients of all ten inputs, with the mix and without it (the code form),
// at n = 4 and d = 128 (the register-blocked kernels), n = 3 and n = 5 at
// odd d (the plain loops), for broadcast streams too.
TEST_P(CpuFusedHcWriteRoute, EqualsWriteThenRouteInDouble) {
  torch::manual_seed(131 + GetParam());
  for (int64_t n : {4, 3, 5}) {
    const int64_t B = 2, T = n == 4 ? 96 : 7, d = n == 4 ? 128 : 33;
    torch::Tensor h = torch::randn({B, T, n, d}), a = torch::randn({B, T, n, n}) * 0.5;
    torch::Tensor b = torch::rand({B, T, n}) + 0.5, yb = torch::randn({B, T, d});
    torch::Tensor w = torch::randn({d, n + 2}) * 0.1, sa = torch::randn({n, n + 1});
    torch::Tensor sb = torch::rand({n}) + 0.5, ga = torch::rand({1}) + 0.1, gb = torch::rand({1}) + 0.1;
    torch::Tensor px = torch::randn({B, T, d}), pa = torch::randn({B, T, n, n}),
                  pb = torch::randn({B, T, n}), ph = torch::randn({B, T, n, d});
    for (bool mix : {true, false}) {
      for (bool broadcast : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "n=" << n << " mix=" << mix << " broadcast=" << broadcast);
        auto f = [&](bool fused) {
          return [=](auto& in) {
            torch::Tensor hh = broadcast ? in[0].narrow(2, 0, 1).expand({B, T, n, d}) : in[0];
            torch::Tensor aa = mix ? in[1] : torch::Tensor();
            HcRouteTensors r;
            if (fused) {
              std::vector<torch::Tensor> v = cpu_fused::HcWriteRoute(
                  hh, aa, in[2], in[3], in[4], in[5], in[6], in[7], in[8], 1e-6);
              r = {v[0], v[1], v[2], v[3]};
            } else {
              SetFusedOpsEnabled(false);
              auto c = [&](const torch::Tensor& t) {
                return t.defined() ? t.to(torch::kFloat64) : torch::Tensor();
              };
              r = HcWriteRouteOp(c(hh), c(aa), c(in[2]), c(in[3]), c(in[4]), c(in[5]), c(in[6]),
                                 c(in[7]), c(in[8]), 1e-6);
              SetFusedOpsEnabled(true);
            }
            const auto k = r.x.scalar_type();
            torch::Tensor y = (r.x * px.to(k)).sum(-1) + (r.ar * pa.to(k)).sum({-2, -1}) +
                              (r.b * pb.to(k)).sum(-1) + (r.h * ph.to(k)).sum({-2, -1});
            return y.to(torch::kFloat32);
          };
        };
        torch::Tensor probe = torch::randn({B, T});
        const std::vector<torch::Tensor> in = {h, a, b, yb, w, sa, sb, ga, gb};
        ExpectSame(Evaluate(f(true), in, probe), Evaluate(f(false), in, probe), 1e-4, 2e-4,
                   "HcWriteRoute");
      }
    }
  }
}

// A chain as HC runs it (a route, fused write + route twice, a last write):
// the stream gradient each fused backward returns is taken over and written
// in place by the one before it; values and all gradients equal the chain
// of separate HcRoute and HcWrite functions.
TEST_P(CpuFusedHcWriteRoute, ChainEqualsSeparateRoutesAndWrites) {
  torch::manual_seed(137 + GetParam());
  const int64_t B = 2, T = 64, n = 4, d = 128, links = 3;
  std::vector<torch::Tensor> in = {torch::randn({B, T, d})};  // embedding, then per link 6 + y
  for (int64_t l = 0; l < links; ++l) {
    in.push_back(torch::randn({d, n + 2}) * 0.1);
    in.push_back(torch::randn({n, n + 1}));
    in.push_back(torch::rand({n}) + 0.5);
    in.push_back(torch::rand({1}) + 0.1);
    in.push_back(torch::rand({1}) + 0.1);
    in.push_back(torch::randn({d, d}) * 0.1);  // the branch: y = tanh(x) W
  }
  for (bool mix : {true, false}) {
    SCOPED_TRACE(::testing::Message() << "mix=" << mix);
    auto f = [&](bool fused) {
      return [=](auto& p) {
        std::vector<torch::Tensor> pending = {p[0].unsqueeze(-2).expand({B, T, n, d})};
        for (int64_t l = 0; l < links; ++l) {
          const auto* q = &p[1 + 6 * l];
          std::vector<torch::Tensor> v;
          if (pending.size() == 1) {
            v = cpu_fused::HcRoute(pending[0], q[0], q[1], q[2], q[3], q[4], 1e-6);
          } else if (fused) {
            v = cpu_fused::HcWriteRoute(pending[0], pending[1], pending[2], pending[3], q[0], q[1],
                                        q[2], q[3], q[4], 1e-6);
          } else {
            v = cpu_fused::HcRoute(
                cpu_fused::HcWrite(pending[0], pending[1], pending[2], pending[3]), q[0], q[1],
                q[2], q[3], q[4], 1e-6);
          }
          pending = {v[3], mix ? v[1] : torch::Tensor(), v[2], torch::tanh(v[0]).matmul(q[5])};
        }
        return cpu_fused::HcWrite(pending[0], pending[1], pending[2], pending[3]).sum(-2);
      };
    };
    torch::Tensor probe = torch::randn({B, T, d});
    const Outcome fused = Evaluate(f(true), in, probe), separate = Evaluate(f(false), in, probe);
    ExpectSame(fused, separate, 1e-5, 1e-5, "HC chain");
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, CpuFusedHcWriteRoute, ::testing::Values(1, 2),
                         [](const auto& info) { return "threads" + std::to_string(info.param); });

// ---- Sinkhorn ----

class CpuFusedSinkhorn : public ThreadsTest {};

TEST_P(CpuFusedSinkhorn, EqualsTheLogDomainReference) {
  torch::manual_seed(30 + GetParam());
  for (int64_t n : {2, 4, 5}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    // Random logits, and the mHC init (0 on the diagonal, -8 off it) plus noise.
    torch::Tensor random = torch::randn({2, 150, n, n}) * 2;
    torch::Tensor init = ((torch::eye(n) - 1.0) * 8.0).expand({2, 150, n, n}) +
                         torch::randn({2, 150, n, n}) * 0.1;
    for (const torch::Tensor& z : {random, init}) {
      torch::Tensor probe = torch::randn_like(z);
      ExpectSame(Evaluate([](auto& in) { return cpu_fused::Sinkhorn(in[0], 20, 1e-6); }, {z}, probe),
                 Evaluate([](auto& in) { return reference::Sinkhorn(in[0], 20, 1e-6); }, {z}, probe),
                 1e-4, 1e-5, "Sinkhorn");
      // The hand-written backward sinkhorn.cu implements.
      Outcome f = Evaluate([](auto& in) { return cpu_fused::Sinkhorn(in[0], 20, 1e-6); }, {z}, probe);
      EXPECT_TRUE(AllClose(f.grads[0], reference::SinkhornBackward(probe, z, 20, 1e-6), 1e-4, 1e-5));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, CpuFusedSinkhorn, ::testing::Values(1, 2),
                         [](const auto& info) { return "threads" + std::to_string(info.param); });

// ---- AttnRes mix ----

class CpuFusedAttnRes : public ThreadsTest {};

TEST_P(CpuFusedAttnRes, EqualsTheReferenceForFullAndBlockSourceLists) {
  torch::manual_seed(40 + GetParam());
  for (int S : {1, 2, 5, 17}) {  // 17: a Full AttnRes head at L = 8
    // 300 rows: more than one parallel chunk at d = 128 and S >= 5, and
    // more than one row tile (MixTileRows: 120 rows) at S = 17, d = 128.
    for (int64_t d : {128, 33}) {
      for (bool with_query : {true, false}) {
        SCOPED_TRACE(::testing::Message() << "S=" << S << " d=" << d << " query=" << with_query);
        std::vector<torch::Tensor> in;
        for (int i = 0; i < S; ++i) in.push_back(torch::randn({2, 150, d}) * (1 + 0.3 * i));
        torch::Tensor q = with_query ? torch::randn({d}) : torch::Tensor();
        torch::Tensor kg = with_query ? torch::rand({d}) + 0.5 : torch::Tensor();
        in.push_back(q);
        in.push_back(kg);
        in.push_back(torch::rand({d}) + 0.5);
        auto call = [S](bool fused) {
          return [S, fused](const std::vector<torch::Tensor>& x) {
            std::vector<torch::Tensor> src(x.begin(), x.begin() + S);
            return fused ? cpu_fused::AttnResMix(src, x[S], x[S + 1], x[S + 2], 1e-6)
                         : reference::AttnResMix(src, x[S], x[S + 1], x[S + 2], 1e-6);
          };
        };
        torch::Tensor probe = torch::randn({2, 150, d});
        Outcome f = Evaluate(call(true), in, probe);
        // fp32 rounding over up to 17 sources and 300 rows: 1e-3 relative.
        // The gain gradients sum 300 rows, so their rounding is absolute
        // (about 1e-6 of the summed magnitudes, 3e-4 with OpenBLAS's
        // AVX-512 kernels): 1e-3 absolute, as for the hand-written
        // backward below.
        ExpectSame(f, Evaluate(call(false), in, probe), 1e-3, 1e-3, "AttnResMix");
        // Against the hand-written backward attnres_mix.cu implements.
        std::vector<torch::Tensor> src(in.begin(), in.begin() + S);
        reference::AttnResGrads g =
            reference::AttnResMixBackward(probe, src, in[S], in[S + 1], in[S + 2], 1e-6);
        for (int i = 0; i < S; ++i) EXPECT_TRUE(AllClose(f.grads[i], g.dsources[i], 1e-3, 1e-4));
        EXPECT_TRUE(AllClose(f.grads[S + 2], g.dout_gain, 1e-3, 1e-3));
        if (with_query) {
          EXPECT_TRUE(AllClose(f.grads[S], g.dquery, 1e-3, 1e-3));
          EXPECT_TRUE(AllClose(f.grads[S + 1], g.dkey_gain, 1e-3, 1e-3));
        }
      }
    }
  }
}

// The model's chain (attnres_common.cc): a mix passes its sources through
// and the next mix (and here the loss too) reads the passed tensors. The
// gradient of each source, from every reader, must come out as with the
// sources read directly (the reference composites, autograd adding).
TEST_P(CpuFusedAttnRes, PassedSourcesCarryEveryReadersGradient) {
  torch::manual_seed(45 + GetParam());
  const int64_t d = 128;
  for (bool with_query : {true, false}) {
    SCOPED_TRACE(::testing::Message() << "query=" << with_query);
    std::vector<torch::Tensor> in;
    for (int i = 0; i < 4; ++i) in.push_back(torch::randn({2, 150, d}) * (1 + 0.3 * i));
    for (int mix = 0; mix < 2; ++mix) {
      in.push_back(with_query ? torch::randn({d}) : torch::Tensor());
      in.push_back(with_query ? torch::rand({d}) + 0.5 : torch::Tensor());
      in.push_back(torch::rand({d}) + 0.5);
    }
    auto call = [](bool fused) {
      return [fused](const std::vector<torch::Tensor>& x) {
        const std::vector<torch::Tensor> src = {x[0], x[1], x[2]};
        std::vector<torch::Tensor> passed;
        torch::Tensor y1 = fused ? cpu_fused::AttnResMix(src, x[4], x[5], x[6], 1e-6, &passed)
                                 : reference::AttnResMix(src, x[4], x[5], x[6], 1e-6);
        if (!fused) passed = src;
        EXPECT_EQ(passed.size(), 3u);
        const std::vector<torch::Tensor> next = {passed[0], passed[1], passed[2], x[3]};
        torch::Tensor y2 = fused ? cpu_fused::AttnResMix(next, x[7], x[8], x[9], 1e-6)
                                 : reference::AttnResMix(next, x[7], x[8], x[9], 1e-6);
        // passed[1] has a third reader; passed[2] only the second mix.
        return y1 + y2 + 0.5 * passed[1];
      };
    };
    torch::Tensor probe = torch::randn({2, 150, d});
    ExpectSame(Evaluate(call(true), in, probe), Evaluate(call(false), in, probe), 1e-3, 1e-3,
               "AttnResMix chain");
  }
}

// Three mixes, each reading the last one's passed sources plus one more
// (Full AttnRes): a source's gradient buffer is returned by the third mix,
// taken over and added into in place by the second (TakeOwnedGradient),
// returned again and taken over by the first. Every source's gradient must
// come out as with the sources read directly.
TEST_P(CpuFusedAttnRes, GradientsTakenOverAlongAChainOfMixes) {
  torch::manual_seed(46 + GetParam());
  const int64_t d = 64;
  std::vector<torch::Tensor> in;
  for (int i = 0; i < 4; ++i) in.push_back(torch::randn({3, 70, d}) * (1 + 0.2 * i));
  for (int mix = 0; mix < 3; ++mix) {
    in.push_back(torch::randn({d}));
    in.push_back(torch::rand({d}) + 0.5);
    in.push_back(torch::rand({d}) + 0.5);
  }
  auto call = [](bool fused) {
    return [fused](const std::vector<torch::Tensor>& x) {
      std::vector<torch::Tensor> src = {x[0], x[1]};
      torch::Tensor y;
      for (int mix = 0; mix < 3; ++mix) {
        const auto& q = x[4 + 3 * mix];
        const auto& kg = x[5 + 3 * mix];
        const auto& og = x[6 + 3 * mix];
        std::vector<torch::Tensor> passed;
        torch::Tensor ym = fused ? cpu_fused::AttnResMix(src, q, kg, og, 1e-6, mix < 2 ? &passed : nullptr)
                                 : reference::AttnResMix(src, q, kg, og, 1e-6);
        if (!fused) passed = src;
        y = y.defined() ? y + ym : ym;
        if (mix < 2) {
          src = passed;
          src.push_back(x[2 + mix]);
        }
      }
      return y;
    };
  };
  torch::Tensor probe = torch::randn({3, 70, d});
  ExpectSame(Evaluate(call(true), in, probe), Evaluate(call(false), in, probe), 1e-3, 1e-3,
             "AttnResMix chain of three");
}

// A gradient the caller supplies for a passed source is not one of the
// kernels' own: it is read, never written.
TEST_P(CpuFusedAttnRes, SuppliedGradientsOfPassedSourcesStayUnchanged) {
  torch::manual_seed(47 + GetParam());
  const int64_t d = 32;
  std::vector<torch::Tensor> src;
  for (int i = 0; i < 3; ++i) src.push_back(torch::randn({2, 9, d}).requires_grad_());
  std::vector<torch::Tensor> passed;
  torch::Tensor y = cpu_fused::AttnResMix(src, torch::randn({d}), torch::rand({d}) + 0.5,
                                          torch::rand({d}) + 0.5, 1e-6, &passed);
  std::vector<torch::Tensor> outs = {y}, grads = {torch::randn({2, 9, d})}, copies;
  for (const auto& p : passed) {
    outs.push_back(p);
    grads.push_back(torch::randn({2, 9, d}));
    copies.push_back(grads.back().clone());
  }
  torch::autograd::backward(outs, grads);
  for (size_t i = 0; i < copies.size(); ++i) EXPECT_TRUE(torch::equal(grads[i + 1], copies[i])) << i;
}

INSTANTIATE_TEST_SUITE_P(Threads, CpuFusedAttnRes, ::testing::Values(1, 2),
                         [](const auto& info) { return "threads" + std::to_string(info.param); });

// ---- gradcheck in double ----

torch::Tensor Var(const torch::Tensor& t) { return t.clone().requires_grad_(true); }

TEST(CpuFusedMixGradcheck, HcReadAndWrite) {
  torch::manual_seed(50);
  torch::Tensor h = Var(torch::randn({2, 3, 3, 5}, kF64)), read = Var(torch::rand({2, 3, 3}, kF64));
  torch::Tensor a = Var(torch::randn({2, 3, 3, 3}, kF64)), b = Var(torch::rand({2, 3, 3}, kF64));
  torch::Tensor y = Var(torch::randn({2, 3, 5}, kF64));
  EXPECT_EQ(GradCheck([](const auto& in) { return cpu_fused::HcRead(in[0], in[1]); }, {h, read}), "");
  EXPECT_EQ(GradCheck([](const auto& in) { return cpu_fused::HcWrite(in[0], in[1], in[2], in[3]); },
                      {h, a, b, y}),
            "");
  EXPECT_EQ(GradCheck([](const auto& in) {
              return cpu_fused::HcWrite(in[0], torch::Tensor(), in[1], in[2]);
            }, {h, b, y}),
            "");
}

TEST(CpuFusedMixGradcheck, RmsProject) {
  torch::manual_seed(53);
  torch::Tensor x = Var(torch::randn({2, 3, 7}, kF64)), w = Var(torch::randn({7, 4}, kF64));
  EXPECT_EQ(GradCheck([](const auto& in) { return cpu_fused::RmsProject(in[0], in[1], 1e-6); }, {x, w}), "");
}

TEST(CpuFusedMixGradcheck, Coefficients) {
  torch::manual_seed(54);
  const int64_t n = 3;
  std::vector<torch::Tensor> hc = {Var(torch::randn({2, 2, n, n + 2}, kF64)), Var(torch::randn({n, n + 1}, kF64)),
                                   Var(torch::randn({n}, kF64)), Var(torch::rand({1}, kF64) + 0.1),
                                   Var(torch::rand({1}, kF64) + 0.1)};
  EXPECT_EQ(GradCheck([](const auto& in) {
              std::vector<torch::Tensor> ab = cpu_fused::HcCoefficients(in[0], in[1], in[2], in[3], in[4]);
              return torch::cat({ab[0].flatten(), ab[1].flatten()});
            }, hc),
            "");
  std::vector<torch::Tensor> mhc = {Var(torch::randn({2, 2, n * n + 2 * n}, kF64)),
                                    Var(torch::rand({3}, kF64) + 0.1), Var(torch::randn({n * n + 2 * n}, kF64))};
  EXPECT_EQ(GradCheck([](const auto& in) {
              std::vector<torch::Tensor> c = cpu_fused::MhcCoefficients(in[0], in[1], in[2], 3);
              return torch::cat({c[0].flatten(), c[1].flatten(), c[2].flatten()});
            }, mhc),
            "");
}

TEST(CpuFusedMixGradcheck, MhcRoute) {
  torch::manual_seed(55);
  const int64_t n = 3, d = 4, m = n * n + 2 * n;
  std::vector<torch::Tensor> in = {Var(torch::randn({2, 2, n, d}, kF64)), Var(torch::randn({n * d, m}, kF64) * 0.3),
                                   Var(torch::rand({3}, kF64) + 0.5), Var(torch::randn({m}, kF64))};
  EXPECT_EQ(GradCheck([](const auto& x) {
              std::vector<torch::Tensor> r = cpu_fused::MhcRoute(x[0], x[1], x[2], x[3], 3, 1e-6);
              return torch::cat({r[0].flatten(), r[1].flatten(), r[2].flatten(), r[3].flatten()});
            }, in),
            "");
}

TEST(CpuFusedMixGradcheck, HcRoute) {
  torch::manual_seed(56);
  const int64_t n = 3, d = 5;
  std::vector<torch::Tensor> in = {Var(torch::randn({2, 2, n, d}, kF64)), Var(torch::randn({d, n + 2}, kF64) * 0.5),
                                   Var(torch::randn({n, n + 1}, kF64)), Var(torch::rand({n}, kF64) + 0.5),
                                   Var(torch::rand({1}, kF64) + 0.5), Var(torch::rand({1}, kF64) + 0.5)};
  EXPECT_EQ(GradCheck([](const auto& x) {
              std::vector<torch::Tensor> r = cpu_fused::HcRoute(x[0], x[1], x[2], x[3], x[4], x[5], 1e-6);
              return torch::cat({r[0].flatten(), r[1].flatten(), r[2].flatten(), r[3].flatten()});
            }, in),
            "");
}

TEST(CpuFusedMixGradcheck, HcWriteRoute) {
  torch::manual_seed(57);
  const int64_t n = 3, d = 5;
  for (bool mix : {true, false}) {
    SCOPED_TRACE(::testing::Message() << "mix=" << mix);
    std::vector<torch::Tensor> in = {
        Var(torch::randn({2, 2, n, d}, kF64)),         Var(torch::randn({2, 2, n, n}, kF64)),
        Var(torch::rand({2, 2, n}, kF64) + 0.5),       Var(torch::randn({2, 2, d}, kF64)),
        Var(torch::randn({d, n + 2}, kF64) * 0.5),     Var(torch::randn({n, n + 1}, kF64)),
        Var(torch::rand({n}, kF64) + 0.5),             Var(torch::rand({1}, kF64) + 0.5),
        Var(torch::rand({1}, kF64) + 0.5)};
    if (!mix) in.erase(in.begin() + 1);  // the code form: no residual map
    EXPECT_EQ(GradCheck([mix](const auto& x) {
                const int64_t o = mix ? 0 : 1;  // without a, b is x[1]
                std::vector<torch::Tensor> r = cpu_fused::HcWriteRoute(
                    x[0], mix ? x[1] : torch::Tensor(), x[2 - o], x[3 - o], x[4 - o], x[5 - o],
                    x[6 - o], x[7 - o], x[8 - o], 1e-6);
                return torch::cat({r[0].flatten(), r[1].flatten(), r[2].flatten(), r[3].flatten()});
              }, in),
              "");
  }
}

TEST(CpuFusedMixGradcheck, Sinkhorn) {
  torch::manual_seed(51);
  torch::Tensor z = Var(torch::randn({3, 4, 4}, kF64));
  EXPECT_EQ(GradCheck([](const auto& in) { return cpu_fused::Sinkhorn(in[0], 20, 1e-6); }, {z}), "");
  torch::Tensor z3 = Var(torch::randn({2, 3, 3}, kF64) * 3);
  EXPECT_EQ(GradCheck([](const auto& in) { return cpu_fused::Sinkhorn(in[0], 5, 1e-3); }, {z3}), "");
}

TEST(CpuFusedMixGradcheck, AttnResMix) {
  torch::manual_seed(52);
  const int64_t d = 6;
  std::vector<torch::Tensor> in = {Var(torch::randn({2, 3, d}, kF64)),
                                   Var(torch::randn({2, 3, d}, kF64) * 2),
                                   Var(torch::randn({2, 3, d}, kF64)),
                                   Var(torch::randn({d}, kF64)),
                                   Var(torch::rand({d}, kF64) + 0.5),
                                   Var(torch::rand({d}, kF64) + 0.5)};
  EXPECT_EQ(GradCheck([](const auto& x) {
              return cpu_fused::AttnResMix({x[0], x[1], x[2]}, x[3], x[4], x[5], 1e-6);
            }, in),
            "");
  std::vector<torch::Tensor> uniform = {in[0], in[1], in[5]};
  EXPECT_EQ(GradCheck([](const auto& x) {
              return cpu_fused::AttnResMix({x[0], x[1]}, torch::Tensor(), torch::Tensor(), x[2], 1e-6);
            }, uniform),
            "");
  // With the sources passed through and read again (their gradients join).
  EXPECT_EQ(GradCheck([](const auto& x) {
              std::vector<torch::Tensor> passed;
              torch::Tensor y = cpu_fused::AttnResMix({x[0], x[1], x[2]}, x[3], x[4], x[5], 1e-6, &passed);
              return torch::cat({y.flatten(), (passed[0] * passed[2]).flatten(), passed[1].flatten()});
            }, in),
            "");
}

// ---- the ISA builds ----

TEST(CpuFusedIsa, WideAndBaselineBuildsAgree) {
  const std::vector<Build> wide = WideBuilds();
  if (wide.empty()) GTEST_SKIP() << kNoWideBuild;
  // The entry points run the widest build.
  EXPECT_STREQ(cpu_fused::KernelIsa(), BuildName(wide.back()));
  torch::manual_seed(70);
  const int64_t B = 2, T = 33, n = 4, d = 40;
  torch::Tensor h = torch::randn({B, T, n, d}), read = torch::rand({B, T, n});
  torch::Tensor a = torch::randn({B, T, n, n}), b = torch::rand({B, T, n}), y = torch::randn({B, T, d});
  torch::Tensor w = torch::randn({d, n + 2}) * 0.1, z = torch::randn({B, T, n, n});
  torch::Tensor rw = torch::rand({d}) + 0.5;
  std::vector<torch::Tensor> src = {torch::randn({B, T, d}), torch::randn({B, T, d}), torch::randn({B, T, d})};
  torch::Tensor q = torch::randn({d}), kg = torch::rand({d}) + 0.5, og = torch::rand({d}) + 0.5;
  struct Kernel {
    const char* name;
    std::vector<torch::Tensor> inputs;
    std::function<torch::Tensor(Build, const std::vector<torch::Tensor>&)> f;
  };
  const std::vector<Kernel> kernels = {
      {"RmsNorm", {y, rw}, [](Build v, auto& in) {
         return DB_BUILD_CALL(v, RmsNorm, in[0], in[1], 1e-6);
       }},
      {"HcRead", {h, read}, [](Build v, auto& in) {
         return DB_BUILD_CALL(v, HcRead, in[0], in[1]);
       }},
      {"HcWrite", {h, a, b, y}, [](Build v, auto& in) {
         return DB_BUILD_CALL(v, HcWrite, in[0], in[1], in[2], in[3]);
       }},
      {"RmsProject", {h, w}, [](Build v, auto& in) {
         return DB_BUILD_CALL(v, RmsProject, in[0], in[1], 1e-6);
       }},
      {"MhcRoute", {h, torch::randn({n * d, n * n + 2 * n}) * 0.05, torch::rand({3}) + 0.1,
                    torch::randn({n * n + 2 * n})},
       [](Build v, auto& in) {
         std::vector<torch::Tensor> r =
             DB_BUILD_CALL(v, MhcRoute, in[0], in[1], in[2], in[3], 4, 1e-6, nullptr);
         return torch::cat({r[0].flatten(), r[1].flatten(), r[2].flatten()});
       }},
      // The GEMM projection's own passes, also built per ISA (without
      // oneDNN: the fused projection again).
      {"MhcRoute (GEMM projection)",
       {h, torch::randn({n * d, n * n + 2 * n}) * 0.05, torch::rand({3}) + 0.1,
        torch::randn({n * n + 2 * n})},
       [](Build v, auto& in) {
         cpu_gemm::SgemmFn gemm = cpu_gemm::Enabled() ? &cpu_gemm::Sgemm : nullptr;
         std::vector<torch::Tensor> r =
             DB_BUILD_CALL(v, MhcRoute, in[0], in[1], in[2], in[3], 4, 1e-6, gemm);
         return torch::cat({r[0].flatten(), r[1].flatten(), r[2].flatten()});
       }},
      {"HcRoute", {h, w, torch::randn({n, n + 1}), torch::rand({n}) + 0.5, torch::rand({1}) + 0.1,
                   torch::rand({1}) + 0.1},
       [](Build v, auto& in) {
         std::vector<torch::Tensor> r =
             DB_BUILD_CALL(v, HcRoute, in[0], in[1], in[2], in[3], in[4], in[5], 1e-6);
         return torch::cat({r[0].flatten(), r[1].flatten(), r[2].flatten()});
       }},
      {"Sinkhorn", {z}, [](Build v, auto& in) {
         return DB_BUILD_CALL(v, Sinkhorn, in[0], 20, 1e-6);
       }},
      {"AttnResMix", {src[0], src[1], src[2], q, kg, og}, [](Build v, auto& in) {
         std::vector<torch::Tensor> s = {in[0], in[1], in[2]};
         std::vector<torch::Tensor> passed;
         torch::Tensor y = DB_BUILD_CALL(v, AttnResMix, s, in[3], in[4], in[5], 1e-6, &passed);
         return torch::cat({y.flatten(), (passed[0] * passed[1]).flatten()});
       }},
  };
  for (Build b : wide) {
    SCOPED_TRACE(BuildName(b));
    for (const Kernel& k : kernels) {
      torch::Tensor probe = torch::randn(k.f(Build::kGeneric, k.inputs).sizes());
      // FMA contracts a*b+c into one rounding and the wider builds sum in
      // other orders: equal up to float rounding.
      ExpectSame(Evaluate([&](auto& in) { return k.f(b, in); }, k.inputs, probe),
                 Evaluate([&](auto& in) { return k.f(Build::kGeneric, in); }, k.inputs, probe), 1e-5,
                 1e-5, k.name);
    }
  }
}

// ---- dispatcher ----

TEST(CpuFusedMixDispatch, OpsUseTheKernelsOnCpuAndTheReferencesOtherwise) {
  torch::manual_seed(60);
  torch::Tensor h = torch::randn({2, 5, 4, 8}), read = torch::rand({2, 5, 4});
  torch::Tensor a = torch::rand({2, 5, 4, 4}), b = torch::rand({2, 5, 4}), y = torch::randn({2, 5, 8});
  torch::Tensor z = torch::randn({2, 5, 4, 4});
  std::vector<torch::Tensor> src = {torch::randn({2, 5, 8}), torch::randn({2, 5, 8})};
  torch::Tensor q = torch::randn({8}), kg = torch::rand({8}) + 0.5, og = torch::rand({8}) + 0.5;

  torch::Tensor w = torch::randn({8, 6});
  EXPECT_TRUE(torch::equal(RmsProjectOp(h, w, 1e-6), cpu_fused::RmsProject(h, w, 1e-6)));
  EXPECT_TRUE(torch::equal(HcReadOp(h, read), cpu_fused::HcRead(h, read)));
  EXPECT_TRUE(torch::equal(HcWriteOp(h, a, b, y), cpu_fused::HcWrite(h, a, b, y)));
  EXPECT_TRUE(torch::equal(HcWriteOp(h, torch::Tensor(), b, y),
                           cpu_fused::HcWrite(h, torch::Tensor(), b, y)));
  EXPECT_TRUE(torch::equal(SinkhornOp(z, 20, 1e-6), cpu_fused::Sinkhorn(z, 20, 1e-6)));
  EXPECT_TRUE(torch::equal(AttnResMixOp(src, q, kg, og, 1e-6),
                           cpu_fused::AttnResMix(src, q, kg, og, 1e-6)));
  torch::Tensor phi = torch::randn({32, 24}) * 0.1, gains = torch::rand({3}) + 0.1,
                bias = torch::randn({24});
  EXPECT_TRUE(torch::equal(MhcRouteOp(h, phi, gains, bias, 4, 1e-6).x,
                           cpu_fused::MhcRoute(h, phi, gains, bias, 4, 1e-6)[0]));
  torch::Tensor sa = torch::randn({4, 5}), sb = torch::rand({4}) + 0.5, ga = torch::rand({1}),
                gb = torch::rand({1});
  EXPECT_TRUE(torch::equal(HcRouteOp(h, w, sa, sb, ga, gb, 1e-6).x,
                           cpu_fused::HcRoute(h, w, sa, sb, ga, gb, 1e-6)[0]));
  EXPECT_NE(FusedOpsDescription().find("Sinkhorn"), std::string::npos) << FusedOpsDescription();

  // Logits beyond the exp domain's range take the log-domain reference.
  torch::Tensor big = z + 1000.0;
  EXPECT_FALSE(cpu_fused::SinkhornInRange(big));
  EXPECT_TRUE(torch::equal(SinkhornOp(big, 20, 1e-6), reference::Sinkhorn(big, 20, 1e-6)));
  // bf16 takes the references.
  torch::Tensor hb = h.to(torch::kBFloat16);
  EXPECT_TRUE(torch::equal(HcReadOp(hb, read), reference::HcRead(hb, read)));

  SetFusedOpsEnabled(false);
  {
    MhcRouteTensors r = MhcRouteOp(h, phi, gains, bias, 4, 1e-6);
    MhcCoefficientTensors c =
        MhcCoefficientsOp(RmsProjectComposite(h.flatten(-2), phi, 1e-6), gains, bias, 4);
    EXPECT_TRUE(torch::equal(r.x, reference::HcRead(h, c.read)));
    EXPECT_TRUE(torch::equal(r.logits, c.logits));
  }
  {
    HcRouteTensors r = HcRouteOp(h, w, sa, sb, ga, gb, 1e-6);
    HcCoefficientTensors c = HcCoefficientsOp(RmsProjectComposite(h, w, 1e-6), sa, sb, ga, gb);
    EXPECT_TRUE(torch::equal(r.x, reference::HcRead(h, c.a.select(-1, 0))));
    EXPECT_TRUE(torch::equal(r.ar, c.a.narrow(-1, 1, 4)));
    EXPECT_TRUE(torch::equal(r.b, c.b));
  }
  EXPECT_TRUE(torch::equal(RmsProjectOp(h, w, 1e-6), RmsProjectComposite(h, w, 1e-6)));
  EXPECT_TRUE(torch::equal(HcReadOp(h, read), reference::HcRead(h, read)));
  EXPECT_TRUE(torch::equal(HcWriteOp(h, a, b, y), reference::HcWrite(h, a, b, y)));
  EXPECT_TRUE(torch::equal(SinkhornOp(z, 20, 1e-6), reference::Sinkhorn(z, 20, 1e-6)));
  EXPECT_TRUE(torch::equal(AttnResMixOp(src, q, kg, og, 1e-6),
                           reference::AttnResMix(src, q, kg, og, 1e-6)));
  SetFusedOpsEnabled(true);
}

TEST(CpuFusedMixDispatch, BadShapesAreRejectedWithTheFieldNamed) {
  torch::Tensor h = torch::randn({2, 4, 8});
  try {
    cpu_fused::HcWrite(h, torch::Tensor(), torch::rand({3}), torch::randn({2, 8}));
    FAIL() << "no error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("HcWrite: b"), std::string::npos) << e.what();
  }
  try {
    MhcCoefficientsOp(torch::randn({2, 23}), torch::ones({3}), torch::zeros({24}), 4);
    FAIL() << "no error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("MhcCoefficientsOp: u"), std::string::npos) << e.what();
  }
  try {
    RmsProjectOp(h, torch::randn({7, 6}), 1e-6);
    FAIL() << "no error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("RmsProjectOp: w"), std::string::npos) << e.what();
  }
  try {
    MhcRouteOp(torch::randn({2, 4, 8}), torch::randn({31, 24}), torch::ones({3}), torch::zeros({24}), 4, 1e-6);
    FAIL() << "no error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("MhcRouteOp: phi"), std::string::npos) << e.what();
  }
  try {
    HcRouteOp(torch::randn({2, 4, 8}), torch::randn({8, 5}), torch::zeros({4, 5}), torch::ones({4}),
              torch::ones({1}), torch::ones({1}), 1e-6);
    FAIL() << "no error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("HcRouteOp: w"), std::string::npos) << e.what();
  }
  try {
    cpu_fused::HcRoute(torch::randn({2, 4, 8}), torch::randn({8, 6}), torch::zeros({4, 4}), torch::ones({4}),
                       torch::ones({1}), torch::ones({1}), 1e-6);
    FAIL() << "no error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("HcRoute: static_a"), std::string::npos) << e.what();
  }
  EXPECT_THROW(cpu_fused::MhcRoute(torch::randn({2, 4, 8}), torch::randn({32, 24}), torch::ones({2}),
                                   torch::zeros({24}), 4, 1e-6),
               c10::Error);
  EXPECT_THROW(cpu_fused::Sinkhorn(torch::randn({2, 3, 4}), 20, 1e-6), c10::Error);
  EXPECT_THROW(cpu_fused::AttnResMix({torch::randn({2, 8}), torch::randn({3, 8})}, torch::Tensor(),
                                     torch::Tensor(), torch::ones({8}), 1e-6),
               c10::Error);
}

TEST(CpuFusedMixDispatch, RepeatedCallsAreBitIdentical) {
  torch::manual_seed(61);
  std::vector<torch::Tensor> in = {torch::randn({8, 64, 32}), torch::randn({8, 64, 32}),
                                   torch::randn({8, 64, 32}), torch::randn({32}),
                                   torch::rand({32}) + 0.5, torch::rand({32}) + 0.5};
  Fn f = [](const std::vector<torch::Tensor>& x) {
    return cpu_fused::AttnResMix({x[0], x[1], x[2]}, x[3], x[4], x[5], 1e-6);
  };
  torch::Tensor probe = torch::randn({8, 64, 32});
  Outcome r1 = Evaluate(f, in, probe), r2 = Evaluate(f, in, probe);
  EXPECT_TRUE(torch::equal(r1.y, r2.y));
  for (size_t i = 0; i < r1.grads.size(); ++i) EXPECT_TRUE(torch::equal(r1.grads[i], r2.grads[i]));
}

}  // namespace
}  // namespace depthbench
