// Effective depth of states computed elsewhere: a float32 or float64 `.npy`
// array of shape (L, N, d) (L block outputs h_1..h_L, N sequences, each
// already mean-pooled over tokens), reported as D_eff of spec section 7.
// Backs `depthbench-deff` and `depthbench-train diagnose deff --states F`.
//
// The file is memory-mapped read-only and never loaded: the CKA kernel
// (cka_kernel.h) reads it a row block at a time and drops the pages it has
// used from the resident set, so the peak RSS is the kernel's buffers (about
// kCkaDefaultBudgetBytes) plus LibTorch, whatever the file size.
//
// The JSON document (keys are stable; the scheduler stores it as is):
//   {"kind": "deff", "states": PATH, "layers": L, "sequences": N,
//    "d_model": d, "max_lag": K, "deff": x, "deff_over_l": x,
//    "rho_bar1": x|null, "f_l": x, "gap_pct": x,
//    "lag_profile": [rho_bar(0)=1, rho_bar(1), ..., rho_bar(L-1)],
//    "cka": [[rho(i, j)]] (L x L, 0-indexed over h_1..h_L),
//    "perf": {"form": "gram"|"feature", "precision": "fp32"|"fp64",
//             "diagonal_tiles": "syrk: LIB" | "gemm: ..." | "" (feature),
//             "gemm": "oneDNN sgemm" | "at::mm ..." (CkaResult::gemm),
//             "seconds": x, "phase_seconds": {"means", "centre", "gemm",
//             "contract"} (where the seconds went), "gflop": x, "gflops": x,
//             "threads": n,
//             "peak_rss_mib": x, and when measured (DeffNpyOptions::perf or
//             a run over progress_interval_s) "sgemm_peak_gflops": x,
//             "sgemm_peak_library": "at::mm" | "oneDNN sgemm" (the faster;
//             MeasureSgemmPeak), "fraction_of_peak": x}}
// Only "perf" varies between runs on the same file.
//
// Torch-free header (the implementation uses LibTorch). Thread safety: pure.
#ifndef DEPTHBENCH_TRAINER_CORE_DIAGNOSTICS_DEFF_NPY_H_
#define DEPTHBENCH_TRAINER_CORE_DIAGNOSTICS_DEFF_NPY_H_

#include <cstdint>
#include <ostream>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/statusor.h"
#include "trainer_core/diagnostics/cka_options.h"

namespace depthbench {
namespace diagnostics {

// Input bounds. D_eff holds an L x L CKA matrix and the kernel's buffers
// (cka_kernel.h: an [L, t, t] Gram tile buffer or a block of centred
// layers), so the memory grows with L^2 and the tile, not with the file.
// DepthBench models have at most a few hundred blocks.
inline constexpr int64_t kDeffMaxLayers = 4096;
inline constexpr int64_t kDeffMaxWorkingBytes = int64_t{4} << 30;  // 4 GiB

// What DeffFromNpy allocates for states of shape (L, N, d) with the default
// kernel options, in bytes (the mapped file is not counted: it is read, not
// held). Saturates at INT64_MAX.
int64_t DeffWorkingBytes(int64_t num_layers, int64_t num_seq, int64_t dim);

struct DeffNpyOptions {
  int64_t max_lag = -1;  // K; -1 means L-1
  int64_t max_working_bytes = kDeffMaxWorkingBytes;
  CkaOptions cka;  // precision, form, buffer budget (progress is set here)
  // Progress lines ("deff: ... ETA ...") and the final perf line go here
  // (stderr in the CLIs); null: silent. The first progress line comes after
  // progress_interval_s, then one every progress_interval_s.
  std::ostream* log = nullptr;
  double progress_interval_s = 2.0;
  // Measure the sgemm peak (2048^3 at::mm and oneDNN sgemm, ~0.2-1 s) and print the perf
  // line even for a short run. Runs over progress_interval_s always do.
  bool perf = false;
};

// `path` must be a regular file (a FIFO or device such as /dev/zero is
// refused before reading). The shape is checked before any array memory is
// allocated: InvalidArgument for a bad file ('<f4' or '<f8' little-endian,
// C order), a shape that is not 3-D, N < 2, L > kDeffMaxLayers,
// DeffWorkingBytes above max_working_bytes, or a layer with non-finite values
// or zero variance (named, 1-indexed).
absl::StatusOr<nlohmann::json> DeffFromNpy(const std::string& path,
                                           const DeffNpyOptions& options);
absl::StatusOr<nlohmann::json> DeffFromNpy(
    const std::string& path, int64_t max_lag = -1,
    int64_t max_working_bytes = kDeffMaxWorkingBytes);

// The command-line knobs both CLIs share (--precision, --form, --threads,
// --budget-mib, --perf, --quiet), turned into options. Sets the thread count.
struct DeffCliFlags {
  std::string precision = "auto";
  std::string form = "auto";
  int threads = 0;  // 0: all cores
  int64_t budget_mib = kCkaDefaultBudgetBytes >> 20;
  bool perf = false;
  bool quiet = false;  // no progress or perf line on stderr
};
absl::StatusOr<DeffNpyOptions> MakeDeffNpyOptions(const DeffCliFlags& flags,
                                                  int64_t max_lag,
                                                  std::ostream* log);

// Human-readable table of a DeffFromNpy document (summary + lag profile).
std::string FormatDeffTable(const nlohmann::json& deff);

}  // namespace diagnostics
}  // namespace depthbench

#endif  // DEPTHBENCH_TRAINER_CORE_DIAGNOSTICS_DEFF_NPY_H_
