#include "cli/results_doc.h"

#include <cmath>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "cli/output.h"

namespace depthbench::cli {
namespace {

using nlohmann::json;

std::optional<double> NumberAt(const json& doc, const char* kind, const char* field) {
  if (!doc.is_object() || !doc.contains(kind) || !doc[kind].is_object()) return std::nullopt;
  const json& d = doc[kind];
  if (!d.contains(field) || !d[field].is_number()) return std::nullopt;
  return d[field].get<double>();
}

json Opt(const std::optional<double>& v) {
  return v && std::isfinite(*v) ? json(*v) : json(nullptr);
}

}  // namespace

std::string LrCell(const depthbench::v1::LrLoss& l) {
  if (l.diverged()) return "div";
  if (l.has_loss()) return FormatDouble(l.val_loss(), 5);
  if (l.pruned_runs() > 0) return absl::StrCat("pruned@r", l.pruned_rung());
  if (l.never_run() > 0 && l.succeeded() + l.failed_runs() + l.diverged_runs() == 0) {
    return "never";
  }
  return "-";
}

std::string ComputeCell(const depthbench::v1::ResultRow& row) {
  if (row.grid_tokens() <= 0) return "-";
  return absl::StrCat(FormatDouble(100.0 * static_cast<double>(row.tokens_trained()) /
                                       static_cast<double>(row.grid_tokens()),
                                   3),
                      "%");
}

DiagnosticsSummary SummarizeDiagnostics(const std::string& diagnostics_json) {
  json doc = json::parse(diagnostics_json, nullptr, false);
  DiagnosticsSummary s;
  if (doc.is_discarded() || !doc.is_object()) return s;
  s.r_causal = NumberAt(doc, "causal", "r_causal");
  s.r_perm = NumberAt(doc, "permutation", "r_perm");
  s.deff_over_l = NumberAt(doc, "deff", "deff_over_l");
  if (doc.contains("causal") && doc["causal"].is_object()) {
    const json& c = doc["causal"];
    s.causal_form = c.contains("form") && c["form"].is_string() ? c["form"].get<std::string>()
                                                                 : "legacy";
  }
  if (doc.contains("deff") && doc["deff"].is_object()) {
    const json& d = doc["deff"];
    if (d.contains("num_sequences") && d["num_sequences"].is_number_integer()) {
      s.deff_n = d["num_sequences"].get<int64_t>();
    } else {
      s.deff_legacy = true;
      if (d.contains("sequences") && d["sequences"].is_number_integer()) {
        s.deff_n = d["sequences"].get<int64_t>();
      }
    }
  }
  return s;
}

std::string CausalFormCell(const DiagnosticsSummary& s) {
  return s.causal_form.empty() ? "-" : s.causal_form;
}

std::string DeffNCell(const DiagnosticsSummary& s) {
  if (s.deff_legacy) return s.deff_n ? absl::StrCat(*s.deff_n, " (legacy)") : "legacy";
  return s.deff_n ? absl::StrCat(*s.deff_n) : "-";
}

const char kLegacyFootnote[] =
    "legacy: diagnostics stored before the causal form and the D_eff sample size N were "
    "recorded: R_causal is the old ratio-of-means score under the old skip rules, and D_eff "
    "may come from an N far below d_model (which pulls it towards 1). Re-run the diagnose "
    "jobs to replace them; they are not comparable with the other rows.";

Table ResultsTable(const depthbench::v1::QueryResultsResponse& resp) {
  std::set<double> lrs;
  for (const auto& row : resp.rows()) {
    for (const auto& l : row.lrs()) lrs.insert(l.lr());
  }
  // The first seven columns keep their places (scripts read them).
  std::vector<std::string> header = {"ARCH",    "L",        "D",      "ASPECT", "PARAMS",
                                     "BEST_LR", "VAL_LOSS", "TOKENS", "STEPS"};
  for (double lr : lrs) header.push_back("LR=" + FormatDouble(lr, 4));
  // DONE stays last (scripts read it there).
  for (const char* h : {"DIAG_LR", "R_CAUSAL", "CAUSAL_FORM", "R_PERM", "DEFF/L", "DEFF_N",
                        "COMPUTE", "DONE"}) {
    header.push_back(h);
  }
  Table table(header);
  for (const auto& row : resp.rows()) {
    std::map<double, std::string> cells;
    for (const auto& l : row.lrs()) {
      cells[l.lr()] = LrCell(l);
    }
    std::vector<std::string> r = {row.arch(), std::to_string(row.layers()),
                                  std::to_string(row.d_model()),
                                  FormatDouble(row.aspect_ratio(), 4),
                                  std::to_string(row.params()),
                                  row.has_best() ? FormatDouble(row.best_lr(), 4) : "-",
                                  row.has_best() ? FormatDouble(row.best_val_loss(), 5) : "-",
                                  row.budget_tokens() > 0 ? std::to_string(row.budget_tokens()) : "-",
                                  row.budget_steps() > 0 ? std::to_string(row.budget_steps()) : "-"};
    for (double lr : lrs) r.push_back(cells.count(lr) ? cells[lr] : "");
    r.push_back(row.diagnosed_lr() > 0 ? FormatDouble(row.diagnosed_lr(), 4) : "-");
    const DiagnosticsSummary diag = SummarizeDiagnostics(row.diagnostics_json());
    auto num = [](const std::optional<double>& v) { return v ? FormatDouble(*v, 4) : "-"; };
    r.push_back(num(diag.r_causal));
    r.push_back(CausalFormCell(diag));
    r.push_back(num(diag.r_perm));
    r.push_back(num(diag.deff_over_l));
    r.push_back(DeffNCell(diag));
    r.push_back(ComputeCell(row));
    r.push_back(row.complete() ? "yes" : "no");
    table.AddRow(r);
  }
  return table;
}

bool AnyLegacy(const depthbench::v1::QueryResultsResponse& resp) {
  for (const auto& row : resp.rows()) {
    if (SummarizeDiagnostics(row.diagnostics_json()).legacy()) return true;
  }
  return false;
}

json ResultsJson(const depthbench::v1::QueryResultsResponse& resp) {
  json doc = json::parse(ToJson(resp), nullptr, false);
  if (!doc.is_object()) doc = json::object();
  if (!doc.contains("rows") || !doc["rows"].is_array()) return doc;
  for (int i = 0; i < resp.rows_size() && i < static_cast<int>(doc["rows"].size()); ++i) {
    const DiagnosticsSummary s = SummarizeDiagnostics(resp.rows(i).diagnostics_json());
    json summary;
    summary["r_causal"] = Opt(s.r_causal);
    summary["causal_form"] = s.causal_form.empty() ? json(nullptr) : json(s.causal_form);
    summary["r_perm"] = Opt(s.r_perm);
    summary["deff_over_l"] = Opt(s.deff_over_l);
    summary["deff_n"] = s.deff_n ? json(*s.deff_n) : json(nullptr);
    summary["legacy"] = s.legacy();
    doc["rows"][i]["summary"] = summary;
  }
  return doc;
}

std::string RunId(int64_t job_id) { return absl::StrCat("job-", job_id); }

namespace {

// lr_losses (loss, or null when diverged) and lr_status ("ran",
// "pruned@rN", "never": strategies, issue 15), keyed by the LR.
void AddLrColumns(const depthbench::v1::ResultRow& row, json& r) {
  json lrs = json::object();
  json status = json::object();
  for (const auto& l : row.lrs()) {
    if (!(l.lr() > 0)) continue;
    const std::string key = FormatDouble(l.lr(), 6);
    if (l.has_loss()) {
      lrs[key] = l.val_loss();
    } else if (l.diverged()) {
      lrs[key] = nullptr;
    }
    const std::string cell = LrCell(l);
    status[key] = cell.rfind("pruned", 0) == 0 || cell == "never" ? cell : std::string("ran");
  }
  r["lr_losses"] = lrs;
  r["lr_status"] = status;
}

// The row's diagnostics summary plus its matrices; null when it has none.
json DiagnosticsDocument(const std::string& diagnostics_json) {
  json diag = json::parse(diagnostics_json.empty() ? "{}" : diagnostics_json, nullptr, false);
  if (!diag.is_object() || diag.empty()) return nullptr;
  const DiagnosticsSummary s = SummarizeDiagnostics(diagnostics_json);
  json d;
  d["r_causal"] = Opt(s.r_causal);
  if (!s.causal_form.empty()) d["causal_form"] = s.causal_form;
  d["r_perm"] = Opt(s.r_perm);
  d["deff_over_l"] = Opt(s.deff_over_l);
  if (s.deff_n) d["deff_n"] = *s.deff_n;
  d["legacy"] = s.legacy();
  auto matrix = [&](const char* kind, const char* key) {
    if (diag.contains(kind) && diag[kind].is_object() && diag[kind].contains("matrix") &&
        diag[kind]["matrix"].is_array()) {
      d[key] = diag[kind]["matrix"];
    }
  };
  matrix("angular", "angular");
  matrix("causal", "causal");
  matrix("permutation", "perm");
  return d;
}

json RowDocument(const depthbench::v1::ResultRow& row) {
  json r;
  r["arch"] = row.arch();
  r["layers"] = row.layers();
  r["d_model"] = row.d_model();
  if (row.aspect_ratio() > 0) r["aspect_ratio"] = row.aspect_ratio();
  if (row.params() > 0) r["params"] = row.params();
  if (row.budget_tokens() > 0) r["budget_tokens"] = row.budget_tokens();
  if (row.budget_steps() > 0) r["budget_steps"] = row.budget_steps();
  if (row.diagnosed_lr() > 0) r["diagnosed_lr"] = row.diagnosed_lr();
  r["best_lr"] = row.has_best() ? json(row.best_lr()) : json(nullptr);
  if (row.has_best()) {
    r["val_loss"] = row.best_val_loss();
  } else if (row.complete()) {
    r["val_loss"] = nullptr;  // every LR diverged or failed
  }
  if (row.best_job_id() > 0) r["run_id"] = RunId(row.best_job_id());
  AddLrColumns(row, r);
  if (row.grid_tokens() > 0) {
    r["tokens_trained"] = row.tokens_trained();
    r["grid_tokens"] = row.grid_tokens();
  }
  json d = DiagnosticsDocument(row.diagnostics_json());
  if (!d.is_null()) r["diagnostics"] = d;
  return r;
}

json CurvesDocument(const std::map<std::string, Curve>& curves) {
  json c = json::object();
  for (const auto& [run_id, points] : curves) {
    json p = json::array();
    for (const auto& [step, value] : points) {
      p.push_back({step, std::isfinite(value) ? json(value) : json(nullptr)});
    }
    c[run_id] = p;
  }
  return c;
}

}  // namespace

json ResultsDocument(const std::string& sweep, const depthbench::v1::QueryResultsResponse& results,
                     const std::map<std::string, Curve>& curves) {
  json doc;
  doc["schema"] = "depthbench.results.v1";
  doc["sweep"] = sweep;
  doc["rows"] = json::array();
  for (const auto& row : results.rows()) doc["rows"].push_back(RowDocument(row));
  doc["curves"] = CurvesDocument(curves);
  return doc;
}

}  // namespace depthbench::cli
