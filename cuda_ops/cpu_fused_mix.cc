// Fused CPU kernels of the multi-stream mixing ops (HC/mHC read and write,
// Sinkhorn, AttnRes depth mix) with hand-written backward passes; math as in
// the references (cuda_ops/*_ref.cc) and the CUDA kernels (*.cu). See
// cpu_fused.h.
//
// Why: as composites each connector runs ~10 ATen ops forward and ~20
// backward over [tokens, n, d] tensors (Sinkhorn: ~160 tiny ops forward and
// as many backward), which put HC, mHC and Full AttnRes at 0.57x, 0.32x and
// 0.65x of Pre-LN's tokens/s on CPU, far below their FLOP ratios (issue 18).
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include <unistd.h>

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

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Rows per parallel task for `per_row` elements of work per row: about 32k
// elements per task, as ATen's element-wise kernels.
int64_t Grain(int64_t per_row) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(per_row, 1)); }

// Dot product with 16 independent partial sums, so the compiler can
// vectorise it without reassociating a single accumulator and, in the AVX2
// build, keep two 8-wide FMA chains in flight; the partials are folded by
// a fixed tree written out (a folding loop stays scalar and, at d = 128,
// cost more than the products).
template <typename T>
inline T Dot(const T* a, const T* b, int64_t d) {
  constexpr int kParts = 16;
  T p[kParts] = {};
  int64_t j = 0;
  for (; j + kParts <= d; j += kParts) {
    for (int k = 0; k < kParts; ++k) p[k] += a[j + k] * b[j + k];
  }
  T tail = 0;
  for (; j < d; ++j) tail += a[j] * b[j];
  for (int k = 0; k < 8; ++k) p[k] += p[k + 8];
  return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7])) + tail;
}

// out[r] = Dot(x + r * ldx, y + r * ldy, d) for the rows r < n (ldy 0: one
// y for every row), to the bit; out needs room for n rounded up to kVF.
// Float rows of whole 16-column chunks go kVF at a time (RowDotsVF<16>:
// Dot's additions, without its per-row horizontal sum and single FMA chain).
template <typename T>
void DotsOfRows(const T* x, int64_t ldx, const T* y, int64_t ldy, int64_t n, int64_t d, T* out) {
  if constexpr (std::is_same_v<T, float>) {
    if (d % 16 == 0) {
      for (int64_t r0 = 0; r0 < n; r0 += kVF) {
        RowDotsVF<16>(x + r0 * ldx, ldx, y + r0 * ldy, ldy, std::min<int64_t>(kVF, n - r0), d,
                      out + r0);
      }
      return;
    }
  }
  for (int64_t r = 0; r < n; ++r) out[r] = Dot(x + r * ldx, y + r * ldy, d);
}

// ss[r] = Dot(x_r, x_r, d) and xy[r] = Dot(x_r, y, d) for the rows r < n of
// x (stride ldx), one y for every row: DotsOfRows(x, ldx, x, ldx, ...) and
// DotsOfRows(x, ldx, y, 0, ...) to the bit, float rows of whole 16-column
// chunks in one sweep (RowSquaresAndDotsVF<16>); both outputs need room for
// n rounded up to kVF.
template <typename T>
void SquaresAndDotsOfRows(const T* x, int64_t ldx, const T* y, int64_t n, int64_t d, T* ss,
                          T* xy) {
  if constexpr (std::is_same_v<T, float>) {
    if (d % 16 == 0) {
      for (int64_t r0 = 0; r0 < n; r0 += kVF) {
        RowSquaresAndDotsVF<16>(x + r0 * ldx, ldx, y, std::min<int64_t>(kVF, n - r0), d, ss + r0,
                                xy + r0);
      }
      return;
    }
  }
  for (int64_t r = 0; r < n; ++r) {
    ss[r] = Dot(x + r * ldx, x + r * ldx, d);
    xy[r] = Dot(x + r * ldx, y, d);
  }
}

// out[k] = 1 / sqrt(ss[k] / d + eps) for k < n (ss: sums of squares of
// d-long rows), the quotient in T (kDoubleQuotient: in double, as the
// routing projection's ProjectRow rounds it), the rest in double, rounded to
// T; out may be ss. In float the wide builds take 8 (AVX-512) or 4 (AVX2)
// rows per vector square root and division: correctly rounded like their
// scalar forms, so the values are the per-row loop's. std::sqrt stays scalar
// behind libm's errno check (-fno-math-errno would cost the file the shared
// precompiled header), and one such square root and division per row and
// source was about a tenth of Full AttnRes's forward mix (and about 30% of
// HC's route forward, bench/RESULTS.md session 34).
template <bool kDoubleQuotient = false, typename T>
void InvRmsOfSums(const T* ss, int64_t n, int64_t d, double eps, T* out) {
  int64_t k = 0;
  // (The masked AVX-512 forms: the unmasked ones start from
  // _mm512_undefined, which GCC 12 reports as maybe uninitialised.)
  if constexpr (std::is_same_v<T, float>) {
#if defined(DEPTHBENCH_CPU_FUSED_AVX512)
    const float df = static_cast<float>(d);
    const __m512d dd = _mm512_set1_pd(static_cast<double>(d));
    for (; k + 8 <= n; k += 8) {
      const __m256 s8 = _mm256_loadu_ps(ss + k);
      const __m512d q = kDoubleQuotient
                            ? _mm512_div_pd(_mm512_maskz_cvtps_pd(0xFF, s8), dd)
                            : _mm512_maskz_cvtps_pd(0xFF, _mm256_div_ps(s8, _mm256_set1_ps(df)));
      const __m512d x = _mm512_maskz_sqrt_pd(0xFF, _mm512_add_pd(q, _mm512_set1_pd(eps)));
      _mm256_storeu_ps(out + k,
                       _mm512_maskz_cvtpd_ps(0xFF, _mm512_div_pd(_mm512_set1_pd(1.0), x)));
    }
#elif defined(DEPTHBENCH_CPU_FUSED_AVX2)
    const float df = static_cast<float>(d);
    const __m256d dd = _mm256_set1_pd(static_cast<double>(d));
    for (; k + 4 <= n; k += 4) {
      const __m128 s4 = _mm_loadu_ps(ss + k);
      const __m256d q = kDoubleQuotient ? _mm256_div_pd(_mm256_cvtps_pd(s4), dd)
                                        : _mm256_cvtps_pd(_mm_div_ps(s4, _mm_set1_ps(df)));
      const __m256d x = _mm256_sqrt_pd(_mm256_add_pd(q, _mm256_set1_pd(eps)));
      _mm_storeu_ps(out + k, _mm256_cvtpd_ps(_mm256_div_pd(_mm256_set1_pd(1.0), x)));
    }
#endif
  }
  for (; k < n; ++k) {
    const double q = kDoubleQuotient ? static_cast<double>(ss[k]) / static_cast<double>(d)
                                     : static_cast<double>(ss[k] / d);
    out[k] = static_cast<T>(1.0 / std::sqrt(q + eps));
  }
}

// y[j] += c * x[j]
template <typename T>
inline void Axpy(T c, const T* x, T* y, int64_t d) {
  for (int64_t j = 0; j < d; ++j) y[j] += c * x[j];
}

// out[k] = exp(in[k]) for count doubles, eight at a time (Exp8d): in and
// out (which may be the same array) must hold count rounded up to a
// multiple of 8; the values past count are scratch.
inline void ExpN(const double* in, int64_t count, double* out) {
  for (int64_t k = 0; k < count; k += 8) Exp8d(in + k, out + k);
}

// Sizes of h [..., n, d] as (rows, n, d).
struct StreamShape {
  int64_t rows, n, d;
};
StreamShape StreamsOf(const torch::Tensor& h) {
  TORCH_CHECK(h.dim() >= 2, "HC streams: h needs [..., n, d], has ", h.sizes());
  const int64_t n = h.size(-2), d = h.size(-1);
  return {h.numel() / std::max<int64_t>(n * d, 1), n, d};
}

void CheckCoefficients(const char* op, const char* name, const torch::Tensor& t, int64_t rows,
                       int64_t per_row) {
  TORCH_CHECK(t.numel() == rows * per_row, op, ": ", name, " has ", t.sizes(), ", expected ",
              rows, " x ", per_row, " values (one set per token)");
}

// ---------------------------------------------------------------- HC read

// x = sum_s c[s] h[s] for one token's streams h [n, d]. Float rows of whole
// vectors sum a vector of every stream in a register and store it once (the
// plain loop below stores and reloads the row once per stream: 4-6% of HC's
// route forward, 2026-12-06, paired runs); the terms are added in its order,
// so the values are the same.
template <typename T>
inline void ReadRow(const T* hr, const T* c, int64_t n, int64_t d, T* xr) {
  if constexpr (std::is_same_v<T, float>) {
    if (d % kVF == 0 && n >= 1) {
      for (int64_t i = 0; i < d; i += kVF) {
        VF o = BroadcastVF(c[0]) * LoadVF(hr + i);
        for (int64_t k = 1; k < n; ++k) o += BroadcastVF(c[k]) * LoadVF(hr + k * d + i);
        StoreVF(xr + i, o);
      }
      return;
    }
  }
  for (int64_t j = 0; j < d; ++j) xr[j] = c[0] * hr[j];
  for (int64_t k = 1; k < n; ++k) Axpy(c[k], hr + k * d, xr, d);
}

// x [..., d] = sum_s read[r, s] h[r, s] for contiguous h [..., n, d] and
// read [rows * n] (HcRead's forward and the mHC route's read).
torch::Tensor ReadStreams(const torch::Tensor& h, const torch::Tensor& read) {
  const StreamShape s = StreamsOf(h);
  std::vector<int64_t> out_sizes(h.sizes().begin(), h.sizes().end() - 2);
  out_sizes.push_back(s.d);
  torch::Tensor x = torch::empty(out_sizes, h.options());
  AT_DISPATCH_FLOATING_TYPES(h.scalar_type(), "cpu_fused::HcRead", [&] {
    const scalar_t* hp = h.data_ptr<scalar_t>();
    const scalar_t* rp = read.data_ptr<scalar_t>();
    scalar_t* xp = x.data_ptr<scalar_t>();
    at::parallel_for(0, s.rows, Grain(s.n * s.d), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        ReadRow(hp + r * s.n * s.d, rp + r * s.n, s.n, s.d, xp + r * s.d);
      }
    });
  });
  return x;
}

class HcReadFunction : public torch::autograd::Function<HcReadFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& h_in,
                               const torch::Tensor& read_in) {
    torch::Tensor h = h_in.contiguous(), read = read_in.contiguous();
    const StreamShape s = StreamsOf(h);
    CheckCoefficients("HcRead", "read", read, s.rows, s.n);
    torch::Tensor x = ReadStreams(h, read);
    ctx->save_for_backward({h, read});
    return x;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list saved = ctx->get_saved_variables();
    const torch::Tensor& h = saved[0];
    const torch::Tensor& read = saved[1];
    torch::Tensor dx = grads[0].contiguous();
    const StreamShape s = StreamsOf(h);
    torch::Tensor dh = torch::empty_like(h);
    torch::Tensor dread = torch::empty_like(read);
    AT_DISPATCH_FLOATING_TYPES(h.scalar_type(), "cpu_fused::HcReadBackward", [&] {
      const scalar_t* hp = h.data_ptr<scalar_t>();
      const scalar_t* rp = read.data_ptr<scalar_t>();
      const scalar_t* gp = dx.data_ptr<scalar_t>();
      scalar_t* dhp = dh.data_ptr<scalar_t>();
      scalar_t* drp = dread.data_ptr<scalar_t>();
      at::parallel_for(0, s.rows, Grain(2 * s.n * s.d), [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const scalar_t* g = gp + r * s.d;
          for (int64_t k = 0; k < s.n; ++k) {
            const int64_t off = (r * s.n + k) * s.d;
            const scalar_t c = rp[r * s.n + k];
            scalar_t* o = dhp + off;
            for (int64_t j = 0; j < s.d; ++j) o[j] = c * g[j];
            drp[r * s.n + k] = Dot(hp + off, g, s.d);
          }
        }
      });
    });
    return {dh, dread};
  }
};

// --------------------------------------------------------------- HC write

// One token's HcWrite with the mix, N streams, d a multiple of kVF, in
// float: o_t = b_t y + sum_s a[s, t] h_s, one kVF-wide chunk of every stream
// at a time with the chunks of h in registers (the plain loop below sweeps
// each output stream n + 1 times). Terms are added in the plain loop's
// order, so both give the same values.
// ph, pout (both null or neither): the rows of h and out of a token ahead,
// asked for (out for writing) a line per stream at each 64 bytes of the
// sweep, as in WriteBackwardTokenBlocked below.
template <int N>
inline void WriteTokenBlocked(const float* hr, const float* ar, const float* br, const float* yr,
                              int64_t d, float* out, const float* ph = nullptr,
                              float* pout = nullptr) {
  for (int64_t i = 0; i < d; i += kVF) {
    if (ph != nullptr && i % kFloatsPerLine == 0) {
      PrefetchLineOfRows(ph, N, d, i);
      PrefetchLineOfRows<true>(pout, N, d, i);
    }
    VF hv[N];
    for (int k = 0; k < N; ++k) hv[k] = LoadVF(hr + k * d + i);
    const VF yv = LoadVF(yr + i);
    for (int t = 0; t < N; ++t) {
      VF o = BroadcastVF(br[t]) * yv;
      for (int k = 0; k < N; ++k) o += BroadcastVF(ar[k * N + t]) * hv[k];
      StoreVF(out + t * d + i, o);
    }
  }
}

// One token's HcWrite backward, N streams, d a multiple of kVF, in float:
//   dy = sum_t b_t g_t, db_t = g_t . y, and with the mix
//   dh_s = sum_t a[s, t] g_t, da[s, t] = h_s . g_t
// in one sweep of the token's rows, the N (N + 1) dot products as
// lane-wise partial sums in registers, reduced together at the end
// (SumEachVF; the plain loop ran N (N + 1) separate dot products, each with
// its own reduction, and N + 1 sweeps of each output row). In the AVX-512 build the
// partial sums and their reduction are Dot's, so the values are the plain
// loop's; in the others they differ from it by float rounding.
// ph, pg, py (each may be null; ph unused without the mix, which reads no
// h): the rows of h, g and y of a token ahead, asked for in L1 a line per
// stream at each 64 bytes of the sweep (PrefetchLineOfRows). Asked
// for all at once before each token (9 KB at n = 4, d = 128), the requests
// filled the core's queue of misses and the prefetch instructions stalled
// (29% of the function's samples); spread over the sweep they overlap its
// arithmetic: the backward 20-25% faster in the model (bench/RESULTS.md,
// session 32).
template <int N, bool kMix>
inline void WriteBackwardTokenBlocked(const float* hr, const float* ar, const float* br,
                                      const float* yr, const float* gr, int64_t d, float* dhr,
                                      float* dar, float* dbr, float* dyr,
                                      const float* ph = nullptr, const float* pg = nullptr,
                                      const float* py = nullptr) {
  VF da_acc[kMix ? N : 1][N] = {};
  VF db_acc[N] = {};
  for (int64_t i = 0; i < d; i += kVF) {
    if (i % kFloatsPerLine == 0) {
      if (kMix && ph != nullptr) PrefetchLineOfRows(ph, N, d, i);  // h is read only with the mix
      if (pg != nullptr) PrefetchLineOfRows(pg, N, d, i);
      if (py != nullptr) PrefetchLineOfRows(py, 1, d, i);
    }
    VF gv[N];
    for (int t = 0; t < N; ++t) gv[t] = LoadVF(gr + t * d + i);
    const VF yv = LoadVF(yr + i);
    VF dy = BroadcastVF(br[0]) * gv[0];
    for (int t = 1; t < N; ++t) dy += BroadcastVF(br[t]) * gv[t];
    StoreVF(dyr + i, dy);
    for (int t = 0; t < N; ++t) db_acc[t] += gv[t] * yv;
    if constexpr (kMix) {
      for (int k = 0; k < N; ++k) {
        const VF hv = LoadVF(hr + k * d + i);
        VF o = BroadcastVF(ar[k * N]) * gv[0];
        for (int t = 1; t < N; ++t) o += BroadcastVF(ar[k * N + t]) * gv[t];
        StoreVF(dhr + k * d + i, o);
        for (int t = 0; t < N; ++t) da_acc[k][t] += hv * gv[t];
      }
    }
  }
  SumEachVF<N>(db_acc, dbr);
  if constexpr (kMix) SumEachVF<N * N>(&da_acc[0][0], dar);
}

// One token's HcWrite, any dtype and shape: out_t = b_t y + sum_s a[s, t] h_s
// (ar: a [n, n], a[s, t] at ar[s n + t]), or out_t = h_t + b_t y with ar
// null (the code form). The loops WriteTokenBlocked's terms follow.
template <typename T>
inline void WriteTokenPlain(const T* hr, const T* ar, const T* br, const T* yr, int64_t n,
                            int64_t d, T* out) {
  for (int64_t t = 0; t < n; ++t) {
    T* o = out + t * d;
    const T bt = br[t];
    if (ar != nullptr) {
      for (int64_t j = 0; j < d; ++j) o[j] = bt * yr[j];
      for (int64_t k = 0; k < n; ++k) Axpy(ar[k * n + t], hr + k * d, o, d);
    } else {
      const T* ht = hr + t * d;
      for (int64_t j = 0; j < d; ++j) o[j] = ht[j] + bt * yr[j];
    }
  }
}

// Its backward for the gradient g [n, d] of out: dy = sum_t b_t g_t,
// db_t = g_t . y, and with the mix (ar not null) dh_s = sum_t a[s, t] g_t
// and da[s, t] = h_s . g_t. dhr must not overlap g.
template <typename T>
inline void WriteBackwardTokenPlain(const T* hr, const T* ar, const T* br, const T* yr,
                                    const T* gr, int64_t n, int64_t d, T* dhr, T* dar, T* dbr,
                                    T* dyr) {
  for (int64_t j = 0; j < d; ++j) dyr[j] = br[0] * gr[j];
  for (int64_t t = 1; t < n; ++t) Axpy(br[t], gr + t * d, dyr, d);
  for (int64_t t = 0; t < n; ++t) dbr[t] = Dot(gr + t * d, yr, d);
  if (ar == nullptr) return;
  for (int64_t k = 0; k < n; ++k) {
    T* o = dhr + k * d;
    for (int64_t j = 0; j < d; ++j) o[j] = ar[k * n] * gr[j];
    for (int64_t t = 1; t < n; ++t) Axpy(ar[k * n + t], gr + t * d, o, d);
    for (int64_t t = 0; t < n; ++t) dar[k * n + t] = Dot(hr + k * d, gr + t * d, d);
  }
}

// Runs fn(std::integral_constant<int, N>) for the stream counts with a
// register-blocked HcWrite (1..kMaxBlockedStreams; at more streams the N^2
// partial sums no longer fit in registers) and returns true, or returns
// false.
constexpr int64_t kMaxBlockedStreams = 4;
template <typename Fn>
bool WithBlockedStreams(int64_t n, Fn&& fn) {
  switch (n) {
    case 1: fn(std::integral_constant<int, 1>{}); return true;
    case 2: fn(std::integral_constant<int, 2>{}); return true;
    case 3: fn(std::integral_constant<int, 3>{}); return true;
    case 4: fn(std::integral_constant<int, 4>{}); return true;
    default: return false;
  }
}

// HcWrite's shape checks (HcWrite, HcWriteRoute: `op` names it); a
// undefined: the code form.
StreamShape CheckWriteArguments(const char* op, const torch::Tensor& h, const torch::Tensor& a,
                                const torch::Tensor& b, const torch::Tensor& y) {
  const StreamShape s = StreamsOf(h);
  if (a.defined()) CheckCoefficients(op, "a", a, s.rows, s.n * s.n);
  CheckCoefficients(op, "b", b, s.rows, s.n);
  CheckCoefficients(op, "y", y, s.rows, s.d);
  return s;
}

// HcWrite's forward for the tokens [begin, end) of h [tokens, n, d] (ap
// null: the code form) into out, each token handed to then(t) once written
// (HcWriteRoute routes it while it is in L1).
template <typename T, typename Then>
void WriteTokens(const T* hp, const T* ap, const T* bp, const T* yp, int64_t n, int64_t d, T* op,
                 int64_t begin, int64_t end, const Then& then) {
  if constexpr (std::is_same_v<T, float>) {
    if (ap != nullptr && d % kVF == 0 && WithBlockedStreams(n, [&](auto nc) {
          constexpr int N = decltype(nc)::value;
          // The output rows kAhead tokens ahead asked for in L1 for
          // writing (and h's for reading): out is a fresh tensor, so each
          // store waited for its line to come from memory; 13-19% of the
          // forward write (2026-12-06, paired runs). Since 2026-12-07 the
          // kernel asks for them a line per stream per 64 bytes of its
          // sweep (ph, pout), not all at once ahead of the token (see
          // WriteBackwardTokenBlocked).
          constexpr int64_t kAhead = 4;
          for (int64_t t = begin; t < end; ++t) {
            const bool pf = t + kAhead < end;
            WriteTokenBlocked<N>(hp + t * N * d, ap + t * N * N, bp + t * N, yp + t * d, d,
                                 op + t * N * d, pf ? hp + (t + kAhead) * N * d : nullptr,
                                 pf ? op + (t + kAhead) * N * d : nullptr);
            then(t);
          }
        })) {
      return;
    }
  }
  for (int64_t t = begin; t < end; ++t) {
    WriteTokenPlain(hp + t * n * d, ap != nullptr ? ap + t * n * n : nullptr, bp + t * n,
                    yp + t * d, n, d, op + t * n * d);
    then(t);
  }
}

// HcWrite's backward for the tokens [begin, end) (those before `limit`
// are the task's), from the gradient g of its output (dhp, dap null: the
// code form, whose dh is g). dhp may be gp itself (in place: the register-blocked kernel reads each
// chunk of a token's g before it writes that chunk of dh; the plain loops
// take a copy of the token's g first). The kernel asks for h, y and, with
// prefetch_g, g of a token kPrefetchTokens ahead, below limit
// (HcWriteRoute's g ahead is not computed yet when a token is done).
template <typename T>
void WriteBackwardTokens(const T* hp, const T* ap, const T* bp, const T* yp, const T* gp,
                         int64_t n, int64_t d, T* dhp, T* dap, T* dbp, T* dyp, int64_t begin,
                         int64_t end, int64_t limit, bool prefetch_g) {
  if constexpr (std::is_same_v<T, float>) {
    if (d % kVF == 0 && WithBlockedStreams(n, [&](auto nc) {
          constexpr int N = decltype(nc)::value;
          // The rows of h, g and y kPrefetchTokens tokens ahead asked for in
          // L1: the loads of h stalled this loop (h, saved by the forward,
          // comes from L3); 2-3% of HC's connector (mix_ops_bench,
          // 2026-12-05). Asked for during the sweep of the token in hand
          // since 2026-12-07.
          constexpr int64_t kPrefetchTokens = 8;
          for (int64_t t = begin; t < end; ++t) {
            const int64_t nd = t * N * d;
            // The token ahead's rows (null past the task's end).
            const bool pf = t + kPrefetchTokens < limit;
            const int64_t pn = (t + kPrefetchTokens) * N * d;
            const float* pg = pf && prefetch_g ? gp + pn : nullptr;
            const float* py = pf ? yp + (t + kPrefetchTokens) * d : nullptr;
            if (ap != nullptr) {
              WriteBackwardTokenBlocked<N, true>(hp + nd, ap + t * N * N, bp + t * N, yp + t * d,
                                                 gp + nd, d, dhp + nd, dap + t * N * N,
                                                 dbp + t * N, dyp + t * d, pf ? hp + pn : nullptr,
                                                 pg, py);
            } else {
              WriteBackwardTokenBlocked<N, false>(hp + nd, nullptr, bp + t * N, yp + t * d,
                                                  gp + nd, d, nullptr, nullptr, dbp + t * N,
                                                  dyp + t * d, nullptr, pg, py);
            }
          }
        })) {
      return;
    }
  }
  std::vector<T> copy(dhp == gp ? static_cast<size_t>(n * d) : 0);
  for (int64_t t = begin; t < end; ++t) {
    const int64_t nd = t * n * d;
    const T* g = gp + nd;
    if (!copy.empty()) {
      std::copy(g, g + n * d, copy.begin());
      g = copy.data();
    }
    WriteBackwardTokenPlain(hp + nd, ap != nullptr ? ap + t * n * n : nullptr, bp + t * n,
                            yp + t * d, g, n, d, dhp != nullptr ? dhp + nd : nullptr,
                            dap != nullptr ? dap + t * n * n : nullptr, dbp + t * n, dyp + t * d);
  }
}

class HcWriteFunction : public torch::autograd::Function<HcWriteFunction> {
 public:
  // mix false: identity residual map (the HC code form); `a_in` is then an
  // empty placeholder (autograd functions take no undefined inputs).
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& h_in,
                               const torch::Tensor& a_in, const torch::Tensor& b_in,
                               const torch::Tensor& y_in, bool mix) {
    torch::Tensor h = h_in.contiguous(), b = b_in.contiguous(), y = y_in.contiguous();
    torch::Tensor a = mix ? a_in.contiguous() : torch::Tensor();
    const StreamShape s = CheckWriteArguments("HcWrite", h, a, b, y);
    torch::Tensor out = torch::empty_like(h);
    AT_DISPATCH_FLOATING_TYPES(h.scalar_type(), "cpu_fused::HcWrite", [&] {
      const scalar_t* ap = mix ? a.data_ptr<scalar_t>() : nullptr;
      at::parallel_for(0, s.rows, Grain(s.n * s.n * s.d), [&](int64_t begin, int64_t end) {
        WriteTokens(h.data_ptr<scalar_t>(), ap, b.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(),
                    s.n, s.d, out.data_ptr<scalar_t>(), begin, end, [](int64_t) {});
      });
    });
    ctx->save_for_backward({h, mix ? a : torch::Tensor(), b, y});
    ctx->saved_data["mix"] = mix;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list saved = ctx->get_saved_variables();
    const bool mix = ctx->saved_data["mix"].toBool();
    const torch::Tensor& h = saved[0];
    const torch::Tensor& a = saved[1];
    const torch::Tensor& b = saved[2];
    const torch::Tensor& y = saved[3];
    torch::Tensor g = grads[0].contiguous();
    const StreamShape s = StreamsOf(h);
    // The register-blocked kernel reads a token's whole chunk of g before it
    // writes that chunk of dh, so with the mix it may write dh over g when
    // g is a gradient nobody else sees (TakeOwnedGradient: the next route's
    // returned stream gradient): one [tokens, n, d] tensor less to allocate
    // and stream through the cache per connector.
    const bool blocked = h.scalar_type() == torch::kFloat && s.d % kVF == 0 && s.n >= 1 &&
                         s.n <= kMaxBlockedStreams;
    const bool in_place =
        mix && blocked && TakeOwnedGradient(grads[0], h.sizes(), h.scalar_type());
    torch::Tensor dh = mix && !in_place ? torch::empty_like(h) : g;
    torch::Tensor da = mix ? torch::empty_like(a) : torch::Tensor();
    torch::Tensor db = torch::empty_like(b);
    torch::Tensor dy = torch::empty_like(y);
    AT_DISPATCH_FLOATING_TYPES(h.scalar_type(), "cpu_fused::HcWriteBackward", [&] {
      const scalar_t* hp = h.data_ptr<scalar_t>();
      const scalar_t* ap = mix ? a.data_ptr<scalar_t>() : nullptr;
      const scalar_t* bp = b.data_ptr<scalar_t>();
      const scalar_t* yp = y.data_ptr<scalar_t>();
      const scalar_t* gp = g.data_ptr<scalar_t>();
      scalar_t* dhp = mix ? dh.data_ptr<scalar_t>() : nullptr;
      scalar_t* dap = mix ? da.data_ptr<scalar_t>() : nullptr;
      scalar_t* dbp = db.data_ptr<scalar_t>();
      scalar_t* dyp = dy.data_ptr<scalar_t>();
      at::parallel_for(0, s.rows, Grain(3 * s.n * s.n * s.d), [&](int64_t begin, int64_t end) {
        WriteBackwardTokens(hp, ap, bp, yp, gp, s.n, s.d, dhp, dap, dbp, dyp, begin, end, end,
                            /*prefetch_g=*/true);
      });
    });
    // A new dh (mix) is the route's to take over; without the mix dh is g,
    // whose mark, if any, stays for the route as well.
    if (mix) MarkOwnedGradient(dh);
    return {dh, da, db, dy, torch::Tensor()};
  }
};

// ------------------------------------------------- RMS-normalised projection

// Rows of x accumulated in the working precision before a parameter-gradient
// partial is added into its double per-thread sum.
constexpr int64_t kFlushRows = 16;
// RmsProject's backward: rows whose dw terms are added in one sweep of the
// block (written out as four in the loop).
constexpr int64_t kGroup = 4;
// Columns per block of the backward's register-blocked products (GroupDx,
// GroupDw): two vectors, so each row's sum over the weight rows runs as two
// independent FMA chains (at one 16-wide vector per row, the AVX-512 build
// waited on the FMA latency). 16 at 8 wide, 32 at 16.
constexpr int64_t kRouteCols = 2 * kVF;
// How many rows ahead ProjectBackwardRows prefetches.
constexpr int64_t kPrefetchRows = 8;

// One row of the projection: *rs = rsqrt(mean(x^2) + eps), u[j] = rs x . wt[j].
template <typename T>
inline void ProjectRow(const T* xr, const T* wp, int64_t k, int64_t m, double eps, T* rs, T* ur) {
  const T inv = static_cast<T>(
      1.0 / std::sqrt(static_cast<double>(Dot(xr, xr, k)) / static_cast<double>(k) + eps));
  *rs = inv;
  for (int64_t j = 0; j < m; ++j) ur[j] = inv * Dot(xr, wp + j * k, k);
}

// ProjectRow for `count` <= kGroup consecutive rows x (stride k) into rs
// [count] and u [count][m]. In float with k a multiple of kVF, register-
// blocked: two weight rows against all the rows at once, so the m x k
// weights (48 KB for mHC at d = 128, past L1) stream once per group
// instead of once per row, and the group's 2 kGroup sums reduced together
// (SumEachVF).
template <typename T>
inline void ProjectGroup(const T* x, int64_t count, const T* wp, int64_t k, int64_t m, double eps,
                         T* rs, T* u) {
  if constexpr (std::is_same_v<T, float>) {
    if (k % kVF == 0) {
      const float* xs[kGroup];
      for (int64_t q = 0; q < kGroup; ++q) {
        xs[q] = x + std::min(q, count - 1) * k;  // rows past the end: a copy (unused)
      }
      // The group's sums of squares (Dot's values) and their rsqrt a vector
      // at a time: the per-row scalar chain (a reduction, then a double
      // square root and division) held up HC's route forward, about 30%
      // of its samples (bench/RESULTS.md, session 34).
      float ss[kVF > kGroup ? kVF : kGroup];
      DotsOfRows(x, k, x, k, count, k, ss);
      InvRmsOfSums</*kDoubleQuotient=*/true>(ss, count, k, eps, rs);
      for (int64_t j = 0; j < m; j += 2) {
        const float* w0 = wp + j * k;
        const float* w1 = j + 1 < m ? w0 + k : w0;  // odd m: the last row twice (unused)
        VF a[kGroup][2] = {};
        for (int64_t i = 0; i < k; i += kVF) {
          const VF v0 = LoadVF(w0 + i), v1 = LoadVF(w1 + i);
          for (int q = 0; q < kGroup; ++q) {
            const VF xv = LoadVF(xs[q] + i);
            a[q][0] += xv * v0;
            a[q][1] += xv * v1;
          }
        }
        float sums[2 * kGroup];
        SumEachVF<2 * kGroup>(&a[0][0], sums);
        for (int64_t q = 0; q < count; ++q) {
          u[q * m + j] = rs[q] * sums[2 * q];
          if (j + 1 < m) u[q * m + j + 1] = rs[q] * sums[2 * q + 1];
        }
      }
      return;
    }
  }
  for (int64_t q = 0; q < count; ++q) ProjectRow(x + q * k, wp, k, m, eps, rs + q, u + q * m);
}

// The projection u [rows, m] = rs * (x2 wt^T), rs [rows, 1] = rsqrt(mean(x2^2)
// + eps) per row, for x2 [rows, K] and wt [m, K] (one row per output); the
// normalised rows are never written out.
struct Projection {
  torch::Tensor u, rs;
};
Projection ProjectRows(const torch::Tensor& x2, const torch::Tensor& wt, double eps) {
  const int64_t rows = x2.size(0), k = x2.size(1), m = wt.size(0);
  Projection p{torch::empty({rows, m}, x2.options()), torch::empty({rows, 1}, x2.options())};
  AT_DISPATCH_FLOATING_TYPES(x2.scalar_type(), "cpu_fused::RmsProject", [&] {
    const scalar_t* xp = x2.data_ptr<scalar_t>();
    const scalar_t* wp = wt.data_ptr<scalar_t>();
    scalar_t* rp = p.rs.data_ptr<scalar_t>();
    scalar_t* up = p.u.data_ptr<scalar_t>();
    at::parallel_for(0, rows, Grain((m + 1) * k), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; r += kGroup) {
        ProjectGroup(xp + r * k, std::min(kGroup, end - r), wp, k, m, eps, rp + r, up + r * m);
      }
    });
  });
  return p;
}

// The projection backward's two products for a group of kGroup rows in
// float with k a multiple of kRouteCols, register-blocked: kRouteCols
// columns of the kGroup rows' outputs stay in registers while the m weight
// (or dw) rows stream past, so each weight row is read once per group
// instead of once per row and the dw block once per group with no reloads
// of x (the per-row loops below were bound by L1 misses on the m x k
// weights, 48 KB for mHC at d = 128). dp: [kGroup][m] (rows past the end zero); xs: the group's rows;
// ins: gradient rows already arriving for them (null: none); reads / dreads
// (null: none): the fused HcRead term of each row, whose columns
// [s d, (s + 1) d) add reads[q][s] dreads[q] (d a multiple of kRouteCols).
//   o_q  = c_q x_q + in_q + sum_j dp[q][j] w_j [+ read term]  (dx rows; o_q null: skipped)
//   blk_j += sum_q dp[q][j] x_q                  (dw^T rows)
inline void GroupDx(const float* dp, const float* const* xs, const float* cs,
                    const float* const* ins, const float* wp, int64_t k, int64_t m,
                    float* const* o, const float* const* reads = nullptr,
                    const float* const* dreads = nullptr, int64_t d = 0) {
  constexpr int kC = kRouteCols / kVF;
  for (int64_t i = 0; i < k; i += kRouteCols) {
    VF acc[kGroup][kC];
    for (int q = 0; q < kGroup; ++q) {
      const VF c = BroadcastVF(cs[q]);
      for (int v = 0; v < kC; ++v) {
        acc[q][v] = c * LoadVF(xs[q] + i + v * kVF);
        if (ins[q] != nullptr) acc[q][v] += LoadVF(ins[q] + i + v * kVF);
      }
    }
    for (int64_t j = 0; j < m; ++j) {
      VF w[kC];
      for (int v = 0; v < kC; ++v) w[v] = LoadVF(wp + j * k + i + v * kVF);
      for (int q = 0; q < kGroup; ++q) {
        const VF b = BroadcastVF(dp[q * m + j]);
        for (int v = 0; v < kC; ++v) acc[q][v] += b * w[v];
      }
    }
    if (reads != nullptr) {
      const int64_t st = i / d, off = i - st * d;
      for (int q = 0; q < kGroup; ++q) {
        if (reads[q] == nullptr) continue;
        const VF c = BroadcastVF(reads[q][st]);
        for (int v = 0; v < kC; ++v) acc[q][v] += c * LoadVF(dreads[q] + off + v * kVF);
      }
    }
    for (int q = 0; q < kGroup; ++q) {
      if (o[q] == nullptr) continue;
      for (int v = 0; v < kC; ++v) StoreVF(o[q] + i + v * kVF, acc[q][v]);
    }
  }
}
template <int R>
inline void GroupDw(const float* dp, const float* const* xs, int64_t k, int64_t m, float* block) {
  for (int64_t i = 0; i < k; i += kRouteCols) {
    const float* x[R];
    for (int q = 0; q < R; ++q) x[q] = xs[q] + i;
    RankUpdateBlock<R, kRouteCols>(dp, m, x, m, block + i, k);
  }
}

// The rows kernel of ProjectBackward: du_row(r, scratch) returns row r of du
// ([m]; it may compute it into `scratch`, m values of this thread's own).
// readp/dreadp: the fused HcRead term, or null: row r holds n streams of
// k / n values and belongs to token r / rows_per_token, whose read gradient
// is dreadp[token * k / n ...]; stream s of row r gets readp[r n + s] times it
// (mHC: a row is a token's n streams; HC: a row is one stream, n = 1).
// dx_in: a gradient already arriving for x ([rows, k]; a route's pass-through
// of its streams), added into dx in the same pass; null: none.
// after_rows(r0, r1, end): called once the dx rows [r0, r1) are final, in
// row order, by the thread whose rows [., end) they are; the rows are split
// between threads at whole tokens (rows_per_token), so a token's rows are
// all one thread's (HcWriteRoute's backward goes on with each finished
// token while its rows are in L1).
struct NoAfterRows {
  void operator()(int64_t, int64_t, int64_t) const {}
};
template <typename T, typename DuRow, typename AfterRows = NoAfterRows>
void ProjectBackwardRows(const T* xp, const T* wp, const T* rp, const T* upp, int64_t rows,
                         int64_t k, int64_t m, const T* readp, const T* dreadp, int64_t n,
                         int64_t rows_per_token, std::vector<double>& partial, const T* dx_in,
                         T* dxp, const DuRow& du_row, const AfterRows& after_rows = AfterRows()) {
  const int64_t d = k / n;
  // float rows of a multiple of kRouteCols: GroupDx / GroupDw.
  const bool blocked = std::is_same_v<T, float> && k % kRouteCols == 0;
  // The read term goes into GroupDx's sums before their one store where
  // the kRouteCols-column blocks do not straddle streams (the Axpy below
  // reloaded and stored each dx row again: 2-5% of HC's mix backward,
  // 2026-12-06, paired runs); the same additions.
  const bool read_in_dx = blocked && readp != nullptr && d % kRouteCols == 0;
  TORCH_INTERNAL_ASSERT(rows_per_token >= 1 && rows % rows_per_token == 0);
  const int64_t grain = std::max<int64_t>(1, Grain(3 * m * k) / rows_per_token);
  at::parallel_for(0, rows / rows_per_token, grain, [&](int64_t token_begin, int64_t token_end) {
    const int64_t begin = token_begin * rows_per_token, end = token_end * rows_per_token;
    double* acc = partial.data() + at::get_thread_num() * m * k;
    std::vector<T> block(static_cast<size_t>(m * k), 0);  // dw^T of <= kFlushRows rows
    // dp and the rows of the last two groups ([2 kGroup][m]; rows past the
    // end: 0): the blocked dw update takes two groups at once (each block
    // row loaded and stored once per 2 kGroup rows: the block, 48 KB at
    // mHC's m x k, lives in L2, and its traffic bound the backward). The
    // terms are added in the same order either way.
    std::vector<T> dp_pair(static_cast<size_t>(2 * kGroup * m)), scratch(static_cast<size_t>(m));
    const T* xs_pair[2 * kGroup];
    int half = 0;  // which group of the pair is in hand
    int64_t pending = 0;
    for (int64_t r0 = begin; r0 < end; r0 += kGroup) {
      const int64_t n_rows = std::min<int64_t>(kGroup, end - r0);
      T* const dp = dp_pair.data() + half * kGroup * m;
      const T** xs = xs_pair + half * kGroup;
      const T* ins[kGroup];
      T cs[kGroup];
      T* os[kGroup];
      for (int64_t q = 0; q < kGroup; ++q) {
        T* dq = dp + q * m;
        xs[q] = xp + (r0 + std::min(q, n_rows - 1)) * k;
        ins[q] = dx_in != nullptr && q < n_rows ? dx_in + (r0 + q) * k : nullptr;
        cs[q] = 0;
        os[q] = nullptr;
        if (q >= n_rows) {
          std::fill(dq, dq + m, T(0));
          continue;
        }
        const int64_t r = r0 + q;
        // Row r + kPrefetchRows of x (and of the arriving gradients) asked
        // for in L1, one row per row done: x, saved by the forward, comes
        // from memory in a training step, and HC's first read of a row
        // (du_row's dot product with the read gradient) waited on it. Asked
        // for a group at a time (before 2026-12-07), the requests filled
        // the core's queue of misses and the prefetch instructions
        // themselves stalled (a quarter of the function's samples in the
        // model); one row at a time they overlap the rows' arithmetic.
        if (const int64_t ahead = r + kPrefetchRows; ahead < end) {
          PrefetchL1(xp + ahead * k, k * sizeof(T));
          if (dx_in != nullptr) PrefetchL1(dx_in + ahead * k, k * sizeof(T));
          if (dreadp != nullptr && ahead % rows_per_token == 0) {
            PrefetchL1(dreadp + (ahead / rows_per_token) * d, d * sizeof(T));
          }
        }
        const T* g = du_row(r, scratch.data());
        const T inv = rp[r];
        T gu = 0;
        for (int64_t j = 0; j < m; ++j) {
          dq[j] = inv * g[j];
          gu += g[j] * upp[r * m + j];
        }
        // dx row = c x + dp w^T.
        cs[q] = -inv * inv * gu / static_cast<T>(k);
        os[q] = dxp + r * k;
      }
      if constexpr (std::is_same_v<T, float>) {
        if (blocked) {
          const float* reads[kGroup] = {};
          const float* dreads[kGroup] = {};
          for (int64_t q = 0; read_in_dx && q < n_rows; ++q) {
            reads[q] = readp + (r0 + q) * n;
            dreads[q] = dreadp + ((r0 + q) / rows_per_token) * d;
          }
          GroupDx(dp, xs, cs, ins, wp, k, m, os, read_in_dx ? reads : nullptr, dreads, d);
        }
      }
      for (int64_t q = 0; q < n_rows; ++q) {
        const int64_t r = r0 + q;
        T* o = os[q];
        if (!blocked) {
          const T* dq = dp + q * m;
          const T* xr = xs[q];
          // ins[q] may be o (a taken-over gradient): read before written.
          if (ins[q] != nullptr) {
            for (int64_t i = 0; i < k; ++i) o[i] = cs[q] * xr[i] + ins[q][i];
          } else {
            for (int64_t i = 0; i < k; ++i) o[i] = cs[q] * xr[i];
          }
          // Four weight rows per sweep of o: one load and store per four
          // products.
          int64_t j = 0;
          for (; j + 4 <= m; j += 4) {
            const T a0 = dq[j], a1 = dq[j + 1], a2 = dq[j + 2], a3 = dq[j + 3];
            const T *w0 = wp + j * k, *w1 = w0 + k, *w2 = w1 + k, *w3 = w2 + k;
            for (int64_t i = 0; i < k; ++i) o[i] += (a0 * w0[i] + a1 * w1[i]) + (a2 * w2[i] + a3 * w3[i]);
          }
          for (; j < m; ++j) Axpy(dq[j], wp + j * k, o, k);
        }
        if (readp != nullptr && !read_in_dx) {
          const T* dr = dreadp + (r / rows_per_token) * d;
          for (int64_t s = 0; s < n; ++s) Axpy(readp[r * n + s], dr, o + s * d, d);
        }
      }
      after_rows(r0, r0 + n_rows, end);
      // dw^T rows += the pair's 2 kGroup rank-1 terms (or one group's
      // before a flush): one load and store of the block per 2 kGroup
      // products.
      pending += n_rows;
      const bool flush = pending >= kFlushRows || r0 + n_rows == end;
      if constexpr (std::is_same_v<T, float>) {
        if (blocked) {
          if (half == 1) {
            GroupDw<2 * kGroup>(dp_pair.data(), xs_pair, k, m, block.data());
          } else if (flush) {
            GroupDw<kGroup>(dp_pair.data(), xs_pair, k, m, block.data());
          }
          half = half == 0 && !flush ? 1 : 0;
        }
      }
      if (!blocked) {
        for (int64_t j = 0; j < m; ++j) {
          const T d0 = dp[j], d1 = dp[m + j], d2 = dp[2 * m + j], d3 = dp[3 * m + j];
          const T *x0 = xs[0], *x1 = xs[1], *x2r = xs[2], *x3 = xs[3];
          T* b = block.data() + j * k;
          for (int64_t i = 0; i < k; ++i) b[i] += (d0 * x0[i] + d1 * x1[i]) + (d2 * x2r[i] + d3 * x3[i]);
        }
      }
      if (flush) {
        for (int64_t e = 0; e < m * k; ++e) acc[e] += block[static_cast<size_t>(e)];
        std::fill(block.begin(), block.end(), T(0));
        pending = 0;
      }
    }
  });
}

// The projection's backward for du [rows, m]: {dx [rows, K], dw^T [m, K]}.
// With p = x w (= u / rs), per row:
//   dp = rs du;  dw = x^T dp;  dx = dp w^T - (rs^2 / K) (du . u) x
// (the last term is d rs / dx = -rs^3 x / K times du . p).
std::pair<torch::Tensor, torch::Tensor> ProjectBackward(const torch::Tensor& x2,
                                                        const torch::Tensor& w,
                                                        const torch::Tensor& rs,
                                                        const torch::Tensor& u,
                                                        const torch::Tensor& du) {
  const int64_t rows = x2.size(0), k = x2.size(1), m = w.size(0);
  torch::Tensor dx = torch::empty_like(x2);
  const int64_t threads = at::get_num_threads();
  std::vector<double> partial(static_cast<size_t>(threads * m * k), 0.0);
  AT_DISPATCH_FLOATING_TYPES(x2.scalar_type(), "cpu_fused::RmsProjectBackward", [&] {
    const scalar_t* gp = du.data_ptr<scalar_t>();
    ProjectBackwardRows<scalar_t>(
        x2.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(), rs.data_ptr<scalar_t>(),
        u.data_ptr<scalar_t>(), rows, k, m, nullptr, nullptr, 1, 1, partial, nullptr,
        dx.data_ptr<scalar_t>(), [gp, m](int64_t r, scalar_t*) { return gp + r * m; });
  });
  return {dx, SumPartials(partial, threads, m * k, {m, k}, x2.scalar_type())};
}

// The routing projections are skinny (HC: [tokens n, d] x [d, n + 2]; mHC:
// [tokens, n d] x [n d, n^2 + 2n]), where OpenBLAS's GEMMs run far below
// peak: forward+backward over 1k tokens at d = 128, 2 threads, its version
// took 1.1 ms (HC) and 1.2 ms (mHC), these loops 0.26-0.30 and 0.70-0.75 ms,
// with the normalisation and the products in one pass over each row while
// it is in L1 (bench/RESULTS.md).
class RmsProjectFunction : public torch::autograd::Function<RmsProjectFunction> {
 public:
  // x [..., K], w [K, m] -> u [..., m].
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x_in,
                               const torch::Tensor& w_in, double eps) {
    torch::Tensor x = x_in.contiguous();
    const int64_t k = x.size(-1), rows = x.numel() / std::max<int64_t>(k, 1);
    TORCH_CHECK(w_in.dim() == 2 && w_in.size(0) == k, "RmsProject: w has ", w_in.sizes(),
                ", expected [", k, ", m] for x of width ", k);
    torch::Tensor x2 = x.reshape({rows, k});
    torch::Tensor wt = w_in.t().contiguous();  // [m, K]: one row per output
    Projection p = ProjectRows(x2, wt, eps);
    ctx->save_for_backward({x2, wt, p.rs, p.u});
    ctx->saved_data["x_sizes"] = x.sizes();
    std::vector<int64_t> out_sizes(x.sizes().begin(), x.sizes().end() - 1);
    out_sizes.push_back(wt.size(0));
    return p.u.view(out_sizes);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list saved = ctx->get_saved_variables();
    const int64_t rows = saved[0].size(0);
    torch::Tensor du = grads[0].reshape({rows, -1}).contiguous();
    auto [dx, dwt] = ProjectBackward(saved[0], saved[1], saved[2], saved[3], du);
    return {dx.view(ctx->saved_data["x_sizes"].toIntVector()), dwt.t(), torch::Tensor()};
  }
};

// ------------------------------------------------ HC / mHC coefficients

// The gradient of an output, contiguous; an output nobody used gets an
// undefined gradient (read as zero by the kernels), kept undefined.
torch::Tensor ContiguousOrUndefined(const torch::Tensor& g) {
  return g.defined() ? g.contiguous() : torch::Tensor();
}

// A route's stream gradient: the gradient arriving for the streams it
// passed through (`in`, moved in), and the tensor dh [rows, k] to write the
// streams' whole gradient into: `in` itself where it is a gradient of ours
// nobody else sees (TakeOwnedGradient: HcWrite's backward, or a route's
// passed on by the HC code form's write), so the write goes into the lines
// just read; a new tensor otherwise. Returns {dh, in (contiguous or
// undefined)}; the kernel reads each element of `in` before writing dh's.
std::pair<torch::Tensor, torch::Tensor> RouteStreamGradient(torch::Tensor in,
                                                            const torch::Tensor& x2,
                                                            AutogradContext* ctx) {
  if (TakeOwnedGradient(in, ctx->saved_data["h_sizes"].toIntVector(), x2.scalar_type())) {
    torch::Tensor dh = in.view(x2.sizes());
    return {dh, dh};
  }
  return {torch::empty_like(x2), ContiguousOrUndefined(in)};
}

// The stream gradient a route returns, shaped as its input; marked as the
// backward's own (MarkOwnedGradient) for the HcWrite before it.
torch::Tensor ReturnedStreamGradient(const torch::Tensor& dh, AutogradContext* ctx) {
  torch::Tensor out = dh.view(ctx->saved_data["h_sizes"].toIntVector());
  MarkOwnedGradient(out);
  return out;
}

// tr[j] = tanh(ur[j]) for j < count: 8 lanes at a time in float (Tanh8; a
// libm tanh per value was a third of HC's route, forward and again
// backward, before the backward read them saved), libm in double.
inline void TanhN(const float* ur, int64_t count, float* tr) {
  int64_t j = 0;
  for (; j + 8 <= count; j += 8) Store8(tr + j, Tanh8(Load8(ur + j)));
  if (j < count) {
    float in[8] = {}, out[8];
    std::copy(ur + j, ur + count, in);
    Store8(out, Tanh8(Load8(in)));
    std::copy(out, out + (count - j), tr + j);
  }
}
inline void TanhN(const double* ur, int64_t count, double* tr) {
  for (int64_t j = 0; j < count; ++j) tr[j] = std::tanh(ur[j]);
}

// One stream's HC coefficients from tr = tanh of its projection [n + 2]
// (sa: its row of static_a [n + 1], sb: its static_b): *read (column 0),
// ar [n] (columns 1..n) and *b. read and ar apart, so the route writes each
// straight to its own tensor (through a row buffer, copying ar out was a
// memmove call per stream row; HC's memmove samples above Pre-LN's fell from
// 16 to 4 per 8-step round without it, bench/RESULTS.md session 36).
template <typename T>
inline void HcCoefficientsRow(const T* tr, const T* sa, T sb, T ga, T gb, int64_t n, T* read,
                              T* ar, T* b) {
  *read = sa[0] + ga * tr[0];
  for (int64_t j = 1; j <= n; ++j) ar[j - 1] = sa[j] + ga * tr[j];
  *b = sb + gb * tr[n + 1];
}

// Its backward from tr = tanh(u) [n + 2] for da [n + 1] (null: zero) and db:
// dur [n + 2]; adds to acc_sa [n + 1] (this stream's row of dstatic_a),
// *acc_sb and acc_g (dgain_a, dgain_b).
template <typename T>
inline void HcCoefficientsBackwardRow(const T* tr, T ga, T gb, const T* da, T db, int64_t n,
                                      T* dur, double* acc_sa, double* acc_sb, double* acc_g) {
  double gain_a = 0;  // the row's terms first, as MhcCoefficientsBackwardRow's
  for (int64_t j = 0; j <= n; ++j) {
    const T t = tr[j];
    const T g = da ? da[j] : T(0);
    dur[j] = ga * g * (1 - t * t);
    acc_sa[j] += g;
    gain_a += static_cast<double>(g) * t;
  }
  acc_g[0] += gain_a;
  const T t = tr[n + 1];
  dur[n + 1] = gb * db * (1 - t * t);
  *acc_sb += db;
  acc_g[1] += static_cast<double>(db) * t;
}

// HC: from the projection u [rows, n, n + 2], per stream s and column j,
//   a[s, j] = static_a[s, j] + gain_a tanh(u[s, j])     (j <= n)
//   b[s]    = static_b[s]    + gain_b tanh(u[s, n + 1])
// one pass each way instead of tanh, split and four broadcast ops forward
// and their backward.
class HcCoefficientsFunction : public torch::autograd::Function<HcCoefficientsFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& u_in,
                               const torch::Tensor& static_a_in, const torch::Tensor& static_b_in,
                               const torch::Tensor& gain_a, const torch::Tensor& gain_b) {
    torch::Tensor u = u_in.contiguous();
    torch::Tensor sa = static_a_in.contiguous(), sb = static_b_in.contiguous();
    const int64_t n = sb.numel(), m = n + 2;
    TORCH_CHECK(u.dim() >= 2 && u.size(-1) == m && u.size(-2) == n, "HcCoefficients: u has ",
                u.sizes(), ", expected [..., ", n, ", ", m, "] for ", n, " streams");
    TORCH_CHECK(sa.numel() == n * (n + 1), "HcCoefficients: static_a has ", sa.sizes(),
                ", expected [", n, ", ", n + 1, "]");
    TORCH_CHECK(gain_a.numel() == 1 && gain_b.numel() == 1,
                "HcCoefficients: gain_a and gain_b must hold one value each");
    const int64_t rows = u.numel() / (n * m);
    std::vector<int64_t> b_sizes(u.sizes().begin(), u.sizes().end() - 1);  // [..., n]
    std::vector<int64_t> a_sizes = b_sizes;
    a_sizes.push_back(n + 1);
    torch::Tensor a = torch::empty(a_sizes, u.options());
    torch::Tensor b = torch::empty(b_sizes, u.options());
    torch::Tensor th = torch::empty_like(u);  // tanh(u), for the backward
    AT_DISPATCH_FLOATING_TYPES(u.scalar_type(), "cpu_fused::HcCoefficients", [&] {
      const scalar_t* up = u.data_ptr<scalar_t>();
      const scalar_t* sap = sa.data_ptr<scalar_t>();
      const scalar_t* sbp = sb.data_ptr<scalar_t>();
      const scalar_t ga = gain_a.item<scalar_t>(), gb = gain_b.item<scalar_t>();
      scalar_t* ap = a.data_ptr<scalar_t>();
      scalar_t* bp = b.data_ptr<scalar_t>();
      scalar_t* thp = th.data_ptr<scalar_t>();
      at::parallel_for(0, rows, Grain(4 * n * m), [&](int64_t begin, int64_t end) {
        TanhN(up + begin * n * m, (end - begin) * n * m, thp + begin * n * m);
        for (int64_t r = begin; r < end; ++r) {
          for (int64_t st = 0; st < n; ++st) {
            scalar_t* ar = ap + (r * n + st) * (n + 1);
            HcCoefficientsRow(thp + (r * n + st) * m, sap + st * (n + 1), sbp[st], ga, gb, n, ar,
                              ar + 1, bp + r * n + st);
          }
        }
      });
    });
    ctx->save_for_backward({th, gain_a, gain_b});
    return {a, b};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list saved = ctx->get_saved_variables();
    const torch::Tensor& th = saved[0];  // tanh of the projection u
    const torch::Tensor& gain_a = saved[1];
    const torch::Tensor& gain_b = saved[2];
    const int64_t n = th.size(-2), m = n + 2, rows = th.numel() / (n * m);
    torch::Tensor da = ContiguousOrUndefined(grads[0]);
    torch::Tensor db = ContiguousOrUndefined(grads[1]);
    torch::Tensor du = torch::empty_like(th);
    const int64_t threads = at::get_num_threads();
    // Per thread: dstatic_a [n (n + 1)], dstatic_b [n], dgain_a, dgain_b.
    const int64_t count = n * (n + 1) + n + 2;
    std::vector<double> partial(static_cast<size_t>(threads * count), 0.0);
    AT_DISPATCH_FLOATING_TYPES(th.scalar_type(), "cpu_fused::HcCoefficientsBackward", [&] {
      const scalar_t* thp = th.data_ptr<scalar_t>();
      const scalar_t* dap = da.defined() ? da.data_ptr<scalar_t>() : nullptr;
      const scalar_t* dbp = db.defined() ? db.data_ptr<scalar_t>() : nullptr;
      const scalar_t ga = gain_a.item<scalar_t>(), gb = gain_b.item<scalar_t>();
      scalar_t* dup = du.data_ptr<scalar_t>();
      at::parallel_for(0, rows, Grain(4 * n * m), [&](int64_t begin, int64_t end) {
        double* acc = partial.data() + at::get_thread_num() * count;
        double* acc_sb = acc + n * (n + 1);
        double* acc_g = acc_sb + n;
        for (int64_t r = begin; r < end; ++r) {
          for (int64_t st = 0; st < n; ++st) {
            const int64_t row = r * n + st;
            HcCoefficientsBackwardRow(thp + row * m, ga, gb, dap ? dap + row * (n + 1) : nullptr,
                                      dbp ? dbp[row] : scalar_t(0), n, dup + row * m,
                                      acc + st * (n + 1), acc_sb + st, acc_g);
          }
        }
      });
    });
    const auto dtype = th.scalar_type();
    torch::Tensor sums = SumPartials(partial, threads, count, {count}, dtype);
    return {du, sums.narrow(0, 0, n * (n + 1)).reshape({n, n + 1}),
            sums.narrow(0, n * (n + 1), n).clone(),
            sums.narrow(0, n * (n + 1) + n, 1).reshape(gain_a.sizes()),
            sums.narrow(0, n * (n + 1) + n + 1, 1).reshape(gain_b.sizes())};
  }
};

// One token's mHC coefficients from its projection ur [n^2 + 2n].
template <typename T>
inline void MhcCoefficientsRow(const T* ur, const T* gp, const T* bp, int64_t n, T* read,
                               T* write, T* logits) {
  for (int64_t j = 0; j < n; ++j) {
    read[j] = 1 / (1 + std::exp(-(gp[0] * ur[j] + bp[j])));
    write[j] = 2 / (1 + std::exp(-(gp[1] * ur[n + j] + bp[n + j])));
  }
  for (int64_t j = 0; j < n * n; ++j) logits[j] = gp[2] * ur[2 * n + j] + bp[2 * n + j];
}

// Its backward: dz = dread s(1 - s) | dwrite 2 s(1 - s) | dlogits, with s
// the sigmoid (s = read, write / 2); dur = g dz; acc_g[group] += dz u;
// acc_b += dz. Null output gradients count as zero.
template <typename T>
inline void MhcCoefficientsBackwardRow(const T* ur, const T* gp, const T* read, const T* write,
                                       const T* dr, const T* dw, const T* dl, int64_t n, T* dur,
                                       double* acc_g, double* acc_b) {
  const int64_t m = n * n + 2 * n;
  // The row's gain terms are summed locally, then added: accumulating into
  // acc_g per j chained every term through a store and a load. One loop
  // per group, each sum a scalar of its own: one loop choosing the group
  // per j kept the three sums in an array on the stack, indexed at run
  // time, and each term waited on the last one's store (28% of mHC's route
  // backward on Zen 5, bench/RESULTS.md session 35). The same additions in
  // the same order.
  double g_read = 0, g_write = 0, g_logit = 0;
  for (int64_t j = 0; j < n; ++j) {
    const T sg = read[j];
    const T dz = dr ? dr[j] * sg * (1 - sg) : T(0);
    dur[j] = gp[0] * dz;
    g_read += static_cast<double>(dz) * ur[j];
    acc_b[j] += dz;
  }
  for (int64_t j = n; j < 2 * n; ++j) {
    const T sg = write[j - n] / 2;
    const T dz = dw ? dw[j - n] * 2 * sg * (1 - sg) : T(0);
    dur[j] = gp[1] * dz;
    g_write += static_cast<double>(dz) * ur[j];
    acc_b[j] += dz;
  }
  for (int64_t j = 2 * n; j < m; ++j) {
    const T dz = dl ? dl[j - 2 * n] : T(0);
    dur[j] = gp[2] * dz;
    g_logit += static_cast<double>(dz) * ur[j];
    acc_b[j] += dz;
  }
  acc_g[0] += g_read;
  acc_g[1] += g_write;
  acc_g[2] += g_logit;
}

// mHC coefficients. Forward: {read, write [..., n], logits [..., n, n]} from u [..., m], m =
// n^2 + 2n (u, gains and bias contiguous).
variable_list MhcCoefficientsForward(const torch::Tensor& u, const torch::Tensor& gains,
                                     const torch::Tensor& bias, int64_t n) {
  const int64_t m = n * n + 2 * n, rows = u.numel() / m;
  std::vector<int64_t> nn(u.sizes().begin(), u.sizes().end() - 1);
  nn.push_back(n);
  std::vector<int64_t> square = nn;
  square.push_back(n);
  torch::Tensor read = torch::empty(nn, u.options()), write = torch::empty(nn, u.options());
  torch::Tensor logits = torch::empty(square, u.options());
  AT_DISPATCH_FLOATING_TYPES(u.scalar_type(), "cpu_fused::MhcCoefficients", [&] {
    const scalar_t* up = u.data_ptr<scalar_t>();
    const scalar_t* gp = gains.data_ptr<scalar_t>();
    const scalar_t* bp = bias.data_ptr<scalar_t>();
    scalar_t* rp = read.data_ptr<scalar_t>();
    scalar_t* wp = write.data_ptr<scalar_t>();
    scalar_t* lp = logits.data_ptr<scalar_t>();
    at::parallel_for(0, rows, Grain(4 * m), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        MhcCoefficientsRow(up + r * m, gp, bp, n, rp + r * n, wp + r * n, lp + r * n * n);
      }
    });
  });
  return {read, write, logits};
}

// Backward (MhcCoefficientsBackwardRow per token; undefined output
// gradients count as zero): {du, dgains [3], dbias [m]}.
variable_list MhcCoefficientsBackward(const torch::Tensor& u, const torch::Tensor& gains,
                                      const torch::Tensor& read, const torch::Tensor& write,
                                      const torch::Tensor& dr, const torch::Tensor& dw,
                                      const torch::Tensor& dl, int64_t n) {
  const int64_t m = n * n + 2 * n, rows = u.numel() / m;
  torch::Tensor du = torch::empty_like(u);
  const int64_t threads = at::get_num_threads();
  const int64_t count = 3 + m;  // dgains, dbias
  std::vector<double> partial(static_cast<size_t>(threads * count), 0.0);
  AT_DISPATCH_FLOATING_TYPES(u.scalar_type(), "cpu_fused::MhcCoefficientsBackward", [&] {
    const scalar_t* up = u.data_ptr<scalar_t>();
    const scalar_t* gp = gains.data_ptr<scalar_t>();
    const scalar_t* rp = read.data_ptr<scalar_t>();
    const scalar_t* wp = write.data_ptr<scalar_t>();
    const scalar_t* drp = dr.defined() ? dr.data_ptr<scalar_t>() : nullptr;
    const scalar_t* dwp = dw.defined() ? dw.data_ptr<scalar_t>() : nullptr;
    const scalar_t* dlp = dl.defined() ? dl.data_ptr<scalar_t>() : nullptr;
    scalar_t* dup = du.data_ptr<scalar_t>();
    at::parallel_for(0, rows, Grain(4 * m), [&](int64_t begin, int64_t end) {
      double* acc_g = partial.data() + at::get_thread_num() * count;
      double* acc_b = acc_g + 3;
      for (int64_t r = begin; r < end; ++r) {
        MhcCoefficientsBackwardRow(up + r * m, gp, rp + r * n, wp + r * n,
                                   drp ? drp + r * n : nullptr, dwp ? dwp + r * n : nullptr,
                                   dlp ? dlp + r * n * n : nullptr, n, dup + r * m, acc_g, acc_b);
      }
    });
  });
  torch::Tensor sums = SumPartials(partial, threads, count, {count}, u.scalar_type());
  return {du, sums.narrow(0, 0, 3), sums.narrow(0, 3, m)};
}

// mHC: from the projection u [rows, n^2 + 2n], with the group gains g (read,
// write, residual) and bias,
//   z = g u + bias;  read = sigmoid(z[0:n]);  write = 2 sigmoid(z[n:2n]);
//   logits = z[2n:] as [n, n]
// one pass each way instead of a concatenation of gains, six element-wise
// ops and three slices forward and their backward.
class MhcCoefficientsFunction : public torch::autograd::Function<MhcCoefficientsFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& u_in,
                               const torch::Tensor& gains_in, const torch::Tensor& bias_in,
                               int64_t n) {
    torch::Tensor u = u_in.contiguous(), gains = gains_in.contiguous(), bias = bias_in.contiguous();
    const int64_t m = n * n + 2 * n;
    TORCH_CHECK(n >= 1 && u.dim() >= 1 && u.size(-1) == m, "MhcCoefficients: u has ", u.sizes(),
                ", expected [..., ", m, "] for ", n, " streams");
    TORCH_CHECK(gains.numel() == 3, "MhcCoefficients: gains has ", gains.sizes(), ", expected [3]");
    TORCH_CHECK(bias.numel() == m, "MhcCoefficients: bias has ", bias.sizes(), ", expected [", m, "]");
    variable_list out = MhcCoefficientsForward(u, gains, bias, n);
    ctx->save_for_backward({u, gains, out[0], out[1]});
    ctx->saved_data["n"] = n;
    ctx->saved_data["bias_sizes"] = bias_in.sizes();
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list saved = ctx->get_saved_variables();
    const torch::Tensor& gains = saved[1];
    variable_list g = MhcCoefficientsBackward(
        saved[0], gains, saved[2], saved[3], ContiguousOrUndefined(grads[0]),
        ContiguousOrUndefined(grads[1]), ContiguousOrUndefined(grads[2]),
        ctx->saved_data["n"].toInt());
    return {g[0], g[1].reshape(gains.sizes()),
            g[2].reshape(ctx->saved_data["bias_sizes"].toIntVector()), torch::Tensor()};
  }
};

// ------------------------------------------------------------ mHC route

// The mHC connector's routing up to its read, as one function: projection
// u = RmsProject(h flattened to n d, phi), coefficients (read, write,
// logits) = MhcCoefficients(u), and x = HcRead(h, read), with the same
// per-token kernels as the three ops but one pass over the streams each
// way, and one node: its backward returns one gradient for the streams
// (the projection's dx pass adds read_s dx to stream s), where the three ops
// return two that autograd then adds (a 2 MB sum per connector at the
// benchmark shape) after a separate HcRead backward pass.
// Streams per token the route takes (its backward keeps d read on the stack).
constexpr int64_t kMaxRouteStreams = 64;

// Row r of the route's du [m] into `du`: d read = h_s . dx per stream
// (dxp null: no read gradient), then the coefficients' backward, its gain
// and bias terms added into acc_g [3 + m] (both projections' backward).
template <typename T>
inline void MhcRouteDuRow(int64_t r, const T* hp, const T* dxp, const T* up, const T* gp,
                          const T* rp, const T* wrp, const T* dwp, const T* dlp, int64_t n,
                          int64_t d, double* acc_g, T* du) {
  const int64_t k = n * d, m = n * n + 2 * n;
  T dread[kMaxRouteStreams];
  if (dxp != nullptr) {
    for (int64_t s = 0; s < n; ++s) dread[s] = Dot(hp + r * k + s * d, dxp + r * d, d);
  }
  MhcCoefficientsBackwardRow(up + r * m, gp, rp + r * n, wrp + r * n, dxp ? dread : nullptr,
                             dwp ? dwp + r * n : nullptr, dlp ? dlp + r * n * n : nullptr, n, du,
                             acc_g, acc_g + 3);
}

// The route with its projection's products as GEMMs (RouteProjection::kGemm,
// float32): forward p = x2 phi [rows, m] in one sgemm, then one pass per
// token for rs = rsqrt(mean(x^2) + eps), u = rs p, the coefficients and the
// read. x2 [rows, k], phi [k, m] contiguous; the outputs are preallocated.
void RouteForwardGemm(cpu_gemm::SgemmFn gemm, const torch::Tensor& x2, const torch::Tensor& phi,
                      const torch::Tensor& gains, const torch::Tensor& bias, int64_t n,
                      double eps, torch::Tensor& rs, torch::Tensor& u, torch::Tensor& read,
                      torch::Tensor& write, torch::Tensor& logits, torch::Tensor& x) {
  const int64_t rows = x2.size(0), k = x2.size(1), m = phi.size(1), d = k / n;
  const float* hp = x2.data_ptr<float>();
  float* up = u.data_ptr<float>();
  if (rows > 0) gemm('N', 'N', rows, m, k, 1.0f, hp, k, phi.data_ptr<float>(), m, 0.0f, up, m);
  const float* gp = gains.data_ptr<float>();
  const float* bp = bias.data_ptr<float>();
  float *rsp = rs.data_ptr<float>(), *rp = read.data_ptr<float>();
  float *wrp = write.data_ptr<float>(), *lp = logits.data_ptr<float>();
  float* xp = x.data_ptr<float>();
  at::parallel_for(0, rows, Grain(2 * k), [&](int64_t begin, int64_t end) {
    // rs for kVF rows at a time (their sums of squares as Dot's and the
    // rsqrt rounded as ProjectRow's, InvRmsOfSums with the double
    // quotient): a scalar square root and division per row was a chain the
    // rest of the row waited on. The rows stay in L1 for the pass below.
    float inv_rows[kVF];  // DotsOfRows writes kVF values
    for (int64_t r0 = begin; r0 < end; r0 += kVF) {
      const int64_t count = std::min<int64_t>(kVF, end - r0);
      DotsOfRows(hp + r0 * k, k, hp + r0 * k, k, count, k, inv_rows);
      InvRmsOfSums</*kDoubleQuotient=*/true>(inv_rows, count, k, eps, inv_rows);
      for (int64_t r = r0; r < r0 + count; ++r) {
        const float* xr = hp + r * k;
        const float inv = inv_rows[r - r0];
        rsp[r] = inv;
        float* ur = up + r * m;
        for (int64_t j = 0; j < m; ++j) ur[j] *= inv;
        MhcCoefficientsRow(ur, gp, bp, n, rp + r * n, wrp + r * n, lp + r * n * n);
        ReadRow(xr, rp + r * n, n, d, xp + r * d);
      }
    }
  });
}

// Its backward: one pass per token for d read = h . dx, the coefficients'
// backward to du (gains and bias into partial_c [threads][3 + m]), dp = rs
// du, and dh = c x + dh_in + read_s dx per stream s (c = -(rs^2 / k) du . u,
// the normalisation's term); then dh += dp phi^T and dphi = x2^T dp as two
// sgemm calls. dh may be dh_in itself (a taken-over gradient). Returns dphi
// [k, m].
torch::Tensor RouteBackwardGemm(cpu_gemm::SgemmFn gemm, const torch::Tensor& x2,
                                const torch::Tensor& phi, const torch::Tensor& rs,
                                const torch::Tensor& u, const torch::Tensor& gains,
                                const torch::Tensor& read, const torch::Tensor& write,
                                const torch::Tensor& dx, const torch::Tensor& dwrite,
                                const torch::Tensor& dlogits, const torch::Tensor& dh_in,
                                torch::Tensor& dh, int64_t n, std::vector<double>& partial_c) {
  const int64_t rows = x2.size(0), k = x2.size(1), m = phi.size(1), d = k / n;
  const int64_t count = 3 + m;
  torch::Tensor dp = torch::empty({rows, m}, x2.options());
  const float* hp = x2.data_ptr<float>();
  const float* up = u.data_ptr<float>();
  const float* rsp = rs.data_ptr<float>();
  const float* gp = gains.data_ptr<float>();
  const float* rp = read.data_ptr<float>();
  const float* wrp = write.data_ptr<float>();
  const float* dxp = dx.defined() ? dx.data_ptr<float>() : nullptr;
  const float* dwp = dwrite.defined() ? dwrite.data_ptr<float>() : nullptr;
  const float* dlp = dlogits.defined() ? dlogits.data_ptr<float>() : nullptr;
  const float* inp = dh_in.defined() ? dh_in.data_ptr<float>() : nullptr;
  float* dpp = dp.data_ptr<float>();
  float* dhp = dh.data_ptr<float>();
  at::parallel_for(0, rows, Grain(3 * k), [&](int64_t begin, int64_t end) {
    double* acc_g = partial_c.data() + at::get_thread_num() * count;
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = hp + r * k;
      float* dq = dpp + r * m;
      MhcRouteDuRow(r, hp, dxp, up, gp, rp, wrp, dwp, dlp, n, d, acc_g, dq);
      const float inv = rsp[r];
      float gu = 0;
      for (int64_t j = 0; j < m; ++j) {
        gu += dq[j] * up[r * m + j];
        dq[j] *= inv;
      }
      const float c = -inv * inv * gu / static_cast<float>(k);
      float* o = dhp + r * k;
      const float* in = inp != nullptr ? inp + r * k : nullptr;
      // `in` may be o: each element read before it is written.
      if (in != nullptr && dxp != nullptr) {
        // The read term in the same pass: writing o, then adding each
        // stream's read_s dx in a second pass, loaded and stored every row
        // twice (as HC's route did before GroupDx took its read term).
        // Two statements, each one multiply-add, so the FMA builds round
        // as before: fma(read_s, dx, fma(c, x, in)).
        const float* dxr = dxp + r * d;
        for (int64_t s = 0; s < n; ++s) {
          const float rd = rp[r * n + s];
          const float* xs = xr + s * d;
          const float* ins = in + s * d;
          float* os = o + s * d;
          for (int64_t j = 0; j < d; ++j) {
            const float t = c * xs[j] + ins[j];
            os[j] = rd * dxr[j] + t;
          }
        }
        continue;
      }
      // With no arriving gradient the read term stays a second pass: in
      // one loop, o = c x + read_s dx, GCC's FMA contraction may fuse either
      // product, where the two passes round as fma(read_s, dx, c x).
      if (in == nullptr) {
        for (int64_t i = 0; i < k; ++i) o[i] = c * xr[i];
      } else if (in == o) {
        Axpy(c, xr, o, k);
      } else {
        for (int64_t i = 0; i < k; ++i) o[i] = c * xr[i] + in[i];
      }
      if (dxp != nullptr) {
        for (int64_t s = 0; s < n; ++s) Axpy(rp[r * n + s], dxp + r * d, o + s * d, d);
      }
    }
  });
  // Written whole by the beta = 0 product below; zero with no rows.
  torch::Tensor dphi =
      rows > 0 ? torch::empty({k, m}, x2.options()) : torch::zeros({k, m}, x2.options());
  if (rows > 0) {
    const float* php = phi.data_ptr<float>();
    gemm('N', 'T', rows, k, m, 1.0f, dpp, m, php, m, 1.0f, dhp, k);  // dh += dp phi^T
    gemm('T', 'N', k, m, rows, 1.0f, hp, k, dpp, m, 0.0f, dphi.data_ptr<float>(), m);
  }
  return dphi;
}

class MhcRouteFunction : public torch::autograd::Function<MhcRouteFunction> {
 public:
  // h [..., n, d], phi [n d, n^2 + 2n] -> {x [..., d], write [..., n],
  // logits [..., n, n], h [..., n, d]}. The last is h passed through (see
  // MhcRoute in cpu_fused.h): its gradient is added into h's here.
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& h_in,
                               const torch::Tensor& phi, const torch::Tensor& gains_in,
                               const torch::Tensor& bias_in, int64_t n, double eps,
                               cpu_gemm::SgemmFn gemm) {
    torch::Tensor h = h_in.contiguous();
    TORCH_CHECK(n >= 1 && n <= kMaxRouteStreams && h.dim() >= 2 && h.size(-2) == n,
                "MhcRoute: h has ", h.sizes(), ", expected [..., ", n, ", d] with 1 <= n <= ",
                kMaxRouteStreams);
    const int64_t d = h.size(-1), k = n * d, m = n * n + 2 * n;
    const int64_t rows = h.numel() / std::max<int64_t>(k, 1);
    TORCH_CHECK(phi.dim() == 2 && phi.size(0) == k && phi.size(1) == m, "MhcRoute: phi has ",
                phi.sizes(), ", expected [", k, ", ", m, "]");
    torch::Tensor gains = gains_in.contiguous(), bias = bias_in.contiguous();
    TORCH_CHECK(gains.numel() == 3, "MhcRoute: gains has ", gains.sizes(), ", expected [3]");
    TORCH_CHECK(bias.numel() == m, "MhcRoute: bias has ", bias.sizes(), ", expected [", m, "]");
    TORCH_CHECK(gemm == nullptr || (h.scalar_type() == torch::kFloat32 &&
                                    phi.scalar_type() == torch::kFloat32),
                "MhcRoute: the GEMM projection needs float32 h and phi, has ", h.scalar_type(),
                " and ", phi.scalar_type());
    torch::Tensor x2 = h.reshape({rows, k});
    // The fused projection reads phi^T (one row per output); the GEMM one
    // phi as it is.
    torch::Tensor wt = gemm != nullptr ? phi.contiguous() : phi.t().contiguous();
    const auto opts = h.options();
    torch::Tensor rs = torch::empty({rows, 1}, opts), u = torch::empty({rows, m}, opts);
    torch::Tensor read = torch::empty({rows, n}, opts), write = torch::empty({rows, n}, opts);
    torch::Tensor logits = torch::empty({rows, n, n}, opts);
    std::vector<int64_t> x_sizes(h.sizes().begin(), h.sizes().end() - 2);
    x_sizes.push_back(d);
    torch::Tensor x = torch::empty(x_sizes, opts);
    if (gemm != nullptr) {
      RouteForwardGemm(gemm, x2, wt, gains, bias, n, eps, rs, u, read, write, logits, x);
    } else {
      // One pass over each token's streams: projection, coefficients, read.
      AT_DISPATCH_FLOATING_TYPES(h.scalar_type(), "cpu_fused::MhcRoute", [&] {
        const scalar_t* hp = x2.data_ptr<scalar_t>();
        const scalar_t* wp = wt.data_ptr<scalar_t>();
        const scalar_t* gp = gains.data_ptr<scalar_t>();
        const scalar_t* bp = bias.data_ptr<scalar_t>();
        scalar_t *rsp = rs.data_ptr<scalar_t>(), *up = u.data_ptr<scalar_t>();
        scalar_t *rp = read.data_ptr<scalar_t>(), *wrp = write.data_ptr<scalar_t>();
        scalar_t *lp = logits.data_ptr<scalar_t>(), *xp = x.data_ptr<scalar_t>();
        at::parallel_for(0, rows, Grain((m + 2) * k), [&](int64_t begin, int64_t end) {
          for (int64_t r0 = begin; r0 < end; r0 += kGroup) {
            const int64_t count = std::min(kGroup, end - r0);
            ProjectGroup(hp + r0 * k, count, wp, k, m, eps, rsp + r0, up + r0 * m);
            for (int64_t r = r0; r < r0 + count; ++r) {
              MhcCoefficientsRow(up + r * m, gp, bp, n, rp + r * n, wrp + r * n, lp + r * n * n);
              ReadRow(hp + r * k, rp + r * n, n, d, xp + r * d);
            }
          }
        });
      });
    }
    ctx->save_for_backward({x2, wt, rs, u, gains, read, write});
    ctx->saved_data["n"] = n;
    ctx->saved_data["gemm"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(gemm));
    ctx->saved_data["h_sizes"] = h.sizes();
    ctx->saved_data["bias_sizes"] = bias_in.sizes();
    std::vector<int64_t> batch(h.sizes().begin(), h.sizes().end() - 2);
    std::vector<int64_t> nn = batch, square = batch;
    nn.push_back(n);
    square.push_back(n);
    square.push_back(n);
    return {x, write.view(nn), logits.view(square), h};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list saved = ctx->get_saved_variables();
    const torch::Tensor &x2 = saved[0], &wt = saved[1], &rs = saved[2], &u = saved[3],
                        &gains = saved[4], &read = saved[5], &write = saved[6];
    const int64_t n = ctx->saved_data["n"].toInt();
    const int64_t rows = x2.size(0), d = x2.size(1) / n;
    const int64_t m = n * n + 2 * n, k = n * d;
    torch::Tensor dx = ContiguousOrUndefined(grads[0]);
    torch::Tensor dwrite = ContiguousOrUndefined(grads[1]), dlogits = ContiguousOrUndefined(grads[2]);
    auto [dh, dh_in] = RouteStreamGradient(std::move(grads[3]), x2, ctx);  // the pass-through's
    const int64_t threads = at::get_num_threads();
    const int64_t count = 3 + m;  // dgains, dbias
    std::vector<double> partial_c(static_cast<size_t>(threads * count), 0.0);
    const auto gemm = reinterpret_cast<cpu_gemm::SgemmFn>(
        static_cast<intptr_t>(ctx->saved_data["gemm"].toInt()));
    torch::Tensor dphi;
    if (gemm != nullptr) {
      dphi = RouteBackwardGemm(gemm, x2, wt, rs, u, gains, read, write, dx, dwrite, dlogits,
                               dh_in, dh, n, partial_c);
    } else {
      std::vector<double> partial_w(static_cast<size_t>(threads * m * k), 0.0);
      // One pass over each token's streams: d read = h . dx, the coefficients'
      // backward to du, then the projection's backward with read_s dx added to
      // stream s of dh.
      AT_DISPATCH_FLOATING_TYPES(x2.scalar_type(), "cpu_fused::MhcRouteBackward", [&] {
        const scalar_t* hp = x2.data_ptr<scalar_t>();
        const scalar_t* up = u.data_ptr<scalar_t>();
        const scalar_t* gp = gains.data_ptr<scalar_t>();
        const scalar_t* rp = read.data_ptr<scalar_t>();
        const scalar_t* wrp = write.data_ptr<scalar_t>();
        const scalar_t* dxp = dx.defined() ? dx.data_ptr<scalar_t>() : nullptr;
        const scalar_t* dwp = dwrite.defined() ? dwrite.data_ptr<scalar_t>() : nullptr;
        const scalar_t* dlp = dlogits.defined() ? dlogits.data_ptr<scalar_t>() : nullptr;
        auto du_row = [&](int64_t r, scalar_t* scratch) -> const scalar_t* {
          MhcRouteDuRow(r, hp, dxp, up, gp, rp, wrp, dwp, dlp, n, d,
                        partial_c.data() + at::get_thread_num() * count, scratch);
          return scratch;
        };
        ProjectBackwardRows<scalar_t>(hp, wt.data_ptr<scalar_t>(), rs.data_ptr<scalar_t>(), up,
                                      rows, k, m, dxp ? rp : nullptr, dxp, n, 1, partial_w,
                                      dh_in.defined() ? dh_in.data_ptr<scalar_t>() : nullptr,
                                      dh.data_ptr<scalar_t>(), du_row);
      });
      dphi = SumPartials(partial_w, threads, m * k, {m, k}, x2.scalar_type()).t();
    }
    torch::Tensor sums = SumPartials(partial_c, threads, count, {count}, x2.scalar_type());
    return {ReturnedStreamGradient(dh, ctx), dphi,
            sums.narrow(0, 0, 3).reshape(gains.sizes()),
            sums.narrow(0, 3, m).reshape(ctx->saved_data["bias_sizes"].toIntVector()),
            torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// ------------------------------------------------------------- HC route

// The HC route's argument checks (HcRoute, HcWriteRoute: `op` names it);
// returns the stream count n.
int64_t CheckHcRouteArguments(const char* op, const torch::Tensor& h, const torch::Tensor& w,
                              const torch::Tensor& sa, const torch::Tensor& sb,
                              const torch::Tensor& gain_a, const torch::Tensor& gain_b) {
  const int64_t n = sb.numel();
  TORCH_CHECK(n >= 1 && n <= kMaxRouteStreams && h.dim() >= 2 && h.size(-2) == n, op, ": h has ",
              h.sizes(), ", expected [..., ", n, ", d] for ", n, " streams (at most ",
              kMaxRouteStreams, ")");
  const int64_t d = h.size(-1), m = n + 2;
  TORCH_CHECK(w.dim() == 2 && w.size(0) == d && w.size(1) == m, op, ": w has ", w.sizes(),
              ", expected [", d, ", ", m, "]");
  TORCH_CHECK(sa.numel() == n * (n + 1), op, ": static_a has ", sa.sizes(), ", expected [", n,
              ", ", n + 1, "]");
  TORCH_CHECK(gain_a.numel() == 1 && gain_b.numel() == 1, op,
              ": gain_a and gain_b must hold one value each");
  return n;
}

// The HC route's outputs and what its backward keeps, for h [..., n, d].
struct HcRouteOutputs {
  torch::Tensor rs, u, th, read, ar, b, x;  // th: tanh(u), for the backward

  static HcRouteOutputs Empty(const torch::Tensor& h, int64_t n) {
    const int64_t d = h.size(-1), m = n + 2, tokens = h.numel() / std::max<int64_t>(n * d, 1);
    const auto opts = h.options();
    std::vector<int64_t> x_sizes(h.sizes().begin(), h.sizes().end() - 2);
    x_sizes.push_back(d);
    return {torch::empty({tokens * n, 1}, opts), torch::empty({tokens * n, m}, opts),
            torch::empty({tokens * n, m}, opts), torch::empty({tokens, n}, opts),
            torch::empty({tokens, n, n}, opts), torch::empty({tokens, n}, opts),
            torch::empty(x_sizes, opts)};
  }

  // {x [..., d], ar [..., n, n], b [..., n], h}, h: the streams passed on.
  variable_list Returned(const torch::Tensor& h) const {
    const int64_t n = read.size(1);
    std::vector<int64_t> nb(h.sizes().begin(), h.sizes().end() - 1), square = nb;  // [..., n]
    square.push_back(n);
    return {x, ar.view(square), b.view(nb), h};
  }
};

// One token's HC route forward over the streams x2 [tokens n, d] into
// HcRouteOutputs: the projection of each stream row, tanh, the coefficients
// and the read.
template <typename T>
class HcRouteRows {
 public:
  HcRouteRows(const torch::Tensor& x2, const torch::Tensor& wt, const torch::Tensor& sa,
              const torch::Tensor& sb, const torch::Tensor& gain_a, const torch::Tensor& gain_b,
              double eps, const HcRouteOutputs& o)
      : h_(x2.data_ptr<T>()), wt_(wt.data_ptr<T>()), sa_(sa.data_ptr<T>()),
        sb_(sb.data_ptr<T>()), ga_(gain_a.item<T>()), gb_(gain_b.item<T>()), n_(sb.numel()),
        d_(x2.size(1)), m_(n_ + 2), eps_(eps), rs_(o.rs.data_ptr<T>()), u_(o.u.data_ptr<T>()),
        th_(o.th.data_ptr<T>()), read_(o.read.data_ptr<T>()), ar_(o.ar.data_ptr<T>()),
        b_(o.b.data_ptr<T>()), x_(o.x.data_ptr<T>()) {}

  void Token(int64_t t) const {
    for (int64_t s0 = 0; s0 < n_; s0 += kGroup) {
      const int64_t row = t * n_ + s0;
      ProjectGroup(h_ + row * d_, std::min(kGroup, n_ - s0), wt_, d_, m_, eps_, rs_ + row,
                   u_ + row * m_);
    }
    TanhN(u_ + t * n_ * m_, n_ * m_, th_ + t * n_ * m_);
    for (int64_t s = 0; s < n_; ++s) {
      const int64_t row = t * n_ + s;
      HcCoefficientsRow(th_ + row * m_, sa_ + s * (n_ + 1), sb_[s], ga_, gb_, n_, read_ + row,
                        ar_ + row * n_, b_ + row);
    }
    ReadRow(h_ + t * n_ * d_, read_ + t * n_, n_, d_, x_ + t * d_);
  }

 private:
  const T *h_, *wt_, *sa_, *sb_;
  T ga_, gb_;
  int64_t n_, d_, m_;
  double eps_;
  T *rs_, *u_, *th_, *read_, *ar_, *b_, *x_;
};

void SaveRouteSizes(AutogradContext* ctx, const torch::Tensor& h, const torch::Tensor& static_a,
                    const torch::Tensor& static_b) {
  ctx->saved_data["h_sizes"] = h.sizes();
  ctx->saved_data["static_a_sizes"] = static_a.sizes();
  ctx->saved_data["static_b_sizes"] = static_b.sizes();
}

// The HC route's backward over the streams x2 [tokens n, d]: per stream row,
// d read_s = h_s . dx, the coefficients' backward to du, then the
// projection's backward with read_s dx added to the row, into dh (dh_in:
// the gradient arriving for the streams passed on, or undefined; it may be
// dh itself). Fills partial_w [threads][m d] (dw^T) and partial_c
// [threads][n (n + 1) + n + 2] (dstatic_a, dstatic_b, dgain_a, dgain_b);
// after_rows as ProjectBackwardRows's.
template <typename T, typename AfterRows>
void HcRouteBackwardRows(const torch::Tensor& x2, const torch::Tensor& wt, const torch::Tensor& rs,
                         const torch::Tensor& u, const torch::Tensor& read,
                         const torch::Tensor& gain_a, const torch::Tensor& gain_b,
                         const torch::Tensor& th, const torch::Tensor& dx,
                         const torch::Tensor& dar, const torch::Tensor& db,
                         const torch::Tensor& dh_in, const torch::Tensor& dh,
                         std::vector<double>& partial_w, std::vector<double>& partial_c,
                         const AfterRows& after_rows) {
  const int64_t tokens = read.size(0), n = read.size(1), d = x2.size(1), m = n + 2;
  const int64_t threads = at::get_num_threads();
  const int64_t count = n * (n + 1) + n + 2;
  partial_w.assign(static_cast<size_t>(threads * m * d), 0.0);
  partial_c.assign(static_cast<size_t>(threads * count), 0.0);
  const T* hp = x2.data_ptr<T>();
  const T* up = u.data_ptr<T>();
  const T* thp = th.data_ptr<T>();
  const T ga = gain_a.item<T>(), gb = gain_b.item<T>();
  const T* dxp = dx.defined() ? dx.data_ptr<T>() : nullptr;
  const T* darp = dar.defined() ? dar.data_ptr<T>() : nullptr;
  const T* dbp = db.defined() ? db.data_ptr<T>() : nullptr;
  const int64_t rows = tokens * n;
  auto du_row = [&](int64_t row, T* scratch) -> const T* {
    const int64_t t = row / n, s = row % n;
    T da[kMaxRouteStreams + 1];
    da[0] = dxp ? Dot(hp + row * d, dxp + t * d, d) : T(0);
    for (int64_t j = 0; j < n; ++j) da[j + 1] = darp ? darp[row * n + j] : T(0);
    double* acc = partial_c.data() + at::get_thread_num() * count;
    HcCoefficientsBackwardRow(thp + row * m, ga, gb, da, dbp ? dbp[row] : T(0), n, scratch,
                              acc + s * (n + 1), acc + n * (n + 1) + s, acc + n * (n + 1) + n);
    return scratch;
  };
  ProjectBackwardRows<T>(hp, wt.data_ptr<T>(), rs.data_ptr<T>(), up, rows, d, m,
                         dxp ? read.data_ptr<T>() : nullptr, dxp, 1, n, partial_w,
                         dh_in.defined() ? dh_in.data_ptr<T>() : nullptr, dh.data_ptr<T>(), du_row,
                         after_rows);
}

// Appends the route's parameter gradients, from HcRouteBackwardRows's
// partial sums, to `out`: dw [d, m], dstatic_a, dstatic_b, dgain_a, dgain_b.
void AppendRouteParameterGradients(AutogradContext* ctx, const std::vector<double>& partial_w,
                                   const std::vector<double>& partial_c, int64_t n, int64_t d,
                                   torch::ScalarType dtype, const torch::Tensor& gain_a,
                                   const torch::Tensor& gain_b, variable_list& out) {
  const int64_t m = n + 2, count = n * (n + 1) + n + 2;
  const int64_t threads = static_cast<int64_t>(partial_w.size()) / (m * d);
  out.push_back(SumPartials(partial_w, threads, m * d, {m, d}, dtype).t());
  torch::Tensor sums = SumPartials(partial_c, threads, count, {count}, dtype);
  out.push_back(
      sums.narrow(0, 0, n * (n + 1)).reshape(ctx->saved_data["static_a_sizes"].toIntVector()));
  out.push_back(sums.narrow(0, n * (n + 1), n).reshape(ctx->saved_data["static_b_sizes"].toIntVector()));
  out.push_back(sums.narrow(0, n * (n + 1) + n, 1).reshape(gain_a.sizes()));
  out.push_back(sums.narrow(0, n * (n + 1) + n + 1, 1).reshape(gain_b.sizes()));
}

// The HC connector's routing up to its read, as one function: per stream,
// u = RmsProject(h_s, w) with w = [dynamic_a | dynamic_b] [d, n + 2], the
// coefficients a = static_a + gain_a tanh(u[:n + 1]), b = static_b +
// gain_b tanh(u[n + 1]), and x = sum_s a[s, 0] h_s: one pass over each
// token's streams each way and one stream gradient, where RmsProject,
// HcCoefficients and HcRead return two for autograd to add (as the mHC
// route). Outputs the residual mix a[:, 1:] and b for HcWrite.
class HcRouteFunction : public torch::autograd::Function<HcRouteFunction> {
 public:
  // h [..., n, d] -> {x [..., d], ar [..., n, n], b [..., n], h [..., n, d]}
  // (the last: h passed through, as MhcRoute's).
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& h_in,
                               const torch::Tensor& w, const torch::Tensor& static_a_in,
                               const torch::Tensor& static_b_in, const torch::Tensor& gain_a,
                               const torch::Tensor& gain_b, double eps) {
    torch::Tensor h = h_in.contiguous();
    torch::Tensor sa = static_a_in.contiguous(), sb = static_b_in.contiguous();
    const int64_t n = CheckHcRouteArguments("HcRoute", h, w, sa, sb, gain_a, gain_b);
    const int64_t d = h.size(-1), m = n + 2, tokens = h.numel() / std::max<int64_t>(n * d, 1);
    torch::Tensor x2 = h.reshape({tokens * n, d});
    torch::Tensor wt = w.t().contiguous();  // [m, d]
    HcRouteOutputs o = HcRouteOutputs::Empty(h, n);
    AT_DISPATCH_FLOATING_TYPES(h.scalar_type(), "cpu_fused::HcRoute", [&] {
      const HcRouteRows<scalar_t> route(x2, wt, sa, sb, gain_a, gain_b, eps, o);
      at::parallel_for(0, tokens, Grain((m + 2) * n * d), [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) route.Token(t);
      });
    });
    ctx->save_for_backward({x2, wt, o.rs, o.u, o.read, gain_a, gain_b, o.th});
    SaveRouteSizes(ctx, h, static_a_in, static_b_in);
    return o.Returned(h);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list saved = ctx->get_saved_variables();
    const torch::Tensor &x2 = saved[0], &wt = saved[1], &rs = saved[2], &u = saved[3],
                        &read = saved[4], &gain_a = saved[5], &gain_b = saved[6], &th = saved[7];
    const int64_t n = read.size(1), d = x2.size(1);
    torch::Tensor dx = ContiguousOrUndefined(grads[0]);
    torch::Tensor dar = ContiguousOrUndefined(grads[1]), db = ContiguousOrUndefined(grads[2]);
    auto [dh, dh_in] = RouteStreamGradient(std::move(grads[3]), x2, ctx);  // the pass-through's
    std::vector<double> partial_w, partial_c;
    AT_DISPATCH_FLOATING_TYPES(x2.scalar_type(), "cpu_fused::HcRouteBackward", [&] {
      HcRouteBackwardRows<scalar_t>(x2, wt, rs, u, read, gain_a, gain_b, th, dx, dar, db, dh_in, dh,
                                    partial_w, partial_c, NoAfterRows());
    });
    variable_list out{ReturnedStreamGradient(dh, ctx)};
    AppendRouteParameterGradients(ctx, partial_w, partial_c, n, d, x2.scalar_type(), gain_a,
                                  gain_b, out);
    out.push_back(torch::Tensor());  // eps
    return out;
  }
};

// ------------------------------------------------ HC write + next route

// One connector's write and the next connector's route as one function (HC
// runs each connector's write but the last this way, hc.cc): per token, the
// new streams h' = HcWrite(h, a, b, y) and, while they are in L1, the route
// of h' (HcRouteRows::Token); backward, per token, the route's stream
// gradient (HcRouteBackwardRows) and, while those rows are in L1, the
// write's backward on them (WriteBackwardTokenBlocked), written over them.
// As two functions the route read h' back from L2/L3 (the write had just
// streamed it out), and the write's backward the route's stream gradient:
// two passes over [tokens, n, d] per connector each way; one step of HC is
// a chain of 2L connectors with nothing between one's write and the next
// one's route. Values: the two functions', term for term.
class HcWriteRouteFunction : public torch::autograd::Function<HcWriteRouteFunction> {
 public:
  // h [..., n, d], a [..., n, n] (mix false: an empty placeholder, the
  // identity residual map), b [..., n], y [..., d]: HcWrite's; w, static_a,
  // static_b, gain_a, gain_b, eps: HcRoute's. Returns HcRoute's outputs
  // {x, ar', b', h'} for h' = HcWrite(h, a, b, y), h' passed on.
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& h_in,
                               const torch::Tensor& a_in, const torch::Tensor& b_in,
                               const torch::Tensor& y_in, const torch::Tensor& w,
                               const torch::Tensor& static_a_in, const torch::Tensor& static_b_in,
                               const torch::Tensor& gain_a, const torch::Tensor& gain_b,
                               double eps, bool mix) {
    torch::Tensor h = h_in.contiguous(), b = b_in.contiguous(), y = y_in.contiguous();
    torch::Tensor a = mix ? a_in.contiguous() : torch::Tensor();
    torch::Tensor sa = static_a_in.contiguous(), sb = static_b_in.contiguous();
    const int64_t n = CheckHcRouteArguments("HcWriteRoute", h, w, sa, sb, gain_a, gain_b);
    const StreamShape s = CheckWriteArguments("HcWriteRoute", h, a, b, y);
    const int64_t d = s.d, m = n + 2;
    torch::Tensor hn = torch::empty_like(h);  // h'
    torch::Tensor x2 = hn.view({s.rows * n, d});
    torch::Tensor wt = w.t().contiguous();  // [m, d]
    HcRouteOutputs o = HcRouteOutputs::Empty(h, n);
    AT_DISPATCH_FLOATING_TYPES(h.scalar_type(), "cpu_fused::HcWriteRoute", [&] {
      const scalar_t* ap = mix ? a.data_ptr<scalar_t>() : nullptr;
      const HcRouteRows<scalar_t> route(x2, wt, sa, sb, gain_a, gain_b, eps, o);
      at::parallel_for(0, s.rows, Grain((m + 2 + n) * n * d), [&](int64_t begin, int64_t end) {
        WriteTokens(h.data_ptr<scalar_t>(), ap, b.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), n,
                    d, hn.data_ptr<scalar_t>(), begin, end,
                    [&](int64_t t) { route.Token(t); });
      });
    });
    ctx->save_for_backward(
        {hn, wt, o.rs, o.u, o.read, gain_a, gain_b, o.th, h, mix ? a : torch::Tensor(), b, y});
    SaveRouteSizes(ctx, h, static_a_in, static_b_in);
    ctx->saved_data["mix"] = mix;
    return o.Returned(hn);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list saved = ctx->get_saved_variables();
    const torch::Tensor &hn = saved[0], &wt = saved[1], &rs = saved[2], &u = saved[3],
                        &read = saved[4], &gain_a = saved[5], &gain_b = saved[6], &th = saved[7];
    const torch::Tensor &h = saved[8], &a = saved[9], &b = saved[10], &y = saved[11];
    const bool mix = ctx->saved_data["mix"].toBool();
    const int64_t tokens = read.size(0), n = read.size(1), d = hn.size(-1);
    torch::Tensor x2 = hn.view({tokens * n, d});
    torch::Tensor dx = ContiguousOrUndefined(grads[0]);
    torch::Tensor dar = ContiguousOrUndefined(grads[1]), db = ContiguousOrUndefined(grads[2]);
    // dh: h''s whole gradient, then the write's dh over it token by token.
    auto [dh, dh_in] = RouteStreamGradient(std::move(grads[3]), x2, ctx);
    torch::Tensor da_w = mix ? torch::empty_like(a) : torch::Tensor();
    torch::Tensor db_w = torch::empty_like(b), dy_w = torch::empty_like(y);
    std::vector<double> partial_w, partial_c;
    AT_DISPATCH_FLOATING_TYPES(x2.scalar_type(), "cpu_fused::HcWriteRouteBackward", [&] {
      const scalar_t* hp = h.data_ptr<scalar_t>();
      const scalar_t* ap = mix ? a.data_ptr<scalar_t>() : nullptr;
      const scalar_t* bp = b.data_ptr<scalar_t>();
      const scalar_t* yp = y.data_ptr<scalar_t>();
      scalar_t* gp = dh.data_ptr<scalar_t>();
      scalar_t* dap = mix ? da_w.data_ptr<scalar_t>() : nullptr;
      scalar_t* dbp = db_w.data_ptr<scalar_t>();
      scalar_t* dyp = dy_w.data_ptr<scalar_t>();
      // The write's backward of the tokens whose last stream row is in
      // [r0, r1), tokens [r0 / n, r1 / n), over their rows of dh.
      auto write_backward = [&](int64_t r0, int64_t r1, int64_t end) {
        WriteBackwardTokens(hp, ap, bp, yp, gp, n, d, mix ? gp : nullptr, dap, dbp, dyp, r0 / n,
                            r1 / n, end / n, /*prefetch_g=*/false);
      };
      HcRouteBackwardRows<scalar_t>(x2, wt, rs, u, read, gain_a, gain_b, th, dx, dar, db, dh_in, dh,
                                    partial_w, partial_c, write_backward);
    });
    variable_list out{ReturnedStreamGradient(dh, ctx), da_w, db_w, dy_w};
    AppendRouteParameterGradients(ctx, partial_w, partial_c, n, d, x2.scalar_type(), gain_a,
                                  gain_b, out);
    out.push_back(torch::Tensor());  // eps
    out.push_back(torch::Tensor());  // mix
    return out;
  }
};

// ---------------------------------------------------------------- Sinkhorn

// Matrices per block: the kernels run kLanes matrices side by side, element
// e of matrix k at p[e * kLanes + k], so every inner loop runs over k with no
// dependency between iterations and vectorises (and the divisions of
// different matrices overlap).
constexpr int64_t kLanes = 8;

// A chunk of the kLanes lanes of one element of a block is the build's
// native double vector, VD (cpu_fused_vec.h): all 8 lanes in the AVX-512
// build, 4 in the AVX2 build, 2 in the baseline. Written as plain lane
// loops, GCC vectorised only the in-place forward: where a half step writes
// a separate state (the backward's recomputation) or the backward updates
// its gradient, it could not rule out aliasing and left the loops scalar,
// which made the backward 4x the forward at n = 4 (bench/RESULTS.md,
// session 28). Until session 33 the vector was all 8 lanes in every build:
// wider than an AVX2 register, GCC moved it through the stack in 16-byte
// pieces, and more so once the line direction became a template argument
// (which alone made the kernels 2x slower). The arithmetic per lane is the
// same operations in the same order whatever the width, so the values do
// not change. The vectors, loaded and stored with LoadV/StoreV, stay inside
// this file's inline helpers (see cpu_fused_vec.h on the ABI note).
static_assert(kLanes % kVD == 0, "whole vectors per block");

// The sums of line a (row a, or column a if kCol) of lanes [c, c + kVD)
// of the block's kLanes n x n matrices x.
template <bool kCol>
inline VD LineSums(const double* x, int64_t a, int64_t n, int64_t c) {
  const int64_t along = kCol ? n : 1, across = kCol ? 1 : n;
  VD sum{};  // +0 in every lane, as the scalar sums began
  for (int64_t b = 0; b < n; ++b) sum += LoadV<VD>(x + (a * across + b * along) * kLanes + c);
  return sum;
}

// One half step on a block: dst = src with each line (row, or column if
// kCol) divided by its sum + eps. dst may be src (in place): a line's sum
// is taken before it is written. The direction is a template argument (a
// run-time flag alternating with the step selected every offset at run
// time).
template <int NC, bool kCol>
inline void SinkhornHalfStep(const double* src, double* dst, int64_t n_rt, double eps) {
  const int64_t n = NC > 0 ? NC : n_rt;
  const int64_t along = kCol ? n : 1, across = kCol ? 1 : n;  // element strides
  for (int64_t a = 0; a < n; ++a) {
    for (int64_t c = 0; c < kLanes; c += kVD) {
      const VD inv = 1.0 / (LineSums<kCol>(src, a, n, c) + eps);
      for (int64_t b = 0; b < n; ++b) {
        const int64_t e = (a * across + b * along) * kLanes + c;
        StoreV(dst + e, LoadV<VD>(src + e) * inv);
      }
    }
  }
}

// Runs the iterations on a block of kLanes n x n matrices in double (NC: n
// at compile time, 0: n_rt at run time); writes the state after every half
// step to `states` (2 * iterations blocks) when non-null, each step reading
// the previous one there (no copies), and leaves the final matrices in p.
template <int NC>
void SinkhornBlock(double* p, int64_t n_rt, int iterations, double eps, double* states) {
  const int64_t n = NC > 0 ? NC : n_rt, nn = n * n;
  const double* src = p;
  for (int step = 0; step < 2 * iterations; step += 2) {  // a row step, then a column step
    double* dst = states != nullptr ? states + step * nn * kLanes : p;
    SinkhornHalfStep<NC, false>(src, dst, n, eps);
    src = dst;
    dst = states != nullptr ? dst + nn * kLanes : p;
    SinkhornHalfStep<NC, true>(src, dst, n, eps);
    src = dst;
  }
  if (src != p) std::copy(src, src + nn * kLanes, p);
}

// One half step of the backward on a block: g -= P * (sums of g along each
// line), lines being the columns (kCol) or the rows of the n x n matrices.
template <int NC, bool kCol>
inline void SinkhornBackStep(double* g, const double* pk, int64_t n_rt) {
  const int64_t n = NC > 0 ? NC : n_rt;
  const int64_t along = kCol ? n : 1, across = kCol ? 1 : n;  // element strides
  for (int64_t a = 0; a < n; ++a) {
    for (int64_t c = 0; c < kLanes; c += kVD) {
      const VD sum = LineSums<kCol>(g, a, n, c);
      for (int64_t b = 0; b < n; ++b) {
        const int64_t e = (a * across + b * along) * kLanes + c;
        StoreV(g + e, LoadV<VD>(g + e) - LoadV<VD>(pk + e) * sum);
      }
    }
  }
}

// Calls fn with n as a compile-time constant for the stream counts the
// designs use (2, 4, 8: the loops unroll), else with 0 (n at run time).
template <typename Fn>
void WithStreams(int64_t n, Fn&& fn) {
  switch (n) {
    case 2: fn(std::integral_constant<int, 2>{}); break;
    case 4: fn(std::integral_constant<int, 4>{}); break;
    case 8: fn(std::integral_constant<int, 8>{}); break;
    default: fn(std::integral_constant<int, 0>{}); break;
  }
}

// Loads matrices [m0, m0 + count) of z (count <= kLanes) as exp(z) into the
// block layout; missing lanes get a copy of the first matrix (discarded).
template <typename T>
void LoadExp(const T* z, int64_t m0, int64_t count, int64_t nn, double* p) {
  static_assert(kLanes == 8, "one Exp8d per element of the block");
  for (int64_t k = 0; k < kLanes; ++k) {
    const T* src = z + (m0 + (k < count ? k : 0)) * nn;
    for (int64_t e = 0; e < nn; ++e) p[e * kLanes + k] = static_cast<double>(src[e]);
  }
  for (int64_t e = 0; e < nn; ++e) Exp8d(p + e * kLanes, p + e * kLanes);
}

class SinkhornFunction : public torch::autograd::Function<SinkhornFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& logits_in,
                               int64_t iterations, double eps) {
    torch::Tensor z = logits_in.contiguous();
    const int64_t n = z.size(-1), nn = n * n, mats = z.numel() / std::max<int64_t>(nn, 1);
    const int64_t blocks = (mats + kLanes - 1) / kLanes;
    torch::Tensor out = torch::empty_like(z);
    AT_DISPATCH_FLOATING_TYPES(z.scalar_type(), "cpu_fused::Sinkhorn", [&] {
      const scalar_t* zp = z.data_ptr<scalar_t>();
      scalar_t* op = out.data_ptr<scalar_t>();
      at::parallel_for(0, blocks, Grain(kLanes * nn * 4 * iterations), [&](int64_t begin, int64_t end) {
        double p[kMaxSinkhornStreams * kMaxSinkhornStreams * kLanes];
        for (int64_t blk = begin; blk < end; ++blk) {
          const int64_t m0 = blk * kLanes, count = std::min(kLanes, mats - m0);
          LoadExp(zp, m0, count, nn, p);
          WithStreams(n, [&](auto nc) {
            SinkhornBlock<decltype(nc)::value>(p, n, static_cast<int>(iterations), eps, nullptr);
          });
          for (int64_t k = 0; k < count; ++k) {
            for (int64_t e = 0; e < nn; ++e) op[(m0 + k) * nn + e] = static_cast<scalar_t>(p[e * kLanes + k]);
          }
        }
      });
    });
    ctx->save_for_backward({z});
    ctx->saved_data["iterations"] = iterations;
    ctx->saved_data["eps"] = eps;
    return out;
  }

  // With P_k the state after half step k (row steps even, column steps odd)
  // and g the gradient w.r.t. the log-domain state z_k = log P_k: a row step
  // z' = z - log(sum_j exp z_j + eps) maps g' to g = g' - P' * rowsum(g'), a
  // column step likewise with column sums; the start is g = dout * P_final.
  // The forward states are recomputed per block.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const torch::Tensor z = ctx->get_saved_variables()[0];
    const int iterations = static_cast<int>(ctx->saved_data["iterations"].toInt());
    const double eps = ctx->saved_data["eps"].toDouble();
    torch::Tensor dout = grads[0].contiguous();
    const int64_t n = z.size(-1), nn = n * n, mats = z.numel() / std::max<int64_t>(nn, 1);
    const int64_t blocks = (mats + kLanes - 1) / kLanes;
    torch::Tensor dz = torch::empty_like(z);
    AT_DISPATCH_FLOATING_TYPES(z.scalar_type(), "cpu_fused::SinkhornBackward", [&] {
      const scalar_t* zp = z.data_ptr<scalar_t>();
      const scalar_t* gp = dout.data_ptr<scalar_t>();
      scalar_t* dzp = dz.data_ptr<scalar_t>();
      at::parallel_for(0, blocks, Grain(kLanes * nn * 8 * iterations), [&](int64_t begin, int64_t end) {
        std::vector<double> states(static_cast<size_t>(std::max(1, 2 * iterations) * nn * kLanes));
        double p[kMaxSinkhornStreams * kMaxSinkhornStreams * kLanes];
        double g[kMaxSinkhornStreams * kMaxSinkhornStreams * kLanes];
        for (int64_t blk = begin; blk < end; ++blk) {
          const int64_t m0 = blk * kLanes, count = std::min(kLanes, mats - m0);
          LoadExp(zp, m0, count, nn, p);
          WithStreams(n, [&](auto nc) {
            constexpr int NC = decltype(nc)::value;
            SinkhornBlock<NC>(p, n, iterations, eps, states.data());
            for (int64_t k = 0; k < kLanes; ++k) {
              const scalar_t* src = gp + (m0 + (k < count ? k : 0)) * nn;
              for (int64_t e = 0; e < nn; ++e) g[e * kLanes + k] = static_cast<double>(src[e]) * p[e * kLanes + k];
            }
            // Back from the last (column) step: odd steps are column steps.
            for (int step = 2 * iterations - 1; step > 0; step -= 2) {
              SinkhornBackStep<NC, true>(g, states.data() + step * nn * kLanes, n);
              SinkhornBackStep<NC, false>(g, states.data() + (step - 1) * nn * kLanes, n);
            }
          });
          for (int64_t k = 0; k < count; ++k) {
            for (int64_t e = 0; e < nn; ++e) dzp[(m0 + k) * nn + e] = static_cast<scalar_t>(g[e * kLanes + k]);
          }
        }
      });
    });
    return {dz, torch::Tensor(), torch::Tensor()};
  }
};

// ---------------------------------------------------------- AttnRes mixing

// Rows are processed in tiles, and within a tile source by source: each
// loop over a tile's rows reads one source's rows (and writes one source
// gradient's), a few sequential streams the hardware prefetchers follow.
// Row by row, every row read a row of all S sources and of every passed
// source's gradient and wrote one of every source gradient, 3 S streams
// (51 at Full AttnRes's last mix at L = 8), far more than the prefetchers
// track: with software prefetching of each stream, the backward still ran
// at a third of the machine's streaming bandwidth (issue 18). The tile's
// rows of all sources fill about one L2 between the source-major passes; the
// per-row state between them (mixed rows, their gradient, the logit
// gradients) is a tile's worth.
// The tile's rows change only how the backward groups its float sums of
// the query gradient, as the threads' row ranges already do.
int64_t MixTileRows(int64_t S, int64_t d, size_t elem) {
  // One L2 of this CPU: sysconf's figure (glibc reads it from CPUID), or
  // 1 MB (Zen 4/5's) where it reports none or an unlikely size. A quarter
  // of the L2 (before 2026-12-05) was 2-9% slower on Zen 5 (mix_ops_bench,
  // alternated in one process): a tile cut each source's sequential run to
  // ~30 rows at Full AttnRes's last mix, and each run starts with misses the
  // prefetchers have not yet learnt. On a Zen 3 (512 KB L2) a 1 MB tile
  // spilled each source's second read to L3: its mix 5% slower than at
  // 512 KB (bench/RESULTS.md, session 34).
  static const int64_t kTileBytes = [] {
    const long l2 = ::sysconf(_SC_LEVEL2_CACHE_SIZE);
    return l2 >= 256 * 1024 && l2 <= 8 * 1024 * 1024 ? static_cast<int64_t>(l2)
                                                     : int64_t{1024 * 1024};
  }();
  const int64_t per_row = std::max<int64_t>(1, S * d * static_cast<int64_t>(elem));
  return std::clamp<int64_t>(kTileBytes / per_row, 4, 512);
}

// The mix of rows [r0, r1): out row r - r0 (d apart) = sum_i p[r, i] v_i[r]
// with p [rows][S], source by source (the forward's output before its
// normalisation, which the backward reuses).
template <typename T>
void MixTile(const T* pp, const std::vector<const T*>& vp, int64_t S, int64_t d, int64_t r0,
             int64_t r1, T* out) {
  for (int64_t r = r0; r < r1; ++r) {
    T* o = out + (r - r0) * d;
    const T p0 = pp[r * S];
    const T* v0 = vp[0] + r * d;
    for (int64_t j = 0; j < d; ++j) o[j] = p0 * v0[j];
  }
  for (int64_t i = 1; i < S; ++i) {
    for (int64_t r = r0; r < r1; ++r) Axpy(pp[r * S + i], vp[i] + r * d, out + (r - r0) * d, d);
  }
}

// How many rows ahead the backward asks for the older sources' arriving
// gradients. Each mix's backward reads and writes every older source's
// gradient once (it adds its term to the one passed back from the later
// mixes), a tile of rows per source, from L3: on Zen 5, 40% of the
// backward's samples sat on that store, waiting on the load. Asked for 8
// rows ahead, and across each source's end to the next one's first rows
// (where the hardware prefetcher starts over), the backward took 20% fewer
// samples (4 rows: 10%; bench/RESULTS.md, session 35).
constexpr int64_t kMixAheadRows = 8;

// One row of a source's gradient in the mix backward (AttnResMixFunction
// below): o = pi dm + dl (a - v coef) + in (in may be o itself, or null),
// and dat += dl v; without a query o = pi dm + in and dat untouched.
// ahead (or null): a row asked for writing, a line per line of the sweep:
// asked for a row at a time, the burst of requests filled the core's queue
// of misses and the prefetch instruction itself stalled, 14% of the
// backward's samples (bench/RESULTS.md, session 36). In float with whole
// lines the loops are written out in vectors (as loops over a line GCC
// could not rule out that dat aliases the rows and left them scalar), the
// same operations per element, so the same values.
template <typename T>
inline void MixGradRow(const T* vi, const T* dmr, const T* a, const T* in, T pi, T dl, T coef,
                       bool has_query, int64_t d, const T* ahead, T* dat, T* o) {
  if constexpr (std::is_same_v<T, float>) {
    if (d % kFloatsPerLine == 0) {
      const VF pv = BroadcastVF(pi), dlv = BroadcastVF(dl), cv = BroadcastVF(coef);
      for (int64_t j0 = 0; j0 < d; j0 += kFloatsPerLine) {
        if (ahead != nullptr) PrefetchL1<true>(ahead + j0, 1);
        for (int64_t j = j0; j < j0 + kFloatsPerLine; j += kVF) {
          VF t;
          if (!has_query) {
            t = pv * LoadVF(dmr + j);
          } else {
            const VF v = LoadVF(vi + j);
            StoreVF(dat + j, LoadVF(dat + j) + dlv * v);
            t = pv * LoadVF(dmr + j) + dlv * (LoadVF(a + j) - v * cv);
          }
          if (in != nullptr) t += LoadVF(in + j);
          StoreVF(o + j, t);
        }
      }
      return;
    }
  }
  if (ahead != nullptr) PrefetchL1<true>(ahead, d * static_cast<int64_t>(sizeof(T)));
  if (!has_query) {
    if (in != nullptr) {
      for (int64_t j = 0; j < d; ++j) o[j] = pi * dmr[j] + in[j];
    } else {
      for (int64_t j = 0; j < d; ++j) o[j] = pi * dmr[j];
    }
    return;
  }
  for (int64_t j = 0; j < d; ++j) dat[j] += dl * vi[j];
  if (in != nullptr) {
    for (int64_t j = 0; j < d; ++j) o[j] = pi * dmr[j] + dl * (a[j] - vi[j] * coef) + in[j];
  } else {
    for (int64_t j = 0; j < d; ++j) o[j] = pi * dmr[j] + dl * (a[j] - vi[j] * coef);
  }
}

class AttnResMixFunction : public torch::autograd::Function<AttnResMixFunction> {
 public:
  // has_query false: uniform weights; query and key_gain are then empty
  // placeholders (autograd functions take no undefined inputs). With
  // pass_through the sources follow the output, passed through (AttnResMix
  // in cpu_fused.h): their gradients arrive in the backward and are added
  // into the sources' gradients as the kernel writes them.
  static variable_list forward(AutogradContext* ctx, at::TensorList sources_in,
                               const torch::Tensor& query_in, const torch::Tensor& key_gain_in,
                               const torch::Tensor& out_gain_in, double eps, bool has_query,
                               bool pass_through) {
    const int64_t S = static_cast<int64_t>(sources_in.size());
    std::vector<torch::Tensor> v;
    for (const auto& t : sources_in) v.push_back(t.contiguous());
    const int64_t d = v[0].size(-1), rows = v[0].numel() / std::max<int64_t>(d, 1);
    torch::Tensor og = out_gain_in.contiguous();
    torch::Tensor q = has_query ? query_in.contiguous() : torch::Tensor();
    torch::Tensor kg = has_query ? key_gain_in.contiguous() : torch::Tensor();
    TORCH_CHECK(og.numel() == d, "AttnResMix: out_gain has ", og.sizes(), ", expected [", d, "]");
    if (has_query) {
      TORCH_CHECK(q.numel() == d, "AttnResMix: query has ", q.sizes(), ", expected [", d, "]");
      TORCH_CHECK(kg.numel() == d, "AttnResMix: key_gain has ", kg.sizes(), ", expected [", d, "]");
    }
    torch::Tensor y = torch::empty_like(v[0]);
    // Per row: softmax weights p, source rsqrt r, logits, output rsqrt s.
    torch::Tensor p = torch::empty({rows, S}, v[0].options());
    torch::Tensor rr = torch::empty({rows, S}, v[0].options());
    torch::Tensor lg = torch::empty({rows, S}, v[0].options());
    torch::Tensor so = torch::empty({rows}, v[0].options());
    // The mix before its normalisation, kept for the backward: recomputing
    // it there took one more pass over every source (a fifth of Full
    // AttnRes's mix time) for one [rows, d] tensor per mix.
    torch::Tensor mixed = torch::empty_like(v[0]);
    AT_DISPATCH_FLOATING_TYPES(v[0].scalar_type(), "cpu_fused::AttnResMix", [&] {
      std::vector<const scalar_t*> vp;
      for (const auto& t : v) vp.push_back(t.data_ptr<scalar_t>());
      std::vector<scalar_t> a(static_cast<size_t>(d), 0);  // query * key_gain
      if (has_query) {
        const scalar_t* qp = q.data_ptr<scalar_t>();
        const scalar_t* kp = kg.data_ptr<scalar_t>();
        for (int64_t j = 0; j < d; ++j) a[j] = qp[j] * kp[j];
      }
      const scalar_t* gop = og.data_ptr<scalar_t>();
      scalar_t* yp = y.data_ptr<scalar_t>();
      scalar_t* pp = p.data_ptr<scalar_t>();
      scalar_t* rp = rr.data_ptr<scalar_t>();
      scalar_t* lp = lg.data_ptr<scalar_t>();
      scalar_t* sp = so.data_ptr<scalar_t>();
      scalar_t* mp = mixed.data_ptr<scalar_t>();
      const int64_t tile = MixTileRows(S, d, sizeof(scalar_t));
      at::parallel_for(0, rows, Grain(3 * S * d), [&](int64_t begin, int64_t end) {
        // Per tile row: the online softmax's running maximum and sum; ex:
        // exponents in, exponentials out (2 per row, or S per row for p),
        // padded to ExpN's blocks of 8.
        std::vector<double> run_max(static_cast<size_t>(tile)), run_sum(static_cast<size_t>(tile));
        std::vector<double> ex(static_cast<size_t>(tile * std::max<int64_t>(S, 2) + 8));
        // A source's sums of squares and logit numerators (v_i . a) for the
        // tile's rows (SquaresAndDotsOfRows, padded to its blocks).
        std::vector<scalar_t> ss(static_cast<size_t>(tile + kVF)), la(ss.size());
        // Rows [ra, rb) of the output, rb - ra <= kVF: the mix normalised
        // (its rsqrt kept for the backward), the rows' sums of squares
        // (Dot's) and rsqrt (InvRmsOfSums, the per-row form's rounding) a
        // vector at a time rather than a scalar square root and division
        // per row.
        scalar_t inv_rows[kVF];  // DotsOfRows writes kVF values
        auto normalise = [&](int64_t ra, int64_t rb) {
          DotsOfRows(mp + ra * d, d, mp + ra * d, d, rb - ra, d, inv_rows);
          InvRmsOfSums(inv_rows, rb - ra, d, eps, inv_rows);
          for (int64_t r = ra; r < rb; ++r) {
            const scalar_t* mr = mp + r * d;
            scalar_t* yr = yp + r * d;
            const scalar_t inv = inv_rows[r - ra];
            sp[r] = inv;
            for (int64_t j = 0; j < d; ++j) yr[j] = mr[j] * inv * gop[j];
          }
        };
        for (int64_t r0 = begin; r0 < end; r0 += tile) {
          const int64_t r1 = std::min(end, r0 + tile);
          if (has_query) {
            // One pass over the sources with an online softmax: per source,
            // its rows' rsqrt and logit, then its term added to each row's
            // running sum, rescaled by exp(old max - new max) (the two
            // passes this replaces, logits then mix, read every source
            // twice). The exponentials are taken a source's rows at a time,
            // vectorised (ExpN; one libm call per value cost as much as the
            // pass it saved). mp's rows hold the unnormalised sum until the
            // division below.
            const int64_t nr = r1 - r0;
            for (int64_t i = 0; i < S; ++i) {
              SquaresAndDotsOfRows(vp[i] + r0 * d, d, static_cast<const scalar_t*>(a.data()), nr,
                                   d, ss.data(), la.data());
              InvRmsOfSums(ss.data(), nr, d, eps, ss.data());
              for (int64_t r = r0; r < r1; ++r) {
                const scalar_t inv = ss[r - r0];
                const scalar_t l = inv * la[r - r0];
                rp[r * S + i] = inv;
                lp[r * S + i] = l;
                const int64_t k = r - r0;
                const double mx = i == 0 ? static_cast<double>(l) : std::max<double>(run_max[k], l);
                ex[k] = l - mx;                                      // -> weight of the term
                ex[nr + k] = i == 0 ? 0.0 : run_max[k] - mx;         // -> rescale of the sum
                run_max[k] = mx;
              }
              ExpN(ex.data(), 2 * nr, ex.data());
              for (int64_t r = r0; r < r1; ++r) {
                const int64_t k = r - r0;
                const scalar_t* vi = vp[i] + r * d;
                scalar_t* acc = mp + r * d;
                const double w = ex[k];
                if (i == 0) {
                  run_sum[k] = w;
                  for (int64_t j = 0; j < d; ++j) acc[j] = static_cast<scalar_t>(w) * vi[j];
                } else {
                  const double c = ex[nr + k];
                  run_sum[k] = run_sum[k] * c + w;
                  const scalar_t cs = static_cast<scalar_t>(c), ws = static_cast<scalar_t>(w);
                  for (int64_t j = 0; j < d; ++j) acc[j] = acc[j] * cs + ws * vi[j];
                }
              }
            }
            // p = exp(logit - max) / sum, the tile's rows at once.
            for (int64_t r = r0; r < r1; ++r) {
              for (int64_t i = 0; i < S; ++i) ex[(r - r0) * S + i] = lp[r * S + i] - run_max[r - r0];
            }
            ExpN(ex.data(), nr * S, ex.data());
            for (int64_t ra = r0; ra < r1; ra += kVF) {
              const int64_t rb = std::min<int64_t>(r1, ra + kVF);
              for (int64_t r = ra; r < rb; ++r) {
                const double total = run_sum[r - r0];
                scalar_t* pr = pp + r * S;
                for (int64_t i = 0; i < S; ++i) pr[i] = static_cast<scalar_t>(ex[(r - r0) * S + i] / total);
                const scalar_t scale = static_cast<scalar_t>(1.0 / total);
                scalar_t* mr = mp + r * d;
                for (int64_t j = 0; j < d; ++j) mr[j] *= scale;
              }
              normalise(ra, rb);  // while the rows are in L1
            }
          } else {
            // Uniform weights: the mean of the sources.
            for (int64_t r = r0; r < r1; ++r) {
              for (int64_t i = 0; i < S; ++i) {
                rp[r * S + i] = 0;
                lp[r * S + i] = 0;
                pp[r * S + i] = static_cast<scalar_t>(1.0 / static_cast<double>(S));
              }
            }
            MixTile(static_cast<const scalar_t*>(pp), vp, S, d, r0, r1, mp + r0 * d);
            for (int64_t ra = r0; ra < r1; ra += kVF) normalise(ra, std::min<int64_t>(r1, ra + kVF));
          }
        }
      });
    });
    std::vector<torch::Tensor> save = v;
    save.push_back(has_query ? q : torch::Tensor());
    save.push_back(has_query ? kg : torch::Tensor());
    save.push_back(og);
    save.push_back(p);
    save.push_back(rr);
    save.push_back(lg);
    save.push_back(so);
    save.push_back(mixed);
    ctx->save_for_backward(save);
    ctx->saved_data["S"] = S;
    ctx->saved_data["has_query"] = has_query;
    variable_list out = {y};
    if (pass_through) out.insert(out.end(), v.begin(), v.end());
    return out;
  }

  // Per row, with m = sum_i p_i v_i (saved by the forward), g = dy:
  //   dm = s (og g - m s^2 mean(og g m));        dout_gain += g m s
  //   dp_i = v_i . dm; dlogit = p (dp - sum p dp)
  //   dv_i = p_i dm + dlogit_i r_i (a - v_i r_i logit_i / d)
  //   da += dlogit_i r_i v_i; dquery = da key_gain; dkey_gain = da query;
  // dv_i also gets the gradient of the passed-through v_i, if any.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list saved = ctx->get_saved_variables();
    const int64_t S = ctx->saved_data["S"].toInt();
    const bool has_query = ctx->saved_data["has_query"].toBool();
    std::vector<torch::Tensor> v(saved.begin(), saved.begin() + S);
    const torch::Tensor& q = saved[S];
    const torch::Tensor& kg = saved[S + 1];
    const torch::Tensor& og = saved[S + 2];
    const torch::Tensor& p = saved[S + 3];
    const torch::Tensor& rr = saved[S + 4];
    const torch::Tensor& lg = saved[S + 5];
    const torch::Tensor& so = saved[S + 6];
    const torch::Tensor& mixed = saved[S + 7];
    torch::Tensor dy = grads[0].contiguous();
    const int64_t d = v[0].size(-1), rows = v[0].numel() / std::max<int64_t>(d, 1);
    // dv_in: the pass-through's gradient (undefined: none); where it is a
    // gradient of ours nobody else sees (TakeOwnedGradient), it becomes dv
    // and the kernel adds into it in place.
    std::vector<torch::Tensor> dv, dv_in;
    for (int64_t i = 0; i < S; ++i) {
      torch::Tensor in = static_cast<int64_t>(grads.size()) > 1 + i ? std::move(grads[1 + i])
                                                                    : torch::Tensor();
      if (TakeOwnedGradient(in, v[i].sizes(), v[i].scalar_type())) {
        dv.push_back(in);
        dv_in.push_back(in);
      } else {
        dv.push_back(torch::empty_like(v[i]));
        dv_in.push_back(ContiguousOrUndefined(in));
      }
    }
    const int64_t threads = at::get_num_threads();
    // Per-thread partial sums: [threads][2][d] (dout_gain, da).
    std::vector<double> partial(static_cast<size_t>(threads * 2 * d), 0.0);
    AT_DISPATCH_FLOATING_TYPES(v[0].scalar_type(), "cpu_fused::AttnResMixBackward", [&] {
      std::vector<const scalar_t*> vp, dvinp;
      std::vector<scalar_t*> dvp;
      for (int64_t i = 0; i < S; ++i) {
        vp.push_back(v[i].data_ptr<scalar_t>());
        dvp.push_back(dv[i].data_ptr<scalar_t>());
        dvinp.push_back(dv_in[i].defined() ? dv_in[i].data_ptr<scalar_t>() : nullptr);
      }
      std::vector<scalar_t> a(static_cast<size_t>(d), 0);
      if (has_query) {
        const scalar_t* qp = q.data_ptr<scalar_t>();
        const scalar_t* kp = kg.data_ptr<scalar_t>();
        for (int64_t j = 0; j < d; ++j) a[j] = qp[j] * kp[j];
      }
      const scalar_t* gop = og.data_ptr<scalar_t>();
      const scalar_t* gp = dy.data_ptr<scalar_t>();
      const scalar_t* pp = p.data_ptr<scalar_t>();
      const scalar_t* rp = rr.data_ptr<scalar_t>();
      const scalar_t* lp = lg.data_ptr<scalar_t>();
      const scalar_t* sp = so.data_ptr<scalar_t>();
      const scalar_t* mp = mixed.data_ptr<scalar_t>();
      const int64_t tile = MixTileRows(S, d, sizeof(scalar_t));
      at::parallel_for(0, rows, Grain(5 * S * d), [&](int64_t begin, int64_t end) {
        double* acc_go = partial.data() + at::get_thread_num() * 2 * d;
        double* acc_a = acc_go + d;
        // The tile's gradients of the mixed rows dm, and dp [rows][S].
        std::vector<scalar_t> dm(static_cast<size_t>(tile * d));
        // dp source-major ([S][tile], each source's padded to DotsOfRows'
        // blocks); da_tile: a source's sum of dlogit_i r_i v_i over the
        // tile's rows, added into the double partial once per tile and
        // source instead of once per row and source (a conversion and a
        // double FMA per element, a sixth of the backward).
        const int64_t dp_ld = tile + kVF;
        std::vector<scalar_t> dp(static_cast<size_t>(dp_ld * S)), pdp(static_cast<size_t>(tile));
        std::vector<scalar_t> da_tile(static_cast<size_t>(has_query ? d : 0));
        for (int64_t r0 = begin; r0 < end; r0 += tile) {
          const int64_t r1 = std::min(end, r0 + tile);
          for (int64_t r = r0; r < r1; ++r) {
            const scalar_t* g = gp + r * d;
            const scalar_t s = sp[r];
            const scalar_t* mr = mp + r * d;  // m = sum_i p_i v_i (saved)
            scalar_t* dmr = dm.data() + (r - r0) * d;
            // mean(og g m) via a dot of (og g) and m
            for (int64_t j = 0; j < d; ++j) dmr[j] = gop[j] * g[j];
            const scalar_t gm = Dot(dmr, mr, d) / static_cast<scalar_t>(d);
            const scalar_t c = s * s * gm;
            for (int64_t j = 0; j < d; ++j) {
              acc_go[j] += static_cast<double>(g[j]) * mr[j] * s;
              dmr[j] = s * (dmr[j] - mr[j] * c);
            }
          }
          // dp_i = v_i . dm, source by source; then sum_i p_i dp_i per row.
          for (int64_t i = 0; i < S; ++i) {
            DotsOfRows(vp[i] + r0 * d, d, static_cast<const scalar_t*>(dm.data()), d, r1 - r0, d,
                       dp.data() + i * dp_ld);
          }
          for (int64_t r = r0; r < r1; ++r) {
            scalar_t sum = 0;
            for (int64_t i = 0; i < S; ++i) sum += pp[r * S + i] * dp[i * dp_ld + (r - r0)];
            pdp[r - r0] = sum;
          }
          // The source gradients, source by source.
          for (int64_t i = 0; i < S; ++i) {
            std::fill(da_tile.begin(), da_tile.end(), scalar_t(0));
            for (int64_t r = r0; r < r1; ++r) {
              // The arriving gradient's row kMixAheadRows on (in this
              // source, or past the tile's end the next source's first
              // rows), asked for writing as this row is swept: it is
              // usually written in place.
              const scalar_t* ahead = nullptr;
              if (const int64_t past = r + kMixAheadRows - r1; past < 0) {
                if (dvinp[i] != nullptr) ahead = dvinp[i] + (r + kMixAheadRows) * d;
              } else if (i + 1 < S && dvinp[i + 1] != nullptr && r0 + past < r1) {
                ahead = dvinp[i + 1] + (r0 + past) * d;
              }
              const scalar_t* vi = vp[i] + r * d;
              const scalar_t* dmr = dm.data() + (r - r0) * d;
              scalar_t* o = dvp[i] + r * d;
              // The arriving gradient's row; it may be o itself (in place:
              // each element is read before it is written).
              const scalar_t* in = dvinp[i] != nullptr ? dvinp[i] + r * d : nullptr;
              const scalar_t pi = pp[r * S + i];
              // dlogit_i r_i, and the coefficient of v_i in its term
              const scalar_t dl =
                  has_query ? pi * (dp[i * dp_ld + (r - r0)] - pdp[r - r0]) * rp[r * S + i] : 0;
              const scalar_t coef =
                  has_query ? rp[r * S + i] * lp[r * S + i] / static_cast<scalar_t>(d) : 0;
              MixGradRow(vi, dmr, a.data(), in, pi, dl, coef, has_query, d, ahead,
                         da_tile.data(), o);
            }
            for (size_t j = 0; j < da_tile.size(); ++j) acc_a[j] += da_tile[j];
          }
        }
      });
    });
    torch::Tensor sums = SumPartials(partial, threads, 2 * d, {2, d}, og.scalar_type());
    torch::Tensor dgo = sums[0].reshape(og.sizes());
    for (const torch::Tensor& g : dv) MarkOwnedGradient(g);
    variable_list out(dv.begin(), dv.end());
    if (has_query) {
      torch::Tensor da = sums[1];
      out.push_back((da * kg.reshape({-1})).reshape(q.sizes()));
      out.push_back((da * q.reshape({-1})).reshape(kg.sizes()));
    } else {
      out.push_back(torch::Tensor());
      out.push_back(torch::Tensor());
    }
    out.push_back(dgo);
    out.push_back(torch::Tensor());  // eps
    out.push_back(torch::Tensor());  // has_query
    out.push_back(torch::Tensor());  // pass_through
    return out;
  }
};

}  // namespace

torch::Tensor HcRead(const torch::Tensor& h, const torch::Tensor& read) {
  return HcReadFunction::apply(h, read);
}

torch::Tensor HcWrite(const torch::Tensor& h, const torch::Tensor& a, const torch::Tensor& b,
                      const torch::Tensor& y) {
  if (a.defined()) return HcWriteFunction::apply(h, a, b, y, true);
  return HcWriteFunction::apply(h, torch::empty({0}, h.options()), b, y, false);
}

torch::Tensor RmsProject(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  return RmsProjectFunction::apply(x, w, eps);
}

std::vector<torch::Tensor> HcCoefficients(const torch::Tensor& u, const torch::Tensor& static_a,
                                          const torch::Tensor& static_b,
                                          const torch::Tensor& gain_a,
                                          const torch::Tensor& gain_b) {
  return HcCoefficientsFunction::apply(u, static_a, static_b, gain_a, gain_b);
}

std::vector<torch::Tensor> MhcCoefficients(const torch::Tensor& u, const torch::Tensor& gains,
                                           const torch::Tensor& bias, int64_t n) {
  return MhcCoefficientsFunction::apply(u, gains, bias, n);
}

std::vector<torch::Tensor> MhcRoute(const torch::Tensor& h, const torch::Tensor& phi,
                                    const torch::Tensor& gains, const torch::Tensor& bias,
                                    int64_t n, double eps, cpu_gemm::SgemmFn gemm) {
  return MhcRouteFunction::apply(h, phi, gains, bias, n, eps, gemm);
}

std::vector<torch::Tensor> HcRoute(const torch::Tensor& h, const torch::Tensor& w,
                                   const torch::Tensor& static_a, const torch::Tensor& static_b,
                                   const torch::Tensor& gain_a, const torch::Tensor& gain_b,
                                   double eps) {
  return HcRouteFunction::apply(h, w, static_a, static_b, gain_a, gain_b, eps);
}

std::vector<torch::Tensor> HcWriteRoute(const torch::Tensor& h, const torch::Tensor& a,
                                        const torch::Tensor& b, const torch::Tensor& y,
                                        const torch::Tensor& w, const torch::Tensor& static_a,
                                        const torch::Tensor& static_b, const torch::Tensor& gain_a,
                                        const torch::Tensor& gain_b, double eps) {
  const bool mix = a.defined();
  return HcWriteRouteFunction::apply(h, mix ? a : torch::empty({0}, h.options()), b, y, w,
                                     static_a, static_b, gain_a, gain_b, eps, mix);
}

torch::Tensor Sinkhorn(const torch::Tensor& logits, int iterations, double eps) {
  TORCH_CHECK(logits.dim() >= 2 && logits.size(-1) == logits.size(-2) &&
                  logits.size(-1) <= kMaxSinkhornStreams,
              "Sinkhorn: logits need [..., n, n] with n <= ", kMaxSinkhornStreams, ", have ",
              logits.sizes());
  TORCH_CHECK(iterations >= 0 && iterations <= kMaxSinkhornIterations,
              "Sinkhorn: iterations ", iterations, " outside [0, ", kMaxSinkhornIterations, "]");
  return SinkhornFunction::apply(logits, static_cast<int64_t>(iterations), eps);
}

torch::Tensor AttnResMix(const std::vector<torch::Tensor>& sources, const torch::Tensor& query,
                         const torch::Tensor& key_gain, const torch::Tensor& out_gain,
                         double eps, std::vector<torch::Tensor>* passed) {
  TORCH_CHECK(!sources.empty(), "AttnResMix: no sources");
  for (const auto& s : sources) {
    TORCH_CHECK(s.sizes() == sources[0].sizes(), "AttnResMix: source of shape ", s.sizes(),
                " differs from the first's ", sources[0].sizes());
  }
  TORCH_CHECK(!query.defined() || key_gain.defined(), "AttnResMix: a query needs a key_gain");
  const bool has_query = query.defined();
  torch::Tensor none = has_query ? torch::Tensor() : torch::empty({0}, out_gain.options());
  variable_list r = AttnResMixFunction::apply(at::TensorList(sources), has_query ? query : none,
                                              has_query ? key_gain : none, out_gain, eps,
                                              has_query, passed != nullptr);
  if (passed != nullptr) passed->assign(r.begin() + 1, r.end());
  return r[0];
}

}  // namespace DEPTHBENCH_CPU_FUSED_ISA
}  // namespace cpu_fused
}  // namespace depthbench
