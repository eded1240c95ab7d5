// SumEachVF (cuda_ops/cpu_fused_vec.h), the reduction of many vectors' lanes
// at once that HcWrite's backward and the routing projection use, gives
// SumVF's value to the bit in every build this CPU runs (vec_sum_check.h),
// so those kernels' values did not change with it; and AttnRes's one-sweep
// RowSquaresAndDotsVF gives the two RowDotsVF sums it replaced, to the bit.
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
  int64_t (*dot_mismatches)(uint32_t);
};

void ExpectSumEachIsSumVF(const VecBuild& b) {
  EXPECT_EQ(b.vector_lanes(), b.lanes) << b.name;
  for (uint32_t seed : {1u, 2u}) EXPECT_EQ(b.mismatches(seed), 0) << b.name << " seed " << seed;
}

void ExpectSquaresAndDotsAreRowDots(const VecBuild& b) {
  for (uint32_t seed : {1u, 2u}) {
    EXPECT_EQ(b.dot_mismatches(seed), 0) << b.name << " seed " << seed;
  }
}

// The builds of the vector code this CPU runs besides the baseline.
std::vector<VecBuild> WideBuilds() {
  std::vector<VecBuild> wide;
#if defined(DEPTHBENCH_CPU_FUSED_HAVE_AVX2)
  if (cpu_fused::Avx2Available()) {
    wide.push_back({"avx2", 8, cpu_fused::avx2::VectorLanes, cpu_fused::avx2::SumEachVFMismatches,
                    cpu_fused::avx2::RowSquaresAndDotsMismatches});
  }
#endif
#if defined(DEPTHBENCH_CPU_FUSED_HAVE_AVX512)
  if (cpu_fused::Avx512Available()) {
    wide.push_back({"avx512", 16, cpu_fused::avx512::VectorLanes,
                    cpu_fused::avx512::SumEachVFMismatches,
                    cpu_fused::avx512::RowSquaresAndDotsMismatches});
  }
#endif
  return wide;
}

const VecBuild kBaseline = {"generic", 8, cpu_fused::generic::VectorLanes,
                            cpu_fused::generic::SumEachVFMismatches,
                            cpu_fused::generic::RowSquaresAndDotsMismatches};

TEST(CpuFusedVec, SumEachVFIsSumVFToTheBitInTheBaselineBuild) { ExpectSumEachIsSumVF(kBaseline); }

TEST(CpuFusedVec, SumEachVFIsSumVFToTheBitInTheWideBuilds) {
  const std::vector<VecBuild> wide = WideBuilds();
  if (wide.empty()) {
    GTEST_SKIP() << testing::kNoWideBuild;
  }
  for (const VecBuild& b : wide) ExpectSumEachIsSumVF(b);
}

TEST(CpuFusedVec, RowSquaresAndDotsVFIsRowDotsVFToTheBitInTheBaselineBuild) {
  ExpectSquaresAndDotsAreRowDots(kBaseline);
}

TEST(CpuFusedVec, RowSquaresAndDotsVFIsRowDotsVFToTheBitInTheWideBuilds) {
  const std::vector<VecBuild> wide = WideBuilds();
  if (wide.empty()) {
    GTEST_SKIP() << testing::kNoWideBuild;
  }
  for (const VecBuild& b : wide) ExpectSquaresAndDotsAreRowDots(b);
}

}  // namespace
}  // namespace depthbench
