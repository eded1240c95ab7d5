// Data parallelism over a c10d process group: N ranks (processes) each hold a
// full model replica and a disjoint slice of every global batch.
//
//   - rendezvous through a c10d::TCPStore at master_addr:master_port (rank 0
//     hosts it);
//   - backend NCCL when training on CUDA and this build has it
//     (DEPTHBENCH_HAVE_NCCL), Gloo otherwise (CPU tensors; DEPTHBENCH_HAVE_GLOO);
//   - BroadcastFromRank0 makes the initial parameters identical;
//   - AllReduceMean averages gradients (one flattened buffer per call), so
//     every rank applies the same update and, with equal slices, the result
//     equals one process training on the whole batch.
//
// World size 1 needs no backend: every call is a no-op.
//
// Thread safety: one training thread per rank uses a DataParallel.
#ifndef DEPTHBENCH_TRAINER_CORE_DISTRIBUTED_H_
#define DEPTHBENCH_TRAINER_CORE_DISTRIBUTED_H_

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace depthbench {

struct DistributedOptions {
  int64_t world_size = 1;
  int64_t rank = 0;
  std::string master_addr = "127.0.0.1";
  int64_t master_port = 29500;
  int64_t timeout_s = 300;  // rendezvous and collectives
};

// Fills unset fields from RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT
// (torchrun's variables) where the config did not give them.
DistributedOptions DistributedOptionsFromEnv(DistributedOptions options, bool world_size_given,
                                             bool rank_given, bool addr_given, bool port_given);

// Which backends this build can create ("gloo", "nccl").
std::vector<std::string> AvailableBackends();

class DataParallel {
 public:
  // Joins the group; blocks until all ranks arrived (or the timeout).
  // `device` picks the backend: NCCL for CUDA, Gloo for CPU.
  static absl::StatusOr<std::unique_ptr<DataParallel>> Create(const DistributedOptions& options,
                                                              const torch::Device& device);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  int64_t rank() const { return options_.rank; }
  int64_t world_size() const { return options_.world_size; }
  bool is_primary() const { return options_.rank == 0; }
  const std::string& backend() const { return backend_; }

  // Overwrites each tensor with rank 0's values (in place).
  absl::Status BroadcastFromRank0(const std::vector<torch::Tensor>& tensors);
  // Replaces each defined gradient of `params` by its mean over the ranks.
  absl::Status AllReduceMeanGradients(const std::vector<torch::Tensor>& params);
  // Mean over ranks of one value per rank (losses, flags).
  absl::StatusOr<double> AllReduceMean(double value);

 private:
  struct Group;  // the c10d objects (kept out of this header)
  DataParallel(DistributedOptions options, std::string backend, torch::Device device,
               std::unique_ptr<Group> group);
  absl::Status AllReduceFlat(torch::Tensor& flat);

  DistributedOptions options_;
  std::string backend_;
  torch::Device device_;  // where collective buffers live (NCCL: this rank's GPU)
  std::unique_ptr<Group> group_;
};

}  // namespace depthbench

#endif  // DEPTHBENCH_TRAINER_CORE_DISTRIBUTED_H_
