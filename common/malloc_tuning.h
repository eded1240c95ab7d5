// Allocator policy for processes that run LibTorch on CPU (training,
// diagnostics, their benchmarks).
//
// LibTorch's CPU allocator is plain malloc. With glibc's dynamic mmap and
// trim thresholds, the 0.1-10 MB activations and gradients of a training
// step are mmapped (or carved from a heap top that is trimmed right after)
// and freed every step, so every step re-faults and re-zeroes the same
// pages: on the issue-2 benchmark model that made the forward and backward
// passes about 2x slower than the same ops in a Python process whose heap
// happened not to be trimmed (bench/RESULTS.md, "Trainer"). Pinning the
// thresholds keeps those blocks in the heap across steps. jemalloc or
// tcmalloc would do the same job; glibc's mallopt needs no new dependency.
//
// Set DEPTHBENCH_MALLOC=default to keep glibc's dynamic thresholds (the
// benchmark measures both forms this way).
#ifndef DEPTHBENCH_COMMON_MALLOC_TUNING_H_
#define DEPTHBENCH_COMMON_MALLOC_TUNING_H_

#include <string>

namespace depthbench {

// Pins glibc malloc's mmap threshold (256 MiB) and trim threshold (1 GiB)
// unless DEPTHBENCH_MALLOC=default; call once at process start, before the
// first tensor. Returns what was done, for the run's `start` event:
// "pinned (mmap 256 MiB, trim 1 GiB)", "glibc default (DEPTHBENCH_MALLOC=default)",
// or "glibc default (not glibc)" / "glibc default (mallopt refused)".
std::string PinMallocThresholds();

// The last PinMallocThresholds() result in this process, or "glibc default"
// when it was never called.
std::string MallocPolicy();

}  // namespace depthbench

#endif  // DEPTHBENCH_COMMON_MALLOC_TUNING_H_
