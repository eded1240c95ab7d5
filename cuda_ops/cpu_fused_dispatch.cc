// The cpu_fused:: entry points (cpu_fused.h): each runs the widest build of
// its kernel the CPU runs: AVX-512, AVX2 + FMA, or the baseline
// (cpu_fused_isa.h). The choice is made once per process. Also the helpers
// the builds share.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include <ATen/Parallel.h>

#include "cuda_ops/cpu_fused.h"
#include "cuda_ops/cpu_fused_isa.h"

namespace depthbench {
namespace cpu_fused {
namespace {

enum class Build { kGeneric, kAvx2, kAvx512 };

bool CpuHasAvx2() {
#if defined(DEPTHBENCH_CPU_FUSED_HAVE_AVX2) && defined(__GNUC__) && \
    (defined(__x86_64__) || defined(__i386__))
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

// libgcc's cpu model also checks that the OS saves the AVX-512 state (XCR0)
// before it reports these features.
bool CpuHasAvx512() {
#if defined(DEPTHBENCH_CPU_FUSED_HAVE_AVX512) && defined(__GNUC__) && \
    (defined(__x86_64__) || defined(__i386__))
  __builtin_cpu_init();
  return CpuHasAvx2() && __builtin_cpu_supports("avx512f") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512dq");
#else
  return false;
#endif
}

// DEPTHBENCH_CPU_FUSED_ISA=generic or avx2 caps the choice (to compare the
// builds, or to rule a wider one out); any other value is ignored.
Build Chosen() {
  static const Build use = [] {
    const char* forced = std::getenv("DEPTHBENCH_CPU_FUSED_ISA");
    if (forced != nullptr && std::strcmp(forced, "generic") == 0) return Build::kGeneric;
    const bool cap_avx2 = forced != nullptr && std::strcmp(forced, "avx2") == 0;
    if (!cap_avx2 && CpuHasAvx512()) return Build::kAvx512;
    return CpuHasAvx2() ? Build::kAvx2 : Build::kGeneric;
  }();
  return use;
}

}  // namespace

bool Avx2Available() { return CpuHasAvx2(); }
bool Avx512Available() { return CpuHasAvx512(); }
const char* KernelIsa() {
  switch (Chosen()) {
    case Build::kAvx512: return "avx512";
    case Build::kAvx2: return "avx2";
    default: return "generic";
  }
}

#if defined(DEPTHBENCH_CPU_FUSED_HAVE_AVX512)
#define DEPTHBENCH_CPU_FUSED_CALL(fn, ...)                                                \
  (Chosen() == Build::kAvx512 ? avx512::fn(__VA_ARGS__)                                   \
   : Chosen() == Build::kAvx2 ? avx2::fn(__VA_ARGS__)                                     \
                              : generic::fn(__VA_ARGS__))
#elif defined(DEPTHBENCH_CPU_FUSED_HAVE_AVX2)
#define DEPTHBENCH_CPU_FUSED_CALL(fn, ...) \
  (Chosen() == Build::kAvx2 ? avx2::fn(__VA_ARGS__) : generic::fn(__VA_ARGS__))
#else
#define DEPTHBENCH_CPU_FUSED_CALL(fn, ...) generic::fn(__VA_ARGS__)
#endif

torch::Tensor SumPartials(const std::vector<double>& partial, int64_t threads, int64_t count,
                          torch::IntArrayRef sizes, torch::ScalarType dtype) {
  torch::Tensor sum = torch::zeros({count}, torch::kFloat64);
  double* sp = sum.data_ptr<double>();
  for (int64_t t = 0; t < threads; ++t) {
    for (int64_t e = 0; e < count; ++e) sp[e] += partial[static_cast<size_t>(t * count + e)];
  }
  return sum.to(dtype).reshape(sizes);
}

namespace {
std::mutex owned_mu;
std::vector<c10::weak_intrusive_ptr<c10::TensorImpl>> owned;  // guarded by owned_mu

void PruneOwnedLocked() {
  owned.erase(std::remove_if(owned.begin(), owned.end(), [](const auto& w) { return w.expired(); }),
              owned.end());
}
}  // namespace

void MarkOwnedGradient(const torch::Tensor& grad) {
  if (!grad.defined()) return;
  std::lock_guard<std::mutex> lock(owned_mu);
  PruneOwnedLocked();
  owned.emplace_back(grad.getIntrusivePtr());
}

bool TakeOwnedGradient(const torch::Tensor& grad, torch::IntArrayRef sizes,
                       torch::ScalarType dtype, bool rows_any_layout) {
  if (!grad.defined()) return false;
  std::lock_guard<std::mutex> lock(owned_mu);
  PruneOwnedLocked();
  // A live weak reference's target address can only be this TensorImpl.
  const auto it = std::find_if(owned.begin(), owned.end(), [&](const auto& w) {
    return w._unsafe_get_target() == grad.unsafeGetTensorImpl();
  });
  if (it == owned.end()) return false;
  owned.erase(it);
  const bool layout = rows_any_layout
                          ? grad.is_non_overlapping_and_dense() && grad.stride(-1) == 1
                          : grad.is_contiguous();
  return layout && grad.sizes() == sizes && grad.scalar_type() == dtype;
}

bool Supports(std::initializer_list<const torch::Tensor*> tensors) {
  c10::optional<torch::ScalarType> dtype;
  for (const torch::Tensor* t : tensors) {
    if (!t->defined() || !t->device().is_cpu()) return false;
    const auto st = t->scalar_type();
    if (st != torch::kFloat32 && st != torch::kFloat64) return false;
    if (dtype && *dtype != st) return false;
    dtype = st;
  }
  return true;
}

bool SinkhornInRange(const torch::Tensor& logits) {
  // exp in double overflows past ~709; n^2 terms are summed. NaN fails too.
  if (logits.numel() == 0) return true;
  return logits.max().item<double>() <= 600.0;
}

void CheckCausalAttentionShapes(const char* op, const torch::Tensor& q, const torch::Tensor& k,
                                const torch::Tensor& v, const torch::Tensor& depth_keys,
                                const torch::Tensor& depth_values) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, op,
              ": q, k and v need [B, heads, T, head_dim], have ", q.sizes(), ", ", k.sizes(), ", ",
              v.sizes());
  TORCH_CHECK(k.sizes() == v.sizes() && k.size(0) == q.size(0) && k.size(2) == q.size(2) &&
                  k.size(3) == q.size(3) && k.size(1) >= 1 && q.size(1) % k.size(1) == 0,
              op, ": k ", k.sizes(), " and v ", v.sizes(), " must match q ", q.sizes(),
              " in batch, length and head dim, with a head count dividing q's");
  TORCH_CHECK(depth_keys.defined() == depth_values.defined(), op,
              ": depth keys and values come together");
  if (depth_keys.defined()) {
    TORCH_CHECK(depth_keys.dim() == 5 && depth_keys.sizes() == depth_values.sizes() &&
                    depth_keys.size(0) == q.size(0) && depth_keys.size(1) == q.size(1) &&
                    depth_keys.size(2) == q.size(2) && depth_keys.size(4) == q.size(3),
                op, ": depth keys ", depth_keys.sizes(), " and values ", depth_values.sizes(),
                " must be [B, H, T, S, head_dim] for q ", q.sizes());
  }
}

void CheckCausalAttentionQkvShapes(const char* op, const torch::Tensor& qkv, int64_t heads,
                                   int64_t kv_heads, const torch::Tensor& cos,
                                   const torch::Tensor& sin,
                                   const std::vector<torch::Tensor>& depth_keys,
                                   const std::vector<torch::Tensor>& depth_values) {
  TORCH_CHECK(heads >= 1 && kv_heads >= 1 && heads % kv_heads == 0, op, ": heads (", heads,
              ") must be a positive multiple of kv_heads (", kv_heads, ")");
  TORCH_CHECK(qkv.dim() == 4 && qkv.size(2) == heads + 2 * kv_heads, op,
              ": qkv needs [B, T, heads + 2 kv_heads = ", heads + 2 * kv_heads,
              ", head_dim], has ", qkv.sizes());
  const int64_t T = qkv.size(1), hd = qkv.size(3);
  TORCH_CHECK(hd % 2 == 0, op, ": the rotary embedding needs an even head_dim, qkv has ", hd);
  TORCH_CHECK(cos.dim() == 2 && cos.sizes() == sin.sizes() && cos.size(0) == T && cos.size(1) == hd,
              op, ": cos ", cos.sizes(), " and sin ", sin.sizes(), " must be [T = ", T,
              ", head_dim = ", hd, "]");
  TORCH_CHECK(cos.scalar_type() == qkv.scalar_type() && sin.scalar_type() == qkv.scalar_type(), op,
              ": cos and sin must have qkv's dtype ", qkv.scalar_type());
  TORCH_CHECK(!cos.requires_grad() && !sin.requires_grad(), op,
              ": cos and sin are tables and take no gradient");
  TORCH_CHECK(depth_keys.size() == depth_values.size(), op, ": ", depth_keys.size(),
              " depth key slots but ", depth_values.size(), " value slots");
  const int64_t B = qkv.size(0);
  for (size_t j = 0; j < depth_keys.size(); ++j) {
    for (const torch::Tensor* t : {&depth_keys[j], &depth_values[j]}) {
      const char* what = t == &depth_keys[j] ? "depth key" : "depth value";
      TORCH_CHECK(t->defined() && t->dim() == 4 && t->size(0) == B &&
                      (t->size(1) == heads || t->size(1) == kv_heads) && t->size(2) == T &&
                      t->size(3) == hd,
                  op, ": ", what, " slot ", j, " has ",
                  t->defined() ? t->sizes() : torch::IntArrayRef{}, ", expected [B = ", B,
                  ", heads ", heads, " or kv_heads ", kv_heads, ", T = ", T, ", head_dim = ", hd,
                  "]");
    }
  }
}

AdamWCoefficients AdamWCoefficients::For(double lr, double weight_decay, double beta1,
                                         double beta2, double eps, int64_t step) {
  const double bias_correction1 = 1 - std::pow(beta1, static_cast<double>(step));
  const double bias_correction2 = 1 - std::pow(beta2, static_cast<double>(step));
  AdamWCoefficients c;
  c.decay = static_cast<float>(1 - lr * weight_decay);
  c.beta1 = static_cast<float>(beta1);
  c.one_minus_beta1 = static_cast<float>(1 - beta1);
  c.beta2 = static_cast<float>(beta2);
  c.one_minus_beta2 = static_cast<float>(1 - beta2);
  c.sqrt_bias_correction2 = static_cast<float>(std::sqrt(bias_correction2));
  c.eps = static_cast<float>(eps);
  c.neg_step_size = static_cast<float>(-lr / bias_correction1);
  return c;
}

bool AdamWStepApplies(const torch::Tensor& param, const torch::Tensor& grad,
                      const torch::Tensor& exp_avg, const torch::Tensor& exp_avg_sq) {
  for (const torch::Tensor* t : {&param, &grad, &exp_avg, &exp_avg_sq}) {
    if (t == &grad && !grad.defined()) continue;
    if (!t->defined() || !t->device().is_cpu() || t->scalar_type() != torch::kFloat32 ||
        !t->is_contiguous() || t->sizes() != param.sizes()) {
      return false;
    }
  }
  return true;
}

void AdamWStep(const torch::Tensor& param, const torch::Tensor& grad, const torch::Tensor& exp_avg,
               const torch::Tensor& exp_avg_sq, const AdamWCoefficients& c) {
  TORCH_CHECK(AdamWStepApplies(param, grad, exp_avg, exp_avg_sq),
              "AdamWStep: param ", param.sizes(), ", grad ",
              grad.defined() ? grad.sizes() : torch::IntArrayRef{}, ", exp_avg ", exp_avg.sizes(),
              " and exp_avg_sq ", exp_avg_sq.sizes(),
              " must be contiguous float32 CPU tensors of one shape (grad may be undefined)");
  DEPTHBENCH_CPU_FUSED_CALL(AdamWStep, param, grad, exp_avg, exp_avg_sq, c);
}

torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  return DEPTHBENCH_CPU_FUSED_CALL(RmsNorm, x, weight, eps);
}
torch::Tensor SwiGluPacked(const torch::Tensor& gu) {
  return DEPTHBENCH_CPU_FUSED_CALL(SwiGluPacked, gu);
}
torch::Tensor HcRead(const torch::Tensor& h, const torch::Tensor& read) {
  return DEPTHBENCH_CPU_FUSED_CALL(HcRead, h, read);
}
torch::Tensor HcWrite(const torch::Tensor& h, const torch::Tensor& a, const torch::Tensor& b,
                      const torch::Tensor& y) {
  return DEPTHBENCH_CPU_FUSED_CALL(HcWrite, h, a, b, y);
}
torch::Tensor RmsProject(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  return DEPTHBENCH_CPU_FUSED_CALL(RmsProject, x, w, eps);
}
std::vector<torch::Tensor> HcCoefficients(const torch::Tensor& u, const torch::Tensor& static_a,
                                          const torch::Tensor& static_b,
                                          const torch::Tensor& gain_a,
                                          const torch::Tensor& gain_b) {
  return DEPTHBENCH_CPU_FUSED_CALL(HcCoefficients, u, static_a, static_b, gain_a, gain_b);
}
std::vector<torch::Tensor> MhcCoefficients(const torch::Tensor& u, const torch::Tensor& gains,
                                           const torch::Tensor& bias, int64_t n) {
  return DEPTHBENCH_CPU_FUSED_CALL(MhcCoefficients, u, gains, bias, n);
}
std::vector<torch::Tensor> MhcRoute(const torch::Tensor& h, const torch::Tensor& phi,
                                    const torch::Tensor& gains, const torch::Tensor& bias,
                                    int64_t n, double eps, RouteProjection projection) {
  const bool float32 = h.scalar_type() == torch::kFloat32 && phi.scalar_type() == torch::kFloat32;
  if (projection == RouteProjection::kGemm) {
    TORCH_CHECK(float32 && cpu_gemm::Enabled(), "MhcRoute: projection kGemm needs float32 h and ",
                "phi and oneDNN in use; has h ", h.scalar_type(), ", phi ", phi.scalar_type(),
                " (", cpu_gemm::Description(), ")");
  }
  // DEPTHBENCH_ROUTE_PROJECTION=fused turns kAuto's GEMMs off (to compare
  // the two in one model, designs_bench); any other value is ignored.
  static const bool auto_fused = [] {
    const char* e = std::getenv("DEPTHBENCH_ROUTE_PROJECTION");
    return e != nullptr && std::strcmp(e, "fused") == 0;
  }();
  // kAuto takes the GEMMs only where the route runs on one thread: oneDNN's
  // sgemm split over two threads gained less on these skinny shapes than the
  // fused loops' parallel_for (bench/RESULTS.md, session 23).
  const bool one_thread = at::in_parallel_region() || at::get_num_threads() == 1;
  const bool gemm = projection == RouteProjection::kGemm ||
                    (projection == RouteProjection::kAuto && !auto_fused && float32 &&
                     one_thread && cpu_gemm::Enabled());
  cpu_gemm::SgemmFn fn = gemm ? &cpu_gemm::Sgemm : nullptr;
  return DEPTHBENCH_CPU_FUSED_CALL(MhcRoute, h, phi, gains, bias, n, eps, fn);
}
std::vector<torch::Tensor> HcRoute(const torch::Tensor& h, const torch::Tensor& w,
                                   const torch::Tensor& static_a, const torch::Tensor& static_b,
                                   const torch::Tensor& gain_a, const torch::Tensor& gain_b,
                                   double eps) {
  return DEPTHBENCH_CPU_FUSED_CALL(HcRoute, h, w, static_a, static_b, gain_a, gain_b, eps);
}
std::vector<torch::Tensor> HcWriteRoute(const torch::Tensor& h, const torch::Tensor& a,
                                        const torch::Tensor& b, const torch::Tensor& y,
                                        const torch::Tensor& w, const torch::Tensor& static_a,
                                        const torch::Tensor& static_b, const torch::Tensor& gain_a,
                                        const torch::Tensor& gain_b, double eps) {
  return DEPTHBENCH_CPU_FUSED_CALL(HcWriteRoute, h, a, b, y, w, static_a, static_b, gain_a, gain_b,
                                   eps);
}
torch::Tensor Sinkhorn(const torch::Tensor& logits, int iterations, double eps) {
  return DEPTHBENCH_CPU_FUSED_CALL(Sinkhorn, logits, iterations, eps);
}
torch::Tensor AttnResMix(const std::vector<torch::Tensor>& sources, const torch::Tensor& query,
                         const torch::Tensor& key_gain, const torch::Tensor& out_gain,
                         double eps, std::vector<torch::Tensor>* passed) {
  return DEPTHBENCH_CPU_FUSED_CALL(AttnResMix, sources, query, key_gain, out_gain, eps, passed);
}

torch::Tensor CausalAttention(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, const torch::Tensor& depth_keys,
                              const torch::Tensor& depth_values, double scale) {
  return DEPTHBENCH_CPU_FUSED_CALL(CausalAttention, q, k, v, depth_keys, depth_values, scale);
}

std::vector<torch::Tensor> CausalAttentionQkv(const torch::Tensor& qkv, int64_t heads,
                                              int64_t kv_heads, const torch::Tensor& cos,
                                              const torch::Tensor& sin,
                                              const std::vector<torch::Tensor>& depth_keys,
                                              const std::vector<torch::Tensor>& depth_values,
                                              double scale, bool return_kv, bool pass_slots) {
  return DEPTHBENCH_CPU_FUSED_CALL(CausalAttentionQkv, qkv, heads, kv_heads, cos, sin, depth_keys,
                                   depth_values, scale, return_kv, pass_slots);
}

#undef DEPTHBENCH_CPU_FUSED_CALL

}  // namespace cpu_fused
}  // namespace depthbench
