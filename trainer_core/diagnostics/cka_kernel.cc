#include "trainer_core/diagnostics/cka_kernel.h"

#include <dlfcn.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "cuda_ops/cpu_gemm.h"

namespace depthbench {
namespace diagnostics {
namespace {

using Clock = std::chrono::steady_clock;

// Adds the seconds from construction to destruction to *acc.
class PhaseTimer {
 public:
  explicit PhaseTimer(double* acc) : acc_(acc), start_(Clock::now()) {}
  ~PhaseTimer() { *acc_ += std::chrono::duration<double>(Clock::now() - start_).count(); }
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

 private:
  double* acc_;
  Clock::time_point start_;
};

// Elements per thread, at least, of the centring copy.
constexpr int64_t kCentreGrainElems = int64_t{1} << 17;

// Bytes per piece of a block that is read (pread) and centred in place
// before the next piece: small enough to stay in a core's L2 between the
// two.
constexpr int64_t kReadPieceBytes = int64_t{1} << 18;

// Elements per block of the mean / variance pass.
constexpr int64_t kStatsChunkElems = int64_t{1} << 19;

int64_t SaturatedBytes(long double bytes) {
  constexpr auto kMax = std::numeric_limits<int64_t>::max();
  return bytes >= static_cast<long double>(kMax) ? kMax
                                                 : static_cast<int64_t>(bytes);
}

// ---- Diagonal tiles through the BLAS's syrk ----
// A diagonal tile K = X_a X_a^T is symmetric: syrk forms its upper triangle
// in half the FLOPs of a GEMM. LibTorch (1.13) has no syrk op (at::mm,
// addmm and matmul always form the full product), so the kernel calls the
// syrk of the BLAS LibTorch already loaded into the process (Debian:
// libtorch_cpu -> libblas.so.3 -> OpenBLAS), looked up with dlsym: cblas_?syrk,
// else the Fortran ?syrk_. No new link dependency; where the process has
// neither, the diagonal tiles fall back to a full at::mm (CkaResult says
// which ran).
constexpr int kCblasRowMajor = 101;  // cblas.h: CblasRowMajor
constexpr int kCblasUpper = 121;     // CblasUpper
constexpr int kCblasNoTrans = 111;   // CblasNoTrans
template <typename T>
using CblasSyrk = void (*)(int, int, int, int, int, T, const T*, int, T, T*,
                           int);
template <typename T>
using FortranSyrk = void (*)(const char*, const char*, const int*, const int*,
                             const T*, const T*, const int*, const T*, T*,
                             const int*);

struct ProcessSyrk {
  CblasSyrk<float> cs = nullptr;
  CblasSyrk<double> cd = nullptr;
  FortranSyrk<float> fs = nullptr;
  FortranSyrk<double> fd = nullptr;
  std::string description;  // "cblas_ssyrk (/usr/lib/.../libblas.so.3)"
  bool ok() const {
    return (cs != nullptr && cd != nullptr) || (fs != nullptr && fd != nullptr);
  }
};

std::string SymbolLibrary(void* symbol) {
  Dl_info info{};
  if (dladdr(symbol, &info) != 0 && info.dli_fname != nullptr) {
    return info.dli_fname;
  }
  return "?";
}

const ProcessSyrk& FindSyrk() {
  static const ProcessSyrk syrk = [] {
    ProcessSyrk s;
    s.cs = reinterpret_cast<CblasSyrk<float>>(dlsym(RTLD_DEFAULT, "cblas_ssyrk"));
    s.cd = reinterpret_cast<CblasSyrk<double>>(dlsym(RTLD_DEFAULT, "cblas_dsyrk"));
    if (s.cs != nullptr && s.cd != nullptr) {
      s.description = absl::StrCat("cblas_ssyrk/dsyrk (",
                                   SymbolLibrary(reinterpret_cast<void*>(s.cs)),
                                   ")");
      return s;
    }
    s.cs = nullptr;
    s.cd = nullptr;
    s.fs = reinterpret_cast<FortranSyrk<float>>(dlsym(RTLD_DEFAULT, "ssyrk_"));
    s.fd = reinterpret_cast<FortranSyrk<double>>(dlsym(RTLD_DEFAULT, "dsyrk_"));
    if (s.fs != nullptr && s.fd != nullptr) {
      s.description = absl::StrCat("ssyrk_/dsyrk_ (",
                                   SymbolLibrary(reinterpret_cast<void*>(s.fs)),
                                   ")");
    }
    return s;
  }();
  return syrk;
}

// Upper triangle of the row-major t x t tile c (row stride t) = a a^T for a
// row-major [t, d] block (row stride lda). The lower triangle is not
// written.
template <typename T>
void SyrkUpper(const ProcessSyrk& s, const T* a, int64_t t, int64_t d,
               int64_t lda, T* c) {
  const int n = static_cast<int>(t), k = static_cast<int>(d);
  const int ia = static_cast<int>(lda), ic = static_cast<int>(t);
  const T one = 1, zero = 0;
  CblasSyrk<T> cblas;
  FortranSyrk<T> fortran;
  if constexpr (std::is_same_v<T, float>) {
    cblas = s.cs;
    fortran = s.fs;
  } else {
    cblas = s.cd;
    fortran = s.fd;
  }
  if (cblas != nullptr) {
    cblas(kCblasRowMajor, kCblasUpper, kCblasNoTrans, n, k, one, a, ia, zero,
          c, ic);
    return;
  }
  // Column-major view of the same memory: a is a k x n matrix B = a^T, and
  // the row-major upper triangle of c is the column-major lower one of
  // B^T B.
  fortran("L", "T", &n, &k, &one, a, &ia, &zero, c, &ic);
}

struct FormCost {
  int64_t tile_rows = 0;
  int64_t block_layers = 0;
  double flops = 0;
  long double bytes = 0;
};

struct DimStats {
  long double l = 0, sumd = 0, sumd2 = 0, maxd = 0;
};

// Auto tile: as large as the [L, t, t] buffer's share of the budget allows,
// then evened out over the blocks that needs (no thin last tile: fewer
// centring passes and GEMMs of one efficient size), rounded up to 16 rows.
int64_t AutoTileRows(int64_t n, const DimStats& s, int64_t es, int64_t budget) {
  const long double fit =
      std::sqrt(std::max<long double>(0, budget * 0.8L) / (s.l * es));
  if (fit >= static_cast<long double>(n)) return n;
  const int64_t t = std::max<int64_t>(
      {int64_t{64}, static_cast<int64_t>(fit), std::min<int64_t>(n, 256)});
  const int64_t blocks = (n + t - 1) / t;
  const int64_t even = (n + blocks - 1) / blocks;
  return std::min(n, (even + 15) / 16 * 16);
}

// With syrk the diagonal tiles are formed and contracted over their upper
// triangle only: (N^2 + N) / 2 index pairs in all, whatever the tiling.
FormCost GramCost(int64_t n, const DimStats& s, int64_t es, int64_t budget,
                  int64_t tile_rows, bool syrk) {
  FormCost c;
  const int64_t t = std::min(
      n, tile_rows > 0 ? tile_rows : AutoTileRows(n, s, es, budget));
  c.tile_rows = t;
  const int64_t blocks = (n + t - 1) / t;
  const long double last = static_cast<long double>(n - (blocks - 1) * t);
  const long double sum_sq =
      static_cast<long double>(blocks - 1) * t * t + last * last;
  const long double nn = static_cast<long double>(n) * n;
  const long double pairs = syrk ? (nn + n) / 2 : (nn + sum_sq) / 2;
  c.flops = static_cast<double>(2 * s.sumd * pairs + 2 * s.l * s.l * pairs);
  c.bytes = s.l * t * t * es + 2.0L * t * s.maxd * es + s.l * s.maxd * (8 + es) +
            3 * s.l * s.l * 8;
  return c;
}

FormCost FeatureCost(int64_t n, const DimStats& s, int64_t es,
                     int64_t budget) {
  FormCost c;
  const long double layer = static_cast<long double>(n) * s.maxd * es;
  const long double fit = (budget - layer) / layer;
  c.block_layers = fit < 1 ? 1 : fit >= s.l ? static_cast<int64_t>(s.l)
                                            : static_cast<int64_t>(fit);
  c.flops = static_cast<double>(static_cast<long double>(n) *
                                (s.sumd * s.sumd + s.sumd2));
  c.bytes = (c.block_layers + 1) * layer +
            2.0L * c.block_layers * s.maxd * s.maxd * es +
            s.l * s.maxd * (8 + es) + 3.0L * s.l * s.l * 8;
  return c;
}

CkaPlan PlanFromStats(int64_t num_rows, const DimStats& s,
                      const CkaOptions& options) {
  CkaPlan plan;
  if (s.l < 1 || num_rows < 1) return plan;
  const bool syrk = options.diagonal_syrk && FindSyrk().ok();
  auto cost = [&](int64_t es, CkaForm* form) {
    const FormCost g = GramCost(num_rows, s, es, options.budget_bytes,
                                options.tile_rows, syrk);
    const FormCost f = FeatureCost(num_rows, s, es, options.budget_bytes);
    plan.gram_flops = g.flops;
    plan.feature_flops = f.flops;
    if (*form == CkaForm::kAuto) {
      *form = g.flops <= f.flops ? CkaForm::kGram : CkaForm::kFeature;
    }
    return *form == CkaForm::kGram ? g : f;
  };
  CkaForm form = options.form;
  FormCost c = cost(4, &form);
  CkaPrecision precision = options.precision;
  if (precision == CkaPrecision::kAuto) {
    precision = c.flops < kCkaFloat64MaxFlops ? CkaPrecision::kFloat64
                                              : CkaPrecision::kFloat32;
  }
  if (precision == CkaPrecision::kFloat64) c = cost(8, &form);
  plan.form = form;
  plan.precision = precision;
  plan.diagonal_syrk = form == CkaForm::kGram && syrk;
  plan.tile_rows = c.tile_rows;
  plan.block_layers = c.block_layers;
  plan.flops = c.flops;
  plan.working_bytes = SaturatedBytes(c.bytes);
  return plan;
}

// Rows [r0, r1) of out = x - mu on this thread (row strides out_stride
// and d).
template <typename T>
void CentreRowRange(T* out, int64_t out_stride, const T* x, const T* mu,
                    int64_t r0, int64_t r1, int64_t d) {
  for (int64_t r = r0; r < r1; ++r) {
    const T* xr = x + r * d;
    T* o = out + r * out_stride;
    for (int64_t c = 0; c < d; ++c) o[c] = xr[c] - mu[c];
  }
}

// out = x - mu (mu in float64 [d]; out in the compute dtype, any strides).
template <typename T>
void CentreRows(T* out, int64_t out_stride, const T* x, const T* mu,
                int64_t rows, int64_t d) {
  at::parallel_for(0, rows, std::max<int64_t>(1, kCentreGrainElems / d),
                   [&](int64_t r0, int64_t r1) {
    CentreRowRange(out, out_stride, x, mu, r0, r1, d);
  });
}

// Plain loops where the layouts allow, split over the intra-op threads in
// pieces of at least kCentreGrainElems (the GEMMs' OpenMP workers are still
// spinning, so the hand-off is cheap; on the idle 2-core machine it took the
// centring of 32 x 10,000 x 1,024 from 7.2 to 7.0 s, the rest being memory
// traffic). Any other layout or dtype goes through ATen.
void Centre(torch::Tensor out, const torch::Tensor& x,
            const torch::Tensor& mu_compute, const torch::Tensor& mu64) {
  const bool rows_ok = x.is_contiguous() && out.stride(1) == 1 &&
                       out.stride(0) >= out.size(1) &&
                       mu_compute.is_contiguous();
  if (rows_ok && x.scalar_type() == out.scalar_type()) {
    if (out.scalar_type() == torch::kFloat32) {
      CentreRows(out.data_ptr<float>(), out.stride(0), x.data_ptr<float>(),
                 mu_compute.data_ptr<float>(), x.size(0), x.size(1));
      return;
    }
    if (out.scalar_type() == torch::kFloat64) {
      CentreRows(out.data_ptr<double>(), out.stride(0), x.data_ptr<double>(),
                 mu_compute.data_ptr<double>(), x.size(0), x.size(1));
      return;
    }
  }
  if (x.scalar_type() == out.scalar_type()) {
    at::sub_out(out, x, mu_compute);
  } else if (x.scalar_type() == torch::kFloat64) {
    out.copy_(x - mu64);  // centre before rounding to float32
  } else {
    out.copy_(x);
    out.sub_(mu_compute);
  }
}

// G[i][j] += w * <K_i, K_j> for i <= j over the L rows of K (row stride
// `ld`, `cols` columns), float32 products summed in float32 over blocks of
// kContractCols columns, blocks summed in float64. Hand-written because this
// product is inner-product shaped (L x P times P x L with P ~ 10^6): BLAS
// GEMM packs both operands for every K block and, threaded on a busy
// machine, was measured at 0.1-1.5 GFLOP/s on it (ssyrk ~5).
constexpr int64_t kContractCols = 512;
using V4 = float __attribute__((vector_size(16)));
using V8 = float __attribute__((vector_size(32)));

// The float ContractBlock on CPUs with AVX2 and FMA (picked at run time; the
// build targets baseline x86-64): pairs 2 x 4 at a time in 8 lanes, so each
// loaded element feeds several products (the baseline loop loads two
// elements per product and was 9% of the run's CPU time on the big case).
// Lanes that fall outside the layers or below the diagonal are computed and
// dropped.
__attribute__((target("avx2,fma"))) void ContractBlockAvx2(
    const float* k, int64_t ld, int64_t num_layers, int64_t p0, int64_t n,
    double* acc) {
  const int64_t n8 = n / 8 * 8;
  for (int64_t i0 = 0; i0 < num_layers; i0 += 2) {
    const float* ki[2];
    for (int a = 0; a < 2; ++a) {
      ki[a] = k + std::min(i0 + a, num_layers - 1) * ld + p0;
    }
    for (int64_t j0 = i0; j0 < num_layers; j0 += 4) {
      const float* kj[4];
      for (int b = 0; b < 4; ++b) {
        kj[b] = k + std::min(j0 + b, num_layers - 1) * ld + p0;
      }
      V8 s00 = {}, s01 = {}, s02 = {}, s03 = {};
      V8 s10 = {}, s11 = {}, s12 = {}, s13 = {};
      for (int64_t p = 0; p < n8; p += 8) {
        V8 x0, x1, y0, y1, y2, y3;
        std::memcpy(&x0, ki[0] + p, 32);
        std::memcpy(&x1, ki[1] + p, 32);
        std::memcpy(&y0, kj[0] + p, 32);
        std::memcpy(&y1, kj[1] + p, 32);
        std::memcpy(&y2, kj[2] + p, 32);
        std::memcpy(&y3, kj[3] + p, 32);
        s00 += x0 * y0;
        s01 += x0 * y1;
        s02 += x0 * y2;
        s03 += x0 * y3;
        s10 += x1 * y0;
        s11 += x1 * y1;
        s12 += x1 * y2;
        s13 += x1 * y3;
      }
      const V8 sums[2][4] = {{s00, s01, s02, s03}, {s10, s11, s12, s13}};
      for (int a = 0; a < 2; ++a) {
        for (int b = 0; b < 4; ++b) {
          const int64_t i = i0 + a, j = j0 + b;
          if (i >= num_layers || j >= num_layers || j < i) continue;
          float tail = 0;
          for (int64_t p = n8; p < n; ++p) tail += ki[a][p] * kj[b][p];
          const V8& v = sums[a][b];
          double t = tail;
          for (int lane = 0; lane < 8; ++lane) t += v[lane];
          acc[i * num_layers + j] += t;
        }
      }
    }
  }
}

bool HaveAvx2Fma() {
  static const bool ok =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok;
}

template <typename T>
void ContractBlock(const T* k, int64_t ld, int64_t num_layers, int64_t p0,
                   int64_t n, double* acc) {
  if constexpr (std::is_same_v<T, float>) {
    if (HaveAvx2Fma()) {
      ContractBlockAvx2(k, ld, num_layers, p0, n, acc);
      return;
    }
  }
  for (int64_t i = 0; i < num_layers; ++i) {
    const T* ki = k + i * ld + p0;
    for (int64_t j = i; j < num_layers; ++j) {
      const T* kj = k + j * ld + p0;
      double s = 0;
      if constexpr (std::is_same_v<T, float>) {
        V4 a0 = {0, 0, 0, 0}, a1 = a0, a2 = a0, a3 = a0;
        int64_t p = 0;
        for (; p + 16 <= n; p += 16) {
          V4 x0, x1, x2, x3, y0, y1, y2, y3;
          std::memcpy(&x0, ki + p, 16);
          std::memcpy(&x1, ki + p + 4, 16);
          std::memcpy(&x2, ki + p + 8, 16);
          std::memcpy(&x3, ki + p + 12, 16);
          std::memcpy(&y0, kj + p, 16);
          std::memcpy(&y1, kj + p + 4, 16);
          std::memcpy(&y2, kj + p + 8, 16);
          std::memcpy(&y3, kj + p + 12, 16);
          a0 += x0 * y0;
          a1 += x1 * y1;
          a2 += x2 * y2;
          a3 += x3 * y3;
        }
        const V4 a = (a0 + a1) + (a2 + a3);
        float tail = 0;
        for (; p < n; ++p) tail += ki[p] * kj[p];
        s = static_cast<double>(a[0]) + a[1] + a[2] + a[3] + tail;
      } else {
        for (int64_t p = 0; p < n; ++p) s += ki[p] * kj[p];
      }
      acc[i * num_layers + j] += s;
    }
  }
}

// Partial sums of one parallel loop, one buffer per intra-op thread (each
// thread gets one contiguous range), added in thread order afterwards: the
// result does not depend on which thread finished first.
class PerThreadSums {
 public:
  explicit PerThreadSums(int64_t size)
      : size_(size), sums_(static_cast<size_t>(size * std::max(1, at::get_num_threads())), 0.0) {}
  double* Mine() { return sums_.data() + at::get_thread_num() * size_; }
  // g[i][j] += w * sum over threads, upper triangle of [n, n].
  void AddUpperTo(int64_t n, double w, double* g) const {
    const int64_t threads = static_cast<int64_t>(sums_.size()) / std::max<int64_t>(size_, 1);
    for (int64_t t = 0; t < threads; ++t) {
      const double* a = sums_.data() + t * size_;
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = i; j < n; ++j) g[i * n + j] += w * a[i * n + j];
      }
    }
  }

 private:
  int64_t size_;
  std::vector<double> sums_;
};

template <typename T>
void Contract(const T* k, int64_t ld, int64_t num_layers, int64_t cols,
              double w, double* g) {
  const int64_t blocks = (cols + kContractCols - 1) / kContractCols;
  PerThreadSums acc(num_layers * num_layers);
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    double* a = acc.Mine();
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t p0 = b * kContractCols;
      ContractBlock(k, ld, num_layers, p0, std::min(kContractCols, cols - p0), a);
    }
  });
  acc.AddUpperTo(num_layers, w, g);
}


// G[i][j] += <K_i, K_j> over symmetric t x t tiles (row stride t, layer
// stride ld) of which only the upper triangle is set (by syrk): twice the
// strict upper part plus the diagonal, half the work of Contract. The
// strict upper rows go through ContractBlock in pieces of at most
// kContractCols columns (the same float32 partial sums as Contract); rows r
// and t-1-r form one work unit so that the units are of equal length.
template <typename T>
void ContractUpper(const T* k, int64_t ld, int64_t num_layers, int64_t t,
                   double* g) {
  PerThreadSums acc(num_layers * num_layers);
  at::parallel_for(0, (t + 1) / 2, 1, [&](int64_t u0, int64_t u1) {
    double* a = acc.Mine();
    auto row = [&](int64_t r) {
      const int64_t end = (r + 1) * t;
      for (int64_t p = r * t + r + 1; p < end; p += kContractCols) {
        ContractBlock(k, ld, num_layers, p, std::min(kContractCols, end - p), a);
      }
    };
    for (int64_t u = u0; u < u1; ++u) {
      row(u);
      if (t - 1 - u != u) row(t - 1 - u);
    }
  });
  acc.AddUpperTo(num_layers, 2.0, g);
  // The diagonal, gathered per layer, summed in float64.
  std::vector<double> diag(static_cast<size_t>(num_layers * t));
  for (int64_t l = 0; l < num_layers; ++l) {
    for (int64_t r = 0; r < t; ++r) diag[l * t + r] = k[l * ld + r * t + r];
  }
  for (int64_t i = 0; i < num_layers; ++i) {
    for (int64_t j = i; j < num_layers; ++j) {
      double s = 0;
      for (int64_t r = 0; r < t; ++r) s += diag[i * t + r] * diag[j * t + r];
      g[i * num_layers + j] += s;
    }
  }
}

// Column means, centred sums of squares (float64) of a [rows, d] block, and
// its raw sum of squares added to *raw_sq. Plain loops on this thread: the
// pass is memory-bound, and ATen's parallel elementwise ops were measured
// ten times slower than one thread on a busy 2-core machine. The raw sum is
// kept per column so that the inner loop has no serial dependency and
// vectorises.
template <typename T>
void ChunkStats(const T* x, int64_t rows, int64_t d, double* cm, double* cm2,
                double* raw_sq) {
  std::fill(cm, cm + d, 0.0);
  std::fill(cm2, cm2 + d, 0.0);
  std::vector<double> raw(static_cast<size_t>(d), 0.0);
  double* rc = raw.data();
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * d;
    for (int64_t c = 0; c < d; ++c) cm[c] += xr[c];
  }
  for (int64_t c = 0; c < d; ++c) cm[c] /= static_cast<double>(rows);
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * d;
    for (int64_t c = 0; c < d; ++c) {
      const double v = static_cast<double>(xr[c]);
      const double e = v - cm[c];
      cm2[c] += e * e;
      rc[c] += v * v;
    }
  }
  for (int64_t c = 0; c < d; ++c) *raw_sq += rc[c];
}

double SumSquares(const torch::Tensor& m) {
  return at::sum(m.square(), torch::kFloat64).item<double>();
}

// ---- One LinearCkaMatrix call, step by step ----

// The source, its shape, the plan, the column means and the progress count.
struct CkaRun {
  CkaRun(LayerRows& s, const CkaOptions& o, const std::string& w)
      : source(s), options(o), what(w) {}
  LayerRows& source;
  const CkaOptions& options;
  const std::string& what;
  std::vector<int64_t> dims;
  int64_t n = 0;
  int64_t maxd = 0;
  CkaPlan plan;
  torch::ScalarType cdt = torch::kFloat32;  // compute dtype
  bool onednn = false;  // float32 GEMMs through oneDNN's sgemm (MmOut)
  std::vector<torch::Tensor> mu64, muc;     // column means: float64, cdt
  CkaProgress progress;
  CkaPhaseSeconds phases;

  int64_t layers() const { return static_cast<int64_t>(dims.size()); }
  torch::Tensor Empty(int64_t elems) const {
    return torch::empty({elems}, torch::TensorOptions().dtype(cdt));
  }
  void Report(double flops) {
    progress.done_flops += flops;
    ++progress.done_steps;
    if (options.progress) options.progress(progress);
  }
  // Rows [r0, r1) of layer l, centred, in the front of `buf` as [rows, d].
  torch::Tensor CentredRows(int64_t l, int64_t r0, int64_t r1,
                            const torch::Tensor& buf) {
    PhaseTimer timer(&phases.centre);
    const int64_t d = dims[l];
    torch::Tensor out = buf.narrow(0, 0, (r1 - r0) * d).view({r1 - r0, d});
    const bool read = cdt == torch::kFloat32 ? ReadCentred<float>(l, r0, r1, out)
                                             : ReadCentred<double>(l, r0, r1, out);
    if (!read) Centre(out, source.Rows(l, r0, r1), muc[l], mu64[l]);
    return out;
  }

  // Rows [r0, r1) of layer l read into out (contiguous, compute dtype T)
  // with the source's ReadRows and centred in place, in pieces of
  // kReadPieceBytes split over the intra-op threads: each piece is centred
  // while it is still in the reading core's L2, and both cores copy out of
  // the page cache (one thread alone measured 1.8 s of the 32 x 10,000 x
  // 1,024 run's 2.4 s of centring: bench/RESULTS.md, session 30). The
  // values are those of a whole-block read and Centre (x - mu per
  // element). false: the source has no such read for this block (nothing
  // to undo: the caller overwrites out).
  template <typename T>
  bool ReadCentred(int64_t l, int64_t r0, int64_t r1, torch::Tensor& out) {
    const int64_t d = dims[l], rows = r1 - r0;
    const int64_t piece = std::max<int64_t>(
        1, kReadPieceBytes / (d * static_cast<int64_t>(sizeof(T))));
    T* o = out.data_ptr<T>();
    const T* mu = muc[l].data_ptr<T>();
    // The first piece on this thread: a source without ReadRows (or not for
    // this dtype) says so before any thread starts.
    const int64_t first = std::min(rows, piece);
    torch::Tensor head = out.narrow(0, 0, first);
    if (!source.ReadRows(l, r0, r0 + first, head)) return false;
    CentreRowRange(o, d, o, mu, 0, first, d);
    std::atomic<bool> ok{true};
    at::parallel_for(first, rows, piece, [&](int64_t p0, int64_t p1) {
      for (int64_t q0 = p0; q0 < p1 && ok.load(std::memory_order_relaxed); q0 += piece) {
        const int64_t q1 = std::min(p1, q0 + piece);
        torch::Tensor part = out.narrow(0, q0, q1 - q0);
        if (!source.ReadRows(l, r0 + q0, r0 + q1, part)) {
          ok.store(false, std::memory_order_relaxed);
          return;
        }
        CentreRowRange(o, d, o, mu, q0, q1, d);
      }
    });
    return ok.load();
  }
};

absl::Status ReadShape(CkaRun& run) {
  const int64_t num_layers = run.source.num_layers();
  run.n = run.source.num_rows();
  if (num_layers < 1) {
    return absl::InvalidArgumentError(absl::StrCat(run.what, ": no layers"));
  }
  if (run.n < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(run.what, ": need N >= 2 sequences, got ", run.n));
  }
  run.dims.resize(static_cast<size_t>(num_layers));
  for (int64_t l = 0; l < num_layers; ++l) {
    run.dims[l] = run.source.dim(l);
    if (run.dims[l] < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(run.what, ": layer ", l + 1, " has no features"));
    }
    run.maxd = std::max(run.maxd, run.dims[l]);
  }
  return absl::OkStatus();
}

// ChunkStats of a [rows, d] block in its own float dtype (float64 for any
// other).
void BlockStats(torch::Tensor x, double* cm, double* cm2, double* raw_sq) {
  if (x.scalar_type() != torch::kFloat32 &&
      x.scalar_type() != torch::kFloat64) {
    x = x.to(torch::kFloat64);
  }
  x = x.contiguous();
  if (x.scalar_type() == torch::kFloat32) {
    ChunkStats(x.data_ptr<float>(), x.size(0), x.size(1), cm, cm2, raw_sq);
  } else {
    ChunkStats(x.data_ptr<double>(), x.size(0), x.size(1), cm, cm2, raw_sq);
  }
}

// Pass 1 for layer l: column means and the variance check, float64, merged
// per block (Chan et al.) so that a large mean does not cancel the variance.
absl::Status LayerMean(CkaRun& run, int64_t l) {
  const int64_t d = run.dims[l];
  const int64_t chunk = std::max<int64_t>(1, kStatsChunkElems / d);
  std::vector<double> mean(d, 0.0), m2(d, 0.0), cm(d), cm2(d);
  double raw_sq = 0;
  int64_t count = 0;
  // Blocks are read into `buf` where the source can (ReadRows), else viewed.
  torch::Tensor buf = torch::empty(
      {std::min(chunk, run.n) * d},
      torch::TensorOptions().dtype(run.source.Rows(l, 0, 1).scalar_type()));
  run.source.Release();
  for (int64_t r0 = 0; r0 < run.n; r0 += chunk) {
    const int64_t nb = std::min(run.n, r0 + chunk) - r0;
    torch::Tensor block = buf.narrow(0, 0, nb * d).view({nb, d});
    if (!run.source.ReadRows(l, r0, r0 + nb, block)) {
      block = run.source.Rows(l, r0, r0 + nb);
    }
    BlockStats(block, cm.data(), cm2.data(), &raw_sq);
    run.source.Release();
    const double total = static_cast<double>(count + nb);
    const double wn = static_cast<double>(nb) / total;
    const double wc = static_cast<double>(count) * nb / total;
    for (int64_t c = 0; c < d; ++c) {
      const double delta = cm[c] - mean[c];
      mean[c] += delta * wn;
      m2[c] += cm2[c] + delta * delta * wc;
    }
    count += nb;
  }
  double m2_sum = 0;
  for (double v : m2) m2_sum += v;
  const double raw = std::sqrt(raw_sq);
  const double cen = std::sqrt(m2_sum);
  if (!std::isfinite(raw) || !std::isfinite(cen)) {
    return absl::InvalidArgumentError(
        absl::StrCat(run.what, ": layer ", l + 1, ": non-finite values"));
  }
  // Centring a constant column leaves rounding residue ~1e-17 relative.
  if (cen <= 1e-12 * raw || cen == 0.0) {
    return absl::InvalidArgumentError(absl::StrCat(
        run.what, ": layer ", l + 1, ": zero variance after centring columns"));
  }
  run.mu64[l] = torch::from_blob(mean.data(), {d},
                                 torch::TensorOptions().dtype(torch::kFloat64))
                    .clone();
  run.muc[l] = run.mu64[l].to(run.cdt);
  return absl::OkStatus();
}

// How a 2-D operand reads as a row-major BLAS matrix: 'N' with row stride
// ld, or 'T' (a transposed view of one) with ld its column stride. false
// for any other layout.
bool BlasLayout(const torch::Tensor& x, char* trans, int64_t* ld) {
  if (x.stride(1) == 1 && (x.stride(0) >= x.size(1) || x.size(0) == 1)) {
    *trans = 'N';
    *ld = std::max(x.stride(0), x.size(1));
    return true;
  }
  if (x.stride(0) == 1 && (x.stride(1) >= x.size(0) || x.size(1) == 1)) {
    *trans = 'T';
    *ld = std::max(x.stride(1), x.size(0));
    return true;
  }
  return false;
}

// c = a b for the GEMMs of both forms. float32 goes through oneDNN's sgemm
// where the trainer's dense layers use it (cpu_gemm::Enabled(): built with
// oneDNN, DEPTHBENCH_CPU_GEMM not "blas"; CkaOptions::onednn_gemm): on the
// Zen 5 it ran the dense layers' GEMMs 2.0-2.5x faster than OpenBLAS
// (bench/RESULTS.md, session 22); on a Zen 3 (AVX2) these tiles ran level
// with it (session 30).
// Everything else, and layouts sgemm cannot take, go to at::mm_out (the
// system BLAS).
void MmOut(const CkaRun& run, torch::Tensor& c, const torch::Tensor& a,
           const torch::Tensor& b) {
  char ta = 'N', tb = 'N';
  int64_t lda = 0, ldb = 0;
  if (run.onednn && c.scalar_type() == torch::kFloat32 &&
      a.scalar_type() == torch::kFloat32 && b.scalar_type() == torch::kFloat32 &&
      c.is_contiguous() && a.numel() > 0 && b.numel() > 0 && BlasLayout(a, &ta, &lda) &&
      BlasLayout(b, &tb, &ldb)) {
    cpu_gemm::Sgemm(ta, tb, a.size(0), b.size(1), a.size(1), 1.0f, a.data_ptr<float>(), lda,
                    b.data_ptr<float>(), ldb, 0.0f, c.data_ptr<float>(), c.size(1));
    return;
  }
  at::mm_out(c, a, b);
}

// The gram form's buffers: [L, t*t] Gram tiles, two centred row blocks.
struct GramBuffers {
  torch::Tensor k, a, b;
};

// Every layer's Gram tile K_l = X_l[a] X_l[b]^T for the row blocks
// [ra0, ra1) x [rb0, rb1) into buf.k; a diagonal tile (ra0 == rb0) by syrk,
// upper triangle only, when the plan says so.
void GramTiles(CkaRun& run, GramBuffers& buf, int64_t ra0, int64_t ra1,
               int64_t rb0, int64_t rb1) {
  const int64_t ta = ra1 - ra0, tb = rb1 - rb0, num_layers = run.layers();
  const bool diag = ra0 == rb0;
  const bool syrk = diag && run.plan.diagonal_syrk;
  const double elems = syrk ? ta * (ta + 1) / 2.0 : static_cast<double>(ta) * tb;
  for (int64_t l = 0; l < num_layers; ++l) {
    const int64_t d = run.dims[l];
    torch::Tensor ca = run.CentredRows(l, ra0, ra1, buf.a);
    torch::Tensor cb = diag ? ca : run.CentredRows(l, rb0, rb1, buf.b);
    run.source.Release();
    torch::Tensor k = buf.k.select(0, l).narrow(0, 0, ta * tb).view({ta, tb});
    PhaseTimer timer(&run.phases.gemm);
    if (!syrk) {
      MmOut(run, k, ca, cb.t());
    } else if (run.cdt == torch::kFloat32) {
      SyrkUpper(FindSyrk(), ca.data_ptr<float>(), ta, d, d, k.data_ptr<float>());
    } else {
      SyrkUpper(FindSyrk(), ca.data_ptr<double>(), ta, d, d,
                k.data_ptr<double>());
    }
    run.Report(2.0 * elems * d +
               (l + 1 == num_layers ? 2.0 * num_layers * num_layers * elems : 0.0));
  }
}

// gu (upper triangle of G) += the contraction of the tiles in buf.k.
void ContractTiles(CkaRun& run, const GramBuffers& buf, int64_t ta,
                   int64_t tb, bool diag, std::vector<double>& gu) {
  PhaseTimer timer(&run.phases.contract);
  const int64_t ld = buf.k.size(1), num_layers = run.layers();
  const bool upper = diag && run.plan.diagonal_syrk;
  auto go = [&](const auto* k) {
    if (upper) {
      ContractUpper(k, ld, num_layers, ta, gu.data());
    } else {
      Contract(k, ld, num_layers, ta * tb, diag ? 1.0 : 2.0, gu.data());
    }
  };
  if (run.cdt == torch::kFloat32) {
    go(buf.k.data_ptr<float>());
  } else {
    go(buf.k.data_ptr<double>());
  }
}

// The gram form over the upper triangle of t x t tiles; returns the upper
// triangle of G (row-major L x L).
std::vector<double> GramForm(CkaRun& run) {
  const int64_t t = run.plan.tile_rows, n = run.n, num_layers = run.layers();
  const int64_t blocks = (n + t - 1) / t;
  run.progress.total_steps = blocks * (blocks + 1) / 2 * num_layers;
  GramBuffers buf{torch::empty({num_layers, t * t},
                               torch::TensorOptions().dtype(run.cdt)),
                  run.Empty(t * run.maxd), run.Empty(t * run.maxd)};
  std::vector<double> gu(static_cast<size_t>(num_layers * num_layers), 0.0);
  for (int64_t a = 0; a < blocks; ++a) {
    const int64_t ra0 = a * t, ra1 = std::min(n, ra0 + t);
    for (int64_t b = a; b < blocks; ++b) {
      const int64_t rb0 = b * t, rb1 = std::min(n, rb0 + t);
      GramTiles(run, buf, ra0, ra1, rb0, rb1);
      ContractTiles(run, buf, ra1 - ra0, rb1 - rb0, a == b, gu);
    }
  }
  return gu;
}

// Centred layer l into the columns of dst [n, *], a stats chunk at a time.
void LoadCentred(CkaRun& run, torch::Tensor dst, int64_t l) {
  PhaseTimer timer(&run.phases.centre);
  const int64_t chunk_rows = std::max<int64_t>(1, kStatsChunkElems / run.maxd);
  for (int64_t r0 = 0; r0 < run.n; r0 += chunk_rows) {
    const int64_t r1 = std::min(run.n, r0 + chunk_rows);
    Centre(dst.narrow(0, r0, r1 - r0), run.source.Rows(l, r0, r1), run.muc[l],
           run.mu64[l]);
    run.source.Release();
  }
}

// Layers [p0, p1) held centred side by side in pbuf: their pairs, then each
// later layer j (centred into jbuf) against the whole block in one GEMM.
void FeatureBlock(CkaRun& run, int64_t p0, int64_t p1, torch::Tensor pbuf,
                  torch::Tensor jbuf, std::vector<double>& gu) {
  const int64_t num_layers = run.layers(), n = run.n;
  const auto& dims = run.dims;
  std::vector<int64_t> off(static_cast<size_t>(p1 - p0 + 1), 0);
  for (int64_t l = p0; l < p1; ++l) off[l - p0 + 1] = off[l - p0] + dims[l];
  torch::Tensor xp = pbuf.narrow(0, 0, n * off.back()).view({n, off.back()});
  auto x = [&](int64_t l) { return xp.narrow(1, off[l - p0], dims[l]); };
  for (int64_t l = p0; l < p1; ++l) LoadCentred(run, x(l), l);
  for (int64_t i = p0; i < p1; ++i) {
    for (int64_t j = i; j < p1; ++j) {
      torch::Tensor m = torch::empty({dims[i], dims[j]}, xp.options());
      {
        PhaseTimer timer(&run.phases.gemm);
        MmOut(run, m, x(i).t(), x(j));
      }
      PhaseTimer timer(&run.phases.contract);
      gu[i * num_layers + j] = SumSquares(m);
      run.Report(2.0 * n * dims[i] * dims[j]);
    }
  }
  for (int64_t j = p1; j < num_layers; ++j) {
    torch::Tensor xj = jbuf.narrow(0, 0, n * dims[j]).view({n, dims[j]});
    LoadCentred(run, xj, j);
    torch::Tensor m = torch::empty({off.back(), dims[j]}, xp.options());  // [width, d_j]
    {
      PhaseTimer timer(&run.phases.gemm);
      MmOut(run, m, xp.t(), xj);
    }
    PhaseTimer timer(&run.phases.contract);
    for (int64_t i = p0; i < p1; ++i) {
      gu[i * num_layers + j] = SumSquares(m.narrow(0, off[i - p0], dims[i]));
      run.Report(2.0 * n * dims[i] * dims[j]);
    }
  }
}

// The feature form over blocks of plan.block_layers layers; returns the
// upper triangle of G.
std::vector<double> FeatureForm(CkaRun& run) {
  const int64_t num_layers = run.layers(), bl = run.plan.block_layers;
  run.progress.total_steps = num_layers * (num_layers + 1) / 2;
  int64_t max_block = 0;
  for (int64_t p0 = 0; p0 < num_layers; p0 += bl) {
    int64_t s = 0;
    for (int64_t l = p0; l < std::min(num_layers, p0 + bl); ++l) {
      s += run.dims[l];
    }
    max_block = std::max(max_block, s);
  }
  torch::Tensor pbuf = run.Empty(run.n * max_block);
  torch::Tensor jbuf = run.Empty(run.n * run.maxd);
  std::vector<double> gu(static_cast<size_t>(num_layers * num_layers), 0.0);
  for (int64_t p0 = 0; p0 < num_layers; p0 += bl) {
    FeatureBlock(run, p0, std::min(num_layers, p0 + bl), pbuf, jbuf, gu);
  }
  return gu;
}

// HSIC and CKA matrices from the upper triangle of G.
void FillResult(const std::vector<double>& gu, int64_t num_layers,
                CkaResult* result) {
  auto g = [&](int64_t i, int64_t j) {
    return i <= j ? gu[i * num_layers + j] : gu[j * num_layers + i];
  };
  result->hsic.assign(num_layers, std::vector<double>(num_layers, 0.0));
  result->cka.assign(num_layers, std::vector<double>(num_layers, 0.0));
  for (int64_t i = 0; i < num_layers; ++i) {
    for (int64_t j = 0; j < num_layers; ++j) {
      result->hsic[i][j] = g(i, j);
      result->cka[i][j] = i == j ? 1.0 : g(i, j) / std::sqrt(g(i, i) * g(j, j));
    }
  }
}

// The library of the run's GEMMs, as CkaResult::gemm says it.
std::string GemmPath(const CkaRun& run) {
  if (run.onednn) return "oneDNN sgemm";
  if (run.cdt == torch::kFloat32 && run.options.onednn_gemm) {
    return "at::mm (" + cpu_gemm::Description() + ")";
  }
  return "at::mm";
}

std::string DiagonalTilesPath(const CkaRun& run) {
  if (run.plan.form != CkaForm::kGram) return "";
  if (run.plan.diagonal_syrk) return "syrk: " + FindSyrk().description;
  return "gemm: " + GemmPath(run) +
         (run.options.diagonal_syrk ? " (no ?syrk in the process)" : " (syrk turned off)");
}

}  // namespace

std::string CkaSyrkSource() { return FindSyrk().description; }

absl::StatusOr<CkaResult> LinearCkaMatrix(LayerRows& source,
                                          const CkaOptions& options,
                                          const std::string& what) {
  try {
    torch::NoGradGuard no_grad;
    const Clock::time_point start = Clock::now();
    CkaRun run(source, options, what);
    RETURN_IF_ERROR(ReadShape(run));
    CkaResult result;
    result.plan = run.plan = PlanCka(run.n, run.dims, options);
    run.cdt = run.plan.precision == CkaPrecision::kFloat64 ? torch::kFloat64
                                                           : torch::kFloat32;
    run.onednn = run.cdt == torch::kFloat32 && options.onednn_gemm && cpu_gemm::Enabled();
    result.gemm = GemmPath(run);
    result.diagonal_tiles = DiagonalTilesPath(run);
    run.mu64.resize(run.dims.size());
    run.muc.resize(run.dims.size());
    {
      PhaseTimer timer(&run.phases.means);
      for (int64_t l = 0; l < run.layers(); ++l) {
        RETURN_IF_ERROR(LayerMean(run, l));
      }
    }
    run.progress.total_flops = run.plan.flops;
    const std::vector<double> gu =
        run.plan.form == CkaForm::kGram ? GramForm(run) : FeatureForm(run);
    FillResult(gu, run.layers(), &result);
    result.seconds =
        std::chrono::duration<double>(Clock::now() - start).count();
    result.phases = run.phases;
    return result;
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat(what, ": LibTorch error: ", e.what_without_backtrace()));
  }
}

const char* CkaPrecisionName(CkaPrecision p) {
  switch (p) {
    case CkaPrecision::kFloat32:
      return "fp32";
    case CkaPrecision::kFloat64:
      return "fp64";
    default:
      return "auto";
  }
}

const char* CkaFormName(CkaForm f) {
  switch (f) {
    case CkaForm::kGram:
      return "gram";
    case CkaForm::kFeature:
      return "feature";
    default:
      return "auto";
  }
}

CkaPlan PlanCka(int64_t num_rows, const std::vector<int64_t>& dims,
                const CkaOptions& options) {
  DimStats s;
  s.l = static_cast<long double>(dims.size());
  for (int64_t d : dims) {
    s.sumd += d;
    s.sumd2 += static_cast<long double>(d) * d;
    s.maxd = std::max<long double>(s.maxd, d);
  }
  return PlanFromStats(num_rows, s, options);
}

CkaPlan PlanCkaUniform(int64_t num_layers, int64_t num_rows, int64_t dim,
                       const CkaOptions& options) {
  DimStats s;
  s.l = static_cast<long double>(num_layers);
  s.sumd = s.l * dim;
  s.sumd2 = s.l * dim * static_cast<long double>(dim);
  s.maxd = static_cast<long double>(dim);
  return PlanFromStats(num_rows, s, options);
}



absl::StatusOr<CkaPrecision> ParseCkaPrecision(const std::string& name,
                                               const std::string& flag) {
  if (name == "auto") return CkaPrecision::kAuto;
  if (name == "fp32") return CkaPrecision::kFloat32;
  if (name == "fp64") return CkaPrecision::kFloat64;
  return absl::InvalidArgumentError(absl::StrCat(
      flag, ": unknown precision \"", name, "\" (auto, fp32 or fp64)"));
}

absl::StatusOr<CkaForm> ParseCkaForm(const std::string& name,
                                     const std::string& flag) {
  if (name == "auto") return CkaForm::kAuto;
  if (name == "gram") return CkaForm::kGram;
  if (name == "feature") return CkaForm::kFeature;
  return absl::InvalidArgumentError(absl::StrCat(
      flag, ": unknown form \"", name, "\" (auto, gram or feature)"));
}

int SetKernelThreads(int n) {
  if (n <= 0) n = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  at::set_num_threads(n);
  return at::get_num_threads();
}

SgemmPeak MeasureSgemmPeak() {
  torch::NoGradGuard no_grad;
  constexpr int64_t kN = 2048;
  torch::Tensor a = torch::randn({kN, kN});
  torch::Tensor b = torch::randn({kN, kN});
  torch::Tensor c = torch::empty({kN, kN});
  auto best_of = [&](const std::function<void()>& mm) {
    mm();  // warm-up (thread pool, packing buffers)
    double best = std::numeric_limits<double>::infinity();
    for (int rep = 0; rep < 3; ++rep) {
      const Clock::time_point t0 = Clock::now();
      mm();
      best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
    }
    return 2.0 * kN * kN * kN / best / 1e9;
  };
  SgemmPeak peak{best_of([&] { at::mm_out(c, a, b); }), "at::mm"};
  if (cpu_gemm::Enabled()) {
    const double dnnl = best_of([&] {
      cpu_gemm::Sgemm('N', 'N', kN, kN, kN, 1.0f, a.data_ptr<float>(), kN, b.data_ptr<float>(),
                      kN, 0.0f, c.data_ptr<float>(), kN);
    });
    if (dnnl > peak.gflops) peak = {dnnl, "oneDNN sgemm"};
  }
  return peak;
}

int64_t PeakRssBytes() {
  struct rusage ru {};
  if (getrusage(RUSAGE_SELF, &ru) != 0) return -1;
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;  // Linux: kilobytes
}

}  // namespace diagnostics
}  // namespace depthbench
