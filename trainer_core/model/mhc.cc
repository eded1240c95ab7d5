// Design 7, mHC (manifold-constrained Hyper-Connections, Xie et al. 2025),
// n residual streams.
//
// Per connector, with x the token's streams flattened to n*d values and
// divided by their RMS (affine-free, eps 1e-6), in fp32:
//
//   z     = g (x Phi) + bias        Phi [n d, n^2 + 2n]; g: three scalar
//                                   gains (read, write, residual groups)
//   read  = sigmoid(z[0:n])         write = 2 sigmoid(z[n:2n])
//   M     = Sinkhorn(exp(z[2n:] as [n, n]))   20 log-domain iterations,
//                                   rows then columns, eps 1e-6
//   H'_s  = sum_r M[r, s] H_r + write_s F(LN(sum_r read_r H_r))
//
// Init (spec section 3): Phi zero; gains 0.01; read bias +8 on stream k mod n
// and -8 elsewhere (k = zero-indexed sub-layer of the block's weights), write
// bias 0, residual bias 0 on the diagonal and -8 off it; o_proj and down_proj
// scaled by 1/sqrt(n) (= 1/2 at n = 4). Biases and gains take no weight decay,
// Phi decays. The embedding is replicated; the streams are averaged before
// the final norm.
#include <cmath>
#include <string>

#include "cuda_ops/ops.h"
#include "cuda_ops/reference.h"
#include "trainer_core/model/design.h"
#include "trainer_core/precision.h"

namespace depthbench {

inline constexpr int kSinkhornIterations = 20;
inline constexpr double kSinkhornEps = 1e-6;

// Log-domain Sinkhorn-Knopp on the last two dims of `logits` [..., n, n]:
// returns exp(z) after kSinkhornIterations row-then-column normalisations.
torch::Tensor SinkhornKnopp(const torch::Tensor& logits) {
  return reference::Sinkhorn(logits, kSinkhornIterations, kSinkhornEps);
}

namespace {

class MhcConnectorImpl : public torch::nn::Module {
 public:
  MhcConnectorImpl(int64_t d, int64_t n) : n_(n) {
    const int64_t m = n * n + 2 * n;
    phi = register_parameter("phi", torch::zeros({n * d, m}));
    bias = register_parameter("bias", torch::zeros({m}));
    gains = register_parameter("gains", torch::full({3}, 0.01));
  }

  void Init(int64_t k) {
    torch::NoGradGuard no_grad;
    const int64_t n = n_;
    phi.zero_();
    gains.fill_(0.01);
    bias.zero_();
    torch::Tensor read = bias.narrow(0, 0, n);
    read.fill_(-8.0);
    read[k % n].fill_(8.0);
    bias.narrow(0, 2 * n, n * n).copy_((torch::eye(n) - 1.0).mul(8.0).reshape({-1}));
  }

  template <typename Branch>
  torch::Tensor forward(const torch::Tensor& h, Branch&& branch, torch::Tensor* residual_map) {
    const int64_t n = n_;
    torch::Tensor x, write, map, streams;
    {
      AutocastOffGuard fp32_routing;  // coefficients and Sinkhorn stay fp32
      // RMS over the flattened n*d values, then Phi; group gains, bias, the
      // two sigmoids and the residual logits; the read sum_r read_r H_r.
      // One fused function on CPU (cuda_ops MhcRouteOp; the read is
      // element-wise, which autocast leaves alone either way).
      MhcRouteTensors r = MhcRouteOp(h, phi, gains, bias, n, kNormEps);
      x = r.x;
      write = r.write;
      streams = r.h;  // h passed through the route (one stream gradient)
      // Fused Sinkhorn on CUDA and CPU (cuda_ops SinkhornOp).
      map = SinkhornOp(r.logits, kSinkhornIterations, kSinkhornEps);  // [B,T,n,n]
    }
    if (residual_map != nullptr) *residual_map = map.detach();
    torch::Tensor y = branch(x);
    // out_t = sum_s map[s, t] h_s + write_t y, i.e. map^T h + write y.
    return HcWriteOp(streams, map, write, y);
  }

  std::vector<torch::Tensor> NoDecay() { return {bias, gains}; }

  torch::Tensor phi, bias, gains;

 private:
  int64_t n_;
};
TORCH_MODULE(MhcConnector);

class MhcBlockImpl : public TransformerBlockImpl {
 public:
  MhcBlockImpl(const ModelShape& shape, int64_t n) : TransformerBlockImpl(shape) {
    attn_mhc = register_module("attn_mhc", MhcConnector(shape.d_model, n));
    ffn_mhc = register_module("ffn_mhc", MhcConnector(shape.d_model, n));
  }
  MhcConnector attn_mhc{nullptr}, ffn_mhc{nullptr};
};
TORCH_MODULE(MhcBlock);

class MhcDesign final : public DesignImpl {
 public:
  explicit MhcDesign(const DesignOptions& options)
      : DesignImpl(options), n_(options.hc_streams) {
    for (int64_t l = 0; l < options.shape.layers; ++l) {
      blocks_.push_back(register_module("block_" + std::to_string(l),
                                        MhcBlock(options.shape, n_)));
    }
  }
  Arch arch() const override { return Arch::kMhc; }

  DepthState Begin(const torch::Tensor& embedding) override {
    if (!maps_.empty()) maps_.clear();  // read-only when not recording (micro_batch.h)
    return DepthState({embedding.unsqueeze(-2).expand(
        {embedding.size(0), embedding.size(1), n_, embedding.size(-1)})});
  }

  void ApplyBlock(int64_t /*position*/, int64_t weights, DepthState& s) override {
    MhcBlockImpl& b = *blocks_[weights];
    torch::Tensor map;
    torch::Tensor* rec = record_diagnostics_ ? &map : nullptr;
    torch::Tensor h = s.tensors[0];
    h = b.attn_mhc->forward(
        h, [&](const torch::Tensor& x) { return b.attn->forward(b.attn_norm->forward(x), rope()); },
        rec);
    if (rec) maps_.push_back(map);
    h = b.ffn_mhc->forward(
        h, [&](const torch::Tensor& x) { return b.ffn->forward(b.ffn_norm->forward(x)); }, rec);
    if (rec) maps_.push_back(map);
    s.tensors[0] = h;
  }

  torch::Tensor Finish(const DepthState& s) override {
    return final_norm->forward(s.tensors[0].mean(-2));
  }
  torch::Tensor Representation(const DepthState& s, int64_t) override {
    const torch::Tensor& h = s.tensors[0];
    return h.reshape({h.size(0), h.size(1), -1});
  }
  // What the head reads: the stream average.
  torch::Tensor LensHidden(const DepthState& s, int64_t) override { return s.tensors[0].mean(-2); }

  void InitDesignParameters() override {
    torch::NoGradGuard no_grad;
    const double scale = 1.0 / std::sqrt(static_cast<double>(n_));
    for (size_t l = 0; l < blocks_.size(); ++l) {
      blocks_[l]->attn_mhc->Init(2 * static_cast<int64_t>(l));
      blocks_[l]->ffn_mhc->Init(2 * static_cast<int64_t>(l) + 1);
      blocks_[l]->attn->o_proj->weight.mul_(scale);
      blocks_[l]->ffn->down_proj->weight.mul_(scale);
    }
  }

  std::vector<torch::Tensor> NoDecayParameters() override {
    std::vector<torch::Tensor> out;
    for (auto& b : blocks_) {
      for (auto& p : b->attn_mhc->NoDecay()) out.push_back(p);
      for (auto& p : b->ffn_mhc->NoDecay()) out.push_back(p);
    }
    return out;
  }

  std::vector<torch::Tensor> ResidualMaps() const override { return maps_; }

 private:
  int64_t n_;
  std::vector<MhcBlock> blocks_;
  std::vector<torch::Tensor> maps_;
};

}  // namespace

std::shared_ptr<DesignImpl> MakeMhc(const DesignOptions& options) {
  return std::make_shared<MhcDesign>(options);
}

}  // namespace depthbench
