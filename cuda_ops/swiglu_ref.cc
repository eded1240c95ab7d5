// CPU reference of swiglu.cu (math in that file's opening comment).
#include "cuda_ops/reference.h"
#include "cuda_ops/reference_util.h"

namespace depthbench {
namespace reference {

torch::Tensor SwiGluGate(const torch::Tensor& g, const torch::Tensor& u) {
  return (torch::silu(Up(g)) * Up(u)).to(g.scalar_type());
}

SwiGluGrads SwiGluGateBackward(const torch::Tensor& dh, const torch::Tensor& g,
                               const torch::Tensor& u) {
  torch::Tensor gf = Up(g), uf = Up(u), d = Up(dh);
  torch::Tensor s = torch::sigmoid(gf);
  torch::Tensor dg = d * uf * s * (1 + gf * (1 - s));
  torch::Tensor du = d * gf * s;
  return {dg.to(g.scalar_type()), du.to(u.scalar_type())};
}

}  // namespace reference
}  // namespace depthbench
