#include "trainer_core/batch_sampler.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace depthbench {

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

}  // namespace depthbench
