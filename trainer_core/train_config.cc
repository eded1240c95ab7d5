#include "trainer_core/train_config.h"

#include <cmath>
#include <limits>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace depthbench {
namespace {

using nlohmann::json;

absl::Status TypeError(const std::string& key, const char* expected) {
  return absl::InvalidArgumentError(absl::StrCat("config.", key, ": expected ", expected));
}

absl::Status GetInt(const json& j, const std::string& key, int64_t* out) {
  if (!j.contains(key)) return absl::OkStatus();
  const json& v = j.at(key);
  if (v.is_number_unsigned() &&
      v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.", key, ": ", v.get<uint64_t>(), " is out of the 64-bit integer range"));
  }
  if (v.is_number_integer()) {  // signed or unsigned within range
    *out = v.get<int64_t>();
    return absl::OkStatus();
  }
  if (v.is_number_float()) {
    double d = v.get<double>();
    // 2^63 itself is out of range: the largest double below it is the limit.
    if (std::isfinite(d) && std::floor(d) == d && std::abs(d) < 9.2e18) {
      *out = static_cast<int64_t>(d);
      return absl::OkStatus();
    }
    if (std::floor(d) == d || !std::isfinite(d)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config.", key, ": ", d, " is out of the 64-bit integer range"));
    }
  }
  return TypeError(key, "an integer");
}

absl::Status GetDouble(const json& j, const std::string& key, double* out) {
  if (!j.contains(key)) return absl::OkStatus();
  if (!j.at(key).is_number()) return TypeError(key, "a number");
  *out = j.at(key).get<double>();
  return absl::OkStatus();
}

absl::Status GetString(const json& j, const std::string& key, std::string* out) {
  if (!j.contains(key)) return absl::OkStatus();
  if (!j.at(key).is_string()) return TypeError(key, "a string");
  *out = j.at(key).get<std::string>();
  return absl::OkStatus();
}

const std::set<std::string>& KnownKeys() {
  static const auto* keys = new std::set<std::string>{
      "arch", "layers", "d_model", "d_ff", "heads", "kv_heads", "vocab",
      "seq_len", "batch", "steps", "tokens", "tokens_per_param", "budget_params",
      "lr", "seed",
      "threads", "data", "eval_interval", "eval_batches",
      "checkpoint_interval", "checkpoint_minutes", "warmup_frac", "min_lr_frac", "weight_decay",
      "grad_clip", "explode_threshold", "hc_streams", "hc_form", "init",
      "log_interval", "device", "precision", "world_size", "rank", "master_addr",
      "master_port"};
  return *keys;
}

}  // namespace

namespace {

// arch, layers, d_model, d_ff, heads, kv_heads, data, vocab.
absl::Status ReadModel(const json& j, TrainConfig* c) {
  if (!j.contains("arch")) return absl::InvalidArgumentError("config.arch: required");
  std::string arch_name;
  RETURN_IF_ERROR(GetString(j, "arch", &arch_name));
  auto arch = ParseArch(arch_name);
  if (!arch.ok())
    return absl::InvalidArgumentError(absl::StrCat("config.arch: ", arch.status().message()));
  c->arch = *arch;
  for (const char* key : {"layers", "d_model", "lr"}) {
    if (!j.contains(key)) return absl::InvalidArgumentError(absl::StrCat("config.", key, ": required"));
  }
  RETURN_IF_ERROR(GetInt(j, "layers", &c->shape.layers));
  RETURN_IF_ERROR(GetInt(j, "d_model", &c->shape.d_model));
  c->shape.d_ff = FfnWidth(c->shape.d_model, FfnRule::kSwiGlu83);
  RETURN_IF_ERROR(GetInt(j, "d_ff", &c->shape.d_ff));
  c->shape.heads = 16;
  RETURN_IF_ERROR(GetInt(j, "heads", &c->shape.heads));
  c->shape.kv_heads = c->shape.heads;
  RETURN_IF_ERROR(GetInt(j, "kv_heads", &c->shape.kv_heads));
  RETURN_IF_ERROR(GetString(j, "data", &c->data));
  c->shape.vocab = 0;
  RETURN_IF_ERROR(GetInt(j, "vocab", &c->shape.vocab));
  if (c->shape.vocab == 0) {
    if (c->data != "brown")
      return absl::InvalidArgumentError("config.vocab: required for user data (the tokenizer's vocabulary size)");
    c->shape.vocab = 256;
  }
  return absl::OkStatus();
}

// An optional integer key into an optional field.
absl::Status GetOptionalInt(const json& j, const char* key, std::optional<int64_t>* out) {
  if (!j.contains(key)) return absl::OkStatus();
  int64_t v = 0;
  RETURN_IF_ERROR(GetInt(j, key, &v));
  *out = v;
  return absl::OkStatus();
}

// seq_len, batch, the token budget, lr, seed, threads, evaluation,
// checkpoints and the optimizer's settings.
absl::Status ReadTraining(const json& j, TrainConfig* c) {
  RETURN_IF_ERROR(GetInt(j, "seq_len", &c->seq_len));
  RETURN_IF_ERROR(GetInt(j, "batch", &c->batch));
  RETURN_IF_ERROR(GetOptionalInt(j, "steps", &c->steps));
  RETURN_IF_ERROR(GetOptionalInt(j, "tokens", &c->tokens));
  RETURN_IF_ERROR(GetDouble(j, "tokens_per_param", &c->tokens_per_param));
  RETURN_IF_ERROR(GetOptionalInt(j, "budget_params", &c->budget_params));
  RETURN_IF_ERROR(GetDouble(j, "lr", &c->lr));
  int64_t seed = 0;
  RETURN_IF_ERROR(GetInt(j, "seed", &seed));
  if (seed < 0) return absl::InvalidArgumentError("config.seed: must be >= 0");
  c->seed = static_cast<uint64_t>(seed);
  RETURN_IF_ERROR(GetInt(j, "threads", &c->threads));
  RETURN_IF_ERROR(GetInt(j, "eval_interval", &c->eval_interval));
  RETURN_IF_ERROR(GetInt(j, "eval_batches", &c->eval_batches));
  RETURN_IF_ERROR(GetInt(j, "checkpoint_interval", &c->checkpoint_interval));
  RETURN_IF_ERROR(GetDouble(j, "checkpoint_minutes", &c->checkpoint_minutes));
  RETURN_IF_ERROR(GetDouble(j, "warmup_frac", &c->warmup_frac));
  RETURN_IF_ERROR(GetDouble(j, "min_lr_frac", &c->min_lr_frac));
  RETURN_IF_ERROR(GetDouble(j, "weight_decay", &c->weight_decay));
  RETURN_IF_ERROR(GetDouble(j, "grad_clip", &c->grad_clip));
  return GetDouble(j, "explode_threshold", &c->explode_threshold);
}

// hc_streams, hc_form, init, log_interval, device, precision and the
// data-parallel keys.
absl::Status ReadRuntime(const json& j, TrainConfig* c) {
  RETURN_IF_ERROR(GetInt(j, "hc_streams", &c->hc_streams));
  std::string hc_form = "paper";
  RETURN_IF_ERROR(GetString(j, "hc_form", &hc_form));
  if (hc_form != "paper" && hc_form != "code")
    return absl::InvalidArgumentError(absl::StrCat("config.hc_form: expected \"paper\" or \"code\", got \"", hc_form, "\""));
  c->hc_code_form = hc_form == "code";
  std::string init = "normal";
  RETURN_IF_ERROR(GetString(j, "init", &init));
  if (init != "normal" && init != "trunc_normal")
    return absl::InvalidArgumentError(absl::StrCat("config.init: expected \"normal\" or \"trunc_normal\", got \"", init, "\""));
  c->trunc_normal_init = init == "trunc_normal";
  RETURN_IF_ERROR(GetInt(j, "log_interval", &c->log_interval));
  RETURN_IF_ERROR(GetString(j, "device", &c->device));
  RETURN_IF_ERROR(GetString(j, "precision", &c->precision));
  c->world_size_given = j.contains("world_size");
  c->rank_given = j.contains("rank");
  c->master_addr_given = j.contains("master_addr");
  c->master_port_given = j.contains("master_port");
  RETURN_IF_ERROR(GetInt(j, "world_size", &c->world_size));
  RETURN_IF_ERROR(GetInt(j, "rank", &c->rank));
  RETURN_IF_ERROR(GetString(j, "master_addr", &c->master_addr));
  return GetInt(j, "master_port", &c->master_port);
}

}  // namespace

absl::StatusOr<TrainConfig> TrainConfigFromJson(const json& j) {
  if (!j.is_object()) return absl::InvalidArgumentError("config: expected a JSON object");
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!KnownKeys().count(it.key()))
      return absl::InvalidArgumentError(absl::StrCat("config.", it.key(), ": unknown key"));
  }
  TrainConfig c;
  RETURN_IF_ERROR(ReadModel(j, &c));
  RETURN_IF_ERROR(ReadTraining(j, &c));
  RETURN_IF_ERROR(ReadRuntime(j, &c));
  RETURN_IF_ERROR(ValidateTrainConfig(c));
  return c;
}

absl::Status ValidateTrainConfig(const TrainConfig& c) {
  auto positive = [](const char* key, double v) -> absl::Status {
    if (!(v > 0)) return absl::InvalidArgumentError(absl::StrCat("config.", key, ": must be positive, got ", v));
    return absl::OkStatus();
  };
  auto fraction = [](const char* key, double v) -> absl::Status {
    if (!(v >= 0 && v <= 1)) return absl::InvalidArgumentError(absl::StrCat("config.", key, ": must be in [0, 1], got ", v));
    return absl::OkStatus();
  };
  auto non_negative = [](const char* key, double v) -> absl::Status {
    if (!(v >= 0)) return absl::InvalidArgumentError(absl::StrCat("config.", key, ": must be >= 0, got ", v));
    return absl::OkStatus();
  };
  // Upper bounds: far above any real run, low enough that products such as
  // batch * seq_len and step counts cannot overflow, and a value that
  // overflowed to infinity in a spec is refused here rather than stored (as
  // JSON null) for every job to fail on.
  auto at_most = [](const char* key, double v, double max) -> absl::Status {
    if (!(v <= max)) return absl::InvalidArgumentError(absl::StrCat("config.", key, ": must be at most ", max, ", got ", v));
    return absl::OkStatus();
  };
  constexpr double kMaxSize = 1 << 20;   // seq_len, batch, eval_batches
  constexpr double kMaxCount = 1e12;     // steps and intervals
  RETURN_IF_ERROR(at_most("seq_len", static_cast<double>(c.seq_len), kMaxSize));
  RETURN_IF_ERROR(at_most("batch", static_cast<double>(c.batch), kMaxSize));
  RETURN_IF_ERROR(at_most("eval_batches", static_cast<double>(c.eval_batches), kMaxSize));
  if (c.steps) RETURN_IF_ERROR(at_most("steps", static_cast<double>(*c.steps), kMaxCount));
  if (c.tokens) RETURN_IF_ERROR(at_most("tokens", static_cast<double>(*c.tokens), 1e18));
  RETURN_IF_ERROR(at_most("tokens_per_param", c.tokens_per_param, 1e6));
  RETURN_IF_ERROR(at_most("lr", c.lr, 1e3));
  RETURN_IF_ERROR(at_most("threads", static_cast<double>(c.threads), 4096));
  RETURN_IF_ERROR(at_most("eval_interval", static_cast<double>(c.eval_interval), kMaxCount));
  RETURN_IF_ERROR(at_most("checkpoint_interval", static_cast<double>(c.checkpoint_interval), kMaxCount));
  RETURN_IF_ERROR(at_most("log_interval", static_cast<double>(c.log_interval), kMaxCount));
  RETURN_IF_ERROR(at_most("weight_decay", c.weight_decay, 1e6));
  RETURN_IF_ERROR(at_most("grad_clip", c.grad_clip, 1e30));
  RETURN_IF_ERROR(at_most("explode_threshold", c.explode_threshold, 1e30));
  RETURN_IF_ERROR(at_most("hc_streams", static_cast<double>(c.hc_streams), 1024));
  RETURN_IF_ERROR(at_most("world_size", static_cast<double>(c.world_size), 1 << 16));
  absl::Status shape = ValidateShape(c.shape);
  if (!shape.ok()) return absl::InvalidArgumentError(absl::StrCat("config.", shape.message()));
  RETURN_IF_ERROR(positive("seq_len", static_cast<double>(c.seq_len)));
  RETURN_IF_ERROR(positive("batch", static_cast<double>(c.batch)));
  if (c.steps) RETURN_IF_ERROR(positive("steps", static_cast<double>(*c.steps)));
  if (c.tokens) RETURN_IF_ERROR(positive("tokens", static_cast<double>(*c.tokens)));
  RETURN_IF_ERROR(positive("tokens_per_param", c.tokens_per_param));
  if (c.budget_params) RETURN_IF_ERROR(positive("budget_params", static_cast<double>(*c.budget_params)));
  RETURN_IF_ERROR(positive("lr", c.lr));
  RETURN_IF_ERROR(non_negative("threads", static_cast<double>(c.threads)));
  RETURN_IF_ERROR(non_negative("eval_interval", static_cast<double>(c.eval_interval)));
  RETURN_IF_ERROR(positive("eval_batches", static_cast<double>(c.eval_batches)));
  RETURN_IF_ERROR(non_negative("checkpoint_interval", static_cast<double>(c.checkpoint_interval)));
  RETURN_IF_ERROR(non_negative("checkpoint_minutes", c.checkpoint_minutes));
  RETURN_IF_ERROR(fraction("warmup_frac", c.warmup_frac));
  RETURN_IF_ERROR(fraction("min_lr_frac", c.min_lr_frac));
  RETURN_IF_ERROR(non_negative("weight_decay", c.weight_decay));
  RETURN_IF_ERROR(positive("grad_clip", c.grad_clip));
  RETURN_IF_ERROR(non_negative("explode_threshold", c.explode_threshold));
  RETURN_IF_ERROR(positive("hc_streams", static_cast<double>(c.hc_streams)));
  RETURN_IF_ERROR(positive("log_interval", static_cast<double>(c.log_interval)));
  if (c.data.empty()) return absl::InvalidArgumentError("config.data: must not be empty");
  if (c.device != "auto" && c.device != "cpu" && c.device != "cuda")
    return absl::InvalidArgumentError(absl::StrCat("config.device: expected \"auto\", \"cpu\" or \"cuda\", got \"", c.device, "\""));
  if (c.precision != "fp32" && c.precision != "bf16")
    return absl::InvalidArgumentError(absl::StrCat("config.precision: expected \"fp32\" or \"bf16\", got \"", c.precision, "\""));
  RETURN_IF_ERROR(positive("world_size", static_cast<double>(c.world_size)));
  if (c.rank < 0 || c.rank >= c.world_size)
    return absl::InvalidArgumentError(absl::StrCat("config.rank: ", c.rank, " is outside [0, world_size = ", c.world_size, ")"));
  if (c.batch % c.world_size != 0)
    return absl::InvalidArgumentError(absl::StrCat("config.batch: ", c.batch, " is not divisible by world_size ", c.world_size, " (per-rank batch = batch / world_size)"));
  if (c.master_port <= 0 || c.master_port > 65535)
    return absl::InvalidArgumentError(absl::StrCat("config.master_port: ", c.master_port, " is not a TCP port"));
  return absl::OkStatus();
}

TokenBudget ResolveTokenBudget(const TrainConfig& c) {
  TokenBudget b;
  b.params = c.budget_params ? *c.budget_params : TotalParams(c.shape);
  b.tokens = c.tokens ? *c.tokens
                      : static_cast<int64_t>(std::ceil(c.tokens_per_param * static_cast<double>(b.params)));
  const double per_step = static_cast<double>(c.batch * c.seq_len);
  b.steps = c.steps ? *c.steps
                    : std::max<int64_t>(1, static_cast<int64_t>(std::ceil(static_cast<double>(b.tokens) / per_step)));
  // Fixed steps override the token count, so the budget reported is what
  // the run trains (a demo's 200 steps are not a 20-tokens-per-parameter run).
  if (c.steps) b.tokens = *c.steps * c.batch * c.seq_len;
  return b;
}

int64_t ResolveTotalSteps(const TrainConfig& c) { return ResolveTokenBudget(c).steps; }

nlohmann::json TrainConfig::ToJson() const {
  json j;
  j["arch"] = std::string(ArchName(arch));
  j["layers"] = shape.layers;
  j["d_model"] = shape.d_model;
  j["d_ff"] = shape.d_ff;
  j["heads"] = shape.heads;
  j["kv_heads"] = shape.kv_heads;
  j["vocab"] = shape.vocab;
  j["seq_len"] = seq_len;
  j["batch"] = batch;
  if (steps) j["steps"] = *steps;
  if (tokens) j["tokens"] = *tokens;
  j["tokens_per_param"] = tokens_per_param;
  if (budget_params) j["budget_params"] = *budget_params;
  j["lr"] = lr;
  j["seed"] = seed;
  j["threads"] = threads;
  j["data"] = data;
  j["eval_interval"] = eval_interval;
  j["eval_batches"] = eval_batches;
  j["checkpoint_interval"] = checkpoint_interval;
  j["checkpoint_minutes"] = checkpoint_minutes;
  j["warmup_frac"] = warmup_frac;
  j["min_lr_frac"] = min_lr_frac;
  j["weight_decay"] = weight_decay;
  j["grad_clip"] = grad_clip;
  j["explode_threshold"] = explode_threshold;
  j["hc_streams"] = hc_streams;
  j["hc_form"] = hc_code_form ? "code" : "paper";
  j["init"] = trunc_normal_init ? "trunc_normal" : "normal";
  j["log_interval"] = log_interval;
  j["device"] = device;
  j["precision"] = precision;
  j["world_size"] = world_size;
  return j;
}

}  // namespace depthbench
