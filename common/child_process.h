// The one way this code base runs a child process: spawned in its own
// process group, its stdout and stderr on pipes (the worker's trainer
// runs), on one merged pipe (report's gnuplot) or appended to a log file
// (the demo's daemons), signalled as a group, its tree killed, reaped once.
//
// Why POSIX fork/exec and not Boost.Process: the worker needs three things
// Boost.Process 1.74 does not give cleanly: the child in its own process
// group (so SIGTERM/SIGKILL reach anything it starts), PR_SET_PDEATHSIG
// (a `kill -9` of the worker must not leave an orphan trainer writing into
// the shared checkpoint directory while another worker resumes the job),
// and a reset signal mask (the daemon blocks SIGTERM in every thread for its
// sigwait() loop, and a blocked mask survives exec, which would make the
// trainer deaf to SIGTERM). Between fork() and execve() the child calls only
// async-signal-safe functions, so forking from a multi-threaded (gRPC)
// process is safe; everything it needs (argv, envp) is built before fork().
//
// PR_SET_PDEATHSIG fires when the *thread* that forked exits, so the thread
// that calls Spawn() must outlive the child (JobRunner's thread does: it
// reaps the child before returning).
//
//   ASSIGN_OR_RETURN(auto child, ChildProcess::Spawn(spec));
//   ... read child->stdout_fd() / stderr_fd() until EOF ...
//   child->SignalGroup(SIGTERM);
//   ExitInfo info = child->Wait();
//
// The whole tree: without cgroups, a descendant can leave the group
// (setsid) and, once the trainer exits, is re-parented away from it. Every
// child therefore carries an environment tag (kChildTagVar=<unique token>)
// that its descendants inherit; KillTree() SIGKILLs the group, the
// descendants still linked by parent pids, and every process of this user
// whose /proc/<pid>/environ holds the tag. Wait() does so after the child
// exited, so no path leaves a descendant behind (one that cleared its
// environment and left the group escapes; a cgroup would be needed).
//
// Thread safety: SignalGroup(), KillTree() and Exited() may be called from
// any thread, concurrently with Wait(); they are no-ops once the child has
// been reaped. The fds belong
// to the object and are read by one thread. Ownership: owns both pipe fds;
// the destructor SIGKILLs and reaps a child that was not waited for.
#ifndef DEPTHBENCH_COMMON_CHILD_PROCESS_H_
#define DEPTHBENCH_COMMON_CHILD_PROCESS_H_

#include <sys/types.h>

#include <cstdint>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace depthbench {

// Every live (not zombie) process of this machine: pid -> parent pid, read
// from /proc (a snapshot: racy by nature). KillTree walks it; tests use it
// to find a daemon's children.
std::map<pid_t, pid_t> ParentPids();

// The environment variable that tags a child's process tree.
inline constexpr char kChildTagVar[] = "DEPTHBENCH_WORKER_CHILD_TAG";

struct ChildSpec {
  // argv[0] is the executable's path (or, with search_path, a name looked
  // up on PATH before the fork).
  std::vector<std::string> argv;
  bool search_path = false;
  // Variables set (or overridden) on top of this process's environment.
  std::map<std::string, std::string> env;
  // Signal sent to the child if the spawning thread (in practice: the
  // worker, the demo) dies. 0 = none.
  int parent_death_signal = 9;  // SIGKILL
  // Where stdout and stderr go (stdin is /dev/null):
  //   kPipes       two pipes, stdout_fd() and stderr_fd()
  //   kMergedPipe  one pipe for both, stdout_fd() (stderr_fd() is -1)
  //   kLogFile     appended to `log_file` (created 0644; both fds -1)
  //   kInherit     this process's stdout and stderr (both fds -1)
  enum class Output { kPipes, kMergedPipe, kLogFile, kInherit };
  Output output = Output::kPipes;
  std::string log_file;
  std::string cwd;  // the child's working directory; empty: this one's
  // Tag the child's tree with a fresh kChildTagVar (KillTree finds
  // descendants that left the group by it). false: the child inherits this
  // process's tag, if any, so that it stays in the tree of whoever tagged
  // this process (the trainer's rank launcher).
  bool tag_tree = true;
  // The child leads a new process group (SignalGroup reaches what it
  // starts). false: it stays in this process's group, so that a signal to
  // that group reaches it too (the trainer's ranks); SignalGroup then fails.
  bool new_process_group = true;
};

struct ExitInfo {
  bool exited = false;  // true: `code` is valid; false: killed by `signal`
  int code = -1;
  int signal = 0;
  // "exit code 3" / "killed by signal 9 (Killed)".
  std::string Describe() const;
};

class ChildProcess {
 public:
  // InvalidArgument for an empty argv or (kLogFile) no log_file; NotFound
  // when search_path finds no executable argv[0] (as a path, or on PATH);
  // Internal if
  // pipe()/open()/fork() fail. An executable that cannot be exec'd (or a
  // cwd that cannot be entered) shows up as exit code 127 with the reason
  // on its stderr.
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Spawn(const ChildSpec& spec);

  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  int stdout_fd() const { return stdout_fd_; }
  int stderr_fd() const { return stderr_fd_; }

  // kill(-pgid, sig). Returns false if the child was already reaped.
  bool SignalGroup(int sig);

  // SIGKILLs the child's whole tree (see above); returns how many other
  // processes (outside the group) the sweep found. No-op once reaped.
  int KillTree();

  // True once the child itself has exited (not reaped: Wait() still
  // returns its status). Does not block.
  bool Exited();

  // Blocks until the child exits; idempotent (returns the same info). After
  // it returns, KillTree()s the rest so no descendant survives.
  ExitInfo Wait();

  // SignalGroup(SIGTERM), then SIGKILL once `grace_ms` passed without the
  // child exiting; Wait()s. Returns Wait()'s info.
  ExitInfo Stop(int64_t grace_ms);

  const std::string& tag() const { return tag_; }

 private:
  ChildProcess(pid_t pid, int out_fd, int err_fd, std::string tag)
      : pid_(pid), stdout_fd_(out_fd), stderr_fd_(err_fd), tag_(std::move(tag)) {}
  int KillTreeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const pid_t pid_;  // also the process group id
  const int stdout_fd_;
  const int stderr_fd_;
  const std::string tag_;  // kChildTagVar's value

  absl::Mutex mu_;
  bool reaped_ ABSL_GUARDED_BY(mu_) = false;
  ExitInfo exit_ ABSL_GUARDED_BY(mu_);
  bool exited_ ABSL_GUARDED_BY(mu_) = false;
  absl::Mutex wait_mu_;  // serialises waitpid() callers
};

}  // namespace depthbench

#endif  // DEPTHBENCH_COMMON_CHILD_PROCESS_H_
