// Validates a SweepSpec and expands it into the job grid
//   architectures x shapes x lr_grid(arch) x seeds
// with one train-config JSON per job (keys of trainer_core/README.md), each
// checked with the trainer's own parser (trainer_core/train_config.h), so a
// setting the trainer would refuse fails here rather than in the job.
// Errors are InvalidArgument naming the field as `spec.<path>: ...`, e.g.
// `spec.architectures[2]: unknown architecture "hcc" (valid: ...)` or
// `spec.training.grad_clip: must be positive, got 0`.
//
// Thread safety: pure functions.
#ifndef DEPTHBENCH_SCHEDULER_SWEEP_EXPANDER_H_
#define DEPTHBENCH_SCHEDULER_SWEEP_EXPANDER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "depthbench/v1/spec.pb.h"
#include "scheduler/strategies/asha.h"
#include "trainer_core/shapes.h"

namespace depthbench::scheduler {

// Upper bound on jobs one spec may create.
inline constexpr int64_t kMaxJobsPerSweep = 100000;
// Upper bounds on any one string of a spec (names, paths, labels, map keys)
// and on the whole serialized spec: a sweep's spec and its jobs' configs are
// stored, listed and sent to workers, so they must stay small.
inline constexpr size_t kMaxSpecStringBytes = 4096;
inline constexpr size_t kMaxSpecBytes = 256 * 1024;

struct PlannedJob {
  std::string arch;
  ModelShape shape;
  double lr = 0;
  int64_t seed = 0;
  std::string config_json;
  // LR transfer: a job at a shape other than the reference, created held
  // (not leased until its group's sub-grid reaches its LR).
  bool held = false;
};

// One (arch, shape) row of the results table.
struct PlannedGroup {
  std::string arch;
  ModelShape shape;
  int64_t params = 0;  // total + the design's extra parameters
  std::vector<double> lrs;
  // The token budget of every run of the group (trainer_core/train_config.h
  // ResolveTokenBudget), identical for every design at this shape.
  int64_t budget_params = 0;  // the shape's Pre-LN count
  int64_t budget_tokens = 0;
  int64_t budget_steps = 0;
};

// What the diagnose jobs get (spec.diagnostics, defaults applied).
struct DiagnoseSettings {
  std::vector<std::string> kinds;
  int64_t num_sequences = 0;  // 0 = auto
  bool allow_small_n = false;
  std::string causal_form = "per_token";
  double fixed_lr = 0;  // 0 = the best-LR run
};

// The diagnose settings of a spec, defaults applied (not validated:
// ExpandSweep validates).
DiagnoseSettings DiagnoseSettingsFromSpec(const depthbench::v1::DiagnosticsSpec& spec);

struct RetrySettings {
  int64_t max_attempts = 3;
  int64_t initial_backoff_ms = 1000;
  double backoff_multiplier = 2.0;
  int64_t max_backoff_ms = 60000;
};

struct ExpandedSweep {
  std::vector<PlannedJob> jobs;
  std::vector<PlannedGroup> groups;
  RetrySettings retry;
  DiagnoseSettings diagnose;
  strategies::StrategySettings strategy;
  size_t reference_shape = 0;  // LR transfer: index into the sweep's shapes
};

// Retry policy with defaults applied (validated).
RetrySettings RetryFromSpec(const depthbench::v1::RetryPolicy& policy);

absl::StatusOr<ExpandedSweep> ExpandSweep(const depthbench::v1::SweepSpec& spec);

// The shapes the spec's shape source yields (validated).
absl::StatusOr<std::vector<ModelShape>> SpecShapes(
    const depthbench::v1::SweepSpec& spec);

// Train-config JSON for one point of the grid: the grid point, its token
// budget's parameter count `budget_params` (the shape's Pre-LN count,
// TotalParams(shape): the same for every design at the shape), plus every
// setting `training` sets (TrainingSettings' field names are the trainer's
// keys); unset settings are left to the trainer's defaults. Not validated
// (ExpandSweep validates).
std::string TrainConfigJson(const depthbench::v1::TrainingSettings& training,
                            const std::string& arch, const ModelShape& shape,
                            double lr, int64_t seed);

// Diagnose-config JSON: the diagnosed run's train config plus
// {"checkpoint": checkpoint_dir, "kinds": [...], "num_sequences": N (only
// when the spec fixes N; absent = auto, the trainer's default),
// "allow_small_n": bool, "causal_form": "per_token"|"ratio_of_means"} (the
// keys of trainer_core/diagnostics/run.h's diagnose config).
std::string DiagnoseConfigJson(const std::string& train_config_json,
                               const std::string& checkpoint_dir,
                               const DiagnoseSettings& settings);

}  // namespace depthbench::scheduler

#endif  // DEPTHBENCH_SCHEDULER_SWEEP_EXPANDER_H_
