#include "common/fd_limit.h"

#include <sys/resource.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace depthbench {

absl::StatusOr<FdLimit> RaiseFdLimit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) {
    return absl::InternalError(absl::StrCat("getrlimit(RLIMIT_NOFILE): ", strerror(errno)));
  }
  FdLimit out;
  out.previous_soft = lim.rlim_cur;
  rlim_t target = lim.rlim_max;
  if (target == RLIM_INFINITY) {
    // setrlimit refuses a soft limit above fs.nr_open.
    uint64_t nr_open = 1 << 20;
    std::ifstream in("/proc/sys/fs/nr_open");
    if (!(in >> nr_open) || nr_open == 0) nr_open = 1 << 20;
    target = static_cast<rlim_t>(nr_open);
  }
  if (lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur < target) {
    rlimit raised = lim;
    raised.rlim_cur = target;
    if (setrlimit(RLIMIT_NOFILE, &raised) != 0) {
      return absl::InternalError(
          absl::StrCat("setrlimit(RLIMIT_NOFILE, ", target, "): ", strerror(errno)));
    }
    lim = raised;
  }
  out.soft = lim.rlim_cur;
  out.hard = lim.rlim_max;
  return out;
}

}  // namespace depthbench
