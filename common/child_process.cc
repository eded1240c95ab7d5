#include "common/child_process.h"

#include <errno.h>  // program_invocation_short_name
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

extern char** environ;

namespace depthbench {

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
  put(program_invocation_short_name);  // "depthbench-worker: ..."
  put(": ");
  put(what);
  put(" ");
  put(arg);
  put(": ");
  put(err);
  put("\n");
  _exit(127);
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


// `name` if it is a path to an executable, else the first executable
// PATH entry/`name`.
absl::StatusOr<std::string> ResolveExecutable(const std::string& name) {
  if (name.find('/') != std::string::npos) {
    if (access(name.c_str(), X_OK) == 0) return name;
    return absl::NotFoundError(absl::StrCat(name, ": not an executable file"));
  }
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path != nullptr ? path : "", ':')) {
    if (dir.empty()) continue;
    const std::string candidate = absl::StrCat(dir, "/", name);
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return absl::NotFoundError(absl::StrCat(name, ": not found on PATH"));
}

// The child's environment: this process's, with `spec.env` on top and a
// fresh tree tag.
std::vector<std::string> ChildEnvironment(const ChildSpec& spec, const std::string& tag) {
  std::vector<std::string> env_strings;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string kv = *e;
    std::string key = kv.substr(0, kv.find('='));
    // A process started by a child (tests) must not pass its own tag on.
    if (spec.env.count(key) == 0 && (key != kChildTagVar || tag.empty())) {
      env_strings.push_back(std::move(kv));
    }
  }
  for (const auto& [k, v] : spec.env) {
    if (k != kChildTagVar) env_strings.push_back(absl::StrCat(k, "=", v));
  }
  if (!tag.empty()) env_strings.push_back(absl::StrCat(kChildTagVar, "=", tag));
  return env_strings;
}

// The descriptors the child's stdout and stderr get (out[1], err[1]) and
// the parent keeps (out[0], err[0]); -1 where there is none.
struct ChildOutput {
  int out[2] = {-1, -1};
  int err[2] = {-1, -1};
  void CloseAll() {
    for (int fd : {out[0], out[1], err[0], err[1]}) {
      if (fd >= 0) close(fd);
    }
  }
};

absl::StatusOr<ChildOutput> OpenOutput(const ChildSpec& spec) {
  ChildOutput o;
  switch (spec.output) {
    case ChildSpec::Output::kLogFile: {
      if (spec.log_file.empty()) return absl::InvalidArgumentError("log_file: empty");
      const int fd = open(spec.log_file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (fd < 0) {
        return absl::InternalError(absl::StrCat("open ", spec.log_file, ": ", strerror(errno)));
      }
      o.out[1] = fd;
      o.err[1] = dup(fd);
      fcntl(o.err[1], F_SETFD, FD_CLOEXEC);
      return o;
    }
    case ChildSpec::Output::kInherit:
      return o;
    case ChildSpec::Output::kMergedPipe:
      if (pipe2(o.out, O_CLOEXEC) != 0) {
        return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
      }
      o.err[1] = dup(o.out[1]);
      fcntl(o.err[1], F_SETFD, FD_CLOEXEC);
      return o;
    case ChildSpec::Output::kPipes:
      break;
  }
  if (pipe2(o.out, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  }
  if (pipe2(o.err, O_CLOEXEC) != 0) {
    int saved = errno;
    o.CloseAll();
    return absl::InternalError(absl::StrCat("pipe: ", strerror(saved)));
  }
  return o;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Spawn(const ChildSpec& spec) {
  if (spec.argv.empty()) return absl::InvalidArgumentError("argv: empty");

  // Everything the child needs is built before fork().
  std::vector<std::string> args = spec.argv;
  if (spec.search_path) {
    absl::StatusOr<std::string> resolved = ResolveExecutable(args[0]);
    if (!resolved.ok()) return resolved.status();
    args[0] = *resolved;
  }
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string tag = spec.tag_tree ? NewTag() : std::string();
  std::vector<std::string> env_strings = ChildEnvironment(spec, tag);
  std::vector<char*> envp;
  for (std::string& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  const pid_t parent = getpid();
  const int death_signal = spec.parent_death_signal;
  const char* cwd = spec.cwd.empty() ? nullptr : spec.cwd.c_str();
  const bool new_group = spec.new_process_group;
  absl::StatusOr<ChildOutput> output = OpenOutput(spec);
  if (!output.ok()) return output.status();
  ChildOutput o = *output;

  pid_t pid = fork();
  if (pid < 0) {
    int saved = errno;
    o.CloseAll();
    return absl::InternalError(absl::StrCat("fork: ", strerror(saved)));
  }
  if (pid == 0) {
    // Child: async-signal-safe calls only until execve().
    if (new_group) setpgid(0, 0);
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
    if ((o.out[1] >= 0 && dup2(o.out[1], STDOUT_FILENO) < 0) ||
        (o.err[1] >= 0 && dup2(o.err[1], STDERR_FILENO) < 0)) {
      _exit(127);
    }
    if (cwd != nullptr && chdir(cwd) != 0) ChildFail("cannot enter", cwd);
    execve(argv[0], argv.data(), envp.data());
    ChildFail("cannot execute", argv[0]);
  }
  // Parent. Set the group here too so that a SignalGroup() right after
  // Spawn() cannot race the child's own setpgid().
  if (new_group) setpgid(pid, pid);
  if (o.out[1] >= 0) close(o.out[1]);
  if (o.err[1] >= 0) close(o.err[1]);
  return std::unique_ptr<ChildProcess>(new ChildProcess(pid, o.out[0], o.err[0], tag));
}

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
  if (stdout_fd_ >= 0) close(stdout_fd_);
  if (stderr_fd_ >= 0) close(stderr_fd_);
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
      if (tag_.empty()) break;
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

ExitInfo ChildProcess::Stop(int64_t grace_ms) {
  SignalGroup(SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(grace_ms);
  while (!Exited()) {
    if (std::chrono::steady_clock::now() >= deadline) {
      SignalGroup(SIGKILL);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return Wait();
}

}  // namespace depthbench
