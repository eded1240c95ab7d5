// Model shapes and the iso-parameter solver of spec section 4.
//
// A ModelShape fully determines the backbone of every design (the design adds
// its own extra parameters, see arch.h). The solver picks, for each requested
// depth L, the width d (a multiple of 2 * heads: 16 heads x an even head_dim,
// which RoPE needs) whose matched size (total or backbone) is nearest to the
// reference shape's.
//
// Torch-free; thread safety: pure functions.
#ifndef DEPTHBENCH_TRAINER_CORE_SHAPES_H_
#define DEPTHBENCH_TRAINER_CORE_SHAPES_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace depthbench {

enum class FfnRule {
  kSwiGlu83,  // d_ff = ceil16(8d/3)  (sub-1B suites)
  kThreeD,    // d_ff = 3d            (1.6B suite)
};

enum class MatchBy { kTotal, kBackbone };

struct ModelShape {
  int64_t layers = 0;
  int64_t d_model = 0;
  int64_t d_ff = 0;
  int64_t heads = 16;
  int64_t kv_heads = 16;
  int64_t vocab = 256;

  int64_t head_dim() const { return heads == 0 ? 0 : d_model / heads; }
  int64_t kv_dim() const { return kv_heads * head_dim(); }
  double aspect_ratio() const {
    return layers == 0 ? 0.0 : static_cast<double>(d_model) / layers;
  }
};

// d_ff for width d under the rule.
int64_t FfnWidth(int64_t d_model, FfnRule rule);

// Builds a shape with d_ff from the rule.
ModelShape MakeShape(int64_t layers, int64_t d_model, int64_t vocab,
                     FfnRule rule = FfnRule::kSwiGlu83, int64_t heads = 16,
                     int64_t kv_heads = 16);

// Checks a shape is buildable: positive sizes, heads divide d, head_dim even,
// kv_heads divide heads. InvalidArgument names the field.
absl::Status ValidateShape(const ModelShape& shape);

// backbone = L * (attention + 3 d d_ff + 2d) + d (final norm), where the
// attention projections are 2 d^2 + 2 d kv_dim (4 d^2 for MHA).
int64_t BackboneParams(const ModelShape& shape);
// total = backbone + 2 V d (untied embedding and head).
int64_t TotalParams(const ModelShape& shape);

struct ShapeRow {
  ModelShape shape;
  int64_t backbone_params = 0;
  int64_t total_params = 0;
  double diff_pct = 0.0;  // matched size vs the reference's, in percent
};

struct SuiteDefinition {
  std::string name;
  int64_t ref_layers = 0;
  int64_t ref_d_model = 0;
  // Either explicit depths, or target aspect ratios (the solver then picks,
  // for each target, the depth whose solved shape has the nearest ratio).
  std::vector<int64_t> layers;
  std::vector<double> aspect_targets;
  MatchBy match = MatchBy::kTotal;
  int64_t vocab = 50280;
  FfnRule ffn = FfnRule::kSwiGlu83;
  int64_t heads = 16;
  int64_t kv_heads = 16;
};

// Named suites: main400M, isobackbone300M, ladder200M, ladder300M,
// ladder400M, ladder500M, gqa1.6B, and the CPU-scale suites tiny (used by the
// demo) and small. NotFound lists the valid names.
absl::StatusOr<SuiteDefinition> NamedSuite(std::string_view name);
std::vector<std::string> NamedSuiteNames();

// Solves a suite: one row per depth, reference first-class (diff 0 at the
// reference depth). InvalidArgument names a bad field.
absl::StatusOr<std::vector<ShapeRow>> SolveSuite(const SuiteDefinition& suite);

// The width for one depth at a budget; d ranges over multiples of 2*heads.
absl::StatusOr<ShapeRow> SolveDepth(const SuiteDefinition& suite,
                                    int64_t budget, int64_t layers);

// Parses "LxD" (e.g. "24x1024") into (layers, d_model).
absl::StatusOr<std::pair<int64_t, int64_t>> ParseLxD(std::string_view text);

}  // namespace depthbench

#endif  // DEPTHBENCH_TRAINER_CORE_SHAPES_H_
