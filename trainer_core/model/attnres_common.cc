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
    if (!records_.empty()) records_.clear();  // read-only when not recording (micro_batch.h)
    return DepthState({embedding, torch::Tensor()});
  }

  // Swap rule (spec section 9): slot p runs block w's core weights and FFN
  // mixer; its attention (input-side) mixer is the mixer that consumes the
  // output of the block run in slot p-1, which travels with that block
  // (ConsumerMixer). Unswapped, that is block p's own attention mixer.
  void ApplyBlock(int64_t position, int64_t weights, DepthState& s) override {
    AttnResBlockImpl& b = *blocks_[weights];
    Mixer in = position == 0 ? Mixer{} : ConsumerMixer(s, position);
    // Each branch gets its input already through its pre-norm (SubLayer).
    SubLayer(2 * position, s, in.query, in.key_norm, *b.attn_norm,
             [&](const torch::Tensor& xn) { return b.attn->forward(xn, rope()); });
    SubLayer(2 * position + 1, s, b.ffn_query, b.ffn_key_norm.get(), *b.ffn_norm,
             [&](const torch::Tensor& xn) { return b.ffn->forward(xn); });
    s.last_weights = weights;
  }

  // Skip rule ("next output", spec section 9): the block adds nothing to the
  // running sum and freezes nothing (a skipped Block AttnRes block does not
  // close its block group), and the depth mix that would consume its output
  // returns its newest source unmixed when that mix is a true boundary
  // (block p+1's attention mix at a boundary; always for Full AttnRes) or
  // the head. Inside a Block AttnRes group the next mix runs as usual.
  void SkipBlock(int64_t position, DepthState& s) override {
    const int64_t next = 2 * (position + 1);
    s.identity_mix_site = (position + 1 == num_blocks() || AttnResFreezesAt(next, block_size_))
                              ? next
                              : -1;
    s.last_weights = -1;
  }

  torch::Tensor Finish(const DepthState& s) override {
    const int64_t head_site = 2 * num_blocks();
    if (s.identity_mix_site == head_site) {
      if (record_diagnostics_) records_.push_back(IdentityRecord(head_site, s));
      return final_norm->forward(Sources(s).back());
    }
    Mixer m = ConsumerMixer(s, num_blocks());
    if (!record_diagnostics_) {
      // Mix + final norm in one dispatcher call (fused on CUDA).
      return AttnResMixOp(Sources(s), m.query, m.key_norm->weight, final_norm->weight,
                          final_norm->eps());
    }
    return final_norm->forward(HeadMix(s, /*record=*/true));
  }

  // The diagnostics' state z_l (spec section 9): the embedding for l = 0;
  // the depth mix the next layer consumes at a true boundary (block l's
  // attention mix when it is a boundary, the head mix for l = L; every l for
  // Full AttnRes); inside a Block AttnRes group the plain partial sum (the
  // running sum; the newest source if it is still empty).
  torch::Tensor Representation(const DepthState& s, int64_t blocks_done) override {
    if (blocks_done == 0) return s.tensors.front();
    if (blocks_done < num_blocks() && !AttnResFreezesAt(2 * blocks_done, block_size_)) {
      return Sources(s).back();
    }
    return LensHidden(s, blocks_done);
  }
  // The mixture the next depth-mixing query makes (before its pre-norm),
  // with the skip and swap rules applied: block `blocks_done`'s attention
  // mixture (the embedding for 0), the head's mixture after all blocks.
  torch::Tensor LensHidden(const DepthState& s, int64_t blocks_done) override {
    if (blocks_done == 0) return s.tensors.front();
    if (s.identity_mix_site == 2 * blocks_done) return Sources(s).back();
    Mixer m = ConsumerMixer(s, blocks_done);
    return AttnResMix(Sources(s), m.query, m.key_norm, nullptr);
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

  struct Mixer {
    torch::Tensor query;             // undefined: uniform
    RmsNormImpl* key_norm = nullptr;
  };

  // The mixer that consumes the output of block c - 1 (c in 1..L): block
  // c's attention mixer, the head's for c = L.
  Mixer OutputMixer(int64_t c) {
    if (c >= num_blocks()) return {head_query, head_key_norm.get()};
    AttnResBlockImpl& b = *blocks_[c];
    return {b.attn_query, OrNull(b.attn_key_norm)};
  }
  // The mixer in use at slot p's attention site (p = L: the head): the one
  // that belongs to the block run in slot p-1 (its last_weights), or slot
  // p's own when the previous slot ran unswapped, was skipped or is unknown.
  Mixer ConsumerMixer(const DepthState& s, int64_t p) {
    return OutputMixer(s.last_weights >= 0 ? s.last_weights + 1 : p);
  }

  // A record for a site that returned its newest source: weight 1 on it.
  MixingRecord IdentityRecord(int64_t site, const DepthState& s) const {
    const std::vector<torch::Tensor> src = Sources(s);
    const torch::Tensor& v = src.back();
    torch::Tensor w = torch::zeros({v.size(0), v.size(1), static_cast<int64_t>(src.size())},
                                   v.options());
    w.select(2, w.size(2) - 1).fill_(1.0);
    return {site, w, s.tensors.back().defined() && block_size_ > 1};
  }

  torch::Tensor HeadMix(const DepthState& s, bool record) {
    torch::Tensor w;
    Mixer m = ConsumerMixer(s, num_blocks());
    torch::Tensor mix = AttnResMix(Sources(s), m.query, m.key_norm, record ? &w : nullptr);
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
    if (s.identity_mix_site == k) {
      // "Next output" rule after a skipped block: the newest source, unmixed.
      if (record_diagnostics_) records_.push_back(IdentityRecord(k, s));
      xn = pre_norm.forward(Sources(s).back());
      s.identity_mix_site = -1;
    } else if (record_diagnostics_) {
      torch::Tensor w;
      xn = pre_norm.forward(AttnResMix(Sources(s), query, key_norm, &w));
      records_.push_back({k, w, s.tensors.back().defined() && block_size_ > 1});
    } else {
      // The sources come back passed through the mix (one gradient per
      // source, summed in the kernels; cuda_ops AttnResMixOp) and replace
      // the state's.
      std::vector<torch::Tensor> passed;
      xn = AttnResMixOp(Sources(s), query, key_norm ? key_norm->weight : torch::Tensor(),
                        pre_norm.weight, pre_norm.eps(), &passed);
      std::copy(passed.begin(), passed.end(), s.tensors.begin());
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
