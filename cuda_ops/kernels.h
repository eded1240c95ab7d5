// C-style launcher API of the fused CUDA kernels (one .cu file per op).
//
// This header includes no LibTorch and no CUDA header: it compiles with any
// C++ compiler, so the torch bindings (*_torch.cc), the raw-kernel tests and
// nvcc all see the same declarations. Streams are passed as `void*` holding a
// cudaStream_t (nullptr = the legacy default stream).
//
// Conventions shared by every launcher:
//   - Tensors are dense, row-major, contiguous; `rows` counts the flattened
//     leading dimensions (batch * time).
//   - DbDtype says what the activations are (x, sources, streams, dy); gains,
//     queries and routing coefficients (HC/mHC) are always fp32, and every
//     accumulation is fp32.
//   - Parameter gradients (dweight, dquery, ...) are reduced over rows inside
//     the launcher through a caller-provided fp32 workspace of
//     Db*WorkspaceFloats() floats; they are written (not accumulated).
//   - The return value is a cudaError_t as int (0 = success); a launcher
//     never synchronises the stream.
//
// Thread safety: launchers are reentrant; concurrent launches on one stream
// must not share a workspace.
#ifndef DEPTHBENCH_CUDA_OPS_KERNELS_H_
#define DEPTHBENCH_CUDA_OPS_KERNELS_H_

#include <cstdint>

extern "C" {

enum DbDtype { kDbFloat32 = 0, kDbBFloat16 = 1 };

// Most sources one AttnRes mixing site takes (2L + 1 for L <= 127).
#define DB_ATTNRES_MAX_SOURCES 256
// Stream counts n the HC connector and Sinkhorn kernels are instantiated
// for: 2, 4 and 8 (other n: cudaErrorInvalidValue; callers use the composite
// path). Sinkhorn takes at most 32 iterations.

// ---- RMSNorm with fused scale (rms_norm.cu) ----
// y = x * rsqrt(mean(x^2) + eps) * weight; inv_rms[row] is saved for backward.
int DbRmsNormForward(const void* x, const float* weight, void* y, float* inv_rms,
                     int64_t rows, int64_t dim, float eps, DbDtype dtype, void* stream);
int64_t DbRmsNormWorkspaceFloats(int64_t rows, int64_t dim);
int DbRmsNormBackward(const void* dy, const void* x, const float* weight,
                      const float* inv_rms, void* dx, float* dweight, float* workspace,
                      int64_t rows, int64_t dim, DbDtype dtype, void* stream);

// ---- SwiGLU gate (swiglu.cu) ----
// h = silu(g) * u, elementwise over n values.
int DbSwiGluForward(const void* g, const void* u, void* h, int64_t n, DbDtype dtype,
                    void* stream);
int DbSwiGluBackward(const void* dh, const void* g, const void* u, void* dg, void* du,
                     int64_t n, DbDtype dtype, void* stream);

// ---- AttnRes depth mixing (attnres_mix.cu) ----
// Per row, over S sources v_i [rows, dim] (each its own pointer):
//   logit_i = sum_c query_c key_gain_c v_ic rsqrt(mean(v_i^2) + eps)
//   p = softmax(logit);  m = sum_i p_i v_i
//   y = m * rsqrt(mean(m^2) + eps) * out_gain
// probs [rows, S] and inv_rms_out [rows] are saved for backward.
struct DbSourceList {
  const void* ptr[DB_ATTNRES_MAX_SOURCES];
};
struct DbGradList {
  void* ptr[DB_ATTNRES_MAX_SOURCES];
};
int DbAttnResMixForward(DbSourceList sources, int num_sources, const float* query,
                        const float* key_gain, const float* out_gain, void* y,
                        float* probs, float* inv_rms_out, int64_t rows, int64_t dim,
                        float eps, DbDtype dtype, void* stream);
int64_t DbAttnResMixWorkspaceFloats(int64_t rows, int64_t dim);
// Writes d sources, dquery, dkey_gain and dout_gain.
int DbAttnResMixBackward(const void* dy, DbSourceList sources, int num_sources,
                         const float* query, const float* key_gain, const float* out_gain,
                         const float* probs, const float* inv_rms_out, DbGradList dsources,
                         float* dquery, float* dkey_gain, float* dout_gain,
                         float* workspace, int64_t rows, int64_t dim, float eps,
                         DbDtype dtype, void* stream);

// ---- Sinkhorn-Knopp, log domain (sinkhorn.cu) ----
// For each of `batch` maps z [n, n] (fp32), `iterations` times:
//   z <- z - log(sum_j exp(z_rj) + eps)   (rows)
//   z <- z - log(sum_r exp(z_rj) + eps)   (columns)
// then out = exp(z). Backward recomputes from the logits (nothing saved but
// the input).
int DbSinkhornForward(const float* logits, float* out, int64_t batch, int n,
                      int iterations, float eps, void* stream);
int DbSinkhornBackward(const float* dout, const float* logits, float* dlogits,
                       int64_t batch, int n, int iterations, float eps, void* stream);

// ---- HC / mHC connector (hc_connector.cu) ----
// Streams h [rows, n, dim]; read weights [rows, n], residual map A [rows, n, n]
// (nullptr = identity: the HC code form), write weights b [rows, n]; fp32.
//   read:  x[c]     = sum_s read_s h_s[c]
//   write: h'_t[c]  = sum_s A[s, t] h_s[c] + b_t y[c]
int DbHcReadForward(const void* h, const float* read, void* x, int64_t rows, int n,
                    int64_t dim, DbDtype dtype, void* stream);
int DbHcReadBackward(const void* dx, const void* h, const float* read, void* dh,
                     float* dread, int64_t rows, int n, int64_t dim, DbDtype dtype,
                     void* stream);
int DbHcWriteForward(const void* h, const float* a, const float* b, const void* y,
                     void* out, int64_t rows, int n, int64_t dim, DbDtype dtype,
                     void* stream);
// da may be nullptr when a is nullptr.
int DbHcWriteBackward(const void* dout, const void* h, const float* a, const float* b,
                      const void* y, void* dh, float* da, float* db, void* dy,
                      int64_t rows, int n, int64_t dim, DbDtype dtype, void* stream);

}  // extern "C"

#endif  // DEPTHBENCH_CUDA_OPS_KERNELS_H_
