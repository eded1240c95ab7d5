// depthbench results SWEEP [--csv | --json]
#include "absl/strings/str_cat.h"
#include "cli/commands.h"
#include "cli/output.h"
#include "cli/results_doc.h"

namespace depthbench::cli {

namespace v1 = ::depthbench::v1;

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
      auto results = env.QueryResults(args->sweep);
      if (!results.ok()) return env.Fail(results.status());
      const v1::QueryResultsResponse& resp = *results;
      if (env.json) {
        *env.out << ResultsJson(resp).dump(2) << "\n";
      } else if (args->csv) {
        ResultsTable(resp).PrintCsv(*env.out);  // CAUSAL_FORM / DEFF_N say "legacy"
      } else {
        ResultsTable(resp).Print(*env.out);
        if (AnyLegacy(resp)) *env.out << "\n" << kLegacyFootnote << "\n";
      }
      return kExitOk;
    };
  });
}

}  // namespace depthbench::cli
