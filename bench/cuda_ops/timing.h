// Wall-clock timing shared by the kernel benchmarks in this folder
// (attn_bench, gemm_bench, mix_ops_bench): each times repetitions of a
// step and reports their median.
#ifndef DEPTHBENCH_BENCH_CUDA_OPS_TIMING_H_
#define DEPTHBENCH_BENCH_CUDA_OPS_TIMING_H_

#include <algorithm>
#include <chrono>
#include <vector>

namespace depthbench {
namespace bench {

// Milliseconds one call of f takes.
template <typename F>
double Ms(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// The upper median (the middle element of an even count): v non-empty.
inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace bench
}  // namespace depthbench

#endif  // DEPTHBENCH_BENCH_CUDA_OPS_TIMING_H_
