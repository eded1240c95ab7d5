// `depthbench report`: renders a sweep's results document into tables and
// plots (issue 6, "Results people look at").
//
// Results document (JSON; what QueryResults is turned into by the CLI):
//
//   {
//     "schema": "depthbench.results.v1",        // optional; checked if present
//     "sweep": "main400M",                       // required string
//     "rows": [                                  // one per (arch, shape)
//       {
//         "arch": "pre_ln",                      // required, non-empty
//         "layers": 16, "d_model": 1216,         // required, > 0
//         "aspect_ratio": 76.0,                  // optional; d_model / layers
//         "params": 407000000,                   // optional integer
//         "budget_tokens": 8108134400,           // optional: the shape's token
//         "budget_steps": 7733,                  //   budget (same every design)
//         "diagnosed_lr": 0.002,                 // optional: the LR whose run
//                                                //   the diagnostics examine
//         "best_lr": 0.002,                      // optional; null: none
//         "val_loss": 2.759,                     // optional; at best_lr; null:
//                                                //   every LR diverged
//         "run_id": "job-17",                    // optional: the best run
//         "lr_losses": {"0.001": 2.80,           // optional; key: LR written
//                       "0.004": null},          //   as a number; null =
//                                                //   diverged
//         "diagnostics": {                       // optional; all keys optional
//           "r_causal": 0.01, "r_perm": 0.08, "deff_over_l": 0.40,
//           "causal_form": "per_token",  // or "ratio_of_means", "legacy"
//           "deff_n": 4096,              // D_eff sample size (sequences)
//           "legacy": false,             // computed with the old forms
//           "angular": [[...]],  // (L+1) x (L+1): [l][n], l = state (0 =
//                                // embedding), n = offset; null = undefined
//           "causal":  [[...]],  // L x L: [s][l], s skipped block, 0-indexed
//           "perm":    [[...]]   // L x L: [l1][l2], l1 < l2, 0-indexed
//         }
//       }, ...
//     ],
//     "curves": {"job-17": [[step, loss], ...], ...}   // optional; null loss
//                                                      // points are skipped
//   }
//
// Output directory (created if missing):
//   results.csv, results.json (the validated document, aspect_ratio filled
//   in), results.md (row table + arch x layers validation-loss pivot),
//   val_loss_vs_aspect.{png,svg} (one line per arch at its best LR: Figure 2),
//   angular_<arch>_L<layers>.{png,svg}, causal_..., perm_... (heatmaps, for
//   rows that carry the matrix), loss_<run_id>.{png,svg} (one per curve), and
//   gnuplot/ with the scripts and data files used (re-runnable by hand).
// Names are sanitised to [A-Za-z0-9._-] (anything else becomes '_').
//
// Plots are drawn by running gnuplot (Debian: gnuplot-nox) as a child
// process: `pngcairo` when the build has it, else `png`; and `svg`. A missing
// gnuplot is FailedPrecondition naming it; tables are still written first.
//
// Torch-free. Thread safety: functions are reentrant; WriteReport writes only
// under `out_dir` and must not run twice on the same directory at once.
#ifndef DEPTHBENCH_CLI_REPORT_REPORT_H_
#define DEPTHBENCH_CLI_REPORT_REPORT_H_

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace depthbench {
namespace report {

inline constexpr char kResultsSchema[] = "depthbench.results.v1";

struct ReportOptions {
  // gnuplot executable: a name looked up on PATH, or a path.
  std::string gnuplot = "gnuplot";
  // false: write the tables only (no gnuplot needed).
  bool plots = true;
};

struct ReportSummary {
  std::vector<std::string> files;  // written, relative to out_dir, sorted
  std::string png_terminal;        // "pngcairo" or "png"; empty if no plots
};

// InvalidArgument naming the first offending field ("rows[3].layers ...").
absl::Status ValidateResults(const nlohmann::json& doc);

// The tables alone (doc must be valid).
absl::StatusOr<std::string> ResultsCsv(const nlohmann::json& doc);
absl::StatusOr<std::string> ResultsMarkdown(const nlohmann::json& doc);

// Which PNG terminal `gnuplot` offers: "pngcairo" preferred, else "png".
// FailedPrecondition if gnuplot cannot be run or has neither.
absl::StatusOr<std::string> DetectPngTerminal(const std::string& gnuplot);

// Validates `doc` and writes every file listed above into `out_dir`.
absl::StatusOr<ReportSummary> WriteReport(const nlohmann::json& doc,
                                          const std::string& out_dir,
                                          const ReportOptions& options = {});

}  // namespace report
}  // namespace depthbench

#endif  // DEPTHBENCH_CLI_REPORT_REPORT_H_
