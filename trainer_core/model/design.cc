#include "trainer_core/model/design.h"

#include "absl/strings/str_cat.h"

namespace depthbench {

DesignImpl::DesignImpl(const DesignOptions& options)
    : options_(options),
      rope_(std::make_unique<Rope>(options.shape.head_dim(), options.max_seq_len)) {
  final_norm = register_module("final_norm", RmsNorm(options.shape.d_model));
}

void DesignImpl::SkipBlock(int64_t /*position*/, DepthState& /*state*/) {}

TransformerBlockImpl::TransformerBlockImpl(const ModelShape& shape) {
  attn_norm = register_module("attn_norm", RmsNorm(shape.d_model));
  attn = register_module(
      "attn", Attention(AttentionOptions{shape.d_model, shape.heads, shape.kv_heads}));
  ffn_norm = register_module("ffn_norm", RmsNorm(shape.d_model));
  ffn = register_module("ffn", SwiGlu(shape.d_model, shape.d_ff));
}

torch::Tensor PreNormBlockForward(TransformerBlockImpl& b, const torch::Tensor& h,
                                  const Rope& rope, double input_scale) {
  auto in = [input_scale](const torch::Tensor& normed) {
    return input_scale == 1.0 ? normed : normed * input_scale;
  };
  torch::Tensor out = h + b.attn->forward(in(b.attn_norm->forward(h)), rope);
  return out + b.ffn->forward(in(b.ffn_norm->forward(out)));
}

std::shared_ptr<DesignImpl> MakeDesign(Arch arch, const DesignOptions& options) {
  switch (arch) {
    case Arch::kPreLn: return MakePreLn(options);
    case Arch::kSandwichLn: return MakeSandwichLn(options);
    case Arch::kLns: return MakeLns(options);
    case Arch::kDeepNorm: return MakeDeepNorm(options);
    case Arch::kKeel: return MakeKeel(options);
    case Arch::kHc: return MakeHc(options);
    case Arch::kMhc: return MakeMhc(options);
    case Arch::kAttnResFull: return MakeAttnResFull(options);
    case Arch::kAttnResBlock: return MakeAttnResBlock(options);
    case Arch::kModa: return MakeModa(options);
  }
  return nullptr;
}

}  // namespace depthbench
