"""Softmax attention: O = softmax(s Q K^T) V, s = 1/sqrt(d) by default; causal masks j > i.

Rows of the weight matrix are positive and sum to one, so every output lies in the convex hull of the
values (shared/BOUNDS.md, Softmax attention).
"""

from __future__ import annotations

import math
from typing import Any

from .common import causal_keep, masked_softmax
from .spec import Variant


def reference(ar: Any, q: Any, k: Any, v: Any, *, causal: bool, scale: float | None) -> Any:
    s = 1.0 / ar.sqrt(ar.const(q.shape[-1])) if scale is None else scale
    logits = ar.matmul(q, ar.mT(k)) * s
    keep = causal_keep(q.shape[-2]) if causal else None
    return ar.matmul(masked_softmax(ar, logits, keep), v)


def torch_forward(q: Any, k: Any, v: Any, *, causal: bool, form: str, chunk_size: int, scale: float | None) -> Any:
    import torch

    s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    logits = (q @ k.transpose(-1, -2)) * s
    if causal:
        n = q.shape[-2]
        mask = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        logits = logits.masked_fill(~mask, -math.inf)
    return torch.softmax(logits, dim=-1) @ v


VARIANTS = [
    Variant(
        name="softmax",
        family="softmax",
        summary="softmax(Q K^T / sqrt(d)) V, the quadratic baseline",
        source="Vaswani et al. 2017",
        params={"scale": None},
        forms=("parallel",),
        declares=frozenset({"causal", "normalised-rows", "convex-hull", "permutation-equivariant", "materialises-nxn"}),
        reference_fn=reference,
        torch_fn=torch_forward,
    )
]
