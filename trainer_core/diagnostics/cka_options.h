// Options, plan and measurements of the linear-CKA kernel (cka_kernel.h),
// without LibTorch, for torch-free headers such as deff_npy.h.
// Thread safety: pure functions; MeasureSgemmPeakGflops uses the LibTorch
// intra-op pool.
#ifndef DEPTHBENCH_TRAINER_CORE_DIAGNOSTICS_CKA_OPTIONS_H_
#define DEPTHBENCH_TRAINER_CORE_DIAGNOSTICS_CKA_OPTIONS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace depthbench {
namespace diagnostics {

enum class CkaPrecision { kAuto, kFloat32, kFloat64 };
enum class CkaForm { kAuto, kGram, kFeature };
const char* CkaPrecisionName(CkaPrecision p);  // "auto", "fp32", "fp64"
const char* CkaFormName(CkaForm f);            // "auto", "gram", "feature"

// Below this many FLOPs kAuto computes in float64 (a fraction of a second).
inline constexpr double kCkaFloat64MaxFlops = 1e10;
// Default budget for the kernel's buffers (not counting the source).
inline constexpr int64_t kCkaDefaultBudgetBytes = int64_t{192} << 20;

struct CkaProgress {
  double done_flops = 0;
  double total_flops = 0;
  int64_t done_steps = 0;  // GEMM steps: tiles x layers, or layer pairs
  int64_t total_steps = 0;
};

struct CkaOptions {
  CkaPrecision precision = CkaPrecision::kAuto;
  CkaForm form = CkaForm::kAuto;
  int64_t budget_bytes = kCkaDefaultBudgetBytes;
  int64_t tile_rows = 0;  // gram form; 0 = from the budget
  // Gram form: the diagonal tiles X_a X_a^T through the BLAS's syrk (half
  // their FLOPs) when the process has one; false = full GEMM there.
  bool diagonal_syrk = true;
  // float32 GEMMs through oneDNN's sgemm where the build and environment
  // use it for the dense layers (cpu_gemm::Enabled()); false = at::mm.
  bool onednn_gemm = true;
  // Called after each step from the calling thread (may be empty).
  std::function<void(const CkaProgress&)> progress;
};

// What a run will do for a shape: resolved form and precision, sizes, FLOPs
// and the bytes of its buffers.
struct CkaPlan {
  CkaForm form = CkaForm::kGram;
  CkaPrecision precision = CkaPrecision::kFloat64;
  int64_t tile_rows = 0;     // gram
  int64_t block_layers = 0;  // feature
  bool diagonal_syrk = false;  // gram: diagonal tiles by cblas_?syrk
  double flops = 0;          // multiply-add = 2 FLOPs
  double gram_flops = 0;
  double feature_flops = 0;
  int64_t working_bytes = 0;  // saturates at INT64_MAX
};
CkaPlan PlanCka(int64_t num_rows, const std::vector<int64_t>& dims,
                const CkaOptions& options = {});
// The same for L layers of equal width d, without a per-layer list (any
// sizes: the byte count saturates instead of overflowing).
CkaPlan PlanCkaUniform(int64_t num_layers, int64_t num_rows, int64_t dim,
                       const CkaOptions& options = {});

// The float32 GEMM peak on the current thread pool: the best of a few
// 2048^3 products through at::mm (the system BLAS) and, where the kernel's
// GEMMs may use it (cpu_gemm::Enabled()), oneDNN's sgemm; the faster one.
struct SgemmPeak {
  double gflops = 0;
  std::string library;  // "at::mm" or "oneDNN sgemm"
};
SgemmPeak MeasureSgemmPeak();

// "auto" / "fp32" / "fp64" and "auto" / "gram" / "feature"; InvalidArgument
// naming `flag` for anything else.
absl::StatusOr<CkaPrecision> ParseCkaPrecision(const std::string& name,
                                               const std::string& flag);
absl::StatusOr<CkaForm> ParseCkaForm(const std::string& name,
                                     const std::string& flag);

// Sets LibTorch's intra-op thread count: n > 0, or all cores for 0. Returns
// the count in effect.
int SetKernelThreads(int n);

// Peak resident set of this process so far (getrusage), bytes.
int64_t PeakRssBytes();

}  // namespace diagnostics
}  // namespace depthbench

#endif  // DEPTHBENCH_TRAINER_CORE_DIAGNOSTICS_CKA_OPTIONS_H_
