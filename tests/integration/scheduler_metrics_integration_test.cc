// The real depthbench-scheduler with --metrics-listen 127.0.0.1:0: RPCs from
// a scripted worker, then /metrics, /healthz and /readyz over HTTP, the
// expected series and values, and `promtool check metrics` on the scrape.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "tests/integration/metrics_scrape.h"
#include "tests/integration/scheduler_process.h"
#include "tests/integration/worker_client.h"

namespace depthbench::testing {
namespace {

namespace v1 = ::depthbench::v1;

int ReadPort(const std::string& path) {
  std::ifstream in(path);
  int port = 0;
  in >> port;
  return port;
}

v1::SweepSpec TwoJobSpec(const std::string& name) {
  v1::SweepSpec spec;
  spec.set_name(name);
  spec.add_architectures("pre_ln");
  (*spec.mutable_lr_grids())["pre_ln"].add_lrs(1e-3);
  (*spec.mutable_lr_grids())["pre_ln"].add_lrs(2e-3);
  auto* shape = spec.mutable_shapes()->add_explicit_shapes();
  shape->set_layers(2);
  shape->set_d_model(64);
  spec.mutable_training()->set_steps(10);
  spec.mutable_retry()->set_max_attempts(2);
  return spec;
}

TEST(SchedulerMetricsIntegrationTest, ServesMetricsHealthAndReadiness) {
  std::string dir = MakeTempDir("metrics");
  SchedulerProcess server(dir + "/s.db", dir,
                          {"--metrics-listen", "127.0.0.1:0", "--metrics-port-file",
                           dir + "/metrics_port"});
  ASSERT_TRUE(server.Start());
  int mport = ReadPort(dir + "/metrics_port");  // written before the gRPC port file
  ASSERT_GT(mport, 0);

  HttpResponse health = HttpGet(mport, "/healthz");
  EXPECT_EQ(health.status, 200);
  HttpResponse ready = HttpGet(mport, "/readyz");
  EXPECT_EQ(ready.status, 200) << ready.body;
  EXPECT_EQ(HttpGet(mport, "/nope").status, 404);

  auto sweeps = v1::SweepService::NewStub(
      grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
  v1::SubmitSweepRequest submit;
  *submit.mutable_spec() = TwoJobSpec("s");
  v1::SubmitSweepResponse submitted;
  ASSERT_TRUE(sweeps->SubmitSweep(Ctx().get(), submit, &submitted).ok());

  WorkerClient worker(server.address(), "w1");
  ASSERT_TRUE(worker.Register().ok());
  v1::AcquireJobResponse a, b, none;
  ASSERT_TRUE(worker.Acquire(&a).ok());
  ASSERT_TRUE(a.has_job());
  ASSERT_TRUE(worker.Report(a, 1, 4).ok());
  ASSERT_TRUE(worker.Finish(a, v1::FINISH_SUCCEEDED).ok());
  ASSERT_TRUE(worker.Acquire(&b).ok());
  ASSERT_TRUE(b.has_job());
  ASSERT_TRUE(worker.Finish(b, v1::FINISH_DIVERGED).ok());
  ASSERT_TRUE(worker.Acquire(&none).ok());
  EXPECT_FALSE(none.has_job());
  WorkerClient stranger(server.address(), "never-registered");
  v1::AcquireJobResponse refused;
  EXPECT_EQ(stranger.Acquire(&refused).error_code(), grpc::StatusCode::NOT_FOUND);

  // workers_connected is refreshed by the lease ticker (<= 200 ms).
  std::string text;
  for (int i = 0; i < 100; ++i) {
    HttpResponse scrape = HttpGet(mport, "/metrics");
    ASSERT_EQ(scrape.status, 200);
    text = scrape.body;
    if (SampleValue(text, "depthbench_scheduler_workers_connected") == 1.0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  auto expect = [&text](const std::string& series, double value) {
    std::optional<double> v = SampleValue(text, series);
    ASSERT_TRUE(v.has_value()) << "missing " << series << " in\n" << text;
    EXPECT_EQ(*v, value) << series;
  };
  expect("depthbench_scheduler_workers_connected", 1);
  expect("depthbench_scheduler_leases_granted_total", 2);
  expect("depthbench_scheduler_rpcs_total{method=\"AcquireJob\",code=\"OK\"}", 3);
  expect("depthbench_scheduler_rpcs_total{method=\"AcquireJob\",code=\"NOT_FOUND\"}", 1);
  expect("depthbench_scheduler_rpcs_total{method=\"SubmitSweep\",code=\"OK\"}", 1);
  expect("depthbench_scheduler_rpcs_total{method=\"RegisterWorker\",code=\"OK\"}", 1);
  expect("depthbench_scheduler_rpcs_total{method=\"ReportMetrics\",code=\"OK\"}", 1);
  expect("depthbench_scheduler_rpcs_total{method=\"FinishJob\",code=\"OK\"}", 2);
  expect("depthbench_scheduler_rpc_duration_seconds_count{method=\"AcquireJob\",code=\"OK\"}",
         3);
  expect("depthbench_scheduler_metric_points_ingested_total", 4);
  expect("depthbench_scheduler_jobs_finished_total{state=\"succeeded\"}", 1);
  expect("depthbench_scheduler_jobs_finished_total{state=\"diverged\"}", 1);
  expect("depthbench_scheduler_jobs{sweep=\"s\",state=\"succeeded\"}", 1);
  expect("depthbench_scheduler_jobs{sweep=\"s\",state=\"diverged\"}", 1);
  expect("depthbench_scheduler_jobs{sweep=\"s\",state=\"pending\"}", 0);
  expect("depthbench_scheduler_sqlite_transaction_duration_seconds_count{txn=\"acquire_job\"}",
         2);
  expect("depthbench_build_info{component=\"scheduler\",version=\"0.1.0\"}", 1);

  if (!std::filesystem::exists(kPromtool)) {
    GTEST_SKIP() << kPromtool << " not installed: `promtool check metrics` not run";
  }
  std::string output;
  EXPECT_EQ(PromtoolCheckMetrics(text, dir, &output), 0) << output;
}

TEST(SchedulerMetricsIntegrationTest, MetricsPortFileRequiresMetricsListen) {
  std::string dir = MakeTempDir("metrics_usage");
  std::string cmd = std::string(DEPTHBENCH_SCHEDULER_BIN) + " --db " + dir +
                    "/s.db --metrics-port-file " + dir + "/p > /dev/null 2>&1";
  int rc = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(rc));
  EXPECT_EQ(WEXITSTATUS(rc), 2);
}

}  // namespace
}  // namespace depthbench::testing
