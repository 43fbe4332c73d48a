"""Performer FAVOR+ (Choromanski et al., ICLR 2021): normalised linear attention whose features are
random features of the softmax kernel, phi(q)^T phi(k) ~ exp(scale q.k) (gramcheck.featuremaps.favor).

The random matrix is an input, ``projection`` (m, d_k), drawn by ``featuremaps.random_projection``
(iid or orthogonal), so that the reference and the torch forms evaluate the same draw. Positive and
hyperbolic features keep every row weight positive; trigonometric features can give negative weights
and vanishing denominators where the kernel is small (Lemma 2).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..featuremaps import FAVOR_KINDS, SHIFTS, favor, favor_causal
from ..forms import CHUNK_SIZES, accumulation_dtype
from ..inputs import projection as projection_input
from ..torch_arith import TORCH
from .common import linear_product, ref_normalised, ref_normalised_gated, torch_normalised
from .linear import LINEAR_FORMS
from .spec import AmplitudeRounding, Variant


def _features(ar: Any, q: Any, k: Any, w: Any, p: dict[str, Any]) -> tuple[Any, Any]:
    kw = {
        "kind": p["kind"],
        "scale": p["scale"],
        "stabilize": p["stabilize"],
        "feature_eps": p["feature_eps"],
        "shift": p["shift"],
    }
    return favor(ar, q, w, is_query=True, **kw), favor(ar, k, w, is_query=False, **kw)


def prefix_stabilised(p: dict[str, Any], eps: float) -> bool:
    """Causal forms stabilise keys by their running maximum when that cancels exactly (no eps)."""
    return bool(p["stabilize"]) and p["feature_eps"] == 0 and eps == 0


def reference(ar: Any, q: Any, k: Any, v: Any, *, causal: bool, projection: Any, eps: float, **p: Any) -> Any:
    """Non-causal: (A V) / (A 1) with the reference code's stabilisers. Causal: the same value, computed
    as the normalised diagonal gated recurrence of the per-feature running-maximum stabiliser
    (``featuremaps.favor_causal``: the production form's structure, so that the rounding model
    describes what the forms compute; proofs/invariants.md)."""
    if causal and prefix_stabilised(p, eps):
        fq, fk, g = favor_causal(ar, q, k, projection, kind=p["kind"], scale=p["scale"])
        return ref_normalised_gated(ar, fq, fk, v, g)
    fq, fk = _features(ar, q, k, projection, p)
    return ref_normalised(ar, fq, fk, v, causal=causal, eps=eps)


def linear_form(
    ar: Any,
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool,
    projection: Any,
    eps: float,
    chunk: int = CHUNK_SIZES[-1],
    **p: Any,
) -> Any:
    """The same output by the linear form, the production algorithm of FAVOR+: phi(Q) (phi(K)^T [V, 1]),
    causal by chunks of ``chunk`` tokens (``common.chunked_gated_recurrence``, with the per-feature decays
    where the reference uses them; the variant lists it causal at each of ``forms.CHUNK_SIZES``, whose
    errors differ where the chunks' carried states cancel: trigonometric features in float32 erred
    1.4e-3 in norm at 16 and 3.0e-4 at 64 on one heavy-tailed input). Equal to ``reference`` in exact
    arithmetic; with trigonometric features its signed terms cancel in another order than the quadratic
    form's, so the low-precision rules take the larger of the two errors as their yardstick
    (proofs/low-precision-rule.md)."""
    alpha = None
    if causal and prefix_stabilised(p, eps):
        fq, fk, g = favor_causal(ar, q, k, projection, kind=p["kind"], scale=p["scale"])
        alpha = ar.exp(ar.held(g))
    else:
        fq, fk = _features(ar, q, k, projection, p)
    dv = v.shape[-1]
    va = ar.concat([v, ar.asarray(np.ones(v.shape[:-1] + (1,)))], axis=-1)
    out = linear_product(ar, fq, fk, va, causal, chunk, alpha)
    return ar.div(out[..., :dv], out[..., dv:] + eps)


def features(ar: Any, q: Any, k: Any, *, projection: Any, eps: float, **p: Any) -> tuple[Any, Any]:
    """Unstabilised features: phi(Q) phi(K)^T is the estimate of exp(scale Q K^T) itself."""
    return _features(ar, q, k, projection, {**p, "stabilize": False})


def quotient_features(
    ar: Any, q: Any, k: Any, *, causal: bool, projection: Any, eps: float, **p: Any
) -> tuple[Any, Any, Any]:
    """(phi(Q), phi(K), g): the features the definition divides by, in float64's range. Non-causal, stabilised
    (with ``stabilize``): queries by their own maximum and keys by the maximum over every token and feature,
    g None. Causal without eps, as ``reference`` computes them: keys by their running maximum, with the log
    decays g that carry an earlier key to a later row (``featuremaps.favor_causal``), so that no row's terms
    depend on a later key's shift."""
    if causal and prefix_stabilised(p, eps):
        return favor_causal(ar, q, k, projection, kind=p["kind"], scale=p["scale"])
    return (*_features(ar, q, k, projection, p), None)


def amplitude_rounding(q: Any, k: Any, *, causal: bool, projection: Any, **p: Any) -> AmplitudeRounding | None:
    """Trigonometric features: phi(k_s) = exp(L_s - M_s) [sin, cos](W x_s) / sqrt(m) with the log-amplitude
    L_s = sum_i t_si, t_si = x_si^2 / 2, of the scaled key x_s = f k_s (f = d^-1/4, or sqrt(scale)) and M_s the
    keys' shift (with ``stabilize``): their maximum, or in the causal mode their running maximum
    max_{r<=s} L_r. The stored results of L_s - M_s round, each unless float32 holds it exactly: each square
    (t_si), each partial sum p of a pairwise tree over i (as torch's and Triton's reductions sum), the shift's
    difference (L_s - M_s, unless L_s >= M_s / 2: exact by Sterbenz's lemma) and, unless f is a power of two
    (then x_s is exact), each scaled entry (2 t_si to first order). Every feature of key s then moves by the
    same factor exp(delta L_s), and with independent relative errors uniform on [-u, u] (the classical model
    of rounding errors) delta L_s has root mean square sigma_s u,

        sigma_s^2 = ((1 + 4 [f inexact]) sum_i [t_si inexact] t_si^2 + sum_p [p inexact] p^2
                     + [L_s < M_s / 2] (L_s - M_s)^2) / 3.

    Keys with the same |x_s| compute the same L_s with the same roundings: they share one delta (``groups``),
    whose move of a row is the square of a sum over them, not a sum of squares (a repeated token's copies
    cancel). A change of M is one factor for all keys, which cancels. In the causal mode the state carries
    the keys before token t into t's row by the decay exp(g_t), g_t = M_{t-1} - M_t; as a recurrence computes
    it, g_t (unless M_t <= 2 M_{t-1}) and its exponential round once each, which moves every key s < t alike,
    with root mean square tau_t u, tau_t^2 = ([M_t > 2 M_{t-1}] g_t^2 + 1) / 3 (0 where g_t = 0: the decay 1 is
    exact). None for the exponential kinds, which have one log-amplitude per feature and a positive
    denominator."""
    if p["kind"] != "trig":
        return None
    k = np.asarray(k, dtype=np.float64)
    f = k.shape[-1] ** -0.25 if p["scale"] is None else float(np.sqrt(p["scale"]))
    inexact = 0.0 if np.frexp(f)[0] == 0.5 else 4.0  # x_s = f k_s is exact when f is a power of two
    t = (f * k) ** 2 / 2.0
    squares = np.sum(np.where((inexact > 0) | _rounds(t), (1.0 + inexact) * t**2, 0.0), axis=-1)
    partials, level = 0.0, t
    while level.shape[-1] > 1:  # pairwise: each level sums neighbours, an odd last term carried
        n = level.shape[-1]
        paired = level[..., : n - n % 2 : 2] + level[..., 1 : n - n % 2 : 2]
        partials = partials + np.sum(np.where(_rounds(paired), paired**2, 0.0), axis=-1)
        level = np.concatenate([paired, level[..., n - n % 2 :]], axis=-1)
    log_amplitude = level[..., 0]  # L >= 0, so a difference of two within a factor 2 is exact (Sterbenz)
    decays = None
    if not p["stabilize"]:
        run = np.zeros_like(log_amplitude[..., :1])  # no shift, no decays: the features as they are
    elif causal:
        run = np.maximum.accumulate(log_amplitude, axis=-1)
        before = np.concatenate([run[..., :1], run[..., :-1]], axis=-1)
        g = np.where(run > 2 * before, before - run, 0.0)
        decays = np.where(run != before, np.sqrt((g**2 + 1.0) / 3.0), 0.0)
    else:
        run = np.max(log_amplitude, axis=-1, keepdims=True)
    shift = np.where(2 * log_amplitude < run, log_amplitude - run, 0.0)
    return AmplitudeRounding(np.sqrt((squares + partials + shift**2) / 3.0), decays, _same_magnitudes(k))


def _rounds(x: np.ndarray) -> np.ndarray:
    """Where float32 does not hold x (an exact float64 value) exactly."""
    return np.asarray(x, dtype=np.float32).astype(np.float64) != x


def _same_magnitudes(k: np.ndarray) -> np.ndarray | None:
    """(B, H, N) labels, equal for keys of equal |k| within a (batch, head) slice (the first such key's index);
    None where every key's is its own."""
    a = np.abs(k).reshape(-1, *k.shape[-2:])
    labels = np.empty(a.shape[:2], dtype=np.int64)
    for b in range(a.shape[0]):
        _, first, inverse = np.unique(a[b], axis=0, return_index=True, return_inverse=True)
        labels[b] = first[np.ravel(inverse)]
    if np.all(labels == np.arange(a.shape[1])):
        return None
    return labels.reshape(k.shape[:-1])


def torch_forward(
    q: Any, k: Any, v: Any, *, causal: bool, form: str, chunk_size: int, projection: Any, eps: float, **p: Any
) -> Any:
    """Stabilised without eps (the stabiliser then cancels): keys by their maximum feature by feature, a
    running maximum with the matching decays when causal, so no future token enters (``favor_causal``);
    otherwise the reference code's stabilisers.
    In float16 the features are computed and kept in float32, as a kernel keeps them in registers: |x|^2 / 2
    overflows float16 at |x| ~ 362 where the stabilised features do not, and features stored in float16
    underflow to 0/0 on anti-aligned inputs whose output is finite (xformers#96, fixed by computing them in
    float32). A dtype with float32's range (bfloat16) computes them in the dtype, rounding as the definition
    does there."""
    import torch

    narrow = torch.finfo(q.dtype).max < torch.finfo(torch.float32).max
    acc = accumulation_dtype(q) if narrow else q.dtype
    qa, ka, w = q.to(acc), k.to(acc), projection.to(dtype=acc, device=q.device)
    g = None
    if prefix_stabilised(p, eps):  # feature by feature: every denominator at least 1 / count
        fq, fk, g = favor_causal(TORCH, qa, ka, w, kind=p["kind"], scale=p["scale"], causal=causal)
    else:
        fq, fk = _features(TORCH, qa, ka, w, p)
    return torch_normalised(fq, fk, v, causal=causal, form=form, chunk_size=chunk_size, eps=eps, g=g)


def kind_tags(params: Mapping[str, Any]) -> frozenset[str]:
    """Positive and hyperbolic features give positive weights (rows sum to one, the row-normalisation
    bound applies); trigonometric features give signed weights and denominators that can vanish."""
    if params["kind"] == "trig":
        # ``features`` are unstabilised: the definition's stabilised features times a positive factor per row,
        # which cancels in the quotient only without feature_eps and without eps
        divides_by_features = not params["feature_eps"] and not params["eps"]
        return frozenset({"vanishing-denominator"} | ({"feature-denominator"} if divides_by_features else set()))
    return frozenset({"normalised-rows", "convex-hull", "row-normalisation"})


def _variant(kind: str, summary: str) -> Variant:
    return Variant(
        name=f"performer-{kind}",
        family="performer",
        summary=summary,
        source="Choromanski et al. 2021, Rethinking Attention with Performers",
        params={
            "kind": kind,
            "scale": None,
            "stabilize": True,
            "feature_eps": 0.0,
            "eps": 0.0,
            "shift": "log-amplitude",
            # m, for a target that draws its own random features (checked statistically); a target that
            # takes ``projection`` gets m from the matrix it is given
            "features": None,
        },
        param_choices={"kind": FAVOR_KINDS, "shift": SHIFTS},
        forms=LINEAR_FORMS,
        noncausal_only=("parallel",),
        declares=frozenset(
            {"causal", "permutation-equivariant", "random-features", "denominator", "causal-rounding", "linear-in-v"}
        ),
        reference_fn=reference,
        algorithms_fn=(linear_form,),
        causal_algorithms_fn=tuple(functools.partial(linear_form, chunk=c) for c in CHUNK_SIZES[:-1]),
        torch_fn=torch_forward,
        inputs=(projection_input(),),
        features_fn=features,
        quotient_features_fn=quotient_features,
        amplitude_rounding_fn=amplitude_rounding,
        recurrence="diagonal",
        tags_fn=kind_tags,
    )


VARIANTS = [
    _variant("positive", "FAVOR+ with positive random features exp(w.x - |x|^2/2)"),
    _variant("hyperbolic", "FAVOR+ with hyperbolic (paired exp(+-w.x)) random features"),
    _variant("trig", "FAVOR+ with trigonometric random features (weights may be negative)"),
]
