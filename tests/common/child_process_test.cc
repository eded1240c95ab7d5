#include "common/child_process.h"

#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "tests/integration/process_util.h"

namespace depthbench {
namespace {

using ::depthbench::testing::ProcessAlive;

std::string ReadAll(int fd) {
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  return out;
}

TEST(ChildProcessTest, PipesExitCodeAndEnvironment) {
  ChildSpec spec;
  spec.argv = {"/bin/sh", "-c", "echo out:$DB_TEST_VAR; echo err >&2; exit 3"};
  spec.env["DB_TEST_VAR"] = "hello";
  auto child = ChildProcess::Spawn(spec);
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_EQ(ReadAll((*child)->stdout_fd()), "out:hello\n");
  EXPECT_EQ(ReadAll((*child)->stderr_fd()), "err\n");
  ExitInfo info = (*child)->Wait();
  EXPECT_TRUE(info.exited);
  EXPECT_EQ(info.code, 3);
  EXPECT_EQ(info.Describe(), "exit code 3");
  EXPECT_EQ((*child)->Wait().code, 3);  // idempotent
  EXPECT_FALSE((*child)->SignalGroup(SIGTERM));  // reaped: no signal
}

TEST(ChildProcessTest, OwnProcessGroupAndGroupSignalReachesGrandchildren) {
  ChildSpec spec;
  // The shell starts a grandchild and waits; both are in the child's group.
  spec.argv = {"/bin/sh", "-c", "sleep 30 & echo $$ $(ps -o pgid= $$); wait"};
  auto child = ChildProcess::Spawn(spec);
  ASSERT_TRUE(child.ok());
  EXPECT_EQ(getpgid((*child)->pid()), (*child)->pid());
  auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE((*child)->SignalGroup(SIGKILL));
  ExitInfo info = (*child)->Wait();
  EXPECT_FALSE(info.exited);
  EXPECT_EQ(info.signal, SIGKILL);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  // The grandchild (sleep) held the pipe open; EOF now means it is gone too.
  struct pollfd p = {(*child)->stdout_fd(), POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 5000), 1);
  ReadAll((*child)->stdout_fd());
}


// A grandchild that left the group (setsid) and was re-parented when the
// child exited is still found (by its environment tag) and killed.
TEST(ChildProcessTest, ExitedAndWaitKillADetachedGrandchild) {
  ChildSpec spec;
  spec.argv = {"/bin/sh", "-c", "setsid sleep 300 & echo $!"};
  auto child = ChildProcess::Spawn(spec);
  ASSERT_TRUE(child.ok());
  char buf[64] = {};
  ssize_t n = 0;
  for (int i = 0; i < 100 && n <= 0; ++i) n = read((*child)->stdout_fd(), buf, sizeof(buf) - 1);
  ASSERT_GT(n, 0);
  const pid_t grandchild = static_cast<pid_t>(std::stol(buf));
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  // $! is known before the grandchild ran setsid.
  while (getpgid(grandchild) == (*child)->pid() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  while (!(*child)->Exited() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE((*child)->Exited());
  ASSERT_TRUE(ProcessAlive(grandchild));
  EXPECT_NE(getpgid(grandchild), (*child)->pid());  // out of the group
  EXPECT_EQ((*child)->KillTree(), 1);
  ExitInfo info = (*child)->Wait();
  EXPECT_TRUE(info.exited);
  EXPECT_EQ(info.code, 0);
  for (int i = 0; i < 100 && ProcessAlive(grandchild); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_FALSE(ProcessAlive(grandchild));
}

TEST(ChildProcessTest, SigtermIsDeliveredEvenIfBlockedInTheParent) {
  sigset_t block, old;
  sigemptyset(&block);
  sigaddset(&block, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &block, &old);  // like the daemon's sigwait setup
  ChildSpec spec;
  spec.argv = {"/bin/sh", "-c", "trap 'exit 4' TERM; echo ready; while :; do sleep 0.05; done"};
  auto child = ChildProcess::Spawn(spec);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  ASSERT_TRUE(child.ok());
  char buf[16];
  ASSERT_GT(read((*child)->stdout_fd(), buf, sizeof(buf)), 0);  // trap installed
  (*child)->SignalGroup(SIGTERM);
  ExitInfo info = (*child)->Wait();
  EXPECT_TRUE(info.exited) << info.Describe();
  EXPECT_EQ(info.code, 4);
}

TEST(ChildProcessTest, MissingExecutableExits127WithReason) {
  ChildSpec spec;
  spec.argv = {"/nonexistent/depthbench-train", "train"};
  auto child = ChildProcess::Spawn(spec);
  ASSERT_TRUE(child.ok());
  std::string err = ReadAll((*child)->stderr_fd());
  EXPECT_NE(err.find("cannot execute /nonexistent/depthbench-train"), std::string::npos) << err;
  EXPECT_EQ((*child)->Wait().code, 127);
}

TEST(ChildProcessTest, DestructorKillsAnUnreapedChild) {
  pid_t pid;
  {
    ChildSpec spec;
    spec.argv = {"/bin/sleep", "30"};
    auto child = ChildProcess::Spawn(spec);
    ASSERT_TRUE(child.ok());
    pid = (*child)->pid();
  }
  EXPECT_NE(kill(pid, 0), 0);  // reaped and gone
}

TEST(ChildProcessTest, MergedPipeCarriesStdoutAndStderrInOrder) {
  ChildSpec spec;
  spec.argv = {"/bin/sh", "-c", "echo one; echo two >&2; echo three"};
  spec.output = ChildSpec::Output::kMergedPipe;
  auto child = ChildProcess::Spawn(spec);
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_EQ((*child)->stderr_fd(), -1);
  EXPECT_EQ(ReadAll((*child)->stdout_fd()), "one\ntwo\nthree\n");
  EXPECT_EQ((*child)->Wait().code, 0);
}

TEST(ChildProcessTest, LogFileIsAppendedAndCwdAndPathSearchApply) {
  const std::string dir = "/tmp/child_process_test_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  const std::string log = dir + "/out.log";
  std::ofstream(log) << "before\n";
  ChildSpec spec;
  spec.argv = {"sh", "-c", "pwd; echo err >&2"};
  spec.search_path = true;
  spec.cwd = dir;
  spec.output = ChildSpec::Output::kLogFile;
  spec.log_file = log;
  auto child = ChildProcess::Spawn(spec);
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_EQ((*child)->stdout_fd(), -1);
  EXPECT_EQ((*child)->Wait().code, 0);
  std::ifstream in(log);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), "before\n" + dir + "\nerr\n");
  std::filesystem::remove_all(dir);
}

TEST(ChildProcessTest, PathSearchNamesAMissingProgram) {
  ChildSpec spec;
  spec.argv = {"depthbench-no-such-program"};
  spec.search_path = true;
  auto child = ChildProcess::Spawn(spec);
  ASSERT_FALSE(child.ok());
  EXPECT_EQ(child.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(child.status().message().find("depthbench-no-such-program"), std::string::npos);
  spec.output = ChildSpec::Output::kLogFile;  // without log_file
  spec.argv = {"/bin/true"};
  EXPECT_EQ(ChildProcess::Spawn(spec).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ChildProcessTest, StopSendsSigtermThenSigkillAfterTheGrace) {
  ChildSpec polite;
  polite.argv = {"/bin/sh", "-c", "exec sleep 30"};
  auto a = ChildProcess::Spawn(polite);
  ASSERT_TRUE(a.ok());
  ExitInfo info = (*a)->Stop(5000);
  EXPECT_FALSE(info.exited);
  EXPECT_EQ(info.signal, SIGTERM);

  ChildSpec stubborn;
  stubborn.argv = {"/bin/sh", "-c", "trap '' TERM; echo ready; while true; do sleep 1; done"};
  auto b = ChildProcess::Spawn(stubborn);
  ASSERT_TRUE(b.ok());
  char c;
  ASSERT_EQ(read((*b)->stdout_fd(), &c, 1), 1);  // the trap is set
  const auto start = std::chrono::steady_clock::now();
  info = (*b)->Stop(300);
  EXPECT_FALSE(info.exited);
  EXPECT_EQ(info.signal, SIGKILL);
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(300));
}

TEST(ChildProcessTest, WithoutANewGroupTheChildStaysInOursAndKeepsOurTag) {
  ChildSpec spec;
  spec.argv = {"/bin/sh", "-c", "echo $(ps -o pgid= $$) ${DEPTHBENCH_WORKER_CHILD_TAG:-none}"};
  spec.new_process_group = false;
  spec.tag_tree = false;
  auto child = ChildProcess::Spawn(spec);
  ASSERT_TRUE(child.ok()) << child.status();
  std::istringstream words(ReadAll((*child)->stdout_fd()));
  long pgid = 0;
  std::string tag;
  words >> pgid >> tag;
  EXPECT_EQ(pgid, static_cast<long>(getpgid(0)));
  const char* ours = std::getenv(kChildTagVar);
  EXPECT_EQ(tag, ours != nullptr ? ours : "none");
  EXPECT_TRUE((*child)->tag().empty());
  EXPECT_EQ((*child)->Wait().code, 0);
}

}  // namespace
}  // namespace depthbench
