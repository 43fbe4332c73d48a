"""Reference agreement: a torch form's output against the oracle's truth, within a bound derived from
the unit roundoff of the dtype (proofs/fp-forward-error.md).

bound_ij = C * R_ij(u_dtype) where R(u) is the first-order componentwise rounding-error bound of the
variant's definitional formula (the largest of it and the variant's other standard algorithms',
``model_radii``) evaluated with unit roundoff u (ball arithmetic over
``arith.rounding_model``: each operation contributes u |result|, each product of length n contributes
gamma_n |A| |B|, radii propagate through the formula), and C = 2 allows one reassociation (recurrent
or chunked order) of the same non-negative sums. The truth is computed to within 1% of the bound (for
the low-precision rule's entries, only as sharply as its verdict can use: proofs/low-precision-rule.md).

No entry passes on a vacuous bound. An entry whose worst-case bound is not below the magnitude of its
(batch, head) slice, max(|truth|, |v|) (the bound cannot tell the output from zero: bfloat16 and float16 at moderate N,
or n u >= 1, where gamma_n does not exist) is judged, in this order, by
1. the probabilistic bound (``arith.ProbabilisticModel``, Higham & Mary 2019; proofs/
   probabilistic-rounding.md) where that one is below the magnitude: rigour ``probabilistic``, with the
   probability it holds recorded;
2. otherwise the low-precision rule in norm (proofs/low-precision-rule.md): over those entries,
   ||T - truth||_F <= 2 ||naive - truth||_F + 2 u ||truth||_F, naive the least accurate of the
   definition (rounded to nearest, and stochastically) and the variant's other algorithms computed in
   the dtype (``naive_forms``).
The rule rests on the standard model of rounding, which the dtype's underflow and overflow break: it
judges only entries that the naive definition computes finitely, in a row (one query's output vector)
where the dtype's range did not move the result by more than its rounding did (the naive definition
against the same rounding in float64's exponent range). When FAVOR+ features underflow into float32's
subnormals, the textbook formula returns a value quantised to +-1 for one row and 0/0 for the next; a
target's NaN there is range exhaustion the definition shares, reported in ``unbounded_entries``.
The rule compares the target's rounding with the naive definition's, which says something only where
those roundings are not all there is: an entry whose probabilistic bound at float32's unit roundoff
(the least precision a kernel accumulates in; for variants whose denominators can vanish, with the
elementwise results in the dtype: ``rounding_noise``) still reaches its magnitude is rounding noise for
every algorithm, and two noises compare by chance (performer-trig's recurrent form, the definition's own
algorithm, measured 1.47 against the definition rounded to float32). Such entries, where the output is
finite, are counted in ``noise_entries`` (and ``unbounded_entries``) and not judged, except for variants
whose transitions contract
(``contracting-transitions``: there the rounding model's radii wrap, and a large radius is not evidence
of cancellation). Entries none of these can judge are counted as ``unbounded_entries``.
``details["judged_by"]`` says how many entries each rule judged.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import variants as _variants
from .arith import ProbabilisticModel, RoundedArith, rounding_model
from .findings import Finding
from .oracle import truth
from .precision import dtype_name, unit_roundoff

REASSOCIATION_FACTOR = 2.0
LOW_PRECISION_K = 2.0  # the low-precision rule's factor on the naive definition's error
LOW_PRECISION_FLOOR_ULPS = 2.0  # the output's own last rounding (u |o|), twice
RULES = ("worst-case", "probabilistic", "low-precision rule")


def model_radii(var: Any, model: Any, q: Any, k: Any, v: Any, *, causal: bool, **kwargs: Any) -> Any:
    """Entrywise the largest radius, in the rounding model ``model``, of the definition and of each other
    standard algorithm of the variant (``Variant.algorithms``): a bound on the rounding error of whichever
    of them a target follows (the delta rule's chunked solve rounds where the recurrence does not).
    An array, or a tuple of arrays where the reference returns a tuple (``output_final_state``)."""
    with np.errstate(all="ignore"):
        outs = [var.reference(q, k, v, causal=causal, arith=model, **kwargs)]
        outs += var.algorithms(q, k, v, causal=causal, arith=model, **kwargs)
        with model.context():
            radii = [
                tuple(np.asarray(model.radius(b), dtype=np.float64) for b in o)
                if isinstance(o, tuple)
                else (np.asarray(model.radius(o), dtype=np.float64),)
                for o in outs
            ]
        largest = tuple(functools.reduce(np.fmax, parts) for parts in zip(*radii, strict=True))
    return largest if isinstance(outs[0], tuple) else largest[0]


def rounding_bound(variant: Any, q: Any, k: Any, v: Any, *, causal: bool, dtype: Any, **kwargs: Any) -> Any:
    """C * R(u_dtype), componentwise, for inputs exactly representable in ``dtype``: R the largest rounding
    bound of the definition and the variant's other algorithms (``model_radii``); a tuple (out, S_N)
    with ``output_final_state``."""
    r = model_radii(_variants.get(variant), rounding_model(dtype), q, k, v, causal=causal, **kwargs)
    return tuple(REASSOCIATION_FACTOR * x for x in r) if isinstance(r, tuple) else REASSOCIATION_FACTOR * r


def probabilistic_bound(
    variant: Any, q: Any, k: Any, v: Any, *, causal: bool, dtype: Any, accumulator: Any = None, **kwargs: Any
) -> tuple[np.ndarray, float]:
    """(C * R~(u_dtype), probability): the rounding bound with every accumulation charged Higham and
    Mary's gamma~_n(lambda) instead of gamma_n; it holds for all entries together with at least the
    returned probability under the probabilistic rounding model (proofs/probabilistic-rounding.md).
    ``accumulator``: accumulations at that format's unit roundoff (``arith.ProbabilisticModel``)."""
    model = ProbabilisticModel(dtype, accumulator=accumulator)
    r = model_radii(_variants.get(variant), model, q, k, v, causal=causal, **kwargs)
    return REASSOCIATION_FACTOR * r, 1.0 - model.failure_probability()


def naive_definition(
    variant: Any,
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool,
    dtype: Any,
    wide_range: bool = False,
    stochastic: int | None = None,
    fn: str = "reference",
    **kwargs: Any,
) -> Any:
    """The definition (or, with ``fn='algorithms'``, the list of the variant's other algorithms) evaluated
    with every operation rounded to ``dtype`` (``arith.RoundedArith``); ``wide_range``: to its significand
    in float64's exponent range; ``stochastic``: rounded stochastically with that seed."""
    ar = RoundedArith(dtype, wide_range=wide_range, stochastic=stochastic)
    with np.errstate(all="ignore"):
        out = getattr(_variants.get(variant), fn)(q, k, v, causal=causal, arith=ar, **kwargs)
    return [ar.to_float64(x) for x in out] if isinstance(out, list) else ar.to_float64(out)


STOCHASTIC_SAMPLES = 4  # stochastically rounded evaluations of the definition among the yardsticks


def naive_forms(
    variant: Any, q: Any, k: Any, v: Any, *, causal: bool, dtype: Any, sampled: bool = True, **kwargs: Any
) -> Yardsticks:
    """The low-precision rules' yardsticks, each with its wide-range twin: the definition rounded to nearest
    in ``dtype``, then, in formats coarser than float32, ``STOCHASTIC_SAMPLES`` times rounded
    stochastically (seeds 0, 1, ...), and each other standard algorithm of the variant
    (``Variant.algorithms``) rounded to nearest. Where a few roundings amplified by exp decide the output
    (a logit or feature exponent of size 10-50 in bfloat16 errs by u |x| = 4-20%), rounding to nearest is
    one draw from a wide spread of errors, and a target's rounding choices land anywhere in it; where
    rounding to nearest keeps a row out of the dtype's underflow by chance, the samples show it. In float32
    that amplification is 2^-24 |x|, and the samples would only loosen the rule (by 2.4x on the delta
    rule's recurrence). ``sampled=False`` leaves the samples out (``can_sample`` then says whether the
    format has them): the rules evaluate them only where the yardsticks rounded to nearest fail a target."""
    var = _variants.get(variant)
    coarse = unit_roundoff(dtype) > unit_roundoff("float32")
    samples = range(STOCHASTIC_SAMPLES if coarse and sampled else 0)

    def twins(**how: Any) -> Any:
        narrow, wide = (
            naive_definition(var, q, k, v, causal=causal, dtype=dtype, wide_range=w, **how, **kwargs)
            for w in (False, True)
        )
        if isinstance(narrow, list):
            return [Naive(a, b) for a, b in zip(narrow, wide, strict=True)]
        return Naive(narrow, wide)

    definition = [twins()] + [twins(stochastic=seed) for seed in samples]
    can_sample = coarse and not sampled and STOCHASTIC_SAMPLES > 0
    return Yardsticks(definition, twins(fn="algorithms"), can_sample=can_sample)


@dataclass(frozen=True)
class Naive:
    """An algorithm's output with every operation rounded to the dtype, and its wide-range twin (the same
    roundings in float64's exponent range)."""

    value: np.ndarray
    wide: np.ndarray

    def in_range(self, truth_value: np.ndarray, u: float) -> np.ndarray:
        return _in_range(self.value, self.wide, truth_value, u)


@dataclass(frozen=True)
class Yardsticks:
    """The definition in the dtype (rounded to nearest first, then stochastically) and the variant's other
    algorithms rounded to nearest (``naive_forms``)."""

    definition: list[Naive]
    algorithms: list[Naive]
    can_sample: bool = False  # the format has stochastic samples that these yardsticks leave out

    @property
    def nearest(self) -> Naive:
        """The definition rounded to nearest."""
        return self.definition[0]

    def in_range(self, truth_value: np.ndarray, u: float) -> np.ndarray:
        """Entries the rule can judge: finite, and decided by rounding, not by the dtype's range, in every
        evaluation of the definition."""
        return functools.reduce(np.logical_and, (d.in_range(truth_value, u) for d in self.definition))

    def error(
        self, truth_value: np.ndarray, judged: np.ndarray, u: float, size: Callable[[np.ndarray], float]
    ) -> float:
        """The yardstick: the largest ``size`` of |naive - truth| over the definition's evaluations and each
        other algorithm whose result is finite and decided by rounding on the ``judged`` entries (an
        algorithm that overflows where the definition does not says nothing of rounding)."""
        errors = [size(np.abs(d.value - truth_value)) for d in self.definition]
        for f in self.algorithms:
            if np.all(f.in_range(truth_value, u)[judged]):
                errors.append(size(np.abs(f.value - truth_value)))
        return max(errors)


def rounding_noise(
    variant: Any,
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool,
    dtype: Any,
    magnitude: np.ndarray,
    bound: Any = None,
    **kwargs: Any,
) -> np.ndarray:
    """Entries whose probabilistic bound for a kernel accumulating in float32 (the least precision kernels
    accumulate in) reaches half their ``magnitude`` (the largest value of their (batch, head) slice):
    rounding noise for every such algorithm, which the low-precision rules do not judge
    (proofs/low-precision-rule.md). The kernel rounds its elementwise results to float32, or, for a
    variant whose denominators can vanish (``vanishing-denominator``) in a format coarser than float32,
    to that format: there the rounding of the features decides a denominator that cancels below it
    (trigonometric FAVOR+ in bfloat16 took the wrong sign rounded to nearest). Where weights are
    positive nothing cancels, and the quotient's worst-case radius, blind to the rounding its numerator
    and denominator share, would call every bfloat16 FAVOR+ output noise. ``bound``: that bound when
    already computed. None for variants whose transitions contract: there the rounding model's radii
    wrap, and a large radius is not evidence of cancellation."""
    var = _variants.get(variant)
    tags = var.tags(var.split_kwargs(kwargs)[0])
    if "contracting-transitions" in tags:
        return np.zeros(np.shape(magnitude), dtype=bool)
    if bound is None:
        coarse = "vanishing-denominator" in tags and unit_roundoff(dtype) > unit_roundoff("float32")
        elementwise = dtype if coarse else "float32"
        kw = dict(causal=causal, dtype=elementwise, accumulator="float32", **kwargs)
        bound = probabilistic_bound(var, q, k, v, **kw)[0]
    return ~(bound < 0.5 * magnitude)


def slice_scale(x: np.ndarray) -> np.ndarray:
    """max |x| over each (batch, head) slice (the last two axes), broadcast back to x's shape."""
    a = np.where(np.isfinite(x), np.abs(x), 0.0)
    if a.ndim < 2:
        return np.broadcast_to(np.max(a, initial=0.0), a.shape)
    return np.broadcast_to(np.max(a, axis=(-2, -1), keepdims=True, initial=0.0), a.shape)


def _in_range(naive: np.ndarray, wide: np.ndarray, value: np.ndarray, u: float) -> np.ndarray:
    """Entries the low-precision rule can judge: the naive definition finite, in a row (last axis) where
    it differs from the same rounding in float64's range by no more than that one's error, plus u |row|."""

    def rows(x: np.ndarray) -> np.ndarray:
        return np.linalg.norm(x, axis=-1, keepdims=True)

    with np.errstate(all="ignore"):
        shift = rows(naive - wide)
        finite = np.isfinite(value)
        allowed = rows(np.where(finite, wide - value, np.inf)) + u * rows(np.where(finite, value, 0.0))
        good = shift <= allowed  # NaN (a non-finite naive) compares False
    return np.isfinite(naive) & np.broadcast_to(good, naive.shape)


def check_agreement(
    name: str,
    output: np.ndarray,
    variant: Any,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    causal: bool,
    dtype: Any,
    **kwargs: Any,
) -> Finding:
    """Finding: max_ij |out - truth| / bound_ij <= 1 where the worst-case bound is informative, and the
    probabilistic bound or the low-precision rule where it is not (module docstring). Inputs must
    already be representable in dtype."""
    out = np.asarray(output, dtype=np.float64)
    u = unit_roundoff(dtype)
    var = _variants.get(variant)
    with np.errstate(all="ignore"):
        bound = rounding_bound(var, q, k, v, causal=causal, dtype=dtype, **kwargs)
        approx = np.asarray(var.reference(q, k, v, causal=causal, **kwargs), dtype=np.float64)
    scale = np.maximum(
        slice_scale(approx), slice_scale(np.broadcast_to(np.asarray(v, dtype=np.float64), approx.shape))
    )
    vacuous_guess = ~(bound < 0.5 * scale)
    if vacuous_guess.any():
        pbound, probability = probabilistic_bound(variant, q, k, v, causal=causal, dtype=dtype, **kwargs)
    else:
        pbound, probability = np.full(bound.shape, np.inf), 1.0
    # the truth to 1% of the bound that judges each entry; where the low-precision rule may judge, which
    # is a rule in norm (its floor u |o|_2), to u max(|o_i|, rms(o)) / 100: the truth's error is then at
    # most 1.5% of that floor in norm, and an output cancelling to ~0 asks nothing float64 cannot give.
    # The rule's bound is 2 |naive - truth| plus that floor, so where the naive definition is farther
    # off than the floor, 1% of its distance is as sharp (the verdict nets out the truth's bound either way)
    finite_approx = np.where(np.isfinite(approx), np.abs(approx), 0.0)
    rms = float(np.sqrt(np.mean(finite_approx**2))) if finite_approx.size else 0.0
    fallback = u * np.maximum(finite_approx, np.maximum(rms, 2.0**-30 * scale))

    @functools.cache
    def naive(sampled: bool = False) -> Yardsticks:
        """The rule's yardsticks (``naive_forms``), evaluated once, when a rule first needs them."""
        return naive_forms(var, q, k, v, causal=causal, dtype=dtype, sampled=sampled, **kwargs)

    @functools.cache
    def noise() -> np.ndarray:
        """``rounding_noise``, evaluated once, when the low-precision rule first has entries to judge."""
        same = pbound if u == unit_roundoff("float32") else None  # float32's bound is the gate's
        return rounding_noise(var, q, k, v, causal=causal, dtype=dtype, magnitude=scale, bound=same, **kwargs)

    # first without the rule's request (float64 mostly suffices): a sharper truth is asked for only when
    # the rule's verdict could change with it (``_Judged.rule_open``)
    first = np.where(vacuous_guess, np.minimum(pbound, bound), bound)
    need = first
    if vacuous_guess.any():
        forms = naive(False)
        with np.errstate(invalid="ignore"):
            miss = np.abs(forms.nearest.value - approx)
        lp_need = np.where(forms.in_range(approx, u), np.maximum(fallback, miss), np.inf)
        need = np.where(vacuous_guess, np.minimum(first, lp_need), first)
    # an entry no rule can judge (every bound infinite, the naive definition not finite or moved by the
    # range) asks only for the slice magnitude that decides which rule judges its neighbours
    need, first = (np.where(np.isfinite(x), x, scale) for x in (need, first))
    if out.shape != approx.shape:
        return Finding(
            name, float("inf"), 1.0, details={"error": f"output shape {out.shape}, expected {approx.shape}"}
        )
    requests = (first, need) if vacuous_guess.any() else (need,)
    for request in requests:
        t = truth(var, q, k, v, causal=causal, digits=None, atol=np.maximum(0.01 * request, 1e-300), **kwargs)
        judged = _judge(name, out, v, t, bound, pbound, probability, naive, u, dtype, noise)
        if not judged.rule_open:
            break
    return judged.finding


@dataclass
class _Judged:
    finding: Finding
    rule_open: bool  # the low-precision rule's verdict could change with a sharper truth


def _judge(
    name: str,
    out: np.ndarray,
    v: Any,
    t: Any,
    bound: np.ndarray,
    pbound: np.ndarray,
    probability: float,
    naive: Callable[[bool], Yardsticks],
    u: float,
    dtype: Any,
    noise: Callable[[], np.ndarray],
) -> _Judged:
    """The Finding of ``check_agreement`` on the truth ``t``, every error counted at its worst over the
    truth's bound."""
    rule_open = False
    defined = ~t.undefined
    # the magnitude a bound must stay below to say anything: the largest output of the slice, or the
    # largest value where outputs cancel (|o| <= max|v| for normalised attention)
    mag = np.maximum(slice_scale(np.where(defined, t.value, 0.0)), slice_scale(np.broadcast_to(v, out.shape)))
    err = np.abs(out - t.value) + t.bound  # worst case over the truth's own uncertainty
    err = np.where(np.isnan(err), np.inf, err)
    # 1. worst case, where the bound is below the magnitude of the outputs it bounds
    wc = defined & np.isfinite(bound) & (bound < mag)
    # 2. the probabilistic bound where that one is informative
    rest = defined & ~wc
    pr = rest & np.isfinite(pbound) & (pbound < mag)
    rest &= ~pr
    details: dict[str, Any] = {}
    measured, worst_rule = 0.0, "worst-case"
    worst_at: tuple[int, ...] | None = None
    ratios: dict[str, float] = {}
    for rule, mask, b in (("worst-case", wc, bound), ("probabilistic", pr, pbound)):
        if not mask.any():
            continue
        with np.errstate(divide="ignore", invalid="ignore"):
            r = np.where(mask, err / b, 0.0)
        r = np.where(np.isnan(r), np.inf, r)
        idx = np.unravel_index(int(np.argmax(r)), r.shape)
        ratios[rule] = float(r[idx])
        if float(r[idx]) > measured or worst_at is None:
            measured, worst_rule, worst_at = float(r[idx]), rule, tuple(int(i) for i in idx)
    # 3. the low-precision rule, in norm over the entries left, where the naive definition is informative
    # and the entry is more than rounding noise at float32's unit roundoff (a non-finite output is never
    # noise: the rule judges it, and fails it where the naive definition is finite)
    noisy = np.zeros_like(rest)
    if rest.any():
        noisy = rest & noise() & np.isfinite(out)
        rest &= ~noisy
    lp_count, unbounded = 0, int(rest.sum()) + int(noisy.sum())
    # the yardsticks rounded to nearest first; the stochastic samples only where those fail the target
    # (they can only widen the yardstick, or set aside rows the range decided under other roundings)
    for sampled in (False, True):
        if not rest.any():
            break
        forms = naive(sampled)
        lp = rest & forms.in_range(t.value, u)
        lp_count, unbounded = int(lp.sum()), int((rest & ~lp).sum()) + int(noisy.sum())
        r_lp = 0.0
        if lp_count:

            def norm(x: np.ndarray, lp: np.ndarray = lp) -> float:  # Frobenius norm over the rule's entries
                return float(np.sqrt(np.sum(np.where(lp, x, 0.0) ** 2)))

            e_t, t_bound = norm(err), norm(t.bound)
            # the yardstick's error, at least: its distance to the truth's value less the truth's bound
            e_n = max(forms.error(t.value, lp, u, norm) - t_bound, 0.0)
            size = norm(t.value)
            b_lp = LOW_PRECISION_K * e_n + LOW_PRECISION_FLOOR_ULPS * u * size
            r_lp = e_t / b_lp if b_lp > 0 else (0.0 if e_t == 0 else float("inf"))
            # a failure that holds at the truth's most favourable value is settled; a pass always is
            e_t_least = max(norm(np.abs(out - t.value)) - t_bound, 0.0)
            b_most = LOW_PRECISION_K * (e_n + 2 * t_bound) + LOW_PRECISION_FLOOR_ULPS * u * (size + t_bound)
            rule_open = r_lp > 1.0 and not e_t_least > b_most
            ratios["low-precision rule"] = r_lp
            details["low_precision"] = {"target_error": e_t, "naive_error": e_n, "output_norm": size}
        if r_lp <= 1.0 or not forms.can_sample:
            break
    if "low-precision rule" in ratios and ratios["low-precision rule"] > measured:
        lp_err = np.where(lp, err, -1.0)
        measured, worst_rule = ratios["low-precision rule"], "low-precision rule"
        worst_at = tuple(int(i) for i in np.unravel_index(int(np.argmax(lp_err)), lp_err.shape))
    judged = wc | pr
    abs_err = np.where(judged, np.abs(out - t.value), 0.0)
    counterexample = None
    if measured > 1.0 and worst_at is not None:
        b_at = {"worst-case": bound, "probabilistic": pbound}.get(worst_rule)
        counterexample = {
            "index": list(worst_at),
            "error": float(err[worst_at]),
            "bound": float(b_at[worst_at]) if b_at is not None else None,
            "rule": worst_rule,
        }
    details.update(
        {
            "max_abs_error": float(np.max(abs_err, initial=0.0)),
            "oracle": t.arithmetic,
            "undefined_entries": int(t.undefined.sum()),
            "unbounded_entries": unbounded,
            "noise_entries": int(noisy.sum()),
            "judged_by": {"worst-case": int(wc.sum()), "probabilistic": int(pr.sum()), "low-precision rule": lp_count},
            "ratios": ratios,
            "rule": worst_rule,
            "dtype": dtype_name(dtype),
            "worst_index": list(worst_at) if worst_at is not None else None,
        }
    )
    if worst_at is not None:
        b_worst = {"worst-case": bound, "probabilistic": pbound}.get(worst_rule)
        details["worst_error"] = float(err[worst_at])
        if b_worst is not None:
            details["worst_bound"] = float(b_worst[worst_at])
    if int(pr.sum()):
        details["probability"] = probability
    if worst_at is not None and worst_rule == "worst-case":
        details["bits_beyond_bound"] = float(np.log2(max(measured, 1.0)))
    rigour = "probabilistic" if int(pr.sum()) else "sampled"
    finding = Finding(name, measured, 1.0, rigour=rigour, counterexample=counterexample, details=details)
    return _Judged(finding, rule_open)
