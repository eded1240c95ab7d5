// Effective depth of states computed elsewhere: reads a float32 `.npy` array
// of shape (L, N, d) (L block outputs h_1..h_L, N sequences, each already
// mean-pooled over tokens) and reports D_eff as in spec section 7. Backs
// `depthbench-deff` and `depthbench-train diagnose deff --states FILE.npy`.
//
// The JSON document (keys are stable; the scheduler stores it as is):
//   {"kind": "deff", "states": PATH, "layers": L, "sequences": N,
//    "d_model": d, "max_lag": K, "deff": x, "deff_over_l": x,
//    "rho_bar1": x|null, "f_l": x, "gap_pct": x,
//    "lag_profile": [rho_bar(0)=1, rho_bar(1), ..., rho_bar(L-1)],
//    "cka": [[rho(i, j)]] (L x L, 0-indexed over h_1..h_L)}
//
// Torch-free header (the implementation uses LibTorch). Thread safety: pure.
#ifndef DEPTHBENCH_TRAINER_CORE_DIAGNOSTICS_DEFF_NPY_H_
#define DEPTHBENCH_TRAINER_CORE_DIAGNOSTICS_DEFF_NPY_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/statusor.h"

namespace depthbench {
namespace diagnostics {

// Input bounds. D_eff holds an L x L CKA matrix and, per layer, float64
// copies of the (N, d) states (and an N x N Gram matrix when N <= d), so
// the work grows as L^2 and L * N * d: a small file can ask for terabytes.
// DepthBench models have at most a few hundred blocks.
inline constexpr int64_t kDeffMaxLayers = 4096;
inline constexpr int64_t kDeffMaxWorkingBytes = int64_t{4} << 30;  // 4 GiB

// What DeffFromNpy allocates for states of shape (L, N, d), in bytes: the
// float32 array, the float64 pooled and centred copies, the Gram matrices or
// one transient d x d product, and the CKA matrix. Saturates at INT64_MAX.
int64_t DeffWorkingBytes(int64_t num_layers, int64_t num_seq, int64_t dim);

// `max_lag` -1 means L-1. `path` must be a regular file (a FIFO or device
// such as /dev/zero is refused before reading). The shape is checked before
// any array memory is allocated: InvalidArgument for a bad file, a shape that
// is not 3-D, N < 2, L > kDeffMaxLayers, DeffWorkingBytes above
// max_working_bytes, or a layer whose pooled states have zero variance.
absl::StatusOr<nlohmann::json> DeffFromNpy(
    const std::string& path, int64_t max_lag = -1,
    int64_t max_working_bytes = kDeffMaxWorkingBytes);

// Human-readable table of a DeffFromNpy document (summary + lag profile).
std::string FormatDeffTable(const nlohmann::json& deff);

}  // namespace diagnostics
}  // namespace depthbench

#endif  // DEPTHBENCH_TRAINER_CORE_DIAGNOSTICS_DEFF_NPY_H_
