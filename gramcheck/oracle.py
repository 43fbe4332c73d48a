"""Adaptive-precision reference evaluation: the truth, known to a requested accuracy.

``truth`` evaluates the variant's definition in float64 ball arithmetic, which yields the float64
result together with a rigorous bound on its distance from the exact real result (proofs/
ball-arithmetic.md). Where that bound already meets the requested accuracy the float64 result is
returned; elsewhere the definition is re-evaluated in mpmath ball arithmetic with a precision chosen
from the shortfall (the bits float64 lacked, plus guard bits), doubling until the bound is met or
``max_prec`` is reached. The returned bound always covers the final rounding to float64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import variants as _variants
from .arith import BALL_F64, BallMP

GUARD_BITS = 10


@dataclass
class Truth:
    """The reference output (float64, shape of the output) and a componentwise bound with
    |value - exact| <= bound. ``arithmetic`` names what certified it ('float64' or 'mpmath[p]');
    ``undefined`` marks entries whose exact value is not a finite number (e.g. 0/0)."""

    value: np.ndarray
    bound: np.ndarray
    arithmetic: str
    prec: int
    met: bool
    undefined: np.ndarray
    tried: list[str] = field(default_factory=list)

    @property
    def escalated(self) -> bool:
        return self.arithmetic != "float64"


def _tolerance(value: np.ndarray, digits: float | None, atol: Any) -> np.ndarray:
    rel = 0.0 if digits is None else 10.0 ** (-digits)
    tol = rel * np.abs(value)
    if atol is not None:
        tol = np.maximum(tol, np.broadcast_to(np.asarray(atol, dtype=np.float64), value.shape))
    return tol


def truth(
    variant: Any,
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = False,
    digits: float | None = 10.0,
    atol: Any = None,
    max_prec: int = 2048,
    **kwargs: Any,
) -> Truth:
    """The exact output of ``variant`` on float64 inputs q, k, v (B, H, N, d) to ``digits`` correct
    significant digits componentwise, or within ``atol`` (scalar or array) where that is larger.

    ``digits`` above about 15.6 cannot be represented in float64; the bound then reflects float64
    rounding and ``met`` says whether the request was satisfied.
    """
    var = _variants.get(variant)
    if digits is None and atol is None:
        raise ValueError("digits: got None with atol None; expected an accuracy request")
    if digits is not None and (isinstance(digits, bool) or not math.isfinite(float(digits)) or digits <= 0):
        raise ValueError(f"digits: got {digits!r}; expected a positive finite number of decimal digits or None")
    if atol is not None and np.any(np.isnan(np.asarray(atol, dtype=np.float64))):
        raise ValueError("atol: got NaN entries; expected non-negative tolerances")
    tried: list[str] = []

    ball = var.reference(q, k, v, causal=causal, arith=BALL_F64, **kwargs)
    value = BALL_F64.to_float64(ball)
    bound = BALL_F64.radius(ball)
    tried.append("float64")
    finite = np.isfinite(value)
    tol = _tolerance(np.where(finite, value, 0.0), digits, atol)
    # a non-finite float64 result (overflow, 0/0) proves nothing about the exact value: escalate
    need = (bound > tol) | ~finite
    if not need.any():
        return Truth(value, bound, "float64", 53, True, ~finite, tried)

    # bits float64 lacked where it fell short; infinite radii (overflow, a denominator straddling 0)
    # start from a generous guess and double
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        short = np.log2(bound[need] / np.maximum(tol[need], np.finfo(float).tiny))
    short = np.where(np.isnan(short), np.inf, short)
    finite_short = short[np.isfinite(short)]
    extra = int(math.ceil(finite_short.max())) if finite_short.size else 64
    if not np.all(np.isfinite(short)):
        extra = max(extra, 64)
    prec = max(64, 53 + extra + GUARD_BITS)
    met = False
    while True:
        ar = BallMP(prec)
        ball = var.reference(q, k, v, causal=causal, arith=ar, **kwargs)
        tried.append(ar.name)
        with ar.context():
            mid = ball.mid
            value = ar.b.to_float64(mid)
            undefined = ~np.isfinite(value) & _nonfinite_mid(mid)
            # |float64(mid) - exact| <= rad + |mid - float64(mid)|
            rad = ar.radius(ball)
            bound = rad + np.abs(ar.b.to_float64(mid - ar.b.asarray(np.where(undefined, 0.0, value))))
        bound = np.where(undefined, np.inf, bound)
        tol = _tolerance(np.where(undefined, 0.0, value), digits, atol)
        # the float64 rounding of the value is part of the bound; a request finer than float64 can hold
        # is met when the mpmath radius alone meets it
        met = bool(np.all((rad <= tol) | undefined))
        if met or prec * 2 > max_prec:
            return Truth(value, bound, ar.name, prec, met, undefined, tried)
        prec *= 2


def _nonfinite_mid(mid: Any) -> np.ndarray:
    import mpmath

    return np.vectorize(lambda x: not mpmath.isfinite(x), otypes=[bool])(np.asarray(mid, dtype=object))
