// The fused CPU AdamW update (cpu_fused.h, AdamWStep); compiled once per ISA
// (cpu_fused_isa.h), the entry point is in cpu_fused_dispatch.cc.
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cuda_ops/cpu_fused.h"
#include "cuda_ops/cpu_fused_isa.h"
// Last: the ISA of this object (cpu_fused_isa.h).
#include "cuda_ops/cpu_fused_target.h"
#include "cuda_ops/cpu_fused_vec.h"
#if defined(DEPTHBENCH_CPU_FUSED_AVX2) || defined(DEPTHBENCH_CPU_FUSED_AVX512)
#include <immintrin.h>
#endif

namespace depthbench {
namespace cpu_fused {
namespace DEPTHBENCH_CPU_FUSED_ISA {
namespace {

// Elements per parallel task, as ATen's element-wise kernels
// (at::internal::GRAIN_SIZE).
constexpr int64_t kGrain = 32768;

// sqrt of each lane. std::sqrt in the loop stays scalar (GCC keeps libm's
// errno path without -fno-math-errno, and that flag would cost this file
// the shared precompiled header).
inline VF SqrtVF(VF x) {
#if defined(DEPTHBENCH_CPU_FUSED_AVX512)
  return reinterpret_cast<VF>(_mm512_maskz_sqrt_ps(0xFFFF, reinterpret_cast<__m512>(x)));
#elif defined(DEPTHBENCH_CPU_FUSED_AVX2)
  return reinterpret_cast<VF>(_mm256_sqrt_ps(reinterpret_cast<__m256>(x)));
#else
  for (int l = 0; l < kVF; ++l) x[l] = std::sqrt(x[l]);
  return x;
#endif
}

// One AdamW step of elements [begin, end), in the order of operations of
// torch::optim::AdamW::step (LibTorch 1.13): p *= 1 - lr wd; m = beta1 m +
// (1 - beta1) g; v = beta2 v + (1 - beta2) g g; p += -step_size m /
// (sqrt(v) / sqrt(bc2) + eps). kGrad false: g = 0 (a parameter whose
// gradient was cleared and not written since; the stock optimiser saw a
// zeroed gradient there). T: VF for whole vectors, float for the tail.
template <bool kGrad, typename T>
inline void UpdateAt(float* p, const float* g, float* m, float* v, int64_t i,
                     const AdamWCoefficients& c) {
  auto load = [](const float* a) {
    if constexpr (std::is_same_v<T, float>) return *a; else return LoadVF(a);
  };
  auto store = [](float* a, T x) {
    if constexpr (std::is_same_v<T, float>) *a = x; else StoreVF(a, x);
  };
  const T gi = kGrad ? load(g + i) : T{};
  const T mi = load(m + i) * c.beta1 + c.one_minus_beta1 * gi;
  const T vi = load(v + i) * c.beta2 + c.one_minus_beta2 * gi * gi;
  store(m + i, mi);
  store(v + i, vi);
  T root;
  if constexpr (std::is_same_v<T, float>) root = std::sqrt(vi); else root = SqrtVF(vi);
  const T denom = root / c.sqrt_bias_correction2 + c.eps;
  store(p + i, load(p + i) * c.decay + c.neg_step_size * mi / denom);
}

template <bool kGrad>
void Update(float* p, const float* g, float* m, float* v, int64_t begin, int64_t end,
            const AdamWCoefficients& c) {
  int64_t i = begin;
  for (; i + kVF <= end; i += kVF) UpdateAt<kGrad, VF>(p, g, m, v, i, c);
  for (; i < end; ++i) UpdateAt<kGrad, float>(p, g, m, v, i, c);
}

}  // namespace

void AdamWStep(const torch::Tensor& param, const torch::Tensor& grad, const torch::Tensor& exp_avg,
               const torch::Tensor& exp_avg_sq, const AdamWCoefficients& c) {
  float* p = param.data_ptr<float>();
  const float* g = grad.defined() ? grad.data_ptr<float>() : nullptr;
  float* m = exp_avg.data_ptr<float>();
  float* v = exp_avg_sq.data_ptr<float>();
  at::parallel_for(0, param.numel(), kGrain, [&](int64_t begin, int64_t end) {
    if (g != nullptr) {
      Update<true>(p, g, m, v, begin, end, c);
    } else {
      Update<false>(p, g, m, v, begin, end, c);
    }
  });
}

}  // namespace DEPTHBENCH_CPU_FUSED_ISA
}  // namespace cpu_fused
}  // namespace depthbench
