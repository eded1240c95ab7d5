// Design 8, Full AttnRes: every sub-layer's input is a softmax mixture over
// the embedding and all earlier sub-layer outputs (no running residual sum);
// the head mixes all 2L + 1 sources. The schedule of attnres_common.h with
// block size 1; extra parameters 2d per mixing site (query + key-norm gain),
// 2L sites.
#include "trainer_core/model/attnres_common.h"

namespace depthbench {

std::shared_ptr<DesignImpl> MakeAttnResFull(const DesignOptions& options) {
  return MakeAttnRes(options, Arch::kAttnResFull, /*block_size=*/1);
}

}  // namespace depthbench
