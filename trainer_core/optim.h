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

// Group 0 takes `weight_decay`, group 1 (if any parameter is in it) none.
std::unique_ptr<torch::optim::AdamW> MakeAdamW(const ParamGroups& groups, double lr,
                                               double weight_decay);

// Sets the learning rate of every parameter group.
void SetLearningRate(torch::optim::Optimizer& optimizer, double lr);

// Scales gradients so their global L2 norm is at most max_norm; returns the
// norm before clipping (inf/NaN when a gradient is not finite).
double ClipGradNorm(const std::vector<torch::Tensor>& parameters, double max_norm);

}  // namespace depthbench

#endif  // DEPTHBENCH_TRAINER_CORE_OPTIM_H_
