// Cost accounting of spec section 7 / paper Appendix D: forward FLOPs with one
// multiply-add = 2 FLOPs, counting matrix products and depth-mixing vector
// products and omitting norms and element-wise work; KV-cache bytes.
//
// Torch-free; thread safety: pure functions.
#ifndef DEPTHBENCH_TRAINER_CORE_FLOPS_H_
#define DEPTHBENCH_TRAINER_CORE_FLOPS_H_

#include <cstdint>

#include "trainer_core/arch.h"
#include "trainer_core/shapes.h"

namespace depthbench {

struct FlopsBreakdown {
  // L (4 T d^2 + 4 T d kv_dim + 6 T d d_ff + 2 T^2 d): = L(8Td^2 + ...) for MHA.
  double body = 0;
  double head_all_positions = 0;  // 2 T d V
  double head_last_position = 0;  // 2 d V
  double design = 0;              // the design's own term (below)
  double total_all_positions = 0; // body + design + head_all_positions
  double kv_cache_bytes = 0;      // per sequence of T tokens
};

// Design terms (m = streams):
//   hc            2L [2Tmd(m+1) + 2Tmd + 2Tm(m+1)d + 2Tmd]   (192 T d L at m=4)
//   mhc           2L [2Tmd(m^2+2m) + 2Tmd + 2Tm^2 d + 2Tmd]  (480 T d L at m=4)
//   attnres_full  4 T d L (2L+3)
//   attnres_block 4 T d [sum_{k=1}^{2L-1} (2 + floor(k/b)) + 9], b = 2L/8
//                 (Appendix D as printed. The module mixes 2 + floor((k-1)/b)
//                 sources at sub-layer k, one fewer at the 7 boundary
//                 sub-layers, so it runs 7 * 4 T d fewer; see
//                 model/README.md. With b = 1 the printed count would not
//                 reduce to the Full term, the module's does.)
//   moda          (not in Appendix D; same convention) FFN K/V projections
//                 4 T d kv_dim (L-1) plus depth attention: block l's queries
//                 see 2l depth slots, QK and PV 2 * 2 T d each: 4 T d L (L-1)
//   others        0
// kv_cache_bytes = 2 (K and V) * L * T * kv_dim * bytes_per_element.
FlopsBreakdown ForwardFlops(Arch arch, const ModelShape& shape, int64_t seq_len,
                            int64_t streams = kDefaultHcStreams,
                            int64_t bytes_per_element = 2);

}  // namespace depthbench

#endif  // DEPTHBENCH_TRAINER_CORE_FLOPS_H_
