"""The ``Property`` record and what every property shares: the guard that turns a misbehaving target into
a failing Finding, and the ratio form of a Finding (measured = worst error / bound, passes at <= 1)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..agreement import output_distance, rounding_bound
from ..findings import Finding, error_ratios
from ..strategies import KINDS, AttentionInputs
from ..targets import Target, TargetError
from ..variants.spec import Variant

# example kinds a property draws from unless told otherwise: every adversarial kind but ``overflow``,
# which is a stress domain asked for explicitly (domain=...)
DEFAULT_KINDS = tuple(k for k in KINDS if k != "overflow")


@dataclass(frozen=True)
class Property:
    """A checkable property. ``fn(target, ex, causal=...)`` returns a Finding for one drawn input (or
    None when the input is outside the property's domain); ``applies(variant, causal, params)`` says
    whether it is meaningful for a target. ``proof`` names the file in proofs/ behind its bound."""

    name: str
    fn: Callable[..., Finding | None]
    applies: Callable[[Variant, bool, dict[str, Any]], bool]
    proof: str
    summary: str
    kinds: tuple[str, ...] = DEFAULT_KINDS
    max_n: int | None = None  # a cap on N for expensive properties (gradients)
    max_d: int | None = None
    # the batch rows it draws up to, at least (the state properties: a kernel's per-batch state offsets)
    min_b: int = 1
    default: bool = True  # in the default set of ``check`` (diagnostics are opt-in)
    # applies to the variant, but not under these hyperparameters: the reason (listed as skipped) or None
    unless: Callable[[Variant, bool, dict[str, Any]], str | None] | None = None
    # holds for every random draw a target makes itself (Target.own_draws): it compares nothing with the
    # reference's draw; the others are skipped for such a target
    any_draw: bool = False
    max_examples: int | None = None  # a cap on the examples (each one costs many target calls)


def guarded(name: str) -> Callable[[Callable[..., Finding | None]], Callable[..., Finding | None]]:
    """Wrap a property so that a misbehaving target gives a failing Finding of that failure kind."""

    def deco(fn: Callable[..., Finding | None]) -> Callable[..., Finding | None]:
        @functools.wraps(fn)
        def wrapper(target: Target, ex: AttentionInputs, **kw: Any) -> Finding | None:
            try:
                return fn(target, ex, **kw)
            except TargetError as err:
                return Finding(
                    name,
                    float("inf"),
                    1.0,
                    counterexample=ex.summary(),
                    details={"failure": err.kind, "error": err.message},
                    arrays=arrays_of(ex),
                )

        return wrapper

    return deco


def arrays_of(ex: AttentionInputs) -> dict[str, np.ndarray]:
    return {"q": ex.q, "k": ex.k, "v": ex.v, **ex.extras}


def ratio_finding(
    name: str, err: np.ndarray, bound: np.ndarray, ex: AttentionInputs, *, rigour: str = "sampled", **details: Any
) -> Finding:
    """Finding with measured = max_i err_i / bound_i (inf where err is NaN or the bound is 0 < err)."""
    err = np.asarray(err, dtype=np.float64)
    bound = np.broadcast_to(np.asarray(bound, dtype=np.float64), err.shape)
    r = error_ratios(err, bound)
    # an infinite bound (the rounding model says the definition cannot be computed in this dtype there:
    # features underflowing to 0/0) judges nothing: such entries are counted, as agreement counts them
    uncertifiable = np.isinf(bound) & (bound > 0)
    if uncertifiable.any():
        r = np.where(uncertifiable, 0.0, r)
        details.setdefault("uncertifiable_entries", int(uncertifiable.sum()))
    measured = float(r.max()) if r.size else 0.0
    if r.size:
        worst = np.unravel_index(int(np.argmax(r)), r.shape)
        details.setdefault("worst_index", [int(i) for i in worst])
        details.setdefault("worst_error", float(err[worst]))
        details.setdefault("worst_bound", float(bound[worst]))
    f = Finding(name, measured, 1.0, rigour=rigour, details=details)
    return with_counterexample(f, ex)


def with_counterexample(f: Finding, ex: AttentionInputs) -> Finding:
    """``f`` with the input's summary and arrays attached when it fails (its verdict decides)."""
    if not f.passed:
        f.counterexample = {**ex.summary(), **(f.counterexample or {})}
        f.arrays = arrays_of(ex)
    return f


def output_difference(a: np.ndarray, b: np.ndarray, dtype: Any = None, *, nan_agrees: bool = True) -> np.ndarray:
    """|a - b| of two outputs of a target: 0 where equal (infinities included: inf - inf is no difference of two
    runs that both overflow) or, where ``nan_agrees``, both NaN; inf where only one is NaN (or either, where NaN
    in both runs is no agreement: the property's exact results are finite). With the outputs'
    ``dtype``, an infinity against a finite value is read as the nearest value that rounds to it
    (``agreement.output_distance``): two runs of a correct form may round an exact value near the overflow
    threshold to 65504 and to inf."""
    same = (a == b) | (np.isnan(a) & np.isnan(b) & nan_agrees)
    with np.errstate(invalid="ignore"):
        diff = np.abs(a - b)
        if dtype is not None:
            diff = np.where(np.isinf(a) & np.isfinite(b), output_distance(a, b, dtype), diff)
            diff = np.where(np.isinf(b) & np.isfinite(a), output_distance(b, a, dtype), diff)
    return np.where(same, 0.0, np.where(np.isnan(diff), np.inf, diff))


def bound_of(
    target: Target, ex: AttentionInputs, *, causal: bool, v: np.ndarray | None = None, **extras: Any
) -> np.ndarray:
    """2 R(u_dtype): the componentwise rounding bound of the definition in the target's dtype
    (proofs/fp-forward-error.md), with the target's hyperparameters."""
    ex_extras = {**ex.extras, **extras}
    return rounding_bound(
        target.variant,
        ex.q,
        ex.k,
        ex.v if v is None else v,
        causal=causal,
        dtype=target.dtype,
        **target.params,
        **ex_extras,
    )


def always(variant: Variant, causal: bool, params: dict[str, Any]) -> bool:
    return True


def declares(
    *tags: str, causal: bool | None = None, absent: tuple[str, ...] = ()
) -> Callable[[Variant, bool, dict[str, Any]], bool]:
    """Applicability: with the target's hyperparameters the variant holds every tag and none of
    ``absent`` (and the mode matches ``causal`` if given)."""

    def test(variant: Variant, c: bool, params: dict[str, Any]) -> bool:
        held = variant.tags(params)
        return all(t in held for t in tags) and not held & set(absent) and (causal is None or c == causal)

    return test
