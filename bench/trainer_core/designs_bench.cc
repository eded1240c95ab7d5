// Benchmark of the ten residual designs (issue 3): forward+backward tokens/s
// and peak memory at one small shape, each relative to Pre-LN in the same
// run, next to the ratio of training FLOPs (trainer_core/flops.h, the
// `depthbench-train flops` tool: Pre-LN's over the design's). Issue 18's goal
// for the multi-stream designs: tokens/s relative to Pre-LN within 15% of
// that FLOP ratio (the last column, speed ratio / FLOP ratio, >= 0.85).
// Each step is a forward and backward as depthbench-train runs it: at 2..8
// threads dividing the batch, one single-threaded micro-batch per thread
// (trainer_core/micro_batch.h); DEPTHBENCH_CPU_MICROBATCH=off measures one
// backward of the whole batch on all threads, as before 2026-12-03.
//
// Throughput: the designs are alternated round-robin (rounds x steps each) so
// drift on a shared machine hits all of them alike, each round starting with
// the next design (--order fixed: Pre-LN first in every round); the figure is
// the median over rounds. 11 rounds by default: with 5, the median of one design's
// ratio moved by up to 0.08 between back-to-back runs on this 2-core machine
// (whose speed changes from minute to minute); the rounds are short (a
// whole run takes under a minute). Peak memory: the binary re-runs itself once per design
// (--memory_of=<arch>); the child reports its peak RSS (getrusage
// ru_maxrss) minus its RSS after building the model and one batch, i.e. the
// activations and gradients of one forward+backward.
//
//   designs_bench [--layers 8] [--d 128] [--heads 4] [--seq 128] [--batch 8]
//                 [--threads 2] [--rounds 11] [--steps 3]
//                 [--archs pre_ln,hc,mhc,attnres_full] [--no-memory]
//                 [--clock wall|cpu] [--order rotate|fixed] [--trace PREFIX]
//                 [--hc-form paper|code] [--round-log FILE]
// (--archs: a subset, Pre-LN always included; --no-memory: skip the
// peak-memory children; --clock cpu: tokens per second of process CPU time
// instead of wall time, steadier on a machine shared with other jobs; use it
// with --threads 1, as idle OpenMP threads spin and count as CPU time;
// --trace PREFIX: after the timed rounds, --steps more steps of each design under
// LibTorch's profiler, written as a Chrome trace to PREFIX<design>.json, to
// see which ops a design's extra time goes to; --hc-form code: HC in the
// authors' code form, H'_s = H_s + b_s F(x), as `depthbench-train --hc-form
// code`, to see what the paper form's residual mix A_r^T H costs;
// --round-log FILE: one line per timed round, "<design> <start> <end>" in
// CLOCK_MONOTONIC seconds, so samples of `perf record -k CLOCK_MONOTONIC`
// can be split by design within one run (bench/trainer_core/
// profile_rounds.sh). A bad flag or value is an error naming the flag.)
#include <sys/resource.h>
#include <time.h>
#include <torch/csrc/autograd/profiler_legacy.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "common/malloc_tuning.h"
#include "trainer_core/arch.h"
#include "trainer_core/flops.h"
#include "trainer_core/micro_batch.h"
#include "trainer_core/model/model.h"
#include "trainer_core/shapes.h"

namespace depthbench {
namespace {

struct Config {
  int64_t layers = 8, d = 128, heads = 4, seq = 128, batch = 8, threads = 2;
  int rounds = 11, steps = 3;
  std::string archs;  // comma-separated subset; empty: all
  bool memory = true;
  bool cpu_clock = false;
  bool rotate = true;  // --order fixed: Pre-LN first in every round
  std::string trace_prefix;  // --trace: Chrome traces of one step per design
  std::string round_log;     // --round-log: each timed round's design and span
  bool hc_code_form = false;  // --hc-form code
};

// CLOCK_MONOTONIC in seconds: perf's clock under `perf record -k
// CLOCK_MONOTONIC`, so --round-log's spans line up with its samples.
double MonotonicSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Seconds of wall time, or of this process's CPU time with --clock cpu.
double Now(bool cpu) {
  if (cpu) {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double RssKb() {
  std::ifstream f("/proc/self/statm");
  long pages = 0, resident = 0;
  f >> pages >> resident;
  return resident * (sysconf(_SC_PAGESIZE) / 1024.0);
}

double PeakKb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss);
}

LanguageModel Build(Arch arch, const Config& c) {
  ModelOptions o;
  o.arch = arch;
  o.design.shape = MakeShape(c.layers, c.d, 256, FfnRule::kSwiGlu83, c.heads, c.heads);
  o.design.max_seq_len = c.seq;
  o.design.hc_code_form = c.hc_code_form;
  torch::manual_seed(0);
  auto m = BuildModel(o);
  if (!m.ok()) {
    std::fprintf(stderr, "%s\n", m.status().ToString().c_str());
    std::exit(1);
  }
  return *m;
}

// One forward and backward as depthbench-train runs it: as one micro-batch
// per thread where the trainer splits (trainer_core/micro_batch.h; off with
// DEPTHBENCH_CPU_MICROBATCH=off), else one backward of the whole batch.
void Step(LanguageModel& m, const torch::Tensor& in, const torch::Tensor& tgt) {
  LossAndGradients(m, in, tgt, CpuMicroBatches(m, at::get_num_threads(), in.size(0)));
}

int MemoryChild(Arch arch, const Config& c) {
  torch::set_num_threads(c.threads);
  LanguageModel m = Build(arch, c);
  torch::Tensor tok = torch::randint(0, 256, {c.batch, c.seq + 1}, torch::kLong);
  torch::Tensor in = tok.narrow(1, 0, c.seq), tgt = tok.narrow(1, 1, c.seq);
  const double base = RssKb();
  Step(m, in, tgt);
  Step(m, in, tgt);
  std::printf("%.0f\n", PeakKb() - base);
  return 0;
}

int Main(int argc, char** argv) {
  PinMallocThresholds();  // as depthbench-train does (common/malloc_tuning.h)
  Config c;
  std::string memory_of;
  std::string bad;  // the first bad flag's message
  for (int i = 1; i < argc && bad.empty(); ++i) {
    std::string a = argv[i];
    // The flag's value; a flag last on the line, without one, is an error.
    auto text = [&]() -> std::string {
      if (i + 1 >= argc) {
        bad = a + " needs a value";
        return "";
      }
      return argv[++i];
    };
    // A positive whole number (the sizes, threads, rounds and steps).
    auto next = [&]() -> int64_t {
      const std::string v = text();
      char* end = nullptr;
      const long long n = std::strtoll(v.c_str(), &end, 10);
      if (bad.empty() && (v.empty() || *end != '\0' || n < 1)) {
        bad = a + " needs a positive whole number, not '" + v + "'";
      }
      return n;
    };
    // The flag's value if it is `yes` or `no` (the two choices it has).
    auto choice = [&](const char* yes, const char* no) -> bool {
      const std::string v = text();
      if (bad.empty() && v != yes && v != no) {
        bad = a + " must be " + yes + " or " + no + ", not '" + v + "'";
      }
      return v == yes;
    };
    if (a == "--layers") c.layers = next();
    else if (a == "--d") c.d = next();
    else if (a == "--heads") c.heads = next();
    else if (a == "--seq") c.seq = next();
    else if (a == "--batch") c.batch = next();
    else if (a == "--threads") c.threads = next();
    else if (a == "--rounds") c.rounds = static_cast<int>(next());
    else if (a == "--steps") c.steps = static_cast<int>(next());
    else if (a == "--archs") c.archs = text();
    else if (a == "--no-memory") c.memory = false;
    else if (a == "--order") c.rotate = choice("rotate", "fixed");
    else if (a == "--clock") c.cpu_clock = choice("cpu", "wall");
    else if (a == "--trace") c.trace_prefix = text();
    else if (a == "--round-log") c.round_log = text();
    else if (a == "--hc-form") c.hc_code_form = choice("code", "paper");
    else if (a.rfind("--memory_of=", 0) == 0) memory_of = a.substr(12);
    else bad = "unknown argument '" + a + "'";
  }
  if (!bad.empty()) {
    std::fprintf(stderr, "designs_bench: %s (the flags are listed at the top of "
                         "bench/trainer_core/designs_bench.cc)\n", bad.c_str());
    return 2;
  }
  if (!memory_of.empty()) return MemoryChild(*ParseArch(memory_of), c);

  torch::set_num_threads(c.threads);
  std::vector<Arch> archs;
  if (c.archs.empty()) {
    archs = AllArchs();
  } else {
    archs.push_back(Arch::kPreLn);
    std::string rest = c.archs + ",";
    for (size_t pos = rest.find(','); pos != std::string::npos; pos = rest.find(',')) {
      const std::string name = rest.substr(0, pos);
      rest = rest.substr(pos + 1);
      if (name.empty() || name == "pre_ln") continue;
      auto a = ParseArch(name);
      if (!a.ok()) {
        std::fprintf(stderr, "--archs: %s\n", a.status().ToString().c_str());
        return 2;
      }
      archs.push_back(*a);
    }
  }
  std::FILE* round_log = nullptr;
  if (!c.round_log.empty()) {
    round_log = std::fopen(c.round_log.c_str(), "w");
    if (round_log == nullptr) {
      std::fprintf(stderr, "--round-log: cannot write %s\n", c.round_log.c_str());
      return 2;
    }
  }
  std::vector<LanguageModel> models;
  for (Arch a : archs) models.push_back(Build(a, c));
  torch::Tensor tok = torch::randint(0, 256, {c.batch, c.seq + 1}, torch::kLong);
  torch::Tensor in = tok.narrow(1, 0, c.seq), tgt = tok.narrow(1, 1, c.seq);
  for (auto& m : models) Step(m, in, tgt);  // warm-up
  std::map<Arch, std::vector<double>> tps;
  for (int r = 0; r < c.rounds; ++r) {
    for (size_t k = 0; k < archs.size(); ++k) {
      const size_t i = (k + (c.rotate ? r : 0)) % archs.size();
      const double m0 = MonotonicSeconds();
      const double t0 = Now(c.cpu_clock);
      for (int s = 0; s < c.steps; ++s) Step(models[i], in, tgt);
      const double sec = Now(c.cpu_clock) - t0;
      if (round_log != nullptr) {
        std::fprintf(round_log, "%s %.6f %.6f\n", std::string(ArchName(archs[i])).c_str(), m0,
                     MonotonicSeconds());
      }
      tps[archs[i]].push_back(c.batch * c.seq * c.steps / sec);
    }
  }
  if (round_log != nullptr) std::fclose(round_log);
  if (!c.trace_prefix.empty()) {
    for (size_t i = 0; i < archs.size(); ++i) {
      torch::autograd::profiler::RecordProfile trace(c.trace_prefix +
                                                     std::string(ArchName(archs[i])) + ".json");
      for (int s = 0; s < c.steps; ++s) Step(models[i], in, tgt);
    }
  }
  std::map<Arch, double> mem;
  for (Arch a : archs) {
    if (!c.memory) {
      mem[a] = 0;
      continue;
    }
    const std::string cmd = std::string(argv[0]) + " --memory_of=" + std::string(ArchName(a)) +
                            " --layers " + std::to_string(c.layers) + " --d " + std::to_string(c.d) +
                            " --heads " + std::to_string(c.heads) + " --seq " + std::to_string(c.seq) +
                            " --batch " + std::to_string(c.batch) + " --threads " +
                            std::to_string(c.threads) +
                            " --hc-form " + (c.hc_code_form ? "code" : "paper");
    FILE* p = popen(cmd.c_str(), "r");
    double kb = 0;
    if (p == nullptr || std::fscanf(p, "%lf", &kb) != 1) kb = -1;
    if (p != nullptr) pclose(p);
    mem[a] = kb;
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  // Per-round ratio to Pre-LN (same round): its median and spread.
  std::map<Arch, std::vector<double>> round_ratio;
  for (Arch a : archs) {
    for (int r = 0; r < c.rounds; ++r) round_ratio[a].push_back(tps[a][r] / tps[Arch::kPreLn][r]);
  }
  const ModelShape shape = MakeShape(c.layers, c.d, 256, FfnRule::kSwiGlu83, c.heads, c.heads);
  const double base_flops = ForwardFlops(Arch::kPreLn, shape, c.seq).total_all_positions;
  const double base_mem = mem[Arch::kPreLn];
  std::printf("shape L=%ld d=%ld heads=%ld T=%ld B=%ld threads=%ld; median of %d rounds x %d steps; %s\n",
              static_cast<long>(c.layers), static_cast<long>(c.d), static_cast<long>(c.heads),
              static_cast<long>(c.seq), static_cast<long>(c.batch), static_cast<long>(c.threads),
              c.rounds, c.steps, c.cpu_clock ? "tokens per CPU-second" : "tokens per wall second");
  if (c.hc_code_form) std::printf("HC in the authors' code form (--hc-form code)\n");
  std::printf(
      "| design | params | tokens/s (fwd+bwd) | vs Pre-LN (median, range over rounds) | "
      "FLOP ratio (Pre-LN / design) | speed / FLOP ratio | peak memory (MiB) | vs Pre-LN |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (size_t i = 0; i < archs.size(); ++i) {
    const double t = median(tps[archs[i]]);
    const std::vector<double>& rr = round_ratio[archs[i]];
    const double ratio = median(rr);
    const double flop_ratio = base_flops / ForwardFlops(archs[i], shape, c.seq).total_all_positions;
    std::printf("| %s | %ld | %.0f | %.2f (%.2f-%.2f) | %.3f | %.2f%s | %.1f | %.2f |\n",
                std::string(ArchName(archs[i])).c_str(),
                static_cast<long>(models[i]->ParameterCount()), t, ratio,
                *std::min_element(rr.begin(), rr.end()), *std::max_element(rr.begin(), rr.end()),
                flop_ratio, ratio / flop_ratio, ratio / flop_ratio >= 0.85 ? "" : " (< 0.85)",
                mem[archs[i]] / 1024.0, base_mem > 0 ? mem[archs[i]] / base_mem : 0.0);
  }
  return 0;
}

}  // namespace
}  // namespace depthbench

int main(int argc, char** argv) { return depthbench::Main(argc, argv); }
