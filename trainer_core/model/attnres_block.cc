// Design 9, Block AttnRes: sub-layer outputs accumulate into a running sum
// that is frozen as a new source every b = AttnResBlockSize(L) = 2L/8
// sub-layers (8 blocks at the paper's depths; for odd b the boundaries
// alternate between attention and FFN sub-layers). Mixtures are over the
// embedding, the frozen block sums and the running sum; the head mixes the
// embedding with the block outputs. Same parameters and init as Full AttnRes
// (attnres_common.h).
#include "trainer_core/model/attnres_common.h"

namespace depthbench {

std::shared_ptr<DesignImpl> MakeAttnResBlock(const DesignOptions& options) {
  return MakeAttnRes(options, Arch::kAttnResBlock, AttnResBlockSize(options.shape.layers));
}

}  // namespace depthbench
