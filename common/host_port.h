// Parses the HOST:PORT strings of the daemons' --listen, --metrics-listen
// and --scheduler flags.
//
//   "127.0.0.1:9100"  -> {"127.0.0.1", 9100}
//   "[::1]:0"         -> {"::1", 0}         (brackets required for IPv6)
//   "localhost:7070"  -> {"localhost", 7070}
//   ":9100"           -> {"0.0.0.0", 9100}  (empty host: all IPv4 interfaces)
//
// Thread safety: stateless.
#ifndef DEPTHBENCH_COMMON_HOST_PORT_H_
#define DEPTHBENCH_COMMON_HOST_PORT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace depthbench {

struct HostPort {
  std::string host;  // without brackets
  uint16_t port = 0;

  // "host:port", bracketing an IPv6 host.
  std::string ToString() const;
};

// InvalidArgument names the bad part of `text`.
absl::StatusOr<HostPort> ParseHostPort(const std::string& text);

}  // namespace depthbench

#endif  // DEPTHBENCH_COMMON_HOST_PORT_H_
