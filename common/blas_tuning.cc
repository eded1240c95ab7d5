#include "common/blas_tuning.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace depthbench {

std::string OpenBlasCoreName() {
  using CoreNameFn = char* (*)();
  auto fn = reinterpret_cast<CoreNameFn>(::dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  const char* name = fn != nullptr ? fn() : nullptr;
  return name != nullptr ? std::string(name) : std::string("unknown");
}

std::string BetterOpenBlasCoreType(const std::string& core_name) {
  if (core_name != "Prescott" && core_name != "prescott") return "";
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
    return "SkylakeX";
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
  return "";
}

void ReexecForOpenBlasKernels(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;
  if (const char* policy = std::getenv("DEPTHBENCH_BLAS");
      policy != nullptr && std::strcmp(policy, "default") == 0) {
    return;
  }
  const std::string better = BetterOpenBlasCoreType(OpenBlasCoreName());
  if (better.empty()) return;
  // Set even if the exec fails, so a child this process starts gets it.
  ::setenv("OPENBLAS_CORETYPE", better.c_str(), 1);
  ::execv("/proc/self/exe", argv);
}

}  // namespace depthbench
