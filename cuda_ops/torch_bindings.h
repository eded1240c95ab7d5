// The fused kernels wrapped as differentiable LibTorch ops (one *_torch.cc
// per op). Compiled only when CMake found a CUDA-enabled LibTorch; callers go
// through ops.h, which checks device, dtype and size limits first (these
// functions TORCH_CHECK them again and make inputs contiguous).
//
// Each op is a torch::autograd::Function whose forward launches the kernel on
// the current CUDA stream and whose backward launches the hand-written
// backward kernel. Parameters and routing coefficients are fp32; activations
// fp32 or bf16.
//
// Thread safety: as LibTorch ops.
#ifndef DEPTHBENCH_CUDA_OPS_TORCH_BINDINGS_H_
#define DEPTHBENCH_CUDA_OPS_TORCH_BINDINGS_H_

#include <torch/torch.h>

#include <vector>

#include "cuda_ops/kernels.h"

namespace depthbench {
namespace fused {

// True when a CUDA device is visible to this process.
bool CudaDeviceAvailable();

// True for a CUDA tensor of a dtype the kernels take (fp32, bf16).
bool KernelDtype(const torch::Tensor& t);

torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps);
torch::Tensor SwiGluGate(const torch::Tensor& g, const torch::Tensor& u);
// query and key_gain must be defined here (ops.h passes zeros / ones).
torch::Tensor AttnResMix(const std::vector<torch::Tensor>& sources, const torch::Tensor& query,
                         const torch::Tensor& key_gain, const torch::Tensor& out_gain,
                         double eps);
torch::Tensor Sinkhorn(const torch::Tensor& logits, int iterations, double eps);
torch::Tensor HcRead(const torch::Tensor& h, const torch::Tensor& read);
torch::Tensor HcWrite(const torch::Tensor& h, const torch::Tensor& a, const torch::Tensor& b,
                      const torch::Tensor& y);

// Internal helpers shared by the *_torch.cc files (each has `using namespace
// internal;`).
namespace internal {
// The autograd types every op's torch::autograd::Function uses.
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
DbDtype ToDbDtype(const torch::Tensor& t);
void* CurrentStream(const torch::Tensor& on);
// Throws c10::Error naming the op when a launcher returned non-zero.
void Check(int cuda_error, const char* op);
}  // namespace internal

}  // namespace fused
}  // namespace depthbench

#endif  // DEPTHBENCH_CUDA_OPS_TORCH_BINDINGS_H_
