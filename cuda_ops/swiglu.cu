// SwiGLU gate, elementwise (the two projections stay cuBLAS matmuls).
//
// Forward:  s = sigmoid(g),  h = g * s * u          (silu(g) * u)
// Backward: dg = dh * u * s * (1 + g * (1 - s))
//           du = dh * g * s
// fp32 math; g, u, h and the gradients in fp32 or bf16.
#include "cuda_ops/cuda_common.cuh"

namespace depthbench {
namespace cuda {
namespace {

template <typename T>
__global__ void SwiGluForwardKernel(const T* __restrict__ g, const T* __restrict__ u,
                                    T* __restrict__ h, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const float gv = ToFloat(g[i]);
    const float s = 1.0f / (1.0f + __expf(-gv));
    h[i] = FromFloat<T>(gv * s * ToFloat(u[i]));
  }
}

template <typename T>
__global__ void SwiGluBackwardKernel(const T* __restrict__ dh, const T* __restrict__ g,
                                     const T* __restrict__ u, T* __restrict__ dg,
                                     T* __restrict__ du, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const float gv = ToFloat(g[i]);
    const float uv = ToFloat(u[i]);
    const float d = ToFloat(dh[i]);
    const float s = 1.0f / (1.0f + __expf(-gv));
    dg[i] = FromFloat<T>(d * uv * s * (1.0f + gv * (1.0f - s)));
    du[i] = FromFloat<T>(d * gv * s);
  }
}

unsigned ElementwiseBlocks(int64_t n, int threads) {
  constexpr int64_t kMaxBlocks = 65535;
  int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < kMaxBlocks ? (b > 0 ? b : 1) : kMaxBlocks);
}

}  // namespace
}  // namespace cuda
}  // namespace depthbench

extern "C" {

int DbSwiGluForward(const void* g, const void* u, void* h, int64_t n, DbDtype dtype,
                    void* stream) {
  using namespace depthbench::cuda;
  if (n == 0) return 0;
  constexpr int kThreads = 256;
  auto s = static_cast<cudaStream_t>(stream);
  if (dtype == kDbBFloat16) {
    SwiGluForwardKernel<<<ElementwiseBlocks(n, kThreads), kThreads, 0, s>>>(
        static_cast<const __nv_bfloat16*>(g), static_cast<const __nv_bfloat16*>(u),
        static_cast<__nv_bfloat16*>(h), n);
  } else {
    SwiGluForwardKernel<<<ElementwiseBlocks(n, kThreads), kThreads, 0, s>>>(
        static_cast<const float*>(g), static_cast<const float*>(u), static_cast<float*>(h), n);
  }
  return static_cast<int>(cudaGetLastError());
}

int DbSwiGluBackward(const void* dh, const void* g, const void* u, void* dg, void* du,
                     int64_t n, DbDtype dtype, void* stream) {
  using namespace depthbench::cuda;
  if (n == 0) return 0;
  constexpr int kThreads = 256;
  auto s = static_cast<cudaStream_t>(stream);
  if (dtype == kDbBFloat16) {
    using B = __nv_bfloat16;
    SwiGluBackwardKernel<<<ElementwiseBlocks(n, kThreads), kThreads, 0, s>>>(
        static_cast<const B*>(dh), static_cast<const B*>(g), static_cast<const B*>(u),
        static_cast<B*>(dg), static_cast<B*>(du), n);
  } else {
    SwiGluBackwardKernel<<<ElementwiseBlocks(n, kThreads), kThreads, 0, s>>>(
        static_cast<const float*>(dh), static_cast<const float*>(g),
        static_cast<const float*>(u), static_cast<float*>(dg), static_cast<float*>(du), n);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // extern "C"
