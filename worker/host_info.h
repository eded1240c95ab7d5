// What the worker tells the scheduler about its host, and where it finds
// the trainer binary.
//
// Thread safety: stateless functions (they read /proc, run `nvidia-smi -L`
// or stat files). LibTorch is deliberately not linked into the worker, so
// GPUs are counted from the driver, not from torch::cuda.
#ifndef DEPTHBENCH_WORKER_HOST_INFO_H_
#define DEPTHBENCH_WORKER_HOST_INFO_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"

namespace depthbench::worker {

// CUDA GPUs: entries of /proc/driver/nvidia/gpus/ if present, else the
// "GPU n:" lines of `nvidia-smi -L` when nvidia-smi is on PATH; 0 otherwise.
int CountCudaGpus();

// Physical memory in MiB (sysconf), 0 if unknown.
int64_t PhysicalMemoryMb();

// "k=v,k2=v2" -> map. InvalidArgument names the bad entry.
absl::StatusOr<std::map<std::string, std::string>> ParseLabels(const std::string& text);

// The depthbench-train to run: `flag` if given (must be executable);
// otherwise, next to this executable (`<dir>/depthbench-train`), the build
// tree's `<dir>/../trainer_core/depthbench-train`, then `depthbench-train`
// on PATH. NotFound lists what was tried.
absl::StatusOr<std::string> FindTrainBinary(const std::string& flag);

// The directory holding the running executable (/proc/self/exe).
std::string SelfDir();

// The hostname, for the default worker name.
std::string HostName();

}  // namespace depthbench::worker

#endif  // DEPTHBENCH_WORKER_HOST_INFO_H_
