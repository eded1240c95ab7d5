// Test helpers for the worker integration tests: the real depthbench-worker
// binary as a child process, the trainer children it runs (found in /proc),
// and running the `depthbench` CLI.
#ifndef DEPTHBENCH_TESTS_INTEGRATION_WORKER_PROCESS_H_
#define DEPTHBENCH_TESTS_INTEGRATION_WORKER_PROCESS_H_

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace depthbench::testing {

// Runs `args` with stdout+stderr appended to `log`; returns the pid.
inline pid_t SpawnLogged(std::vector<std::string> args, const std::string& log) {
  pid_t pid = fork();
  if (pid == 0) {
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
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry.path() / "stat");
    std::string stat;
    if (!std::getline(in, stat)) continue;
    size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 2));
    char state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid == parent && state != 'Z') out.push_back(static_cast<pid_t>(std::stoi(name)));
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

class WorkerProcess {
 public:
  WorkerProcess(std::string name, std::string dir) : name_(std::move(name)), dir_(std::move(dir)) {}
  ~WorkerProcess() { Stop(SIGKILL); }

  void Start(const std::string& scheduler, const std::string& checkpoint_root,
             std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {DEPTHBENCH_WORKER_BIN, "--scheduler", scheduler,
                                     "--checkpoint-root", checkpoint_root, "--slots", "1",
                                     "--threads-per-slot", "1", "--name", name_,
                                     "--poll-ms", "100", "--train-binary",
                                     DEPTHBENCH_TRAIN_BIN};
    args.insert(args.end(), extra.begin(), extra.end());
    pid_ = SpawnLogged(args, log());
  }

  // Sends `sig` and waits for the exit; returns the wait status (-1: none).
  int Stop(int sig, int timeout_ms = 30000) {
    if (pid_ <= 0) return -1;
    kill(pid_, sig);
    int status = -1;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (waitpid(pid_, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    pid_ = -1;
    return status;
  }

  pid_t pid() const { return pid_; }
  std::string log() const { return dir_ + "/" + name_ + ".log"; }
  std::string ReadLog() const {
    std::ifstream in(log());
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

 private:
  std::string name_, dir_;
  pid_t pid_ = -1;
};

// Runs a shell command; returns {exit status, stdout}.
inline std::pair<int, std::string> RunCommand(const std::string& cmd) {
  std::string output;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return {-1, ""};
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) output.append(buf, n);
  int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

}  // namespace depthbench::testing

#endif  // DEPTHBENCH_TESTS_INTEGRATION_WORKER_PROCESS_H_
