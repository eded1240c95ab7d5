#include "trainer_core/micro_batch.h"

#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "trainer_core/optim.h"

namespace depthbench {

int64_t CpuMicroBatches(LanguageModel& model, int64_t threads, int64_t batch) {
  const char* env = std::getenv("DEPTHBENCH_CPU_MICROBATCH");
  if (env != nullptr && std::strcmp(env, "off") == 0) return 1;
  if (threads < 2 || threads > kMaxCpuMicroBatches || batch % threads != 0) return 1;
  if (model->design().record_diagnostics()) return 1;  // records are per forward
  for (const torch::Tensor& p : model->parameters()) {
    if (!p.device().is_cpu() || p.scalar_type() != torch::kFloat32) return 1;
  }
  return threads;
}

torch::Tensor LossAndGradients(LanguageModel& model, const torch::Tensor& inputs,
                               const torch::Tensor& targets, int64_t parts) {
  TORCH_CHECK(parts >= 1 && inputs.dim() == 2 && inputs.size(0) % parts == 0 &&
                  targets.sizes() == inputs.sizes(),
              "LossAndGradients: inputs ", inputs.sizes(), " and targets ", targets.sizes(),
              " must be [B, T] alike with B a multiple of parts = ", parts);
  const std::vector<torch::Tensor> params = model->parameters();
  ClearGradients(params);
  if (parts == 1) {
    torch::Tensor loss = model->Loss(inputs, targets);
    loss.backward();
    return loss.detach();
  }
  const int64_t rows = inputs.size(0) / parts;
  std::vector<torch::Tensor> losses(static_cast<size_t>(parts));
  std::vector<std::vector<torch::Tensor>> grads(static_cast<size_t>(parts));
  // Grad mode and the other thread-local settings of the caller.
  const at::ThreadLocalState caller;
  // Grain 1: one micro-batch per thread of the team (more parts than threads
  // would run in turn). Exceptions reach the caller through parallel_for.
  at::parallel_for(0, parts, 1, [&](int64_t begin, int64_t end) {
    at::ThreadLocalStateGuard guard(caller);
    for (int64_t i = begin; i < end; ++i) {
      torch::Tensor loss = model->Loss(inputs.narrow(0, i * rows, rows),
                                       targets.narrow(0, i * rows, rows)) /
                           static_cast<double>(parts);
      // allow_unused: a parameter the loss does not reach (none in the
      // trainer's designs) keeps an undefined gradient, as after backward.
      grads[i] = torch::autograd::grad({loss}, params, /*grad_outputs=*/{},
                                       /*retain_graph=*/false, /*create_graph=*/false,
                                       /*allow_unused=*/true);
      losses[i] = loss.detach();
    }
  });
  // Summed in micro-batch order into a new tensor (deterministic for a given
  // thread count): a returned gradient may be shared with another input of
  // the op that produced it, so none is written in place or kept as is.
  at::parallel_for(0, static_cast<int64_t>(params.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      torch::Tensor sum;
      int64_t terms = 0;
      for (int64_t i = 0; i < parts; ++i) {
        const torch::Tensor& g = grads[i][p];
        if (!g.defined()) continue;
        sum = terms == 0 ? g : terms == 1 ? sum + g : sum.add_(g);
        ++terms;
      }
      if (terms == 1) sum = sum.clone();
      if (terms > 0) params[p].mutable_grad() = sum;
    }
  });
  torch::Tensor loss = losses[0];
  for (int64_t i = 1; i < parts; ++i) loss = loss + losses[i];
  return loss;
}

}  // namespace depthbench
