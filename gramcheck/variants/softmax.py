"""Softmax attention: O = softmax(s Q K^T) V, s = 1/sqrt(d) by default; causal masks j > i.

Rows of the weight matrix are positive and sum to one, so every output lies in the convex hull of the
values (proofs/invariants.md).
"""

from __future__ import annotations

import math
from typing import Any

from ..arith import F64
from ..forms import accumulation_dtype
from ..hyperparams import scale_value
from ..torch_arith import TORCH
from .common import attention_matrix, causal_keep, masked_softmax
from .spec import Variant

# softmax weights: rows of a stochastic matrix, so every output is in the convex hull of the values and
# the Jacobian bounds of proofs/jacobian-bounds.md apply with respect to q, k and v
ROW_STOCHASTIC = frozenset({"normalised-rows", "convex-hull", "linear-in-v", "jacobian-qk"})


def jacobian(var: Any, q: Any, k: Any, v: Any, *, causal: bool, params: Any, extras: Any) -> dict[str, float]:
    """||dO/dV|| <= sqrt(||P||_1 ||P||_inf), ||dO/dQ||, ||dO/dK|| by the covariance bounds (one (b, h) slice)
    for any softmax over logits s q.k (the blocked DiagAttention too: P carries its mask)."""
    from .. import bounds

    p = attention_matrix(var, q, k, causal=causal, params=params, extras=extras)[0, 0]
    s = var.scale(params, q.shape[-1])
    q0, k0, v0 = q[0, 0], k[0, 0], v[0, 0]
    return {
        "v": bounds.jacobian_v_bound(p),
        "q": bounds.softmax_jacobian_q_bound(p, k0, v0, s),
        "k": bounds.softmax_jacobian_k_bound(p, q0, v0, s),
    }


def reference(ar: Any, q: Any, k: Any, v: Any, *, causal: bool, scale: Any) -> Any:
    s = scale_value(ar, scale, q.shape[-1])
    return _attend(ar, ar.matmul(q, ar.mT(k)) * s, v, causal)


def scaled_queries(ar: Any, q: Any, k: Any, v: Any, *, causal: bool, scale: Any) -> Any:
    """softmax((s Q) K^T) V: the scale applied to the queries before the product (xformers' and many
    models' attention), whose logits stay in range where Q K^T alone overflows float16."""
    s = scale_value(ar, scale, q.shape[-1])
    return _attend(ar, ar.matmul(q * s, ar.mT(k)), v, causal)


def split_scale(ar: Any, q: Any, k: Any, v: Any, *, causal: bool, scale: Any) -> Any:
    """softmax((sqrt(s) Q) (sqrt(s) K)^T) V: torch's math reference of scaled_dot_product_attention."""
    r = ar.sqrt(ar.const(scale_value(F64, scale, q.shape[-1])))
    return _attend(ar, ar.matmul(q * r, ar.mT(k * r)), v, causal)


def default_scaled(ar: Any, q: Any, k: Any, v: Any, *, causal: bool, scale: Any) -> Any:
    """softmax(((s / s_0) Q) K^T s_0) V, s_0 = 1/sqrt(d): a custom scale passed to a kernel that applies its
    default only, by rescaling the queries first (x-transformers' flash path since PR #244; fused kernels
    without a scale argument). The same as the definition where s = s_0; elsewhere the queries' rounding
    moves large logits more than the definition's does (5 times, float32, anti-aligned keys of 113)."""
    s0 = 1.0 / math.sqrt(q.shape[-1])
    ratio = scale_value(F64, scale, q.shape[-1]) / s0
    return _attend(ar, ar.matmul(q * ar.const(ratio), ar.mT(k)) * ar.const(s0), v, causal)


def _attend(ar: Any, logits: Any, v: Any, causal: bool) -> Any:
    keep = causal_keep(logits.shape[-1]) if causal else None
    return ar.matmul(masked_softmax(ar, logits, keep), v)


def torch_forward(q: Any, k: Any, v: Any, *, causal: bool, form: str, chunk_size: int, scale: Any) -> Any:
    """The logits, the softmax and P V in the float32 accumulators, stored once, as fused kernels keep them
    (a float16 logit of -1e6 is -inf, and a row of them 0/0 where the output is v)."""
    import torch

    acc = accumulation_dtype(q)
    s = scale_value(TORCH, scale, q.shape[-1])
    logits = (q.to(acc) * s) @ k.to(acc).transpose(-1, -2)  # scaled first, as ``scaled_queries``
    if causal:
        n = q.shape[-2]
        mask = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        logits = logits.masked_fill(~mask, -math.inf)
    return (torch.softmax(logits, dim=-1) @ v.to(acc)).to(v.dtype)


VARIANTS = [
    Variant(
        name="softmax",
        family="softmax",
        summary="softmax(Q K^T / sqrt(d)) V, the quadratic baseline",
        source="Vaswani et al. 2017",
        params={"scale": None},
        forms=("parallel",),
        declares=frozenset({"causal", "permutation-equivariant", "materialises-nxn"}) | ROW_STOCHASTIC,
        reference_fn=reference,
        torch_fn=torch_forward,
        jacobian_fn=jacobian,
        algorithms_fn=(scaled_queries, split_scale, default_scaled),
    )
]
