"""TransNormer (Qin et al., EMNLP 2022, "The Devil in Linear Transformer") and a write-up's variant.

NormAttention:  O = Norm(phi(Q) (phi(K)^T V)), no denominator (causal: masked), phi = elu + 1;
                Norm = RMSNorm  g x / sqrt(mean(x^2) + eps)  or SRMSNorm  x / sqrt(mean(x^2) + eps)
                (no gain; TransNormerLLM). The output is invariant to scaling V (up to eps).
DiagAttention:  softmax attention restricted to non-overlapping diagonal blocks of ``block_size``
                tokens (causal: also j <= i), the paper's remedy for attention dilution.

``gram-diag-subtracted`` is *not* the paper's method: it is what some write-ups describe as
TransNormer's, O = tau (A - diag(A)) V with A = phi(Q) phi(K)^T (causal: strictly lower part), i.e.
each token's own kernel term subtracted, scaled by a (learnable) temperature, with no normaliser.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from ..featuremaps import ELEMENTWISE, elementwise
from ..forms import CHUNK_SIZES, accumulation_dtype, linear_recurrence
from ..hyperparams import scale_value
from ..torch_arith import TORCH
from ..validation import check_positive_int
from .common import causal_keep, kernel_product, linear_product, masked_softmax, rms_normalise
from .linear import LINEAR_FORMS, features
from .softmax import ROW_STOCHASTIC
from .softmax import jacobian as softmax_jacobian
from .spec import Variant

NORMS = ("rmsnorm", "srmsnorm")


# NormAttention ------------------------------------------------------------------------------------
def _output_norm(ar: Any, x: Any, norm: str, gain: float, eps: float) -> Any:
    if norm not in NORMS:
        raise ValueError(f"norm: got {norm!r}; expected one of {NORMS}")
    y = rms_normalise(ar, x, eps)
    return y * gain if norm == "rmsnorm" else y


def reference_norm(
    ar: Any, q: Any, k: Any, v: Any, *, causal: bool, feature: str, norm: str, gain: float, norm_eps: float
) -> Any:
    phi = elementwise(feature)
    u = kernel_product(ar, phi(ar, q), phi(ar, k), v, causal)
    return _output_norm(ar, u, norm, gain, norm_eps)


def torch_norm(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool,
    form: str,
    chunk_size: int,
    feature: str,
    norm: str,
    gain: float,
    norm_eps: float,
) -> Any:
    phi = elementwise(feature)
    fq = phi(TORCH, q)
    # normalised from the float32 accumulators, stored once: a float16 phi(Q)(phi(K)^T V) overflows where
    # its RMS-normalised output does not
    u = linear_recurrence(fq, phi(TORCH, k), v, causal=causal, form=form, chunk_size=chunk_size, wide_output=True)
    return _output_norm(TORCH, u, norm, gain, norm_eps).to(fq.dtype)


def linear_form_norm(
    ar: Any,
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool,
    feature: str,
    norm: str,
    gain: float,
    norm_eps: float,
    chunk: int = CHUNK_SIZES[-1],
) -> Any:
    """``reference_norm`` by the linear form (``common.linear_product``), the production algorithm: where
    phi(Q)(phi(K)^T V) cancels, its state rounds each term among the others, which the normalisation then
    scales up (bfloat16, d_v = 2: the builtin erred 11 times the quadratic definition on a row;
    proofs/low-precision-rule.md)."""
    phi = elementwise(feature)
    return _output_norm(ar, linear_product(ar, phi(ar, q), phi(ar, k), v, causal, chunk), norm, gain, norm_eps)


def jacobian_norm(var: Any, q: Any, k: Any, v: Any, *, causal: bool, params: Any, extras: Any) -> dict[str, float]:
    """||dO/dV||_2 <= g max_i sqrt(d_v) / r_i ||A||_2 through the output norm (one (b, h) slice)."""
    from ..bounds import normattention_jacobian_v_bound

    fq, fk = var.features(q, k, **params)
    a = fq[0, 0] @ fk[0, 0].T
    a = np.tril(a) if causal else a
    gain = float(params["gain"]) if params["norm"] == "rmsnorm" else 1.0
    return {"v": normattention_jacobian_v_bound(a, v[0, 0], gain=gain, eps=float(params["norm_eps"]))}


# DiagAttention ------------------------------------------------------------------------------------
def block_keep(n: int, block_size: int, causal: bool) -> np.ndarray:
    """(N, N) mask of the pairs in the same diagonal block (and j <= i when causal)."""
    blk = np.arange(n) // block_size
    keep = blk[:, None] == blk[None, :]
    return keep & causal_keep(n) if causal else keep


def reference_diag(ar: Any, q: Any, k: Any, v: Any, *, causal: bool, block_size: int, scale: Any) -> Any:
    s = scale_value(ar, scale, q.shape[-1])
    logits = ar.matmul(q, ar.mT(k)) * s
    return ar.matmul(masked_softmax(ar, logits, block_keep(q.shape[-2], block_size, causal)), v)


def torch_diag(
    q: Any, k: Any, v: Any, *, causal: bool, form: str, chunk_size: int, block_size: int, scale: Any
) -> Any:
    """Blocked computation: O(N w d) work, never N x N; the logits, softmax and P V in the float32
    accumulators, stored once (as ``softmax.torch_forward``)."""
    import torch

    from ..forms import pad_chunks

    check_positive_int("block_size", block_size)
    n = q.shape[-2]
    w = block_size
    s = scale_value(TORCH, scale, q.shape[-1])
    acc = accumulation_dtype(q)
    qb, kb, vb = pad_chunks(q.to(acc), w), pad_chunks(k.to(acc), w), pad_chunks(v.to(acc), w)
    logits = (qb @ kb.transpose(-1, -2)) * s  # (B, H, nb, w, w)
    pos = torch.arange(qb.shape[2] * w, device=q.device).reshape(-1, 1, w)
    keep = pos < n  # padded keys get no weight
    if causal:
        keep = keep & torch.ones(w, w, dtype=torch.bool, device=q.device).tril()
    logits = logits.masked_fill(~keep, -math.inf)
    out = torch.softmax(logits, dim=-1) @ vb
    return out.reshape(*q.shape[:2], -1, v.shape[-1])[:, :, :n].to(v.dtype)


# the write-ups' diagonal-subtracted Gram ------------------------------------------------------------
def reference_diag_subtracted(ar: Any, q: Any, k: Any, v: Any, *, causal: bool, feature: str, tau: float) -> Any:
    """tau (A V - diag(A) V): the diagonal is subtracted, as the write-ups define it."""
    phi = elementwise(feature)
    fq, fk = phi(ar, q), phi(ar, k)
    full = kernel_product(ar, fq, fk, v, causal)
    return (full - ar.sum(fq * fk, axis=-1, keepdims=True) * v) * tau


def linear_form_diag_subtracted(
    ar: Any, q: Any, k: Any, v: Any, *, causal: bool, feature: str, tau: float, chunk: int = CHUNK_SIZES[-1]
) -> Any:
    """The same output by the linear form, the production algorithm: tau (phi(Q) (phi(K)^T V) - diag(A) V)
    (``common.linear_product``). Equal to ``reference_diag_subtracted`` in exact arithmetic; its state holds each key's
    term summed with the others, so the diagonal cancels against another rounding than the quadratic form's
    (float16: the builtin erred 10 times the quadratic definition on a cancelling row;
    proofs/low-precision-rule.md)."""
    phi = elementwise(feature)
    fq, fk = phi(ar, q), phi(ar, k)
    return (linear_product(ar, fq, fk, v, causal, chunk) - ar.sum(fq * fk, axis=-1, keepdims=True) * v) * tau


def torch_diag_subtracted(
    q: Any, k: Any, v: Any, *, causal: bool, form: str, chunk_size: int, feature: str, tau: float
) -> Any:
    phi = elementwise(feature)
    acc = accumulation_dtype(q)
    fq, fk = phi(TORCH, q.to(acc)), phi(TORCH, k.to(acc))  # in registers, as ``linear.torch_normalised_forward``
    # the difference taken from the float32 accumulators, stored once: A V overflows float16 where
    # (A - diag A) V need not
    full = linear_recurrence(fq, fk, v, causal=causal, form=form, chunk_size=chunk_size, wide_output=True)
    diag = (fq * fk).sum(-1, keepdim=True) * v.to(acc)
    return ((full - diag) * tau).to(v.dtype)


VARIANTS = [
    Variant(
        name="transnormer-norm",
        family="transnormer",
        summary="NormAttention: RMSNorm/SRMSNorm of phi(Q)(phi(K)^T V), no denominator",
        source="Qin et al. 2022, The Devil in Linear Transformer",
        params={"feature": "elu1", "norm": "srmsnorm", "gain": 1.0, "norm_eps": 1e-6},
        param_choices={"feature": tuple(ELEMENTWISE), "norm": NORMS},
        forms=LINEAR_FORMS,
        noncausal_only=("parallel",),
        algorithms_fn=(linear_form_norm,),
        causal_algorithms_fn=tuple(functools.partial(linear_form_norm, chunk=c) for c in CHUNK_SIZES[:-1]),
        declares=frozenset({"causal", "permutation-equivariant", "v-scale-invariant", "jacobian-v"}),
        reference_fn=reference_norm,
        torch_fn=torch_norm,
        features_fn=features,
        recurrence="diagonal",
        jacobian_fn=jacobian_norm,
    ),
    Variant(
        name="transnormer-diag",
        family="transnormer",
        summary="DiagAttention: softmax within non-overlapping diagonal blocks",
        source="Qin et al. 2022, The Devil in Linear Transformer",
        params={"block_size": 64, "scale": None},
        forms=("parallel",),
        declares=frozenset({"causal"}) | ROW_STOCHASTIC,
        reference_fn=reference_diag,
        torch_fn=torch_diag,
        jacobian_fn=softmax_jacobian,
    ),
    Variant(
        name="gram-diag-subtracted",
        family="transnormer",
        summary="tau (A - diag A) V: the write-ups' 'TransNormer', not the paper's method",
        source="popular write-ups (not Qin et al. 2022)",
        params={"feature": "elu1", "tau": 1.0},
        param_choices={"feature": tuple(ELEMENTWISE)},
        forms=LINEAR_FORMS,
        noncausal_only=("parallel",),
        declares=frozenset({"causal", "linear-in-v"}),
        reference_fn=reference_diag_subtracted,
        algorithms_fn=(linear_form_diag_subtracted,),
        causal_algorithms_fn=tuple(functools.partial(linear_form_diag_subtracted, chunk=c) for c in CHUNK_SIZES[:-1]),
        torch_fn=torch_diag_subtracted,
        features_fn=features,
        recurrence="diagonal",
    ),
]
