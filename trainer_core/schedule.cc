#include "trainer_core/schedule.h"

#include <algorithm>
#include <cmath>

namespace depthbench {

int64_t WarmupSteps(int64_t total_steps, double warmup_frac) {
  if (warmup_frac <= 0) return 0;
  return std::max<int64_t>(1, std::llround(warmup_frac * static_cast<double>(total_steps)));
}

double LearningRateAt(int64_t step, int64_t total_steps, double peak,
                      double warmup_frac, double min_lr_frac) {
  const int64_t warmup = WarmupSteps(total_steps, warmup_frac);
  if (step < warmup) {
    return peak * static_cast<double>(step + 1) / static_cast<double>(warmup);
  }
  const double min_lr = peak * min_lr_frac;
  const int64_t span = total_steps - 1 - warmup;
  double progress = span <= 0 ? 1.0 : static_cast<double>(step - warmup) / span;
  progress = std::clamp(progress, 0.0, 1.0);
  return min_lr + (peak - min_lr) * 0.5 * (1.0 + std::cos(M_PI * progress));
}

}  // namespace depthbench
