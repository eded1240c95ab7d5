// The fused-op dispatcher the model calls: each op runs the fused CUDA kernel
// (forward and hand-written backward, as a torch::autograd::Function) when
//   - this build has the CUDA torch bindings (CMake found nvcc and a
//     CUDA-enabled LibTorch: DEPTHBENCH_HAVE_FUSED_OPS),
//   - the tensors are on a CUDA device, in fp32 or bf16, and
//   - the sizes are within the kernels' limits (kernels.h),
// and the composite CPU reference (reference.h) otherwise. Both paths are
// differentiable and compute the same function; which one ran is not
// observable except through speed and rounding.
//
// Thread safety: the ops are as thread-safe as LibTorch ops. The enable
// switch is a process-wide atomic meant for tests and benchmarks.
#ifndef DEPTHBENCH_CUDA_OPS_OPS_H_
#define DEPTHBENCH_CUDA_OPS_OPS_H_

#include <torch/torch.h>

#include <string>
#include <vector>

namespace depthbench {

// True when this binary was built with the CUDA torch bindings.
bool FusedOpsCompiled();
// True when the bindings are compiled in, a CUDA device is visible and the
// fused path is enabled: what the trainer reports as "fused_ops" in its
// `start` event (when it trains on CUDA).
bool FusedOpsAvailable();
// One line for logs and the `start` event: the fused path's state and, when
// it is unavailable, why ("LibTorch built without CUDA", "no CUDA device").
std::string FusedOpsDescription();
// Process-wide switch (default on): off forces the composite path even on
// CUDA tensors (benchmarks compare the two this way).
void SetFusedOpsEnabled(bool enabled);

// A dense layer without bias, y = x w^T: x [..., K], w [N, K] -> [..., N].
// On float32 CPU tensors through oneDNN's sgemm, forward and backward
// (cpu_gemm.h; DEPTHBENCH_CPU_GEMM=blas, or a build without oneDNN, leaves
// it to the system BLAS); elsewhere torch::linear.
torch::Tensor LinearOp(const torch::Tensor& x, const torch::Tensor& w);
// LinearOp(x, w).chunk(parts, -1) (w.size(0) % parts == 0): on the oneDNN
// path each part's gradient goes straight to its rows of w and into x's
// gradient, with no concatenation of the parts' gradients (MoDA's FFN K/V).
std::vector<torch::Tensor> LinearChunksOp(const torch::Tensor& x, const torch::Tensor& w,
                                          int64_t parts);

// y = x * rsqrt(mean(x^2) + eps) * weight; x [..., d], weight [d].
torch::Tensor RmsNormOp(const torch::Tensor& x, const torch::Tensor& weight, double eps);

// Affine-free x * rsqrt(mean(x^2) + eps) (the HC/mHC routing inputs): the
// RMSNorm op with a unit weight, so the fused kernels serve it too.
torch::Tensor RmsNormalizeOp(const torch::Tensor& x, double eps);

// The HC/mHC routing projection RmsNormalizeOp(x, eps) @ w; x [..., K],
// w [K, m]. Fused on CPU (the normalised x is never materialised); on CUDA
// the fused RMSNorm kernel and a matmul.
torch::Tensor RmsProjectOp(const torch::Tensor& x, const torch::Tensor& w, double eps);

// The HC connector's routing coefficients from its projection u [..., n, n+2]
// (hc.cc): a = static_a + gain_a tanh(u[..., :n+1]) and
// b = static_b + gain_b tanh(u[..., n+1]). Fused on CPU; composite elsewhere.
struct HcCoefficientTensors {
  torch::Tensor a;  // [..., n, n + 1]: column 0 read, columns 1..n residual
  torch::Tensor b;  // [..., n] write
};
HcCoefficientTensors HcCoefficientsOp(const torch::Tensor& u, const torch::Tensor& static_a,
                                      const torch::Tensor& static_b, const torch::Tensor& gain_a,
                                      const torch::Tensor& gain_b);

// The mHC connector's coefficients from u [..., n^2 + 2n] (mhc.cc): with
// z = u * (gains[0] x n, gains[1] x n, gains[2] x n^2) + bias, read =
// sigmoid(z[:n]), write = 2 sigmoid(z[n:2n]), logits = z[2n:] as [n, n].
struct MhcCoefficientTensors {
  torch::Tensor read, write;  // [..., n]
  torch::Tensor logits;       // [..., n, n], for SinkhornOp
};
MhcCoefficientTensors MhcCoefficientsOp(const torch::Tensor& u, const torch::Tensor& gains,
                                        const torch::Tensor& bias, int64_t n);

// The HC connector's routing up to its read (hc.cc): u = RmsProjectOp(h
// [..., n, d] in w's precision, w = [dynamic_a | dynamic_b] [d, n + 2]),
// (a, b) = HcCoefficientsOp(u, ...) and x = HcReadOp(h, a[..., 0]). One
// function on CPU (one stream gradient; cpu_fused.h).
struct HcRouteTensors {
  torch::Tensor x;   // [..., d]: the read, the sub-layer's input
  torch::Tensor ar;  // [..., n, n]: the residual mix a[..., 1:]
  torch::Tensor b;   // [..., n]: the write weights
  // The streams for the connector's write (HcWriteOp): on the fused CPU path
  // the route's pass-through of h, whose gradient its backward adds into
  // h's (no separate add of two stream gradients); elsewhere h itself.
  torch::Tensor h;
};
HcRouteTensors HcRouteOp(const torch::Tensor& h, const torch::Tensor& w,
                         const torch::Tensor& static_a, const torch::Tensor& static_b,
                         const torch::Tensor& gain_a, const torch::Tensor& gain_b, double eps);

// One HC connector's write and the next connector's route (hc.cc):
// HcRouteOp(HcWriteOp(h, a, b, y), w, static_a, static_b, gain_a, gain_b,
// eps), as one function on CPU (cpu_fused::HcWriteRoute: the new streams
// routed while they are in cache, one pass over them less each way); the
// two ops elsewhere. a undefined: the identity residual map (the code form).
HcRouteTensors HcWriteRouteOp(const torch::Tensor& h, const torch::Tensor& a,
                              const torch::Tensor& b, const torch::Tensor& y,
                              const torch::Tensor& w, const torch::Tensor& static_a,
                              const torch::Tensor& static_b, const torch::Tensor& gain_a,
                              const torch::Tensor& gain_b, double eps);

// The mHC connector's routing up to its read (mhc.cc): u = RmsProjectOp(h
// flattened to [..., n d], phi, eps) in fp32, MhcCoefficientsOp(u, gains,
// bias, n), and x = HcReadOp(h, read). h [..., n, d], phi [n d, n^2 + 2n].
// One fused function on CPU (one stream gradient instead of two for
// autograd to add); the three ops elsewhere.
struct MhcRouteTensors {
  torch::Tensor x;       // [..., d]: the read, the sub-layer's input
  torch::Tensor write;   // [..., n]
  torch::Tensor logits;  // [..., n, n], for SinkhornOp
  torch::Tensor h;       // the streams for the write, as HcRouteTensors::h
};
MhcRouteTensors MhcRouteOp(const torch::Tensor& h, const torch::Tensor& phi,
                           const torch::Tensor& gains, const torch::Tensor& bias, int64_t n,
                           double eps);

// silu(g) * u (the SwiGLU gate; the projections stay matmuls).
torch::Tensor SwiGluGateOp(const torch::Tensor& g, const torch::Tensor& u);
// The same gate on the packed gate/up projection gu [..., 2 F] (gate first)
// -> [..., F]: fused on CPU (one gradient for gu), else chunk + SwiGluGateOp.
torch::Tensor SwiGluPackedOp(const torch::Tensor& gu);

// AttnRes depth mixing folded with the consuming sub-layer's pre-norm:
// rmsnorm(sum_i softmax_i(query . (key_gain * rmsnorm(v_i))) v_i) * out_gain.
// sources: S >= 1 tensors [..., d] of one shape and dtype; query may be
// undefined (uniform mixing; key_gain may then be undefined too).
// passed (non-null): receives the sources for later mixes to take instead:
// on the fused CPU path passed through the mix, so a source's gradients from
// all its readers add up inside the kernels (cpu_fused::AttnResMix), else
// the sources themselves.
torch::Tensor AttnResMixOp(const std::vector<torch::Tensor>& sources,
                           const torch::Tensor& query, const torch::Tensor& key_gain,
                           const torch::Tensor& out_gain, double eps,
                           std::vector<torch::Tensor>* passed = nullptr);

// Log-domain Sinkhorn-Knopp of logits [..., n, n] (fp32 on the fused path):
// exp(z) after `iterations` row-then-column normalisations.
torch::Tensor SinkhornOp(const torch::Tensor& logits, int iterations = 20, double eps = 1e-6);

// Causal self-attention softmax(scale q k^T + causal mask) v (the
// attention layers, layers.cc), with optional same-token depth keys and
// values in the same softmax (MoDA): q [B, H, T, hd]; k, v [B, KV, T, hd]
// with H a multiple of KV (GQA); depth_keys and depth_values [B, H, T, S, hd]
// or both undefined. Returns [B, T, H * hd]. Fused on CPU (cpu_fused.h;
// DEPTHBENCH_CPU_ATTENTION=composite turns only this op's fused path off,
// for benchmarks); elsewhere batched GEMMs and a softmax, by query chunks
// when there are no depth keys (DEPTHBENCH_ATTN_CHUNKS, default 4 from
// T = 128, 2 from 64, else 1).
torch::Tensor CausalAttentionOp(const torch::Tensor& q, const torch::Tensor& k,
                                const torch::Tensor& v, const torch::Tensor& depth_keys,
                                const torch::Tensor& depth_values, double scale);

// The rotary embedding (LLaMA's rotate_half form): x [..., T, hd] ->
// x cos + swap(x) sin with swap exchanging the two halves of the head dim
// and cos, sin [T, hd] (sin carrying rotate_half's sign). Composite ATen ops.
torch::Tensor RopeRotate(const torch::Tensor& x, const torch::Tensor& cos,
                         const torch::Tensor& sin);

// CausalAttentionOp on the packed Q/K/V projection qkv [B, T, H + 2 KV, hd]
// with RopeRotate applied to q and k first (tables [T, hd]); returns
// [B, T, H * hd]. MoDA's depth keys and values: S slots each (possibly
// none), [B, H or KV, T, hd], the keys unrotated (see
// cpu_fused::CausalAttentionQkv). Fused on CPU (rotation inside the kernel,
// one gradient for qkv, the slots read in place; cpu_fused.h), else
// RopeRotate, the slots stacked and the composite. own_kv, if given,
// receives this layer's unrotated keys and values [B, KV, T, hd] (MoDA's
// slots for later layers). passed_slots, if given, receives the depth keys
// and values for later layers to read instead: on the fused CPU path passed
// through the attention, so a slot's gradients from all its readers add up
// inside the kernels (cpu_fused::CausalAttentionQkv), else the slots
// themselves.
using DepthSlotLists = std::pair<std::vector<torch::Tensor>, std::vector<torch::Tensor>>;
torch::Tensor CausalAttentionQkvOp(const torch::Tensor& qkv, int64_t heads, int64_t kv_heads,
                                   const torch::Tensor& cos, const torch::Tensor& sin,
                                   const std::vector<torch::Tensor>& depth_keys,
                                   const std::vector<torch::Tensor>& depth_values, double scale,
                                   std::pair<torch::Tensor, torch::Tensor>* own_kv = nullptr,
                                   DepthSlotLists* passed_slots = nullptr);

// HC/mHC connector. h [..., n, d]; read, b [..., n]; a [..., n, n] or
// undefined (identity, the HC code form); coefficients fp32.
torch::Tensor HcReadOp(const torch::Tensor& h, const torch::Tensor& read);
torch::Tensor HcWriteOp(const torch::Tensor& h, const torch::Tensor& a, const torch::Tensor& b,
                        const torch::Tensor& y);

}  // namespace depthbench

#endif  // DEPTHBENCH_CUDA_OPS_OPS_H_
