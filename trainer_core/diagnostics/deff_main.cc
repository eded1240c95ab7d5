// depthbench-deff: effective depth of states saved as a float32 (L, N, d)
// .npy array (L block outputs, N sequences mean-pooled over tokens).
//
//   depthbench-deff --states FILE.npy [--json] [--max-lag K] [--threads N]
//                   [--precision auto|fp32|fp64] [--form auto|gram|feature]
//                   [--budget-mib M] [--perf] [--quiet]
//
// Progress (runs over 2 s) and the perf line go to stderr.
//
// Exit codes: 0 ok, 2 bad usage or invalid input, 1 other failure.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <iostream>
#include <string>

#include "absl/status/status.h"
#include "common/blas_tuning.h"
#include "trainer_core/diagnostics/deff_cli.h"
#include "trainer_core/diagnostics/deff_npy.h"

int main(int argc, char** argv) {
  depthbench::ReexecForOpenBlasKernels(argv);  // common/blas_tuning.h
  CLI::App app{
      "Effective depth D_eff (linear CKA across layers) of pooled states"};
  std::string states;
  bool json = false;
  int64_t max_lag = -1;
  app.add_option("--states", states,
                 "float32 or float64 .npy array of shape (L, N, d): L block outputs "
                 "h_1..h_L, N sequences mean-pooled over tokens")
      ->required();
  app.add_flag("--json", json, "print one JSON document instead of a table");
  app.add_option("--max-lag", max_lag, "K in the D_eff sum (default L-1)");
  depthbench::diagnostics::DeffCliFlags flags;
  depthbench::diagnostics::AddDeffCliFlags(app, flags);
  CLI11_PARSE(app, argc, argv);

  auto options = depthbench::diagnostics::MakeDeffNpyOptions(flags, max_lag,
                                                             &std::cerr);
  auto result = options.ok()
                    ? depthbench::diagnostics::DeffFromNpy(states, *options)
                    : absl::StatusOr<nlohmann::json>(options.status());
  if (!result.ok()) {
    std::cerr << "depthbench-deff: " << result.status() << "\n";
    const auto code = result.status().code();
    return code == absl::StatusCode::kInvalidArgument ||
                   code == absl::StatusCode::kNotFound
               ? 2
               : 1;
  }
  if (json) {
    std::cout << result->dump() << "\n";
  } else {
    std::cout << depthbench::diagnostics::FormatDeffTable(*result);
  }
  return 0;
}
