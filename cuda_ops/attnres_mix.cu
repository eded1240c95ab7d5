// AttnRes depth mixing, one row (token) per thread block, one pass over the
// sources in the forward (online softmax), folded with the output RMSNorm.
//
// Per row, sources v_i [d] (i < S), query q, key gain g_k, output gain g_o,
// a = q * g_k:
//   r_i     = 1 / sqrt(mean(v_i^2) + eps)
//   logit_i = a . v_i * r_i            (= q . (g_k * rmsnorm(v_i)); temperature 1)
//   p       = softmax_i(logit)          (saved: probs)
//   m       = sum_i p_i v_i
//   s       = 1 / sqrt(mean(m^2) + eps) (saved: inv_rms_out)
//   y       = m * s * g_o
// Backward (m is recomputed from the sources and the saved p):
//   dm       = s * (g_o dy - m * s^2 * mean(g_o dy m))
//   dg_o     = sum_rows dy * m * s
//   dp_i     = dm . v_i
//   dlogit_i = p_i (dp_i - sum_j p_j dp_j)
//   dv_i     = p_i dm + dlogit_i r_i (a - v_i r_i logit_i / d)
//   da       = sum_rows sum_i dlogit_i r_i v_i;  dq = da * g_k;  dg_k = da * q
// Full and Block AttnRes differ only in which sources a site passes. Each
// thread keeps kVec columns in registers (dim <= kVec * 1024).
#include "cuda_ops/cuda_common.cuh"

namespace depthbench {
namespace cuda {
namespace {

constexpr int kVec = 8;

int VecThreads(int64_t dim) {
  int64_t t = (dim + kVec - 1) / kVec;
  t = (t + kWarp - 1) / kWarp * kWarp;
  return static_cast<int>(t < 128 ? 128 : t);
}

template <typename T>
__global__ void AttnResForwardKernel(DbSourceList src, int S, const float* __restrict__ q,
                                     const float* __restrict__ gk,
                                     const float* __restrict__ go, T* __restrict__ y,
                                     float* __restrict__ probs, float* __restrict__ inv_rms_out,
                                     int64_t dim, float eps) {
  __shared__ float scratch[2 * kWarp];
  __shared__ float logits[DB_ATTNRES_MAX_SOURCES];
  const int64_t row = blockIdx.x;
  const float inv_dim = 1.0f / static_cast<float>(dim);
  float a[kVec], acc[kVec];
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    const int64_t c = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
    a[k] = c < dim ? q[c] * gk[c] : 0.0f;
    acc[k] = 0.0f;
  }
  float mx = -INFINITY, denom = 0.0f;
  for (int i = 0; i < S; ++i) {
    const T* v = static_cast<const T*>(src.ptr[i]) + row * dim;
    float vk[kVec];
    float red[2] = {0.0f, 0.0f};
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const int64_t c = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
      vk[k] = c < dim ? ToFloat(v[c]) : 0.0f;
      red[0] += vk[k] * vk[k];
      red[1] += a[k] * vk[k];
    }
    BlockSum<2>(red, scratch);
    const float logit = red[1] * rsqrtf(red[0] * inv_dim + eps);
    if (threadIdx.x == 0) logits[i] = logit;
    const float mx_new = fmaxf(mx, logit);
    const float scale = __expf(mx - mx_new);  // 0 on the first source
    const float e = __expf(logit - mx_new);
    denom = denom * scale + e;
#pragma unroll
    for (int k = 0; k < kVec; ++k) acc[k] = acc[k] * scale + e * vk[k];
    mx = mx_new;
  }
  const float inv_denom = 1.0f / denom;
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    acc[k] *= inv_denom;
    ss += acc[k] * acc[k];
  }
  ss = BlockSum1(ss, scratch);  // also orders the logits[] writes
  const float s = rsqrtf(ss * inv_dim + eps);
  for (int i = threadIdx.x; i < S; i += blockDim.x) {
    probs[row * S + i] = __expf(logits[i] - mx) * inv_denom;
  }
  if (threadIdx.x == 0) inv_rms_out[row] = s;
  T* yr = y + row * dim;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    const int64_t c = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
    if (c < dim) yr[c] = FromFloat<T>(acc[k] * s * go[c]);
  }
}

template <typename T>
__global__ void AttnResBackwardKernel(const T* __restrict__ dy, DbSourceList src, int S,
                                      const float* __restrict__ q,
                                      const float* __restrict__ gk,
                                      const float* __restrict__ go,
                                      const float* __restrict__ probs,
                                      const float* __restrict__ inv_rms_out, DbGradList dsrc,
                                      float* __restrict__ partials, int64_t rows, int64_t dim,
                                      float eps) {
  __shared__ float scratch[2 * kWarp];
  __shared__ float r_sh[DB_ATTNRES_MAX_SOURCES];
  __shared__ float logit_sh[DB_ATTNRES_MAX_SOURCES];
  __shared__ float dp_sh[DB_ATTNRES_MAX_SOURCES];
  const float inv_dim = 1.0f / static_cast<float>(dim);
  float* part_a = partials + static_cast<int64_t>(blockIdx.x) * 2 * dim;
  float* part_o = part_a + dim;
  float a[kVec], pa[kVec], po[kVec];
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    const int64_t c = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
    a[k] = c < dim ? q[c] * gk[c] : 0.0f;
    pa[k] = 0.0f;
    po[k] = 0.0f;
  }
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const float* p = probs + row * S;
    // Pass 1: r_i, logit_i and the mixture m.
    float m[kVec];
#pragma unroll
    for (int k = 0; k < kVec; ++k) m[k] = 0.0f;
    for (int i = 0; i < S; ++i) {
      const T* v = static_cast<const T*>(src.ptr[i]) + row * dim;
      const float pi = p[i];
      float red[2] = {0.0f, 0.0f};
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const int64_t c = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
        const float vv = c < dim ? ToFloat(v[c]) : 0.0f;
        red[0] += vv * vv;
        red[1] += a[k] * vv;
        m[k] += pi * vv;
      }
      BlockSum<2>(red, scratch);
      if (threadIdx.x == 0) {
        const float r = rsqrtf(red[0] * inv_dim + eps);
        r_sh[i] = r;
        logit_sh[i] = red[1] * r;
      }
    }
    // Output RMSNorm backward.
    const float s = inv_rms_out[row];
    const T* dyr = dy + row * dim;
    float gout[kVec];
    float sdot = 0.0f;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const int64_t c = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
      const float d = c < dim ? ToFloat(dyr[c]) : 0.0f;
      gout[k] = c < dim ? d * go[c] : 0.0f;
      sdot += gout[k] * m[k];
      po[k] += d * m[k] * s;
    }
    sdot = BlockSum1(sdot, scratch) * inv_dim;
    float dm[kVec];
#pragma unroll
    for (int k = 0; k < kVec; ++k) dm[k] = s * (gout[k] - m[k] * s * s * sdot);
    // Pass 2: dp_i = dm . v_i.
    for (int i = 0; i < S; ++i) {
      const T* v = static_cast<const T*>(src.ptr[i]) + row * dim;
      float t = 0.0f;
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const int64_t c = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
        if (c < dim) t += dm[k] * ToFloat(v[c]);
      }
      t = BlockSum1(t, scratch);
      if (threadIdx.x == 0) dp_sh[i] = t;
    }
    __syncthreads();
    float pdp = 0.0f;
    for (int i = 0; i < S; ++i) pdp += p[i] * dp_sh[i];
    // Pass 3: dv_i and the query partials.
    for (int i = 0; i < S; ++i) {
      const T* v = static_cast<const T*>(src.ptr[i]) + row * dim;
      T* dv = static_cast<T*>(dsrc.ptr[i]) + row * dim;
      const float pi = p[i];
      const float r = r_sh[i];
      const float dlogit = pi * (dp_sh[i] - pdp);
      const float coef = r * logit_sh[i] * inv_dim;
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const int64_t c = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
        if (c < dim) {
          const float vv = ToFloat(v[c]);
          dv[c] = FromFloat<T>(pi * dm[k] + dlogit * r * (a[k] - vv * coef));
          pa[k] += dlogit * r * vv;
        }
      }
    }
    __syncthreads();  // r_sh / logit_sh / dp_sh are rewritten by the next row
  }
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    const int64_t c = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
    if (c < dim) {
      part_a[c] = pa[k];
      part_o[c] = po[k];
    }
  }
}

__global__ void AttnResFinishKernel(const float* __restrict__ partials, int parts,
                                    const float* __restrict__ q, const float* __restrict__ gk,
                                    float* __restrict__ dq, float* __restrict__ dgk,
                                    float* __restrict__ dgo, int64_t dim) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= dim) return;
  float da = 0.0f, dgo_c = 0.0f;
  for (int p = 0; p < parts; ++p) {
    da += partials[(2 * static_cast<int64_t>(p)) * dim + c];
    dgo_c += partials[(2 * static_cast<int64_t>(p) + 1) * dim + c];
  }
  dq[c] = da * gk[c];
  dgk[c] = da * q[c];
  dgo[c] = dgo_c;
}

bool Supported(int S, int64_t dim) {
  return S >= 1 && S <= DB_ATTNRES_MAX_SOURCES && dim >= 1 && dim <= kVec * 1024;
}

}  // namespace
}  // namespace cuda
}  // namespace depthbench

extern "C" {

int DbAttnResMixForward(DbSourceList sources, int num_sources, const float* query,
                        const float* key_gain, const float* out_gain, void* y, float* probs,
                        float* inv_rms_out, int64_t rows, int64_t dim, float eps,
                        DbDtype dtype, void* stream) {
  using namespace depthbench::cuda;
  if (!Supported(num_sources, dim)) return static_cast<int>(cudaErrorInvalidValue);
  if (rows == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  const unsigned blocks = static_cast<unsigned>(rows);
  if (dtype == kDbBFloat16) {
    AttnResForwardKernel<__nv_bfloat16><<<blocks, VecThreads(dim), 0, s>>>(
        sources, num_sources, query, key_gain, out_gain, static_cast<__nv_bfloat16*>(y), probs,
        inv_rms_out, dim, eps);
  } else {
    AttnResForwardKernel<float><<<blocks, VecThreads(dim), 0, s>>>(
        sources, num_sources, query, key_gain, out_gain, static_cast<float*>(y), probs,
        inv_rms_out, dim, eps);
  }
  return static_cast<int>(cudaGetLastError());
}

int64_t DbAttnResMixWorkspaceFloats(int64_t rows, int64_t dim) {
  return 2 * static_cast<int64_t>(depthbench::cuda::PartialBlocks(rows)) * dim;
}

int DbAttnResMixBackward(const void* dy, DbSourceList sources, int num_sources,
                         const float* query, const float* key_gain, const float* out_gain,
                         const float* probs, const float* inv_rms_out, DbGradList dsources,
                         float* dquery, float* dkey_gain, float* dout_gain, float* workspace,
                         int64_t rows, int64_t dim, float eps, DbDtype dtype, void* stream) {
  using namespace depthbench::cuda;
  if (!Supported(num_sources, dim)) return static_cast<int>(cudaErrorInvalidValue);
  auto s = static_cast<cudaStream_t>(stream);
  const int parts = PartialBlocks(rows);
  if (rows > 0) {
    if (dtype == kDbBFloat16) {
      AttnResBackwardKernel<__nv_bfloat16><<<parts, VecThreads(dim), 0, s>>>(
          static_cast<const __nv_bfloat16*>(dy), sources, num_sources, query, key_gain,
          out_gain, probs, inv_rms_out, dsources, workspace, rows, dim, eps);
    } else {
      AttnResBackwardKernel<float><<<parts, VecThreads(dim), 0, s>>>(
          static_cast<const float*>(dy), sources, num_sources, query, key_gain, out_gain,
          probs, inv_rms_out, dsources, workspace, rows, dim, eps);
    }
    const int err = static_cast<int>(cudaGetLastError());
    if (err != 0) return err;
  } else {
    const int err = static_cast<int>(
        cudaMemsetAsync(workspace, 0, 2 * parts * dim * sizeof(float), s));
    if (err != 0) return err;
  }
  const int threads = 256;
  AttnResFinishKernel<<<static_cast<unsigned>((dim + threads - 1) / threads), threads, 0, s>>>(
      workspace, parts, query, key_gain, dquery, dkey_gain, dout_gain, dim);
  return static_cast<int>(cudaGetLastError());
}

}  // extern "C"
