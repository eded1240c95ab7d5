// The ten residual designs of DepthBench (spec section 3) and what is known
// about each without building a model: canonical identifiers (used by the
// CLI, the proto API and the database), default LR grids (spec section 5) and
// the closed-form count of parameters each design adds over Pre-LN.
//
// Torch-free: the scheduler links this to validate and expand sweep specs.
// Thread safety: pure functions over constant tables.
#ifndef DEPTHBENCH_TRAINER_CORE_ARCH_H_
#define DEPTHBENCH_TRAINER_CORE_ARCH_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace depthbench {

enum class Arch {
  kPreLn,
  kSandwichLn,
  kLns,
  kDeepNorm,
  kKeel,
  kHc,
  kMhc,
  kAttnResFull,
  kAttnResBlock,
  kModa,
};

// All ten, in the spec's order.
const std::vector<Arch>& AllArchs();

// Canonical identifier: "pre_ln", "sandwich_ln", "lns", "deepnorm", "keel",
// "hc", "mhc", "attnres_full", "attnres_block", "moda".
std::string_view ArchName(Arch arch);

// Parses a canonical identifier; InvalidArgument names the bad value and lists
// the valid ones.
absl::StatusOr<Arch> ParseArch(std::string_view name);

// The paper's LR grid for the design: {5e-4, 1e-3, 2e-3, 5e-3}, LNS
// {2e-3, 5e-3, 1e-2, 2e-2}.
std::vector<double> DefaultLrGrid(Arch arch);

// Number of residual streams used by HC/mHC (n in the spec); 1 for others.
inline constexpr int64_t kDefaultHcStreams = 4;

// Parameters the design adds over a Pre-LN model of the same shape, from the
// spec's formulas (section 3). `kv_dim` is kv_heads * head_dim (= d for MHA);
// `streams` is n for HC/mHC, ignored otherwise. The `params` tool and the
// tests check these against the real modules.
//   sandwich_ln    2d per block (output norms)
//   keel           d in block 0, 2d in every other block (post-norms)
//   hc             per sub-layer: static n x (n+1) read/residual map, n write
//                  weights, dynamic d x (n+1) and d x 1 projections, 2 gains
//   mhc            per sub-layer: Phi (n d) x (n^2+2n), n^2+2n biases, 3 gains
//   attnres_*      2d per mixing site (query + key-norm gain); sites are every
//                  sub-layer but block 0's attention, plus the head: 2L sites
//   moda           K and V projections (d x kv_dim each) on the FFN sub-layers
//                  of blocks 0..L-2
int64_t ExtraParamsFormula(Arch arch, int64_t layers, int64_t d_model,
                           int64_t kv_dim, int64_t streams = kDefaultHcStreams);

// Number of sub-layers between Block AttnRes block boundaries: 2L/8 rounded
// down, at least 1 (b = 4,5,6,7,8 for L = 16,20,24,28,32).
int64_t AttnResBlockSize(int64_t layers);

}  // namespace depthbench

#endif  // DEPTHBENCH_TRAINER_CORE_ARCH_H_
