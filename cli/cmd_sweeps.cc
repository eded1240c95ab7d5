// depthbench sweeps | status SWEEP | cancel SWEEP | delete SWEEP [--force]
#include <ctime>
#include <functional>
#include <memory>

#include "absl/strings/str_cat.h"
#include "cli/commands.h"
#include "cli/output.h"

namespace depthbench::cli {
namespace {

namespace v1 = ::depthbench::v1;

std::string StateName(v1::SweepState s) {
  switch (s) {
    case v1::SWEEP_RUNNING: return "running";
    case v1::SWEEP_COMPLETED: return "completed";
    case v1::SWEEP_CANCELLED: return "cancelled";
    default: return "?";
  }
}

std::string Time(int64_t ms) {
  std::time_t t = static_cast<std::time_t>(ms / 1000);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", std::localtime(&t));
  return buf;
}

std::string Progress(const v1::Sweep& s) {
  double pct = s.total_jobs() == 0 ? 100.0 : 100.0 * s.done_jobs() / s.total_jobs();
  return absl::StrCat(s.done_jobs(), "/", s.total_jobs(), " (", FormatDouble(pct, 3), "%)");
}

// `sweeps`: every sweep, one row each.
int RunSweeps(CommandEnv& env) {
  auto client = env.Client();
  if (!client.ok()) return env.Fail(client.status());
  auto resp = (*client)->ListAllSweeps();
  if (!resp.ok()) return env.Fail(resp.status());
  if (env.json) {
    *env.out << ToJson(*resp) << "\n";
    return kExitOk;
  }
  Table table({"NAME", "STATE", "DONE", "CREATED"});
  for (const auto& s : resp->sweeps()) {
    table.AddRow({s.name(), StateName(s.state()), Progress(s), Time(s.created_ms())});
  }
  table.Print(*env.out);
  return kExitOk;
}

// `status SWEEP`: progress and the job counts by state.
int RunStatus(CommandEnv& env, const std::string& name) {
  auto client = env.Client();
  if (!client.ok()) return env.Fail(client.status());
  auto sweep = (*client)->GetSweep(name);
  if (!sweep.ok()) return env.Fail(sweep.status());
  const v1::Sweep& resp = *sweep;
  if (env.json) {
    *env.out << ToJson(resp) << "\n";
    return kExitOk;
  }
  *env.out << "sweep " << resp.name() << ": " << StateName(resp.state()) << ", "
           << Progress(resp) << " jobs done\n";
  Table table({"STATE", "JOBS"});
  for (const char* state : {"pending", "leased", "running", "succeeded", "diverged",
                            "failed", "cancelled"}) {
    auto it = resp.job_counts().find(state);
    table.AddRow({state, std::to_string(it == resp.job_counts().end() ? 0 : it->second)});
  }
  // Strategies (issue 15): shown only when a sweep has such jobs.
  for (const char* state : {"held", "paused", "pruned", "skipped"}) {
    auto it = resp.job_counts().find(state);
    if (it != resp.job_counts().end() && it->second > 0) {
      table.AddRow({state, std::to_string(it->second)});
    }
  }
  table.Print(*env.out);
  return kExitOk;
}

// `cancel SWEEP`.
int RunCancel(CommandEnv& env, const std::string& name) {
  auto client = env.Client();
  if (!client.ok()) return env.Fail(client.status());
  auto resp = (*client)->CancelSweep(name);
  if (!resp.ok()) return env.Fail(resp.status());
  if (env.json) {
    *env.out << ToJson(*resp) << "\n";
  } else {
    *env.out << "cancelled " << resp->cancelled_jobs() << " job(s) of " << name << "\n";
  }
  return kExitOk;
}

// `delete SWEEP [--force]`.
int RunDelete(CommandEnv& env, const std::string& name, bool force) {
  auto client = env.Client();
  if (!client.ok()) return env.Fail(client.status());
  auto resp = (*client)->DeleteSweep(name, force);
  if (!resp.ok()) return env.Fail(resp.status());
  if (env.json) {
    *env.out << ToJson(*resp) << "\n";
    return kExitOk;
  }
  *env.out << "deleted sweep " << name << " and its " << resp->deleted_jobs() << " job(s)";
  if (resp->cancelled_jobs() > 0) {
    *env.out << " (" << resp->cancelled_jobs() << " leased or running job(s) cancelled)";
  }
  *env.out << "\n";
  return kExitOk;
}

// A subcommand `name` with one required positional `sweep`, running `run`.
CLI::App* AddSweepNameCommand(CLI::App& app, CommandEnv& env, const std::string& name,
                              const std::string& help,
                              std::function<int(CommandEnv&, const std::string&)> run) {
  auto* cmd = app.add_subcommand(name, help);
  auto sweep = std::make_shared<std::string>();
  cmd->add_option("sweep", *sweep, "sweep name")->required();
  cmd->callback([&env, sweep, run] {
    env.run = [sweep, run](CommandEnv& env) -> int { return run(env, *sweep); };
  });
  return cmd;
}

}  // namespace

void AddSweepCommands(CLI::App& app, CommandEnv& env) {
  app.add_subcommand("sweeps", "list sweeps")->callback([&env] { env.run = RunSweeps; });
  AddSweepNameCommand(app, env, "status", "a sweep's job counts by state and progress",
                      RunStatus);
  AddSweepNameCommand(app, env, "cancel", "cancel every unfinished job of a sweep", RunCancel);
  auto force = std::make_shared<bool>(false);
  CLI::App* del = AddSweepNameCommand(
      app, env, "delete",
      "delete a sweep with its jobs, points and results (refused while jobs run)",
      [force](CommandEnv& env, const std::string& name) { return RunDelete(env, name, *force); });
  del->add_flag("--force", *force, "cancel the sweep's leased and running jobs first");
}

}  // namespace depthbench::cli
