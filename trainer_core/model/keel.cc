// Design 5, KEEL: h = LN_post(alpha h + F(LN_pre(h))), alpha = 2L (the number
// of sub-layers). The first block is special: its attention sub-layer is
// plain Pre-LN (no post-norm, no up-scaling) and its FFN sub-layer is pre-
// and post-normalised without up-scaling (alpha = 1). Extra parameters over
// Pre-LN: d in block 0, 2d in every other block.
#include <string>

#include "trainer_core/model/single_stream.h"

namespace depthbench {
namespace {

class KeelBlockImpl : public TransformerBlockImpl {
 public:
  KeelBlockImpl(const ModelShape& shape, bool first) : TransformerBlockImpl(shape), first_(first) {
    if (!first) attn_post_norm = register_module("attn_post_norm", RmsNorm(shape.d_model));
    ffn_post_norm = register_module("ffn_post_norm", RmsNorm(shape.d_model));
  }
  bool first() const { return first_; }
  RmsNorm attn_post_norm{nullptr}, ffn_post_norm{nullptr};

 private:
  bool first_;
};
TORCH_MODULE(KeelBlock);

class KeelDesign final : public SingleStreamDesign<KeelBlock> {
 public:
  explicit KeelDesign(const DesignOptions& options)
      : SingleStreamDesign(options,
                           [&options](int64_t l) { return KeelBlock(options.shape, l == 0); }),
        alpha_(2.0 * options.shape.layers) {}
  Arch arch() const override { return Arch::kKeel; }
  // Swap (spec section 9): the first block's structure (plain Pre-LN
  // attention, alpha = 1 FFN) belongs to slot 0, not to block 0's weights;
  // every parameter both blocks have moves, and the attention post-norm,
  // which block 0 lacks, stays in its slot when block 0 is swapped away.
  void ApplyBlock(int64_t position, int64_t weights, DepthState& s) override {
    KeelBlockImpl& b = *blocks_[weights];
    torch::Tensor h = s.tensors[0];
    if (position == 0) {
      h = h + b.attn->forward(b.attn_norm->forward(h), rope());
      h = b.ffn_post_norm->forward(h + b.ffn->forward(b.ffn_norm->forward(h)));
    } else {
      RmsNormImpl& post = b.attn_post_norm.is_empty() ? *blocks_[position]->attn_post_norm
                                                      : *b.attn_post_norm;
      h = post.forward(alpha_ * h + b.attn->forward(b.attn_norm->forward(h), rope()));
      h = b.ffn_post_norm->forward(alpha_ * h + b.ffn->forward(b.ffn_norm->forward(h)));
    }
    s.tensors[0] = h;
  }

 private:
  double alpha_;
};

}  // namespace

std::shared_ptr<DesignImpl> MakeKeel(const DesignOptions& options) {
  return std::make_shared<KeelDesign>(options);
}

}  // namespace depthbench
