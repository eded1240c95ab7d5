// Design 10, MoDA (Mixture-of-Depths Attention, Pre-LN variant): Pre-LN
// blocks whose attention runs one softmax over the causal sequence K/V and,
// per token, the K/V that earlier sub-layers produced for the same token
// (scale 1/sqrt(head_dim), Attention::ForwardWithDepth).
//
// Depth cache (DepthState::depth_keys / depth_values, one [B, kv_heads, T,
// hd] tensor per slot, appended in execution order): the attention of the
// block in slot p writes its own K and V (slot 2p); its FFN writes K/V from
// its own projections of its normalised input (slot 2p + 1). The final
// block has no FFN K/V projections (no later layer reads them), and nothing
// is written from the last slot. Block 0 sees an empty cache, i.e. plain
// attention. A skipped block writes nothing into the slots it owns: they
// stay zero (spec section 9, as in the authors' preallocated cache), so
// later attention still sees them (a zero key, logit 0, and a zero value).
//
// RoPE and the depth keys (issue 12 item 9). The paper (Table 1 and Appendix
// A) defines the depth part of the softmax as the same token's K/V from
// earlier layers at scale 1/sqrt(head_dim) and gives no position treatment
// for it. We treat a depth key as rotated at its own token's position t,
// like the query t that reads it: (R_t q_t) . (R_t k_t) = q_t . k_t, i.e.
// RoPE at relative offset 0, so a depth logit carries no absolute position,
// as every RoPE attention logit depends on relative offsets only. The cache
// therefore holds unrotated keys and the attention scores them against the
// unrotated query (CausalAttentionQkvOp), the same logits without rotating
// any key (the rotation is orthogonal). The authors' code
// (olmo_core/nn/moda.py) caches the keys before RoPE and rotates only the
// query, so its depth logits are (R_t q_t) . k_t and vary with the absolute
// position t for the same content; we read that as an artefact of sharing
// the sequence path's rotated query with a cache filled pre-rotation, not as
// a design the paper states, and do not reproduce it.
// tests/trainer_core/designs_test.cc (ModaDepthKeysCarryNoAbsolutePosition)
// checks the model against an explicit forward of this form and that the
// other form gives clearly different logits.
#include <string>
#include <vector>

#include "cuda_ops/ops.h"
#include "trainer_core/model/design.h"

namespace depthbench {
namespace {

torch::nn::Linear NoBiasLinear(int64_t in, int64_t out) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
}

class ModaBlockImpl : public TransformerBlockImpl {
 public:
  ModaBlockImpl(const ModelShape& shape, bool last) : TransformerBlockImpl(shape) {
    if (!last) {
      ffn_depth_k = register_module("ffn_depth_k", NoBiasLinear(shape.d_model, shape.kv_dim()));
      ffn_depth_v = register_module("ffn_depth_v", NoBiasLinear(shape.d_model, shape.kv_dim()));
    }
  }
  bool has_ffn_kv() const { return !ffn_depth_k.is_empty(); }
  torch::nn::Linear ffn_depth_k{nullptr}, ffn_depth_v{nullptr};
};
TORCH_MODULE(ModaBlock);

class ModaDesign final : public DesignImpl {
 public:
  explicit ModaDesign(const DesignOptions& options) : DesignImpl(options) {
    const int64_t L = options.shape.layers;
    for (int64_t l = 0; l < L; ++l) {
      blocks_.push_back(register_module("block_" + std::to_string(l),
                                        ModaBlock(options.shape, l == L - 1)));
    }
  }
  Arch arch() const override { return Arch::kModa; }
  DepthState Begin(const torch::Tensor& embedding) override { return DepthState({embedding}); }

  void ApplyBlock(int64_t position, int64_t weights, DepthState& s) override {
    ModaBlockImpl& b = *blocks_[weights];
    const bool last = position == num_blocks() - 1;
    // The slots as they are (the attention reads them in place). Later
    // layers read them as the attention passes them through, so each slot's
    // gradients from all its readers add up in the kernels (one autograd
    // add per reader otherwise); the last layer has no later readers.
    const DepthKv depth{s.depth_keys, s.depth_values};
    std::pair<torch::Tensor, torch::Tensor> own;
    DepthKv passed;
    torch::Tensor h = s.tensors[0];
    h = h + b.attn->ForwardWithDepth(b.attn_norm->forward(h), rope(), depth,
                                     last ? nullptr : &own, last ? nullptr : &passed);
    if (!last) {
      s.depth_keys = std::move(passed.keys);
      s.depth_values = std::move(passed.values);
      s.depth_keys.push_back(own.first);
      s.depth_values.push_back(own.second);
    }
    torch::Tensor x = b.ffn_norm->forward(h);
    h = h + b.ffn->forward(x);
    if (!last) {
      // Swap: the final block has no FFN K/V projections; its weights in an
      // earlier slot use that slot's own (parameters that exist only at
      // some positions stay in place, spec section 9).
      ModaBlockImpl& kv = b.has_ffn_kv() ? b : *blocks_[position];
      // One GEMM for both projections (separate parameters), whose
      // backward takes the two halves' gradients as they are.
      std::vector<torch::Tensor> k_v = LinearChunksOp(
          x, torch::cat({kv.ffn_depth_k->weight, kv.ffn_depth_v->weight}, 0), /*parts=*/2);
      s.depth_keys.push_back(Heads(k_v[0]));
      s.depth_values.push_back(Heads(k_v[1]));
    }
    s.tensors[0] = h;
  }

  // The slots block `position` would have written (2p, and 2p + 1 unless it
  // is the last slot) are zero.
  void SkipBlock(int64_t position, DepthState& s) override {
    if (position == num_blocks() - 1) return;
    const torch::Tensor& h = s.tensors[0];
    const ModelShape& sh = options_.shape;
    torch::Tensor zero =
        torch::zeros({h.size(0), sh.kv_heads, h.size(1), sh.head_dim()}, h.options());
    for (int i = 0; i < 2; ++i) {
      s.depth_keys.push_back(zero);
      s.depth_values.push_back(zero);
    }
  }

  torch::Tensor Finish(const DepthState& s) override { return final_norm->forward(s.tensors[0]); }
  torch::Tensor Representation(const DepthState& s, int64_t) override { return s.tensors[0]; }
  torch::Tensor LensHidden(const DepthState& s, int64_t) override { return s.tensors[0]; }

 private:
  // [B, T, kv_heads * hd] -> [B, kv_heads, T, hd].
  torch::Tensor Heads(const torch::Tensor& x) const {
    const ModelShape& sh = options_.shape;
    return x.view({x.size(0), x.size(1), sh.kv_heads, sh.head_dim()}).transpose(1, 2);
  }

  std::vector<ModaBlock> blocks_;
};

}  // namespace

std::shared_ptr<DesignImpl> MakeModa(const DesignOptions& options) {
  return std::make_shared<ModaDesign>(options);
}

}  // namespace depthbench
