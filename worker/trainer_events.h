// Turns the JSON-line events `depthbench-train` writes on stdout (parsed by
// common/run_protocol.h) into the metric points relayed to
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
// Thread safety: pure functions.
#ifndef DEPTHBENCH_WORKER_TRAINER_EVENTS_H_
#define DEPTHBENCH_WORKER_TRAINER_EVENTS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/run_protocol.h"
#include "depthbench/v1/types.pb.h"

namespace depthbench::worker {

// The events and their parser are the run protocol's (common/run_protocol.h).
using run_protocol::EventKind;
using run_protocol::ParseTrainerEvent;
using run_protocol::TrainerEvent;

// The points an event contributes (empty for start/done/...).
std::vector<depthbench::v1::MetricPoint> PointsFor(const TrainerEvent& event,
                                                   int64_t wall_ms);

}  // namespace depthbench::worker

#endif  // DEPTHBENCH_WORKER_TRAINER_EVENTS_H_
