// Included last by each fused CPU kernel file (see cpu_fused_isa.h): sets
// the ISA the rest of the file is compiled for and the namespace its kernels
// go in. No include guard: it is meant to be included once per kernel file,
// after every other header.
//
// GCC's C++ front end does not redefine __AVX2__ / __AVX512F__ after a
// target pragma, so the kernels test DEPTHBENCH_CPU_FUSED_AVX512 (which
// CMake defines for that object) where the code differs by ISA.
#if defined(DEPTHBENCH_CPU_FUSED_AVX2) || defined(DEPTHBENCH_CPU_FUSED_AVX512)
#if !defined(__GNUC__) || !(defined(__x86_64__) || defined(__i386__))
#error "the AVX2 / AVX-512 kernel builds need GCC or Clang on x86"
#endif
#endif
#if defined(DEPTHBENCH_CPU_FUSED_AVX512)
// 512-bit vectors for the auto-vectorised loops too (GCC's default tuning
// prefers 256): on a CPU with full-width AVX-512 units (this machine's Zen 5
// measured 250 against 125 GFLOP/s of FMA per core, zmm against ymm) they do
// twice the work per instruction. prfchw: __builtin_prefetch(p, 1) is
// PREFETCHW only on a target that has it; without it GCC emitted PREFETCHT0
// for the rows HcWrite asks for writing (every AVX2 CPU runs PREFETCHW; it
// made no measurable difference on Zen 5, bench/RESULTS.md session 35).
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,prfchw,prefer-vector-width=512")
#define DEPTHBENCH_CPU_FUSED_ISA avx512
#elif defined(DEPTHBENCH_CPU_FUSED_AVX2)
#pragma GCC target("avx2,fma,prfchw")
#define DEPTHBENCH_CPU_FUSED_ISA avx2
#else
#define DEPTHBENCH_CPU_FUSED_ISA generic
#endif
