// The builds of the fused CPU kernels (cuda_ops/cpu_fused_isa.h) for tests
// that run one kernel in each: the wider builds this CPU runs, each compared
// against the baseline build.
#ifndef DEPTHBENCH_TESTS_CUDA_OPS_ISA_BUILDS_H_
#define DEPTHBENCH_TESTS_CUDA_OPS_ISA_BUILDS_H_

#include <vector>

#include "cuda_ops/cpu_fused_isa.h"

namespace depthbench {
namespace testing {

enum class Build { kGeneric, kAvx2, kAvx512 };

inline const char* BuildName(Build b) {
  return b == Build::kAvx512 ? "avx512" : b == Build::kAvx2 ? "avx2" : "generic";
}

// The AVX2 and AVX-512 builds, where the CPU runs them.
inline std::vector<Build> WideBuilds() {
  std::vector<Build> out;
  if (cpu_fused::Avx2Available()) out.push_back(Build::kAvx2);
  if (cpu_fused::Avx512Available()) out.push_back(Build::kAvx512);
  return out;
}

// The message for a test skipped because the CPU runs no wider build.
inline const char* kNoWideBuild =
    "this CPU (or build) has no AVX2 + FMA kernels; the baseline build is the one every other "
    "test here runs";

}  // namespace testing
}  // namespace depthbench

// cpu_fused::<build>::fn(args...) for a Build value.
#define DB_BUILD_CALL(build, fn, ...)                                                    \
  ((build) == ::depthbench::testing::Build::kAvx512 ? cpu_fused::avx512::fn(__VA_ARGS__) \
   : (build) == ::depthbench::testing::Build::kAvx2 ? cpu_fused::avx2::fn(__VA_ARGS__)   \
                                                    : cpu_fused::generic::fn(__VA_ARGS__))

#endif  // DEPTHBENCH_TESTS_CUDA_OPS_ISA_BUILDS_H_
