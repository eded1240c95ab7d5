// The DepthState of the multi-stream designs (HC, mHC): tensors = {h}, the
// streams [B, T, n, d], or {h, a, b, y} when the last connector's write is
// left for the next connector's route to apply (HcPendingWrite,
// HcWriteRouteOp: on CPU the two run as one fused function, so the written
// streams and their gradient never pass through memory whole; issue 18).
// Whatever reads the streams themselves (the final norm, diagnostics)
// applies a pending write first (Streams).
#ifndef DEPTHBENCH_TRAINER_CORE_MODEL_STREAMS_H_
#define DEPTHBENCH_TRAINER_CORE_MODEL_STREAMS_H_

#include <torch/torch.h>

#include "cuda_ops/ops.h"
#include "trainer_core/model/design.h"

namespace depthbench {

// The pending write of s, or an undefined one when s holds the streams.
inline HcPendingWrite PendingWriteOf(const DepthState& s) {
  if (s.tensors.size() != 4) return {};
  return {s.tensors[0], s.tensors[1], s.tensors[2], s.tensors[3]};
}

// The streams of s, with a pending write applied.
inline torch::Tensor Streams(const DepthState& s) {
  const HcPendingWrite w = PendingWriteOf(s);
  return w.defined() ? w.Apply() : s.tensors[0];
}

inline void SetPendingWrite(DepthState& s, const HcPendingWrite& w) {
  s.tensors = {w.h, w.a, w.b, w.y};
}

}  // namespace depthbench

#endif  // DEPTHBENCH_TRAINER_CORE_MODEL_STREAMS_H_
