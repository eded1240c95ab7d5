// Injected time. Everything that expires (leases, backoff, heartbeat ages)
// asks a Clock, so tests advance a FakeClock instead of sleeping.
//
// Thread safety: RealClock is stateless; FakeClock is safe to read and
// advance from any thread.
#ifndef DEPTHBENCH_COMMON_CLOCK_H_
#define DEPTHBENCH_COMMON_CLOCK_H_

#include <atomic>
#include <cstdint>

namespace depthbench {

class Clock {
 public:
  virtual ~Clock() = default;
  // Monotonic milliseconds: use for every timeout and lease computation.
  virtual int64_t NowMonotonicMs() const = 0;
  // Wall-clock milliseconds since the Unix epoch: use only for display and
  // for timestamps stored in the database.
  virtual int64_t NowWallMs() const = 0;
};

class RealClock final : public Clock {
 public:
  int64_t NowMonotonicMs() const override;
  int64_t NowWallMs() const override;
  // A process-wide instance; never destroyed.
  static Clock* Default();
};

class FakeClock final : public Clock {
 public:
  explicit FakeClock(int64_t start_ms = 1'000'000) : now_ms_(start_ms) {}
  int64_t NowMonotonicMs() const override { return now_ms_.load(); }
  int64_t NowWallMs() const override { return kWallOffsetMs + now_ms_.load(); }
  void AdvanceMs(int64_t ms) { now_ms_.fetch_add(ms); }

 private:
  static constexpr int64_t kWallOffsetMs = 1'700'000'000'000;
  std::atomic<int64_t> now_ms_;
};

}  // namespace depthbench

#endif  // DEPTHBENCH_COMMON_CLOCK_H_
