#include "trainer_core/trainer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <cmath>
#include <filesystem>
#include <limits>
#include <optional>
#include <utility>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/malloc_tuning.h"
#include "common/run_protocol.h"
#include "common/status_macros.h"
#include "cuda_ops/ops.h"
#include "trainer_core/batcher.h"
#include "trainer_core/checkpoint.h"
#include "trainer_core/data.h"
#include "trainer_core/distributed.h"
#include "trainer_core/micro_batch.h"
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

// What one run holds between its phases (Trainer::Run). Not movable once
// set up: the sampler points into `dataset`.
struct RunState {
  int64_t threads = 1;
  torch::Device device{torch::kCPU};
  bool bf16 = false;
  std::unique_ptr<DataParallel> dp;
  int64_t world = 1;
  int64_t per_rank_batch = 0;
  int64_t micro_batches = 1;  // CPU micro-batches per step (micro_batch.h)
  bool primary = true;  // only rank 0 speaks: events and checkpoints
  Clock* clock = nullptr;
  EventSink emit;
  TokenDataset dataset;
  ModelOptions model_options;
  LanguageModel model{nullptr};
  TokenBudget budget;
  std::unique_ptr<torch::optim::AdamW> optimizer;
  std::optional<BatchSampler> sampler;
  std::vector<Batch> val_batches;
  std::string ckpt_path;
  int64_t start_step = 0;
  int64_t last_checkpoint_ms = 0;
};

// Threads, data parallelism (config keys, else torchrun-style variables),
// the device, and the event sink (rank 0 only; every event stamped with the
// wall clock it was logged at: the worker stores it with the points, and
// latency from logging to the scheduler is measured against it).
absl::Status SetUpParallel(const TrainConfig& config, Clock* clock, const EventSink& sink,
                           RunState* run) {
  run->threads = config.threads > 0 ? config.threads
                                    : std::max<int64_t>(1, std::thread::hardware_concurrency());
  at::set_num_threads(static_cast<int>(run->threads));
  DistributedOptions dist_options;
  dist_options.world_size = config.world_size;
  dist_options.rank = config.rank;
  dist_options.master_addr = config.master_addr;
  dist_options.master_port = config.master_port;
  dist_options = DistributedOptionsFromEnv(dist_options, config.world_size_given,
                                           config.rank_given, config.master_addr_given,
                                           config.master_port_given);
  if (dist_options.world_size < 1 || config.batch % dist_options.world_size != 0)
    return absl::InvalidArgumentError(absl::StrCat("config.batch: ", config.batch,
                                                   " is not divisible by world_size ",
                                                   dist_options.world_size));
  ASSIGN_OR_RETURN(run->device, ResolveDevice(config, dist_options.rank));
  run->bf16 = config.precision == "bf16";
  ASSIGN_OR_RETURN(run->dp, DataParallel::Create(dist_options, run->device));
  run->world = run->dp->world_size();
  run->per_rank_batch = config.batch / run->world;
  run->primary = run->dp->is_primary();
  run->clock = clock;
  run->emit = run->primary ? EventSink([&sink, clock](const nlohmann::json& event) {
                               nlohmann::json stamped = event;
                               stamped[run_protocol::field::kTimeMs] = clock->NowWallMs();
                               sink(stamped);
                             })
                           : EventSink([](const nlohmann::json&) {});
  return absl::OkStatus();
}

// The data, the model (seeded), its token budget, AdamW, the sampler and
// the validation batches.
absl::Status LoadDataAndModel(const TrainConfig& config, const TrainerOptions& options,
                              RunState* run) {
  DataOptions data_options;
  data_options.data = config.data;
  data_options.vocab = config.shape.vocab;
  data_options.brown_dir = options.data_dir;
  ASSIGN_OR_RETURN(run->dataset, LoadDataset(data_options));
  if (run->dataset.train.size() < config.seq_len + 2)
    return absl::InvalidArgumentError(absl::StrCat("config.seq_len: ", config.seq_len,
                                                   " is longer than the training split (", run->dataset.train.size(), " tokens)"));
  torch::manual_seed(config.seed);
  run->model_options = ModelOptionsFor(config);
  ASSIGN_OR_RETURN(run->model, BuildModel(run->model_options));
  run->model->train();
  // The budget counts the shape's Pre-LN parameters, not this design's.
  run->budget = ResolveTokenBudget(config);
  run->optimizer = MakeAdamW(run->model->ParameterGroups(), config.lr, config.weight_decay);
  SamplerOptions sampler_options;
  sampler_options.seq_len = config.seq_len;
  sampler_options.batch = config.batch;
  sampler_options.seed = config.seed;
  ASSIGN_OR_RETURN(BatchSampler sampler, BatchSampler::Create(&run->dataset.train, sampler_options));
  run->sampler.emplace(std::move(sampler));
  ASSIGN_OR_RETURN(run->val_batches,
                   MakeValidationBatches(run->dataset.val, config.seq_len, config.batch,
                                         config.eval_batches));
  return absl::OkStatus();
}

// The output folder, a resumed checkpoint (when asked for and present), and
// identical replicas on the device.
absl::Status RestoreAndPlace(const TrainConfig& config, const TrainerOptions& options,
                             RunState* run) {
  std::error_code ec;
  std::filesystem::create_directories(options.out_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("out: cannot create ", options.out_dir, ": ", ec.message()));
  run->ckpt_path = CheckpointPath(options.out_dir);
  if (options.resume && std::filesystem::exists(run->ckpt_path)) {
    ASSIGN_OR_RETURN(CheckpointMeta meta, LoadTrainingCheckpoint(run->ckpt_path, config, *run->model, *run->optimizer));
    ASSIGN_OR_RETURN(SamplerPosition pos, SamplerPosition::FromJson(meta.sampler_json));
    RETURN_IF_ERROR(run->sampler->Restore(pos));
    run->start_step = meta.step;
  }
  // Parameters move with set_data, so the optimizer's references stay valid.
  run->model->to(run->device);
  MoveOptimizerState(*run->optimizer, run->device);
  // Identical replicas: rank 0's parameters (and buffers) everywhere.
  std::vector<torch::Tensor> all = run->model->parameters();
  for (const auto& b : run->model->buffers()) all.push_back(b);
  return run->dp->BroadcastFromRank0(all);
}

nlohmann::json StartEvent(const TrainConfig& config, RunState& run) {
  auto count = CountParameters(run.model_options);
  return run_protocol::StartEvent({
      {"config", config.ToJson()},
      {"params", {{"total", run.model->ParameterCount()},
                  {"backbone", BackboneParams(config.shape)},
                  {"extra", count.ok() ? count->extra : 0}}},
      {"total_steps", run.budget.steps},
      {"budget", {{"params", run.budget.params}, {"tokens", run.budget.tokens}, {"steps", run.budget.steps}}},
      {"threads", run.threads},
      {"micro_batches", run.micro_batches},
      {"device", run.device.str()},
      {"fused_ops", run.device.is_cuda() && FusedOpsAvailable()},
      {"fused_ops_detail", FusedOpsDescription()},
      {"precision", config.precision},
      {"malloc", MallocPolicy()},
      {"world_size", run.world},
      {"backend", run.dp->backend()},
      {"data", {{"source", run.dataset.source}, {"train_tokens", run.dataset.train.size()},
                {"val_tokens", run.dataset.val.size()}, {"split_rule", run.dataset.split_rule}}},
      {"resumed_from_step", run.start_step}});
}

// Rank 0 writes the checkpoint at `step` and emits its event.
absl::Status SaveCheckpoint(const TrainConfig& config, int64_t step, const char* trigger,
                            RunState* run) {
  if (!run->primary) return absl::OkStatus();
  CheckpointMeta meta;
  meta.step = step;
  meta.sampler_json = run->sampler->position().ToJson();
  meta.config = config.ToJson();
  const auto t0 = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(SaveTrainingCheckpoint(run->ckpt_path, meta, *run->model, *run->optimizer));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  run->last_checkpoint_ms = run->clock->NowMonotonicMs();
  run->emit(run_protocol::CheckpointEvent(step, run->ckpt_path, seconds, trigger));
  return absl::OkStatus();
}

// One optimizer step's forward and backward on this rank's slice of the
// global batch; returns (mean loss over ranks, clipped gradient norm).
absl::StatusOr<std::pair<double, double>> ForwardBackward(const TrainConfig& config, RunState* run) {
  // Every rank draws the same global batch and keeps its own slice.
  InputsTargets it = SplitInputsTargets(BatchToTensor(run->sampler->Next()));
  if (run->world > 1) {
    it.inputs = it.inputs.narrow(0, run->dp->rank() * run->per_rank_batch, run->per_rank_batch);
    it.targets = it.targets.narrow(0, run->dp->rank() * run->per_rank_batch, run->per_rank_batch);
  }
  torch::Tensor loss;
  if (run->micro_batches > 1) {
    loss = LossAndGradients(run->model, it.inputs.to(run->device), it.targets.to(run->device),
                            run->micro_batches);
  } else {
    ClearGradients(run->model->parameters());
    {
      Bf16AutocastGuard autocast(run->bf16);
      loss = run->model->Loss(it.inputs.to(run->device), it.targets.to(run->device));
    }
    loss.backward();
  }
  // Mean over ranks before clipping: the clip sees the global gradient.
  RETURN_IF_ERROR(run->dp->AllReduceMeanGradients(run->model->parameters()));
  const double grad_norm = ClipGradNorm(run->model->parameters(), config.grad_clip);
  ASSIGN_OR_RETURN(const double loss_value, run->dp->AllReduceMean(loss.item<double>()));
  return std::make_pair(loss_value, grad_norm);
}

// Why a step diverged ("" if it did not).
std::string DivergenceReason(double loss_value, double grad_norm, double explode) {
  if (!std::isfinite(loss_value)) return "loss is not finite";
  if (!std::isfinite(grad_norm)) return "gradient norm is not finite";
  if (loss_value > explode) {
    return absl::StrCat("loss ", loss_value, " above the explosion threshold ", explode);
  }
  return "";
}

// After step `done`: the step event, a periodic evaluation, and a checkpoint
// by steps or by training time (issue 19: the period counts training time
// since the last checkpoint or the start).
absl::Status AfterStep(const TrainConfig& config, int64_t done, double loss_value, double lr,
                       double grad_norm, double seconds, RunState* run) {
  const int64_t total_steps = run->budget.steps;
  const double tokens_per_step = static_cast<double>(config.batch * config.seq_len);
  if (done % config.log_interval == 0 || done == total_steps) {
    run->emit(run_protocol::StepEvent(done, loss_value, lr, grad_norm,
                                      tokens_per_step / std::max(seconds, 1e-9)));
  }
  if (config.eval_interval > 0 && done % config.eval_interval == 0 && done != total_steps) {
    // Every rank evaluates (same weights, same batches): no collective.
    const double val = Evaluate(run->model, run->val_batches, run->device, run->bf16);
    run->emit(run_protocol::EvalEvent(done, val));
  }
  if (done == total_steps) return absl::OkStatus();
  const int64_t checkpoint_period_ms =
      config.checkpoint_minutes > 0
          ? std::max<int64_t>(1, static_cast<int64_t>(config.checkpoint_minutes * 60000.0))
          : 0;
  if (config.checkpoint_interval > 0 && done % config.checkpoint_interval == 0) {
    return SaveCheckpoint(config, done, "steps", run);
  }
  if (checkpoint_period_ms > 0 &&
      run->clock->NowMonotonicMs() - run->last_checkpoint_ms >= checkpoint_period_ms) {
    return SaveCheckpoint(config, done, "time", run);
  }
  return absl::OkStatus();
}

// The final evaluation, then done (succeeded after the final checkpoint,
// or diverged).
absl::StatusOr<RunResult> FinishRun(const TrainConfig& config, double explode, RunResult result,
                                    RunState* run) {
  const int64_t total_steps = run->budget.steps;
  result.steps_done = total_steps;
  result.val_loss = Evaluate(run->model, run->val_batches, run->device, run->bf16);
  run->emit(run_protocol::EvalEvent(total_steps, result.val_loss));
  if (!std::isfinite(result.val_loss) || result.val_loss > explode) {
    result.status = RunStatus::kDiverged;
    result.reason = "validation loss is not finite or above the explosion threshold";
    run->emit(run_protocol::DivergedEvent(total_steps, result.reason));
    return result;
  }
  RETURN_IF_ERROR(SaveCheckpoint(config, total_steps, "final", run));
  run->emit(run_protocol::SucceededEvent(total_steps, result.val_loss, result.final_train_loss));
  return result;
}

}  // namespace

absl::StatusOr<RunResult> Trainer::Run() {
  RunState run;
  Clock* const clock = options_.clock != nullptr ? options_.clock : RealClock::Default();
  RETURN_IF_ERROR(SetUpParallel(config_, clock, sink_, &run));
  RETURN_IF_ERROR(LoadDataAndModel(config_, options_, &run));
  RETURN_IF_ERROR(RestoreAndPlace(config_, options_, &run));
  run.micro_batches = CpuMicroBatches(run.model, run.threads, run.per_rank_batch);
  run.emit(StartEvent(config_, run));
  run.last_checkpoint_ms = clock->NowMonotonicMs();

  RunResult result;
  result.val_loss = std::numeric_limits<double>::quiet_NaN();
  const double explode = ExplodeThreshold(config_);
  const int64_t total_steps = run.budget.steps;
  for (int64_t step = run.start_step; step < total_steps; ++step) {
    bool stop = StopRequested();
    if (run.world > 1) {  // every rank stops at the same step, or collectives hang
      ASSIGN_OR_RETURN(double any, run.dp->AllReduceMean(stop ? 1.0 : 0.0));
      stop = any > 0;
    }
    if (stop) {
      RETURN_IF_ERROR(SaveCheckpoint(config_, step, "stop", &run));
      result.status = RunStatus::kInterrupted;
      result.steps_done = step;
      run.emit(run_protocol::InterruptedEvent(step));
      return result;
    }
    const auto t0 = std::chrono::steady_clock::now();
    const double lr = LearningRateAt(step, total_steps, config_.lr, config_.warmup_frac,
                                     config_.min_lr_frac);
    SetLearningRate(*run.optimizer, lr);
    ASSIGN_OR_RETURN(const auto loss_grad, ForwardBackward(config_, &run));
    const auto [loss_value, grad_norm] = loss_grad;
    const std::string diverged = DivergenceReason(loss_value, grad_norm, explode);
    if (!diverged.empty()) {
      result.status = RunStatus::kDiverged;
      result.steps_done = step;
      result.final_train_loss = loss_value;
      result.reason = diverged;
      run.emit(run_protocol::StepEvent(step + 1, loss_value, lr, grad_norm, /*tokens_per_s=*/0.0));
      run.emit(run_protocol::DivergedEvent(step + 1, result.reason));
      return result;
    }
    run.optimizer->step();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    result.final_train_loss = loss_value;
    RETURN_IF_ERROR(AfterStep(config_, step + 1, loss_value, lr, grad_norm, seconds, &run));
  }
  return FinishRun(config_, explode, result, &run);
}

}  // namespace depthbench
