// The D_eff knobs shared by `depthbench-deff` and `depthbench-train diagnose
// deff`, registered on a CLI11 app. Header-only.
#ifndef DEPTHBENCH_TRAINER_CORE_DIAGNOSTICS_DEFF_CLI_H_
#define DEPTHBENCH_TRAINER_CORE_DIAGNOSTICS_DEFF_CLI_H_

#include <CLI/CLI.hpp>

#include "trainer_core/diagnostics/deff_npy.h"

namespace depthbench {
namespace diagnostics {

inline void AddDeffCliFlags(CLI::App& app, DeffCliFlags& flags) {
  app.add_option("--threads", flags.threads,
                 "intra-op threads for the GEMMs (default 0 = all cores)");
  app.add_option("--precision", flags.precision,
                 "GEMM precision: auto (fp64 for small runs, else fp32), "
                 "fp32 or fp64");
  app.add_option("--form", flags.form,
                 "CKA formulation: auto (fewest FLOPs), gram (N x N tiles) "
                 "or feature (d x d cross-covariances)");
  app.add_option("--budget-mib", flags.budget_mib,
                 "memory for the kernel's buffers in MiB (default 192)");
  app.add_flag("--perf", flags.perf,
               "measure the sgemm peak and print the perf line on stderr "
               "even for a short run");
  app.add_flag("--quiet", flags.quiet, "no progress or perf line on stderr");
}

}  // namespace diagnostics
}  // namespace depthbench

#endif  // DEPTHBENCH_TRAINER_CORE_DIAGNOSTICS_DEFF_CLI_H_
