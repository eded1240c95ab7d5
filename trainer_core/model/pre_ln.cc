// Design 1, Pre-LN: h = h + F(LN(h)) for each sub-layer.
#include <string>

#include "trainer_core/model/single_stream.h"

namespace depthbench {
namespace {

class PreLnDesign final : public SingleStreamDesign<TransformerBlock> {
 public:
  explicit PreLnDesign(const DesignOptions& options) : SingleStreamDesign(options) {}
  Arch arch() const override { return Arch::kPreLn; }
  void ApplyBlock(int64_t /*position*/, int64_t weights, DepthState& s) override {
    s.tensors[0] = PreNormBlockForward(*blocks_[weights], s.tensors[0], rope());
  }

};

}  // namespace

std::shared_ptr<DesignImpl> MakePreLn(const DesignOptions& options) {
  return std::make_shared<PreLnDesign>(options);
}

}  // namespace depthbench
