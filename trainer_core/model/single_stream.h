// The single-stream designs (pre_ln, sandwich_ln, lns, deepnorm, keel): the
// depth state is one residual stream h [B, T, d]; blocks block_0 ..
// block_{L-1} of one module type; h_0 is the embedding, Representation and
// LensHidden are h itself and Finish is final_norm(h). A design adds its
// ApplyBlock (and anything else it has: DeepNorm's init, KEEL's first
// block).
//
// Thread safety: as torch::nn::Module.
#ifndef DEPTHBENCH_TRAINER_CORE_MODEL_SINGLE_STREAM_H_
#define DEPTHBENCH_TRAINER_CORE_MODEL_SINGLE_STREAM_H_

#include <functional>
#include <string>
#include <vector>

#include "trainer_core/model/design.h"

namespace depthbench {

template <class Block>
class SingleStreamDesign : public DesignImpl {
 public:
  // make_block(l) builds block l; the blocks are registered in order, as
  // "block_<l>" (the checkpoints' parameter names).
  SingleStreamDesign(const DesignOptions& options,
                     const std::function<Block(int64_t)>& make_block)
      : DesignImpl(options) {
    for (int64_t l = 0; l < options.shape.layers; ++l) {
      blocks_.push_back(register_module("block_" + std::to_string(l), make_block(l)));
    }
  }
  // Blocks built from the shape alone.
  explicit SingleStreamDesign(const DesignOptions& options)
      : SingleStreamDesign(options, [&options](int64_t) { return Block(options.shape); }) {}

  DepthState Begin(const torch::Tensor& embedding) override { return DepthState({embedding}); }
  torch::Tensor Finish(const DepthState& s) override { return final_norm->forward(s.tensors[0]); }
  torch::Tensor Representation(const DepthState& s, int64_t) override { return s.tensors[0]; }
  torch::Tensor LensHidden(const DepthState& s, int64_t) override { return s.tensors[0]; }

 protected:
  std::vector<Block> blocks_;
};

}  // namespace depthbench

#endif  // DEPTHBENCH_TRAINER_CORE_MODEL_SINGLE_STREAM_H_
