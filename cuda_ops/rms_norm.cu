// RMSNorm with fused scale, one row (token) per thread block.
//
// Forward, per row x [d], gain w [d]:
//   r = 1 / sqrt(mean_c x_c^2 + eps)          (saved: inv_rms)
//   y_c = x_c * r * w_c
// Backward, with g_c = dy_c * w_c:
//   dx_c = r * (g_c - x_c * r^2 * mean_c(g_c x_c))
//   dw_c = sum_rows dy_c * x_c * r            (per-block partials, then a sum)
// Accumulation in fp32; x, y, dy, dx in fp32 or bf16.
#include "cuda_ops/cuda_common.cuh"

namespace depthbench {
namespace cuda {
namespace {

template <typename T>
__global__ void RmsNormForwardKernel(const T* __restrict__ x, const float* __restrict__ w,
                                     T* __restrict__ y, float* __restrict__ inv_rms,
                                     int64_t dim, float eps) {
  __shared__ float scratch[kWarp];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * dim;
  T* yr = y + row * dim;
  float ss = 0.0f;
  for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
    const float v = ToFloat(xr[c]);
    ss += v * v;
  }
  ss = BlockSum1(ss, scratch);
  const float r = rsqrtf(ss / static_cast<float>(dim) + eps);
  if (threadIdx.x == 0) inv_rms[row] = r;
  for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
    yr[c] = FromFloat<T>(ToFloat(xr[c]) * r * w[c]);
  }
}

template <typename T>
__global__ void RmsNormBackwardKernel(const T* __restrict__ dy, const T* __restrict__ x,
                                      const float* __restrict__ w,
                                      const float* __restrict__ inv_rms, T* __restrict__ dx,
                                      float* __restrict__ partials, int64_t rows,
                                      int64_t dim) {
  __shared__ float scratch[kWarp];
  float* part = partials + blockIdx.x * dim;
  for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) part[c] = 0.0f;
  const float inv_dim = 1.0f / static_cast<float>(dim);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* dyr = dy + row * dim;
    const T* xr = x + row * dim;
    T* dxr = dx + row * dim;
    const float r = inv_rms[row];
    float dot = 0.0f;
    for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
      const float xv = ToFloat(xr[c]);
      const float dyv = ToFloat(dyr[c]);
      dot += dyv * w[c] * xv;
      part[c] += dyv * xv * r;  // only this thread touches column c
    }
    dot = BlockSum1(dot, scratch) * inv_dim;
    const float k = r * r * dot;
    for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
      const float xv = ToFloat(xr[c]);
      dxr[c] = FromFloat<T>(r * (ToFloat(dyr[c]) * w[c] - xv * k));
    }
  }
}

template <typename T>
int Forward(const void* x, const float* w, void* y, float* inv_rms, int64_t rows, int64_t dim,
            float eps, cudaStream_t stream) {
  if (rows == 0) return 0;
  RmsNormForwardKernel<T><<<static_cast<unsigned>(rows), RowThreads(dim), 0, stream>>>(
      static_cast<const T*>(x), w, static_cast<T*>(y), inv_rms, dim, eps);
  return static_cast<int>(cudaGetLastError());
}

template <typename T>
int Backward(const void* dy, const void* x, const float* w, const float* inv_rms, void* dx,
             float* dw, float* ws, int64_t rows, int64_t dim, cudaStream_t stream) {
  if (rows == 0) return static_cast<int>(cudaMemsetAsync(dw, 0, dim * sizeof(float), stream));
  const int parts = PartialBlocks(rows);
  RmsNormBackwardKernel<T><<<parts, RowThreads(dim), 0, stream>>>(
      static_cast<const T*>(dy), static_cast<const T*>(x), w, inv_rms, static_cast<T*>(dx), ws,
      rows, dim);
  const int err = static_cast<int>(cudaGetLastError());
  if (err != 0) return err;
  return LaunchSumPartials(ws, dw, parts, dim, stream);
}

}  // namespace
}  // namespace cuda
}  // namespace depthbench

extern "C" {

int DbRmsNormForward(const void* x, const float* weight, void* y, float* inv_rms, int64_t rows,
                     int64_t dim, float eps, DbDtype dtype, void* stream) {
  using namespace depthbench::cuda;
  auto s = static_cast<cudaStream_t>(stream);
  return dtype == kDbBFloat16
             ? Forward<__nv_bfloat16>(x, weight, y, inv_rms, rows, dim, eps, s)
             : Forward<float>(x, weight, y, inv_rms, rows, dim, eps, s);
}

int64_t DbRmsNormWorkspaceFloats(int64_t rows, int64_t dim) {
  return static_cast<int64_t>(depthbench::cuda::PartialBlocks(rows)) * dim;
}

int DbRmsNormBackward(const void* dy, const void* x, const float* weight, const float* inv_rms,
                      void* dx, float* dweight, float* workspace, int64_t rows, int64_t dim,
                      DbDtype dtype, void* stream) {
  using namespace depthbench::cuda;
  auto s = static_cast<cudaStream_t>(stream);
  return dtype == kDbBFloat16
             ? Backward<__nv_bfloat16>(dy, x, weight, inv_rms, dx, dweight, workspace, rows,
                                       dim, s)
             : Backward<float>(dy, x, weight, inv_rms, dx, dweight, workspace, rows, dim, s);
}

}  // extern "C"
