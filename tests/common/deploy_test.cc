// Checks deploy/: systemd units pass `systemd-analyze verify` (with the
// binary paths pointed at stand-in executables, since the real ones are not
// installed here), shell scripts pass `bash -n` and shellcheck, Kubernetes
// manifests parse as YAML with the expected kinds.
#include <cctype>
#include <filesystem>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "gtest/gtest.h"
#include "tests/common/test_util.h"

// In depthbench::testing: the helpers of tests/common/test_util.h.
namespace depthbench::testing {
namespace {

std::string DeployDir() { return SourceDir() + "/deploy"; }

// Copies `unit` into `dir` with /usr/local/bin/depthbench-* replaced by
// executables created in `dir`.
std::string StageUnit(const std::string& unit, const std::string& dir) {
  std::string text = ReadFileOrDie(DeployDir() + "/systemd/" + unit);
  for (const char* bin : {"depthbench-scheduler", "depthbench-worker"}) {
    const std::string fake = dir + "/" + bin;
    WriteFile(fake, "#!/bin/sh\nexit 0\n");
    std::filesystem::permissions(fake,
                                 std::filesystem::perms::owner_all);
    text = std::regex_replace(text,
                              std::regex(std::string("/usr/local/bin/") + bin),
                              fake);
  }
  const std::string path = dir + "/" + unit;
  WriteFile(path, text);
  return path;
}

class SystemdUnitTest : public ::testing::TestWithParam<std::string> {};

TEST_P(SystemdUnitTest, VerifiesCleanly) {
  if (!Executable("/usr/bin/systemd-analyze")) {
    GTEST_SKIP() << "systemd-analyze not installed";
  }
  TempDir dir;
  const std::string unit = StageUnit(GetParam(), dir.path());
  std::string out;
  EXPECT_EQ(RunCommand("/usr/bin/systemd-analyze verify " + unit, &out), 0)
      << out;
  // Warnings (unknown keys, bad values) exit 0: the output must be empty.
  EXPECT_EQ(out, "");
}

INSTANTIATE_TEST_SUITE_P(Units, SystemdUnitTest,
                         ::testing::Values("depthbench-scheduler.service",
                                           "depthbench-worker.service"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           // depthbench_scheduler_service
                           std::string name = info.param;
                           for (char& c : name) {
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return name;
                         });

TEST(SystemdTest, VerifyCatchesBrokenUnits) {
  if (!Executable("/usr/bin/systemd-analyze")) {
    GTEST_SKIP() << "systemd-analyze not installed";
  }
  TempDir dir;
  std::string out;
  // Missing binary: the unmodified unit fails here (nothing installed).
  const std::string real = dir.path() + "/depthbench-worker.service";
  WriteFile(real, ReadFileOrDie(DeployDir() +
                                "/systemd/depthbench-worker.service"));
  if (!Executable("/usr/local/bin/depthbench-worker")) {
    EXPECT_NE(RunCommand("/usr/bin/systemd-analyze verify " + real, &out), 0);
  }
  WriteFile(dir.path() + "/typo.service",
            "[Service]\nExecStart=/bin/true\nRestartt=always\n");
  RunCommand("/usr/bin/systemd-analyze verify " + dir.path() + "/typo.service",
             &out);
  EXPECT_NE(out, "") << "an unknown key must produce output";
}

TEST(SystemdTest, UnitsRunTheDocumentedCommandLines) {
  const std::string scheduler =
      ReadFileOrDie(DeployDir() + "/systemd/depthbench-scheduler.service");
  EXPECT_NE(scheduler.find("ExecStart=/usr/local/bin/depthbench-scheduler "
                           "--db ${DEPTHBENCH_DB} --listen "
                           "${DEPTHBENCH_LISTEN} --metrics-listen "),
            std::string::npos);
  const std::string worker =
      ReadFileOrDie(DeployDir() + "/systemd/depthbench-worker.service");
  EXPECT_NE(worker.find("ExecStart=/usr/local/bin/depthbench-worker "
                        "--scheduler ${DEPTHBENCH_SCHEDULER} "
                        "--checkpoint-root ${DEPTHBENCH_CHECKPOINT_ROOT} "),
            std::string::npos);
}

std::vector<std::string> ShellScripts() {
  return {DeployDir() + "/slurm/depthbench-workers.sbatch",
          DeployDir() + "/slurm/prometheus_targets.sh",
          DeployDir() + "/slurm/local-cluster.sh",
          DeployDir() + "/systemd/install.sh"};
}

TEST(ShellScriptTest, BashSyntax) {
  for (const std::string& script : ShellScripts()) {
    std::string out;
    EXPECT_EQ(RunCommand("bash -n " + script, &out), 0) << script << out;
  }
  // The check can fail.
  TempDir dir;
  WriteFile(dir.path() + "/bad.sh", "if true; then\n");
  std::string out;
  EXPECT_NE(RunCommand("bash -n " + dir.path() + "/bad.sh", &out), 0);
}

TEST(ShellScriptTest, Shellcheck) {
  if (!Executable("/usr/bin/shellcheck")) {
    GTEST_SKIP() << "shellcheck not installed";
  }
  for (const std::string& script : ShellScripts()) {
    std::string out;
    EXPECT_EQ(RunCommand("/usr/bin/shellcheck " + script, &out), 0)
        << script << "\n" << out;
  }
}

TEST(KubernetesTest, ManifestsParseWithExpectedKinds) {
  std::multiset<std::string> kinds;
  bool gpu_requested = false;
  const std::vector<std::string> files = {
      "namespace.yaml",   "auth-secret.yaml", "checkpoints-pvc.yaml",
      "scheduler.yaml",   "worker.yaml",      "worker-pdb.yaml",
      "servicemonitor.yaml", "kustomization.yaml"};
  for (const std::string& file : files) {
    const std::string path = DeployDir() + "/k8s/" + file;
    ASSERT_TRUE(std::filesystem::exists(path)) << path;
    std::vector<YAML::Node> docs;
    ASSERT_NO_THROW(docs = YAML::LoadAll(ReadFileOrDie(path))) << path;
    for (const YAML::Node& doc : docs) {
      ASSERT_TRUE(doc["apiVersion"] && doc["kind"]) << path;
      const std::string kind = doc["kind"].as<std::string>();
      kinds.insert(kind);
      if (kind == "Deployment" || kind == "DaemonSet") {
        for (const YAML::Node& c : doc["spec"]["template"]["spec"]["containers"]) {
          if (c["resources"]["limits"]["nvidia.com/gpu"]) gpu_requested = true;
        }
      }
      if (kind == "StatefulSet") {
        EXPECT_TRUE(doc["spec"]["volumeClaimTemplates"]) << "SQLite PVC";
      }
    }
  }
  EXPECT_EQ(kinds.count("StatefulSet"), 1u);
  EXPECT_EQ(kinds.count("Deployment") + kinds.count("DaemonSet"), 1u);
  EXPECT_EQ(kinds.count("Service"), 2u);
  EXPECT_EQ(kinds.count("ServiceMonitor"), 2u);
  EXPECT_EQ(kinds.count("PersistentVolumeClaim"), 1u);
  EXPECT_TRUE(gpu_requested);
  // Every file in deploy/k8s is listed in the kustomization.
  const YAML::Node k = YAML::LoadFile(DeployDir() + "/k8s/kustomization.yaml");
  EXPECT_EQ(k["resources"].size(), files.size() - 1);
}

TEST(DeployReadmeTest, DocumentsEveryFile) {
  const std::string readme = ReadFileOrDie(DeployDir() + "/README.md");
  for (const auto& entry :
       std::filesystem::recursive_directory_iterator(DeployDir())) {
    if (!entry.is_regular_file()) continue;
    const std::string rel =
        std::filesystem::relative(entry.path(), DeployDir()).string();
    if (rel == "README.md") continue;
    EXPECT_NE(readme.find(rel), std::string::npos)
        << "deploy/README.md does not mention " << rel;
  }
}

}  // namespace
}  // namespace depthbench::testing
