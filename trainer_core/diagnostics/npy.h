// Little-endian float32 NumPy arrays for the layer diagnostics: pooled
// states in, states out. A thin float32 layer over the project's one .npy
// reader and writer (trainer_core/npy.h, which the data layer's token reader
// uses too).
//
// Supports format versions 1.0, 2.0 and 3.0 with dtype '<f4' in C order
// (what `np.save(path, a.astype(np.float32))` writes). Anything else
// (another dtype, big-endian, Fortran order, truncated or oversized data, a
// malformed header) is InvalidArgument naming the problem; a missing file is
// NotFound, and a path that is not a regular file (a directory, FIFO or
// device) is InvalidArgument.
//
// Torch-free. Thread safety: pure functions.
#ifndef DEPTHBENCH_TRAINER_CORE_DIAGNOSTICS_NPY_H_
#define DEPTHBENCH_TRAINER_CORE_DIAGNOSTICS_NPY_H_

#include <cstdint>
#include <functional>
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

// Called with the header's shape before any array memory is allocated; a
// non-OK status is returned as is and the data is not read.
using NpyShapeCheck =
    std::function<absl::Status(const std::vector<int64_t>& shape)>;

// Parses the bytes of a whole .npy file.
absl::StatusOr<NpyArray> ParseNpyFloat32(std::string_view bytes);

// Reads and parses `path`. check_shape (if set) vets the shape first, so a
// header claiming a shape the caller cannot afford costs no allocation.
absl::StatusOr<NpyArray> ReadNpyFloat32(const std::string& path,
                                        const NpyShapeCheck& check_shape = {});

// Writes a version 1.0 '<f4' C-order file (header padded to 64 bytes, as
// NumPy does). InvalidArgument if data.size() != product(shape).
absl::Status WriteNpyFloat32(const std::string& path,
                             const std::vector<int64_t>& shape,
                             const std::vector<float>& data);

}  // namespace diagnostics
}  // namespace depthbench

#endif  // DEPTHBENCH_TRAINER_CORE_DIAGNOSTICS_NPY_H_
