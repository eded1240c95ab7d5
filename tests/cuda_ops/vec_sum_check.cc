// One build of the SumEachVF and RowSquaresAndDotsVF checks (vec_sum_check.h): compiled for the
// baseline ISA, with AVX2 + FMA and with AVX-512, each into its namespace,
// by the same cpu_fused_target.h switch as the kernels.
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

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

// A draw of count floats in mixed magnitudes (Lane, without infinities:
// a product of two infinities of opposite sign is NaN in either function,
// and a NaN has many bit patterns).
std::vector<float> FiniteRow(std::mt19937& gen, int64_t count) {
  std::vector<float> v(static_cast<size_t>(count));
  for (float& x : v) {
    x = Lane(gen);
    if (std::isinf(x)) x = 1.5f;
  }
  return v;
}

}  // namespace

int64_t RowSquaresAndDotsMismatches(uint32_t seed) {
  std::mt19937 gen(seed);
  int64_t bad = 0;
  for (int64_t d : {16, 32, 128, 256}) {
    for (int64_t n = 1; n <= kVF; ++n) {
      for (int rep = 0; rep < 50; ++rep) {
        const int64_t lda = d + static_cast<int64_t>(gen() % 3) * 16;  // rows apart by lda
        const std::vector<float> a = FiniteRow(gen, n * lda), b = FiniteRow(gen, d);
        std::vector<float> ss(kVF), ab(kVF), want_ss(kVF), want_ab(kVF);
        RowSquaresAndDotsVF<16>(a.data(), lda, b.data(), n, d, ss.data(), ab.data());
        RowDotsVF<16>(a.data(), lda, a.data(), lda, n, d, want_ss.data());
        RowDotsVF<16>(a.data(), lda, b.data(), 0, n, d, want_ab.data());
        for (int64_t r = 0; r < n; ++r) {
          if (std::memcmp(&ss[r], &want_ss[r], sizeof(float)) != 0) ++bad;
          if (std::memcmp(&ab[r], &want_ab[r], sizeof(float)) != 0) ++bad;
        }
      }
    }
  }
  return bad;
}

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
