#!/usr/bin/python3
"""PyTorch eager peer of depthbench-train for the issue-2 benchmark.

The same Pre-LN model (RoPE, RMSNorm eps 1e-6, SwiGLU, untied embedding and
head, no biases, std-0.02 init), AdamW (0.9, 0.95, eps 1e-8, wd 0.1), global
norm clipping 1.0, on random byte tokens. Prints one JSON line with the
median tokens/s over the timed steps. Run with Debian's /usr/bin/python3
(python3-torch).

--onednn-gemm gives the peer the GEMM library depthbench-train's dense layers
call (cuda_ops/cpu_gemm.h): PyTorch 1.13 has no switch that sends float32
F.linear to oneDNN, so every linear layer becomes an autograd function that
calls oneDNN's sgemm through ctypes (libdnnl.so.2, the library LibTorch
itself links; ctypes releases the GIL, so micro-batch threads overlap).
"""
import argparse
import ctypes
import json
import math
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(head_dim, T):
    half = head_dim // 2
    inv = torch.pow(10000.0, -torch.arange(0, half, dtype=torch.float64) * 2.0 / head_dim)
    ang = torch.outer(torch.arange(T, dtype=torch.float64), inv)
    full = torch.cat([ang, ang], -1)
    return full.cos().float(), full.sin().float()


def rope(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class DnnlLinear(torch.autograd.Function):
    """y = x w^T with forward and backward on oneDNN's dnnl_sgemm."""
    lib = None

    @classmethod
    def load(cls):
        cls.lib = ctypes.CDLL("libdnnl.so.2")
        i64, fl, ptr = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
        cls.lib.dnnl_sgemm.argtypes = [ctypes.c_char, ctypes.c_char, i64, i64, i64, fl, ptr, i64,
                                       ptr, i64, fl, ptr, i64]

    @classmethod
    def sgemm(cls, ta, tb, m, n, k, a, lda, b, ldb, c, ldc):
        status = cls.lib.dnnl_sgemm(ta, tb, m, n, k, 1.0, a.data_ptr(), lda, b.data_ptr(), ldb,
                                    0.0, c.data_ptr(), ldc)
        if status != 0:
            raise RuntimeError(f"dnnl_sgemm failed with status {status}")

    @staticmethod
    def forward(ctx, x, w):
        N, K = w.shape
        x2, w = x.reshape(-1, K).contiguous(), w.contiguous()
        y = torch.empty(x2.shape[0], N)
        DnnlLinear.sgemm(b"N", b"T", x2.shape[0], N, K, x2, K, w, K, y, N)
        ctx.save_for_backward(x2, w)
        ctx.x_shape = x.shape
        return y.view(*x.shape[:-1], N)

    @staticmethod
    def backward(ctx, dy):
        x2, w = ctx.saved_tensors
        (N, K), M = w.shape, x2.shape[0]
        dy = dy.reshape(M, N).contiguous()
        dx, dw = torch.empty(M, K), torch.empty(N, K)
        DnnlLinear.sgemm(b"N", b"N", M, K, N, dy, N, w, K, dx, K)
        DnnlLinear.sgemm(b"T", b"N", N, K, M, dy, N, x2, K, dw, K)
        return dx.view(ctx.x_shape), dw


def linear(x, w):
    return DnnlLinear.apply(x, w) if DnnlLinear.lib is not None else F.linear(x, w)


class Block(nn.Module):
    def __init__(self, d, heads, d_ff):
        super().__init__()
        self.heads = heads
        self.attn_norm = RMSNorm(d)
        self.q = nn.Linear(d, d, bias=False)
        self.k = nn.Linear(d, d, bias=False)
        self.v = nn.Linear(d, d, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        self.ffn_norm = RMSNorm(d)
        self.gate = nn.Linear(d, d_ff, bias=False)
        self.up = nn.Linear(d, d_ff, bias=False)
        self.down = nn.Linear(d_ff, d, bias=False)

    fused = False  # --fused-qkv: one GEMM for Q/K/V and one for gate/up

    def forward(self, h, cos, sin, mask):
        B, T, d = h.shape
        hd = d // self.heads
        x = self.attn_norm(h)
        split = lambda t: t.view(B, T, self.heads, hd).transpose(1, 2)
        if self.fused:
            qkv = linear(x, torch.cat([self.q.weight, self.k.weight, self.v.weight], 0))
            q, k, v = (split(t) for t in qkv.split(d, -1))
            q, k = rope(q, cos, sin), rope(k, cos, sin)
        else:
            q = rope(split(linear(x, self.q.weight)), cos, sin)
            k = rope(split(linear(x, self.k.weight)), cos, sin)
            v = split(linear(x, self.v.weight))
        s = q @ k.transpose(-2, -1) / math.sqrt(hd) + mask
        a = (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(B, T, d)
        h = h + linear(a, self.o.weight)
        x = self.ffn_norm(h)
        if self.fused:
            g, u = linear(x, torch.cat([self.gate.weight, self.up.weight], 0)).chunk(2, -1)
        else:
            g, u = linear(x, self.gate.weight), linear(x, self.up.weight)
        return h + linear(F.silu(g) * u, self.down.weight)


class Model(nn.Module):
    def __init__(self, L, d, heads, vocab, T):
        super().__init__()
        d_ff = math.ceil(8 * d / 3 / 16) * 16
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList([Block(d, heads, d_ff) for _ in range(L)])
        self.norm = RMSNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, 0.0, 0.02)
        cos, sin = rope_tables(d // heads, T)
        self.register_buffer("cos", cos)
        self.register_buffer("sin", sin)
        self.register_buffer("mask", torch.full((T, T), float("-inf")).triu(1))

    def forward(self, x):
        h = self.embed(x)
        for b in self.blocks:
            h = b(h, self.cos, self.sin, self.mask)
        return linear(self.norm(h), self.head.weight)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip", type=int, default=3, help="untimed warm-up steps")
    ap.add_argument("--fused-qkv", action="store_true",
                    help="one GEMM for Q/K/V and one for gate/up, as depthbench-train")
    ap.add_argument("--set-to-none", action="store_true",
                    help="zero_grad(set_to_none=True): backward stores gradients instead of "
                         "adding into zeroed ones, as depthbench-train")
    ap.add_argument("--micro-batch-threads", type=int, default=1,
                    help="as depthbench-train on the CPU: the batch as this many micro-batches, "
                         "each forward and backward in a Python thread of its own running "
                         "single-threaded ops (they release the GIL), gradients summed in order")
    ap.add_argument("--onednn-gemm", action="store_true",
                    help="every linear layer on oneDNN's sgemm (ctypes), as depthbench-train")
    a = ap.parse_args()
    if a.micro_batch_threads < 1 or a.batch % a.micro_batch_threads:
        ap.error("--micro-batch-threads must be positive and divide --batch")
    Block.fused = a.fused_qkv
    if a.onednn_gemm:
        DnnlLinear.load()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = Model(a.layers, a.d_model, a.heads, 256, a.seq_len)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    g = torch.Generator().manual_seed(0)
    params = list(model.parameters())
    n, pool = a.micro_batch_threads, None
    rows = a.batch // n
    if n > 1:
        # Each worker's ops single-threaded (OpenMP's thread count is per
        # calling thread; OpenBLAS follows it); the optimiser keeps --threads.
        pool = ThreadPoolExecutor(n, initializer=lambda: torch.set_num_threads(1))

    def micro(toks):
        logits = model(toks[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, 256), toks[:, 1:].reshape(-1)) / n
        return loss.detach(), torch.autograd.grad(loss, params)

    rates = []
    for step in range(a.steps):
        tokens = torch.randint(0, 256, (a.batch, a.seq_len + 1), generator=g)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=a.set_to_none)
        if pool is None:
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, 256), tokens[:, 1:].reshape(-1))
            loss.backward()
        else:
            parts = list(pool.map(lambda i: micro(tokens[i * rows:(i + 1) * rows]), range(n)))
            for j, p in enumerate(params):
                p.grad = parts[0][1][j] + parts[1][1][j]
                for part in parts[2:]:
                    p.grad.add_(part[1][j])
            loss = sum(part[0] for part in parts)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss.item()
        dt = time.perf_counter() - t0
        if step >= a.skip:
            rates.append(a.batch * a.seq_len / dt)
    print(json.dumps({"impl": "pytorch", "median_tokens_per_s": statistics.median(rates)}))


if __name__ == "__main__":
    main()
