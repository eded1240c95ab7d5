// SumEachVF (cuda_ops/cpu_fused_vec.h), the reduction of many vectors' lanes
// at once that HcWrite's backward and the routing projection use, gives
// SumVF's value to the bit in every build this CPU runs (vec_sum_check.h),
// so those kernels' values did not change with it.
#include <gtest/gtest.h>

#include "cuda_ops/cpu_fused_isa.h"
#include "tests/cuda_ops/vec_sum_check.h"

namespace depthbench {
namespace {

TEST(CpuFusedVec, SumEachVFIsSumVFToTheBitInTheBaselineBuild) {
  EXPECT_EQ(cpu_fused::generic::VectorLanes(), 8);
  EXPECT_EQ(cpu_fused::generic::SumEachVFMismatches(1), 0);
  EXPECT_EQ(cpu_fused::generic::SumEachVFMismatches(2), 0);
}

TEST(CpuFusedVec, SumEachVFIsSumVFToTheBitInTheWideBuilds) {
  int ran = 0;
#if defined(DEPTHBENCH_CPU_FUSED_HAVE_AVX2)
  if (cpu_fused::Avx2Available()) {
    EXPECT_EQ(cpu_fused::avx2::VectorLanes(), 8);
    EXPECT_EQ(cpu_fused::avx2::SumEachVFMismatches(1), 0) << "avx2";
    EXPECT_EQ(cpu_fused::avx2::SumEachVFMismatches(2), 0) << "avx2";
    ++ran;
  }
#endif
#if defined(DEPTHBENCH_CPU_FUSED_HAVE_AVX512)
  if (cpu_fused::Avx512Available()) {
    EXPECT_EQ(cpu_fused::avx512::VectorLanes(), 16);
    EXPECT_EQ(cpu_fused::avx512::SumEachVFMismatches(1), 0) << "avx512";
    EXPECT_EQ(cpu_fused::avx512::SumEachVFMismatches(2), 0) << "avx512";
    ++ran;
  }
#endif
  if (ran == 0) {
    GTEST_SKIP() << "this CPU (or build) has no AVX2 + FMA kernels; the baseline build's check "
                    "is the other test here";
  }
}

}  // namespace
}  // namespace depthbench
