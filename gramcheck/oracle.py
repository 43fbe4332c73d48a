"""Adaptive-precision reference evaluation: the truth, known to a requested accuracy.

``truth`` evaluates the variant's definition in coarse float64 ball arithmetic first (radius rad + rel |mid| per
tensor, ``coarse_arith``: about the cost of the plain float64 evaluation), and returns it where that radius
already meets the request everywhere; otherwise in float64 ball arithmetic (a radius per entry). Either
yields the float64 result together with a rigorous bound on its distance from the exact real result
(proofs/ball-arithmetic.md, "Coarse first pass"); a variant's own certified float64 evaluation comes first
where it has one (``Variant.enclosure``: the delta rule, whose ball radii wrap; proofs/delta-enclosure.md). Where that
bound already meets the requested accuracy the float64 result is returned; elsewhere the definition is
re-evaluated in mpmath ball arithmetic, on the batch items that fell short (and, for a causal
evaluation of an exactly causal variant, only the tokens up to the last entry that fell short), with a
precision chosen from the shortfall (the bits float64 lacked, plus guard bits) and raised by the
shortfall measured at that precision until the bound is met or ``max_prec`` is reached. The returned
bound always covers the final rounding to float64.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from . import variants as _variants
from .arb_arith import ArbArith, available
from .arith import BALL_F64, BallArith, BallMP
from .coarse_arith import COARSE_F64

GUARD_BITS = 10


@dataclass
class Truth:
    """The reference output (float64, shape of the output) and a componentwise bound with
    |value - exact| <= bound. ``arithmetic`` names what certified it ('float64-coarse', 'float64',
    'arb[p]' or 'mpmath[p]');
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
        return self.arithmetic not in ("float64", COARSE_F64.name)

    def exact_where(self, mask: np.ndarray, value: np.ndarray) -> Truth:
        """This truth with ``value`` and a bound of 0 where ``mask``: entries a ball evaluation of the same
        formula certified exactly (radius 0: every operation on the way was exact, so its float64 midpoint
        is the exact value; proofs/ball-arithmetic.md), which an enclosure charging eta everywhere (the
        coarse balls, the delta rule's) leaves a few subnormals wide."""
        if not np.any(mask):
            return self
        return replace(
            self,
            value=np.where(mask, value, self.value),
            bound=np.where(mask, 0.0, self.bound),
            undefined=self.undefined & ~mask,
        )


def _tolerance(value: np.ndarray, digits: float | None, atol: Any) -> np.ndarray:
    rel = 0.0 if digits is None else 10.0 ** (-digits)
    tol = rel * np.abs(value)
    if atol is not None:
        tol = np.maximum(tol, np.broadcast_to(np.asarray(atol, dtype=np.float64), value.shape))
    return tol


def escalation_arith(prec: int) -> BallArith | ArbArith:
    """The multiprecision ball arithmetic the oracle escalates to: Arb (python-flint) where installed,
    else ball arithmetic over mpmath; both enclose the exact value (GRAMCHECK_ORACLE=mpmath forces the
    latter)."""
    if os.environ.get("GRAMCHECK_ORACLE", "") != "mpmath" and available():
        return ArbArith(prec)
    return BallMP(prec)


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
    rows: bool = True,
    **kwargs: Any,
) -> Truth:
    """The exact output of ``variant`` on float64 inputs q, k, v (B, H, N, d) to ``digits`` correct
    significant digits componentwise, or within ``atol`` (scalar or array) where that is larger.

    ``digits`` above about 15.6 cannot be represented in float64; the bound then reflects float64
    rounding and ``met`` says whether the request was satisfied. ``rows=False`` escalates the whole
    tensor instead of the batch items and causal prefix that fell short (same truth, more work).
    """
    var = _variants.get(variant)
    _check_request(digits, atol, kwargs)
    tried: list[str] = []

    certified = var.enclosure(q, k, v, causal=causal, **kwargs)  # the variant's own, where ball radii wrap
    if certified is None:
        coarse = var.reference(q, k, v, causal=causal, arith=COARSE_F64, **kwargs)
        value, bound, undefined = COARSE_F64.certify64(coarse)
        tried.append(COARSE_F64.name)
        if not undefined.any() and not (bound > _tolerance(value, digits, atol)).any():
            return Truth(value, bound, COARSE_F64.name, 53, True, undefined, tried)
        ball = var.reference(q, k, v, causal=causal, arith=BALL_F64, **kwargs)
        certified = BALL_F64.to_float64(ball), BALL_F64.radius(ball)
    value, bound = certified
    tried.append("float64")
    finite = np.isfinite(value)
    tol = _tolerance(np.where(finite, value, 0.0), digits, atol)
    # a non-finite float64 result (overflow, 0/0) proves nothing about the exact value: escalate
    need = (bound > tol) | ~finite
    if not need.any():
        return Truth(value, bound, "float64", 53, True, ~finite, tried)

    sub = _escalation_slice(var, need, (q, k, v), causal=causal, kwargs=kwargs) if rows else None
    if sub is None:
        idx: tuple[Any, ...] = (slice(None),)
        qs, ks, vs, kw = q, k, v, kwargs
    else:
        idx, (qs, ks, vs, kw) = sub
    # bits float64 lacked where it fell short; no finite radius (overflow, a denominator straddling 0):
    # start at 53 + guard bits and measure
    prec = min(max_prec, 53 + _shortfall_bits(bound[need], tol[need], default=0) + GUARD_BITS)
    while True:
        ar = escalation_arith(prec)
        ball = var.reference(qs, ks, vs, causal=causal, arith=ar, **kw)
        tried.append(ar.name)
        val_s, bnd_s, undef_s = ar.certify64(ball)
        rad = ar.radius(ball)
        tol_s = _tolerance(np.where(undef_s, 0.0, val_s), digits, _atol_slice(atol, value.shape, idx))
        # the float64 rounding of the value is part of the bound; a request finer than float64 can hold
        # is met when the mpmath radius alone meets it
        short = (rad > tol_s) & ~undef_s
        met = not bool(short.any())
        if met or prec >= max_prec:
            break
        # raise the precision by the shortfall measured at this one (radii scale as 2^-prec), not past max_prec
        prec = min(max_prec, prec + _shortfall_bits(rad[short], tol_s[short], default=prec) + GUARD_BITS)
    value = value.copy()
    bound = bound.copy()
    undefined = ~finite
    value[idx], bound[idx], undefined[idx] = val_s, bnd_s, undef_s
    if sub is not None:
        # entries outside the slice kept their float64 certificate, which met the request
        met = met and not bool(need[_outside(idx, need.shape)].any())
    return Truth(value, bound, ar.name, prec, met, undefined, tried)


def truth_given(
    variant: Any,
    q: Any,
    k: Any,
    v: Any,
    certified: tuple[np.ndarray, np.ndarray],
    *,
    causal: bool = False,
    digits: float | None = 10.0,
    atol: Any = None,
    max_prec: int = 2048,
    **kwargs: Any,
) -> Truth:
    """``truth`` for a caller that already holds a float64 certificate ``certified`` = (value, bound) of
    the exact output, |value - exact| <= bound entrywise (the rounding model's,
    ``arith.RoundingModel.float64_certificate``): the entries it meets are returned as they are, and
    ``truth`` computes the others, on the batch items (and causal prefix) that hold them
    (``_escalation_slice``), or on the whole problem where that is no larger."""
    var = _variants.get(variant)
    _check_request(digits, atol, kwargs)
    value, bound = (np.asarray(x, dtype=np.float64) for x in certified)
    finite = np.isfinite(value)
    need = (bound > _tolerance(np.where(finite, value, 0.0), digits, atol)) | ~finite
    if not need.any():
        return Truth(value, bound, "float64", 53, True, ~finite, ["float64 (given)"])
    sub = _escalation_slice(var, need, (q, k, v), causal=causal, kwargs=kwargs)
    if sub is None:
        return truth(var, q, k, v, causal=causal, digits=digits, atol=atol, max_prec=max_prec, **kwargs)
    idx, (qs, ks, vs, kw) = sub
    atol_s = _atol_slice(atol, value.shape, idx)
    t = truth(var, qs, ks, vs, causal=causal, digits=digits, atol=atol_s, max_prec=max_prec, **kw)
    value, bound, undefined = value.copy(), bound.copy(), ~finite
    value[idx], bound[idx], undefined[idx] = t.value, t.bound, t.undefined
    met = t.met and not bool(need[_outside(idx, need.shape)].any())
    return Truth(value, bound, t.arithmetic, t.prec, met, undefined, ["float64 (given)", *t.tried])


def _check_request(digits: float | None, atol: Any, kwargs: Any) -> None:
    if kwargs.get("output_final_state"):
        raise ValueError(
            "output_final_state: got True; the truth is that of the output alone (the final state's is "
            "gramcheck.properties.state.state_truth's)"
        )
    if digits is None and atol is None:
        raise ValueError("digits: got None with atol None; expected an accuracy request")
    if digits is not None and (isinstance(digits, bool) or not math.isfinite(float(digits)) or digits <= 0):
        raise ValueError(f"digits: got {digits!r}; expected a positive finite number of decimal digits or None")
    if atol is not None and np.any(np.isnan(np.asarray(atol, dtype=np.float64))):
        raise ValueError("atol: got NaN entries; expected non-negative tolerances")


def _shortfall_bits(bound: np.ndarray, tol: np.ndarray, *, default: int) -> int:
    """ceil(max log2(bound / tol)) over the finite ratios; ``default`` where none is finite."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        short = np.log2(bound / np.maximum(tol, np.finfo(float).tiny))
    finite = short[np.isfinite(short)]
    extra = int(math.ceil(finite.max())) if finite.size else default
    if finite.size < short.size:
        extra = max(extra, default)
    return max(extra, 0)


def _outside(idx: tuple[Any, ...], shape: tuple[int, ...]) -> np.ndarray:
    inside = np.zeros(shape, dtype=bool)
    inside[idx] = True
    return ~inside


def _atol_slice(atol: Any, shape: tuple[int, ...], idx: tuple[Any, ...]) -> Any:
    if atol is None:
        return None
    return np.broadcast_to(np.asarray(atol, dtype=np.float64), shape)[idx]


def _escalation_slice(
    var: Any, need: np.ndarray, qkv: tuple[Any, ...], *, causal: bool, kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], tuple[Any, ...]] | None:
    """(index into the output, (q, k, v, kwargs) of the sub-problem) covering every entry of ``need``,
    or None when the whole problem is no larger. Batch items are independent in every definition (no
    reduction crosses B); a causal evaluation of a variant that declares exact causality ("causal",
    without "causal-rounding", whose exactness rests on a stabiliser cancelling) needs only the tokens up
    to the last entry that fell short. Heads are never sliced: per-head hyperparameters (RetNet's
    gamma_h) are indexed by head position and count. Packed sequences (cu_seqlens) are not sliced."""
    if kwargs.get("cu_seqlens") is not None:
        return None
    B, _, N, _ = need.shape
    batch = np.flatnonzero(need.any(axis=(1, 2, 3)))
    prefix = N
    if causal and "causal" in var.declares and "causal-rounding" not in var.declares:
        prefix = int(np.flatnonzero(need.any(axis=(0, 1, 3))).max()) + 1
    if batch.size == B and prefix == N:
        return None
    names = {getattr(i, "name", i): getattr(i, "axes", None) for i in var.inputs}
    take = np.ix_(batch, np.arange(need.shape[1]), np.arange(prefix))  # (B', H, N') of (B, H, N)

    def cut(x: Any, axes: Any) -> Any:
        x = np.asarray(x)
        if axes is not None:
            if tuple(axes[:3]) == ("B", "H", "N"):
                return x[take]
            if "B" in axes or "N" in axes:
                raise ValueError(f"input axes {axes}: expected (B, H, N, ...) for a per-token input")
            return x
        return x[take] if x.ndim >= 3 and x.shape[:3] == (B, need.shape[1], N) else x

    qs = tuple(np.asarray(x)[take] for x in qkv)
    kw = {n: (cut(x, names[n]) if n in names and x is not None else x) for n, x in kwargs.items()}
    if kwargs.get("initial_state") is not None:  # one state (B, H, d_k, d_v) per batch item, before token 0
        kw["initial_state"] = np.asarray(kwargs["initial_state"])[batch]
    return (batch, slice(None), slice(0, prefix)), (*qs, kw)
