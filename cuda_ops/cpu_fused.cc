// The fused CPU RMSNorm and SwiGLU gate (cpu_fused.h); compiled once per ISA
// (cpu_fused_isa.h), the entry points are in cpu_fused_dispatch.cc.
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cuda_ops/cpu_fused.h"
#include "cuda_ops/cpu_fused_isa.h"
// Last: the ISA of this object (cpu_fused_isa.h).
#include "cuda_ops/cpu_fused_target.h"
#include "cuda_ops/cpu_fused_vec.h"

namespace depthbench {
namespace cpu_fused {
namespace DEPTHBENCH_CPU_FUSED_ISA {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Rows per parallel task: about 32k elements each, as ATen's element-wise
// kernels use (at::internal::GRAIN_SIZE).
int64_t RowGrain(int64_t d) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(d, 1)); }

// Sum of squares of one row, in double (d is at most a few thousand).
template <typename T>
double SumSquares(const T* x, int64_t d) {
  // Four independent partial sums let the compiler keep the loop pipelined.
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t j = 0;
  for (; j + 4 <= d; j += 4) {
    s0 += static_cast<double>(x[j]) * x[j];
    s1 += static_cast<double>(x[j + 1]) * x[j + 1];
    s2 += static_cast<double>(x[j + 2]) * x[j + 2];
    s3 += static_cast<double>(x[j + 3]) * x[j + 3];
  }
  for (; j < d; ++j) s0 += static_cast<double>(x[j]) * x[j];
  return (s0 + s1) + (s2 + s3);
}

// sum_j g[j] w[j] x[j] of one row, in double, in kParts independent
// partial sums (lanes of the build's double vectors), folded by a fixed
// tree. As one running sum (before 2026-12-08) it was a chain of d
// dependent double additions, about 4 cycles each: RmsNorm's backward took
// 2.4% of a training step's samples at d = 128, most of them waiting on it.
template <typename T>
double WeightedDot(const T* g, const T* w, const T* x, int64_t d) {
  constexpr int kParts = 16;
  double p[kParts] = {};
  int64_t j = 0;
  for (; j + kParts <= d; j += kParts) {
    for (int k = 0; k < kParts; ++k) {
      p[k] += static_cast<double>(g[j + k]) * w[j + k] * x[j + k];
    }
  }
  for (; j < d; ++j) p[0] += static_cast<double>(g[j]) * w[j] * x[j];
  for (int k = 0; k < 8; ++k) p[k] += p[k + 8];
  return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
}

class RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x_in,
                               const torch::Tensor& weight_in, double eps) {
    torch::Tensor x = x_in.contiguous(), w = weight_in.contiguous();
    const int64_t d = x.size(-1), rows = x.numel() / std::max<int64_t>(d, 1);
    TORCH_CHECK(w.dim() == 1 && w.size(0) == d, "RmsNorm: weight has ", w.sizes(),
                ", expected [", d, "]");
    torch::Tensor y = torch::empty_like(x);
    torch::Tensor rstd = torch::empty({rows}, x.options());  // 1 / rms per row
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "cpu_fused::RmsNorm", [&] {
      const scalar_t* xp = x.data_ptr<scalar_t>();
      const scalar_t* wp = w.data_ptr<scalar_t>();
      scalar_t* yp = y.data_ptr<scalar_t>();
      scalar_t* rp = rstd.data_ptr<scalar_t>();
      at::parallel_for(0, rows, RowGrain(d), [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const scalar_t* xr = xp + r * d;
          const scalar_t inv =
              static_cast<scalar_t>(1.0 / std::sqrt(SumSquares(xr, d) / d + eps));
          scalar_t* yr = yp + r * d;
          for (int64_t j = 0; j < d; ++j) yr[j] = xr[j] * inv * wp[j];
          rp[r] = inv;
        }
      });
    });
    ctx->save_for_backward({x, w, rstd});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];
    const torch::Tensor& w = saved[1];
    const torch::Tensor& rstd = saved[2];
    torch::Tensor dy = grads[0].contiguous();
    const int64_t d = x.size(-1), rows = x.numel() / std::max<int64_t>(d, 1);
    torch::Tensor dx = torch::empty_like(x);
    // dw = sum over rows of dy * x * rstd: one partial row per thread,
    // summed at the end (deterministic for a fixed thread count).
    const int64_t threads = at::get_num_threads();
    // A unit weight without a gradient (RmsNormalizeOp) skips the dw sums.
    const bool need_dw = ctx->needs_input_grad(1);
    std::vector<double> partial(need_dw ? static_cast<size_t>(threads * d) : 0, 0.0);
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "cpu_fused::RmsNormBackward", [&] {
      const scalar_t* xp = x.data_ptr<scalar_t>();
      const scalar_t* wp = w.data_ptr<scalar_t>();
      const scalar_t* rp = rstd.data_ptr<scalar_t>();
      const scalar_t* gp = dy.data_ptr<scalar_t>();
      scalar_t* dxp = dx.data_ptr<scalar_t>();
      at::parallel_for(0, rows, RowGrain(d), [&](int64_t begin, int64_t end) {
        double* acc = need_dw ? partial.data() + at::get_thread_num() * d : nullptr;
        for (int64_t r = begin; r < end; ++r) {
          const scalar_t* xr = xp + r * d;
          const scalar_t* gr = gp + r * d;
          const double inv = rp[r];
          // dx = inv * (g - x * inv^2 * mean(g * x)), g = dy * w.
          const double dot = WeightedDot(gr, wp, xr, d);
          const scalar_t coef = static_cast<scalar_t>(inv * inv * dot / d);
          const scalar_t sinv = static_cast<scalar_t>(inv);
          scalar_t* dxr = dxp + r * d;
          for (int64_t j = 0; j < d; ++j) dxr[j] = sinv * (gr[j] * wp[j] - xr[j] * coef);
          if (acc != nullptr) {
            for (int64_t j = 0; j < d; ++j) acc[j] += static_cast<double>(gr[j]) * xr[j] * inv;
          }
        }
      });
    });
    if (!need_dw) return {dx, torch::Tensor(), torch::Tensor()};
    return {dx, SumPartials(partial, threads, d, {d}, w.scalar_type()), torch::Tensor()};
  }
};

// The SwiGLU gate on 8 lanes: sigmoid(g) from exp(-|g|) <= 1 (Exp8's
// range), then y = g sigmoid(g) u and, given dy, the two gradients.
struct SwiGlu8 {
  V8f g, u, s;  // s = sigmoid(g)
  SwiGlu8(V8f g_in, V8f u_in) : g(g_in), u(u_in) {
    const V8f zero = Broadcast8(0.0f);
    const V8f e = Exp8(g < zero ? g : -g);
    const V8f inv = 1.0f / (1.0f + e);
    s = g < zero ? e * inv : inv;
  }
  V8f y() const { return g * s * u; }
  V8f du(V8f dy) const { return dy * g * s; }
  V8f dg(V8f dy) const { return dy * u * s * (1.0f + g * (1.0f - s)); }
};

// fn(c, lanes) over one row of n floats in 8-lane chunks; the last partial
// chunk goes through zero-padded copies (lanes < 8).
template <typename Fn>
inline void Chunks8(int64_t n, Fn&& fn) {
  int64_t c = 0;
  for (; c + 8 <= n; c += 8) fn(c, 8);
  if (c < n) fn(c, static_cast<int>(n - c));
}
inline V8f LoadN(const float* p, int lanes) {
  if (lanes == 8) return Load8(p);
  float b[8] = {};
  std::copy(p, p + lanes, b);
  return Load8(b);
}
inline void StoreN(float* p, V8f v, int lanes) {
  if (lanes == 8) return Store8(p, v);
  float b[8];
  Store8(b, v);
  std::copy(b, b + lanes, p);
}

// One row: gate g and up u (F each) -> y; float on 8 lanes, double scalar.
inline void SwiGluRow(const float* g, const float* u, int64_t F, float* y) {
  Chunks8(F, [&](int64_t c, int lanes) {
    StoreN(y + c, SwiGlu8(LoadN(g + c, lanes), LoadN(u + c, lanes)).y(), lanes);
  });
}
inline void SwiGluRow(const double* g, const double* u, int64_t F, double* y) {
  for (int64_t c = 0; c < F; ++c) y[c] = g[c] / (1.0 + std::exp(-g[c])) * u[c];
}
inline void SwiGluBackwardRow(const float* g, const float* u, const float* dy, int64_t F,
                              float* dg, float* du) {
  Chunks8(F, [&](int64_t c, int lanes) {
    const SwiGlu8 v(LoadN(g + c, lanes), LoadN(u + c, lanes));
    const V8f d = LoadN(dy + c, lanes);
    StoreN(dg + c, v.dg(d), lanes);
    StoreN(du + c, v.du(d), lanes);
  });
}
inline void SwiGluBackwardRow(const double* g, const double* u, const double* dy, int64_t F,
                              double* dg, double* du) {
  for (int64_t c = 0; c < F; ++c) {
    const double s = 1.0 / (1.0 + std::exp(-g[c]));
    du[c] = dy[c] * g[c] * s;
    dg[c] = dy[c] * u[c] * s * (1.0 + g[c] * (1.0 - s));
  }
}

class SwiGluPackedFunction : public torch::autograd::Function<SwiGluPackedFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& gu_in) {
    torch::Tensor gu = gu_in.contiguous();
    const int64_t F = gu.size(-1) / 2, rows = gu.numel() / std::max<int64_t>(2 * F, 1);
    std::vector<int64_t> sizes = gu.sizes().vec();
    sizes.back() = F;
    torch::Tensor y = torch::empty(sizes, gu.options());
    AT_DISPATCH_FLOATING_TYPES(gu.scalar_type(), "cpu_fused::SwiGluPacked", [&] {
      const scalar_t* p = gu.data_ptr<scalar_t>();
      scalar_t* yp = y.data_ptr<scalar_t>();
      at::parallel_for(0, rows, RowGrain(2 * F), [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          SwiGluRow(p + r * 2 * F, p + r * 2 * F + F, F, yp + r * F);
        }
      });
    });
    ctx->save_for_backward({gu});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const torch::Tensor gu = ctx->get_saved_variables()[0];
    torch::Tensor dy = grads[0].contiguous();
    const int64_t F = gu.size(-1) / 2, rows = gu.numel() / std::max<int64_t>(2 * F, 1);
    torch::Tensor dgu = torch::empty_like(gu);
    AT_DISPATCH_FLOATING_TYPES(gu.scalar_type(), "cpu_fused::SwiGluPackedBackward", [&] {
      const scalar_t* p = gu.data_ptr<scalar_t>();
      const scalar_t* dyp = dy.data_ptr<scalar_t>();
      scalar_t* dp = dgu.data_ptr<scalar_t>();
      at::parallel_for(0, rows, RowGrain(2 * F), [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const int64_t o = r * 2 * F;
          SwiGluBackwardRow(p + o, p + o + F, dyp + r * F, F, dp + o, dp + o + F);
        }
      });
    });
    return {dgu};
  }
};

}  // namespace

torch::Tensor SwiGluPacked(const torch::Tensor& gu) {
  TORCH_CHECK(gu.dim() >= 1 && gu.size(-1) % 2 == 0,
              "SwiGluPacked: gu needs [..., 2 F] (gate, then up), has ", gu.sizes());
  return SwiGluPackedFunction::apply(gu);
}

torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  return RmsNormFunction::apply(x, weight, eps);
}

int ParallelForThreads() {
  std::vector<int> used(static_cast<size_t>(std::max(1, at::get_num_threads())), 0);
  at::parallel_for(0, 64, 1, [&](int64_t, int64_t) {
    const int t = at::get_thread_num();
    if (t >= 0 && t < static_cast<int>(used.size())) used[static_cast<size_t>(t)] = 1;
  });
  int n = 0;
  for (int u : used) n += u;
  return n;
}

}  // namespace DEPTHBENCH_CPU_FUSED_ISA
}  // namespace cpu_fused
}  // namespace depthbench
