#include "trainer_core/model/layers.h"

#include "cuda_ops/ops.h"

#include <cmath>
#include <vector>

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
  torch::Tensor angles = torch::outer(pos, inv_freq);  // [T, half]
  cos_ = torch::cat({angles, angles}, /*dim=*/-1).cos().to(torch::kFloat32);  // [T, hd]
  // rotate_half(x) * sin = cat(-x2, x1) * sin = cat(x2, x1) * cat(-sin, sin):
  // the sign lives in the table, which saves a negation per call.
  torch::Tensor sin = angles.sin();
  sin_signed_ = torch::cat({-sin, sin}, /*dim=*/-1).to(torch::kFloat32);
}

void Rope::Tables(int64_t T, const torch::Tensor& x, torch::Tensor* cos,
                  torch::Tensor* sin) const {
  TORCH_CHECK(T <= max_len_, "sequence length ", T, " exceeds RoPE table ", max_len_);
  // The tables are plain members (model->to(device) does not move them):
  // keep one copy per device and dtype in use rather than copying per call.
  // Locked: micro-batches run their forwards concurrently (micro_batch.h).
  torch::Tensor c, s;
  {
    std::lock_guard<std::mutex> lock(*cache_mu_);
    if (!cache_cos_.defined() || cache_cos_.device() != x.device() ||
        cache_cos_.scalar_type() != x.scalar_type()) {
      cache_cos_ = cos_.to(x.device(), x.scalar_type());
      cache_sin_ = sin_signed_.to(x.device(), x.scalar_type());
    }
    c = cache_cos_;
    s = cache_sin_;
  }
  *cos = c.narrow(0, 0, T);
  *sin = s.narrow(0, 0, T);
}

torch::Tensor Rope::Apply(const torch::Tensor& x) const {
  torch::Tensor cos, sin;
  Tables(x.size(2), x, &cos, &sin);
  return RopeRotate(x, cos, sin);
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

torch::Tensor AttentionImpl::forward(const torch::Tensor& x, const Rope& rope) {
  return ForwardWithDepth(x, rope, DepthKv{}, nullptr);
}

torch::Tensor AttentionImpl::ForwardWithDepth(
    const torch::Tensor& x, const Rope& rope, const DepthKv& depth,
    std::pair<torch::Tensor, torch::Tensor>* own_kv, DepthKv* passed) {
  const int64_t B = x.size(0), T = x.size(1);
  const int64_t H = options_.heads, KV = options_.kv_heads, hd = head_dim_;
  // One GEMM for Q, K and V (their weights stay separate parameters; the
  // concatenation is a d x d-sized copy); the attention op rotates q and k
  // (RoPE) itself and returns one gradient for the packed projection.
  torch::Tensor qkv =
      LinearOp(x, torch::cat({q_proj->weight, k_proj->weight, v_proj->weight}, /*dim=*/0))
          .view({B, T, H + 2 * KV, hd});
  torch::Tensor cos, sin;
  rope.Tables(T, qkv, &cos, &sin);
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  // No depth slots: plain causal attention.
  DepthSlotLists slots;
  torch::Tensor out = CausalAttentionQkvOp(qkv, H, KV, cos, sin, depth.keys, depth.values, scale,
                                           own_kv, passed != nullptr ? &slots : nullptr);
  if (passed != nullptr) *passed = {std::move(slots.first), std::move(slots.second)};
  return LinearOp(out, o_proj->weight);
}

SwiGluImpl::SwiGluImpl(int64_t d_model, int64_t d_ff) {
  gate_proj = register_module("gate_proj", NoBias(d_model, d_ff));
  up_proj = register_module("up_proj", NoBias(d_model, d_ff));
  down_proj = register_module("down_proj", NoBias(d_ff, d_model));
}

torch::Tensor SwiGluImpl::forward(const torch::Tensor& x) {
  // One GEMM for the gate and up projections (separate parameters), the
  // gate on the packed result (one gradient for it).
  return LinearOp(SwiGluPackedOp(LinearOp(
                      x, torch::cat({gate_proj->weight, up_proj->weight}, /*dim=*/0))),
                  down_proj->weight);
}

}  // namespace depthbench
