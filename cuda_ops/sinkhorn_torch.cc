// sinkhorn.cu as a differentiable LibTorch op (fp32; backward recomputes
// from the saved logits).
#include <c10/cuda/CUDAGuard.h>

#include "cuda_ops/torch_bindings.h"

namespace depthbench {
namespace fused {
namespace {

using namespace internal;

class SinkhornFunction : public torch::autograd::Function<SinkhornFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& logits,
                               int64_t iterations, double eps) {
    c10::cuda::CUDAGuard guard(logits.device());
    TORCH_CHECK(logits.scalar_type() == torch::kFloat32, "Sinkhorn: fp32 logits expected");
    torch::Tensor z = logits.contiguous();
    const int64_t n = z.size(-1);
    const int64_t batch = n == 0 ? 0 : z.numel() / (n * n);
    torch::Tensor out = torch::empty_like(z);
    Check(DbSinkhornForward(z.data_ptr<float>(), out.data_ptr<float>(), batch,
                            static_cast<int>(n), static_cast<int>(iterations),
                            static_cast<float>(eps), CurrentStream(z)),
          "Sinkhorn forward");
    ctx->save_for_backward({z});
    ctx->saved_data["iterations"] = iterations;
    ctx->saved_data["eps"] = eps;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const torch::Tensor z = ctx->get_saved_variables()[0];
    c10::cuda::CUDAGuard guard(z.device());
    const int64_t n = z.size(-1);
    const int64_t batch = n == 0 ? 0 : z.numel() / (n * n);
    torch::Tensor dout = grads[0].to(torch::kFloat32).contiguous();
    torch::Tensor dz = torch::empty_like(z);
    Check(DbSinkhornBackward(dout.data_ptr<float>(), z.data_ptr<float>(), dz.data_ptr<float>(),
                             batch, static_cast<int>(n),
                             static_cast<int>(ctx->saved_data["iterations"].toInt()),
                             static_cast<float>(ctx->saved_data["eps"].toDouble()),
                             CurrentStream(z)),
          "Sinkhorn backward");
    return {dz, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor Sinkhorn(const torch::Tensor& logits, int iterations, double eps) {
  return SinkhornFunction::apply(logits, static_cast<int64_t>(iterations), eps);
}

}  // namespace fused
}  // namespace depthbench
