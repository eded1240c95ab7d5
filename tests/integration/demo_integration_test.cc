// `depthbench demo --workdir DIR`, exactly as the README runs it: a
// scheduler, two workers and the embedded 24-job sweep, to the results table.
#include <chrono>
#include <filesystem>
#include <set>
#include <sstream>

#include <gtest/gtest.h>

#include "tests/integration/scheduler_process.h"
#include "tests/integration/worker_process.h"

namespace depthbench::testing {
namespace {

TEST(DemoIntegrationTest, DemoRunsToTheResultsTable) {
  std::string dir = MakeTempDir("demo");
  auto start = std::chrono::steady_clock::now();
  auto [rc, out] = RunCommand(std::string(DEPTHBENCH_CLI_BIN) + " demo --workdir " + dir +
                              "/work 2>&1");
  double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << out << "\n(demo wall time " << seconds << " s)\n";
  ASSERT_EQ(rc, 0) << out;
  EXPECT_LT(seconds, 300.0) << "the demo should finish in under 5 minutes";
  // The results table: one row per (arch, L) of the demo spec.
  std::istringstream lines(out.substr(out.find("Results:")));
  std::string line;
  std::set<std::string> rows, with_best;
  while (std::getline(lines, line)) {
    std::istringstream cells(line);
    std::string arch, layers, d, aspect, params, best_lr;
    if (!(cells >> arch >> layers >> d >> aspect >> params >> best_lr)) continue;
    if (layers != "2" && layers != "4" && layers != "6") continue;
    rows.insert(arch + "/" + layers);
    if (best_lr != "-") with_best.insert(arch + "/" + layers);
  }
  for (const char* arch : {"pre_ln", "hc", "attnres_full", "sandwich_ln"}) {
    for (const char* l : {"2", "4", "6"}) {
      EXPECT_TRUE(rows.count(std::string(arch) + "/" + l)) << arch << " L=" << l;
    }
  }
  for (const char* arch : {"pre_ln", "sandwich_ln"}) {
    for (const char* l : {"2", "4", "6"}) {
      EXPECT_TRUE(with_best.count(std::string(arch) + "/" + l)) << arch << " L=" << l;
    }
  }
  EXPECT_NE(out.find("database:"), std::string::npos);
  // The web view's address (issue 16), printed while the sweep runs.
  EXPECT_NE(out.find("web view (sweep, results, live loss curves): http://127.0.0.1:"),
            std::string::npos);
  EXPECT_LT(out.find("web view"), out.find("Results:"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/work/demo.sqlite"));
  // No daemon left behind: the demo stopped what it started ("[-]" keeps
  // the pattern from matching the shell that runs pgrep).
  EXPECT_EQ(RunCommand("pgrep -f -- '[-]-checkpoint-root " + dir + "/work/checkpoints'").first, 1);
  if (!HasFailure()) std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace depthbench::testing
