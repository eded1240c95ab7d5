// Included last by each fused CPU kernel file (see cpu_fused_isa.h): sets
// the ISA the rest of the file is compiled for and the namespace its kernels
// go in. No include guard: it is meant to be included once per kernel file,
// after every other header.
#if defined(DEPTHBENCH_CPU_FUSED_AVX2)
#if !defined(__GNUC__) || !(defined(__x86_64__) || defined(__i386__))
#error "DEPTHBENCH_CPU_FUSED_AVX2 needs GCC or Clang on x86"
#endif
#pragma GCC target("avx2,fma")
#define DEPTHBENCH_CPU_FUSED_ISA avx2
#else
#define DEPTHBENCH_CPU_FUSED_ISA generic
#endif
