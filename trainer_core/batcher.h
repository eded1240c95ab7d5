// Torch adapter for the data layer: turns a Batch (data.h) into a tensor.
// Kept apart from data.h so the readers and the sampler stay torch-free.
//
// Thread safety: pure functions. Ownership: the returned tensor owns a copy
// of the ids; the Batch may be discarded.
#ifndef DEPTHBENCH_TRAINER_CORE_BATCHER_H_
#define DEPTHBENCH_TRAINER_CORE_BATCHER_H_

#include <torch/types.h>

#include "trainer_core/data.h"

namespace depthbench {

// The batch as a CPU int64 tensor [batch, seq_len + 1]: row b is window b;
// inputs are [:, :-1] and targets [:, 1:] (see SplitInputsTargets).
torch::Tensor BatchToTensor(const Batch& batch);

struct InputsTargets {
  torch::Tensor inputs;   // int64 [B, T], a view of the batch tensor
  torch::Tensor targets;  // int64 [B, T], a view shifted by one token
};

// Splits a [B, T + 1] tensor into inputs (first T) and targets (last T).
InputsTargets SplitInputsTargets(const torch::Tensor& batch_tensor);

}  // namespace depthbench

#endif  // DEPTHBENCH_TRAINER_CORE_BATCHER_H_
