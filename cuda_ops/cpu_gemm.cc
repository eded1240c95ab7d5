#include "cuda_ops/cpu_gemm.h"

#include <cstdlib>
#include <cstring>

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

class LinearFunction : public torch::autograd::Function<LinearFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x_in,
                               const torch::Tensor& w_in) {
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
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];
    const torch::Tensor& w = saved[1];
    torch::Tensor dy = grads[0].contiguous();
    const int64_t K = w.size(1), N = w.size(0), M = x.numel() / K;
    // out = op(a) op(b), [rows, cols] over `inner` products; zero when empty.
    auto product = [&](const torch::Tensor& like, char ta, char tb, int64_t rows, int64_t cols,
                       int64_t inner, const torch::Tensor& a, int64_t lda,
                       const torch::Tensor& b, int64_t ldb) {
      torch::Tensor out = torch::empty_like(like);
      if (M == 0 || N == 0) return out.zero_();
      Sgemm(ta, tb, rows, cols, inner, 1.0f, a.data_ptr<float>(), lda, b.data_ptr<float>(), ldb,
            0.0f, out.data_ptr<float>(), cols);
      return out;
    };
    torch::Tensor dx, dw;
    // dx [M, K] = dy [M, N] w [N, K]
    if (ctx->needs_input_grad(0)) dx = product(x, 'N', 'N', M, K, N, dy, N, w, K);
    // dw [N, K] = dy^T [N, M] x [M, K]
    if (ctx->needs_input_grad(1)) dw = product(w, 'T', 'N', N, K, M, dy, N, x, K);
    return {dx, dw};
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

torch::Tensor Linear(const torch::Tensor& x, const torch::Tensor& w) {
  TORCH_CHECK(Supports(x, w), "cpu_gemm::Linear: needs float32 CPU x [..., K] and w [N, K] ",
              "with oneDNN enabled; has x ", x.sizes(), " ", x.scalar_type(), ", w ", w.sizes(),
              " ", w.scalar_type(), " (", Description(), ")");
#ifdef DEPTHBENCH_HAVE_DNNL
  return LinearFunction::apply(x, w);
#else
  return torch::linear(x, w);
#endif
}

}  // namespace cpu_gemm
}  // namespace depthbench
