#include "worker/host_info.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace depthbench::worker {

namespace fs = std::filesystem;

namespace {

bool IsExecutableFile(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec) && access(p.c_str(), X_OK) == 0;
}

}  // namespace

int CountCudaGpus() {
  std::error_code ec;
  const fs::path proc = "/proc/driver/nvidia/gpus";
  if (fs::is_directory(proc, ec)) {
    int n = 0;
    for (const auto& entry : fs::directory_iterator(proc, ec)) {
      (void)entry;
      ++n;
    }
    if (n > 0) return n;
  }
  // nvidia-smi only if it is on PATH (no shell lookup noise otherwise).
  const char* path_env = std::getenv("PATH");
  bool have_smi = false;
  for (absl::string_view dir : absl::StrSplit(path_env ? path_env : "", ':')) {
    if (!dir.empty() && IsExecutableFile(fs::path(std::string(dir)) / "nvidia-smi")) {
      have_smi = true;
      break;
    }
  }
  if (!have_smi) return 0;
  FILE* pipe = popen("nvidia-smi -L 2>/dev/null", "r");
  if (pipe == nullptr) return 0;
  int n = 0;
  char line[512];
  while (fgets(line, sizeof(line), pipe) != nullptr) {
    if (absl::StartsWith(line, "GPU ")) ++n;
  }
  pclose(pipe);
  return n;
}

int64_t PhysicalMemoryMb() {
  long pages = sysconf(_SC_PHYS_PAGES);
  long page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return 0;
  return static_cast<int64_t>(pages) * page / (1024 * 1024);
}

absl::StatusOr<std::map<std::string, std::string>> ParseLabels(const std::string& text) {
  std::map<std::string, std::string> out;
  if (text.empty()) return out;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    item = absl::StripAsciiWhitespace(item);
    if (item.empty()) continue;
    size_t eq = item.find('=');
    if (eq == absl::string_view::npos || eq == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--labels: expected k=v, got \"", std::string(item), "\""));
    }
    out[std::string(item.substr(0, eq))] = std::string(item.substr(eq + 1));
  }
  return out;
}

std::string SelfDir() {
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return ".";
  return self.parent_path().string();
}

absl::StatusOr<std::string> FindTrainBinary(const std::string& flag) {
  if (!flag.empty()) {
    if (IsExecutableFile(flag)) return fs::absolute(flag).string();
    return absl::NotFoundError(absl::StrCat("--train-binary ", flag, " is not an executable file"));
  }
  std::vector<fs::path> tried;
  const fs::path dir = SelfDir();
  for (const fs::path& p : {dir / "depthbench-train", dir / ".." / "trainer_core" / "depthbench-train"}) {
    tried.push_back(p);
    if (IsExecutableFile(p)) return fs::weakly_canonical(p).string();
  }
  const char* path_env = std::getenv("PATH");
  for (absl::string_view d : absl::StrSplit(path_env ? path_env : "", ':')) {
    if (d.empty()) continue;
    fs::path p = fs::path(std::string(d)) / "depthbench-train";
    if (IsExecutableFile(p)) return p.string();
  }
  std::vector<std::string> names;
  for (const fs::path& p : tried) names.push_back(p.string());
  names.push_back("depthbench-train on $PATH");
  return absl::NotFoundError(absl::StrCat("depthbench-train not found (tried ",
                                          absl::StrJoin(names, ", "),
                                          "); pass --train-binary PATH"));
}

std::string HostName() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "worker";
  return buf;
}

}  // namespace depthbench::worker
