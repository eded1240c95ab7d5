#include "worker/trainer_events.h"

#include <cmath>

#include <nlohmann/json.hpp>

namespace depthbench::worker {

namespace {

using nlohmann::json;

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

absl::StatusOr<TrainerEvent> ParseTrainerEvent(const std::string& line) {
  json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return absl::InvalidArgumentError("not a JSON object");
  auto ev = j.find("event");
  if (ev == j.end() || !ev->is_string()) {
    return absl::InvalidArgumentError("missing string field \"event\"");
  }
  const std::string name = ev->get<std::string>();
  TrainerEvent e;
  e.step = Int(j, "step");
  e.time_ms = Int(j, "time_ms");
  if (name == "start") {
    e.kind = EventKind::kStart;
    e.resumed_from_step = Int(j, "resumed_from_step");
  } else if (name == "step") {
    e.kind = EventKind::kStep;
    e.loss = Num(j, "loss");
    e.lr = Num(j, "lr");
    e.grad_norm = Num(j, "grad_norm");
    e.tokens_per_s = Num(j, "tokens_per_s");
  } else if (name == "eval") {
    e.kind = EventKind::kEval;
    e.val_loss = Num(j, "val_loss");
    e.has_val_loss = std::isfinite(e.val_loss);
  } else if (name == "checkpoint") {
    e.kind = EventKind::kCheckpoint;
    e.path = Str(j, "path");
    e.checkpoint_seconds = Num(j, "seconds");
    e.has_checkpoint_seconds = std::isfinite(e.checkpoint_seconds) && e.checkpoint_seconds >= 0;
  } else if (name == "done") {
    e.kind = EventKind::kDone;
    e.status = Str(j, "status");
    e.reason = Str(j, "reason");
    e.val_loss = Num(j, "val_loss");
    e.has_val_loss = std::isfinite(e.val_loss);
  } else if (name == "interrupted") {
    e.kind = EventKind::kInterrupted;
  } else if (name == "diagnostics") {
    e.kind = EventKind::kDiagnostics;
    e.diag_kind = Str(j, "kind");
    auto data = j.find("data");
    e.diag_data = data == j.end() ? "{}" : data->dump();
  }
  return e;
}

std::vector<depthbench::v1::MetricPoint> PointsFor(const TrainerEvent& event,
                                                   int64_t wall_ms) {
  std::vector<depthbench::v1::MetricPoint> out;
  // Non-finite values are not stored (a diverged step reports null loss);
  // the divergence itself travels in FinishJob.
  auto add = [&](const char* name, double value) {
    if (!std::isfinite(value)) return;
    depthbench::v1::MetricPoint p;
    p.set_step(event.step);
    p.set_name(name);
    p.set_value(value);
    p.set_wall_ms(event.time_ms > 0 ? event.time_ms : wall_ms);
    out.push_back(std::move(p));
  };
  switch (event.kind) {
    case EventKind::kStep:
      add("loss", event.loss);
      add("lr", event.lr);
      add("grad_norm", event.grad_norm);
      add("tokens_per_s", event.tokens_per_s);
      break;
    case EventKind::kEval:
      add("val_loss", event.val_loss);
      break;
    case EventKind::kCheckpoint:
      add("checkpoint", static_cast<double>(event.step));
      if (event.has_checkpoint_seconds) add("checkpoint_seconds", event.checkpoint_seconds);
      break;
    default:
      break;
  }
  return out;
}

}  // namespace depthbench::worker
