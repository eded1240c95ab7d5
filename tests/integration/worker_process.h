// Test helpers for the worker integration tests: the real depthbench-worker
// binary as a child process, the trainer children it runs (found in /proc),
// and running the `depthbench` CLI.
#ifndef DEPTHBENCH_TESTS_INTEGRATION_WORKER_PROCESS_H_
#define DEPTHBENCH_TESTS_INTEGRATION_WORKER_PROCESS_H_

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/integration/process_util.h"

namespace depthbench::testing {

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
