// `depthbench demo --workdir DIR`, exactly as the README runs it: a
// scheduler, two workers and the embedded 24-job sweep, to the results table.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <vector>

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
  EXPECT_LT(seconds, 480.0) << "the demo should finish in under 8 minutes";
  // The results table: one row per (arch, L) of the demo spec.
  std::istringstream lines(out.substr(out.find("Results:")));
  std::string line;
  std::set<std::string> rows, with_best;
  std::vector<std::string> header;
  std::map<std::string, std::map<std::string, double>> deff_over_l;  // L -> arch -> value
  while (std::getline(lines, line)) {
    std::istringstream cells(line);
    std::vector<std::string> row;
    for (std::string cell; cells >> cell;) row.push_back(cell);
    if (!row.empty() && row[0] == "ARCH") header = row;
    if (row.size() < 6) continue;
    const std::string& arch = row[0];
    const std::string& layers = row[1];
    if (layers != "2" && layers != "4" && layers != "6") continue;
    rows.insert(arch + "/" + layers);
    if (row[5] != "-") with_best.insert(arch + "/" + layers);
    const auto col = std::find(header.begin(), header.end(), "DEFF/L");
    const size_t at = static_cast<size_t>(col - header.begin());
    if (col != header.end() && at < row.size() && row[at] != "-") {
      deff_over_l[layers][arch] = std::stod(row[at]);
    }
  }
  // Issue 12: D_eff/L of the trained demo models is neither 1/L (D_eff = 1,
  // what a too-small N or untrained models give) nor the same for every
  // design at a shape.
  for (const char* l : {"2", "4", "6"}) {
    const auto& by_arch = deff_over_l[l];
    ASSERT_EQ(by_arch.size(), 4u) << "D_eff/L at L=" << l << "\n" << out;
    double lo = 1e9, hi = -1e9;
    for (const auto& [arch, v] : by_arch) {
      EXPECT_GT(std::abs(v - 1.0 / std::stod(l)), 0.003) << arch << " L=" << l << ": D_eff/L " << v;
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
    EXPECT_GT(hi - lo, 0.005) << "D_eff/L at L=" << l << " is the same for every design";
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
