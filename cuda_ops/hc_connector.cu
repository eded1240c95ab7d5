// HC / mHC connector: read, residual-mix and write, one row (token) per
// thread block, the n streams of a column in registers (n = 2, 4 or 8).
//
// Streams h [n, d] per token; fp32 routing coefficients: read weights r [n],
// residual map A [n, n] (identity when absent: the HC code form), write
// weights b [n]. The sub-layer F runs between read and write.
//   read:   x_c = sum_s r_s h_sc
//           dh_sc = r_s dx_c;           dr_s = sum_c dx_c h_sc
//   write:  h'_tc = sum_s A_st h_sc + b_t y_c
//           dh_sc = sum_t A_st dh'_tc;  dA_st = sum_c h_sc dh'_tc
//           db_t = sum_c y_c dh'_tc;    dy_c = sum_t b_t dh'_tc
// The per-token coefficient gradients are block reductions (fp32).
#include "cuda_ops/cuda_common.cuh"

namespace depthbench {
namespace cuda {
namespace {

template <typename T, int N>
__global__ void HcReadForwardKernel(const T* __restrict__ h, const float* __restrict__ read,
                                    T* __restrict__ x, int64_t dim) {
  const int64_t row = blockIdx.x;
  float r[N];
#pragma unroll
  for (int s = 0; s < N; ++s) r[s] = read[row * N + s];
  const T* hr = h + row * N * dim;
  for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
    float acc = 0.0f;
#pragma unroll
    for (int s = 0; s < N; ++s) acc += r[s] * ToFloat(hr[s * dim + c]);
    x[row * dim + c] = FromFloat<T>(acc);
  }
}

template <typename T, int N>
__global__ void HcReadBackwardKernel(const T* __restrict__ dx, const T* __restrict__ h,
                                     const float* __restrict__ read, T* __restrict__ dh,
                                     float* __restrict__ dread, int64_t dim) {
  __shared__ float scratch[N * kWarp];
  const int64_t row = blockIdx.x;
  float r[N], acc[N];
#pragma unroll
  for (int s = 0; s < N; ++s) {
    r[s] = read[row * N + s];
    acc[s] = 0.0f;
  }
  const T* hr = h + row * N * dim;
  T* dhr = dh + row * N * dim;
  for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
    const float g = ToFloat(dx[row * dim + c]);
#pragma unroll
    for (int s = 0; s < N; ++s) {
      acc[s] += g * ToFloat(hr[s * dim + c]);
      dhr[s * dim + c] = FromFloat<T>(r[s] * g);
    }
  }
  BlockSum<N>(acc, scratch);
  if (threadIdx.x < N) {
#pragma unroll
    for (int s = 0; s < N; ++s) {
      if (s == static_cast<int>(threadIdx.x)) dread[row * N + s] = acc[s];
    }
  }
}

template <typename T, int N>
__global__ void HcWriteForwardKernel(const T* __restrict__ h, const float* __restrict__ a,
                                     const float* __restrict__ b, const T* __restrict__ y,
                                     T* __restrict__ out, int64_t dim) {
  const int64_t row = blockIdx.x;
  float am[N * N], bw[N];
#pragma unroll
  for (int k = 0; k < N * N; ++k) {
    am[k] = a != nullptr ? a[row * N * N + k] : (k / N == k % N ? 1.0f : 0.0f);
  }
#pragma unroll
  for (int t = 0; t < N; ++t) bw[t] = b[row * N + t];
  const T* hr = h + row * N * dim;
  T* outr = out + row * N * dim;
  for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
    float hv[N];
#pragma unroll
    for (int s = 0; s < N; ++s) hv[s] = ToFloat(hr[s * dim + c]);
    const float yv = ToFloat(y[row * dim + c]);
#pragma unroll
    for (int t = 0; t < N; ++t) {
      float acc = bw[t] * yv;
#pragma unroll
      for (int s = 0; s < N; ++s) acc += am[s * N + t] * hv[s];
      outr[t * dim + c] = FromFloat<T>(acc);
    }
  }
}

template <typename T, int N>
__global__ void HcWriteBackwardKernel(const T* __restrict__ dout, const T* __restrict__ h,
                                      const float* __restrict__ a,
                                      const float* __restrict__ b, const T* __restrict__ y,
                                      T* __restrict__ dh, float* __restrict__ da,
                                      float* __restrict__ db, T* __restrict__ dy,
                                      int64_t dim) {
  constexpr int K = N * N + N;  // dA (n^2) then db (n)
  __shared__ float scratch[K * kWarp];
  const int64_t row = blockIdx.x;
  float am[N * N], bw[N], acc[K];
#pragma unroll
  for (int k = 0; k < N * N; ++k) {
    am[k] = a != nullptr ? a[row * N * N + k] : (k / N == k % N ? 1.0f : 0.0f);
  }
#pragma unroll
  for (int t = 0; t < N; ++t) bw[t] = b[row * N + t];
#pragma unroll
  for (int k = 0; k < K; ++k) acc[k] = 0.0f;
  const T* hr = h + row * N * dim;
  const T* gr = dout + row * N * dim;
  T* dhr = dh + row * N * dim;
  for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
    float hv[N], gv[N];
#pragma unroll
    for (int s = 0; s < N; ++s) {
      hv[s] = ToFloat(hr[s * dim + c]);
      gv[s] = ToFloat(gr[s * dim + c]);
    }
    const float yv = ToFloat(y[row * dim + c]);
    float dyv = 0.0f;
#pragma unroll
    for (int t = 0; t < N; ++t) {
      dyv += bw[t] * gv[t];
      acc[N * N + t] += yv * gv[t];
    }
    dy[row * dim + c] = FromFloat<T>(dyv);
#pragma unroll
    for (int s = 0; s < N; ++s) {
      float d = 0.0f;
#pragma unroll
      for (int t = 0; t < N; ++t) {
        d += am[s * N + t] * gv[t];
        acc[s * N + t] += hv[s] * gv[t];
      }
      dhr[s * dim + c] = FromFloat<T>(d);
    }
  }
  BlockSum<K>(acc, scratch);
  if (threadIdx.x == 0) {
    if (da != nullptr) {
#pragma unroll
      for (int k = 0; k < N * N; ++k) da[row * N * N + k] = acc[k];
    }
#pragma unroll
    for (int t = 0; t < N; ++t) db[row * N + t] = acc[N * N + t];
  }
}

enum class Op { kReadForward, kReadBackward, kWriteForward, kWriteBackward };

struct Args {
  const void* in0;  // h (read fwd, write fwd) or the upstream gradient
  const void* in1;  // h (backward)
  const float* read;
  const float* a;
  const float* b;
  const void* y;
  void* out0;
  void* out1;
  float* dcoef0;
  float* dcoef1;
};

template <typename T, int N>
int Launch(Op op, const Args& g, int64_t rows, int64_t dim, cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>(rows);
  const int threads = RowThreads(dim);
  switch (op) {
    case Op::kReadForward:
      HcReadForwardKernel<T, N><<<blocks, threads, 0, stream>>>(
          static_cast<const T*>(g.in0), g.read, static_cast<T*>(g.out0), dim);
      break;
    case Op::kReadBackward:
      HcReadBackwardKernel<T, N><<<blocks, threads, 0, stream>>>(
          static_cast<const T*>(g.in0), static_cast<const T*>(g.in1), g.read,
          static_cast<T*>(g.out0), g.dcoef0, dim);
      break;
    case Op::kWriteForward:
      HcWriteForwardKernel<T, N><<<blocks, threads, 0, stream>>>(
          static_cast<const T*>(g.in0), g.a, g.b, static_cast<const T*>(g.y),
          static_cast<T*>(g.out0), dim);
      break;
    case Op::kWriteBackward:
      HcWriteBackwardKernel<T, N><<<blocks, threads, 0, stream>>>(
          static_cast<const T*>(g.in0), static_cast<const T*>(g.in1), g.a, g.b,
          static_cast<const T*>(g.y), static_cast<T*>(g.out0), g.dcoef0, g.dcoef1,
          static_cast<T*>(g.out1), dim);
      break;
  }
  return static_cast<int>(cudaGetLastError());
}

template <typename T>
int ByStreams(Op op, const Args& g, int64_t rows, int n, int64_t dim, cudaStream_t stream) {
  switch (n) {
    case 2: return Launch<T, 2>(op, g, rows, dim, stream);
    case 4: return Launch<T, 4>(op, g, rows, dim, stream);
    case 8: return Launch<T, 8>(op, g, rows, dim, stream);
    default: return static_cast<int>(cudaErrorInvalidValue);
  }
}

int Dispatch(Op op, const Args& g, int64_t rows, int n, int64_t dim, DbDtype dtype,
             void* stream) {
  if (n != 2 && n != 4 && n != 8) return static_cast<int>(cudaErrorInvalidValue);
  if (rows == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  return dtype == kDbBFloat16 ? ByStreams<__nv_bfloat16>(op, g, rows, n, dim, s)
                              : ByStreams<float>(op, g, rows, n, dim, s);
}

}  // namespace
}  // namespace cuda
}  // namespace depthbench

extern "C" {

int DbHcReadForward(const void* h, const float* read, void* x, int64_t rows, int n, int64_t dim,
                    DbDtype dtype, void* stream) {
  using namespace depthbench::cuda;
  Args g{h, nullptr, read, nullptr, nullptr, nullptr, x, nullptr, nullptr, nullptr};
  return Dispatch(Op::kReadForward, g, rows, n, dim, dtype, stream);
}

int DbHcReadBackward(const void* dx, const void* h, const float* read, void* dh, float* dread,
                     int64_t rows, int n, int64_t dim, DbDtype dtype, void* stream) {
  using namespace depthbench::cuda;
  Args g{dx, h, read, nullptr, nullptr, nullptr, dh, nullptr, dread, nullptr};
  return Dispatch(Op::kReadBackward, g, rows, n, dim, dtype, stream);
}

int DbHcWriteForward(const void* h, const float* a, const float* b, const void* y, void* out,
                     int64_t rows, int n, int64_t dim, DbDtype dtype, void* stream) {
  using namespace depthbench::cuda;
  Args g{h, nullptr, nullptr, a, b, y, out, nullptr, nullptr, nullptr};
  return Dispatch(Op::kWriteForward, g, rows, n, dim, dtype, stream);
}

int DbHcWriteBackward(const void* dout, const void* h, const float* a, const float* b,
                      const void* y, void* dh, float* da, float* db, void* dy, int64_t rows,
                      int n, int64_t dim, DbDtype dtype, void* stream) {
  using namespace depthbench::cuda;
  Args g{dout, h, nullptr, a, b, y, dh, dy, da, db};
  return Dispatch(Op::kWriteBackward, g, rows, n, dim, dtype, stream);
}

}  // extern "C"
