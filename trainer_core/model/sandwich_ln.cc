// Design 2, Sandwich-LN (Peri-LN): h = h + LN_out(F(LN_in(h))), LN_out gain
// initialised to 1; +2d parameters per block.
#include <string>

#include "trainer_core/model/single_stream.h"

namespace depthbench {
namespace {

class SandwichBlockImpl : public TransformerBlockImpl {
 public:
  explicit SandwichBlockImpl(const ModelShape& shape) : TransformerBlockImpl(shape) {
    attn_out_norm = register_module("attn_out_norm", RmsNorm(shape.d_model));
    ffn_out_norm = register_module("ffn_out_norm", RmsNorm(shape.d_model));
  }
  RmsNorm attn_out_norm{nullptr}, ffn_out_norm{nullptr};
};
TORCH_MODULE(SandwichBlock);

class SandwichLnDesign final : public SingleStreamDesign<SandwichBlock> {
 public:
  explicit SandwichLnDesign(const DesignOptions& options) : SingleStreamDesign(options) {}
  Arch arch() const override { return Arch::kSandwichLn; }
  void ApplyBlock(int64_t /*position*/, int64_t weights, DepthState& s) override {
    SandwichBlockImpl& b = *blocks_[weights];
    torch::Tensor h = s.tensors[0];
    h = h + b.attn_out_norm->forward(b.attn->forward(b.attn_norm->forward(h), rope()));
    h = h + b.ffn_out_norm->forward(b.ffn->forward(b.ffn_norm->forward(h)));
    s.tensors[0] = h;
  }

};

}  // namespace

std::shared_ptr<DesignImpl> MakeSandwichLn(const DesignOptions& options) {
  return std::make_shared<SandwichLnDesign>(options);
}

}  // namespace depthbench
