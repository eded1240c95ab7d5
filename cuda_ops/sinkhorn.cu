// Sinkhorn-Knopp in the log domain for batches of small n x n maps (mHC's
// residual map), one thread per map, n a compile-time constant (2, 4 or 8).
//
// Forward, z = logits [n, n], `iterations` (20 in mHC) times:
//   row step:    z_rj <- z_rj - log(sum_k exp(z_rk) + eps)
//   column step: z_rj <- z_rj - log(sum_k exp(z_kj) + eps)
//   out = exp(z)                           (doubly stochastic up to eps)
// Backward, hand-written: with P = exp(z') the output of a step,
//   row step:    dz_rj = dz'_rj - P_rj * sum_k dz'_rk
//   column step: dz_rj = dz'_rj - P_rj * sum_k dz'_kj
//   and dz_final = dout * out. The states after each column step are
// recomputed from the logits into a per-thread checkpoint array; the
// row-step outputs are recomputed from them on the way back.
#include "cuda_ops/cuda_common.cuh"

namespace depthbench {
namespace cuda {
namespace {

constexpr int kMaxIterations = 32;

__device__ __forceinline__ float LogAddExp(float a, float b) {
  const float mx = fmaxf(a, b);
  return mx + log1pf(__expf(-fabsf(a - b)));
}

template <int N>
__device__ __forceinline__ void RowStep(float (&z)[N * N], float log_eps) {
#pragma unroll
  for (int r = 0; r < N; ++r) {
    float mx = z[r * N];
#pragma unroll
    for (int j = 1; j < N; ++j) mx = fmaxf(mx, z[r * N + j]);
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < N; ++j) s += __expf(z[r * N + j] - mx);
    const float d = LogAddExp(mx + __logf(s), log_eps);
#pragma unroll
    for (int j = 0; j < N; ++j) z[r * N + j] -= d;
  }
}

template <int N>
__device__ __forceinline__ void ColStep(float (&z)[N * N], float log_eps) {
#pragma unroll
  for (int j = 0; j < N; ++j) {
    float mx = z[j];
#pragma unroll
    for (int r = 1; r < N; ++r) mx = fmaxf(mx, z[r * N + j]);
    float s = 0.0f;
#pragma unroll
    for (int r = 0; r < N; ++r) s += __expf(z[r * N + j] - mx);
    const float d = LogAddExp(mx + __logf(s), log_eps);
#pragma unroll
    for (int r = 0; r < N; ++r) z[r * N + j] -= d;
  }
}

template <int N>
__global__ void SinkhornForwardKernel(const float* __restrict__ logits, float* __restrict__ out,
                                      int64_t batch, int iterations, float log_eps) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= batch) return;
  float z[N * N];
#pragma unroll
  for (int k = 0; k < N * N; ++k) z[k] = logits[b * N * N + k];
  for (int t = 0; t < iterations; ++t) {
    RowStep<N>(z, log_eps);
    ColStep<N>(z, log_eps);
  }
#pragma unroll
  for (int k = 0; k < N * N; ++k) out[b * N * N + k] = __expf(z[k]);
}

template <int N>
__global__ void SinkhornBackwardKernel(const float* __restrict__ dout,
                                       const float* __restrict__ logits,
                                       float* __restrict__ dlogits, int64_t batch,
                                       int iterations, float log_eps) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= batch) return;
  // checkpoint[t] = state at the start of iteration t (local memory).
  float checkpoint[kMaxIterations + 1][N * N];
  float z[N * N];
#pragma unroll
  for (int k = 0; k < N * N; ++k) z[k] = logits[b * N * N + k];
  for (int t = 0; t < iterations; ++t) {
#pragma unroll
    for (int k = 0; k < N * N; ++k) checkpoint[t][k] = z[k];
    RowStep<N>(z, log_eps);
    ColStep<N>(z, log_eps);
  }
  float g[N * N];
#pragma unroll
  for (int k = 0; k < N * N; ++k) g[k] = dout[b * N * N + k] * __expf(z[k]);
  // z now holds the output of the last column step.
  for (int t = iterations - 1; t >= 0; --t) {
    // Column step of iteration t: its output is z.
#pragma unroll
    for (int j = 0; j < N; ++j) {
      float s = 0.0f;
#pragma unroll
      for (int r = 0; r < N; ++r) s += g[r * N + j];
#pragma unroll
      for (int r = 0; r < N; ++r) g[r * N + j] -= __expf(z[r * N + j]) * s;
    }
    // Row step of iteration t: recompute its output from the checkpoint.
#pragma unroll
    for (int k = 0; k < N * N; ++k) z[k] = checkpoint[t][k];
    float zr[N * N];
#pragma unroll
    for (int k = 0; k < N * N; ++k) zr[k] = z[k];
    RowStep<N>(zr, log_eps);
#pragma unroll
    for (int r = 0; r < N; ++r) {
      float s = 0.0f;
#pragma unroll
      for (int j = 0; j < N; ++j) s += g[r * N + j];
#pragma unroll
      for (int j = 0; j < N; ++j) g[r * N + j] -= __expf(zr[r * N + j]) * s;
    }
    // The input of iteration t (z = checkpoint[t]) is the output of the
    // column step of iteration t - 1.
  }
#pragma unroll
  for (int k = 0; k < N * N; ++k) dlogits[b * N * N + k] = g[k];
}

template <int N>
int Launch(bool backward, const float* dout, const float* logits, float* out, int64_t batch,
           int iterations, float log_eps, cudaStream_t stream) {
  constexpr int kThreads = 128;
  const unsigned blocks = static_cast<unsigned>((batch + kThreads - 1) / kThreads);
  if (backward) {
    SinkhornBackwardKernel<N><<<blocks, kThreads, 0, stream>>>(dout, logits, out, batch,
                                                               iterations, log_eps);
  } else {
    SinkhornForwardKernel<N><<<blocks, kThreads, 0, stream>>>(logits, out, batch, iterations,
                                                              log_eps);
  }
  return static_cast<int>(cudaGetLastError());
}

int Dispatch(bool backward, const float* dout, const float* logits, float* out, int64_t batch,
             int n, int iterations, float eps, cudaStream_t stream) {
  if (iterations < 0 || iterations > kMaxIterations || !(eps > 0.0f)) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  if (batch == 0) return 0;
  const float log_eps = logf(eps);
  switch (n) {
    case 2: return Launch<2>(backward, dout, logits, out, batch, iterations, log_eps, stream);
    case 4: return Launch<4>(backward, dout, logits, out, batch, iterations, log_eps, stream);
    case 8: return Launch<8>(backward, dout, logits, out, batch, iterations, log_eps, stream);
    default: return static_cast<int>(cudaErrorInvalidValue);
  }
}

}  // namespace
}  // namespace cuda
}  // namespace depthbench

extern "C" {

int DbSinkhornForward(const float* logits, float* out, int64_t batch, int n, int iterations,
                      float eps, void* stream) {
  return depthbench::cuda::Dispatch(false, nullptr, logits, out, batch, n, iterations, eps,
                                    static_cast<cudaStream_t>(stream));
}

int DbSinkhornBackward(const float* dout, const float* logits, float* dlogits, int64_t batch,
                       int n, int iterations, float eps, void* stream) {
  return depthbench::cuda::Dispatch(true, dout, logits, dlogits, batch, n, iterations, eps,
                                    static_cast<cudaStream_t>(stream));
}

}  // extern "C"
