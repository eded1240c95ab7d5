// The residual design interface: what differs between the ten designs of
// spec section 3 lives behind it; the embedding, the head and the training
// loop do not know which design they drive.
//
// A forward pass is driven step by step so that diagnostics can skip a block,
// swap two blocks and restart from a cached prefix without a design knowing:
//
//   DepthState s = design->Begin(embedding);          // h_0
//   for (l = 0; l < L; ++l) design->ApplyBlock(l, order[l], s);
//   logits = head(design->Finish(s));
//
// DepthState holds whatever the design carries between blocks (Pre-LN: the
// residual; HC: the n streams; AttnRes: the sources; MoDA: the residual and
// the depth K/V cache). Tensors in it are never modified in place, so copying
// a DepthState is a cheap snapshot (diagnostics cache prefixes this way).
//
// Thread safety: none; a design is owned by one training thread.
#ifndef DEPTHBENCH_TRAINER_CORE_MODEL_DESIGN_H_
#define DEPTHBENCH_TRAINER_CORE_MODEL_DESIGN_H_

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "trainer_core/arch.h"
#include "trainer_core/model/layers.h"
#include "trainer_core/shapes.h"

namespace depthbench {

struct DesignOptions {
  ModelShape shape;
  int64_t max_seq_len = 2048;
  int64_t hc_streams = kDefaultHcStreams;
  // HC update: false = the paper's H' = A_r^T H + b F (default); true = the
  // authors' code form, where the residual-mixing columns are unused.
  bool hc_code_form = false;
};

struct DepthState {
  DepthState() = default;
  explicit DepthState(std::vector<torch::Tensor> t) : tensors(std::move(t)) {}
  std::vector<torch::Tensor> tensors;  // design-defined meaning
  // MoDA's per-token depth K/V cache (empty for other designs).
  std::vector<torch::Tensor> depth_keys;
  std::vector<torch::Tensor> depth_values;
  // AttnRes bookkeeping for skip and swap (README "Skip and swap"):
  // the weights index of the block applied last (-1: none yet, or a skip);
  // the mixing site (sub-layer k, or 2L for the head) that must return its
  // newest source unmixed because the block it would have consumed was
  // skipped (-1: none).
  int64_t last_weights = -1;
  int64_t identity_mix_site = -1;
};

// One depth-mixing site's softmax weights from the last recorded forward
// (AttnRes). Sites are numbered by sub-layer position k = 2l (attention) or
// 2l + 1 (FFN); the head is site 2L.
struct MixingRecord {
  int64_t site = 0;
  // [B, T, S] over the site's sources in order: embedding, frozen sources
  // (Full: sub-layer outputs; Block: block sums), then the running sum when
  // has_running_sum (Block AttnRes only).
  torch::Tensor weights;
  bool has_running_sum = false;
};

// Which parameters get weight decay is part of each design (spec section 9:
// everything decays except HC/mHC static routing, biases and gains).
struct ParamGroups {
  std::vector<torch::Tensor> decay;
  std::vector<torch::Tensor> no_decay;
};

class DesignImpl : public torch::nn::Module {
 public:
  explicit DesignImpl(const DesignOptions& options);
  ~DesignImpl() override = default;

  virtual Arch arch() const = 0;
  int64_t num_blocks() const { return options_.shape.layers; }
  const DesignOptions& options() const { return options_; }

  // h_0 from the token embeddings [B, T, d].
  virtual DepthState Begin(const torch::Tensor& embedding) = 0;

  // Runs the block in slot `position` (0-indexed) with the weights of block
  // `weights` (== position unless two blocks are swapped). The per-design
  // swap rules (spec section 9) are in model/README.md "Skip and swap":
  // weights and the per-layer constants that belong to them (LNS's
  // 1/sqrt(l), HC's read stream) follow `weights`; structure that exists
  // only at some positions (KEEL block 0, Block AttnRes boundaries, MoDA's
  // last block) stays with `position`; AttnRes mixers as the README says.
  virtual void ApplyBlock(int64_t position, int64_t weights, DepthState& state) = 0;

  // The block in slot `position` replaced by the identity (README "Skip and
  // swap"). Default: nothing changes. MoDA writes zero depth slots; AttnRes
  // applies the "next output" rule.
  virtual void SkipBlock(int64_t position, DepthState& state);

  // Normalised hidden [B, T, d] for the LM head (includes the final norm).
  virtual torch::Tensor Finish(const DepthState& state) = 0;

  // Representation h_l after `blocks_done` blocks, for angular distance,
  // causal score and CKA: [B, T, d'] (HC/mHC: streams concatenated, d' = n d;
  // AttnRes: the mixture the next layer consumes).
  virtual torch::Tensor Representation(const DepthState& state,
                                       int64_t blocks_done) = 0;

  // What the logit lens reads after `blocks_done` blocks (before the final
  // norm): Pre-LN the residual, HC the sum of streams, AttnRes the mixture
  // the next depth-mixing query makes. [B, T, d].
  virtual torch::Tensor LensHidden(const DepthState& state, int64_t blocks_done) = 0;

  // Initialises the design's own parameters after the model-wide std-0.02
  // init of every matrix (DeepNorm's beta, HC's 1/sqrt(n), zero queries...).
  virtual void InitDesignParameters() {}

  // Parameters that must not decay; everything else decays.
  virtual std::vector<torch::Tensor> NoDecayParameters() { return {}; }

  // Diagnostics recording: while on, the designs that have them keep the
  // routing tensors of the last forward (detached), cleared by Begin().
  void set_record_diagnostics(bool on) { record_diagnostics_ = on; }
  bool record_diagnostics() const { return record_diagnostics_; }
  // HC/mHC: the residual map of each connector run, in execution order
  // (sub-layer 2p, 2p + 1 for each applied slot p), [B, T, n, n] with
  // H'_s = sum_r M[r, s] H_r (H' = M^T H) plus the written branch output.
  // Empty for other designs or when not recording.
  virtual std::vector<torch::Tensor> ResidualMaps() const { return {}; }
  // AttnRes: the mixing weights of each site run, in execution order.
  virtual std::vector<MixingRecord> MixingWeights() const { return {}; }

  // The final norm (RMSNorm) feeding the head.
  RmsNorm final_norm{nullptr};

 protected:
  const Rope& rope() const { return *rope_; }
  DesignOptions options_;
  bool record_diagnostics_ = false;

 private:
  std::unique_ptr<Rope> rope_;
};

// Builds the design for `arch`. InvalidArgument for a bad shape.
std::shared_ptr<DesignImpl> MakeDesign(Arch arch, const DesignOptions& options);

// Per-design factories (one file each).
std::shared_ptr<DesignImpl> MakePreLn(const DesignOptions& options);
std::shared_ptr<DesignImpl> MakeSandwichLn(const DesignOptions& options);
std::shared_ptr<DesignImpl> MakeLns(const DesignOptions& options);
std::shared_ptr<DesignImpl> MakeDeepNorm(const DesignOptions& options);
std::shared_ptr<DesignImpl> MakeKeel(const DesignOptions& options);
std::shared_ptr<DesignImpl> MakeHc(const DesignOptions& options);
std::shared_ptr<DesignImpl> MakeMhc(const DesignOptions& options);
std::shared_ptr<DesignImpl> MakeAttnResFull(const DesignOptions& options);
std::shared_ptr<DesignImpl> MakeAttnResBlock(const DesignOptions& options);
std::shared_ptr<DesignImpl> MakeModa(const DesignOptions& options);

// mHC's residual-map normalisation: 20 log-domain Sinkhorn-Knopp iterations
// (rows, then columns, eps 1e-6) on logits [..., n, n]; returns the
// (approximately) doubly stochastic exp(z). Defined in mhc.cc.
torch::Tensor SinkhornKnopp(const torch::Tensor& logits);

// Standard Pre-LN-style block parts, reused by several designs.
class TransformerBlockImpl : public torch::nn::Module {
 public:
  TransformerBlockImpl(const ModelShape& shape);
  RmsNorm attn_norm{nullptr}, ffn_norm{nullptr};
  Attention attn{nullptr};
  SwiGlu ffn{nullptr};
};
TORCH_MODULE(TransformerBlock);

// One Pre-LN block on the single stream h: h + F(norm(h) * input_scale) for
// attention, then for the FFN. Pre-LN uses input_scale 1 (no extra op), LNS
// 1/sqrt(l).
torch::Tensor PreNormBlockForward(TransformerBlockImpl& b, const torch::Tensor& h,
                                  const Rope& rope, double input_scale = 1.0);

}  // namespace depthbench

#endif  // DEPTHBENCH_TRAINER_CORE_MODEL_DESIGN_H_
