// Dense layers' GEMMs on the CPU through oneDNN's sgemm.
//
// Every linear layer of the model (the packed Q/K/V and gate/up projections,
// the attention output, the FFN down projection and the LM head) is a float32
// GEMM that takes about 80% of a CPU training step at d = 512. LibTorch 1.13
// sends them to the system BLAS (OpenBLAS here). oneDNN, the CPU kernel
// library LibTorch itself is built with and loads (libdnnl.so.2, "MKL-DNN" in
// torch::show_config()), has a JIT sgemm that on this machine's AVX-512 runs
// the step's shapes 5-10% faster single-threaded (bench/RESULTS.md, session 16).
// LibTorch 1.13 does not route float32 matmuls to it (only bf16), so the
// trainer calls it here: y = x w^T forward, dx = dy w and dw = dy^T x in a
// hand-written backward.
//
// Built when CMake finds oneDNN's header and library (DEPTHBENCH_HAVE_DNNL);
// without them, or with DEPTHBENCH_CPU_GEMM=blas in the environment,
// Supports() is false and the callers take torch::linear (the system BLAS).
//
// Signals: oneDNN 2.6.3's sgemm corrupts the heap when a signal handler runs
// on the calling thread mid-call (bench/RESULTS.md, session 16). A process
// that calls Linear must install no signal handler; depthbench-train takes
// SIGTERM / SIGINT with sigwait() (trainer_core/main.cc).
#ifndef DEPTHBENCH_CUDA_OPS_CPU_GEMM_H_
#define DEPTHBENCH_CUDA_OPS_CPU_GEMM_H_

#include <torch/torch.h>

#include <string>
#include <vector>

namespace depthbench {
namespace cpu_gemm {

// True when this build has oneDNN and DEPTHBENCH_CPU_GEMM is not "blas".
bool Enabled();
// One line for logs: "oneDNN sgemm" or why the system BLAS serves instead.
std::string Description();
// True when Linear can take these: oneDNN enabled, both float32 on the CPU,
// x [..., K] and w [N, K] with K >= 1.
bool Supports(const torch::Tensor& x, const torch::Tensor& w);
// y = x w^T, [..., N], differentiable in x and w (backward through the same
// sgemm). Requires Supports(x, w).
torch::Tensor Linear(const torch::Tensor& x, const torch::Tensor& w);
// Linear(x, w).chunk(parts, -1) without chunk's backward concatenation: the
// parts are views of one output, and each part's gradient is multiplied by
// its own rows of w. Requires Supports(x, w) and w.size(0) % parts == 0.
std::vector<torch::Tensor> LinearChunks(const torch::Tensor& x, const torch::Tensor& w,
                                        int64_t parts);

// Row-major C [m, n] = alpha op(A) op(B) + beta C, op(A) [m, k], op(B) [k, n],
// 'T' reading the stored matrix transposed, through oneDNN's sgemm on the
// calling thread's OpenMP team (for kernels that hold raw buffers: the mHC
// route's projection, cpu_fused_mix.cc). Requires Enabled(); fails with the
// oneDNN status otherwise.
void Sgemm(char trans_a, char trans_b, int64_t m, int64_t n, int64_t k, float alpha,
           const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
           int64_t ldc);
using SgemmFn = decltype(&Sgemm);

}  // namespace cpu_gemm
}  // namespace depthbench

#endif  // DEPTHBENCH_CUDA_OPS_CPU_GEMM_H_
