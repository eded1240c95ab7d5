#include "worker/child_process.h"

#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>

namespace depthbench::worker {
namespace {

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

bool Alive(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return false;
  size_t close = stat.rfind(')');
  return close != std::string::npos && stat.size() > close + 2 && stat[close + 2] != 'Z';
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
  ASSERT_TRUE(Alive(grandchild));
  EXPECT_NE(getpgid(grandchild), (*child)->pid());  // out of the group
  EXPECT_EQ((*child)->KillTree(), 1);
  ExitInfo info = (*child)->Wait();
  EXPECT_TRUE(info.exited);
  EXPECT_EQ(info.code, 0);
  for (int i = 0; i < 100 && Alive(grandchild); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_FALSE(Alive(grandchild));
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

}  // namespace
}  // namespace depthbench::worker
