#include "cuda_ops/cpu_gemm.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#ifdef DEPTHBENCH_HAVE_DNNL
#include <dnnl.h>
#endif

namespace depthbench {
namespace cpu_gemm {
namespace {

bool BlasForced() {
  static const bool forced = [] {
    const char* e = std::getenv("DEPTHBENCH_CPU_GEMM");
    return e != nullptr && std::strcmp(e, "blas") == 0;
  }();
  return forced;
}

#ifdef DEPTHBENCH_HAVE_DNNL
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// y = x w^T, returned whole (parts 1) or as `parts` equal column blocks,
// views of y (MoDA's FFN K and V from one GEMM): each block's gradient comes
// back on its own, and the backward multiplies by the matching rows of w,
// where chunk's backward would first concatenate the blocks' gradients.
class LinearFunction : public torch::autograd::Function<LinearFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& x_in,
                               const torch::Tensor& w_in, int64_t parts) {
    torch::Tensor x = x_in.contiguous(), w = w_in.contiguous();
    const int64_t K = w.size(1), N = w.size(0), M = x.numel() / K;
    std::vector<int64_t> sizes = x.sizes().vec();
    sizes.back() = N;
    torch::Tensor y = torch::empty(sizes, x.options());
    if (M > 0 && N > 0) {
      // y [M, N] = x [M, K] w^T
      Sgemm('N', 'T', M, N, K, 1.0f, x.data_ptr<float>(), K, w.data_ptr<float>(), K, 0.0f,
            y.data_ptr<float>(), N);
    }
    ctx->save_for_backward({x, w});
    ctx->saved_data["parts"] = parts;
    if (parts == 1) return {y};
    return y.chunk(parts, /*dim=*/-1);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];
    const torch::Tensor& w = saved[1];
    const int64_t parts = ctx->saved_data["parts"].toInt();
    const int64_t K = w.size(1), N = w.size(0), M = x.numel() / K, Np = N / parts;
    torch::Tensor dx, dw;
    if (ctx->needs_input_grad(0)) dx = torch::empty_like(x);
    if (ctx->needs_input_grad(1)) dw = torch::empty_like(w);
    bool dx_written = false;
    for (int64_t p = 0; p < parts; ++p) {
      const float* wp = w.data_ptr<float>() + p * Np * K;
      float* dwp = dw.defined() ? dw.data_ptr<float>() + p * Np * K : nullptr;
      // An unused block's gradient is undefined: zero.
      if (!grads[p].defined() || M == 0 || Np == 0) {
        if (dwp != nullptr) std::fill(dwp, dwp + Np * K, 0.0f);
        continue;
      }
      const torch::Tensor dy = grads[p].contiguous();  // [M, Np]
      // dx [M, K] (+)= dy_p [M, Np] w_p [Np, K]
      if (dx.defined()) {
        Sgemm('N', 'N', M, K, Np, 1.0f, dy.data_ptr<float>(), Np, wp, K, dx_written ? 1.0f : 0.0f,
              dx.data_ptr<float>(), K);
        dx_written = true;
      }
      // dw_p [Np, K] = dy_p^T [Np, M] x [M, K]
      if (dwp != nullptr) {
        Sgemm('T', 'N', Np, K, M, 1.0f, dy.data_ptr<float>(), Np, x.data_ptr<float>(), K, 0.0f,
              dwp, K);
      }
    }
    if (dx.defined() && !dx_written) dx.zero_();
    return {dx, dw, torch::Tensor()};
  }
};
#endif

}  // namespace

bool Enabled() {
#ifdef DEPTHBENCH_HAVE_DNNL
  return !BlasForced();
#else
  return false;
#endif
}

std::string Description() {
#ifdef DEPTHBENCH_HAVE_DNNL
  if (BlasForced()) return "dense GEMMs: system BLAS (DEPTHBENCH_CPU_GEMM=blas)";
  return "dense GEMMs: oneDNN sgemm";
#else
  return "dense GEMMs: system BLAS (built without oneDNN)";
#endif
}

bool Supports(const torch::Tensor& x, const torch::Tensor& w) {
  return Enabled() && x.defined() && w.defined() && x.device().is_cpu() &&
         w.device().is_cpu() && x.scalar_type() == torch::kFloat32 &&
         w.scalar_type() == torch::kFloat32 && x.dim() >= 1 && w.dim() == 2 &&
         w.size(1) >= 1 && x.size(-1) == w.size(1);
}

void Sgemm(char trans_a, char trans_b, int64_t m, int64_t n, int64_t k, float alpha,
           const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
           int64_t ldc) {
  TORCH_CHECK(Enabled(), "cpu_gemm::Sgemm: oneDNN is not in use (", Description(), ")");
#ifdef DEPTHBENCH_HAVE_DNNL
  // oneDNN runs it on the OpenMP team of the calling thread,
  // single-threaded inside a parallel region (the trainer's micro-batches,
  // trainer_core/micro_batch.h).
  const dnnl_status_t status =
      dnnl_sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  TORCH_CHECK(status == dnnl_success, "cpu_gemm: dnnl_sgemm(", trans_a, trans_b, ", m=", m,
              ", n=", n, ", k=", k, ") failed with oneDNN status ", static_cast<int>(status));
#else
  (void)trans_a, (void)trans_b, (void)m, (void)n, (void)k, (void)alpha, (void)a, (void)lda;
  (void)b, (void)ldb, (void)beta, (void)c, (void)ldc;
#endif
}

namespace {

// Fails, naming `op`, unless Supports(x, w).
void CheckSupported(const char* op, const torch::Tensor& x, const torch::Tensor& w) {
  TORCH_CHECK(Supports(x, w), "cpu_gemm::", op, ": needs float32 CPU x [..., K] and w [N, K] ",
              "with oneDNN enabled; has x ", x.sizes(), " ", x.scalar_type(), ", w ", w.sizes(),
              " ", w.scalar_type(), " (", Description(), ")");
}

}  // namespace

torch::Tensor Linear(const torch::Tensor& x, const torch::Tensor& w) {
  CheckSupported("Linear", x, w);
#ifdef DEPTHBENCH_HAVE_DNNL
  return LinearFunction::apply(x, w, 1)[0];
#else
  return torch::linear(x, w);
#endif
}

std::vector<torch::Tensor> LinearChunks(const torch::Tensor& x, const torch::Tensor& w,
                                        int64_t parts) {
  TORCH_CHECK(parts >= 1 && w.dim() == 2 && w.size(0) % parts == 0,
              "cpu_gemm::LinearChunks: w's ", w.dim() == 2 ? w.size(0) : -1,
              " output rows do not split into ", parts, " equal parts");
  CheckSupported("LinearChunks", x, w);
#ifdef DEPTHBENCH_HAVE_DNNL
  return LinearFunction::apply(x, w, parts);
#else
  return torch::linear(x, w).chunk(parts, /*dim=*/-1);
#endif
}

}  // namespace cpu_gemm
}  // namespace depthbench
