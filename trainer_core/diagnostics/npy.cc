#include "trainer_core/diagnostics/npy.h"

#include <cstring>
#include <utility>

#include "common/status_macros.h"
#include "trainer_core/npy.h"

namespace depthbench {
namespace diagnostics {
namespace {

static_assert(sizeof(float) == 4, "float must be IEEE binary32");

const NpyDtype kFloat32 = {"<f4", 4};

NpyExpectation Float32Array() {
  NpyExpectation expect;
  expect.dtypes = {kFloat32};
  expect.dtypes_help = "'<f4' little-endian float32";
  expect.file_noun = "states file";
  return expect;
}

}  // namespace

absl::StatusOr<NpyArray> ParseNpyFloat32(std::string_view bytes) {
  ASSIGN_OR_RETURN(const NpyLayout layout,
                   ParseNpyLayout(bytes, "(in memory)", Float32Array()));
  NpyArray out;
  out.shape = layout.shape;
  out.data.resize(static_cast<size_t>(layout.count));
  if (layout.count > 0) {
    std::memcpy(out.data.data(), bytes.data() + layout.data_offset,
                static_cast<size_t>(layout.data_bytes()));
  }
  return out;
}

absl::StatusOr<NpyArray> ReadNpyFloat32(const std::string& path,
                                        const NpyShapeCheck& check_shape) {
  ASSIGN_OR_RETURN(NpyFileReader reader,
                   NpyFileReader::Open(path, Float32Array()));
  if (check_shape) RETURN_IF_ERROR(check_shape(reader.layout().shape));
  NpyArray out;
  out.shape = reader.layout().shape;
  out.data.resize(static_cast<size_t>(reader.layout().count));
  RETURN_IF_ERROR(reader.ReadData(out.data.data()));
  return out;
}

absl::Status WriteNpyFloat32(const std::string& path,
                             const std::vector<int64_t>& shape,
                             const std::vector<float>& data) {
  return WriteNpy(path, kFloat32, shape,
                  std::string_view(reinterpret_cast<const char*>(data.data()),
                                   data.size() * sizeof(float)));
}

}  // namespace diagnostics
}  // namespace depthbench
