// Issue 7's end-to-end monitoring check: a real Prometheus (Debian's
// /usr/bin/prometheus) scrapes the real depthbench-scheduler (and a
// depthbench-worker when that binary is built) every second on loopback,
// with dashboards/alerts.yml loaded, while scripted workers drive a small
// sweep through success, failure + retry, a final failure, an expired
// lease, an interruption, divergence, a manual retry and a cancellation.
// Then every PromQL expression of the Grafana dashboards and alert rules
// is evaluated through Prometheus's HTTP API:
//   - every expression must evaluate without error;
//   - every metric it names must be one the daemons export (names table);
//   - it must return data when all its metrics come from daemons this test
//     started. For alert rules the condition is usually (and rightly) false
//     in a healthy run, so the data requirement applies to the rule's
//     signal: each `or` alternative with its top-level comparison removed
//     (`absent(...)` alternatives are empty by design and are only
//     evaluated). Expressions needing a daemon that was not started are
//     listed in the test output, never passed silently.
// A deliberately wrong expression is checked to fail the same check.
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/child_process.h"
#include "common/daemon_metrics.h"
#include "common/free_port.h"
#include "tests/common/promql_refs.h"
#include "tests/integration/metrics_scrape.h"
#include "tests/integration/scheduler_process.h"
#include "tests/integration/worker_client.h"

namespace depthbench::testing {
namespace {

namespace v1 = ::depthbench::v1;
using std::chrono::milliseconds;

constexpr char kPrometheus[] = "/usr/bin/prometheus";
constexpr char kSchedulerJob[] = "depthbench-scheduler";  // as in dashboards/
constexpr char kWorkerJob[] = "depthbench-worker";

// One /metrics endpoint Prometheus scrapes, under the job name the
// dashboards and alerts use for that daemon.
struct ScrapeTarget {
  std::string job;  // kSchedulerJob or kWorkerJob
  int port = 0;
};

int FreePort() { return FreeLoopbackPort().value_or(0); }

std::string UrlEncode(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      char buf[4];
      std::snprintf(buf, sizeof(buf), "%%%02X", c);
      out += buf;
    }
  }
  return out;
}

int ReadPort(const std::string& path) {
  std::ifstream in(path);
  int port = 0;
  in >> port;
  return port;
}

// A daemon (common/child_process.h) with its output appended to a log,
// stopped by Stop() / the destructor: SIGTERM, then SIGKILL after 10 s.
class Daemon {
 public:
  Daemon() = default;
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;
  ~Daemon() { Stop(); }

  bool Start(std::vector<std::string> args, const std::string& log) {
    ChildSpec spec;
    spec.argv = std::move(args);
    spec.parent_death_signal = 0;
    spec.output = ChildSpec::Output::kLogFile;
    spec.log_file = log;
    absl::StatusOr<std::unique_ptr<::depthbench::ChildProcess>> child =
        ::depthbench::ChildProcess::Spawn(spec);
    if (!child.ok()) return false;
    child_ = std::move(*child);
    return true;
  }
  bool Running() { return child_ != nullptr && !child_->Exited(); }
  void Stop() {
    if (child_ != nullptr) child_->Stop(10000);
  }

 private:
  std::unique_ptr<::depthbench::ChildProcess> child_;
};

struct QueryResult {
  absl::Status status;  // transport, HTTP or Prometheus error
  nlohmann::json result = nlohmann::json::array();  // data.result
};

class PrometheusServer {
 public:
  // Writes prometheus.yml (1 s scrape and evaluation interval, `rules_file`
  // as its rule file) into `dir` and starts Prometheus on a free loopback
  // port; true once /-/ready answers 200.
  bool Start(const std::string& dir, const std::vector<ScrapeTarget>& targets,
             const std::string& rules_file) {
    std::set<std::string> jobs;
    for (const ScrapeTarget& t : targets) jobs.insert(t.job);
    std::ofstream config(dir + "/prometheus.yml");
    config << "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
           << "  evaluation_interval: 1s\n"
           << "rule_files:\n  - " << rules_file << "\nscrape_configs:\n";
    for (const std::string& job : jobs) {
      config << "  - job_name: " << job << "\n    static_configs:\n      - targets: [";
      std::vector<std::string> addresses;
      for (const ScrapeTarget& t : targets) {
        if (t.job == job) addresses.push_back(absl::StrCat("\"127.0.0.1:", t.port, "\""));
      }
      config << absl::StrJoin(addresses, ", ") << "]\n";
    }
    config.close();
    for (int attempt = 0; attempt < 3; ++attempt) {  // a free port can be taken
      port_ = FreePort();
      std::filesystem::remove_all(dir + "/tsdb");
      if (!process_.Start({kPrometheus, "--config.file=" + dir + "/prometheus.yml",
                           "--web.listen-address=127.0.0.1:" + std::to_string(port_),
                           "--storage.tsdb.path=" + dir + "/tsdb",
                           "--storage.tsdb.retention.time=1h", "--log.level=warn"},
                          dir + "/prometheus.log")) {
        return false;
      }
      for (int i = 0; i < 600 && process_.Running(); ++i) {  // up to 30 s
        if (HttpGet(port_, "/-/ready", 1000).status == 200) return true;
        std::this_thread::sleep_for(milliseconds(50));
      }
      process_.Stop();
    }
    return false;
  }
  void Stop() { process_.Stop(); }

  // An instant query at the current time.
  QueryResult Query(const std::string& expr) {
    QueryResult out;
    HttpResponse r = HttpGet(port_, "/api/v1/query?query=" + UrlEncode(expr), 10000);
    nlohmann::json body = nlohmann::json::parse(r.body, nullptr, false);
    if (r.status == 0 || body.is_discarded()) {
      out.status = absl::UnavailableError(absl::StrCat("HTTP ", r.status, ": ", r.body));
      return out;
    }
    if (body.value("status", "") != "success") {
      out.status = absl::InvalidArgumentError(absl::StrCat(
          "Prometheus: ", body.value("errorType", "?"), ": ", body.value("error", r.body)));
      return out;
    }
    const nlohmann::json& data = body["data"];
    if (data.value("resultType", "") == "vector" || data.value("resultType", "") == "matrix") {
      out.result = data["result"];
    } else {  // scalar or string: one value
      out.result = nlohmann::json::array({data["result"]});
    }
    return out;
  }

  // The value of a query returning one sample, or NaN.
  double Scalar(const std::string& expr) {
    QueryResult q = Query(expr);
    if (!q.status.ok() || q.result.size() != 1) return std::nan("");
    const nlohmann::json& sample = q.result[0];
    const nlohmann::json& value = sample.is_object() ? sample["value"] : sample;
    return std::stod(value[1].get<std::string>());
  }

 private:
  Daemon process_;
  int port_ = 0;
};

// Which daemon's job a metric name belongs to: "scheduler", "worker", or
// "any" (both export it); empty if no daemon exports it. Prometheus's own
// `up` series belongs to the job its expression selects.
std::string DaemonOf(const std::string& metric, const std::string& expr) {
  if (metric == "up") {
    return expr.find(std::string("job=\"") + kWorkerJob + "\"") != std::string::npos
               ? "worker"
               : "scheduler";
  }
  std::string base = metric;
  for (const char* suffix : {"_bucket", "_sum", "_count"}) {
    const std::string s(suffix);
    if (FindMetricSpec(base) == nullptr && base.size() > s.size() &&
        base.compare(base.size() - s.size(), s.size(), s) == 0) {
      const MetricSpec* spec = FindMetricSpec(base.substr(0, base.size() - s.size()));
      if (spec != nullptr && std::string(spec->type) == "histogram") {
        base = spec->name;
      }
    }
  }
  if (FindMetricSpec(base) == nullptr) return "";
  if (base.rfind("depthbench_scheduler_", 0) == 0) return "scheduler";
  if (base.rfind("depthbench_worker_", 0) == 0) return "worker";
  return "any";
}

// The first index of `expr` outside strings and (), {}, [] at which
// `at(i)` is true (std::string::npos if none); `at` sees every such index in
// order.
size_t FindTopLevel(const std::string& expr, const std::function<bool(size_t)>& at) {
  int depth = 0;
  char quote = 0;
  for (size_t i = 0; i < expr.size(); ++i) {
    char c = expr[i];
    if (quote != 0) {
      if (c == '\\') ++i;
      else if (c == quote) quote = 0;
      continue;
    }
    if (c == '"' || c == '\'' || c == '`') quote = c;
    else if (c == '(' || c == '{' || c == '[') ++depth;
    else if (c == ')' || c == '}' || c == ']') --depth;
    else if (depth == 0 && at(i)) return i;
  }
  return std::string::npos;
}

// Splits `expr` at top-level (outside (), {}, [] and strings) occurrences of
// the binary operator `or`.
std::vector<std::string> SplitTopLevelOr(const std::string& expr) {
  std::vector<std::string> parts;
  size_t start = 0;
  FindTopLevel(expr, [&](size_t i) {
    if (expr.compare(i, 2, "or") == 0 && i > 0 &&
        std::isspace(static_cast<unsigned char>(expr[i - 1])) && i + 2 < expr.size() &&
        std::isspace(static_cast<unsigned char>(expr[i + 2]))) {
      parts.push_back(expr.substr(start, i - start));
      start = i + 2;
    }
    return false;
  });
  parts.push_back(expr.substr(start));
  return parts;
}

std::string Trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\n");
  size_t e = s.find_last_not_of(" \t\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

// `expr` up to its first top-level comparison operator (the whole of it if
// it has none).
std::string StripComparison(const std::string& expr) {
  const size_t op = FindTopLevel(expr, [&](size_t i) {
    const char c = expr[i];
    return c == '>' || c == '<' ||
           ((c == '=' || c == '!') && i + 1 < expr.size() && expr[i + 1] == '=');
  });
  return Trim(op == std::string::npos ? expr : expr.substr(0, op));
}

// The expressions that must return data for `e` to count as "has data":
// `e` itself, or for an alert rule its signals (see the file comment).
std::vector<std::string> DataExpressions(const PromQlExpression& e, const std::string& expr) {
  if (e.source.rfind("alerts.yml", 0) != 0) return {expr};
  std::vector<std::string> out;
  for (const std::string& alternative : SplitTopLevelOr(expr)) {
    std::string a = Trim(alternative);
    if (a.rfind("absent(", 0) == 0 || a.rfind("absent_over_time(", 0) == 0) continue;
    out.push_back(StripComparison(a));
  }
  return out;
}

struct Verdict {
  absl::Status status;          // not OK: the test fails
  bool data_checked = false;    // false: needs a daemon that is not running
  std::vector<std::string> missing_daemons;
};

// Evaluates one dashboard/alert expression against Prometheus; `running`
// holds the daemons ("scheduler", "worker") whose targets are scraped.
Verdict CheckExpression(PrometheusServer& prometheus, const PromQlExpression& e,
                        const std::set<std::string>& running) {
  Verdict v;
  std::string expr = SubstituteGrafanaVariables(e.expr, "1m");
  QueryResult full = prometheus.Query(expr);
  if (!full.status.ok()) {
    v.status = absl::InvalidArgumentError(absl::StrCat(full.status.message(), "\n  expr: ", expr));
    return v;
  }
  std::set<std::string> needed;
  for (const std::string& metric : MetricNamesInExpression(expr)) {
    std::string daemon = DaemonOf(metric, expr);
    if (daemon.empty()) {
      v.status = absl::NotFoundError(absl::StrCat("names metric \"", metric,
                                                  "\", which no depthbench daemon exports"
                                                  "\n  expr: ", expr));
      return v;
    }
    if (daemon != "any") needed.insert(daemon);
  }
  for (const std::string& d : needed) {
    if (running.count(d) == 0) v.missing_daemons.push_back(d);
  }
  if (!v.missing_daemons.empty()) return v;
  v.data_checked = true;
  for (const std::string& data_expr : DataExpressions(e, expr)) {
    QueryResult q = data_expr == expr ? full : prometheus.Query(data_expr);
    if (!q.status.ok()) {
      v.status = absl::InvalidArgumentError(
          absl::StrCat(q.status.message(), "\n  expr: ", data_expr));
      return v;
    }
    if (q.result.empty()) {
      v.status = absl::NotFoundError(absl::StrCat("no data\n  expr: ", data_expr));
      return v;
    }
    if (!e.label_values.empty()) {
      bool has_label = false;
      for (const auto& series : q.result) {
        if (series.contains("metric") && series["metric"].contains(e.label_values)) {
          has_label = true;
        }
      }
      if (!has_label) {
        v.status = absl::NotFoundError(absl::StrCat("no series carries label \"",
                                                    e.label_values, "\"\n  expr: ", data_expr));
        return v;
      }
    }
  }
  return v;
}

v1::SweepSpec SyntheticSpec(const std::string& name, std::vector<double> lrs) {
  v1::SweepSpec spec;
  spec.set_name(name);
  spec.add_architectures("pre_ln");
  for (double lr : lrs) (*spec.mutable_lr_grids())["pre_ln"].add_lrs(lr);
  auto* shape = spec.mutable_shapes()->add_explicit_shapes();
  shape->set_layers(2);
  shape->set_d_model(64);
  spec.mutable_training()->set_steps(10);
  spec.mutable_retry()->set_max_attempts(2);
  spec.mutable_retry()->set_initial_backoff_ms(50);
  spec.mutable_retry()->set_max_backoff_ms(100);
  // Only the scripted workers (and no real worker) run these jobs.
  (*spec.mutable_resources()->mutable_labels())["pool"] = "synthetic";
  return spec;
}

double LrOf(const std::string& config_json) {
  nlohmann::json c = nlohmann::json::parse(config_json, nullptr, false);
  if (c.is_object() && c.contains("lr") && c["lr"].is_number()) return c["lr"].get<double>();
  size_t at = config_json.find("\"lr\":");
  return at == std::string::npos ? 0 : std::atof(config_json.c_str() + at + 5);
}

// Drives a synthetic sweep with scripted workers; returns leases granted
// (defined below the fixture).
int DriveSweep(const std::string& address, const std::string& sweep);

class PrometheusE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kPrometheus)) {
      GTEST_SKIP() << kPrometheus << " is not installed (Debian package `prometheus`)";
    }
    dir_ = MakeTempDir("prometheus_e2e");
  }
  void TearDown() override {
    prometheus_.Stop();
    for (auto& p : extra_daemons_) p->Stop();
    if (scheduler_ != nullptr) scheduler_->Stop(SIGTERM);
  }

  // Prometheus creates its scrape loops a few seconds after it is ready;
  // traffic before the first scrape would only show in counters.
  void WaitUntilScrapingScheduler() {
    bool scraping = false;
    for (int i = 0; i < 300 && !scraping; ++i) {  // up to 30 s
      scraping = prometheus_.Scalar(absl::StrCat("up{job=\"", kSchedulerJob, "\"}")) == 1;
      if (!scraping) std::this_thread::sleep_for(milliseconds(100));
    }
    ASSERT_TRUE(scraping) << "Prometheus never scraped the scheduler; see " << dir_;
  }

  // Waits until Prometheus holds the final counters (`granted` leases) and
  // a few more scrapes (and, with the real worker, its job's series).
  void WaitUntilCaughtUp(int granted) {
    bool caught_up = false;
    for (int i = 0; i < 600 && !caught_up; ++i) {  // up to 60 s
      // >=: a real worker, when started, takes leases of its own sweep too.
      caught_up = prometheus_.Scalar("sum(depthbench_scheduler_leases_granted_total)") >= granted &&
                  prometheus_.Scalar(absl::StrCat("count_over_time(up{job=\"", kSchedulerJob,
                                                  "\"}[10m])")) >= 6;
      if (!caught_up) std::this_thread::sleep_for(milliseconds(100));
    }
    ASSERT_TRUE(caught_up) << "Prometheus did not scrape the scheduler; see " << dir_;
#ifdef DEPTHBENCH_WORKER_BIN
    // The real worker's job: wait until its step and validation series are in.
    bool worker_seen = false;
    for (int i = 0; i < 1200 && !worker_seen; ++i) {  // up to 120 s
      worker_seen = prometheus_.Scalar("count(depthbench_worker_job_validation_loss)") >= 1 &&
                    prometheus_.Scalar("count_over_time(depthbench_worker_job_step[10m])") >= 3;
      if (!worker_seen) std::this_thread::sleep_for(milliseconds(100));
    }
    ASSERT_TRUE(worker_seen) << "the real worker's job never reported; see " << dir_;
#endif
    std::this_thread::sleep_for(milliseconds(3000));  // >= 2 scrapes past the end for rate()
  }

  // Every dashboard and alert expression evaluates without error, and with
  // data where the daemons it needs run.
  void ExpectEveryExpressionEvaluates(const std::vector<PromQlExpression>& expressions) {
    std::vector<std::string> failures, not_checked;
    int with_data = 0;
    for (const PromQlExpression& e : expressions) {
      Verdict v = CheckExpression(prometheus_, e, running_);
      if (!v.status.ok()) {
        failures.push_back(absl::StrCat(e.source, ": ", v.status.message()));
      } else if (!v.data_checked) {
        not_checked.push_back(absl::StrCat(e.source, " (needs ",
                                           absl::StrJoin(v.missing_daemons, ", "), ")"));
      } else {
        ++with_data;
      }
    }
    EXPECT_TRUE(failures.empty()) << failures.size() << " expression(s) failed:\n  "
                                  << absl::StrJoin(failures, "\n  ");
    std::cout << "[prometheus_e2e] " << expressions.size() << " expressions evaluated, "
              << with_data << " with data required and found\n";
    if (!not_checked.empty()) {
      std::cout << "[prometheus_e2e] NOT CHECKED FOR DATA: " << not_checked.size()
                << " expression(s) need a daemon this build does not start"
                << " (evaluated without error only):\n  " << absl::StrJoin(not_checked, "\n  ")
                << "\n";
    }
    RecordProperty("expressions_with_data", with_data);
    RecordProperty("expressions_not_checked_for_data", static_cast<int>(not_checked.size()));
#ifdef DEPTHBENCH_WORKER_BIN
    EXPECT_TRUE(not_checked.empty());
#endif
  }

  // The check itself can fail: a metric nobody exports, a label value that
  // never occurs, and a syntax error.
  void ExpectWrongExpressionsFail() {
    std::set<std::string> all = {"scheduler", "worker"};
    for (const char* wrong :
         {"sum(rate(depthbench_scheduler_no_such_metric_total[1m]))",
          "depthbench_scheduler_jobs{state=\"no_such_state\"}",
          "sum(rate(depthbench_scheduler_rpcs_total[1m])"}) {
      PromQlExpression e{"deliberately wrong", wrong, ""};
      Verdict v = CheckExpression(prometheus_, e, all);
      EXPECT_FALSE(v.status.ok()) << wrong;
    }
  }

  // A sweep submitted and cancelled; the main sweep driven by synthetic
  // workers (DriveSweep), a manual retry of its failed job, driven again.
  // `granted`: the leases granted.
  void RunSweeps(const std::string& address, int* granted) {
    auto sweeps = v1::SweepService::NewStub(
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    v1::SubmitSweepRequest submit;
    v1::SubmitSweepResponse submitted;
    *submit.mutable_spec() = SyntheticSpec("e2e-cancelled", {1e-3});
    ASSERT_TRUE(sweeps->SubmitSweep(Ctx().get(), submit, &submitted).ok());
    v1::CancelSweepRequest cancel;
    cancel.set_name("e2e-cancelled");
    v1::CancelSweepResponse cancelled;
    ASSERT_TRUE(sweeps->CancelSweep(Ctx().get(), cancel, &cancelled).ok());
    *submit.mutable_spec() = SyntheticSpec("e2e", {1e-3, 2e-3, 3e-3, 4e-3});
    ASSERT_TRUE(sweeps->SubmitSweep(Ctx().get(), submit, &submitted).ok());
    *granted = DriveSweep(address, "e2e");
    v1::RetryJobRequest retry;
    retry.set_sweep("e2e");
    v1::RetryJobResponse retried;
    ASSERT_TRUE(sweeps->RetryJob(Ctx().get(), retry, &retried).ok());
    ASSERT_EQ(retried.job_ids_size(), 1);
    *granted += DriveSweep(address, "e2e");
  }

  // Starts depthbench-scheduler with a metrics endpoint and adds it to the
  // scrape targets.
  void StartScheduler() {
    scheduler_ = std::make_unique<SchedulerProcess>(
        dir_ + "/s.db", dir_,
        std::vector<std::string>{"--metrics-listen", "127.0.0.1:0", "--metrics-port-file",
                                 dir_ + "/scheduler_metrics_port", "--lease-ttl-ms", "1000"});
    ASSERT_TRUE(scheduler_->Start());
    int port = ReadPort(dir_ + "/scheduler_metrics_port");
    ASSERT_GT(port, 0);
    targets_.push_back({kSchedulerJob, port});
    running_.insert("scheduler");
  }

#ifdef DEPTHBENCH_WORKER_BIN
  // Starts a real depthbench-worker (with the real trainer) that runs a tiny
  // sweep of its own, labelled pool=real, and adds its metrics endpoint.
  // Not exercised on the branch that wrote this test (no worker binary
  // there); the flags follow worker/main.cc as of that branch.
  void StartWorkerDaemon() {
    int port = FreePort();
    auto worker = std::make_unique<Daemon>();
    std::filesystem::create_directories(dir_ + "/checkpoints");
    ASSERT_TRUE(worker->Start(
        {DEPTHBENCH_WORKER_BIN, "--scheduler", scheduler_->address(), "--name", "e2e-worker",
         "--slots", "1", "--labels", "pool=real", "--checkpoint-root", dir_ + "/checkpoints",
         "--train-binary", DEPTHBENCH_TRAIN_BIN, "--metrics-listen",
         "127.0.0.1:" + std::to_string(port)},
        dir_ + "/worker.log"));
    for (int i = 0; i < 200 && HttpGet(port, "/healthz", 500).status != 200; ++i) {
      std::this_thread::sleep_for(milliseconds(50));
    }
    ASSERT_EQ(HttpGet(port, "/healthz").status, 200) << "see " << dir_ << "/worker.log";
    extra_daemons_.push_back(std::move(worker));
    targets_.push_back({kWorkerJob, port});
    running_.insert("worker");
    auto sweeps = v1::SweepService::NewStub(
        grpc::CreateChannel(scheduler_->address(), grpc::InsecureChannelCredentials()));
    v1::SubmitSweepRequest submit;
    *submit.mutable_spec() = SyntheticSpec("e2e-real", {1e-3});
    (*submit.mutable_spec()->mutable_resources()->mutable_labels())["pool"] = "real";
    // The per-job series exist while the job runs (the worker drops them when
    // it ends), so this job must outlast the test; TearDown stops it.
    auto* training = submit.mutable_spec()->mutable_training();
    training->set_steps(1000000);
    training->set_eval_interval(10);
    training->set_eval_batches(1);
    training->set_seq_len(32);
    training->set_batch(4);
    v1::SubmitSweepResponse resp;
    ASSERT_TRUE(sweeps->SubmitSweep(Ctx().get(), submit, &resp).ok());
  }
#endif

  std::string dir_;
  std::unique_ptr<SchedulerProcess> scheduler_;
  std::vector<std::unique_ptr<Daemon>> extra_daemons_;
  std::vector<ScrapeTarget> targets_;
  std::set<std::string> running_;
  PrometheusServer prometheus_;
};

// Drives the synthetic sweep with scripted workers. Each job's fate follows
// its lr: 1e-3 interrupted once then succeeds (with a re-sent chunk),
// 2e-3 fails on every attempt (retry, then final failure), 3e-3 diverges,
// 4e-3 is abandoned on its first attempt (lease expires) then succeeds.
// Returns leases granted.
int DriveSweep(const std::string& address, const std::string& sweep) {
  auto sweeps = v1::SweepService::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  WorkerClient worker(address, "w1");
  EXPECT_TRUE(worker.Register(4, {{"pool", "synthetic"}}).ok());
  int granted = 0;
  for (int i = 0; i < 600; ++i) {  // up to ~30 s
    v1::GetSweepRequest get;
    get.set_name(sweep);
    v1::Sweep state;
    if (sweeps->GetSweep(Ctx().get(), get, &state).ok() &&
        state.state() != v1::SWEEP_RUNNING) {
      break;
    }
    EXPECT_TRUE(worker.Heartbeat().ok());
    v1::AcquireJobResponse lease;
    grpc::Status s = worker.Acquire(&lease);
    EXPECT_TRUE(s.ok()) << s.error_message();
    if (!s.ok() || !lease.has_job()) {
      std::this_thread::sleep_for(milliseconds(50));
      continue;
    }
    ++granted;
    double lr = LrOf(lease.config_json());
    int attempt = lease.attempt_number();
    if (std::abs(lr - 4e-3) < 1e-12 && attempt == 1) continue;  // abandoned
    EXPECT_TRUE(worker.Report(lease, 1, 5).ok());
    if (std::abs(lr - 1e-3) < 1e-12 && attempt == 1) {
      EXPECT_TRUE(worker.Finish(lease, v1::FINISH_INTERRUPTED).ok());
    } else if (std::abs(lr - 2e-3) < 1e-12) {
      EXPECT_TRUE(worker.Finish(lease, v1::FINISH_FAILED).ok());
    } else if (std::abs(lr - 3e-3) < 1e-12) {
      EXPECT_TRUE(worker.Finish(lease, v1::FINISH_DIVERGED).ok());
    } else {
      EXPECT_TRUE(worker.Report(lease, 4, 10).ok());  // 4, 5 re-sent: duplicates
      EXPECT_TRUE(worker.Finish(lease, v1::FINISH_SUCCEEDED).ok());
    }
  }
  return granted;
}

TEST_F(PrometheusE2eTest, EveryDashboardAndAlertExpressionEvaluatesWithData) {
  auto expressions = ExtractAllExpressions(DEPTHBENCH_SOURCE_DIR "/dashboards");
  ASSERT_TRUE(expressions.ok()) << expressions.status();
  ASSERT_GT(expressions->size(), 20u);

  ASSERT_NO_FATAL_FAILURE(StartScheduler());
#ifdef DEPTHBENCH_WORKER_BIN
  ASSERT_NO_FATAL_FAILURE(StartWorkerDaemon());
#endif
  ASSERT_TRUE(prometheus_.Start(dir_, targets_, DEPTHBENCH_SOURCE_DIR "/dashboards/alerts.yml"))
      << "see " << dir_ << "/prometheus.log";

  ASSERT_NO_FATAL_FAILURE(WaitUntilScrapingScheduler());

  // Traffic: w1 heartbeats throughout; w2 heartbeats until Prometheus has
  // seen both connected, then goes silent (so the gauge drops); a cancelled
  // sweep, the main sweep, a manual retry of its failed job, the sweep again.
  std::string address = scheduler_->address();
  WorkerClient w1(address, "w1");
  ASSERT_TRUE(w1.Register(4, {{"pool", "synthetic"}}).ok());
  std::atomic<bool> stop_heartbeats{false};
  std::thread heartbeats([&] {
    while (!stop_heartbeats.load()) {
      w1.Heartbeat();
      std::this_thread::sleep_for(milliseconds(200));
    }
  });
  struct Joiner {
    std::atomic<bool>* stop;
    std::thread* thread;
    ~Joiner() {
      stop->store(true);
      thread->join();
    }
  } joiner{&stop_heartbeats, &heartbeats};
  WorkerClient quitter(address, "w2");
  ASSERT_TRUE(quitter.Register(1, {{"pool", "synthetic"}}).ok());
  // The real worker daemon, when started, is connected throughout too.
  const int real_workers = running_.count("worker") ? 1 : 0;
  bool both_seen = false;
  for (int i = 0; i < 100 && !both_seen; ++i) {  // up to ~20 s
    ASSERT_TRUE(quitter.Heartbeat().ok());
    both_seen = prometheus_.Scalar("depthbench_scheduler_workers_connected") == 2 + real_workers;
    if (!both_seen) std::this_thread::sleep_for(milliseconds(200));
  }
  ASSERT_TRUE(both_seen) << "workers_connected never reached 2 in Prometheus";
  int granted = 0;
  ASSERT_NO_FATAL_FAILURE(RunSweeps(address, &granted));
  // 1e-3: 2, 2e-3: 2 + 2 after the manual retry, 3e-3: 1, 4e-3: 2.
  ASSERT_EQ(granted, 9);

  ASSERT_NO_FATAL_FAILURE(WaitUntilCaughtUp(granted));
  for (const ScrapeTarget& t : targets_) {
    EXPECT_EQ(prometheus_.Scalar(absl::StrCat("up{job=\"", t.job, "\",instance=\"127.0.0.1:",
                                              t.port, "\"}")),
              1)
        << t.job;
  }
  // A few values, as Prometheus sees them.
  EXPECT_EQ(prometheus_.Scalar("depthbench_scheduler_leases_expired_total"), 1);
  EXPECT_EQ(prometheus_.Scalar("depthbench_scheduler_jobs_finished_total{state=\"failed\"}"), 2);
  EXPECT_EQ(prometheus_.Scalar("depthbench_scheduler_job_retries_total{reason=\"manual\"}"), 1);
  EXPECT_EQ(prometheus_.Scalar(
                "depthbench_scheduler_jobs{sweep=\"e2e-cancelled\",state=\"cancelled\"}"),
            1);
  EXPECT_GE(prometheus_.Scalar("max_over_time(depthbench_scheduler_workers_connected[10m])"), 2);
  EXPECT_EQ(prometheus_.Scalar("depthbench_scheduler_workers_connected"),
            1 + real_workers);  // w2 dropped

  ExpectEveryExpressionEvaluates(*expressions);

  ExpectWrongExpressionsFail();
}

TEST(AlertSignalTest, StripsComparisonsAndSkipsAbsent) {
  PromQlExpression rule{"alerts.yml: g/A", "", ""};
  EXPECT_EQ(DataExpressions(rule, "up{job=\"x\"} == 0 or absent(up{job=\"x\"})"),
            std::vector<std::string>{"up{job=\"x\"}"});
  EXPECT_EQ(DataExpressions(rule, "a{l!=\"v\"} < max_over_time(a[1h])"),
            std::vector<std::string>{"a{l!=\"v\"}"});
  EXPECT_EQ(DataExpressions(rule, "sum(x{state=\"failed\"})\n / clamp_min(sum(y), 1)\n> 0.2"),
            std::vector<std::string>{"sum(x{state=\"failed\"})\n / clamp_min(sum(y), 1)"});
  PromQlExpression panel{"fleet.json: panel 1", "", ""};
  EXPECT_EQ(DataExpressions(panel, "a > 1"), std::vector<std::string>{"a > 1"});
  EXPECT_EQ(DaemonOf("depthbench_scheduler_rpc_duration_seconds_bucket", ""), "scheduler");
  EXPECT_EQ(DaemonOf("depthbench_worker_slots", ""), "worker");
  EXPECT_EQ(DaemonOf("depthbench_build_info", ""), "any");
  EXPECT_EQ(DaemonOf("up", "up{job=\"depthbench-worker\"}"), "worker");
  EXPECT_EQ(DaemonOf("depthbench_nope", ""), "");
}

}  // namespace
}  // namespace depthbench::testing
