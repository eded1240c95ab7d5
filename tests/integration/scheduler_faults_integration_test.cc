// Issue 20 items 6-8 end to end: the real depthbench-scheduler and the real
// depthbench CLI on loopback. Oversized specs are refused with the field
// named, lists keep working, `depthbench delete` removes a sweep (refused
// while a job runs unless --force), and hostile spec files get an error
// message and exit code 2 rather than an abort.
#include <sys/wait.h>

#include <atomic>
#include <cstdio>
#include <thread>
#include <vector>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "tests/integration/scheduler_process.h"

namespace depthbench::testing {
namespace {

namespace v1 = ::depthbench::v1;

struct Output {
  int code = -1;
  std::string text;  // stdout and stderr
};

Output Cli(const std::string& address, const std::string& args) {
  std::string cmd = std::string(DEPTHBENCH_CLI_BIN) + " --scheduler " + address + " " + args +
                    " 2>&1";
  Output out;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) out.text.append(buf, n);
  int status = pclose(pipe);
  out.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return out;
}

void Write(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

constexpr char kSpec[] = R"(name: NAME
architectures: [pre_ln]
shapes: {explicit: ["2x64"]}
lr_grids: {pre_ln: [0.001, 0.002]}
training: {steps: 5, data: DATA}
)";

std::string SpecText(const std::string& name, const std::string& data) {
  std::string text = kSpec;
  text.replace(text.find("NAME"), 4, name);
  text.replace(text.find("DATA"), 4, data);
  return text;
}

// Items 7 and 8: hostile files end in a message and exit 2, not an abort.
void ExpectHostileFilesRefused(const std::string& address, const std::string& dir) {
  Write(dir + "/bomb.yaml",
        "a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n"
        "b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
        "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\n"
        "f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\ng: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]\n"
        "h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]\ni: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]\n");
  Output bomb = Cli(address, "submit " + dir + "/bomb.yaml");
  EXPECT_EQ(bomb.code, 2) << bomb.text;
  EXPECT_NE(bomb.text.find("YAML aliases"), std::string::npos) << bomb.text;
  Write(dir + "/inf.json", R"({"name": "x", "training": {"tokens_per_param": 1e400}})");
  Output inf = Cli(address, "submit " + dir + "/inf.json");
  EXPECT_EQ(inf.code, 2) << inf.text;
  EXPECT_NE(inf.text.find("spec.training.tokens_per_param"), std::string::npos) << inf.text;
  Write(dir + "/utf8.yaml", SpecText("u", "\"br\xff\xfewn\""));
  Output utf8 = Cli(address, "submit " + dir + "/utf8.yaml");
  EXPECT_EQ(utf8.code, 2) << utf8.text;
  EXPECT_NE(utf8.text.find("spec.training.data: not valid UTF-8"), std::string::npos)
      << utf8.text;
}

// Registers worker "w1" and leases it a job (which there must be).
void RegisterAndLease(v1::WorkerService::Stub* workers, v1::AcquireJobResponse* lease) {
  v1::RegisterWorkerRequest reg;
  reg.set_name("w1");
  v1::RegisterWorkerResponse reg_resp;
  ASSERT_TRUE(workers->RegisterWorker(Ctx().get(), reg, &reg_resp).ok());
  v1::AcquireJobRequest acq;
  acq.set_worker_id("w1");
  ASSERT_TRUE(workers->AcquireJob(Ctx().get(), acq, lease).ok());
  ASSERT_TRUE(lease->has_job());
}

TEST(SchedulerFaultsIntegrationTest, BoundedSpecsListsDeleteAndCliErrors) {
  std::string dir = MakeTempDir("faults");
  SchedulerProcess server(dir + "/s.db", dir);
  ASSERT_TRUE(server.Start());
  const std::string address = server.address();

  // Item 6: a 3.9 MB data path is refused by the scheduler (sent over gRPC,
  // past the CLI's own file limit), naming the field...
  auto sweeps = v1::SweepService::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  v1::SubmitSweepRequest big;
  big.mutable_spec()->set_name("huge");
  big.mutable_spec()->add_architectures("pre_ln");
  big.mutable_spec()->mutable_shapes()->set_suite("tiny");
  big.mutable_spec()->mutable_training()->set_data(std::string(3900000, 'x'));
  v1::SubmitSweepResponse created;
  grpc::Status refused = sweeps->SubmitSweep(Ctx(20000).get(), big, &created);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(refused.error_message().find("must be at most"), std::string::npos)
      << refused.error_message();
  big.mutable_spec()->mutable_training()->set_data(std::string(5000, 'x'));
  refused = sweeps->SubmitSweep(Ctx().get(), big, &created);
  EXPECT_EQ(refused.error_message(), "spec.training.data: must be at most 4096 bytes, got 5000");
  // ... and the CLI refuses the file itself.
  Write(dir + "/huge.yaml", SpecText("huge", std::string(3900000, 'x')));
  Output huge = Cli(address, "submit " + dir + "/huge.yaml");
  EXPECT_EQ(huge.code, 2) << huge.text;
  EXPECT_NE(huge.text.find("larger than 1048576 bytes"), std::string::npos) << huge.text;

  // Sweeps at the bounds still list (paged by bytes) and submit.
  for (const char* name : {"one", "two"}) {
    Write(dir + "/" + name + ".yaml", SpecText(name, std::string(4000, 'd')));
    Output ok = Cli(address, std::string("submit ") + dir + "/" + name + ".yaml");
    ASSERT_EQ(ok.code, 0) << ok.text;
  }
  Output jobs = Cli(address, "jobs --all");
  EXPECT_EQ(jobs.code, 0) << jobs.text;
  Output listed = Cli(address, "sweeps");
  ASSERT_EQ(listed.code, 0) << listed.text;
  EXPECT_NE(listed.text.find("one"), std::string::npos);
  EXPECT_NE(listed.text.find("two"), std::string::npos);

  // `depthbench delete`: refused while a job of the sweep is leased...
  auto workers = v1::WorkerService::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  v1::AcquireJobResponse lease;
  ASSERT_NO_FATAL_FAILURE(RegisterAndLease(workers.get(), &lease));
  ASSERT_EQ(lease.sweep_name(), "one");
  Output busy = Cli(address, "delete one");
  EXPECT_EQ(busy.code, 1) << busy.text;
  EXPECT_NE(busy.text.find("--force"), std::string::npos) << busy.text;
  // ... then with --force: gone, the other sweep stays.
  Output forced = Cli(address, "delete one --force");
  EXPECT_EQ(forced.code, 0) << forced.text;
  EXPECT_NE(forced.text.find("deleted sweep one and its 2 job(s) (1 leased or running job(s) cancelled)"),
            std::string::npos)
      << forced.text;
  Output idle = Cli(address, "delete two");
  EXPECT_EQ(idle.code, 0) << idle.text;
  listed = Cli(address, "sweeps");
  EXPECT_EQ(listed.text.find("one"), std::string::npos) << listed.text;
  Output gone = Cli(address, "status one");
  EXPECT_EQ(gone.code, 1);
  EXPECT_NE(gone.text.find("not found"), std::string::npos) << gone.text;

  ExpectHostileFilesRefused(address, dir);
  server.Stop(SIGTERM);
}

// One ReportMetrics stream with "loss" at steps 1..steps, 50 per message.
void ReportLossPoints(v1::WorkerService::Stub* workers, const v1::AcquireJobResponse& lease,
                      int steps, v1::ReportMetricsResponse* reported) {
  auto ctx = Ctx(60000);
  auto writer = workers->ReportMetrics(ctx.get(), reported);
  for (int s = 1; s <= steps; s += 50) {
    v1::ReportMetricsRequest chunk;
    chunk.set_job_id(lease.job_id());
    chunk.set_attempt_id(lease.attempt_id());
    for (int i = s; i < s + 50; ++i) {
      auto* p = chunk.add_points();
      p->set_step(i);
      p->set_name("loss");
      p->set_value(1.0 / i);
    }
    ASSERT_TRUE(writer->Write(chunk));
  }
  writer->WritesDone();
  ASSERT_TRUE(writer->Finish().ok());
}

// Item 12 over gRPC: streams watching a job while it is written get every
// live point once, then the final state, from the WatchHub ring.
TEST(SchedulerFaultsIntegrationTest, LiveWatchersGetEveryPointThenTheFinalState) {
  std::string dir = MakeTempDir("watch");
  SchedulerProcess server(dir + "/s.db", dir);
  ASSERT_TRUE(server.Start());
  auto channel = grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials());
  auto sweeps = v1::SweepService::NewStub(channel);
  auto workers = v1::WorkerService::NewStub(channel);
  v1::SubmitSweepRequest submit;
  submit.mutable_spec()->set_name("w");
  submit.mutable_spec()->add_architectures("pre_ln");
  submit.mutable_spec()->mutable_shapes()->add_explicit_shapes()->set_layers(2);
  submit.mutable_spec()->mutable_shapes()->mutable_explicit_shapes(0)->set_d_model(64);
  (*submit.mutable_spec()->mutable_lr_grids())["pre_ln"].add_lrs(1e-3);
  submit.mutable_spec()->mutable_training()->set_steps(5);
  v1::SubmitSweepResponse created;
  ASSERT_TRUE(sweeps->SubmitSweep(Ctx().get(), submit, &created).ok());
  v1::AcquireJobResponse lease;
  ASSERT_NO_FATAL_FAILURE(RegisterAndLease(workers.get(), &lease));

  constexpr int kWatchers = 8;
  constexpr int kSteps = 3000;
  std::vector<int> points(kWatchers, 0), disorder(kWatchers, 0);
  std::vector<v1::JobState> last(kWatchers, v1::JOB_STATE_UNSPECIFIED);
  std::atomic<int> open{0};
  std::vector<std::thread> readers;
  for (int w = 0; w < kWatchers; ++w) {
    readers.emplace_back([&, w] {
      v1::WatchJobRequest req;
      req.set_job_id(lease.job_id());
      auto ctx = Ctx(60000);
      auto reader = sweeps->WatchJob(ctx.get(), req);
      v1::WatchJobEvent event;
      int64_t step = 0;
      bool first = true;
      while (reader->Read(&event)) {
        if (first) open.fetch_add(1);
        first = false;
        if (event.has_point()) {
          if (event.point().step() <= step) ++disorder[w];
          step = event.point().step();
          ++points[w];
        } else {
          last[w] = event.state();
        }
      }
      reader->Finish();
    });
  }
  while (open.load() < kWatchers) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  v1::ReportMetricsResponse reported;
  ASSERT_NO_FATAL_FAILURE(ReportLossPoints(workers.get(), lease, kSteps, &reported));
  EXPECT_EQ(reported.accepted(), kSteps);
  v1::FinishJobRequest fin;
  fin.set_job_id(lease.job_id());
  fin.set_attempt_id(lease.attempt_id());
  fin.set_status(v1::FINISH_SUCCEEDED);
  fin.set_has_val_loss(true);
  fin.set_final_val_loss(2.0);
  auto* final_point = fin.add_points();
  final_point->set_step(kSteps + 1);
  final_point->set_name("val_loss");
  final_point->set_value(2.0);
  v1::FinishJobResponse finished;
  ASSERT_TRUE(workers->FinishJob(Ctx().get(), fin, &finished).ok());
  for (auto& t : readers) t.join();
  for (int w = 0; w < kWatchers; ++w) {
    EXPECT_EQ(points[w], kSteps + 1) << "watcher " << w;
    EXPECT_EQ(disorder[w], 0) << "watcher " << w;
    EXPECT_EQ(last[w], v1::SUCCEEDED) << "watcher " << w;
  }
  server.Stop(SIGTERM);
}

}  // namespace
}  // namespace depthbench::testing
