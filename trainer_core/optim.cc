#include "trainer_core/optim.h"

namespace depthbench {

std::unique_ptr<torch::optim::AdamW> MakeAdamW(const ParamGroups& groups, double lr,
                                               double weight_decay) {
  auto options = [&](double wd) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(lr).betas({kAdamBeta1, kAdamBeta2}).eps(kAdamEps).weight_decay(wd));
  };
  std::vector<torch::optim::OptimizerParamGroup> param_groups;
  param_groups.emplace_back(groups.decay, options(weight_decay));
  if (!groups.no_decay.empty()) param_groups.emplace_back(groups.no_decay, options(0.0));
  return std::make_unique<torch::optim::AdamW>(param_groups, *options(weight_decay));
}

void SetLearningRate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) {
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
  }
}

double ClipGradNorm(const std::vector<torch::Tensor>& parameters, double max_norm) {
  return torch::nn::utils::clip_grad_norm_(parameters, max_norm);
}

}  // namespace depthbench
