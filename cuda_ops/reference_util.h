// Internal helpers of the CPU references (not part of the op API).
#ifndef DEPTHBENCH_CUDA_OPS_REFERENCE_UTIL_H_
#define DEPTHBENCH_CUDA_OPS_REFERENCE_UTIL_H_

#include <torch/torch.h>

namespace depthbench {
namespace reference {

// Computes in at least fp32: bf16/fp16 inputs are upcast (the fused kernels
// accumulate in fp32 too); fp64 stays fp64 (gradchecks).
inline torch::Tensor Up(const torch::Tensor& t) {
  if (!t.defined()) return t;
  const auto s = t.scalar_type();
  return (s == torch::kBFloat16 || s == torch::kHalf) ? t.to(torch::kFloat32) : t;
}

}  // namespace reference
}  // namespace depthbench

#endif  // DEPTHBENCH_CUDA_OPS_REFERENCE_UTIL_H_
