// attnres_mix.cu as a differentiable LibTorch op. The sources are passed to
// the kernel as a pointer list (no torch::stack copy).
#include <c10/cuda/CUDAGuard.h>

#include "cuda_ops/torch_bindings.h"

namespace depthbench {
namespace fused {
namespace {

using namespace internal;

class AttnResMixFunction : public torch::autograd::Function<AttnResMixFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, torch::TensorList sources,
                               const torch::Tensor& query, const torch::Tensor& key_gain,
                               const torch::Tensor& out_gain, double eps) {
    const int64_t S = static_cast<int64_t>(sources.size());
    TORCH_CHECK(S >= 1 && S <= DB_ATTNRES_MAX_SOURCES, "AttnResMix: ", S, " sources");
    const torch::Tensor& v0 = sources[0];
    c10::cuda::CUDAGuard guard(v0.device());
    const int64_t d = v0.size(-1);
    const int64_t rows = d == 0 ? 0 : v0.numel() / d;
    DbSourceList list{};
    variable_list saved;
    for (int64_t i = 0; i < S; ++i) {
      TORCH_CHECK(sources[i].sizes() == v0.sizes() &&
                      sources[i].scalar_type() == v0.scalar_type(),
                  "AttnResMix: source ", i, " differs in shape or dtype from source 0");
      torch::Tensor c = sources[i].contiguous();
      list.ptr[i] = c.data_ptr();
      saved.push_back(c);
    }
    torch::Tensor q = query.to(torch::kFloat32).contiguous();
    torch::Tensor kg = key_gain.to(torch::kFloat32).contiguous();
    torch::Tensor og = out_gain.to(torch::kFloat32).contiguous();
    torch::Tensor y = torch::empty_like(saved[0]);
    torch::Tensor probs = torch::empty({rows, S}, og.options());
    torch::Tensor inv = torch::empty({rows}, og.options());
    Check(DbAttnResMixForward(list, static_cast<int>(S), q.data_ptr<float>(),
                              kg.data_ptr<float>(), og.data_ptr<float>(), y.data_ptr(),
                              probs.data_ptr<float>(), inv.data_ptr<float>(), rows, d,
                              static_cast<float>(eps), ToDbDtype(v0), CurrentStream(v0)),
          "AttnResMix forward");
    for (const torch::Tensor& t : {q, kg, og, probs, inv}) saved.push_back(t);
    ctx->save_for_backward(saved);
    ctx->saved_data["sources"] = S;
    ctx->saved_data["eps"] = eps;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list saved = ctx->get_saved_variables();
    const int64_t S = ctx->saved_data["sources"].toInt();
    const double eps = ctx->saved_data["eps"].toDouble();
    const torch::Tensor& v0 = saved[0];
    const torch::Tensor& q = saved[S];
    const torch::Tensor& kg = saved[S + 1];
    const torch::Tensor& og = saved[S + 2];
    const torch::Tensor& probs = saved[S + 3];
    const torch::Tensor& inv = saved[S + 4];
    c10::cuda::CUDAGuard guard(v0.device());
    const int64_t d = v0.size(-1);
    const int64_t rows = d == 0 ? 0 : v0.numel() / d;
    torch::Tensor dy = grads[0].to(v0.scalar_type()).contiguous();
    DbSourceList list{};
    DbGradList dlist{};
    variable_list out;
    for (int64_t i = 0; i < S; ++i) {
      list.ptr[i] = saved[i].data_ptr();
      out.push_back(torch::empty_like(saved[i]));
      dlist.ptr[i] = out.back().data_ptr();
    }
    torch::Tensor dq = torch::empty_like(q), dkg = torch::empty_like(kg),
                  dog = torch::empty_like(og);
    torch::Tensor ws = torch::empty({DbAttnResMixWorkspaceFloats(rows, d)}, og.options());
    Check(DbAttnResMixBackward(dy.data_ptr(), list, static_cast<int>(S), q.data_ptr<float>(),
                               kg.data_ptr<float>(), og.data_ptr<float>(),
                               probs.data_ptr<float>(), inv.data_ptr<float>(), dlist,
                               dq.data_ptr<float>(), dkg.data_ptr<float>(),
                               dog.data_ptr<float>(), ws.data_ptr<float>(), rows, d,
                               static_cast<float>(eps), ToDbDtype(v0), CurrentStream(v0)),
          "AttnResMix backward");
    out.push_back(dq);
    out.push_back(dkg);
    out.push_back(dog);
    out.push_back(torch::Tensor());  // eps
    return out;
  }
};

}  // namespace

torch::Tensor AttnResMix(const std::vector<torch::Tensor>& sources, const torch::Tensor& query,
                         const torch::Tensor& key_gain, const torch::Tensor& out_gain,
                         double eps) {
  return AttnResMixFunction::apply(torch::TensorList(sources), query, key_gain, out_gain, eps);
}

}  // namespace fused
}  // namespace depthbench
