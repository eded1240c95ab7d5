#include "common/clock.h"

#include <chrono>

namespace depthbench {

int64_t RealClock::NowMonotonicMs() const {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int64_t RealClock::NowWallMs() const {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Clock* RealClock::Default() {
  static RealClock* clock = new RealClock();
  return clock;
}

}  // namespace depthbench
