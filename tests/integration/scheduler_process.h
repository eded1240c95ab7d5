// Test helpers: runs the real depthbench-scheduler binary on a loopback port
// (port 0 + --port-file) over a temp SQLite file, and a minimal worker that
// speaks WorkerService.
#ifndef DEPTHBENCH_TESTS_INTEGRATION_SCHEDULER_PROCESS_H_
#define DEPTHBENCH_TESTS_INTEGRATION_SCHEDULER_PROCESS_H_

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "depthbench/v1/sweep_service.grpc.pb.h"
#include "depthbench/v1/worker_service.grpc.pb.h"

namespace depthbench::testing {

class SchedulerProcess {
 public:
  // `listen` "127.0.0.1:0" picks a port; pass the old port to restart there.
  SchedulerProcess(std::string db, std::string dir, std::vector<std::string> extra = {})
      : db_(std::move(db)), dir_(std::move(dir)), extra_(std::move(extra)) {}
  ~SchedulerProcess() { Stop(SIGTERM); }

  bool Start(int port = 0) {
    std::string port_file = dir_ + "/port";
    std::filesystem::remove(port_file);
    std::vector<std::string> args = {DEPTHBENCH_SCHEDULER_BIN, "--db", db_, "--listen",
                                     "127.0.0.1:" + std::to_string(port), "--port-file",
                                     port_file};
    args.insert(args.end(), extra_.begin(), extra_.end());
    pid_ = fork();
    if (pid_ == 0) {
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      std::string log = dir_ + "/scheduler.log";
      FILE* e = freopen(log.c_str(), "a", stderr);
      FILE* o = freopen(log.c_str(), "a", stdout);
      (void)e;
      (void)o;
      execv(argv[0], argv.data());
      _exit(127);
    }
    for (int i = 0; i < 500; ++i) {  // up to 10 s
      std::ifstream in(port_file);
      if (in >> port_ && port_ > 0) return true;
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  void Stop(int sig) {
    if (pid_ <= 0) return;
    kill(pid_, sig);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
  }

  int port() const { return port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  std::string db_, dir_;
  std::vector<std::string> extra_;
  pid_t pid_ = -1;
  int port_ = 0;
};

inline std::string MakeTempDir(const std::string& name) {
  std::string dir = std::filesystem::temp_directory_path() /
                    ("db_integration_" + std::to_string(getpid()) + "_" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

template <typename Duration = std::chrono::milliseconds>
std::unique_ptr<grpc::ClientContext> Ctx(int ms = 5000) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(ms));
  return ctx;
}

}  // namespace depthbench::testing

#endif  // DEPTHBENCH_TESTS_INTEGRATION_SCHEDULER_PROCESS_H_
