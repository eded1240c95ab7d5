#include "trainer_core/launcher.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"

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

absl::StatusOr<int> FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const std::string err = std::strerror(errno);
    close(fd);
    return absl::InternalError(absl::StrCat("cannot pick a free port: ", err));
  }
  close(fd);
  return static_cast<int>(ntohs(addr.sin_port));
}

bool CleanExit(int status) {
  if (!WIFEXITED(status)) return false;
  const int code = WEXITSTATUS(status);
  return code == 0 || code == 3 || code == 4;  // ok, diverged, interrupted
}

int ExitCode(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 1;  // killed by a signal: an infrastructure failure
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

  for (int r = 0; r < nproc; ++r) {
    const pid_t pid = fork();
    if (pid < 0) {
      Forward(SIGKILL);
      return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
    }
    if (pid == 0) {
      // Flags as well as the variables: flags override a config file that
      // sets world_size / rank itself.
      std::vector<std::string> mine = args;
      for (const std::string& a :
           {std::string("--world-size"), std::to_string(nproc), std::string("--rank"),
            std::to_string(r), std::string("--master-addr"), std::string("127.0.0.1"),
            std::string("--master-port"), std::to_string(master_port)}) {
        mine.push_back(a);
      }
      std::vector<char*> child_argv;
      for (auto& a : mine) child_argv.push_back(a.data());
      child_argv.push_back(nullptr);
      signal(SIGTERM, SIG_DFL);
      signal(SIGINT, SIG_DFL);
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", std::to_string(master_port).c_str(), 1);
      execv("/proc/self/exe", child_argv.data());
      _exit(127);
    }
    g_children[r] = pid;
    g_num_children.store(r + 1);
  }

  int rank0_code = 1, failed_code = 0, alive = nproc;
  while (alive > 0) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      break;
    }
    int rank = -1;
    for (int i = 0; i < nproc; ++i) {
      if (g_children[i] == pid) rank = i;
    }
    if (rank < 0) continue;
    g_children[rank] = -1;
    --alive;
    if (rank == 0) rank0_code = ExitCode(status);
    if (!CleanExit(status)) {
      if (failed_code == 0) failed_code = ExitCode(status);
      Forward(SIGKILL);  // the others would wait in a collective until timeout
    }
  }
  signal(SIGTERM, SIG_DFL);
  signal(SIGINT, SIG_DFL);
  if (rank0_code == 0 && failed_code != 0) return failed_code;
  return rank0_code;
}

}  // namespace depthbench
