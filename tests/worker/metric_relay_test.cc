#include "worker/metric_relay.h"

#include <atomic>
#include <chrono>
#include <thread>

#include <gtest/gtest.h>

#include "tests/worker/fake_worker_service.h"

namespace depthbench::worker {
namespace {

namespace v1 = ::depthbench::v1;

std::vector<v1::MetricPoint> Steps(int64_t from, int64_t to) {
  std::vector<v1::MetricPoint> out;
  for (int64_t s = from; s <= to; ++s) {
    v1::MetricPoint p;
    p.set_step(s);
    p.set_name("loss");
    p.set_value(1.0 / static_cast<double>(s));
    out.push_back(p);
  }
  return out;
}

MetricRelayOptions Fast() {
  MetricRelayOptions o;
  o.batch = 16;
  o.flush_ms = 20;
  o.initial_backoff_ms = 10;
  o.max_backoff_ms = 40;
  return o;
}

bool WaitFor(const std::function<bool()>& cond, int ms = 10000) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (!cond()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

TEST(MetricRelayTest, DeliversEveryPointInBatches) {
  FakeSchedulerServer server;
  SchedulerClient client({server.address(), "", 2000, ""});
  std::atomic<int64_t> backlog{0};
  MetricRelayHooks hooks;
  hooks.on_backlog = [&](int64_t d) { backlog += d; };
  MetricRelay relay(&client, 1, 1, Fast(), hooks);
  for (int64_t s = 1; s <= 100; s += 10) ASSERT_TRUE(relay.Push(Steps(s, s + 9)));
  ASSERT_TRUE(WaitFor([&] { return server.service().stored() == 100; }));
  EXPECT_TRUE(relay.Close().empty());
  EXPECT_EQ(backlog.load(), 0);
  EXPECT_EQ(relay.sent_points(), 100);
  // Batched: far fewer calls than points.
  EXPECT_LE(server.service().report_calls(), 20);
}

TEST(MetricRelayTest, SchedulerOutageLosesNothingAndResendsAreIdempotent) {
  FakeSchedulerServer server;
  server.service().FailNextReports(5, grpc::StatusCode::UNAVAILABLE);
  SchedulerClient client({server.address(), "", 2000, ""});
  MetricRelay relay(&client, 1, 1, Fast(), {});
  ASSERT_TRUE(relay.Push(Steps(1, 50)));
  ASSERT_TRUE(WaitFor([&] { return server.service().stored() == 50; }));
  EXPECT_GE(server.service().report_calls(), 6);
  // The same steps again (a resent batch) are stored once.
  ASSERT_TRUE(relay.Push(Steps(41, 60)));
  ASSERT_TRUE(WaitFor([&] { return server.service().stored() == 60; }));
  EXPECT_EQ(server.service().duplicates(), 10);
  std::vector<int64_t> steps = server.service().Steps("loss");
  ASSERT_EQ(steps.size(), 60u);
  for (int64_t i = 0; i < 60; ++i) EXPECT_EQ(steps[i], i + 1);
}

TEST(MetricRelayTest, UnreachableSchedulerKeepsPointsForFinishJob) {
  // Nothing listens on this port: every call fails; Close() hands back all.
  SchedulerClient client({"127.0.0.1:1", "", 200, ""});
  MetricRelay relay(&client, 1, 1, Fast(), {});
  ASSERT_TRUE(relay.Push(Steps(1, 30)));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::vector<v1::MetricPoint> rest = relay.Close();
  ASSERT_EQ(rest.size(), 30u);
  EXPECT_EQ(rest.front().step(), 1);
  EXPECT_EQ(rest.back().step(), 30);
}

TEST(MetricRelayTest, FullBufferBlocksPushUntilDrained) {
  FakeSchedulerServer server;
  server.service().FailNextReports(1000000, grpc::StatusCode::UNAVAILABLE);
  SchedulerClient client({server.address(), "", 2000, ""});
  MetricRelayOptions o = Fast();
  o.capacity = 20;
  MetricRelay relay(&client, 1, 1, o, {});
  ASSERT_TRUE(relay.Push(Steps(1, 20)));
  std::atomic<bool> pushed{false};
  std::thread producer([&] {
    relay.Push(Steps(21, 25));
    pushed = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(pushed.load()) << "Push must block while the buffer is full";
  server.service().FailNextReports(0, grpc::StatusCode::UNAVAILABLE);  // scheduler back
  ASSERT_TRUE(WaitFor([&] { return pushed.load(); }));
  producer.join();
  ASSERT_TRUE(WaitFor([&] { return server.service().stored() == 25; }));
}

TEST(MetricRelayTest, UnblockLetsAStoppingChildDrain) {
  SchedulerClient client({"127.0.0.1:1", "", 200, ""});
  MetricRelayOptions o = Fast();
  o.capacity = 10;
  MetricRelay relay(&client, 1, 1, o, {});
  ASSERT_TRUE(relay.Push(Steps(1, 10)));
  relay.Unblock();
  ASSERT_TRUE(relay.Push(Steps(11, 30)));  // does not block
  EXPECT_EQ(relay.Close().size(), 30u);
}

TEST(MetricRelayTest, StaleAttemptStopsTheRelay) {
  FakeSchedulerServer server;
  server.service().MakeStale();
  SchedulerClient client({server.address(), "", 2000, ""});
  std::atomic<int> stale_calls{0};
  MetricRelayHooks hooks;
  hooks.on_stale = [&](const std::string& reason) {
    EXPECT_NE(reason.find("stale"), std::string::npos);
    ++stale_calls;
  };
  MetricRelay relay(&client, 1, 1, Fast(), hooks);
  ASSERT_TRUE(relay.Push(Steps(1, 5)));
  ASSERT_TRUE(WaitFor([&] { return relay.stale(); }));
  EXPECT_FALSE(relay.Push(Steps(6, 7)));
  EXPECT_TRUE(relay.Close().empty());
  EXPECT_EQ(stale_calls.load(), 1);
}

TEST(MetricRelayTest, AnnounceSendsAnEmptyReport) {
  FakeSchedulerServer server;
  SchedulerClient client({server.address(), "", 2000, ""});
  MetricRelay relay(&client, 1, 1, Fast(), {});
  relay.Announce();
  ASSERT_TRUE(WaitFor([&] { return server.service().report_calls() == 1; }));
  EXPECT_EQ(server.service().stored(), 0u);
}

// Issue 19: the step a trainer resumed from reaches the scheduler with the
// attempt's first acknowledged report, through failures, and only once.
TEST(MetricRelayTest, AnnouncedResumeStepIsDeliveredOnceThroughFailures) {
  FakeSchedulerServer server;
  server.service().FailNextReports(2, grpc::StatusCode::UNAVAILABLE);
  SchedulerClient client({server.address(), "", 2000, ""});
  MetricRelay relay(&client, 1, 1, Fast(), {});
  relay.Announce(40);
  ASSERT_TRUE(relay.Push(Steps(41, 45)));
  ASSERT_TRUE(WaitFor([&] { return server.service().stored() == 5; }));
  ASSERT_TRUE(relay.Push(Steps(46, 50)));
  ASSERT_TRUE(WaitFor([&] { return server.service().stored() == 10; }));
  EXPECT_TRUE(relay.Close().empty());
  EXPECT_GE(server.service().report_calls(), 3);
  EXPECT_EQ(server.service().resumes(), std::vector<int64_t>{40});
}

// Live delivery: a single point is sent after about flush_ms, not held for
// a full batch (the job runner no longer waits for checkpoints either).
TEST(MetricRelayTest, APartialBatchIsFlushedWithinFlushMs) {
  FakeSchedulerServer server;
  SchedulerClient client({server.address(), "", 2000, ""});
  MetricRelayOptions o = Fast();
  o.batch = 512;
  o.flush_ms = 50;
  MetricRelay relay(&client, 1, 1, o, {});
  ASSERT_TRUE(relay.Push(Steps(1, 1)));
  // Generous for a loaded machine; the bound that matters is "not never".
  ASSERT_TRUE(WaitFor([&] { return server.service().stored() == 1; }, 5000));
  // The relay counts the point once the RPC has returned, which can be just
  // after the server stored it (this check raced that under ctest -j2).
  EXPECT_TRUE(WaitFor([&] { return relay.sent_points() == 1; }, 5000))
      << "sent_points " << relay.sent_points();
}

}  // namespace
}  // namespace depthbench::worker
