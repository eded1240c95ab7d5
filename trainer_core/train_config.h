// One training run's settings: the keys of trainer_core/README.md. Read from a
// JSON object (the worker passes the scheduler's job config as a file) with
// command-line flags layered over it; validated field by field.
//
// Thread safety: plain value type.
#ifndef DEPTHBENCH_TRAINER_CORE_TRAIN_CONFIG_H_
#define DEPTHBENCH_TRAINER_CORE_TRAIN_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "trainer_core/arch.h"
#include "trainer_core/shapes.h"

namespace depthbench {

struct TrainConfig {
  Arch arch = Arch::kPreLn;
  ModelShape shape;            // vocab filled from `vocab` or the data
  int64_t seq_len = 128;
  int64_t batch = 16;
  std::optional<int64_t> steps;
  std::optional<int64_t> tokens;
  double tokens_per_param = 20.0;
  // The parameter count the token budget is 20 (tokens_per_param) tokens per:
  // spec section 5, the Pre-LN count of the shape (TotalParams(shape)), the
  // same for every design at that shape; a design's extra parameters buy no
  // extra tokens. Unset = TotalParams(shape); the scheduler always sets it.
  std::optional<int64_t> budget_params;
  double lr = 0.0;
  uint64_t seed = 0;
  int64_t threads = 0;         // 0: all cores
  std::string data = "brown";
  int64_t eval_interval = 0;   // 0: evaluate at the end only
  int64_t eval_batches = 8;
  int64_t checkpoint_interval = 0;
  // Minutes of training between time-based checkpoints (issue 19), on top
  // of checkpoint_interval: a lost worker costs at most this much. 0: off.
  double checkpoint_minutes = 10.0;
  double warmup_frac = 0.1;
  double min_lr_frac = 0.1;
  double weight_decay = 0.1;
  double grad_clip = 1.0;
  double explode_threshold = 0.0;  // 0: 2 * ln(vocab)
  int64_t hc_streams = kDefaultHcStreams;
  bool hc_code_form = false;
  bool trunc_normal_init = false;
  int64_t log_interval = 1;

  // Where and how to compute (issue 8). device: "auto" (CUDA when visible),
  // "cpu" or "cuda"; precision: "fp32", or "bf16" (autocast of matmuls on
  // CUDA, fp32 master weights; refused on CPU).
  std::string device = "auto";
  std::string precision = "fp32";

  // Data parallelism (issue 8): world_size ranks over a c10d process group;
  // batch is the global batch (batch % world_size == 0). Unset keys fall back
  // to RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT; the *_given flags
  // record whether the config set them.
  int64_t world_size = 1;
  int64_t rank = 0;
  std::string master_addr = "127.0.0.1";
  int64_t master_port = 29500;
  bool world_size_given = false, rank_given = false, master_addr_given = false,
       master_port_given = false;

  // The keys of the README table, normalised (defaults filled in).
  nlohmann::json ToJson() const;
};

// Parses a config object. Unknown keys and wrong types are errors naming the
// key ("config.lr: expected a number"). The vocabulary defaults to 256 for
// brown and is required otherwise.
absl::StatusOr<TrainConfig> TrainConfigFromJson(const nlohmann::json& j);

// Checks ranges (positive sizes, lr > 0, fractions in [0, 1], ...) and the
// shape; the error names the field.
absl::Status ValidateTrainConfig(const TrainConfig& config);

// The token budget of a run (spec section 5), identical for every design at
// one shape: `budget_params` (default: the Pre-LN count TotalParams(shape));
// `tokens` = the config's `tokens` if given, else
// ceil(tokens_per_param * budget_params); `steps` = the config's `steps` if
// given, else ceil(tokens / (batch * seq_len)) (at least 1). Given `steps`
// win, and `tokens` is then steps * batch * seq_len, the tokens the run
// trains. The design's own parameter count plays no part.
struct TokenBudget {
  int64_t params = 0;
  int64_t tokens = 0;
  int64_t steps = 0;
};
TokenBudget ResolveTokenBudget(const TrainConfig& config);

// ResolveTokenBudget(config).steps: the run's total optimizer steps.
int64_t ResolveTotalSteps(const TrainConfig& config);

}  // namespace depthbench

#endif  // DEPTHBENCH_TRAINER_CORE_TRAIN_CONFIG_H_
