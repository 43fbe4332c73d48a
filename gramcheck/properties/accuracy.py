"""Accuracy against the oracle: the rounding bound (agreement) and the low-precision rule."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..agreement import (
    LOW_PRECISION_K,
    Yardsticks,
    check_agreement,
    judged_in_range,
    naive_yardsticks,
    output_distance,
    own_rounding,
    per_slice,
    probabilistic_bound,
    quiet_rows,
    resolution_radius,
    rounding_noise,
    row_scales,
    slice_magnitude,
    unresolved_entries,
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
    definition computed in the same dtype, or the variant's other standard algorithm there where that errs more
    (``agreement.naive_yardsticks``; proofs/low-precision-rule.md), over the entries that are not rounding
    noise (``agreement.rounding_noise``, as agreement judges them; a non-finite output there is still judged)
    and that a standard algorithm computes in the dtype's range (``agreement.judged_in_range``). In a slice
    that fails, each entry's error is first excused up to its own rounding (``agreement.own_rounding``), as
    agreement does. Where the naive definition itself is not finite the rule gives no bound and the Finding
    says so (agreement still applies)."""
    var = target.variant
    kw = {**target.params, **ex.extras}
    t = truth(var, ex.q, ex.k, ex.v, causal=causal, digits=6, **kw)
    defined = ~t.undefined
    if not defined.any():
        return None
    out = target(ex.q, ex.k, ex.v, causal=causal, **ex.extras)
    # rows whose denominator the dtype does not resolve are judged by no rule, as agreement (NaN still is),
    # nor do their values set the output's scale
    unresolved = unresolved_entries(var, ex.q, ex.k, ex.v, causal=causal, dtype=target.dtype, **kw)
    value = np.where(defined & ~unresolved, t.value, 0.0)
    magnitude = slice_magnitude(value, ex.v)
    forms = naive_yardsticks(var, ex.q, ex.k, ex.v, causal=causal, dtype=target.dtype, **kw)
    noisy = defined & np.isfinite(out) & rounding_noise(var, ex.q, ex.k, ex.v, causal=causal, magnitude=magnitude, **kw)
    if noisy.any():
        noisy &= ~quiet_rows(var, kw, forms.forward, t.value, magnitude)
    u = unit_roundoff(target.dtype)
    # only where the naive forms compute in range: a yardstick that overflowed errs the whole row, and would
    # pass anything (agreement's bounds judge the rest)
    judged = judged_in_range(forms.forward, t.value, defined & ~noisy & ~(unresolved & ~np.isnan(out)), u)
    if not judged.any():
        return None  # every entry is rounding noise or out of the rule's range: this input judges nothing
    dist = output_distance(out, t.value, target.dtype)

    @functools.cache
    def excuse() -> np.ndarray | None:
        """``own_rounding``, evaluated once, when a slice first fails."""
        return own_rounding(var, ex.q, ex.k, ex.v, causal=causal, dtype=target.dtype, **kw)

    @functools.cache
    def rows() -> np.ndarray:
        """``row_scales``, evaluated once, when a slice first passes the rule over the whole slice."""
        pbound = probabilistic_bound(var, ex.q, ex.k, ex.v, causal=causal, dtype=target.dtype, **kw)[0]
        return row_scales(pbound, magnitude, u)

    measured, details = -1.0, dict[str, Any]()
    resolution: np.ndarray | None = None
    for at, j in per_slice(judged):  # each (batch, head) slice on its own; the worst one reported
        # the scale of the output: |truth|, or |v| where the truth cancels to (near) zero
        scale = max(float(np.max(np.abs(value[at]))), float(np.max(np.abs(ex.v[at]))))
        floor = LOW_PRECISION_FLOOR_ULPS * u * scale
        rule = _SliceRule(j, floor, forms, t.value, u)
        zero_yardstick = float("inf")
        if np.all(np.abs(t.value[j]) <= t.bound[j]):  # the exact value is 0: one rounding per result, as agreement
            if resolution is None:
                resolution = resolution_radius(var, ex.q, ex.k, ex.v, causal=causal, dtype=target.dtype, **kw)
            zero_yardstick = rule.largest(resolution)
        if np.isfinite(zero_yardstick):
            err_n, scales = zero_yardstick, None
        else:
            err_n, scales = forms.error(t.value, j, u, rule.largest, rule.fails(rule.largest(dist))), rows
        (r, err_t, norm), yardstick = rule.judge(dist, err_n, scales), None
        if r > 1 and scales is not None:  # each entry's own rounding first, as agreement
            own = excuse()
            if own is not None and (excused := rule.judge(np.maximum(dist - own, 0.0), err_n, scales))[0] < r:
                (r, err_t, norm), yardstick = excused, "own rounding"
        note = None
        if not np.isfinite(LOW_PRECISION_K * err_n + floor):
            r, note = 0.0, "the naive reference is not finite in this dtype: the rule gives no bound"
        if r > measured:
            measured = r
            details = {"target_error": err_t, "naive_error": err_n, "k": LOW_PRECISION_K, "floor": floor}
            details.update({"slice": list(at), "norm": norm}, **({"note": note} if note else {}))
            if yardstick is not None:
                details["yardstick"] = yardstick
    details["noise_entries"] = int(noisy.sum())
    return with_counterexample(Finding("low-precision", float(measured), 1.0, details=details), ex)


@dataclass(frozen=True)
class _SliceRule:
    """The rule on one (batch, head) slice: its judged entries ``mask``, its ``floor`` and yardsticks."""

    mask: np.ndarray
    floor: float
    forms: Yardsticks
    truth_value: np.ndarray
    u: float

    def largest(self, diff: np.ndarray) -> float:
        """max over the judged entries, NaN as inf."""
        return float(np.max(np.where(self.mask, np.where(np.isnan(diff), np.inf, diff), 0.0), initial=0.0))

    def ratio(self, err_t: float, err_n: float, floor: float | None = None) -> float:
        """err_t / (k err_n + floor), the slice's floor unless given."""
        bound = LOW_PRECISION_K * err_n + (self.floor if floor is None else floor)
        return float(err_t / bound) if bound > 0 else (0.0 if err_t == 0 else float("inf"))

    def fails(self, err_t: float, floor: float | None = None) -> Callable[[float], bool]:
        """Whether err_t fails against a yardstick's error (``Yardsticks.error`` asks the other order then)."""
        return lambda e: self.ratio(err_t, e, floor) > 1

    def judge(self, d: np.ndarray, err_n: float, scales: Callable[[], np.ndarray] | None) -> tuple[float, float, str]:
        """(ratio, err_t, norm) of the distances ``d``: the rule over the slice and, where that passes and
        ``scales`` gives the rows' c (``agreement.row_scales``), each row in its own scale,
        |d_i| <= k c_i max_j(|naive_j - truth_j| / c_j) + floor; the larger ratio and the norm that gave it."""
        err_t = self.largest(d)
        r_slice = self.ratio(err_t, err_n)
        if r_slice > 1 or scales is None or not np.isfinite(err_n):
            return r_slice, err_t, "slice"
        c = scales()
        with np.errstate(invalid="ignore"):  # a row of no finite scale is judged over the slice only

            def weighted(x: np.ndarray) -> float:
                return self.largest(x / c)

            per_c = self.forms.error(self.truth_value, self.mask, self.u, weighted, self.fails(weighted(d), 0.0))
            allowed = np.where(np.isinf(c), np.inf, LOW_PRECISION_K * per_c * c + self.floor)
            per_row = self.largest(d / allowed)
        return (per_row, err_t, "rows") if per_row > r_slice else (r_slice, err_t, "slice")
