// One build of the SumEachVF check (vec_sum_check.h): compiled for the
// baseline ISA, with AVX2 + FMA and with AVX-512, each into its namespace,
// by the same cpu_fused_target.h switch as the kernels.
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "tests/cuda_ops/vec_sum_check.h"
// Last: the ISA of this object.
#include "cuda_ops/cpu_fused_target.h"
#include "cuda_ops/cpu_fused_vec.h"

namespace depthbench {
namespace cpu_fused {
namespace DEPTHBENCH_CPU_FUSED_ISA {
namespace {

// Lanes of mixed magnitude (2^-20 to 2^20 times a normal draw, so the
// order of the additions shows in the low bits), some -0 and some
// infinities of either sign.
float Lane(std::mt19937& gen) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const uint32_t kind = gen() % 64;
  if (kind == 0) return -0.0f;
  if (kind == 1) return std::numeric_limits<float>::infinity();
  if (kind == 2) return -std::numeric_limits<float>::infinity();
  return std::ldexp(normal(gen), static_cast<int>(gen() % 41) - 20);
}

template <int count>
int64_t Mismatches(std::mt19937& gen, int reps) {
  int64_t bad = 0;
  for (int rep = 0; rep < reps; ++rep) {
    VF v[count] = {};
    for (int i = 0; i < count; ++i) {
      // Every lane -0 in some vectors: the sum must stay -0.
      const bool all_negative_zero = gen() % 16 == 0;
      for (int l = 0; l < kVF; ++l) v[i][l] = all_negative_zero ? -0.0f : Lane(gen);
    }
    float out[count];
    SumEachVF<count>(v, out);
    for (int i = 0; i < count; ++i) {
      const float want = SumVF(v[i]);
      // Bitwise: -0 against +0 and NaN (inf - inf) against NaN as well.
      if (std::memcmp(&want, &out[i], sizeof want) != 0) ++bad;
    }
  }
  return bad;
}

}  // namespace

int64_t SumEachVFMismatches(uint32_t seed) {
  std::mt19937 gen(seed);
  constexpr int kReps = 500;
  return Mismatches<1>(gen, kReps) + Mismatches<2>(gen, kReps) + Mismatches<3>(gen, kReps) +
         Mismatches<kVF - 1>(gen, kReps) + Mismatches<kVF>(gen, kReps) +
         Mismatches<kVF + 1>(gen, kReps) + Mismatches<20>(gen, kReps) +
         Mismatches<2 * kVF + 3>(gen, kReps);
}

int VectorLanes() { return kVF; }

}  // namespace DEPTHBENCH_CPU_FUSED_ISA
}  // namespace cpu_fused
}  // namespace depthbench
