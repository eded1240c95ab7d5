#include "scheduler/sweep_expander.h"

#include "scheduler/strategies/asha.h"

#include <cmath>
#include <set>
#include <vector>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "trainer_core/arch.h"
#include "trainer_core/train_config.h"

namespace depthbench::scheduler {
namespace {

using depthbench::v1::SweepSpec;
using depthbench::v1::TrainingSettings;

absl::Status Field(const std::string& path, const std::string& message) {
  return absl::InvalidArgumentError(absl::StrCat("spec.", path, ": ", message));
}

// Re-prefixes an error from trainer_core (whose messages start with the field
// name, e.g. "layers[2]: ...") with the spec path of the object it describes.
absl::Status Prefixed(const std::string& path, const absl::Status& status) {
  return absl::InvalidArgumentError(
      absl::StrCat("spec.", path, ".", std::string(status.message())));
}

// Maps the trainer's error for a job config ("config.<key>: ...") to the
// spec: "spec.training.<key>: ..." for a training setting, else the message
// with the grid point it came from.
absl::Status TrainerRefused(const absl::Status& status, const std::string& arch,
                            const ModelShape& shape, double lr, int64_t seed) {
  const std::string message(status.message());
  const std::string prefix = "config.";
  if (message.compare(0, prefix.size(), prefix) == 0) {
    std::string rest = message.substr(prefix.size());
    std::string key = rest.substr(0, rest.find_first_of(":.["));
    if (TrainingSettings::descriptor()->FindFieldByName(key) != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("spec.training.", rest));
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "spec: the trainer refuses the config of ", arch, " ", shape.layers, "x",
      shape.d_model, " lr ", lr, " seed ", seed, ": ", message));
}

absl::Status BoundedString(const std::string& value, const std::string& path) {
  if (value.size() > kMaxSpecStringBytes) {
    return Field(path, absl::StrCat("must be at most ", kMaxSpecStringBytes,
                                    " bytes, got ", value.size()));
  }
  return absl::OkStatus();
}

// Checks every string set anywhere in `message` (repeated fields and map
// keys/values included) against kMaxSpecStringBytes; `path` is relative to
// `spec.` ("" for the root).
absl::Status BoundStrings(const google::protobuf::Message& message, const std::string& path) {
  using google::protobuf::FieldDescriptor;
  const google::protobuf::Reflection* reflection = message.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  reflection->ListFields(message, &fields);
  for (const FieldDescriptor* field : fields) {
    std::string fpath = path.empty() ? field->name() : absl::StrCat(path, ".", field->name());
    if (field->is_map()) {
      const FieldDescriptor* key_field = field->message_type()->map_key();
      const FieldDescriptor* value_field = field->message_type()->map_value();
      for (int i = 0; i < reflection->FieldSize(message, field); ++i) {
        const google::protobuf::Message& entry = reflection->GetRepeatedMessage(message, field, i);
        const google::protobuf::Reflection* er = entry.GetReflection();
        std::string key = key_field->cpp_type() == FieldDescriptor::CPPTYPE_STRING
                              ? er->GetString(entry, key_field)
                              : "";
        if (key.size() > kMaxSpecStringBytes) {
          return Field(fpath, absl::StrCat("a key must be at most ", kMaxSpecStringBytes,
                                           " bytes, got ", key.size()));
        }
        std::string epath = absl::StrCat(fpath, "[\"", key, "\"]");
        if (value_field->cpp_type() == FieldDescriptor::CPPTYPE_STRING) {
          RETURN_IF_ERROR(BoundedString(er->GetString(entry, value_field), epath));
        } else if (value_field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
          RETURN_IF_ERROR(BoundStrings(er->GetMessage(entry, value_field), epath));
        }
      }
    } else if (field->is_repeated()) {
      for (int i = 0; i < reflection->FieldSize(message, field); ++i) {
        std::string ipath = absl::StrCat(fpath, "[", i, "]");
        if (field->cpp_type() == FieldDescriptor::CPPTYPE_STRING) {
          RETURN_IF_ERROR(BoundedString(reflection->GetRepeatedString(message, field, i), ipath));
        } else if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
          RETURN_IF_ERROR(BoundStrings(reflection->GetRepeatedMessage(message, field, i), ipath));
        }
      }
    } else if (field->cpp_type() == FieldDescriptor::CPPTYPE_STRING) {
      RETURN_IF_ERROR(BoundedString(reflection->GetString(message, field), fpath));
    } else if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      RETURN_IF_ERROR(BoundStrings(reflection->GetMessage(message, field), fpath));
    }
  }
  return absl::OkStatus();
}

bool ValidName(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' &&
        c != '.') {
      return false;
    }
  }
  return name != "." && name != "..";
}

template <typename T>
absl::Status Positive(bool has, T value, const std::string& path) {
  if (has && !(value > 0)) return Field(path, absl::StrCat("must be positive, got ", value));
  return absl::OkStatus();
}
template <typename T>
absl::Status NonNegative(bool has, T value, const std::string& path) {
  if (has && !(value >= 0)) return Field(path, absl::StrCat("must be >= 0, got ", value));
  return absl::OkStatus();
}

absl::Status ValidateTraining(const TrainingSettings& t) {
  if (t.has_data() && t.data().empty()) return Field("training.data", "must not be empty");
  RETURN_IF_ERROR(Positive(t.has_seq_len(), t.seq_len(), "training.seq_len"));
  RETURN_IF_ERROR(Positive(t.has_batch(), t.batch(), "training.batch"));
  RETURN_IF_ERROR(Positive(t.has_tokens_per_param(), t.tokens_per_param(),
                           "training.tokens_per_param"));
  RETURN_IF_ERROR(Positive(t.has_steps(), t.steps(), "training.steps"));
  RETURN_IF_ERROR(Positive(t.has_tokens(), t.tokens(), "training.tokens"));
  RETURN_IF_ERROR(NonNegative(t.has_eval_interval(), t.eval_interval(), "training.eval_interval"));
  RETURN_IF_ERROR(Positive(t.has_eval_batches(), t.eval_batches(), "training.eval_batches"));
  RETURN_IF_ERROR(NonNegative(t.has_checkpoint_interval(), t.checkpoint_interval(),
                              "training.checkpoint_interval"));
  RETURN_IF_ERROR(NonNegative(t.has_checkpoint_minutes(), t.checkpoint_minutes(),
                              "training.checkpoint_minutes"));
  RETURN_IF_ERROR(Positive(t.has_threads(), t.threads(), "training.threads"));
  if (t.has_warmup_frac() && !(t.warmup_frac() >= 0 && t.warmup_frac() < 1)) {
    return Field("training.warmup_frac", absl::StrCat("must be in [0, 1), got ", t.warmup_frac()));
  }
  if (t.has_min_lr_frac() && !(t.min_lr_frac() >= 0 && t.min_lr_frac() <= 1)) {
    return Field("training.min_lr_frac", absl::StrCat("must be in [0, 1], got ", t.min_lr_frac()));
  }
  RETURN_IF_ERROR(NonNegative(t.has_weight_decay(), t.weight_decay(), "training.weight_decay"));
  RETURN_IF_ERROR(NonNegative(t.has_grad_clip(), t.grad_clip(), "training.grad_clip"));
  RETURN_IF_ERROR(Positive(t.has_explode_threshold(), t.explode_threshold(),
                           "training.explode_threshold"));
  RETURN_IF_ERROR(Positive(t.has_hc_streams(), t.hc_streams(), "training.hc_streams"));
  if (t.has_hc_form() && t.hc_form() != "paper" && t.hc_form() != "code") {
    return Field("training.hc_form",
                 absl::StrCat("must be \"paper\" or \"code\", got \"", t.hc_form(), "\""));
  }
  RETURN_IF_ERROR(Positive(t.has_log_interval(), t.log_interval(), "training.log_interval"));
  return absl::OkStatus();
}

// spec.diagnostics beyond the kinds: the D_eff sample size against every
// shape's width, the causal form, and a fixed LR that every architecture's
// grid holds exactly.
absl::Status ValidateDiagnostics(const SweepSpec& spec, const std::vector<ModelShape>& shapes) {
  const auto& d = spec.diagnostics();
  if (d.num_sequences() < 0) {
    return Field("diagnostics.num_sequences",
                 absl::StrCat("must be >= 0 (0 = auto), got ", d.num_sequences()));
  }
  if (d.num_sequences() > 0 && !d.allow_small_n()) {
    for (const ModelShape& shape : shapes) {
      if (d.num_sequences() < shape.d_model) {
        return Field("diagnostics.num_sequences", absl::StrCat(
            d.num_sequences(), " sequences is below d_model ", shape.d_model, " of shape ",
            shape.layers, "x", shape.d_model, ": linear CKA of so few pooled states is near 1 "
            "for any model, so D_eff would mean nothing; use 0 (auto, several times d_model), "
            "at least ", shape.d_model, ", or set diagnostics.allow_small_n"));
      }
    }
  }
  if (!d.causal_form().empty() && d.causal_form() != "per_token" &&
      d.causal_form() != "ratio_of_means") {
    return Field("diagnostics.causal_form", absl::StrCat(
        "must be \"per_token\" or \"ratio_of_means\", got \"", d.causal_form(), "\""));
  }
  if (!std::isfinite(d.fixed_lr()) || d.fixed_lr() < 0) {
    return Field("diagnostics.fixed_lr", absl::StrCat(
        "must be 0 (diagnose the best-LR run) or a learning rate of the grid, got ", d.fixed_lr()));
  }
  if (d.fixed_lr() > 0) {
    for (const std::string& arch_name : spec.architectures()) {
      std::vector<double> lrs;
      auto grid = spec.lr_grids().find(arch_name);
      if (grid != spec.lr_grids().end()) {
        lrs.assign(grid->second.lrs().begin(), grid->second.lrs().end());
      } else {
        absl::StatusOr<Arch> arch = ParseArch(arch_name);
        if (arch.ok()) lrs = DefaultLrGrid(*arch);
      }
      bool found = false;
      for (double lr : lrs) found = found || lr == d.fixed_lr();
      if (!found) {
        std::string listed;
        for (double lr : lrs) absl::StrAppend(&listed, listed.empty() ? "" : ", ", lr);
        return Field("diagnostics.fixed_lr", absl::StrCat(
            d.fixed_lr(), " is not in the LR grid of ", arch_name, " (", listed,
            "): the diagnosed run must be one the sweep trains"));
      }
    }
  }
  return absl::OkStatus();
}

nlohmann::json TrainConfigObject(const TrainingSettings& t, const std::string& arch,
                                 const ModelShape& shape, double lr, int64_t seed) {
  nlohmann::json j;
  j["arch"] = arch;
  // Spec section 5: the budget is 20 tokens per Pre-LN parameter of the
  // shape for every design; written out so the job config shows it.
  j["budget_params"] = TotalParams(shape);
  j["layers"] = shape.layers;
  j["d_model"] = shape.d_model;
  j["d_ff"] = shape.d_ff;
  j["heads"] = shape.heads;
  j["kv_heads"] = shape.kv_heads;
  j["vocab"] = shape.vocab;
  j["lr"] = lr;
  j["seed"] = seed;
  // Every setting the spec sets, under its field name: TrainingSettings
  // names its fields after the trainer's config keys, and
  // TrainConfigFromJson (run on every job by ExpandSweep) refuses any key it
  // does not know. Unset settings stay unset: the trainer's defaults apply.
  const google::protobuf::Reflection* reflection = t.GetReflection();
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  reflection->ListFields(t, &fields);
  for (const google::protobuf::FieldDescriptor* field : fields) {
    switch (field->cpp_type()) {
      case google::protobuf::FieldDescriptor::CPPTYPE_INT64:
        j[field->name()] = reflection->GetInt64(t, field);
        break;
      case google::protobuf::FieldDescriptor::CPPTYPE_DOUBLE:
        j[field->name()] = reflection->GetDouble(t, field);
        break;
      case google::protobuf::FieldDescriptor::CPPTYPE_STRING:
        j[field->name()] = reflection->GetString(t, field);
        break;
      default:  // TrainingSettings holds only the types above
        j[field->name()] = nullptr;  // and TrainConfigFromJson refuses this
        break;
    }
  }
  return j;
}

}  // namespace

RetrySettings RetryFromSpec(const depthbench::v1::RetryPolicy& p) {
  RetrySettings r;
  if (p.max_attempts() > 0) r.max_attempts = p.max_attempts();
  if (p.initial_backoff_ms() > 0) r.initial_backoff_ms = p.initial_backoff_ms();
  if (p.backoff_multiplier() > 0) r.backoff_multiplier = p.backoff_multiplier();
  if (p.max_backoff_ms() > 0) r.max_backoff_ms = p.max_backoff_ms();
  return r;
}

absl::StatusOr<std::vector<ModelShape>> SpecShapes(const SweepSpec& spec) {
  const auto& s = spec.shapes();
  int sources = (!s.suite().empty()) + s.has_solver() + (s.explicit_shapes_size() > 0);
  if (sources != 1) {
    return Field("shapes", "exactly one of suite, solver or explicit_shapes is required");
  }
  std::vector<ModelShape> shapes;
  if (!s.suite().empty() || s.has_solver()) {
    SuiteDefinition suite;
    std::string path;
    if (!s.suite().empty()) {
      path = "shapes.suite";
      absl::StatusOr<SuiteDefinition> named = NamedSuite(s.suite());
      if (!named.ok()) return Field(path, std::string(named.status().message()));
      suite = *named;
    } else {
      path = "shapes.solver";
      const auto& v = s.solver();
      if (v.ref_layers() <= 0) return Field(path + ".ref_layers", absl::StrCat("must be positive, got ", v.ref_layers()));
      if (v.ref_d_model() <= 0) return Field(path + ".ref_d_model", absl::StrCat("must be positive, got ", v.ref_d_model()));
      if (v.layers_size() == 0) return Field(path + ".layers", "at least one depth is required");
      if (!v.match().empty() && v.match() != "total" && v.match() != "backbone") {
        return Field(path + ".match", absl::StrCat("must be \"total\" or \"backbone\", got \"", v.match(), "\""));
      }
      RETURN_IF_ERROR(NonNegative(true, v.vocab(), path + ".vocab"));
      RETURN_IF_ERROR(NonNegative(true, v.heads(), path + ".heads"));
      RETURN_IF_ERROR(NonNegative(true, v.kv_heads(), path + ".kv_heads"));
      suite.name = "custom";
      suite.ref_layers = v.ref_layers();
      suite.ref_d_model = v.ref_d_model();
      suite.layers.assign(v.layers().begin(), v.layers().end());
      suite.match = v.match() == "backbone" ? MatchBy::kBackbone : MatchBy::kTotal;
      suite.vocab = v.vocab() > 0 ? v.vocab() : 256;
      suite.heads = v.heads() > 0 ? v.heads() : 16;
      suite.kv_heads = v.kv_heads() > 0 ? v.kv_heads() : suite.heads;
    }
    absl::StatusOr<std::vector<ShapeRow>> rows = SolveSuite(suite);
    if (!rows.ok()) return Prefixed(path, rows.status());
    for (const ShapeRow& row : *rows) shapes.push_back(row.shape);
  } else {
    std::set<std::pair<int64_t, int64_t>> seen;
    for (int i = 0; i < s.explicit_shapes_size(); ++i) {
      const auto& e = s.explicit_shapes(i);
      std::string path = absl::StrCat("shapes.explicit_shapes[", i, "]");
      RETURN_IF_ERROR(NonNegative(true, e.vocab(), path + ".vocab"));
      RETURN_IF_ERROR(NonNegative(true, e.heads(), path + ".heads"));
      RETURN_IF_ERROR(NonNegative(true, e.kv_heads(), path + ".kv_heads"));
      int64_t heads = e.heads() > 0 ? e.heads() : 16;
      ModelShape shape = MakeShape(e.layers(), e.d_model(),
                                   e.vocab() > 0 ? e.vocab() : 256,
                                   FfnRule::kSwiGlu83, heads,
                                   e.kv_heads() > 0 ? e.kv_heads() : heads);
      absl::Status valid = ValidateShape(shape);
      if (!valid.ok()) return Prefixed(path, valid);
      if (!seen.insert({shape.layers, shape.d_model}).second) {
        return Field(path, absl::StrCat("duplicate shape ", shape.layers, "x", shape.d_model));
      }
      shapes.push_back(shape);
    }
  }
  return shapes;
}

namespace {

// The spec as a whole: serialized size, string bounds, labels and name.
absl::Status ValidateEnvelope(const SweepSpec& spec) {
  size_t spec_bytes = spec.ByteSizeLong();
  if (spec_bytes > kMaxSpecBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec: must be at most ", kMaxSpecBytes, " bytes serialized, got ", spec_bytes));
  }
  RETURN_IF_ERROR(BoundStrings(spec, ""));
  // Labels are copied onto every job: bound them together too.
  size_t label_bytes = 0;
  for (const auto& [key, value] : spec.resources().labels()) label_bytes += key.size() + value.size();
  if (label_bytes > kMaxSpecStringBytes) {
    return Field("resources.labels", absl::StrCat("keys and values must total at most ",
                                                  kMaxSpecStringBytes, " bytes, got ", label_bytes));
  }
  if (!ValidName(spec.name())) {
    return Field("name", absl::StrCat(
        "must be 1-64 characters of [A-Za-z0-9._-], got \"", spec.name(), "\""));
  }
  return absl::OkStatus();
}

// Known designs, each once; returns their names.
absl::StatusOr<std::set<std::string>> ValidateArchitectures(const SweepSpec& spec) {
  if (spec.architectures_size() == 0) {
    return Field("architectures", "at least one architecture is required");
  }
  std::set<std::string> archs;
  for (int i = 0; i < spec.architectures_size(); ++i) {
    const std::string& name = spec.architectures(i);
    absl::StatusOr<Arch> arch = ParseArch(name);
    if (!arch.ok()) {
      return Field(absl::StrCat("architectures[", i, "]"), std::string(arch.status().message()));
    }
    if (!archs.insert(name).second) {
      return Field(absl::StrCat("architectures[", i, "]"), absl::StrCat("duplicate architecture \"", name, "\""));
    }
  }
  return archs;
}

// Every grid belongs to a listed design and holds distinct positive LRs.
absl::Status ValidateLrGrids(const SweepSpec& spec, const std::set<std::string>& archs) {
  for (const auto& [arch, grid] : spec.lr_grids()) {
    std::string path = absl::StrCat("lr_grids[\"", arch, "\"]");
    if (archs.count(arch) == 0) return Field(path, "architecture is not in spec.architectures");
    if (grid.lrs_size() == 0) return Field(path + ".lrs", "at least one learning rate is required");
    std::set<double> seen;
    for (int i = 0; i < grid.lrs_size(); ++i) {
      double lr = grid.lrs(i);
      std::string lr_path = absl::StrCat(path, ".lrs[", i, "]");
      if (!std::isfinite(lr) || lr <= 0) return Field(lr_path, absl::StrCat("must be a positive finite number, got ", lr));
      if (!seen.insert(lr).second) return Field(lr_path, absl::StrCat("duplicate learning rate ", lr));
    }
  }
  return absl::OkStatus();
}

// The seeds (default {0}), non-negative and distinct.
absl::StatusOr<std::vector<int64_t>> SpecSeeds(const SweepSpec& spec) {
  std::vector<int64_t> seeds(spec.seeds().begin(), spec.seeds().end());
  if (seeds.empty()) seeds.push_back(0);
  std::set<int64_t> seen_seeds;
  for (size_t i = 0; i < seeds.size(); ++i) {
    std::string path = absl::StrCat("seeds[", i, "]");
    if (seeds[i] < 0) return Field(path, absl::StrCat("must be >= 0, got ", seeds[i]));
    if (!seen_seeds.insert(seeds[i]).second) return Field(path, absl::StrCat("duplicate seed ", seeds[i]));
  }
  return seeds;
}

absl::Status ValidateRetry(const depthbench::v1::RetryPolicy& retry) {
  if (retry.max_attempts() < 0 || retry.max_attempts() > 100) {
    return Field("retry.max_attempts", absl::StrCat("must be in 1..100 (0 = default 3), got ", retry.max_attempts()));
  }
  RETURN_IF_ERROR(NonNegative(true, retry.initial_backoff_ms(), "retry.initial_backoff_ms"));
  RETURN_IF_ERROR(NonNegative(true, retry.max_backoff_ms(), "retry.max_backoff_ms"));
  if (retry.backoff_multiplier() != 0 && !(retry.backoff_multiplier() >= 1)) {
    return Field("retry.backoff_multiplier", absl::StrCat("must be >= 1 (0 = default 2), got ", retry.backoff_multiplier()));
  }
  return absl::OkStatus();
}

// Diagnostic kinds are distinct lowercase identifiers.
absl::Status ValidateKinds(const depthbench::v1::DiagnosticsSpec& diagnostics) {
  std::set<std::string> kinds;
  for (int i = 0; i < diagnostics.kinds_size(); ++i) {
    const std::string& kind = diagnostics.kinds(i);
    std::string path = absl::StrCat("diagnostics.kinds[", i, "]");
    bool ok = !kind.empty();
    for (char c : kind) ok = ok && (std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) || c == '_');
    if (!ok) return Field(path, absl::StrCat("must be a lowercase identifier, got \"", kind, "\""));
    if (!kinds.insert(kind).second) return Field(path, absl::StrCat("duplicate kind \"", kind, "\""));
  }
  return absl::OkStatus();
}

// LR transfer: the index of the reference shape (default the first).
absl::StatusOr<size_t> ReferenceShapeIndex(const SweepSpec& spec,
                                           const strategies::StrategySettings& strategy,
                                           const std::vector<ModelShape>& shapes) {
  if (!strategy.lr_transfer) return size_t{0};
  if (spec.diagnostics().fixed_lr() > 0) {
    return Field("strategy.kind",
                 "lr_transfer cannot be combined with diagnostics.fixed_lr (the fixed LR may "
                 "never run at a shape other than the reference)");
  }
  if (strategy.reference_shape.empty()) return size_t{0};
  size_t reference = shapes.size();
  std::string names;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const std::string name = absl::StrCat(shapes[i].layers, "x", shapes[i].d_model);
    if (name == strategy.reference_shape && reference == shapes.size()) reference = i;
    absl::StrAppend(&names, i == 0 ? "" : ", ", name);
  }
  if (reference == shapes.size()) {
    return Field("strategy.reference_shape",
                 absl::StrCat("no shape \"", strategy.reference_shape,
                              "\" in the sweep (shapes: ", names, ")"));
  }
  return reference;
}

// The design's LR grid: the spec's, or the paper's default.
std::vector<double> ArchLrs(const SweepSpec& spec, const std::string& arch_name, Arch arch) {
  auto grid = spec.lr_grids().find(arch_name);
  if (grid == spec.lr_grids().end()) return DefaultLrGrid(arch);
  return {grid->second.lrs().begin(), grid->second.lrs().end()};
}

// One (design, shape, lr, seed) job: the config the trainer would accept,
// its rung-aligned eval interval, and the group's budget on first sight.
absl::Status PlanJob(const SweepSpec& spec, const std::string& arch_name, size_t shape_index,
                     double lr, int64_t seed, size_t group_index, ExpandedSweep* out) {
  const ModelShape& shape = out->groups[group_index].shape;
  const strategies::StrategySettings& strategy = out->strategy;
  nlohmann::json config = TrainConfigObject(spec.training(), arch_name, shape, lr, seed);
  // The trainer's own parser and checks: a setting it would refuse fails the
  // submission, not the job.
  absl::StatusOr<TrainConfig> parsed = TrainConfigFromJson(config);
  if (!parsed.ok()) return TrainerRefused(parsed.status(), arch_name, shape, lr, seed);
  if (strategy.successive_halving) {
    // Every rung must be an eval step: round the rungs to the job's eval
    // interval (or make the first rung the interval).
    const int64_t total_steps = ResolveTotalSteps(*parsed);
    const int64_t every =
        strategies::RungEvalInterval(strategy.rungs, total_steps, parsed->eval_interval);
    absl::StatusOr<std::vector<int64_t>> rungs =
        strategies::RungSteps(strategy.rungs, total_steps, every);
    if (!rungs.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(rungs.status().message(), " (", arch_name,
                                                     " at ", shape.layers, "x", shape.d_model, ")"));
    }
    if (every != parsed->eval_interval) config["eval_interval"] = every;
  }
  PlannedGroup& group = out->groups[group_index];
  if (group.budget_steps == 0) {
    const TokenBudget budget = ResolveTokenBudget(*parsed);
    group.budget_params = budget.params;
    group.budget_tokens = budget.tokens;
    group.budget_steps = budget.steps;
  }
  out->jobs.push_back({arch_name, shape, lr, seed, config.dump(),
                       strategy.lr_transfer && shape_index != out->reference_shape});
  return absl::OkStatus();
}

// Every group and job of one design.
absl::Status PlanArch(const SweepSpec& spec, const std::string& arch_name,
                      const std::vector<ModelShape>& shapes, const std::vector<int64_t>& seeds,
                      int64_t* total, ExpandedSweep* out) {
  const Arch arch = *ParseArch(arch_name);
  const std::vector<double> lrs = ArchLrs(spec, arch_name, arch);
  *total += static_cast<int64_t>(shapes.size() * lrs.size() * seeds.size());
  if (*total > kMaxJobsPerSweep) {
    return Field("architectures", absl::StrCat("the grid has more than ", kMaxJobsPerSweep, " jobs"));
  }
  const int64_t streams =
      spec.training().has_hc_streams() ? spec.training().hc_streams() : kDefaultHcStreams;
  for (size_t shape_index = 0; shape_index < shapes.size(); ++shape_index) {
    const ModelShape& shape = shapes[shape_index];
    PlannedGroup group;
    group.arch = arch_name;
    group.shape = shape;
    group.params = TotalParams(shape) +
                   ExtraParamsFormula(arch, shape.layers, shape.d_model, shape.kv_dim(), streams);
    group.lrs = lrs;
    out->groups.push_back(group);
    for (double lr : lrs) {
      for (int64_t seed : seeds) {
        RETURN_IF_ERROR(PlanJob(spec, arch_name, shape_index, lr, seed, out->groups.size() - 1, out));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ExpandedSweep> ExpandSweep(const SweepSpec& spec) {
  RETURN_IF_ERROR(ValidateEnvelope(spec));
  ASSIGN_OR_RETURN(const std::set<std::string> archs, ValidateArchitectures(spec));
  ASSIGN_OR_RETURN(const std::vector<ModelShape> shapes, SpecShapes(spec));
  RETURN_IF_ERROR(ValidateLrGrids(spec, archs));
  ASSIGN_OR_RETURN(const std::vector<int64_t> seeds, SpecSeeds(spec));
  RETURN_IF_ERROR(ValidateTraining(spec.training()));
  RETURN_IF_ERROR(ValidateRetry(spec.retry()));
  RETURN_IF_ERROR(ValidateKinds(spec.diagnostics()));
  RETURN_IF_ERROR(ValidateDiagnostics(spec, shapes));
  RETURN_IF_ERROR(NonNegative(true, spec.resources().devices(), "resources.devices"));
  RETURN_IF_ERROR(NonNegative(true, spec.resources().memory_mb(), "resources.memory_mb"));

  ExpandedSweep out;
  ASSIGN_OR_RETURN(out.strategy, strategies::StrategyFromSpec(spec.strategy()));
  ASSIGN_OR_RETURN(out.reference_shape, ReferenceShapeIndex(spec, out.strategy, shapes));
  out.retry = RetryFromSpec(spec.retry());
  out.diagnose = DiagnoseSettingsFromSpec(spec.diagnostics());
  int64_t total = 0;
  for (const std::string& arch_name : spec.architectures()) {
    RETURN_IF_ERROR(PlanArch(spec, arch_name, shapes, seeds, &total, &out));
  }
  return out;
}

std::string TrainConfigJson(const TrainingSettings& t, const std::string& arch,
                            const ModelShape& shape, double lr, int64_t seed) {
  return TrainConfigObject(t, arch, shape, lr, seed).dump();
}

DiagnoseSettings DiagnoseSettingsFromSpec(const depthbench::v1::DiagnosticsSpec& d) {
  DiagnoseSettings out;
  out.kinds.assign(d.kinds().begin(), d.kinds().end());
  out.num_sequences = d.num_sequences();
  out.allow_small_n = d.allow_small_n();
  if (!d.causal_form().empty()) out.causal_form = d.causal_form();
  out.fixed_lr = d.fixed_lr();
  return out;
}

std::string DiagnoseConfigJson(const std::string& train_config_json,
                               const std::string& checkpoint_dir,
                               const DiagnoseSettings& settings) {
  nlohmann::json j = nlohmann::json::parse(train_config_json, nullptr, false);
  if (!j.is_object()) j = nlohmann::json::object();
  j["checkpoint"] = checkpoint_dir;
  j["kinds"] = settings.kinds;
  // 0 (auto) is the trainer's own default: left out, so the key appears
  // only when the spec fixes N.
  if (settings.num_sequences > 0) j["num_sequences"] = settings.num_sequences;
  j["allow_small_n"] = settings.allow_small_n;
  j["causal_form"] = settings.causal_form;
  return j.dump();
}

}  // namespace depthbench::scheduler
