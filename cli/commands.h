// The `depthbench` client's subcommands. Each lives in its own file and
// registers itself on the CLI11 app through an Add*Command function; the
// chosen one stores its action in CommandEnv::run, which main() calls after
// parsing. A new subcommand (e.g. `demo`, added by its own issue) is one
// more file and one more Add*Command call in main.cc.
//
// Exit codes: kExitOk 0, kExitFailure 1, kExitUsage 2 (bad usage or invalid
// input, including InvalidArgument from the scheduler).
//
// Thread safety: single-threaded CLI.
#ifndef DEPTHBENCH_CLI_COMMANDS_H_
#define DEPTHBENCH_CLI_COMMANDS_H_

#include <functional>
#include <iostream>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "absl/status/status.h"
#include "cli/client.h"

namespace depthbench::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

struct CommandEnv {
  ClientOptions client;
  bool json = false;
  std::ostream* out = &std::cout;
  std::ostream* err = &std::cerr;
  // Set by the parsed subcommand.
  std::function<int(CommandEnv&)> run;
  // Connects lazily (commands that need no scheduler never connect).
  absl::StatusOr<SchedulerClient*> Client();
  // Client() then its QueryResults (results, report).
  absl::StatusOr<v1::QueryResultsResponse> QueryResults(const std::string& sweep);
  // Prints "error: ..." and maps the status to an exit code.
  int Fail(const absl::Status& status);

 private:
  std::unique_ptr<SchedulerClient> client_;
};

void AddSubmitCommand(CLI::App& app, CommandEnv& env);
void AddSweepCommands(CLI::App& app, CommandEnv& env);   // sweeps, status, cancel
void AddJobCommands(CLI::App& app, CommandEnv& env);     // jobs, job, retry, watch
void AddResultsCommand(CLI::App& app, CommandEnv& env);  // results
void AddReportCommand(CLI::App& app, CommandEnv& env);   // report
void AddDemoCommand(CLI::App& app, CommandEnv& env);     // demo (cmd_demo.cc)

// Runs the CLI (argv as given to main); returns the exit code. The global
// options (--scheduler, --token-file, --tls-ca, --timeout-ms, --json) may
// come before or after the subcommand.
int RunCli(int argc, char** argv, std::ostream& out, std::ostream& err);

}  // namespace depthbench::cli

#endif  // DEPTHBENCH_CLI_COMMANDS_H_
