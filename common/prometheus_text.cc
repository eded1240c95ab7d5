#include "common/prometheus_text.h"

#include <charconv>
#include <cmath>

namespace depthbench {
namespace {

bool IsAsciiAlpha(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
bool IsAsciiDigit(char c) { return c >= '0' && c <= '9'; }

}  // namespace

bool IsValidMetricName(const std::string& name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = IsAsciiAlpha(c) || c == '_' || c == ':' ||
                    (i > 0 && IsAsciiDigit(c));
    if (!ok) return false;
  }
  return true;
}

bool IsValidLabelName(const std::string& name) {
  if (name.empty()) return false;
  if (name.size() >= 2 && name[0] == '_' && name[1] == '_') return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = IsAsciiAlpha(c) || c == '_' || (i > 0 && IsAsciiDigit(c));
    if (!ok) return false;
  }
  return true;
}

namespace {

// Backslash and newline escaped, and the double quote too when `quote`
// (label values escape it, HELP text does not).
void AppendEscaped(const std::string& text, bool quote, std::string* out) {
  for (const char c : text) {
    if (c == '\\') {
      out->append("\\\\");
    } else if (c == '\n') {
      out->append("\\n");
    } else if (c == '"' && quote) {
      out->append("\\\"");
    } else {
      out->push_back(c);
    }
  }
}

}  // namespace

void AppendEscapedLabelValue(const std::string& value, std::string* out) {
  AppendEscaped(value, /*quote=*/true, out);
}

void AppendEscapedHelp(const std::string& help, std::string* out) {
  AppendEscaped(help, /*quote=*/false, out);
}

void AppendSampleValue(double value, std::string* out) {
  if (std::isnan(value)) {
    out->append("NaN");
    return;
  }
  if (std::isinf(value)) {
    out->append(value > 0 ? "+Inf" : "-Inf");
    return;
  }
  // Shortest round-trip representation (C++17 <charconv>, GCC >= 11).
  char buf[64];
  const auto result = std::to_chars(buf, buf + sizeof(buf), value);
  out->append(buf, result.ptr);
}

std::string FormatSampleValue(double value) {
  std::string out;
  AppendSampleValue(value, &out);
  return out;
}

}  // namespace depthbench
