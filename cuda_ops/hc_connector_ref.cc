// CPU reference of hc_connector.cu (math in that file's opening comment).
// Same composites as trainer_core/model/hc.cc and mhc.cc.
#include "cuda_ops/reference.h"
#include "cuda_ops/reference_util.h"

namespace depthbench {
namespace reference {

torch::Tensor HcRead(const torch::Tensor& h, const torch::Tensor& read) {
  return (Up(read).unsqueeze(-1) * Up(h)).sum(-2).to(h.scalar_type());
}

HcReadGrads HcReadBackward(const torch::Tensor& dx, const torch::Tensor& h,
                           const torch::Tensor& read) {
  torch::Tensor dxf = Up(dx).unsqueeze(-2);  // [..., 1, d]
  torch::Tensor dh = Up(read).unsqueeze(-1) * dxf;
  torch::Tensor dread = (Up(h) * dxf).sum(-1);
  return {dh.to(h.scalar_type()), dread.to(read.scalar_type())};
}

torch::Tensor HcWrite(const torch::Tensor& h, const torch::Tensor& a, const torch::Tensor& b,
                      const torch::Tensor& y) {
  torch::Tensor hf = Up(h);
  torch::Tensor mixed = a.defined() ? torch::matmul(Up(a).transpose(-1, -2), hf) : hf;
  return (mixed + Up(b).unsqueeze(-1) * Up(y).unsqueeze(-2)).to(h.scalar_type());
}

HcWriteGrads HcWriteBackward(const torch::Tensor& dout, const torch::Tensor& h,
                             const torch::Tensor& a, const torch::Tensor& b,
                             const torch::Tensor& y) {
  torch::Tensor g = Up(dout), hf = Up(h), yf = Up(y);
  HcWriteGrads out;
  out.dh = (a.defined() ? torch::matmul(Up(a), g) : g).to(h.scalar_type());
  if (a.defined()) out.da = torch::matmul(hf, g.transpose(-1, -2)).to(a.scalar_type());
  out.db = (g * yf.unsqueeze(-2)).sum(-1).to(b.scalar_type());
  out.dy = (Up(b).unsqueeze(-1) * g).sum(-2).to(y.scalar_type());
  return out;
}

}  // namespace reference
}  // namespace depthbench
