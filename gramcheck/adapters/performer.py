"""performer-pytorch's FastAttention (softmax kernel, non-causal) behind gramcheck's calling convention.

The random matrix is passed in as ``projection`` (m, d) and copied into the module's
``projection_matrix`` buffer, so the reference evaluates the same draw. performer-pytorch's
``softmax_kernel`` scales data by d^-1/4, subtracts the (detached) maximum of w.x (queries per token,
keys over tokens and features) and adds eps = 1e-4 to every feature: gramcheck's performer-positive with
feature_eps = 1e-4 and shift = 'projection' is the same definition. Causal mode is not adapted: its
``causal_linear_attention_noncuda`` adds 1e-6 to every feature of the key prefix sums, a denominator
term no gramcheck variant defines (its Findings would report that difference, not a bug).
"""

from __future__ import annotations

import importlib.util
from typing import Any

VARIANT = "performer-positive"
PARAMS = {"feature_eps": 1e-4, "shift": "projection"}


def available() -> bool:
    return importlib.util.find_spec("performer_pytorch") is not None


def fast_attention(q: Any, k: Any, v: Any, *, causal: bool = False, projection: Any) -> Any:
    """FastAttention(dim_heads=d, nb_features=m) on (B, H, N, d) with the given projection (m, d)."""
    import torch
    from performer_pytorch import FastAttention

    if causal:
        raise ValueError("causal: got True; the performer-pytorch adapter is non-causal only (see module docstring)")
    m, d = projection.shape
    attn = FastAttention(dim_heads=d, nb_features=m, causal=False).to(device=q.device, dtype=q.dtype)
    with torch.no_grad():
        attn.projection_matrix.copy_(projection.to(dtype=attn.projection_matrix.dtype))
    return attn(q, k, v)
