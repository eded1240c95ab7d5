#include "trainer_core/diagnostics/npy.h"

#include <cctype>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace depthbench {
namespace diagnostics {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "npy reader assumes a little-endian host");
static_assert(sizeof(float) == 4, "float must be IEEE binary32");

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;

absl::Status Bad(const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("npy: ", why));
}

void SkipSpace(std::string_view h, size_t* pos) {
  while (*pos < h.size() && std::isspace(static_cast<unsigned char>(h[*pos]))) {
    ++*pos;
  }
}

// Finds the value text following key 'name' in the header dict.
absl::StatusOr<size_t> FindKey(std::string_view h, std::string_view name) {
  for (char quote : {'\'', '"'}) {
    const std::string key = std::string(1, quote) + std::string(name) + quote;
    size_t p = h.find(key);
    if (p == std::string_view::npos) continue;
    p += key.size();
    SkipSpace(h, &p);
    if (p >= h.size() || h[p] != ':') return Bad("malformed header dict");
    ++p;
    SkipSpace(h, &p);
    return p;
  }
  return Bad(absl::StrCat("header lacks '", std::string(name), "'"));
}

absl::StatusOr<std::string> ParseStringValue(std::string_view h, size_t p) {
  if (p >= h.size() || (h[p] != '\'' && h[p] != '"')) {
    return Bad("descr is not a string");
  }
  const char quote = h[p];
  const size_t end = h.find(quote, p + 1);
  if (end == std::string_view::npos) return Bad("unterminated string");
  return std::string(h.substr(p + 1, end - p - 1));
}

absl::StatusOr<std::vector<int64_t>> ParseShape(std::string_view h, size_t p) {
  if (p >= h.size() || h[p] != '(') return Bad("shape is not a tuple");
  const size_t end = h.find(')', p);
  if (end == std::string_view::npos) return Bad("unterminated shape tuple");
  std::vector<int64_t> shape;
  size_t i = p + 1;
  while (true) {
    SkipSpace(h, &i);
    if (i >= end) break;
    if (!std::isdigit(static_cast<unsigned char>(h[i]))) {
      return Bad(absl::StrCat("bad shape entry in '",
                              std::string(h.substr(p, end - p + 1)), "'"));
    }
    int64_t v = 0;
    while (i < end && std::isdigit(static_cast<unsigned char>(h[i]))) {
      if (v > (std::numeric_limits<int64_t>::max() - 9) / 10) {
        return Bad("shape entry overflows");
      }
      v = v * 10 + (h[i] - '0');
      ++i;
    }
    // NumPy may write Python 2 long suffixes ("3L").
    if (i < end && h[i] == 'L') ++i;
    shape.push_back(v);
    SkipSpace(h, &i);
    if (i < end) {
      if (h[i] != ',') return Bad("shape entries must be separated by ','");
      ++i;
    }
  }
  return shape;
}

}  // namespace

absl::StatusOr<NpyArray> ParseNpyFloat32(std::string_view bytes) {
  if (bytes.size() < kMagicLen + 2 ||
      std::memcmp(bytes.data(), kMagic, kMagicLen) != 0) {
    return Bad("not a .npy file (bad magic)");
  }
  const auto major = static_cast<uint8_t>(bytes[kMagicLen]);
  size_t header_len = 0;
  size_t prefix = 0;
  if (major == 1) {
    if (bytes.size() < 10) return Bad("truncated preamble");
    header_len = static_cast<uint8_t>(bytes[8]) |
                 (static_cast<size_t>(static_cast<uint8_t>(bytes[9])) << 8);
    prefix = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return Bad("truncated preamble");
    for (int i = 3; i >= 0; --i) {
      header_len = (header_len << 8) | static_cast<uint8_t>(bytes[8 + i]);
    }
    prefix = 12;
  } else {
    return Bad(absl::StrCat("unsupported format version ", major));
  }
  if (bytes.size() < prefix + header_len) return Bad("truncated header");
  const std::string_view header = bytes.substr(prefix, header_len);

  auto descr_pos = FindKey(header, "descr");
  if (!descr_pos.ok()) return descr_pos.status();
  auto descr = ParseStringValue(header, *descr_pos);
  if (!descr.ok()) return descr.status();
  if (*descr != "<f4") {
    return Bad(absl::StrCat("dtype '", *descr,
                            "' is not little-endian float32 ('<f4')"));
  }
  auto fortran_pos = FindKey(header, "fortran_order");
  if (!fortran_pos.ok()) return fortran_pos.status();
  if (header.substr(*fortran_pos, 5) == "False") {
    // C order: fine.
  } else if (header.substr(*fortran_pos, 4) == "True") {
    return Bad("Fortran-order arrays are not supported (use C order)");
  } else {
    return Bad("fortran_order is neither True nor False");
  }
  auto shape_pos = FindKey(header, "shape");
  if (!shape_pos.ok()) return shape_pos.status();
  auto shape = ParseShape(header, *shape_pos);
  if (!shape.ok()) return shape.status();

  uint64_t count = 1;
  for (int64_t d : *shape) {
    if (d != 0 && count > std::numeric_limits<uint64_t>::max() / 8 /
                              static_cast<uint64_t>(d)) {
      return Bad("array too large");
    }
    count *= static_cast<uint64_t>(d);
  }
  const uint64_t data_bytes = bytes.size() - prefix - header_len;
  if (data_bytes != count * 4) {
    return Bad(absl::StrCat(
        "data is ", data_bytes, " bytes, shape needs ", count * 4,
        data_bytes < count * 4 ? " (truncated file)" : " (trailing bytes)"));
  }
  NpyArray out;
  out.shape = *std::move(shape);
  out.data.resize(count);
  if (count > 0) {
    std::memcpy(out.data.data(), bytes.data() + prefix + header_len, count * 4);
  }
  return out;
}

absl::StatusOr<NpyArray> ReadNpyFloat32(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("npy: cannot open ", path));
  std::string bytes((std::istreambuf_iterator<char>(in)),
                    std::istreambuf_iterator<char>());
  if (in.bad()) return absl::InternalError(absl::StrCat("npy: read ", path));
  auto arr = ParseNpyFloat32(bytes);
  if (!arr.ok()) {
    return absl::Status(arr.status().code(),
                        absl::StrCat(arr.status().message(), " [", path, "]"));
  }
  return arr;
}

absl::Status WriteNpyFloat32(const std::string& path,
                             const std::vector<int64_t>& shape,
                             const std::vector<float>& data) {
  uint64_t count = 1;
  std::string tuple = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) return Bad("negative dimension");
    count *= static_cast<uint64_t>(shape[i]);
    absl::StrAppend(&tuple, i == 0 ? "" : ", ", shape[i]);
  }
  tuple += shape.size() == 1 ? ",)" : ")";
  if (count != data.size()) {
    return Bad(
        absl::StrCat("data has ", data.size(), " values, shape needs ", count));
  }
  std::string header = absl::StrCat(
      "{'descr': '<f4', 'fortran_order': False, 'shape': ", tuple, ", }");
  const size_t unpadded = 10 + header.size() + 1;  // +1 for '\n'
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');
  if (header.size() > 0xffff) return Bad("header too long for version 1.0");
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out)
    return absl::InternalError(absl::StrCat("npy: cannot write ", path));
  out.write(kMagic, kMagicLen);
  const char version[2] = {1, 0};
  out.write(version, 2);
  const char len[2] = {static_cast<char>(header.size() & 0xff),
                       static_cast<char>((header.size() >> 8) & 0xff)};
  out.write(len, 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(reinterpret_cast<const char*>(data.data()),
            static_cast<std::streamsize>(data.size() * sizeof(float)));
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("npy: write ", path));
  return absl::OkStatus();
}

}  // namespace diagnostics
}  // namespace depthbench
