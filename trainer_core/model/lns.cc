// Design 3, LNS (LayerNorm Scaling): h = h + F(LN(h) / sqrt(l)), l the
// 1-indexed block position, the same factor for both sub-layers. On a swap
// the factor travels with the block it scales (spec section 9): slot p
// running block w's weights scales by 1/sqrt(w + 1).
#include <cmath>
#include <string>

#include "trainer_core/model/design.h"

namespace depthbench {
namespace {

class LnsDesign final : public DesignImpl {
 public:
  explicit LnsDesign(const DesignOptions& options) : DesignImpl(options) {
    for (int64_t l = 0; l < options.shape.layers; ++l) {
      blocks_.push_back(register_module("block_" + std::to_string(l),
                                        TransformerBlock(options.shape)));
    }
  }
  Arch arch() const override { return Arch::kLns; }
  DepthState Begin(const torch::Tensor& embedding) override { return DepthState({embedding}); }
  void ApplyBlock(int64_t position, int64_t weights, DepthState& s) override {
    (void)position;
    const double scale = 1.0 / std::sqrt(static_cast<double>(weights + 1));
    s.tensors[0] = PreNormBlockForward(*blocks_[weights], s.tensors[0], rope(), scale);
  }
  torch::Tensor Finish(const DepthState& s) override { return final_norm->forward(s.tensors[0]); }
  torch::Tensor Representation(const DepthState& s, int64_t) override { return s.tensors[0]; }
  torch::Tensor LensHidden(const DepthState& s, int64_t) override { return s.tensors[0]; }

 private:
  std::vector<TransformerBlock> blocks_;
};

}  // namespace

std::shared_ptr<DesignImpl> MakeLns(const DesignOptions& options) {
  return std::make_shared<LnsDesign>(options);
}

}  // namespace depthbench
