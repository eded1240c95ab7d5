// The fused CPU causal attention alone (issue 18, goal 2): forward + backward
// of cpu_fused::CausalAttentionQkv (RoPE inside, one gradient for the packed
// q/k/v) against the same function as ATen ops (RopeRotate, q k^T, causal
// mask, softmax, p v, autograd's backward), alternated rep by rep in one
// process, at the per-thread shapes of the goal-2 benchmark (one micro-batch
// per thread: B/2 sequences). At d = 512 the attention is the largest piece
// of the step that is not a dense GEMM, so its rate against the GEMMs' rate
// is what it costs goal 2.
//
//   attn_bench [--threads 1] [--reps 20] [--slots S] [--shape B:T:H:HD]...
//
// With --slots S, both sides also attend to S MoDA depth slots per row
// (keys and values [B, H, T, hd] each, leaves with gradients, scored
// against the unrotated query in one softmax with the sequence scores), as
// MoDA's layers do; the FLOP count then adds the slots' products (forward
// 2, backward 5 of 2 hd S per row).
//
// Prints per shape the median and best milliseconds of each side, the
// speed-up composite / fused (medians), and the fused kernel's rate in
// GFLOP/s: the causal products it does, forward 2 (q k^T, p v) and backward
// 5 (the scores recomputed, dP, dV, dQ, dK) of 2 hd T (T + 1) / 2 FLOPs per
// (sequence, head), over its time; and that rate as a fraction of oneDNN's
// (or the system BLAS's) single-call sgemm rate at the shape of the step's
// dense layers ([B T, 512] x [512, 1536]), measured in the same run, the
// rate the rest of the step runs at.
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/cuda_ops/timing.h"
#include "common/malloc_tuning.h"
#include "cuda_ops/cpu_fused.h"
#include "cuda_ops/cpu_gemm.h"
#include "cuda_ops/ops.h"
#include "trainer_core/model/layers.h"

namespace depthbench {
namespace {

using bench::Median;
using bench::Ms;

struct Shape {
  int64_t B, T, H, hd;
};

bool ParseShape(const std::string& s, Shape* out) {
  long long b, t, h, d;
  char tail;
  if (std::sscanf(s.c_str(), "%lld:%lld:%lld:%lld%c", &b, &t, &h, &d, &tail) != 4) return false;
  if (b < 1 || t < 1 || h < 1 || d < 2 || d % 2 != 0) return false;
  *out = {b, t, h, d};
  return true;
}

int Main(int argc, char** argv) {
  PinMallocThresholds();  // as depthbench-train does
  int64_t threads = 1, reps = 20, slots = 0;
  std::vector<Shape> shapes;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "attn_bench: %s: missing value\n", a.c_str());
      return 2;
    }
    const std::string v = argv[++i];
    if (a == "--shape") {
      Shape s;
      if (!ParseShape(v, &s)) {
        std::fprintf(stderr, "attn_bench: --shape: want B:T:H:HD (positive, HD even), got %s\n",
                     v.c_str());
        return 2;
      }
      shapes.push_back(s);
      continue;
    }
    char* end = nullptr;
    const long long n = std::strtoll(v.c_str(), &end, 10);
    const long long least = a == "--slots" ? 0 : 1;
    if (end == v.c_str() || *end != '\0' || n < least) {
      std::fprintf(stderr, "attn_bench: %s: not an integer >= %lld: %s\n", a.c_str(), least,
                   v.c_str());
      return 2;
    }
    if (a == "--threads") threads = n;
    else if (a == "--reps") reps = n;
    else if (a == "--slots") slots = n;
    else {
      std::fprintf(stderr, "attn_bench: unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  if (shapes.empty()) {  // goal 2's shapes, one micro-batch (B / 2 sequences) each
    shapes = {{8, 128, 4, 32}, {8, 128, 16, 16}, {4, 256, 16, 16}, {8, 128, 8, 64}, {4, 256, 8, 64}};
  }
  torch::set_num_threads(static_cast<int>(threads));
  torch::manual_seed(0);

  // The dense layers' rate: one [1024, 512] x [512, 1536] product as the
  // step's Q/K/V projection runs it (LinearOp, the model's dense layer).
  const torch::Tensor gx = torch::randn({1024, 512}), gw = torch::randn({1536, 512});
  std::vector<double> gemm_ms;
  LinearOp(gx, gw);
  for (int r = 0; r < 20; ++r) gemm_ms.push_back(Ms([&] { LinearOp(gx, gw); }));
  const double gemm_gflops = 2.0 * 1024 * 512 * 1536 / (Median(gemm_ms) * 1e6);
  std::printf("threads=%ld reps=%ld slots=%ld; dense GEMM [1024,512]x[512,1536] (%s): %.1f GFLOP/s\n",
              static_cast<long>(threads), static_cast<long>(reps), static_cast<long>(slots),
              cpu_gemm::Description().c_str(), gemm_gflops);

  for (const Shape& s : shapes) {
    const torch::Tensor qkv = (torch::randn({s.B, s.T, 3 * s.H, s.hd}) * 0.5).requires_grad_();
    const torch::Tensor dout = torch::randn({s.B, s.T, s.H * s.hd});
    torch::Tensor cos, sin;  // the model's rotary tables
    Rope(s.hd, s.T).Tables(s.T, qkv, &cos, &sin);
    const double scale = 1.0 / std::sqrt(static_cast<double>(s.hd));
    const torch::Tensor mask = torch::ones({s.T, s.T}, torch::kBool).triu(1);
    std::vector<torch::Tensor> dkeys, dvalues;  // the depth slots
    for (int64_t j = 0; j < slots; ++j) {
      dkeys.push_back((torch::randn({s.B, s.H, s.T, s.hd}) * 0.5).requires_grad_());
      dvalues.push_back(torch::randn({s.B, s.H, s.T, s.hd}).requires_grad_());
    }
    auto reset_grads = [&] {
      qkv.mutable_grad().reset();
      for (int64_t j = 0; j < slots; ++j) {
        dkeys[j].mutable_grad().reset();
        dvalues[j].mutable_grad().reset();
      }
    };
    auto fused = [&] {
      const torch::Tensor out =
          cpu_fused::CausalAttentionQkv(qkv, s.H, s.H, cos, sin, dkeys, dvalues, scale)[0];
      out.backward(dout);
      reset_grads();
    };
    auto composite = [&] {
      // [B, T, 3H, hd] -> q, k, v [B, H, T, hd], rotated as the model's
      // composite path does (ops.h RopeRotate).
      const torch::Tensor t = qkv.transpose(1, 2);
      const torch::Tensor q = RopeRotate(t.narrow(1, 0, s.H), cos, sin);
      const torch::Tensor k = RopeRotate(t.narrow(1, s.H, s.H), cos, sin);
      const torch::Tensor v = t.narrow(1, 2 * s.H, s.H);
      torch::Tensor scores =
          (torch::matmul(q, k.transpose(-2, -1)) * scale).masked_fill(mask, -INFINITY);
      torch::Tensor vd;  // [B, H, T, S, hd]: each row's slot values
      if (slots > 0) {  // the slots' scores against the unrotated query
        const torch::Tensor qu = t.narrow(1, 0, s.H).unsqueeze(3);
        scores = torch::cat({scores, (qu * torch::stack(dkeys, 3)).sum(-1) * scale}, -1);
        vd = torch::stack(dvalues, 3);
      }
      const torch::Tensor p = torch::softmax(scores, -1);
      torch::Tensor o = torch::matmul(p.narrow(-1, 0, s.T), v);
      if (slots > 0) o = o + (p.narrow(-1, s.T, slots).unsqueeze(-1) * vd).sum(3);
      const torch::Tensor out = o.transpose(1, 2).reshape({s.B, s.T, -1});
      out.backward(dout);
      reset_grads();
    };
    fused();
    composite();
    std::vector<double> f_ms, c_ms;
    for (int64_t r = 0; r < reps; ++r) {  // alternated, so drift hits both alike
      f_ms.push_back(Ms(fused));
      c_ms.push_back(Ms(composite));
    }
    const double flops = 7.0 * s.B * s.H * 2.0 * s.hd * s.T * ((s.T + 1) / 2.0 + slots);
    const double f_med = Median(f_ms), c_med = Median(c_ms);
    const double rate = flops / (f_med * 1e6);
    std::printf(
        "B=%ld T=%ld heads=%ld hd=%ld: fused median %.3f ms (best %.3f), composite median %.3f ms "
        "(best %.3f); composite/fused %.2fx; fused %.1f GFLOP/s = %.2f of the dense GEMM rate\n",
        static_cast<long>(s.B), static_cast<long>(s.T), static_cast<long>(s.H),
        static_cast<long>(s.hd), f_med, *std::min_element(f_ms.begin(), f_ms.end()), c_med,
        *std::min_element(c_ms.begin(), c_ms.end()), c_med / f_med, rate, rate / gemm_gflops);
  }
  return 0;
}

}  // namespace
}  // namespace depthbench

int main(int argc, char** argv) { return depthbench::Main(argc, argv); }
