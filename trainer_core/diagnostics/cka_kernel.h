// The linear-CKA kernel behind D_eff (spec section 7): the L x L matrix of
// HSIC terms G[i][j] = ||X_i^T X_j||_F^2 = <X_i X_i^T, X_j X_j^T>_F of the
// column-centred layer states X_l [N, d_l], from which
// rho(i, j) = G[i][j] / sqrt(G[i][i] G[j][j]).
//
// It reads the states through a LayerRows source one row block at a time, so
// neither the whole array nor a float64 copy of it is ever held: the
// depthbench-deff / `diagnose deff` path hands it a read-only memory map of
// the .npy file, the in-model `deff` diagnostic the pooled tensors.
//
// Two GEMM-bound formulations, chosen by FLOP count for the shape:
//   * gram    : the N x N index space is cut into t x t tiles (upper
//               triangle); per tile each layer's centred Gram tile
//               K_l = X_l[a] X_l[b]^T is one GEMM (t x d x t) into an
//               [L, t*t] buffer, and G += w K K^T (w = 2 off the diagonal)
//               is a hand-written blocked contraction (BLAS is slow on that
//               inner-product shape). FLOPs ~ (sum d + L^2) N^2, for any
//               number of layers at the memory of one [L, t, t] buffer.
//   * feature : blocks of B layers are held centred as [N, sum d] and every
//               pair's d_i x d_j cross-covariance is one GEMM. FLOPs ~
//               N (sum d)^2; better when N is large against L d.
// Diagonal tiles X_l[a] X_l[a]^T are symmetric: with CkaOptions::
// diagonal_syrk (default) they go through the process's BLAS syrk (LibTorch
// has no syrk op; see FindSyrk in the .cc) and are contracted over their
// upper triangle, so every tiling does (N^2 + N) / 2 index pairs; without a
// syrk in the process they are full GEMMs (N^2 + sum of t^2) / 2.
// For 32 x 10,000 x 1,024 the gram form needs about 3.38 TFLOP with syrk
// (3.75 without, at the 9 x 1,120-row auto tiles), the feature form 11.1 TFLOP.
//
// GEMMs: float32 through oneDNN's sgemm where the trainer's dense layers
// use it (cuda_ops/cpu_gemm.h; CkaOptions::onednn_gemm), else at::mm (the
// system BLAS, as float64 always). oneDNN 2.6's sgemm must not be
// interrupted by a signal handler on the calling thread (cpu_gemm.h): the
// CLIs install none (depthbench-train takes signals with sigwait).
// Precision: kFloat32 runs the GEMMs in float32 (float32 accumulation inside
// a GEMM and over 512-column blocks of the contraction; every sum across
// those, the means and the variance check are float64); CKA values then
// carry relative errors of about 1e-6.
// Threads: the GEMMs, the contraction and the centring copy use LibTorch's
// intra-op pool; the means pass runs on the calling thread.
// kFloat64 does everything in float64. kAuto picks float64 when the run is
// small (under kCkaFloat64MaxFlops), so small inputs keep their float64
// results exactly, and float32 otherwise.
//
// Errors: InvalidArgument (naming the layer, 1-indexed) for a layer with
// non-finite values or zero variance after centring, or inconsistent
// shapes. LibTorch errors are converted to Internal; nothing throws.
// Thread safety: one call per LayerRows at a time; uses LibTorch's intra-op
// thread pool (at::get_num_threads()).
#ifndef DEPTHBENCH_TRAINER_CORE_DIAGNOSTICS_CKA_KERNEL_H_
#define DEPTHBENCH_TRAINER_CORE_DIAGNOSTICS_CKA_KERNEL_H_

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer_core/diagnostics/cka_options.h"

namespace depthbench {
namespace diagnostics {

// Layer states, served by row block.
class LayerRows {
 public:
  virtual ~LayerRows() = default;
  virtual int64_t num_layers() const = 0;
  virtual int64_t num_rows() const = 0;  // N, the same for every layer
  virtual int64_t dim(int64_t layer) const = 0;
  // Rows [r0, r1) of `layer` as a [r1 - r0, dim(layer)] float32 or float64
  // tensor (possibly a view of mapped memory, valid until Release()).
  virtual torch::Tensor Rows(int64_t layer, int64_t r0, int64_t r1) = 0;
  // Copies rows [r0, r1) of `layer` into dst, a contiguous [r1 - r0,
  // dim(layer)] tensor of the source's own dtype, where the source has a
  // cheaper way than a view (the mmap source reads the file with pread: no
  // pages mapped and dropped again for every block). false: not done (no
  // such path, a dtype it does not hold, a read error); use Rows().
  // Unlike the other members it is called from the kernel's intra-op
  // threads at once, for disjoint row ranges of one layer, so an override
  // must be safe to run concurrently.
  virtual bool ReadRows(int64_t /*layer*/, int64_t /*r0*/, int64_t /*r1*/,
                        torch::Tensor& /*dst*/) {
    return false;
  }
  // The kernel is done with every block handed out so far (the mmap source
  // drops those pages from the process's resident set).
  virtual void Release() {}
};

// In-memory [N, d_l] tensors (any float dtype; not copied).
class TensorLayerRows : public LayerRows {
 public:
  explicit TensorLayerRows(std::vector<torch::Tensor> layers)
      : layers_(std::move(layers)) {}
  int64_t num_layers() const override {
    return static_cast<int64_t>(layers_.size());
  }
  int64_t num_rows() const override {
    return layers_.empty() ? 0 : layers_[0].size(0);
  }
  int64_t dim(int64_t layer) const override { return layers_[layer].size(1); }
  torch::Tensor Rows(int64_t layer, int64_t r0, int64_t r1) override {
    return layers_[layer].slice(0, r0, r1);
  }

 private:
  std::vector<torch::Tensor> layers_;
};

// Wall-clock seconds per phase of one LinearCkaMatrix call, measured on the
// calling thread (what the time went to; they sum to about CkaResult::seconds).
struct CkaPhaseSeconds {
  double means = 0;     // pass 1: column means and the variance check
  double centre = 0;    // reading and centring row blocks
  double gemm = 0;      // Gram tiles / cross-covariances (BLAS GEMM, syrk)
  double contract = 0;  // the gram form's L x L contraction; the feature form's sums of squares
};

struct CkaResult {
  std::vector<std::vector<double>> hsic;  // G, L x L
  std::vector<std::vector<double>> cka;   // rho, L x L, diagonal 1
  CkaPlan plan;
  // Gram form: how the diagonal tiles ran, "syrk: cblas_ssyrk/dsyrk (LIB)"
  // or "gemm: at::mm (...)"; empty for the feature form.
  std::string diagonal_tiles;
  // The library of the GEMMs: "oneDNN sgemm", "at::mm", or "at::mm (why
  // not oneDNN)" for a float32 run.
  std::string gemm;
  double seconds = 0;
  CkaPhaseSeconds phases;
};

// The BLAS syrk the kernel found in the process ("cblas_ssyrk/dsyrk (LIB)",
// "ssyrk_/dsyrk_ (LIB)"), or "" when there is none.
std::string CkaSyrkSource();

// `what` starts error messages ("EffectiveDepth", "deff: FILE").
absl::StatusOr<CkaResult> LinearCkaMatrix(LayerRows& source,
                                          const CkaOptions& options,
                                          const std::string& what);

}  // namespace diagnostics
}  // namespace depthbench

#endif  // DEPTHBENCH_TRAINER_CORE_DIAGNOSTICS_CKA_KERNEL_H_
