// The daemons' start-up call of RaiseFdLimit (common/fd_limit.h), logged:
// one info line when the soft limit moved, a warning when it could not be
// read or raised (the daemon runs on). Header-only so db_common stays free
// of spdlog (the trainer-only build links it).
#ifndef DEPTHBENCH_COMMON_FD_LIMIT_LOG_H_
#define DEPTHBENCH_COMMON_FD_LIMIT_LOG_H_

#include <spdlog/spdlog.h>

#include "common/fd_limit.h"

namespace depthbench {

inline void RaiseFdLimitAndLog() {
  if (absl::StatusOr<FdLimit> fds = RaiseFdLimit(); fds.ok()) {
    if (fds->soft != fds->previous_soft) {
      spdlog::info("open-file limit raised from {} to {}", fds->previous_soft, fds->soft);
    }
  } else {
    spdlog::warn("{}", fds.status().ToString());
  }
}

}  // namespace depthbench

#endif  // DEPTHBENCH_COMMON_FD_LIMIT_LOG_H_
