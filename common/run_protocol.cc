#include "common/run_protocol.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"

namespace depthbench::run_protocol {

namespace {

using nlohmann::json;

constexpr char kTailMarker[] = "; stderr tail:\n";

// A number, or null when it is not finite (JSON has no NaN/Inf).
json NumOrNull(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

json Event(EventKind kind, int64_t step) {
  return json{{field::kEvent, std::string(EventName(kind))}, {field::kStep, step}};
}

// Numbers only; null / missing / non-numeric read as NaN.
double Num(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return std::nan("");
  return it->get<double>();
}

int64_t Int(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return 0;
  return it->get<int64_t>();
}

std::string Str(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return "";
  return it->get<std::string>();
}

}  // namespace

std::string_view ExitCodeMeaning(int code) {
  switch (code) {
    case kExitUsage: return "invalid input";
    case kExitDiverged: return "diverged";
    case kExitInterrupted: return "interrupted";
    default: return "";
  }
}

std::string_view EventName(EventKind kind) {
  switch (kind) {
    case EventKind::kStart: return "start";
    case EventKind::kStep: return "step";
    case EventKind::kEval: return "eval";
    case EventKind::kCheckpoint: return "checkpoint";
    case EventKind::kDone: return "done";
    case EventKind::kInterrupted: return "interrupted";
    case EventKind::kDiagnostics: return "diagnostics";
    case EventKind::kOther: return "";
  }
  return "";
}

EventKind EventKindFromName(std::string_view name) {
  for (EventKind k : {EventKind::kStart, EventKind::kStep, EventKind::kEval, EventKind::kCheckpoint,
                      EventKind::kDone, EventKind::kInterrupted, EventKind::kDiagnostics}) {
    if (EventName(k) == name) return k;
  }
  return EventKind::kOther;
}

json StartEvent(json details) {
  json out = {{field::kEvent, std::string(EventName(EventKind::kStart))}};
  out.update(details);
  return out;
}

json StepEvent(int64_t step, double loss, double lr, double grad_norm, double tokens_per_s) {
  json e = Event(EventKind::kStep, step);
  e["loss"] = NumOrNull(loss);
  e["lr"] = NumOrNull(lr);
  e["grad_norm"] = NumOrNull(grad_norm);
  e["tokens_per_s"] = NumOrNull(tokens_per_s);
  return e;
}

json EvalEvent(int64_t step, double val_loss) {
  json e = Event(EventKind::kEval, step);
  e["val_loss"] = NumOrNull(val_loss);
  return e;
}

json CheckpointEvent(int64_t step, const std::string& path, double seconds,
                     std::string_view trigger) {
  json e = Event(EventKind::kCheckpoint, step);
  e["path"] = path;
  e["seconds"] = NumOrNull(seconds);
  e["trigger"] = std::string(trigger);
  return e;
}

json InterruptedEvent(int64_t step) { return Event(EventKind::kInterrupted, step); }

json DiagnosticsEvent(const std::string& kind, json data) {
  return json{{field::kEvent, std::string(EventName(EventKind::kDiagnostics))},
              {"kind", kind},
              {"data", std::move(data)}};
}

json SucceededEvent(int64_t step, double val_loss, double train_loss) {
  json e = Event(EventKind::kDone, step);
  e["status"] = kDoneSucceeded;
  e["val_loss"] = NumOrNull(val_loss);
  e["train_loss"] = NumOrNull(train_loss);
  return e;
}

json DivergedEvent(int64_t step, const std::string& reason) {
  json e = Event(EventKind::kDone, step);
  e["status"] = kDoneDiverged;
  e["val_loss"] = nullptr;
  e["reason"] = reason;
  return e;
}

absl::StatusOr<TrainerEvent> ParseTrainerEvent(const std::string& line) {
  json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return absl::InvalidArgumentError("not a JSON object");
  auto ev = j.find(field::kEvent);
  if (ev == j.end() || !ev->is_string()) {
    return absl::InvalidArgumentError("missing string field \"event\"");
  }
  TrainerEvent e;
  e.kind = EventKindFromName(ev->get<std::string>());
  e.step = Int(j, field::kStep);
  e.time_ms = Int(j, field::kTimeMs);
  switch (e.kind) {
    case EventKind::kStart:
      e.resumed_from_step = Int(j, "resumed_from_step");
      break;
    case EventKind::kStep:
      e.loss = Num(j, "loss");
      e.lr = Num(j, "lr");
      e.grad_norm = Num(j, "grad_norm");
      e.tokens_per_s = Num(j, "tokens_per_s");
      break;
    case EventKind::kEval:
    case EventKind::kDone:
      e.val_loss = Num(j, "val_loss");
      e.has_val_loss = std::isfinite(e.val_loss);
      e.status = Str(j, "status");
      e.reason = Str(j, "reason");
      break;
    case EventKind::kCheckpoint:
      e.path = Str(j, "path");
      e.checkpoint_seconds = Num(j, "seconds");
      e.has_checkpoint_seconds = std::isfinite(e.checkpoint_seconds) && e.checkpoint_seconds >= 0;
      break;
    case EventKind::kDiagnostics: {
      e.diag_kind = Str(j, "kind");
      auto data = j.find("data");
      e.diag_data = data == j.end() ? "{}" : data->dump();
      break;
    }
    case EventKind::kInterrupted:
    case EventKind::kOther:
      break;
  }
  return e;
}

std::string FormatFailureReason(const FailureDetail& detail) {
  return absl::StrCat(detail.summary, kTailMarker, detail.stderr_tail);
}

FailureDetail ParseFailureDetail(const std::string& reason) {
  FailureDetail d;
  const size_t marker = reason.find(kTailMarker);
  d.summary = reason.substr(0, marker);
  if (marker != std::string::npos) d.stderr_tail = reason.substr(marker + sizeof(kTailMarker) - 1);
  // The trainer's error line is in the tail; without one, anywhere.
  const std::string& where = marker == std::string::npos ? reason : d.stderr_tail;
  constexpr std::string_view kError = "error: ";
  const size_t err = where.find(kError);
  if (err != std::string::npos) {
    d.has_trainer_error = true;
    const size_t from = err + kError.size();
    d.trainer_error = where.substr(from, where.find('\n', from) - from);
  }
  return d;
}

}  // namespace depthbench::run_protocol
