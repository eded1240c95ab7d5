#include "common/host_port.h"

#include "absl/strings/str_cat.h"

namespace depthbench {

std::string HostPort::ToString() const {
  const std::string port_text = std::to_string(port);
  if (host.find(':') != std::string::npos) {
    return absl::StrCat("[", host, "]:", port_text);
  }
  return absl::StrCat(host, ":", port_text);
}

absl::StatusOr<HostPort> ParseHostPort(const std::string& text) {
  HostPort result;
  std::string port_text;
  if (!text.empty() && text[0] == '[') {
    const size_t close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() ||
        text[close + 1] != ':') {
      return absl::InvalidArgumentError(absl::StrCat(
          "\"", text, "\": expected [IPV6]:PORT"));
    }
    result.host = text.substr(1, close - 1);
    port_text = text.substr(close + 2);
  } else {
    const size_t colon = text.rfind(':');
    if (colon == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", text, "\": expected HOST:PORT"));
    }
    result.host = text.substr(0, colon);
    if (result.host.find(':') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "\"", text, "\": an IPv6 host needs brackets, [::1]:PORT"));
    }
    port_text = text.substr(colon + 1);
  }
  if (result.host.empty()) result.host = "0.0.0.0";
  if (port_text.empty() || port_text.size() > 5) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", text, "\": bad port \"", port_text, "\""));
  }
  int port = 0;
  for (const char c : port_text) {
    if (c < '0' || c > '9') {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", text, "\": bad port \"", port_text, "\""));
    }
    port = port * 10 + (c - '0');
  }
  if (port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", text, "\": port out of range"));
  }
  result.port = static_cast<uint16_t>(port);
  return result;
}

}  // namespace depthbench
