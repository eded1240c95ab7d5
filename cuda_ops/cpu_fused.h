// A fused CPU kernel for the normalisation every sub-layer runs, RMSNorm, as
// an autograd function with a hand-written backward pass (the math of
// rms_norm.cu and of the reference's RmsNormBackward).
//
// Why: the composites (cuda_ops/*_ref.cc) make 4 passes over the activation
// for an RMSNorm forward and ~8 for its backward, each allocating a
// temporary; these kernels make 2 and 2, with no temporaries beyond the
// output, rows split over LibTorch's intra-op threads (at::parallel_for).
// On the issue-2 benchmark model that is part of what puts depthbench-train
// ahead of PyTorch eager (bench/RESULTS.md).
//
// Also the SwiGLU gate on the packed gate/up projection: one pass each way
// with an 8-lane exp (cpu_fused_vec.h; a libm exp per element lost to
// ATen's vectorised silu), and one gradient for the packed input where
// chunk + silu * up return two halves for autograd to concatenate.
//
// float32 and float64 (the latter for gradcheck), any shape with the
// normalised dimension last; inputs are made contiguous. No double
// backward (the backward is not differentiable); use the references for that.
//
// Thread safety: as LibTorch ops.
#ifndef DEPTHBENCH_CUDA_OPS_CPU_FUSED_H_
#define DEPTHBENCH_CUDA_OPS_CPU_FUSED_H_

#include <torch/torch.h>

#include <vector>

namespace depthbench {
namespace cpu_fused {

// Whether these kernels take the tensors: all on the CPU, same floating
// dtype, float32 or float64.
bool Supports(std::initializer_list<const torch::Tensor*> tensors);

// y = x * rsqrt(mean(x^2, -1) + eps) * weight; weight [d], x [..., d].
torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps);

// silu(gu[..., :F]) * gu[..., F:] for gu [..., 2 F] -> [..., F].
torch::Tensor SwiGluPacked(const torch::Tensor& gu);

// The multi-stream mixing ops of HC/mHC and AttnRes (issue 18), same math as
// their references in cuda_ops/reference.h and their CUDA kernels, each one
// pass over the streams forward and one or two backward, rows (tokens) split
// over the intra-op threads. Parameter gradients that sum over rows are
// accumulated per thread in double and added at the end (deterministic for a
// fixed thread count). Callers check Supports() and the shapes (ops.cc).

// h [..., n, d], read [..., n] -> [..., d] = sum_s read_s h_s.
torch::Tensor HcRead(const torch::Tensor& h, const torch::Tensor& read);
// h [..., n, d], a [..., n, n] (undefined: identity), b [..., n], y [..., d]
// -> out_t = sum_s a[s, t] h_s + b_t y.
torch::Tensor HcWrite(const torch::Tensor& h, const torch::Tensor& a, const torch::Tensor& b,
                      const torch::Tensor& y);
// The HC/mHC routing projection: (x * rsqrt(mean(x^2, -1) + eps)) @ w with
// x [..., K] and w [K, m], one pass over x forward and one backward (the
// normalised x is never materialised; dw is summed per thread as above).
torch::Tensor RmsProject(const torch::Tensor& x, const torch::Tensor& w, double eps);
// The HC routing coefficients from the projection u [..., n, n + 2]:
// a = static_a + gain_a tanh(u[..., :n + 1]) [..., n, n + 1] and
// b = static_b + gain_b tanh(u[..., n + 1]) [..., n]; gains hold one value.
std::vector<torch::Tensor> HcCoefficients(const torch::Tensor& u, const torch::Tensor& static_a,
                                          const torch::Tensor& static_b,
                                          const torch::Tensor& gain_a,
                                          const torch::Tensor& gain_b);
// The mHC coefficients from u [..., n^2 + 2n]: z = g u + bias with gains
// [3] per group (read, write, residual); returns read = sigmoid(z[:n]),
// write = 2 sigmoid(z[n:2n]) [..., n] and the residual logits [..., n, n].
std::vector<torch::Tensor> MhcCoefficients(const torch::Tensor& u, const torch::Tensor& gains,
                                           const torch::Tensor& bias, int64_t n);
// The mHC connector's routing up to its read in one function: u =
// RmsProject(h [..., n, d] flattened to n d, phi [n d, n^2 + 2n]),
// (read, write, logits) = MhcCoefficients(u, gains, bias, n) and x =
// HcRead(h, read); returns {x [..., d], write [..., n], logits [..., n, n],
// h [..., n, d]}. Its backward returns one gradient for h (the three ops
// return two that autograd adds). The last output is h passed through, for
// the connector's write (HcWrite) to use instead of h: its gradient arrives
// here and is added into h's in the same pass, where two uses of h would
// have autograd add two [..., n, d] gradients (one more pass over them).
//
// The projection's products run one of two ways (`projection`):
//   kFused: in the same pass as the normalisation and the coefficients,
//     register-blocked loops over each group of rows (any dtype);
//   kGemm: float32 only, the products h phi, dp phi^T and h^T dp as three
//     oneDNN sgemm calls (cpu_gemm::Sgemm) around one fused pass each way
//     for the rest. On Zen 5, on one thread, oneDNN's sgemm outruns the
//     fused loops, which are bound by load latency, not FMA width; on two
//     threads over one batch it scales worse than they do (bench/RESULTS.md,
//     session 23);
//   kAuto: kGemm for float32 on one thread (inside a parallel region, as
//     the trainer's micro-batches, or with one intra-op thread) where
//     oneDNN is in use (cpu_gemm::Enabled()) and DEPTHBENCH_ROUTE_PROJECTION
//     is not "fused"; kFused otherwise.
// Both give the same values up to float rounding (the order of the sums).
enum class RouteProjection { kAuto, kFused, kGemm };
std::vector<torch::Tensor> MhcRoute(const torch::Tensor& h, const torch::Tensor& phi,
                                    const torch::Tensor& gains, const torch::Tensor& bias,
                                    int64_t n, double eps,
                                    RouteProjection projection = RouteProjection::kAuto);
// The HC connector's routing up to its read in one function: u =
// RmsProject(h [..., n, d], w [d, n + 2]) per stream, (a, b) =
// HcCoefficients(u, ...) and x = HcRead(h, a[..., 0]); returns {x [..., d],
// ar = a[..., 1:] [..., n, n], b [..., n], h [..., n, d]} and one gradient
// for h (the last output: h passed through, as MhcRoute's).
std::vector<torch::Tensor> HcRoute(const torch::Tensor& h, const torch::Tensor& w,
                                   const torch::Tensor& static_a, const torch::Tensor& static_b,
                                   const torch::Tensor& gain_a, const torch::Tensor& gain_b,
                                   double eps);
// One HC connector's write and the next one's route in one function:
// HcRoute(HcWrite(h, a, b, y), w, static_a, static_b, gain_a, gain_b, eps)
// with the same values and gradients (a undefined: the identity residual
// map), each token's new streams routed while they are in L1, and backward
// the write's gradient taken from the route's stream gradient the same way
// (two passes over [..., n, d] less each way). Returns HcRoute's outputs,
// the last the new streams.
std::vector<torch::Tensor> HcWriteRoute(const torch::Tensor& h, const torch::Tensor& a,
                                        const torch::Tensor& b, const torch::Tensor& y,
                                        const torch::Tensor& w, const torch::Tensor& static_a,
                                        const torch::Tensor& static_b, const torch::Tensor& gain_a,
                                        const torch::Tensor& gain_b, double eps);
// Sinkhorn-Knopp of logits [..., n, n] (n <= kMaxSinkhornStreams, iterations
// <= kMaxSinkhornIterations), computed per matrix in double in the exp
// domain: P = exp(z), then P /= (row sums + eps), P /= (column sums + eps),
// which equals the reference's log-domain z - log(sum exp z + eps) exactly
// in real arithmetic. The caller keeps logits small enough for exp in double
// (SinkhornInRange).
inline constexpr int64_t kMaxSinkhornStreams = 16;
inline constexpr int kMaxSinkhornIterations = 64;
bool SinkhornInRange(const torch::Tensor& logits);
torch::Tensor Sinkhorn(const torch::Tensor& logits, int iterations, double eps);
// rmsnorm(sum_i softmax_i(query . (key_gain * rmsnorm(v_i))) v_i) * out_gain;
// sources S tensors [..., d] of one shape; query and key_gain [d] or both
// undefined (uniform mixing); out_gain [d]. With `passed` non-null it
// receives the sources passed through the function, for the next mix to
// take instead: their gradients arrive in this one's backward and are added
// into the sources' as it writes them, where a source read by every later
// mix (Full AttnRes) would otherwise have autograd add one gradient per
// reader (one more pass over [..., d] each).
torch::Tensor AttnResMix(const std::vector<torch::Tensor>& sources, const torch::Tensor& query,
                         const torch::Tensor& key_gain, const torch::Tensor& out_gain,
                         double eps, std::vector<torch::Tensor>* passed = nullptr);

// Causal self-attention over the sequence, softmax(scale q k^T + causal
// mask) v, with optional same-token depth keys and values (MoDA) in the same
// softmax: query t attends keys 0..t and its own S depth keys. q
// [B, H, T, hd], k and v [B, KV, T, hd] with H a multiple of KV (GQA:
// query head h reads key/value head h / (H / KV)); any strides with the
// last dim contiguous (others are copied). depth_keys and depth_values
// [B, H, T, S, hd] or both undefined. Returns [B, T, H * hd] (heads
// concatenated per token, the output projection's input). One task per
// (batch, key/value head) over the intra-op threads; the backward pass
// recomputes the probabilities from the saved log-sum-exp
// (cpu_fused_attn.cc).
torch::Tensor CausalAttention(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, const torch::Tensor& depth_keys,
                              const torch::Tensor& depth_values, double scale);
// The shape contract above, checked with errors that start with `op` and
// name the offending argument (CausalAttention and CausalAttentionOp).
void CheckCausalAttentionShapes(const char* op, const torch::Tensor& q, const torch::Tensor& k,
                                const torch::Tensor& v, const torch::Tensor& depth_keys,
                                const torch::Tensor& depth_values);
// The same attention from the packed projection qkv [B, T, H + 2 KV, hd]
// (query heads, then key heads, then value heads, per token: the fused
// Q/K/V linear's output viewed per head), with the rotary embedding applied
// to q and k inside the kernel: q_t <- q_t cos[t] + swap(q_t) sin[t] with
// swap exchanging the two halves of the head dim, cos and sin [T, hd]
// (trainer_core's Rope tables, the sign of rotate_half in sin), likewise k.
// Its backward returns one gradient for qkv (none for the tables, which
// must not require one). MoDA's depth keys and values come as S slots
// (lists of S tensors, possibly empty), each [B, H or KV, T, hd] with any
// strides (query head h reads head h of an H-head slot, h / (H / KV) of a
// KV-head slot), read in place and each given its own gradient; the depth
// keys are NOT rotated and are scored against the unrotated query: a depth
// key is its own token's, and RoPE at relative offset 0 is the identity on
// q . k, so this equals rotating both at the token's position (for tables
// that are rotations, as Rope's: cos and sin of one angle per pair of
// positions c and c + hd / 2, the first half's sin negated). Returns
// {out [B, T, H * hd]}, with return_kv {out, k, v}: the unrotated keys and
// the values, [B, KV, T, hd] views of qkv (MoDA's own slots for later
// layers, read in place like every slot; their gradients join the packed
// one in this function's backward). With
// pass_slots the S key slots and the S value slots follow, passed through
// for the next layer to read instead: their gradients arrive in this
// backward and are added into the slots' as the kernel writes them, where a
// slot read by every later layer would otherwise have autograd add one
// gradient per reader (one more pass over [B, KV, T, hd] each).
std::vector<torch::Tensor> CausalAttentionQkv(const torch::Tensor& qkv, int64_t heads,
                                              int64_t kv_heads, const torch::Tensor& cos,
                                              const torch::Tensor& sin,
                                              const std::vector<torch::Tensor>& depth_keys,
                                              const std::vector<torch::Tensor>& depth_values,
                                              double scale, bool return_kv = false,
                                              bool pass_slots = false);
void CheckCausalAttentionQkvShapes(const char* op, const torch::Tensor& qkv, int64_t heads,
                                   int64_t kv_heads, const torch::Tensor& cos,
                                   const torch::Tensor& sin,
                                   const std::vector<torch::Tensor>& depth_keys,
                                   const std::vector<torch::Tensor>& depth_values);

// One AdamW step of a float32 parameter in one pass over the parameter, its
// gradient and the two moments (trainer_core's FusedAdamW). The stock
// LibTorch AdamW makes about nine element-wise passes and two temporaries
// per parameter: 50 ms a step for 13 M parameters on 2 cores, 4% of the
// d=512 training step (issue 18). Same update, in the same order of
// operations: p = p (1 - lr wd) - step_size m' / (sqrt(v') / sqrt(bc2) +
// eps), m' = beta1 m + (1 - beta1) g, v' = beta2 v + (1 - beta2) g^2.
// (GCC may contract a product and a sum into one rounding where ATen's
// separate kernels rounded twice: the result agrees to float rounding, not
// bit for bit.)
struct AdamWCoefficients {
  // The coefficients of step number `step` (1 for the first) with these
  // hyper-parameters, derived in double and rounded once to float.
  static AdamWCoefficients For(double lr, double weight_decay, double beta1, double beta2,
                               double eps, int64_t step);
  float decay;                  // 1 - lr * weight_decay
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float sqrt_bias_correction2;  // sqrt(1 - beta2^step)
  float eps;
  float neg_step_size;          // -lr / (1 - beta1^step)
};
// Whether AdamWStep takes these tensors: param, exp_avg and exp_avg_sq (and
// grad, unless undefined) float32, contiguous, on the CPU, of one shape.
bool AdamWStepApplies(const torch::Tensor& param, const torch::Tensor& grad,
                      const torch::Tensor& exp_avg, const torch::Tensor& exp_avg_sq);
// Updates param, exp_avg and exp_avg_sq in place from grad (undefined: a
// zero gradient). Fails unless AdamWStepApplies.
void AdamWStep(const torch::Tensor& param, const torch::Tensor& grad, const torch::Tensor& exp_avg,
               const torch::Tensor& exp_avg_sq, const AdamWCoefficients& c);

}  // namespace cpu_fused
}  // namespace depthbench

#endif  // DEPTHBENCH_CUDA_OPS_CPU_FUSED_H_
