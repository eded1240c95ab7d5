// deploy/k8s as Kubernetes would receive it: `kubectl kustomize deploy/k8s`
// renders, and the rendered objects hang together — images built by
// deploy/docker at the project's version, Service ports naming container
// ports that the daemons really listen on, probes on the endpoints the
// daemons serve (/healthz, /readyz on --metrics-listen), the token Secret
// mounted where --auth-token-file reads it, a PodDisruptionBudget over the
// workers, and a termination grace longer than the worker's own
// SIGTERM -> SIGKILL grace for its trainers (the time a checkpoint gets).
// Skips with a message when kubectl is not installed.
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "gtest/gtest.h"
#include "tests/common/test_util.h"

namespace depthbench {
namespace {

using ::depthbench::testing::RunCommand;
using ::depthbench::testing::SourceDir;

// Value of `--flag=VALUE` (or `--flag VALUE`) in a container's args.
std::string Arg(const YAML::Node& container, const std::string& flag) {
  const YAML::Node args = container["args"];
  for (size_t i = 0; args && i < args.size(); ++i) {
    const std::string a = args[i].as<std::string>();
    if (a.rfind(flag + "=", 0) == 0) return a.substr(flag.size() + 1);
    if (a == flag && i + 1 < args.size()) return args[i + 1].as<std::string>();
  }
  return "";
}

int PortOf(const std::string& host_port) {
  const size_t colon = host_port.rfind(':');
  return colon == std::string::npos ? -1 : std::atoi(host_port.c_str() + colon + 1);
}

class K8sRenderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string which;
    if (RunCommand("command -v kubectl", &which) != 0) {
      GTEST_SKIP() << "kubectl not installed (Debian: kubernetes-client)";
    }
    std::string out;
    ASSERT_EQ(RunCommand("kubectl kustomize " + SourceDir() + "/deploy/k8s 2>&1", &out), 0) << out;
    docs_ = YAML::LoadAll(out);
    ASSERT_FALSE(docs_.empty());
    for (const YAML::Node& d : docs_) {
      by_kind_[d["kind"].as<std::string>()].push_back(d);
    }
  }

  const YAML::Node* Find(const std::string& kind, const std::string& name) const {
    auto it = by_kind_.find(kind);
    if (it == by_kind_.end()) return nullptr;
    for (const YAML::Node& d : it->second) {
      if (d["metadata"]["name"].as<std::string>() == name) return &d;
    }
    return nullptr;
  }

  // The workloads with their pod specs: StatefulSet, Deployment, DaemonSet.
  std::vector<YAML::Node> Workloads() const {
    std::vector<YAML::Node> out;
    for (const char* kind : {"StatefulSet", "Deployment", "DaemonSet"}) {
      auto it = by_kind_.find(kind);
      if (it != by_kind_.end()) out.insert(out.end(), it->second.begin(), it->second.end());
    }
    return out;
  }

  YAML::Node Workload(const std::string& name) const {
    for (const YAML::Node& w : Workloads()) {
      if (w["metadata"]["name"].as<std::string>() == name) return w;
    }
    ADD_FAILURE() << "no workload " << name;
    return YAML::Node();
  }

  std::vector<YAML::Node> docs_;
  std::map<std::string, std::vector<YAML::Node>> by_kind_;
};

TEST_F(K8sRenderTest, EveryObjectIsNamespacedAndLabelled) {
  for (const YAML::Node& d : docs_) {
    const std::string kind = d["kind"].as<std::string>();
    if (kind == "Namespace") continue;
    EXPECT_EQ(d["metadata"]["namespace"].as<std::string>(""), "depthbench")
        << kind << "/" << d["metadata"]["name"];
  }
}

TEST_F(K8sRenderTest, ImagesAreTheProjectsAtItsVersion) {
  const std::string version = DEPTHBENCH_VERSION;
  for (const YAML::Node& w : Workloads()) {
    for (const YAML::Node& c : w["spec"]["template"]["spec"]["containers"]) {
      const std::string image = c["image"].as<std::string>();
      // deploy/docker/Dockerfile builds depthbench:VERSION; the GPU variant
      // (deploy/README.md, "Containers") is depthbench-gpu:VERSION.
      EXPECT_TRUE(image == "depthbench:" + version || image == "depthbench-gpu:" + version)
          << image << " (project version " << version << ")";
      const std::string binary = c["command"][0].as<std::string>();
      EXPECT_TRUE(binary == "/usr/local/bin/depthbench-scheduler" ||
                  binary == "/usr/local/bin/depthbench-worker")
          << binary << ": the Dockerfile installs the daemons in /usr/local/bin";
    }
  }
}

TEST_F(K8sRenderTest, PortsAndProbesPointAtWhatTheDaemonsServe) {
  for (const YAML::Node& w : Workloads()) {
    const std::string name = w["metadata"]["name"].as<std::string>();
    const YAML::Node c = w["spec"]["template"]["spec"]["containers"][0];
    std::map<std::string, int> ports;
    for (const YAML::Node& p : c["ports"]) {
      ports[p["name"].as<std::string>()] = p["containerPort"].as<int>();
    }
    // The metrics port is the one the daemon's --metrics-listen binds.
    ASSERT_TRUE(ports.count("metrics")) << name;
    EXPECT_EQ(ports["metrics"], PortOf(Arg(c, "--metrics-listen"))) << name;
    if (ports.count("grpc")) {
      EXPECT_EQ(ports["grpc"], PortOf(Arg(c, "--listen"))) << name;
    }
    // Liveness on /healthz, readiness on /readyz, both on the metrics port.
    ASSERT_TRUE(c["livenessProbe"]) << name;
    ASSERT_TRUE(c["readinessProbe"]) << name;
    EXPECT_EQ(c["livenessProbe"]["httpGet"]["path"].as<std::string>(), "/healthz") << name;
    EXPECT_EQ(c["readinessProbe"]["httpGet"]["path"].as<std::string>(), "/readyz") << name;
    for (const char* probe : {"livenessProbe", "readinessProbe"}) {
      EXPECT_EQ(c[probe]["httpGet"]["port"].as<std::string>(), "metrics") << name << " " << probe;
    }
    // Prometheus annotations scrape the metrics port.
    EXPECT_EQ(w["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"].as<int>(),
              ports["metrics"])
        << name;
  }
  // Every Service port targets a named port of the pods it selects.
  for (const YAML::Node& svc : by_kind_["Service"]) {
    const std::string selected =
        svc["spec"]["selector"]["app.kubernetes.io/name"].as<std::string>();
    const YAML::Node w = Workload(selected);
    const YAML::Node c = w["spec"]["template"]["spec"]["containers"][0];
    std::set<std::string> names;
    for (const YAML::Node& p : c["ports"]) names.insert(p["name"].as<std::string>());
    for (const YAML::Node& p : svc["spec"]["ports"]) {
      EXPECT_TRUE(names.count(p["targetPort"].as<std::string>()))
          << svc["metadata"]["name"] << " targets " << p["targetPort"];
    }
  }
  // The workers dial the scheduler Service's gRPC port.
  const YAML::Node worker = Workload("depthbench-worker");
  const std::string dial = Arg(worker["spec"]["template"]["spec"]["containers"][0], "--scheduler");
  EXPECT_EQ(dial, "depthbench-scheduler.depthbench.svc:7070");
  const YAML::Node* svc = Find("Service", "depthbench-scheduler");
  ASSERT_NE(svc, nullptr);
  bool grpc_port = false;
  for (const YAML::Node& p : (*svc)["spec"]["ports"]) {
    if (p["port"].as<int>() == 7070 && p["targetPort"].as<std::string>() == "grpc") grpc_port = true;
  }
  EXPECT_TRUE(grpc_port);
}

TEST_F(K8sRenderTest, TokenSecretIsMountedWhereTheDaemonsReadIt) {
  for (const YAML::Node& w : Workloads()) {
    const std::string name = w["metadata"]["name"].as<std::string>();
    const YAML::Node pod = w["spec"]["template"]["spec"];
    const YAML::Node c = pod["containers"][0];
    const std::string token_file = Arg(c, "--auth-token-file");
    ASSERT_FALSE(token_file.empty()) << name << " runs without --auth-token-file";
    const std::string dir = token_file.substr(0, token_file.rfind('/'));
    const std::string key = token_file.substr(token_file.rfind('/') + 1);
    std::string volume;
    for (const YAML::Node& m : c["volumeMounts"]) {
      if (m["mountPath"].as<std::string>() == dir) volume = m["name"].as<std::string>();
    }
    ASSERT_FALSE(volume.empty()) << name << ": nothing mounted at " << dir;
    std::string secret_name;
    for (const YAML::Node& v : pod["volumes"]) {
      if (v["name"].as<std::string>() == volume && v["secret"]) {
        secret_name = v["secret"]["secretName"].as<std::string>();
      }
    }
    ASSERT_FALSE(secret_name.empty()) << name << ": volume " << volume << " is not a Secret";
    const YAML::Node* secret = Find("Secret", secret_name);
    ASSERT_NE(secret, nullptr) << "Secret " << secret_name << " is not rendered";
    const bool has_key = ((*secret)["stringData"] && (*secret)["stringData"][key]) ||
                         ((*secret)["data"] && (*secret)["data"][key]);
    EXPECT_TRUE(has_key) << "Secret " << secret_name << " has no key " << key;
  }
}

TEST_F(K8sRenderTest, WorkersHaveADisruptionBudgetAndTimeToCheckpoint) {
  const YAML::Node worker = Workload("depthbench-worker");
  const YAML::Node labels = worker["spec"]["template"]["metadata"]["labels"];
  bool covered = false;
  for (const YAML::Node& pdb : by_kind_["PodDisruptionBudget"]) {
    bool all = true;
    for (const auto& kv : pdb["spec"]["selector"]["matchLabels"]) {
      const std::string k = kv.first.as<std::string>();
      if (!labels[k] || labels[k].as<std::string>() != kv.second.as<std::string>()) all = false;
    }
    if (all) {
      covered = true;
      EXPECT_TRUE(pdb["spec"]["maxUnavailable"] || pdb["spec"]["minAvailable"]);
    }
  }
  EXPECT_TRUE(covered) << "no PodDisruptionBudget selects the worker pods";
  // SIGTERM -> the worker gives its trainers --grace-ms to checkpoint, then
  // reports; the pod must outlive that, with margin for the report.
  const YAML::Node pod = worker["spec"]["template"]["spec"];
  const std::string grace = Arg(pod["containers"][0], "--grace-ms");
  const long grace_ms = grace.empty() ? 10000 : std::atol(grace.c_str());  // worker default
  EXPECT_GE(grace_ms, 60000) << "a 400M checkpoint (weights + AdamW state) needs about a minute";
  EXPECT_GE(pod["terminationGracePeriodSeconds"].as<long>() * 1000, grace_ms + 20000);
}

TEST_F(K8sRenderTest, SchedulerKeepsItsDatabaseOnAPersistentVolume) {
  const YAML::Node s = Workload("depthbench-scheduler");
  ASSERT_EQ(s["kind"].as<std::string>(), "StatefulSet");
  EXPECT_EQ(s["spec"]["replicas"].as<int>(), 1) << "the scheduler is the database's only writer";
  const std::string db = Arg(s["spec"]["template"]["spec"]["containers"][0], "--db");
  bool on_claim = false;
  for (const YAML::Node& m : s["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]) {
    const std::string path = m["mountPath"].as<std::string>();
    for (const YAML::Node& t : s["spec"]["volumeClaimTemplates"]) {
      if (m["name"].as<std::string>() == t["metadata"]["name"].as<std::string>() &&
          db.rfind(path + "/", 0) == 0) {
        on_claim = true;
      }
    }
  }
  EXPECT_TRUE(on_claim) << db << " is not on a volumeClaimTemplate";
}

}  // namespace
}  // namespace depthbench
