// The offline tools of depthbench-train (shapes, params, flops, data-info)
// and the human loss-curve summary printed at the end of a training run.
// Each tool writes an aligned table, or JSON with --json.
//
// Thread safety: none needed (command-line use).
#ifndef DEPTHBENCH_TRAINER_CORE_TOOLS_H_
#define DEPTHBENCH_TRAINER_CORE_TOOLS_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "absl/status/status.h"

namespace depthbench {

struct ToolFlags {
  bool json = false;
  std::string suite;
  std::string ref;
  std::string layers_list;
  std::string match = "total";
  int64_t vocab = 0;  // 0: the suite's own (shapes), 256 otherwise
  int64_t kv_heads = 0;
  int64_t heads = 16;
  std::string arch;
  int64_t layers = 0;
  int64_t d_model = 0;
  int64_t seq = 2048;
  int64_t hc_streams = 4;
  std::string data = "brown";
  std::string data_dir;
};

CLI::App* AddShapesCommand(CLI::App& app, ToolFlags& flags);
CLI::App* AddParamsCommand(CLI::App& app, ToolFlags& flags);
CLI::App* AddFlopsCommand(CLI::App& app, ToolFlags& flags);
CLI::App* AddDataInfoCommand(CLI::App& app, ToolFlags& flags);

absl::Status RunShapesCommand(const ToolFlags& flags, std::ostream& out);
absl::Status RunParamsCommand(const ToolFlags& flags, std::ostream& out);
absl::Status RunFlopsCommand(const ToolFlags& flags, std::ostream& out);
absl::Status RunDataInfoCommand(const ToolFlags& flags, std::ostream& out);

// Prints rows as an aligned text table (first row = header).
void PrintTable(const std::vector<std::vector<std::string>>& rows, std::ostream& out);

// Collects step/eval/done events and renders a short loss-curve summary:
// training loss at 0, 25, 50, 75 and 100% of the run, validation losses,
// throughput and the final status.
class LossCurveSummary {
 public:
  void Observe(const nlohmann::json& event);
  std::string Render() const;

 private:
  std::vector<std::pair<int64_t, double>> losses_;
  std::vector<std::pair<int64_t, double>> evals_;
  double tokens_per_s_sum_ = 0;
  int64_t tokens_per_s_n_ = 0;
  std::string status_;
  std::string arch_;
  int64_t params_ = 0;
};

}  // namespace depthbench

#endif  // DEPTHBENCH_TRAINER_CORE_TOOLS_H_
