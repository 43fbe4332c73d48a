from __future__ import annotations

import numpy as np

from gramcheck import variants as V
from gramcheck.featuremaps import random_projection
from gramcheck.precision import round_to


def make_inputs(variant, *, B=1, H=2, N=24, d=8, dtype="float64", seed=0, m=16):
    """Seeded Gaussian inputs rounded to ``dtype`` (returned as float64) plus the variant's extras."""
    rng = np.random.default_rng(seed)
    q, k, v = (round_to(rng.standard_normal((B, H, N, d)), dtype) for _ in range(3))
    extras = {}
    var = V.get(variant)
    if "g" in var.inputs:
        extras["g"] = round_to(-np.abs(rng.standard_normal((B, H, N, d))) * 0.3, dtype)
    if "projection" in var.inputs:
        extras["projection"] = round_to(random_projection(m, d, kind="orf", seed=seed + 1), dtype)
    return q, k, v, extras


def causal_modes(variant):
    return [True] if "causal-only" in V.get(variant).declares else [False, True]


def to_torch(x, dtype):
    import torch

    return torch.as_tensor(x).to(getattr(torch, dtype))
