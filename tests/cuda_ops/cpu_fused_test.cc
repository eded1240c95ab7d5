// CPU tests of the fused CPU RMSNorm kernel (cuda_ops/cpu_fused.h): values
// and gradients equal the composite reference on odd sizes, non-contiguous
// inputs and one or two threads; a finite-difference gradcheck in double;
// the dispatcher takes it for CPU tensors and the reference when fused ops
// are disabled; repeated calls are bit-identical; the kernels' parallel
// loops really run on the intra-op threads (compiled with OpenMP). The
// same for the SwiGLU gate on the packed projection (SwiGluPacked), over the
// whole range of the gate (its sigmoid from an exp of -|g|).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

#include "cuda_ops/cpu_fused.h"
#include "cuda_ops/cpu_fused_isa.h"
#include "cuda_ops/ops.h"
#include "cuda_ops/reference.h"
#include "tests/cuda_ops/gradcheck.h"
#include "tests/cuda_ops/isa_builds.h"

namespace depthbench {
namespace {

using testing::AllClose;
using testing::GradCheck;

torch::Tensor Leaf(const torch::Tensor& t) { return t.detach().clone().requires_grad_(true); }

struct Grads {
  torch::Tensor y, dx, dw;
};

template <typename Fn>
Grads RunNorm(Fn&& fn, const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& probe) {
  torch::Tensor xl = Leaf(x), wl = Leaf(w);
  torch::Tensor y = fn(xl, wl);
  (y * probe).sum().backward();
  return {y.detach(), xl.grad(), wl.grad()};
}

// at::parallel_for is serial in a file compiled without -fopenmp (ATen's
// OpenMP backend is a header template): the kernels then ignore
// torch::set_num_threads. Every ISA build of the kernel objects must fan out.
TEST(CpuFusedThreads, KernelLoopsRunOnEveryIntraOpThread) {
  const int saved = torch::get_num_threads();
  torch::set_num_threads(2);
  EXPECT_EQ(cpu_fused::generic::ParallelForThreads(), 2);
  if (cpu_fused::Avx2Available()) {
    EXPECT_EQ(cpu_fused::avx2::ParallelForThreads(), 2);
  }
  if (cpu_fused::Avx512Available()) {
    EXPECT_EQ(cpu_fused::avx512::ParallelForThreads(), 2);
  }
  torch::set_num_threads(1);
  EXPECT_EQ(cpu_fused::generic::ParallelForThreads(), 1);
  torch::set_num_threads(saved);
}

class CpuFusedRmsNorm : public ::testing::TestWithParam<int> {};

TEST_P(CpuFusedRmsNorm, EqualsReferenceValuesAndGradients) {
  const int threads = GetParam();
  const int saved_threads = torch::get_num_threads();
  torch::set_num_threads(threads);
  torch::manual_seed(threads);
  // d = 16, an odd 33, and the model's 128; rows from 1 to 4096 (several
  // parallel chunks); one input transposed (non-contiguous).
  const std::vector<std::vector<int64_t>> shapes = {{3, 5, 16}, {7, 33}, {1, 128}, {16, 256, 128}};
  for (const auto& shape : shapes) {
    for (bool transposed : {false, true}) {
      SCOPED_TRACE(::testing::Message() << torch::IntArrayRef(shape) << (transposed ? " transposed" : ""));
      torch::Tensor x = torch::randn(shape) * 3;
      if (transposed && shape.size() == 3) x = x.transpose(0, 1).contiguous().transpose(0, 1);
      torch::Tensor w = torch::rand({shape.back()}) + 0.5;
      torch::Tensor probe = torch::randn(shape);
      Grads fused = RunNorm([](auto& a, auto& b) { return cpu_fused::RmsNorm(a, b, 1e-6); }, x, w, probe);
      Grads ref = RunNorm([](auto& a, auto& b) { return reference::RmsNorm(a, b, 1e-6); }, x, w, probe);
      EXPECT_TRUE(AllClose(fused.y, ref.y, 1e-5, 1e-6));
      EXPECT_TRUE(AllClose(fused.dx, ref.dx, 1e-4, 1e-5));
      EXPECT_TRUE(AllClose(fused.dw, ref.dw, 1e-4, 1e-4));
    }
  }
  torch::set_num_threads(saved_threads);
}

INSTANTIATE_TEST_SUITE_P(Threads, CpuFusedRmsNorm, ::testing::Values(1, 2),
                         [](const auto& info) { return "threads" + std::to_string(info.param); });

TEST(CpuFusedRmsNormCheck, GradcheckInDouble) {
  torch::manual_seed(5);
  const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  torch::Tensor x = torch::randn({4, 7}, f64).requires_grad_(true);
  torch::Tensor w = (torch::rand({7}, f64) + 0.5).requires_grad_(true);
  EXPECT_EQ(GradCheck([](const std::vector<torch::Tensor>& in) {
              return cpu_fused::RmsNorm(in[0], in[1], 1e-6);
            }, {x, w}), "");
}

TEST(CpuFusedRmsNormCheck, DispatcherUsesItOnCpuAndTheReferenceWhenDisabled) {
  torch::manual_seed(6);
  torch::Tensor x = torch::randn({8, 24}), w = torch::rand({24}) + 0.5;
  EXPECT_TRUE(cpu_fused::Supports({&x, &w}));
  torch::Tensor half = x.to(torch::kBFloat16);
  EXPECT_FALSE(cpu_fused::Supports({&half, &w}));  // dtype mismatch / bf16
  EXPECT_TRUE(torch::equal(RmsNormOp(x, w, 1e-6), cpu_fused::RmsNorm(x, w, 1e-6)));
  SetFusedOpsEnabled(false);
  EXPECT_TRUE(torch::equal(RmsNormOp(x, w, 1e-6), reference::RmsNorm(x, w, 1e-6)));
  EXPECT_NE(FusedOpsDescription().find("disabled"), std::string::npos) << FusedOpsDescription();
  SetFusedOpsEnabled(true);
  EXPECT_NE(FusedOpsDescription().find("CPU: fused RMSNorm"), std::string::npos)
      << FusedOpsDescription();
  // bf16 CPU tensors take the composite.
  torch::Tensor wh = w.to(torch::kBFloat16);
  EXPECT_TRUE(torch::equal(RmsNormOp(half, wh, 1e-6), reference::RmsNorm(half, wh, 1e-6)));
}

TEST(CpuFusedRmsNormCheck, RepeatedCallsAreBitIdentical) {
  torch::manual_seed(7);
  torch::Tensor x = torch::randn({512, 96}), w = torch::rand({96}) + 0.5;
  torch::Tensor probe = torch::randn({512, 96});
  Grads a = RunNorm([](auto& p, auto& q) { return cpu_fused::RmsNorm(p, q, 1e-6); }, x, w, probe);
  Grads b = RunNorm([](auto& p, auto& q) { return cpu_fused::RmsNorm(p, q, 1e-6); }, x, w, probe);
  EXPECT_TRUE(torch::equal(a.y, b.y));
  EXPECT_TRUE(torch::equal(a.dx, b.dx));
  EXPECT_TRUE(torch::equal(a.dw, b.dw));
}

TEST(CpuFusedRmsNormCheck, RejectsAWeightOfTheWrongSize) {
  torch::Tensor x = torch::randn({2, 8}), w = torch::ones({7});
  EXPECT_THROW(cpu_fused::RmsNorm(x, w, 1e-6), c10::Error);
}

// SwiGluPacked against chunk + the composite gate evaluated in double.
struct GateGrads {
  torch::Tensor y, dgu;
};
GateGrads RunGate(const std::function<torch::Tensor(const torch::Tensor&)>& fn,
                  const torch::Tensor& gu, const torch::Tensor& probe) {
  torch::Tensor l = Leaf(gu);
  torch::Tensor y = fn(l);
  (y * probe.to(y.scalar_type())).sum().backward();
  return {y.detach(), l.grad()};
}
torch::Tensor ComposedGate(const torch::Tensor& gu) {
  std::vector<torch::Tensor> g_u = gu.chunk(2, -1);
  return reference::SwiGluGate(g_u[0], g_u[1]);
}

class CpuFusedSwiGlu : public testing::ThreadsTest {};

TEST_P(CpuFusedSwiGlu, EqualsTheCompositeInDouble) {
  torch::manual_seed(20 + GetParam());
  // F = 8 (one vector), 13 (a partial one), 344 (the d = 128 model) and
  // 1368 over 4096 rows (several parallel chunks); one input a
  // non-contiguous view; gates out to +-100, where exp(-g) overflows float.
  const std::vector<std::vector<int64_t>> shapes = {{3, 16}, {5, 26}, {2, 64, 688}, {4096, 2736}};
  for (const auto& shape : shapes) {
    for (bool strided : {false, true}) {
      SCOPED_TRACE(::testing::Message() << torch::IntArrayRef(shape) << (strided ? " strided" : ""));
      torch::Tensor gu = torch::randn(shape) * 4;
      gu.view({-1})[0] = 100.0;
      gu.view({-1})[1] = -100.0;
      if (strided) gu = torch::cat({gu, gu}, -1).narrow(-1, 1, shape.back());
      std::vector<int64_t> out_shape = shape;
      out_shape.back() /= 2;
      torch::Tensor probe = torch::randn(out_shape);
      const GateGrads fused = RunGate([](const auto& x) { return cpu_fused::SwiGluPacked(x); }, gu, probe);
      const GateGrads ref = RunGate(ComposedGate, gu.to(torch::kFloat64), probe);
      ASSERT_EQ(fused.y.sizes(), ref.y.sizes());
      EXPECT_LE(testing::MaxAbsDiff(fused.y.to(torch::kFloat64), ref.y),
                2e-6 * ref.y.abs().max().item<double>());
      EXPECT_LE(testing::MaxAbsDiff(fused.dgu.to(torch::kFloat64), ref.dgu),
                2e-6 * ref.dgu.abs().max().item<double>());
      EXPECT_TRUE(torch::isfinite(fused.dgu).all().item<bool>());
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, CpuFusedSwiGlu, ::testing::Values(1, 2),
                         [](const auto& info) { return "threads" + std::to_string(info.param); });

TEST(CpuFusedSwiGluCheck, GradcheckInDouble) {
  torch::manual_seed(21);
  torch::Tensor gu = (torch::randn({3, 5, 14}, torch::kFloat64) * 3).requires_grad_(true);
  EXPECT_EQ(GradCheck([](const std::vector<torch::Tensor>& in) { return cpu_fused::SwiGluPacked(in[0]); },
                      {gu}),
            "");
}

TEST(CpuFusedSwiGluCheck, WideAndBaselineBuildsAgree) {
  const std::vector<testing::Build> wide = testing::WideBuilds();
  if (wide.empty()) GTEST_SKIP() << testing::kNoWideBuild;
  torch::manual_seed(22);
  torch::Tensor gu = torch::randn({37, 2 * 45}) * 5, probe = torch::randn({37, 45});
  const GateGrads g = RunGate([](const auto& x) { return cpu_fused::generic::SwiGluPacked(x); }, gu, probe);
  for (testing::Build b : wide) {
    SCOPED_TRACE(testing::BuildName(b));
    const GateGrads a = RunGate([b](const auto& x) { return DB_BUILD_CALL(b, SwiGluPacked, x); }, gu, probe);
    EXPECT_TRUE(AllClose(a.y, g.y, 1e-6, 1e-7));
    EXPECT_TRUE(AllClose(a.dgu, g.dgu, 1e-6, 1e-7));
  }
}

TEST(CpuFusedSwiGluCheck, DispatcherUsesItOnCpuAndTheCompositeWhenDisabled) {
  torch::manual_seed(23);
  torch::Tensor gu = torch::randn({6, 10, 40});
  EXPECT_TRUE(torch::equal(SwiGluPackedOp(gu), cpu_fused::SwiGluPacked(gu)));
  EXPECT_NE(FusedOpsDescription().find("SwiGLU gate"), std::string::npos) << FusedOpsDescription();
  SetFusedOpsEnabled(false);
  torch::Tensor composite = SwiGluPackedOp(gu);
  SetFusedOpsEnabled(true);
  EXPECT_TRUE(torch::equal(composite, ComposedGate(gu)));
  EXPECT_TRUE(AllClose(composite, cpu_fused::SwiGluPacked(gu), 1e-5, 1e-6));
  // bf16 takes the composite.
  torch::Tensor half = gu.to(torch::kBFloat16);
  EXPECT_TRUE(torch::equal(SwiGluPackedOp(half), ComposedGate(half)));
}

TEST(CpuFusedSwiGluCheck, AnOddLastDimIsRejectedByName) {
  torch::Tensor gu = torch::randn({4, 7});
  for (const auto& [name, fn] : std::vector<std::pair<std::string, std::function<void()>>>{
           {"SwiGluPackedOp: gu", [&] { SwiGluPackedOp(gu); }},
           {"SwiGluPacked: gu", [&] { cpu_fused::SwiGluPacked(gu); }}}) {
    try {
      fn();
      ADD_FAILURE() << "no error from " << name;
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  }
}

// AdamWStep against the update written out in double, for each build, with
// a gradient and without one (a zero gradient), over a size with a vector
// tail; and its input check.
TEST(CpuFusedAdamWCheck, EveryBuildMatchesTheUpdateInDouble) {
  torch::manual_seed(23);
  const int64_t n = 16 * 37 + 5;
  const torch::Tensor p0 = torch::randn({n}), g = torch::randn({n});
  const torch::Tensor m0 = torch::randn({n}) * 0.1, v0 = torch::rand({n}) * 0.01;
  const double lr = 2e-3, wd = 0.1, beta1 = 0.9, beta2 = 0.95, step = 3;
  const double bc1 = 1 - std::pow(beta1, step), bc2 = 1 - std::pow(beta2, step);
  const auto c = cpu_fused::AdamWCoefficients::For(lr, wd, beta1, beta2, 1e-8, step);
  std::vector<testing::Build> builds = testing::WideBuilds();
  builds.push_back(testing::Build::kGeneric);
  for (bool with_grad : {true, false}) {
    const torch::Tensor gd = with_grad ? g.to(torch::kFloat64) : torch::zeros({n}, torch::kFloat64);
    const torch::Tensor m = m0.to(torch::kFloat64) * beta1 + (1 - beta1) * gd;
    const torch::Tensor v = v0.to(torch::kFloat64) * beta2 + (1 - beta2) * gd * gd;
    const torch::Tensor want = p0.to(torch::kFloat64) * (1 - lr * wd) -
                               (lr / bc1) * m / (v.sqrt() / std::sqrt(bc2) + 1e-8);
    for (testing::Build b : builds) {
      SCOPED_TRACE(::testing::Message() << testing::BuildName(b) << (with_grad ? "" : ", no gradient"));
      torch::Tensor p = p0.clone(), mm = m0.clone(), vv = v0.clone();
      DB_BUILD_CALL(b, AdamWStep, p, with_grad ? g : torch::Tensor(), mm, vv, c);
      EXPECT_TRUE(AllClose(mm, m.to(torch::kFloat32), 1e-6, 1e-7));  // ulps of terms ~0.3
      EXPECT_TRUE(AllClose(vv, v.to(torch::kFloat32), 1e-6, 1e-10));
      EXPECT_TRUE(AllClose(p, want.to(torch::kFloat32), 1e-6, 1e-7));
      // The update itself, not only the decay, happened.
      EXPECT_GT((p - p0 * c.decay).abs().max().item<double>(), 1e-4);
    }
  }
  torch::Tensor p = p0.clone(), mm = m0.clone();
  for (const auto& [what, call] : std::vector<std::pair<std::string, std::function<void()>>>{
           {"exp_avg_sq [3]", [&] { cpu_fused::AdamWStep(p, g, mm, torch::zeros({3}), c); }},
           {"grad [" + std::to_string(n) + "]",
            [&] { cpu_fused::AdamWStep(p, g.to(torch::kFloat64), mm, mm.clone(), c); }}}) {
    try {
      call();
      ADD_FAILURE() << "no error for a bad " << what;
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("AdamWStep: param"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  }
  EXPECT_TRUE(torch::equal(p, p0));  // a rejected call writes nothing
}

}  // namespace
}  // namespace depthbench
