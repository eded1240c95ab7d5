// Low-level pieces of the Prometheus text exposition format, version 0.0.4:
// name validation, escaping and number formatting. MetricsRegistry
// (common/metrics.h) builds on these; they are public so that tests and the
// benchmark can check them in isolation.
//
// Format reference (summarised here so the rules live next to the code):
//   metric name   [a-zA-Z_:][a-zA-Z0-9_:]*
//   label name    [a-zA-Z_][a-zA-Z0-9_]*, names starting with "__" reserved
//   label value   any UTF-8; `\` -> `\\`, `"` -> `\"`, newline -> `\n`
//   HELP text     any UTF-8; `\` -> `\\`, newline -> `\n` (quotes kept)
//   sample value  Go ParseFloat syntax; "+Inf", "-Inf", "NaN" for specials
//
// Thread safety: stateless free functions; safe from any thread.
#ifndef DEPTHBENCH_COMMON_PROMETHEUS_TEXT_H_
#define DEPTHBENCH_COMMON_PROMETHEUS_TEXT_H_

#include <string>

namespace depthbench {

// True if `name` is a valid metric name.
bool IsValidMetricName(const std::string& name);

// True if `name` is a valid label name that a user may declare (reserved
// "__" prefix rejected).
bool IsValidLabelName(const std::string& name);

// Appends `value` escaped for use inside a quoted label value.
void AppendEscapedLabelValue(const std::string& value, std::string* out);

// Appends `help` escaped for a `# HELP` line.
void AppendEscapedHelp(const std::string& help, std::string* out);

// Appends the shortest decimal text that parses back to exactly `value`
// ("+Inf", "-Inf", "NaN" for the special values; integers without ".0").
void AppendSampleValue(double value, std::string* out);

// Convenience wrapper around AppendSampleValue.
std::string FormatSampleValue(double value);

}  // namespace depthbench

#endif  // DEPTHBENCH_COMMON_PROMETHEUS_TEXT_H_
