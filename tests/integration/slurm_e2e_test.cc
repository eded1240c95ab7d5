// deploy/slurm/depthbench-workers.sbatch, unchanged, on a real one-node SLURM
// cluster (munged, slurmctld, slurmd started by deploy/slurm/local-cluster.sh
// under a temp dir): sbatch starts a real depthbench-worker through srun; it
// registers with a real scheduler and runs a small sweep to the end; then
// `scancel` of an allocation makes its worker report the running job as
// interrupted and exit, and a worker of a new allocation resumes the job and
// finishes it. Skips, with the reason, where SLURM cannot be started (not
// root, packages missing, daemons refusing to start).
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "common/free_port.h"
#include "tests/integration/scheduler_process.h"
#include "tests/integration/worker_process.h"

namespace depthbench::testing {
namespace {

namespace v1 = ::depthbench::v1;
using Clock = std::chrono::steady_clock;

const std::string kSourceDir = DEPTHBENCH_SOURCE_DIR;
const std::string kCluster = kSourceDir + "/deploy/slurm/local-cluster.sh";
const std::string kSbatch = kSourceDir + "/deploy/slurm/depthbench-workers.sbatch";

int FreePort() { return FreeLoopbackPort().value_or(0); }

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string Tail(const std::string& text, size_t n = 3000) {
  return text.size() > n ? text.substr(text.size() - n) : text;
}

// Brings the cluster up in its constructor and down in its destructor.
class LocalSlurm {
 public:
  explicit LocalSlurm(std::string dir) : dir_(std::move(dir)) {
    ctld_port_ = FreePort();
    slurmd_port_ = FreePort();
    auto [rc, out] = RunCommand("SLURM_LOCAL_CTLD_PORT=" + std::to_string(ctld_port_) +
                                " SLURM_LOCAL_SLURMD_PORT=" + std::to_string(slurmd_port_) +
                                " " + kCluster + " start " + dir_ + " 2>&1");
    started_ = rc == 0;
    start_output_ = out;
    if (!started_) {
      for (const char* log : {"slurmctld.log", "slurmd.log", "munged.log"}) {
        start_output_ += std::string("\n--- ") + log + "\n" + Tail(Slurp(dir_ + "/log/" + log));
      }
    }
  }
  ~LocalSlurm() { RunCommand(kCluster + " stop " + dir_ + " 2>&1"); }

  bool started() const { return started_; }
  const std::string& start_output() const { return start_output_; }
  // Prefix for SLURM client commands.
  std::string Env() const { return "SLURM_CONF=" + dir_ + "/slurm.conf "; }

 private:
  std::string dir_;
  int ctld_port_ = 0, slurmd_port_ = 0;
  bool started_ = false;
  std::string start_output_;
};

class SlurmE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "SLURM end-to-end test needs root (slurmd runs jobs)";
    for (const char* bin : {"/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd",
                            "/usr/bin/sbatch", "/usr/bin/scancel", "/usr/bin/squeue"}) {
      if (access(bin, X_OK) != 0) {
        GTEST_SKIP() << bin << " not installed (apt-get install slurm-wlm munge)";
      }
    }
    dir_ = MakeTempDir("slurm");
    slurm_ = std::make_unique<LocalSlurm>(dir_ + "/cluster");
    if (!slurm_->started()) {
      GTEST_SKIP() << "could not start a one-node SLURM cluster:\n" << slurm_->start_output();
    }
    scheduler_ = std::make_unique<SchedulerProcess>(
        dir_ + "/sched.db", dir_, std::vector<std::string>{"--lease-ttl-ms", "5000"});
    ASSERT_TRUE(scheduler_->Start()) << Slurp(dir_ + "/scheduler.log");
    channel_ = grpc::CreateChannel(scheduler_->address(), grpc::InsecureChannelCredentials());
    stub_ = v1::SweepService::NewStub(channel_);
    std::filesystem::create_directories(dir_ + "/ckpt");
  }

  void TearDown() override {
    if (slurm_ && slurm_->started()) {
      RunCommand(slurm_->Env() + "scancel --full --signal=KILL --user=root 2>&1");
    }
    scheduler_.reset();
    slurm_.reset();
    if (!HasFailure() && !dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // Submits the unchanged sbatch script with the environment an operator
  // sets; returns the SLURM job id.
  std::string Sbatch() {
    const std::string cmd =
        "cd " + dir_ + " && " + slurm_->Env() + "DEPTHBENCH_SCHEDULER=" +
        scheduler_->address() + " DEPTHBENCH_CHECKPOINT_ROOT=" + dir_ +
        "/ckpt DEPTHBENCH_WORKER_BIN=" + DEPTHBENCH_WORKER_BIN +
        " DEPTHBENCH_METRICS_PORT=0 DEPTHBENCH_SLOTS=1 sbatch --parsable " + kSbatch + " 2>&1";
    auto [rc, out] = RunCommand(cmd);
    EXPECT_EQ(rc, 0) << out;
    std::string id = out.substr(0, out.find_first_of(";\n"));
    return id;
  }

  std::string SlurmJobState(const std::string& id) {
    auto [rc, out] = RunCommand(slurm_->Env() + "squeue -h -j " + id + " -o %T 2>/dev/null");
    (void)rc;
    while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
    return out;  // empty once the job has left the queue
  }

  std::string Submit(const std::string& yaml) {
    WriteSpec(yaml);
    auto [rc, out] = RunCommand(std::string(DEPTHBENCH_CLI_BIN) + " --scheduler " +
                                scheduler_->address() + " submit " + dir_ + "/spec.yaml 2>&1");
    EXPECT_EQ(rc, 0) << out;
    return out;
  }

  void WriteSpec(const std::string& yaml) {
    std::ofstream out(dir_ + "/spec.yaml");
    out << yaml;
  }

  v1::Sweep GetSweep(const std::string& name) {
    v1::GetSweepRequest req;
    req.set_name(name);
    v1::Sweep sweep;
    auto ctx = Ctx();
    grpc::Status s = stub_->GetSweep(ctx.get(), req, &sweep);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return sweep;
  }

  std::vector<v1::Job> Jobs(const std::string& sweep) {
    v1::ListJobsRequest req;
    req.set_sweep(sweep);
    v1::ListJobsResponse resp;
    auto ctx = Ctx();
    grpc::Status s = stub_->ListJobs(ctx.get(), req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    std::vector<v1::Job> out;
    for (const auto& j : resp.jobs()) {
      v1::GetJobRequest g;
      g.set_job_id(j.id());
      v1::Job full;
      auto c = Ctx();
      if (stub_->GetJob(c.get(), g, &full).ok()) out.push_back(full);
    }
    return out;
  }

  bool WaitFor(const std::function<bool()>& done, int seconds) {
    auto deadline = Clock::now() + std::chrono::seconds(seconds);
    while (Clock::now() < deadline) {
      if (done()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
    return done();
  }

  std::string SlurmOutput(const std::string& id) {
    return Slurp(dir_ + "/depthbench-workers-" + id + ".out");
  }

  std::string dir_;
  std::unique_ptr<LocalSlurm> slurm_;
  std::unique_ptr<SchedulerProcess> scheduler_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::SweepService::Stub> stub_;
};

TEST_F(SlurmE2eTest, SbatchWorkerRunsASweepAndScancelRequeuesItsJob) {
  // (1) A small sweep, run to completion by the worker of one allocation.
  Submit(R"(name: slurm-small
architectures: [pre_ln]
shapes: {explicit: [{layers: 2, d_model: 64, heads: 4, vocab: 256}]}
lr_grids: {pre_ln: [3.0e-3, 1.0e-2]}
training: {data: brown, seq_len: 32, batch: 4, steps: 20, eval_batches: 2, log_interval: 5}
retry: {max_attempts: 2}
)");
  const std::string first = Sbatch();
  ASSERT_FALSE(first.empty());
  ASSERT_TRUE(WaitFor([&] { return GetSweep("slurm-small").state() == v1::SWEEP_COMPLETED; }, 180))
      << "sweep did not complete; squeue state '" << SlurmJobState(first) << "'\n"
      << Tail(SlurmOutput(first)) << "\nscheduler:\n" << Tail(Slurp(dir_ + "/scheduler.log"));
  for (const v1::Job& job : Jobs("slurm-small")) {
    EXPECT_EQ(job.state(), v1::SUCCEEDED) << job.id() << " " << job.reason();
    ASSERT_GE(job.attempts_size(), 1);
    // The worker named itself after the SLURM node.
    EXPECT_FALSE(job.attempts(0).worker_id().empty());
  }
  EXPECT_NE(SlurmOutput(first).find("depthbench: 1 worker(s), 1 slot(s) each"), std::string::npos)
      << SlurmOutput(first);

  // (2) A longer job; scancel while it trains.
  Submit(R"(name: slurm-cancel
architectures: [pre_ln]
shapes: {explicit: [{layers: 2, d_model: 64, heads: 4, vocab: 256}]}
lr_grids: {pre_ln: [3.0e-3]}
training: {data: brown, seq_len: 16, batch: 2, steps: 2000, eval_batches: 2, log_interval: 20,
           checkpoint_interval: 20}
retry: {max_attempts: 1}
)");
  int64_t job_id = 0;
  std::string seen;
  ASSERT_TRUE(WaitFor([&] {
    auto jobs = Jobs("slurm-cancel");
    if (jobs.empty()) return false;
    const v1::Job& job = jobs[0];
    seen = std::to_string(job.state()) + " in " + job.checkpoint_dir();
    if (job.state() != v1::RUNNING && job.state() != v1::LEASED) return false;
    job_id = job.id();
    // Trained past at least one checkpoint.
    // checkpoint_dir is relative to the workers' --checkpoint-root.
    return std::filesystem::exists(dir_ + "/ckpt/" + job.checkpoint_dir() + "/checkpoint.pt");
  }, 120)) << "job never ran past a checkpoint (last seen: state " << seen << ")\n"
           << Tail(SlurmOutput(first));
  auto [rc, out] = RunCommand(slurm_->Env() + "scancel " + first + " 2>&1");
  ASSERT_EQ(rc, 0) << out;
  ASSERT_TRUE(WaitFor([&] { return SlurmJobState(first).empty(); }, 90))
      << "allocation did not end after scancel: " << SlurmJobState(first);
  {
    auto jobs = Jobs("slurm-cancel");
    ASSERT_EQ(jobs.size(), 1u);
    const v1::Job& job = jobs[0];
    // Back in the queue without using its only attempt.
    EXPECT_EQ(job.state(), v1::PENDING) << job.reason() << "\n" << Tail(SlurmOutput(first));
    ASSERT_GE(job.attempts_size(), 1);
    EXPECT_EQ(job.attempts(job.attempts_size() - 1).outcome(), "interrupted")
        << Tail(SlurmOutput(first));
  }
  const std::string worker_out = SlurmOutput(first);
  EXPECT_NE(worker_out.find("interrupt"), std::string::npos) << Tail(worker_out);

  // (3) A new allocation's worker resumes the job and finishes it.
  const std::string second = Sbatch();
  ASSERT_TRUE(WaitFor([&] { return GetSweep("slurm-cancel").state() == v1::SWEEP_COMPLETED; }, 480))
      << Tail(SlurmOutput(second));
  auto jobs = Jobs("slurm-cancel");
  ASSERT_EQ(jobs.size(), 1u);
  EXPECT_EQ(jobs[0].id(), job_id);
  EXPECT_EQ(jobs[0].state(), v1::SUCCEEDED) << jobs[0].reason();
  ASSERT_EQ(jobs[0].attempts_size(), 2);
  EXPECT_EQ(jobs[0].attempts(0).outcome(), "interrupted");
  EXPECT_EQ(jobs[0].attempts(1).outcome(), "succeeded");
  RunCommand(slurm_->Env() + "scancel " + second + " 2>&1");
  EXPECT_TRUE(WaitFor([&] { return SlurmJobState(second).empty(); }, 90));
}

}  // namespace
}  // namespace depthbench::testing
