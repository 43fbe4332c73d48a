"""The README's main job: check every built-in variant's torch forms against the oracle."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from . import variants as _variants
from .agreement import check_agreement
from .featuremaps import random_projection
from .findings import Finding
from .precision import round_to


def demo_inputs(
    variant: Any, *, dtype: str, B: int = 1, H: int = 2, N: int = 32, d: int = 8, m: int = 16, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Seeded Gaussian q, k, v (B, H, N, d) representable in ``dtype``, plus the variant's extra inputs
    (log-decays in [-0.5, 0), an orthogonal random matrix (m, d))."""
    var = _variants.get(variant)
    rng = np.random.default_rng(seed)
    q, k, v = (round_to(rng.standard_normal((B, H, N, d)), dtype) for _ in range(3))
    if var.name == "linear-relu":  # keep relu denominators away from zero for the agreement check
        q, k = np.abs(q) + round_to(np.full_like(q, 0.25), dtype), np.abs(k) + round_to(np.full_like(k, 0.25), dtype)
    extras: dict[str, np.ndarray] = {}
    if "g" in var.inputs:
        extras["g"] = round_to(-rng.uniform(1e-3, 0.5, (B, H, N, d)), dtype)
    if "projection" in var.inputs:
        extras["projection"] = round_to(random_projection(m, d, kind="orf", seed=seed + 1), dtype)
    return q, k, v, extras


def run_demo(dtypes: tuple[str, ...] = ("float32", "float64"), seed: int = 0, chunk_size: int = 8) -> Iterator[Finding]:
    """One reference-agreement Finding per (variant, form, causal mode, dtype)."""
    import torch

    for var in _variants.list():
        modes = [True] if "causal-only" in var.declares else [False, True]
        for dtype in dtypes:
            q, k, v, ex = demo_inputs(var, dtype=dtype, seed=seed)
            tt = {n: torch.as_tensor(x).to(getattr(torch, dtype)) for n, x in ex.items()}
            args = [torch.as_tensor(x).to(getattr(torch, dtype)) for x in (q, k, v)]
            for causal in modes:
                for form in var.forms_for(causal):
                    out = var.torch(*args, causal=causal, form=form, chunk_size=chunk_size, **tt)
                    name = f"agreement[{var.name}/{form}/{'causal' if causal else 'full'}/{dtype}]"
                    f = check_agreement(name, out.double().numpy(), var, q, k, v, causal=causal, dtype=dtype, **ex)
                    f.details.update(variant=var.name, form=form, causal=causal)
                    yield f
