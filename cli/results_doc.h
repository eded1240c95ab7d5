// Turns the scheduler's QueryResults answer into what people read: the
// diagnostics summaries of a result row (R_causal, R_perm, D_eff/L, derived
// from ResultRow.diagnostics_json, which holds the diagnose job's data objects
// keyed by kind: trainer_core/diagnostics/run.h) and the
// `depthbench.results.v1` document that cli/report renders.
//
// Torch- and gRPC-free. Thread safety: pure functions.
#ifndef DEPTHBENCH_CLI_RESULTS_DOC_H_
#define DEPTHBENCH_CLI_RESULTS_DOC_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/output.h"
#include "depthbench/v1/sweep_service.pb.h"

namespace depthbench::cli {

struct DiagnosticsSummary {
  std::optional<double> r_causal;     // causal.r_causal
  std::optional<double> r_perm;       // permutation.r_perm
  std::optional<double> deff_over_l;  // deff.deff_over_l
  // causal.form: "per_token" or "ratio_of_means"; "legacy" for causal data
  // stored before the form was recorded (the old ratio-of-means score under
  // the old skip rules); empty without causal data.
  std::string causal_form;
  // deff.num_sequences, the D_eff sample size N; for data stored before it
  // was recorded, deff.sequences if present (deff_legacy marks both).
  std::optional<int64_t> deff_n;
  bool deff_legacy = false;
  // Some diagnostics were computed with the old forms (never mixed silently
  // with new ones: tables mark them "legacy" and add a footnote).
  bool legacy() const { return causal_form == "legacy" || deff_legacy; }
};

// Missing kinds, fields, nulls and malformed JSON give nullopt fields.
DiagnosticsSummary SummarizeDiagnostics(const std::string& diagnostics_json);

// Table cells: the causal form ("-" without causal data) and the D_eff N
// ("4096", "16 (legacy)", "legacy", or "-" without D_eff data).
std::string CausalFormCell(const DiagnosticsSummary& s);
std::string DeffNCell(const DiagnosticsSummary& s);

// One LR's cell: its mean loss, "div" (diverged), "pruned@rN" (successive
// halving stopped its runs, the highest at rung N), "never" (LR transfer
// never ran it) or "-" (no finished run yet).
std::string LrCell(const depthbench::v1::LrLoss& l);
// The row's tokens trained as a percentage of the full grid's ("37.5%"),
// "-" when unknown.
std::string ComputeCell(const depthbench::v1::ResultRow& row);

// The footnote under a table that holds legacy rows.
extern const char kLegacyFootnote[];

// The `depthbench results` table: one row per (arch, shape) with its token
// budget (TOKENS, STEPS: the same for every design at the shape), the loss at
// every LR ("div" diverged, "-" no finished run), the LR whose run the
// diagnostics examine (DIAG_LR: the best LR, or spec.diagnostics.fixed_lr),
// R_causal with its form, R_perm, D_eff/L with its N ("-" until they exist),
// COMPUTE (tokens trained as a share of the full grid's) and DONE (last; LR cells
// of pruned / never-run LRs read "pruned@rN" / "never", see LrCell).
Table ResultsTable(const depthbench::v1::QueryResultsResponse& results);

// True when any row's diagnostics are legacy.
bool AnyLegacy(const depthbench::v1::QueryResultsResponse& results);

// `depthbench results --json`: the response as proto JSON, each row with a
// "summary" object {r_causal, causal_form, r_perm, deff_over_l, deff_n,
// legacy}.
nlohmann::json ResultsJson(const depthbench::v1::QueryResultsResponse& results);

// A run's loss curve: (step, value) pairs.
using Curve = std::vector<std::pair<int64_t, double>>;

// "job-<id>", the run_id of a result row's best run.
std::string RunId(int64_t job_id);

// The `depthbench.results.v1` document (cli/report/report.h): one row per
// (arch, shape) with lr_losses (null = diverged), the best run as run_id,
// its token budget (budget_tokens, budget_steps), diagnosed_lr, and
// diagnostics {r_causal, causal_form, r_perm, deff_over_l, deff_n, legacy,
// angular, causal, perm}; `curves` keyed by run_id.
nlohmann::json ResultsDocument(const std::string& sweep,
                               const depthbench::v1::QueryResultsResponse& results,
                               const std::map<std::string, Curve>& curves);

}  // namespace depthbench::cli

#endif  // DEPTHBENCH_CLI_RESULTS_DOC_H_
