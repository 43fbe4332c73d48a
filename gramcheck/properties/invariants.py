"""Invariants that hold in exact arithmetic, checked within the rounding bound of the target's dtype
(proofs/invariants.md): rows sum to one, convex hull, permutation equivariance, causality, scale
invariances, and the QK-norm weight range."""

from __future__ import annotations

import zlib
from dataclasses import replace
from typing import Any

import numpy as np

from .. import algorithm_underflow
from ..bounds import qknorm_weight_range, value_hull
from ..findings import Finding
from ..precision import max_finite, round_to, smallest_normal
from ..strategies import AttentionInputs
from ..targets import Target
from .base import bound_of, guarded, output_difference, ratio_finding


def replacement(rng: np.random.Generator, shape: tuple[int, ...], x: np.ndarray, dtype: str) -> np.ndarray:
    """Values to put in place of some of x's tokens: N(0, 1) times 1 + max|x|, kept within the dtype's
    finite range (float16 inputs near 65504 would otherwise be replaced by infinities) and rounded to it."""
    big = max_finite(dtype)
    return round_to(np.clip(rng.standard_normal(shape) * (1 + np.abs(x).max()), -big, big), dtype)


def _rng(ex: AttentionInputs, salt: str) -> np.random.Generator:
    """A generator determined by the example (so a property is a function of its input)."""
    return np.random.default_rng(zlib.crc32(ex.q.tobytes() + ex.k.tobytes() + salt.encode()))


def _undefined(target: Target, ex: AttentionInputs, causal: bool, v: np.ndarray | None = None) -> bool:
    """True where the exact output has 0/0 entries (a vanishing denominator): outside every domain."""
    with np.errstate(all="ignore"):
        ref = target.reference(ex.q, ex.k, ex.v if v is None else v, causal=causal, **ex.extras)
    return not bool(np.all(np.isfinite(ref)))


def _identity_v(ex: AttentionInputs) -> np.ndarray:
    B, H, N, _ = ex.q.shape
    return np.broadcast_to(np.eye(N), (B, H, N, N)).copy()


@guarded("rows-sum-to-one")
def rows_sum_to_one(target: Target, ex: AttentionInputs, *, causal: bool) -> Finding | None:
    """With V = I_N the output is the weight matrix P: every row sums to 1 and P >= 0, within the
    rounding bound of P (normalised positive kernels)."""
    eye = _identity_v(ex)
    if _undefined(target, ex, causal, eye):
        return None
    p = target(ex.q, ex.k, eye, causal=causal, **ex.extras)
    b = bound_of(target, ex, causal=causal, v=eye)
    # the definition's own departure (a declared eps in the denominator: rows sum to den / (den + eps))
    with np.errstate(all="ignore"):
        ref = target.reference(ex.q, ex.k, eye, causal=causal, **ex.extras)
    own_row, own_neg = np.abs(ref.sum(-1) - 1.0), np.maximum(-ref, 0.0)
    row_err = np.abs(p.sum(-1) - 1.0)
    neg = np.maximum(-p, 0.0)
    return ratio_finding(
        "rows-sum-to-one",
        np.concatenate([np.maximum(row_err - own_row, 0.0).ravel(), np.maximum(neg - own_neg, 0.0).ravel()]),
        np.concatenate([b.sum(-1).ravel(), b.ravel()]),
        ex,
        min_weight=float(p.min()),
        max_row_error=float(row_err.max()),
    )


@guarded("convex-hull")
def convex_hull(target: Target, ex: AttentionInputs, *, causal: bool) -> Finding | None:
    """min_j v_jk <= o_ik <= max_j v_jk (j <= i when causal), up to the rounding bound of o."""
    if _undefined(target, ex, causal):
        return None
    o = target(ex.q, ex.k, ex.v, causal=causal, **ex.extras)
    hi, lo = value_hull(ex.v, causal=causal)
    with np.errstate(all="ignore"):
        ref = target.reference(ex.q, ex.k, ex.v, causal=causal, **ex.extras)
    # the definition's own distance outside the hull (a declared eps shrinks outputs toward 0)
    own = np.maximum(np.maximum(ref - hi, lo - ref), 0.0)
    outside = np.maximum(np.maximum(o - hi, lo - o), 0.0)
    outside = np.where(np.isnan(o), np.inf, np.maximum(outside - own, 0.0))
    return ratio_finding("convex-hull", outside, bound_of(target, ex, causal=causal), ex)


@guarded("permutation-equivariance")
def permutation_equivariance(target: Target, ex: AttentionInputs, *, causal: bool) -> Finding | None:
    """Non-causal: permuting (K, V) rows together leaves O unchanged; permuting Q rows permutes O.
    Both within the sum of the two evaluations' rounding bounds."""
    if _undefined(target, ex, causal):
        return None
    n = ex.q.shape[-2]
    perm = _rng(ex, "perm").permutation(n)
    o = target(ex.q, ex.k, ex.v, causal=False, **ex.extras)
    o_kv = target(ex.q, ex.k[..., perm, :], ex.v[..., perm, :], causal=False, **ex.extras)
    o_q = target(ex.q[..., perm, :], ex.k, ex.v, causal=False, **ex.extras)
    b = bound_of(target, ex, causal=False)
    # two runs that overflow alike agree (float16, q = k = v = 100: o = 1e6 is inf in both); NaN never passes
    diffs = ((o_kv, o), (o_q, o[..., perm, :]))
    err = np.concatenate([output_difference(x, y, ex.dtype, nan_agrees=False).ravel() for x, y in diffs])
    return ratio_finding(
        "permutation-equivariance", err, np.concatenate([2 * b.ravel(), 2 * b[..., perm, :].ravel()]), ex
    )


@guarded("causality")
def causality(target: Target, ex: AttentionInputs, *, causal: bool) -> Finding | None:
    """Replacing every token after position t (q, k, v and every per-token extra input, redrawn by its
    spec) changes no output at positions <= t.
    Bit-exact (bound 0) unless the variant declares ``causal-rounding`` (a global stabiliser that
    cancels in exact arithmetic), where the change must stay within the two rounding bounds."""
    n = ex.q.shape[-2]
    if n < 2:
        return None
    rng = _rng(ex, "future")
    t = int(rng.integers(0, n - 1))
    extras = {}
    for name, x in ex.extras.items():
        spec = target.variant.input(name)
        extras[name] = np.clip(round_to(spec.future(x, t, rng), ex.dtype), spec.low, spec.high)
    fut = replace(ex, q=ex.q.copy(), k=ex.k.copy(), v=ex.v.copy(), extras=extras)
    for x in (fut.q, fut.k, fut.v):
        x[..., t + 1 :, :] = replacement(rng, x[..., t + 1 :, :].shape, x, ex.dtype)
    if _undefined(target, ex, True) or _undefined(target, fut, True):
        return None
    o = target(ex.q, ex.k, ex.v, causal=True, **ex.extras)[..., : t + 1, :]
    o2 = target(fut.q, fut.k, fut.v, causal=True, **fut.extras)[..., : t + 1, :]
    diff = output_difference(o2, o)
    if "causal-rounding" in target.variant.declares:
        b = (bound_of(target, ex, causal=True) + bound_of(target, fut, causal=True))[..., : t + 1, :]
        return ratio_finding("causality", diff, b, ex, cut=t, mode="rounding")
    changed = int(np.count_nonzero(diff))
    f = ratio_finding("causality", diff, np.zeros_like(diff), ex, cut=t, mode="bit-exact", changed_entries=changed)
    return f


def _invariance(
    name: str, target: Target, ex: AttentionInputs, causal: bool, changed: AttentionInputs
) -> Finding | None:
    """|T(x') - T(x)| <= |R(x') - R(x)| + bound(x) + bound(x'): the target moves no more than the exact
    definition does (the definition's own departure, e.g. through a norm's eps, is allowed). One-sided: where the
    definition moves, how the target should move is agreement's question at x', whose bound there is not this
    one (gated-deltanet in float64, d = 1, extreme gates, rows scaled far down: the builtin moved 3.5e-14 from the
    definition's move of 4.5, against 2 R(u) = 1.2e-14). A property on a gated variant takes the bounds with
    the log-decay sums' share where the definition's fail (``algorithm_underflow.judged_property``): the
    builtin's own error from the definition there was 3.3 times 2 R(u) before x was scaled at all."""
    if _undefined(target, ex, causal) or _undefined(target, changed, causal):
        return None
    o = target(ex.q, ex.k, ex.v, causal=causal, **ex.extras)
    o2 = target(changed.q, changed.k, changed.v, causal=causal, **changed.extras)
    exact = np.abs(
        target.reference(changed.q, changed.k, changed.v, causal=causal, **changed.extras)
        - target.reference(ex.q, ex.k, ex.v, causal=causal, **ex.extras)
    )
    b = bound_of(target, ex, causal=causal) + bound_of(target, changed, causal=causal)
    moved = np.maximum(output_difference(o2, o, ex.dtype) - exact, 0.0)
    return ratio_finding(name, moved, b, ex, definition_change=float(exact.max()))


def _pow2_scales(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Positive powers of two in [1/4, 4]: scaling by them is exact in every binary format."""
    return np.exp2(rng.integers(-2, 3, shape)).astype(np.float64)


def _rows_scaled(x: np.ndarray, scales: np.ndarray, dtype: Any) -> np.ndarray:
    """Each row of x times its scale, or times its reciprocal where the scale would take the row past the dtype's
    largest finite value (heavy-tailed float16 rows of 2e4 times 4: the target then rightly refused an inf input)."""
    over = np.max(np.abs(x), axis=-1, keepdims=True) * scales > max_finite(dtype)
    return x * np.where(over, 1.0 / scales, scales)


FAR_SCALED_ROWS = 0.25  # the share of q and k rows that qk-scale-invariance takes to a norm far from their own
FAR_NORMS = (2.0**-20, 2.0**60)  # the row norms it draws them to (log-uniform), within the dtype's range


def _far_row_scales(rng: np.random.Generator, x: np.ndarray, dtype: Any) -> np.ndarray:
    """Per row of x (..., d), a power-of-two scale (..., 1): for a share ``FAR_SCALED_ROWS`` of the rows, one that
    takes the row's norm to a norm drawn log-uniformly in ``FAR_NORMS``, narrowed to the dtype (above 64 sqrt(d)
    times its smallest normal, below a quarter of its largest finite value); for the others ``_pow2_scales``.
    Where a norm's eps sits (inside the root or outside, on the sum or on the mean) and whether its sum of squares
    is formed in the dtype only shows in rows far smaller or larger than the inputs' own: axlearn#21's eps of
    1e-8 inside the root moves rows of norm 1e-4, and a float16 sum of squares overflows past norm 256."""
    shape = x.shape[:-1] + (1,)
    near = _pow2_scales(rng, shape)
    lo = max(FAR_NORMS[0], 64.0 * np.sqrt(x.shape[-1]) * smallest_normal(dtype))
    hi = min(FAR_NORMS[1], max_finite(dtype) / 4)
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    to = np.exp2(rng.uniform(np.log2(lo), np.log2(hi), shape))
    far = np.exp2(np.round(np.log2(to) - np.log2(np.where(norms > 0, norms, 1.0))))
    # the largest entry stays below a quarter of the largest finite value however the row's mass is spread
    largest = np.max(np.abs(x), axis=-1, keepdims=True)
    far = np.minimum(far, np.exp2(np.floor(np.log2(hi) - np.log2(np.where(largest > 0, largest, 1.0)))))
    return np.where(rng.random(shape) < FAR_SCALED_ROWS, far, near)


@guarded("qk-scale-invariance")
@algorithm_underflow.judged_property
def qk_scale_invariance(target: Target, ex: AttentionInputs, *, causal: bool) -> Finding | None:
    """Scaling rows of q and of k by positive constants leaves a QK-normalised output unchanged (up to the
    definition's own change through its norm's eps, ``_invariance``); a quarter of the rows are taken far from
    their own norm (``_far_row_scales``), the rest by [1/4, 4]. Rows scaled into the dtype's subnormals are
    rounded to it, and the definition is evaluated at what the target receives."""
    rng = _rng(ex, "scale")
    q_scales, k_scales = (_far_row_scales(rng, x, ex.dtype) for x in (ex.q, ex.k))
    q, k = (round_to(_rows_scaled(x, c, ex.dtype), ex.dtype) for x, c in ((ex.q, q_scales), (ex.k, k_scales)))
    return _invariance("qk-scale-invariance", target, ex, causal, replace(ex, q=q, k=k))


@guarded("v-scale-invariance")
def v_scale_invariance(target: Target, ex: AttentionInputs, *, causal: bool) -> Finding | None:
    """Scaling V by a positive constant leaves an output-normalised (NormAttention) output unchanged."""
    c = float(_pow2_scales(_rng(ex, "vscale"), ()))
    changed = replace(ex, v=ex.v * c)
    return _invariance("v-scale-invariance", target, ex, causal, changed)


@guarded("weight-range")
def weight_range(target: Target, ex: AttentionInputs, *, causal: bool) -> Finding | None:
    """QK-norm softmax: every weight of a row with n keys lies in
    [1/(1 + (n-1) e^{2 tau}), 1/(1 + (n-1) e^{-2 tau})] (proofs/qknorm-weight-range.md), up to rounding."""
    eye = _identity_v(ex)
    p = target(ex.q, ex.k, eye, causal=causal, **ex.extras)
    b = bound_of(target, ex, causal=causal, v=eye)
    n = ex.q.shape[-2]
    tau = float(target.params["tau"])
    counts = np.arange(1, n + 1) if causal else np.full(n, n)
    lo_hi = np.array([qknorm_weight_range(int(c), tau) for c in counts])  # (N, 2)
    lo, hi = lo_hi[:, 0][:, None], lo_hi[:, 1][:, None]
    keep = np.tril(np.ones((n, n), bool)) if causal else np.ones((n, n), bool)
    out = np.where(keep, np.maximum(np.maximum(p - hi, lo - p), 0.0), 0.0)
    return ratio_finding("weight-range", out, b, ex, tau=tau)


@guarded("determinism")
def determinism(target: Target, ex: AttentionInputs, *, causal: bool) -> Finding | None:
    """Two calls on the same input give bit-identical outputs (NaN where NaN). A target that does not
    is reported with failure kind ``nondeterministic``: no other property's verdict can be trusted."""
    a = target(ex.q, ex.k, ex.v, causal=causal, **ex.extras)
    b = target(ex.q, ex.k, ex.v, causal=causal, **ex.extras)
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    changed = int((~same).sum())
    f = ratio_finding(
        "determinism", np.where(same, 0.0, np.abs(a - b) + 1e-300), np.zeros(a.shape), ex, changed_entries=changed
    )
    if changed:
        f.details["failure"] = "nondeterministic"
        f.details["error"] = f"{target.name}: two identical calls differ in {changed} entries"
    return f
