// SumEachVF (cuda_ops/cpu_fused_vec.h), the reduction of many vectors' lanes
// at once that HcWrite's backward and the routing projection use, gives
// SumVF's value to the bit in every build this CPU runs (vec_sum_check.h),
// so those kernels' values did not change with it.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cuda_ops/cpu_fused_isa.h"
#include "tests/cuda_ops/isa_builds.h"
#include "tests/cuda_ops/vec_sum_check.h"

namespace depthbench {
namespace {

// One build's check: its vector width and its entry point.
struct VecBuild {
  const char* name;
  int lanes;
  int (*vector_lanes)();
  int64_t (*mismatches)(uint32_t);
};

void ExpectSumEachIsSumVF(const VecBuild& b) {
  EXPECT_EQ(b.vector_lanes(), b.lanes) << b.name;
  for (uint32_t seed : {1u, 2u}) EXPECT_EQ(b.mismatches(seed), 0) << b.name << " seed " << seed;
}

TEST(CpuFusedVec, SumEachVFIsSumVFToTheBitInTheBaselineBuild) {
  ExpectSumEachIsSumVF({"generic", 8, cpu_fused::generic::VectorLanes,
                        cpu_fused::generic::SumEachVFMismatches});
}

TEST(CpuFusedVec, SumEachVFIsSumVFToTheBitInTheWideBuilds) {
  std::vector<VecBuild> wide;
#if defined(DEPTHBENCH_CPU_FUSED_HAVE_AVX2)
  if (cpu_fused::Avx2Available()) {
    wide.push_back({"avx2", 8, cpu_fused::avx2::VectorLanes, cpu_fused::avx2::SumEachVFMismatches});
  }
#endif
#if defined(DEPTHBENCH_CPU_FUSED_HAVE_AVX512)
  if (cpu_fused::Avx512Available()) {
    wide.push_back(
        {"avx512", 16, cpu_fused::avx512::VectorLanes, cpu_fused::avx512::SumEachVFMismatches});
  }
#endif
  if (wide.empty()) {
    GTEST_SKIP() << testing::kNoWideBuild;
  }
  for (const VecBuild& b : wide) ExpectSumEachIsSumVF(b);
}

}  // namespace
}  // namespace depthbench
