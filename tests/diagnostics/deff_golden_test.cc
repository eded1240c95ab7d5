// D_eff against NumPy golden values (tests/golden/deff_golden.py), through the
// .npy path the CLI uses, and the depthbench-deff binary itself.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "trainer_core/diagnostics/deff_npy.h"
#include "trainer_core/diagnostics/npy.h"

namespace depthbench {
namespace diagnostics {
namespace {

const std::string kGoldenDir = DEPTHBENCH_GOLDEN_DIR;
constexpr double kTol = 1e-9;  // float64 from identical float32 inputs

nlohmann::json LoadExpected() {
  std::ifstream in(kGoldenDir + "/deff_expected.json");
  return nlohmann::json::parse(in);
}

void ExpectMatches(const nlohmann::json& got, const nlohmann::json& want) {
  for (const char* key :
       {"deff", "deff_over_l", "rho_bar1", "f_l", "gap_pct"}) {
    EXPECT_NEAR(got.at(key).get<double>(), want.at(key).get<double>(), kTol)
        << key;
  }
  EXPECT_EQ(got.at("max_lag"), want.at("max_lag"));
  ASSERT_EQ(got.at("lag_profile").size(), want.at("lag_profile").size());
  for (size_t k = 0; k < want["lag_profile"].size(); ++k) {
    EXPECT_NEAR(got["lag_profile"][k].get<double>(),
                want["lag_profile"][k].get<double>(), kTol)
        << "lag " << k;
  }
  ASSERT_EQ(got.at("cka").size(), want.at("cka").size());
  for (size_t i = 0; i < want["cka"].size(); ++i) {
    for (size_t j = 0; j < want["cka"][i].size(); ++j) {
      EXPECT_NEAR(got["cka"][i][j].get<double>(),
                  want["cka"][i][j].get<double>(), kTol)
          << i << "," << j;
    }
  }
}

TEST(DeffGoldenTest, MatchesNumpyFullLag) {
  const nlohmann::json want = LoadExpected();
  auto got = DeffFromNpy(kGoldenDir + "/deff_states.npy");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)["layers"], want["shape"][0]);
  EXPECT_EQ((*got)["sequences"], want["shape"][1]);
  EXPECT_EQ((*got)["d_model"], want["shape"][2]);
  ExpectMatches(*got, want["full"]);
}

TEST(DeffGoldenTest, MatchesNumpyLag2) {
  const nlohmann::json want = LoadExpected();
  auto got = DeffFromNpy(kGoldenDir + "/deff_states.npy", 2);
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectMatches(*got, want["lag2"]);
}

TEST(DeffGoldenTest, RejectsWrongRankAndMissingFile) {
  const std::string path = ::testing::TempDir() + "/deff_2d.npy";
  ASSERT_TRUE(WriteNpyFloat32(path, {2, 3}, {1, 2, 3, 4, 5, 6}).ok());
  auto r = DeffFromNpy(path);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DeffFromNpy(path + ".missing").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(DeffGoldenTest, TableNamesEveryFigure) {
  auto got = DeffFromNpy(kGoldenDir + "/deff_states.npy");
  ASSERT_TRUE(got.ok()) << got.status();
  const std::string table = FormatDeffTable(*got);
  for (const char* s : {"D_eff", "D_eff / L", "rho_bar(1)", "F_L", "gap to F_L",
                        "1.1242", "0.9396", "34.42"}) {
    EXPECT_NE(table.find(s), std::string::npos) << s << "\n" << table;
  }
}

// Runs a command, returning (exit status, stdout).
std::pair<int, std::string> RunShell(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return {-1, out};
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0)
    out.append(buf.data(), n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST(DeffCliTest, JsonAndTableAndErrors) {
  const std::string bin = DEPTHBENCH_DEFF_BIN;
  const std::string states = kGoldenDir + "/deff_states.npy";
  auto [rc, out] = RunShell("'" + bin + "' --states '" + states + "' --json");
  ASSERT_EQ(rc, 0) << out;
  const nlohmann::json got = nlohmann::json::parse(out);
  ExpectMatches(got, LoadExpected()["full"]);

  auto [rc2, out2] =
      RunShell("'" + bin + "' --states '" + states + "' --max-lag 2 --json");
  ASSERT_EQ(rc2, 0) << out2;
  ExpectMatches(nlohmann::json::parse(out2), LoadExpected()["lag2"]);

  auto [rc3, out3] = RunShell("'" + bin + "' --states '" + states + "'");
  ASSERT_EQ(rc3, 0);
  EXPECT_NE(out3.find("D_eff / L"), std::string::npos) << out3;

  EXPECT_EQ(
      RunShell("'" + bin + "' --states /nonexistent.npy 2>/dev/null").first, 2);
  EXPECT_EQ(RunShell("'" + bin + "' --states '" + states +
                     "' --max-lag 9 2>/dev/null")
                .first,
            2);
  EXPECT_NE(RunShell("'" + bin + "' 2>/dev/null").first, 0);
}

}  // namespace
}  // namespace diagnostics
}  // namespace depthbench
