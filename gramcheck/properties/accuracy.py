"""Accuracy against the oracle: the rounding bound (agreement) and the low-precision rule."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..agreement import check_agreement
from ..arith import RoundedArith
from ..findings import Finding
from ..oracle import truth
from ..precision import unit_roundoff
from ..strategies import AttentionInputs
from ..targets import Target
from .base import guarded, with_counterexample

LOW_PRECISION_K = 2.0  # FlashAttention's tests: error(target) <= 2 * error(plain reference, same dtype)
LOW_PRECISION_FLOOR_ULPS = 4.0  # the output's own last roundings (numerator, denominator, quotient): 3u|o|


@guarded("agreement")
def agreement(target: Target, ex: AttentionInputs, *, causal: bool) -> Finding | None:
    """|T(q, k, v) - truth| <= 2 R(u_dtype) componentwise, R the first-order rounding bound of the
    definition (proofs/fp-forward-error.md); details carry the bits of error beyond the bound."""
    out = target(ex.q, ex.k, ex.v, causal=causal, **ex.extras)
    f = check_agreement(
        "agreement",
        out,
        target.variant,
        ex.q,
        ex.k,
        ex.v,
        causal=causal,
        dtype=target.dtype,
        **target.params,
        **ex.extras,
    )
    return with_counterexample(f, ex)


def naive_reference(target: Target, ex: AttentionInputs, *, causal: bool) -> np.ndarray:
    """The definition evaluated with every operation rounded to the target's dtype."""
    ar = RoundedArith(target.dtype)
    with np.errstate(all="ignore"):
        ball = target.variant.reference(ex.q, ex.k, ex.v, causal=causal, arith=ar, **target.params, **ex.extras)
    return ar.to_float64(ball)


@guarded("low-precision")
def low_precision(target: Target, ex: AttentionInputs, *, causal: bool) -> Finding | None:
    """max|T - truth| <= k max|naive - truth| + 4 u max(|truth|, |v|) with k = 2, the naive reference being the
    definition computed in the same dtype (proofs/low-precision-rule.md). Where the naive reference
    itself is not finite the rule gives no bound and the Finding says so (agreement still applies)."""
    t = truth(target.variant, ex.q, ex.k, ex.v, causal=causal, digits=6, **target.params, **ex.extras)
    defined = ~t.undefined
    if not defined.any():
        return None
    out = target(ex.q, ex.k, ex.v, causal=causal, **ex.extras)
    naive = naive_reference(target, ex, causal=causal)
    err_t = float(np.max(np.where(defined, np.abs(out - t.value), 0.0), initial=0.0))
    diff_n = np.where(defined, np.abs(naive - t.value), 0.0)
    err_n = float(np.max(np.where(np.isnan(diff_n), np.inf, diff_n), initial=0.0))
    if np.isnan(err_t):
        err_t = float("inf")
    # the scale of the output: |truth|, or |v| where the truth cancels to (near) zero
    scale = max(float(np.max(np.abs(np.where(defined, t.value, 0.0)))), float(np.max(np.abs(ex.v))))
    floor = LOW_PRECISION_FLOOR_ULPS * unit_roundoff(target.dtype) * scale
    bound = LOW_PRECISION_K * err_n + floor
    details: dict[str, Any] = {"target_error": err_t, "naive_error": err_n, "k": LOW_PRECISION_K, "floor": floor}
    if not np.isfinite(bound):
        details["note"] = "the naive reference is not finite in this dtype: the rule gives no bound"
        measured = 0.0
    else:
        measured = float(err_t / bound) if bound > 0 else (0.0 if err_t == 0 else float("inf"))
    return with_counterexample(Finding("low-precision", float(measured), 1.0, details=details), ex)
