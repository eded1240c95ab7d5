// The recipe's optimiser (spec section 5): AdamW (beta1 0.9, beta2 0.95,
// eps 1e-8) over the design's two parameter groups (decay / no decay), and
// global-norm gradient clipping.
//
// Thread safety: none; one training thread.
#ifndef DEPTHBENCH_TRAINER_CORE_OPTIM_H_
#define DEPTHBENCH_TRAINER_CORE_OPTIM_H_

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "trainer_core/model/design.h"

namespace depthbench {

inline constexpr double kAdamBeta1 = 0.9;
inline constexpr double kAdamBeta2 = 0.95;
inline constexpr double kAdamEps = 1e-8;

// torch::optim::AdamW with its step in one pass per parameter
// (cpu_fused::AdamWStep) where the parameter, its gradient and moments are
// contiguous float32 CPU tensors, and the stock element-wise ops elsewhere
// (GPU, float64). Same state, options and checkpoints as the stock
// optimiser. A parameter whose gradient is undefined but which has been
// stepped before is stepped with a zero gradient, as the stock optimiser
// stepped it after zero_grad(): so ClearGradients below can replace
// zero_grad() without changing a run. amsgrad is not part of the recipe:
// with it the stock step runs.
class FusedAdamW : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;
  torch::Tensor step(LossClosure closure = nullptr) override;
};

// Group 0 takes `weight_decay`, group 1 (if any parameter is in it) none.
// A FusedAdamW.
std::unique_ptr<torch::optim::AdamW> MakeAdamW(const ParamGroups& groups, double lr,
                                               double weight_decay);

// Drops the parameters' gradients, for the next backward to store its
// gradients instead of adding them into zeroed ones (LibTorch 1.13's
// zero_grad() zeroes: one pass to zero and one to add per parameter, 8 ms a
// step at 13 M parameters). Use with FusedAdamW (see there).
void ClearGradients(const std::vector<torch::Tensor>& parameters);

// Sets the learning rate of every parameter group.
void SetLearningRate(torch::optim::Optimizer& optimizer, double lr);

// Scales gradients so their global L2 norm is at most max_norm; returns the
// norm before clipping (inf/NaN when a gradient is not finite).
double ClipGradNorm(const std::vector<torch::Tensor>& parameters, double max_norm);

}  // namespace depthbench

#endif  // DEPTHBENCH_TRAINER_CORE_OPTIM_H_
