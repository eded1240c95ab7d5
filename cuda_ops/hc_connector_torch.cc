// hc_connector.cu as differentiable LibTorch ops (read; residual-mix + write).
#include <c10/cuda/CUDAGuard.h>

#include "cuda_ops/torch_bindings.h"

namespace depthbench {
namespace fused {
namespace {

using namespace internal;

struct Dims {
  int64_t rows, n, d;
};
Dims StreamDims(const torch::Tensor& h) {
  const int64_t n = h.size(-2), d = h.size(-1);
  return {n * d == 0 ? 0 : h.numel() / (n * d), n, d};
}

class HcReadFunction : public torch::autograd::Function<HcReadFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& h,
                               const torch::Tensor& read) {
    c10::cuda::CUDAGuard guard(h.device());
    torch::Tensor hc = h.contiguous();
    torch::Tensor r = read.to(torch::kFloat32).contiguous();
    const Dims dims = StreamDims(hc);
    TORCH_CHECK(r.numel() == dims.rows * dims.n, "HcRead: read weights do not match h");
    std::vector<int64_t> xs(hc.sizes().begin(), hc.sizes().end() - 2);
    xs.push_back(dims.d);
    torch::Tensor x = torch::empty(xs, hc.options());
    Check(DbHcReadForward(hc.data_ptr(), r.data_ptr<float>(), x.data_ptr(), dims.rows,
                          static_cast<int>(dims.n), dims.d, ToDbDtype(hc), CurrentStream(hc)),
          "HcRead forward");
    ctx->save_for_backward({hc, r});
    return x;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list saved = ctx->get_saved_variables();
    const torch::Tensor& h = saved[0];
    const torch::Tensor& r = saved[1];
    c10::cuda::CUDAGuard guard(h.device());
    const Dims dims = StreamDims(h);
    torch::Tensor dx = grads[0].to(h.scalar_type()).contiguous();
    torch::Tensor dh = torch::empty_like(h), dr = torch::empty_like(r);
    Check(DbHcReadBackward(dx.data_ptr(), h.data_ptr(), r.data_ptr<float>(), dh.data_ptr(),
                           dr.data_ptr<float>(), dims.rows, static_cast<int>(dims.n), dims.d,
                           ToDbDtype(h), CurrentStream(h)),
          "HcRead backward");
    return {dh, dr};
  }
};

class HcWriteFunction : public torch::autograd::Function<HcWriteFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& h,
                               const torch::Tensor& a, const torch::Tensor& b,
                               const torch::Tensor& y) {
    c10::cuda::CUDAGuard guard(h.device());
    torch::Tensor hc = h.contiguous();
    torch::Tensor ac = a.defined() ? a.to(torch::kFloat32).contiguous() : torch::Tensor();
    torch::Tensor bc = b.to(torch::kFloat32).contiguous();
    torch::Tensor yc = y.to(h.scalar_type()).contiguous();
    const Dims dims = StreamDims(hc);
    TORCH_CHECK(bc.numel() == dims.rows * dims.n && yc.numel() == dims.rows * dims.d &&
                    (!ac.defined() || ac.numel() == dims.rows * dims.n * dims.n),
                "HcWrite: coefficient or branch shapes do not match h");
    torch::Tensor out = torch::empty_like(hc);
    Check(DbHcWriteForward(hc.data_ptr(), ac.defined() ? ac.data_ptr<float>() : nullptr,
                           bc.data_ptr<float>(), yc.data_ptr(), out.data_ptr(), dims.rows,
                           static_cast<int>(dims.n), dims.d, ToDbDtype(hc), CurrentStream(hc)),
          "HcWrite forward");
    ctx->save_for_backward({hc, ac, bc, yc});
    ctx->saved_data["y_dtype"] = static_cast<int64_t>(y.scalar_type());
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list saved = ctx->get_saved_variables();
    const torch::Tensor& h = saved[0];
    const torch::Tensor& a = saved[1];
    const torch::Tensor& b = saved[2];
    const torch::Tensor& y = saved[3];
    c10::cuda::CUDAGuard guard(h.device());
    const Dims dims = StreamDims(h);
    torch::Tensor g = grads[0].to(h.scalar_type()).contiguous();
    torch::Tensor dh = torch::empty_like(h), db = torch::empty_like(b), dy = torch::empty_like(y);
    torch::Tensor da = a.defined() ? torch::empty_like(a) : torch::Tensor();
    Check(DbHcWriteBackward(g.data_ptr(), h.data_ptr(), a.defined() ? a.data_ptr<float>() : nullptr,
                            b.data_ptr<float>(), y.data_ptr(), dh.data_ptr(),
                            da.defined() ? da.data_ptr<float>() : nullptr, db.data_ptr<float>(),
                            dy.data_ptr(), dims.rows, static_cast<int>(dims.n), dims.d,
                            ToDbDtype(h), CurrentStream(h)),
          "HcWrite backward");
    const auto ydtype = static_cast<c10::ScalarType>(ctx->saved_data["y_dtype"].toInt());
    return {dh, da, db, dy.to(ydtype)};
  }
};

}  // namespace

torch::Tensor HcRead(const torch::Tensor& h, const torch::Tensor& read) {
  return HcReadFunction::apply(h, read);
}

torch::Tensor HcWrite(const torch::Tensor& h, const torch::Tensor& a, const torch::Tensor& b,
                      const torch::Tensor& y) {
  return HcWriteFunction::apply(h, a, b, y);
}

}  // namespace fused
}  // namespace depthbench
