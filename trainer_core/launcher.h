// `depthbench-train train --nproc N`: runs N ranks of the same train command
// on this machine, one child process each, with the torchrun-style variables
// RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR (127.0.0.1) and MASTER_PORT (a
// free loopback port unless the caller gives one) set. The worker uses it for
// multi-device jobs (and may set CUDA_VISIBLE_DEVICES for the whole group).
//
// SIGTERM / SIGINT are forwarded to every rank (each checkpoints and exits 4
// at the same step). If a rank fails (exit code other than 0, 3, 4, or a
// signal), the others are killed rather than left hanging in a collective.
// The result is rank 0's exit code, or the failed rank's code when rank 0
// itself ended cleanly.
//
// Thread safety: call once, from the main thread (installs signal handlers).
#ifndef DEPTHBENCH_TRAINER_CORE_LAUNCHER_H_
#define DEPTHBENCH_TRAINER_CORE_LAUNCHER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace depthbench {

// `args` is the full argv of one rank (args[0] ignored: this executable,
// /proc/self/exe, is run). master_port 0 picks a free port.
absl::StatusOr<int> LaunchRanks(int nproc, const std::vector<std::string>& args,
                                int master_port = 0);

// argv without `--nproc N` / `--nproc=N`.
std::vector<std::string> WithoutNprocFlag(int argc, char** argv);

}  // namespace depthbench

#endif  // DEPTHBENCH_TRAINER_CORE_LAUNCHER_H_
