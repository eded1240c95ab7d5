// Injected time. Everything that expires (leases, backoff, heartbeat ages)
// asks a Clock, and everything that waits (polling, backoff, heartbeat
// periods) waits on one, so tests advance a FakeClock instead of sleeping.
//
//   clock->SleepFor(backoff_ms);
//   absl::MutexLock lock(&mu_);
//   clock->AwaitWithTimeout(&mu_, absl::Condition(&stopping_), period_ms);
//
// On a FakeClock both return once the test has advanced the clock past the
// deadline (or, for AwaitWithTimeout, once the condition holds), however
// long that takes in real time.
//
// Thread safety: RealClock is stateless; FakeClock is safe to read, advance
// and wait on from any thread.
#ifndef DEPTHBENCH_COMMON_CLOCK_H_
#define DEPTHBENCH_COMMON_CLOCK_H_

#include <atomic>
#include <cstdint>
#include <set>

#include "absl/synchronization/mutex.h"

namespace depthbench {

class Clock {
 public:
  virtual ~Clock() = default;
  // Monotonic milliseconds: use for every timeout and lease computation.
  virtual int64_t NowMonotonicMs() const = 0;
  // Wall-clock milliseconds since the Unix epoch: use only for display and
  // for timestamps stored in the database.
  virtual int64_t NowWallMs() const = 0;

  // Blocks for `ms` of this clock's time (no-op for ms <= 0).
  virtual void SleepFor(int64_t ms) const;
  // With `mu` held: waits until `cond` holds or `timeout_ms` of this clock's
  // time passed, releasing `mu` meanwhile; returns whether `cond` holds.
  // `mu` is held again on return.
  virtual bool AwaitWithTimeout(absl::Mutex* mu, const absl::Condition& cond,
                                int64_t timeout_ms) const;

  // The base versions re-read NowMonotonicMs() every kPollMs of real time
  // (right for clocks a test moves); RealClock waits on real time directly.
  static constexpr int64_t kPollMs = 1;

 protected:
  // The polling waits up to an absolute deadline of this clock's time, so a
  // caller that registered the deadline (FakeClock's waiters) waits for
  // exactly that one, however late its thread reads the clock again.
  void SleepUntilMs(int64_t deadline_ms) const;
  bool AwaitUntilMs(absl::Mutex* mu, const absl::Condition& cond, int64_t deadline_ms) const;
};

class RealClock final : public Clock {
 public:
  int64_t NowMonotonicMs() const override;
  int64_t NowWallMs() const override;
  void SleepFor(int64_t ms) const override;
  bool AwaitWithTimeout(absl::Mutex* mu, const absl::Condition& cond,
                        int64_t timeout_ms) const override;
  // A process-wide instance; never destroyed.
  static Clock* Default();
};

class FakeClock final : public Clock {
 public:
  explicit FakeClock(int64_t start_ms = 1'000'000) : now_ms_(start_ms) {}
  int64_t NowMonotonicMs() const override { return now_ms_.load(); }
  int64_t NowWallMs() const override { return kWallOffsetMs + now_ms_.load(); }
  void AdvanceMs(int64_t ms) { now_ms_.fetch_add(ms); }
  // Waiters re-check the fake time every kPollMs of real time, so an
  // AdvanceMs from another thread wakes them within about that long.
  void SleepFor(int64_t ms) const override;
  bool AwaitWithTimeout(absl::Mutex* mu, const absl::Condition& cond,
                        int64_t timeout_ms) const override;

  // How many SleepFor / AwaitWithTimeout calls are blocked on a deadline
  // still ahead of the fake time. A test advances the clock, then waits
  // until the code under test is blocked again before it advances further.
  int PendingWaiters() const;
  // Waits (in real time, up to `real_timeout_ms`) until PendingWaiters() is
  // `n`; false on timeout.
  bool WaitForPendingWaiters(int n, int64_t real_timeout_ms = 10000) const;

 private:
  static constexpr int64_t kWallOffsetMs = 1'700'000'000'000;
  // Registers a waiter's deadline for PendingWaiters().
  class Waiter;
  std::atomic<int64_t> now_ms_;
  mutable absl::Mutex waiters_mu_;
  mutable std::multiset<int64_t> deadlines_ ABSL_GUARDED_BY(waiters_mu_);
};

}  // namespace depthbench

#endif  // DEPTHBENCH_COMMON_CLOCK_H_
