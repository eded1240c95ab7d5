#include "trainer_core/flops.h"

namespace depthbench {

FlopsBreakdown ForwardFlops(Arch arch, const ModelShape& s, int64_t seq_len,
                            int64_t streams, int64_t bytes_per_element) {
  const double L = static_cast<double>(s.layers);
  const double T = static_cast<double>(seq_len);
  const double d = static_cast<double>(s.d_model);
  const double kv = static_cast<double>(s.kv_dim());
  const double ff = static_cast<double>(s.d_ff);
  const double V = static_cast<double>(s.vocab);
  const double m = static_cast<double>(streams);

  FlopsBreakdown f;
  f.body = L * (4 * T * d * d + 4 * T * d * kv + 6 * T * d * ff + 2 * T * T * d);
  f.head_all_positions = 2 * T * d * V;
  f.head_last_position = 2 * d * V;
  switch (arch) {
    case Arch::kHc:
      f.design = 2 * L * (2 * T * m * d * (m + 1) + 2 * T * m * d +
                          2 * T * m * (m + 1) * d + 2 * T * m * d);
      break;
    case Arch::kMhc:
      f.design = 2 * L * (2 * T * m * d * (m * m + 2 * m) + 2 * T * m * d +
                          2 * T * m * m * d + 2 * T * m * d);
      break;
    case Arch::kAttnResFull:
      f.design = 4 * T * d * L * (2 * L + 3);
      break;
    case Arch::kAttnResBlock: {
      const int64_t b = AttnResBlockSize(s.layers);
      double sources = 9;
      for (int64_t k = 1; k <= 2 * s.layers - 1; ++k) sources += 2 + k / b;
      f.design = 4 * T * d * sources;
      break;
    }
    case Arch::kModa:
      f.design = 4 * T * d * kv * (L - 1) + 4 * T * d * L * (L - 1);
      break;
    default:
      f.design = 0;
  }
  f.total_all_positions = f.body + f.design + f.head_all_positions;
  f.kv_cache_bytes = 2 * L * T * kv * static_cast<double>(bytes_per_element);
  return f;
}

}  // namespace depthbench
