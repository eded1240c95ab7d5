#include "common/malloc_tuning.h"

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <cstdlib>
#include <cstring>

namespace depthbench {
namespace {

constexpr int kMmapThreshold = 256 << 20;
constexpr int kTrimThreshold = 1 << 30;

std::string& Policy() {
  static std::string policy = "glibc default";
  return policy;
}

}  // namespace

std::string PinMallocThresholds() {
  const char* env = std::getenv("DEPTHBENCH_MALLOC");
  if (env != nullptr && std::strcmp(env, "default") == 0) {
    Policy() = "glibc default (DEPTHBENCH_MALLOC=default)";
    return Policy();
  }
#ifdef __GLIBC__
  // mallopt returns 1 on success; setting either threshold also turns off
  // glibc's dynamic adjustment of both.
  if (mallopt(M_MMAP_THRESHOLD, kMmapThreshold) == 1 &&
      mallopt(M_TRIM_THRESHOLD, kTrimThreshold) == 1) {
    Policy() = "pinned (mmap 256 MiB, trim 1 GiB)";
  } else {
    Policy() = "glibc default (mallopt refused)";
  }
#else
  Policy() = "system default (not glibc)";
#endif
  return Policy();
}

std::string MallocPolicy() { return Policy(); }

}  // namespace depthbench
