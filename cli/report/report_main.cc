// depthbench-report: renders a results document (schema in report.h) into
// tables and figures. Stand-in until `depthbench report SWEEP --out DIR`
// fetches the document from the scheduler itself.
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
      "Render sweep results: CSV/JSON/Markdown tables, gnuplot figures"};
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
