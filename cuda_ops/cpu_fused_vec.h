// 8-float vectors, the build's widest float vector (VF), lane sums (one
// vector's, or many vectors' at once), a vectorised exp and tanh and a
// register-blocked rank update for the fused CPU kernels (cpu_fused_attn.cc,
// cpu_fused.cc, cpu_fused_mix.cc). Included after cpu_fused_target.h, so
// these compile for the including object's ISA, in its namespace.
#ifndef DEPTHBENCH_CUDA_OPS_CPU_FUSED_VEC_H_
#define DEPTHBENCH_CUDA_OPS_CPU_FUSED_VEC_H_

#ifndef DEPTHBENCH_CPU_FUSED_ISA
#error "include cuda_ops/cpu_fused_target.h first"
#endif

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

namespace depthbench {
namespace cpu_fused {
namespace DEPTHBENCH_CPU_FUSED_ISA {

// 8 floats as a GCC vector (lowered to two SSE halves in the baseline
// build): the attention's head-dim loops are a few vectors long, and GCC's
// auto-vectoriser left them scalar (aliasing between rows it cannot rule
// out, and an exp's clamp as control flow). The vectors never cross a
// non-inline call (the kernels using them are inline within their file), so
// the ABI note for 32-byte vectors without AVX does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"
typedef float V8f __attribute__((vector_size(32)));
typedef int32_t V8i __attribute__((vector_size(32)));
// Unaligned load and store of a GCC vector type V (V8f, VF, VD) from and
// to elements of its own type T.
template <typename V>
using VecElem = std::remove_cv_t<std::remove_reference_t<decltype(std::declval<V&>()[0])>>;
template <typename V, typename T>
inline V LoadV(const T* p) {
  static_assert(std::is_same_v<VecElem<V>, T>, "LoadV: pointer and vector element types differ");
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <typename V, typename T>
inline void StoreV(T* p, V v) {
  static_assert(std::is_same_v<VecElem<V>, T>, "StoreV: pointer and vector element types differ");
  std::memcpy(p, &v, sizeof v);
}
inline V8f Load8(const float* p) { return LoadV<V8f>(p); }
inline void Store8(float* p, V8f v) { StoreV(p, v); }
// x in every lane. Not `V8f{} + x`: 0 + x is not x for x = -0, so GCC kept
// a scalar add before each broadcast (one per coefficient in the rank
// updates).
inline V8f Broadcast8(float x) { return x - V8f{}; }

// The build's widest float vector, VF (kVF lanes): 16 floats in the AVX-512
// build, V8f otherwise. The register-blocked loops that were FMA-bound at 8
// wide (the routing projections, RankUpdateBlock, the attention's head-dim
// loops) are written over it, so the same code runs one zmm, or two ymm (two
// pairs of SSE registers in the baseline build), per 16 columns.
#if defined(DEPTHBENCH_CPU_FUSED_AVX512)
typedef float VF __attribute__((vector_size(64)));
#else
typedef V8f VF;
#endif
constexpr int kVF = static_cast<int>(sizeof(VF) / sizeof(float));

// The build's native double vector, VD (kVD lanes): one zmm (8 doubles) in
// the AVX-512 build, one ymm (4) in the AVX2 build, one xmm (2) in the
// baseline. Unlike VF it is never wider than a register: a GCC vector wider
// than the build's registers went through the stack in 16-byte pieces in
// Sinkhorn's kernels (bench/RESULTS.md, session 33).
#if defined(DEPTHBENCH_CPU_FUSED_AVX512)
typedef double VD __attribute__((vector_size(64)));
#elif defined(DEPTHBENCH_CPU_FUSED_AVX2)
typedef double VD __attribute__((vector_size(32)));
#else
typedef double VD __attribute__((vector_size(16)));
#endif
constexpr int kVD = static_cast<int>(sizeof(VD) / sizeof(double));
inline VF LoadVF(const float* p) { return LoadV<VF>(p); }
inline void StoreVF(float* p, VF v) { StoreV(p, v); }
inline VF BroadcastVF(float x) { return x - VF{}; }  // as Broadcast8

// exp(x) of 8 floats for x <= 0 (softmax terms after the max or log-sum-exp
// shift): 2^n by the exponent bits times a degree-6 polynomial on the
// remainder (Cephes' expf coefficients; relative error about 1e-7, as
// Sleef's u10 exp behind ATen's softmax). Inputs below -87 give exp(-87) ~
// 1.6e-38 instead of a denormal or zero. A libm call per element kept these
// loops scalar and cost a third of the kernel.
inline V8f Exp8(V8f x) {
  const V8f lo = Broadcast8(-87.0f);
  x = x < lo ? lo : x;
  // n = round(x / ln 2) by adding and subtracting 1.5 * 2^23.
  const V8f magic = Broadcast8(12582912.0f);
  const V8f n = (x * 1.44269504088896341f + magic) - magic;
  V8f r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  V8f p = Broadcast8(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const V8i bits = (__builtin_convertvector(n, V8i) + 127) << 23;
  V8f scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// tanh of 8 floats (Cephes' tanhf: an odd polynomial below |x| = 0.625, else
// (1 - e) / (1 + e) with e = exp(-2|x|) <= 1, Exp8's range; relative error
// about 1e-7).
inline V8f Tanh8(V8f x) {
  const V8f zero = Broadcast8(0.0f);
  const V8f a = x < zero ? -x : x;
  const V8f e = Exp8(-2.0f * a);
  const V8f big = (1.0f - e) / (1.0f + e);
  const V8f z = a * a;
  V8f p = Broadcast8(-5.70498872745e-3f);
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const V8f small = p * z * a + a;
  const V8f r = a >= Broadcast8(0.625f) ? big : small;
  return x < zero ? -r : r;
}

// dst[j * dst_ld + c] += sum_{r < R} coef[r * ld + j] vec[r][c] for j < n and
// c < C (C a multiple of kVF): the R vectors' C columns stay in R C / kVF
// registers while the n destination rows stream past (the rank-R updates of
// the attention's key and value gradients and of the routing projection's
// dw; reloading the vectors per row made those loops load-bound). At C = 16
// the vectors take 2R of the AVX2 build's 16 registers (at R = 8 some are
// reloaded from L1).
template <int R, int C = 16>
inline void RankUpdateBlock(const float* coef, int64_t ld, const float* const* vec, int64_t n,
                            float* dst, int64_t dst_ld) {
  static_assert(C % kVF == 0, "whole vectors");
  constexpr int kC = C / kVF;
  VF v[R][kC];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < kC; ++c) v[r][c] = LoadVF(vec[r] + c * kVF);
  }
  for (int64_t j = 0; j < n; ++j) {
    float* d = dst + j * dst_ld;
    VF a[kC];
    for (int c = 0; c < kC; ++c) a[c] = LoadVF(d + c * kVF);
    for (int r = 0; r < R; ++r) {
      const VF w = BroadcastVF(coef[r * ld + j]);
      for (int c = 0; c < kC; ++c) a[c] += w * v[r][c];
    }
    for (int c = 0; c < kC; ++c) StoreVF(d + c * kVF, a[c]);
  }
}

// Sum of the 8 lanes, pairwise.
inline float Sum8(V8f v) {
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}
#if defined(DEPTHBENCH_CPU_FUSED_AVX512)
// Sum of the 16 lanes: the two halves added, then pairwise.
inline float SumVF(VF v) {
  V8f lo, hi;
  std::memcpy(&lo, &v, sizeof lo);
  std::memcpy(&hi, reinterpret_cast<const char*>(&v) + sizeof lo, sizeof hi);
  return Sum8(lo + hi);
}
#else
inline float SumVF(VF v) { return Sum8(v); }
#endif
// Sum of the lanes of V8f or VF.
template <typename V>
inline float SumV(V v) {
  if constexpr (sizeof(V) == sizeof(V8f)) {
    return Sum8(v);
  } else {
    return SumVF(v);
  }
}

// SumEachVF's step at lane distance D (a power of two): lane l of the
// result is p[l] + p[l + D] where l & D is 0 and q[l - D] + q[l] where it
// is not, two two-source lane permutations and one add.
typedef int32_t VFi __attribute__((vector_size(sizeof(VF))));
template <int D, size_t... L>
inline VF FoldPair(VF p, VF q, std::index_sequence<L...>) {
  constexpr int W = kVF;
  const VFi lower{static_cast<int32_t>((L & D) != 0 ? W + L - D : L)...};
  const VFi upper{static_cast<int32_t>((L & D) != 0 ? W + L : L + D)...};
  return __builtin_shuffle(p, q, lower) + __builtin_shuffle(p, q, upper);
}
// One fold of SumEachVF at lane distance D, where the distances in Done
// (a bit mask) are folded already and only the vectors v[i] with those bits
// of i clear still hold sums: v[i] and v[i + D] into v[i].
template <int D, int Done>
inline void FoldStep(VF* v) {
  for (int i = 0; i < kVF; ++i) {
    if ((i & (Done | D)) == 0) v[i] = FoldPair<D>(v[i], v[i + D], std::make_index_sequence<kVF>{});
  }
}

// out[i] = SumVF(v[i]) for i < count, by the same additions in the same
// order (lanes l + 8 into l first in the AVX-512 build, then neighbours,
// pairs, quads), so the values are SumVF's to the bit; but kVF vectors at a
// time are folded together, lane i of the last one holding v[i]'s sum:
// about 2 permutations and an add per vector where SumVF takes a chain of
// extracts and adds per vector (at d = 128 HcWrite's backward spent about
// as long in its 20 SumVF as in its products). Lanes of different vectors
// never meet, so the zero padding past count changes nothing.
template <int count>
inline void SumEachVF(const VF* v, float* out) {
  static_assert(count >= 1, "at least one vector");
  for (int c0 = 0; c0 < count; c0 += kVF) {
    VF w[kVF];
    for (int i = 0; i < kVF; ++i) w[i] = c0 + i < count ? v[c0 + i] : VF{};
    constexpr int kFirst = kVF == 16 ? 8 : 0;
    if constexpr (kFirst != 0) FoldStep<8, 0>(w);
    FoldStep<1, kFirst>(w);
    FoldStep<2, kFirst | 1>(w);
    FoldStep<4, kFirst | 3>(w);
    float all[kVF];
    std::memcpy(all, &w[0], sizeof all);
    for (int i = 0; c0 + i < count && i < kVF; ++i) out[c0 + i] = all[i];
  }
}

// out[r] = a_r . b_r for the rows r < n <= kVF (a_r at a + r * lda, b_r at
// b + r * ldb; ldb 0: one vector b for every row) of d columns, d a
// multiple of W (itself a multiple of kVF); out needs room for kVF values.
// Each row's products go into W / kVF vectors, lane k of the W summing
// columns k, k + W, ... in order; the vectors are added and the kVF rows'
// lanes summed together (SumEachVF). So the additions are those of a
// W-partial dot folded like SumVF: W = kVF gives DotHd's values, W = 16
// Dot's (cpu_fused_mix.cc) in every build. One horizontal sum per kVF rows
// instead of a chain of lane extracts and adds per row, and kVF independent
// FMA chains instead of one.
template <int W = kVF>
inline void RowDotsVF(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t n,
                      int64_t d, float* out) {
  static_assert(W % kVF == 0, "whole vectors per chunk");
  constexpr int P = W / kVF;
  VF acc[kVF];
#pragma GCC unroll 16
  for (int r = 0; r < kVF; ++r) {
    VF part[P] = {};
    if (r < n) {
      const float* x = a + r * lda;
      const float* y = b + r * ldb;
      for (int64_t c = 0; c < d; c += W) {
#pragma GCC unroll 4
        for (int p = 0; p < P; ++p) part[p] += LoadVF(x + c + p * kVF) * LoadVF(y + c + p * kVF);
      }
    }
    acc[r] = part[0];
    for (int p = 1; p < P; ++p) acc[r] += part[p];
  }
  SumEachVF<kVF>(acc, out);
}

// ss[r] = a_r . a_r and ab[r] = a_r . b for the rows r < n <= kVF (a_r at
// a + r * lda; one vector b for every row) of d columns, d a multiple of W:
// RowDotsVF<W>(a, lda, a, lda, ...) and RowDotsVF<W>(a, lda, b, 0, ...) in
// one sweep of the rows, each sum by the same additions in the same order,
// so both values are theirs to the bit. (AttnRes's forward mix took the two
// one after the other, its tile's rows read twice.)
template <int W = kVF>
inline void RowSquaresAndDotsVF(const float* a, int64_t lda, const float* b, int64_t n, int64_t d,
                                float* ss, float* ab) {
  static_assert(W % kVF == 0, "whole vectors per chunk");
  constexpr int P = W / kVF;
  VF acc_ss[kVF], acc_ab[kVF];
#pragma GCC unroll 16
  for (int r = 0; r < kVF; ++r) {
    VF part_ss[P] = {}, part_ab[P] = {};
    if (r < n) {
      const float* x = a + r * lda;
      for (int64_t c = 0; c < d; c += W) {
#pragma GCC unroll 4
        for (int p = 0; p < P; ++p) {
          const VF xv = LoadVF(x + c + p * kVF);
          part_ss[p] += xv * xv;
          part_ab[p] += xv * LoadVF(b + c + p * kVF);
        }
      }
    }
    acc_ss[r] = part_ss[0];
    acc_ab[r] = part_ab[0];
    for (int p = 1; p < P; ++p) {
      acc_ss[r] += part_ss[p];
      acc_ab[r] += part_ab[p];
    }
  }
  SumEachVF<kVF>(acc_ss, ss);
  SumEachVF<kVF>(acc_ab, ab);
}

// The cache line, the unit the prefetches below ask for.
constexpr int64_t kLineBytes = 64;
constexpr int64_t kFloatsPerLine = kLineBytes / static_cast<int64_t>(sizeof(float));

// Asks for bytes [p, p + bytes) in L1, a line at a time, ahead of a pass
// that reads them (kForWrite: that writes them, PREFETCHW).
template <bool kForWrite = false>
inline void PrefetchL1(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t o = 0; o < bytes; o += kLineBytes) __builtin_prefetch(c + o, kForWrite ? 1 : 0, 3);
}

// Asks for the line at float offset i of each of `rows` rows d floats apart
// (kForWrite: PREFETCHW): for a kernel that sweeps a token's rows a chunk at
// a time and asks for a token ahead as it goes, a line per row per line of
// its sweep, rather than the whole token at once (PrefetchL1), whose burst
// of requests can fill the core's queue of misses.
template <bool kForWrite = false>
inline void PrefetchLineOfRows(const float* p, int rows, int64_t d, int64_t i) {
  for (int k = 0; k < rows; ++k) __builtin_prefetch(p + k * d + i, kForWrite ? 1 : 0, 3);
}

// out[k] = exp(in[k]) for 8 doubles. The wide builds call glibc's libmvec
// (the vector exp GCC itself emits under -ffast-math; within 4 ulp, its
// documented bound) at their width; the baseline build calls libm's exp per
// value. A libm call per value was most of Sinkhorn's forward, and of its
// backward's recomputation, at n = 4 (bench/RESULTS.md).
#if defined(DEPTHBENCH_CPU_FUSED_AVX512)
extern "C" VD _ZGVeN8v_exp(VD);  // libmvec, AVX-512
inline void Exp8d(const double* in, double* out) {
  StoreV(out, _ZGVeN8v_exp(LoadV<VD>(in)));
}
#elif defined(DEPTHBENCH_CPU_FUSED_AVX2)
extern "C" VD _ZGVdN4v_exp(VD);  // libmvec, AVX2
inline void Exp8d(const double* in, double* out) {
  for (int h = 0; h < 8; h += kVD) StoreV(out + h, _ZGVdN4v_exp(LoadV<VD>(in + h)));
}
#else
inline void Exp8d(const double* in, double* out) {
  for (int k = 0; k < 8; ++k) out[k] = std::exp(in[k]);
}
#endif

}  // namespace DEPTHBENCH_CPU_FUSED_ISA
}  // namespace cpu_fused
}  // namespace depthbench

#endif  // DEPTHBENCH_CUDA_OPS_CPU_FUSED_VEC_H_
