// CPU reference of attnres_mix.cu (math in that file's opening comment).
// Matches trainer_core's AttnResMix followed by the consuming sub-layer's
// pre-norm (RmsNorm), composed from LibTorch ops.
#include "cuda_ops/reference.h"
#include "cuda_ops/reference_util.h"

namespace depthbench {
namespace reference {
namespace {

torch::Tensor Stack(const std::vector<torch::Tensor>& sources) {
  TORCH_CHECK(!sources.empty(), "AttnResMix: no sources");
  std::vector<torch::Tensor> up;
  up.reserve(sources.size());
  for (const auto& s : sources) up.push_back(Up(s));
  return torch::stack(up, -2);  // [..., S, d]
}

torch::Tensor Logits(const torch::Tensor& v, const torch::Tensor& query,
                     const torch::Tensor& key_gain, double eps) {
  if (!query.defined()) return torch::zeros(v.sizes().slice(0, v.dim() - 1), v.options());
  torch::Tensor keys = v * torch::rsqrt(v.pow(2).mean(-1, true) + eps) * Up(key_gain);
  return torch::matmul(keys, Up(query));  // [..., S]
}

}  // namespace

torch::Tensor AttnResMixWeights(const std::vector<torch::Tensor>& sources,
                                const torch::Tensor& query, const torch::Tensor& key_gain,
                                double eps) {
  return torch::softmax(Logits(Stack(sources), query, key_gain, eps), -1);
}

torch::Tensor AttnResMix(const std::vector<torch::Tensor>& sources, const torch::Tensor& query,
                         const torch::Tensor& key_gain, const torch::Tensor& out_gain,
                         double eps) {
  torch::Tensor v = Stack(sources);
  torch::Tensor p = torch::softmax(Logits(v, query, key_gain, eps), -1);
  torch::Tensor m = (p.unsqueeze(-1) * v).sum(-2);
  torch::Tensor y = m * torch::rsqrt(m.pow(2).mean(-1, true) + eps) * Up(out_gain);
  return y.to(sources[0].scalar_type());
}

AttnResGrads AttnResMixBackward(const torch::Tensor& dy,
                                const std::vector<torch::Tensor>& sources,
                                const torch::Tensor& query, const torch::Tensor& key_gain,
                                const torch::Tensor& out_gain, double eps) {
  torch::NoGradGuard no_grad;
  const int64_t d = sources[0].size(-1);
  torch::Tensor v = Stack(sources);                                 // [..., S, d]
  torch::Tensor q = query.defined() ? Up(query) : torch::zeros({d}, v.options());
  torch::Tensor kg = key_gain.defined() ? Up(key_gain) : torch::ones({d}, v.options());
  torch::Tensor go = Up(out_gain), g = Up(dy);
  torch::Tensor a = q * kg;
  torch::Tensor r = torch::rsqrt(v.pow(2).mean(-1) + eps);          // [..., S]
  torch::Tensor logit = torch::matmul(v, a) * r;                     // [..., S]
  torch::Tensor p = torch::softmax(logit, -1);
  torch::Tensor m = (p.unsqueeze(-1) * v).sum(-2);                   // [..., d]
  torch::Tensor s = torch::rsqrt(m.pow(2).mean(-1, true) + eps);     // [..., 1]
  torch::Tensor gout = go * g;
  torch::Tensor dm = s * (gout - m * s.pow(2) * (gout * m).mean(-1, true));
  torch::Tensor dgo = (g * m * s).reshape({-1, d}).sum(0);
  torch::Tensor dp = torch::matmul(v, dm.unsqueeze(-1)).squeeze(-1);  // [..., S]
  torch::Tensor dlogit = p * (dp - (p * dp).sum(-1, true));
  torch::Tensor coef = (r * logit / static_cast<double>(d)).unsqueeze(-1);  // [..., S, 1]
  torch::Tensor dv = p.unsqueeze(-1) * dm.unsqueeze(-2) +
                     (dlogit * r).unsqueeze(-1) * (a - v * coef);
  torch::Tensor da = ((dlogit * r).unsqueeze(-1) * v).reshape({-1, d}).sum(0);
  AttnResGrads out;
  for (int64_t i = 0; i < static_cast<int64_t>(sources.size()); ++i) {
    out.dsources.push_back(dv.select(-2, i).to(sources[i].scalar_type()));
  }
  out.dquery = da * kg;
  out.dkey_gain = da * q;
  out.dout_gain = dgo;
  return out;
}

}  // namespace reference
}  // namespace depthbench
