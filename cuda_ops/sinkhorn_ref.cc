// CPU reference of sinkhorn.cu (math in that file's opening comment). Same
// composite as trainer_core/model/mhc.cc's SinkhornKnopp.
#include <cmath>

#include "cuda_ops/reference.h"

namespace depthbench {
namespace reference {
namespace {

torch::Tensor RowStep(const torch::Tensor& z, const torch::Tensor& log_eps) {
  return z - torch::logaddexp(torch::logsumexp(z, -1, /*keepdim=*/true), log_eps);
}
torch::Tensor ColStep(const torch::Tensor& z, const torch::Tensor& log_eps) {
  return z - torch::logaddexp(torch::logsumexp(z, -2, /*keepdim=*/true), log_eps);
}

}  // namespace

torch::Tensor Sinkhorn(const torch::Tensor& logits, int iterations, double eps) {
  torch::Tensor log_eps = torch::scalar_tensor(std::log(eps), logits.options());
  torch::Tensor z = logits;
  for (int i = 0; i < iterations; ++i) z = ColStep(RowStep(z, log_eps), log_eps);
  return torch::exp(z);
}

torch::Tensor SinkhornBackward(const torch::Tensor& dout, const torch::Tensor& logits,
                               int iterations, double eps) {
  torch::NoGradGuard no_grad;
  torch::Tensor log_eps = torch::scalar_tensor(std::log(eps), logits.options());
  std::vector<torch::Tensor> starts;  // input of each iteration
  torch::Tensor z = logits;
  for (int i = 0; i < iterations; ++i) {
    starts.push_back(z);
    z = ColStep(RowStep(z, log_eps), log_eps);
  }
  torch::Tensor g = dout * torch::exp(z);
  for (int i = iterations - 1; i >= 0; --i) {
    g = g - torch::exp(z) * g.sum(-2, /*keepdim=*/true);       // column step, output z
    torch::Tensor zr = RowStep(starts[i], log_eps);
    g = g - torch::exp(zr) * g.sum(-1, /*keepdim=*/true);      // row step, output zr
    z = starts[i];
  }
  return g;
}

}  // namespace reference
}  // namespace depthbench
