// Raises the process's soft RLIMIT_NOFILE to its hard limit at start-up.
//
// Daemons that accept connections (gRPC, the metrics HTTP endpoint) must
// not run out of descriptors at the usual soft default of 1,024 while the
// hard limit allows far more: a single EMFILE in gRPC's accept loop stops
// its listener for good (gRPC 1.51). Children inherit the raised limit.
//
//   absl::StatusOr<FdLimit> limit = RaiseFdLimit();
//   if (limit.ok()) LOG << "fd limit " << limit->soft;
//
// Thread safety: call once, early in main(), before threads open files.
#ifndef DEPTHBENCH_COMMON_FD_LIMIT_H_
#define DEPTHBENCH_COMMON_FD_LIMIT_H_

#include <cstdint>

#include "absl/status/statusor.h"

namespace depthbench {

struct FdLimit {
  uint64_t previous_soft = 0;
  uint64_t soft = 0;  // after the call
  uint64_t hard = 0;
};

// Sets soft = hard (a hard limit of "unlimited" is taken as the kernel's
// fs.nr_open). Internal with errno's text if getrlimit/setrlimit fail.
absl::StatusOr<FdLimit> RaiseFdLimit();

}  // namespace depthbench

#endif  // DEPTHBENCH_COMMON_FD_LIMIT_H_
