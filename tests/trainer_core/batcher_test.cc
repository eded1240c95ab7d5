#include "trainer_core/batcher.h"

#include <vector>

#include "gtest/gtest.h"

namespace depthbench {
namespace {

TEST(Batcher, TensorMatchesBatchAndSplitsShiftByOne) {
  std::vector<uint32_t> ids(500);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = 70000 + static_cast<uint32_t>(i);
  const TokenSequence tokens(std::move(ids));
  auto sampler = BatchSampler::Create(&tokens, {8, 3, 11});
  ASSERT_TRUE(sampler.ok()) << sampler.status();
  const Batch batch = sampler->Next();
  const torch::Tensor t = BatchToTensor(batch);
  EXPECT_EQ(t.scalar_type(), torch::kLong);
  ASSERT_EQ(t.sizes(), (std::vector<int64_t>{3, 9}));
  for (int64_t b = 0; b < 3; ++b) {
    for (int64_t j = 0; j < 9; ++j) {
      EXPECT_EQ(t[b][j].item<int64_t>(), 70000 + batch.starts[b] + j);
    }
  }
  const InputsTargets io = SplitInputsTargets(t);
  ASSERT_EQ(io.inputs.sizes(), (std::vector<int64_t>{3, 8}));
  ASSERT_EQ(io.targets.sizes(), (std::vector<int64_t>{3, 8}));
  EXPECT_TRUE(torch::equal(io.targets, io.inputs + 1));
  EXPECT_EQ(io.inputs[2][0].item<int64_t>(), batch.input(2, 0));
  EXPECT_EQ(io.targets[2][7].item<int64_t>(), batch.target(2, 7));
}

TEST(Batcher, RejectsMalformedBatch) {
  Batch bad;
  bad.batch = 2;
  bad.seq_len = 4;
  bad.tokens.assign(7, 0);
  EXPECT_THROW(BatchToTensor(bad), c10::Error);
  EXPECT_THROW(SplitInputsTargets(torch::zeros({5}, torch::kLong)), c10::Error);
}

}  // namespace
}  // namespace depthbench
