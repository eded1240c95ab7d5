// swiglu.cu as a differentiable LibTorch op.
#include <c10/cuda/CUDAGuard.h>

#include "cuda_ops/torch_bindings.h"

namespace depthbench {
namespace fused {
namespace {

using namespace internal;

class SwiGluFunction : public torch::autograd::Function<SwiGluFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& g,
                               const torch::Tensor& u) {
    c10::cuda::CUDAGuard guard(g.device());
    TORCH_CHECK(g.sizes() == u.sizes() && g.scalar_type() == u.scalar_type(),
                "SwiGluGate: g and u differ in shape or dtype");
    torch::Tensor gc = g.contiguous(), uc = u.contiguous();
    torch::Tensor h = torch::empty_like(gc);
    Check(DbSwiGluForward(gc.data_ptr(), uc.data_ptr(), h.data_ptr(), gc.numel(),
                          ToDbDtype(gc), CurrentStream(gc)),
          "SwiGluGate forward");
    ctx->save_for_backward({gc, uc});
    return h;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list saved = ctx->get_saved_variables();
    const torch::Tensor& g = saved[0];
    const torch::Tensor& u = saved[1];
    c10::cuda::CUDAGuard guard(g.device());
    torch::Tensor dh = grads[0].to(g.scalar_type()).contiguous();
    torch::Tensor dg = torch::empty_like(g), du = torch::empty_like(u);
    Check(DbSwiGluBackward(dh.data_ptr(), g.data_ptr(), u.data_ptr(), dg.data_ptr(),
                           du.data_ptr(), g.numel(), ToDbDtype(g), CurrentStream(g)),
          "SwiGluGate backward");
    return {dg, du};
  }
};

}  // namespace

torch::Tensor SwiGluGate(const torch::Tensor& g, const torch::Tensor& u) {
  return SwiGluFunction::apply(g, u);
}

}  // namespace fused
}  // namespace depthbench
