// depthbench results SWEEP [--csv | --json]
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "cli/commands.h"
#include "cli/output.h"
#include "cli/results_doc.h"

namespace depthbench::cli {

namespace v1 = ::depthbench::v1;

// The paper's table: one row per (arch, shape) with the loss at every LR
// ("div" marks a diverged LR, "-" one without a finished run), then the
// late-layer summaries of the best run's diagnostics ("-" until they exist).
Table ResultsTable(const v1::QueryResultsResponse& resp) {
  std::set<double> lrs;
  for (const auto& row : resp.rows()) {
    for (const auto& l : row.lrs()) lrs.insert(l.lr());
  }
  std::vector<std::string> header = {"ARCH", "L", "D", "ASPECT", "PARAMS", "BEST_LR", "VAL_LOSS"};
  for (double lr : lrs) header.push_back("LR=" + FormatDouble(lr, 4));
  for (const char* h : {"R_CAUSAL", "R_PERM", "DEFF/L", "DONE"}) header.push_back(h);
  Table table(header);
  for (const auto& row : resp.rows()) {
    std::map<double, std::string> cells;
    for (const auto& l : row.lrs()) {
      cells[l.lr()] = l.diverged() ? "div" : (l.has_loss() ? FormatDouble(l.val_loss(), 5) : "-");
    }
    std::vector<std::string> r = {row.arch(), std::to_string(row.layers()),
                                  std::to_string(row.d_model()),
                                  FormatDouble(row.aspect_ratio(), 4),
                                  std::to_string(row.params()),
                                  row.has_best() ? FormatDouble(row.best_lr(), 4) : "-",
                                  row.has_best() ? FormatDouble(row.best_val_loss(), 5) : "-"};
    for (double lr : lrs) r.push_back(cells.count(lr) ? cells[lr] : "");
    const DiagnosticsSummary diag = SummarizeDiagnostics(row.diagnostics_json());
    for (const auto& v : {diag.r_causal, diag.r_perm, diag.deff_over_l}) {
      r.push_back(v ? FormatDouble(*v, 4) : "-");
    }
    r.push_back(row.complete() ? "yes" : "no");
    table.AddRow(r);
  }
  return table;
}

void AddResultsCommand(CLI::App& app, CommandEnv& env) {
  struct Args {
    std::string sweep;
    bool csv = false;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("results", "the results table: val loss per (arch, shape) at every LR, diagnostics summaries");
  cmd->add_option("sweep", args->sweep, "sweep name")->required();
  cmd->add_flag("--csv", args->csv, "CSV output");
  cmd->callback([&env, args] {
    env.run = [args](CommandEnv& env) -> int {
      auto client = env.Client();
      if (!client.ok()) return env.Fail(client.status());
      auto results = (*client)->QueryResults(args->sweep);
      if (!results.ok()) return env.Fail(results.status());
      const v1::QueryResultsResponse& resp = *results;
      if (env.json) {
        *env.out << ToJson(resp) << "\n";
      } else if (args->csv) {
        ResultsTable(resp).PrintCsv(*env.out);
      } else {
        ResultsTable(resp).Print(*env.out);
      }
      return kExitOk;
    };
  });
}

}  // namespace depthbench::cli
