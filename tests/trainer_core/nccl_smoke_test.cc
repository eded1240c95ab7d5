// One-GPU NCCL smoke test (issue 21): the c10d NCCL backend this build links
// (trainer_core/distributed.cc's DEPTHBENCH_HAVE_NCCL path) loads NCCL,
// creates a one-rank communicator through a store and runs all-reduce and
// broadcast on a CUDA tensor, fp32 and bf16. DataParallel never builds a
// group for world_size 1 and NCCL refuses two ranks on one device, so this
// is the most a single-GPU node can prove before a multi-GPU run.
//
// The CPU twin runs the same collectives through the Gloo backend (skipped
// with a message when the build has no Gloo).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <vector>

#if defined(DEPTHBENCH_HAVE_GLOO) || defined(DEPTHBENCH_HAVE_NCCL)
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#endif
#ifdef DEPTHBENCH_HAVE_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#ifdef DEPTHBENCH_HAVE_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace {

// Runs all-reduce (sum over one rank: unchanged) and broadcast from rank 0
// on `device` through `pg`, for each dtype, on values that bf16 represents
// exactly.
template <typename Group>
void CheckOneRankCollectives(Group& pg, const torch::Device& device,
                             const std::vector<torch::ScalarType>& dtypes) {
  for (auto dtype : dtypes) {
    SCOPED_TRACE(c10::toString(dtype));
    const torch::Tensor expected =
        torch::arange(0, 1024, torch::TensorOptions().dtype(torch::kFloat32)).div(4).to(dtype);
    std::vector<at::Tensor> t{expected.to(device)};
    pg->allreduce(t)->wait();
    EXPECT_EQ(t[0].device(), device);
    EXPECT_TRUE(torch::equal(t[0].cpu(), expected));

    std::vector<at::Tensor> b{expected.mul(2).to(device)};
    pg->broadcast(b)->wait();
    EXPECT_TRUE(torch::equal(b[0].cpu(), expected.mul(2)));
  }
}

TEST(NcclSmoke, OneRankAllReduceAndBroadcastOnCuda) {
#ifndef DEPTHBENCH_HAVE_NCCL
  GTEST_SKIP() << "this build has no c10d NCCL backend (needs a CUDA LibTorch and nccl.h; "
                  "scripts/gpu-check.sh passes NCCL_ROOT)";
#else
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible";
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = std::chrono::milliseconds(60000);
  auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, 0, 1, options);
  EXPECT_EQ(pg->getBackendName(), "nccl");
  CheckOneRankCollectives(pg, torch::Device(torch::kCUDA, 0), {torch::kFloat32, torch::kBFloat16});
  torch::cuda::synchronize();
#endif
}

// CPU twin: the same collectives through Gloo (fp32: LibTorch 1.13's Gloo
// backend has no bf16 all-reduce).
TEST(NcclSmoke, CpuTwinOneRankAllReduceAndBroadcastOnGloo) {
#ifndef DEPTHBENCH_HAVE_GLOO
  GTEST_SKIP() << "this build has no c10d Gloo backend (install libgloo-dev)";
#else
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto options = c10d::ProcessGroupGloo::Options::create();
  options->timeout = std::chrono::milliseconds(60000);
  options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, 0, 1, options);
  EXPECT_EQ(pg->getBackendName(), "gloo");
  CheckOneRankCollectives(pg, torch::Device(torch::kCPU), {torch::kFloat32});
#endif
}

}  // namespace
