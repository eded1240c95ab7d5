// Parses the JSON-line events `depthbench-train` writes on stdout
// (trainer_core/README.md) and turns them into the metric points relayed to
// the scheduler.
//
//   step       -> points loss, lr, grad_norm, tokens_per_s at that step
//   eval       -> point val_loss
//   checkpoint -> point "checkpoint" (value = the step), so the scheduler's
//                 history shows where a retried attempt can resume, and
//                 "checkpoint_seconds" (how long the write took) when given
//
// A point's wall_ms is the event's `time_ms` (the trainer's wall clock when
// it logged the event) when present, else the time the worker read it.
//
// Thread safety: pure functions. ParseTrainerEvent never throws.
#ifndef DEPTHBENCH_WORKER_TRAINER_EVENTS_H_
#define DEPTHBENCH_WORKER_TRAINER_EVENTS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "depthbench/v1/types.pb.h"

namespace depthbench::worker {

enum class EventKind {
  kStart,
  kStep,
  kEval,
  kCheckpoint,
  kDone,
  kInterrupted,
  kDiagnostics,
  kOther,  // a well-formed event this worker does not know (ignored)
};

struct TrainerEvent {
  EventKind kind = EventKind::kOther;
  int64_t step = 0;
  double loss = 0, lr = 0, grad_norm = 0, tokens_per_s = 0;
  bool has_val_loss = false;
  double val_loss = 0;
  std::string path;         // checkpoint
  bool has_checkpoint_seconds = false;
  double checkpoint_seconds = 0;  // checkpoint: write time
  int64_t time_ms = 0;      // the trainer's wall clock at logging; 0: absent
  std::string status;       // done: "succeeded" | "diverged"
  std::string reason;       // done
  int64_t resumed_from_step = 0;  // start
  std::string diag_kind;    // diagnostics
  std::string diag_data;    // diagnostics: the data object as JSON text
};

// InvalidArgument for a line that is not a JSON object with a string
// "event" field (the worker logs and skips such lines).
absl::StatusOr<TrainerEvent> ParseTrainerEvent(const std::string& line);

// The points an event contributes (empty for start/done/...).
std::vector<depthbench::v1::MetricPoint> PointsFor(const TrainerEvent& event,
                                                   int64_t wall_ms);

}  // namespace depthbench::worker

#endif  // DEPTHBENCH_WORKER_TRAINER_EVENTS_H_
