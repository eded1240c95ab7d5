// depthbench submit SPEC.{yaml,json}
#include "cli/commands.h"
#include "cli/output.h"
#include "cli/spec_reader.h"

namespace depthbench::cli {

void AddSubmitCommand(CLI::App& app, CommandEnv& env) {
  auto* cmd = app.add_subcommand("submit", "submit a sweep spec (YAML or JSON); idempotent per name + spec");
  auto path = std::make_shared<std::string>();
  cmd->add_option("spec", *path, "spec file (.yaml/.yml or .json)")->required();
  cmd->callback([&env, path] {
    env.run = [path](CommandEnv& env) -> int {
      auto spec = ReadSpecFile(*path);
      if (!spec.ok()) {
        *env.err << "error: " << spec.status().message() << "\n";
        return kExitUsage;
      }
      auto client = env.Client();
      if (!client.ok()) return env.Fail(client.status());
      auto submitted = (*client)->SubmitSweep(*spec);
      if (!submitted.ok()) return env.Fail(submitted.status());
      const depthbench::v1::SubmitSweepResponse& resp = *submitted;
      if (env.json) {
        *env.out << ToJson(resp) << "\n";
      } else {
        *env.out << "sweep " << resp.sweep().name() << ": " << resp.sweep().total_jobs()
                 << " jobs " << (resp.created() ? "submitted" : "(already submitted; unchanged)")
                 << "\n";
      }
      return kExitOk;
    };
  });
}

}  // namespace depthbench::cli
