"""The rounding of cumulative log-decays (proofs/fp-forward-error.md, "Cumulative log-decays").

Every production form of a gated recurrence takes its decay weights as exp of differences of cumulative
log-decays, exp(b^_t - b^_s) with b^_r = fl(b^_{r-1} + g_r) (gramcheck.forms, fla's chunked kernels and naive
references, Mamba2's SSD), where the definition multiplies the one-step decays exp(g_r). The computed sums
are the exact cumulative sums of g'_r = b^_r - b^_{r-1}, and

    |g'_r - g_r| <= u / (1 - u) |b^_r| <= u / (1 - u) (1 + gamma_N) M_r,      M_r = sum_{j <= r} |g_j|,

so such a form evaluates the definition at log-decays g' (the same for every pair s, t): a backward error
that grows with the cumulative magnitude M_r, which the definition's rounding model does not contain (after a
strong decay, b ~ -133 and b_t - b_s ~ -0.002: 133 u in a weight of about 1). The subtraction
b^_t - b^_s adds at most u |b^_t - b^_s| <= u sum_{s < r <= t} |g'_r| to the exponent, charged as a
further u |g'_r| on each log-decay of the path. The sums are held in float64 (gramcheck.forms; a float64
target has no wider format), so u = 2^-53 for every dtype. A kernel that holds them in float32 is not
covered: it loses |b| 2^-24 and fails where the decays are strong then weak (tests/test_gated.py).

Sums formed one after another are covered as a backward error; a parallel scan (a GPU's cumsum) can err up
to about 2 log2 N times more and is not charged (a false alarm there, never a wrong pass; the proof says why).

The share of a rounding bound is R(rho) - R(0): the radius of the definition evaluated in the same model with
every log-decay input widened by rho, less the radius without (every term rho contributes, and nothing
else); computed only where the definition's bounds fail (``algorithm_underflow.judged``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from .precision import gamma

_U = math.ldexp(1.0, -53)  # the cumulative sums' unit roundoff: float64


def log_decay_inputs(var: Any) -> tuple[Any, ...]:
    """The variant's per-token log-decay inputs (``InputSpec.log_decay``)."""
    return tuple(spec for spec in var.inputs if spec.log_decay)


def log_decay_radii(var: Any, extras: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """rho per log-decay input present in ``extras``, shaped as the input:

        rho_r = (u / (1 - u)) (1 + gamma_N)^2 (1 + u) M_r + u |g_r|,   M_r = sum_{j <= r} |g_j| along the tokens,

    one factor (1 + gamma_N) for the computed sums' growth over M_r, one for the float64 evaluation of M_r
    itself, (1 + u) for |g'_r| <= |g_r| + u |b^_r| in the subtraction's charge, all rounded up by (1 + 8u)."""
    radii = {}
    for spec in log_decay_inputs(var):
        if extras.get(spec.name) is None:
            continue
        g = np.abs(np.asarray(extras[spec.name], dtype=np.float64))
        axis = spec.axes.index("N")
        n = g.shape[axis]
        grow = (1.0 + float(gamma(max(n, 1)))) ** 2
        rho = (_U / (1.0 - _U)) * grow * (1.0 + _U) * np.cumsum(g, axis=axis) + _U * g
        radii[spec.name] = rho * (1.0 + 8 * _U)
    return radii


def decay_sum_share(
    var: Any,
    result: Any,
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool,
    dtype: Any,
    model: Callable[[Any], Any],
    **kw: Any,
) -> tuple[np.ndarray, ...] | None:
    """R(rho) - R(0) per part of ``result`` (the definition's ball in ``model(dtype)``: one ball, or (out, S_N)),
    entrywise, 0 where not finite (an unbounded share proves nothing); None where the variant has no
    log-decay input on this call, or the call packs sequences (the sums restart per sequence)."""
    radii = log_decay_radii(var, {n: kw[n] for n in var.input_names if n in kw})
    if not radii or kw.get("cu_seqlens") is not None:
        return None
    ar = model(dtype)
    with np.errstate(all="ignore"):
        widened = var.reference(q, k, v, causal=causal, arith=ar, input_radii=radii, **kw)
        parts = widened if isinstance(widened, tuple) else (widened,)
        base = result if isinstance(result, tuple) else (result,)
        shares = []
        for w, b in zip(parts, base, strict=True):
            d = np.asarray(ar.radius(w), dtype=np.float64) - np.asarray(b.ar.radius(b), dtype=np.float64)
            shares.append(np.where(np.isfinite(d), np.maximum(d, 0.0), 0.0))
    return tuple(shares)
