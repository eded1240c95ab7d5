// Training checkpoints: one file, DIR/checkpoint.pt, a LibTorch archive with
//   model      the model's parameters and buffers
//   optimizer  AdamW state (moments, step counts) per parameter group
//   rng        the default CPU generator state
//   meta       JSON: {"step", "sampler" (data position), "config"}
// written to a temp file in the same directory and renamed over the old one,
// so a crash mid-write leaves the previous checkpoint intact.
//
// Thread safety: free functions; callers own the model and optimizer.
#ifndef DEPTHBENCH_TRAINER_CORE_CHECKPOINT_H_
#define DEPTHBENCH_TRAINER_CORE_CHECKPOINT_H_

#include <torch/torch.h>

#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "trainer_core/model/model.h"
#include "trainer_core/train_config.h"

namespace depthbench {

struct CheckpointMeta {
  int64_t step = 0;
  std::string sampler_json;
  nlohmann::json config;
};

// The model options a config describes (arch, shape, HC settings, init).
ModelOptions ModelOptionsFor(const TrainConfig& config);

// Writes `path` + ".tmp", fsyncs it, renames it over `path` and fsyncs the
// directory: readers see the previous checkpoint or this one, never a part.
absl::Status SaveTrainingCheckpoint(const std::string& path, const CheckpointMeta& meta,
                                    LanguageModelImpl& model, torch::optim::Optimizer& optimizer);

// Restores model, optimizer and RNG. FailedPrecondition when the checkpoint
// was written for a different architecture or shape than `config`.
absl::StatusOr<CheckpointMeta> LoadTrainingCheckpoint(const std::string& path,
                                                      const TrainConfig& config,
                                                      LanguageModelImpl& model,
                                                      torch::optim::Optimizer& optimizer);

// For diagnostics: rebuilds the model a checkpoint (file or run directory)
// was trained with and loads its weights.
struct LoadedModel {
  TrainConfig config;
  CheckpointMeta meta;
  LanguageModel model{nullptr};
};
absl::StatusOr<LoadedModel> LoadModelCheckpoint(const std::string& path_or_dir);

}  // namespace depthbench

#endif  // DEPTHBENCH_TRAINER_CORE_CHECKPOINT_H_
