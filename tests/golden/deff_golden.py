#!/usr/bin/python3
"""Golden values for effective depth D_eff (spec section 7), from NumPy.

Writes, next to this script:
  deff_states.npy     float32 (L, N, d) pooled states: a residual-like stream
                      h_l = h_{l-1} + u_l with fixed-seed Gaussian updates
  deff_expected.json  CKA matrix, lag profile, D_eff (K = L-1 and K = 2),
                      D_eff / L, rho_bar(1), F_L, gap_pct

Independent of the C++ code: linear CKA in the feature form
||Y^T X||_F^2 / (||X^T X||_F ||Y^T Y||_F) on column-centred float64 copies
(the C++ side takes the N x N Gram form when N <= d, as here).

Run with Debian's interpreter (it has numpy):  /usr/bin/python3 deff_golden.py
"""
import json
import os

import numpy as np

L, N, D = 6, 12, 16
SEED = 20260501


def cka(x, y):
    x = x - x.mean(axis=0, keepdims=True)
    y = y - y.mean(axis=0, keepdims=True)
    num = np.linalg.norm(y.T @ x, "fro") ** 2
    return num / (np.linalg.norm(x.T @ x, "fro") * np.linalg.norm(y.T @ y, "fro"))


def deff(states, max_lag):
    n_layers = states.shape[0]
    rho = np.array([[cka(states[i], states[j]) for j in range(n_layers)]
                    for i in range(n_layers)])
    lag = [float(np.mean([rho[i, i + k] for i in range(n_layers - k)]))
           for k in range(n_layers)]
    s = sum((1.0 - k / n_layers) * lag[k] for k in range(1, max_lag + 1))
    d = n_layers / (1.0 + 2.0 * s)
    f_l = 2.0 * n_layers / (n_layers + 1.0)
    return {
        "max_lag": max_lag,
        "deff": d,
        "deff_over_l": d / n_layers,
        "rho_bar1": lag[1],
        "f_l": f_l,
        "gap_pct": 100.0 * (f_l - d) / f_l,
        "lag_profile": lag,
        "cka": rho.tolist(),
    }


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    rng = np.random.RandomState(SEED)
    h = rng.randn(N, D)
    layers = []
    for _ in range(L):
        h = h + 0.8 * rng.randn(N, D)
        layers.append(h.copy())
    states = np.stack(layers).astype(np.float32)
    np.save(os.path.join(here, "deff_states.npy"), states)
    x = states.astype(np.float64)
    expected = {
        "generator": "tests/golden/deff_golden.py",
        "shape": [L, N, D],
        "full": deff(x, L - 1),
        "lag2": deff(x, 2),
    }
    with open(os.path.join(here, "deff_expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
