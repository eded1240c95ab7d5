// Causal + permutation (+ pruning, free with causal) on a random small model:
// layer-forward count and wall time of the prefix-reusing passes vs the naive
// form (a full forward from the embedding per skipped block / swapped pair),
// measured in the same run on the same model and tokens, and checked to give
// identical matrices.
//
//   diagnostics_bench [--layers 16] [--d-model 64] [--heads 4]
//                     [--sequences 8] [--seq-len 64] [--repeats 5]
//                     [--glibc-default-malloc]
//
// By default the bench pins glibc malloc's mmap and trim thresholds
// (common/malloc_tuning.h, as depthbench-train does) for both forms: with its dynamic defaults, the ~100 KB-1 MB
// activations of a small model on CPU are mmapped / trimmed and re-faulted
// over and over, and the prefix-reusing form, which keeps its snapshots
// alive, was measured slower than the naive one for that reason alone (sys
// time, not arithmetic). --glibc-default-malloc measures that case.
#include <torch/torch.h>

#include "common/malloc_tuning.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <iostream>

#include <CLI/CLI.hpp>

#include "trainer_core/diagnostics/run.h"
#include "trainer_core/model/model.h"

namespace depthbench::diagnostics {
namespace {

bool SameMatrix(const Matrix& a, const Matrix& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    for (size_t j = 0; j < a[i].size(); ++j) {
      const bool both_nan = std::isnan(a[i][j]) && std::isnan(b[i][j]);
      if (!both_nan && a[i][j] != b[i][j]) return false;
    }
  }
  return true;
}

struct Timed {
  RunReport report;
  double seconds = 1e300;      // wall, best of the repeats
  double cpu_seconds = 1e300;  // process CPU time, best of the repeats
  double causal_seconds = 1e300;  // wall of the causal pass, best
  double perm_seconds = 1e300;    // wall of the permutation pass, best
};

int Main(int argc, char** argv) {
  int64_t layers = 16, d_model = 64, heads = 4, sequences = 8, seq_len = 64, repeats = 5;
  bool default_malloc = false;
  CLI::App app{"diagnostics_bench: prefix reuse vs naive causal + permutation passes"};
  app.add_option("--layers", layers);
  app.add_option("--d-model", d_model);
  app.add_option("--heads", heads);
  app.add_option("--sequences", sequences);
  app.add_option("--seq-len", seq_len);
  app.add_option("--repeats", repeats);
  app.add_flag("--glibc-default-malloc", default_malloc, "keep glibc's dynamic mmap/trim thresholds");
  CLI11_PARSE(app, argc, argv);
  if (!default_malloc) PinMallocThresholds();

  torch::manual_seed(0);
  ModelOptions options;
  options.arch = Arch::kPreLn;
  options.design.shape = MakeShape(layers, d_model, 256, FfnRule::kSwiGlu83, heads, heads);
  options.design.max_seq_len = seq_len;
  auto model = BuildModel(options);
  if (!model.ok()) {
    std::cerr << model.status() << "\n";
    return 1;
  }
  torch::Tensor tokens = torch::randint(0, 256, {sequences, seq_len + 1}, torch::kInt64);

  // One run of each form per repeat, alternating, so both see the same
  // machine load; CPU time is reported too (less sensitive to other load on
  // a shared machine than wall time).
  auto run_once = [&](bool reuse, Timed& best) {
    RunOptions run;
    run.kinds = {"causal", "permutation"};
    run.micro_batch = sequences;
    run.reuse_prefix = reuse;
    const std::clock_t cpu_start = std::clock();
    const auto start = std::chrono::steady_clock::now();
    auto report = RunDiagnostics(**model, tokens, run);
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double cpu = static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC;
    if (!report.ok()) {
      std::cerr << report.status() << "\n";
      std::exit(1);
    }
    best.seconds = std::min(best.seconds, s);
    best.cpu_seconds = std::min(best.cpu_seconds, cpu);
    best.causal_seconds = std::min(best.causal_seconds, report->skip_seconds);
    best.perm_seconds = std::min(best.perm_seconds, report->permutation_seconds);
    best.report = std::move(*report);
  };
  Timed naive, reuse;
  for (int64_t r = 0; r < repeats; ++r) {
    run_once(false, naive);
    run_once(true, reuse);
  }

  const bool same = SameMatrix(naive.report.causal, reuse.report.causal) &&
                    SameMatrix(naive.report.permutation, reuse.report.permutation);
  std::printf("model: pre_ln L=%ld d=%ld heads=%ld, %ld sequences x %ld tokens, threads=%d, best of %ld, malloc %s\n",
              static_cast<long>(layers), static_cast<long>(d_model), static_cast<long>(heads),
              static_cast<long>(sequences), static_cast<long>(seq_len), at::get_num_threads(),
              static_cast<long>(repeats), default_malloc ? "glibc default" : "pinned thresholds");
  std::printf("%-10s %10s %10s %10s %10s %10s %10s %10s\n", "form", "causal_lf", "perm_lf",
              "total_lf", "causal_s", "perm_s", "wall_s", "cpu_s");
  auto row = [](const char* name, const Timed& t) {
    const RunReport& r = t.report;
    std::printf("%-10s %10ld %10ld %10ld %10.3f %10.3f %10.3f %10.3f\n", name,
                static_cast<long>(r.skip_layer_forwards),
                static_cast<long>(r.permutation_layer_forwards),
                static_cast<long>(r.base_layer_forwards + r.skip_layer_forwards +
                                  r.permutation_layer_forwards),
                t.causal_seconds, t.perm_seconds, t.seconds, t.cpu_seconds);
  };
  row("naive", naive);
  row("reuse", reuse);
  const auto total = [](const RunReport& r) {
    return static_cast<double>(r.base_layer_forwards + r.skip_layer_forwards +
                               r.permutation_layer_forwards);
  };
  std::printf("ratio naive/reuse: layer-forwards causal %.2fx, permutation %.2fx, total %.2fx; "
              "wall %.2fx, cpu %.2fx\n",
              static_cast<double>(naive.report.skip_layer_forwards) /
                  reuse.report.skip_layer_forwards,
              static_cast<double>(naive.report.permutation_layer_forwards) /
                  reuse.report.permutation_layer_forwards,
              total(naive.report) / total(reuse.report), naive.seconds / reuse.seconds,
              naive.cpu_seconds / reuse.cpu_seconds);
  std::printf("matrices identical: %s\n", same ? "yes" : "NO");
  return same ? 0 : 1;
}

}  // namespace
}  // namespace depthbench::diagnostics

int main(int argc, char** argv) { return depthbench::diagnostics::Main(argc, argv); }
