// Reads a sweep spec from YAML or JSON into depthbench.v1.SweepSpec. Both
// formats go through one JSON tree, so errors read the same: the field path
// as `spec.<path>: <problem>` (unknown or repeated keys, wrong types,
// integers out of range). Semantic checks (architecture names, shapes,
// ranges) are the scheduler's, with the same path style
// (scheduler/sweep_expander.h), which follows the proto's field names; the
// reader accepts those names too: `shapes.explicit_shapes` beside the
// shorter `shapes.explicit`, and an `lr_grids` entry as `{lrs: [...]}`
// beside a plain list.
//
// Thread safety: pure functions.
#ifndef DEPTHBENCH_CLI_SPEC_READER_H_
#define DEPTHBENCH_CLI_SPEC_READER_H_

#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "depthbench/v1/spec.pb.h"

namespace depthbench::cli {

// Largest spec text the reader accepts (the scheduler bounds the parsed spec
// further). YAML aliases are refused: they could expand a small file
// without bound.
inline constexpr size_t kMaxSpecFileBytes = 1 << 20;

// Reads the file; ".json" is parsed as JSON, anything else as YAML (a JSON
// document is valid YAML too).
absl::StatusOr<depthbench::v1::SweepSpec> ReadSpecFile(const std::string& path);

absl::StatusOr<depthbench::v1::SweepSpec> ParseSpecYaml(const std::string& text);
absl::StatusOr<depthbench::v1::SweepSpec> ParseSpecJson(const std::string& text);
absl::StatusOr<depthbench::v1::SweepSpec> SpecFromJson(const nlohmann::json& json);

}  // namespace depthbench::cli

#endif  // DEPTHBENCH_CLI_SPEC_READER_H_
