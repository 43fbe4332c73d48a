from __future__ import annotations

import numpy as np

from gramcheck import variants as V
from gramcheck.inputs import draw_extras
from gramcheck.precision import round_to


def make_inputs(variant, *, B=1, H=2, N=24, d=8, dtype="float64", seed=0, m=16):
    """Seeded Gaussian inputs rounded to ``dtype`` (returned as float64) plus the variant's extras."""
    rng = np.random.default_rng(seed)
    q, k, v = (round_to(rng.standard_normal((B, H, N, d)), dtype) for _ in range(3))
    dims = {"B": B, "H": H, "N": N, "dk": d, "dv": d, "m": m}
    return q, k, v, draw_extras(V.get(variant).inputs, dims, dtype=dtype, seed=seed + 1)


def causal_modes(variant):
    return [True] if "causal-only" in V.get(variant).declares else [False, True]


def to_torch(x, dtype):
    import torch

    return torch.as_tensor(x).to(getattr(torch, dtype))
