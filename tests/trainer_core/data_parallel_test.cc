// Data parallelism (issue 8): two Gloo ranks on CPU, launched by
// `depthbench-train train --nproc 2`, give the same per-step losses as one
// process on the whole global batch; and the DataParallel API's edge cases.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "trainer_core/distributed.h"

namespace depthbench {
namespace {

bool HaveGloo() {
  auto b = AvailableBackends();
  return std::find(b.begin(), b.end(), "gloo") != b.end();
}

struct RunOutput {
  int exit_code = -1;
  std::vector<nlohmann::json> events;
};

RunOutput Train(const std::string& extra, const std::string& out_dir) {
  const std::string cmd = std::string(DEPTHBENCH_TRAIN_BIN) +
                          " train --arch pre_ln --layers 2 --d-model 64 --heads 4 "
                          "--seq-len 32 --batch 8 --steps 5 --lr 3e-3 --threads 1 "
                          "--eval-batches 1 --device cpu --out " +
                          out_dir + " " + extra + " 2>" + out_dir + ".stderr";
  RunOutput r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[1 << 16];
  while (fgets(buf, sizeof(buf), p) != nullptr) {
    auto j = nlohmann::json::parse(buf, nullptr, false);
    if (!j.is_discarded()) r.events.push_back(j);
  }
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::vector<double> Losses(const RunOutput& r) {
  std::vector<double> out;
  for (const auto& e : r.events) {
    if (e.value("event", "") == "step") out.push_back(e.at("loss").get<double>());
  }
  return out;
}

TEST(DataParallelTraining, TwoGlooRanksMatchOneProcessOnTheWholeBatch) {
  if (!HaveGloo()) GTEST_SKIP() << "this build has no c10d Gloo backend (install libgloo-dev)";
  const auto dir = std::filesystem::temp_directory_path() /
                   ("db_dp_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  RunOutput single = Train("", (dir / "single").string());
  RunOutput dp = Train("--nproc 2", (dir / "dp").string());
  ASSERT_EQ(single.exit_code, 0);
  ASSERT_EQ(dp.exit_code, 0) << "see " << (dir / "dp.stderr").string();
  const std::vector<double> a = Losses(single), b = Losses(dp);
  ASSERT_EQ(a.size(), 5u);
  ASSERT_EQ(b.size(), 5u) << "rank 0 alone reports steps";
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(b[i], a[i], 1e-5 * std::abs(a[i])) << "step " << i + 1;
  }
  // One start event (rank 0's) naming the group; one checkpoint on disk.
  int starts = 0;
  for (const auto& e : dp.events) {
    if (e.value("event", "") != "start") continue;
    ++starts;
    EXPECT_EQ(e.at("world_size"), 2);
    EXPECT_EQ(e.at("backend"), "gloo");
    EXPECT_EQ(e.at("device"), "cpu");
    EXPECT_EQ(e.at("fused_ops"), false);
  }
  EXPECT_EQ(starts, 1);
  EXPECT_TRUE(std::filesystem::exists(dir / "dp" / "checkpoint.pt"));
  std::filesystem::remove_all(dir);
}

TEST(DataParallelTraining, RefusesBf16OnCpuAndABatchNotDivisibleByWorldSize) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("db_dp_refuse_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto stderr_of = [&](const char* name) {
    std::ifstream in(dir / (std::string(name) + ".stderr"));
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  RunOutput bf16 = Train("--precision bf16", (dir / "bf16").string());
  EXPECT_EQ(bf16.exit_code, 2);
  EXPECT_NE(stderr_of("bf16").find("needs a CUDA device"), std::string::npos) << stderr_of("bf16");
  RunOutput odd = Train("--world-size 3", (dir / "odd").string());
  EXPECT_EQ(odd.exit_code, 2);
  EXPECT_NE(stderr_of("odd").find("not divisible by world_size"), std::string::npos)
      << stderr_of("odd");
  std::filesystem::remove_all(dir);
}

TEST(DataParallel, WorldSizeOneIsANoOpAndBadRanksAreRefused) {
  DistributedOptions o;
  auto dp = DataParallel::Create(o, torch::Device(torch::kCPU));
  ASSERT_TRUE(dp.ok()) << dp.status();
  EXPECT_EQ((*dp)->backend(), "none");
  torch::Tensor p = torch::ones({3}, torch::requires_grad());
  p.mutable_grad() = torch::full({3}, 2.0);
  EXPECT_TRUE((*dp)->AllReduceMeanGradients({p}).ok());
  EXPECT_TRUE(torch::equal(p.grad(), torch::full({3}, 2.0)));
  EXPECT_EQ(*(*dp)->AllReduceMean(1.5), 1.5);
  o.world_size = 2;
  o.rank = 2;
  EXPECT_EQ(DataParallel::Create(o, torch::Device(torch::kCPU)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(DataParallel, TwoGlooRanksInOneProcessAverageAndBroadcast) {
  if (!HaveGloo()) GTEST_SKIP() << "this build has no c10d Gloo backend (install libgloo-dev)";
  // Port: let rank 0's TCPStore pick nothing fancy; a fixed high port offset
  // by the pid keeps parallel ctest runs apart.
  const int64_t port = 20000 + ::getpid() % 20000;
  std::vector<torch::Tensor> grads(2), weights(2);
  std::vector<double> means(2);
  std::vector<std::string> errors(2);
  auto rank_main = [&](int rank) {
    DistributedOptions o;
    o.world_size = 2;
    o.rank = rank;
    o.master_port = port;
    o.timeout_s = 60;
    auto dp = DataParallel::Create(o, torch::Device(torch::kCPU));
    if (!dp.ok()) {
      errors[rank] = dp.status().ToString();
      return;
    }
    torch::Tensor w = torch::full({4}, static_cast<double>(rank + 1));
    torch::Tensor p = torch::zeros({2, 2}, torch::requires_grad());
    p.mutable_grad() = torch::full({2, 2}, rank == 0 ? 1.0 : 3.0);
    absl::Status s1 = (*dp)->BroadcastFromRank0({w});
    absl::Status s2 = (*dp)->AllReduceMeanGradients({p});
    auto m = (*dp)->AllReduceMean(rank == 0 ? 10.0 : 20.0);
    if (!s1.ok() || !s2.ok() || !m.ok()) {
      errors[rank] = "collective failed";
      return;
    }
    weights[rank] = w;
    grads[rank] = p.grad().clone();
    means[rank] = *m;
  };
  std::thread t0(rank_main, 0), t1(rank_main, 1);
  t0.join();
  t1.join();
  ASSERT_EQ(errors[0], "");
  ASSERT_EQ(errors[1], "");
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(torch::equal(weights[r], torch::full({4}, 1.0))) << "rank " << r;
    EXPECT_TRUE(torch::equal(grads[r], torch::full({2, 2}, 2.0))) << "rank " << r;
    EXPECT_DOUBLE_EQ(means[r], 15.0);
  }
}

}  // namespace
}  // namespace depthbench
