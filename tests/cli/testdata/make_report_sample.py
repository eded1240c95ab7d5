#!/usr/bin/python3
"""Writes report_sample.json: a small synthetic results document (schema
depthbench.results.v1) for the report tests and for eyeballing the figures.
Values are made up (shaped like the paper's 400M numbers), not measured."""
import json
import math
import os

import numpy as np

rng = np.random.RandomState(7)
ARCHS = {  # arch -> val loss at L = 4, 6, 8 (illustrative)
    "pre_ln": [2.759, 2.770, 2.782],
    "full_attnres": [2.751, 2.735, 2.718],
    "hc": [2.729, 2.712, 2.699],
}
SHAPES = [(4, 256), (6, 208), (8, 176)]
LRS = [0.001, 0.002, 0.004]


def angular(L, smooth):
    m = [[None] * (L + 1) for _ in range(L + 1)]
    for l in range(L):
        for n in range(1, L - l + 1):
            m[l][n] = round(min(0.5, (0.05 + 0.3 * (l == 0)) * n ** smooth
                                + 0.01 * rng.rand()), 4)
    return m


def upper(L, scale):
    m = [[None] * L for _ in range(L)]
    for a in range(L):
        for b in range(a + 1, L):
            m[a][b] = round(float(scale * rng.rand() * math.exp(-(b - a) / L)
                                  + (0.6 if a == 0 else 0.0)), 4)
    return m


rows, curves = [], {}
for arch, losses in ARCHS.items():
    for (L, d), loss in zip(SHAPES, losses):
        run = f"{arch}-L{L}-lr0.002"
        lr_losses = {str(lr): round(loss + abs(math.log2(lr / 0.002)) * 0.03, 4)
                     for lr in LRS}
        lr_losses["0.002"] = loss
        if arch == "hc" and L == 8:
            lr_losses["0.004"] = None  # diverged
        rows.append({
            "arch": arch, "layers": L, "d_model": d,
            "params": int(12 * L * d * d + 2 * 256 * d),
            "best_lr": 0.002, "val_loss": loss, "run_id": run,
            "lr_losses": lr_losses,
            "diagnostics": {
                "r_causal": {"pre_ln": 0.01, "full_attnres": 0.16, "hc": 0.07}[arch],
                "r_perm": {"pre_ln": 0.08, "full_attnres": 0.46, "hc": 0.35}[arch],
                "deff_over_l": round(0.3 + 0.1 * rng.rand(), 4),
                "angular": angular(L, 0.5 if arch == "pre_ln" else 0.8),
                "causal": upper(L, 0.2 if arch == "pre_ln" else 0.7),
                "perm": upper(L, 0.1 if arch == "pre_ln" else 0.4),
            },
        })
        steps = np.arange(0, 201, 10)
        curves[run] = [[int(s), round(float(loss + 8.0 * math.exp(-s / 25.0)
                                           + 0.02 * rng.randn()), 4)]
                       for s in steps]
rows.append({"arch": "deepnorm", "layers": 8, "d_model": 176,
             "best_lr": None, "val_loss": None,
             "lr_losses": {"0.001": None, "0.002": None}})

doc = {"schema": "depthbench.results.v1", "sweep": "demo", "rows": rows,
       "curves": curves}
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "report_sample.json"), "w") as f:
    json.dump(doc, f)
    f.write("\n")
