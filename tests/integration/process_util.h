// Process helpers for tests that run real binaries: spawn with the output
// in a log file, find a process's children and whether it is alive in
// /proc. Used by tests/integration and tests/worker.
#ifndef DEPTHBENCH_TESTS_INTEGRATION_PROCESS_UTIL_H_
#define DEPTHBENCH_TESTS_INTEGRATION_PROCESS_UTIL_H_

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/child_process.h"

namespace depthbench::testing {

// Runs `args` with stdout+stderr appended to `log`, optionally with
// RLIMIT_NOFILE set to (soft, hard) before exec; returns the pid.
inline pid_t SpawnLogged(std::vector<std::string> args, const std::string& log,
                         std::optional<std::pair<rlim_t, rlim_t>> nofile = std::nullopt) {
  pid_t pid = fork();
  if (pid == 0) {
    if (nofile) {
      rlimit lim{nofile->first, nofile->second};
      if (setrlimit(RLIMIT_NOFILE, &lim) != 0) _exit(126);
    }
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

// Pids whose parent is `parent` (from /proc/<pid>/stat).
inline std::vector<pid_t> ChildPids(pid_t parent) {
  std::vector<pid_t> out;
  for (const auto& [pid, ppid] : ParentPids()) {
    if (ppid == parent) out.push_back(pid);
  }
  return out;
}

inline bool ProcessAlive(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return false;
  size_t close = stat.rfind(')');
  return close != std::string::npos && stat.size() > close + 2 && stat[close + 2] != 'Z';
}

}  // namespace depthbench::testing

#endif  // DEPTHBENCH_TESTS_INTEGRATION_PROCESS_UTIL_H_
