// CPU references of the fused ops (one .cc per op, beside its .cu file):
// LibTorch composite forms that run on any device and differentiate through
// autograd, plus the hand-derived backward formulas the CUDA kernels
// implement, written in ATen so the math is checked on CPU (tests compare
// each *Backward with autograd through the forward).
//
// Shapes: `...` is any number of leading dims (batch, time). Routing
// coefficients (HC/mHC read, residual map, write) and gains are fp32.
//
// Thread safety: pure functions.
#ifndef DEPTHBENCH_CUDA_OPS_REFERENCE_H_
#define DEPTHBENCH_CUDA_OPS_REFERENCE_H_

#include <torch/torch.h>

#include <vector>

namespace depthbench {
namespace reference {

inline constexpr int kSinkhornIterations = 20;
inline constexpr double kSinkhornEps = 1e-6;

// ---- RMSNorm with fused scale: x [..., d], weight [d] ----
torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps);
struct RmsNormGrads {
  torch::Tensor dx, dweight;
};
RmsNormGrads RmsNormBackward(const torch::Tensor& dy, const torch::Tensor& x,
                             const torch::Tensor& weight, double eps);

// ---- SwiGLU gate: silu(g) * u ----
torch::Tensor SwiGluGate(const torch::Tensor& g, const torch::Tensor& u);
struct SwiGluGrads {
  torch::Tensor dg, du;
};
SwiGluGrads SwiGluGateBackward(const torch::Tensor& dh, const torch::Tensor& g,
                               const torch::Tensor& u);

// ---- AttnRes depth mixing ----
// sources: S tensors [..., d]; query, key_gain, out_gain [d]. An undefined
// query mixes uniformly (same as a zero query).
// Returns rmsnorm(sum_i softmax_i(query . rmsnorm(v_i) * key_gain) v_i) * out_gain.
torch::Tensor AttnResMix(const std::vector<torch::Tensor>& sources, const torch::Tensor& query,
                         const torch::Tensor& key_gain, const torch::Tensor& out_gain,
                         double eps);
// The softmax weights [..., S] alone (diagnostics, tests).
torch::Tensor AttnResMixWeights(const std::vector<torch::Tensor>& sources,
                                const torch::Tensor& query, const torch::Tensor& key_gain,
                                double eps);
struct AttnResGrads {
  std::vector<torch::Tensor> dsources;
  torch::Tensor dquery, dkey_gain, dout_gain;
};
AttnResGrads AttnResMixBackward(const torch::Tensor& dy,
                                const std::vector<torch::Tensor>& sources,
                                const torch::Tensor& query, const torch::Tensor& key_gain,
                                const torch::Tensor& out_gain, double eps);

// ---- Sinkhorn-Knopp, log domain: logits [..., n, n] ----
// `iterations` row-then-column normalisations, each dividing by (sum + eps);
// returns exp(z). Autograd differentiates through the unrolled iterations.
torch::Tensor Sinkhorn(const torch::Tensor& logits, int iterations = kSinkhornIterations,
                       double eps = kSinkhornEps);
// Hand-written backward (what sinkhorn.cu does): dz' -> dz per step.
torch::Tensor SinkhornBackward(const torch::Tensor& dout, const torch::Tensor& logits,
                               int iterations = kSinkhornIterations,
                               double eps = kSinkhornEps);

// ---- HC / mHC connector: streams h [..., n, d] ----
// read [..., n] -> x [..., d] = sum_s read_s h_s.
torch::Tensor HcRead(const torch::Tensor& h, const torch::Tensor& read);
struct HcReadGrads {
  torch::Tensor dh, dread;
};
HcReadGrads HcReadBackward(const torch::Tensor& dx, const torch::Tensor& h,
                           const torch::Tensor& read);
// a [..., n, n] (undefined = identity), b [..., n], y [..., d]:
// out_t = sum_s a[s, t] h_s + b_t y.
torch::Tensor HcWrite(const torch::Tensor& h, const torch::Tensor& a, const torch::Tensor& b,
                      const torch::Tensor& y);
struct HcWriteGrads {
  torch::Tensor dh, da, db, dy;  // da undefined when a is
};
HcWriteGrads HcWriteBackward(const torch::Tensor& dout, const torch::Tensor& h,
                             const torch::Tensor& a, const torch::Tensor& b,
                             const torch::Tensor& y);

}  // namespace reference
}  // namespace depthbench

#endif  // DEPTHBENCH_CUDA_OPS_REFERENCE_H_
