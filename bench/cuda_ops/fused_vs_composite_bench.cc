// Fused vs composite ops (issue 21): forward+backward time of one model with
// the dispatcher's fused path on and off (SetFusedOpsEnabled), alternated
// round by round on the same model and batch, so drift hits both alike. The
// figure is the speed-up median(composite ms) / median(fused ms). The first
// round also compares the two paths' losses (they compute the same function).
//
//   fused_vs_composite_bench [--arch attnres_full] [--layers 24] [--d 1024]
//       [--heads 16] [--vocab 50280] [--seq 2048] [--batch 4] [--device cuda]
//       [--bf16] [--rounds 5] [--steps 3] [--threads 0]
//
// Prints one JSON line: {"arch", "device", "fused_ops", "fused_ms",
// "composite_ms", "speedup", "fused_tokens_per_s", "composite_tokens_per_s",
// "loss_abs_diff", ...}. On a build without the CUDA bindings (or on CPU)
// both paths are composite except the CPU RMSNorm kernel (cpu_fused.h).
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuda_ops/ops.h"
#include "trainer_core/arch.h"
#include "trainer_core/model/model.h"
#include "trainer_core/precision.h"
#include "trainer_core/shapes.h"

namespace depthbench {
namespace {

struct Config {
  std::string arch = "attnres_full", device = "cuda";
  int64_t layers = 24, d = 1024, heads = 16, vocab = 50280, seq = 2048, batch = 4, threads = 0;
  int rounds = 5, steps = 3;
  bool bf16 = false;
};

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "fused_vs_composite_bench: %s\n", what.c_str());
  std::exit(2);
}

int Main(int argc, char** argv) {
  Config c;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Fail(a + ": missing value");
      return argv[++i];
    };
    auto number = [&]() -> int64_t {
      const std::string v = value();
      char* end = nullptr;
      const long long n = std::strtoll(v.c_str(), &end, 10);
      if (end == v.c_str() || *end != '\0' || n < 0) Fail(a + ": not a non-negative integer: " + v);
      return n;
    };
    if (a == "--arch") c.arch = value();
    else if (a == "--device") c.device = value();
    else if (a == "--layers") c.layers = number();
    else if (a == "--d") c.d = number();
    else if (a == "--heads") c.heads = number();
    else if (a == "--vocab") c.vocab = number();
    else if (a == "--seq") c.seq = number();
    else if (a == "--batch") c.batch = number();
    else if (a == "--threads") c.threads = number();
    else if (a == "--rounds") c.rounds = static_cast<int>(number());
    else if (a == "--steps") c.steps = static_cast<int>(number());
    else if (a == "--bf16") c.bf16 = true;
    else Fail("unknown flag " + a);
  }
  if (c.rounds < 1 || c.steps < 1 || c.batch < 1 || c.seq < 1) Fail("rounds, steps, batch, seq must be >= 1");
  if (c.device != "cpu" && c.device != "cuda") Fail("--device: cpu or cuda, got " + c.device);
  if (c.device == "cuda" && !torch::cuda::is_available()) Fail("--device cuda: no CUDA device visible");
  if (c.bf16 && c.device != "cuda") Fail("--bf16: CUDA only (as the trainer's precision bf16)");
  if (c.threads > 0) torch::set_num_threads(static_cast<int>(c.threads));

  auto arch = ParseArch(c.arch);
  if (!arch.ok()) Fail(std::string(arch.status().message()));
  ModelOptions o;
  o.arch = *arch;
  o.design.shape = MakeShape(c.layers, c.d, c.vocab, FfnRule::kSwiGlu83, c.heads, c.heads);
  o.design.max_seq_len = c.seq;
  if (absl::Status s = ValidateShape(o.design.shape); !s.ok()) Fail(std::string(s.message()));
  torch::manual_seed(0);
  auto built = BuildModel(o);
  if (!built.ok()) Fail(std::string(built.status().message()));
  LanguageModel m = *built;
  const torch::Device device(c.device == "cuda" ? torch::kCUDA : torch::kCPU);
  m->to(device);

  torch::Tensor tok =
      torch::randint(0, c.vocab, {c.batch, c.seq + 1}, torch::TensorOptions(torch::kLong)).to(device);
  torch::Tensor in = tok.narrow(1, 0, c.seq), tgt = tok.narrow(1, 1, c.seq);
  auto sync = [&]() {
    if (device.is_cuda()) torch::cuda::synchronize();
  };
  auto step = [&]() -> double {
    m->zero_grad();
    torch::Tensor loss;
    {
      Bf16AutocastGuard autocast(c.bf16);
      loss = m->Loss(in, tgt);
    }
    loss.backward();
    return loss.item<double>();
  };
  // Warm-up both paths (allocator, cuBLAS heuristics) and compare losses.
  SetFusedOpsEnabled(false);
  const double composite_loss = step();
  SetFusedOpsEnabled(true);
  const double fused_loss = step();
  std::vector<double> fused_ms, composite_ms;
  for (int r = 0; r < c.rounds; ++r) {
    for (bool fused : {true, false}) {
      SetFusedOpsEnabled(fused);
      sync();
      const auto t0 = std::chrono::steady_clock::now();
      for (int s = 0; s < c.steps; ++s) step();
      sync();
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
          c.steps;
      (fused ? fused_ms : composite_ms).push_back(ms);
    }
  }
  SetFusedOpsEnabled(true);
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double f = median(fused_ms), cm = median(composite_ms);
  const double tokens = static_cast<double>(c.batch * c.seq);
  nlohmann::json out = {{"arch", c.arch},
                        {"device", c.device},
                        {"precision", c.bf16 ? "bf16" : "fp32"},
                        {"layers", c.layers},
                        {"d_model", c.d},
                        {"seq", c.seq},
                        {"batch", c.batch},
                        {"params", m->ParameterCount()},
                        {"fused_ops", FusedOpsDescription()},
                        {"rounds", c.rounds},
                        {"steps", c.steps},
                        {"fused_ms", f},
                        {"composite_ms", cm},
                        {"speedup", cm / f},
                        {"fused_tokens_per_s", tokens / (f / 1000.0)},
                        {"composite_tokens_per_s", tokens / (cm / 1000.0)},
                        {"fused_loss", fused_loss},
                        {"composite_loss", composite_loss},
                        {"loss_abs_diff", std::fabs(fused_loss - composite_loss)}};
  std::printf("%s\n", out.dump().c_str());
  return std::isfinite(fused_loss) && std::isfinite(composite_loss) ? 0 : 1;
}

}  // namespace
}  // namespace depthbench

int main(int argc, char** argv) { return depthbench::Main(argc, argv); }
