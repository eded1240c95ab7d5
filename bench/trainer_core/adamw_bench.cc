// The optimiser step of depthbench-train (trainer_core/optim.h: FusedAdamW,
// gradients dropped with ClearGradients) against LibTorch's stock
// torch::optim::AdamW with zero_grad() (its gradients then accumulated
// into), on the parameter set of the Pre-LN model at L=4 and several
// widths (issue 18, goal 2: the step around the GEMMs). Both run in the
// same process, alternately, on identical parameters and gradients; prints
// the median milliseconds per step of each and their ratio.
//
//   adamw_bench [--threads N] [--rounds R]
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "trainer_core/optim.h"

namespace {

// Pre-LN at width d, L layers, vocab 256 (trainer_core/model): embedding,
// head, per layer Q/K/V [3d, d], output [d, d], gate/up [2F, d], down
// [d, F] with F = ceil16(8 d / 3), two norm gains [d]; a final norm [d].
std::vector<std::vector<int64_t>> PreLnShapes(int64_t d, int64_t layers) {
  const int64_t f = (8 * d / 3 + 15) / 16 * 16;
  std::vector<std::vector<int64_t>> s = {{256, d}, {256, d}, {d}};
  for (int64_t l = 0; l < layers; ++l) {
    for (auto shape : std::vector<std::vector<int64_t>>{{3 * d, d}, {d, d}, {2 * f, d}, {d, f}, {d}, {d}}) {
      s.push_back(shape);
    }
  }
  return s;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, rounds = 15;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--threads") == 0) {
      threads = std::atoi(argv[i + 1]);
    } else if (std::strcmp(argv[i], "--rounds") == 0) {
      rounds = std::atoi(argv[i + 1]);
    } else {
      std::fprintf(stderr, "unknown option %s (--threads N, --rounds R)\n", argv[i]);
      return 2;
    }
  }
  if (threads < 1 || rounds < 1) {
    std::fprintf(stderr, "--threads and --rounds must be positive\n");
    return 2;
  }
  torch::set_num_threads(threads);
  std::printf("threads %d, %d rounds; ms per optimiser step (gradient reset + step), median\n",
              threads, rounds);
  std::printf("| width (L=4) | parameters | stock AdamW + zero_grad | FusedAdamW + ClearGradients | speed-up |\n");
  std::printf("|---|---:|---:|---:|---:|\n");
  for (int64_t d : {256, 512, 1024}) {
    torch::manual_seed(0);
    std::vector<torch::Tensor> stock_params, fused_params, grads;
    int64_t count = 0;
    for (const auto& shape : PreLnShapes(d, 4)) {
      torch::Tensor init = torch::randn(shape) * 0.02;
      stock_params.push_back(init.clone().requires_grad_());
      fused_params.push_back(init.clone().requires_grad_());
      grads.push_back(torch::randn(shape) * 1e-3);
      count += init.numel();
    }
    torch::optim::AdamW stock(stock_params, torch::optim::AdamWOptions(1e-3)
                                                .betas({depthbench::kAdamBeta1, depthbench::kAdamBeta2})
                                                .eps(depthbench::kAdamEps)
                                                .weight_decay(0.1));
    auto fused = depthbench::MakeAdamW(depthbench::ParamGroups{fused_params, {}}, 1e-3, 0.1);
    // The gradient as backward delivers it: accumulated into the zeroed
    // gradient (stock) or stored as the new one (fused; a fresh tensor, as
    // AccumulateGrad steals or clones the incoming gradient).
    auto stock_step = [&] {
      stock.zero_grad();
      for (size_t i = 0; i < grads.size(); ++i) {
        torch::Tensor& g = stock_params[i].mutable_grad();
        if (g.defined()) g.add_(grads[i]); else g = grads[i].clone();
      }
      stock.step();
    };
    auto fused_step = [&] {
      depthbench::ClearGradients(fused_params);
      for (size_t i = 0; i < grads.size(); ++i) fused_params[i].mutable_grad() = grads[i].clone();
      fused->step();
    };
    auto time_ms = [](auto&& fn) {
      const auto t0 = std::chrono::steady_clock::now();
      fn();
      return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    };
    for (int w = 0; w < 2; ++w) {
      stock_step();
      fused_step();
    }
    std::vector<double> a, b;
    for (int r = 0; r < rounds; ++r) {
      a.push_back(time_ms(stock_step));
      b.push_back(time_ms(fused_step));
    }
    std::printf("| d=%lld | %lld | %.2f | %.2f | %.2fx |\n", static_cast<long long>(d),
                static_cast<long long>(count), Median(a), Median(b), Median(a) / Median(b));
  }
  return 0;
}
