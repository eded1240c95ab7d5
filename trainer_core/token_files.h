// User token data on disk: llm.c .bin shards, NumPy .npy token arrays, and
// directories of shards. Torch-free.
//
//   PATH.bin     one llm.c uint16 shard: 256 x int32 little-endian header
//                (magic 20240520, version 1, token count), then the tokens.
//   PATH.npy     a NumPy array (format 1.0/2.0/3.0), 1-D, C order, dtype
//                '<u2' or '<u4' (read with trainer_core/npy.h).
//   DIRECTORY    the directory's *.bin shards sorted by file name; the last
//                shard is validation, the others (concatenated) training.
//   For a single .bin or .npy file, or a directory holding one shard, the
//   last floor(N / 20) tokens are validation and the rest training.
// Every token id is checked against the run's vocabulary: an id >= vocab is
// an InvalidArgument naming the file, the index and the vocab.
//
// Thread safety: the free functions are thread-safe.
#ifndef DEPTHBENCH_TRAINER_CORE_TOKEN_FILES_H_
#define DEPTHBENCH_TRAINER_CORE_TOKEN_FILES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "trainer_core/token_dataset.h"
#include "trainer_core/token_sequence.h"

namespace depthbench {

// llm.c .bin shard layout.
inline constexpr int32_t kBinMagic = 20240520;
inline constexpr int32_t kBinVersion = 1;
inline constexpr int64_t kBinHeaderInts = 256;

// Reads one llm.c uint16 .bin shard and checks ids against vocab. Errors:
// file unreadable, header truncated, wrong magic (expected vs got),
// unsupported version, negative count, truncated (header says N tokens, file
// holds M), trailing bytes, id >= vocab.
absl::StatusOr<TokenSequence> ReadBinShard(const std::string& path,
                                           int64_t vocab);

// Writes tokens as an llm.c uint16 .bin shard (for tools and tests).
absl::Status WriteBinShard(const std::string& path,
                           const std::vector<uint16_t>& tokens);

// Reads a 1-D '<u2' / '<u4' C-order .npy array and checks ids against vocab.
// Errors: bad magic, unsupported format version, malformed header dict,
// missing key, unsupported dtype, not 1-D, fortran_order True, truncated or
// trailing data, id >= vocab.
absl::StatusOr<TokenSequence> ReadNpyTokens(const std::string& path,
                                            int64_t vocab);

// The dataset of a .bin shard, a .npy array or a directory of .bin shards
// (see the file comment). path must exist; vocab > 0.
absl::StatusOr<TokenDataset> LoadTokenFiles(const std::string& path,
                                            int64_t vocab);

}  // namespace depthbench

#endif  // DEPTHBENCH_TRAINER_CORE_TOKEN_FILES_H_
