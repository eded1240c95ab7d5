// trainer_core/micro_batch.h: a step run as parallel CPU micro-batches has
// the one-batch step's loss and gradients (to float rounding), is the same
// bit for bit from run to run, and is chosen only where it applies.
#include "trainer_core/micro_batch.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "trainer_core/trainer.h"
#include "trainer_core/train_config.h"

namespace depthbench {
namespace {

LanguageModel Tiny(Arch arch) {
  ModelOptions o;
  o.arch = arch;
  o.design.shape = MakeShape(2, 32, 256, FfnRule::kSwiGlu83, 4, 4);
  o.design.max_seq_len = 16;
  torch::manual_seed(3);
  auto m = BuildModel(o);
  EXPECT_TRUE(m.ok()) << m.status();
  return *m;
}

std::vector<torch::Tensor> Gradients(LanguageModel& m) {
  std::vector<torch::Tensor> g;
  for (const torch::Tensor& p : m->parameters()) g.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
  return g;
}

class MicroBatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    threads_ = at::get_num_threads();
    at::set_num_threads(2);
  }
  void TearDown() override { at::set_num_threads(threads_); }
  int threads_ = 1;
};

// Every design: parts 2 (one micro-batch per thread) and 4 (two per thread)
// against one backward of the whole batch; the multi-stream designs' fused
// kernels take gradients over in place (cpu_fused_isa.h), here from two
// threads at once.
TEST_F(MicroBatchTest, EveryDesignGetsTheOneBatchGradients) {
  torch::manual_seed(5);
  const torch::Tensor tok = torch::randint(0, 256, {4, 17}, torch::kLong);
  const torch::Tensor in = tok.narrow(1, 0, 16), tgt = tok.narrow(1, 1, 16);
  for (Arch arch : AllArchs()) {
    SCOPED_TRACE(std::string(ArchName(arch)));
    LanguageModel m = Tiny(arch);
    const double joint_loss = LossAndGradients(m, in, tgt, 1).item<double>();
    const std::vector<torch::Tensor> joint = Gradients(m);
    for (int64_t parts : {2, 4}) {
      SCOPED_TRACE(::testing::Message() << parts << " micro-batches");
      const torch::Tensor loss = LossAndGradients(m, in, tgt, parts);
      EXPECT_FALSE(loss.requires_grad());
      EXPECT_NEAR(loss.item<double>(), joint_loss, 1e-6 * joint_loss);
      const std::vector<torch::Tensor> split = Gradients(m);
      ASSERT_EQ(split.size(), joint.size());
      int64_t compared = 0;
      for (size_t i = 0; i < split.size(); ++i) {
        ASSERT_EQ(split[i].defined(), joint[i].defined()) << "parameter " << i;
        if (!joint[i].defined()) continue;
        EXPECT_TRUE(torch::allclose(split[i], joint[i], 1e-4, 1e-6))
            << "parameter " << i << ": max difference "
            << (split[i] - joint[i]).abs().max().item<double>();
        ++compared;
      }
      EXPECT_GT(compared, 10);
      // Deterministic: the same step again gives the same bits.
      LossAndGradients(m, in, tgt, parts);
      const std::vector<torch::Tensor> again = Gradients(m);
      for (size_t i = 0; i < split.size(); ++i) {
        if (split[i].defined()) {
          EXPECT_TRUE(torch::equal(again[i], split[i])) << "parameter " << i;
        }
      }
    }
  }
}

TEST_F(MicroBatchTest, GradientsAreFreshTensorsOfTheirOwn) {
  LanguageModel m = Tiny(Arch::kPreLn);
  const torch::Tensor tok = torch::randint(0, 256, {2, 17}, torch::kLong);
  LossAndGradients(m, tok.narrow(1, 0, 16), tok.narrow(1, 1, 16), 2);
  std::vector<const void*> storages;
  for (const torch::Tensor& p : m->parameters()) {
    ASSERT_TRUE(p.grad().defined());
    EXPECT_EQ(p.grad().sizes(), p.sizes());
    storages.push_back(p.grad().storage().data());
  }
  std::sort(storages.begin(), storages.end());
  // Clipping scales gradients in place: no two may share memory.
  EXPECT_EQ(std::adjacent_find(storages.begin(), storages.end()), storages.end());
}

TEST_F(MicroBatchTest, SplitsOnlyWhereItApplies) {
  LanguageModel m = Tiny(Arch::kPreLn);
  EXPECT_EQ(CpuMicroBatches(m, 2, 16), 2);
  EXPECT_EQ(CpuMicroBatches(m, 4, 16), 4);
  EXPECT_EQ(CpuMicroBatches(m, 1, 16), 1);   // one thread: nothing to split for
  EXPECT_EQ(CpuMicroBatches(m, 2, 15), 1);   // the batch does not divide
  EXPECT_EQ(CpuMicroBatches(m, kMaxCpuMicroBatches + 1, 9 * 16), 1);  // too many gradient copies
  setenv("DEPTHBENCH_CPU_MICROBATCH", "off", 1);
  EXPECT_EQ(CpuMicroBatches(m, 2, 16), 1);
  unsetenv("DEPTHBENCH_CPU_MICROBATCH");
  m->design().set_record_diagnostics(true);  // records belong to one forward
  EXPECT_EQ(CpuMicroBatches(m, 2, 16), 1);
  m->design().set_record_diagnostics(false);
  m->to(torch::kFloat64);
  EXPECT_EQ(CpuMicroBatches(m, 2, 16), 1);  // float64 runs keep one batch
}

TEST_F(MicroBatchTest, UnevenBatchIsAPreciseError) {
  LanguageModel m = Tiny(Arch::kPreLn);
  const torch::Tensor tok = torch::randint(0, 256, {3, 17}, torch::kLong);
  try {
    LossAndGradients(m, tok.narrow(1, 0, 16), tok.narrow(1, 1, 16), 2);
    ADD_FAILURE() << "no error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of parts = 2"), std::string::npos) << e.what();
  }
  for (const torch::Tensor& p : m->parameters()) EXPECT_FALSE(p.grad().defined());
}

std::vector<double> Losses(const TrainConfig& config, const std::string& name,
                           int64_t* micro_batches) {
  std::random_device rd;
  const auto dir = std::filesystem::temp_directory_path() /
                   ("depthbench_mb_" + name + "_" + std::to_string(rd()));
  std::vector<double> losses;
  Trainer t(config, TrainerOptions{dir.string(), false, ""}, [&](const nlohmann::json& e) {
    if (e["event"] == "start") *micro_batches = e["micro_batches"].get<int64_t>();
    if (e["event"] == "step") losses.push_back(e["loss"].get<double>());
  });
  auto result = t.Run();
  EXPECT_TRUE(result.ok()) << result.status();
  std::filesystem::remove_all(dir);
  return losses;
}

// The trainer at 2 threads trains in 2 micro-batches (its start event says
// so), reproducibly, and follows the one-batch run to float rounding.
TEST_F(MicroBatchTest, TrainerAtTwoThreadsSplitsReproducibly) {
  Trainer::ClearStop();
  nlohmann::json j = {{"arch", "mhc"}, {"layers", 2}, {"d_model", 32}, {"heads", 4},
                      {"seq_len", 32}, {"batch", 4}, {"steps", 6}, {"lr", 3e-3},
                      {"threads", 2}, {"seed", 7}, {"eval_batches", 1}};
  auto config = TrainConfigFromJson(j);
  ASSERT_TRUE(config.ok()) << config.status();
  int64_t parts_a = 0, parts_b = 0, parts_off = 0;
  const std::vector<double> a = Losses(*config, "a", &parts_a);
  const std::vector<double> b = Losses(*config, "b", &parts_b);
  setenv("DEPTHBENCH_CPU_MICROBATCH", "off", 1);
  const std::vector<double> off = Losses(*config, "off", &parts_off);
  unsetenv("DEPTHBENCH_CPU_MICROBATCH");
  EXPECT_EQ(parts_a, 2);
  EXPECT_EQ(parts_off, 1);
  ASSERT_EQ(a.size(), 6u);
  EXPECT_EQ(a, b);  // bit for bit
  ASSERT_EQ(off.size(), a.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], off[i], 1e-4 * off[i]) << "step " << i + 1;
}

}  // namespace
}  // namespace depthbench
