// Both splits of one data source, how validation was held out, and the
// `depthbench-train data-info` summary. Torch-free.
//
// Split rules (the loaders in brown_corpus.h and token_files.h apply them):
// Brown holds out whole documents (every kValEvery-th); a directory of .bin
// shards holds out its last shard; a single .bin or .npy file, or a directory
// holding one shard, holds out its last floor(N / kValEvery) tokens.
//
// Thread safety: values; const access from several threads is safe.
#ifndef DEPTHBENCH_TRAINER_CORE_TOKEN_DATASET_H_
#define DEPTHBENCH_TRAINER_CORE_TOKEN_DATASET_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "trainer_core/token_sequence.h"

namespace depthbench {

// Every kValEvery-th document (Brown) is validation; a single file or shard
// holds out its last 1 / kValEvery of tokens.
inline constexpr int64_t kValEvery = 20;

enum class DataFormat { kBrown, kBin, kNpy, kBinDirectory };
// "brown", "bin", "npy", "bin_dir".
std::string DataFormatName(DataFormat format);

struct TokenDataset {
  DataFormat format = DataFormat::kBrown;
  std::string source;  // "brown" or the path given
  int64_t vocab = 0;
  bool byte_level = false;  // ids are bytes of UTF-8 text (Brown)
  TokenSequence train;
  TokenSequence val;
  std::string split_rule;  // one human-readable line: how val was chosen
  // Brown: document names; directory: shard paths; single file: the path.
  std::vector<std::string> train_files;
  std::vector<std::string> val_files;
};

// Splits `all` into ds->train (the first N - floor(N / kValEvery) tokens) and
// ds->val (the rest) and sets ds->split_rule. InvalidArgument naming source
// when N < kValEvery.
absl::Status HoldOutTail(const std::string& source, TokenSequence all,
                         TokenDataset* ds);

// For `depthbench-train data-info`: {"source","format","vocab","byte_level",
// "split_rule","train":{"tokens","files","max_id"},"val":{...},
// "sample": first 200 characters of train decoded (byte-level data), or
// "sample_ids": the first 64 train ids (other data)}.
std::string DataInfoJson(const TokenDataset& dataset);

}  // namespace depthbench

#endif  // DEPTHBENCH_TRAINER_CORE_TOKEN_DATASET_H_
