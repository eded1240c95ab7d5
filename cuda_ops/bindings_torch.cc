// Helpers shared by the *_torch.cc bindings (CUDA-enabled LibTorch only).
// Only c10/cuda headers are used (stable from LibTorch 1.13 to 2.x), not
// ATen/cuda/CUDAContext.h, which drags in cuBLAS/cuSPARSE headers.
#include <c10/cuda/CUDAStream.h>
#include <torch/cuda.h>

#include "cuda_ops/torch_bindings.h"

namespace depthbench {
namespace fused {

bool CudaDeviceAvailable() { return torch::cuda::is_available(); }

bool KernelDtype(const torch::Tensor& t) {
  return t.defined() && t.is_cuda() &&
         (t.scalar_type() == torch::kFloat32 || t.scalar_type() == torch::kBFloat16);
}

namespace internal {

DbDtype ToDbDtype(const torch::Tensor& t) {
  TORCH_CHECK(t.scalar_type() == torch::kFloat32 || t.scalar_type() == torch::kBFloat16,
              "fused ops take fp32 or bf16, got ", t.scalar_type());
  return t.scalar_type() == torch::kBFloat16 ? kDbBFloat16 : kDbFloat32;
}

void* CurrentStream(const torch::Tensor& on) {
  return static_cast<void*>(c10::cuda::getCurrentCUDAStream(on.device().index()).stream());
}

void Check(int cuda_error, const char* op) {
  TORCH_CHECK(cuda_error == 0, "fused op ", op, ": CUDA error ", cuda_error);
}

}  // namespace internal
}  // namespace fused
}  // namespace depthbench
