// Human and machine output for the CLI: aligned text tables, CSV, and
// protobuf messages as JSON.
//
// Thread safety: Table is a plain value; functions are pure.
#ifndef DEPTHBENCH_CLI_OUTPUT_H_
#define DEPTHBENCH_CLI_OUTPUT_H_

#include <ostream>
#include <string>
#include <vector>

#include <google/protobuf/message.h>

namespace depthbench::cli {

class Table {
 public:
  explicit Table(std::vector<std::string> header) : header_(std::move(header)) {}
  void AddRow(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  // Columns padded to their widest cell, two spaces apart.
  void Print(std::ostream& out) const;
  // RFC 4180 CSV (quotes cells holding commas, quotes or newlines).
  void PrintCsv(std::ostream& out) const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

// Proto3 JSON with field names as in the .proto and defaults included.
std::string ToJson(const google::protobuf::Message& message);

// Shortest round-trip-ish formatting for losses and learning rates.
std::string FormatDouble(double value, int precision = 6);

}  // namespace depthbench::cli

#endif  // DEPTHBENCH_CLI_OUTPUT_H_
