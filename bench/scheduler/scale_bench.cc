// The scheduler at a real study's scale (issue 14), one command:
//   scale_bench [--workers 1000] [--active 64] [--seeds 100] [--points 10]
//               [--baseline-rounds 3] [--window-s 4] [--max-seconds 300]
//               [--durability normal|full] [--scheduler PATH]
// Runs the real depthbench-scheduler binary as a child process (so its CPU
// and RSS are its own, read from /proc) over a fresh SQLite file, then:
//   1. registers --workers simulated workers over gRPC; every one of them
//      heartbeats at the interval RegisterWorker returns (the default, 10 s)
//      for the rest of the run, listing the attempt it holds;
//   2. baseline: --baseline-rounds times, submits a 1,000-job sweep
//      (10 designs x 10 shapes x 10 LRs x 1 seed) and lets --active of the
//      workers drain it (AcquireJob, ReportMetrics with --points points,
//      FinishJob, back to back): leases/s with ~1,000 jobs pending;
//   3. submits the 10 x 10 x 10 x --seeds sweep (100,000 jobs) over gRPC
//      and drains it the same way, while a reader calls QueryResults and
//      ListJobs once a second in alternate --window-s windows (on, off,
//      on, ...), so AcquireJob latency with and without the reader comes
//      from the same run under the same load.
// Prints submit time, leases/s (baseline, first 10,000 leases of the big
// sweep = 100,000..90,000 pending, its last 10,000 and overall), AcquireJob,
// FinishJob and Heartbeat p50/p99 (AcquireJob split by reader window),
// QueryResults/ListJobs p50/p99, the scheduler's CPU per lease, its RSS
// (largest sample and VmHWM) and the database size.
// The simulated jobs take no time: --active 64 back-to-back workers ask as
// much of the lease path as 1,000 workers whose jobs last 0.5 s at 2,000
// leases/s.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <grpcpp/grpcpp.h>

#include "depthbench/v1/sweep_service.grpc.pb.h"
#include "depthbench/v1/worker_service.grpc.pb.h"
#include "study_spec.h"

#ifndef DEPTHBENCH_SCHEDULER_BIN
#define DEPTHBENCH_SCHEDULER_BIN "depthbench-scheduler"
#endif

namespace v1 = ::depthbench::v1;
using SteadyClock = std::chrono::steady_clock;

namespace {

double Since(SteadyClock::time_point t0) {
  return std::chrono::duration<double>(SteadyClock::now() - t0).count();
}
double Ms(SteadyClock::time_point t0, SteadyClock::time_point t1) {
  return std::chrono::duration<double, std::milli>(t1 - t0).count();
}

std::unique_ptr<grpc::ClientContext> Ctx(int seconds = 60) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
  return ctx;
}

// Latency samples (ms) gathered from many threads.
class Samples {
 public:
  void Add(double ms) {
    std::lock_guard<std::mutex> lock(mu_);
    v_.push_back(ms);
  }
  void AddAll(const std::vector<double>& ms) {
    std::lock_guard<std::mutex> lock(mu_);
    v_.insert(v_.end(), ms.begin(), ms.end());
  }
  // "p50 X ms  p99 Y ms  (n)"
  std::string Summary() {
    std::lock_guard<std::mutex> lock(mu_);
    if (v_.empty()) return "no samples";
    std::sort(v_.begin(), v_.end());
    char buf[128];
    std::snprintf(buf, sizeof(buf), "p50 %7.2f ms  p99 %7.2f ms  max %7.1f ms  (n=%zu)", At(0.5),
                  At(0.99), v_.back(), v_.size());
    return buf;
  }
  void Clear() {
    std::lock_guard<std::mutex> lock(mu_);
    v_.clear();
  }
  double P(double p) {
    std::lock_guard<std::mutex> lock(mu_);
    std::sort(v_.begin(), v_.end());
    return v_.empty() ? 0 : At(p);
  }

 private:
  double At(double p) const { return v_[std::min(v_.size() - 1, static_cast<size_t>(p * v_.size()))]; }
  std::mutex mu_;
  std::vector<double> v_;
};

// user + system CPU seconds of `pid` (/proc/PID/stat fields 14 and 15).
double ProcessCpuSeconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(in, line);
  size_t close = line.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(line.substr(close + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14 || i == 15) ticks += std::stod(field);
  }
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// A "VmRSS:"-style field of /proc/PID/status in MB.
double StatusMb(pid_t pid, const std::string& key) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) return std::stod(line.substr(key.size())) / 1024.0;
  }
  return 0;
}

double FileMb(const std::string& path) {
  std::error_code ec;
  auto size = std::filesystem::file_size(path, ec);
  return ec ? 0 : static_cast<double>(size) / (1024.0 * 1024.0);
}

// 10 designs x 10 LRs x 10 shapes x seeds jobs.
v1::SweepSpec Spec(const std::string& name, int seeds) {
  return depthbench::bench::StudySpec(name, 10, 10, seeds);
}

// The scheduler as a child process on a loopback port.
class SchedulerChild {
 public:
  bool Start(const std::string& bin, const std::string& dir, const std::string& durability) {
    std::string port_file = dir + "/port";
    std::vector<std::string> args = {bin, "--db", dir + "/scale.db", "--listen", "127.0.0.1:0",
                                     "--port-file", port_file};
    // Only when asked: a scheduler built before --durability existed can
    // then be measured too (--scheduler).
    if (durability != "normal") {
      args.push_back("--durability");
      args.push_back(durability);
    }
    pid_ = fork();
    if (pid_ == 0) {
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      std::string log = dir + "/scheduler.log";
      if (freopen(log.c_str(), "a", stderr) == nullptr) _exit(126);
      if (freopen(log.c_str(), "a", stdout) == nullptr) _exit(126);
      execv(argv[0], argv.data());
      _exit(127);
    }
    for (int i = 0; i < 1000; ++i) {
      std::ifstream in(port_file);
      if (in >> port_ && port_ > 0) return true;
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }
  void Stop() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
  }
  ~SchedulerChild() { Stop(); }
  pid_t pid() const { return pid_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
};

// What one simulated worker holds, for its heartbeats.
struct Held {
  std::mutex mu;
  int64_t job_id = 0;
  int64_t attempt_id = 0;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"scale_bench: the scheduler with a 100,000-job sweep and 1,000 workers"};
  std::string scheduler_bin = DEPTHBENCH_SCHEDULER_BIN, durability = "normal";
  int workers = 1000, active = 64, seeds = 100, points = 10, baseline_rounds = 3;
  double window_s = 2, max_seconds = 300;
  app.add_option("--scheduler", scheduler_bin, "depthbench-scheduler binary")->capture_default_str();
  app.add_option("--workers", workers, "registered, heartbeating workers")->capture_default_str()
      ->check(CLI::Range(1, 100000));
  app.add_option("--active", active, "workers leasing back to back")->capture_default_str()
      ->check(CLI::Range(1, 1000));
  app.add_option("--seeds", seeds, "seeds of the big sweep (x 1,000 jobs)")->capture_default_str()
      ->check(CLI::Range(1, 100));
  app.add_option("--points", points, "metric points reported per job")->capture_default_str()
      ->check(CLI::Range(0, 100000));
  app.add_option("--baseline-rounds", baseline_rounds, "1,000-job sweeps drained first")
      ->capture_default_str()->check(CLI::Range(0, 100));
  app.add_option("--window-s", window_s, "length of each reader-on / reader-off window")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--max-seconds", max_seconds, "stop draining the big sweep after this long")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--durability", durability, "passed to depthbench-scheduler")
      ->capture_default_str()->check(CLI::IsMember({"normal", "full"}));
  CLI11_PARSE(app, argc, argv);
  setvbuf(stdout, nullptr, _IOLBF, 0);
  active = std::min(active, workers);

  std::string dir = std::filesystem::temp_directory_path() /
                    ("depthbench_scale_bench_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  SchedulerChild scheduler;
  if (!scheduler.Start(scheduler_bin, dir, durability)) {
    std::fprintf(stderr, "could not start %s (log: %s/scheduler.log)\n", scheduler_bin.c_str(),
                 dir.c_str());
    return 1;
  }
  pid_t pid = scheduler.pid();
  std::printf("scheduler pid %d on %s, --durability %s, db %s/scale.db\n", pid,
              scheduler.address().c_str(), durability.c_str(), dir.c_str());

  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int i = 0; i < 8; ++i) {
    grpc::ChannelArguments args;
    args.SetInt("grpc.channel_id", i);  // distinct connections
    // An older scheduler answers QueryResults with every run at once.
    args.SetMaxReceiveMessageSize(256 << 20);
    channels.push_back(grpc::CreateCustomChannel(scheduler.address(),
                                                 grpc::InsecureChannelCredentials(), args));
  }
  auto sweeps = v1::SweepService::NewStub(channels[0]);

  // Samplers: the scheduler's RSS every 100 ms for the whole run.
  std::atomic<bool> done{false};
  std::atomic<double> max_rss_mb{0};
  std::thread rss_sampler([&] {
    while (!done.load()) {
      double rss = StatusMb(pid, "VmRSS:");
      if (rss > max_rss_mb.load()) max_rss_mb = rss;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });

  // --- 1. register and heartbeat ----------------------------------------
  std::vector<std::string> names(workers);
  std::vector<Held> held(workers);
  for (int w = 0; w < workers; ++w) names[w] = "scale-w" + std::to_string(w);
  Samples register_ms, heartbeat_ms;
  std::atomic<int64_t> heartbeat_interval_ms{10000};
  {
    auto t0 = SteadyClock::now();
    std::vector<std::thread> threads;
    std::atomic<int> next{0}, failed{0};
    for (int t = 0; t < 16; ++t) {
      threads.emplace_back([&, t] {
        auto stub = v1::WorkerService::NewStub(channels[t % channels.size()]);
        for (int w = next++; w < workers; w = next++) {
          v1::RegisterWorkerRequest req;
          req.set_name(names[w]);
          req.mutable_resources()->set_slots(1);
          v1::RegisterWorkerResponse resp;
          auto s0 = SteadyClock::now();
          if (!stub->RegisterWorker(Ctx().get(), req, &resp).ok()) {
            ++failed;
            continue;
          }
          register_ms.Add(Ms(s0, SteadyClock::now()));
          heartbeat_interval_ms = resp.heartbeat_interval_ms();
        }
      });
    }
    for (auto& t : threads) t.join();
    if (failed > 0) {
      std::fprintf(stderr, "%d registrations failed\n", failed.load());
      return 1;
    }
    std::printf("registered %d workers in %.2f s; Register %s\n", workers, Since(t0),
                register_ms.Summary().c_str());
  }
  std::vector<std::thread> heartbeaters;
  auto hb_start = SteadyClock::now();
  const int hb_threads = 8;
  for (int t = 0; t < hb_threads; ++t) {
    heartbeaters.emplace_back([&, t] {
      auto stub = v1::WorkerService::NewStub(channels[t % channels.size()]);
      double interval = heartbeat_interval_ms.load() / 1000.0;
      // Worker w heartbeats at (w / workers + k) * interval.
      for (int64_t k = 0; !done.load(); ++k) {
        for (int w = t; w < workers && !done.load(); w += hb_threads) {
          double due = (static_cast<double>(w) / workers + k + 1) * interval;
          while (!done.load() && Since(hb_start) < due) {
            std::this_thread::sleep_for(std::chrono::milliseconds(
                std::max<int64_t>(1, std::min<int64_t>(50, (due - Since(hb_start)) * 1000))));
          }
          if (done.load()) break;
          v1::HeartbeatRequest req;
          req.set_worker_id(names[w]);
          {
            std::lock_guard<std::mutex> lock(held[w].mu);
            if (held[w].job_id != 0) {
              auto* r = req.add_running();
              r->set_job_id(held[w].job_id);
              r->set_attempt_id(held[w].attempt_id);
            }
          }
          v1::HeartbeatResponse resp;
          auto s0 = SteadyClock::now();
          if (stub->Heartbeat(Ctx().get(), req, &resp).ok()) {
            heartbeat_ms.Add(Ms(s0, SteadyClock::now()));
          }
        }
      }
    });
  }

  // --- lease loops --------------------------------------------------------
  // Each active worker leases, reports `points` points and finishes, back to
  // back, until its phase says stop or no job is left.
  std::atomic<bool> reader_on{false};
  Samples acquire_on, acquire_off, finish_ms, report_ms;
  auto drain = [&](int64_t expect, std::vector<SteadyClock::time_point>* marks, double limit_s) {
    std::atomic<int64_t> completed{0};
    std::atomic<bool> stop{false};
    std::mutex marks_mu;
    auto t0 = SteadyClock::now();
    std::vector<std::thread> threads;
    for (int w = 0; w < active; ++w) {
      threads.emplace_back([&, w] {
        auto stub = v1::WorkerService::NewStub(channels[w % channels.size()]);
        std::vector<double> on, off, fin, rep;
        while (!stop.load()) {
          v1::AcquireJobRequest acq;
          acq.set_worker_id(names[w]);
          v1::AcquireJobResponse lease;
          bool reading = reader_on.load();
          auto a0 = SteadyClock::now();
          grpc::Status st = stub->AcquireJob(Ctx().get(), acq, &lease);
          auto a1 = SteadyClock::now();
          if (!st.ok()) {
            std::fprintf(stderr, "AcquireJob: %s\n", st.error_message().c_str());
            break;
          }
          (reading ? on : off).push_back(Ms(a0, a1));
          if (!lease.has_job()) break;  // drained
          {
            std::lock_guard<std::mutex> lock(held[w].mu);
            held[w].job_id = lease.job_id();
            held[w].attempt_id = lease.attempt_id();
          }
          if (points > 0) {
            v1::ReportMetricsResponse resp;
            auto ctx = Ctx();
            auto r0 = SteadyClock::now();
            auto writer = stub->ReportMetrics(ctx.get(), &resp);
            v1::ReportMetricsRequest req;
            req.set_job_id(lease.job_id());
            req.set_attempt_id(lease.attempt_id());
            for (int p = 1; p <= points; ++p) {
              auto* point = req.add_points();
              point->set_step(p);
              point->set_name("loss");
              point->set_value(4.0 - 0.01 * p);
            }
            writer->Write(req);
            writer->WritesDone();
            st = writer->Finish();
            if (!st.ok()) {
              std::fprintf(stderr, "ReportMetrics: %s\n", st.error_message().c_str());
              break;
            }
            rep.push_back(Ms(r0, SteadyClock::now()));
          }
          v1::FinishJobRequest fin_req;
          fin_req.set_job_id(lease.job_id());
          fin_req.set_attempt_id(lease.attempt_id());
          fin_req.set_status(v1::FINISH_SUCCEEDED);
          fin_req.set_has_val_loss(true);
          fin_req.set_final_val_loss(3.0 + 0.001 * (lease.job_id() % 97));
          fin_req.set_final_step(100);
          v1::FinishJobResponse fin_resp;
          auto f0 = SteadyClock::now();
          st = stub->FinishJob(Ctx().get(), fin_req, &fin_resp);
          if (!st.ok()) {
            std::fprintf(stderr, "FinishJob: %s\n", st.error_message().c_str());
            break;
          }
          fin.push_back(Ms(f0, SteadyClock::now()));
          {
            std::lock_guard<std::mutex> lock(held[w].mu);
            held[w].job_id = held[w].attempt_id = 0;
          }
          int64_t n = ++completed;
          if (marks != nullptr && n % 1000 == 0) {
            std::lock_guard<std::mutex> lock(marks_mu);
            if (static_cast<int64_t>(marks->size()) <= n / 1000) marks->resize(n / 1000 + 1);
            (*marks)[n / 1000] = SteadyClock::now();
          }
          if (n >= expect || Since(t0) > limit_s) stop = true;
        }
        acquire_on.AddAll(on);
        acquire_off.AddAll(off);
        finish_ms.AddAll(fin);
        report_ms.AddAll(rep);
      });
    }
    if (marks != nullptr) {
      marks->resize(1);
      (*marks)[0] = t0;
    }
    for (auto& t : threads) t.join();
    return std::make_pair(completed.load(), Since(t0));
  };

  // --- 2. baseline: ~1,000 pending ----------------------------------------
  // Run before the big sweep (small database) and again after it has
  // drained (the big sweep's 100,000 finished jobs in the file), so the
  // comparison brackets both the machine's drift and the database's growth.
  int baseline_sweeps = 0;
  auto baseline = [&](const char* label) -> double {
    int64_t leases = 0;
    double seconds = 0;
    for (int r = 0; r < baseline_rounds; ++r) {
      v1::SubmitSweepRequest req;
      *req.mutable_spec() = Spec("baseline" + std::to_string(baseline_sweeps++), 1);
      v1::SubmitSweepResponse resp;
      grpc::Status st = sweeps->SubmitSweep(Ctx().get(), req, &resp);
      if (!st.ok()) {
        std::fprintf(stderr, "submit baseline: %s\n", st.error_message().c_str());
        return 0;
      }
      // Stop at 1,000 - active: the last leases starve the workers.
      auto [n, s] = drain(resp.sweep().total_jobs() - active, nullptr, max_seconds);
      leases += n;
      seconds += s;
      // Drain the rest so the next round starts from 1,000 again.
      drain(1 << 30, nullptr, max_seconds);
    }
    if (baseline_rounds == 0 || seconds <= 0) return 0;
    std::printf("baseline %s (1,000-job sweeps, %d rounds): %lld leases in %.2f s = %.0f leases/s\n",
                label, baseline_rounds, static_cast<long long>(leases), seconds, leases / seconds);
    std::printf("  AcquireJob: %s\n", acquire_off.Summary().c_str());
    for (Samples* s : {&acquire_off, &acquire_on, &finish_ms, &report_ms}) s->Clear();
    return leases / seconds;
  };
  double baseline_before = baseline("before");

  // --- 3. the big sweep ----------------------------------------------------
  int64_t total = 0;
  {
    v1::SubmitSweepRequest req;
    *req.mutable_spec() = Spec("scale", seeds);
    v1::SubmitSweepResponse resp;
    auto t0 = SteadyClock::now();
    grpc::Status st = sweeps->SubmitSweep(Ctx(600).get(), req, &resp);
    if (!st.ok()) {
      std::fprintf(stderr, "submit: %s\n", st.error_message().c_str());
      return 1;
    }
    total = resp.sweep().total_jobs();
    std::printf("submit: %lld jobs in %.2f s over gRPC; scheduler RSS now %.0f MB\n",
                static_cast<long long>(total), Since(t0), StatusMb(pid, "VmRSS:"));
  }
  Samples query_ms, list_ms;
  std::atomic<int64_t> query_errors{0};
  std::atomic<bool> stop_reader{false};
  std::thread reader([&] {
    auto t0 = SteadyClock::now();
    while (!stop_reader.load()) {
      bool on = static_cast<int64_t>(Since(t0) / window_s) % 2 == 0;
      reader_on = on;
      if (on) {
        v1::QueryResultsRequest q;
        q.set_sweep("scale");
        v1::QueryResultsResponse results;
        auto q0 = SteadyClock::now();
        if (sweeps->QueryResults(Ctx().get(), q, &results).ok() && results.rows_size() == 1000 / 10) {
          query_ms.Add(Ms(q0, SteadyClock::now()));
        } else {
          ++query_errors;
        }
        v1::ListJobsRequest l;
        l.set_sweep("scale");
        l.set_page_size(100);
        v1::ListJobsResponse jobs;
        auto l0 = SteadyClock::now();
        if (sweeps->ListJobs(Ctx().get(), l, &jobs).ok()) {
          list_ms.Add(Ms(l0, SteadyClock::now()));
        } else {
          ++query_errors;
        }
      }
      // Once a second, aligned so the windows stay whole.
      std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    }
  });
  double cpu0 = ProcessCpuSeconds(pid), bench_cpu0 = ProcessCpuSeconds(getpid());
  std::vector<SteadyClock::time_point> marks;
  auto [leases, seconds] = drain(total, &marks, max_seconds);
  double cpu = ProcessCpuSeconds(pid) - cpu0;
  double bench_cpu = ProcessCpuSeconds(getpid()) - bench_cpu0;
  auto rate = [&](int64_t from_k, int64_t to_k) {
    if (to_k >= static_cast<int64_t>(marks.size()) || from_k < 0 || to_k <= from_k) return 0.0;
    return (to_k - from_k) * 1000.0 /
           std::chrono::duration<double>(marks[to_k] - marks[from_k]).count();
  };
  int64_t k_done = static_cast<int64_t>(marks.size()) - 1;
  double first_rate = rate(0, std::min<int64_t>(10, k_done));
  double last_rate = rate(std::max<int64_t>(0, k_done - 10), k_done);
  std::printf("big sweep: %lld of %lld leases completed in %.1f s = %.0f leases/s (%d active of %d "
              "workers, %d points each)\n",
              static_cast<long long>(leases), static_cast<long long>(total), seconds,
              leases / seconds, active, workers, points);
  int64_t first_k = std::min<int64_t>(10, k_done);
  std::printf("  leases/s, first %lld (%lld..%lld pending): %.0f\n",
              static_cast<long long>(first_k * 1000), static_cast<long long>(total),
              static_cast<long long>(total - first_k * 1000), first_rate);
  std::printf("  leases/s, last %lld completed (%lld..%lld pending): %.0f\n",
              static_cast<long long>(first_k * 1000),
              static_cast<long long>(total - (k_done - first_k) * 1000),
              static_cast<long long>(total - k_done * 1000), last_rate);
  if (baseline_before > 0) {
    std::printf("  ratio first %lld / baseline before (1,000 pending): %.2f\n",
                static_cast<long long>(first_k * 1000), first_rate / baseline_before);
  }
  std::printf("  scheduler CPU: %.1f s = %.3f ms per lease; this bench's clients: %.3f ms per lease\n",
              cpu, 1000 * cpu / std::max<int64_t>(1, leases),
              1000 * bench_cpu / std::max<int64_t>(1, leases));
  std::printf("  AcquireJob, reader off: %s\n", acquire_off.Summary().c_str());
  std::printf("  AcquireJob, reader on:  %s\n", acquire_on.Summary().c_str());
  if (acquire_off.P(0.99) > 0) {
    std::printf("  AcquireJob p99 on / off: %.2f\n", acquire_on.P(0.99) / acquire_off.P(0.99));
  }
  std::printf("  ReportMetrics:          %s\n", report_ms.Summary().c_str());
  std::printf("  FinishJob:              %s\n", finish_ms.Summary().c_str());
  std::printf("  Heartbeat:              %s\n", heartbeat_ms.Summary().c_str());
  std::printf("  QueryResults (100 rows + 100 runs): %s\n", query_ms.Summary().c_str());
  std::printf("  ListJobs (100 jobs):    %s\n", list_ms.Summary().c_str());
  if (query_errors > 0) std::printf("  reader errors: %lld\n", static_cast<long long>(query_errors.load()));

  stop_reader = true;
  reader.join();
  reader_on = false;
  for (Samples* s : {&acquire_off, &acquire_on, &finish_ms, &report_ms}) s->Clear();
  double baseline_after = baseline("after");
  if (baseline_after > 0) {
    std::printf("  ratio first %lld of the big sweep / baseline after: %.2f; / mean of both "
                "baselines: %.2f\n",
                static_cast<long long>(first_k * 1000), first_rate / baseline_after,
                2 * first_rate / (baseline_before + baseline_after));
  }
  done = true;
  for (auto& t : heartbeaters) t.join();
  rss_sampler.join();
  // QueryResults once more, on whatever the sweep reached.
  {
    v1::QueryResultsRequest q;
    q.set_sweep("scale");
    q.set_page_size(1000);
    v1::QueryResultsResponse results;
    auto q0 = SteadyClock::now();
    grpc::Status st = sweeps->QueryResults(Ctx().get(), q, &results);
    int complete = 0;
    for (const auto& row : results.rows()) complete += row.complete() ? 1 : 0;
    std::printf("final QueryResults: %s, %d rows (%d complete), %d runs on the page, %.1f ms\n",
                st.ok() ? "ok" : st.error_message().c_str(), results.rows_size(), complete,
                results.runs_size(), Ms(q0, SteadyClock::now()));
  }
  std::printf("scheduler RSS: largest sample %.0f MB, VmHWM %.0f MB\n", max_rss_mb.load(),
              StatusMb(pid, "VmHWM:"));
  std::string db = dir + "/scale.db";
  std::printf("database: %.1f MB (+ WAL %.1f MB)\n", FileMb(db), FileMb(db + "-wal"));
  scheduler.Stop();
  std::filesystem::remove_all(dir);
  return 0;
}
