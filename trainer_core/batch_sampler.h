// Deterministic training batches and fixed validation batches over a
// TokenSequence. Torch-free (batcher.h turns a Batch into a tensor).
//
// Sampler: each epoch draws, from (seed, epoch), a window offset o in
// [0, min(T - 1, N - T - 1)] and a random permutation of the non-overlapping
// windows starting at o, o + T, o + 2T, ... (each window holds T + 1 tokens;
// consecutive windows share one token, so an epoch trains on every token of
// [o, N) once). Batches take the next B windows of the permutation, running
// into the next epoch when one is used up. The position (seed, epoch, cursor,
// step) is all the state: a sampler restored at a position yields exactly the
// batches an uninterrupted sampler yields from there. Random numbers come from
// std::mt19937_64 with project-owned shuffling and range reduction, so the
// order is the same with every standard library.
//
// Validation: MakeValidationBatches picks B * n evenly spaced windows of the
// validation split, independent of any seed: the same windows on every call,
// step and run, so validation losses are comparable.
//
// Thread safety: MakeValidationBatches is thread-safe. A BatchSampler is not
// thread-safe; use one per thread. Ownership: a BatchSampler borrows the
// TokenSequence it samples from, which must outlive it.
#ifndef DEPTHBENCH_TRAINER_CORE_BATCH_SAMPLER_H_
#define DEPTHBENCH_TRAINER_CORE_BATCH_SAMPLER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "trainer_core/token_sequence.h"

namespace depthbench {

struct SamplerOptions {
  int64_t seq_len = 128;  // T
  int64_t batch = 16;     // B
  uint64_t seed = 0;
};

// Everything needed to resume a sampler exactly.
struct SamplerPosition {
  uint64_t seed = 0;
  int64_t epoch = 0;   // epochs started before the current one
  int64_t cursor = 0;  // next window index in the current epoch's order
  int64_t step = 0;    // batches produced so far

  // {"seed":S,"epoch":E,"cursor":C,"step":N}; seed as a decimal string so a
  // full 64-bit seed survives JSON readers that use doubles.
  std::string ToJson() const;
  static absl::StatusOr<SamplerPosition> FromJson(const std::string& json);
  bool operator==(const SamplerPosition& o) const {
    return seed == o.seed && epoch == o.epoch && cursor == o.cursor &&
           step == o.step;
  }
};

// B windows of T + 1 tokens: inputs are the first T, targets the last T.
struct Batch {
  int64_t batch = 0;
  int64_t seq_len = 0;
  std::vector<int32_t> tokens;  // row-major [batch, seq_len + 1]
  std::vector<int64_t> starts;  // offset of each row in its split

  int32_t input(int64_t b, int64_t t) const {
    return tokens[b * (seq_len + 1) + t];
  }
  int32_t target(int64_t b, int64_t t) const {
    return tokens[b * (seq_len + 1) + t + 1];
  }
};

// Deterministic training batches (see the file comment). Not thread-safe;
// borrows tokens.
class BatchSampler {
 public:
  // InvalidArgument when seq_len < 1, batch < 1, or tokens hold fewer than
  // seq_len + 1 ids.
  static absl::StatusOr<BatchSampler> Create(const TokenSequence* tokens,
                                             const SamplerOptions& options);

  BatchSampler(BatchSampler&&) = default;
  BatchSampler& operator=(BatchSampler&&) = default;
  BatchSampler(const BatchSampler&) = delete;
  BatchSampler& operator=(const BatchSampler&) = delete;

  // The next batch; advances the position.
  Batch Next();
  // Fills *out (reusing its storage); advances the position.
  void NextInto(Batch* out);

  SamplerPosition position() const { return position_; }
  // Continues from position. FailedPrecondition if its seed differs from
  // this sampler's; InvalidArgument for a negative field or a cursor past
  // that epoch's window count.
  absl::Status Restore(const SamplerPosition& position);

  // Windows in the given epoch (depends on that epoch's offset).
  int64_t WindowsInEpoch(int64_t epoch) const;

 private:
  BatchSampler(const TokenSequence* tokens, const SamplerOptions& options);
  // Makes order_/offset_ describe position_.epoch.
  void LoadEpoch();

  const TokenSequence* tokens_;  // not owned
  SamplerOptions options_;
  SamplerPosition position_;
  int64_t loaded_epoch_ = -1;
  int64_t offset_ = 0;
  std::vector<int64_t> order_;  // window indices of loaded_epoch_
};

// num_batches batches of B evenly spaced windows of T + 1 tokens over val
// (the first starts at 0, the last ends at val.size()); the same on every
// call. Windows overlap only when val is shorter than B * num_batches * T.
// InvalidArgument when val holds fewer than seq_len + 1 ids or a size < 1.
absl::StatusOr<std::vector<Batch>> MakeValidationBatches(
    const TokenSequence& val, int64_t seq_len, int64_t batch,
    int64_t num_batches);

}  // namespace depthbench

#endif  // DEPTHBENCH_TRAINER_CORE_BATCH_SAMPLER_H_
