#include "trainer_core/model/attnres_common.h"

#include <string>

#include "cuda_ops/ops.h"

namespace depthbench {

bool AttnResFreezesAt(int64_t k, int64_t block_size) {
  return k > 0 && k % block_size == 0;
}

int64_t AttnResSourcesAt(int64_t k, int64_t block_size) {
  if (k == 0) return 1;
  return 2 + (k - 1) / block_size;
}

int64_t AttnResHeadSources(int64_t layers, int64_t block_size) {
  // Embedding + frozen blocks + the final running sum.
  return 2 + (2 * layers - 1) / block_size;
}

torch::Tensor AttnResMix(const std::vector<torch::Tensor>& sources,
                         const torch::Tensor& query, RmsNormImpl* key_norm,
                         torch::Tensor* weights) {
  const int64_t S = static_cast<int64_t>(sources.size());
  if (S == 1) {
    if (weights != nullptr) {
      const auto& v = sources[0];
      *weights = torch::ones({v.size(0), v.size(1), 1}, v.options());
    }
    return sources[0];
  }
  torch::Tensor v = torch::stack(sources, 0);  // [S, B, T, d]
  torch::Tensor probs;
  if (query.defined()) {
    torch::Tensor logits = torch::matmul(key_norm->forward(v), query);  // [S, B, T]
    probs = torch::softmax(logits, 0);
  } else {
    probs = torch::full({S, v.size(1), v.size(2)}, 1.0 / S, v.options());
  }
  if (weights != nullptr) *weights = probs.permute({1, 2, 0}).detach();
  return (probs.unsqueeze(-1) * v).sum(0);
}

namespace {

RmsNormImpl* OrNull(RmsNorm& norm) { return norm.is_empty() ? nullptr : norm.get(); }

class AttnResBlockImpl : public TransformerBlockImpl {
 public:
  AttnResBlockImpl(const ModelShape& shape, bool first) : TransformerBlockImpl(shape) {
    const int64_t d = shape.d_model;
    if (!first) {
      attn_query = register_parameter("attn_query", torch::zeros({d}));
      attn_key_norm = register_module("attn_key_norm", RmsNorm(d));
    }
    ffn_query = register_parameter("ffn_query", torch::zeros({d}));
    ffn_key_norm = register_module("ffn_key_norm", RmsNorm(d));
  }
  torch::Tensor attn_query, ffn_query;  // attn_query undefined in block 0
  RmsNorm attn_key_norm{nullptr}, ffn_key_norm{nullptr};
};
TORCH_MODULE(AttnResBlock);

// DepthState layout: tensors = [embedding, frozen sources..., running sum],
// the running sum undefined while empty.
class AttnResDesign final : public DesignImpl {
 public:
  AttnResDesign(const DesignOptions& options, Arch arch, int64_t block_size)
      : DesignImpl(options), arch_(arch), block_size_(block_size) {
    const int64_t d = options.shape.d_model;
    for (int64_t l = 0; l < options.shape.layers; ++l) {
      blocks_.push_back(register_module("block_" + std::to_string(l),
                                        AttnResBlock(options.shape, l == 0)));
    }
    head_query = register_parameter("head_query", torch::zeros({d}));
    head_key_norm = register_module("head_key_norm", RmsNorm(d));
  }
  Arch arch() const override { return arch_; }

  DepthState Begin(const torch::Tensor& embedding) override {
    records_.clear();
    return DepthState({embedding, torch::Tensor()});
  }

  void ApplyBlock(int64_t position, int64_t weights, DepthState& s) override {
    AttnResBlockImpl& b = *blocks_[weights];
    // A block without an attention query (block 0's weights) placed at a
    // later slot mixes uniformly, as a zero query would.
    // Each branch gets its input already through its pre-norm (SubLayer).
    SubLayer(2 * position, s, b.attn_query, OrNull(b.attn_key_norm), *b.attn_norm,
             [&](const torch::Tensor& xn) { return b.attn->forward(xn, rope()); });
    SubLayer(2 * position + 1, s, b.ffn_query, b.ffn_key_norm.get(), *b.ffn_norm,
             [&](const torch::Tensor& xn) { return b.ffn->forward(xn); });
  }

  // A skipped block adds nothing to the running sum; the freezes its slot's
  // boundaries call for still happen (by position).
  void SkipBlock(int64_t position, DepthState& s) override {
    for (int64_t k : {2 * position, 2 * position + 1}) MaybeFreeze(k, s);
  }

  torch::Tensor Finish(const DepthState& s) override {
    if (!record_diagnostics_) {
      // Mix + final norm in one dispatcher call (fused on CUDA).
      return AttnResMixOp(Sources(s), head_query, head_key_norm->weight, final_norm->weight,
                          final_norm->eps());
    }
    return final_norm->forward(HeadMix(s, /*record=*/true));
  }

  // The mixture the next layer consumes (before its pre-norm): block
  // `blocks_done`'s attention mixture (the embedding for 0), the head's
  // mixture after all blocks. Uses the unswapped weights of that slot.
  torch::Tensor Representation(const DepthState& s, int64_t blocks_done) override {
    if (blocks_done >= num_blocks()) return HeadMix(s, false);
    AttnResBlockImpl& b = *blocks_[blocks_done];
    return AttnResMix(Sources(s), b.attn_query, OrNull(b.attn_key_norm), nullptr);
  }
  torch::Tensor LensHidden(const DepthState& s, int64_t blocks_done) override {
    return Representation(s, blocks_done);
  }

  void InitDesignParameters() override {
    torch::NoGradGuard no_grad;
    for (auto& b : blocks_) {
      if (b->attn_query.defined()) b->attn_query.zero_();
      b->ffn_query.zero_();
      if (!b->attn_key_norm.is_empty()) b->attn_key_norm->weight.fill_(1.0);
      b->ffn_key_norm->weight.fill_(1.0);
    }
    head_query.zero_();
    head_key_norm->weight.fill_(1.0);
  }

  std::vector<MixingRecord> MixingWeights() const override { return records_; }

  torch::Tensor head_query;
  RmsNorm head_key_norm{nullptr};

 private:
  static std::vector<torch::Tensor> Sources(const DepthState& s) {
    std::vector<torch::Tensor> src(s.tensors.begin(), s.tensors.end() - 1);
    if (s.tensors.back().defined()) src.push_back(s.tensors.back());
    return src;
  }

  torch::Tensor HeadMix(const DepthState& s, bool record) {
    torch::Tensor w;
    torch::Tensor mix = AttnResMix(Sources(s), head_query, head_key_norm.get(),
                                   record ? &w : nullptr);
    if (record) {
      records_.push_back({2 * num_blocks(), w, s.tensors.back().defined() && block_size_ > 1});
    }
    return mix;
  }

  void MaybeFreeze(int64_t k, DepthState& s) {
    if (AttnResFreezesAt(k, block_size_) && s.tensors.back().defined()) {
      s.tensors.push_back(torch::Tensor());  // the new, empty running sum
    }
  }

  // Mixes the sources into sub-layer k's input, through `pre_norm`, runs the
  // branch on it and adds its output to the running sum. Without a
  // diagnostics record the mix and the pre-norm are one dispatcher call
  // (cuda_ops AttnResMixOp: fused on CUDA, the same composite elsewhere);
  // with one, the composite keeps the mixing weights.
  template <typename Branch>
  void SubLayer(int64_t k, DepthState& s, const torch::Tensor& query, RmsNormImpl* key_norm,
                RmsNormImpl& pre_norm, Branch&& branch) {
    torch::Tensor xn;
    if (record_diagnostics_) {
      torch::Tensor w;
      xn = pre_norm.forward(AttnResMix(Sources(s), query, key_norm, &w));
      records_.push_back({k, w, s.tensors.back().defined() && block_size_ > 1});
    } else {
      xn = AttnResMixOp(Sources(s), query, key_norm ? key_norm->weight : torch::Tensor(),
                        pre_norm.weight, pre_norm.eps());
    }
    MaybeFreeze(k, s);
    torch::Tensor y = branch(xn);
    torch::Tensor& run = s.tensors.back();
    run = run.defined() ? run + y : y;
  }

  Arch arch_;
  int64_t block_size_;
  std::vector<AttnResBlock> blocks_;
  std::vector<MixingRecord> records_;
};

}  // namespace

std::shared_ptr<DesignImpl> MakeAttnRes(const DesignOptions& options, Arch arch,
                                        int64_t block_size) {
  return std::make_shared<AttnResDesign>(options, arch, block_size);
}

}  // namespace depthbench
