#!/usr/bin/env python3
"""Is NumPy's `a @ a.T` a syrk? (bench/RESULTS.md, session 29, goal 1.)

Times, alternated in one process, the BLAS's cblas_ssyrk (upper triangle of
a a^T, called through ctypes from the libblas.so.3 NumPy and LibTorch load),
NumPy's `a @ a.T` (same buffer transposed) and `a @ b.T` (a general GEMM of
the same shape), for [n, k] float32 blocks: the shape of the D_eff kernel's
diagonal and off-diagonal Gram tiles. Equal times for the first two mean
NumPy's diagonal tiles cost what depthbench-train's syrk tiles do.

  OMP_NUM_THREADS=2 python3 bench/diagnostics/syrk_vs_gemm.py [N ...]   (default 1120 1680, k = 1024)
"""
import ctypes
import sys
import time

import numpy as np


def main():
    sizes = [int(a) for a in sys.argv[1:]] or [1120, 1680]
    blas = ctypes.CDLL("libblas.so.3")
    k = 1024
    for n in sizes:
        rng = np.random.default_rng(n)
        a = rng.standard_normal((n, k), dtype=np.float32)
        b = rng.standard_normal((n, k), dtype=np.float32)
        c = np.zeros((n, n), np.float32)

        def syrk():
            blas.cblas_ssyrk(101, 121, 111, n, k, ctypes.c_float(1.0),  # RowMajor, Upper, NoTrans
                             a.ctypes.data_as(ctypes.c_void_p), k, ctypes.c_float(0.0),
                             c.ctypes.data_as(ctypes.c_void_p), n)

        def gram():
            np.matmul(a, a.T, out=c)

        def gemm():
            np.matmul(a, b.T, out=c)

        runs = {f: [] for f in (syrk, gram, gemm)}
        for f in runs:
            f()
        for _ in range(15):
            for f, ts in runs.items():
                t = time.perf_counter()
                f()
                ts.append(time.perf_counter() - t)
        full = 2.0 * n * n * k
        for f, ts in runs.items():
            m = sorted(ts)[len(ts) // 2]
            print(f"n={n} k={k} {f.__name__:5s}: median {m * 1e3:7.2f} ms, "
                  f"{full / m / 1e9:6.1f} GFLOP/s counted as a full product")


if __name__ == "__main__":
    main()
