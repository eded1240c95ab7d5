#include "cuda_ops/ops.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "cuda_ops/cpu_fused.h"
#include "cuda_ops/cpu_gemm.h"
#include "cuda_ops/reference.h"
#ifdef DEPTHBENCH_HAVE_FUSED_OPS
#include "cuda_ops/torch_bindings.h"
#endif

namespace depthbench {
namespace {

std::atomic<bool> g_enabled{true};

// What runs fused on CPU tensors (cpu_fused.h), for FusedOpsDescription.
constexpr const char* kCpuFused =
    "CPU: fused RMSNorm, causal attention (with RoPE on the packed Q/K/V), HC/mHC routing "
    "projection, coefficients and read-write (each connector's projection, coefficients and "
    "read as one op), Sinkhorn, AttnRes mix, SwiGLU gate on the packed projection";

bool CpuFused(std::initializer_list<const torch::Tensor*> tensors) {
  return g_enabled.load(std::memory_order_relaxed) && cpu_fused::Supports(tensors);
}

#ifdef DEPTHBENCH_HAVE_FUSED_OPS
// Sizes the kernels are instantiated for (kernels.h).
bool StreamsSupported(int64_t n) { return n == 2 || n == 4 || n == 8; }
constexpr int64_t kMaxAttnResDim = 8 * 1024;
constexpr int64_t kMaxAttnResSources = DB_ATTNRES_MAX_SOURCES;
constexpr int kMaxSinkhornIterations = 32;

bool Fused(std::initializer_list<const torch::Tensor*> tensors) {
  if (!g_enabled.load(std::memory_order_relaxed)) return false;
  for (const torch::Tensor* t : tensors) {
    if (t->defined() && !t->is_cuda()) return false;
  }
  return true;
}
bool IsFloat(const torch::Tensor& t) {
  return !t.defined() || t.scalar_type() == torch::kFloat32;
}
#endif

// DEPTHBENCH_CPU_ATTENTION=composite: CausalAttentionOp runs the composite
// on CPU too (benchmarks compare the two in one binary).
bool CpuAttentionFused() {
  static const bool fused = [] {
    const char* e = std::getenv("DEPTHBENCH_CPU_ATTENTION");
    return e == nullptr || std::strcmp(e, "composite") != 0;
  }();
  return fused;
}

// Query chunks of the composite causal attention at length T (no depth
// keys): 4 from T = 128, 2 from 64, else 1 (one T x T score matrix).
// DEPTHBENCH_ATTN_CHUNKS overrides it (tests compare 1 against the default).
int64_t CausalChunks(int64_t T) {
  if (const char* e = std::getenv("DEPTHBENCH_ATTN_CHUNKS")) {
    return std::clamp<int64_t>(std::atoll(e), 1, std::max<int64_t>(T, 1));
  }
  return T >= 128 ? 4 : T >= 64 ? 2 : 1;
}

// The additive causal mask [T, T] (-inf above the diagonal). Every attention
// call of a step asks for the same one: keep the last built (per thread; the
// tensor is only read by its users).
torch::Tensor CausalMask(int64_t T, const torch::TensorOptions& options) {
  thread_local torch::Tensor cached;
  if (!cached.defined() || cached.size(0) != T || cached.device() != options.device() ||
      cached.scalar_type() != c10::typeMetaToScalarType(options.dtype())) {
    cached = torch::full({T, T}, -std::numeric_limits<float>::infinity(), options).triu(1);
  }
  return cached;
}

torch::Tensor CompositeCausalAttention(const torch::Tensor& q, const torch::Tensor& k_in,
                                       const torch::Tensor& v_in, const torch::Tensor& depth_keys,
                                       const torch::Tensor& depth_values, double scale) {
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), hd = q.size(3);
  const int64_t groups = H / k_in.size(1);
  torch::Tensor k = groups == 1 ? k_in : k_in.repeat_interleave(groups, /*dim=*/1);
  torch::Tensor v = groups == 1 ? v_in : v_in.repeat_interleave(groups, /*dim=*/1);
  // scale * q k^T + mask in one batched GEMM (beta = 1 adds the mask).
  const torch::Tensor mask = CausalMask(T, q.options());
  torch::Tensor qf = q.reshape({B * H, T, hd});
  torch::Tensor kt = k.transpose(-2, -1).reshape({B * H, hd, T});
  torch::Tensor vf = v.reshape({B * H, T, hd});
  torch::Tensor out;
  const int64_t chunks = depth_keys.defined() ? 1 : CausalChunks(T);
  if (chunks > 1) {
    // By query chunks: chunk c's queries only see keys [0, end_c), so the
    // score, softmax and probability-times-V passes (and their backward) skip
    // most of the masked upper triangle (10/16 of the T x T work with 4
    // chunks). Same values up to GEMM blocking: the skipped entries are
    // exactly zero after the softmax.
    const int64_t len = (T + chunks - 1) / chunks;
    std::vector<torch::Tensor> qc = qf.split(len, 1), outs;
    int64_t t0 = 0;
    for (const torch::Tensor& qi : qc) {
      const int64_t n = qi.size(1), end = t0 + n;
      torch::Tensor s = torch::baddbmm(mask.narrow(0, t0, n).narrow(1, 0, end), qi,
                                       end == T ? kt : kt.narrow(2, 0, end), /*beta=*/1.0,
                                       /*alpha=*/scale);
      outs.push_back(torch::bmm(torch::softmax(s, -1), end == T ? vf : vf.narrow(1, 0, end)));
      t0 = end;
    }
    out = torch::cat(outs, 1).view({B, H, T, hd});
  } else {
    torch::Tensor scores =
        torch::baddbmm(mask, qf, kt, /*beta=*/1.0, /*alpha=*/scale).view({B, H, T, T});
    if (!depth_keys.defined()) {
      out = torch::matmul(torch::softmax(scores, -1), v);
    } else {
      // Same-token depth scores: [B, H, T, S].
      torch::Tensor depth_scores = (q.unsqueeze(3) * depth_keys).sum(-1) * scale;
      torch::Tensor probs = torch::softmax(torch::cat({scores, depth_scores}, -1), -1);
      torch::Tensor p_seq = probs.narrow(-1, 0, T);
      torch::Tensor p_depth = probs.narrow(-1, T, depth_scores.size(-1));
      out = torch::matmul(p_seq, v) + (p_depth.unsqueeze(-1) * depth_values).sum(3);
    }
  }
  return out.transpose(1, 2).contiguous().view({B, T, H * hd});
}

}  // namespace

bool FusedOpsCompiled() {
#ifdef DEPTHBENCH_HAVE_FUSED_OPS
  return true;
#else
  return false;
#endif
}

bool FusedOpsAvailable() {
#ifdef DEPTHBENCH_HAVE_FUSED_OPS
  return g_enabled.load() && fused::CudaDeviceAvailable();
#else
  return false;
#endif
}

std::string FusedOpsDescription() {
  // The dense GEMMs' library is independent of the fused-op switch.
  const std::string gemm = "; CPU " + cpu_gemm::Description();
  if (!g_enabled.load()) return "composite ops (fused ops disabled)" + gemm;
#ifdef DEPTHBENCH_HAVE_FUSED_OPS
  if (!fused::CudaDeviceAvailable())
    return "fused CUDA ops compiled, no CUDA device; " + std::string(kCpuFused) + gemm;
  return "fused CUDA ops; " + std::string(kCpuFused) + gemm;
#else
  return std::string(kCpuFused) + gemm +
         " (fused CUDA ops not built: no nvcc or LibTorch built without CUDA)";
#endif
}

void SetFusedOpsEnabled(bool enabled) { g_enabled.store(enabled); }

torch::Tensor RmsNormOp(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
#ifdef DEPTHBENCH_HAVE_FUSED_OPS
  if (Fused({&x, &weight}) && fused::KernelDtype(x) && IsFloat(weight)) {
    return fused::RmsNorm(x, weight, eps);
  }
#endif
  if (g_enabled.load(std::memory_order_relaxed) && cpu_fused::Supports({&x, &weight})) {
    return cpu_fused::RmsNorm(x, weight, eps);
  }
  return reference::RmsNorm(x, weight, eps);
}

torch::Tensor RmsNormalizeOp(const torch::Tensor& x, double eps) {
  return RmsNormOp(x, torch::ones({x.size(-1)}, x.options()), eps);
}

torch::Tensor RmsProjectOp(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  TORCH_CHECK(x.dim() >= 1 && w.dim() == 2 && w.size(0) == x.size(-1), "RmsProjectOp: w has ",
              w.sizes(), ", expected [", x.dim() >= 1 ? x.size(-1) : 0, ", m] for x of shape ",
              x.sizes());
  if (CpuFused({&x, &w})) return cpu_fused::RmsProject(x, w, eps);
  return torch::matmul(RmsNormalizeOp(x, eps), w);
}

HcCoefficientTensors HcCoefficientsOp(const torch::Tensor& u, const torch::Tensor& static_a,
                                      const torch::Tensor& static_b, const torch::Tensor& gain_a,
                                      const torch::Tensor& gain_b) {
  const int64_t n = static_b.numel();
  TORCH_CHECK(u.dim() >= 2 && u.size(-2) == n && u.size(-1) == n + 2, "HcCoefficientsOp: u has ",
              u.sizes(), ", expected [..., ", n, ", ", n + 2, "] for ", n, " streams");
  TORCH_CHECK(static_a.numel() == n * (n + 1) && gain_a.numel() == 1 && gain_b.numel() == 1,
              "HcCoefficientsOp: static_a ", static_a.sizes(), ", gain_a ", gain_a.sizes(),
              ", gain_b ", gain_b.sizes(), " do not match ", n, " streams");
  if (CpuFused({&u, &static_a, &static_b, &gain_a, &gain_b})) {
    std::vector<torch::Tensor> ab = cpu_fused::HcCoefficients(u, static_a, static_b, gain_a, gain_b);
    return {ab[0], ab[1]};
  }
  std::vector<torch::Tensor> t = torch::tanh(u).split_with_sizes({n + 1, 1}, -1);
  return {static_a + gain_a * t[0], static_b + gain_b * t[1].squeeze(-1)};
}

MhcCoefficientTensors MhcCoefficientsOp(const torch::Tensor& u, const torch::Tensor& gains,
                                        const torch::Tensor& bias, int64_t n) {
  const int64_t m = n * n + 2 * n;
  TORCH_CHECK(n >= 1 && u.dim() >= 1 && u.size(-1) == m, "MhcCoefficientsOp: u has ", u.sizes(),
              ", expected [..., ", m, "] for ", n, " streams");
  TORCH_CHECK(gains.numel() == 3 && bias.numel() == m, "MhcCoefficientsOp: gains ", gains.sizes(),
              " and bias ", bias.sizes(), ", expected [3] and [", m, "]");
  if (CpuFused({&u, &gains, &bias})) {
    std::vector<torch::Tensor> c = cpu_fused::MhcCoefficients(u, gains, bias, n);
    return {c[0], c[1], c[2]};
  }
  torch::Tensor g = torch::cat({gains.narrow(0, 0, 1).expand({n}), gains.narrow(0, 1, 1).expand({n}),
                                gains.narrow(0, 2, 1).expand({n * n})});
  torch::Tensor z = u * g + bias;
  std::vector<int64_t> sq(z.sizes().begin(), z.sizes().end() - 1);
  sq.push_back(n);
  sq.push_back(n);
  return {torch::sigmoid(z.narrow(-1, 0, n)), 2.0 * torch::sigmoid(z.narrow(-1, n, n)),
          z.narrow(-1, 2 * n, n * n).reshape(sq)};
}

HcRouteTensors HcRouteOp(const torch::Tensor& h, const torch::Tensor& w,
                         const torch::Tensor& static_a, const torch::Tensor& static_b,
                         const torch::Tensor& gain_a, const torch::Tensor& gain_b, double eps) {
  const int64_t n = static_b.numel();
  TORCH_CHECK(n >= 1 && h.dim() >= 2 && h.size(-2) == n, "HcRouteOp: h has ", h.sizes(),
              ", expected [..., ", n, ", d] for static_b's ", n, " streams");
  TORCH_CHECK(w.dim() == 2 && w.size(0) == h.size(-1) && w.size(1) == n + 2, "HcRouteOp: w has ",
              w.sizes(), ", expected [", h.size(-1), ", ", n + 2, "]");
  if (CpuFused({&h, &w, &static_a, &static_b, &gain_a, &gain_b})) {
    std::vector<torch::Tensor> r =
        cpu_fused::HcRoute(h, w, static_a, static_b, gain_a, gain_b, eps);
    return {r[0], r[1], r[2], r[3]};
  }
  // The routing runs in w's precision (fp32 in the model, h may be bf16).
  torch::Tensor u = RmsProjectOp(h.to(w.scalar_type()), w, eps);
  HcCoefficientTensors c = HcCoefficientsOp(u, static_a, static_b, gain_a, gain_b);
  return {HcReadOp(h, c.a.select(-1, 0)), c.a.narrow(-1, 1, n), c.b, h};
}

HcRouteTensors HcWriteRouteOp(const torch::Tensor& h, const torch::Tensor& a,
                              const torch::Tensor& b, const torch::Tensor& y,
                              const torch::Tensor& w, const torch::Tensor& static_a,
                              const torch::Tensor& static_b, const torch::Tensor& gain_a,
                              const torch::Tensor& gain_b, double eps) {
  if (CpuFused({&h, &b, &y, &w, &static_a, &static_b, &gain_a, &gain_b}) &&
      (!a.defined() || CpuFused({&h, &a}))) {
    std::vector<torch::Tensor> r =
        cpu_fused::HcWriteRoute(h, a, b, y, w, static_a, static_b, gain_a, gain_b, eps);
    return {r[0], r[1], r[2], r[3]};
  }
  return HcRouteOp(HcWriteOp(h, a, b, y), w, static_a, static_b, gain_a, gain_b, eps);
}

MhcRouteTensors MhcRouteOp(const torch::Tensor& h, const torch::Tensor& phi,
                           const torch::Tensor& gains, const torch::Tensor& bias, int64_t n,
                           double eps) {
  TORCH_CHECK(n >= 1 && h.dim() >= 2 && h.size(-2) == n, "MhcRouteOp: h has ", h.sizes(),
              ", expected [..., ", n, ", d]");
  TORCH_CHECK(phi.dim() == 2 && phi.size(0) == n * h.size(-1) && phi.size(1) == n * n + 2 * n,
              "MhcRouteOp: phi has ", phi.sizes(), ", expected [", n * h.size(-1), ", ",
              n * n + 2 * n, "]");
  if (CpuFused({&h, &phi, &gains, &bias})) {
    std::vector<torch::Tensor> r = cpu_fused::MhcRoute(h, phi, gains, bias, n, eps);
    return {r[0], r[1], r[2], r[3]};
  }
  // The routing runs in phi's precision (fp32 in the model, h may be bf16).
  torch::Tensor u = RmsProjectOp(h.to(phi.scalar_type()).flatten(-2), phi, eps);
  MhcCoefficientTensors c = MhcCoefficientsOp(u, gains, bias, n);
  return {HcReadOp(h, c.read), c.write, c.logits, h};
}

torch::Tensor SwiGluGateOp(const torch::Tensor& g, const torch::Tensor& u) {
#ifdef DEPTHBENCH_HAVE_FUSED_OPS
  if (Fused({&g, &u}) && fused::KernelDtype(g) && g.scalar_type() == u.scalar_type() &&
      g.sizes() == u.sizes()) {
    return fused::SwiGluGate(g, u);
  }
#endif
  return reference::SwiGluGate(g, u);
}

namespace {

// Fails, naming `op`, unless x [..., K] and w [N, K] agree in K.
void CheckLinearShapes(const char* op, const torch::Tensor& x, const torch::Tensor& w) {
  TORCH_CHECK(x.dim() >= 1 && w.dim() == 2 && x.size(-1) == w.size(1), op,
              ": x [..., K] and w [N, K] must agree in K; has x ", x.sizes(), ", w ", w.sizes());
}

}  // namespace

torch::Tensor LinearOp(const torch::Tensor& x, const torch::Tensor& w) {
  CheckLinearShapes("LinearOp", x, w);
  if (cpu_gemm::Supports(x, w)) return cpu_gemm::Linear(x, w);
  return torch::linear(x, w);
}

std::vector<torch::Tensor> LinearChunksOp(const torch::Tensor& x, const torch::Tensor& w,
                                          int64_t parts) {
  CheckLinearShapes("LinearChunksOp", x, w);
  TORCH_CHECK(parts >= 1 && w.size(0) % parts == 0, "LinearChunksOp: w's ", w.size(0),
              " output rows do not split into ", parts, " equal parts");
  if (cpu_gemm::Supports(x, w)) return cpu_gemm::LinearChunks(x, w, parts);
  // Elsewhere chunk's backward concatenates the parts' gradients.
  return torch::linear(x, w).chunk(parts, /*dim=*/-1);
}

torch::Tensor SwiGluPackedOp(const torch::Tensor& gu) {
  TORCH_CHECK(gu.dim() >= 1 && gu.size(-1) % 2 == 0,
              "SwiGluPackedOp: gu needs [..., 2 F] (gate, then up), has ", gu.sizes());
  if (CpuFused({&gu})) return cpu_fused::SwiGluPacked(gu);
  std::vector<torch::Tensor> g_u = gu.chunk(2, /*dim=*/-1);
  return SwiGluGateOp(g_u[0], g_u[1]);
}

torch::Tensor AttnResMixOp(const std::vector<torch::Tensor>& sources,
                           const torch::Tensor& query, const torch::Tensor& key_gain,
                           const torch::Tensor& out_gain, double eps,
                           std::vector<torch::Tensor>* passed) {
  TORCH_CHECK(!sources.empty(), "AttnResMixOp: no sources");
  if (passed != nullptr) *passed = sources;  // the fused CPU path replaces them
#ifdef DEPTHBENCH_HAVE_FUSED_OPS
  const torch::Tensor& v0 = sources[0];
  bool ok = Fused({&v0, &query, &key_gain, &out_gain}) && fused::KernelDtype(v0) &&
            IsFloat(query) && IsFloat(key_gain) && IsFloat(out_gain) &&
            static_cast<int64_t>(sources.size()) <= kMaxAttnResSources &&
            v0.size(-1) <= kMaxAttnResDim;
  for (const auto& s : sources) {
    ok = ok && s.is_cuda() && s.sizes() == v0.sizes() && s.scalar_type() == v0.scalar_type();
  }
  if (ok) {
    const auto opts = out_gain.options();
    torch::Tensor q = query.defined() ? query : torch::zeros_like(out_gain);
    torch::Tensor kg = key_gain.defined() ? key_gain : torch::ones({v0.size(-1)}, opts);
    return fused::AttnResMix(sources, q, kg, out_gain, eps);
  }
#endif
  {
    const torch::Tensor& s0 = sources[0];
    bool cpu = CpuFused({&s0, &out_gain}) && s0.dim() >= 1 && out_gain.numel() == s0.size(-1) &&
               (!query.defined() || (CpuFused({&s0, &query, &key_gain}) &&
                                     query.numel() == s0.size(-1) &&
                                     key_gain.numel() == s0.size(-1)));
    for (const auto& s : sources) cpu = cpu && CpuFused({&s0, &s}) && s.sizes() == s0.sizes();
    if (cpu) return cpu_fused::AttnResMix(sources, query, key_gain, out_gain, eps, passed);
  }
  return reference::AttnResMix(sources, query, key_gain, out_gain, eps);
}

torch::Tensor SinkhornOp(const torch::Tensor& logits, int iterations, double eps) {
#ifdef DEPTHBENCH_HAVE_FUSED_OPS
  if (Fused({&logits}) && logits.scalar_type() == torch::kFloat32 && logits.dim() >= 2 &&
      logits.size(-1) == logits.size(-2) && StreamsSupported(logits.size(-1)) &&
      iterations >= 0 && iterations <= kMaxSinkhornIterations && eps > 0) {
    return fused::Sinkhorn(logits, iterations, eps);
  }
#endif
  if (CpuFused({&logits}) && logits.dim() >= 2 && logits.size(-1) == logits.size(-2) &&
      logits.size(-1) <= cpu_fused::kMaxSinkhornStreams && iterations >= 0 &&
      iterations <= cpu_fused::kMaxSinkhornIterations && eps > 0 &&
      cpu_fused::SinkhornInRange(logits)) {
    return cpu_fused::Sinkhorn(logits, iterations, eps);
  }
  return reference::Sinkhorn(logits, iterations, eps);
}

torch::Tensor CausalAttentionOp(const torch::Tensor& q, const torch::Tensor& k,
                                const torch::Tensor& v, const torch::Tensor& depth_keys,
                                const torch::Tensor& depth_values, double scale) {
  cpu_fused::CheckCausalAttentionShapes("CausalAttentionOp", q, k, v, depth_keys, depth_values);
  const bool depth = depth_keys.defined() && depth_keys.numel() > 0;
  const torch::Tensor none;
  const torch::Tensor& dk = depth ? depth_keys : none;
  const torch::Tensor& dv = depth ? depth_values : none;
  if (CpuAttentionFused() && CpuFused({&q, &k, &v}) && (!depth || CpuFused({&q, &dk, &dv}))) {
    return cpu_fused::CausalAttention(q, k, v, dk, dv, scale);
  }
  return CompositeCausalAttention(q, k, v, dk, dv, scale);
}

torch::Tensor RopeRotate(const torch::Tensor& x, const torch::Tensor& cos,
                         const torch::Tensor& sin) {
  // cat(x2, x1) as one flip of the two halves: one pass forward and one
  // backward (two slices + cat would zero-fill and add in the backward).
  std::vector<int64_t> halves = x.sizes().vec();
  halves.back() = 2;
  halves.push_back(x.size(-1) / 2);
  torch::Tensor swapped = x.view(halves).flip({-2}).view(x.sizes());
  return torch::addcmul(x * cos, swapped, sin);
}

torch::Tensor CausalAttentionQkvOp(const torch::Tensor& qkv, int64_t heads, int64_t kv_heads,
                                   const torch::Tensor& cos, const torch::Tensor& sin,
                                   const std::vector<torch::Tensor>& depth_keys,
                                   const std::vector<torch::Tensor>& depth_values, double scale,
                                   std::pair<torch::Tensor, torch::Tensor>* own_kv,
                                   DepthSlotLists* passed_slots) {
  if (passed_slots != nullptr) *passed_slots = {depth_keys, depth_values};  // fused: replaced
  cpu_fused::CheckCausalAttentionQkvShapes("CausalAttentionQkvOp", qkv, heads, kv_heads, cos, sin,
                                           depth_keys, depth_values);
  bool fused = CpuAttentionFused() && CpuFused({&qkv, &cos, &sin});
  for (const torch::Tensor& t : depth_keys) fused = fused && CpuFused({&qkv, &t});
  for (const torch::Tensor& t : depth_values) fused = fused && CpuFused({&qkv, &t});
  if (fused) {
    std::vector<torch::Tensor> r =
        cpu_fused::CausalAttentionQkv(qkv, heads, kv_heads, cos, sin, depth_keys, depth_values,
                                      scale, own_kv != nullptr, passed_slots != nullptr);
    const size_t S = depth_keys.size(), first = own_kv != nullptr ? 3 : 1;
    if (own_kv != nullptr) *own_kv = {r[1], r[2]};
    if (passed_slots != nullptr) {
      passed_slots->first.assign(r.begin() + first, r.begin() + first + S);
      passed_slots->second.assign(r.begin() + first + S, r.begin() + first + 2 * S);
    }
    return r[0];
  }
  if (own_kv != nullptr) {
    *own_kv = {qkv.narrow(2, heads, kv_heads).transpose(1, 2),
               qkv.narrow(2, heads + kv_heads, kv_heads).transpose(1, 2)};
  }
  // split (not narrow): its backward is one concatenation, where each
  // narrow's backward zero-fills a full-size gradient and adds.
  std::vector<torch::Tensor> qk_v = qkv.split_with_sizes({heads + kv_heads, kv_heads}, 2);
  torch::Tensor qk = RopeRotate(qk_v[0].transpose(1, 2), cos, sin);
  std::vector<torch::Tensor> q_k = qk.split_with_sizes({heads, kv_heads}, 1);
  torch::Tensor dk, dv;
  if (!depth_keys.empty()) {
    // [B, H, T, S, hd] in qkv's dtype (under autocast a skipped block's
    // zero slots may be fp32 beside bf16 projections) with KV-head slots
    // repeated per query head, the keys rotated at their own token's
    // position like the query.
    auto stack = [heads, &qkv](const std::vector<torch::Tensor>& slots) {
      std::vector<torch::Tensor> per_query;
      for (const torch::Tensor& t : slots) {
        torch::Tensor s = t.to(qkv.scalar_type());
        per_query.push_back(s.size(1) == heads ? s
                                               : s.repeat_interleave(heads / s.size(1), 1));
      }
      return torch::stack(per_query, 3);
    };
    dk = RopeRotate(stack(depth_keys), cos.unsqueeze(1), sin.unsqueeze(1));
    dv = stack(depth_values);
  }
  return CompositeCausalAttention(q_k[0], q_k[1], qk_v[1].transpose(1, 2), dk, dv, scale);
}

torch::Tensor HcReadOp(const torch::Tensor& h, const torch::Tensor& read) {
#ifdef DEPTHBENCH_HAVE_FUSED_OPS
  if (Fused({&h, &read}) && fused::KernelDtype(h) && IsFloat(read) && h.dim() >= 2 &&
      StreamsSupported(h.size(-2))) {
    return fused::HcRead(h, read);
  }
#endif
  if (CpuFused({&h, &read}) && h.dim() >= 2 && read.numel() * h.size(-1) == h.numel()) {
    return cpu_fused::HcRead(h, read);
  }
  return reference::HcRead(h, read);
}

torch::Tensor HcWriteOp(const torch::Tensor& h, const torch::Tensor& a, const torch::Tensor& b,
                        const torch::Tensor& y) {
#ifdef DEPTHBENCH_HAVE_FUSED_OPS
  if (Fused({&h, &a, &b, &y}) && fused::KernelDtype(h) && y.scalar_type() == h.scalar_type() &&
      IsFloat(a) && IsFloat(b) && h.dim() >= 2 && StreamsSupported(h.size(-2))) {
    return fused::HcWrite(h, a, b, y);
  }
#endif
  if (CpuFused({&h, &b, &y}) && (!a.defined() || CpuFused({&h, &a})) && h.dim() >= 2) {
    const int64_t n = h.size(-2), rows = h.numel() / std::max<int64_t>(n * h.size(-1), 1);
    if (b.numel() == rows * n && y.numel() * n == h.numel() &&
        (!a.defined() || a.numel() == rows * n * n)) {
      return cpu_fused::HcWrite(h, a, b, y);
    }
  }
  return reference::HcWrite(h, a, b, y);
}

}  // namespace depthbench
