#include "trainer_core/npy.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <limits>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace depthbench {
namespace {

namespace fs = std::filesystem;

constexpr bool kHostLittleEndian = __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__;
constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;

// ---- Python literal parser for the header dict ---------------------------

struct PyValue {
  enum class Kind { kString, kBool, kNone, kInt, kTuple, kList, kDict };
  Kind kind = Kind::kNone;
  std::string str;
  bool boolean = false;
  int64_t integer = 0;
  std::vector<PyValue> items;                            // tuple / list
  std::vector<std::pair<std::string, PyValue>> entries;  // dict
};

class PyLiteralParser {
 public:
  PyLiteralParser(std::string_view text, const std::string& source)
      : text_(text), source_(source) {}

  absl::StatusOr<PyValue> ParseWhole() {
    ASSIGN_OR_RETURN(PyValue v, ParseValue(0));
    SkipSpace();
    if (pos_ != text_.size()) return Error("unexpected trailing text");
    return v;
  }

 private:
  absl::Status Error(const std::string& what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("bad .npy header in ", source_, ": ", what,
                     " at character ", pos_, " of '", std::string(text_), "'"));
  }
  void SkipSpace() {
    while (pos_ < text_.size() &&
           std::isspace(static_cast<unsigned char>(text_[pos_]))) {
      ++pos_;
    }
  }
  bool Consume(char c) {
    SkipSpace();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  absl::StatusOr<PyValue> ParseValue(int depth) {
    if (depth > 16) return Error("nesting too deep");
    SkipSpace();
    if (pos_ >= text_.size()) return Error("unexpected end");
    const char c = text_[pos_];
    if (c == '\'' || c == '"') return ParseString();
    if (c == '(') return ParseSeq(')', PyValue::Kind::kTuple, depth);
    if (c == '[') return ParseSeq(']', PyValue::Kind::kList, depth);
    if (c == '{') return ParseDict(depth);
    if (c == '-' || std::isdigit(static_cast<unsigned char>(c))) {
      return ParseInt();
    }
    if (std::isalpha(static_cast<unsigned char>(c))) return ParseName();
    return Error(
        absl::StrCat("unexpected character '", std::string(1, c), "'"));
  }

  // True, False or None.
  absl::StatusOr<PyValue> ParseName() {
    size_t end = pos_;
    while (end < text_.size() &&
           std::isalnum(static_cast<unsigned char>(text_[end]))) {
      ++end;
    }
    const std::string word(text_.substr(pos_, end - pos_));
    PyValue v;
    if (word == "True" || word == "False") {
      v.kind = PyValue::Kind::kBool;
      v.boolean = word == "True";
    } else if (word == "None") {
      v.kind = PyValue::Kind::kNone;
    } else {
      return Error(absl::StrCat("unknown name '", word, "'"));
    }
    pos_ = end;
    return v;
  }

  absl::StatusOr<PyValue> ParseString() {
    const char quote = text_[pos_++];
    PyValue v;
    v.kind = PyValue::Kind::kString;
    while (pos_ < text_.size() && text_[pos_] != quote) {
      if (text_[pos_] == '\\' && pos_ + 1 < text_.size()) ++pos_;
      v.str.push_back(text_[pos_++]);
    }
    if (pos_ >= text_.size()) return Error("unterminated string");
    ++pos_;
    return v;
  }

  absl::StatusOr<PyValue> ParseInt() {
    size_t end = pos_;
    if (text_[end] == '-') ++end;
    const size_t digits_begin = end;
    while (end < text_.size() &&
           std::isdigit(static_cast<unsigned char>(text_[end]))) {
      ++end;
    }
    if (end == digits_begin) return Error("expected digits");
    if (end - digits_begin > 18) return Error("integer too large");
    PyValue v;
    v.kind = PyValue::Kind::kInt;
    v.integer = std::stoll(std::string(text_.substr(pos_, end - pos_)));
    pos_ = end;
    if (pos_ < text_.size() && (text_[pos_] == 'L' || text_[pos_] == 'l')) {
      ++pos_;  // Python 2 long suffix
    }
    return v;
  }

  absl::StatusOr<PyValue> ParseSeq(char close, PyValue::Kind kind, int depth) {
    ++pos_;
    PyValue v;
    v.kind = kind;
    while (true) {
      if (Consume(close)) return v;
      ASSIGN_OR_RETURN(PyValue item, ParseValue(depth + 1));
      v.items.push_back(std::move(item));
      if (Consume(',')) continue;
      if (Consume(close)) return v;
      return Error(
          absl::StrCat("expected ',' or '", std::string(1, close), "'"));
    }
  }

  absl::StatusOr<PyValue> ParseDict(int depth) {
    ++pos_;
    PyValue v;
    v.kind = PyValue::Kind::kDict;
    while (true) {
      if (Consume('}')) return v;
      SkipSpace();
      if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"')) {
        return Error("expected a string key");
      }
      ASSIGN_OR_RETURN(PyValue key, ParseString());
      if (!Consume(':')) return Error("expected ':'");
      ASSIGN_OR_RETURN(PyValue value, ParseValue(depth + 1));
      for (const auto& e : v.entries) {
        if (e.first == key.str) {
          return Error(absl::StrCat("duplicate key '", key.str, "'"));
        }
      }
      v.entries.emplace_back(key.str, std::move(value));
      if (Consume(',')) continue;
      if (Consume('}')) return v;
      return Error("expected ',' or '}'");
    }
  }

  std::string_view text_;
  const std::string& source_;
  size_t pos_ = 0;
};

std::string PyRepr(const PyValue& v) {
  switch (v.kind) {
    case PyValue::Kind::kString:
      return absl::StrCat("'", v.str, "'");
    case PyValue::Kind::kBool:
      return v.boolean ? "True" : "False";
    case PyValue::Kind::kNone:
      return "None";
    case PyValue::Kind::kInt:
      return absl::StrCat(v.integer);
    case PyValue::Kind::kTuple:
    case PyValue::Kind::kList: {
      const bool tuple = v.kind == PyValue::Kind::kTuple;
      std::string s = tuple ? "(" : "[";
      for (size_t i = 0; i < v.items.size(); ++i) {
        if (i > 0) s += ", ";
        s += PyRepr(v.items[i]);
      }
      if (tuple && v.items.size() == 1) s += ",";
      return s + (tuple ? ")" : "]");
    }
    case PyValue::Kind::kDict: {
      std::string s = "{";
      for (size_t i = 0; i < v.entries.size(); ++i) {
        if (i > 0) s += ", ";
        s += absl::StrCat("'", v.entries[i].first,
                          "': ", PyRepr(v.entries[i].second));
      }
      return s + "}";
    }
  }
  return "?";
}

// ---- the three steps: preamble, header dict, data size -------------------

absl::Status Bad(const std::string& source, const std::string& what) {
  return absl::InvalidArgumentError(
      absl::StrCat("bad .npy file ", source, ": ", what));
}

struct Preamble {
  int major = 0;
  int64_t header_len = 0;
  int64_t prefix = 0;  // bytes before the header text
};

uint32_t LoadLe32(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}

// `head` holds the first min(12, file_size) bytes of the file.
absl::StatusOr<Preamble> ParsePreamble(std::string_view head, int64_t file_size,
                                       const std::string& source) {
  if (file_size < 10) {
    return Bad(source, "file is shorter than the 10-byte preamble");
  }
  const auto* p = reinterpret_cast<const unsigned char*>(head.data());
  if (std::memcmp(p, kMagic, kMagicLen) != 0) {
    return Bad(source, "magic string is not \\x93NUMPY");
  }
  Preamble pre;
  pre.major = p[6];
  const int minor = p[7];
  if (pre.major == 1) {
    pre.header_len = p[8] | (p[9] << 8);
    pre.prefix = 10;
  } else if (pre.major == 2 || pre.major == 3) {
    if (file_size < 12) {
      return Bad(source, "file is shorter than the 12-byte preamble");
    }
    pre.header_len = LoadLe32(p + 8);
    pre.prefix = 12;
  }
  if (pre.prefix == 0 || minor != 0) {
    return Bad(source, absl::StrCat("unsupported format version ", pre.major,
                                    ".", minor, " (supported: 1.0, 2.0, 3.0)"));
  }
  if (pre.prefix + pre.header_len > file_size) {
    return Bad(
        source,
        absl::StrCat("truncated header: header length ", pre.header_len,
                     " runs past the end of the file (", file_size, " bytes)"));
  }
  return pre;
}

// Checks the 'shape' tuple (non-negative ints, expect.ndim dimensions) and
// sets layout->shape and layout->count (layout->dtype must be set).
absl::Status ReadShape(const PyValue& shape, const std::string& source,
                       const NpyExpectation& expect, NpyLayout* layout) {
  if (shape.kind != PyValue::Kind::kTuple) {
    return Bad(source,
               absl::StrCat("'shape' is ", PyRepr(shape), ", not a tuple"));
  }
  for (const PyValue& dim : shape.items) {
    if (dim.kind != PyValue::Kind::kInt || dim.integer < 0) {
      return Bad(source, absl::StrCat("bad shape ", PyRepr(shape)));
    }
    layout->shape.push_back(dim.integer);
  }
  if (expect.ndim >= 0 &&
      static_cast<int>(layout->shape.size()) != expect.ndim) {
    return Bad(source,
               absl::StrCat("array is ", layout->shape.size(), "-D with shape ",
                            PyRepr(shape), "; ", expect.ndim_help));
  }
  const bool empty = std::find(layout->shape.begin(), layout->shape.end(), 0) !=
                     layout->shape.end();
  layout->count = empty ? 0 : 1;
  const int64_t max_count =
      std::numeric_limits<int64_t>::max() / layout->dtype.item_size;
  for (int64_t d : layout->shape) {
    if (empty) break;
    if (layout->count > max_count / d) {
      return Bad(source,
                 absl::StrCat("shape ", PyRepr(shape), " is too large"));
    }
    layout->count *= d;
  }
  return absl::OkStatus();
}

// Parses the header dict and checks dtype, order and shape against expect.
absl::StatusOr<NpyLayout> ParseHeader(std::string_view text,
                                      const Preamble& pre,
                                      const std::string& source,
                                      const NpyExpectation& expect) {
  PyLiteralParser parser(text, source);
  ASSIGN_OR_RETURN(const PyValue dict, parser.ParseWhole());
  if (dict.kind != PyValue::Kind::kDict) {
    return Bad(source, "header is not a dict");
  }
  const PyValue* descr = nullptr;
  const PyValue* fortran = nullptr;
  const PyValue* shape = nullptr;
  for (const auto& [key, value] : dict.entries) {
    if (key == "descr") {
      descr = &value;
    } else if (key == "fortran_order") {
      fortran = &value;
    } else if (key == "shape") {
      shape = &value;
    } else {
      return Bad(source, absl::StrCat("unexpected header key '", key, "'"));
    }
  }
  if (descr == nullptr) return Bad(source, "header lacks 'descr'");
  if (fortran == nullptr) return Bad(source, "header lacks 'fortran_order'");
  if (shape == nullptr) return Bad(source, "header lacks 'shape'");

  NpyLayout layout;
  layout.major_version = pre.major;
  layout.data_offset = pre.prefix + pre.header_len;
  const auto accepted = std::find_if(
      expect.dtypes.begin(), expect.dtypes.end(), [&](const NpyDtype& d) {
        return descr->kind == PyValue::Kind::kString && descr->str == d.descr;
      });
  if (accepted == expect.dtypes.end()) {
    return Bad(source, absl::StrCat("unsupported dtype ", PyRepr(*descr),
                                    " (supported: ", expect.dtypes_help, ")"));
  }
  layout.dtype = *accepted;
  if (fortran->kind != PyValue::Kind::kBool) {
    return Bad(source, absl::StrCat("'fortran_order' is ", PyRepr(*fortran),
                                    ", expected True or False"));
  }
  if (fortran->boolean) {
    return Bad(source,
               "fortran_order is True (a Fortran-order array); only C-order "
               "arrays are supported");
  }
  RETURN_IF_ERROR(ReadShape(*shape, source, expect, &layout));
  return layout;
}

// The data after the header must be exactly what the shape needs.
absl::Status CheckDataSize(const NpyLayout& layout, int64_t file_size,
                           const std::string& source,
                           const NpyExpectation& expect) {
  const int64_t payload = file_size - layout.data_offset;
  const int64_t width = layout.dtype.item_size;
  const int64_t count = layout.count;
  if (payload < layout.data_bytes()) {
    return Bad(source,
               absl::StrCat("truncated: header says ", count, " ",
                            expect.element_noun, ", file holds ",
                            payload / width, " (", payload, " bytes of data)"));
  }
  if (payload > layout.data_bytes()) {
    return Bad(source,
               absl::StrCat("size mismatch: header says ", count, " ",
                            expect.element_noun, ", file holds ", payload,
                            " bytes of data (", payload - layout.data_bytes(),
                            " trailing bytes)"));
  }
  return absl::OkStatus();
}

void SwapToHost(char* data, int64_t count, int item_size) {
  if (kHostLittleEndian || item_size == 1) return;
  for (int64_t i = 0; i < count; ++i) {
    std::reverse(data + i * item_size, data + (i + 1) * item_size);
  }
}

}  // namespace

std::string NpyShapeString(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    absl::StrAppend(&s, i == 0 ? "" : ", ", shape[i]);
  }
  return s + (shape.size() == 1 ? ",)" : ")");
}

absl::StatusOr<int64_t> RegularFileSize(const std::string& path,
                                        const std::string& what) {
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    return absl::NotFoundError(
        absl::StrCat(what, " ", path, " does not exist"));
  }
  if (!fs::is_regular_file(path, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", path, " is not a regular file"));
  }
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot stat ", path, ": ", ec.message()));
  }
  return static_cast<int64_t>(size);
}

absl::StatusOr<NpyLayout> ParseNpyLayout(std::string_view bytes,
                                         const std::string& source,
                                         const NpyExpectation& expect) {
  const auto size = static_cast<int64_t>(bytes.size());
  ASSIGN_OR_RETURN(const Preamble pre,
                   ParsePreamble(bytes.substr(0, 12), size, source));
  ASSIGN_OR_RETURN(NpyLayout layout,
                   ParseHeader(bytes.substr(pre.prefix, pre.header_len), pre,
                               source, expect));
  RETURN_IF_ERROR(CheckDataSize(layout, size, source, expect));
  return layout;
}

NpyFileReader::NpyFileReader(std::string path, std::ifstream in,
                             NpyLayout layout, int64_t file_size)
    : path_(std::move(path)),
      in_(std::move(in)),
      layout_(std::move(layout)),
      file_size_(file_size) {}

absl::StatusOr<NpyFileReader> NpyFileReader::Open(
    const std::string& path, const NpyExpectation& expect) {
  ASSIGN_OR_RETURN(const int64_t file_size,
                   RegularFileSize(path, expect.file_noun));
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::string head(static_cast<size_t>(std::min<int64_t>(file_size, 12)), '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  if (in.gcount() != static_cast<std::streamsize>(head.size())) {
    return absl::DataLossError(absl::StrCat("short read from ", path));
  }
  ASSIGN_OR_RETURN(const Preamble pre, ParsePreamble(head, file_size, path));
  std::string text(static_cast<size_t>(pre.header_len), '\0');
  in.seekg(pre.prefix);
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.gcount() != static_cast<std::streamsize>(text.size())) {
    return absl::DataLossError(
        absl::StrCat("short read from ", path, ": ", in.gcount(), " of ",
                     text.size(), " header bytes at offset ", pre.prefix));
  }
  ASSIGN_OR_RETURN(NpyLayout layout, ParseHeader(text, pre, path, expect));
  RETURN_IF_ERROR(CheckDataSize(layout, file_size, path, expect));
  return NpyFileReader(path, std::move(in), std::move(layout), file_size);
}

absl::Status NpyFileReader::ReadData(void* dst) {
  const int64_t bytes = layout_.data_bytes();
  char* out = static_cast<char*>(dst);
  in_.seekg(layout_.data_offset);
  in_.read(out, static_cast<std::streamsize>(bytes));
  if (in_.gcount() != bytes) {
    return absl::DataLossError(
        absl::StrCat("short read from ", path_, ": ", in_.gcount(), " of ",
                     bytes, " bytes at offset ", layout_.data_offset));
  }
  SwapToHost(out, layout_.count, layout_.dtype.item_size);
  return absl::OkStatus();
}

absl::Status WriteNpy(const std::string& path, const NpyDtype& dtype,
                      const std::vector<int64_t>& shape,
                      std::string_view data) {
  uint64_t count = 1;
  for (int64_t d : shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot write ", path, ": negative dimension in shape ",
                       NpyShapeString(shape)));
    }
    count *= static_cast<uint64_t>(d);
  }
  if (count * static_cast<uint64_t>(dtype.item_size) != data.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot write ", path, ": data has ", data.size() / dtype.item_size,
        " values, shape ", NpyShapeString(shape), " needs ", count));
  }
  std::string header =
      absl::StrCat("{'descr': '", dtype.descr, "', 'fortran_order': False, ",
                   "'shape': ", NpyShapeString(shape), ", }");
  const size_t unpadded = 10 + header.size() + 1;  // +1 for '\n'
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');
  if (header.size() > 0xffff) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot write ", path, ": header too long for version 1.0"));
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::InternalError(absl::StrCat("cannot create ", path));
  out.write(kMagic, kMagicLen);
  const char version[2] = {1, 0};
  out.write(version, 2);
  const char len[2] = {static_cast<char>(header.size() & 0xff),
                       static_cast<char>((header.size() >> 8) & 0xff)};
  out.write(len, 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  if (kHostLittleEndian || dtype.item_size == 1) {
    out.write(data.data(), static_cast<std::streamsize>(data.size()));
  } else {
    std::string le(data);
    SwapToHost(le.data(), static_cast<int64_t>(count), dtype.item_size);
    out.write(le.data(), static_cast<std::streamsize>(le.size()));
  }
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace depthbench
