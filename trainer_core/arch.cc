#include "trainer_core/arch.h"

#include <algorithm>
#include <array>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace depthbench {
namespace {

struct ArchEntry {
  Arch arch;
  std::string_view name;
};

constexpr std::array<ArchEntry, 10> kArchTable = {{
    {Arch::kPreLn, "pre_ln"},
    {Arch::kSandwichLn, "sandwich_ln"},
    {Arch::kLns, "lns"},
    {Arch::kDeepNorm, "deepnorm"},
    {Arch::kKeel, "keel"},
    {Arch::kHc, "hc"},
    {Arch::kMhc, "mhc"},
    {Arch::kAttnResFull, "attnres_full"},
    {Arch::kAttnResBlock, "attnres_block"},
    {Arch::kModa, "moda"},
}};

}  // namespace

const std::vector<Arch>& AllArchs() {
  static const std::vector<Arch>* all = [] {
    auto* v = new std::vector<Arch>();
    for (const auto& e : kArchTable) v->push_back(e.arch);
    return v;
  }();
  return *all;
}

std::string_view ArchName(Arch arch) {
  for (const auto& e : kArchTable) {
    if (e.arch == arch) return e.name;
  }
  return "unknown";
}

absl::StatusOr<Arch> ParseArch(std::string_view name) {
  for (const auto& e : kArchTable) {
    if (e.name == name) return e.arch;
  }
  std::vector<std::string> names;
  for (const auto& e : kArchTable) names.emplace_back(e.name);
  return absl::InvalidArgumentError(
      absl::StrCat("unknown architecture \"", std::string(name), "\" (valid: ",
                   absl::StrJoin(names, ", "), ")"));
}

std::vector<double> DefaultLrGrid(Arch arch) {
  if (arch == Arch::kLns) return {2e-3, 5e-3, 1e-2, 2e-2};
  return {5e-4, 1e-3, 2e-3, 5e-3};
}

int64_t AttnResBlockSize(int64_t layers) {
  return std::max<int64_t>(1, (2 * layers) / 8);
}

int64_t ExtraParamsFormula(Arch arch, int64_t layers, int64_t d_model,
                           int64_t kv_dim, int64_t streams) {
  const int64_t L = layers, d = d_model, n = streams;
  switch (arch) {
    case Arch::kPreLn:
    case Arch::kLns:
    case Arch::kDeepNorm:
      return 0;
    case Arch::kSandwichLn:
      return 2 * d * L;
    case Arch::kKeel:
      return L == 0 ? 0 : d + 2 * d * (L - 1);
    case Arch::kHc: {
      const int64_t per_site = n * (n + 1) + n + d * (n + 1) + d + 2;
      return 2 * L * per_site;
    }
    case Arch::kMhc: {
      const int64_t logits = n * n + 2 * n;
      const int64_t per_site = n * d * logits + logits + 3;
      return 2 * L * per_site;
    }
    case Arch::kAttnResFull:
    case Arch::kAttnResBlock:
      return 2 * d * (2 * L);
    case Arch::kModa:
      return L == 0 ? 0 : 2 * d * kv_dim * (L - 1);
  }
  return 0;
}

}  // namespace depthbench
