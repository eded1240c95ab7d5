// Clock waits (common/clock.h): a FakeClock's SleepFor / AwaitWithTimeout
// end when the test advances the fake time, not when real time passes.
#include "common/clock.h"

#include <atomic>
#include <chrono>
#include <thread>

#include <gtest/gtest.h>

#include "absl/synchronization/mutex.h"

namespace depthbench {
namespace {

TEST(FakeClockTest, SleepForEndsWhenTheFakeTimeIsAdvancedPastIt) {
  FakeClock clock;
  std::atomic<bool> woke{false};
  std::thread sleeper([&] {
    clock.SleepFor(60'000);  // a minute of fake time
    woke = true;
  });
  ASSERT_TRUE(clock.WaitForPendingWaiters(1));
  clock.AdvanceMs(59'999);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(woke.load()) << "woke before its fake deadline";
  EXPECT_EQ(clock.PendingWaiters(), 1);
  clock.AdvanceMs(1);
  sleeper.join();
  EXPECT_TRUE(woke.load());
  EXPECT_EQ(clock.PendingWaiters(), 0);
}

TEST(FakeClockTest, AwaitWithTimeoutReturnsOnTheConditionOrTheFakeDeadline) {
  FakeClock clock;
  absl::Mutex mu;
  bool flag = false;
  std::atomic<int> result{-1};
  std::thread waiter([&] {
    absl::MutexLock lock(&mu);
    result = clock.AwaitWithTimeout(&mu, absl::Condition(&flag), 1000) ? 1 : 0;
  });
  ASSERT_TRUE(clock.WaitForPendingWaiters(1));
  {
    absl::MutexLock lock(&mu);
    flag = true;
  }
  waiter.join();
  EXPECT_EQ(result.load(), 1);

  flag = false;
  std::thread timed_out([&] {
    absl::MutexLock lock(&mu);
    result = clock.AwaitWithTimeout(&mu, absl::Condition(&flag), 1000) ? 1 : 0;
  });
  ASSERT_TRUE(clock.WaitForPendingWaiters(1));
  clock.AdvanceMs(1000);
  timed_out.join();
  EXPECT_EQ(result.load(), 0);
}

TEST(FakeClockTest, ZeroAndNegativeWaitsDoNotBlock) {
  FakeClock clock;
  clock.SleepFor(0);
  clock.SleepFor(-5);
  absl::Mutex mu;
  bool flag = false;
  absl::MutexLock lock(&mu);
  EXPECT_FALSE(clock.AwaitWithTimeout(&mu, absl::Condition(&flag), 0));
}

TEST(RealClockTest, SleepForWaitsRealTime) {
  const auto start = std::chrono::steady_clock::now();
  RealClock::Default()->SleepFor(30);
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(30));
}

}  // namespace
}  // namespace depthbench
