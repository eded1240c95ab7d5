// Shared machinery of designs 8 and 9, Full and Block AttnRes (Attention
// Residuals, Team et al. 2026): there is no plain residual; each sub-layer's
// input is a softmax mixture over sources, folded with the sub-layer's own
// pre-norm.
//
// One schedule covers both (as in the authors' code, where Full AttnRes is
// block size 1): sources are the embedding, frozen block sums, and the
// current running sum of sub-layer outputs. At zero-indexed sub-layer k:
//   1. input = pre_norm_k(Mix(sources + [running sum, if non-empty]));
//   2. if k > 0 and k % b == 0, the running sum is frozen as a new source and
//      reset (after step 1, so the sub-layer at a boundary still sees the
//      completed block as the running sum);
//   3. the sub-layer's output is added to the running sum.
// The head mixes sources + running sum with its own query and the final norm.
// b = 1 gives Full AttnRes (k + 1 sources at sub-layer k, 2L + 1 at the head);
// b = AttnResBlockSize(L) gives Block AttnRes (2 + floor((k-1)/b) sources at
// sub-layer k >= 1; 1 + 2L/b at the head, 9 for the paper's depths).
//
// Mix: logit_i = w . (g * rmsnorm(v_i)) (temperature 1), weights = softmax
// over sources, mixture = sum_i weight_i v_i. Each site (every sub-layer but
// block 0's attention, plus the head) owns w (zero init) and g (ones).
//
// Thread safety: none.
#ifndef DEPTHBENCH_TRAINER_CORE_MODEL_ATTNRES_COMMON_H_
#define DEPTHBENCH_TRAINER_CORE_MODEL_ATTNRES_COMMON_H_

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "trainer_core/model/design.h"

namespace depthbench {

// The schedule of a block size b over 2L sub-layers, for tests and the
// diagnostics: whether the running sum is frozen at sub-layer k (after its
// mixing step), how many sources sub-layer k mixes (k >= 1; 1 at k = 0), and
// how many sources the head mixes.
bool AttnResFreezesAt(int64_t k, int64_t block_size);
int64_t AttnResSourcesAt(int64_t k, int64_t block_size);
int64_t AttnResHeadSources(int64_t layers, int64_t block_size);

// Softmax depth mixing over `sources` ([B, T, d] each). With an undefined
// `query` the weights are uniform; a single source is returned as is.
// `weights`, when non-null, receives the [B, T, S] softmax weights.
torch::Tensor AttnResMix(const std::vector<torch::Tensor>& sources,
                         const torch::Tensor& query, RmsNormImpl* key_norm,
                         torch::Tensor* weights);

// Builds Full (block_size 1) or Block AttnRes.
std::shared_ptr<DesignImpl> MakeAttnRes(const DesignOptions& options, Arch arch,
                                        int64_t block_size);

}  // namespace depthbench

#endif  // DEPTHBENCH_TRAINER_CORE_MODEL_ATTNRES_COMMON_H_
