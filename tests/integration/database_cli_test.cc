// The scheduler's SQLite file as a public artifact (issue 14): the sqlite3
// CLI reads the contract views (storage/views.h) of a real
// depthbench-scheduler while its workers lease, report and finish, is never
// told "database is locked", cannot write through -readonly, and reads the
// same results as QueryResults once the sweep is done.
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "tests/integration/scheduler_process.h"
#include "tests/integration/worker_client.h"

#ifndef SQLITE3_CLI
#define SQLITE3_CLI ""
#endif

namespace depthbench::testing {
namespace {

namespace v1 = ::depthbench::v1;

struct CliResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs `sqlite3 ARGS...` (no shell), stdout and stderr into files of `dir`.
CliResult Sqlite(const std::string& dir, std::vector<std::string> args) {
  std::string out = dir + "/cli.out", err = dir + "/cli.err";
  args.insert(args.begin(), SQLITE3_CLI);
  pid_t pid = fork();
  if (pid == 0) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (freopen(out.c_str(), "w", stdout) == nullptr) _exit(126);
    if (freopen(err.c_str(), "w", stderr) == nullptr) _exit(126);
    execv(argv[0], argv.data());
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  CliResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = Slurp(out);
  r.err = Slurp(err);
  return r;
}

// Joins the worker threads however the test ends.
struct Joiner {
  std::vector<std::thread> threads;
  ~Joiner() {
    for (auto& t : threads) {
      if (t.joinable()) t.join();
    }
  }
};

v1::SweepSpec Spec() {
  v1::SweepSpec spec;
  spec.set_name("cli");
  for (const char* arch : {"pre_ln", "hc"}) {
    spec.add_architectures(arch);
    auto& grid = (*spec.mutable_lr_grids())[arch];
    for (double lr : {1e-3, 2e-3, 3e-3, 4e-3}) grid.add_lrs(lr);
  }
  auto* shape = spec.mutable_shapes()->add_explicit_shapes();
  shape->set_layers(2);
  shape->set_d_model(64);
  for (int seed = 0; seed < 5; ++seed) spec.add_seeds(seed);
  spec.mutable_training()->set_steps(20);
  spec.mutable_training()->set_seq_len(32);
  return spec;
}

// A worker over WorkerService: lease, report 20 points, "train" 60 ms,
// finish, until no job is left.
void FakeWorker(const std::string& address, const std::string& name,
                std::atomic<int64_t>* finished, std::atomic<bool>* failed) {
  WorkerClient worker(address, name);
  if (!worker.Register().ok()) {
    *failed = true;
    return;
  }
  while (true) {
    v1::AcquireJobResponse lease;
    if (!worker.Acquire(&lease).ok()) {
      *failed = true;
      return;
    }
    if (!lease.has_job()) return;
    if (!worker.Report(lease, 1, 20).ok()) *failed = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(60));
    double loss = 3.0 + 0.01 * static_cast<double>(lease.job_id() % 7);
    if (!worker.Finish(lease, v1::FINISH_SUCCEEDED, loss).ok()) *failed = true;
    ++*finished;
  }
}

// The finished sweep "cli" as the views show it: the rows QueryResults
// returns, and the point, run and best-run counts.
void ExpectViewsAgreeWithQueryResults(v1::SweepService::Stub* sweeps, const std::string& dir,
                                      const std::string& db) {
  v1::QueryResultsRequest q;
  q.set_sweep("cli");
  v1::QueryResultsResponse results;
  ASSERT_TRUE(sweeps->QueryResults(Ctx().get(), q, &results).ok());
  ASSERT_EQ(results.rows_size(), 2);
  std::map<std::string, v1::ResultRow> by_arch;
  for (const auto& row : results.rows()) by_arch[row.arch()] = row;
  std::ostringstream want;
  for (const auto& [arch, row] : by_arch) {
    ASSERT_TRUE(row.complete());
    char buf[160];
    std::snprintf(buf, sizeof(buf), "%s,%lld,%lld,%.6g,%.6f,%lld,1\n", row.arch().c_str(),
                  static_cast<long long>(row.layers()), static_cast<long long>(row.d_model()),
                  row.best_lr(), row.best_val_loss(), static_cast<long long>(row.best_job_id()));
    want << buf;
  }
  CliResult got = Sqlite(dir, {"-readonly", "-separator", ",", db,
                               "SELECT arch, layers, d_model, printf('%.6g', best_lr), "
                               "printf('%.6f', best_val_loss), best_job_id, complete "
                               "FROM results_v1 WHERE sweep = 'cli' ORDER BY arch"});
  ASSERT_EQ(got.exit_code, 0) << got.err;
  EXPECT_EQ(got.out, want.str());
  CliResult counts = Sqlite(dir, {"-readonly", db,
                                  "SELECT (SELECT COUNT(*) FROM metrics_v1 WHERE sweep = 'cli'), "
                                  "(SELECT SUM(runs) FROM lrs_v1), "
                                  "(SELECT COUNT(*) FROM runs_v1 WHERE is_best), "
                                  "(SELECT views_version FROM contract)"});
  ASSERT_EQ(counts.exit_code, 0) << counts.err;
  EXPECT_EQ(counts.out, "800|40|2|1\n");
}

TEST(DatabaseCliTest, Sqlite3ReadsTheViewsWhileWorkersWrite) {
  ASSERT_FALSE(std::string(SQLITE3_CLI).empty())
      << "the sqlite3 CLI was not found at configure time (scripts/setup.sh installs the "
         "Debian package sqlite3)";
  std::string dir = MakeTempDir("sqlite_cli");
  std::string db = dir + "/sweeps.db";
  SchedulerProcess scheduler(db, dir);
  ASSERT_TRUE(scheduler.Start()) << Slurp(dir + "/scheduler.log");
  auto channel = grpc::CreateChannel(scheduler.address(), grpc::InsecureChannelCredentials());
  auto sweeps = v1::SweepService::NewStub(channel);
  v1::SubmitSweepRequest submit;
  *submit.mutable_spec() = Spec();
  v1::SubmitSweepResponse submitted;
  ASSERT_TRUE(sweeps->SubmitSweep(Ctx().get(), submit, &submitted).ok());
  const int64_t total = submitted.sweep().total_jobs();
  ASSERT_EQ(total, 40);

  // Four workers: lease, report 20 points, "train" 60 ms, finish.
  std::atomic<int64_t> finished{0};
  std::atomic<bool> failed{false};
  Joiner workers;
  for (int w = 0; w < 4; ++w) {
    workers.threads.emplace_back(
        [&, w] { FakeWorker(scheduler.address(), "w" + std::to_string(w), &finished, &failed); });
  }

  // Read while they write: every read answers, counts only grow.
  int reads = 0, mid_sweep = 0;
  int64_t last_succeeded = 0, last_points = 0;
  bool saw_tables = false;
  while (finished.load() < total && !failed.load() && reads < 2000) {
    CliResult r = Sqlite(dir, {"-readonly", db,
                               "SELECT COUNT(*), SUM(state = 'succeeded'), "
                               "(SELECT COUNT(*) FROM metrics_v1) FROM runs_v1"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.err.find("locked"), std::string::npos) << r.err;
    int64_t runs = 0, succeeded = 0, points = 0;
    char bar1 = 0, bar2 = 0;
    std::istringstream line(r.out);
    ASSERT_TRUE(line >> runs >> bar1 >> succeeded >> bar2 >> points) << r.out;
    EXPECT_EQ(runs, total);
    EXPECT_GE(succeeded, last_succeeded);
    EXPECT_GE(points, last_points);
    last_succeeded = succeeded;
    last_points = points;
    if (succeeded > 0 && succeeded < total) ++mid_sweep;
    if (reads % 5 == 0) {
      // The repro: a plain sqlite3 (not -readonly) on the live file.
      CliResult tables = Sqlite(dir, {db, ".tables"});
      ASSERT_EQ(tables.exit_code, 0) << tables.err;
      EXPECT_EQ(tables.err.find("locked"), std::string::npos) << tables.err;
      saw_tables = saw_tables || tables.out.find("results_v1") != std::string::npos;
    }
    ++reads;
  }
  for (auto& t : workers.threads) t.join();
  ASSERT_FALSE(failed.load());
  EXPECT_TRUE(saw_tables);
  EXPECT_GE(mid_sweep, 2) << "too few reads landed while the sweep ran (" << reads << " reads)";

  // -readonly cannot write, and says why.
  CliResult write = Sqlite(dir, {"-readonly", db, "DELETE FROM jobs"});
  EXPECT_NE(write.exit_code, 0);
  EXPECT_NE(write.err.find("readonly"), std::string::npos) << write.err;

  // Once done, the views say what QueryResults says.
  ExpectViewsAgreeWithQueryResults(sweeps.get(), dir, db);
  scheduler.Stop(SIGTERM);
}

// --durability: a bad value is refused with exit code 2 naming the flag; a
// scheduler started with `full` serves and writes.
TEST(DatabaseCliTest, DurabilityFlagIsCheckedAndFullServes) {
  std::string dir = MakeTempDir("durability");
  pid_t pid = fork();
  if (pid == 0) {
    std::string err = dir + "/bad.err";
    if (freopen(err.c_str(), "w", stderr) == nullptr) _exit(126);
    execl(DEPTHBENCH_SCHEDULER_BIN, DEPTHBENCH_SCHEDULER_BIN, "--db", (dir + "/x.db").c_str(),
          "--listen", "127.0.0.1:0", "--durability", "fast", static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 2);
  std::string err = Slurp(dir + "/bad.err");
  EXPECT_NE(err.find("--durability"), std::string::npos) << err;
  EXPECT_NE(err.find("\"fast\""), std::string::npos) << err;

  SchedulerProcess scheduler(dir + "/full.db", dir, {"--durability", "full"});
  ASSERT_TRUE(scheduler.Start()) << Slurp(dir + "/scheduler.log");
  auto sweeps = v1::SweepService::NewStub(
      grpc::CreateChannel(scheduler.address(), grpc::InsecureChannelCredentials()));
  v1::SubmitSweepRequest submit;
  *submit.mutable_spec() = Spec();
  v1::SubmitSweepResponse submitted;
  ASSERT_TRUE(sweeps->SubmitSweep(Ctx().get(), submit, &submitted).ok());
  WorkerClient worker(scheduler.address(), "w");
  ASSERT_TRUE(worker.Register().ok());
  v1::AcquireJobResponse lease;
  ASSERT_TRUE(worker.Acquire(&lease).ok());
  ASSERT_TRUE(lease.has_job());
  ASSERT_TRUE(worker.Finish(lease, v1::FINISH_SUCCEEDED, 2.5).ok());
  scheduler.Stop(SIGKILL);  // what a committed finish must survive
  CliResult state = Sqlite(dir, {"-readonly", dir + "/full.db",
                                 "SELECT state, val_loss FROM runs_v1 WHERE job_id = " +
                                     std::to_string(lease.job_id())});
  ASSERT_EQ(state.exit_code, 0) << state.err;
  EXPECT_EQ(state.out, "succeeded|2.5\n");
}

}  // namespace
}  // namespace depthbench::testing
