// deploy/systemd without systemd: the scheduler and worker units' ExecStart
// lines, expanded the way systemd expands them (Environment= defaults, then
// the EnvironmentFile, `${VAR}` as one word, `$VAR` split at white space),
// started as real processes with environment files in the shipped
// /etc/default format. The worker registers and runs a one-job sweep (with
// the stand-in trainer), and both daemons stop on the unit's KillSignal
// within its TimeoutStopSec. The shipped .default files are checked to set
// only variables their unit reads.
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/integration/scheduler_process.h"
#include "tests/integration/worker_process.h"

namespace depthbench::testing {
namespace {

namespace v1 = ::depthbench::v1;
using Clock = std::chrono::steady_clock;

const std::string kUnits = std::string(DEPTHBENCH_SOURCE_DIR) + "/deploy/systemd/";

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Unit {
  std::vector<std::pair<std::string, std::string>> environment;  // Environment= in order
  std::string environment_file;                                    // without the leading '-'
  std::string exec_start;
  std::string kill_signal;
  int timeout_stop_s = 90;
};

Unit ParseUnit(const std::string& path) {
  Unit u;
  std::istringstream lines(Slurp(path));
  std::string line;
  while (std::getline(lines, line)) {
    auto value = [&](const std::string& key) -> std::optional<std::string> {
      if (line.rfind(key + "=", 0) != 0) return std::nullopt;
      return line.substr(key.size() + 1);
    };
    if (auto v = value("Environment")) {
      const size_t eq = v->find('=');
      u.environment.emplace_back(v->substr(0, eq), v->substr(eq + 1));
    } else if (auto v = value("EnvironmentFile")) {
      u.environment_file = (*v)[0] == '-' ? v->substr(1) : *v;
    } else if (auto v = value("ExecStart")) {
      u.exec_start = *v;
    } else if (auto v = value("KillSignal")) {
      u.kill_signal = *v;
    } else if (auto v = value("TimeoutStopSec")) {
      u.timeout_stop_s = std::stoi(*v);  // "120s" -> 120
    }
  }
  return u;
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

// An EnvironmentFile: KEY=VALUE lines, '#' comments, blank lines.
std::map<std::string, std::string> ParseEnvironmentFile(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t eq = line.find('=');
    EXPECT_NE(eq, std::string::npos) << "not KEY=VALUE: " << line;
    if (eq == std::string::npos) continue;
    out[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return out;
}

// systemd's ExecStart expansion: "${VAR}" is one word, "$VAR" splits at
// white space (an empty value gives no word).
std::vector<std::string> Expand(const std::string& exec,
                                const std::map<std::string, std::string>& env) {
  std::vector<std::string> words;
  std::istringstream in(exec);
  std::string word;
  static const std::regex braced(R"(\$\{([A-Za-z_][A-Za-z0-9_]*)\})");
  static const std::regex bare(R"(^\$([A-Za-z_][A-Za-z0-9_]*)$)");
  while (in >> word) {
    std::smatch m;
    if (std::regex_match(word, m, bare)) {
      auto it = env.find(m[1]);
      std::istringstream split(it == env.end() ? "" : it->second);
      std::string part;
      while (split >> part) words.push_back(part);
      continue;
    }
    std::string expanded;
    auto begin = word.cbegin();
    for (std::sregex_iterator i(word.begin(), word.end(), braced), end; i != end; ++i) {
      expanded.append(begin, word.cbegin() + i->position());
      auto it = env.find((*i)[1]);
      expanded += it == env.end() ? "" : it->second;
      begin = word.cbegin() + i->position() + i->length();
    }
    expanded.append(begin, word.cend());
    words.push_back(expanded);
  }
  return words;
}

// Variables a unit reads: Environment= names and ${X} / $X in ExecStart.
std::set<std::string> UnitVariables(const Unit& u) {
  std::set<std::string> out;
  for (const auto& [k, v] : u.environment) out.insert(k);
  static const std::regex ref(R"(\$\{?([A-Za-z_][A-Za-z0-9_]*))");
  for (std::sregex_iterator i(u.exec_start.begin(), u.exec_start.end(), ref), end; i != end; ++i) {
    out.insert((*i)[1]);
  }
  return out;
}

// Starts the unit's command with `env_file` as its EnvironmentFile and the
// binaries of this build in place of /usr/local/bin.
pid_t StartUnit(const Unit& u, const std::string& env_file, const std::string& log) {
  std::map<std::string, std::string> env;
  for (const auto& [k, v] : u.environment) env[k] = v;
  for (const auto& [k, v] : ParseEnvironmentFile(Slurp(env_file))) env[k] = v;
  std::vector<std::string> argv = Expand(u.exec_start, env);
  EXPECT_FALSE(argv.empty());
  const std::map<std::string, std::string> installed = {
      {"/usr/local/bin/depthbench-scheduler", DEPTHBENCH_SCHEDULER_BIN},
      {"/usr/local/bin/depthbench-worker", DEPTHBENCH_WORKER_BIN}};
  EXPECT_TRUE(installed.count(argv[0])) << argv[0];
  argv[0] = installed.at(argv[0]);
  return SpawnLogged(argv, log);
}

// Sends the unit's KillSignal; true when the process exits within
// TimeoutStopSec.
bool StopUnit(const Unit& u, pid_t pid) {
  EXPECT_EQ(u.kill_signal, "SIGTERM");
  kill(pid, SIGTERM);
  auto deadline = Clock::now() + std::chrono::seconds(u.timeout_stop_s);
  int status = 0;
  while (Clock::now() < deadline) {
    if (waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) && WEXITSTATUS(status) == 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return false;
}

TEST(SystemdExecTest, DefaultFilesSetOnlyVariablesTheirUnitReads) {
  for (const char* name : {"depthbench-scheduler", "depthbench-worker"}) {
    const Unit u = ParseUnit(kUnits + name + ".service");
    EXPECT_EQ(u.environment_file, std::string("/etc/default/") + name);
    const std::set<std::string> known = UnitVariables(u);
    for (const auto& [k, v] : ParseEnvironmentFile(Slurp(kUnits + name + ".default"))) {
      EXPECT_TRUE(known.count(k)) << name << ".default sets " << k << ", which the unit never reads";
    }
  }
}

TEST(SystemdExecTest, ExpansionFollowsSystemd) {
  const std::map<std::string, std::string> env = {{"A", "x y"}, {"B", ""}, {"C", "--f 1"}};
  EXPECT_EQ(Expand("/bin/p --a ${A} $B $C tail${A}", env),
            (std::vector<std::string>{"/bin/p", "--a", "x y", "--f", "1", "tailx y"}));
}

TEST(SystemdExecTest, UnitsRunASweepFromTheirExecStartLines) {
  const std::string dir = MakeTempDir("systemd");
  const Unit scheduler_unit = ParseUnit(kUnits + "depthbench-scheduler.service");
  const Unit worker_unit = ParseUnit(kUnits + "depthbench-worker.service");

  // /etc/default/depthbench-scheduler, as an operator writes it for this host.
  WriteFile(dir + "/scheduler.env",
            "# test host\nDEPTHBENCH_DB=" + dir + "/scheduler.db\n"
            "DEPTHBENCH_LISTEN=127.0.0.1:0\nDEPTHBENCH_METRICS_LISTEN=127.0.0.1:0\n"
            "DEPTHBENCH_SCHEDULER_ARGS=--port-file " + dir + "/port --metrics-port-file " + dir +
            "/metrics-port\n");
  const pid_t scheduler = StartUnit(scheduler_unit, dir + "/scheduler.env", dir + "/scheduler.log");
  int port = 0;
  for (int i = 0; i < 500 && port == 0; ++i) {
    std::ifstream in(dir + "/port");
    if (!(in >> port)) port = 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GT(port, 0) << Slurp(dir + "/scheduler.log");
  const std::string address = "127.0.0.1:" + std::to_string(port);

  std::filesystem::create_directories(dir + "/ckpt");
  WriteFile(dir + "/worker.env",
            "DEPTHBENCH_SCHEDULER=" + address + "\nDEPTHBENCH_CHECKPOINT_ROOT=" + dir +
            "/ckpt\nDEPTHBENCH_METRICS_LISTEN=127.0.0.1:0\n"
            "DEPTHBENCH_WORKER_ARGS=--slots 1 --poll-ms 100 --name systemd-worker "
            "--train-binary " DEPTHBENCH_TRAIN_BIN "\n");
  const pid_t worker = StartUnit(worker_unit, dir + "/worker.env", dir + "/worker.log");

  WriteFile(dir + "/spec.yaml",
            "name: systemd\narchitectures: [pre_ln]\n"
            "shapes: {explicit: [{layers: 2, d_model: 64, heads: 4}]}\n"
            "lr_grids: {pre_ln: [1.0e-3]}\ntraining: {steps: 1}\n");
  auto [rc, out] = RunCommand(std::string(DEPTHBENCH_CLI_BIN) + " --scheduler " + address +
                              " submit " + dir + "/spec.yaml 2>&1");
  ASSERT_EQ(rc, 0) << out;

  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto stub = v1::SweepService::NewStub(channel);
  v1::Sweep sweep;
  auto deadline = Clock::now() + std::chrono::seconds(60);
  while (Clock::now() < deadline) {
    v1::GetSweepRequest req;
    req.set_name("systemd");
    auto ctx = Ctx();
    if (stub->GetSweep(ctx.get(), req, &sweep).ok() && sweep.state() == v1::SWEEP_COMPLETED) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(sweep.state(), v1::SWEEP_COMPLETED)
      << Slurp(dir + "/worker.log") << Slurp(dir + "/scheduler.log");
  EXPECT_EQ(sweep.job_counts().at("succeeded"), 1);
  EXPECT_NE(Slurp(dir + "/worker.log").find("systemd-worker"), std::string::npos);

  EXPECT_TRUE(StopUnit(worker_unit, worker)) << Slurp(dir + "/worker.log");
  EXPECT_TRUE(StopUnit(scheduler_unit, scheduler)) << Slurp(dir + "/scheduler.log");
  if (!::testing::Test::HasFailure()) std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace depthbench::testing
