// A free loopback TCP port: bound to 127.0.0.1:0, read back and released.
// Another process may take it before the caller binds it, so this is for
// local use (the demo's daemons, the trainer's rendezvous, tests), where
// the window is short and nothing else competes for ports.
//
// Thread safety: stateless.
#ifndef DEPTHBENCH_COMMON_FREE_PORT_H_
#define DEPTHBENCH_COMMON_FREE_PORT_H_

#include "absl/status/statusor.h"

namespace depthbench {

// Internal (with errno's text) when no socket can be made or bound.
absl::StatusOr<int> FreeLoopbackPort();

}  // namespace depthbench

#endif  // DEPTHBENCH_COMMON_FREE_PORT_H_
