// rms_norm.cu as a differentiable LibTorch op.
#include <c10/cuda/CUDAGuard.h>

#include "cuda_ops/torch_bindings.h"

namespace depthbench {
namespace fused {
namespace {

using namespace internal;

class RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, double eps) {
    c10::cuda::CUDAGuard guard(x.device());
    torch::Tensor xc = x.contiguous();
    torch::Tensor w = weight.to(torch::kFloat32).contiguous();
    const int64_t d = xc.size(-1);
    TORCH_CHECK(w.numel() == d, "RmsNorm: weight has ", w.numel(), " values, x has dim ", d);
    const int64_t rows = d == 0 ? 0 : xc.numel() / d;
    torch::Tensor y = torch::empty_like(xc);
    torch::Tensor inv = torch::empty({rows}, xc.options().dtype(torch::kFloat32));
    Check(DbRmsNormForward(xc.data_ptr(), w.data_ptr<float>(), y.data_ptr(),
                           inv.data_ptr<float>(), rows, d, static_cast<float>(eps),
                           ToDbDtype(xc), CurrentStream(xc)),
          "RmsNorm forward");
    ctx->save_for_backward({xc, w, inv});
    ctx->saved_data["weight_dtype"] = static_cast<int64_t>(weight.scalar_type());
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];
    const torch::Tensor& w = saved[1];
    const torch::Tensor& inv = saved[2];
    c10::cuda::CUDAGuard guard(x.device());
    torch::Tensor dy = grads[0].to(x.scalar_type()).contiguous();
    const int64_t d = x.size(-1);
    const int64_t rows = d == 0 ? 0 : x.numel() / d;
    torch::Tensor dx = torch::empty_like(x);
    torch::Tensor dw = torch::empty({d}, w.options());
    torch::Tensor ws = torch::empty({DbRmsNormWorkspaceFloats(rows, d)}, w.options());
    Check(DbRmsNormBackward(dy.data_ptr(), x.data_ptr(), w.data_ptr<float>(),
                            inv.data_ptr<float>(), dx.data_ptr(), dw.data_ptr<float>(),
                            ws.data_ptr<float>(), rows, d, ToDbDtype(x), CurrentStream(x)),
          "RmsNorm backward");
    const auto wdtype = static_cast<c10::ScalarType>(ctx->saved_data["weight_dtype"].toInt());
    return {dx, dw.to(wdtype), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  return RmsNormFunction::apply(x, weight, eps);
}

}  // namespace fused
}  // namespace depthbench
