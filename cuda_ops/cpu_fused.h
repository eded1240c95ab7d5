// A fused CPU kernel for the normalisation every sub-layer runs, RMSNorm, as
// an autograd function with a hand-written backward pass (the math of
// rms_norm.cu and of the reference's RmsNormBackward).
//
// Why: the composites (cuda_ops/*_ref.cc) make 4 passes over the activation
// for an RMSNorm forward and ~8 for its backward, each allocating a
// temporary; these kernels make 2 and 2, with no temporaries beyond the
// output, rows split over LibTorch's intra-op threads (at::parallel_for).
// On the issue-2 benchmark model that is part of what puts depthbench-train
// ahead of PyTorch eager (bench/RESULTS.md).
//
// Not fused on CPU: the SwiGLU gate. Its sigmoid needs exp per element, and
// ATen's vectorised (Sleef, AVX2) silu beats a portable scalar loop built
// without -mavx2 by more than the passes saved.
//
// float32 and float64 (the latter for gradcheck), any shape with the
// normalised dimension last; inputs are made contiguous. No double
// backward (the backward is not differentiable); use the references for that.
//
// Thread safety: as LibTorch ops.
#ifndef DEPTHBENCH_CUDA_OPS_CPU_FUSED_H_
#define DEPTHBENCH_CUDA_OPS_CPU_FUSED_H_

#include <torch/torch.h>

namespace depthbench {
namespace cpu_fused {

// Whether these kernels take the tensors: all on the CPU, same floating
// dtype, float32 or float64.
bool Supports(std::initializer_list<const torch::Tensor*> tensors);

// y = x * rsqrt(mean(x^2, -1) + eps) * weight; weight [d], x [..., d].
torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps);

}  // namespace cpu_fused
}  // namespace depthbench

#endif  // DEPTHBENCH_CUDA_OPS_CPU_FUSED_H_
