// Building blocks shared by all ten residual designs (spec section 2):
// RMSNorm (eps 1e-6), bias-free LayerNorm (DeepNorm's block norms), rotary
// position embedding, causal multi-head / grouped-query attention (with an
// optional depth K/V for MoDA) and the SwiGLU feed-forward.
//
// Every module follows torch/nn style (XxxImpl + TORCH_MODULE). Linear layers
// have no bias. Weights are initialised by the model (model.cc), not here, so
// that each design's init is in one place.
//
// Thread safety: modules are not thread-safe; one training thread owns them.
#ifndef DEPTHBENCH_TRAINER_CORE_MODEL_LAYERS_H_
#define DEPTHBENCH_TRAINER_CORE_MODEL_LAYERS_H_

#include <torch/torch.h>

#include <memory>
#include <mutex>
#include <optional>
#include <vector>

namespace depthbench {

inline constexpr double kNormEps = 1e-6;

// y = x / sqrt(mean(x^2) + eps) * gain. `affine=false` gives the gain-free
// form HC/mHC use on streams.
class RmsNormImpl : public torch::nn::Module {
 public:
  RmsNormImpl(int64_t dim, double eps = kNormEps, bool affine = true);
  torch::Tensor forward(const torch::Tensor& x);
  // Normalises with this module's gain but an explicit input (AttnRes folds
  // the consuming sub-layer's pre-norm into its mixing step this way).
  torch::Tensor weight;  // [dim], undefined when !affine
  double eps() const { return eps_; }

 private:
  double eps_;
};
TORCH_MODULE(RmsNorm);

// Functional RMS normalisation without a gain.
torch::Tensor RmsNormalize(const torch::Tensor& x, double eps = kNormEps);

// Mean-centring LayerNorm with a gain and no bias (DeepNorm's block norms).
class LayerNormNoBiasImpl : public torch::nn::Module {
 public:
  explicit LayerNormNoBiasImpl(int64_t dim, double eps = 1e-5);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(LayerNormNoBias);

// Rotary embedding tables for head_dim and up to max_len positions
// (base 10000, pairs (i, i + head_dim/2) as in LLaMA / OLMo).
class Rope {
 public:
  Rope(int64_t head_dim, int64_t max_len, double base = 10000.0);
  // x: [B, H, T, head_dim] -> rotated, same shape.
  torch::Tensor Apply(const torch::Tensor& x) const;
  // cos/sin tables [T, head_dim] for the first T positions on x's device and
  // dtype (sin with rotate_half's sign; RopeRotate in cuda_ops/ops.h).
  void Tables(int64_t T, const torch::Tensor& x, torch::Tensor* cos, torch::Tensor* sin) const;

 private:
  torch::Tensor cos_;         // [max_len, head_dim], float32 on the CPU
  torch::Tensor sin_signed_;  // cat(-sin, sin) over the two halves
  int64_t max_len_;
  mutable torch::Tensor cache_cos_, cache_sin_;  // on the device/dtype last used
  std::shared_ptr<std::mutex> cache_mu_ = std::make_shared<std::mutex>();
};

// Per-token K/V of earlier sub-layers for MoDA's depth attention: one
// [B, kv_heads (or heads), T, head_dim] tensor per depth slot, the keys not
// rotated (CausalAttentionQkvOp scores them against the unrotated query,
// which equals rotating both at the token's own position).
struct DepthKv {
  std::vector<torch::Tensor> keys;
  std::vector<torch::Tensor> values;
  bool empty() const { return keys.empty(); }
};

struct AttentionOptions {
  int64_t d_model = 0;
  int64_t heads = 16;
  int64_t kv_heads = 16;
};

// Causal self-attention with RoPE, no biases. kv_heads < heads gives GQA.
class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const AttentionOptions& options);
  // x: [B, T, d] (already normalised by the design). Returns [B, T, d].
  torch::Tensor forward(const torch::Tensor& x, const Rope& rope);
  // MoDA: one softmax over the causal sequence K/V and, per token, the depth
  // K/V of earlier sub-layers (scale 1/sqrt(head_dim) for both). When
  // `own_kv` is given it receives this sub-layer's K/V, [B, kv_heads, T,
  // head_dim] each (copies on the fused CPU path, views of the projection
  // elsewhere), for later layers. Depth keys stay unrotated and are scored
  // against the unrotated query: the rotation-free dot product, which is
  // what rotating both at their own token's position gives. `passed`, when
  // given, receives the depth slots for later layers to read instead of
  // `depth`'s (CausalAttentionQkvOp's passed_slots: one gradient per slot).
  torch::Tensor ForwardWithDepth(const torch::Tensor& x, const Rope& rope,
                                 const DepthKv& depth,
                                 std::pair<torch::Tensor, torch::Tensor>* own_kv,
                                 DepthKv* passed = nullptr);

  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr},
      o_proj{nullptr};
  const AttentionOptions& options() const { return options_; }

 private:
  AttentionOptions options_;
  int64_t head_dim_;
};
TORCH_MODULE(Attention);

// SwiGLU: down(silu(gate(x)) * up(x)).
class SwiGluImpl : public torch::nn::Module {
 public:
  SwiGluImpl(int64_t d_model, int64_t d_ff);
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(SwiGlu);

}  // namespace depthbench

#endif  // DEPTHBENCH_TRAINER_CORE_MODEL_LAYERS_H_
