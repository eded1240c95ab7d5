#include "trainer_core/model/layers.h"

#include "cuda_ops/ops.h"

#include <cmath>
#include <limits>

namespace depthbench {

RmsNormImpl::RmsNormImpl(int64_t dim, double eps, bool affine) : eps_(eps) {
  if (affine) weight = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor RmsNormalize(const torch::Tensor& x, double eps) {
  return x * torch::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + eps);
}

torch::Tensor RmsNormImpl::forward(const torch::Tensor& x) {
  // The dispatcher runs the fused CUDA kernel on CUDA tensors and the same
  // composite ops as RmsNormalize(x) * weight elsewhere.
  return weight.defined() ? RmsNormOp(x, weight, eps_) : RmsNormalize(x, eps_);
}

LayerNormNoBiasImpl::LayerNormNoBiasImpl(int64_t dim, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor LayerNormNoBiasImpl::forward(const torch::Tensor& x) {
  return torch::layer_norm(x, {x.size(-1)}, weight, /*bias=*/{}, eps_);
}

Rope::Rope(int64_t head_dim, int64_t max_len, double base) : max_len_(max_len) {
  const int64_t half = head_dim / 2;
  torch::Tensor inv_freq =
      torch::pow(base, -torch::arange(0, half, torch::kFloat64) * 2.0 / head_dim);
  torch::Tensor pos = torch::arange(0, max_len, torch::kFloat64);
  torch::Tensor angles = torch::outer(pos, inv_freq);            // [T, half]
  torch::Tensor full = torch::cat({angles, angles}, /*dim=*/-1);  // [T, hd]
  cos_ = full.cos().to(torch::kFloat32);
  sin_ = full.sin().to(torch::kFloat32);
}

torch::Tensor Rope::Apply(const torch::Tensor& x) const {
  const int64_t T = x.size(2);
  TORCH_CHECK(T <= max_len_, "sequence length ", T, " exceeds RoPE table ", max_len_);
  const int64_t half = x.size(-1) / 2;
  // The tables are plain members (model->to(device) does not move them).
  torch::Tensor cos = cos_.narrow(0, 0, T).to(x.device(), x.scalar_type());
  torch::Tensor sin = sin_.narrow(0, 0, T).to(x.device(), x.scalar_type());
  torch::Tensor x1 = x.narrow(-1, 0, half);
  torch::Tensor x2 = x.narrow(-1, half, half);
  torch::Tensor rotated = torch::cat({-x2, x1}, -1);
  return x * cos + rotated * sin;
}

torch::Tensor CausalMask(int64_t T, const torch::TensorOptions& options) {
  return torch::full({T, T}, -std::numeric_limits<float>::infinity(), options)
      .triu(1);
}

namespace {
torch::nn::Linear NoBias(int64_t in, int64_t out) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
}
}  // namespace

AttentionImpl::AttentionImpl(const AttentionOptions& options)
    : options_(options), head_dim_(options.d_model / options.heads) {
  const int64_t d = options.d_model;
  const int64_t kv_dim = options.kv_heads * head_dim_;
  q_proj = register_module("q_proj", NoBias(d, d));
  k_proj = register_module("k_proj", NoBias(d, kv_dim));
  v_proj = register_module("v_proj", NoBias(d, kv_dim));
  o_proj = register_module("o_proj", NoBias(d, d));
}

torch::Tensor AttentionImpl::Heads(const torch::Tensor& x, int64_t n) const {
  return x.view({x.size(0), x.size(1), n, head_dim_}).transpose(1, 2);
}

torch::Tensor AttentionImpl::ExpandKv(const torch::Tensor& kv) const {
  const int64_t groups = options_.heads / options_.kv_heads;
  if (groups == 1) return kv;
  return kv.repeat_interleave(groups, /*dim=*/1);
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x, const Rope& rope) {
  return ForwardWithDepth(x, rope, DepthKv{}, nullptr);
}

torch::Tensor AttentionImpl::ForwardWithDepth(
    const torch::Tensor& x, const Rope& rope, const DepthKv& depth,
    std::pair<torch::Tensor, torch::Tensor>* own_kv) {
  const int64_t B = x.size(0), T = x.size(1);
  torch::Tensor q = rope.Apply(Heads(q_proj->forward(x), options_.heads));
  torch::Tensor k = ExpandKv(rope.Apply(Heads(k_proj->forward(x), options_.kv_heads)));
  torch::Tensor v = ExpandKv(Heads(v_proj->forward(x), options_.kv_heads));
  if (own_kv != nullptr) *own_kv = {k, v};
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim_));
  torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) * scale;  // [B,H,T,T]
  scores = scores + CausalMask(T, scores.options());
  torch::Tensor out;
  if (depth.empty()) {
    out = torch::matmul(torch::softmax(scores, -1), v);
  } else {
    // Same-token depth scores: [B,H,T,S].
    torch::Tensor depth_scores =
        (q.unsqueeze(3) * depth.keys).sum(-1) * scale;
    torch::Tensor probs = torch::softmax(torch::cat({scores, depth_scores}, -1), -1);
    torch::Tensor p_seq = probs.narrow(-1, 0, T);
    torch::Tensor p_depth = probs.narrow(-1, T, depth_scores.size(-1));
    out = torch::matmul(p_seq, v) + (p_depth.unsqueeze(-1) * depth.values).sum(3);
  }
  out = out.transpose(1, 2).contiguous().view({B, T, options_.d_model});
  return o_proj->forward(out);
}

SwiGluImpl::SwiGluImpl(int64_t d_model, int64_t d_ff) {
  gate_proj = register_module("gate_proj", NoBias(d_model, d_ff));
  up_proj = register_module("up_proj", NoBias(d_model, d_ff));
  down_proj = register_module("down_proj", NoBias(d_ff, d_model));
}

torch::Tensor SwiGluImpl::forward(const torch::Tensor& x) {
  return down_proj->forward(SwiGluGateOp(gate_proj->forward(x), up_proj->forward(x)));
}

}  // namespace depthbench
