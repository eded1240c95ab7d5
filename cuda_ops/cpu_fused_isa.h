// The fused CPU kernels (cpu_fused.cc, cpu_fused_mix.cc, cpu_fused_attn.cc) are
// compiled three times (cuda_ops/CMakeLists.txt): for the baseline x86-64
// ISA, with AVX2 + FMA and with AVX-512, each object in its own namespace
// below. cpu_fused_dispatch.cc picks one per process from the CPU's
// features, so a binary built here runs on any x86-64 CPU and uses 8-wide
// (16-wide) FMA loops where there are (issue 18: the multi-stream mixing is
// dot and axpy loops over [tokens, n, d] whose arithmetic, not memory
// traffic, bounded them in the SSE2 build; the routing projections stayed
// FMA-bound at 8 wide).
//
// Only the kernels' own code is built for the wider ISAs: cpu_fused_target.h,
// included last in a kernel file, switches the target after every header,
// so no inline function shared with the rest of the program is compiled for
// AVX2 or AVX-512 (the ctests cpu_fused_{avx2,avx512}_code_stays_in_its_namespace
// check each object's code for that).
#ifndef DEPTHBENCH_CUDA_OPS_CPU_FUSED_ISA_H_
#define DEPTHBENCH_CUDA_OPS_CPU_FUSED_ISA_H_

#include <torch/torch.h>

#include <vector>

#include "cuda_ops/cpu_fused.h"
#include "cuda_ops/cpu_gemm.h"

#define DEPTHBENCH_CPU_FUSED_KERNELS(isa)                                                     \
  namespace isa {                                                                            \
  torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps);    \
  torch::Tensor SwiGluPacked(const torch::Tensor& gu);                                        \
  torch::Tensor HcRead(const torch::Tensor& h, const torch::Tensor& read);                    \
  torch::Tensor HcWrite(const torch::Tensor& h, const torch::Tensor& a, const torch::Tensor& b, \
                        const torch::Tensor& y);                                              \
  torch::Tensor RmsProject(const torch::Tensor& x, const torch::Tensor& w, double eps);       \
  std::vector<torch::Tensor> HcCoefficients(const torch::Tensor& u, const torch::Tensor& static_a, \
                                            const torch::Tensor& static_b,                   \
                                            const torch::Tensor& gain_a,                     \
                                            const torch::Tensor& gain_b);                    \
  std::vector<torch::Tensor> MhcCoefficients(const torch::Tensor& u, const torch::Tensor& gains, \
                                             const torch::Tensor& bias, int64_t n);          \
  std::vector<torch::Tensor> MhcRoute(const torch::Tensor& h, const torch::Tensor& phi,     \
                                      const torch::Tensor& gains, const torch::Tensor& bias, \
                                      int64_t n, double eps, cpu_gemm::SgemmFn gemm);        \
  std::vector<torch::Tensor> HcRoute(const torch::Tensor& h, const torch::Tensor& w,          \
                                     const torch::Tensor& static_a, const torch::Tensor& static_b, \
                                     const torch::Tensor& gain_a, const torch::Tensor& gain_b, \
                                     double eps);                                            \
  std::vector<torch::Tensor> HcWriteRoute(                                                    \
      const torch::Tensor& h, const torch::Tensor& a, const torch::Tensor& b,                 \
      const torch::Tensor& y, const torch::Tensor& w, const torch::Tensor& static_a,          \
      const torch::Tensor& static_b, const torch::Tensor& gain_a, const torch::Tensor& gain_b, \
      double eps);                                                                            \
  torch::Tensor Sinkhorn(const torch::Tensor& logits, int iterations, double eps);            \
  torch::Tensor AttnResMix(const std::vector<torch::Tensor>& sources, const torch::Tensor& query, \
                           const torch::Tensor& key_gain, const torch::Tensor& out_gain,      \
                           double eps, std::vector<torch::Tensor>* passed);                   \
  torch::Tensor CausalAttention(const torch::Tensor& q, const torch::Tensor& k,                \
                                const torch::Tensor& v, const torch::Tensor& depth_keys,       \
                                const torch::Tensor& depth_values, double scale);              \
  std::vector<torch::Tensor> CausalAttentionQkv(                                              \
      const torch::Tensor& qkv, int64_t heads, int64_t kv_heads, const torch::Tensor& cos,     \
      const torch::Tensor& sin, const std::vector<torch::Tensor>& depth_keys,                  \
      const std::vector<torch::Tensor>& depth_values, double scale, bool return_kv,            \
      bool pass_slots);                                                                        \
  void AdamWStep(const torch::Tensor& param, const torch::Tensor& grad,                       \
                 const torch::Tensor& exp_avg, const torch::Tensor& exp_avg_sq,              \
                 const AdamWCoefficients& c);                                                \
  /* Threads at::parallel_for ran a 64-task loop on, as compiled in this object. */          \
  int ParallelForThreads();                                                                  \
  }

namespace depthbench {
namespace cpu_fused {

DEPTHBENCH_CPU_FUSED_KERNELS(generic)
DEPTHBENCH_CPU_FUSED_KERNELS(avx2)
DEPTHBENCH_CPU_FUSED_KERNELS(avx512)

// Shared by both builds (defined once, in cpu_fused_dispatch.cc): sums
// per-thread double partials [threads][count] in thread order into a tensor
// of `dtype` shaped `sizes` (the kernels' parameter gradients, deterministic
// for a fixed thread count).
torch::Tensor SumPartials(const std::vector<double>& partial, int64_t threads, int64_t count,
                          torch::IntArrayRef sizes, torch::ScalarType dtype);

// Gradient buffers a fused backward may update in place (shared by the
// builds, in cpu_fused_dispatch.cc). The ops that pass their inputs
// through (AttnResMix's sources, CausalAttentionQkv's depth slots) receive,
// for each passed input, the gradient that the next reader's backward
// returned for it, and return that gradient plus their own term as the
// input's. Allocating a new tensor for that sum cost a write-allocate of a
// full-size tensor per passed input per reader (Full AttnRes at L = 8: 153
// of 512 KB per step, issue 18). A backward that allocates a gradient and
// returns it once marks it (MarkOwnedGradient); when that tensor arrives
// as the gradient of a passed output, no other node can see it (autograd
// hands a returned gradient to the one node whose input it feeds, summed
// with other readers' into a new tensor or into this one), so the receiving
// backward takes it (TakeOwnedGradient) and adds its term in place. Marks
// hold weak references: a marked tensor that died is never matched (its
// TensorImpl's memory is not reused while the mark holds it) and is pruned.
// Passed outputs must therefore carry no tensor hooks (retain_grad), which
// would also see the gradient; the models register none.
void MarkOwnedGradient(const torch::Tensor& grad);
// Whether `grad` is a marked, live tensor that can be written in place as
// the gradient of a tensor of `sizes` and `dtype` (contiguous, that shape
// and type; with rows_any_layout, any non-overlapping dense layout whose
// last dim is contiguous, for kernels that address rows through strides);
// forgets the mark either way.
bool TakeOwnedGradient(const torch::Tensor& grad, torch::IntArrayRef sizes,
                       torch::ScalarType dtype, bool rows_any_layout = false);

// Whether this build has the AVX2 kernels and the CPU runs them (cpuid:
// AVX2 and FMA).
bool Avx2Available();
// Whether this build has the AVX-512 kernels and the CPU (and OS) runs them:
// AVX-512 F, BW, VL and DQ besides AVX2 and FMA.
bool Avx512Available();
// Which kernels the cpu_fused:: entry points run: "avx512", "avx2" or
// "generic" (the widest available; DEPTHBENCH_CPU_FUSED_ISA=avx2 or generic
// caps it).
const char* KernelIsa();

}  // namespace cpu_fused
}  // namespace depthbench

#endif  // DEPTHBENCH_CUDA_OPS_CPU_FUSED_ISA_H_
