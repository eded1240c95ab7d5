#!/usr/bin/python3
"""Independent PyTorch re-implementation of the ten DepthBench residual designs.

Used by tests/trainer_core/designs_test.cc (DesignGoldenTest): the C++ test
writes, into DIR, index.json (tokens, and per model: arch, shape, parameter
names and shapes) and one raw little-endian float32 file per parameter
(DIR/<model>/<name>.f32). This script rebuilds each model from the spec
(docs/DEPTHBENCH.md sections 2, 3, 9) in float64, computes the
logits and takes one AdamW step (lr 1e-3, betas 0.9/0.95, eps 1e-8, weight
decay 0.1 on the decay group, 0 on the no-decay group, chosen here from the
spec: HC static routing (the tanh gains decay), mHC biases and gains do not
decay), and
writes DIR/<model>/out_logits.f32, DIR/<model>/grad_<name>.f32 (gradients
before the step) and DIR/<model>/out_<name>.f32 (parameters after it).

Run with Debian's interpreter (python3-torch): /usr/bin/python3 designs_golden.py DIR
"""
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

torch.set_default_dtype(torch.float64)
EPS = 1e-6


def rms(x, eps=EPS):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


def rmsnorm(x, g):
    return rms(x) * g


def rope(x):
    # x [B, H, T, hd], pairs (i, i + hd/2), base 10000.
    T, hd = x.shape[2], x.shape[3]
    half = hd // 2
    inv = 10000.0 ** (-torch.arange(0, half, dtype=torch.float64) * 2.0 / hd)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], -1)
    x1, x2 = x[..., :half], x[..., half:]
    return x * ang.cos() + torch.cat([-x2, x1], -1) * ang.sin()


class Model:
    def __init__(self, entry, params):
        self.arch = entry["arch"]
        self.code_form = entry["hc_code_form"]
        s = entry["shape"]
        self.L, self.d, self.H, self.KV = s["layers"], s["d_model"], s["heads"], s["kv_heads"]
        self.hd = self.d // self.H
        self.n = s["streams"]
        self.P = params

    def p(self, name):
        return self.P["design." + name]

    # ---- shared sub-layers ----
    def heads(self, x, n):
        B, T, _ = x.shape
        return x.view(B, T, n, self.hd).transpose(1, 2)

    def expand(self, kv):
        return kv.repeat_interleave(self.H // self.KV, dim=1)

    def attention(self, l, x, depth=None, want_kv=False):
        pre = "block_%d.attn." % l
        B, T, _ = x.shape
        q = rope(self.heads(x @ self.p(pre + "q_proj.weight").T, self.H))
        k = self.expand(rope(self.heads(x @ self.p(pre + "k_proj.weight").T, self.KV)))
        v = self.expand(self.heads(x @ self.p(pre + "v_proj.weight").T, self.KV))
        scale = 1.0 / math.sqrt(self.hd)
        mask = torch.triu(torch.full((T, T), float("-inf")), 1)
        scores = q @ k.transpose(-1, -2) * scale + mask
        if depth:
            dk = torch.stack([a for a, _ in depth], 3)  # [B,H,T,S,hd]
            dv = torch.stack([b for _, b in depth], 3)
            ds = torch.einsum("bhtd,bhtsd->bhts", q, dk) * scale
            pr = torch.softmax(torch.cat([scores, ds], -1), -1)
            out = pr[..., :T] @ v + torch.einsum("bhts,bhtsd->bhtd", pr[..., T:], dv)
        else:
            out = torch.softmax(scores, -1) @ v
        out = out.transpose(1, 2).reshape(B, T, self.d) @ self.p(pre + "o_proj.weight").T
        return (out, (k, v)) if want_kv else out

    def ffn(self, l, x):
        pre = "block_%d.ffn." % l
        g = x @ self.p(pre + "gate_proj.weight").T
        u = x @ self.p(pre + "up_proj.weight").T
        return (F.silu(g) * u) @ self.p(pre + "down_proj.weight").T

    def norm(self, name, x):
        return rmsnorm(x, self.p(name + ".weight"))

    def sub(self, l, which, x):
        """Pre-normalised sub-layer `which` of block l on x."""
        if which == "attn":
            return self.attention(l, self.norm("block_%d.attn_norm" % l, x))
        return self.ffn(l, self.norm("block_%d.ffn_norm" % l, x))

    # ---- designs ----
    def body(self, h):
        L = self.L
        a = self.arch
        if a in ("pre_ln", "sandwich_ln", "lns"):
            for l in range(L):
                for w in ("attn", "ffn"):
                    xin = self.norm("block_%d.%s_norm" % (l, w), h)
                    if a == "lns":
                        xin = xin / math.sqrt(l + 1)
                    y = self.attention(l, xin) if w == "attn" else self.ffn(l, xin)
                    if a == "sandwich_ln":
                        y = self.norm("block_%d.%s_out_norm" % (l, w), y)
                    h = h + y
            return h
        if a == "deepnorm":
            alpha = (2.0 * L) ** 0.25
            for l in range(L):
                h = F.layer_norm(alpha * h + self.attention(l, h), (self.d,),
                                 self.p("block_%d.attn_post_norm.weight" % l), None, 1e-5)
                h = F.layer_norm(alpha * h + self.ffn(l, h), (self.d,),
                                 self.p("block_%d.ffn_post_norm.weight" % l), None, 1e-5)
            return h
        if a == "keel":
            alpha = 2.0 * L
            for l in range(L):
                if l == 0:
                    h = h + self.sub(0, "attn", h)
                    h = self.norm("block_0.ffn_post_norm", h + self.sub(0, "ffn", h))
                else:
                    h = self.norm("block_%d.attn_post_norm" % l, alpha * h + self.sub(l, "attn", h))
                    h = self.norm("block_%d.ffn_post_norm" % l, alpha * h + self.sub(l, "ffn", h))
            return h
        if a == "moda":
            cache = []
            for l in range(L):
                x = self.norm("block_%d.attn_norm" % l, h)
                y, kv = self.attention(l, x, depth=cache, want_kv=True)
                h = h + y
                x = self.norm("block_%d.ffn_norm" % l, h)
                h = h + self.ffn(l, x)
                if l < L - 1:
                    cache.append(kv)
                    k = x @ self.p("block_%d.ffn_depth_k.weight" % l).T
                    v = x @ self.p("block_%d.ffn_depth_v.weight" % l).T
                    cache.append((self.expand(rope(self.heads(k, self.KV))),
                                  self.expand(self.heads(v, self.KV))))
            return h
        raise ValueError(a)

    def hc(self, h_streams):
        # h_streams: [B, T, n, d]
        H = h_streams
        for l in range(self.L):
            for w in ("attn", "ffn"):
                pre = "block_%d.%s_hc." % (l, w)
                hn = rms(H)
                A = self.p(pre + "static_a") + self.p(pre + "gain_a") * torch.tanh(hn @ self.p(pre + "dynamic_a"))
                b = self.p(pre + "static_b") + self.p(pre + "gain_b") * torch.tanh(hn @ self.p(pre + "dynamic_b"))[..., 0]
                x = torch.einsum("btn,btnd->btd", A[..., 0], H)
                y = self.sub(l, w, x)
                if self.code_form:
                    res = H
                else:
                    res = torch.einsum("btrs,btrd->btsd", A[..., 1:], H)
                H = res + b[..., None] * y[:, :, None, :]
        return H.sum(2)

    def mhc(self, H):
        n = self.n
        for l in range(self.L):
            for w in ("attn", "ffn"):
                pre = "block_%d.%s_mhc." % (l, w)
                B, T = H.shape[:2]
                x = rms(H.reshape(B, T, -1))
                g = self.p(pre + "gains")
                proj = x @ self.p(pre + "phi")
                bias = self.p(pre + "bias")
                read = torch.sigmoid(g[0] * proj[..., :n] + bias[:n])
                write = 2 * torch.sigmoid(g[1] * proj[..., n:2 * n] + bias[n:2 * n])
                z = (g[2] * proj[..., 2 * n:] + bias[2 * n:]).view(B, T, n, n)
                # Sinkhorn-Knopp in the plain domain, eps 1e-6 in the sums.
                M = torch.exp(z)
                for _ in range(20):
                    M = M / (M.sum(-1, keepdim=True) + 1e-6)
                    M = M / (M.sum(-2, keepdim=True) + 1e-6)
                xin = torch.einsum("btn,btnd->btd", read, H)
                y = self.sub(l, w, xin)
                H = torch.einsum("btrs,btrd->btsd", M, H) + write[..., None] * y[:, :, None, :]
        return H.mean(2)

    def mix(self, sources, query, gain):
        if len(sources) == 1:
            return sources[0]
        V = torch.stack(sources, 0)
        if query is None:
            p = torch.full(V.shape[:3], 1.0 / len(sources))
        else:
            p = torch.softmax((rmsnorm(V, gain) * query).sum(-1), 0)
        return (p[..., None] * V).sum(0)

    def attnres(self, emb, block_size):
        # Sources: embedding, frozen sums, current running sum (None if empty).
        frozen, run = [emb], None
        for k in range(2 * self.L):
            l, w = k // 2, ("attn" if k % 2 == 0 else "ffn")
            srcs = frozen + ([run] if run is not None else [])
            q = None if k == 0 else self.p("block_%d.%s_query" % (l, w))
            g = None if k == 0 else self.p("block_%d.%s_key_norm.weight" % (l, w))
            x = self.mix(srcs, q, g)
            if k > 0 and k % block_size == 0 and run is not None:
                frozen.append(run)
                run = None
            y = self.sub(l, w, x)
            run = y if run is None else run + y
        srcs = frozen + ([run] if run is not None else [])
        return self.mix(srcs, self.p("head_query"), self.p("head_key_norm.weight"))

    def forward(self, tokens):
        emb = self.P["embed.weight"][tokens]
        a = self.arch
        if a == "hc":
            h = self.hc(emb[:, :, None, :].expand(-1, -1, self.n, -1))
        elif a == "mhc":
            h = self.mhc(emb[:, :, None, :].expand(-1, -1, self.n, -1))
        elif a == "attnres_full":
            h = self.attnres(emb, 1)
        elif a == "attnres_block":
            h = self.attnres(emb, max(1, 2 * self.L // 8))
        else:
            h = self.body(emb)
        return self.norm("final_norm", h) @ self.P["head.weight"].T


def no_decay(arch, name):
    leaf = name.split(".")[-1]
    if arch == "hc":
        return leaf in ("static_a", "static_b")  # the tanh gains decay
    if arch == "mhc":
        return leaf in ("bias", "gains")
    return False


FOLLOW_STEPS = 3


def main(root):
    with open(os.path.join(root, "index.json")) as f:
        index = json.load(f)
    B, T = index["batch"], index["seq_len"]
    tokens = torch.tensor(index["tokens"], dtype=torch.long).view(B, T + 1)
    inputs, targets = tokens[:, :T], tokens[:, 1:]
    for name, entry in index["models"].items():
        folder = os.path.join(root, name)
        params = {}
        for p in entry["params"]:
            a = np.fromfile(os.path.join(folder, p["name"] + ".f32"), dtype="<f4")
            params[p["name"]] = torch.tensor(a.astype(np.float64).reshape(p["shape"]), requires_grad=True)
        model = Model(entry, params)
        logits = model.forward(inputs)
        logits.detach().numpy().astype("<f4").tofile(os.path.join(folder, "out_logits.f32"))
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        loss.backward()
        decay = [p for n, p in params.items() if not no_decay(entry["arch"], n)]
        nodecay = [p for n, p in params.items() if no_decay(entry["arch"], n)]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                 {"params": nodecay, "weight_decay": 0.0}],
                                lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
        for n, p in params.items():
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            g.detach().numpy().astype("<f4").tofile(os.path.join(folder, "grad_" + n + ".f32"))
        opt.step()
        for n, p in params.items():
            p.detach().numpy().astype("<f4").tofile(os.path.join(folder, "out_" + n + ".f32"))
        # Steps 2..1+FOLLOW_STEPS of the recipe on the same batch: loss,
        # global-norm clipping at 1.0 (the norm before clipping), AdamW.
        losses, norms = [], []
        for _ in range(FOLLOW_STEPS):
            opt.zero_grad()
            step_loss = F.cross_entropy(model.forward(inputs).reshape(-1, logits.shape[-1]),
                                        targets.reshape(-1))
            step_loss.backward()
            norms.append(float(torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)))
            opt.step()
            losses.append(step_loss.item())
        with open(os.path.join(folder, "steps.json"), "w") as f:
            json.dump({"losses": losses, "grad_norms": norms}, f)
        print("%s: loss %.6f, then %s" % (name, loss.item(), " ".join("%.6f" % l for l in losses)))


if __name__ == "__main__":
    main(sys.argv[1])
