// Faults an outside tester found in the worker and the daemons' listeners
// (issue 20), each on the real binaries: depthbench-scheduler and
// depthbench-worker over loopback, with small shell scripts as the trainer
// (written into the test's temp dir; passed as --train-binary).
//   (1) a report the scheduler cannot take (non-UTF-8 stderr; over 4 MB)
//       still ends the job and frees the slot
//   (2) idle connections to the metrics port cannot stop gRPC; readiness
//       says when gRPC stopped accepting; the daemons raise their soft
//       open-file limit
//   (4) exit 4 the worker did not ask for is a failure, not a re-queue
//   (5) the trainer's exit ends the attempt though a grandchild holds its
//       pipes; SIGTERM of the worker returns; the grandchild dies
//   (11) stdout/stderr floods do not become worker log or per-attempt files
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>

#include "depthbench/v1/sweep_service.grpc.pb.h"
#include "tests/integration/metrics_scrape.h"
#include "tests/integration/process_util.h"
#include "tests/integration/scheduler_process.h"
#include "tests/integration/sweep_fixture.h"

namespace depthbench::testing {
namespace {

namespace v1 = ::depthbench::v1;
namespace fs = std::filesystem;
using std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

int ReadPortFile(const std::string& path) {
  for (int i = 0; i < 500; ++i) {
    std::ifstream in(path);
    int port = 0;
    if (in >> port && port > 0) return port;
    std::this_thread::sleep_for(milliseconds(20));
  }
  return 0;
}

// "Max open files" soft limit of a process (-1: unknown).
long SoftFdLimit(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/limits");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Max open files", 0) == 0) {
      std::istringstream fields(line.substr(14));
      long soft = -1;
      fields >> soft;
      return soft;
    }
  }
  return -1;
}

long VmHwmKb(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

// A daemon as a child process with stdout+stderr in `log`, optionally with
// RLIMIT_NOFILE set (soft, hard) before exec.
class Daemon {
 public:
  Daemon() = default;
  ~Daemon() { Stop(SIGKILL, 5000); }

  void Start(std::vector<std::string> args, const std::string& log,
             std::optional<std::pair<rlim_t, rlim_t>> nofile = std::nullopt) {
    pid_ = SpawnLogged(std::move(args), log, nofile);
  }

  // Sends `sig`, waits up to `timeout_ms`; returns the wait status, or -1
  // if the process had to be SIGKILLed (it did not exit in time).
  int Stop(int sig, int timeout_ms) {
    if (pid_ <= 0) return -1;
    kill(pid_, sig);
    int status = 0;
    auto deadline = SteadyClock::now() + milliseconds(timeout_ms);
    while (waitpid(pid_, &status, WNOHANG) == 0) {
      if (SteadyClock::now() > deadline) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
        pid_ = -1;
        return -1;
      }
      std::this_thread::sleep_for(milliseconds(10));
    }
    pid_ = -1;
    return status;
  }

  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
};

// One gRPC call over a fresh connection; true if the server answered.
bool GrpcAnswers(const std::string& address, int timeout_ms = 3000) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto stub = v1::SweepService::NewStub(
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
  v1::ListSweepsRequest req;
  v1::ListSweepsResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + milliseconds(timeout_ms));
  ctx.set_wait_for_ready(true);
  return stub->ListSweeps(&ctx, req, &resp).ok();
}

v1::SweepSpec FakeSpec(const std::string& name, int max_attempts,
                       std::vector<std::string> diagnostics = {}) {
  v1::SweepSpec spec = OneJobSpec(name);
  auto* shape = spec.mutable_shapes()->mutable_explicit_shapes(0);
  shape->set_heads(4);
  shape->set_vocab(256);
  auto* t = spec.mutable_training();
  t->set_data("brown");
  t->set_seq_len(32);
  t->set_batch(4);
  t->set_steps(2);
  spec.mutable_retry()->set_max_attempts(max_attempts);
  spec.mutable_retry()->set_initial_backoff_ms(100);
  spec.mutable_retry()->set_max_backoff_ms(500);
  for (const std::string& k : diagnostics) spec.mutable_diagnostics()->add_kinds(k);
  return spec;
}

constexpr char kEvents[] =
    "echo '{\"event\":\"start\",\"step\":0}'\n"
    "echo '{\"event\":\"step\",\"step\":1,\"loss\":3.0,\"lr\":0.001,\"grad_norm\":1.0,"
    "\"tokens_per_s\":100}'\n";
constexpr char kDone[] =
    "echo '{\"event\":\"done\",\"step\":1,\"status\":\"succeeded\",\"val_loss\":2.5}'\n";

class WorkerFaultsTest : public SweepFixture {
 protected:
  void SetUp() override { MakeDirs("faults_"); }

  void TearDown() override {
    worker_.Stop(SIGKILL, 5000);
    if (server_) server_->Stop(SIGKILL);
    if (!HasFailure()) fs::remove_all(dir_);
  }

  void StartScheduler() { SweepFixture::StartScheduler(/*lease_ttl_ms=*/3000); }

  // Writes an executable /bin/sh script (the fake trainer) and returns its path.
  std::string Script(const std::string& name, const std::string& body) {
    std::string path = dir_ + "/" + name;
    std::ofstream(path) << "#!/bin/sh\n" << body;
    chmod(path.c_str(), 0755);
    return path;
  }

  void StartWorker(const std::string& trainer, std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {DEPTHBENCH_WORKER_BIN, "--scheduler", server_->address(),
                                     "--checkpoint-root", root_, "--slots", "1",
                                     "--threads-per-slot", "1", "--name", "w1", "--poll-ms",
                                     "100", "--grace-ms", "3000", "--train-binary", trainer};
    args.insert(args.end(), extra.begin(), extra.end());
    worker_.Start(args, worker_log());
  }
  std::string worker_log() const { return dir_ + "/worker.log"; }

  // Starts `scheduler` (a real depthbench-scheduler with a metrics port)
  // under a descriptor limit of `fds`; returns its gRPC and metrics ports
  // (0 if it did not write one).
  std::pair<int, int> StartSchedulerWithFdLimit(Daemon& scheduler, rlim_t fds) {
    const std::string port_file = dir_ + "/port", mport_file = dir_ + "/mport";
    scheduler.Start({DEPTHBENCH_SCHEDULER_BIN, "--db", dir_ + "/s.db", "--listen", "127.0.0.1:0",
                     "--port-file", port_file, "--metrics-listen", "127.0.0.1:0",
                     "--metrics-port-file", mport_file},
                    dir_ + "/scheduler.log", std::pair<rlim_t, rlim_t>(fds, fds));
    const int mport = ReadPortFile(mport_file);
    return {ReadPortFile(port_file), mport};
  }

  // Waits until a job of `sweep` (of `kind`) is in a final state.
  std::optional<v1::Job> WaitFinal(const std::string& sweep, v1::JobKind kind, int timeout_s) {
    auto deadline = SteadyClock::now() + std::chrono::seconds(timeout_s);
    while (SteadyClock::now() < deadline) {
      for (const v1::Job& j : Jobs(sweep)) {
        if (j.kind() == kind && (j.state() == v1::SUCCEEDED || j.state() == v1::FAILED ||
                                 j.state() == v1::DIVERGED)) {
          return GetJob(j.id());
        }
      }
      std::this_thread::sleep_for(milliseconds(100));
    }
    return std::nullopt;
  }

  std::optional<v1::Job> WaitState(const std::string& sweep, v1::JobState state, int timeout_s) {
    auto deadline = SteadyClock::now() + std::chrono::seconds(timeout_s);
    while (SteadyClock::now() < deadline) {
      for (const v1::Job& j : Jobs(sweep)) {
        if (j.state() == state) return j;
      }
      std::this_thread::sleep_for(milliseconds(100));
    }
    return std::nullopt;
  }

  Daemon worker_;
};

// (1) stderr that is not UTF-8 (a lone 0xFF, a multi-byte character cut by
// the 4,096-byte line limit) used to make every FinishJob fail with
// INTERNAL, retried for ever: the job stayed leased, the slot was lost.
TEST_F(WorkerFaultsTest, NonUtf8StderrStillEndsTheJobAndFreesTheSlot) {
  StartScheduler();
  std::string trainer = Script("trainer.sh", std::string(kEvents) +
                                                 "printf 'bad byte \\377 here\\n' >&2\n"
                                                 // 4,095 x 'a' then the euro sign: cut inside it
                                                 "head -c 4095 /dev/zero | tr '\\0' a >&2\n"
                                                 "printf '\\342\\202\\254 tail\\n' >&2\n"
                                                 "exit 1\n");
  StartWorker(trainer);
  Submit(FakeSpec("utf8", /*max_attempts=*/1));
  std::optional<v1::Job> job = WaitFinal("utf8", v1::TRAIN, 30);
  ASSERT_TRUE(job.has_value()) << "the job never ended; see " << worker_log();
  EXPECT_EQ(job->state(), v1::FAILED);
  EXPECT_NE(job->reason().find("exit code 1"), std::string::npos) << job->reason();
  // Delivered in full, sanitized (U+FFFD for the bad byte), not the minimal
  // fallback.
  EXPECT_NE(job->reason().find("bad byte \xEF\xBF\xBD here"), std::string::npos) << job->reason();

  // The slot is free again: the next sweep runs on the same worker.
  Script("trainer.sh", std::string(kEvents) + kDone);
  Submit(FakeSpec("after", 1));
  std::optional<v1::Job> next = WaitFinal("after", v1::TRAIN, 30);
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(next->state(), v1::SUCCEEDED);
}

// (1) A report over the scheduler's 4 MB receive limit (diagnostics) used to
// get RESOURCE_EXHAUSTED, retried for ever. Now: a minimal report.
TEST_F(WorkerFaultsTest, OversizedReportFallsBackToAMinimalOne) {
  StartScheduler();
  // Train: succeed at once. Diagnose: three 1.5 MB diagnostics (each line
  // under the worker's 2 MiB line limit; together over 4 MB).
  std::string diag;
  for (const char* kind : {"angular", "causal", "permutation"}) {
    diag += std::string("printf '{\"event\":\"diagnostics\",\"kind\":\"") + kind +
            "\",\"data\":{\"x\":\"'\nhead -c 1500000 /dev/zero | tr '\\0' a\nprintf '\"}}\\n'\n";
  }
  std::string trainer = Script(
      "trainer.sh", "if [ \"$1\" = diagnose ]; then\n" + diag + kDone + "exit 0\nfi\n" +
                        kEvents + kDone);
  StartWorker(trainer);
  Submit(FakeSpec("big", 1, {"angular", "causal", "permutation"}));
  std::optional<v1::Job> diagnose = WaitFinal("big", v1::DIAGNOSE, 40);
  ASSERT_TRUE(diagnose.has_value()) << "the diagnose job never ended; see " << worker_log();
  EXPECT_EQ(diagnose->state(), v1::FAILED);
  EXPECT_NE(diagnose->reason().find("diagnostics could not be reported"), std::string::npos)
      << diagnose->reason();
}

// (4) Exit code 4 ("interrupted") without a stop from the worker used to be
// reported INTERRUPTED: re-queued at once without using an attempt,
// thousands of times a second.
TEST_F(WorkerFaultsTest, UnrequestedInterruptedExitIsAFailureThatUsesAnAttempt) {
  StartScheduler();
  std::string trainer = Script("trainer.sh", std::string(kEvents) + "exit 4\n");
  StartWorker(trainer);
  Submit(FakeSpec("exit4", /*max_attempts=*/2));
  std::optional<v1::Job> job = WaitFinal("exit4", v1::TRAIN, 30);
  ASSERT_TRUE(job.has_value()) << "the job never ended; see " << worker_log();
  EXPECT_EQ(job->state(), v1::FAILED);
  EXPECT_EQ(job->attempts_used(), 2);
  EXPECT_EQ(job->attempts_size(), 2);  // not re-queued without counting
  EXPECT_NE(job->reason().find("exit code 4"), std::string::npos) << job->reason();
}

// (5) A trainer that prints `done` and exits while a grandchild keeps its
// stdout open used to keep the job leased until the grandchild ended.
TEST_F(WorkerFaultsTest, TrainerExitEndsTheAttemptThoughAGrandchildHoldsStdout) {
  StartScheduler();
  const std::string pid_file = dir_ + "/grandchild.pid";
  std::string trainer = Script("trainer.sh", std::string(kEvents) + kDone +
                                                 "sleep 300 &\necho $! > " + pid_file +
                                                 "\nexit 0\n");
  StartWorker(trainer);
  Submit(FakeSpec("grandchild", 1));
  std::optional<v1::Job> job = WaitFinal("grandchild", v1::TRAIN, 20);
  ASSERT_TRUE(job.has_value()) << "the job stayed leased; see " << worker_log();
  EXPECT_EQ(job->state(), v1::SUCCEEDED);
  pid_t grandchild = 0;
  std::ifstream(pid_file) >> grandchild;
  ASSERT_GT(grandchild, 0);
  for (int i = 0; i < 100 && ProcessAlive(grandchild); ++i) std::this_thread::sleep_for(milliseconds(20));
  EXPECT_FALSE(ProcessAlive(grandchild)) << "the trainer's grandchild survived";
}

// (5) A grandchild in its own session (out of the process group) holding
// the pipes used to make SIGTERM of the worker hang.
TEST_F(WorkerFaultsTest, SigtermReturnsThoughADetachedGrandchildHoldsStdout) {
  StartScheduler();
  const std::string pid_file = dir_ + "/grandchild.pid";
  std::string trainer = Script(
      "trainer.sh", "trap 'exit 4' TERM\nsetsid sleep 300 &\necho $! > " + pid_file + "\n" +
                        kEvents + "while :; do sleep 0.1; done\n");
  StartWorker(trainer);
  Submit(FakeSpec("detached", 2));
  ASSERT_TRUE(WaitState("detached", v1::RUNNING, 20).has_value());
  pid_t grandchild = 0;
  for (int i = 0; i < 100 && grandchild == 0; ++i) {
    std::ifstream(pid_file) >> grandchild;
    std::this_thread::sleep_for(milliseconds(20));
  }
  ASSERT_GT(grandchild, 0);
  // The pid is written before the grandchild ran setsid.
  for (int i = 0; i < 250 && getsid(grandchild) == getsid(worker_.pid()); ++i) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  ASSERT_NE(getsid(grandchild), getsid(worker_.pid())) << "not in a session of its own";

  int status = worker_.Stop(SIGTERM, 15000);
  ASSERT_NE(status, -1) << "the worker did not exit within 15 s of SIGTERM; see " << worker_log();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  for (int i = 0; i < 100 && ProcessAlive(grandchild); ++i) std::this_thread::sleep_for(milliseconds(20));
  EXPECT_FALSE(ProcessAlive(grandchild)) << "the detached grandchild survived";
  // Reported INTERRUPTED: back to pending without using an attempt.
  std::optional<v1::Job> job = WaitState("detached", v1::PENDING, 10);
  ASSERT_TRUE(job.has_value());
  EXPECT_EQ(job->attempts_used(), 0);
}

// (11) Garbage on stdout (many short lines, one endless line) and stderr
// used to be copied into the worker's log line by line, into the events
// file whole, and an endless line was buffered whole.
TEST_F(WorkerFaultsTest, OutputFloodIsBoundedInLogsAndMemory) {
  StartScheduler();
  std::string trainer = Script(
      "trainer.sh", std::string(kEvents) +
                        // ~600,000 short garbage lines (5 MB)
                        "yes 'garbage' | head -c 5000000\n"
                        // one 40 MB line
                        "head -c 40000000 /dev/zero | tr '\\0' x; echo\n"
                        // 5 MB on stderr
                        "yes 'stderr noise' | head -c 5000000 >&2\n" +
                        kDone);
  StartWorker(trainer, {"--attempt-log-max-bytes", "1048576"});
  Submit(FakeSpec("flood", 1));
  std::optional<v1::Job> job = WaitFinal("flood", v1::TRAIN, 60);
  ASSERT_TRUE(job.has_value()) << "see " << worker_log();
  EXPECT_EQ(job->state(), v1::SUCCEEDED) << job->reason();
  long hwm_kb = VmHwmKb(worker_.pid());

  EXPECT_LT(fs::file_size(worker_log()), 64u * 1024) << "the worker's log grew with the garbage";
  int files = 0;
  for (const auto& entry : fs::recursive_directory_iterator(root_)) {
    const std::string name = entry.path().filename().string();
    if (name.size() > 13 && name.substr(name.size() - 13) == ".events.jsonl") {
      ++files;
      EXPECT_LT(entry.file_size(), 4096u) << "events file holds more than the events";
    }
    if (name.size() > 11 && name.substr(name.size() - 11) == ".stderr.log") {
      ++files;
      EXPECT_LE(entry.file_size(), 1048576u + 256) << "stderr log not capped";
      EXPECT_GE(entry.file_size(), 1048576u / 2);
    }
  }
  EXPECT_EQ(files, 2);
  // The 40 MB line was never held whole (the worker's peak RSS stays far
  // below it).
  EXPECT_GT(hwm_kb, 0);
  EXPECT_LT(hwm_kb, 36 * 1024) << "peak RSS " << hwm_kb << " kB";
  RecordProperty("worker_peak_rss_kb", static_cast<int>(hwm_kb));
}

// (2) With the default soft limit, 1,100 idle connections to the metrics
// port used up the descriptors; gRPC's accept() then failed once and its
// listener never came back. Here with a limit of 256 and 400 connections.
TEST_F(WorkerFaultsTest, IdleMetricsConnectionsCannotStopGrpc) {
  Daemon scheduler;
  const auto [port, mport] = StartSchedulerWithFdLimit(scheduler, 256);
  ASSERT_GT(mport, 0);
  ASSERT_GT(port, 0);
  const std::string address = "127.0.0.1:" + std::to_string(port);
  ASSERT_TRUE(GrpcAnswers(address));

  std::vector<int> idle;
  for (int i = 0; i < 400; ++i) {
    int fd = ConnectLoopback(mport);
    if (fd >= 0) idle.push_back(fd);
  }
  std::this_thread::sleep_for(milliseconds(500));  // let the server accept them
  EXPECT_TRUE(GrpcAnswers(address)) << "gRPC stopped answering; see " << dir_;
  HttpResponse ready = HttpGet(mport, "/readyz");
  EXPECT_EQ(ready.status, 200) << ready.body;
  for (int fd : idle) close(fd);
  // Still answering after the flood is gone.
  EXPECT_TRUE(GrpcAnswers(address));
  EXPECT_EQ(scheduler.Stop(SIGTERM, 10000), 0);
}

// (2) When gRPC's listener did die (descriptors exhausted by gRPC
// connections themselves, then released), /readyz used to keep saying
// "ready".
TEST_F(WorkerFaultsTest, ReadinessFailsWhenGrpcStopsAccepting) {
  Daemon scheduler;
  const auto [port, mport] = StartSchedulerWithFdLimit(scheduler, 128);
  ASSERT_GT(mport, 0);
  ASSERT_GT(port, 0);
  const std::string address = "127.0.0.1:" + std::to_string(port);
  ASSERT_EQ(HttpGet(mport, "/readyz").status, 200);

  std::vector<int> flood;
  for (int i = 0; i < 200; ++i) {
    int fd = ConnectLoopback(port);
    if (fd >= 0) flood.push_back(fd);
  }
  std::this_thread::sleep_for(milliseconds(500));
  for (int fd : flood) close(fd);
  std::this_thread::sleep_for(milliseconds(500));  // descriptors free again
  ASSERT_FALSE(GrpcAnswers(address, 2000))
      << "gRPC recovered by itself; this test's premise (gRPC 1.51) no longer holds";
  HttpResponse ready = HttpGet(mport, "/readyz");
  EXPECT_EQ(ready.status, 503) << ready.body;
  EXPECT_NE(ready.body.find("does not answer"), std::string::npos) << ready.body;
}

// (2) Both daemons start with the soft open-file limit raised to the hard
// one.
TEST_F(WorkerFaultsTest, DaemonsRaiseTheSoftFdLimitToTheHardLimit) {
  rlimit mine{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &mine), 0);
  if (mine.rlim_max <= 64 || mine.rlim_max == RLIM_INFINITY) {
    GTEST_SKIP() << "hard RLIMIT_NOFILE " << mine.rlim_max << " leaves nothing to raise to";
  }
  const rlim_t hard = std::min<rlim_t>(mine.rlim_max, 4096);
  Daemon scheduler;
  const std::string port_file = dir_ + "/port";
  scheduler.Start({DEPTHBENCH_SCHEDULER_BIN, "--db", dir_ + "/s.db", "--listen", "127.0.0.1:0",
                   "--port-file", port_file},
                  dir_ + "/scheduler.log", std::pair<rlim_t, rlim_t>(64, hard));
  const int port = ReadPortFile(port_file);
  ASSERT_GT(port, 0);
  EXPECT_EQ(SoftFdLimit(scheduler.pid()), static_cast<long>(hard));

  Daemon worker;
  worker.Start({DEPTHBENCH_WORKER_BIN, "--scheduler", "127.0.0.1:" + std::to_string(port),
                "--checkpoint-root", root_, "--name", "w1", "--train-binary", "/bin/true"},
               worker_log(), std::pair<rlim_t, rlim_t>(64, hard));
  long soft = -1;
  for (int i = 0; i < 250 && soft != static_cast<long>(hard); ++i) {
    std::this_thread::sleep_for(milliseconds(20));
    soft = SoftFdLimit(worker.pid());
  }
  EXPECT_EQ(soft, static_cast<long>(hard));
  EXPECT_EQ(worker.Stop(SIGTERM, 10000), 0);
  EXPECT_EQ(scheduler.Stop(SIGTERM, 10000), 0);
}

}  // namespace
}  // namespace depthbench::testing
