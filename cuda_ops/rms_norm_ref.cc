// CPU reference of rms_norm.cu (math in that file's opening comment).
#include "cuda_ops/reference.h"
#include "cuda_ops/reference_util.h"

namespace depthbench {
namespace reference {

torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  torch::Tensor xf = Up(x);
  torch::Tensor y = xf * torch::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps) * Up(weight);
  return y.to(x.scalar_type());
}

RmsNormGrads RmsNormBackward(const torch::Tensor& dy, const torch::Tensor& x,
                             const torch::Tensor& weight, double eps) {
  torch::Tensor xf = Up(x), dyf = Up(dy), w = Up(weight);
  torch::Tensor r = torch::rsqrt(xf.pow(2).mean(-1, true) + eps);
  torch::Tensor g = dyf * w;
  torch::Tensor dx = r * (g - xf * r.pow(2) * (g * xf).mean(-1, true));
  torch::Tensor dw = (dyf * xf * r).reshape({-1, x.size(-1)}).sum(0);
  return {dx.to(x.scalar_type()), dw.to(weight.scalar_type())};
}

}  // namespace reference
}  // namespace depthbench
