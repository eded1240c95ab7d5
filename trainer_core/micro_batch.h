// One training step's forward and backward as parallel micro-batches on the
// CPU (issue 18, goal 2).
//
// With two intra-op threads, every GEMM of a step is split between the two
// cores inside OpenBLAS, which then synchronises them several times per
// call: at d=512 about 6% of the step went to threads waiting for each
// other (sched_yield, perf), and each ATen element-wise op forks and joins
// the OpenMP team too. Splitting the batch into one micro-batch per thread
// instead runs each micro-batch's forward and backward on one core, with no
// synchronisation until the gradients are summed: inside an OpenMP parallel
// region OpenBLAS and ATen's parallel_for run serially.
//
// The gradients are those of the mean loss over the whole batch: each
// micro-batch's mean loss is scaled by 1 / parts and its gradients are taken
// into buffers of its own (torch::autograd::grad), then summed in micro-batch
// order, so a step is deterministic for a given thread count and equals the
// one-batch step up to float rounding. Costs (parts - 1) extra gradient
// buffers of the parameters' size.
//
// DEPTHBENCH_CPU_MICROBATCH=off (environment) turns the split off.
#ifndef DEPTHBENCH_TRAINER_CORE_MICRO_BATCH_H_
#define DEPTHBENCH_TRAINER_CORE_MICRO_BATCH_H_

#include <torch/torch.h>

#include <cstdint>

#include "trainer_core/model/model.h"

namespace depthbench {

// How many micro-batches a step of `batch` rows runs as: `threads` (the
// intra-op thread count) when the model trains on the CPU in float32 without
// diagnostics recording, threads is 2..kMaxCpuMicroBatches, batch is a
// multiple of it and the environment does not turn the split off; else 1.
inline constexpr int64_t kMaxCpuMicroBatches = 8;
int64_t CpuMicroBatches(LanguageModel& model, int64_t threads, int64_t batch);

// Clears the parameters' gradients (ClearGradients), then stores in them the
// gradient of model->Loss(inputs, targets), run as `parts` micro-batches of
// equal size in parallel (parts 1: one ordinary backward). Returns the loss,
// detached. inputs and targets: [B, T] with B a multiple of parts.
torch::Tensor LossAndGradients(LanguageModel& model, const torch::Tensor& inputs,
                               const torch::Tensor& targets, int64_t parts);

}  // namespace depthbench

#endif  // DEPTHBENCH_TRAINER_CORE_MICRO_BATCH_H_
