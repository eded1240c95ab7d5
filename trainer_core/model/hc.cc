// Design 6, HC (Hyper-Connections, Zhu et al. 2025), n residual streams.
//
// A connector replaces the residual addition around each pre-normalised
// sub-layer. With the streams H [n, d] of one token and Hn their affine-free
// RMS normalisation (per stream):
//
//   A = A_static + s_a * tanh(Hn W_a)        [n, n+1]  (column 0: read,
//                                                       columns 1..n: A_r)
//   b = b_static + s_b * tanh(Hn w_b)        [n]       (write weights)
//   x = sum_s A[s, 0] H_s                    (branch input)
//   H' = A_r^T H + b F(LN(x))                (paper form, the default)
//   H'_s = H_s + b_s F(LN(x))                (authors' code form,
//                                             DesignOptions::hc_code_form:
//                                             A_r is computed but unused)
//
// Init (spec section 3): W_a, w_b zero; s_a = s_b = 0.01; A_static[:, 0]
// one-hot on stream k mod n (k = zero-indexed sub-layer of the block's
// weights), A_static[:, 1:] = I; b_static = 1; attention o_proj and FFN
// down_proj scaled by 1/sqrt(n). The embedding is replicated over the streams;
// the streams are summed before the final norm. Routing coefficients are
// computed in fp32 whatever the stream dtype. Weight decay (spec section 9,
// as the authors' code groups them): only the static routing parameters
// A_static and b_static are exempt; W_a, w_b and the two tanh gains s_a, s_b
// decay like every other weight.
#include <cmath>
#include <string>
#include <vector>

#include "cuda_ops/ops.h"
#include "trainer_core/model/design.h"
#include "trainer_core/precision.h"

namespace depthbench {
namespace {

class HcConnectorImpl : public torch::nn::Module {
 public:
  HcConnectorImpl(int64_t d, int64_t n) {
    static_a = register_parameter("static_a", torch::zeros({n, n + 1}));
    static_b = register_parameter("static_b", torch::ones({n}));
    dynamic_a = register_parameter("dynamic_a", torch::zeros({d, n + 1}));
    dynamic_b = register_parameter("dynamic_b", torch::zeros({d, 1}));
    gain_a = register_parameter("gain_a", torch::full({1}, 0.01));
    gain_b = register_parameter("gain_b", torch::full({1}, 0.01));
  }

  // Resets to the spec's init for zero-indexed sub-layer k.
  void Init(int64_t k) {
    torch::NoGradGuard no_grad;
    const int64_t n = static_b.size(0);
    static_a.zero_();
    static_a.select(1, 0).select(0, k % n).fill_(1.0);
    static_a.narrow(1, 1, n).copy_(torch::eye(n));
    static_b.fill_(1.0);
    dynamic_a.zero_();
    dynamic_b.zero_();
    gain_a.fill_(0.01);
    gain_b.fill_(0.01);
  }

  // Runs the connector on `streams` (HcDesign's DepthState: the streams
  // [B, T, n, d], or the last connector's write still to do) and leaves its
  // own write pending in it: the write runs with the next connector's route
  // (HcWriteRouteOp: the new streams routed while in cache) or at the end
  // (Streams). branch maps the (un-normalised) read [B, T, d] to the
  // sub-layer output. `residual_map`, when non-null, receives A_r [B,T,n,n].
  template <typename Branch>
  void forward(std::vector<torch::Tensor>& streams, bool code_form, Branch&& branch,
               torch::Tensor* residual_map) {
    const int64_t n = static_b.size(0);
    if (streams.size() == 4 && !streams[0].device().is_cpu()) {
      // Off the CPU the pending write runs on its own, outside the fp32
      // routing scope below, as it always has (bf16 under autocast).
      streams = {HcWriteOp(streams[0], streams[1], streams[2], streams[3])};
    }
    HcRouteTensors r;
    {
      AutocastOffGuard fp32_routing;  // coefficients stay fp32 under bf16 autocast
      // Per-stream RMS normalisation and one projection for both weight
      // sets (the parameters stay separate), tanh and the static/gain
      // affine, and the read sum_s a[s, 0] H_s: one fused function on CPU
      // (cuda_ops HcRouteOp; the read is element-wise, which autocast leaves
      // alone either way), with the last connector's write when one is
      // pending.
      const torch::Tensor w = torch::cat({dynamic_a, dynamic_b}, /*dim=*/1);
      r = streams.size() == 1
              ? HcRouteOp(streams[0], w, static_a, static_b, gain_a, gain_b, kNormEps)
              : HcWriteRouteOp(streams[0], streams[1], streams[2], streams[3], w, static_a,
                               static_b, gain_a, gain_b, kNormEps);
    }
    // The residual mix and write go through the cuda_ops dispatcher: the
    // fused kernels on CUDA and CPU, the composites elsewhere.
    torch::Tensor y = branch(r.x);  // [B,T,d]
    if (residual_map != nullptr) {
      *residual_map = code_form ? torch::eye(n).expand_as(r.ar).clone() : r.ar.detach();
    }
    // r.h: the streams as the route passed them on (one stream gradient).
    streams = {r.h, code_form ? torch::Tensor() : r.ar, r.b, y};
  }

  // Static routing only: the tanh gains decay (spec section 9).
  std::vector<torch::Tensor> NoDecay() { return {static_a, static_b}; }

  torch::Tensor static_a, static_b, dynamic_a, dynamic_b, gain_a, gain_b;
};
TORCH_MODULE(HcConnector);

class HcBlockImpl : public TransformerBlockImpl {
 public:
  HcBlockImpl(const ModelShape& shape, int64_t n) : TransformerBlockImpl(shape) {
    attn_hc = register_module("attn_hc", HcConnector(shape.d_model, n));
    ffn_hc = register_module("ffn_hc", HcConnector(shape.d_model, n));
  }
  HcConnector attn_hc{nullptr}, ffn_hc{nullptr};
};
TORCH_MODULE(HcBlock);

class HcDesign final : public DesignImpl {
 public:
  explicit HcDesign(const DesignOptions& options)
      : DesignImpl(options), n_(options.hc_streams) {
    for (int64_t l = 0; l < options.shape.layers; ++l) {
      blocks_.push_back(register_module("block_" + std::to_string(l),
                                        HcBlock(options.shape, n_)));
    }
  }
  Arch arch() const override { return Arch::kHc; }

  // DepthState: tensors = {H [B, T, n, d]} (after Begin), or the last
  // connector's write still to run, {H, A_r (undefined in the code form),
  // b, y}: H' = HcWrite(H, A_r, b, y) (HcConnectorImpl::forward). Streams()
  // runs a pending write for whoever reads the state between blocks.
  DepthState Begin(const torch::Tensor& embedding) override {
    if (!maps_.empty()) maps_.clear();  // read-only when not recording (micro_batch.h)
    const int64_t d = embedding.size(-1);
    return DepthState({embedding.unsqueeze(-2).expand(
        {embedding.size(0), embedding.size(1), n_, d})});
  }

  void ApplyBlock(int64_t /*position*/, int64_t weights, DepthState& s) override {
    HcBlockImpl& b = *blocks_[weights];
    const bool code = options_.hc_code_form;
    torch::Tensor map;
    torch::Tensor* rec = record_diagnostics_ ? &map : nullptr;
    b.attn_hc->forward(
        s.tensors, code,
        [&](const torch::Tensor& x) { return b.attn->forward(b.attn_norm->forward(x), rope()); },
        rec);
    if (rec) maps_.push_back(map);
    b.ffn_hc->forward(
        s.tensors, code, [&](const torch::Tensor& x) { return b.ffn->forward(b.ffn_norm->forward(x)); },
        rec);
    if (rec) maps_.push_back(map);
  }

  torch::Tensor Finish(const DepthState& s) override {
    return final_norm->forward(Streams(s).sum(-2));
  }
  torch::Tensor Representation(const DepthState& s, int64_t) override {
    const torch::Tensor h = Streams(s);
    return h.reshape({h.size(0), h.size(1), -1});
  }
  torch::Tensor LensHidden(const DepthState& s, int64_t) override { return Streams(s).sum(-2); }

  void InitDesignParameters() override {
    torch::NoGradGuard no_grad;
    const double scale = 1.0 / std::sqrt(static_cast<double>(n_));
    for (size_t l = 0; l < blocks_.size(); ++l) {
      blocks_[l]->attn_hc->Init(2 * static_cast<int64_t>(l));
      blocks_[l]->ffn_hc->Init(2 * static_cast<int64_t>(l) + 1);
      blocks_[l]->attn->o_proj->weight.mul_(scale);
      blocks_[l]->ffn->down_proj->weight.mul_(scale);
    }
  }

  std::vector<torch::Tensor> NoDecayParameters() override {
    std::vector<torch::Tensor> out;
    for (auto& b : blocks_) {
      for (auto& p : b->attn_hc->NoDecay()) out.push_back(p);
      for (auto& p : b->ffn_hc->NoDecay()) out.push_back(p);
    }
    return out;
  }

  std::vector<torch::Tensor> ResidualMaps() const override { return maps_; }

 private:
  // The streams the state stands for, running a pending write.
  static torch::Tensor Streams(const DepthState& s) {
    const std::vector<torch::Tensor>& t = s.tensors;
    return t.size() == 1 ? t[0] : HcWriteOp(t[0], t[1], t[2], t[3]);
  }

  int64_t n_;
  std::vector<HcBlock> blocks_;
  std::vector<torch::Tensor> maps_;  // last recorded forward
};

}  // namespace

std::shared_ptr<DesignImpl> MakeHc(const DesignOptions& options) {
  return std::make_shared<HcDesign>(options);
}

}  // namespace depthbench
