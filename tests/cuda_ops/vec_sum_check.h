// SumEachVF (cuda_ops/cpu_fused_vec.h) checked against SumVF, and
// RowSquaresAndDotsVF against RowDotsVF, in each build
// of the fused kernels' vector code: vec_sum_check.cc is compiled once per
// build (tests/cuda_ops/CMakeLists.txt), as the kernels are, and
// vec_sum_test.cc calls the builds this CPU runs.
#ifndef DEPTHBENCH_TESTS_CUDA_OPS_VEC_SUM_CHECK_H_
#define DEPTHBENCH_TESTS_CUDA_OPS_VEC_SUM_CHECK_H_

#include <cstdint>

namespace depthbench {
namespace cpu_fused {

#define DEPTHBENCH_VEC_SUM_CHECK(isa)                                              \
  namespace isa {                                                                  \
  /* Sums of random vectors (1 to 2 kVF + 3 at once, mixed magnitudes, -0 and */ \
  /* infinities among them) where SumEachVF's value is not SumVF's to the   */ \
  /* bit; 0 when all agree. */                                                     \
  int64_t SumEachVFMismatches(uint32_t seed);                                      \
  /* Rows (1 to kVF at a time, d = 16 to 256) where RowSquaresAndDotsVF's   */ \
  /* two sums are not RowDotsVF's to the bit; 0 when all agree. */                 \
  int64_t RowSquaresAndDotsMismatches(uint32_t seed);                              \
  /* The build's vector width, kVF. */                                             \
  int VectorLanes();                                                               \
  }
DEPTHBENCH_VEC_SUM_CHECK(generic)
DEPTHBENCH_VEC_SUM_CHECK(avx2)
DEPTHBENCH_VEC_SUM_CHECK(avx512)
#undef DEPTHBENCH_VEC_SUM_CHECK

}  // namespace cpu_fused
}  // namespace depthbench

#endif  // DEPTHBENCH_TESTS_CUDA_OPS_VEC_SUM_CHECK_H_
