#!/usr/bin/python3
"""Independent PyTorch reference for the depth probes of spec sections 7 and 9.

Used by tests/diagnostics/probes_golden_test.cc (ProbesGoldenTest). The C++
test writes, into DIR, index.json and the parameters of a few tiny models in
the layout of designs_golden.py (DIR/<model>/<name>.f32). This script, written
from ../shared/spec/DEPTHBENCH.md (not from the C++), rebuilds each model in
float64 with designs_golden.Model's sub-layers and computes, on the same
tokens:

  * the depth states z_0..z_L of the intact model (section 7; AttnRes per the
    section 9 rule: the depth mix at true block boundaries, the plain partial
    sum inside a Block AttnRes group);
  * for every skipped block s (section 9 skip rules: identity for the
    residual designs; AttnRes "next output": nothing added, no freeze, and the
    boundary mix (or the head mix) that would consume the block's output
    returns its newest source unmixed) the skipped states and the loss;
  * the causal matrix in both aggregations (per-token ratios with a 1e-8
    floor, and the ratio of token means);
  * the permutation matrix (section 9 swap rules: weights move; LNS's
    1/sqrt(l) travels with its block; AttnRes: the input-side mixer stays,
    the FFN mixer and the mixer that consumes the block's output move).

Writes DIR/<model>/states.f32 ([L+1, B, T, d] float32) and DIR/probes.json.
Run with Debian's interpreter (python3-torch): /usr/bin/python3 probes_golden.py DIR
"""
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from designs_golden import Model, rmsnorm  # noqa: E402  (shared sub-layers)

torch.set_default_dtype(torch.float64)
FLOOR = 1e-8


class Residual:
    """Pre-LN and LNS, step by step."""

    def __init__(self, m):
        self.m = m

    def begin(self, emb):
        return {"h": emb}

    def apply(self, st, p, w):
        m = self.m
        scale = 1.0 / math.sqrt(w + 1) if m.arch == "lns" else 1.0  # travels with w
        h = st["h"]
        h = h + m.attention(w, m.norm("block_%d.attn_norm" % w, h) * scale)
        h = h + m.ffn(w, m.norm("block_%d.ffn_norm" % w, h) * scale)
        st["h"] = h

    def skip(self, st, p):
        pass

    def state(self, st, l):
        return st["h"]

    def finish(self, st):
        return st["h"]


class AttnRes:
    """Full (b = 1) and Block AttnRes, step by step, with the section 9 rules."""

    def __init__(self, m, b):
        self.m, self.b, self.L = m, b, m.L

    def boundary(self, k):
        return k > 0 and k % self.b == 0

    def begin(self, emb):
        return {"frozen": [emb], "run": None, "last": None, "ident": None}

    @staticmethod
    def sources(st):
        return st["frozen"] + ([st["run"]] if st["run"] is not None else [])

    def output_mixer(self, c):
        # The mixer consuming block c-1's output: block c's attention mixer,
        # the head's for c = L.
        if c == self.L:
            return self.m.p("head_query"), self.m.p("head_key_norm.weight")
        return (self.m.p("block_%d.attn_query" % c), self.m.p("block_%d.attn_key_norm.weight" % c))

    def consumer(self, st, p):
        return self.output_mixer(st["last"] + 1 if st["last"] is not None else p)

    def sublayer(self, st, k, q, g, norm, fn):
        if st["ident"] == k:
            x = self.sources(st)[-1]
            st["ident"] = None
        else:
            x = self.m.mix(self.sources(st), q, g)
        if self.boundary(k) and st["run"] is not None:
            st["frozen"].append(st["run"])
            st["run"] = None
        y = fn(self.m.norm(norm, x))
        st["run"] = y if st["run"] is None else st["run"] + y

    def apply(self, st, p, w):
        m = self.m
        q, g = (None, None) if p == 0 else self.consumer(st, p)
        self.sublayer(st, 2 * p, q, g, "block_%d.attn_norm" % w, lambda x: m.attention(w, x))
        self.sublayer(st, 2 * p + 1, m.p("block_%d.ffn_query" % w),
                      m.p("block_%d.ffn_key_norm.weight" % w), "block_%d.ffn_norm" % w,
                      lambda x: m.ffn(w, x))
        st["last"] = w

    def skip(self, st, p):
        nxt = 2 * (p + 1)
        st["ident"] = nxt if (p + 1 == self.L or self.boundary(nxt)) else None
        st["last"] = None

    def mix_at(self, st, l):
        if st["ident"] == 2 * l:
            return self.sources(st)[-1]
        q, g = self.consumer(st, l)
        return self.m.mix(self.sources(st), q, g)

    def state(self, st, l):
        if l == 0:
            return st["frozen"][0]
        if l < self.L and not self.boundary(2 * l):
            return self.sources(st)[-1]
        return self.mix_at(st, l)

    def finish(self, st):
        return self.mix_at(st, self.L)


def walk(design, m, emb, order=None, skip=None):
    """Returns (states z_0..z_L, final hidden before the final norm)."""
    st = design.begin(emb)
    states = [design.state(st, 0)]
    for p in range(m.L):
        if p == skip:
            design.skip(st, p)
        else:
            design.apply(st, p, order[p] if order else p)
        states.append(design.state(st, p + 1))
    return states, design.finish(st)


def causal(base, skipped, s, form):
    row = [None] * len(base[1:])
    for l in range(s + 1, len(base) - 1):
        d = base[l + 1] - base[l]
        ds = skipped[l + 1] - skipped[l]
        num = (ds - d).norm(dim=-1)
        den = d.norm(dim=-1)
        if form == "per_token":
            row[l] = float((num / den.clamp_min(FLOOR)).mean())
        else:
            row[l] = float(num.mean() / den.mean())
    return row


def main(root):
    with open(os.path.join(root, "index.json")) as f:
        index = json.load(f)
    B, T = index["batch"], index["seq_len"]
    tokens = torch.tensor(index["tokens"], dtype=torch.long).view(B, T + 1)
    inputs, targets = tokens[:, :T], tokens[:, 1:]
    out = {}
    for name, entry in index["models"].items():
        folder = os.path.join(root, name)
        params = {}
        for p in entry["params"]:
            a = np.fromfile(os.path.join(folder, p["name"] + ".f32"), dtype="<f4")
            params[p["name"]] = torch.tensor(a.astype(np.float64).reshape(p["shape"]))
        m = Model(entry, params)
        L = m.L
        if m.arch in ("pre_ln", "lns"):
            design = Residual(m)
        elif m.arch == "attnres_full":
            design = AttnRes(m, 1)
        elif m.arch == "attnres_block":
            design = AttnRes(m, max(1, 2 * L // 8))
        else:
            raise ValueError(m.arch)
        emb = params["embed.weight"][inputs]

        def loss_of(hidden):
            logits = m.norm("final_norm", hidden) @ params["head.weight"].T
            return float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)))

        base, hidden = walk(design, m, emb)
        base_loss = loss_of(hidden)
        torch.stack(base).numpy().astype("<f4").tofile(os.path.join(folder, "states.f32"))
        res = {"base_loss": base_loss, "pruning_loss": [],
               "causal_per_token": [[None] * L for _ in range(L)],
               "causal_ratio_of_means": [[None] * L for _ in range(L)],
               "permutation": [[None] * L for _ in range(L)]}
        for s in range(L):
            skipped, hidden = walk(design, m, emb, skip=s)
            res["pruning_loss"].append(loss_of(hidden))
            if s + 1 < L:
                res["causal_per_token"][s] = causal(base, skipped, s, "per_token")
                res["causal_ratio_of_means"][s] = causal(base, skipped, s, "ratio_of_means")
        for l1 in range(L):
            for l2 in range(l1 + 1, L):
                order = list(range(L))
                order[l1], order[l2] = l2, l1
                _, hidden = walk(design, m, emb, order=order)
                res["permutation"][l1][l2] = abs(loss_of(hidden) - base_loss) / base_loss
        out[name] = res
        print("%s: base loss %.6f" % (name, base_loss))
    with open(os.path.join(root, "probes.json"), "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main(sys.argv[1])
