// The run protocol between `depthbench-train` and the worker that runs it,
// defined once (issue 13): the JSON-line events the trainer writes on stdout
// (one object per line), their fields, the trainer's exit codes, and the
// failure detail the worker reports when a run fails. The trainer emits
// through the builders here, the worker parses with ParseTrainerEvent, and
// the CLI reads a failed job's detail with ParseFailureDetail.
//
// Events (every one carries "event" and "time_ms", the trainer's wall clock
// when it logged it; most carry "step"):
//
//   start        config, params, total_steps, budget, ..., resumed_from_step
//   step         loss, lr, grad_norm, tokens_per_s (null when not finite)
//   eval         val_loss
//   checkpoint   path, seconds (write time), trigger ("steps"|"time"|"stop"|"final")
//   interrupted  (the step it stopped at)
//   diagnostics  kind, data (an object)
//   done         status ("succeeded"|"diverged"), val_loss (null when diverged),
//                train_loss (succeeded) or reason (diverged)
//
// Unknown event names parse as EventKind::kOther (a newer trainer may add
// events; the worker ignores them). The prose form of this is
// trainer_core/README.md.
//
// Thread safety: pure functions and constants.
#ifndef DEPTHBENCH_COMMON_RUN_PROTOCOL_H_
#define DEPTHBENCH_COMMON_RUN_PROTOCOL_H_

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"

namespace depthbench::run_protocol {

// ---- exit codes of depthbench-train ----
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;      // any other error
inline constexpr int kExitUsage = 2;        // bad usage / invalid input
inline constexpr int kExitDiverged = 3;     // the run diverged (a result, not an error)
inline constexpr int kExitInterrupted = 4;  // stopped by SIGTERM/SIGINT after a checkpoint

// What an exit code means, for failure messages ("" for codes without a
// meaning of their own: 0, 1, others).
std::string_view ExitCodeMeaning(int code);

// The prefix of the trainer's one error line on stderr.
inline constexpr std::string_view kTrainerErrorPrefix = "depthbench-train: error: ";

// ---- events ----
enum class EventKind {
  kStart,
  kStep,
  kEval,
  kCheckpoint,
  kDone,
  kInterrupted,
  kDiagnostics,
  kOther,  // a well-formed event this reader does not know
};

// The wire name ("start", "step", ...); "" for kOther.
std::string_view EventName(EventKind kind);
EventKind EventKindFromName(std::string_view name);

// Field names shared by several events.
namespace field {
inline constexpr char kEvent[] = "event";
inline constexpr char kTimeMs[] = "time_ms";
inline constexpr char kStep[] = "step";
}  // namespace field

// The "status" of a done event.
inline constexpr char kDoneSucceeded[] = "succeeded";
inline constexpr char kDoneDiverged[] = "diverged";

// Builders: the trainer writes these (the sink adds time_ms). Non-finite
// numbers are written as null.
nlohmann::json StartEvent(nlohmann::json details);  // details gains "event": "start"
nlohmann::json StepEvent(int64_t step, double loss, double lr, double grad_norm,
                         double tokens_per_s);
nlohmann::json EvalEvent(int64_t step, double val_loss);
nlohmann::json CheckpointEvent(int64_t step, const std::string& path, double seconds,
                               std::string_view trigger);
nlohmann::json InterruptedEvent(int64_t step);
nlohmann::json DiagnosticsEvent(const std::string& kind, nlohmann::json data);
nlohmann::json SucceededEvent(int64_t step, double val_loss, double train_loss);
nlohmann::json DivergedEvent(int64_t step, const std::string& reason);

// One parsed event, as the worker reads it.
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
  std::string status;       // done: kDoneSucceeded | kDoneDiverged
  std::string reason;       // done
  int64_t resumed_from_step = 0;  // start
  std::string diag_kind;    // diagnostics
  std::string diag_data;    // diagnostics: the data object as JSON text
};

// InvalidArgument for a line that is not a JSON object with a string
// "event" field. Never throws.
absl::StatusOr<TrainerEvent> ParseTrainerEvent(const std::string& line);

// ---- failure detail ----
// Why a run failed, as the worker reports it in FinishJob's reason (and the
// scheduler keeps in the job's reason). The reason text is
//
//   <summary>; stderr tail:\n<last stderr lines>
//
// FormatFailureReason writes it and ParseFailureDetail reads it back; both
// sides use these two functions only. A reason without the marker (an older
// worker, a scheduler-made failure such as "attempts exhausted") parses as a
// summary with an empty tail.
struct FailureDetail {
  std::string summary;      // "depthbench-train exit code 2 (invalid input) at step 0"
  std::string stderr_tail;  // the trainer's last stderr lines
  // The trainer's own error message: the rest of the first line in the tail
  // (in the whole reason when there is no tail) after "error: ".
  bool has_trainer_error = false;
  std::string trainer_error;
};

std::string FormatFailureReason(const FailureDetail& detail);
FailureDetail ParseFailureDetail(const std::string& reason);

}  // namespace depthbench::run_protocol

#endif  // DEPTHBENCH_COMMON_RUN_PROTOCOL_H_
