// The multi-stream designs' fused CPU mixing ops alone (issue 18, goal 3):
// forward + backward time of the ops one step of designs_bench runs, at its
// shape (L = 8, d = 128, B x T = 8 x 128 tokens, HC/mHC n = 4), without the
// rest of the model, to compare kernel changes (run two builds alternately;
// designs_bench's per-round spread, 0.6-1.3, hides a few percent):
//   - AttnResMix as Full AttnRes runs it: one mix per sub-layer input and
//     the final one, over 1, 2, ..., 2L + 1 sources, with a query, the
//     sources passed through from mix to mix;
//   - HcRoute then HcWrite (the paper form's mix) for 2L chained connectors,
//     each write but the last fused with the next route (HcWriteRoute, as
//     the model runs them), and again with every write and route apart
//     (hc_separate);
//   - mHC's connector as the model runs it: MhcRoute, Sinkhorn (20
//     iterations) on its logits, HcWrite with the map, for 2L chained
//     connectors;
//   - mHC's MhcRoute alone on 2L connectors over one input (the loss reads
//     x, write and logits; h's gradient then sums 2L stream gradients): the
//     route's share of the connector, for a profiler.
// The two mHC families run twice: with the route's projection as oneDNN
// sgemm calls (mhc, mhc_route; what the trainer runs where oneDNN is in
// use) and as the fused loops (mhc_fused, mhc_route_fused).
//
//   mix_ops_bench [--threads 1] [--reps 30] [--tokens 1024] [--d 128] [--layers 8]
//                 [--only attnres|hc|hc_separate|mhc|mhc_fused|mhc_route|mhc_route_fused]
//                 (one family alone, for a profiler)
//
// Prints per op family the median and best milliseconds per step (forward +
// backward) over --reps repetitions.
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "bench/cuda_ops/timing.h"
#include "common/malloc_tuning.h"
#include "cuda_ops/cpu_fused.h"
#include "cuda_ops/cpu_gemm.h"

namespace depthbench {
namespace {

using bench::Ms;

void Report(const char* name, const std::vector<double>& ms) {
  std::printf("%-28s median %7.3f ms  best %7.3f ms\n", name, bench::Median(ms),
              *std::min_element(ms.begin(), ms.end()));
}

int Main(int argc, char** argv) {
  PinMallocThresholds();  // as depthbench-train does
  int64_t threads = 1, reps = 30, tokens = 1024, d = 128, layers = 8;
  std::string only;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--only") {
      only = argv[i + 1];  // checked against the families below
      continue;
    }
    const int64_t v = std::atoll(argv[i + 1]);
    if (a == "--threads") threads = v;
    else if (a == "--reps") reps = v;
    else if (a == "--tokens") tokens = v;
    else if (a == "--d") d = v;
    else if (a == "--layers") layers = v;
    else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  torch::set_num_threads(static_cast<int>(threads));
  torch::manual_seed(0);
  const int64_t n = 4, mixes = 2 * layers + 1;

  // Full AttnRes, chained as the model runs it: mix k reads sources 0..k,
  // which come back passed through (so each mix's backward adds into the
  // gradients the later mixes handed it, in place), and its output plus a
  // branch stand-in (a leaf, so the output's gradient is a fresh tensor as
  // after a real branch) becomes source k + 1. The loss reads the last mix.
  // (Before 2026-12-05 the sources were separate leaves, so every mix's
  // backward wrote fresh gradients that autograd then summed, a cost the
  // model does not have.)
  std::vector<torch::Tensor> branches;
  for (int64_t i = 0; i < mixes; ++i) branches.push_back(torch::randn({tokens, d}).requires_grad_());
  std::vector<torch::Tensor> queries, key_gains, out_gains;
  for (int64_t k = 0; k < mixes; ++k) {
    queries.push_back((torch::randn({d}) * 0.1).requires_grad_());
    key_gains.push_back(torch::ones({d}).requires_grad_());
    out_gains.push_back(torch::ones({d}).requires_grad_());
  }
  const torch::Tensor attnres_probe = torch::randn({tokens, d});
  auto attnres_step = [&] {
    std::vector<torch::Tensor> src = {branches[0] * 1.0f};
    torch::Tensor out;
    for (int64_t k = 0; k < mixes; ++k) {
      std::vector<torch::Tensor> passed;
      out = cpu_fused::AttnResMix(src, queries[k], key_gains[k], out_gains[k], 1e-6, &passed);
      src = std::move(passed);
      if (k + 1 < mixes) src.push_back(out + branches[k + 1]);
    }
    (out * attnres_probe).sum().backward();
  };

  // HC: 2L connectors chained as in the model (each write's output is the
  // next route's input), route then write; the branch is replaced by y + x.
  const int64_t connectors = 2 * layers;
  torch::Tensor h0 = torch::randn({tokens, n, d}).requires_grad_();
  torch::Tensor probe = torch::randn({tokens, n, d});
  std::vector<torch::Tensor> ws, sas, sbs, gas, gbs, ys;
  for (int64_t k = 0; k < connectors; ++k) {
    ws.push_back((torch::randn({d, n + 2}) * 0.05).requires_grad_());
    sas.push_back((torch::rand({n, n + 1}) * 0.5).requires_grad_());
    sbs.push_back(torch::ones({n}).requires_grad_());
    gas.push_back(torch::full({1}, 0.01).requires_grad_());
    gbs.push_back(torch::full({1}, 0.01).requires_grad_());
    ys.push_back(torch::randn({tokens, d}).requires_grad_());
  }
  // fused: each write but the last with the next route (HcWriteRoute, as
  // hc.cc runs them); else HcRoute and HcWrite apart.
  auto hc_step = [&](bool fused) {
    return [&, fused] {
      std::vector<torch::Tensor> r;  // {x, ar, b, h passed on}
      torch::Tensor y;
      for (int64_t k = 0; k < connectors; ++k) {
        if (k == 0) {
          r = cpu_fused::HcRoute(h0, ws[k], sas[k], sbs[k], gas[k], gbs[k], 1e-6);
        } else if (fused) {
          r = cpu_fused::HcWriteRoute(r[3], r[1], r[2], y, ws[k], sas[k], sbs[k], gas[k], gbs[k],
                                      1e-6);
        } else {
          r = cpu_fused::HcRoute(cpu_fused::HcWrite(r[3], r[1], r[2], y), ws[k], sas[k], sbs[k],
                                 gas[k], gbs[k], 1e-6);
        }
        y = ys[k] + r[0];
      }
      (cpu_fused::HcWrite(r[3], r[1], r[2], y) * probe).sum().backward();
    };
  };

  // mHC: phi [n d, n^2 + 2n], gains [3], bias [n^2 + 2n] per connector,
  // random (mhc.cc starts phi at zero; the kernels' work does not depend on
  // the values); the branch again y + x.
  std::vector<torch::Tensor> phis, gains, biases, mys;
  for (int64_t k = 0; k < connectors; ++k) {
    phis.push_back((torch::randn({n * d, n * n + 2 * n}) * 0.02).requires_grad_());
    gains.push_back(torch::full({3}, 0.01).requires_grad_());
    biases.push_back(torch::randn({n * n + 2 * n}).requires_grad_());
    mys.push_back(torch::randn({tokens, d}).requires_grad_());
  }
  // Each with the route's projection as oneDNN GEMMs and as the fused
  // loops (RouteProjection, cpu_fused.h), alternated in the same run.
  auto mhc_step = [&](cpu_fused::RouteProjection projection) {
    return [&, projection] {
      torch::Tensor h = h0;
      for (int64_t k = 0; k < connectors; ++k) {
        // r: {x, write, logits, h passed through}.
        std::vector<torch::Tensor> r =
            cpu_fused::MhcRoute(h, phis[k], gains[k], biases[k], n, 1e-6, projection);
        const torch::Tensor map = cpu_fused::Sinkhorn(r[2], 20, 1e-6);
        h = cpu_fused::HcWrite(r[3], map, r[1], mys[k] + r[0]);
      }
      (h * probe).sum().backward();
    };
  };

  // mHC's route alone: the RMS-normalised projection, coefficients and read,
  // forward and backward.
  auto mhc_route_step = [&](cpu_fused::RouteProjection projection) {
    return [&, projection] {
      torch::Tensor loss = torch::zeros({});
      for (int64_t k = 0; k < connectors; ++k) {
        std::vector<torch::Tensor> r =
            cpu_fused::MhcRoute(h0, phis[k], gains[k], biases[k], n, 1e-6, projection);
        loss = loss + (r[0] * mys[k]).sum() + r[1].sum() + r[2].sum();
      }
      loss.backward();
    };
  };

  struct Family {
    const char* flag;
    const char* name;
    std::function<void()> step;
    std::vector<double> ms;
  };
  using cpu_fused::RouteProjection;
  std::vector<Family> families = {{"attnres", "attnres_full mixes", attnres_step, {}},
                                  {"hc", "hc route+write", hc_step(true), {}},
                                  {"hc_separate", "  the same, write and route apart", hc_step(false), {}}};
  if (cpu_gemm::Enabled()) {
    families.push_back({"mhc", "mhc route+sinkhorn+write", mhc_step(RouteProjection::kGemm), {}});
  }
  families.push_back({"mhc_fused", "  the same, fused projection", mhc_step(RouteProjection::kFused), {}});
  if (cpu_gemm::Enabled()) {
    families.push_back({"mhc_route", "mhc route alone", mhc_route_step(RouteProjection::kGemm), {}});
  }
  families.push_back({"mhc_route_fused", "  the same, fused projection",
                      mhc_route_step(RouteProjection::kFused), {}});
  if (!only.empty()) {
    std::string flags;
    for (const Family& f : families) flags += flags.empty() ? f.flag : std::string(" or ") + f.flag;
    families.erase(std::remove_if(families.begin(), families.end(),
                                  [&](const Family& f) { return only != f.flag; }),
                   families.end());
    if (families.empty()) {
      std::fprintf(stderr, "--only must be %s, not %s\n", flags.c_str(), only.c_str());
      return 2;
    }
  }
  for (Family& f : families) f.step();
  for (int64_t r = 0; r < reps; ++r) {  // alternated, so drift hits all alike
    for (Family& f : families) f.ms.push_back(Ms(f.step));
  }
  std::printf("tokens=%ld d=%ld layers=%ld threads=%ld reps=%ld\n", static_cast<long>(tokens),
              static_cast<long>(d), static_cast<long>(layers), static_cast<long>(threads),
              static_cast<long>(reps));
  for (const Family& f : families) Report(f.name, f.ms);
  return 0;
}

}  // namespace
}  // namespace depthbench

int main(int argc, char** argv) { return depthbench::Main(argc, argv); }
