#include "trainer_core/distributed.h"

#include <chrono>
#include <cstdlib>
#include <functional>

#include "absl/strings/str_cat.h"

#if defined(DEPTHBENCH_HAVE_GLOO) || defined(DEPTHBENCH_HAVE_NCCL)
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#endif
#ifdef DEPTHBENCH_HAVE_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#ifdef DEPTHBENCH_HAVE_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace depthbench {

namespace {
const char* Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}
}  // namespace

DistributedOptions DistributedOptionsFromEnv(DistributedOptions o, bool world_size_given,
                                             bool rank_given, bool addr_given, bool port_given) {
  if (!world_size_given && Env("WORLD_SIZE")) o.world_size = std::atoll(Env("WORLD_SIZE"));
  if (!rank_given && Env("RANK")) o.rank = std::atoll(Env("RANK"));
  if (!addr_given && Env("MASTER_ADDR")) o.master_addr = Env("MASTER_ADDR");
  if (!port_given && Env("MASTER_PORT")) o.master_port = std::atoll(Env("MASTER_PORT"));
  return o;
}

std::vector<std::string> AvailableBackends() {
  std::vector<std::string> out;
#ifdef DEPTHBENCH_HAVE_GLOO
  out.push_back("gloo");
#endif
#ifdef DEPTHBENCH_HAVE_NCCL
  out.push_back("nccl");
#endif
  return out;
}

// The process group behind the c10d API. ProcessGroupGloo/NCCL derive from
// c10d::ProcessGroup in LibTorch 1.13 and from c10d::Backend in 2.x; both
// spell allreduce/broadcast the same way, so the group is held through a
// type-erased pair of callables instead of either base class.
struct DataParallel::Group {
  std::function<void(std::vector<at::Tensor>&)> allreduce_sum;
  std::function<void(std::vector<at::Tensor>&)> broadcast0;
#if defined(DEPTHBENCH_HAVE_GLOO) || defined(DEPTHBENCH_HAVE_NCCL)
  c10::intrusive_ptr<c10d::Store> store;
#endif
};

DataParallel::DataParallel(DistributedOptions options, std::string backend,
                           torch::Device device, std::unique_ptr<Group> group)
    : options_(std::move(options)),
      backend_(std::move(backend)),
      device_(device),
      group_(std::move(group)) {}

DataParallel::~DataParallel() = default;

absl::StatusOr<std::unique_ptr<DataParallel>> DataParallel::Create(
    const DistributedOptions& o, const torch::Device& device) {
  if (o.world_size < 1) return absl::InvalidArgumentError("config.world_size: must be >= 1");
  if (o.rank < 0 || o.rank >= o.world_size)
    return absl::InvalidArgumentError(
        absl::StrCat("config.rank: ", o.rank, " is outside [0, world_size = ", o.world_size, ")"));
  if (o.world_size == 1) {
    return std::unique_ptr<DataParallel>(new DataParallel(o, "none", device, nullptr));
  }
  if (o.master_port <= 0 || o.master_port > 65535)
    return absl::InvalidArgumentError(absl::StrCat("config.master_port: ", o.master_port,
                                                   " is not a TCP port"));
#if defined(DEPTHBENCH_HAVE_GLOO) || defined(DEPTHBENCH_HAVE_NCCL)
  auto group = std::make_unique<Group>();
  const auto timeout = std::chrono::milliseconds(o.timeout_s * 1000);
  std::string backend;
  try {
    c10d::TCPStoreOptions store_options;
    store_options.port = static_cast<uint16_t>(o.master_port);
    store_options.isServer = o.rank == 0;
    store_options.numWorkers = static_cast<size_t>(o.world_size);
    store_options.waitWorkers = true;
    store_options.timeout = timeout;
    group->store = c10::make_intrusive<c10d::TCPStore>(o.master_addr, store_options);
#ifdef DEPTHBENCH_HAVE_NCCL
    if (device.is_cuda()) {
      auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
      auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(
          group->store, static_cast<int>(o.rank), static_cast<int>(o.world_size), nccl_options);
      group->allreduce_sum = [pg](std::vector<at::Tensor>& t) { pg->allreduce(t)->wait(); };
      group->broadcast0 = [pg](std::vector<at::Tensor>& t) { pg->broadcast(t)->wait(); };
      backend = "nccl";
    }
#endif
#ifdef DEPTHBENCH_HAVE_GLOO
    if (backend.empty()) {
      auto gloo_options = c10d::ProcessGroupGloo::Options::create();
      gloo_options->timeout = timeout;
      gloo_options->devices.push_back(
          c10d::ProcessGroupGloo::createDeviceForHostname(o.master_addr));
      auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(
          group->store, static_cast<int>(o.rank), static_cast<int>(o.world_size), gloo_options);
      group->allreduce_sum = [pg](std::vector<at::Tensor>& t) { pg->allreduce(t)->wait(); };
      group->broadcast0 = [pg](std::vector<at::Tensor>& t) { pg->broadcast(t)->wait(); };
      backend = "gloo";
    }
#endif
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("rendezvous at ", o.master_addr, ":", o.master_port,
                                               " (rank ", o.rank, " of ", o.world_size,
                                               ") failed: ", e.what()));
  }
  if (backend.empty())
    return absl::FailedPreconditionError(
        absl::StrCat("world_size ", o.world_size, " on ", device.str(),
                     ": this build has no c10d backend for that device"));
  return std::unique_ptr<DataParallel>(new DataParallel(o, backend, backend == "nccl" ? device : torch::Device(torch::kCPU),
                       std::move(group)));
#else
  (void)device;
  return absl::FailedPreconditionError(
      "world_size > 1: this build has no c10d backend (install libgloo-dev and rebuild)");
#endif
}

absl::Status DataParallel::AllReduceFlat(torch::Tensor& flat) {
  try {
    std::vector<at::Tensor> v{flat};
    group_->allreduce_sum(v);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("all-reduce (", backend_, ") failed: ", e.what()));
  }
  return absl::OkStatus();
}

absl::Status DataParallel::BroadcastFromRank0(const std::vector<torch::Tensor>& tensors) {
  if (world_size() == 1 || tensors.empty()) return absl::OkStatus();
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> flat_parts;
  for (const auto& t : tensors) flat_parts.push_back(t.detach().reshape({-1}));
  torch::Tensor flat = torch::cat(flat_parts).to(device_);
  try {
    std::vector<at::Tensor> v{flat};
    group_->broadcast0(v);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("broadcast (", backend_, ") failed: ", e.what()));
  }
  int64_t offset = 0;
  for (const auto& t : tensors) {
    const int64_t n = t.numel();
    t.detach().copy_(flat.narrow(0, offset, n).view_as(t));
    offset += n;
  }
  return absl::OkStatus();
}

absl::Status DataParallel::AllReduceMeanGradients(const std::vector<torch::Tensor>& params) {
  if (world_size() == 1) return absl::OkStatus();
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  for (const auto& p : params) {
    // A parameter unused this step still takes part (zeros) so every rank
    // packs the same buffer.
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    grads.push_back(p.grad());
  }
  if (grads.empty()) return absl::OkStatus();
  std::vector<torch::Tensor> parts;
  for (const auto& g : grads) parts.push_back(g.reshape({-1}));
  torch::Tensor flat = torch::cat(parts).to(device_);  // Gloo: staged through host memory
  if (absl::Status s = AllReduceFlat(flat); !s.ok()) return s;
  flat.div_(static_cast<double>(world_size()));
  int64_t offset = 0;
  for (auto& g : grads) {
    const int64_t n = g.numel();
    g.copy_(flat.narrow(0, offset, n).view_as(g));
    offset += n;
  }
  return absl::OkStatus();
}

absl::StatusOr<double> DataParallel::AllReduceMean(double value) {
  if (world_size() == 1) return value;
  torch::Tensor t = torch::full({1}, value, torch::TensorOptions(torch::kFloat64).device(device_));
  if (absl::Status s = AllReduceFlat(t); !s.ok()) return s;
  return t.item<double>() / static_cast<double>(world_size());
}

}  // namespace depthbench
