// depthbench sweeps | status SWEEP | cancel SWEEP | delete SWEEP [--force]
#include <ctime>

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

}  // namespace

void AddSweepCommands(CLI::App& app, CommandEnv& env) {
  app.add_subcommand("sweeps", "list sweeps")->callback([&env] {
    env.run = [](CommandEnv& env) -> int {
      auto client = env.Client();
      if (!client.ok()) return env.Fail(client.status());
      // Every page (the scheduler pages by count and by bytes).
      v1::ListSweepsResponse resp;
      v1::ListSweepsRequest req;
      while (true) {
        v1::ListSweepsResponse page;
        auto ctx = (*client)->Context();
        auto status = FromGrpc((*client)->sweeps()->ListSweeps(ctx.get(), req, &page));
        if (!status.ok()) return env.Fail(status);
        for (auto& s : *page.mutable_sweeps()) *resp.add_sweeps() = std::move(s);
        if (page.next_page_token().empty()) break;
        req.set_page_token(page.next_page_token());
      }
      if (env.json) {
        *env.out << ToJson(resp) << "\n";
        return kExitOk;
      }
      Table table({"NAME", "STATE", "DONE", "CREATED"});
      for (const auto& s : resp.sweeps()) {
        table.AddRow({s.name(), StateName(s.state()), Progress(s), Time(s.created_ms())});
      }
      table.Print(*env.out);
      return kExitOk;
    };
  });

  auto* status_cmd = app.add_subcommand("status", "a sweep's job counts by state and progress");
  auto status_name = std::make_shared<std::string>();
  status_cmd->add_option("sweep", *status_name, "sweep name")->required();
  status_cmd->callback([&env, status_name] {
    env.run = [status_name](CommandEnv& env) -> int {
      auto client = env.Client();
      if (!client.ok()) return env.Fail(client.status());
      v1::GetSweepRequest req;
      req.set_name(*status_name);
      v1::Sweep resp;
      auto ctx = (*client)->Context();
      auto status = FromGrpc((*client)->sweeps()->GetSweep(ctx.get(), req, &resp));
      if (!status.ok()) return env.Fail(status);
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
    };
  });

  auto* cancel_cmd = app.add_subcommand("cancel", "cancel every unfinished job of a sweep");
  auto cancel_name = std::make_shared<std::string>();
  cancel_cmd->add_option("sweep", *cancel_name, "sweep name")->required();
  cancel_cmd->callback([&env, cancel_name] {
    env.run = [cancel_name](CommandEnv& env) -> int {
      auto client = env.Client();
      if (!client.ok()) return env.Fail(client.status());
      v1::CancelSweepRequest req;
      req.set_name(*cancel_name);
      v1::CancelSweepResponse resp;
      auto ctx = (*client)->Context();
      auto status = FromGrpc((*client)->sweeps()->CancelSweep(ctx.get(), req, &resp));
      if (!status.ok()) return env.Fail(status);
      if (env.json) {
        *env.out << ToJson(resp) << "\n";
      } else {
        *env.out << "cancelled " << resp.cancelled_jobs() << " job(s) of " << *cancel_name << "\n";
      }
      return kExitOk;
    };
  });

  auto* delete_cmd = app.add_subcommand(
      "delete", "delete a sweep with its jobs, points and results (refused while jobs run)");
  auto delete_name = std::make_shared<std::string>();
  auto force = std::make_shared<bool>(false);
  delete_cmd->add_option("sweep", *delete_name, "sweep name")->required();
  delete_cmd->add_flag("--force", *force, "cancel the sweep's leased and running jobs first");
  delete_cmd->callback([&env, delete_name, force] {
    env.run = [delete_name, force](CommandEnv& env) -> int {
      auto client = env.Client();
      if (!client.ok()) return env.Fail(client.status());
      v1::DeleteSweepRequest req;
      req.set_name(*delete_name);
      req.set_force(*force);
      v1::DeleteSweepResponse resp;
      auto ctx = (*client)->Context();
      auto status = FromGrpc((*client)->sweeps()->DeleteSweep(ctx.get(), req, &resp));
      if (!status.ok()) return env.Fail(status);
      if (env.json) {
        *env.out << ToJson(resp) << "\n";
      } else {
        *env.out << "deleted sweep " << *delete_name << " and its " << resp.deleted_jobs()
                 << " job(s)";
        if (resp.cancelled_jobs() > 0) {
          *env.out << " (" << resp.cancelled_jobs() << " leased or running job(s) cancelled)";
        }
        *env.out << "\n";
      }
      return kExitOk;
    };
  });
}

}  // namespace depthbench::cli
