// The real system on loopback: depthbench-scheduler, depthbench-worker
// daemons and the depthbench-train children they run, on tiny models.
//   (1) a small sweep completes with two workers; every (arch, shape) row
//   (2) kill -9 of a worker between checkpoints (its points relayed live
//       past the last one): lease expires, another worker resumes from the
//       checkpoint, the canonical history has every step exactly once and
//       the abandoned points stay readable per attempt
//   (3) kill -9 of the scheduler mid-sweep + restart: the sweep completes
//   (4) cancel while jobs run: children gone within the grace period
//   (5) a crashing child ends `failed` with its stderr tail; retry re-runs it
//   (6) a diverging run is final, not retried, and skipped by best-LR
//   (7) SIGTERM to a worker: children checkpoint, jobs re-queued without
//       using an attempt, resumed by another worker
//   (8) live points: from the trainer logging a point to WatchJob returning
//       it takes under 2 s (p99 over 300 points), with no checkpoint_interval
//   (9) successive halving (issue 15): a run pruned at a rung has its
//       trainer gone within the grace period, and its slot runs the next job
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <set>

#include <gtest/gtest.h>

#include "tests/integration/scheduler_process.h"
#include "tests/integration/sweep_fixture.h"
#include "tests/integration/worker_process.h"

namespace depthbench::testing {
namespace {

namespace v1 = ::depthbench::v1;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

constexpr int kLeaseTtlMs = 3000;  // heartbeats every second

struct SpecOptions {
  std::vector<std::string> archs = {"pre_ln"};
  std::vector<double> lrs = {3e-3};
  // Empty: the `tiny` suite (L = 2, 4, 6).
  std::vector<int> layers;
  int64_t steps = 10;
  int64_t checkpoint_interval = 0;
  std::string data = "brown";
  int max_attempts = 3;
};

v1::SweepSpec Spec(const std::string& name, const SpecOptions& o) {
  v1::SweepSpec spec;
  spec.set_name(name);
  for (const std::string& a : o.archs) {
    spec.add_architectures(a);
    for (double lr : o.lrs) (*spec.mutable_lr_grids())[a].add_lrs(lr);
  }
  if (o.layers.empty()) {
    spec.mutable_shapes()->set_suite("tiny");
  } else {
    for (int l : o.layers) {
      auto* s = spec.mutable_shapes()->add_explicit_shapes();
      s->set_layers(l);
      s->set_d_model(64);
      s->set_heads(4);
      s->set_vocab(256);
    }
  }
  auto* t = spec.mutable_training();
  t->set_data(o.data);
  t->set_seq_len(32);
  t->set_batch(4);
  t->set_steps(o.steps);
  t->set_eval_batches(2);
  t->set_log_interval(1);
  if (o.checkpoint_interval > 0) t->set_checkpoint_interval(o.checkpoint_interval);
  spec.mutable_retry()->set_max_attempts(o.max_attempts);
  spec.mutable_retry()->set_initial_backoff_ms(100);
  spec.mutable_retry()->set_max_backoff_ms(500);
  return spec;
}

struct PointKey {
  int64_t attempt_id;
  int64_t step;
  std::string name;
};

class WorkerSystemTest : public SweepFixture {
 protected:
  void SetUp() override {
    MakeDirs("worker_");
    StartScheduler(kLeaseTtlMs);
  }

  void TearDown() override {
    for (auto& w : workers_) w->Stop(SIGKILL);  // children die with them (PDEATHSIG)
    workers_.clear();
    server_->Stop(SIGKILL);
    if (!HasFailure()) std::filesystem::remove_all(dir_);
  }

  WorkerProcess* AddWorker(const std::string& name, std::vector<std::string> extra = {}) {
    workers_.push_back(std::make_unique<WorkerProcess>(name, dir_));
    workers_.back()->Start(server_->address(), root_, std::move(extra));
    return workers_.back().get();
  }

  // Waits for the sweep to leave RUNNING; false on timeout.
  bool WaitSweepDone(const std::string& name, int timeout_s) {
    auto deadline = Clock::now() + std::chrono::seconds(timeout_s);
    while (Clock::now() < deadline) {
      auto sweep = GetSweep(name);
      if (sweep && sweep->state() != v1::SWEEP_RUNNING) return true;
      std::this_thread::sleep_for(milliseconds(100));
    }
    return false;
  }

  std::vector<PointKey> Points(int64_t job_id) {
    v1::WatchJobRequest req;
    req.set_job_id(job_id);
    auto ctx = Ctx(20000);
    auto reader = stub_->WatchJob(ctx.get(), req);
    v1::WatchJobEvent event;
    std::vector<PointKey> out;
    while (reader->Read(&event)) {
      if (event.has_point()) {
        out.push_back({event.attempt_id(), event.point().step(), event.point().name()});
      }
    }
    EXPECT_TRUE(reader->Finish().ok());
    return out;
  }

  // Every step 1..steps has exactly one `loss` point in the job's
  // canonical history. Returns the attempt each step's point came from.
  std::map<int64_t, int64_t> ExpectEveryStepOnce(int64_t job_id, int64_t steps) {
    std::map<int64_t, int> count;
    std::map<int64_t, int64_t> attempt_of;
    for (const PointKey& p : Points(job_id)) {
      if (p.name != "loss") continue;
      count[p.step]++;
      attempt_of[p.step] = p.attempt_id;
    }
    EXPECT_EQ(static_cast<int64_t>(count.size()), steps) << "job " << job_id;
    for (int64_t s = 1; s <= steps; ++s) {
      EXPECT_EQ(count[s], 1) << "job " << job_id << " step " << s;
    }
    return attempt_of;
  }

  // WatchJob events of a job (attempt_id 0: its canonical history) until
  // the stream ends, `until` returns true, or `ms` pass.
  std::vector<v1::WatchJobEvent> WatchFor(
      int64_t job_id, int64_t attempt_id, int ms,
      const std::function<bool(const v1::WatchJobEvent&)>& until = nullptr) {
    v1::WatchJobRequest req;
    req.set_job_id(job_id);
    req.set_attempt_id(attempt_id);
    auto ctx = Ctx(ms);
    auto reader = stub_->WatchJob(ctx.get(), req);
    std::vector<v1::WatchJobEvent> out;
    v1::WatchJobEvent event;
    while (reader->Read(&event)) {
      out.push_back(event);
      if (until && until(event)) {
        ctx->TryCancel();
        break;
      }
    }
    reader->Finish();  // DEADLINE_EXCEEDED / CANCELLED while the job runs
    return out;
  }

  // The `loss` steps stored for one attempt (including abandoned ones).
  std::vector<int64_t> AttemptLossSteps(int64_t job_id, int64_t attempt_id, int ms) {
    std::vector<int64_t> steps;
    for (const v1::WatchJobEvent& e : WatchFor(job_id, attempt_id, ms)) {
      if (e.has_point() && e.point().name() == "loss") steps.push_back(e.point().step());
    }
    std::sort(steps.begin(), steps.end());
    return steps;
  }

  // SIGSTOPs `trainer` once the steps attempt `attempt_id` stored stop
  // changing and the last is not on a checkpoint (else lets it run a little
  // and tries again); returns that last step (0: none stored).
  int64_t FreezeBetweenCheckpoints(pid_t trainer, int64_t job_id, int64_t attempt_id,
                                   int64_t interval) {
    std::vector<int64_t> stored;
    for (int tries = 0; tries < 20; ++tries) {
      if (kill(trainer, SIGSTOP) != 0) return 0;
      std::vector<int64_t> previous;
      while (true) {  // until two reads agree (the relay flushes every 250 ms)
        std::this_thread::sleep_for(milliseconds(600));
        stored = AttemptLossSteps(job_id, attempt_id, 1500);
        if (stored == previous) break;
        previous = stored;
      }
      if (stored.empty()) return 0;
      if (stored.back() % interval != 0) break;  // not exactly at a checkpoint
      kill(trainer, SIGCONT);
      std::this_thread::sleep_for(milliseconds(15));
    }
    return stored.back();
  }

  // The pid of a RUNNING job's trainer (the worker's only child); 0 at the
  // deadline or when the job pauses or is pruned before it is seen (a
  // failure).
  pid_t CatchTrainer(int64_t job_id, pid_t worker, Clock::time_point deadline) {
    while (Clock::now() < deadline) {
      v1::Job job = GetJob(job_id);
      if (job.state() == v1::RUNNING) {
        std::vector<pid_t> children = ChildPids(worker);
        if (children.size() == 1 && GetJob(job_id).state() == v1::RUNNING) return children[0];
      }
      EXPECT_NE(job.state(), v1::PAUSED) << "paused before its trainer was seen";
      EXPECT_NE(job.state(), v1::PRUNED) << "pruned before its trainer was seen";
      if (job.state() == v1::PAUSED || job.state() == v1::PRUNED) return 0;
      std::this_thread::sleep_for(milliseconds(5));
    }
    return 0;
  }

  // The job once it is no longer RUNNING (or as it is at the deadline).
  v1::Job WaitWhileRunning(int64_t job_id, Clock::time_point deadline) {
    v1::Job job;
    while (Clock::now() < deadline) {
      job = GetJob(job_id);
      if (job.state() != v1::RUNNING) break;
      std::this_thread::sleep_for(milliseconds(5));
    }
    return job;
  }

  // Whether the job left PENDING before the deadline.
  bool WaitStarted(int64_t job_id, Clock::time_point deadline) {
    while (Clock::now() < deadline) {
      if (GetJob(job_id).state() != v1::PENDING) return true;
      std::this_thread::sleep_for(milliseconds(20));
    }
    return false;
  }

  std::string Cli(const std::string& args) {
    return std::string(DEPTHBENCH_CLI_BIN) + " --scheduler " + server_->address() + " " + args;
  }

  // dir_, root_, server_ and stub_ are SweepFixture's.
  std::vector<std::unique_ptr<WorkerProcess>> workers_;
};

// (1)
TEST_F(WorkerSystemTest, SmallSweepCompletesWithTwoWorkers) {
  SpecOptions o;
  o.archs = {"pre_ln", "sandwich_ln"};
  o.steps = 8;
  Submit(Spec("small", o));
  AddWorker("w1");
  AddWorker("w2");
  ASSERT_TRUE(WaitSweepDone("small", 200));
  std::set<std::string> workers_used;
  for (const v1::Job& job : Jobs("small")) {
    EXPECT_EQ(job.state(), v1::SUCCEEDED) << job.id() << ": " << job.reason();
    EXPECT_EQ(job.final_step(), 8);
    EXPECT_TRUE(job.has_val_loss());
    const v1::Job full = GetJob(job.id());
    for (const v1::Attempt& a : full.attempts()) workers_used.insert(a.worker_id());
    ExpectEveryStepOnce(job.id(), 8);
  }
  EXPECT_EQ(workers_used, (std::set<std::string>{"w1", "w2"}));
  auto [rc, csv] = RunCommand(Cli("results small --csv"));
  ASSERT_EQ(rc, 0) << csv;
  std::set<std::string> rows;
  std::istringstream lines(csv);
  std::string line;
  std::getline(lines, line);  // header
  while (std::getline(lines, line)) {
    std::vector<std::string> cells;
    std::stringstream cs(line);
    std::string cell;
    while (std::getline(cs, cell, ',')) cells.push_back(cell);
    ASSERT_GE(cells.size(), 7u) << line;
    EXPECT_NE(cells[5], "-") << "no best LR in " << line;
    EXPECT_EQ(cells.back(), "yes") << line;
    rows.insert(cells[0] + "/L" + cells[1]);
  }
  EXPECT_EQ(rows, (std::set<std::string>{"pre_ln/L2", "pre_ln/L4", "pre_ln/L6",
                                         "sandwich_ln/L2", "sandwich_ln/L4",
                                         "sandwich_ln/L6"}));
}

// (2)
TEST_F(WorkerSystemTest, KilledWorkerLeaseExpiresAndAnotherResumesFromCheckpoint) {
  constexpr int64_t kInterval = 50;
  SpecOptions o;
  o.layers = {2};
  o.steps = 300;
  o.checkpoint_interval = kInterval;
  Submit(Spec("resume", o));
  WorkerProcess* w1 = AddWorker("w1");
  std::vector<v1::Job> jobs = Jobs("resume");
  ASSERT_EQ(jobs.size(), 1u);
  const int64_t job_id = jobs[0].id();
  // Live points: attempt 1's steps past its first checkpoint reach the
  // scheduler while it trains (no waiting for a checkpoint).
  int64_t attempt1 = 0;
  WatchFor(job_id, 0, 120000, [&](const v1::WatchJobEvent& e) {
    if (e.has_point() && e.point().name() == "loss" && e.point().step() > kInterval + 10) {
      attempt1 = e.attempt_id();
      return true;
    }
    return false;
  });
  ASSERT_NE(attempt1, 0) << "no live point past step " << kInterval + 10 << "; see " << w1->log();
  std::vector<pid_t> trainers = ChildPids(w1->pid());
  ASSERT_EQ(trainers.size(), 1u);
  // Freeze the trainer between checkpoints: attempt 1 got exactly this far.
  const int64_t reached = FreezeBetweenCheckpoints(trainers[0], job_id, attempt1, kInterval);
  ASSERT_GT(reached, 0) << "attempt 1 stored no points";
  ASSERT_NE(reached % kInterval, 0);
  ASSERT_LT(reached, 300);
  ASSERT_NE(GetJob(job_id).state(), v1::SUCCEEDED);
  w1->Stop(SIGKILL);
  // The orphaned trainer dies with its worker (PR_SET_PDEATHSIG), stopped
  // or not, and cannot write into the shared directory while another
  // attempt resumes there.
  for (int i = 0; i < 200 && ProcessAlive(trainers[0]); ++i) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  EXPECT_FALSE(ProcessAlive(trainers[0]));
  AddWorker("w2");
  ASSERT_TRUE(WaitSweepDone("resume", 180));
  v1::Job job = GetJob(job_id);
  EXPECT_EQ(job.state(), v1::SUCCEEDED) << job.reason();
  EXPECT_EQ(job.final_step(), 300);
  ASSERT_EQ(job.attempts_size(), 2);
  EXPECT_EQ(job.attempts(0).attempt_id(), attempt1);
  EXPECT_EQ(job.attempts(0).worker_id(), "w1");
  EXPECT_EQ(job.attempts(0).outcome(), "expired");
  EXPECT_EQ(job.attempts(1).worker_id(), "w2");
  EXPECT_EQ(job.attempts(1).outcome(), "succeeded");
  // Resumed, not restarted: from the last checkpoint before the kill.
  const int64_t resumed = reached / kInterval * kInterval;
  ASSERT_GT(resumed, 0);
  EXPECT_EQ(job.attempts(0).resumed_from_step(), 0);
  EXPECT_EQ(job.attempts(1).resumed_from_step(), resumed);
  std::string log = workers_.back()->ReadLog();
  EXPECT_NE(log.find("resumed from step " + std::to_string(resumed)), std::string::npos) << log;
  // Every step exactly once in the canonical history: attempt 1's up to
  // the checkpoint, attempt 2's after it.
  const std::map<int64_t, int64_t> attempt_of = ExpectEveryStepOnce(job_id, 300);
  for (const auto& [step, attempt] : attempt_of) {
    EXPECT_EQ(attempt, step <= resumed ? attempt1 : job.attempts(1).attempt_id())
        << "step " << step;
  }
  // Attempt 1's abandoned steps (resumed, reached] are still stored under
  // it, each once, and readable per attempt.
  std::vector<int64_t> mine = AttemptLossSteps(job_id, attempt1, 20000);
  ASSERT_EQ(static_cast<int64_t>(mine.size()), reached) << "attempt 1 stored 1.." << reached;
  for (int64_t i = 0; i < reached; ++i) EXPECT_EQ(mine[i], i + 1);
  // A canonical watcher is told where the retry resumed.
  bool told = false;
  for (const v1::WatchJobEvent& e : WatchFor(job_id, 0, 20000)) {
    if (e.has_resumed()) {
      told = true;
      EXPECT_EQ(e.resumed().step(), resumed);
      EXPECT_EQ(e.attempt_id(), job.attempts(1).attempt_id());
    }
  }
  EXPECT_TRUE(told);
}

// (3)
TEST_F(WorkerSystemTest, SchedulerKilledMidSweepAndRestartedSweepCompletes) {
  SpecOptions o;
  o.layers = {2, 3};
  o.lrs = {3e-3, 1e-2};
  o.steps = 40;
  o.checkpoint_interval = 10;
  Submit(Spec("restart", o));
  AddWorker("w1");
  AddWorker("w2");
  // Wait until training is under way (a job running), then kill -9.
  auto deadline = Clock::now() + std::chrono::seconds(120);
  bool running = false;
  while (!running && Clock::now() < deadline) {
    auto sweep = GetSweep("restart");
    running = sweep && sweep->job_counts().count("running") > 0 &&
              sweep->job_counts().at("running") > 0;
    if (!running) std::this_thread::sleep_for(milliseconds(50));
  }
  ASSERT_TRUE(running);
  const int port = server_->port();
  server_->Stop(SIGKILL);
  std::this_thread::sleep_for(milliseconds(1500));  // workers see it gone
  ASSERT_TRUE(server_->Start(port)) << "restart on port " << port;
  Connect();
  ASSERT_TRUE(WaitSweepDone("restart", 200));
  std::vector<v1::Job> jobs = Jobs("restart");
  ASSERT_EQ(jobs.size(), 4u);
  for (const v1::Job& job : jobs) {
    EXPECT_EQ(job.state(), v1::SUCCEEDED) << job.id() << ": " << job.reason();
    EXPECT_EQ(job.final_step(), 40);
    ExpectEveryStepOnce(job.id(), 40);
  }
  for (auto& w : workers_) EXPECT_TRUE(ProcessAlive(w->pid()));
}

// (4)
TEST_F(WorkerSystemTest, CancelSweepStopsChildrenWithinGracePeriod) {
  constexpr int kGraceMs = 2000;
  SpecOptions o;
  o.layers = {2};
  o.lrs = {3e-3, 1e-2};
  o.steps = 100000;  // runs until cancelled
  Submit(Spec("cancel", o));
  WorkerProcess* w1 = AddWorker("w1", {"--grace-ms", std::to_string(kGraceMs)});
  WorkerProcess* w2 = AddWorker("w2", {"--grace-ms", std::to_string(kGraceMs)});
  auto deadline = Clock::now() + std::chrono::seconds(120);
  std::vector<pid_t> trainers;
  while (Clock::now() < deadline) {
    trainers = ChildPids(w1->pid());
    std::vector<pid_t> t2 = ChildPids(w2->pid());
    auto sweep = GetSweep("cancel");
    bool both_running = sweep && sweep->job_counts().count("running") &&
                        sweep->job_counts().at("running") == 2;
    if (trainers.size() == 1 && t2.size() == 1 && both_running) {
      trainers.push_back(t2[0]);
      break;
    }
    std::this_thread::sleep_for(milliseconds(50));
  }
  ASSERT_EQ(trainers.size(), 2u);
  auto [rc, out] = RunCommand(Cli("cancel cancel"));
  ASSERT_EQ(rc, 0) << out;
  auto cancelled_at = Clock::now();
  // The next heartbeat (<= TTL/3) carries the cancellation; then SIGTERM,
  // SIGKILL after the grace period.
  auto limit = cancelled_at + milliseconds(kLeaseTtlMs / 3 + kGraceMs + 1500);
  while ((ProcessAlive(trainers[0]) || ProcessAlive(trainers[1])) && Clock::now() < limit) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  EXPECT_FALSE(ProcessAlive(trainers[0]));
  EXPECT_FALSE(ProcessAlive(trainers[1]));
  for (const v1::Job& job : Jobs("cancel")) EXPECT_EQ(job.state(), v1::CANCELLED);
  auto sweep = GetSweep("cancel");
  ASSERT_TRUE(sweep);
  EXPECT_EQ(sweep->state(), v1::SWEEP_CANCELLED);
  // The workers stay up and idle.
  EXPECT_TRUE(ProcessAlive(w1->pid()));
  EXPECT_TRUE(ProcessAlive(w2->pid()));
  EXPECT_TRUE(ChildPids(w1->pid()).empty());
  EXPECT_TRUE(ChildPids(w2->pid()).empty());
}

// (5)
TEST_F(WorkerSystemTest, CrashingChildFailsWithStderrTailAndRetryRerunsIt) {
  SpecOptions o;
  o.layers = {2};
  o.data = "/nonexistent.bin";
  o.max_attempts = 1;
  Submit(Spec("crash", o));
  AddWorker("w1");
  ASSERT_TRUE(WaitSweepDone("crash", 120));
  std::vector<v1::Job> jobs = Jobs("crash");
  ASSERT_EQ(jobs.size(), 1u);
  v1::Job job = GetJob(jobs[0].id());
  EXPECT_EQ(job.state(), v1::FAILED);
  EXPECT_NE(job.reason().find("exit code 2"), std::string::npos) << job.reason();
  EXPECT_NE(job.reason().find("stderr tail"), std::string::npos) << job.reason();
  // The trainer's own message, relayed from its stderr.
  EXPECT_NE(job.reason().find("/nonexistent.bin"), std::string::npos) << job.reason();
  ASSERT_EQ(job.attempts_size(), 1);

  auto [rc, out] = RunCommand(Cli("retry " + std::to_string(job.id())));
  ASSERT_EQ(rc, 0) << out;
  auto deadline = Clock::now() + std::chrono::seconds(120);
  while (Clock::now() < deadline) {
    job = GetJob(job.id());
    if (job.attempts_size() == 2 && job.state() == v1::FAILED) break;
    std::this_thread::sleep_for(milliseconds(100));
  }
  EXPECT_EQ(job.attempts_size(), 2);
  EXPECT_EQ(job.state(), v1::FAILED);
  EXPECT_EQ(job.attempts(1).outcome(), "failed");
}

// (6)
TEST_F(WorkerSystemTest, DivergingRunIsFinalNotRetriedAndSkippedByBestLr) {
  SpecOptions o;
  o.layers = {2};
  o.lrs = {3e-3, 1e3};
  o.steps = 12;
  o.max_attempts = 3;
  Submit(Spec("diverge", o));
  AddWorker("w1");
  AddWorker("w2");
  ASSERT_TRUE(WaitSweepDone("diverge", 150));
  int diverged = 0;
  for (const v1::Job& listed : Jobs("diverge")) {
    v1::Job job = GetJob(listed.id());
    if (job.lr() > 1) {
      EXPECT_EQ(job.state(), v1::DIVERGED) << job.reason();
      EXPECT_EQ(job.attempts_size(), 1);  // a training result: not retried
      EXPECT_FALSE(job.reason().empty());
      EXPECT_FALSE(job.is_best());
      ++diverged;
    } else {
      EXPECT_EQ(job.state(), v1::SUCCEEDED) << job.reason();
      EXPECT_TRUE(job.is_best());
    }
  }
  EXPECT_EQ(diverged, 1);
  v1::QueryResultsRequest req;
  req.set_sweep("diverge");
  v1::QueryResultsResponse results;
  ASSERT_TRUE(stub_->QueryResults(Ctx().get(), req, &results).ok());
  ASSERT_EQ(results.rows_size(), 1);
  const v1::ResultRow& row = results.rows(0);
  ASSERT_TRUE(row.has_best());
  EXPECT_DOUBLE_EQ(row.best_lr(), 3e-3);
  bool saw_diverged_lr = false;
  for (const v1::LrLoss& l : row.lrs()) {
    if (l.lr() > 1) {
      EXPECT_TRUE(l.diverged());
      saw_diverged_lr = true;
    }
  }
  EXPECT_TRUE(saw_diverged_lr);
}

// (7) SIGTERM to a worker: its child checkpoints and exits 4, the job is
// reported INTERRUPTED (re-queued at once, the attempt not counted), the
// worker exits 0, and another worker finishes the job from the checkpoint.
TEST_F(WorkerSystemTest, SigtermInterruptsChildrenAndAnotherWorkerResumes) {
  SpecOptions o;
  o.layers = {2};
  o.steps = 600;
  o.max_attempts = 1;  // an interrupted attempt must not use it up
  Submit(Spec("drain", o));
  WorkerProcess* w1 = AddWorker("w1");
  std::vector<v1::Job> jobs = Jobs("drain");
  ASSERT_EQ(jobs.size(), 1u);
  const int64_t job_id = jobs[0].id();
  auto deadline = Clock::now() + std::chrono::seconds(120);
  while (Clock::now() < deadline && GetJob(job_id).state() != v1::RUNNING) {
    std::this_thread::sleep_for(milliseconds(50));
  }
  ASSERT_EQ(GetJob(job_id).state(), v1::RUNNING);
  std::this_thread::sleep_for(milliseconds(500));  // some steps done
  int status = w1->Stop(SIGTERM, 30000);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
  v1::Job job = GetJob(job_id);
  EXPECT_EQ(job.state(), v1::PENDING);
  ASSERT_EQ(job.attempts_size(), 1);
  EXPECT_EQ(job.attempts(0).outcome(), "interrupted");
  EXPECT_EQ(job.attempts_used(), 0);
  AddWorker("w2");
  ASSERT_TRUE(WaitSweepDone("drain", 120));
  job = GetJob(job_id);
  EXPECT_EQ(job.state(), v1::SUCCEEDED) << job.reason();
  EXPECT_EQ(job.final_step(), 600);
  ExpectEveryStepOnce(job_id, 600);
  std::string log = workers_.back()->ReadLog();
  EXPECT_NE(log.find("resumed from step "), std::string::npos) << log;
}

// (8) Issue 19: as a new user would run it, with no checkpoint_interval in
// the spec: every point the trainer logs reaches WatchJob live. Latency is
// the watcher's receipt time minus the trainer's own timestamp (time_ms of
// the event, same machine), p99 over every `loss` point.
TEST_F(WorkerSystemTest, LivePointsReachWatchJobWithinTwoSeconds) {
  SpecOptions o;
  o.layers = {2};
  o.steps = 300;
  Submit(Spec("live", o));
  std::vector<v1::Job> jobs = Jobs("live");
  ASSERT_EQ(jobs.size(), 1u);
  const int64_t job_id = jobs[0].id();
  // Watch from before the job starts: everything then arrives live.
  std::vector<double> latency_ms;
  std::map<int64_t, int> seen;
  bool ended = false;
  std::thread watcher([&] {
    v1::WatchJobRequest req;
    req.set_job_id(job_id);
    auto ctx = Ctx(240000);
    auto reader = stub_->WatchJob(ctx.get(), req);
    v1::WatchJobEvent event;
    while (reader->Read(&event)) {
      const int64_t now_ms = std::chrono::duration_cast<milliseconds>(
                                 std::chrono::system_clock::now().time_since_epoch())
                                 .count();
      if (event.has_point() && event.point().name() == "loss") {
        latency_ms.push_back(static_cast<double>(now_ms - event.point().wall_ms()));
        seen[event.point().step()]++;
      }
      if (event.has_state() && event.state() == v1::SUCCEEDED) ended = true;
    }
    EXPECT_TRUE(reader->Finish().ok());
  });
  // And as a user follows it: `depthbench watch --sweep`, one line per point.
  std::pair<int, std::string> cli;
  std::thread cli_watcher(
      [&] { cli = RunCommand(Cli("watch --sweep live --only loss --timeout-s 200 2>&1")); });
  AddWorker("w1");
  watcher.join();
  cli_watcher.join();
  ASSERT_TRUE(ended);
  ASSERT_EQ(cli.first, 0) << cli.second;
  std::set<int64_t> cli_steps;
  std::istringstream cli_lines(cli.second);
  for (std::string line; std::getline(cli_lines, line);) {
    const std::string head = "job " + std::to_string(job_id) + " attempt ";
    if (line.rfind(head, 0) != 0 || line.find(" loss ") == std::string::npos) continue;
    size_t at = line.find(" step ");
    ASSERT_NE(at, std::string::npos) << line;
    EXPECT_TRUE(cli_steps.insert(std::stoll(line.substr(at + 6))).second) << line;
  }
  EXPECT_EQ(cli_steps.size(), 300u) << cli.second.substr(0, 2000);
  ASSERT_EQ(seen.size(), 300u);
  for (const auto& [step, n] : seen) EXPECT_EQ(n, 1) << "step " << step;
  std::vector<double> sorted = latency_ms;
  std::sort(sorted.begin(), sorted.end());
  auto pct = [&](double p) {
    return sorted[std::min(sorted.size() - 1, static_cast<size_t>(p * sorted.size()))];
  };
  std::printf("live latency trainer -> WatchJob over %zu points: p50 %.0f ms, p90 %.0f ms, "
              "p99 %.0f ms, max %.0f ms\n",
              sorted.size(), pct(0.5), pct(0.9), pct(0.99), sorted.back());
  EXPECT_GE(sorted.front(), -50.0) << "clock skew?";  // same machine
  // The bound, loose for a loaded CI machine (flush 250 ms + RPCs).
  EXPECT_LT(pct(0.99), 2000.0);
}

// (9)
TEST_F(WorkerSystemTest, PrunedRunIsStoppedWithinGraceAndItsSlotRunsTheNextJob) {
  constexpr int kGraceMs = 2000;
  SpecOptions o;
  o.layers = {2};
  // In job order: a good LR, then two hopeless ones (they barely move from
  // the initial loss). Successive halving pauses each run reaching rung 0
  // until the rung is complete (3 runs, eta 3: top 1 continues): the first
  // (good) run is paused, then the first hopeless one; the last completes
  // the rung: it is pruned with the paused hopeless one, and the good run
  // is promoted and resumes from the checkpoint written when it was stopped.
  o.lrs = {3e-3, 1e-7, 2e-7};
  o.steps = 1800;
  v1::SweepSpec spec = Spec("halving", o);
  spec.mutable_training()->set_eval_interval(200);  // rungs at steps 200 and 600
  spec.mutable_strategy()->set_kind("successive_halving");
  Submit(spec);
  std::vector<v1::Job> jobs = Jobs("halving");
  ASSERT_EQ(jobs.size(), 3u);
  std::sort(jobs.begin(), jobs.end(), [](auto& a, auto& b) { return a.id() < b.id(); });
  const int64_t hopeless = jobs[1].id();
  ASSERT_DOUBLE_EQ(jobs[1].lr(), 1e-7);
  // One worker, one slot: the jobs run one after another.
  WorkerProcess* w1 = AddWorker("w1", {"--grace-ms", std::to_string(kGraceMs)});
  // Catch the hopeless run's trainer while it runs.
  auto deadline = Clock::now() + std::chrono::seconds(240);
  const pid_t trainer = CatchTrainer(hopeless, w1->pid(), deadline);
  ASSERT_NE(trainer, 0) << "the hopeless run's trainer was never seen running";
  // It is stopped (paused) at rung 0 (step 200) ...
  v1::Job job = WaitWhileRunning(hopeless, deadline);
  const auto stopped_at = Clock::now();
  ASSERT_EQ(job.state(), v1::PAUSED) << job.reason();
  EXPECT_NE(job.reason().find("paused at rung 0 (step 200)"), std::string::npos) << job.reason();
  EXPECT_EQ(job.final_step(), 200);
  // ... its trainer is gone within the grace period (SIGTERM on the answer
  // to the report that paused it; SIGKILL at the latest after grace) ...
  while (ProcessAlive(trainer) && Clock::now() < stopped_at + milliseconds(kGraceMs + 1500)) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  EXPECT_FALSE(ProcessAlive(trainer));
  // ... and the worker's only slot runs the next job.
  const int64_t next = jobs[2].id();
  EXPECT_TRUE(WaitStarted(next, deadline));
  EXPECT_EQ(GetJob(next).worker_id().empty() ? std::string("w1") : GetJob(next).worker_id(), "w1");
  ASSERT_TRUE(WaitSweepDone("halving", 240));
  // Never a failure, never retried: the hopeless runs are pruned once rung
  // 0 is complete (a pause uses no attempt); the good run was promoted and
  // resumed from its checkpoint; the worker is idle and alive.
  job = GetJob(hopeless);
  EXPECT_EQ(job.state(), v1::PRUNED) << job.reason();
  EXPECT_NE(job.reason().find("pruned at rung 0 (step 200)"), std::string::npos) << job.reason();
  EXPECT_EQ(job.attempts_used(), 0);
  EXPECT_EQ(GetJob(next).state(), v1::PRUNED);
  v1::Job good = GetJob(jobs[0].id());
  EXPECT_EQ(good.state(), v1::SUCCEEDED) << good.reason();
  ASSERT_EQ(good.attempts_size(), 2);
  EXPECT_EQ(good.attempts(0).outcome(), "paused");
  EXPECT_GE(good.attempts(1).resumed_from_step(), 200);  // its checkpoint, not step 0
  EXPECT_TRUE(ProcessAlive(w1->pid()));
  auto [rc, out] = RunCommand(Cli("results halving --csv"));
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("pruned@r0"), std::string::npos) << out;
}

}  // namespace
}  // namespace depthbench::testing
