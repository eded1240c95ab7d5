// Scheduler throughput through the real gRPC path (in-process server on a
// loopback port, file-backed SQLite in WAL mode):
//   1. AcquireJob + FinishJob with N concurrent simulated workers: leases/s
//      and p50/p99 latency of each RPC.
//   2. ReportMetrics ingestion: points/s over S concurrent streams.
//   3. (--watchers W) ingestion again, on fresh jobs, without and then with
//      W WatchJob streams open (on W distinct jobs, the S ingesting ones
//      among them): the ratio shows what watchers cost ingestion.
//   4. Live ingestion (issue 19): W simulated workers, each relaying its
//      attempt's points as a trainer logs them: one ReportMetrics call per
//      small batch (the worker relay's flush), the first carrying
//      resumed_from_step; points/s and per-call latency.
// The scheduler runs with the same metrics observer and RPC interceptor as
// depthbench-scheduler (which always installs them); --no-metrics leaves
// them out.
// Usage: scheduler_bench [--workers 64] [--seconds 5] [--streams 8]
//                        [--points 400000] [--chunk 1000] [--no-metrics]
//                        [--exclusive-lock] [--durability normal|full]
//                        [--watchers 0] [--rounds 3] [--watch-idle-only]
// --exclusive-lock opens the file as the scheduler did before issue 14
// (locking_mode=EXCLUSIVE, reads under the mutex) to measure what the
// shared lock costs; --durability full measures synchronous=FULL.
//                        [--live-workers 64] [--live-chunk 32]
//                        [--live-points 400000]
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/synchronization/mutex.h"
#include <grpcpp/grpcpp.h>

#include "common/clock.h"
#include "common/daemon_metrics.h"
#include "common/metrics.h"
#include "depthbench/v1/sweep_service.grpc.pb.h"
#include "depthbench/v1/worker_service.grpc.pb.h"
#include "study_spec.h"
#include "scheduler/scheduler.h"
#include "scheduler/scheduler_metrics.h"
#include "scheduler/server.h"

namespace v1 = ::depthbench::v1;
using Clock = std::chrono::steady_clock;

namespace {

std::unique_ptr<grpc::ClientContext> Ctx() {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  return ctx;
}

// CPU seconds (user + system) of this whole process: the in-process server
// and the simulated workers together, since both compete for the same cores.
double ProcessCpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

double Percentile(std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

// The default LR grids (no lr_grids in the spec).
v1::SweepSpec BigSpec(const std::string& name, int shapes, int seeds) {
  return depthbench::bench::StudySpec(name, 0, shapes, seeds);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"scheduler_bench: lease and metric-ingestion throughput"};
  int workers = 64, streams = 8, chunk = 1000;
  double seconds = 5;
  int64_t total_points = 400000;
  app.add_option("--workers", workers)->capture_default_str();
  app.add_option("--seconds", seconds)->capture_default_str();
  app.add_option("--streams", streams)->capture_default_str();
  app.add_option("--points", total_points)->capture_default_str();
  app.add_option("--chunk", chunk)->capture_default_str();
  bool no_metrics = false, exclusive_lock = false;
  std::string durability = "normal";
  app.add_flag("--exclusive-lock", exclusive_lock,
               "open the file with locking_mode=EXCLUSIVE (nothing else can read it)");
  app.add_option("--durability", durability, "normal or full")->capture_default_str();
  int watchers = 0;
  app.add_option("--watchers", watchers, "WatchJob streams for part 3 (0: skip it)")
      ->capture_default_str();
  int rounds = 3;
  app.add_option("--rounds", rounds, "part 3: alternating rounds (median reported)")
      ->capture_default_str();
  bool watch_idle_only = false;
  app.add_flag("--watch-idle-only", watch_idle_only,
               "part 3: watch only jobs that receive no points (the cost of fan-out alone)");
  int live_workers = 64, live_chunk = 32;
  int64_t live_points = 400000;
  app.add_option("--live-workers", live_workers, "phase 4: simulated workers (0: skip)")
      ->capture_default_str();
  app.add_option("--live-chunk", live_chunk, "phase 4: points per ReportMetrics call")
      ->capture_default_str();
  app.add_option("--live-points", live_points, "phase 4: points in all")->capture_default_str();
  app.add_flag("--no-metrics", no_metrics,
               "run without the metrics observer and RPC interceptor");
  CLI11_PARSE(app, argc, argv);
  // Debian builds Abseil with mutex deadlock detection on; it costs ~2% of
  // CPU per lock here and the scheduler has one lock order.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);

  std::string dir = std::filesystem::temp_directory_path() / "depthbench_scheduler_bench";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  // As scheduler/main.cc wires them.
  depthbench::MetricsRegistry registry;
  depthbench::scheduler::SchedulerScrapeSource source;
  absl::StatusOr<depthbench::SchedulerMetrics> metrics = depthbench::RegisterSchedulerMetrics(
      &registry, "bench", [&source] { return source.JobsBySweepAndState(); });
  if (!metrics.ok()) {
    std::fprintf(stderr, "%s\n", metrics.status().ToString().c_str());
    return 1;
  }
  depthbench::scheduler::SchedulerMetricsObserver observer(*metrics);
  depthbench::scheduler::SchedulerOptions options;
  options.lease_ttl_ms = 60000;
  if (!no_metrics) options.observer = &observer;
  depthbench::storage::DatabaseOptions db_options;
  db_options.exclusive_lock = exclusive_lock;
  auto parsed = depthbench::storage::ParseDurability(durability, "--durability");
  if (!parsed.ok()) {
    std::fprintf(stderr, "%s\n", parsed.status().ToString().c_str());
    return 2;
  }
  db_options.durability = *parsed;
  std::printf("locking: %s, durability: %s\n", exclusive_lock ? "exclusive" : "shared",
              durability.c_str());
  auto db = depthbench::storage::Database::Open(dir + "/bench.db", db_options);
  if (!db.ok()) {
    std::fprintf(stderr, "%s\n", db.status().ToString().c_str());
    return 1;
  }
  auto scheduler = depthbench::scheduler::Scheduler::Create(
      std::move(*db), depthbench::RealClock::Default(), options);
  if (!scheduler.ok()) {
    std::fprintf(stderr, "%s\n", scheduler.status().ToString().c_str());
    return 1;
  }
  source.Attach(scheduler->get());
  depthbench::scheduler::ServerOptions server_options;
  server_options.listen = "127.0.0.1:0";
  if (!no_metrics) {
    server_options.rpc_observer = [m = *metrics](const std::string& method,
                                                 const std::string& code, double seconds) {
      m.RecordRpc(method, code, seconds);
    };
  }
  std::printf("metrics observer and RPC interceptor: %s\n", no_metrics ? "off" : "on");
  depthbench::scheduler::SchedulerServer server(scheduler->get(), server_options);
  if (!server.Start().ok()) return 1;

  // Several channels so the 64 workers do not all share one HTTP/2 connection.
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int i = 0; i < 8; ++i) {
    grpc::ChannelArguments args;
    args.SetInt("grpc.channel_id", i);  // distinct subchannels
    channels.push_back(grpc::CreateCustomChannel(server.address(),
                                                 grpc::InsecureChannelCredentials(), args));
  }
  auto sweeps = v1::SweepService::NewStub(channels[0]);
  // 10 archs x 50 shapes x 4 LRs x 6 seeds = 12,000 jobs in groups of 24.
  for (int s = 0; s < 2; ++s) {
    v1::SubmitSweepRequest req;
    *req.mutable_spec() = BigSpec("bench" + std::to_string(s), 50, 6);
    v1::SubmitSweepResponse resp;
    grpc::Status st = sweeps->SubmitSweep(Ctx().get(), req, &resp);
    if (!st.ok()) {
      std::fprintf(stderr, "submit: %s\n", st.error_message().c_str());
      return 1;
    }
  }

  // --- 1. leases --------------------------------------------------------
  std::atomic<bool> stop{false};
  std::atomic<int64_t> leases{0};
  std::mutex mu;
  std::vector<double> acquire_ms, finish_ms, pair_ms;
  std::vector<std::thread> threads;
  auto start = Clock::now();
  double cpu_start = ProcessCpuSeconds();
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      auto stub = v1::WorkerService::NewStub(channels[w % channels.size()]);
      std::string name = "bench-w" + std::to_string(w);
      v1::RegisterWorkerRequest reg;
      reg.set_name(name);
      reg.mutable_resources()->set_slots(1);
      v1::RegisterWorkerResponse reg_resp;
      if (!stub->RegisterWorker(Ctx().get(), reg, &reg_resp).ok()) return;
      std::vector<double> a_ms, f_ms, p_ms;
      while (!stop.load()) {
        auto t0 = Clock::now();
        v1::AcquireJobRequest acq;
        acq.set_worker_id(name);
        v1::AcquireJobResponse lease;
        if (!stub->AcquireJob(Ctx().get(), acq, &lease).ok() || !lease.has_job()) break;
        auto t1 = Clock::now();
        v1::FinishJobRequest fin;
        fin.set_job_id(lease.job_id());
        fin.set_attempt_id(lease.attempt_id());
        fin.set_status(v1::FINISH_SUCCEEDED);
        fin.set_has_val_loss(true);
        fin.set_final_val_loss(3.0 + 0.001 * (lease.job_id() % 97));
        v1::FinishJobResponse fin_resp;
        if (!stub->FinishJob(Ctx().get(), fin, &fin_resp).ok()) break;
        auto t2 = Clock::now();
        a_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
        f_ms.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
        p_ms.push_back(std::chrono::duration<double, std::milli>(t2 - t0).count());
        leases.fetch_add(1);
      }
      std::lock_guard<std::mutex> lock(mu);
      acquire_ms.insert(acquire_ms.end(), a_ms.begin(), a_ms.end());
      finish_ms.insert(finish_ms.end(), f_ms.begin(), f_ms.end());
      pair_ms.insert(pair_ms.end(), p_ms.begin(), p_ms.end());
    });
  }
  while (std::chrono::duration<double>(Clock::now() - start).count() < seconds &&
         leases.load() < 23000) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  stop = true;
  for (auto& t : threads) t.join();
  double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  double cpu = ProcessCpuSeconds() - cpu_start;
  std::printf("leases: %d workers, %lld Acquire+Finish pairs in %.2f s = %.0f leases/s\n",
              workers, static_cast<long long>(leases.load()), elapsed, leases.load() / elapsed);
  std::printf("  CPU (client + server, user + sys): %.2f s = %.3f ms per pair"
              " (%.0f pairs per CPU-second)\n",
              cpu, 1000 * cpu / std::max<int64_t>(1, leases.load()),
              leases.load() / std::max(cpu, 1e-9));
  std::printf("  AcquireJob  p50 %.2f ms  p99 %.2f ms\n", Percentile(acquire_ms, 0.5),
              Percentile(acquire_ms, 0.99));
  std::printf("  FinishJob   p50 %.2f ms  p99 %.2f ms\n", Percentile(finish_ms, 0.5),
              Percentile(finish_ms, 0.99));
  std::printf("  pair        p50 %.2f ms  p99 %.2f ms\n", Percentile(pair_ms, 0.5),
              Percentile(pair_ms, 0.99));

  // --- 2. metric ingestion ----------------------------------------------
  // Leases `streams` fresh jobs for one ingestion run.
  int ingest_runs = 0;
  auto lease_jobs = [&](std::vector<v1::AcquireJobResponse>* held) -> bool {
    auto stub = v1::WorkerService::NewStub(channels[0]);
    std::string name = "ingest" + std::to_string(ingest_runs++);
    v1::RegisterWorkerRequest reg;
    reg.set_name(name);
    reg.mutable_resources()->set_slots(streams);
    v1::RegisterWorkerResponse reg_resp;
    stub->RegisterWorker(Ctx().get(), reg, &reg_resp);
    for (int i = 0; i < streams; ++i) {
      v1::AcquireJobRequest acq;
      acq.set_worker_id(name);
      v1::AcquireJobResponse lease;
      if (!stub->AcquireJob(Ctx().get(), acq, &lease).ok() || !lease.has_job()) {
        std::fprintf(stderr, "no job left for ingestion stream %d\n", i);
        return false;
      }
      held->push_back(lease);
    }
    return true;
  };
  const char* names[] = {"loss", "lr", "grad_norm", "tokens_per_s"};
  int64_t per_stream = total_points / streams;
  // Streams total_points over `streams` ReportMetrics streams into `held`;
  // returns points/s.
  auto ingest = [&](const std::vector<v1::AcquireJobResponse>& held, const char* label,
                    double* cpu_per_point = nullptr) -> double {
    std::atomic<int64_t> accepted{0};
    std::vector<std::thread> streamers;
    auto t0 = Clock::now();
    double cpu0 = ProcessCpuSeconds();
    for (int s = 0; s < streams; ++s) {
      streamers.emplace_back([&, s] {
        auto stub = v1::WorkerService::NewStub(channels[s % channels.size()]);
        v1::ReportMetricsResponse resp;
        auto ctx = Ctx();
        auto writer = stub->ReportMetrics(ctx.get(), &resp);
        int64_t sent = 0, step = 1;
        while (sent < per_stream) {
          v1::ReportMetricsRequest req;
          req.set_job_id(held[s].job_id());
          req.set_attempt_id(held[s].attempt_id());
          for (int i = 0; i < chunk && sent < per_stream; ++i, ++sent) {
            auto* p = req.add_points();
            p->set_step(step);
            p->set_name(names[i % 4]);
            p->set_value(1.0 / step);
            if (i % 4 == 3) ++step;
          }
          if (!writer->Write(req)) break;
        }
        writer->WritesDone();
        grpc::Status st = writer->Finish();
        if (!st.ok()) std::fprintf(stderr, "stream %d: %s\n", s, st.error_message().c_str());
        accepted.fetch_add(resp.accepted());
      });
    }
    for (auto& t : streamers) t.join();
    double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    double used = ProcessCpuSeconds() - cpu0;
    std::printf("%s: %d streams, %lld points (chunks of %d) in %.2f s = %.0f points/s\n", label,
                streams, static_cast<long long>(accepted.load()), chunk, secs,
                accepted.load() / secs);
    std::printf("  CPU (client + server, user + sys): %.2f s = %.2f us per point\n", used,
                1e6 * used / std::max<int64_t>(1, accepted.load()));
    if (cpu_per_point != nullptr) *cpu_per_point = used / std::max<int64_t>(1, accepted.load());
    return accepted.load() / secs;
  };
  std::vector<v1::AcquireJobResponse> held;
  if (!lease_jobs(&held)) return 1;
  ingest(held, "ingestion");

  // --- 3. ingestion with watchers ---------------------------------------
  // Rounds alternate: ingest into fresh unwatched jobs with no stream open,
  // then open the W streams and ingest into the jobs they watch. Medians of
  // the per-round ratios (points/s and CPU per point) damp a busy machine.
  if (watchers > 0) {
    std::vector<double> rate_ratios, cpu_ratios;
    for (int round = 0; round < rounds; ++round) {
      std::vector<v1::AcquireJobResponse> quiet, watched;
      if (!lease_jobs(&quiet) || !lease_jobs(&watched)) return 1;
      double cpu_alone = 0, cpu_with = 0;
      double alone = ingest(quiet, "ingestion, 0 watchers", &cpu_alone);
      // W streams on W distinct jobs: the ingesting ones first (unless
      // --watch-idle-only), then jobs that get no points.
      std::vector<int64_t> targets;
      if (!watch_idle_only) {
        for (const auto& lease : watched) targets.push_back(lease.job_id());
      }
      auto busy = [&](int64_t id) {
        for (const auto* set : {&quiet, &watched, &held}) {
          for (const auto& lease : *set) {
            if (lease.job_id() == id) return true;
          }
        }
        return false;
      };
      for (int64_t id = 1; static_cast<int>(targets.size()) < watchers; ++id) {
        if (std::find(targets.begin(), targets.end(), id) == targets.end() && !busy(id)) {
          targets.push_back(id);
        }
      }
      std::atomic<int64_t> events{0};
      std::atomic<int> open{0};
      std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
      for (int w = 0; w < watchers; ++w) {
        auto ctx = std::make_unique<grpc::ClientContext>();
        ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(10));
        contexts.push_back(std::move(ctx));
      }
      std::vector<std::thread> readers;
      for (int w = 0; w < watchers; ++w) {
        readers.emplace_back([&, w] {
          auto stub = v1::SweepService::NewStub(channels[w % channels.size()]);
          v1::WatchJobRequest req;
          req.set_job_id(targets[w]);
          auto reader = stub->WatchJob(contexts[w].get(), req);
          v1::WatchJobEvent event;
          bool first = true;
          while (reader->Read(&event)) {
            if (first) open.fetch_add(1);
            first = false;
            events.fetch_add(1);
          }
          reader->Finish();
        });
      }
      // Every stream has its first event (the job's state) before timing.
      while (open.load() < watchers) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      int64_t events_before = events.load();
      double with = ingest(watched, "ingestion, watchers open", &cpu_with);
      std::printf("  round %d: %d WatchJob streams (%d on ingesting jobs) received %lld events; "
                  "rate ratio %.3f, CPU-per-point ratio %.3f\n",
                  round + 1, watchers, watch_idle_only ? 0 : std::min(watchers, streams),
                  static_cast<long long>(events.load() - events_before), with / alone,
                  cpu_with / cpu_alone);
      rate_ratios.push_back(with / alone);
      cpu_ratios.push_back(cpu_with / cpu_alone);
      for (auto& ctx : contexts) ctx->TryCancel();
      for (auto& t : readers) t.join();
    }
    std::printf("ratio (median of %d rounds): ingestion points/s with %d watchers / without = "
                "%.3f; CPU per point with / without = %.3f\n",
                rounds, watchers, Percentile(rate_ratios, 0.5), Percentile(cpu_ratios, 0.5));
  }
  // --- 4. live ingestion: many workers, small batches -------------------
  if (live_workers > 0) {
    std::vector<v1::AcquireJobResponse> live;
    {
      auto stub = v1::WorkerService::NewStub(channels[0]);
      v1::RegisterWorkerRequest reg;
      reg.set_name("live");
      reg.mutable_resources()->set_slots(live_workers);
      v1::RegisterWorkerResponse reg_resp;
      stub->RegisterWorker(Ctx().get(), reg, &reg_resp);
      for (int i = 0; i < live_workers; ++i) {
        v1::AcquireJobRequest acq;
        acq.set_worker_id("live");
        v1::AcquireJobResponse lease;
        if (!stub->AcquireJob(Ctx().get(), acq, &lease).ok() || !lease.has_job()) {
          std::fprintf(stderr, "no job left for live worker %d\n", i);
          return 1;
        }
        live.push_back(lease);
      }
    }
    const int64_t per_worker = live_points / live_workers;
    std::atomic<int64_t> live_accepted{0}, calls{0};
    std::vector<double> call_ms;
    const char* names[] = {"loss", "lr", "grad_norm", "tokens_per_s"};
    std::vector<std::thread> threads;
    auto start = Clock::now();
    double cpu_start = ProcessCpuSeconds();
    for (int w = 0; w < live_workers; ++w) {
      threads.emplace_back([&, w] {
        auto stub = v1::WorkerService::NewStub(channels[w % channels.size()]);
        std::vector<double> my_ms;
        int64_t sent = 0, step = 1;
        bool first = true;
        while (sent < per_worker) {
          v1::ReportMetricsRequest req;
          req.set_job_id(live[w].job_id());
          req.set_attempt_id(live[w].attempt_id());
          if (first) req.set_resumed_from_step(0);  // the trainer's start
          first = false;
          for (int i = 0; i < live_chunk && sent < per_worker; ++i, ++sent) {
            auto* p = req.add_points();
            p->set_step(step);
            p->set_name(names[i % 4]);
            p->set_value(1.0 / step);
            if (i % 4 == 3) ++step;
          }
          // One call per flush, as worker/metric_relay.cc sends them.
          auto t0 = Clock::now();
          v1::ReportMetricsResponse resp;
          auto ctx = Ctx();
          auto writer = stub->ReportMetrics(ctx.get(), &resp);
          bool ok = writer->Write(req);
          writer->WritesDone();
          grpc::Status st = writer->Finish();
          if (!ok || !st.ok()) {
            std::fprintf(stderr, "live worker %d: %s\n", w, st.error_message().c_str());
            break;
          }
          my_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
          live_accepted.fetch_add(resp.accepted());
          calls.fetch_add(1);
        }
        std::lock_guard<std::mutex> lock(mu);
        call_ms.insert(call_ms.end(), my_ms.begin(), my_ms.end());
      });
    }
    for (auto& t : threads) t.join();
    double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    double cpu = ProcessCpuSeconds() - cpu_start;
    std::printf("live ingestion: %d workers, %lld points in %lld calls of %d in %.2f s = "
                "%.0f points/s (%.0f calls/s)\n",
                live_workers, static_cast<long long>(live_accepted.load()),
                static_cast<long long>(calls.load()), live_chunk, elapsed,
                live_accepted.load() / elapsed, calls.load() / elapsed);
    std::printf("  CPU (client + server, user + sys): %.2f s = %.2f us per point\n", cpu,
                1e6 * cpu / std::max<int64_t>(1, live_accepted.load()));
    std::printf("  ReportMetrics call  p50 %.2f ms  p99 %.2f ms\n", Percentile(call_ms, 0.5),
                Percentile(call_ms, 0.99));
  }
  server.Shutdown();
  scheduler->reset();
  std::filesystem::remove_all(dir);
  return 0;
}
