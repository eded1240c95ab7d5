// The CLI's frame: global flags, subcommand registration, exit codes.
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "cli/commands.h"

namespace depthbench::cli {

absl::StatusOr<SchedulerClient*> CommandEnv::Client() {
  if (client_ == nullptr) {
    auto connected = SchedulerClient::Connect(client);
    if (!connected.ok()) return connected.status();
    client_ = std::move(*connected);
  }
  return client_.get();
}

absl::StatusOr<v1::QueryResultsResponse> CommandEnv::QueryResults(const std::string& sweep) {
  auto connected = Client();
  if (!connected.ok()) return connected.status();
  return (*connected)->QueryResults(sweep);
}

int CommandEnv::Fail(const absl::Status& status) {
  std::string message(status.message());
  if (message.empty()) {  // every error says something (e.g. a bare gRPC code)
    message = absl::StrCat("the scheduler or the connection failed with ",
                           absl::StatusCodeToString(status.code()),
                           " and gave no detail; check the scheduler's log");
  }
  *err << "error: " << message << " [" << absl::StatusCodeToString(status.code()) << "]\n";
  return status.code() == absl::StatusCode::kInvalidArgument ? kExitUsage : kExitFailure;
}

int RunCli(int argc, char** argv, std::ostream& out, std::ostream& err) {
  CLI::App app{"depthbench: submit and follow DepthBench sweeps on a depthbench-scheduler"};
  app.require_subcommand(1);
  CommandEnv env;
  env.out = &out;
  env.err = &err;
  const char* from_env = std::getenv("DEPTHBENCH_SCHEDULER");
  if (from_env != nullptr && *from_env != '\0') env.client.address = from_env;
  std::string token_file;
  app.add_option("--scheduler", env.client.address,
                 "scheduler address HOST:PORT (default: $DEPTHBENCH_SCHEDULER, else 127.0.0.1:7070)")
      ->capture_default_str();
  app.add_option("--token-file", token_file,
                 "file holding the shared token (also $DEPTHBENCH_TOKEN)");
  app.add_option("--tls-ca", env.client.tls_ca_file,
                 "PEM root certificate: connect with TLS trusting it (for a scheduler started "
                 "with --tls-cert/--tls-key; the certificate must name the --scheduler host)");
  app.add_option("--timeout-ms", env.client.timeout_ms, "deadline of each RPC")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_flag("--json", env.json, "machine-readable JSON output");
  // The global options above work before or after the subcommand
  // (`depthbench --json sweeps` and `depthbench sweeps --json`): an option a
  // subcommand does not know falls through to the app. Subcommands inherit
  // this setting, so it must precede their registration.
  app.fallthrough();
  AddSubmitCommand(app, env);
  AddSweepCommands(app, env);
  AddJobCommands(app, env);
  AddResultsCommand(app, env);
  AddReportCommand(app, env);
  AddDemoCommand(app, env);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e, out, err);
    return rc == 0 ? kExitOk : kExitUsage;
  }
  const char* token_env = std::getenv("DEPTHBENCH_TOKEN");
  if (!token_file.empty()) {
    absl::StatusOr<std::string> token = ReadTokenFile("--token-file", token_file);
    if (!token.ok()) {
      err << "error: " << token.status().message() << "\n";
      return kExitUsage;
    }
    env.client.token = *token;
  } else if (token_env != nullptr) {
    env.client.token = token_env;
  }
  if (!env.run) {
    err << "error: no command\n";
    return kExitUsage;
  }
  return env.run(env);
}

}  // namespace depthbench::cli
