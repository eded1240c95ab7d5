// A sequence of token ids, the unit every data source yields and the batch
// sampler draws from. Torch-free.
//
// Thread safety: a value; const access from several threads is safe.
#ifndef DEPTHBENCH_TRAINER_CORE_TOKEN_SEQUENCE_H_
#define DEPTHBENCH_TRAINER_CORE_TOKEN_SEQUENCE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace depthbench {

// Token ids stored 16 or 32 bits wide (whichever the source had). Copies are
// deep.
class TokenSequence {
 public:
  TokenSequence() = default;
  explicit TokenSequence(std::vector<uint16_t> tokens);
  explicit TokenSequence(std::vector<uint32_t> tokens);

  int64_t size() const;
  bool empty() const { return size() == 0; }
  // 2 or 4.
  int width_bytes() const { return wide_ ? 4 : 2; }
  // Requires 0 <= i < size().
  uint32_t operator[](int64_t i) const;
  // Copies ids [start, start + count) into out[0 .. count). Requires the
  // range to lie inside the sequence.
  void CopyTo(int64_t start, int64_t count, int32_t* out) const;
  // A copy of [start, start + count); clamped to the sequence.
  TokenSequence Slice(int64_t start, int64_t count) const;
  // Appends other's ids (widening to 32 bits if either is wide).
  void Append(const TokenSequence& other);
  // OK when every id < vocab; otherwise InvalidArgument "token id X at index
  // I of SOURCE is >= vocab V" (index counts from index_base).
  absl::Status CheckVocab(int64_t vocab, const std::string& source,
                          int64_t index_base = 0) const;
  // Largest id, 0 when empty.
  uint32_t MaxId() const;

 private:
  bool wide_ = false;
  std::vector<uint16_t> narrow_;
  std::vector<uint32_t> wide_ids_;
};

// The first max_bytes ids of tokens as bytes (for byte-level data).
std::string DecodeBytes(const TokenSequence& tokens, int64_t max_bytes);

}  // namespace depthbench

#endif  // DEPTHBENCH_TRAINER_CORE_TOKEN_SEQUENCE_H_
