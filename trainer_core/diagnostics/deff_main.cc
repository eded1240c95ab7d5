// depthbench-deff: effective depth of states saved as a float32 (L, N, d)
// .npy array (L block outputs, N sequences mean-pooled over tokens).
//
//   depthbench-deff --states FILE.npy [--json] [--max-lag K]
//
// Exit codes: 0 ok, 2 bad usage or invalid input, 1 other failure.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <iostream>
#include <string>

#include "absl/status/status.h"
#include "trainer_core/diagnostics/deff_npy.h"

int main(int argc, char** argv) {
  CLI::App app{
      "Effective depth D_eff (linear CKA across layers) of pooled states"};
  std::string states;
  bool json = false;
  int64_t max_lag = -1;
  app.add_option("--states", states,
                 "float32 .npy array of shape (L, N, d): L block outputs "
                 "h_1..h_L, N sequences mean-pooled over tokens")
      ->required();
  app.add_flag("--json", json, "print one JSON document instead of a table");
  app.add_option("--max-lag", max_lag, "K in the D_eff sum (default L-1)");
  CLI11_PARSE(app, argc, argv);

  auto result = depthbench::diagnostics::DeffFromNpy(states, max_lag);
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
