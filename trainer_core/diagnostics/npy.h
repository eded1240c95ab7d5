// Minimal NumPy `.npy` reader/writer for little-endian float32 arrays.
//
// Supports format versions 1.0, 2.0 and 3.0 with dtype '<f4' in C order
// (what `np.save(path, a.astype(np.float32))` writes). Anything else
// (another dtype, big-endian, Fortran order, truncated or oversized data, a
// malformed header) is InvalidArgument naming the problem; an unreadable file
// is NotFound / Internal. Self-contained: does not use the data layer's
// token-shard readers.
//
// Torch-free. Thread safety: pure functions.
#ifndef DEPTHBENCH_TRAINER_CORE_DIAGNOSTICS_NPY_H_
#define DEPTHBENCH_TRAINER_CORE_DIAGNOSTICS_NPY_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace depthbench {
namespace diagnostics {

struct NpyArray {
  std::vector<int64_t> shape;  // empty for a 0-d array
  std::vector<float> data;     // C order; size = product of shape
};

// Parses the bytes of a whole .npy file.
absl::StatusOr<NpyArray> ParseNpyFloat32(std::string_view bytes);

// Reads and parses `path`.
absl::StatusOr<NpyArray> ReadNpyFloat32(const std::string& path);

// Writes a version 1.0 '<f4' C-order file (header padded to 64 bytes, as
// NumPy does). InvalidArgument if data.size() != product(shape).
absl::Status WriteNpyFloat32(const std::string& path,
                             const std::vector<int64_t>& shape,
                             const std::vector<float>& data);

}  // namespace diagnostics
}  // namespace depthbench

#endif  // DEPTHBENCH_TRAINER_CORE_DIAGNOSTICS_NPY_H_
