#include "cli/results_doc.h"

#include <cmath>

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

DiagnosticsSummary SummarizeDiagnostics(const std::string& diagnostics_json) {
  json doc = json::parse(diagnostics_json, nullptr, false);
  DiagnosticsSummary s;
  if (doc.is_discarded()) return s;
  s.r_causal = NumberAt(doc, "causal", "r_causal");
  s.r_perm = NumberAt(doc, "permutation", "r_perm");
  s.deff_over_l = NumberAt(doc, "deff", "deff_over_l");
  return s;
}

std::string RunId(int64_t job_id) { return absl::StrCat("job-", job_id); }

json ResultsDocument(const std::string& sweep, const depthbench::v1::QueryResultsResponse& results,
                     const std::map<std::string, Curve>& curves) {
  json doc;
  doc["schema"] = "depthbench.results.v1";
  doc["sweep"] = sweep;
  doc["rows"] = json::array();
  for (const auto& row : results.rows()) {
    json r;
    r["arch"] = row.arch();
    r["layers"] = row.layers();
    r["d_model"] = row.d_model();
    if (row.aspect_ratio() > 0) r["aspect_ratio"] = row.aspect_ratio();
    if (row.params() > 0) r["params"] = row.params();
    r["best_lr"] = row.has_best() ? json(row.best_lr()) : json(nullptr);
    if (row.has_best()) {
      r["val_loss"] = row.best_val_loss();
    } else if (row.complete()) {
      r["val_loss"] = nullptr;  // every LR diverged or failed
    }
    if (row.best_job_id() > 0) r["run_id"] = RunId(row.best_job_id());
    json lrs = json::object();
    for (const auto& l : row.lrs()) {
      if (!(l.lr() > 0)) continue;
      const std::string key = FormatDouble(l.lr(), 6);
      if (l.has_loss()) {
        lrs[key] = l.val_loss();
      } else if (l.diverged()) {
        lrs[key] = nullptr;
      }
    }
    r["lr_losses"] = lrs;
    json diag = json::parse(row.diagnostics_json().empty() ? "{}" : row.diagnostics_json(),
                            nullptr, false);
    if (diag.is_object() && !diag.empty()) {
      const DiagnosticsSummary s = SummarizeDiagnostics(row.diagnostics_json());
      json d;
      d["r_causal"] = Opt(s.r_causal);
      d["r_perm"] = Opt(s.r_perm);
      d["deff_over_l"] = Opt(s.deff_over_l);
      auto matrix = [&](const char* kind, const char* key) {
        if (diag.contains(kind) && diag[kind].is_object() && diag[kind].contains("matrix") &&
            diag[kind]["matrix"].is_array()) {
          d[key] = diag[kind]["matrix"];
        }
      };
      matrix("angular", "angular");
      matrix("causal", "causal");
      matrix("permutation", "perm");
      r["diagnostics"] = d;
    }
    doc["rows"].push_back(r);
  }
  json c = json::object();
  for (const auto& [run_id, points] : curves) {
    json p = json::array();
    for (const auto& [step, value] : points) {
      p.push_back({step, std::isfinite(value) ? json(value) : json(nullptr)});
    }
    c[run_id] = p;
  }
  doc["curves"] = c;
  return doc;
}

}  // namespace depthbench::cli
