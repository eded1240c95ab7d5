// Faults of issue 20 on the scheduler core: failed commits (a full disk,
// injected at storage level or by SQLite's max_page_count) must leave memory
// and counters as they were and be retried; spec strings and list
// responses are bounded; DeleteSweep; WatchJob fan-out off the ingestion
// path.
#include <atomic>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "scheduler/scheduler.h"
#include "scheduler/watch_hub.h"
#include "storage/sqlite.h"
#include "tests/scheduler/test_util.h"
#include "trainer_core/train_config.h"

namespace depthbench::scheduler {
namespace {

namespace v1 = ::depthbench::v1;
using depthbench::testing::SmallSpec;
using depthbench::testing::TempDb;

// Counts observer events, to check they follow commits.
class CountingObserver : public SchedulerObserver {
 public:
  void OnJobFinished(depthbench::v1::JobState) override { finished++; }
  void OnLeasesExpired(int64_t count) override { expired += count; }
  void OnJobRetried(const std::string&) override { retried++; }
  void OnStorageWritable(bool writable) override { (writable ? healthy : unhealthy)++; }
  std::atomic<int64_t> finished{0}, expired{0}, retried{0}, healthy{0}, unhealthy{0};
};

class SchedulerFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = TempDb(std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) +
                   ".db");
    Open();
  }
  void Open(size_t ring = 4096) {
    scheduler_.reset();
    auto db = storage::Database::Open(path_);
    ASSERT_TRUE(db.ok()) << db.status();
    db_ = db->get();  // owned by the scheduler; used by this thread only
    SchedulerOptions options;
    options.lease_ttl_ms = 10000;
    options.observer = &observer_;
    options.watch_ring_points = ring;
    auto s = Scheduler::Create(std::move(*db), &clock_, options);
    ASSERT_TRUE(s.ok()) << s.status();
    scheduler_ = std::move(*s);
  }
  void Register(const std::string& name, int slots = 4) {
    depthbench::testing::RegisterWorker(*scheduler_, name, slots);
  }
  v1::AcquireJobResponse Acquire(const std::string& worker) {
    return depthbench::testing::AcquireFor(*scheduler_, worker);
  }
  absl::StatusOr<v1::ReportMetricsResponse> Report(const v1::AcquireJobResponse& lease,
                                                   int64_t first, int64_t last) {
    v1::ReportMetricsRequest req;
    req.set_job_id(lease.job_id());
    req.set_attempt_id(lease.attempt_id());
    for (int64_t s = first; s <= last; ++s) {
      auto* p = req.add_points();
      p->set_step(s);
      p->set_name("loss");
      p->set_value(5.0 - 0.001 * s);
    }
    return scheduler_->ReportMetrics(req);
  }
  absl::StatusOr<v1::FinishJobResponse> Finish(const v1::AcquireJobResponse& lease) {
    v1::FinishJobRequest req;
    req.set_job_id(lease.job_id());
    req.set_attempt_id(lease.attempt_id());
    req.set_status(v1::FINISH_SUCCEEDED);
    req.set_has_val_loss(true);
    req.set_final_val_loss(3.0);
    req.set_final_step(10);
    auto* p = req.add_points();
    p->set_step(10);
    p->set_name("val_loss");
    p->set_value(3.0);
    return scheduler_->FinishJob(req);
  }
  v1::JobState State(int64_t job_id) {
    auto job = scheduler_->GetJob(job_id);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? job->state() : v1::JOB_STATE_UNSPECIFIED;
  }
  static absl::Status DiskFull() {
    return absl::ResourceExhaustedError("injected: database or disk is full");
  }

  FakeClock clock_;
  std::string path_;
  CountingObserver observer_;
  storage::Database* db_ = nullptr;
  std::unique_ptr<Scheduler> scheduler_;
};

// Issue 20 item 3: the expiry commit fails; the leases must stay (expired)
// in memory so the next ExpireLeases re-queues the jobs, and nothing is
// counted until then.
TEST_F(SchedulerFaultTest, FailedExpiryCommitKeepsLeasesAndRetriesOnceSpaceReturns) {
  ASSERT_TRUE(scheduler_->SubmitSweep(SmallSpec("s", {"pre_ln"}, {1e-3, 2e-3})).ok());
  Register("w1");
  auto a = Acquire("w1");
  auto b = Acquire("w1");
  ASSERT_TRUE(a.has_job() && b.has_job());
  ASSERT_TRUE(Report(a, 1, 3).ok());
  clock_.AdvanceMs(10001);
  db_->InjectCommitFaultForTesting(DiskFull());
  EXPECT_EQ(scheduler_->ExpireLeases().status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(State(a.job_id()), v1::RUNNING);
  EXPECT_EQ(State(b.job_id()), v1::LEASED);
  SchedulerCounters c = scheduler_->Counters();
  EXPECT_EQ(c.leases_expired, 0);
  EXPECT_EQ(c.attempts_retried, 0);
  EXPECT_EQ(c.active_leases, 2);
  EXPECT_EQ(observer_.expired.load(), 0);
  EXPECT_EQ(observer_.retried.load(), 0);
  // Reported as an error state: /readyz's check fails, the observer heard.
  absl::Status ready = scheduler_->CheckDatabase();
  EXPECT_EQ(ready.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(ready.message().find("not writable"), std::string::npos) << ready;
  EXPECT_EQ(observer_.unhealthy.load(), 1);
  EXPECT_EQ(scheduler_->Counters().storage_failures, 1);
  // A heartbeat (which writes nothing) still answers while expiry fails.
  v1::HeartbeatRequest hb;
  hb.set_worker_id("w1");
  EXPECT_TRUE(scheduler_->Heartbeat(hb).ok());

  // Space returns: the next periodic call finishes the job by itself.
  db_->InjectCommitFaultForTesting(absl::OkStatus());
  auto expired = scheduler_->ExpireLeases();
  ASSERT_TRUE(expired.ok()) << expired.status();
  EXPECT_EQ(*expired, 2);
  EXPECT_EQ(State(a.job_id()), v1::PENDING);
  EXPECT_EQ(State(b.job_id()), v1::PENDING);
  c = scheduler_->Counters();
  EXPECT_EQ(c.leases_expired, 2);
  EXPECT_EQ(c.attempts_retried, 2);
  EXPECT_EQ(c.active_leases, 0);
  EXPECT_EQ(observer_.expired.load(), 2);
  EXPECT_TRUE(scheduler_->CheckDatabase().ok());
  EXPECT_EQ(observer_.healthy.load(), 1);
}

// Item 3: counters and observer events follow commits, not attempts.
TEST_F(SchedulerFaultTest, FailedFinishCommitCountsNothingAndCanBeResent) {
  ASSERT_TRUE(scheduler_->SubmitSweep(SmallSpec("s", {"pre_ln"}, {1e-3})).ok());
  Register("w1");
  auto lease = Acquire("w1");
  ASSERT_TRUE(lease.has_job());
  db_->InjectCommitFaultForTesting(DiskFull());
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(Finish(lease).status().code(), absl::StatusCode::kResourceExhausted);
  }
  SchedulerCounters c = scheduler_->Counters();
  EXPECT_EQ(c.jobs_succeeded, 0);
  EXPECT_EQ(c.points_accepted, 0);
  EXPECT_EQ(observer_.finished.load(), 0);
  EXPECT_EQ(State(lease.job_id()), v1::LEASED);
  EXPECT_EQ(c.active_leases, 1);  // the worker can send FinishJob again
  db_->InjectCommitFaultForTesting(absl::OkStatus());
  auto done = Finish(lease);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::SUCCEEDED);
  c = scheduler_->Counters();
  EXPECT_EQ(c.jobs_succeeded, 1);
  EXPECT_EQ(c.points_accepted, 1);
  EXPECT_EQ(observer_.finished.load(), 1);
}

// Item 3 with SQLite's own full-database error: max_page_count caps the
// file, inserts fail with SQLITE_FULL; readiness says so until space
// returns, and ExpireLeases' probe notices the recovery without any other
// write.
TEST_F(SchedulerFaultTest, FullDatabaseIsReportedUntilSpaceReturns) {
  ASSERT_TRUE(scheduler_->SubmitSweep(SmallSpec("s", {"pre_ln"}, {1e-3})).ok());
  Register("w1");
  auto lease = Acquire("w1");
  ASSERT_TRUE(lease.has_job());
  ASSERT_TRUE(Report(lease, 1, 10).ok());
  auto pages = db_->Prepare("PRAGMA page_count");
  ASSERT_TRUE(pages.ok());
  ASSERT_TRUE(*pages->Step());
  int64_t page_count = pages->ColumnInt(0);
  pages->Reset();
  ASSERT_TRUE(db_->Exec("PRAGMA max_page_count = " + std::to_string(page_count)).ok());
  auto full = Report(lease, 11, 5000);
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted) << full.status();
  EXPECT_EQ(scheduler_->Counters().points_accepted, 10);
  EXPECT_EQ(scheduler_->CheckDatabase().code(), absl::StatusCode::kUnavailable);
  // Still full: the probe fails too, readiness stays down.
  ASSERT_TRUE(scheduler_->ExpireLeases().ok());
  EXPECT_EQ(scheduler_->CheckDatabase().code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE(db_->Exec("PRAGMA max_page_count = 1000000").ok());
  ASSERT_TRUE(scheduler_->ExpireLeases().ok());
  EXPECT_TRUE(scheduler_->CheckDatabase().ok());
  auto again = Report(lease, 11, 5000);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->accepted(), 4990);
  auto watch = scheduler_->ReadWatch(lease.job_id(), 0, 0, 10000);
  ASSERT_TRUE(watch.ok());
  EXPECT_EQ(watch->points.size(), 5000u);  // the probe left no row behind
}

// Item 6: every string of a spec is bounded, the error names the field.
TEST_F(SchedulerFaultTest, OversizedSpecStringsAreRefusedNamingTheField) {
  v1::SweepSpec spec = SmallSpec("s", {"pre_ln"}, {1e-3});
  spec.mutable_training()->set_data(std::string(3900000, 'x'));
  auto big = scheduler_->SubmitSweep(spec);
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(big.status().message().find("spec: must be at most"), std::string::npos)
      << big.status();
  spec.mutable_training()->set_data(std::string(4097, 'x'));
  auto field = scheduler_->SubmitSweep(spec);
  EXPECT_EQ(field.status().message(), "spec.training.data: must be at most 4096 bytes, got 4097");
  spec = SmallSpec("s", {"pre_ln"}, {1e-3});
  (*spec.mutable_resources()->mutable_labels())["gpu"] = std::string(5000, 'a');
  auto label = scheduler_->SubmitSweep(spec);
  EXPECT_EQ(label.status().message(),
            "spec.resources.labels[\"gpu\"]: must be at most 4096 bytes, got 5000");
  spec = SmallSpec("s", {"pre_ln"}, {1e-3});
  for (int l = 0; l < 3; ++l) {
    (*spec.mutable_resources()->mutable_labels())["k" + std::to_string(l)] = std::string(2000, 'a');
  }
  EXPECT_EQ(scheduler_->SubmitSweep(spec).status().message(),
            "spec.resources.labels: keys and values must total at most 4096 bytes, got 6006");
  EXPECT_EQ(scheduler_->ListSweeps()->sweeps_size(), 0);
}

// Item 9: values that overflow (inf) or are absurdly large are refused with
// the field named, instead of being stored as JSON null for every job to fail.
TEST_F(SchedulerFaultTest, HugeTrainingNumbersAreRefusedNamingTheField) {
  struct Case {
    std::function<void(v1::TrainingSettings*)> set;
    std::string prefix;
  };
  std::vector<Case> cases = {
      {[](auto* t) { t->set_tokens_per_param(std::numeric_limits<double>::infinity()); },
       "spec.training.tokens_per_param: must be at most"},
      {[](auto* t) { t->set_seq_len(std::numeric_limits<int64_t>::max()); },
       "spec.training.seq_len: must be at most"},
      {[](auto* t) { t->set_batch(std::numeric_limits<int64_t>::max()); },
       "spec.training.batch: must be at most"},
      {[](auto* t) { t->set_steps(std::numeric_limits<int64_t>::max()); },
       "spec.training.steps: must be at most"},
      {[](auto* t) { t->set_grad_clip(std::numeric_limits<double>::infinity()); },
       "spec.training.grad_clip: must be at most"},
  };
  for (const Case& c : cases) {
    v1::SweepSpec spec = SmallSpec("s", {"pre_ln"}, {1e-3});
    spec.mutable_training()->clear_steps();
    c.set(spec.mutable_training());
    auto r = scheduler_->SubmitSweep(spec);
    ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << c.prefix;
    EXPECT_EQ(r.status().message().substr(0, c.prefix.size()), c.prefix) << r.status();
  }
  // The trainer's own parser: 2^63 does not wrap to -2^63.
  nlohmann::json config = {{"arch", "pre_ln"}, {"layers", 2}, {"d_model", 64}, {"lr", 1e-3}};
  config["seq_len"] = static_cast<uint64_t>(1) << 63;
  auto parsed = TrainConfigFromJson(config);
  EXPECT_EQ(parsed.status().message(),
            "config.seq_len: 9223372036854775808 is out of the 64-bit integer range");
  config["seq_len"] = 1e19;
  EXPECT_EQ(TrainConfigFromJson(config).status().code(), absl::StatusCode::kInvalidArgument);
  config["seq_len"] = 64;
  EXPECT_TRUE(TrainConfigFromJson(config).ok());
}

// Item 6: list responses end their page by bytes, so a page never outgrows
// gRPC's 4 MiB limit however large the items; following the tokens yields
// every item once.
TEST_F(SchedulerFaultTest, ListResponsesArePagedByBytes) {
  for (int s = 0; s < 6; ++s) {
    v1::SweepSpec spec = SmallSpec("big" + std::to_string(s), {"pre_ln", "hc"},
                                   {1e-3, 2e-3, 3e-3, 4e-3, 5e-3});
    for (int i = 0; i < 12; ++i) spec.add_seeds(i);
    spec.mutable_training()->set_data(std::string(4000, 'd'));
    for (char k = 'a'; k < 'a' + 26; ++k) {  // ~100 KB of spec per sweep
      spec.mutable_diagnostics()->add_kinds(std::string(3990, 'k') + k);
      spec.mutable_diagnostics()->add_kinds(std::string(3990, 'q') + k);
    }
    auto r = scheduler_->SubmitSweep(spec);
    ASSERT_TRUE(r.ok()) << r.status();
  }
  // 6 sweeps x 120 jobs of ~4 KB config each; sweeps of ~210 KB each.
  v1::ListJobsRequest req;
  req.set_page_size(1000);
  int64_t seen = 0, pages = 0, last_id = 0;
  while (true) {
    auto page = scheduler_->ListJobs(req);
    ASSERT_TRUE(page.ok()) << page.status();
    EXPECT_LE(page->ByteSizeLong(), kListPageBytes + 4096);
    for (const auto& j : page->jobs()) {
      EXPECT_GT(j.id(), last_id);
      last_id = j.id();
    }
    seen += page->jobs_size();
    ++pages;
    if (page->next_page_token().empty()) break;
    req.set_page_token(page->next_page_token());
  }
  EXPECT_EQ(seen, 720);
  EXPECT_GE(pages, 3);
  v1::ListSweepsRequest sreq;
  int64_t sweeps = 0, spages = 0;
  while (true) {
    auto page = scheduler_->ListSweeps(sreq);
    ASSERT_TRUE(page.ok()) << page.status();
    EXPECT_LE(page->ByteSizeLong(), kListPageBytes);
    sweeps += page->sweeps_size();
    ++spages;
    if (page->next_page_token().empty()) break;
    sreq.set_page_token(page->next_page_token());
  }
  EXPECT_EQ(sweeps, 6);
  EXPECT_GE(spages, 2);
  sreq.set_page_token("x");
  EXPECT_EQ(scheduler_->ListSweeps(sreq).status().code(), absl::StatusCode::kInvalidArgument);
}

// Item 6: DeleteSweep refuses while jobs run, --force cancels them, and
// everything of the sweep goes in one transaction (all or nothing).
TEST_F(SchedulerFaultTest, DeleteSweepRemovesEverythingOfTheSweepOnly) {
  ASSERT_TRUE(scheduler_->SubmitSweep(SmallSpec("a", {"pre_ln"}, {1e-3, 2e-3})).ok());
  ASSERT_TRUE(scheduler_->SubmitSweep(SmallSpec("b", {"pre_ln"}, {1e-3})).ok());
  Register("w1");
  auto done = Acquire("w1");  // a's first job
  ASSERT_TRUE(Report(done, 1, 5).ok());
  ASSERT_TRUE(Finish(done).ok());
  auto running = Acquire("w1");  // a's second job
  ASSERT_TRUE(Report(running, 1, 5).ok());
  auto other = Acquire("w1");  // b's job
  ASSERT_TRUE(Report(other, 1, 5).ok());

  v1::DeleteSweepRequest req;
  req.set_name("a");
  auto refused = scheduler_->DeleteSweep(req);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("--force"), std::string::npos);
  req.set_force(true);
  db_->InjectCommitFaultForTesting(DiskFull());
  EXPECT_FALSE(scheduler_->DeleteSweep(req).ok());
  db_->InjectCommitFaultForTesting(absl::OkStatus());
  EXPECT_TRUE(scheduler_->GetSweep("a").ok());  // rolled back whole
  EXPECT_EQ(State(running.job_id()), v1::RUNNING);
  int64_t cancelled_before = scheduler_->Counters().jobs_cancelled;

  auto deleted = scheduler_->DeleteSweep(req);
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_EQ(deleted->deleted_jobs(), 2);
  EXPECT_EQ(deleted->cancelled_jobs(), 1);
  EXPECT_EQ(scheduler_->Counters().jobs_cancelled, cancelled_before + 1);
  EXPECT_EQ(scheduler_->GetSweep("a").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(scheduler_->QueryResults("a").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(scheduler_->GetJob(done.job_id()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(scheduler_->ReadWatch(running.job_id(), 0, 0, 10).status().code(),
            absl::StatusCode::kNotFound);
  for (const char* table : {"jobs", "attempts", "results"}) {
    auto q = db_->Prepare(std::string("SELECT COUNT(*) FROM ") + table);
    ASSERT_TRUE(q.ok());
    ASSERT_TRUE(*q->Step());
    EXPECT_EQ(q->ColumnInt(0), 1) << table;  // b's only
  }
  auto points = db_->Prepare("SELECT COUNT(*) FROM metric_points");
  ASSERT_TRUE(*points->Step());
  EXPECT_EQ(points->ColumnInt(0), 5);
  points->Reset();
  // The worker still running a's job is told to stop; its reports are refused.
  v1::HeartbeatRequest hb;
  hb.set_worker_id("w1");
  auto* r = hb.add_running();
  r->set_job_id(running.job_id());
  r->set_attempt_id(running.attempt_id());
  auto reply = scheduler_->Heartbeat(hb);
  ASSERT_TRUE(reply.ok());
  ASSERT_EQ(reply->cancellations_size(), 1);
  EXPECT_EQ(Report(running, 6, 7).status().code(), absl::StatusCode::kFailedPrecondition);
  // b is untouched, and the name is free again.
  EXPECT_EQ(State(other.job_id()), v1::RUNNING);
  EXPECT_EQ(scheduler_->ListSweeps()->sweeps_size(), 1);
  EXPECT_TRUE(scheduler_->SubmitSweep(SmallSpec("a", {"pre_ln"}, {1e-3})).ok());
  req.set_name("nope");
  EXPECT_EQ(scheduler_->DeleteSweep(req).status().code(), absl::StatusCode::kNotFound);
}

// Reads one JobWatch to the end (terminal state and no more points).
std::vector<storage::MetricRecord> WatchToEnd(Scheduler* scheduler, int64_t job_id,
                                              int64_t from_step) {
  std::unique_ptr<JobWatch> watch = scheduler->Watch(job_id, from_step);
  std::vector<storage::MetricRecord> got;
  for (int i = 0; i < 100000; ++i) {
    auto batch = watch->Next(100, absl::Milliseconds(200));
    if (!batch.ok()) {
      ADD_FAILURE() << batch.status();
      break;
    }
    got.insert(got.end(), batch->points.begin(), batch->points.end());
    if (batch->points.size() < 100 && batch->state == v1::SUCCEEDED) break;
  }
  return got;
}

// Item 12: with many watchers (some falling behind a small ring and
// catching up from SQLite), every watcher gets every point once, in order,
// including the points committed with the final state.
TEST_F(SchedulerFaultTest, EveryWatcherGetsEveryPointOnce) {
  Open(/*ring=*/64);
  ASSERT_TRUE(scheduler_->SubmitSweep(SmallSpec("s", {"pre_ln"}, {1e-3})).ok());
  Register("w1");
  auto lease = Acquire("w1");
  ASSERT_TRUE(Report(lease, 1, 50).ok());  // stored before anyone watches
  constexpr int kWatchers = 24;
  std::vector<std::vector<storage::MetricRecord>> got(kWatchers);
  std::vector<std::thread> threads;
  for (int w = 0; w < kWatchers; ++w) {
    threads.emplace_back([&, w] {
      got[w] = WatchToEnd(scheduler_.get(), lease.job_id(), w % 2 == 0 ? 0 : 1001);
    });
  }
  for (int64_t s = 51; s <= 3000; s += 10) {
    ASSERT_TRUE(Report(lease, s, s + 9).ok());
    if (s % 500 == 1) std::this_thread::yield();
  }
  ASSERT_TRUE(Finish(lease).ok());  // adds val_loss at step 10
  for (auto& t : threads) t.join();
  for (int w = 0; w < kWatchers; ++w) {
    int64_t from = w % 2 == 0 ? 0 : 1001;
    size_t expected = w % 2 == 0 ? 3000 + 1 : 2000;  // the val_loss point is at step 10
    ASSERT_EQ(got[w].size(), expected) << "watcher " << w;
    int64_t last_row = 0;
    for (const auto& p : got[w]) {
      EXPECT_GT(p.row_id, last_row);
      EXPECT_GE(p.step, from);
      last_row = p.row_id;
    }
    EXPECT_EQ(got[w].back().name, w % 2 == 0 ? "val_loss" : "loss");
  }
}

// Item 12, the hub alone: a job nobody watches costs a lookup; a watcher
// behind the ring is told to read storage.
TEST(WatchHubTest, PublishesToWatchedJobsOnlyAndReportsLostPoints) {
  WatchHub hub(4);
  std::vector<storage::MetricRecord> points;
  for (int i = 1; i <= 6; ++i) points.push_back({i, 7, 1, i, "loss", 1.0 / i, 0});
  hub.Publish(7, points);  // unwatched: dropped
  auto channel = hub.Subscribe(7);
  auto empty = hub.Wait(*channel, 0, 0, 100, hub.state_epoch(), absl::ZeroDuration());
  EXPECT_TRUE(empty.points.empty());
  EXPECT_FALSE(empty.lost);
  hub.Publish(7, {points[0], points[1]});
  auto two = hub.Wait(*channel, 0, 0, 100, hub.state_epoch(), absl::Seconds(5));
  ASSERT_EQ(two.points.size(), 2u);
  EXPECT_EQ(two.cursor, 2);
  hub.Publish(7, {points[2], points[3], points[4], points[5]});  // evicts rows 1, 2
  EXPECT_FALSE(hub.Wait(*channel, 2, 0, 100, hub.state_epoch(), absl::ZeroDuration()).lost);
  EXPECT_TRUE(hub.Wait(*channel, 1, 0, 100, hub.state_epoch(), absl::ZeroDuration()).lost);
  auto from5 = hub.Wait(*channel, 2, 5, 100, hub.state_epoch(), absl::ZeroDuration());
  ASSERT_EQ(from5.points.size(), 2u);  // steps 5 and 6
  EXPECT_EQ(from5.cursor, 6);
  uint64_t epoch = hub.state_epoch();
  hub.StateChanged();
  EXPECT_EQ(hub.Wait(*channel, 6, 0, 100, epoch, absl::Seconds(5)).epoch, epoch + 1);
}

}  // namespace
}  // namespace depthbench::scheduler
