// The web view's JSON endpoints (scheduler/web_api.h) against the Scheduler
// read each one wraps (the peer: what the gRPC API answers, without gRPC),
// at several sweep sizes, in one run (issue 16: "stays fast for a
// 100,000-job sweep"):
//   web_bench [--sizes 1000,10000,100000] [--finish 2000] [--points 5000]
//             [--reps 30] [--http]
// For each size N: a fresh SQLite file, one sweep of 10 designs x 10 shapes x
// 10 LRs x N/1000 seeds submitted in-process, --finish jobs leased and
// finished (so results rows and runs have values), one of them with
// --points loss points; then, --reps times each (medians printed):
//   sweeps   GET /api/sweeps                 vs ListSweeps
//   sweep    GET /api/sweeps/NAME            vs GetSweep
//   results  GET /api/sweeps/NAME/results    vs QueryResults (rows, 1 run)
//   runs     GET /api/sweeps/NAME/runs       vs QueryResults (100 runs)
//   jobs     GET /api/jobs?sweep=NAME        vs ListJobs (100 jobs)
//   job      GET /api/jobs/ID                vs GetJob
//   points   GET /api/jobs/ID/points         vs ReadWatch (all points)
// With --http the same requests also go through the real WebServer over
// loopback (one keep-alive connection). "web" calls miss the progress cache
// (web_api.h), "cached" ones may hit it. The ratios web/peer say what the
// JSON costs on top of the read; the last table says how each grows from
// the smallest size to the largest (the goal: no endpoint grows with N
// more than its peer does).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <CLI/CLI.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/clock.h"
#include "scheduler/scheduler.h"
#include "scheduler/web_api.h"
#include "scheduler/web_server.h"
#include "study_spec.h"

namespace v1 = ::depthbench::v1;
using depthbench::scheduler::Scheduler;
using depthbench::scheduler::WebApi;
using depthbench::scheduler::WebRequest;
using depthbench::scheduler::WebResponse;
using SteadyClock = std::chrono::steady_clock;

namespace {

// 10 designs x 10 LRs x 10 shapes x seeds jobs.
v1::SweepSpec Spec(const std::string& name, int seeds) {
  return depthbench::bench::StudySpec(name, 10, 10, seeds);
}

double MedianMs(int reps, const std::function<void()>& f) {
  std::vector<double> ms;
  f();  // warm the page cache and the readers
  for (int i = 0; i < reps; ++i) {
    auto t0 = SteadyClock::now();
    f();
    ms.push_back(std::chrono::duration<double, std::milli>(SteadyClock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

WebRequest Get(const std::string& target) {
  WebRequest r;
  r.method = "GET";
  const size_t q = target.find('?');
  r.path = target.substr(0, q);
  if (q != std::string::npos) {
    for (absl::string_view kv : absl::StrSplit(target.substr(q + 1), '&')) {
      std::vector<std::string> parts = absl::StrSplit(kv, absl::MaxSplits('=', 1));
      r.query[parts[0]] = parts.size() > 1 ? parts[1] : "";
    }
  }
  return r;
}

// One keep-alive HTTP connection to the WebServer.
class HttpClient {
 public:
  explicit HttpClient(int port) : stream_(ioc_) {
    boost::asio::ip::tcp::resolver resolver(ioc_);
    stream_.connect(resolver.resolve("127.0.0.1", std::to_string(port)));
  }
  size_t Get(const std::string& target) {
    namespace http = boost::beast::http;
    http::request<http::empty_body> req{http::verb::get, target, 11};
    req.set(http::field::host, "127.0.0.1");
    http::write(stream_, req);
    http::response<http::string_body> res;
    http::read(stream_, buffer_, res);
    if (res.result_int() != 200) {
      std::fprintf(stderr, "GET %s: %u %s\n", target.c_str(), res.result_int(), res.body().c_str());
      std::exit(1);
    }
    return res.body().size();
  }

 private:
  boost::asio::io_context ioc_;
  boost::beast::tcp_stream stream_;
  boost::beast::flat_buffer buffer_;
};

struct Row {
  std::string endpoint;
  double peer_ms, web_ms, cached_ms, http_ms;
  size_t bytes;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"web_bench: the web view's endpoints vs the Scheduler reads they wrap"};
  std::string sizes_arg = "1000,10000,100000";
  int finish = 2000, points = 5000, reps = 30;
  bool use_http = false;
  app.add_option("--sizes", sizes_arg, "sweep sizes in jobs (multiples of 1000)")
      ->capture_default_str();
  app.add_option("--finish", finish, "jobs leased and finished per sweep")->capture_default_str();
  app.add_option("--points", points, "loss points of the measured job")->capture_default_str();
  app.add_option("--reps", reps, "timed repetitions per request")->capture_default_str();
  app.add_flag("--http", use_http, "also time the requests over loopback HTTP");
  CLI11_PARSE(app, argc, argv);
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);

  std::vector<int> sizes;
  for (absl::string_view s : absl::StrSplit(sizes_arg, ',')) sizes.push_back(std::stoi(std::string(s)));
  std::map<int, std::vector<Row>> all;
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("web_bench_" + std::to_string(getpid()))).string();
  std::filesystem::create_directories(dir);

  for (int size : sizes) {
    const int seeds = std::max(1, size / 1000);
    const std::string path = absl::StrCat(dir, "/web", size, ".sqlite");
    auto scheduler = Scheduler::Open(path, depthbench::RealClock::Default(), {});
    if (!scheduler.ok()) {
      std::fprintf(stderr, "%s\n", scheduler.status().ToString().c_str());
      return 1;
    }
    Scheduler& s = **scheduler;
    auto t0 = SteadyClock::now();
    v1::SweepSpec spec = Spec("web", seeds);
    auto submitted = s.SubmitSweep(spec);
    if (!submitted.ok()) {
      std::fprintf(stderr, "submit: %s\n", submitted.status().ToString().c_str());
      return 1;
    }
    const double submit_s = std::chrono::duration<double>(SteadyClock::now() - t0).count();
    v1::RegisterWorkerRequest reg;
    reg.set_name("bench");
    reg.mutable_resources()->set_slots(1);
    auto worker = s.RegisterWorker(reg);
    if (!worker.ok()) return 1;
    int64_t measured_job = 0;
    t0 = SteadyClock::now();
    for (int i = 0; i < finish; ++i) {
      v1::AcquireJobRequest acq;
      acq.set_worker_id(worker->worker_id());
      auto lease = s.AcquireJob(acq);
      if (!lease.ok() || lease->job_id() == 0) break;
      if (measured_job == 0) {
        measured_job = lease->job_id();
        for (int from = 0; from < points; from += 500) {
          v1::ReportMetricsRequest rep;
          rep.set_job_id(lease->job_id());
          rep.set_attempt_id(lease->attempt_id());
          for (int k = from; k < std::min(points, from + 500); ++k) {
            v1::MetricPoint* p = rep.add_points();
            p->set_step(k + 1);
            p->set_name("loss");
            p->set_value(4.0 / (1.0 + k * 0.01));
            p->set_wall_ms(1);
          }
          if (!s.ReportMetrics(rep).ok()) return 1;
        }
      }
      v1::FinishJobRequest fin;
      fin.set_job_id(lease->job_id());
      fin.set_attempt_id(lease->attempt_id());
      fin.set_status(v1::FINISH_SUCCEEDED);
      fin.set_has_val_loss(true);
      fin.set_final_val_loss(2.0 + (i % 97) * 0.001);
      fin.set_final_step(100);
      if (!s.FinishJob(fin).ok()) return 1;
    }
    const double drain_s = std::chrono::duration<double>(SteadyClock::now() - t0).count();
    std::printf("size %d: submit %.2f s, %d jobs finished in %.2f s\n", size, submit_s, finish,
                drain_s);

    // The web view's clock only dates its progress cache and ETA samples:
    // advancing it before a timed call makes every call miss the cache.
    depthbench::FakeClock web_clock;
    WebApi api(&s, &web_clock, "");
    std::unique_ptr<depthbench::scheduler::WebServer> server;
    std::unique_ptr<HttpClient> client;
    if (use_http) {
      depthbench::scheduler::WebServerOptions o;
      auto started = depthbench::scheduler::WebServer::Start(
          o, [&api](const WebRequest& r) { return api.Handle(r); });
      if (!started.ok()) return 1;
      server = std::move(started).value();
      client = std::make_unique<HttpClient>(server->port());
    }
    const std::string job = std::to_string(measured_job);
    struct Case {
      const char* name;
      std::string target;
      std::function<void()> peer;
    };
    std::vector<Case> cases = {
        {"sweeps", "/api/sweeps", [&] { (void)s.ListSweeps({}); }},
        {"sweep", "/api/sweeps/web", [&] { (void)s.GetSweep("web"); }},
        {"results", "/api/sweeps/web/results",
         [&] {
           v1::QueryResultsRequest q;
           q.set_sweep("web");
           q.set_page_size(1);
           (void)s.QueryResults(q);
         }},
        {"runs", "/api/sweeps/web/runs?page_size=100",
         [&] {
           v1::QueryResultsRequest q;
           q.set_sweep("web");
           q.set_page_size(100);
           (void)s.QueryResults(q);
         }},
        {"jobs", "/api/jobs?sweep=web&page_size=100",
         [&] {
           v1::ListJobsRequest q;
           q.set_sweep("web");
           q.set_page_size(100);
           (void)s.ListJobs(q);
         }},
        {"job", "/api/jobs/" + job, [&] { (void)s.GetJob(measured_job); }},
        {"points", "/api/jobs/" + job + "/points",
         [&] { (void)s.ReadWatch(measured_job, 0, 0, WebApi::kMaxPointsPerRead); }},
    };
    for (const Case& c : cases) {
      Row row{c.name, 0, 0, 0, 0, 0};
      row.peer_ms = MedianMs(reps, c.peer);
      WebRequest req = Get(c.target);
      WebResponse probe = api.Handle(req);
      if (probe.status != 200) {
        std::fprintf(stderr, "%s: %d %s\n", c.target.c_str(), probe.status, probe.body.c_str());
        return 1;
      }
      row.bytes = probe.body.size();
      row.web_ms = MedianMs(reps, [&] {
        web_clock.AdvanceMs(WebApi::kProgressCacheMs);
        (void)api.Handle(req);
      });
      row.cached_ms = MedianMs(reps, [&] { (void)api.Handle(req); });
      if (client) {
        row.http_ms = MedianMs(reps, [&] {
          web_clock.AdvanceMs(WebApi::kProgressCacheMs);
          (void)client->Get(c.target);
        });
      }
      all[size].push_back(row);
    }
    client.reset();
    server.reset();
  }
  std::filesystem::remove_all(dir);

  std::printf("\n%-8s %-8s %10s %10s %8s %10s %10s %10s\n", "jobs", "endpoint", "peer ms",
              "web ms", "web/peer", "cached ms", "http ms", "bytes");
  for (const auto& [size, rows] : all) {
    for (const Row& r : rows) {
      std::printf("%-8d %-8s %10.3f %10.3f %8.2f %10.3f %10.3f %10zu\n", size, r.endpoint.c_str(),
                  r.peer_ms, r.web_ms, r.web_ms / r.peer_ms, r.cached_ms, r.http_ms, r.bytes);
    }
  }
  std::printf("(web ms: the progress cache missed on every call; cached ms: it hit where the "
              "endpoint has one; http ms: 0 without --http)\n");
  if (all.size() >= 2) {
    const auto& small = all.begin()->second;
    const auto& large = all.rbegin()->second;
    std::printf("\ngrowth from %d to %d jobs (median at the largest / at the smallest)\n",
                all.begin()->first, all.rbegin()->first);
    std::printf("%-8s %10s %10s\n", "endpoint", "peer", "web");
    for (size_t i = 0; i < small.size(); ++i) {
      std::printf("%-8s %10.2f %10.2f\n", small[i].endpoint.c_str(),
                  large[i].peer_ms / small[i].peer_ms, large[i].web_ms / small[i].web_ms);
    }
  }
  return 0;
}
