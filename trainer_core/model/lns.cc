// Design 3, LNS (LayerNorm Scaling): h = h + F(LN(h) / sqrt(l)), l the
// 1-indexed block position, the same factor for both sub-layers. On a swap
// the factor travels with the block it scales (spec section 9): slot p
// running block w's weights scales by 1/sqrt(w + 1).
#include <cmath>
#include <string>

#include "trainer_core/model/single_stream.h"

namespace depthbench {
namespace {

class LnsDesign final : public SingleStreamDesign<TransformerBlock> {
 public:
  explicit LnsDesign(const DesignOptions& options) : SingleStreamDesign(options) {}
  Arch arch() const override { return Arch::kLns; }
  void ApplyBlock(int64_t position, int64_t weights, DepthState& s) override {
    (void)position;
    const double scale = 1.0 / std::sqrt(static_cast<double>(weights + 1));
    s.tensors[0] = PreNormBlockForward(*blocks_[weights], s.tensors[0], rope(), scale);
  }

};

}  // namespace

std::shared_ptr<DesignImpl> MakeLns(const DesignOptions& options) {
  return std::make_shared<LnsDesign>(options);
}

}  // namespace depthbench
