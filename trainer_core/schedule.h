// The recipe's learning-rate schedule (spec section 5): linear warmup over
// the first warmup_frac of the steps, then cosine decay to min_lr_frac of the
// peak at the last step.
//
// Steps are 0-indexed; the LR returned for step t is the one its update uses.
// W = max(1, round(warmup_frac * total)) when warmup_frac > 0, else 0.
//   t < W:  peak * (t + 1) / W          (reaches the peak at t = W - 1)
//   t >= W: min + (peak - min) * (1 + cos(pi * p)) / 2,
//           p = (t - W) / (total - 1 - W), clamped to [0, 1]
// (The authors' code starts warmup at lr = 0; starting at peak / W wastes no
// step.) Torch-free; pure function.
#ifndef DEPTHBENCH_TRAINER_CORE_SCHEDULE_H_
#define DEPTHBENCH_TRAINER_CORE_SCHEDULE_H_

#include <cstdint>

namespace depthbench {

int64_t WarmupSteps(int64_t total_steps, double warmup_frac);

double LearningRateAt(int64_t step, int64_t total_steps, double peak,
                      double warmup_frac, double min_lr_frac);

}  // namespace depthbench

#endif  // DEPTHBENCH_TRAINER_CORE_SCHEDULE_H_
