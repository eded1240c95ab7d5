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

#include "depthbench/v1/sweep_service.pb.h"

namespace depthbench::cli {

struct DiagnosticsSummary {
  std::optional<double> r_causal;     // causal.r_causal
  std::optional<double> r_perm;       // permutation.r_perm
  std::optional<double> deff_over_l;  // deff.deff_over_l
};

// Missing kinds, fields, nulls and malformed JSON give nullopt fields.
DiagnosticsSummary SummarizeDiagnostics(const std::string& diagnostics_json);

// A run's loss curve: (step, value) pairs.
using Curve = std::vector<std::pair<int64_t, double>>;

// "job-<id>", the run_id of a result row's best run.
std::string RunId(int64_t job_id);

// The `depthbench.results.v1` document (cli/report/report.h): one row per
// (arch, shape) with lr_losses (null = diverged), the best run as run_id,
// and diagnostics {r_causal, r_perm, deff_over_l, angular, causal, perm};
// `curves` keyed by run_id.
nlohmann::json ResultsDocument(const std::string& sweep,
                               const depthbench::v1::QueryResultsResponse& results,
                               const std::map<std::string, Curve>& curves);

}  // namespace depthbench::cli

#endif  // DEPTHBENCH_CLI_RESULTS_DOC_H_
