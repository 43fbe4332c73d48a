"""Based's linear attention (Arora et al. 2024, "Simple linear attention language models balance the
recall-throughput tradeoff"): normalised linear attention with the 2nd-order Taylor feature map of exp.

    phi(x) = [1, x / d^{1/4}, vec(x x^T) / (sqrt(2) sqrt(d))]        (feature dim 1 + d + d^2)
    phi(q) . phi(k) = 1 + z + z^2 / 2,   z = q . k / sqrt(d)
    o_i = sum_j A_ij v_j / (sum_j A_ij + eps),   A_ij = phi(q_i) . phi(k_j)   (causal: j <= i)

``scale`` (default None: d^-1/2) is the factor of z: x is scaled by sqrt(scale) before the map. d is the
(small) feature dimension the layer projects q and k to (16 in the paper); the projection is the caller's.
The kernel 1 + z + z^2/2 = ((1 + z)^2 + 1)/2 >= 1/2, so every denominator is at least n_i / 2 for n_i
keys (proofs/based-normaliser.md; ``normaliser_lower_bound``): the rows are convex combinations and never
undefined. The torch forms are one pass of gramcheck.forms over [V, 1] (as every normalised linear
variant).

The sliding-window softmax is not part of this variant: in Based it is a separate layer type (small-window
softmax attention layers interleaved with the linear-attention and gated-convolution layers), not a term
added inside the linear attention, and fla's based op (fla/ops/based) implements the Taylor linear
attention alone. A windowed softmax is the ``softmax`` variant with a banded mask.

Where fla differs (fla/ops/based/naive.py): ``naive_parallel_based`` computes the same kernel 1 + z + z^2/2
directly from z (quadratic, causal only) and divides by (sum + 1e-6) (``eps`` here defaults to 0, the
definition; eps = 1e-6 reproduces it); ``naive_chunk_based`` needs N to be a multiple of its chunk (256)
and has the same 1e-6; layout (B, H, T, D) and computation in the input dtype. No state passing is
offered: the state is (phi(K)^T [V, 1]) of size (1 + d + d^2) x (d_v + 1), not the (d_k, d_v) state of the
conventions.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..forms import accumulation_dtype
from ..torch_arith import TORCH
from .common import causal_keep, ref_normalised, torch_normalised
from .spec import Variant


def taylor_features(ar: Any, x: Any, scale: float | None = None) -> Any:
    """phi(x) (B, H, N, 1 + d + d^2) = [1, x', vec(x' x'^T) / sqrt(2)] with x' = x sqrt(scale)
    (scale None: x' = x / d^{1/4}), so that phi(q) . phi(k) = 1 + z + z^2/2, z = scale q . k."""
    B, H, N, d = x.shape
    xs = x / ar.sqrt(ar.sqrt(ar.const(d))) if scale is None else x * ar.sqrt(ar.const(scale))
    quad = (xs[..., :, None] * xs[..., None, :]).reshape(B, H, N, d * d) / ar.sqrt(ar.const(2.0))
    if getattr(ar, "name", "") == "torch":
        one = x.new_ones(B, H, N, 1)
    else:
        one = ar.asarray(np.ones((B, H, N, 1)))
    return ar.concat([one, xs, quad], axis=-1)


def normaliser_lower_bound(n_keys: Any) -> Any:
    """den_i >= n_i / 2: each kernel value 1 + z + z^2/2 is at least 1/2 (equality iff z = -1)."""
    return np.asarray(n_keys, dtype=np.float64) / 2.0


def key_counts(n: int, causal: bool) -> np.ndarray:
    """n_i: keys seen by query i (i + 1 causal, N otherwise), shape (N,)."""
    return causal_keep(n).sum(-1).astype(np.float64) if causal else np.full(n, float(n))


def denominators(ar: Any, q: Any, k: Any, *, causal: bool, scale: float | None = None) -> Any:
    """den_i = sum_j phi(q_i) . phi(k_j) (j <= i when causal), (B, H, N), without eps."""
    fq, fk = taylor_features(ar, q, scale), taylor_features(ar, k, scale)
    a = ar.matmul(fq, ar.mT(fk))
    if causal:
        a = ar.fill(a, causal_keep(q.shape[-2]), 0.0)
    return ar.sum(a, axis=-1)


def reference(ar: Any, q: Any, k: Any, v: Any, *, causal: bool, scale: float | None, eps: float) -> Any:
    return ref_normalised(ar, taylor_features(ar, q, scale), taylor_features(ar, k, scale), v, causal=causal, eps=eps)


def torch_forward(
    q: Any, k: Any, v: Any, *, causal: bool, form: str, chunk_size: int, scale: float | None, eps: float
) -> Any:
    # the Taylor map in the float32 accumulators, as fla's based kernels expand 1 + z + z^2/2 in registers:
    # x x^T / sqrt(2 d) of a 16-bit input overflows float16 at |x| ~ 360 where the normalised output does not
    acc = accumulation_dtype(q)
    fq, fk = taylor_features(TORCH, q.to(acc), scale), taylor_features(TORCH, k.to(acc), scale)
    out = torch_normalised(fq, fk, v.to(acc), causal=causal, form=form, chunk_size=chunk_size, eps=eps)
    return out.to(q.dtype)


def features(ar: Any, q: Any, k: Any, *, scale: float | None, **_: Any) -> tuple[Any, Any]:
    """(phi(Q), phi(K)) with the Taylor feature map."""
    return taylor_features(ar, q, scale), taylor_features(ar, k, scale)


VARIANTS = [
    Variant(
        name="based",
        family="linear",
        summary="Based: normalised linear attention with the 2nd-order Taylor feature map of exp",
        source="Arora et al. 2024, Simple linear attention language models balance the recall-throughput tradeoff",
        params={"scale": None, "eps": 0.0},
        forms=("chunked", "recurrent", "parallel"),
        noncausal_only=("parallel",),
        declares=frozenset(
            {"causal", "normalised-rows", "convex-hull", "permutation-equivariant", "denominator", "linear-in-v"}
        ),
        reference_fn=reference,
        torch_fn=torch_forward,
        features_fn=features,
        recurrence="diagonal",
    )
]
