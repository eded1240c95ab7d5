// depthbench-report: the offline renderer. Renders a saved
// `depthbench.results.v1` document (schema in report.h) into the same tables
// and figures as `depthbench report`, with no scheduler: the document is the
// results.json that `depthbench report SWEEP --out DIR` wrote (re-render it
// elsewhere, e.g. where gnuplot is installed, or after editing it), or one
// built by another tool. `depthbench report` is the way to fetch a sweep's
// results from a running scheduler; both share cli/report (WriteReport).
//
//   depthbench-report --results FILE.json --out DIR [--gnuplot PATH]
//                     [--no-plots]
//
// Exit codes: 0 ok, 2 bad usage or invalid document, 1 other failure
// (including a missing gnuplot: the tables are written before it fails).
#include <CLI/CLI.hpp>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/report/report.h"

int main(int argc, char** argv) {
  CLI::App app{
      "Render a saved results document (results.json of `depthbench report`) "
      "offline: CSV/JSON/Markdown tables, gnuplot figures"};
  std::string results_path, out_dir;
  depthbench::report::ReportOptions options;
  bool no_plots = false;
  app.add_option("--results", results_path, "results JSON document")
      ->required();
  app.add_option("--out", out_dir, "output directory")->required();
  app.add_option("--gnuplot", options.gnuplot, "gnuplot executable");
  app.add_flag("--no-plots", no_plots, "write the tables only");
  CLI11_PARSE(app, argc, argv);
  options.plots = !no_plots;

  std::ifstream in(results_path);
  if (!in) {
    std::cerr << "depthbench-report: cannot open " << results_path << "\n";
    return 2;
  }
  nlohmann::json doc =
      nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    std::cerr << "depthbench-report: " << results_path
              << " is not valid JSON\n";
    return 2;
  }
  auto summary = depthbench::report::WriteReport(doc, out_dir, options);
  if (!summary.ok()) {
    std::cerr << "depthbench-report: " << summary.status() << "\n";
    return summary.status().code() == absl::StatusCode::kInvalidArgument ? 2
                                                                         : 1;
  }
  for (const std::string& f : summary->files)
    std::cout << out_dir << "/" << f << "\n";
  return 0;
}
