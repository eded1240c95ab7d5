#include "trainer_core/token_sequence.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace depthbench {

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

std::string DecodeBytes(const TokenSequence& tokens, int64_t max_bytes) {
  const int64_t n = std::min(tokens.size(), std::max<int64_t>(max_bytes, 0));
  std::string s(static_cast<size_t>(n), '\0');
  for (int64_t i = 0; i < n; ++i) {
    s[i] = static_cast<char>(static_cast<unsigned char>(tokens[i] & 0xFF));
  }
  return s;
}

}  // namespace depthbench
