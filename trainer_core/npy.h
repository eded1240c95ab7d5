// The one NumPy `.npy` reader and writer of the project. The data layer reads
// token arrays with it (token_files.h: '<u2' / '<u4', 1-D) and the layer
// diagnostics read pooled states with it (diagnostics/npy.h: '<f4', any
// shape).
//
// Format (NumPy's format.py): the magic "\x93NUMPY", a version byte pair
// (1.0: 2-byte little-endian header length; 2.0 and 3.0: 4-byte), then the
// header, a Python dict literal {'descr': DTYPE, 'fortran_order': BOOL,
// 'shape': TUPLE} padded with spaces and ended by '\n', then the array data.
//
// The reader checks, in this order: the preamble (magic, version), the header
// dict (a Python literal with exactly the three keys), the dtype against the
// caller's list, fortran_order (C order only), the shape (non-negative ints,
// the number of dimensions the caller requires), and that the data after the
// header is exactly product(shape) * item size bytes. Only then is any array
// memory allocated, and never more than the file holds, so a header that
// claims a huge shape cannot make the reader allocate it. Paths must name
// regular files: a FIFO, a device (/dev/zero) or a directory is refused
// before reading.
//
// Errors: NotFound for a missing file; InvalidArgument naming the source and
// the problem for everything else the file says ("bad .npy file SRC: ..." or
// "bad .npy header in SRC: ..."); DataLoss for a short read; Internal for an
// I/O failure.
//
// Torch-free. Thread safety: the free functions are thread-safe; an
// NpyFileReader is used by one thread at a time. Ownership: plain values.
#ifndef DEPTHBENCH_TRAINER_CORE_NPY_H_
#define DEPTHBENCH_TRAINER_CORE_NPY_H_

#include <cstdint>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace depthbench {

// One dtype a caller accepts.
struct NpyDtype {
  std::string descr;  // e.g. "<u2"
  int item_size = 0;  // bytes per element
};

// What the caller accepts; the reader refuses anything else.
struct NpyExpectation {
  std::vector<NpyDtype> dtypes;
  // How the accepted dtypes read in an error, e.g. "'<u2' uint16, '<u4'
  // uint32".
  std::string dtypes_help;
  // Required number of dimensions; -1 accepts any.
  int ndim = -1;
  // Appended to the wrong-dimensions error, e.g. "token arrays must be 1-D".
  std::string ndim_help;
  // What one element is called in size errors ("tokens", "values").
  std::string element_noun = "values";
  // What the file is called in file-system errors ("data file", "states
  // file").
  std::string file_noun = "data file";
};

// A checked header: what the file holds and where its data starts.
struct NpyLayout {
  int major_version = 1;
  NpyDtype dtype;
  std::vector<int64_t> shape;  // empty for a 0-d array
  int64_t count = 1;           // product(shape)
  int64_t data_offset = 0;     // bytes before the array data
  int64_t data_bytes() const { return count * dtype.item_size; }
};

// The shape as Python prints the tuple: "()", "(3,)", "(3, 1)".
std::string NpyShapeString(const std::vector<int64_t>& shape);

// Checks the preamble and header of a whole .npy file held in memory
// (`bytes`), including that the data has the size the shape needs. `source`
// names it in errors.
absl::StatusOr<NpyLayout> ParseNpyLayout(std::string_view bytes,
                                         const std::string& source,
                                         const NpyExpectation& expect);

// Reads a .npy file in two steps so that the caller can look at the shape
// (and refuse it) before any array memory is allocated:
//
//   ASSIGN_OR_RETURN(NpyFileReader reader, NpyFileReader::Open(path, expect));
//   ... check reader.layout().shape ...
//   std::vector<float> data(reader.layout().count);
//   RETURN_IF_ERROR(reader.ReadData(data.data()));
class NpyFileReader {
 public:
  // Opens `path` (a regular file), reads and checks its preamble and header
  // against `expect` and the file size. Reads no array data.
  static absl::StatusOr<NpyFileReader> Open(const std::string& path,
                                            const NpyExpectation& expect);

  NpyFileReader(NpyFileReader&&) = default;
  NpyFileReader& operator=(NpyFileReader&&) = default;
  NpyFileReader(const NpyFileReader&) = delete;
  NpyFileReader& operator=(const NpyFileReader&) = delete;

  const NpyLayout& layout() const { return layout_; }
  int64_t file_size() const { return file_size_; }

  // Reads the whole array into dst (layout().data_bytes() bytes), converted
  // from little-endian to host order. Call once.
  absl::Status ReadData(void* dst);

 private:
  NpyFileReader(std::string path, std::ifstream in, NpyLayout layout,
                int64_t file_size);

  std::string path_;
  std::ifstream in_;
  NpyLayout layout_;
  int64_t file_size_ = 0;
};

// The size of a regular file. NotFound if it does not exist; InvalidArgument
// ("... is not a regular file") for a directory, FIFO, socket or device.
// `what` starts the messages ("data file", "states file").
absl::StatusOr<int64_t> RegularFileSize(const std::string& path,
                                        const std::string& what);

// Writes a version 1.0 C-order file with the given dtype (header padded to a
// multiple of 64 bytes, as NumPy does). `data` holds the elements in host
// byte order (they are written little-endian); InvalidArgument if its size is
// not product(shape) * dtype.item_size or a dimension is negative.
absl::Status WriteNpy(const std::string& path, const NpyDtype& dtype,
                      const std::vector<int64_t>& shape, std::string_view data);

}  // namespace depthbench

#endif  // DEPTHBENCH_TRAINER_CORE_NPY_H_
