// The real depthbench-scheduler on loopback, driven by test WorkerService
// clients: a sweep to completion, a silent worker losing its lease, kill -9
// mid-sweep with a restart on the same file, and the bearer token.
#include <atomic>
#include <cmath>
#include <cstdio>
#include <set>

#include <gtest/gtest.h>

#include "storage/sqlite.h"
#include "tests/integration/scheduler_process.h"

namespace depthbench::testing {
namespace {

namespace v1 = ::depthbench::v1;
using std::chrono::milliseconds;

bool Retryable(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAVAILABLE ||
         s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
}

// A worker that "trains" by reporting `steps` loss points in chunks, then a
// val_loss point, and finishes: lr 5e-3 diverges, otherwise val loss is
// 3 + |log10(lr / 2e-3)| (so 2e-3 is best). Retries through scheduler
// outages (same attempt; re-sent points are idempotent).
class TestWorker {
 public:
  TestWorker(const std::string& address, std::string name, int steps, int chunk,
             int chunk_delay_ms = 0)
      : name_(std::move(name)), steps_(steps), chunk_(chunk), delay_ms_(chunk_delay_ms) {
    auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
    stub_ = v1::WorkerService::NewStub(channel);
  }

  // Retries `call` while the scheduler is unreachable (up to ~30 s).
  template <typename F>
  grpc::Status Retry(F call) {
    grpc::Status s;
    for (int i = 0; i < 600; ++i) {
      s = call();
      if (!Retryable(s)) return s;
      std::this_thread::sleep_for(milliseconds(50));
    }
    return s;
  }

  bool Register() {
    v1::RegisterWorkerRequest req;
    req.set_name(name_);
    req.mutable_resources()->set_slots(1);
    if (job_id_ != 0) {
      auto* r = req.add_running();
      r->set_job_id(job_id_);
      r->set_attempt_id(attempt_id_);
    }
    v1::RegisterWorkerResponse resp;
    return Retry([&] { return stub_->RegisterWorker(Ctx().get(), req, &resp); }).ok();
  }

  // Runs jobs until `done()` says the sweep is over.
  void Run(const std::function<bool()>& done) {
    ASSERT_TRUE(Register());
    while (!done()) {
      v1::AcquireJobRequest req;
      req.set_worker_id(name_);
      v1::AcquireJobResponse lease;
      grpc::Status s = Retry([&] { return stub_->AcquireJob(Ctx().get(), req, &lease); });
      if (s.error_code() == grpc::StatusCode::NOT_FOUND) {
        Register();
        continue;
      }
      ASSERT_TRUE(s.ok()) << s.error_message();
      if (!lease.has_job()) {
        std::this_thread::sleep_for(milliseconds(20));
        continue;
      }
      job_id_ = lease.job_id();
      attempt_id_ = lease.attempt_id();
      RunJob(lease);
      job_id_ = attempt_id_ = 0;
      ++jobs_run_;
    }
  }

  void RunJob(const v1::AcquireJobResponse& lease) {
    double lr = 0;
    {
      // The config is the trainer's JSON; the test only needs lr.
      const std::string& c = lease.config_json();
      size_t at = c.find("\"lr\":");
      if (at != std::string::npos) lr = std::atof(c.c_str() + at + 5);
    }
    v1::FinishJobRequest finish;
    finish.set_job_id(lease.job_id());
    finish.set_attempt_id(lease.attempt_id());
    if (lease.kind() == v1::DIAGNOSE) {
      finish.set_status(v1::FINISH_SUCCEEDED);
      auto* d = finish.add_diagnostics();
      d->set_kind("deff");
      d->set_data_json(R"({"d_eff_over_l":0.5})");
    } else {
      for (int first = 1; first <= steps_; first += chunk_) {
        v1::ReportMetricsRequest chunk;
        chunk.set_job_id(lease.job_id());
        chunk.set_attempt_id(lease.attempt_id());
        for (int s = first; s < first + chunk_ && s <= steps_; ++s) {
          auto* p = chunk.add_points();
          p->set_step(s);
          p->set_name("loss");
          p->set_value(5.0 - 0.01 * s);
        }
        grpc::Status st = Retry([&] {
          v1::ReportMetricsResponse resp;
          auto ctx = Ctx();
          auto writer = stub_->ReportMetrics(ctx.get(), &resp);
          writer->Write(chunk);
          writer->WritesDone();
          return writer->Finish();
        });
        if (st.error_code() == grpc::StatusCode::FAILED_PRECONDITION) return;  // lease lost
        EXPECT_TRUE(st.ok()) << st.error_message();
        if (delay_ms_ > 0) std::this_thread::sleep_for(milliseconds(delay_ms_));
      }
      bool diverged = std::abs(lr - 5e-3) < 1e-12;
      finish.set_status(diverged ? v1::FINISH_DIVERGED : v1::FINISH_SUCCEEDED);
      finish.set_final_step(steps_);
      if (!diverged) {
        double loss = 3.0 + std::abs(std::log10(lr / 2e-3));
        finish.set_has_val_loss(true);
        finish.set_final_val_loss(loss);
        auto* p = finish.add_points();
        p->set_step(steps_);
        p->set_name("val_loss");
        p->set_value(loss);
      } else {
        finish.set_reason("loss exploded");
      }
    }
    v1::FinishJobResponse resp;
    grpc::Status st = Retry([&] { return stub_->FinishJob(Ctx().get(), finish, &resp); });
    EXPECT_TRUE(st.ok() || st.error_code() == grpc::StatusCode::FAILED_PRECONDITION)
        << st.error_message();
  }

  v1::WorkerService::Stub* stub() { return stub_.get(); }
  int jobs_run() const { return jobs_run_; }

 private:
  std::string name_;
  int steps_, chunk_, delay_ms_;
  std::unique_ptr<v1::WorkerService::Stub> stub_;
  int64_t job_id_ = 0, attempt_id_ = 0;
  int jobs_run_ = 0;
};

v1::SweepSpec Spec(const std::string& name, std::vector<std::string> archs,
                   std::vector<double> lrs, bool diagnostics) {
  v1::SweepSpec spec;
  spec.set_name(name);
  for (const auto& a : archs) {
    spec.add_architectures(a);
    for (double lr : lrs) (*spec.mutable_lr_grids())[a].add_lrs(lr);
  }
  spec.mutable_shapes()->set_suite("tiny");
  spec.mutable_training()->set_steps(20);
  spec.mutable_retry()->set_max_attempts(5);
  spec.mutable_retry()->set_initial_backoff_ms(50);
  if (diagnostics) spec.mutable_diagnostics()->add_kinds("deff");
  return spec;
}

class Sweeps {
 public:
  explicit Sweeps(const std::string& address)
      : stub_(v1::SweepService::NewStub(
            grpc::CreateChannel(address, grpc::InsecureChannelCredentials()))) {}
  v1::SweepService::Stub* operator->() { return stub_.get(); }
  // True once the sweep completed; false while running or unreachable.
  bool Completed(const std::string& name) {
    v1::GetSweepRequest req;
    req.set_name(name);
    v1::Sweep sweep;
    return stub_->GetSweep(Ctx(2000).get(), req, &sweep).ok() &&
           sweep.state() == v1::SWEEP_COMPLETED;
  }

 private:
  std::unique_ptr<v1::SweepService::Stub> stub_;
};

// WatchJob of a finished 20-step job from step 15: loss at 15..20 and
// val_loss at 20, then its state SUCCEEDED.
void ExpectReplayFromStep15(Sweeps& sweeps, int64_t job_id) {
  v1::WatchJobRequest watch;
  watch.set_job_id(job_id);
  watch.set_from_step(15);
  auto ctx = Ctx();
  auto reader = sweeps->WatchJob(ctx.get(), watch);
  v1::WatchJobEvent event;
  int points = 0;
  v1::JobState last = v1::JOB_STATE_UNSPECIFIED;
  while (reader->Read(&event)) {
    if (event.has_point()) {
      EXPECT_GE(event.point().step(), 15);
      ++points;
    } else {
      last = event.state();
    }
  }
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(points, 6 + 1);  // loss at 15..20 + val_loss at 20
  EXPECT_EQ(last, v1::SUCCEEDED);
}

TEST(SchedulerIntegrationTest, SweepRunsToCompletion) {
  std::string dir = MakeTempDir("complete");
  SchedulerProcess server(dir + "/s.db", dir);
  ASSERT_TRUE(server.Start());
  Sweeps sweeps(server.address());
  v1::SubmitSweepRequest submit;
  *submit.mutable_spec() = Spec("full", {"pre_ln", "hc"}, {1e-3, 2e-3, 5e-3}, true);
  v1::SubmitSweepResponse submitted;
  ASSERT_TRUE(sweeps->SubmitSweep(Ctx().get(), submit, &submitted).ok());
  EXPECT_EQ(submitted.sweep().total_jobs(), 2 * 3 * 3);
  std::atomic<bool> done{false};
  std::vector<std::thread> threads;
  std::vector<std::unique_ptr<TestWorker>> workers;
  for (int i = 0; i < 3; ++i) {
    workers.push_back(std::make_unique<TestWorker>(server.address(), "w" + std::to_string(i), 20, 7));
  }
  for (auto& w : workers) {
    threads.emplace_back([&done, w = w.get()] { w->Run([&] { return done.load(); }); });
  }
  for (int i = 0; i < 1500 && !sweeps.Completed("full"); ++i) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  done = true;
  for (auto& t : threads) t.join();
  ASSERT_TRUE(sweeps.Completed("full"));

  v1::QueryResultsRequest q;
  q.set_sweep("full");
  v1::QueryResultsResponse results;
  ASSERT_TRUE(sweeps->QueryResults(Ctx().get(), q, &results).ok());
  ASSERT_EQ(results.rows_size(), 6);  // 2 archs x 3 tiny shapes
  for (const auto& row : results.rows()) {
    EXPECT_TRUE(row.complete());
    EXPECT_DOUBLE_EQ(row.best_lr(), 2e-3);
    EXPECT_DOUBLE_EQ(row.best_val_loss(), 3.0);
    ASSERT_EQ(row.lrs_size(), 3);
    EXPECT_TRUE(row.lrs(2).diverged());
    EXPECT_NE(row.diagnostics_json().find("d_eff_over_l"), std::string::npos);
  }
  // 18 train + 6 diagnose jobs, all succeeded or diverged.
  v1::Sweep sweep;
  v1::GetSweepRequest get;
  get.set_name("full");
  ASSERT_TRUE(sweeps->GetSweep(Ctx().get(), get, &sweep).ok());
  EXPECT_EQ(sweep.total_jobs(), 24);
  EXPECT_EQ(sweep.job_counts().at("succeeded"), 18);
  EXPECT_EQ(sweep.job_counts().at("diverged"), 6);

  // WatchJob replays a finished job's points from a step, then its state.
  ExpectReplayFromStep15(sweeps, results.rows(0).best_job_id());

  // The CLI reads the same table.
  std::string cmd = std::string(DEPTHBENCH_CLI_BIN) + " --scheduler " + server.address() +
                    " results full --csv > " + dir + "/results.csv";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  std::ifstream csv(dir + "/results.csv");
  std::string header, first;
  std::getline(csv, header);
  std::getline(csv, first);
  EXPECT_EQ(header.substr(0, 40), "ARCH,L,D,ASPECT,PARAMS,BEST_LR,VAL_LOSS,");
  EXPECT_EQ(first.substr(0, 7), "pre_ln,");
}

TEST(SchedulerIntegrationTest, SilentWorkerLosesLeaseAndJobIsReleased) {
  std::string dir = MakeTempDir("lease");
  SchedulerProcess server(dir + "/s.db", dir, {"--lease-ttl-ms", "500"});
  ASSERT_TRUE(server.Start());
  Sweeps sweeps(server.address());
  v1::SubmitSweepRequest submit;
  *submit.mutable_spec() = Spec("one", {"pre_ln"}, {1e-3}, false);
  submit.mutable_spec()->mutable_shapes()->clear_suite();
  auto* shape = submit.mutable_spec()->mutable_shapes()->add_explicit_shapes();
  shape->set_layers(2);
  shape->set_d_model(64);
  v1::SubmitSweepResponse submitted;
  ASSERT_TRUE(sweeps->SubmitSweep(Ctx().get(), submit, &submitted).ok());
  TestWorker silent(server.address(), "silent", 5, 5);
  TestWorker healthy(server.address(), "healthy", 5, 5);
  ASSERT_TRUE(silent.Register());
  ASSERT_TRUE(healthy.Register());
  v1::AcquireJobRequest acquire;
  acquire.set_worker_id("silent");
  v1::AcquireJobResponse lost;
  ASSERT_TRUE(silent.stub()->AcquireJob(Ctx().get(), acquire, &lost).ok());
  ASSERT_TRUE(lost.has_job());
  // The silent worker never heartbeats; the healthy one polls until the job
  // is re-leased to it.
  acquire.set_worker_id("healthy");
  v1::AcquireJobResponse again;
  for (int i = 0; i < 250 && !again.has_job(); ++i) {
    std::this_thread::sleep_for(milliseconds(20));
    ASSERT_TRUE(healthy.stub()->AcquireJob(Ctx().get(), acquire, &again).ok());
  }
  ASSERT_TRUE(again.has_job());
  EXPECT_EQ(again.job_id(), lost.job_id());
  EXPECT_NE(again.attempt_id(), lost.attempt_id());
  EXPECT_TRUE(again.resume());
  // The silent worker's late report is refused; its heartbeat says stop.
  v1::FinishJobRequest late;
  late.set_job_id(lost.job_id());
  late.set_attempt_id(lost.attempt_id());
  late.set_status(v1::FINISH_SUCCEEDED);
  v1::FinishJobResponse late_resp;
  EXPECT_EQ(silent.stub()->FinishJob(Ctx().get(), late, &late_resp).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  v1::HeartbeatRequest hb;
  hb.set_worker_id("silent");
  auto* r = hb.add_running();
  r->set_job_id(lost.job_id());
  r->set_attempt_id(lost.attempt_id());
  v1::HeartbeatResponse hb_resp;
  ASSERT_TRUE(silent.stub()->Heartbeat(Ctx().get(), hb, &hb_resp).ok());
  ASSERT_EQ(hb_resp.cancellations_size(), 1);
  healthy.RunJob(again);
  EXPECT_TRUE(sweeps.Completed("one"));
  v1::GetJobRequest get;
  get.set_job_id(lost.job_id());
  v1::Job job;
  ASSERT_TRUE(sweeps->GetJob(Ctx().get(), get, &job).ok());
  ASSERT_EQ(job.attempts_size(), 2);
  EXPECT_EQ(job.attempts(0).outcome(), "expired");
  EXPECT_EQ(job.attempts(1).outcome(), "succeeded");
}

// In the database file: every job succeeded, exactly one attempt of each
// ran to completion, and that attempt's points 1..steps are there once.
void ExpectEveryJobSucceededOnceWithAllPoints(const std::string& db, int kSteps,
                                              int expected_jobs) {
  auto database = storage::Database::Open(db);
  ASSERT_TRUE(database.ok());
  auto jobs = (*database)->Prepare(
      "SELECT id, state, current_attempt_id, lr FROM jobs ORDER BY id");
  ASSERT_TRUE(jobs.ok());
  int n = 0;
  std::vector<std::tuple<int64_t, std::string, int64_t, double>> rows;
  while (*jobs->Step()) {
    rows.emplace_back(jobs->ColumnInt(0), jobs->ColumnText(1), jobs->ColumnInt(2),
                      jobs->ColumnDouble(3));
  }
  ASSERT_EQ(static_cast<int>(rows.size()), expected_jobs);
  for (const auto& [id, state, attempt, lr] : rows) {
    EXPECT_EQ(state, "succeeded") << "job " << id;
    // Exactly one attempt ran to completion.
    auto finished = (*database)->Prepare(
        "SELECT COUNT(*) FROM attempts WHERE job_id = ? AND outcome = 'succeeded'");
    finished->Bind(1, id);
    ASSERT_TRUE(*finished->Step());
    EXPECT_EQ(finished->ColumnInt(0), 1) << "job " << id;
    // Every point of that attempt is present exactly once.
    auto points = (*database)->Prepare(
        "SELECT COUNT(*), COUNT(DISTINCT step || '/' || name), MIN(step), MAX(step) "
        "FROM metric_points WHERE job_id = ? AND attempt_id = ?");
    points->Bind(1, id).Bind(2, attempt);
    ASSERT_TRUE(*points->Step());
    EXPECT_EQ(points->ColumnInt(0), kSteps + 1) << "job " << id;
    EXPECT_EQ(points->ColumnInt(1), kSteps + 1) << "job " << id;
    EXPECT_EQ(points->ColumnInt(2), 1);
    EXPECT_EQ(points->ColumnInt(3), kSteps);
    ++n;
  }
  EXPECT_EQ(n, expected_jobs);
}

TEST(SchedulerIntegrationTest, Kill9MidSweepRestartCompletesEveryPointOnce) {
  std::string dir = MakeTempDir("kill9");
  std::string db = dir + "/s.db";
  SchedulerProcess server(db, dir, {"--lease-ttl-ms", "3000"});
  ASSERT_TRUE(server.Start());
  const int kSteps = 20;
  v1::SubmitSweepRequest submit;
  *submit.mutable_spec() = Spec("crash", {"pre_ln", "lns"}, {1e-3, 2e-3, 4e-3}, false);
  {
    Sweeps sweeps(server.address());
    v1::SubmitSweepResponse submitted;
    ASSERT_TRUE(sweeps->SubmitSweep(Ctx().get(), submit, &submitted).ok());
  }
  std::atomic<bool> done{false};
  std::vector<std::unique_ptr<TestWorker>> workers;
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i) {
    workers.push_back(std::make_unique<TestWorker>(server.address(), "w" + std::to_string(i),
                                                   kSteps, 3, 15));
  }
  for (auto& w : workers) {
    threads.emplace_back([&done, w = w.get()] { w->Run([&] { return done.load(); }); });
  }
  // Kill -9 once some jobs finished and others are mid-stream.
  {
    Sweeps sweeps(server.address());
    v1::GetSweepRequest get;
    get.set_name("crash");
    for (int i = 0; i < 1000; ++i) {
      v1::Sweep sweep;
      if (sweeps->GetSweep(Ctx().get(), get, &sweep).ok() && sweep.done_jobs() >= 5) break;
      std::this_thread::sleep_for(milliseconds(10));
    }
  }
  int port = server.port();
  server.Stop(SIGKILL);
  std::this_thread::sleep_for(milliseconds(300));
  ASSERT_TRUE(server.Start(port));  // same file, same port: workers reconnect
  Sweeps sweeps(server.address());
  for (int i = 0; i < 3000 && !sweeps.Completed("crash"); ++i) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  done = true;
  for (auto& t : threads) t.join();
  ASSERT_TRUE(sweeps.Completed("crash"));
  // Resubmitting after the restart is still idempotent.
  v1::SubmitSweepResponse again;
  ASSERT_TRUE(sweeps->SubmitSweep(Ctx().get(), submit, &again).ok());
  EXPECT_FALSE(again.created());
  server.Stop(SIGTERM);

  ASSERT_NO_FATAL_FAILURE(ExpectEveryJobSucceededOnceWithAllPoints(db, kSteps, 18));
}

TEST(SchedulerIntegrationTest, BearerTokenIsRequiredWhenConfigured) {
  std::string dir = MakeTempDir("auth");
  {
    std::ofstream token(dir + "/token");
    token << "s3cret\n";
  }
  SchedulerProcess server(dir + "/s.db", dir, {"--auth-token-file", dir + "/token"});
  ASSERT_TRUE(server.Start());
  Sweeps sweeps(server.address());
  v1::ListSweepsResponse resp;
  EXPECT_EQ(sweeps->ListSweeps(Ctx().get(), {}, &resp).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  auto wrong = Ctx();
  wrong->AddMetadata("authorization", "Bearer nope");
  EXPECT_EQ(sweeps->ListSweeps(wrong.get(), {}, &resp).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  auto right = Ctx();
  right->AddMetadata("authorization", "Bearer s3cret");
  EXPECT_TRUE(sweeps->ListSweeps(right.get(), {}, &resp).ok());
  TestWorker worker(server.address(), "w", 1, 1);
  v1::RegisterWorkerRequest reg;
  reg.set_name("w");
  v1::RegisterWorkerResponse reg_resp;
  EXPECT_EQ(worker.stub()->RegisterWorker(Ctx().get(), reg, &reg_resp).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  std::string cli = std::string(DEPTHBENCH_CLI_BIN) + " --scheduler " + server.address();
  EXPECT_NE(std::system((cli + " sweeps > /dev/null 2>&1").c_str()), 0);
  EXPECT_EQ(std::system((cli + " --token-file " + dir + "/token sweeps > /dev/null").c_str()), 0);
}

}  // namespace
}  // namespace depthbench::testing
