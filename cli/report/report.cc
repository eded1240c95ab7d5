#include "cli/report/report.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/child_process.h"
#include "common/status_macros.h"

namespace depthbench {
namespace report {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Matrix = std::vector<std::vector<double>>;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// ------------------------------------------------------------ parsing ----

struct LrLoss {
  double lr;
  std::optional<double> loss;  // nullopt: diverged
};

struct Row {
  std::string arch;
  int64_t layers = 0;
  int64_t d_model = 0;
  double aspect = 0;
  std::optional<int64_t> params;
  std::optional<double> best_lr;
  std::optional<double> val_loss;
  std::string run_id;
  std::vector<LrLoss> lr_losses;  // sorted by lr
  std::optional<double> r_causal, r_perm, deff_over_l;
  std::optional<Matrix> angular, causal, perm;
  std::optional<int64_t> budget_tokens, budget_steps, deff_n;
  std::optional<double> diagnosed_lr;
  std::string causal_form;
  bool legacy = false;
  // Strategies (issue 15): lr -> "ran" | "pruned@rN" | "never", and the
  // tokens trained against the full grid's.
  std::map<double, std::string> lr_status;
  std::optional<int64_t> tokens_trained, grid_tokens;
};

struct Curve {
  std::string run_id;
  std::vector<std::pair<double, double>> points;
};

struct Results {
  std::string sweep;
  std::vector<Row> rows;
  std::vector<Curve> curves;
};

absl::Status Bad(const std::string& where, const std::string& what) {
  return absl::InvalidArgumentError(
      absl::StrCat("results: ", where, " ", what));
}

absl::StatusOr<std::optional<double>> OptNumber(const json& obj,
                                                const char* key,
                                                const std::string& where) {
  if (!obj.contains(key) || obj[key].is_null()) return std::nullopt;
  if (!obj[key].is_number()) {
    return Bad(absl::StrCat(where, ".", key), "must be a number or null");
  }
  return obj[key].get<double>();
}

absl::StatusOr<int64_t> PositiveInt(const json& obj, const char* key,
                                    const std::string& where) {
  if (!obj.contains(key)) return Bad(absl::StrCat(where, ".", key), "missing");
  const json& v = obj[key];
  if (!v.is_number_integer() || v.get<int64_t>() <= 0) {
    return Bad(absl::StrCat(where, ".", key), "must be a positive integer");
  }
  return v.get<int64_t>();
}

absl::StatusOr<std::optional<int64_t>> OptCount(const json& obj, const char* key,
                                                const std::string& where) {
  if (!obj.contains(key) || obj[key].is_null()) return std::nullopt;
  const json& v = obj[key];
  if (!v.is_number_integer() || v.get<int64_t>() < 0) {
    return Bad(absl::StrCat(where, ".", key), "must be a non-negative integer or null");
  }
  return v.get<int64_t>();
}

absl::StatusOr<std::optional<Matrix>> OptMatrix(const json& obj,
                                                const char* key,
                                                const std::string& where) {
  if (!obj.contains(key) || obj[key].is_null()) return std::nullopt;
  const std::string name = absl::StrCat(where, ".", key);
  const json& m = obj[key];
  if (!m.is_array()) return Bad(name, "must be an array of rows");
  Matrix out;
  for (size_t i = 0; i < m.size(); ++i) {
    if (!m[i].is_array())
      return Bad(absl::StrCat(name, "[", i, "]"), "not an array");
    if (i > 0 && m[i].size() != m[0].size()) {
      return Bad(name, "is not rectangular");
    }
    std::vector<double> row;
    for (size_t j = 0; j < m[i].size(); ++j) {
      const json& v = m[i][j];
      if (v.is_null()) {
        row.push_back(kNaN);
      } else if (v.is_number()) {
        row.push_back(v.get<double>());
      } else {
        return Bad(absl::StrCat(name, "[", i, "][", j, "]"),
                   "must be a number or null");
      }
    }
    out.push_back(std::move(row));
  }
  return out;
}

// rows[i].lr_losses: {"<lr>": loss | null (diverged)}, sorted by LR.
absl::Status ParseLrLosses(const json& j, const std::string& where, Row* row) {
  if (!j.is_object()) {
    return Bad(where + ".lr_losses", "must be an object {lr: loss|null}");
  }
  for (const auto& [key, value] : j.items()) {
    const std::string name = absl::StrCat(where, ".lr_losses[\"", key, "\"]");
    char* end = nullptr;
    const double lr = std::strtod(key.c_str(), &end);
    if (key.empty() || end == nullptr || *end != '\0' || !(lr > 0) || !std::isfinite(lr)) {
      return Bad(name, "key must be a positive number");
    }
    if (!value.is_null() && !value.is_number()) {
      return Bad(name, "must be a number or null (diverged)");
    }
    row->lr_losses.push_back(
        {lr, value.is_null() ? std::nullopt : std::optional<double>(value.get<double>())});
  }
  std::sort(row->lr_losses.begin(), row->lr_losses.end(),
            [](const LrLoss& a, const LrLoss& b) { return a.lr < b.lr; });
  return absl::OkStatus();
}

// rows[i].diagnostics: the summaries and the matrices.
absl::Status ParseRowDiagnostics(const json& d, const std::string& dw, Row* row) {
  if (!d.is_object()) return Bad(dw, "must be an object");
  ASSIGN_OR_RETURN(row->r_causal, OptNumber(d, "r_causal", dw));
  ASSIGN_OR_RETURN(row->r_perm, OptNumber(d, "r_perm", dw));
  ASSIGN_OR_RETURN(row->deff_over_l, OptNumber(d, "deff_over_l", dw));
  ASSIGN_OR_RETURN(row->deff_n, OptCount(d, "deff_n", dw));
  if (d.contains("causal_form") && !d["causal_form"].is_null()) {
    if (!d["causal_form"].is_string()) return Bad(dw + ".causal_form", "must be a string");
    row->causal_form = d["causal_form"].get<std::string>();
  }
  if (d.contains("legacy") && !d["legacy"].is_null()) {
    if (!d["legacy"].is_boolean()) return Bad(dw + ".legacy", "must be true or false");
    row->legacy = d["legacy"].get<bool>();
  }
  ASSIGN_OR_RETURN(row->angular, OptMatrix(d, "angular", dw));
  ASSIGN_OR_RETURN(row->causal, OptMatrix(d, "causal", dw));
  ASSIGN_OR_RETURN(row->perm, OptMatrix(d, "perm", dw));
  return absl::OkStatus();
}

// "lr_status": {lr: "ran" | "pruned@rN" | "never"} of a strategies sweep.
absl::Status ParseLrStatus(const json& j, const std::string& where, Row* row) {
  if (!j.contains("lr_status") || j["lr_status"].is_null()) return absl::OkStatus();
  if (!j["lr_status"].is_object()) {
    return Bad(where + ".lr_status", "must be an object {lr: \"ran\"|\"pruned@rN\"|\"never\"}");
  }
  for (const auto& [key, value] : j["lr_status"].items()) {
    const std::string name = absl::StrCat(where, ".lr_status[\"", key, "\"]");
    char* end = nullptr;
    const double lr = std::strtod(key.c_str(), &end);
    if (key.empty() || end == nullptr || *end != '\0' || !(lr > 0) || !std::isfinite(lr)) {
      return Bad(name, "key must be a positive number");
    }
    if (!value.is_string()) return Bad(name, "must be a string");
    row->lr_status[lr] = value.get<std::string>();
  }
  return absl::OkStatus();
}

absl::StatusOr<Row> ParseRow(const json& j, const std::string& where) {
  if (!j.is_object()) return Bad(where, "must be an object");
  Row row;
  if (!j.contains("arch") || !j["arch"].is_string() || j["arch"].get<std::string>().empty()) {
    return Bad(where + ".arch", "must be a non-empty string");
  }
  row.arch = j["arch"].get<std::string>();
  ASSIGN_OR_RETURN(row.layers, PositiveInt(j, "layers", where));
  ASSIGN_OR_RETURN(row.d_model, PositiveInt(j, "d_model", where));
  ASSIGN_OR_RETURN(std::optional<double> aspect, OptNumber(j, "aspect_ratio", where));
  row.aspect = aspect.value_or(static_cast<double>(row.d_model) /
                               static_cast<double>(row.layers));
  if (!(row.aspect > 0)) return Bad(where + ".aspect_ratio", "must be > 0");
  if (j.contains("params") && !j["params"].is_null()) {
    if (!j["params"].is_number_integer() || j["params"].get<int64_t>() < 0) {
      return Bad(where + ".params", "must be a non-negative integer");
    }
    row.params = j["params"].get<int64_t>();
  }
  ASSIGN_OR_RETURN(row.budget_tokens, OptCount(j, "budget_tokens", where));
  ASSIGN_OR_RETURN(row.budget_steps, OptCount(j, "budget_steps", where));
  ASSIGN_OR_RETURN(row.tokens_trained, OptCount(j, "tokens_trained", where));
  ASSIGN_OR_RETURN(row.grid_tokens, OptCount(j, "grid_tokens", where));
  RETURN_IF_ERROR(ParseLrStatus(j, where, &row));
  ASSIGN_OR_RETURN(row.diagnosed_lr, OptNumber(j, "diagnosed_lr", where));
  ASSIGN_OR_RETURN(row.best_lr, OptNumber(j, "best_lr", where));
  ASSIGN_OR_RETURN(row.val_loss, OptNumber(j, "val_loss", where));
  if (j.contains("run_id") && !j["run_id"].is_null()) {
    if (!j["run_id"].is_string()) return Bad(where + ".run_id", "must be a string");
    row.run_id = j["run_id"].get<std::string>();
  }
  if (j.contains("lr_losses") && !j["lr_losses"].is_null()) {
    RETURN_IF_ERROR(ParseLrLosses(j["lr_losses"], where, &row));
  }
  if (j.contains("diagnostics") && !j["diagnostics"].is_null()) {
    RETURN_IF_ERROR(ParseRowDiagnostics(j["diagnostics"], where + ".diagnostics", &row));
  }
  return row;
}

// curves: {run_id: [[step, loss|null], ...]}; null and non-finite losses
// are left out.
absl::Status ParseCurves(const json& curves, Results* r) {
  if (!curves.is_object()) return Bad("curves", "must be an object");
  for (const auto& [run_id, points] : curves.items()) {
    const std::string where = absl::StrCat("curves[\"", run_id, "\"]");
    if (!points.is_array()) return Bad(where, "must be [[step, loss], ...]");
    Curve c;
    c.run_id = run_id;
    for (size_t i = 0; i < points.size(); ++i) {
      const json& p = points[i];
      if (!p.is_array() || p.size() != 2 || !p[0].is_number() ||
          !(p[1].is_number() || p[1].is_null())) {
        return Bad(absl::StrCat(where, "[", i, "]"), "must be [step, loss|null]");
      }
      if (p[1].is_null()) continue;
      const double loss = p[1].get<double>();
      if (std::isfinite(loss)) c.points.push_back({p[0].get<double>(), loss});
    }
    r->curves.push_back(std::move(c));
  }
  return absl::OkStatus();
}

absl::StatusOr<Results> Parse(const json& doc) {
  if (!doc.is_object()) return Bad("document", "must be a JSON object");
  if (doc.contains("schema") &&
      (!doc["schema"].is_string() || doc["schema"] != kResultsSchema)) {
    return Bad("schema", absl::StrCat("must be \"", kResultsSchema, "\""));
  }
  Results r;
  if (!doc.contains("sweep") || !doc["sweep"].is_string()) {
    return Bad("sweep", "must be a string");
  }
  r.sweep = doc["sweep"].get<std::string>();
  if (!doc.contains("rows") || !doc["rows"].is_array()) {
    return Bad("rows", "must be an array");
  }
  for (size_t i = 0; i < doc["rows"].size(); ++i) {
    ASSIGN_OR_RETURN(Row row, ParseRow(doc["rows"][i], absl::StrCat("rows[", i, "]")));
    r.rows.push_back(std::move(row));
  }
  if (doc.contains("curves") && !doc["curves"].is_null()) {
    RETURN_IF_ERROR(ParseCurves(doc["curves"], &r));
  }
  return r;
}

// ----------------------------------------------------------- formatting ----

std::string Num(std::optional<double> v, const char* fmt = "%.6g") {
  if (!v.has_value()) return "";
  if (std::isnan(*v)) return "nan";
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, *v);
  return buf;
}

std::string CsvField(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

std::string MdCell(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '|') out += '\\';
    out += (c == '\n' ? ' ' : c);
  }
  return out;
}

std::string LrLabel(double lr) { return absl::StrFormat("%g", lr); }

std::vector<double> AllLrs(const Results& r) {
  std::set<double> lrs;
  for (const Row& row : r.rows) {
    for (const LrLoss& l : row.lr_losses) lrs.insert(l.lr);
  }
  return {lrs.begin(), lrs.end()};
}

std::string ParamsM(const Row& row) {
  return row.params ? absl::StrFormat("%.1f", *row.params / 1e6) : "";
}

std::string CsvOf(const Results& r) {
  const std::vector<double> lrs = AllLrs(r);
  std::vector<std::string> header = {
      "sweep",    "arch",     "layers",      "d_model", "aspect_ratio",
      "params",   "tokens",   "steps",       "best_lr", "val_loss",
      "diag_lr",  "r_causal", "causal_form", "r_perm",  "deff_over_l",
      "deff_n",   "legacy",   "run_id"};
  for (double lr : lrs) header.push_back(absl::StrCat("loss@lr=", LrLabel(lr)));
  std::string out = absl::StrJoin(header, ",") + "\n";
  for (const Row& row : r.rows) {
    std::vector<std::string> f = {
        CsvField(r.sweep),
        CsvField(row.arch),
        absl::StrCat(row.layers),
        absl::StrCat(row.d_model),
        absl::StrFormat("%.4f", row.aspect),
        row.params ? absl::StrCat(*row.params) : "",
        row.budget_tokens ? absl::StrCat(*row.budget_tokens) : "",
        row.budget_steps ? absl::StrCat(*row.budget_steps) : "",
        Num(row.best_lr, "%.6g"),
        row.val_loss ? Num(row.val_loss, "%.6f")
                     : (row.lr_losses.empty() ? "" : "diverged"),
        Num(row.diagnosed_lr, "%.6g"),
        Num(row.r_causal, "%.6f"),
        CsvField(row.causal_form),
        Num(row.r_perm, "%.6f"),
        Num(row.deff_over_l, "%.6f"),
        row.deff_n ? absl::StrCat(*row.deff_n) : "",
        row.legacy ? "yes" : "",
        CsvField(row.run_id)};
    for (double lr : lrs) {
      std::string cell;
      for (const LrLoss& l : row.lr_losses) {
        if (l.lr == lr) cell = l.loss ? Num(l.loss, "%.6f") : "diverged";
      }
      f.push_back(cell);
    }
    out += absl::StrJoin(f, ",") + "\n";
  }
  return out;
}

std::string Pct(std::optional<double> v) {
  return v ? absl::StrFormat("%.1f%%", 100.0 * *v) : "";
}

// The pivot arch x L -> val loss at the best LR; the best shape per arch in
// bold ("" without rows).
std::string PivotByDepth(const Results& r) {
  std::string out;
  std::set<int64_t> layer_set;
  std::vector<std::string> archs;
  for (const Row& row : r.rows) {
    layer_set.insert(row.layers);
    if (std::find(archs.begin(), archs.end(), row.arch) == archs.end()) {
      archs.push_back(row.arch);
    }
  }
  if (!r.rows.empty()) {
    out +=
        "\n## Validation loss by depth (best LR; bold: best shape per "
        "arch)\n\n";
    out += "| arch |";
    for (int64_t l : layer_set) absl::StrAppend(&out, " L=", l, " |");
    out += "\n|---|";
    for (size_t i = 0; i < layer_set.size(); ++i) out += "---:|";
    out += "\n";
    for (const std::string& arch : archs) {
      std::optional<double> best;
      for (const Row& row : r.rows) {
        if (row.arch == arch && row.val_loss &&
            (!best || *row.val_loss < *best)) {
          best = row.val_loss;
        }
      }
      absl::StrAppend(&out, "| ", MdCell(arch), " |");
      for (int64_t l : layer_set) {
        std::string cell;
        for (const Row& row : r.rows) {
          if (row.arch != arch || row.layers != l) continue;
          if (!row.val_loss) {
            cell = row.lr_losses.empty() ? "" : "diverged";
          } else {
            cell = Num(row.val_loss, "%.4f");
            if (best && *row.val_loss == *best) cell = "**" + cell + "**";
          }
        }
        absl::StrAppend(&out, " ", cell, " |");
      }
      out += "\n";
    }
  }
  return out;
}

// Strategies (issue 15): which LRs ran, were pruned or never ran, and the
// compute spent against the full grid's; empty unless a row says.
std::string ComputeSection(const Results& r) {
  bool any_compute = false;
  for (const Row& row : r.rows) any_compute = any_compute || row.grid_tokens.has_value();
  if (!any_compute) return "";
  std::string out =
      "\n## Compute (LR strategies)\n\n"
      "LRs: ran / pruned@rN (successive halving stopped it at rung N) / never "
      "(LR transfer left it out). Share: tokens trained over the full grid's.\n\n"
      "| arch | L | d_model | LRs | tokens trained (M) | share of grid |\n"
      "|---|---:|---:|---|---:|---:|\n";
  for (const Row& row : r.rows) {
    std::vector<std::string> lrs;
    for (const auto& [lr, status] : row.lr_status) {
      lrs.push_back(absl::StrCat(LrLabel(lr), ": ", MdCell(status)));
    }
    std::string share;
    if (row.grid_tokens && *row.grid_tokens > 0 && row.tokens_trained) {
      share = absl::StrFormat("%.1f%%", 100.0 * static_cast<double>(*row.tokens_trained) /
                                            static_cast<double>(*row.grid_tokens));
    }
    absl::StrAppend(&out, "| ", MdCell(row.arch), " | ", row.layers, " | ", row.d_model, " | ",
                    absl::StrJoin(lrs, ", "), " | ",
                    row.tokens_trained ? absl::StrFormat("%.3f", *row.tokens_trained / 1e6) : "",
                    " | ", share, " |\n");
  }
  return out;
}

std::string MarkdownOf(const Results& r,
                       const std::vector<std::string>& figures) {
  std::string out = absl::StrCat("# Sweep `", r.sweep, "`\n\n");
  absl::StrAppend(&out, r.rows.size(),
                  " (architecture, shape) points; validation loss at each "
                  "point's best learning rate. R_causal / R_perm: fraction of "
                  "late-layer pairs (first block >= ceil(L/4)) above 0.45 / "
                  "0.15; R_causal's form in brackets (per_token: mean over tokens "
                  "of per-token ratios; ratio_of_means). D_eff/L: effective depth "
                  "over depth, from N held-out sequences. Tokens: the shape's "
                  "training budget (20 per Pre-LN parameter), the same for every "
                  "design. Diag LR: the LR of the diagnosed run.\n\n");
  out +=
      "| arch | L | d_model | d/L | params (M) | tokens (M) | best LR | val loss | "
      "diag LR | R_causal | R_perm | D_eff/L | D_eff N |\n"
      "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  bool any_legacy = false;
  for (const Row& row : r.rows) {
    const std::string loss = row.val_loss
                                 ? Num(row.val_loss, "%.4f")
                                 : (row.lr_losses.empty() ? "" : "diverged");
    const std::string tokens =
        row.budget_tokens ? absl::StrFormat("%.1f", *row.budget_tokens / 1e6) : "";
    std::string causal = Pct(row.r_causal);
    if (!causal.empty() && !row.causal_form.empty()) {
      absl::StrAppend(&causal, " (", MdCell(row.causal_form), ")");
    }
    std::string n = row.deff_n ? absl::StrCat(*row.deff_n) : "";
    if (row.legacy) {
      any_legacy = true;
      absl::StrAppend(&n, n.empty() ? "" : " ", "(legacy\\*)");
    }
    absl::StrAppend(&out, "| ", MdCell(row.arch), " | ", row.layers, " | ",
                    row.d_model, " | ", absl::StrFormat("%.2f", row.aspect),
                    " | ", ParamsM(row), " | ", tokens, " | ", Num(row.best_lr, "%.3g"),
                    " | ", loss, " | ", Num(row.diagnosed_lr, "%.3g"), " | ", causal,
                    " | ", Pct(row.r_perm), " | ", Num(row.deff_over_l, "%.3f"), " | ", n,
                    " |\n");
  }
  if (any_legacy) {
    out +=
        "\n\\* legacy: diagnostics stored before the causal form and the D_eff "
        "sample size were recorded (the old ratio-of-means causal score under the "
        "old skip rules; D_eff possibly from N far below d_model). Not comparable "
        "with the other rows; re-run their diagnose jobs.\n";
  }
  out += PivotByDepth(r);
  out += ComputeSection(r);
  if (!figures.empty()) {
    out += "\n## Figures\n\n";
    for (const std::string& f : figures) {
      absl::StrAppend(&out, "- [", f, "](", f, ")\n");
    }
  }
  return out;
}

// ------------------------------------------------------------- gnuplot ----

std::string Sanitise(const std::string& s) {
  std::string out;
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    out += ok ? c : '_';
  }
  if (out.empty() || out[0] == '.') out = "_" + out;
  return out;
}

// A gnuplot double-quoted string literal.
std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += (c == '\n' || c == '\r') ? ' ' : c;
  }
  return out + "\"";
}

// Runs argv (argv[0] looked up on PATH) in cwd, stdin from /dev/null;
// returns (exit code, stdout+stderr). Exit code 127 with no output: the
// program could not be found.
absl::StatusOr<std::pair<int, std::string>> RunProcess(
    const std::vector<std::string>& argv, const std::string& cwd) {
  ChildSpec spec;
  spec.argv = argv;
  spec.search_path = true;
  spec.cwd = cwd;
  spec.parent_death_signal = 0;
  spec.output = ChildSpec::Output::kMergedPipe;
  absl::StatusOr<std::unique_ptr<ChildProcess>> child = ChildProcess::Spawn(spec);
  if (absl::IsNotFound(child.status())) return std::make_pair(127, std::string());
  if (!child.ok()) return child.status();
  std::string output;
  char buf[4096];
  while (true) {
    const ssize_t n = read((*child)->stdout_fd(), buf, sizeof(buf));
    if (n > 0) {
      output.append(buf, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  const ExitInfo exit = (*child)->Wait();
  return std::make_pair(exit.exited ? exit.code : 128 + exit.signal, output);
}

absl::Status NotFound(const std::string& gnuplot) {
  return absl::FailedPreconditionError(absl::StrCat(
      "gnuplot not found or not runnable ('", gnuplot,
      "'): install Debian's gnuplot-nox (apt-get install gnuplot-nox) or pass "
      "the path of a gnuplot binary; tables were written without plots"));
}

absl::Status WriteFile(const fs::path& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) {
    return absl::InternalError(absl::StrCat("cannot write ", path.string()));
  }
  out << content;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("write ", path.string()));
  return absl::OkStatus();
}

std::string DataNum(double v) {
  return std::isfinite(v) ? absl::StrFormat("%.10g", v) : std::string("NaN");
}

// Ten distinguishable colours (Tableau 10) and point types, one per arch.
constexpr const char* kColours[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                    "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                                    "#bcbd22", "#17becf"};

struct Plotter {
  std::string gnuplot;
  std::string png_terminal;
  fs::path out_dir;
  std::vector<std::string>* files;

  // Writes gnuplot/<name>.gp rendering `body` to <name>.png and <name>.svg.
  absl::Status Render(const std::string& name, const std::string& body,
                      int width, int height) {
    const std::string png_opts =
        png_terminal == "pngcairo"
            ? absl::StrFormat("pngcairo size %d,%d noenhanced font \"Sans,11\"",
                              width, height)
            : absl::StrFormat("png size %d,%d noenhanced", width, height);
    const std::string script = absl::StrCat(
        "# Generated by depthbench report; run from the report directory:\n",
        "#   gnuplot gnuplot/", name, ".gp\n", "set datafile missing \"NaN\"\n",
        "set terminal ", png_opts, "\n", "set output ", Quote(name + ".png"),
        "\n", body, "set terminal svg size ", width, ",", height,
        " noenhanced font \"Sans,11\" background \"white\"\n", "set output ",
        Quote(name + ".svg"), "\n", "replot\n", "unset output\n");
    const std::string script_rel = "gnuplot/" + name + ".gp";
    RETURN_IF_ERROR(WriteFile(out_dir / script_rel, script));
    files->push_back(script_rel);
    ASSIGN_OR_RETURN(auto run,
                     RunProcess({gnuplot, script_rel}, out_dir.string()));
    if (run.first == 127 && run.second.empty()) return NotFound(gnuplot);
    if (run.first != 0) {
      return absl::InternalError(
          absl::StrCat("gnuplot failed (exit ", run.first, ") on ", script_rel,
                       ": ", run.second.substr(0, 2000)));
    }
    for (const char* ext : {".png", ".svg"}) {
      std::error_code ec;
      if (fs::file_size(out_dir / (name + ext), ec) == 0 || ec) {
        return absl::InternalError(
            absl::StrCat("gnuplot wrote no ", name, ext, ": ", run.second));
      }
      files->push_back(name + ext);
    }
    return absl::OkStatus();
  }

  absl::Status Data(const std::string& name, const std::string& content) {
    const std::string rel = "gnuplot/" + name;
    RETURN_IF_ERROR(WriteFile(out_dir / rel, content));
    files->push_back(rel);
    return absl::OkStatus();
  }
};

absl::Status PlotLossVsAspect(const Results& r, Plotter& p) {
  std::vector<std::string> archs;
  for (const Row& row : r.rows) {
    if (row.val_loss && std::isfinite(*row.val_loss) &&
        std::find(archs.begin(), archs.end(), row.arch) == archs.end()) {
      archs.push_back(row.arch);
    }
  }
  if (archs.empty()) return absl::OkStatus();
  std::string data;
  std::string plot = "plot ";
  for (size_t a = 0; a < archs.size(); ++a) {
    std::vector<const Row*> pts;
    for (const Row& row : r.rows) {
      if (row.arch == archs[a] && row.val_loss &&
          std::isfinite(*row.val_loss)) {
        pts.push_back(&row);
      }
    }
    std::sort(pts.begin(), pts.end(),
              [](const Row* x, const Row* y) { return x->aspect < y->aspect; });
    absl::StrAppend(&data, "# arch ", archs[a], ": aspect val_loss layers\n");
    for (const Row* row : pts) {
      absl::StrAppend(&data, DataNum(row->aspect), " ", DataNum(*row->val_loss),
                      " ", row->layers, "\n");
    }
    data += "\n\n";
    absl::StrAppend(&plot, a == 0 ? "" : ", \\\n     ",
                    "'gnuplot/val_loss_vs_aspect.dat' index ", a,
                    " using 1:2 with linespoints lw 2 pt ", 5 + (a % 9),
                    " ps 1.2 lc rgb \"", kColours[a % 10], "\" title ",
                    Quote(archs[a]));
  }
  // Label each point of the first series with its depth (shapes are shared
  // across architectures, so one set of labels suffices).
  absl::StrAppend(&plot,
                  ", \\\n     'gnuplot/val_loss_vs_aspect.dat' index 0 using "
                  "1:2:(sprintf(\"L=%d\", $3)) with labels offset 0,1.2 "
                  "font \",9\" tc rgb \"#555555\" notitle\n");
  RETURN_IF_ERROR(p.Data("val_loss_vs_aspect.dat", data));
  const std::string body = absl::StrCat(
      "set title ",
      Quote(absl::StrCat("Sweep ", r.sweep,
                         ": validation loss vs aspect ratio "
                         "(each point at its best LR)")),
      "\n",
      "set xlabel \"aspect ratio d_model / n_layer (log scale; left = deeper "
      "and narrower)\"\n",
      "set ylabel \"validation loss (nats/token)\"\n", "set logscale x\n",
      "set grid xtics ytics mxtics lc rgb \"#dddddd\"\n",
      "set key outside right top box opaque\n",
      "set offsets graph 0.05, graph 0.05, graph 0.08, graph 0.05\n", plot);
  return p.Render("val_loss_vs_aspect", body, 1100, 650);
}

struct HeatmapKind {
  const char* prefix;
  const char* title;
  const char* xlabel;
  const char* ylabel;
  const char* cblabel;
};

bool HasFinite(const Matrix& m) {
  for (const auto& row : m) {
    for (double v : row) {
      if (std::isfinite(v)) return true;
    }
  }
  return false;
}

// The largest finite entry of one diagnostic over every row of a report:
// its heatmaps share the colour scale [0, max] so that designs compare by
// colour (0 when nothing is finite or positive; gnuplot then gets [0:1]).
double ReportMax(const std::vector<const Matrix*>& ms) {
  double hi = 0;
  for (const Matrix* m : ms) {
    for (const auto& r : *m) {
      for (double v : r) {
        if (std::isfinite(v)) hi = std::max(hi, v);
      }
    }
  }
  return hi;
}

absl::Status PlotHeatmap(const Row& row, const std::string& name,
                         const Matrix& m, const HeatmapKind& kind, double cb_max,
                         Plotter& p) {
  std::string data =
      absl::StrCat("# ", kind.prefix, " ", row.arch, " L=", row.layers,
                   ": row-major, NaN = undefined\n");
  for (const auto& r : m) {
    std::vector<std::string> cells;
    for (double v : r) cells.push_back(DataNum(v));
    data += absl::StrJoin(cells, " ") + "\n";
  }
  RETURN_IF_ERROR(p.Data(name + ".dat", data));
  const size_t rows = m.size();
  const size_t cols = m.empty() ? 0 : m[0].size();
  const size_t step = std::max<size_t>(1, (std::max(rows, cols) + 15) / 16);
  const std::string body = absl::StrCat(
      "set title ",
      Quote(absl::StrCat(kind.title, ": ", row.arch, ", L=", row.layers,
                         ", d_model=", row.d_model)),
      "\n", "set xlabel ", Quote(kind.xlabel), "\n", "set ylabel ",
      Quote(kind.ylabel), "\n", "set cblabel ", Quote(kind.cblabel), "\n",
      "set xrange [-0.5:", cols, "-0.5]\n",
      // Row 0 at the top, as the matrix is printed.
      "set yrange [", rows, "-0.5:-0.5]\n", "set xtics ", step,
      " out nomirror\n", "set ytics ", step, " out nomirror\n",
      // One fixed colour scale per diagnostic across the report.
      "set cbrange [0:", DataNum(cb_max > 0 ? cb_max : 1.0), "]\n",
      "set size ratio -1\n",
      "set palette defined (0 '#440154', 1 '#3b528b', 2 '#21908d', "
      "3 '#5dc963', 4 '#fde725')\n",
      "set object 1 rectangle from graph 0,0 to graph 1,1 behind "
      "fillcolor rgb '#eeeeee' fillstyle solid noborder\n",
      "plot ", Quote("gnuplot/" + name + ".dat"),
      " matrix with image notitle\n");
  return p.Render(name, body, 760, 680);
}

absl::Status PlotCurve(const Curve& c, const std::string& name,
                       const std::string& label, Plotter& p) {
  std::string data = absl::StrCat("# run ", c.run_id, ": step loss\n");
  for (const auto& [step, loss] : c.points) {
    absl::StrAppend(&data, DataNum(step), " ", DataNum(loss), "\n");
  }
  RETURN_IF_ERROR(p.Data(name + ".dat", data));
  const std::string body = absl::StrCat(
      "set title ", Quote(absl::StrCat("Loss curve: ", label)), "\n",
      "set xlabel \"step\"\n", "set ylabel \"loss (nats/token)\"\n",
      "set grid lc rgb \"#dddddd\"\n", "set key top right\n", "plot ",
      Quote("gnuplot/" + name + ".dat"),
      " using 1:2 with lines lw 2 lc rgb \"#1f77b4\" title \"loss\"\n");
  return p.Render(name, body, 900, 560);
}

std::string UniqueName(const std::string& base, std::set<std::string>* used) {
  std::string name = base;
  for (int i = 2; used->count(name) > 0; ++i) name = absl::StrCat(base, "_", i);
  used->insert(name);
  return name;
}

}  // namespace

absl::Status ValidateResults(const json& doc) { return Parse(doc).status(); }

absl::StatusOr<std::string> ResultsCsv(const json& doc) {
  ASSIGN_OR_RETURN(Results r, Parse(doc));
  return CsvOf(r);
}

absl::StatusOr<std::string> ResultsMarkdown(const json& doc) {
  ASSIGN_OR_RETURN(Results r, Parse(doc));
  return MarkdownOf(r, {});
}

absl::StatusOr<std::string> DetectPngTerminal(const std::string& gnuplot) {
  ASSIGN_OR_RETURN(auto run, RunProcess({gnuplot, "-e", "set terminal"}, ""));
  if (run.first == 127 && run.second.empty()) return NotFound(gnuplot);
  if (run.first != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "gnuplot ('", gnuplot, "') failed to list terminals: ", run.second));
  }
  auto has = [&](const std::string& t) {
    size_t pos = 0;
    while ((pos = run.second.find(t, pos)) != std::string::npos) {
      const bool left =
          pos == 0 ||
          std::isspace(static_cast<unsigned char>(run.second[pos - 1]));
      const size_t end = pos + t.size();
      const bool right =
          end >= run.second.size() ||
          std::isspace(static_cast<unsigned char>(run.second[end]));
      if (left && right) return true;
      pos = end;
    }
    return false;
  };
  if (!has("svg")) {
    return absl::FailedPreconditionError("gnuplot has no svg terminal");
  }
  if (has("pngcairo")) return std::string("pngcairo");
  if (has("png")) return std::string("png");
  return absl::FailedPreconditionError(
      "gnuplot has neither the pngcairo nor the png terminal");
}

// One heatmap per (row, diagnostic) with finite values, each diagnostic on
// one colour scale: the report-wide maximum.
absl::Status PlotHeatmaps(const Results& r, Plotter& p, std::set<std::string>* used) {
  const HeatmapKind kAngular = {
      "angular", "Angular distance arccos(cos(h_l, h_l+n))/pi",
      "n (offset in blocks)", "l (state; 0 = embedding)",
      "angular distance (0 = same direction, 0.5 = orthogonal)"};
  const HeatmapKind kCausal = {
      "causal", "Causal score C(s, l)", "l (later block, 0-indexed)",
      "s (skipped block, 0-indexed)",
      "C(s,l): |D'_l - D_l| / |D_l| (per token, or ratio of means)"};
  const HeatmapKind kPerm = {
      "perm", "Permutation score P(l1, l2)", "l2 (block, 0-indexed)",
      "l1 (block, 0-indexed)", "|loss_swap - loss| / loss"};
  std::vector<const Matrix*> angular, causal, perm;
  for (const Row& row : r.rows) {
    if (row.angular.has_value()) angular.push_back(&*row.angular);
    if (row.causal.has_value()) causal.push_back(&*row.causal);
    if (row.perm.has_value()) perm.push_back(&*row.perm);
  }
  const double cb_angular = ReportMax(angular);
  const double cb_causal = ReportMax(causal);
  const double cb_perm = ReportMax(perm);
  for (const Row& row : r.rows) {
    const std::string stem = absl::StrCat(Sanitise(row.arch), "_L", row.layers);
    const std::tuple<const std::optional<Matrix>*, const HeatmapKind*, double> maps[] = {
        {&row.angular, &kAngular, cb_angular},
        {&row.causal, &kCausal, cb_causal},
        {&row.perm, &kPerm, cb_perm}};
    for (const auto& [m, kind, cb_max] : maps) {
      if (!m->has_value() || !HasFinite(**m)) continue;
      const std::string name = UniqueName(absl::StrCat(kind->prefix, "_", stem), used);
      RETURN_IF_ERROR(PlotHeatmap(row, name, **m, *kind, cb_max, p));
    }
  }
  return absl::OkStatus();
}

// One loss curve per run, labelled with its row's shape and LR.
absl::Status PlotCurves(const Results& r, Plotter& p, std::set<std::string>* used) {
  for (const Curve& c : r.curves) {
    if (c.points.empty()) continue;
    std::string label = c.run_id;
    for (const Row& row : r.rows) {
      if (!row.run_id.empty() && row.run_id == c.run_id) {
        label = absl::StrCat(c.run_id, " (", row.arch, ", L=", row.layers,
                             ", d_model=", row.d_model,
                             row.best_lr ? absl::StrCat(", lr=", LrLabel(*row.best_lr)) : "",
                             ")");
      }
    }
    const std::string name = UniqueName(absl::StrCat("loss_", Sanitise(c.run_id)), used);
    RETURN_IF_ERROR(PlotCurve(c, name, label, p));
  }
  return absl::OkStatus();
}

// Every figure (gnuplot must run); the files written go into the summary.
absl::Status PlotAll(const Results& r, const ReportOptions& options, const fs::path& dir,
                     ReportSummary* summary) {
  ASSIGN_OR_RETURN(summary->png_terminal, DetectPngTerminal(options.gnuplot));
  Plotter p{options.gnuplot, summary->png_terminal, dir, &summary->files};
  RETURN_IF_ERROR(PlotLossVsAspect(r, p));
  std::set<std::string> used;
  RETURN_IF_ERROR(PlotHeatmaps(r, p, &used));
  return PlotCurves(r, p, &used);
}

absl::StatusOr<ReportSummary> WriteReport(const json& doc,
                                          const std::string& out_dir,
                                          const ReportOptions& options) {
  ASSIGN_OR_RETURN(Results r, Parse(doc));
  const fs::path dir(out_dir);
  std::error_code ec;
  fs::create_directories(dir / "gnuplot", ec);
  if (ec) {
    return absl::InternalError(absl::StrCat(
        "cannot create ", (dir / "gnuplot").string(), ": ", ec.message()));
  }
  ReportSummary summary;
  // Tables first: they do not need gnuplot.
  json normalised = doc;
  for (size_t i = 0; i < r.rows.size(); ++i) {
    normalised["rows"][i]["aspect_ratio"] = r.rows[i].aspect;
  }
  if (!normalised.contains("schema")) normalised["schema"] = kResultsSchema;
  RETURN_IF_ERROR(WriteFile(dir / "results.json", normalised.dump(1) + "\n"));
  RETURN_IF_ERROR(WriteFile(dir / "results.csv", CsvOf(r)));
  summary.files = {"results.csv", "results.json", "results.md"};

  const absl::Status plot_status =
      options.plots ? PlotAll(r, options, dir, &summary) : absl::OkStatus();
  std::vector<std::string> figures;
  for (const std::string& f : summary.files) {
    if (f.size() > 4 && f.compare(f.size() - 4, 4, ".png") == 0) {
      figures.push_back(f);
    }
  }
  RETURN_IF_ERROR(WriteFile(dir / "results.md", MarkdownOf(r, figures)));
  std::sort(summary.files.begin(), summary.files.end());
  if (!plot_status.ok()) return plot_status;
  return summary;
}

}  // namespace report
}  // namespace depthbench
