#include "trainer_core/optim.h"

#include <cmath>
#include <string>

#include "cuda_ops/cpu_fused.h"

namespace depthbench {
namespace {

// The stock update (torch::optim::AdamW::step in LibTorch 1.13, op for op)
// for the tensors AdamWStep does not take.
void StockAdamWUpdate(torch::Tensor& p, const torch::Tensor& grad, torch::Tensor& exp_avg,
                      torch::Tensor& exp_avg_sq, const torch::optim::AdamWOptions& options,
                      double bias_correction2, double step_size) {
  const torch::Tensor g = grad.defined() ? grad : torch::zeros_like(p);
  if (options.weight_decay() != 0) p.mul_(1 - options.lr() * options.weight_decay());
  const auto [beta1, beta2] = options.betas();
  exp_avg.mul_(beta1).add_(g, 1 - beta1);
  exp_avg_sq.mul_(beta2).addcmul_(g, g, 1 - beta2);
  const torch::Tensor denom = (exp_avg_sq.sqrt() / std::sqrt(bias_correction2)).add_(options.eps());
  p.addcdiv_(exp_avg, denom, -step_size);
}

}  // namespace

torch::Tensor FusedAdamW::step(LossClosure closure) {
  for (const auto& group : param_groups()) {
    if (static_cast<const torch::optim::AdamWOptions&>(group.options()).amsgrad()) {
      return torch::optim::AdamW::step(std::move(closure));
    }
  }
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (auto& group : param_groups()) {
    const auto& options = static_cast<const torch::optim::AdamWOptions&>(group.options());
    const auto [beta1, beta2] = options.betas();
    for (auto& p : group.params()) {
      const torch::Tensor& grad = p.grad();
      // The stock optimiser's key for a parameter's state.
      const std::string key = c10::guts::to_string(p.unsafeGetTensorImpl());
      auto it = state().find(key);
      if (it == state().end()) {
        if (!grad.defined()) continue;  // never had a gradient: never stepped
        auto fresh = std::make_unique<torch::optim::AdamWParamState>();
        fresh->step(0);
        fresh->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        fresh->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        it = state().emplace(key, std::move(fresh)).first;
      }
      TORCH_CHECK(!grad.defined() || !grad.is_sparse(),
                  "AdamW does not support sparse gradients");
      auto& st = static_cast<torch::optim::AdamWParamState&>(*it->second);
      torch::Tensor& exp_avg = st.exp_avg();
      torch::Tensor& exp_avg_sq = st.exp_avg_sq();
      st.step(st.step() + 1);
      const double bias_correction1 = 1 - std::pow(beta1, st.step());
      const double bias_correction2 = 1 - std::pow(beta2, st.step());
      const double step_size = options.lr() / bias_correction1;
      if (!cpu_fused::AdamWStepApplies(p, grad, exp_avg, exp_avg_sq)) {
        StockAdamWUpdate(p, grad, exp_avg, exp_avg_sq, options, bias_correction2, step_size);
        continue;
      }
      const auto c = cpu_fused::AdamWCoefficients::For(options.lr(), options.weight_decay(), beta1,
                                                       beta2, options.eps(), st.step());
      cpu_fused::AdamWStep(p, grad, exp_avg, exp_avg_sq, c);
      // Written through raw pointers: count the writes as in-place ops do.
      for (torch::Tensor* t : {&p, &exp_avg, &exp_avg_sq}) {
        t->unsafeGetTensorImpl()->bump_version();
      }
    }
  }
  return loss;
}

void ClearGradients(const std::vector<torch::Tensor>& parameters) {
  for (const torch::Tensor& p : parameters) {
    if (p.grad().defined()) p.mutable_grad() = torch::Tensor();
  }
}

std::unique_ptr<torch::optim::AdamW> MakeAdamW(const ParamGroups& groups, double lr,
                                               double weight_decay) {
  auto options = [&](double wd) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(lr).betas({kAdamBeta1, kAdamBeta2}).eps(kAdamEps).weight_decay(wd));
  };
  std::vector<torch::optim::OptimizerParamGroup> param_groups;
  param_groups.emplace_back(groups.decay, options(weight_decay));
  if (!groups.no_decay.empty()) param_groups.emplace_back(groups.no_decay, options(0.0));
  return std::make_unique<FusedAdamW>(param_groups, *options(weight_decay));
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
