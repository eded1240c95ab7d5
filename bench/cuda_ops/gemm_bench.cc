// The dense layers' GEMMs alone (issue 18, goal 2): one Pre-LN layer's
// projections plus the LM head (packed Q/K/V, attention output, packed
// gate/up, down, head at vocab 256), forward + backward, on the system BLAS
// (torch::linear and its autograd backward, as LibTorch and the PyTorch
// peer run them) against oneDNN's sgemm (cpu_gemm::Linear, what
// depthbench-train runs), alternated within each repetition, at several
// widths and token counts (a trainer micro-batch is B x T / threads tokens).
//
//   gemm_bench [--threads 1] [--reps 20] [--tokens 1024,2048] [--widths 128,256,512]
//
// Prints per (width, tokens) the median ms of each and the ratio BLAS / oneDNN
// (above 1: oneDNN faster), with both GFLOP/s. Run with
// `source scripts/blas_env.sh` first, as the trainer and the peer run.
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "bench/cuda_ops/timing.h"
#include "common/malloc_tuning.h"
#include "cuda_ops/cpu_gemm.h"
#include "trainer_core/shapes.h"

namespace depthbench {
namespace {

std::vector<int64_t> ParseList(const std::string& text, const char* flag) {
  std::vector<int64_t> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v <= 0) {
      std::fprintf(stderr, "gemm_bench: %s: '%s' is not a positive integer\n", flag, item.c_str());
      std::exit(2);
    }
    out.push_back(v);
  }
  if (out.empty()) {
    std::fprintf(stderr, "gemm_bench: %s: empty list\n", flag);
    std::exit(2);
  }
  return out;
}

using bench::Median;

int Main(int argc, char** argv) {
  PinMallocThresholds();  // as depthbench-train does
  int64_t threads = 1, reps = 20;
  std::vector<int64_t> tokens_list = {1024, 2048}, widths = {128, 256, 512};
  for (int i = 1; i < argc; i += 2) {
    const std::string a = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "gemm_bench: %s needs a value\n", a.c_str());
      return 2;
    }
    const std::string v = argv[i + 1];
    if (a == "--threads") {
      threads = ParseList(v, "--threads")[0];
    } else if (a == "--reps") {
      reps = ParseList(v, "--reps")[0];
    } else if (a == "--tokens") {
      tokens_list = ParseList(v, "--tokens");
    } else if (a == "--widths") {
      widths = ParseList(v, "--widths");
    } else {
      std::fprintf(stderr, "gemm_bench: unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  if (!cpu_gemm::Enabled()) {
    std::fprintf(stderr, "gemm_bench: %s; nothing to compare\n", cpu_gemm::Description().c_str());
    return 2;
  }
  at::set_num_threads(static_cast<int>(threads));
  torch::manual_seed(0);
  std::printf("threads %lld, %lld reps; %s\n", static_cast<long long>(threads),
              static_cast<long long>(reps), cpu_gemm::Description().c_str());
  std::printf("%6s %7s %14s %14s %9s %9s %13s\n", "d", "tokens", "BLAS ms", "oneDNN ms",
              "BLAS GF/s", "oneDNN GF/s", "BLAS/oneDNN");
  for (int64_t d : widths) {
    const int64_t f = FfnWidth(d, FfnRule::kSwiGlu83);
    // [N, K] of each projection: packed Q/K/V, output, packed gate/up, down, head.
    const std::vector<std::pair<int64_t, int64_t>> weights = {
        {3 * d, d}, {d, d}, {2 * f, d}, {d, f}, {256, d}};
    std::vector<torch::Tensor> w;
    double flops_per_token = 0;
    for (const auto& [n, k] : weights) {
      w.push_back((torch::randn({n, k}) * 0.02).requires_grad_(true));
      flops_per_token += 3.0 * 2.0 * static_cast<double>(n * k);  // forward + two backward GEMMs
    }
    for (int64_t tokens : tokens_list) {
      std::vector<torch::Tensor> x, probe;
      for (const auto& [n, k] : weights) {
        x.push_back(torch::randn({tokens, k}).requires_grad_(true));
        probe.push_back(torch::randn({tokens, n}));
      }
      auto step = [&](bool onednn) {
        for (size_t i = 0; i < w.size(); ++i) {
          torch::Tensor y = onednn ? cpu_gemm::Linear(x[i], w[i]) : torch::linear(x[i], w[i]);
          torch::autograd::grad({y}, {x[i], w[i]}, {probe[i]});
        }
      };
      auto ms = [&](bool onednn) { return bench::Ms([&] { step(onednn); }); };
      step(false);
      step(true);  // warm-up: packing buffers, oneDNN's JIT kernels
      std::vector<double> blas, dnnl;
      for (int64_t r = 0; r < reps; ++r) {
        // Alternate which goes first, so neither always follows the other.
        if (r % 2 == 0) {
          blas.push_back(ms(false));
          dnnl.push_back(ms(true));
        } else {
          dnnl.push_back(ms(true));
          blas.push_back(ms(false));
        }
      }
      const double b = Median(blas), o = Median(dnnl);
      const double flops = flops_per_token * static_cast<double>(tokens);
      std::printf("%6lld %7lld %14.3f %14.3f %9.1f %9.1f %12.3fx\n", static_cast<long long>(d),
                  static_cast<long long>(tokens), b, o, flops / b / 1e6, flops / o / 1e6, b / o);
    }
  }
  return 0;
}

}  // namespace
}  // namespace depthbench

int main(int argc, char** argv) { return depthbench::Main(argc, argv); }
