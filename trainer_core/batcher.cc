#include "trainer_core/batcher.h"

#include <cstdint>

namespace depthbench {

torch::Tensor BatchToTensor(const Batch& batch) {
  const int64_t width = batch.seq_len + 1;
  TORCH_CHECK(static_cast<int64_t>(batch.tokens.size()) == batch.batch * width,
              "Batch holds ", batch.tokens.size(), " ids, expected ",
              batch.batch, " x ", width);
  torch::Tensor out = torch::empty({batch.batch, width}, torch::kLong);
  int64_t* dst = out.data_ptr<int64_t>();
  for (size_t i = 0; i < batch.tokens.size(); ++i) dst[i] = batch.tokens[i];
  return out;
}

InputsTargets SplitInputsTargets(const torch::Tensor& batch_tensor) {
  TORCH_CHECK(batch_tensor.dim() == 2 && batch_tensor.size(1) >= 2,
              "expected a [B, T + 1] tensor with T >= 1, got ",
              batch_tensor.sizes());
  const int64_t t = batch_tensor.size(1) - 1;
  return {batch_tensor.narrow(1, 0, t), batch_tensor.narrow(1, 1, t)};
}

}  // namespace depthbench
