// GPU tests: each fused op (ops.h on CUDA tensors) against its CPU reference
// in fp64, forward and backward, in fp32 and bf16. They skip, saying why,
// where the fused path cannot run (no CUDA LibTorch, or no device); their CPU
// twins in reference_test.cc always run.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "cuda_ops/ops.h"
#include "cuda_ops/reference.h"
#include "tests/cuda_ops/gradcheck.h"

namespace depthbench {
namespace {

namespace ref = reference;
using Fn = std::function<torch::Tensor(const std::vector<torch::Tensor>&)>;

#define REQUIRE_FUSED_CUDA()                                                          \
  do {                                                                                \
    if (!FusedOpsCompiled())                                                          \
      GTEST_SKIP() << "fused ops not compiled: LibTorch built without CUDA (Debian's " \
                      "libtorch is CPU-only) or no nvcc";                             \
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible";       \
  } while (0)

struct Tolerance {
  double rtol, atol;
};

struct DtypeCase {
  torch::Dtype dtype;
  Tolerance fwd, bwd;
  std::string name;
};

// Short names in test listings (ctest) instead of a byte dump.
void PrintTo(const DtypeCase& c, std::ostream* os) { *os << c.name; }

class FusedOpTest : public ::testing::TestWithParam<DtypeCase> {};

// inputs: CPU fp64 values; is_activation[i] says whether input i takes the
// test dtype on the fused path (parameters and coefficients stay fp32).
void CheckOp(const Fn& fused, const Fn& reference, std::vector<torch::Tensor> inputs,
             const std::vector<bool>& is_activation, const DtypeCase& c) {
  std::vector<torch::Tensor> dev, cpu;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const torch::Dtype t = is_activation[i] ? c.dtype : torch::kFloat32;
    torch::Tensor rounded = inputs[i].to(t);  // both paths see the same values
    dev.push_back(rounded.to(torch::kCUDA).detach().requires_grad_(true));
    cpu.push_back(rounded.to(torch::kFloat64).detach().requires_grad_(true));
  }
  torch::Tensor y_dev = fused(dev);
  torch::Tensor y_cpu = reference(cpu);
  ASSERT_EQ(y_dev.sizes(), y_cpu.sizes());
  EXPECT_TRUE(testing::AllClose(y_dev, y_cpu, c.fwd.rtol, c.fwd.atol))
      << c.name << " forward, max abs diff " << testing::MaxAbsDiff(y_dev, y_cpu);
  torch::manual_seed(99);
  torch::Tensor probe = torch::randn(y_cpu.sizes(), torch::kFloat64);
  (y_dev * probe.to(y_dev.device(), y_dev.scalar_type())).sum().backward();
  (y_cpu * probe).sum().backward();
  for (size_t i = 0; i < inputs.size(); ++i) {
    ASSERT_TRUE(dev[i].grad().defined()) << c.name << " input " << i;
    EXPECT_TRUE(testing::AllClose(dev[i].grad(), cpu[i].grad(), c.bwd.rtol, c.bwd.atol))
        << c.name << " grad of input " << i << ", max abs diff "
        << testing::MaxAbsDiff(dev[i].grad(), cpu[i].grad());
  }
}

TEST_P(FusedOpTest, RmsNorm) {
  REQUIRE_FUSED_CUDA();
  torch::manual_seed(0);
  CheckOp([](const auto& in) { return RmsNormOp(in[0], in[1], 1e-6); },
          [](const auto& in) { return ref::RmsNorm(in[0], in[1], 1e-6); },
          {torch::randn({4, 33, 1024}, torch::kFloat64), torch::rand({1024}, torch::kFloat64) + 0.5},
          {true, false}, GetParam());
}

TEST_P(FusedOpTest, SwiGluGate) {
  REQUIRE_FUSED_CUDA();
  torch::manual_seed(1);
  CheckOp([](const auto& in) { return SwiGluGateOp(in[0], in[1]); },
          [](const auto& in) { return ref::SwiGluGate(in[0], in[1]); },
          {torch::randn({3, 17, 2736}, torch::kFloat64) * 3, torch::randn({3, 17, 2736}, torch::kFloat64)},
          {true, true}, GetParam());
}

TEST_P(FusedOpTest, AttnResMixFullAndBlockSourceCounts) {
  REQUIRE_FUSED_CUDA();
  for (int S : {1, 2, 9, 49}) {  // block-0 FFN, Block AttnRes head, Full AttnRes head at L=24
    torch::manual_seed(2 + S);
    std::vector<torch::Tensor> in;
    std::vector<bool> act;
    for (int i = 0; i < S; ++i) {
      in.push_back(torch::randn({2, 40, 1024}, torch::kFloat64) * (1 + 0.1 * i));
      act.push_back(true);
    }
    in.push_back(torch::randn({1024}, torch::kFloat64) * 0.2);  // query
    in.push_back(torch::rand({1024}, torch::kFloat64) + 0.5);   // key gain
    in.push_back(torch::rand({1024}, torch::kFloat64) + 0.5);   // out gain
    for (int k = 0; k < 3; ++k) act.push_back(false);
    auto split = [S](const std::vector<torch::Tensor>& v) {
      return std::vector<torch::Tensor>(v.begin(), v.begin() + S);
    };
    CheckOp([&](const auto& v) { return AttnResMixOp(split(v), v[S], v[S + 1], v[S + 2], 1e-6); },
            [&](const auto& v) { return ref::AttnResMix(split(v), v[S], v[S + 1], v[S + 2], 1e-6); },
            in, act, GetParam());
  }
}

TEST_P(FusedOpTest, SinkhornIsFp32Only) {
  REQUIRE_FUSED_CUDA();
  if (GetParam().dtype != torch::kFloat32) GTEST_SKIP() << "mHC routing (Sinkhorn) is fp32 by spec";
  for (int64_t n : {2, 4, 8}) {
    torch::manual_seed(10 + n);
    CheckOp([](const auto& in) { return SinkhornOp(in[0]); },
            [](const auto& in) { return ref::Sinkhorn(in[0]); },
            {torch::randn({2, 2048, n, n}, torch::kFloat64)}, {false}, GetParam());
  }
}

TEST_P(FusedOpTest, HcReadAndWrite) {
  REQUIRE_FUSED_CUDA();
  for (int64_t n : {2, 4, 8}) {
    torch::manual_seed(20 + n);
    const int64_t B = 2, T = 33, d = 1024;
    torch::Tensor h = torch::randn({B, T, n, d}, torch::kFloat64);
    torch::Tensor read = torch::randn({B, T, n}, torch::kFloat64);
    torch::Tensor a = torch::randn({B, T, n, n}, torch::kFloat64);
    torch::Tensor b = torch::randn({B, T, n}, torch::kFloat64);
    torch::Tensor y = torch::randn({B, T, d}, torch::kFloat64);
    CheckOp([](const auto& in) { return HcReadOp(in[0], in[1]); },
            [](const auto& in) { return ref::HcRead(in[0], in[1]); }, {h, read}, {true, false},
            GetParam());
    CheckOp([](const auto& in) { return HcWriteOp(in[0], in[1], in[2], in[3]); },
            [](const auto& in) { return ref::HcWrite(in[0], in[1], in[2], in[3]); },
            {h, a, b, y}, {true, false, false, true}, GetParam());
    // Code form: residual map = identity.
    CheckOp([](const auto& in) { return HcWriteOp(in[0], torch::Tensor(), in[1], in[2]); },
            [](const auto& in) { return ref::HcWrite(in[0], torch::Tensor(), in[1], in[2]); },
            {h, b, y}, {true, false, true}, GetParam());
  }
}

// bf16: inputs are rounded to bf16 first, so the differences are the
// output's own rounding (8 bits of mantissa) plus fp32-vs-fp64 accumulation.
INSTANTIATE_TEST_SUITE_P(
    Dtypes, FusedOpTest,
    ::testing::Values(DtypeCase{torch::kFloat32, {1e-4, 1e-5}, {1e-3, 1e-4}, "fp32"},
                      DtypeCase{torch::kBFloat16, {1.6e-2, 1e-2}, {3e-2, 3e-2}, "bf16"}),
    [](const ::testing::TestParamInfo<DtypeCase>& info) { return info.param.name; });

}  // namespace
}  // namespace depthbench
