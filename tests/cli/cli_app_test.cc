// The CLI frame (cli/cli_app.cc) against a real scheduler over loopback: the
// global options (--json, --scheduler, --timeout-ms, ...) work before and
// after the subcommand, and unknown options are still refused.
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "scheduler/scheduler.h"
#include "scheduler/server.h"
#include "tests/scheduler/test_util.h"

namespace depthbench::cli {
namespace {

using ::testing::HasSubstr;

class CliAppTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto opened = scheduler::Scheduler::Open(
        depthbench::testing::TempDb("cli_app_test.db"), &clock_);
    ASSERT_TRUE(opened.ok()) << opened.status();
    scheduler_ = std::move(*opened);
    ASSERT_TRUE(scheduler_
                    ->SubmitSweep(depthbench::testing::SmallSpec(
                        "cli-sweep", {"pre_ln"}, {1e-3}))
                    .ok());
    scheduler::ServerOptions options;
    options.listen = "127.0.0.1:0";
    server_ =
        std::make_unique<scheduler::SchedulerServer>(scheduler_.get(), options);
    ASSERT_TRUE(server_->Start().ok());
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  // Runs `depthbench ARGS...`; returns the exit code.
  int Run(std::vector<std::string> args) {
    args.insert(args.begin(), "depthbench");
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    std::ostringstream out, err;
    const int rc = RunCli(static_cast<int>(argv.size()), argv.data(), out, err);
    out_ = out.str();
    err_ = err.str();
    return rc;
  }

  FakeClock clock_;
  std::unique_ptr<scheduler::Scheduler> scheduler_;
  std::unique_ptr<scheduler::SchedulerServer> server_;
  std::string out_, err_;
};

TEST_F(CliAppTest, GlobalOptionsWorkBeforeAndAfterTheSubcommand) {
  const std::string address = server_->address();
  ASSERT_EQ(Run({"--scheduler", address, "--json", "sweeps"}), kExitOk) << err_;
  const std::string before = out_;
  const auto doc = nlohmann::json::parse(before);
  EXPECT_EQ(doc["sweeps"][0]["name"], "cli-sweep") << before;

  // `depthbench sweeps --json` was refused ("The following arguments were
  // not expected: --json").
  ASSERT_EQ(Run({"sweeps", "--json", "--scheduler", address}), kExitOk) << err_;
  EXPECT_EQ(out_, before);
  ASSERT_EQ(Run({"--scheduler", address, "sweeps", "--json"}), kExitOk) << err_;
  EXPECT_EQ(out_, before);

  // After a subcommand's positional and its own options too.
  ASSERT_EQ(Run({"status", "cli-sweep", "--timeout-ms", "5000", "--json",
                 "--scheduler", address}),
            kExitOk)
      << err_;
  EXPECT_EQ(nlohmann::json::parse(out_)["name"], "cli-sweep") << out_;

  // Without --json the same command prints a table.
  ASSERT_EQ(Run({"sweeps", "--scheduler", address}), kExitOk) << err_;
  EXPECT_THAT(out_, HasSubstr("NAME"));
  EXPECT_THROW(nlohmann::json::parse(out_), nlohmann::json::parse_error);
}

TEST_F(CliAppTest, UnknownOptionsAreStillRefused) {
  EXPECT_EQ(
      Run({"sweeps", "--no-such-option", "--scheduler", server_->address()}),
      kExitUsage);
  EXPECT_THAT(err_, HasSubstr("--no-such-option"));
  EXPECT_EQ(Run({"--json"}), kExitUsage);  // a subcommand is required
}

}  // namespace
}  // namespace depthbench::cli
