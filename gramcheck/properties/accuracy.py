"""Accuracy against the oracle: the rounding bound (agreement) and the low-precision rule."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..agreement import (
    LOW_PRECISION_K,
    at_noise_floor,
    check_agreement,
    naive_yardsticks,
    noise_bound,
    noise_entries,
    per_slice,
    slice_magnitude,
)
from ..findings import Finding
from ..oracle import truth
from ..precision import unit_roundoff
from ..strategies import AttentionInputs
from ..targets import Target
from .base import guarded, with_counterexample

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


@guarded("low-precision")
def low_precision(target: Target, ex: AttentionInputs, *, causal: bool) -> Finding | None:
    """max|T - truth| <= k max|naive - truth| + 4 u max(|truth|, |v|) with k = 2, the naive reference being the
    definition computed in the same dtype, or the variant's other standard algorithm there where that
    errs more (``agreement.naive_yardsticks``; proofs/low-precision-rule.md), over the entries that are not
    rounding noise (``agreement.rounding_noise``, as agreement judges them; a non-finite output there is
    still judged), and outside failing slices that are noise together (``agreement.at_noise_floor``). Where
    the naive definition itself is not finite the rule gives no bound and the Finding says so (agreement
    still applies)."""
    var = target.variant
    kw = {**target.params, **ex.extras}
    t = truth(var, ex.q, ex.k, ex.v, causal=causal, digits=6, **kw)
    defined = ~t.undefined
    if not defined.any():
        return None
    out = target(ex.q, ex.k, ex.v, causal=causal, **ex.extras)
    value = np.where(defined, t.value, 0.0)
    magnitude = slice_magnitude(value, ex.v)
    bound32 = noise_bound(var, ex.q, ex.k, ex.v, causal=causal, **kw)
    noisy = defined & np.isfinite(out) & noise_entries(bound32, magnitude)
    judged = defined & ~noisy
    if not judged.any():
        return None  # every entry is rounding noise: this input judges nothing
    forms = naive_yardsticks(var, ex.q, ex.k, ex.v, causal=causal, dtype=target.dtype, **kw)
    u = unit_roundoff(target.dtype)
    measured, details = -1.0, dict[str, Any]()
    for at, j in per_slice(judged):  # each (batch, head) slice on its own; the worst one reported
        # the scale of the output: |truth|, or |v| where the truth cancels to (near) zero
        scale = max(float(np.max(np.abs(value[at]))), float(np.max(np.abs(ex.v[at]))))
        floor = LOW_PRECISION_FLOOR_ULPS * u * scale
        while j.any():
            r, bound, info = _max_rule(out, t.value, j, forms, u, floor)
            # the entries past the bound, where they cancel to rounding noise together (as agreement judges
            # them): the yardstick's error there is luck, not accuracy; the rest of the slice judged again
            past = j & ~(np.abs(out - t.value) <= bound)
            if r > 1.0 and np.isfinite(out[j]).all() and at_noise_floor(bound32, t.value, t.bound, past):
                noisy |= past
                j = j & ~past
                continue
            if r > measured:
                measured, details = r, {**info, "slice": list(at)}
            break
    details["noise_entries"] = int(noisy.sum())
    if measured < 0:
        return None  # every judged slice is at the dtype's noise floor: this input judges nothing
    return with_counterexample(Finding("low-precision", float(measured), 1.0, details=details), ex)


def _max_rule(
    out: np.ndarray, value: np.ndarray, j: np.ndarray, forms: Any, u: float, floor: float
) -> tuple[float, float, dict[str, Any]]:
    """(measured, bound, details) of max_J |T - truth| <= k max_J |naive - truth| + floor over the entries
    ``j``, NaN counted as inf."""

    def largest(diff: np.ndarray, m: np.ndarray = j) -> float:
        return float(np.max(np.where(m, np.where(np.isnan(diff), np.inf, diff), 0.0), initial=0.0))

    def rule(e: float) -> float:
        return LOW_PRECISION_K * e + floor

    err_t = largest(np.abs(out - value))
    err_n = forms.error(value, j, u, largest, lambda e: err_t > rule(e))
    bound = rule(err_n)
    info: dict[str, Any] = {"target_error": err_t, "naive_error": err_n, "k": LOW_PRECISION_K, "floor": floor}
    if not np.isfinite(bound):
        info["note"] = "the naive reference is not finite in this dtype: the rule gives no bound"
        return 0.0, bound, info
    return (float(err_t / bound) if bound > 0 else (0.0 if err_t == 0 else float("inf"))), bound, info
