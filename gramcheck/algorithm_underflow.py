"""The underflow charges of a variant's other standard algorithms (proofs/fp-forward-error.md, "Other
algorithms' underflow").

A production form may evaluate another standard algorithm than the definition (its own: the chunked delta
rule, FAVOR+'s linear form, ``Variant.algorithms_for``; and the recurrent and chunked state orders of
linear attention that its definition reaches, ``Variant.orders_for``), and where that algorithm's
intermediates fall into the subnormals (or, for a target that flushes, below the smallest normal:
``arith.subnormals``) it errs by absolute amounts, up to eta / 2 per subnormal result times the
coefficients that carry it to the output, that the definition's rounding model does not see (Gated
DeltaNet's chunked algorithm forms a cumulative decay of e^-103 and multiplies it by a state 190 times its
updates). The underflow share of algorithm A is

    U_A = R_A(u, eta) - R_A(u, 0),

its rounding-model radius with the dtype's underflow unit less the same radius without it: every term
an underflow contributed, and nothing of A's relative rounding, which can be vacuous (the chunked delta
rule's triangular solve in bfloat16) and must not loosen the definition's bounds. A rounding bound
becomes C (R_def + max_A U_A), an infinite or undefined U_A counting 0 (it proves nothing). The model
charges eta / 2 only to a result that may be a nonzero subnormal and to each nonzero product of an inner
product (``arith.BallArith._underflow``), so U_A is 0 wherever no intermediate of A can underflow. It
is not charged in float16, whose kernels accumulate in float32 (fla, performer-pytorch under autocast,
torch's and cuBLAS's half-precision GEMMs), so that float16's subnormals (6e-8 to 6.1e-5, ordinary
values) arise only where a result is stored: the other algorithms' float16 intermediates are roundings
production kernels do not make, and charging them passed wrong float16 outputs.

The second pass adds, for a variant with log-decay inputs, the share of their cumulative sums
(``decay_sums``): the other algorithms' relative rounding in exactly one place, the decay weights, whose
backward error is bounded by the sums' magnitudes and is never vacuous in float64.

The definition's bounds judge first; the share is computed only for a judgment that fails with them
(``judged``), so a correct output that the definition's bounds already pass costs nothing more, and only
a failing target pays the other algorithms' two model evaluations.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, TypeVar

import numpy as np

from .arith import RoundingModel
from .decay_sums import decay_sum_share, log_decay_inputs
from .findings import Finding
from .precision import smallest_normal
from .targets import replayed_calls

_SHARED: ContextVar[bool] = ContextVar("gramcheck_algorithm_underflow", default=False)
F = TypeVar("F", bound=Finding | None)


def underflow_share(
    var: Any,
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool,
    dtype: Any,
    like: Any,
    model: Callable[[Any], Any] = RoundingModel,
    **kw: Any,
) -> Any:
    """max over the variant's other standard algorithms of U_A = R_A(u, eta) - R_A(u, 0) in the model
    ``model(dtype)`` (``RoundingModel`` or ``ProbabilisticModel``), entrywise, 0 where not finite, and
    everywhere for a dtype whose subnormals are not below float32's normal range (float16: its kernels
    accumulate in float32); shaped as ``like`` (the definition's result, or its (out, S_N) pair where the
    algorithms return one: ``output_final_state``), and 0 without algorithms."""
    zeros = _joined([np.zeros(np.shape(x)) for x in _parts(like)])
    if not has_algorithms(var, causal) or smallest_normal(dtype) > smallest_normal("float32"):
        return zeros
    with_eta, without = (_radii(var, model(dtype), underflow, q, k, v, causal, kw) for underflow in (True, False))
    shares = None
    for parts, parts0 in zip(with_eta, without, strict=True):  # one algorithm's parts, with and without eta
        with np.errstate(invalid="ignore"):
            share = [
                np.where(np.isfinite(a - b), np.maximum(a - b, 0.0), 0.0) for a, b in zip(parts, parts0, strict=True)
            ]
        shares = share if shares is None else [np.maximum(s, t) for s, t in zip(shares, share, strict=True)]
    assert shares is not None
    return _joined(shares)


def added_share(var: Any, ar: Any, result: Any, q: Any, k: Any, v: Any, *, causal: bool, dtype: Any, **kw: Any) -> Any:
    """What a rounding bound computed in the model ``ar`` (a ``RoundingModel`` or ``ProbabilisticModel``),
    whose evaluation of the definition gave ``result``, adds where the judgment asks for it (``judged``):
    ``underflow_share`` and the cumulative log-decays' share (``decay_sums``) in the same model, else 0."""
    if not _SHARED.get():
        return _joined([0.0] * len(_parts(result)))
    like = _joined([np.zeros(np.shape(p.mid)) for p in _parts(result)])
    share = underflow_share(var, q, k, v, causal=causal, dtype=dtype, like=like, model=type(ar), **kw)
    sums = decay_sum_share(var, result, q, k, v, causal=causal, dtype=dtype, model=type(ar), **kw)
    if sums is None:
        return share
    return _joined([a + b for a, b in zip(_parts(share), sums, strict=True)])


def has_second_pass(var: Any, causal: bool) -> bool:
    """Whether ``added_share`` can add anything: other standard algorithms, or log-decay inputs."""
    return has_algorithms(var, causal) or bool(log_decay_inputs(var))


def has_algorithms(var: Any, causal: bool) -> bool:
    """Whether the variant has other standard algorithms in this mode: its own (``algorithms_for``) or a
    production form's evaluation order of its definition (``orders_for``)."""
    return bool(var.algorithms_for(causal) or var.orders_for(causal))


def _radii(var: Any, ar: Any, underflow: bool, q: Any, k: Any, v: Any, causal: bool, kw: Any) -> list[list[Any]]:
    """Per algorithm (the variant's own, then each evaluation order its definition takes on this call),
    the radii of its results (one, or out and S_N) in the model ``ar``."""
    if not underflow:
        ar.without_underflow()
    with np.errstate(all="ignore"):
        runs = var.standard_evaluations(q, k, v, causal=causal, arith=ar, **kw)
        with ar.context():
            return [[np.asarray(ar.radius(p), dtype=np.float64) for p in _parts(r)] for r in runs]


def _parts(result: Any) -> tuple[Any, ...]:
    """A result's parts: (out,), or (out, S_N) with ``output_final_state``."""
    return result if isinstance(result, tuple) else (result,)


def _joined(parts: Any) -> Any:
    """``_parts``'s inverse."""
    return tuple(parts) if len(parts) > 1 else parts[0]


def judged(var: Any, judge: Callable[[], F]) -> F:
    """``judge()`` against the definition's bounds; where that fails and the variant has other standard
    algorithms or log-decay inputs, ``judge()`` once more with their shares in every rounding bound
    (``added_share``), recorded as ``details["algorithms_underflow"]`` and ``details["log_decay_sums"]``."""
    if _SHARED.get():
        return judge()
    with replayed_calls() as replay:  # the second judgment judges the first one's outputs
        first = judge()
        if first is None or first.passed or not has_second_pass(var, True):
            return first
        token = _SHARED.set(True)
        try:
            with replay():
                second = judge()
        finally:
            _SHARED.reset(token)
    if second is not None:
        if has_algorithms(var, True):
            second.details["algorithms_underflow"] = True
        if log_decay_inputs(var):
            second.details["log_decay_sums"] = True
    return second


def judged_by(variant_of: Callable[..., Any]) -> Callable[[Callable[..., F]], Callable[..., F]]:
    """Decorator: ``fn(*args, **kw)`` judged (``judged``) on the variant ``variant_of(*args, **kw)``, its
    rounding bounds taking the other algorithms' underflow share where the definition's fail; the
    definition-only judgment stays reachable as ``__wrapped__``."""

    def decorate(fn: Callable[..., F]) -> Callable[..., F]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kw: Any) -> F:
            return judged(variant_of(*args, **kw), lambda: fn(*args, **kw))

        return wrapper

    return decorate


judged_property = judged_by(lambda target, ex, **kw: target.variant)
"""A property ``fn(target, ex, **kw)`` judged on its target's variant (``judged_by``)."""
