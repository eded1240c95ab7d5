// The DepthBench language model: untied token embedding -> residual design
// (one of ten) -> final RMSNorm (owned by the design) -> untied LM head.
// No biases. Init (spec section 2): every weight matrix N(0, 0.02) (or the
// authors' truncated normal, cut at +-3 std), norm gains 1, then the design's
// own init.
//
// Thread safety: owned by one training thread. Forwards (and their
// backwards) of the same model may run concurrently while diagnostics
// recording is off, as trainer_core/micro_batch.h runs its micro-batches;
// nothing else may touch the model meanwhile.
#ifndef DEPTHBENCH_TRAINER_CORE_MODEL_MODEL_H_
#define DEPTHBENCH_TRAINER_CORE_MODEL_MODEL_H_

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer_core/model/design.h"

namespace depthbench {

enum class InitKind { kNormal, kTruncatedNormal };

struct ModelOptions {
  Arch arch = Arch::kPreLn;
  DesignOptions design;
  InitKind init = InitKind::kNormal;
  double init_std = 0.02;
};

// How one forward pass walks the blocks: `order[p]` is the block whose
// weights run in slot p (identity = no swap); `skip` lists slots replaced by
// the identity.
struct ForwardControl {
  std::vector<int64_t> order;
  std::vector<int64_t> skip;
};

class LanguageModelImpl : public torch::nn::Module {
 public:
  explicit LanguageModelImpl(const ModelOptions& options);

  // tokens [B, T] int64 -> logits [B, T, V].
  torch::Tensor forward(const torch::Tensor& tokens);
  torch::Tensor Forward(const torch::Tensor& tokens, const ForwardControl& control);
  // Mean next-token cross-entropy; inputs [B, T], targets [B, T].
  torch::Tensor Loss(const torch::Tensor& inputs, const torch::Tensor& targets);
  // The LM head on final hidden states [..., d] -> logits [..., V], as
  // forward applies it (LinearOp: oneDNN's sgemm on CPU). Every pass that
  // compares its logits with forward's goes through here, since
  // head->forward (torch::linear, the system BLAS) rounds differently.
  torch::Tensor Logits(const torch::Tensor& hidden);
  // Cross-entropy of given logits.
  static torch::Tensor CrossEntropy(const torch::Tensor& logits, const torch::Tensor& targets);

  ParamGroups ParameterGroups();
  int64_t ParameterCount() const;

  DesignImpl& design() { return *design_; }
  const ModelOptions& options() const { return options_; }

  torch::nn::Embedding embed{nullptr};
  torch::nn::Linear head{nullptr};

 private:
  void Initialize();

  ModelOptions options_;
  std::shared_ptr<DesignImpl> design_;
};
TORCH_MODULE(LanguageModel);

// Validates the shape and builds the model (InvalidArgument names the field).
absl::StatusOr<LanguageModel> BuildModel(const ModelOptions& options);

// Counts parameters of the real modules: total and the design's extra over a
// Pre-LN model of the same shape.
struct ParamCount {
  int64_t total = 0;
  int64_t pre_ln_total = 0;
  int64_t extra = 0;
};
absl::StatusOr<ParamCount> CountParameters(const ModelOptions& options);

}  // namespace depthbench

#endif  // DEPTHBENCH_TRAINER_CORE_MODEL_MODEL_H_
