// Mixed precision for training on CUDA: bf16 autocast of matmuls with fp32
// master weights (the optimizer and the parameters stay fp32), and a guard
// that turns autocast off for code the spec keeps in fp32 (HC/mHC routing
// coefficients, Sinkhorn).
//
// CPU: precision "bf16" is refused (Trainer returns InvalidArgument). LibTorch
// 1.13 has a CPU autocast, but on CPUs without bf16 matrix units it is slower
// than fp32 and it would make CPU smoke runs differ numerically from the
// fp32 reference runs the tests compare against; GPU runs are what bf16 is for.
//
// API drift: LibTorch 1.13 spells the CUDA autocast switches
// at::autocast::{is_enabled, set_enabled, set_autocast_gpu_dtype}; 2.4+
// deprecates them for the device-typed {is_autocast_enabled,
// set_autocast_enabled, set_autocast_dtype}(at::kCUDA, ...). Both are
// handled here by version.
//
// Thread safety: autocast state is thread-local; guards act on the calling
// thread only (the forward pass runs on the training thread).
#ifndef DEPTHBENCH_TRAINER_CORE_PRECISION_H_
#define DEPTHBENCH_TRAINER_CORE_PRECISION_H_

#include <ATen/autocast_mode.h>
#include <torch/version.h>

namespace depthbench {

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define DEPTHBENCH_AUTOCAST_DEVICE_API 1
#endif

inline bool CudaAutocastEnabled() {
#ifdef DEPTHBENCH_AUTOCAST_DEVICE_API
  return at::autocast::is_autocast_enabled(at::kCUDA);
#else
  return at::autocast::is_enabled();
#endif
}

inline void SetCudaAutocast(bool enabled) {
#ifdef DEPTHBENCH_AUTOCAST_DEVICE_API
  at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
  at::autocast::set_autocast_enabled(at::kCUDA, enabled);
#else
  at::autocast::set_autocast_gpu_dtype(at::kBFloat16);
  at::autocast::set_enabled(enabled);
#endif
}

// bf16 CUDA autocast for the guard's lifetime (no-op when !enabled); clears
// the autocast weight-cast cache on exit, once per step as PyTorch's
// torch.autocast context does.
class Bf16AutocastGuard {
 public:
  explicit Bf16AutocastGuard(bool enabled) : enabled_(enabled), previous_(CudaAutocastEnabled()) {
    if (enabled_) SetCudaAutocast(true);
  }
  ~Bf16AutocastGuard() {
    if (!enabled_) return;
    SetCudaAutocast(previous_);
    if (!previous_) at::autocast::clear_cache();
  }
  Bf16AutocastGuard(const Bf16AutocastGuard&) = delete;
  Bf16AutocastGuard& operator=(const Bf16AutocastGuard&) = delete;

 private:
  bool enabled_;
  bool previous_;
};

// Autocast off for the guard's lifetime: fp32 routing (HC/mHC coefficients,
// Sinkhorn) inside a bf16 forward. Inputs must be cast to fp32 by the caller.
class AutocastOffGuard {
 public:
  AutocastOffGuard() : previous_(CudaAutocastEnabled()) {
    if (previous_) SetCudaAutocast(false);
  }
  ~AutocastOffGuard() {
    if (previous_) SetCudaAutocast(true);
  }
  AutocastOffGuard(const AutocastOffGuard&) = delete;
  AutocastOffGuard& operator=(const AutocastOffGuard&) = delete;

 private:
  bool previous_;
};

}  // namespace depthbench

#endif  // DEPTHBENCH_TRAINER_CORE_PRECISION_H_
