#!/usr/bin/python3
"""NumPy peer of `depthbench-train diagnose deff` (issue 18 goal 1).

Linear-CKA D_eff (spec section 7) of an (L, N, d) .npy file, float32 BLAS
(NumPy's matmul, OpenBLAS on Debian), in two forms so the peer is measured at
its best:

  feature : every pair's d x d cross-covariance X_i^T X_j of the centred
            layers (the straightforward script: all centred layers held in
            memory, L (L+1) / 2 GEMMs of d x N x d);
  gram    : the same N x N tiling as ours (per tile, each layer's Gram tile
            X_i[a] X_i[b]^T into an [L, t*t] buffer, then G += w K K^T),
            reading the file through np.load(mmap_mode='r').
  gram_dnnl : gram with the off-diagonal tiles' GEMMs through oneDNN's
            dnnl_sgemm (libdnnl.so.2, by ctypes), the library ours uses for
            them where it is built with oneDNN: the peer gets the faster
            GEMM too (on the Zen 5 oneDNN's sgemm ran the trainer's GEMMs
            2.0-2.5x faster than OpenBLAS; on a Zen 3 the two are level).
            The diagonal tiles stay on NumPy's a @ a.T, a syrk.

Also `generate` (random float32 states, written through a memmap one layer at
a time) and `peak` (NumPy's 2048^3 sgemm GFLOP/s).

  deff_numpy_peer.py generate --shape L N D --out FILE [--seed S]
  deff_numpy_peer.py run --states FILE --form feature|gram|gram_dnnl [--tile T]
  deff_numpy_peer.py peak

`run` prints one JSON line: form, seconds (CKA matrix, after opening the
file), gflop (of that form), deff_over_l, rho_bar1, cka_checksum.
"""
import argparse
import ctypes
import json
import sys
import time

import numpy as np


def deff_summary(cka):
    L = cka.shape[0]
    lag = [float(np.mean(np.diagonal(cka, k))) for k in range(L)]
    acc = sum((1.0 - k / L) * lag[k] for k in range(1, L))
    deff = L / (1.0 + 2.0 * acc)
    return deff / L, (lag[1] if L > 1 else float("nan"))


def means(x):
    return [x[l].mean(axis=0, dtype=np.float64) for l in range(x.shape[0])]


def cka_feature(x):
    L, N, d = x.shape
    mu = means(x)
    xc = [(x[l] - mu[l]).astype(np.float32) for l in range(L)]
    g = np.zeros((L, L))
    for i in range(L):
        for j in range(i, L):
            m = xc[i].T @ xc[j]
            g[i, j] = g[j, i] = np.dot(m.ravel(), m.ravel().astype(np.float64))
    flops = N * (L * d) ** 2 + N * L * d * d
    return g, flops


def dnnl_matmul_bt():
    """out = a @ b.T for C-contiguous float32 a [m, k], b [n, k], out [m, n],
    through oneDNN's row-major dnnl_sgemm."""
    try:
        lib = ctypes.CDLL("libdnnl.so.2")
    except OSError as e:
        sys.exit(f"--form gram_dnnl needs oneDNN's libdnnl.so.2 (Debian: libdnnl2): {e}")
    f = lib.dnnl_sgemm
    i64, f32, ptr = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
    f.argtypes = [ctypes.c_char, ctypes.c_char, i64, i64, i64, f32, ptr, i64,
                  ptr, i64, f32, ptr, i64]
    f.restype = ctypes.c_int

    def mm(a, b, out):
        a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
        m, k = a.shape
        n = b.shape[0]
        assert out.flags.c_contiguous and out.shape == (m, n)
        status = f(b"N", b"T", m, n, k, 1.0, a.ctypes.data, k, b.ctypes.data, k,
                   0.0, out.ctypes.data, n)
        if status != 0:
            sys.exit(f"dnnl_sgemm failed with status {status}")
    return mm


def cka_gram(x, tile, mm_bt=None):
    L, N, d = x.shape
    mu = [m.astype(np.float32) for m in means(x)]
    t = min(tile, N)
    blocks = (N + t - 1) // t
    k = np.empty((L, t * t), dtype=np.float32)
    g = np.zeros((L, L))
    chunk = 1 << 16
    pairs = 0
    for a in range(blocks):
        ra = slice(a * t, min(N, a * t + t))
        for b in range(a, blocks):
            rb = slice(b * t, min(N, b * t + t))
            ta, tb = ra.stop - ra.start, rb.stop - rb.start
            pairs += ta * tb
            for l in range(L):
                ca = x[l, ra] - mu[l]
                cb = ca if a == b else x[l, rb] - mu[l]
                out = k[l, : ta * tb].reshape(ta, tb)
                if mm_bt is not None and a != b:
                    mm_bt(ca, cb, out)
                else:
                    np.matmul(ca, cb.T, out=out)
            w = 1.0 if a == b else 2.0
            for c0 in range(0, ta * tb, chunk):
                kc = k[:, c0 : min(ta * tb, c0 + chunk)]
                g += w * (kc @ kc.T).astype(np.float64)
    flops = 2 * L * d * pairs + 2 * L * L * pairs
    return g, flops


def cmd_run(args):
    x = np.load(args.states, mmap_mode="r")
    if x.ndim != 3:
        sys.exit(f"{args.states}: need (L, N, d), got {x.shape}")
    t0 = time.perf_counter()
    if args.form == "feature":
        g, flops = cka_feature(x)
    elif args.form == "gram":
        g, flops = cka_gram(x, args.tile)
    else:
        g, flops = cka_gram(x, args.tile, dnnl_matmul_bt())
    dg = np.sqrt(np.diag(g))
    cka = g / np.outer(dg, dg)
    np.fill_diagonal(cka, 1.0)
    seconds = time.perf_counter() - t0
    deff_over_l, rho1 = deff_summary(cka)
    print(json.dumps({"form": args.form, "seconds": seconds,
                      "gflop": flops / 1e9, "deff_over_l": deff_over_l,
                      "rho_bar1": rho1, "cka_checksum": float(cka.sum())}))


def cmd_generate(args):
    L, N, d = args.shape
    rng = np.random.default_rng(args.seed)
    out = np.lib.format.open_memmap(args.out, mode="w+", dtype=np.float32,
                                    shape=(L, N, d))
    for l in range(L):
        out[l] = rng.standard_normal((N, d), dtype=np.float32)
    out.flush()
    del out


def cmd_peak(_):
    n = 2048
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    c = a @ a
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        np.matmul(a, a, out=c)
        best = min(best, time.perf_counter() - t0)
    print(json.dumps({"sgemm_peak_gflops": 2 * n**3 / best / 1e9}))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--states", required=True)
    r.add_argument("--form", choices=["feature", "gram", "gram_dnnl"], default="feature")
    r.add_argument("--tile", type=int, default=1216)
    g = sub.add_parser("generate")
    g.add_argument("--shape", type=int, nargs=3, required=True)
    g.add_argument("--out", required=True)
    g.add_argument("--seed", type=int, default=0)
    sub.add_parser("peak")
    args = p.parse_args()
    {"run": cmd_run, "generate": cmd_generate, "peak": cmd_peak}[args.cmd](args)


if __name__ == "__main__":
    main()
