#include "trainer_core/trainer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "trainer_core/batcher.h"
#include "trainer_core/checkpoint.h"
#include "trainer_core/data.h"
#include "trainer_core/model/model.h"
#include "trainer_core/optim.h"
#include "trainer_core/schedule.h"

namespace depthbench {

std::atomic<bool> Trainer::stop_requested_{false};

void Trainer::RequestStop() { stop_requested_.store(true); }
void Trainer::ClearStop() { stop_requested_.store(false); }
bool Trainer::StopRequested() { return stop_requested_.load(); }

double ExplodeThreshold(const TrainConfig& config) {
  if (config.explode_threshold > 0) return config.explode_threshold;
  return 2.0 * std::log(static_cast<double>(config.shape.vocab));
}

Trainer::Trainer(TrainConfig config, TrainerOptions options, EventSink sink)
    : config_(std::move(config)), options_(std::move(options)), sink_(std::move(sink)) {}

namespace {

double Evaluate(LanguageModel& model, const std::vector<Batch>& batches) {
  torch::NoGradGuard no_grad;
  model->eval();
  double sum = 0;
  for (const Batch& b : batches) {
    InputsTargets it = SplitInputsTargets(BatchToTensor(b));
    sum += model->Loss(it.inputs, it.targets).item<double>();
  }
  model->train();
  return batches.empty() ? std::numeric_limits<double>::quiet_NaN()
                         : sum / static_cast<double>(batches.size());
}

}  // namespace

absl::StatusOr<RunResult> Trainer::Run() {
  const int64_t threads = config_.threads > 0
                              ? config_.threads
                              : std::max<int64_t>(1, std::thread::hardware_concurrency());
  at::set_num_threads(static_cast<int>(threads));

  DataOptions data_options;
  data_options.data = config_.data;
  data_options.vocab = config_.shape.vocab;
  data_options.brown_dir = options_.data_dir;
  ASSIGN_OR_RETURN(TokenDataset dataset, LoadDataset(data_options));
  if (dataset.train.size() < config_.seq_len + 2)
    return absl::InvalidArgumentError(absl::StrCat("config.seq_len: ", config_.seq_len,
                                                   " is longer than the training split (", dataset.train.size(), " tokens)"));

  torch::manual_seed(config_.seed);
  ModelOptions model_options = ModelOptionsFor(config_);
  ASSIGN_OR_RETURN(LanguageModel model, BuildModel(model_options));
  model->train();
  const int64_t total_steps = ResolveTotalSteps(config_, model->ParameterCount());

  std::unique_ptr<torch::optim::AdamW> optimizer_owner =
      MakeAdamW(model->ParameterGroups(), config_.lr, config_.weight_decay);
  torch::optim::AdamW& optimizer = *optimizer_owner;

  SamplerOptions sampler_options;
  sampler_options.seq_len = config_.seq_len;
  sampler_options.batch = config_.batch;
  sampler_options.seed = config_.seed;
  ASSIGN_OR_RETURN(BatchSampler sampler, BatchSampler::Create(&dataset.train, sampler_options));
  ASSIGN_OR_RETURN(std::vector<Batch> val_batches,
                   MakeValidationBatches(dataset.val, config_.seq_len, config_.batch,
                                         config_.eval_batches));

  std::error_code ec;
  std::filesystem::create_directories(options_.out_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("out: cannot create ", options_.out_dir, ": ", ec.message()));
  const std::string ckpt_path = CheckpointPath(options_.out_dir);

  int64_t start_step = 0;
  if (options_.resume && std::filesystem::exists(ckpt_path)) {
    ASSIGN_OR_RETURN(CheckpointMeta meta, LoadTrainingCheckpoint(ckpt_path, config_, *model, optimizer));
    ASSIGN_OR_RETURN(SamplerPosition pos, SamplerPosition::FromJson(meta.sampler_json));
    RETURN_IF_ERROR(sampler.Restore(pos));
    start_step = meta.step;
  }

  const int64_t total_params = model->ParameterCount();
  auto count = CountParameters(model_options);
  nlohmann::json start = {
      {"event", "start"},
      {"config", config_.ToJson()},
      {"params", {{"total", total_params},
                  {"backbone", BackboneParams(config_.shape)},
                  {"extra", count.ok() ? count->extra : 0}}},
      {"total_steps", total_steps},
      {"threads", threads},
      {"device", "cpu"},
      {"fused_ops", false},
      {"data", {{"source", dataset.source}, {"train_tokens", dataset.train.size()},
                {"val_tokens", dataset.val.size()}, {"split_rule", dataset.split_rule}}},
      {"resumed_from_step", start_step}};
  sink_(start);

  auto save = [&](int64_t step) -> absl::Status {
    CheckpointMeta meta;
    meta.step = step;
    meta.sampler_json = sampler.position().ToJson();
    meta.config = config_.ToJson();
    RETURN_IF_ERROR(SaveTrainingCheckpoint(ckpt_path, meta, *model, optimizer));
    sink_({{"event", "checkpoint"}, {"step", step}, {"path", ckpt_path}});
    return absl::OkStatus();
  };

  RunResult result;
  result.val_loss = std::numeric_limits<double>::quiet_NaN();
  const double explode = ExplodeThreshold(config_);
  const double tokens_per_step = static_cast<double>(config_.batch * config_.seq_len);
  for (int64_t step = start_step; step < total_steps; ++step) {
    if (StopRequested()) {
      RETURN_IF_ERROR(save(step));
      result.status = RunStatus::kInterrupted;
      result.steps_done = step;
      sink_({{"event", "interrupted"}, {"step", step}});
      return result;
    }
    const auto t0 = std::chrono::steady_clock::now();
    const double lr = LearningRateAt(step, total_steps, config_.lr, config_.warmup_frac,
                                     config_.min_lr_frac);
    SetLearningRate(optimizer, lr);
    InputsTargets it = SplitInputsTargets(BatchToTensor(sampler.Next()));
    optimizer.zero_grad();
    torch::Tensor loss = model->Loss(it.inputs, it.targets);
    loss.backward();
    const double grad_norm = ClipGradNorm(model->parameters(), config_.grad_clip);
    const double loss_value = loss.item<double>();
    if (!std::isfinite(loss_value) || !std::isfinite(grad_norm) || loss_value > explode) {
      result.status = RunStatus::kDiverged;
      result.steps_done = step;
      result.final_train_loss = loss_value;
      result.reason = !std::isfinite(loss_value) ? "loss is not finite"
                      : !std::isfinite(grad_norm)
                          ? "gradient norm is not finite"
                          : absl::StrCat("loss ", loss_value, " above the explosion threshold ", explode);
      sink_({{"event", "step"}, {"step", step + 1}, {"loss", std::isfinite(loss_value) ? nlohmann::json(loss_value) : nlohmann::json(nullptr)},
             {"lr", lr}, {"grad_norm", std::isfinite(grad_norm) ? nlohmann::json(grad_norm) : nlohmann::json(nullptr)},
             {"tokens_per_s", 0.0}});
      sink_({{"event", "done"}, {"status", "diverged"}, {"step", step + 1},
             {"val_loss", nullptr}, {"reason", result.reason}});
      return result;
    }
    optimizer.step();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    result.final_train_loss = loss_value;
    const int64_t done = step + 1;
    if (done % config_.log_interval == 0 || done == total_steps) {
      sink_({{"event", "step"}, {"step", done}, {"loss", loss_value}, {"lr", lr},
             {"grad_norm", grad_norm}, {"tokens_per_s", tokens_per_step / std::max(seconds, 1e-9)}});
    }
    if (config_.eval_interval > 0 && done % config_.eval_interval == 0 && done != total_steps) {
      sink_({{"event", "eval"}, {"step", done}, {"val_loss", Evaluate(model, val_batches)}});
    }
    if (config_.checkpoint_interval > 0 && done % config_.checkpoint_interval == 0 &&
        done != total_steps) {
      RETURN_IF_ERROR(save(done));
    }
  }

  result.steps_done = total_steps;
  result.val_loss = Evaluate(model, val_batches);
  sink_({{"event", "eval"}, {"step", total_steps}, {"val_loss", result.val_loss}});
  if (!std::isfinite(result.val_loss) || result.val_loss > explode) {
    result.status = RunStatus::kDiverged;
    result.reason = "validation loss is not finite or above the explosion threshold";
    sink_({{"event", "done"}, {"status", "diverged"}, {"step", total_steps},
           {"val_loss", nullptr}, {"reason", result.reason}});
    return result;
  }
  RETURN_IF_ERROR(save(total_steps));
  sink_({{"event", "done"}, {"status", "succeeded"}, {"step", total_steps},
         {"val_loss", result.val_loss}, {"train_loss", result.final_train_loss}});
  return result;
}

}  // namespace depthbench
