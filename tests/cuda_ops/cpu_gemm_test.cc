// The dense layers' CPU GEMM through oneDNN (cuda_ops/cpu_gemm.h): the
// output and both gradients agree with the float64 product on the model's
// kinds of shapes (3-D activations, non-contiguous inputs, a non-leaf
// weight, empty batches), inside a parallel region (the trainer's
// micro-batches) as outside it; LinearOp takes it for float32 CPU tensors
// and torch::linear for the rest; LinearChunks' parts take their gradients
// one by one; bad shapes get an error naming them.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "cuda_ops/cpu_gemm.h"
#include "cuda_ops/ops.h"

namespace depthbench {
namespace {

struct LinearGrads {
  torch::Tensor y, dx, dw;
};

// y = fn(x, w), then backward of sum(y * probe).
template <typename Fn>
LinearGrads RunLinear(Fn&& fn, const torch::Tensor& x, const torch::Tensor& w,
                const torch::Tensor& probe) {
  torch::Tensor xl = x.detach().clone().requires_grad_(true);
  torch::Tensor wl = w.detach().clone().requires_grad_(true);
  torch::Tensor y = fn(xl, wl);
  (y * probe).sum().backward();
  return {y.detach(), xl.grad(), wl.grad()};
}

// The float64 product and its gradients.
LinearGrads Exact(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& probe) {
  LinearGrads g = RunLinear([](const torch::Tensor& a, const torch::Tensor& b) {
    return torch::linear(a, b);
  }, x.to(torch::kFloat64), w.to(torch::kFloat64), probe.to(torch::kFloat64));
  return {g.y.to(torch::kFloat32), g.dx.to(torch::kFloat32), g.dw.to(torch::kFloat32)};
}

// Float32 sums of K products: a few ulps of the operands' scale times sqrt(K).
void ExpectClose(const torch::Tensor& got, const torch::Tensor& want, int64_t k,
                 const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const double scale = want.abs().max().item<double>() + 1.0;
  const double err = (got - want).abs().max().item<double>();
  EXPECT_LE(err, 4e-7 * scale * std::sqrt(static_cast<double>(k)) * 4) << what;
}

class CpuGemmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cpu_gemm::Enabled()) {
      GTEST_SKIP() << "oneDNN sgemm not in use: " << cpu_gemm::Description()
                   << " (install libdnnl-dev and rebuild)";
    }
  }
};

TEST_F(CpuGemmTest, MatchesTheFloat64ProductAndItsGradients) {
  torch::manual_seed(7);
  // [B, T, K] x [N, K]: the model's projections at small and odd sizes,
  // with the LM head's N = 256 and a K that is not a multiple of 16.
  const std::vector<std::vector<int64_t>> shapes = {
      {2, 16, 128, 384}, {3, 7, 33, 17}, {1, 1, 1, 1}, {4, 32, 512, 256}, {2, 5, 200, 1408}};
  for (const auto& s : shapes) {
    const std::string what = "B=" + std::to_string(s[0]) + " T=" + std::to_string(s[1]) +
                             " K=" + std::to_string(s[2]) + " N=" + std::to_string(s[3]);
    torch::Tensor x = torch::randn({s[0], s[1], s[2]});
    torch::Tensor w = torch::randn({s[3], s[2]}) * 0.05;
    torch::Tensor probe = torch::randn({s[0], s[1], s[3]});
    LinearGrads got = RunLinear(cpu_gemm::Linear, x, w, probe);
    LinearGrads want = Exact(x, w, probe);
    ExpectClose(got.y, want.y, s[2], what + " y");
    ExpectClose(got.dx, want.dx, s[3], what + " dx");
    ExpectClose(got.dw, want.dw, s[0] * s[1], what + " dw");
  }
}

TEST_F(CpuGemmTest, TakesNonContiguousInputsAndNonLeafWeights) {
  torch::manual_seed(8);
  // x transposed in memory; w a concatenation of two parameters (the packed
  // Q/K/V and gate/up projections), whose gradient splits back into both.
  torch::Tensor x = torch::randn({24, 3, 40}).transpose(0, 1);  // [3, 24, 40], strided
  ASSERT_FALSE(x.is_contiguous());
  torch::Tensor a = torch::randn({16, 40}).requires_grad_(true);
  torch::Tensor b = torch::randn({8, 40}).requires_grad_(true);
  torch::Tensor probe = torch::randn({3, 24, 24});
  (cpu_gemm::Linear(x, torch::cat({a, b}, 0)) * probe).sum().backward();
  LinearGrads want = Exact(x, torch::cat({a, b}, 0).detach(), probe);
  ExpectClose(a.grad(), want.dw.narrow(0, 0, 16), 72, "a's gradient");
  ExpectClose(b.grad(), want.dw.narrow(0, 16, 8), 72, "b's gradient");
}

TEST_F(CpuGemmTest, EmptyBatchGivesEmptyOutputAndZeroWeightGradient) {
  torch::Tensor x = torch::randn({0, 5, 12});
  torch::Tensor w = torch::randn({6, 12});
  LinearGrads g = RunLinear(cpu_gemm::Linear, x, w, torch::ones({0, 5, 6}));
  EXPECT_EQ(g.y.sizes(), (std::vector<int64_t>{0, 5, 6}));
  EXPECT_EQ(g.dx.sizes(), x.sizes());
  EXPECT_TRUE(torch::equal(g.dw, torch::zeros_like(w)));
}

TEST_F(CpuGemmTest, InsideAParallelRegionAsOutside) {
  // The trainer runs one micro-batch per thread (trainer_core/micro_batch.h):
  // oneDNN then runs each GEMM on its calling thread alone.
  torch::manual_seed(9);
  torch::Tensor x = torch::randn({2, 64, 96});
  torch::Tensor w = torch::randn({80, 96});
  torch::Tensor probe = torch::randn({2, 64, 80});
  LinearGrads want = Exact(x, w, probe);
  std::vector<LinearGrads> got(4);
  at::parallel_for(0, 4, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) got[i] = RunLinear(cpu_gemm::Linear, x, w, probe);
  });
  for (size_t i = 0; i < got.size(); ++i) {
    ExpectClose(got[i].y, want.y, 96, "y, part " + std::to_string(i));
    ExpectClose(got[i].dx, want.dx, 80, "dx, part " + std::to_string(i));
    ExpectClose(got[i].dw, want.dw, 128, "dw, part " + std::to_string(i));
  }
}

TEST_F(CpuGemmTest, ChunksMatchTheFloat64ProductWithEachPartsGradient) {
  // MoDA's FFN K and V: two halves of one GEMM, as views of one output,
  // each gradient arriving on its own (here in the T-major layout the depth
  // slots get); with three parts, one of them unused (no gradient).
  torch::manual_seed(11);
  torch::Tensor x = torch::randn({2, 24, 40});
  torch::Tensor w = torch::randn({48, 40}) * 0.05;
  torch::Tensor probe = torch::randn({2, 24, 48});
  for (const int64_t parts : {1, 2, 3}) {
    const std::string what = "parts=" + std::to_string(parts);
    torch::Tensor xl = x.clone().requires_grad_(true), wl = w.clone().requires_grad_(true);
    std::vector<torch::Tensor> y = cpu_gemm::LinearChunks(xl, wl, parts);
    ASSERT_EQ(static_cast<int64_t>(y.size()), parts) << what;
    const int64_t np = 48 / parts;
    torch::Tensor loss = torch::zeros({});
    torch::Tensor used_probe = probe.clone();
    for (int64_t p = 0; p < parts; ++p) {
      ASSERT_EQ(y[p].sizes(), (std::vector<int64_t>{2, 24, np})) << what;
      if (parts == 3 && p == 1) {  // unused: its gradient is undefined
        used_probe.narrow(-1, p * np, np).zero_();
        continue;
      }
      // Through a transposed head view, as the model's slots.
      torch::Tensor heads = y[p].view({2, 24, 2, np / 2}).transpose(1, 2);
      loss = loss + (heads * probe.narrow(-1, p * np, np).view({2, 24, 2, np / 2}).transpose(1, 2)).sum();
    }
    if (parts > 1) EXPECT_EQ(y[1].data_ptr(), static_cast<float*>(y[0].data_ptr()) + np) << what;
    loss.backward();
    LinearGrads want = Exact(x, w, used_probe);
    for (int64_t p = 0; p < parts; ++p) {
      ExpectClose(y[p].detach(), want.y.narrow(-1, p * np, np), 40, what + " y");
    }
    ExpectClose(xl.grad(), want.dx, 48, what + " dx");
    ExpectClose(wl.grad(), want.dw, 48, what + " dw");
  }
  // The op takes it on float32 and chunks torch::linear elsewhere.
  torch::Tensor xd = x.to(torch::kFloat64), wd = w.to(torch::kFloat64);
  std::vector<torch::Tensor> yd = LinearChunksOp(xd, wd, 2);
  EXPECT_TRUE(torch::equal(yd[1], torch::linear(xd, wd).chunk(2, -1)[1]));
}

TEST_F(CpuGemmTest, DescriptionNamesOneDnn) {
  EXPECT_NE(cpu_gemm::Description().find("oneDNN"), std::string::npos) << cpu_gemm::Description();
  EXPECT_NE(FusedOpsDescription().find("oneDNN sgemm"), std::string::npos)
      << FusedOpsDescription();
}

TEST(CpuGemm, LinearOpTakesTorchLinearWhereOneDnnDoesNotApply) {
  // float64 (the golden tests' precision) and a 1-D weight are not oneDNN's.
  torch::manual_seed(10);
  torch::Tensor x = torch::randn({3, 9}, torch::kFloat64);
  torch::Tensor w = torch::randn({4, 9}, torch::kFloat64);
  EXPECT_FALSE(cpu_gemm::Supports(x, w));
  EXPECT_TRUE(torch::equal(LinearOp(x, w), torch::linear(x, w)));
  EXPECT_FALSE(cpu_gemm::Supports(x.to(torch::kFloat32), w.to(torch::kFloat32)[0]));
}

TEST(CpuGemm, MismatchedShapesNameBothOperands) {
  torch::Tensor x = torch::randn({3, 9});
  torch::Tensor w = torch::randn({4, 8});
  try {
    LinearOp(x, w);
    FAIL() << "LinearOp accepted K = 9 against K = 8";
  } catch (const c10::Error& e) {
    const std::string msg = e.what_without_backtrace();
    EXPECT_NE(msg.find("LinearOp"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[3, 9]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[4, 8]"), std::string::npos) << msg;
  }
  EXPECT_THROW(cpu_gemm::Linear(x.to(torch::kFloat64), w.to(torch::kFloat64)), c10::Error);
  // Output rows that do not split into the asked-for parts.
  try {
    LinearChunksOp(torch::randn({3, 8}), torch::randn({5, 8}), 2);
    FAIL() << "LinearChunksOp split 5 rows into 2 parts";
  } catch (const c10::Error& e) {
    const std::string msg = e.what_without_backtrace();
    EXPECT_NE(msg.find("LinearChunksOp: w's 5 output rows do not split into 2 equal parts"),
              std::string::npos)
        << msg;
  }
}

}  // namespace
}  // namespace depthbench
