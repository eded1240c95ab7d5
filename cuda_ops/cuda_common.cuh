// Device helpers shared by the fused kernels (plain CUDA C++, no LibTorch):
// fp32 <-> storage-type conversion, warp and block sum reductions, launch
// sizing. Included by the .cu files only.
#ifndef DEPTHBENCH_CUDA_OPS_CUDA_COMMON_CUH_
#define DEPTHBENCH_CUDA_OPS_CUDA_COMMON_CUH_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda_ops/kernels.h"

namespace depthbench {
namespace cuda {

constexpr int kWarp = 32;

__device__ __forceinline__ float ToFloat(float v) { return v; }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ float FromFloat<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16(v);
}

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  }
  return v;
}

// Sums K values across the block at once; every thread gets the totals.
// `scratch` holds K * 32 floats of shared memory. blockDim.x must be a
// multiple of 32 (launchers use 128..1024).
template <int K>
__device__ __forceinline__ void BlockSum(float (&v)[K], float* scratch) {
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
#pragma unroll
  for (int k = 0; k < K; ++k) v[k] = WarpSum(v[k]);
  __syncthreads();  // scratch may still be read from a previous call
  if (lane == 0) {
#pragma unroll
    for (int k = 0; k < K; ++k) scratch[k * kWarp + warp] = v[k];
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < K; ++k) {
    float t = lane < warps ? scratch[k * kWarp + lane] : 0.0f;
    v[k] = WarpSum(t);
  }
}

__device__ __forceinline__ float BlockSum1(float v, float* scratch) {
  float a[1] = {v};
  BlockSum<1>(a, scratch);
  return a[0];
}

// Threads per row-block: a multiple of 32 covering dim in a few strides.
inline int RowThreads(int64_t dim) {
  int t = 128;
  while (t < 1024 && t < dim / 4) t *= 2;
  return t;
}

// Blocks for a grid-stride loop over `rows` that keeps every SM busy while
// bounding the per-block parameter-gradient partials.
inline int PartialBlocks(int64_t rows) {
  constexpr int64_t kMaxPartials = 1024;
  return static_cast<int>(rows < kMaxPartials ? (rows > 0 ? rows : 1) : kMaxPartials);
}

namespace {
// Sums partials [parts, dim] over parts into out [dim] (fp32). Internal
// linkage: each .cu file gets its own copy (no relocatable device code).
__global__ void SumPartialsKernel(const float* partials, float* out, int parts, int64_t dim) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= dim) return;
  float s = 0.0f;
  for (int p = 0; p < parts; ++p) s += partials[p * dim + c];
  out[c] = s;
}
}  // namespace

inline int LaunchSumPartials(const float* partials, float* out, int parts, int64_t dim,
                             cudaStream_t stream) {
  const int threads = 256;
  const int64_t blocks = (dim + threads - 1) / threads;
  SumPartialsKernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(partials, out,
                                                                           parts, dim);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace cuda
}  // namespace depthbench

#endif  // DEPTHBENCH_CUDA_OPS_CUDA_COMMON_CUH_
