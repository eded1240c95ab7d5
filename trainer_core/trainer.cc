#include "trainer_core/trainer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <cmath>
#include <filesystem>
#include <limits>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/malloc_tuning.h"
#include "common/status_macros.h"
#include "cuda_ops/ops.h"
#include "trainer_core/batcher.h"
#include "trainer_core/checkpoint.h"
#include "trainer_core/data.h"
#include "trainer_core/distributed.h"
#include "trainer_core/model/model.h"
#include "trainer_core/optim.h"
#include "trainer_core/precision.h"
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

double Evaluate(LanguageModel& model, const std::vector<Batch>& batches,
                const torch::Device& device, bool bf16) {
  torch::NoGradGuard no_grad;
  Bf16AutocastGuard autocast(bf16);
  model->eval();
  double sum = 0;
  for (const Batch& b : batches) {
    InputsTargets it = SplitInputsTargets(BatchToTensor(b));
    sum += model->Loss(it.inputs.to(device), it.targets.to(device)).item<double>();
  }
  model->train();
  return batches.empty() ? std::numeric_limits<double>::quiet_NaN()
                         : sum / static_cast<double>(batches.size());
}

absl::StatusOr<torch::Device> ResolveDevice(const TrainConfig& config, int64_t rank) {
  const bool cuda = torch::cuda::is_available();
  if (config.device == "cuda" && !cuda)
    return absl::FailedPreconditionError(
        "config.device: \"cuda\" but no CUDA device is visible (or LibTorch was built without CUDA)");
  if (config.device == "cpu" || !cuda) {
    if (config.precision == "bf16")
      return absl::InvalidArgumentError(
          "config.precision: \"bf16\" needs a CUDA device (bf16 autocast is GPU-only here; use fp32 on CPU)");
    return torch::Device(torch::kCPU);
  }
  // One device per rank: LOCAL_RANK when the launcher sets it, else rank
  // modulo the visible devices (a worker isolating ranks with
  // CUDA_VISIBLE_DEVICES leaves one visible device: index 0).
  const char* local = std::getenv("LOCAL_RANK");
  const int64_t local_rank = local != nullptr ? std::atoll(local) : rank;
  const int64_t count = static_cast<int64_t>(torch::cuda::device_count());
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(local_rank % count));
}

// Moves AdamW's per-parameter state (restored from a CPU checkpoint) to the
// parameters' device.
void MoveOptimizerState(torch::optim::AdamW& optimizer, const torch::Device& device) {
  for (auto& kv : optimizer.state()) {
    auto& st = static_cast<torch::optim::AdamWParamState&>(*kv.second);
    st.exp_avg(st.exp_avg().to(device));
    st.exp_avg_sq(st.exp_avg_sq().to(device));
    if (st.max_exp_avg_sq().defined()) st.max_exp_avg_sq(st.max_exp_avg_sq().to(device));
  }
}

}  // namespace

absl::StatusOr<RunResult> Trainer::Run() {
  const int64_t threads = config_.threads > 0
                              ? config_.threads
                              : std::max<int64_t>(1, std::thread::hardware_concurrency());
  at::set_num_threads(static_cast<int>(threads));

  // Data parallelism (issue 8): config keys, else torchrun-style variables.
  DistributedOptions dist_options;
  dist_options.world_size = config_.world_size;
  dist_options.rank = config_.rank;
  dist_options.master_addr = config_.master_addr;
  dist_options.master_port = config_.master_port;
  dist_options = DistributedOptionsFromEnv(dist_options, config_.world_size_given,
                                           config_.rank_given, config_.master_addr_given,
                                           config_.master_port_given);
  if (dist_options.world_size < 1 || config_.batch % dist_options.world_size != 0)
    return absl::InvalidArgumentError(absl::StrCat("config.batch: ", config_.batch,
                                                   " is not divisible by world_size ",
                                                   dist_options.world_size));
  ASSIGN_OR_RETURN(torch::Device device, ResolveDevice(config_, dist_options.rank));
  const bool bf16 = config_.precision == "bf16";
  ASSIGN_OR_RETURN(std::unique_ptr<DataParallel> dp, DataParallel::Create(dist_options, device));
  const int64_t world = dp->world_size();
  const int64_t per_rank_batch = config_.batch / world;
  // Only rank 0 speaks: events and checkpoints. Every event carries the wall
  // clock it was logged at (time_ms): the worker stores it with the points,
  // and latency from logging to the scheduler is measured against it.
  const bool primary = dp->is_primary();
  Clock* const clock = options_.clock != nullptr ? options_.clock : RealClock::Default();
  EventSink emit = primary ? EventSink([this, clock](const nlohmann::json& event) {
                               nlohmann::json stamped = event;
                               stamped["time_ms"] = clock->NowWallMs();
                               sink_(stamped);
                             })
                           : EventSink([](const nlohmann::json&) {});

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
  // The budget counts the shape's Pre-LN parameters, not this design's.
  const TokenBudget budget = ResolveTokenBudget(config_);
  const int64_t total_steps = budget.steps;

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
  // Parameters move with set_data, so the optimizer's references stay valid.
  model->to(device);
  MoveOptimizerState(optimizer, device);
  {
    // Identical replicas: rank 0's parameters (and buffers) everywhere.
    std::vector<torch::Tensor> all = model->parameters();
    for (const auto& b : model->buffers()) all.push_back(b);
    RETURN_IF_ERROR(dp->BroadcastFromRank0(all));
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
      {"budget", {{"params", budget.params}, {"tokens", budget.tokens}, {"steps", budget.steps}}},
      {"threads", threads},
      {"device", device.str()},
      {"fused_ops", device.is_cuda() && FusedOpsAvailable()},
      {"fused_ops_detail", FusedOpsDescription()},
      {"precision", config_.precision},
      {"malloc", MallocPolicy()},
      {"world_size", world},
      {"backend", dp->backend()},
      {"data", {{"source", dataset.source}, {"train_tokens", dataset.train.size()},
                {"val_tokens", dataset.val.size()}, {"split_rule", dataset.split_rule}}},
      {"resumed_from_step", start_step}};
  emit(start);

  // Time-based checkpoints (issue 19): the period counts training time
  // since the last checkpoint (or the start), read after each step.
  const int64_t checkpoint_period_ms =
      config_.checkpoint_minutes > 0
          ? std::max<int64_t>(1, static_cast<int64_t>(config_.checkpoint_minutes * 60000.0))
          : 0;
  int64_t last_checkpoint_ms = clock->NowMonotonicMs();
  auto save = [&](int64_t step, const char* trigger) -> absl::Status {
    if (!primary) return absl::OkStatus();
    CheckpointMeta meta;
    meta.step = step;
    meta.sampler_json = sampler.position().ToJson();
    meta.config = config_.ToJson();
    const auto t0 = std::chrono::steady_clock::now();
    RETURN_IF_ERROR(SaveTrainingCheckpoint(ckpt_path, meta, *model, optimizer));
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    last_checkpoint_ms = clock->NowMonotonicMs();
    emit({{"event", "checkpoint"}, {"step", step}, {"path", ckpt_path}, {"seconds", seconds},
          {"trigger", trigger}});
    return absl::OkStatus();
  };

  RunResult result;
  result.val_loss = std::numeric_limits<double>::quiet_NaN();
  const double explode = ExplodeThreshold(config_);
  const double tokens_per_step = static_cast<double>(config_.batch * config_.seq_len);
  for (int64_t step = start_step; step < total_steps; ++step) {
    bool stop = StopRequested();
    if (world > 1) {  // every rank stops at the same step, or collectives hang
      ASSIGN_OR_RETURN(double any, dp->AllReduceMean(stop ? 1.0 : 0.0));
      stop = any > 0;
    }
    if (stop) {
      RETURN_IF_ERROR(save(step, "stop"));
      result.status = RunStatus::kInterrupted;
      result.steps_done = step;
      emit({{"event", "interrupted"}, {"step", step}});
      return result;
    }
    const auto t0 = std::chrono::steady_clock::now();
    const double lr = LearningRateAt(step, total_steps, config_.lr, config_.warmup_frac,
                                     config_.min_lr_frac);
    SetLearningRate(optimizer, lr);
    // Every rank draws the same global batch and keeps its own slice.
    InputsTargets it = SplitInputsTargets(BatchToTensor(sampler.Next()));
    if (world > 1) {
      it.inputs = it.inputs.narrow(0, dp->rank() * per_rank_batch, per_rank_batch);
      it.targets = it.targets.narrow(0, dp->rank() * per_rank_batch, per_rank_batch);
    }
    optimizer.zero_grad();
    torch::Tensor loss;
    {
      Bf16AutocastGuard autocast(bf16);
      loss = model->Loss(it.inputs.to(device), it.targets.to(device));
    }
    loss.backward();
    // Mean over ranks before clipping: the clip sees the global gradient.
    RETURN_IF_ERROR(dp->AllReduceMeanGradients(model->parameters()));
    const double grad_norm = ClipGradNorm(model->parameters(), config_.grad_clip);
    ASSIGN_OR_RETURN(const double loss_value, dp->AllReduceMean(loss.item<double>()));
    if (!std::isfinite(loss_value) || !std::isfinite(grad_norm) || loss_value > explode) {
      result.status = RunStatus::kDiverged;
      result.steps_done = step;
      result.final_train_loss = loss_value;
      result.reason = !std::isfinite(loss_value) ? "loss is not finite"
                      : !std::isfinite(grad_norm)
                          ? "gradient norm is not finite"
                          : absl::StrCat("loss ", loss_value, " above the explosion threshold ", explode);
      emit({{"event", "step"}, {"step", step + 1}, {"loss", std::isfinite(loss_value) ? nlohmann::json(loss_value) : nlohmann::json(nullptr)},
             {"lr", lr}, {"grad_norm", std::isfinite(grad_norm) ? nlohmann::json(grad_norm) : nlohmann::json(nullptr)},
             {"tokens_per_s", 0.0}});
      emit({{"event", "done"}, {"status", "diverged"}, {"step", step + 1},
             {"val_loss", nullptr}, {"reason", result.reason}});
      return result;
    }
    optimizer.step();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    result.final_train_loss = loss_value;
    const int64_t done = step + 1;
    if (done % config_.log_interval == 0 || done == total_steps) {
      emit({{"event", "step"}, {"step", done}, {"loss", loss_value}, {"lr", lr},
             {"grad_norm", grad_norm}, {"tokens_per_s", tokens_per_step / std::max(seconds, 1e-9)}});
    }
    if (config_.eval_interval > 0 && done % config_.eval_interval == 0 && done != total_steps) {
      // Every rank evaluates (same weights, same batches): no collective.
      const double val = Evaluate(model, val_batches, device, bf16);
      emit({{"event", "eval"}, {"step", done}, {"val_loss", val}});
    }
    if (done != total_steps) {
      if (config_.checkpoint_interval > 0 && done % config_.checkpoint_interval == 0) {
        RETURN_IF_ERROR(save(done, "steps"));
      } else if (checkpoint_period_ms > 0 &&
                 clock->NowMonotonicMs() - last_checkpoint_ms >= checkpoint_period_ms) {
        RETURN_IF_ERROR(save(done, "time"));
      }
    }
  }

  result.steps_done = total_steps;
  result.val_loss = Evaluate(model, val_batches, device, bf16);
  emit({{"event", "eval"}, {"step", total_steps}, {"val_loss", result.val_loss}});
  if (!std::isfinite(result.val_loss) || result.val_loss > explode) {
    result.status = RunStatus::kDiverged;
    result.reason = "validation loss is not finite or above the explosion threshold";
    emit({{"event", "done"}, {"status", "diverged"}, {"step", total_steps},
           {"val_loss", nullptr}, {"reason", result.reason}});
    return result;
  }
  RETURN_IF_ERROR(save(total_steps, "final"));
  emit({{"event", "done"}, {"status", "succeeded"}, {"step", total_steps},
         {"val_loss", result.val_loss}, {"train_loss", result.final_train_loss}});
  return result;
}

}  // namespace depthbench
