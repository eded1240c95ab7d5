#include "worker/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace depthbench::worker {

std::string ExitInfo::Describe() const {
  if (exited) return absl::StrCat("exit code ", code);
  const char* name = strsignal(signal);
  return absl::StrCat("killed by signal ", signal, " (", name ? name : "?", ")");
}

namespace {

// Writes a message with write(2) only (async-signal-safe) and exits 127.
[[noreturn]] void ChildFail(const char* what, const char* arg) {
  const char* err = strerror(errno);  // not strictly AS-safe; glibc's is fine
  auto put = [](const char* s) {
    ssize_t n = write(STDERR_FILENO, s, strlen(s));
    (void)n;
  };
  put("depthbench-worker: ");
  put(what);
  put(" ");
  put(arg);
  put(": ");
  put(err);
  put("\n");
  _exit(127);
}

// Every process of this machine: pid -> parent pid (racy by nature: a
// snapshot).
std::map<pid_t, pid_t> ParentPids() {
  std::map<pid_t, pid_t> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry.path() / "stat");
    std::string stat;
    if (!std::getline(in, stat)) continue;
    size_t close = stat.rfind(')');
    if (close == std::string::npos || close + 2 >= stat.size()) continue;
    std::istringstream rest(stat.substr(close + 2));
    char state = 0;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (state == 'Z' || state == 'X') continue;  // already dead
    out[static_cast<pid_t>(std::stol(name))] = ppid;
  }
  return out;
}

// True if /proc/<pid>/environ (readable for this user's processes only)
// holds exactly `entry` ("VAR=value").
bool HasEnvEntry(pid_t pid, const std::string& entry) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/environ", std::ios::binary);
  if (!in) return false;
  std::string var;
  while (std::getline(in, var, '\0')) {
    if (var == entry) return true;
  }
  return false;
}

std::string NewTag() {
  static std::atomic<uint64_t> counter{0};
  return absl::StrCat(getpid(), ".", ++counter);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Spawn(const ChildSpec& spec) {
  if (spec.argv.empty()) return absl::InvalidArgumentError("argv: empty");

  // Everything the child needs is built before fork().
  std::vector<std::string> args = spec.argv;
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_strings;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string kv = *e;
    std::string key = kv.substr(0, kv.find('='));
    // A worker started by a trainer (tests) must not pass its own tag on.
    if (spec.env.count(key) == 0 && key != kChildTagVar) env_strings.push_back(std::move(kv));
  }
  for (const auto& [k, v] : spec.env) {
    if (k != kChildTagVar) env_strings.push_back(absl::StrCat(k, "=", v));
  }
  const std::string tag = NewTag();
  env_strings.push_back(absl::StrCat(kChildTagVar, "=", tag));
  std::vector<char*> envp;
  for (std::string& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  const pid_t parent = getpid();
  const int death_signal = spec.parent_death_signal;

  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  }
  if (pipe2(err_pipe, O_CLOEXEC) != 0) {
    int saved = errno;
    close(out_pipe[0]);
    close(out_pipe[1]);
    return absl::InternalError(absl::StrCat("pipe: ", strerror(saved)));
  }

  pid_t pid = fork();
  if (pid < 0) {
    int saved = errno;
    for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) close(fd);
    return absl::InternalError(absl::StrCat("fork: ", strerror(saved)));
  }
  if (pid == 0) {
    // Child: async-signal-safe calls only until execve().
    setpgid(0, 0);
    if (death_signal != 0) {
      prctl(PR_SET_PDEATHSIG, death_signal);
      if (getppid() != parent) _exit(127);  // the parent already died
    }
    // Default dispositions and an empty mask: the trainer installs its own
    // SIGTERM handler, and must die of SIGPIPE if its reader is gone.
    struct sigaction dfl;
    memset(&dfl, 0, sizeof(dfl));
    dfl.sa_handler = SIG_DFL;
    for (int s : {SIGPIPE, SIGTERM, SIGINT, SIGHUP, SIGCHLD}) sigaction(s, &dfl, nullptr);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, STDIN_FILENO);
    if (dup2(out_pipe[1], STDOUT_FILENO) < 0 || dup2(err_pipe[1], STDERR_FILENO) < 0) {
      _exit(127);
    }
    execve(argv[0], argv.data(), envp.data());
    ChildFail("cannot execute", argv[0]);
  }
  // Parent. Set the group here too so that a SignalGroup() right after
  // Spawn() cannot race the child's own setpgid().
  setpgid(pid, pid);
  close(out_pipe[1]);
  close(err_pipe[1]);
  return std::unique_ptr<ChildProcess>(new ChildProcess(pid, out_pipe[0], err_pipe[0], tag));
}

ChildProcess::~ChildProcess() {
  bool reaped;
  {
    absl::MutexLock lock(&mu_);
    reaped = reaped_;
  }
  if (!reaped) {
    SignalGroup(SIGKILL);
    Wait();
  }
  close(stdout_fd_);
  close(stderr_fd_);
}

bool ChildProcess::SignalGroup(int sig) {
  absl::MutexLock lock(&mu_);
  if (reaped_) return false;
  // Until reaped, the (possibly zombie) leader keeps the group id reserved,
  // so this cannot hit an unrelated process.
  return kill(-pid_, sig) == 0;
}

int ChildProcess::KillTree() {
  absl::MutexLock lock(&mu_);
  if (reaped_) return 0;
  return KillTreeLocked();
}

int ChildProcess::KillTreeLocked() {
  // Until reaped, the (possibly zombie) leader keeps the pid and group id
  // reserved, so neither kill can hit an unrelated process.
  kill(-pid_, SIGKILL);
  const std::string entry = absl::StrCat(kChildTagVar, "=", tag_);
  const pid_t self = getpid();
  std::set<pid_t> killed;  // outside the group
  // A few rounds: a process may fork between the snapshot and the kill.
  for (int round = 0; round < 5; ++round) {
    std::map<pid_t, pid_t> parents = ParentPids();
    std::map<pid_t, std::vector<pid_t>> children;
    for (const auto& [pid, ppid] : parents) children[ppid].push_back(pid);
    std::vector<pid_t> victims;
    // Descendants still linked to the child by parent pids...
    std::vector<pid_t> todo = {pid_};
    while (!todo.empty()) {
      pid_t p = todo.back();
      todo.pop_back();
      for (pid_t c : children[p]) {
        victims.push_back(c);
        todo.push_back(c);
      }
    }
    // ... and the re-parented ones, by their tag.
    for (const auto& [pid, ppid] : parents) {
      if (pid != self && pid != pid_ && HasEnvEntry(pid, entry)) victims.push_back(pid);
    }
    bool new_ones = false;
    for (pid_t v : victims) {
      if (v == self || v == pid_ || v <= 1) continue;
      if (getpgid(v) == pid_) continue;  // the group kill has it
      if (kill(v, SIGKILL) == 0 && killed.insert(v).second) new_ones = true;
    }
    if (!new_ones) break;
  }
  return static_cast<int>(killed.size());
}

bool ChildProcess::Exited() {
  absl::MutexLock lock(&mu_);
  if (reaped_ || exited_) return true;
  siginfo_t info;
  memset(&info, 0, sizeof(info));
  if (waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
      info.si_pid == pid_) {
    exited_ = true;
  }
  return exited_;
}

ExitInfo ChildProcess::Wait() {
  absl::MutexLock wait_lock(&wait_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (reaped_) return exit_;
  }
  // Wait without reaping, so the pid/pgid stays ours while we clean up.
  siginfo_t info;
  memset(&info, 0, sizeof(info));
  while (waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOWAIT) != 0) {
    if (errno != EINTR) break;
  }
  absl::MutexLock lock(&mu_);
  exited_ = true;
  KillTreeLocked();  // any descendant left behind
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) {
    exit_.exited = true;
    exit_.code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    exit_.exited = false;
    exit_.signal = WTERMSIG(status);
  }
  reaped_ = true;
  return exit_;
}

}  // namespace depthbench::worker
