"""QK normalisation: normalise each query and key row before the kernel, with a temperature tau.

n(x) = x / sqrt(|x|^2 + eps)                   (``norm='l2'``, Henry et al. 2020, QKNorm), |n(x)| < 1
n(x) = (x - mean x) / sqrt(var x + eps)        (``norm='layernorm'``, no affine), |n(x)| < sqrt(d)

Then q' = sqrt(tau / c) n(q), k' = sqrt(tau / c) n(k) with c = 1 (l2) or d (layernorm), so that
q'.k' = tau n(q).n(k) / c lies in [-tau, tau], and the base kernel runs on (q', k') with unit logit
scale: softmax(Q' K'^T) V, elu+1 linear attention, or FAVOR+ positive features estimating exp(q'.k').
For softmax every weight lies in [e^{-2 tau} / n, e^{2 tau} / n] with n keys in the row
(proofs/qknorm-weight-range.md).
"""

from __future__ import annotations

from typing import Any

from ..featuremaps import elementwise, favor, favor_causal
from ..forms import accumulation_dtype
from ..inputs import projection as projection_input
from ..torch_arith import TORCH
from . import softmax
from .common import in_float32, ref_normalised, ref_normalised_gated, standardise, torch_normalised
from .linear import LINEAR_FORMS
from .spec import Variant

NORMS = ("layernorm", "l2")


def qk_normalise(ar: Any, x: Any, *, norm: str, tau: float, norm_eps: float) -> Any:
    """sqrt(tau / c) n(x) (see the module docstring)."""
    d = x.shape[-1]
    if not tau >= 0:
        raise ValueError(f"tau: got {tau!r}; expected a temperature >= 0")
    if norm == "l2":
        n = in_float32(ar, x, lambda y: y / ar.sqrt(ar.sum(y * y, axis=-1, keepdims=True) + norm_eps))
        return n * ar.sqrt(ar.const(tau))
    if norm == "layernorm":
        return standardise(ar, x, norm_eps) * ar.sqrt(ar.const(tau / d))
    raise ValueError(f"norm: got {norm!r}; expected one of {NORMS}")


def _normed(ar: Any, q: Any, k: Any, p: dict[str, Any]) -> tuple[Any, Any]:
    kw = {"norm": p["norm"], "tau": p["tau"], "norm_eps": p["norm_eps"]}
    return qk_normalise(ar, q, **kw), qk_normalise(ar, k, **kw)


# softmax kernel ------------------------------------------------------------------------------------
def reference_softmax(ar: Any, q: Any, k: Any, v: Any, *, causal: bool, **p: Any) -> Any:
    qn, kn = _normed(ar, q, k, p)
    return softmax.reference(ar, qn, kn, v, causal=causal, scale=1.0)


def torch_softmax(q: Any, k: Any, v: Any, *, causal: bool, form: str, chunk_size: int, **p: Any) -> Any:
    qn, kn = _normed(TORCH, q, k, p)
    return softmax.torch_forward(qn, kn, v, causal=causal, form=form, chunk_size=chunk_size, scale=1.0)


# elu+1 linear kernel --------------------------------------------------------------------------------
def reference_linear(ar: Any, q: Any, k: Any, v: Any, *, causal: bool, **p: Any) -> Any:
    fq, fk = features_linear(ar, q, k, **p)
    return ref_normalised(ar, fq, fk, v, causal=causal)


def features_linear(ar: Any, q: Any, k: Any, **p: Any) -> tuple[Any, Any]:
    qn, kn = _normed(ar, q, k, p)
    phi = elementwise("elu1")
    return phi(ar, qn), phi(ar, kn)


def torch_linear(q: Any, k: Any, v: Any, *, causal: bool, form: str, chunk_size: int, **p: Any) -> Any:
    """The norms and features in the float32 accumulators (``linear.torch_normalised_forward``)."""
    acc = accumulation_dtype(q)
    qn, kn = _normed(TORCH, q.to(acc), k.to(acc), p)
    phi = elementwise("elu1")
    return torch_normalised(phi(TORCH, qn), phi(TORCH, kn), v, causal=causal, form=form, chunk_size=chunk_size)


# FAVOR+ positive kernel -----------------------------------------------------------------------------
def features_performer(ar: Any, q: Any, k: Any, *, projection: Any, stabilize: bool = True, **p: Any) -> Any:
    qn, kn = _normed(ar, q, k, p)
    fq = favor(ar, qn, projection, kind="positive", is_query=True, scale=1.0, stabilize=stabilize)
    fk = favor(ar, kn, projection, kind="positive", is_query=False, scale=1.0, stabilize=stabilize)
    return fq, fk


def reference_performer(ar: Any, q: Any, k: Any, v: Any, *, causal: bool, projection: Any, **p: Any) -> Any:
    if causal:  # the per-feature running-maximum stabiliser, as the causal forms compute it
        fq, fk, g = favor_causal(ar, *_normed(ar, q, k, p), projection, scale=1.0)
        return ref_normalised_gated(ar, fq, fk, v, g)
    fq, fk = features_performer(ar, q, k, projection=projection, **p)
    return ref_normalised(ar, fq, fk, v, causal=causal)


def _gram_performer(ar: Any, q: Any, k: Any, *, projection: Any, **p: Any) -> Any:
    return features_performer(ar, q, k, projection=projection, stabilize=False, **p)


def torch_performer(
    q: Any, k: Any, v: Any, *, causal: bool, form: str, chunk_size: int, projection: Any, **p: Any
) -> Any:
    """The norms and features in the float32 accumulators (``performer.torch_forward``)."""
    acc = accumulation_dtype(q)
    qn, kn = _normed(TORCH, q.to(acc), k.to(acc), p)
    w = projection.to(dtype=acc, device=q.device)
    if causal:  # running-maximum key stabiliser: causal bit for bit (featuremaps.favor_causal)
        fq, fk, g = favor_causal(TORCH, qn, kn, w, scale=1.0)
        return torch_normalised(fq, fk, v, causal=True, form=form, chunk_size=chunk_size, g=g)
    fq = favor(TORCH, qn, w, kind="positive", is_query=True, scale=1.0)
    fk = favor(TORCH, kn, w, kind="positive", is_query=False, scale=1.0)
    return torch_normalised(fq, fk, v, causal=causal, form=form, chunk_size=chunk_size)


_PARAMS = {"norm": "layernorm", "tau": 1.0, "norm_eps": 1e-6}
_TAGS = frozenset(
    {"causal", "normalised-rows", "convex-hull", "permutation-equivariant", "qk-scale-invariant", "linear-in-v"}
)

VARIANTS = [
    Variant(
        name="qknorm-softmax",
        family="qknorm",
        summary="softmax over tau * n(q).n(k) / c with LayerNorm- or l2-normalised q, k",
        source="Henry et al. 2020 (QKNorm); LayerNorm on q, k",
        params=_PARAMS,
        param_choices={"norm": NORMS},
        forms=("parallel",),
        declares=_TAGS | {"materialises-nxn", "weight-range"},
        reference_fn=reference_softmax,
        torch_fn=torch_softmax,
    ),
    Variant(
        name="qknorm-linear",
        family="qknorm",
        summary="elu+1 linear attention on normalised, temperature-scaled q, k",
        source="QK normalisation applied to Katharopoulos et al. 2020",
        params=_PARAMS,
        param_choices={"norm": NORMS},
        forms=LINEAR_FORMS,
        noncausal_only=("parallel",),
        declares=_TAGS | {"denominator"},
        reference_fn=reference_linear,
        torch_fn=torch_linear,
        features_fn=features_linear,
        recurrence="diagonal",
    ),
    Variant(
        name="qknorm-performer",
        family="qknorm",
        summary="FAVOR+ positive features of normalised, temperature-scaled q, k",
        source="QK normalisation applied to Choromanski et al. 2021",
        params=_PARAMS,
        param_choices={"norm": NORMS},
        forms=LINEAR_FORMS,
        noncausal_only=("parallel",),
        declares=_TAGS | {"random-features", "denominator", "causal-rounding"},
        reference_fn=reference_performer,
        torch_fn=torch_performer,
        inputs=(projection_input(),),
        features_fn=_gram_performer,
        recurrence="diagonal",
    ),
]
