// depthbench-train leaves OpenBLAS's generic fallback kernels for the ones
// this CPU has (common/blas_tuning.h): checked on the real binary, whose
// OpenBLAS prints the kernel set it loads with OPENBLAS_VERBOSE=2.
#include "common/blas_tuning.h"

#include <cstdio>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace depthbench {
namespace {

// The "Core: NAME" lines the command printed, in order.
std::vector<std::string> CoreLines(const std::string& env) {
  const std::string cmd = "env -u OPENBLAS_CORETYPE -u DEPTHBENCH_BLAS OPENBLAS_VERBOSE=2 " +
                          env + " " + DEPTHBENCH_TRAIN_BIN + " shapes --suite tiny 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  EXPECT_NE(p, nullptr);
  std::vector<std::string> cores;
  if (p == nullptr) return cores;
  char line[512];
  while (std::fgets(line, sizeof line, p) != nullptr) {
    std::string s(line);
    if (s.rfind("Core: ", 0) == 0) cores.push_back(s.substr(6, s.find_last_not_of("\r\n") - 5));
  }
  EXPECT_EQ(pclose(p), 0) << cmd;
  return cores;
}

TEST(BlasTuningTest, OnlyTheFallbackIsReplaced) {
  EXPECT_EQ(BetterOpenBlasCoreType("SkylakeX"), "");
  EXPECT_EQ(BetterOpenBlasCoreType("Haswell"), "");
  EXPECT_EQ(BetterOpenBlasCoreType("unknown"), "");
  const std::string better = BetterOpenBlasCoreType("Prescott");
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512bw")) {
    EXPECT_EQ(better, "SkylakeX");
  } else if (__builtin_cpu_supports("avx2")) {
    EXPECT_EQ(better, "Haswell");
  }
}

TEST(BlasTuningTest, TrainerRunsOnTheBestKernelsItFinds) {
  const std::vector<std::string> cores = CoreLines("");
  ASSERT_FALSE(cores.empty()) << "OpenBLAS printed no kernel set (not OpenBLAS?)";
  const std::string better = BetterOpenBlasCoreType(cores.front());
  if (better.empty()) {
    EXPECT_EQ(cores.size(), 1u) << "no re-exec when OpenBLAS chose well: " << cores.front();
  } else {
    ASSERT_EQ(cores.size(), 2u) << "one re-exec from " << cores.front();
    EXPECT_EQ(cores.back(), better);
  }
}

TEST(BlasTuningTest, DefaultPolicyKeepsOpenBlassChoice) {
  const std::vector<std::string> cores = CoreLines("DEPTHBENCH_BLAS=default");
  ASSERT_EQ(cores.size(), 1u);
  const std::vector<std::string> forced = CoreLines("OPENBLAS_CORETYPE=Haswell");
  ASSERT_EQ(forced.size(), 1u);
  EXPECT_EQ(forced.front(), "Haswell");
}

}  // namespace
}  // namespace depthbench
