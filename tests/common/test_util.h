// Helpers for tests that check files in the source tree with external tools
// (promtool, systemd-analyze, shellcheck).
//
// Thread safety: not thread-safe (temp dirs and std::system); call from the
// test thread.
#ifndef DEPTHBENCH_TESTS_COMMON_TEST_UTIL_H_
#define DEPTHBENCH_TESTS_COMMON_TEST_UTIL_H_

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace depthbench::testing {

inline std::string SourceDir() { return DEPTHBENCH_SOURCE_DIR; }

inline bool Executable(const std::string& path) {
  return access(path.c_str(), X_OK) == 0;
}

inline std::string ReadFileOrDie(const std::string& path) {
  std::ifstream in(path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

inline void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

// A fresh directory under $TMPDIR (or /tmp), removed with its contents when
// the object dies.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string templ =
        std::string(base != nullptr ? base : "/tmp") + "/depthbench_XXXXXX";
    path_ = mkdtemp(templ.data()) != nullptr ? templ : "";
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Runs `command` through /bin/sh with stdout and stderr captured into
// *output; returns the exit status (-1 if it did not exit normally).
inline int RunCommand(const std::string& command, std::string* output) {
  TempDir dir;
  const std::string out = dir.path() + "/out";
  const int rc = std::system((command + " > " + out + " 2>&1").c_str());
  *output = ReadFileOrDie(out);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

}  // namespace depthbench::testing

#endif  // DEPTHBENCH_TESTS_COMMON_TEST_UTIL_H_
