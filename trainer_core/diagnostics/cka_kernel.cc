#include "trainer_core/diagnostics/cka_kernel.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <mutex>
#include <type_traits>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace depthbench {
namespace diagnostics {
namespace {

using Clock = std::chrono::steady_clock;

// Elements per block of the mean / variance pass.
constexpr int64_t kStatsChunkElems = int64_t{1} << 19;

int64_t SaturatedBytes(long double bytes) {
  constexpr auto kMax = std::numeric_limits<int64_t>::max();
  return bytes >= static_cast<long double>(kMax) ? kMax
                                                 : static_cast<int64_t>(bytes);
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

FormCost GramCost(int64_t n, const DimStats& s, int64_t es, int64_t budget,
                  int64_t tile_rows) {
  FormCost c;
  int64_t t = tile_rows;
  if (t <= 0) {
    const long double fit =
        std::sqrt(std::max<long double>(0, budget * 0.8L) / (s.l * es));
    t = fit >= static_cast<long double>(n) ? n : static_cast<int64_t>(fit);
    t = std::max<int64_t>(t, std::min<int64_t>(n, 256));
    if (t < n) t = std::max<int64_t>(64, t / 64 * 64);
  }
  t = std::min(t, n);
  c.tile_rows = t;
  const int64_t blocks = (n + t - 1) / t;
  const long double last = static_cast<long double>(n - (blocks - 1) * t);
  const long double sum_sq =
      static_cast<long double>(blocks - 1) * t * t + last * last;
  const long double pairs = (static_cast<long double>(n) * n + sum_sq) / 2;
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
  auto cost = [&](int64_t es, CkaForm* form) {
    const FormCost g =
        GramCost(num_rows, s, es, options.budget_bytes, options.tile_rows);
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
  plan.tile_rows = c.tile_rows;
  plan.block_layers = c.block_layers;
  plan.flops = c.flops;
  plan.working_bytes = SaturatedBytes(c.bytes);
  return plan;
}

// out = x - mu (mu in float64 [d]; out in the compute dtype, any strides).
template <typename T>
void CentreRows(T* out, int64_t out_stride, const T* x, const T* mu,
                int64_t rows, int64_t d) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * d;
    T* o = out + r * out_stride;
    for (int64_t c = 0; c < d; ++c) o[c] = xr[c] - mu[c];
  }
}

// Plain loops on this thread where the layouts allow: centring is memory
// bound and short, and an intra-op parallel region per block costs more in
// thread hand-offs than it saves on a busy 2-core machine (measured: the
// GEMMs' OpenMP workers spin between regions).
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

template <typename T>
void ContractBlock(const T* k, int64_t ld, int64_t num_layers, int64_t p0,
                   int64_t n, double* acc) {
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

template <typename T>
void Contract(const T* k, int64_t ld, int64_t num_layers, int64_t cols,
              double w, double* g) {
  const int64_t blocks = (cols + kContractCols - 1) / kContractCols;
  std::mutex mu;
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    std::vector<double> acc(static_cast<size_t>(num_layers * num_layers), 0.0);
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t p0 = b * kContractCols;
      ContractBlock(k, ld, num_layers, p0, std::min(kContractCols, cols - p0),
                    acc.data());
    }
    std::lock_guard<std::mutex> lock(mu);
    for (int64_t i = 0; i < num_layers; ++i) {
      for (int64_t j = i; j < num_layers; ++j) {
        g[i * num_layers + j] += w * acc[i * num_layers + j];
      }
    }
  });
}

// Column means, centred sums of squares (float64) of a [rows, d] block, and
// its raw sum of squares added to *raw_sq. Plain loops on this thread: the
// pass is memory-bound, and ATen's parallel elementwise ops were measured
// ten times slower than one thread on a busy 2-core machine.
template <typename T>
void ChunkStats(const T* x, int64_t rows, int64_t d, double* cm, double* cm2,
                double* raw_sq) {
  std::fill(cm, cm + d, 0.0);
  std::fill(cm2, cm2 + d, 0.0);
  double raw = 0;
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
      raw += v * v;
    }
  }
  *raw_sq += raw;
}

double SumSquares(const torch::Tensor& m) {
  return at::sum(m.square(), torch::kFloat64).item<double>();
}

}  // namespace

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

absl::StatusOr<CkaResult> LinearCkaMatrix(LayerRows& source,
                                          const CkaOptions& options,
                                          const std::string& what) {
  try {
    torch::NoGradGuard no_grad;
    const Clock::time_point start = Clock::now();
    const int64_t num_layers = source.num_layers();
    const int64_t n = source.num_rows();
    if (num_layers < 1) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": no layers"));
    }
    if (n < 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": need N >= 2 sequences, got ", n));
    }
    std::vector<int64_t> dims(static_cast<size_t>(num_layers));
    int64_t maxd = 0;
    for (int64_t l = 0; l < num_layers; ++l) {
      dims[l] = source.dim(l);
      if (dims[l] < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": layer ", l + 1, " has no features"));
      }
      maxd = std::max(maxd, dims[l]);
    }
    CkaResult result;
    result.plan = PlanCka(n, dims, options);
    const CkaPlan& plan = result.plan;
    const auto cdt = plan.precision == CkaPrecision::kFloat64
                         ? torch::kFloat64
                         : torch::kFloat32;
    const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
    const auto fc = torch::TensorOptions().dtype(cdt);

    // Pass 1: column means and the variance check, float64, merged per block
    // (Chan et al.) so that a large mean does not cancel the variance.
    std::vector<torch::Tensor> mu64(num_layers), muc(num_layers);
    for (int64_t l = 0; l < num_layers; ++l) {
      const int64_t d = dims[l];
      const int64_t chunk = std::max<int64_t>(1, kStatsChunkElems / d);
      std::vector<double> mean(d, 0.0), m2(d, 0.0), cm(d), cm2(d);
      double raw_sq = 0;
      int64_t count = 0;
      for (int64_t r0 = 0; r0 < n; r0 += chunk) {
        const int64_t r1 = std::min(n, r0 + chunk);
        const int64_t nb = r1 - r0;
        torch::Tensor x = source.Rows(l, r0, r1);
        if (x.scalar_type() != torch::kFloat32 &&
            x.scalar_type() != torch::kFloat64) {
          x = x.to(torch::kFloat64);
        }
        x = x.contiguous();
        if (x.scalar_type() == torch::kFloat32) {
          ChunkStats(x.data_ptr<float>(), nb, d, cm.data(), cm2.data(),
                     &raw_sq);
        } else {
          ChunkStats(x.data_ptr<double>(), nb, d, cm.data(), cm2.data(),
                     &raw_sq);
        }
        source.Release();
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
            absl::StrCat(what, ": layer ", l + 1, ": non-finite values"));
      }
      // Centring a constant column leaves rounding residue ~1e-17 relative.
      if (cen <= 1e-12 * raw || cen == 0.0) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": layer ", l + 1, ": zero variance after centring columns"));
      }
      mu64[l] = torch::from_blob(mean.data(), {d}, f64).clone();
      muc[l] = mu64[l].to(cdt);
    }

    torch::Tensor g = torch::zeros({num_layers, num_layers}, f64);
    CkaProgress progress;
    progress.total_flops = plan.flops;
    auto report = [&](double flops) {
      progress.done_flops += flops;
      ++progress.done_steps;
      if (options.progress) options.progress(progress);
    };

    if (plan.form == CkaForm::kGram) {
      const int64_t t = plan.tile_rows;
      const int64_t blocks = (n + t - 1) / t;
      progress.total_steps = blocks * (blocks + 1) / 2 * num_layers;
      torch::Tensor kbuf = torch::empty({num_layers, t * t}, fc);
      // Upper triangle of G, row-major L x L.
      std::vector<double> gu(static_cast<size_t>(num_layers * num_layers), 0.0);
      torch::Tensor abuf = torch::empty({t * maxd}, fc);
      torch::Tensor bbuf = torch::empty({t * maxd}, fc);
      for (int64_t a = 0; a < blocks; ++a) {
        const int64_t ra0 = a * t, ra1 = std::min(n, ra0 + t);
        const int64_t ta = ra1 - ra0;
        for (int64_t b = a; b < blocks; ++b) {
          const int64_t rb0 = b * t, rb1 = std::min(n, rb0 + t);
          const int64_t tb = rb1 - rb0;
          for (int64_t l = 0; l < num_layers; ++l) {
            const int64_t d = dims[l];
            torch::Tensor ca = abuf.narrow(0, 0, ta * d).view({ta, d});
            Centre(ca, source.Rows(l, ra0, ra1), muc[l], mu64[l]);
            torch::Tensor cb = ca;
            if (b != a) {
              cb = bbuf.narrow(0, 0, tb * d).view({tb, d});
              Centre(cb, source.Rows(l, rb0, rb1), muc[l], mu64[l]);
            }
            source.Release();
            torch::Tensor k =
                kbuf.select(0, l).narrow(0, 0, ta * tb).view({ta, tb});
            at::mm_out(k, ca, cb.t());
            report(2.0 * ta * tb * d + (l + 1 == num_layers
                                            ? 2.0 * num_layers * num_layers *
                                                  ta * tb
                                            : 0.0));
          }
          const double w = a == b ? 1.0 : 2.0;
          if (cdt == torch::kFloat32) {
            Contract(kbuf.data_ptr<float>(), t * t, num_layers, ta * tb, w,
                     gu.data());
          } else {
            Contract(kbuf.data_ptr<double>(), t * t, num_layers, ta * tb, w,
                     gu.data());
          }
        }
      }
      for (int64_t i = 0; i < num_layers; ++i) {
        for (int64_t j = i; j < num_layers; ++j) {
          g[i][j] = gu[i * num_layers + j];
          g[j][i] = gu[i * num_layers + j];
        }
      }
    } else {
      const int64_t bl = plan.block_layers;
      progress.total_steps = num_layers * (num_layers + 1) / 2;
      int64_t max_block = 0;
      for (int64_t p0 = 0; p0 < num_layers; p0 += bl) {
        int64_t s = 0;
        for (int64_t l = p0; l < std::min(num_layers, p0 + bl); ++l) {
          s += dims[l];
        }
        max_block = std::max(max_block, s);
      }
      torch::Tensor pbuf = torch::empty({n * max_block}, fc);
      torch::Tensor jbuf = torch::empty({n * maxd}, fc);
      const int64_t chunk_rows = std::max<int64_t>(1, kStatsChunkElems / maxd);
      // Centred layer l into the columns of `dst` [n, *].
      auto load = [&](torch::Tensor dst, int64_t l) {
        for (int64_t r0 = 0; r0 < n; r0 += chunk_rows) {
          const int64_t r1 = std::min(n, r0 + chunk_rows);
          Centre(dst.narrow(0, r0, r1 - r0), source.Rows(l, r0, r1), muc[l],
                 mu64[l]);
          source.Release();
        }
      };
      for (int64_t p0 = 0; p0 < num_layers; p0 += bl) {
        const int64_t p1 = std::min(num_layers, p0 + bl);
        std::vector<int64_t> off(static_cast<size_t>(p1 - p0 + 1), 0);
        for (int64_t l = p0; l < p1; ++l) {
          off[l - p0 + 1] = off[l - p0] + dims[l];
        }
        const int64_t width = off.back();
        torch::Tensor xp = pbuf.narrow(0, 0, n * width).view({n, width});
        for (int64_t l = p0; l < p1; ++l) {
          load(xp.narrow(1, off[l - p0], dims[l]), l);
        }
        for (int64_t i = p0; i < p1; ++i) {
          torch::Tensor xi = xp.narrow(1, off[i - p0], dims[i]);
          for (int64_t j = i; j < p1; ++j) {
            torch::Tensor xj = xp.narrow(1, off[j - p0], dims[j]);
            const double v = SumSquares(at::mm(xi.t(), xj));
            g[i][j] = v;
            g[j][i] = v;
            report(2.0 * n * dims[i] * dims[j]);
          }
        }
        for (int64_t j = p1; j < num_layers; ++j) {
          torch::Tensor xj = jbuf.narrow(0, 0, n * dims[j]).view({n, dims[j]});
          load(xj, j);
          torch::Tensor m = at::mm(xp.t(), xj);  // [width, d_j]
          for (int64_t i = p0; i < p1; ++i) {
            const double v = SumSquares(m.narrow(0, off[i - p0], dims[i]));
            g[i][j] = v;
            g[j][i] = v;
            report(2.0 * n * dims[i] * dims[j]);
          }
        }
      }
    }

    auto ga = g.accessor<double, 2>();
    result.hsic.assign(num_layers, std::vector<double>(num_layers, 0.0));
    result.cka.assign(num_layers, std::vector<double>(num_layers, 0.0));
    for (int64_t i = 0; i < num_layers; ++i) {
      for (int64_t j = 0; j < num_layers; ++j) {
        result.hsic[i][j] = ga[i][j];
        result.cka[i][j] =
            i == j ? 1.0 : ga[i][j] / std::sqrt(ga[i][i] * ga[j][j]);
      }
    }
    result.seconds =
        std::chrono::duration<double>(Clock::now() - start).count();
    return result;
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat(what, ": LibTorch error: ", e.what_without_backtrace()));
  }
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

double MeasureSgemmPeakGflops() {
  torch::NoGradGuard no_grad;
  constexpr int64_t kN = 2048;
  torch::Tensor a = torch::randn({kN, kN});
  torch::Tensor b = torch::randn({kN, kN});
  torch::Tensor c = torch::empty({kN, kN});
  at::mm_out(c, a, b);  // warm-up (thread pool, packing buffers)
  double best = std::numeric_limits<double>::infinity();
  for (int rep = 0; rep < 3; ++rep) {
    const Clock::time_point t0 = Clock::now();
    at::mm_out(c, a, b);
    best = std::min(best,
                    std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return 2.0 * kN * kN * kN / best / 1e9;
}

int64_t PeakRssBytes() {
  struct rusage ru {};
  if (getrusage(RUSAGE_SELF, &ru) != 0) return -1;
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;  // Linux: kilobytes
}

}  // namespace diagnostics
}  // namespace depthbench
