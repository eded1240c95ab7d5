#include "worker/trainer_events.h"

#include <cmath>

namespace depthbench::worker {

std::vector<depthbench::v1::MetricPoint> PointsFor(const TrainerEvent& event,
                                                   int64_t wall_ms) {
  std::vector<depthbench::v1::MetricPoint> out;
  // Non-finite values are not stored (a diverged step reports null loss);
  // the divergence itself travels in FinishJob.
  auto add = [&](const char* name, double value) {
    if (!std::isfinite(value)) return;
    depthbench::v1::MetricPoint p;
    p.set_step(event.step);
    p.set_name(name);
    p.set_value(value);
    p.set_wall_ms(event.time_ms > 0 ? event.time_ms : wall_ms);
    out.push_back(std::move(p));
  };
  switch (event.kind) {
    case EventKind::kStep:
      add("loss", event.loss);
      add("lr", event.lr);
      add("grad_norm", event.grad_norm);
      add("tokens_per_s", event.tokens_per_s);
      break;
    case EventKind::kEval:
      add("val_loss", event.val_loss);
      break;
    case EventKind::kCheckpoint:
      add("checkpoint", static_cast<double>(event.step));
      if (event.has_checkpoint_seconds) add("checkpoint_seconds", event.checkpoint_seconds);
      break;
    default:
      break;
  }
  return out;
}

}  // namespace depthbench::worker
