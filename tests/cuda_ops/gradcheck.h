// A small finite-difference gradient check for tests (LibTorch C++ has no
// torch.autograd.gradcheck). Inputs must be double tensors with
// requires_grad; the function's outputs are reduced with fixed random
// weights so every output element takes part.
#ifndef DEPTHBENCH_TESTS_CUDA_OPS_GRADCHECK_H_
#define DEPTHBENCH_TESTS_CUDA_OPS_GRADCHECK_H_

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

namespace depthbench {
namespace testing {

// Returns "" on success, else a description of the first mismatch.
inline std::string GradCheck(
    const std::function<torch::Tensor(const std::vector<torch::Tensor>&)>& f,
    const std::vector<torch::Tensor>& inputs, double eps = 1e-6, double atol = 1e-6,
    double rtol = 1e-4) {
  torch::Tensor probe;
  {
    torch::NoGradGuard no_grad;
    torch::Tensor out = f(inputs);
    torch::manual_seed(1234);
    probe = torch::randn_like(out);
  }
  for (auto& x : inputs) {
    if (x.grad().defined()) x.mutable_grad().zero_();
  }
  torch::Tensor loss = (f(inputs) * probe).sum();
  std::vector<torch::Tensor> analytic = torch::autograd::grad({loss}, inputs);
  torch::NoGradGuard no_grad;
  for (size_t k = 0; k < inputs.size(); ++k) {
    torch::Tensor x = inputs[k];
    torch::Tensor flat = x.detach().view({-1});  // shares storage
    torch::Tensor a = analytic[k].reshape({-1});
    for (int64_t i = 0; i < flat.numel(); ++i) {
      const double orig = flat[i].item<double>();
      flat[i] = orig + eps;
      const double up = (f(inputs) * probe).sum().item<double>();
      flat[i] = orig - eps;
      const double down = (f(inputs) * probe).sum().item<double>();
      flat[i] = orig;
      const double numeric = (up - down) / (2 * eps);
      const double got = a[i].item<double>();
      if (std::abs(numeric - got) > atol + rtol * std::abs(numeric)) {
        return "input " + std::to_string(k) + " element " + std::to_string(i) +
               ": numeric " + std::to_string(numeric) + " analytic " + std::to_string(got);
      }
    }
  }
  return "";
}

// Max |a - b| / (atol + rtol |b|) <= 1 elementwise.
inline bool AllClose(const torch::Tensor& a, const torch::Tensor& b, double rtol, double atol) {
  return torch::allclose(a.to(torch::kFloat64).cpu(), b.to(torch::kFloat64).cpu(), rtol, atol);
}

inline double MaxAbsDiff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat64).cpu() - b.to(torch::kFloat64).cpu()).abs().max().item<double>();
}

// A test parameterised by LibTorch's intra-op thread count, restored after.
class ThreadsTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    saved_ = torch::get_num_threads();
    torch::set_num_threads(GetParam());
  }
  void TearDown() override { torch::set_num_threads(saved_); }
  int saved_ = 1;
};

}  // namespace testing
}  // namespace depthbench

#endif  // DEPTHBENCH_TESTS_CUDA_OPS_GRADCHECK_H_
