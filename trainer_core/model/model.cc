#include "trainer_core/model/model.h"

#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "cuda_ops/ops.h"

namespace depthbench {

LanguageModelImpl::LanguageModelImpl(const ModelOptions& options) : options_(options) {
  const ModelShape& s = options.design.shape;
  embed = register_module("embed", torch::nn::Embedding(s.vocab, s.d_model));
  design_ = register_module("design", MakeDesign(options.arch, options.design));
  head = register_module(
      "head", torch::nn::Linear(torch::nn::LinearOptions(s.d_model, s.vocab).bias(false)));
  Initialize();
}

void LanguageModelImpl::Initialize() {
  torch::NoGradGuard no_grad;
  const double std = options_.init_std;
  for (auto& p : parameters()) {
    if (p.dim() < 2) continue;  // norm gains stay at 1, vectors are the design's
    if (options_.init == InitKind::kNormal) {
      p.normal_(0.0, std);
    } else {
      // Truncated normal at +-3 std by resampling the tails (the authors'
      // OLMo-core init); LibTorch 1.13 has no trunc_normal_.
      p.normal_(0.0, std);
      for (int i = 0; i < 32; ++i) {
        torch::Tensor out = p.abs() > 3 * std;
        if (!out.any().item<bool>()) break;
        p.masked_scatter_(out, torch::randn_like(p).mul_(std).masked_select(out));
      }
    }
  }
  design_->InitDesignParameters();
}

torch::Tensor LanguageModelImpl::forward(const torch::Tensor& tokens) {
  return Forward(tokens, ForwardControl{});
}

torch::Tensor LanguageModelImpl::Forward(const torch::Tensor& tokens,
                                         const ForwardControl& control) {
  const int64_t L = design_->num_blocks();
  DepthState state = design_->Begin(embed->forward(tokens));
  std::unordered_set<int64_t> skip(control.skip.begin(), control.skip.end());
  for (int64_t p = 0; p < L; ++p) {
    if (skip.count(p)) {
      design_->SkipBlock(p, state);
      continue;
    }
    const int64_t w = control.order.empty() ? p : control.order[p];
    design_->ApplyBlock(p, w, state);
  }
  return Logits(design_->Finish(state));
}

torch::Tensor LanguageModelImpl::Logits(const torch::Tensor& hidden) {
  return LinearOp(hidden, head->weight);
}

torch::Tensor LanguageModelImpl::CrossEntropy(const torch::Tensor& logits,
                                              const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(
      logits.reshape({-1, logits.size(-1)}).to(torch::kFloat32), targets.reshape({-1}));
}

torch::Tensor LanguageModelImpl::Loss(const torch::Tensor& inputs,
                                      const torch::Tensor& targets) {
  return CrossEntropy(forward(inputs), targets);
}

ParamGroups LanguageModelImpl::ParameterGroups() {
  ParamGroups groups;
  std::unordered_set<const void*> no_decay;
  for (auto& p : design_->NoDecayParameters()) no_decay.insert(p.unsafeGetTensorImpl());
  for (auto& p : parameters()) {
    if (no_decay.count(p.unsafeGetTensorImpl())) {
      groups.no_decay.push_back(p);
    } else {
      groups.decay.push_back(p);
    }
  }
  return groups;
}

int64_t LanguageModelImpl::ParameterCount() const {
  int64_t n = 0;
  for (const auto& p : parameters()) n += p.numel();
  return n;
}

absl::StatusOr<LanguageModel> BuildModel(const ModelOptions& options) {
  absl::Status st = ValidateShape(options.design.shape);
  if (!st.ok()) return st;
  if ((options.arch == Arch::kHc || options.arch == Arch::kMhc) &&
      options.design.hc_streams < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("hc_streams: must be at least 1, got ", options.design.hc_streams));
  }
  try {
    return LanguageModel(options);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("building the model failed: ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("building the model failed: ", e.what()));
  }
}

absl::StatusOr<ParamCount> CountParameters(const ModelOptions& options) {
  auto model = BuildModel(options);
  if (!model.ok()) return model.status();
  ModelOptions base = options;
  base.arch = Arch::kPreLn;
  auto pre_ln = BuildModel(base);
  if (!pre_ln.ok()) return pre_ln.status();
  ParamCount c;
  c.total = (*model)->ParameterCount();
  c.pre_ln_total = (*pre_ln)->ParameterCount();
  c.extra = c.total - c.pre_ln_total;
  return c;
}

}  // namespace depthbench
