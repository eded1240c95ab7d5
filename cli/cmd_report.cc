// depthbench report SWEEP --out DIR [--no-plots] [--gnuplot PATH]
//
// Fetches the sweep's results (QueryResults), the best runs' loss curves
// (WatchJob on each finished best run: its stored "loss" points) and the
// diagnostics matrices stored with each row, builds the
// `depthbench.results.v1` document (cli/results_doc.h) and renders it with
// cli/report: results.{csv,json,md}, Figure 2 (val loss vs aspect ratio),
// angular / causal / permutation heatmaps and loss curves (PNG + SVG).
#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
#include "cli/commands.h"
#include "cli/output.h"
#include "cli/report/report.h"
#include "cli/results_doc.h"

namespace depthbench::cli {

namespace v1 = ::depthbench::v1;

namespace {

// The "loss" points of a finished job, one per step (a retried attempt's
// repeat of a step replaces the earlier one).
absl::StatusOr<Curve> FetchLossCurve(SchedulerClient& client, int64_t job_id,
                                     int64_t timeout_ms) {
  v1::WatchJobRequest req;
  req.set_job_id(job_id);
  auto ctx = client.Context(timeout_ms);
  auto reader = client.WatchJob(ctx.get(), req);
  std::map<int64_t, double> by_step;
  v1::WatchJobEvent event;
  while (reader->Read(&event)) {
    if (event.has_point() && event.point().name() == "loss") {
      by_step[event.point().step()] = event.point().value();
    }
  }
  absl::Status status = FromGrpc(reader->Finish());
  if (!status.ok()) return status;
  return Curve(by_step.begin(), by_step.end());
}

// The loss curves of the rows' finished best runs, by run id; a curve that
// cannot be fetched is a warning on `err`, not an error.
std::map<std::string, Curve> FetchBestCurves(SchedulerClient& client,
                                             const v1::QueryResultsResponse& resp,
                                             int64_t timeout_ms, std::ostream& err) {
  std::map<std::string, Curve> curves;
  for (const auto& row : resp.rows()) {
    if (row.best_job_id() <= 0 || !row.complete()) continue;
    auto curve = FetchLossCurve(client, row.best_job_id(), timeout_ms);
    if (!curve.ok()) {
      err << "warning: loss curve of job " << row.best_job_id() << ": "
          << curve.status().message() << "\n";
      continue;
    }
    if (!curve->empty()) curves[RunId(row.best_job_id())] = std::move(*curve);
  }
  return curves;
}

}  // namespace

void AddReportCommand(CLI::App& app, CommandEnv& env) {
  struct Args {
    std::string sweep;
    std::string out;
    bool no_plots = false;
    bool no_curves = false;
    std::string gnuplot = "gnuplot";
    int64_t curve_timeout_s = 60;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand(
      "report", "write the results tables, Figure 2, diagnostics heatmaps and loss curves");
  cmd->add_option("sweep", args->sweep, "sweep name")->required();
  cmd->add_option("--out", args->out, "output directory")->required();
  cmd->add_flag("--no-plots", args->no_plots, "write the tables only (no gnuplot)");
  cmd->add_flag("--no-curves", args->no_curves, "skip fetching the loss curves");
  cmd->add_option("--gnuplot", args->gnuplot, "gnuplot executable")->capture_default_str();
  cmd->add_option("--curve-timeout-s", args->curve_timeout_s, "deadline of each curve fetch")
      ->capture_default_str()->check(CLI::PositiveNumber);
  cmd->callback([&env, args] {
    env.run = [args](CommandEnv& env) -> int {
      auto results = env.QueryResults(args->sweep);
      if (!results.ok()) return env.Fail(results.status());
      const v1::QueryResultsResponse& resp = *results;
      std::map<std::string, Curve> curves;
      if (!args->no_curves) {
        // Connected: QueryResults succeeded.
        curves = FetchBestCurves(**env.Client(), resp, args->curve_timeout_s * 1000, *env.err);
      }
      nlohmann::json doc = ResultsDocument(args->sweep, resp, curves);
      report::ReportOptions options;
      options.gnuplot = args->gnuplot;
      options.plots = !args->no_plots;
      auto summary = report::WriteReport(doc, args->out, options);
      if (!summary.ok()) return env.Fail(summary.status());
      if (env.json) {
        *env.out << nlohmann::json{{"out", args->out}, {"files", summary->files}}.dump() << "\n";
      } else {
        *env.out << "wrote " << summary->files.size() << " files to " << args->out << "\n";
        for (const std::string& f : summary->files) *env.out << "  " << f << "\n";
      }
      return kExitOk;
    };
  });
}

}  // namespace depthbench::cli
