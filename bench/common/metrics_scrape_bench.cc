// Cost of a /metrics scrape with N active jobs on a worker (each job has 4
// series: step, training loss, validation loss, tokens/s), against two
// peers in the same run: the same registry with 10 jobs, and a naive
// std::ostringstream renderer over the same values. Also the full HTTP
// scrape over loopback. Bytes per scrape are reported as a counter.
//
//   build/bench/common/metrics_scrape_bench --benchmark_min_time=0.5
#include <iomanip>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "benchmark/benchmark.h"
#include "common/daemon_metrics.h"
#include "common/metrics_http_server.h"

namespace depthbench {
namespace {

struct Worker {
  MetricsRegistry registry;
  WorkerMetrics metrics;
};

std::unique_ptr<Worker> MakeWorker(int jobs) {
  auto w = std::make_unique<Worker>();
  w->metrics = *RegisterWorkerMetrics(&w->registry, "0.1.0", [] { return 1.5; });
  w->metrics.SetSlots(jobs, 0);
  for (int j = 0; j < jobs; ++j) {
    const JobLabels job{"job-" + std::to_string(100000 + j), "depth-sweep-1",
                        j % 2 == 0 ? "pre_ln" : "attnres_full"};
    w->metrics.RecordStep(job, 1000 + j, 3.0 + j * 1e-3, 12345.678 + j);
    w->metrics.RecordEval(job, 3.1 + j * 1e-3);
  }
  return w;
}

void BM_RegistryRender(benchmark::State& state) {
  auto w = MakeWorker(static_cast<int>(state.range(0)));
  size_t bytes = 0;
  for (auto _ : state) {
    std::string text = w->registry.Render();
    bytes = text.size();
    benchmark::DoNotOptimize(text);
  }
  state.counters["bytes"] = static_cast<double>(bytes);
  state.counters["series"] = static_cast<double>(state.range(0) * 4);
}
BENCHMARK(BM_RegistryRender)->Arg(10)->Arg(1000)->Unit(benchmark::kMicrosecond);

// Peer: the obvious renderer, ostringstream and operator<< per line.
void BM_NaiveOstreamRender(benchmark::State& state) {
  struct Row {
    const char* name;
    std::string job, sweep, arch;
    double value;
  };
  std::vector<Row> rows;
  const int jobs = static_cast<int>(state.range(0));
  for (int j = 0; j < jobs; ++j) {
    const std::string id = "job-" + std::to_string(100000 + j);
    const std::string arch = j % 2 == 0 ? "pre_ln" : "attnres_full";
    rows.push_back({"depthbench_worker_job_step", id, "depth-sweep-1", arch,
                    1000.0 + j});
    rows.push_back({"depthbench_worker_job_training_loss", id,
                    "depth-sweep-1", arch, 3.0 + j * 1e-3});
    rows.push_back({"depthbench_worker_job_validation_loss", id,
                    "depth-sweep-1", arch, 3.1 + j * 1e-3});
    rows.push_back({"depthbench_worker_job_tokens_per_second", id,
                    "depth-sweep-1", arch, 12345.678 + j});
  }
  size_t bytes = 0;
  for (auto _ : state) {
    std::ostringstream out;
    out << std::setprecision(17);
    for (const Row& r : rows) {
      out << r.name << "{job_id=\"" << r.job << "\",sweep=\"" << r.sweep
          << "\",arch=\"" << r.arch << "\"} " << r.value << "\n";
    }
    std::string text = out.str();
    bytes = text.size();
    benchmark::DoNotOptimize(text);
  }
  state.counters["bytes"] = static_cast<double>(bytes);
}
BENCHMARK(BM_NaiveOstreamRender)->Arg(1000)->Unit(benchmark::kMicrosecond);

void BM_HttpScrape(benchmark::State& state) {
  namespace http = boost::beast::http;
  auto w = MakeWorker(static_cast<int>(state.range(0)));
  auto server = MetricsHttpServer::Start({}, &w->registry);
  if (!server.ok()) {
    state.SkipWithError("server did not start");
    return;
  }
  boost::asio::io_context ioc;
  boost::asio::ip::tcp::socket socket(ioc);
  socket.connect({boost::asio::ip::make_address("127.0.0.1"),
                  (*server)->port()});
  boost::beast::flat_buffer buffer;
  size_t bytes = 0;
  for (auto _ : state) {
    http::request<http::empty_body> request(http::verb::get, "/metrics", 11);
    request.set(http::field::host, "bench");
    http::write(socket, request);
    http::response_parser<http::string_body> parser;
    parser.body_limit(64 << 20);
    http::read(socket, buffer, parser);
    bytes = parser.get().body().size();
  }
  state.counters["bytes"] = static_cast<double>(bytes);
}
BENCHMARK(BM_HttpScrape)->Arg(10)->Arg(1000)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace depthbench

BENCHMARK_MAIN();
