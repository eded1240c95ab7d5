// Design 4, DeepNorm (Post-LN): h = LN(alpha h + F(h)), alpha = (2L)^(1/4).
// Block norms are mean-centring LayerNorm without bias; the head norm stays
// RMSNorm. Init per DeepNet: attention V and O and all three FFN matrices get
// std 0.02 * beta, beta = (8L)^(-1/4); Q, K, embedding and head keep 0.02.
#include <cmath>
#include <string>

#include "trainer_core/model/single_stream.h"

namespace depthbench {
namespace {

class DeepNormBlockImpl : public torch::nn::Module {
 public:
  explicit DeepNormBlockImpl(const ModelShape& shape) {
    attn = register_module(
        "attn", Attention(AttentionOptions{shape.d_model, shape.heads, shape.kv_heads}));
    attn_post_norm = register_module("attn_post_norm", LayerNormNoBias(shape.d_model));
    ffn = register_module("ffn", SwiGlu(shape.d_model, shape.d_ff));
    ffn_post_norm = register_module("ffn_post_norm", LayerNormNoBias(shape.d_model));
  }
  Attention attn{nullptr};
  LayerNormNoBias attn_post_norm{nullptr};
  SwiGlu ffn{nullptr};
  LayerNormNoBias ffn_post_norm{nullptr};
};
TORCH_MODULE(DeepNormBlock);

class DeepNormDesign final : public SingleStreamDesign<DeepNormBlock> {
 public:
  explicit DeepNormDesign(const DesignOptions& options)
      : SingleStreamDesign(options),
        alpha_(std::pow(2.0 * options.shape.layers, 0.25)),
        beta_(std::pow(8.0 * options.shape.layers, -0.25)) {}
  Arch arch() const override { return Arch::kDeepNorm; }
  void ApplyBlock(int64_t /*position*/, int64_t weights, DepthState& s) override {
    DeepNormBlockImpl& b = *blocks_[weights];
    torch::Tensor h = s.tensors[0];
    h = b.attn_post_norm->forward(alpha_ * h + b.attn->forward(h, rope()));
    h = b.ffn_post_norm->forward(alpha_ * h + b.ffn->forward(h));
    s.tensors[0] = h;
  }

  void InitDesignParameters() override {
    torch::NoGradGuard no_grad;
    for (auto& b : blocks_) {
      // The model-wide init drew these with std 0.02; rescale to 0.02 * beta.
      for (auto* w : {&b->attn->v_proj->weight, &b->attn->o_proj->weight,
                      &b->ffn->gate_proj->weight, &b->ffn->up_proj->weight,
                      &b->ffn->down_proj->weight}) {
        w->mul_(beta_);
      }
    }
  }

  double beta() const { return beta_; }

 private:
  double alpha_;
  double beta_;
};

}  // namespace

std::shared_ptr<DesignImpl> MakeDeepNorm(const DesignOptions& options) {
  return std::make_shared<DeepNormDesign>(options);
}

}  // namespace depthbench
