// BLAS kernel choice for processes that run LibTorch on CPU.
//
// Debian 12's OpenBLAS 0.3.21 picks its kernel set from the CPU model at load
// time and does not know some newer Xeons (this project's machines report
// "Intel(R) Xeon(R) Processor" with AVX-512): it falls back to its generic
// SSE3 "Prescott" kernels, and sgemm runs 4-6x below the machine (2 threads,
// 2048^3: 24 GFLOP/s against 145 with OPENBLAS_CORETYPE=SkylakeX; numbers in
// bench/RESULTS.md). OpenBLAS reads OPENBLAS_CORETYPE only while it loads, so
// a process that finds itself on the fallback sets the variable and execs
// itself once. No packaged BLAS here chooses better (Debian's BLIS and ATLAS
// are slower than OpenBLAS's AVX-512 kernels); MKL is not packaged.
//
// Set DEPTHBENCH_BLAS=default to keep OpenBLAS's own choice.
#ifndef DEPTHBENCH_COMMON_BLAS_TUNING_H_
#define DEPTHBENCH_COMMON_BLAS_TUNING_H_

#include <string>

namespace depthbench {

// OpenBLAS's kernel set in this process ("SkylakeX", "Haswell", "Prescott",
// ...), looked up at run time so nothing links against OpenBLAS directly;
// "unknown" under another BLAS.
std::string OpenBlasCoreName();

// The kernel set this CPU supports when OpenBLAS fell back to "Prescott":
// "SkylakeX" (AVX-512), "Haswell" (AVX2 + FMA), or "" (nothing better, or
// not on the fallback).
std::string BetterOpenBlasCoreType(const std::string& core_name);

// At the top of main(): when OpenBLAS runs its fallback kernels on a CPU
// that has better ones, OPENBLAS_CORETYPE is unset and DEPTHBENCH_BLAS is not
// "default", sets OPENBLAS_CORETYPE and re-executes /proc/self/exe with the
// same arguments (it does not return then). Otherwise returns, doing nothing.
void ReexecForOpenBlasKernels(char** argv);

}  // namespace depthbench

#endif  // DEPTHBENCH_COMMON_BLAS_TUNING_H_
