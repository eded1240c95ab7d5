#include "trainer_core/launcher.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "common/child_process.h"
#include "common/free_port.h"
#include "common/run_protocol.h"

namespace depthbench {
namespace {

constexpr int kMaxRanks = 256;
pid_t g_children[kMaxRanks];
std::atomic<int> g_num_children{0};

void Forward(int sig) {
  const int n = g_num_children.load();
  for (int i = 0; i < n; ++i) {
    if (g_children[i] > 0) kill(g_children[i], sig);
  }
}

bool CleanExit(const ExitInfo& exit) {
  namespace rp = run_protocol;
  return exit.exited && (exit.code == rp::kExitOk || exit.code == rp::kExitDiverged ||
                         exit.code == rp::kExitInterrupted);
}

int ExitCode(const ExitInfo& exit) {
  if (exit.exited) return exit.code;
  return run_protocol::kExitFailure;  // killed by a signal: an infrastructure failure
}

}  // namespace

std::vector<std::string> WithoutNprocFlag(int argc, char** argv) {
  std::vector<std::string> out;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--nproc") {
      ++i;  // skip its value
      continue;
    }
    if (absl::StartsWith(a, "--nproc=")) continue;
    out.push_back(a);
  }
  return out;
}

absl::StatusOr<int> LaunchRanks(int nproc, const std::vector<std::string>& args,
                                int master_port) {
  if (nproc < 1 || nproc > kMaxRanks)
    return absl::InvalidArgumentError(absl::StrCat("--nproc: must be in [1, ", kMaxRanks, "]"));
  if (master_port == 0) {
    auto port = FreeLoopbackPort();
    if (!port.ok()) return port.status();
    master_port = *port;
  }
  struct sigaction sa{};
  sa.sa_handler = Forward;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);

  // This executable, by its path (argv[0] is the path ChildProcess runs).
  std::error_code ec;
  const std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec) return absl::InternalError(absl::StrCat("/proc/self/exe: ", ec.message()));
  std::vector<std::unique_ptr<ChildProcess>> ranks;
  for (int r = 0; r < nproc; ++r) {
    // Flags as well as the variables: flags override a config file that
    // sets world_size / rank itself.
    ChildSpec spec;
    spec.argv = args;
    spec.argv[0] = self;
    for (const std::string& a :
         {std::string("--world-size"), std::to_string(nproc), std::string("--rank"),
          std::to_string(r), std::string("--master-addr"), std::string("127.0.0.1"),
          std::string("--master-port"), std::to_string(master_port)}) {
      spec.argv.push_back(a);
    }
    spec.env = {{"RANK", std::to_string(r)},
                {"LOCAL_RANK", std::to_string(r)},
                {"WORLD_SIZE", std::to_string(nproc)},
                {"MASTER_ADDR", "127.0.0.1"},
                {"MASTER_PORT", std::to_string(master_port)}};
    spec.parent_death_signal = 0;
    spec.output = ChildSpec::Output::kInherit;
    spec.tag_tree = false;            // the ranks stay in the worker's tree
    spec.new_process_group = false;   // and in this process's group
    absl::StatusOr<std::unique_ptr<ChildProcess>> child = ChildProcess::Spawn(spec);
    if (!child.ok()) {
      Forward(SIGKILL);
      return child.status();
    }
    g_children[r] = (*child)->pid();
    g_num_children.store(r + 1);
    ranks.push_back(std::move(*child));
  }

  int rank0_code = 1, failed_code = 0, alive = nproc;
  while (alive > 0) {
    bool reaped = false;
    for (int r = 0; r < nproc; ++r) {
      if (g_children[r] <= 0 || !ranks[r]->Exited()) continue;
      const ExitInfo exit = ranks[r]->Wait();
      g_children[r] = -1;
      --alive;
      reaped = true;
      if (r == 0) rank0_code = ExitCode(exit);
      if (!CleanExit(exit)) {
        if (failed_code == 0) failed_code = ExitCode(exit);
        Forward(SIGKILL);  // the others would wait in a collective until timeout
      }
    }
    if (!reaped) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  signal(SIGTERM, SIG_DFL);
  signal(SIGINT, SIG_DFL);
  if (rank0_code == 0 && failed_code != 0) return failed_code;
  return rank0_code;
}

}  // namespace depthbench
