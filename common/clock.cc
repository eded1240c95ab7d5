#include "common/clock.h"

#include <algorithm>
#include <chrono>
#include <iterator>

#include "absl/time/clock.h"
#include "absl/time/time.h"

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

void RealClock::SleepFor(int64_t ms) const {
  if (ms > 0) absl::SleepFor(absl::Milliseconds(ms));
}

bool RealClock::AwaitWithTimeout(absl::Mutex* mu, const absl::Condition& cond,
                                 int64_t timeout_ms) const {
  return mu->AwaitWithTimeout(cond, absl::Milliseconds(std::max<int64_t>(0, timeout_ms)));
}

void Clock::SleepFor(int64_t ms) const {
  if (ms <= 0) return;
  SleepUntilMs(NowMonotonicMs() + ms);
}

bool Clock::AwaitWithTimeout(absl::Mutex* mu, const absl::Condition& cond,
                             int64_t timeout_ms) const {
  return AwaitUntilMs(mu, cond, NowMonotonicMs() + timeout_ms);
}

void Clock::SleepUntilMs(int64_t deadline_ms) const {
  while (NowMonotonicMs() < deadline_ms) absl::SleepFor(absl::Milliseconds(kPollMs));
}

bool Clock::AwaitUntilMs(absl::Mutex* mu, const absl::Condition& cond,
                         int64_t deadline_ms) const {
  bool held = cond.Eval();
  while (!held && NowMonotonicMs() < deadline_ms) {
    held = mu->AwaitWithTimeout(cond, absl::Milliseconds(kPollMs));
  }
  return held;
}

class FakeClock::Waiter {
 public:
  Waiter(const FakeClock* clock, int64_t timeout_ms)
      : clock_(clock), deadline_(clock->NowMonotonicMs() + std::max<int64_t>(0, timeout_ms)) {
    absl::MutexLock lock(&clock_->waiters_mu_);
    it_ = clock_->deadlines_.insert(deadline_);
  }
  ~Waiter() {
    absl::MutexLock lock(&clock_->waiters_mu_);
    clock_->deadlines_.erase(it_);
  }
  // The registered deadline: the wait must end at this one, not at one
  // computed again later (the test may advance the clock in between).
  int64_t deadline() const { return deadline_; }

 private:
  const FakeClock* const clock_;
  const int64_t deadline_;
  std::multiset<int64_t>::iterator it_;
};

void FakeClock::SleepFor(int64_t ms) const {
  if (ms <= 0) return;
  Waiter waiter(this, ms);
  SleepUntilMs(waiter.deadline());
}

bool FakeClock::AwaitWithTimeout(absl::Mutex* mu, const absl::Condition& cond,
                                 int64_t timeout_ms) const {
  Waiter waiter(this, timeout_ms);
  return AwaitUntilMs(mu, cond, waiter.deadline());
}

int FakeClock::PendingWaiters() const {
  const int64_t now = NowMonotonicMs();
  absl::MutexLock lock(&waiters_mu_);
  return static_cast<int>(std::distance(deadlines_.upper_bound(now), deadlines_.end()));
}

bool FakeClock::WaitForPendingWaiters(int n, int64_t real_timeout_ms) const {
  const absl::Time until = absl::Now() + absl::Milliseconds(real_timeout_ms);
  while (PendingWaiters() != n) {
    if (absl::Now() >= until) return false;
    absl::SleepFor(absl::Milliseconds(kPollMs));
  }
  return true;
}

Clock* RealClock::Default() {
  static RealClock* clock = new RealClock();
  return clock;
}

}  // namespace depthbench
