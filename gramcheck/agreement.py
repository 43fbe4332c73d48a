"""Reference agreement: a torch form's output against the oracle's truth, within a bound derived from
the unit roundoff of the dtype (proofs/fp-forward-error.md).

bound_ij = C * R_ij(u_dtype) where R(u) is the first-order componentwise rounding-error bound of the
variant's definitional formula evaluated with unit roundoff u (ball arithmetic over
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
   ||T - truth||_F <= 2 ||naive - truth||_F + 2 u ||truth||_F, naive the definition computed in the dtype.
The rule rests on the standard model of rounding, which the dtype's underflow and overflow break: it
judges only entries that the naive definition computes finitely, in a row (one query's output vector)
where the dtype's range did not move the result by more than its rounding did (the naive definition
against the same rounding in float64's exponent range). When FAVOR+ features underflow into float32's
subnormals, the textbook formula returns a value quantised to +-1 for one row and 0/0 for the next; a
target's NaN there is range exhaustion the definition shares, reported in ``unbounded_entries``.
The rule compares the target's rounding with the naive definition's, which says something only where
those roundings are not all there is: an entry whose probabilistic bound at float32's unit roundoff
(the least precision a kernel accumulates in) still reaches its magnitude is rounding noise for every
algorithm, and two noises compare by chance (performer-trig's recurrent form, the definition's own
algorithm, measured 1.47 against the definition rounded to float32). Such entries, where the output is
finite, are counted in ``noise_entries`` (and ``unbounded_entries``) and not judged, except for variants
whose transitions contract
(``contracting-transitions``: there the rounding model's radii wrap, and a large radius is not evidence
of cancellation). Entries none of these can judge are counted as ``unbounded_entries``.
A row whose worst-case or probabilistic bound is below its magnitude but not below ``loose_threshold`` (2^-6 of
the row's largest value in bfloat16 and float16; the row's magnitude in float32) is judged by that bound and
also by the rule in norm, each row in its own scale (rule ``row scale``): such a bound cannot tell an output 3%
off. ``details["judged_by"]`` says how many entries each rule judged; a Finding that judged no inexact entry
(every entry exact, at the noise floor or unbounded: bfloat16 outputs a few subnormal units from 0) passes
and says so in ``details["unjudged"]``, which a check's note carries.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import algorithm_underflow
from . import variants as _variants
from .arith import F64, ProbabilisticModel, ResolutionModel, RoundedArith, flushes, rounding_model, subnormals
from .findings import Finding, add_note, error_ratios
from .oracle import truth, truth_given
from .precision import dtype_name, overflow_threshold, round_to, unit_roundoff
from .spectra import decayed_cumsum, denominator_terms

REASSOCIATION_FACTOR = 2.0
LOW_PRECISION_K = 2.0  # the low-precision rule's factor on the naive definition's error
LOW_PRECISION_FLOOR_ULPS = 2.0  # the output's own last rounding (u |o|), twice
RULES = ("worst-case", "probabilistic", "low-precision rule")


def rounding_bound(variant: Any, q: Any, k: Any, v: Any, *, causal: bool, dtype: Any, **kwargs: Any) -> np.ndarray:
    """C * R(u_dtype), componentwise, for inputs exactly representable in ``dtype``."""
    return rounding_evaluation(variant, q, k, v, causal=causal, dtype=dtype, **kwargs).bound


@dataclass(frozen=True)
class RoundingEvaluation:
    """The rounding model's one pass over the definition: ``bound`` = C * R(u_dtype); ``value``, its
    midpoints, the definition evaluated in float64; ``certificate``, (value, bound on |value - exact|)
    derived from the same radii (``arith.RoundingModel.float64_certificate``), or None where the
    derivation does not hold."""

    bound: np.ndarray
    value: np.ndarray
    certificate: tuple[np.ndarray, np.ndarray] | None


def rounding_evaluation(
    variant: Any, q: Any, k: Any, v: Any, *, causal: bool, dtype: Any, **kwargs: Any
) -> RoundingEvaluation:
    """``rounding_bound``, with the float64 value and the float64 certificate the same pass yields
    (proofs/ball-arithmetic.md, "One pass for the rounding bound and the truth")."""
    model = rounding_model(dtype)
    var = _variants.get(variant)
    ball = var.reference(q, k, v, causal=causal, arith=model, **kwargs)
    share = algorithm_underflow.added_share(var, model, ball, q, k, v, causal=causal, dtype=dtype, **kwargs)
    bound = REASSOCIATION_FACTOR * (model.radius(ball) + share)
    return RoundingEvaluation(bound, model.to_float64(ball), model.float64_certificate(ball))


def flushing_reach(
    variant: Any, bound: np.ndarray, q: Any, k: Any, v: Any, *, causal: bool, dtype: Any, **kwargs: Any
) -> np.ndarray | float:
    """How far flushing alone may move each entry: ``bound`` (computed for a target that flushes,
    ``arith.subnormals``) less the definition's rounding bound under gradual underflow; 0 where the
    target does not flush (proofs/fp-forward-error.md, "Flushing kernels")."""
    if not flushes(dtype):
        return 0.0
    with subnormals("gradual"):
        gradual = rounding_bound(variant, q, k, v, causal=causal, dtype=dtype, **kwargs)
    with np.errstate(invalid="ignore"):
        return np.where(np.isnan(bound - gradual), np.inf, np.maximum(bound - gradual, 0.0))


def probabilistic_bound(
    variant: Any, q: Any, k: Any, v: Any, *, causal: bool, dtype: Any, **kwargs: Any
) -> tuple[np.ndarray, float]:
    """(C * R~(u_dtype), probability): the rounding bound with every accumulation charged Higham and
    Mary's gamma~_n(lambda) instead of gamma_n; it holds for all entries together with at least the
    returned probability under the probabilistic rounding model (proofs/probabilistic-rounding.md)."""
    model = ProbabilisticModel(dtype)
    var = _variants.get(variant)
    with np.errstate(all="ignore"):
        ball = var.reference(q, k, v, causal=causal, arith=model, **kwargs)
        share = algorithm_underflow.added_share(var, model, ball, q, k, v, causal=causal, dtype=dtype, **kwargs)
    return REASSOCIATION_FACTOR * (model.radius(ball) + share), 1.0 - model.failure_probability()


def term_scale(variant: Any, q: Any, k: Any, v: Any, *, causal: bool, **kwargs: Any) -> np.ndarray:
    """|definition(q, k, |v|)| in float64, entrywise: the size of the terms each output sums (for attention with
    non-negative weights, sum_j w_ij |v_ij|), which a kernel's stored features round at u even where the output
    cancels; infinite entries read as 0 (no floor)."""
    with np.errstate(all="ignore"):
        s = np.abs(np.asarray(_variants.get(variant).reference(q, k, np.abs(v), causal=causal, arith=F64, **kwargs)))
    return np.where(np.isfinite(s), s, 0.0)


def resolution_radius(variant: Any, q: Any, k: Any, v: Any, *, causal: bool, dtype: Any, **kwargs: Any) -> np.ndarray:
    """The definition's radius in ``arith.ResolutionModel``: one rounding per stored result, entrywise
    (infinite where not finite)."""
    model = ResolutionModel(dtype)
    with np.errstate(all="ignore"):
        r = model.radius(_variants.get(variant).reference(q, k, v, causal=causal, arith=model, **kwargs))
    return np.where(np.isnan(r), np.inf, r)


def naive_definition(
    variant: Any, q: Any, k: Any, v: Any, *, causal: bool, dtype: Any, wide_range: bool = False, **kwargs: Any
) -> np.ndarray:
    """The definition evaluated with every operation rounded to ``dtype`` (``arith.RoundedArith``);
    ``wide_range``: to its significand in float64's exponent range."""
    ar = RoundedArith(dtype, wide_range=wide_range)
    with np.errstate(all="ignore"):
        ball = _variants.get(variant).reference(q, k, v, causal=causal, arith=ar, **kwargs)
    return ar.stored(ball)


def accumulator_computes(
    variant: Any, q: Any, k: Any, v: Any, *, causal: bool, dtype: Any, **kwargs: Any
) -> np.ndarray:
    """Where the definition or another standard algorithm of the variant, every operation rounded to float32
    (the least precision a kernel accumulates in), returns an output that is finite once stored in ``dtype``
    (a float32 value of 65520 is inf in float16), on the inputs q, k, v (already in ``dtype``)."""
    forms = naive_forms(variant, q, k, v, causal=causal, dtype="float32", **kwargs)
    with np.errstate(all="ignore"):
        return np.any([np.isfinite(round_to(f.value, dtype)) for f in forms], axis=0)


def naive_forms(
    variant: Any,
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool,
    dtype: Any,
    rounding: Mapping[str, bool] | None = None,
    **kwargs: Any,
) -> list[Naive]:
    """The low-precision rules' yardsticks: the definition, then each other standard algorithm of the
    variant (``Variant.algorithms``), evaluated with every operation rounded to ``dtype``, each with its
    wide-range twin; ``rounding``: ``RoundedArith``'s further options (``REVERSED``)."""
    var = _variants.get(variant)
    rounded = []
    for wide in (False, True):
        ar = RoundedArith(dtype, wide_range=wide, **(rounding or {}))
        with np.errstate(all="ignore"):
            outs = [var.reference(q, k, v, causal=causal, arith=ar, **kwargs)]
            outs += var.algorithms(q, k, v, causal=causal, arith=ar, **kwargs)
        rounded.append([ar.stored(x) for x in outs])
    return [Naive(a, b) for a, b in zip(*rounded, strict=True)]


# The yardsticks' other roundings: every sum accumulated from the other end (proofs/low-precision-rule.md,
# "Summation order"); each product of two tensors formed and carried in float32, as a kernel forms it in its
# registers (the state rule's, below float32: "Products in float32").
REVERSED: dict[str, bool] = {"reverse": True}
WIDE_PRODUCTS: dict[str, bool] = {"wide_products": True}


class Yardsticks:
    """The rule's yardsticks for one input, evaluated when first needed: ``evaluate(rounding)`` gives the
    standard algorithms' list in one rounding (``RoundedArith``'s options); ``forward`` is the first (every
    operation rounded to the dtype, sums from the start), ``every`` adds those of the ``others`` roundings. A
    larger yardstick only passes more, so a rule asks for the others only where the target fails against the first
    (proofs/low-precision-rule.md, "Summation order")."""

    def __init__(
        self, evaluate: Callable[[dict[str, bool]], list[Any]], others: tuple[dict[str, bool], ...] = (REVERSED,)
    ):
        self._evaluate = evaluate
        self._others = others

    @functools.cached_property
    def forward(self) -> list[Any]:
        return self._evaluate({})

    @functools.cached_property
    def every(self) -> list[Any]:
        return self.forward + [x for r in self._others for x in self._evaluate(r)]

    def error(
        self,
        truth_value: np.ndarray,
        judged: np.ndarray,
        u: float,
        size: Callable[[np.ndarray], float],
        fails: Callable[[float], bool],
    ) -> float:
        """``yardstick_error`` over the first rounding's forms (``Naive``), or over every rounding's where
        ``fails`` says the target fails against the first."""
        e = yardstick_error(self.forward, truth_value, judged, u, size)
        return yardstick_error(self.every, truth_value, judged, u, size) if fails(e) else e


def naive_yardsticks(variant: Any, q: Any, k: Any, v: Any, *, causal: bool, dtype: Any, **kwargs: Any) -> Yardsticks:
    """``naive_forms`` in each of the yardsticks' roundings, each evaluated when first needed."""
    kw = {"causal": causal, "dtype": dtype, **kwargs}
    return Yardsticks(lambda rounding: naive_forms(variant, q, k, v, rounding=rounding, **kw))


@dataclass(frozen=True)
class Naive:
    """An algorithm's output with every operation rounded to the dtype, and its wide-range twin (the same
    roundings in float64's exponent range)."""

    value: np.ndarray
    wide: np.ndarray

    def in_range(self, truth_value: np.ndarray, u: float) -> np.ndarray:
        return _in_range(self.value, self.wide, truth_value, u)


def yardstick_error(
    forms: list[Naive], truth_value: np.ndarray, judged: np.ndarray, u: float, size: Callable[[np.ndarray], float]
) -> float:
    """The low-precision rules' yardstick: the largest ``size`` of |naive - truth| over the definition and
    each other algorithm whose result is finite and decided by rounding, not by the dtype's range, on the
    judged entries (an algorithm that overflows where another does not says nothing of rounding); the
    definition's where none is (``judged_in_range``)."""
    errors = [size(np.abs(f.value - truth_value)) for f in forms if np.all(f.in_range(truth_value, u)[judged])]
    return max(errors) if errors else size(np.abs(forms[0].value - truth_value))


TERMS_FLOOR = 2.0**-900  # a row's scale_i below this: its float64 terms have lost relative accuracy


@dataclass(frozen=True)
class _FeatureDenominator:
    """The float64 quantities of a variant whose definition divides by its features' denominator:
    phi(Q), phi(K) and the causal log decays g or None (``Variant.quotient_features``), den_i, lean_i, scale_i
    (``spectra.denominator_terms``, den without eps), eps, and ``rows``: where those terms are finite and
    scale_i >= ``TERMS_FLOOR``, so that no term sank into float64's subnormals; the functions below say
    nothing of other rows."""

    fq: np.ndarray
    fk: np.ndarray
    g: np.ndarray | None
    den: np.ndarray
    lean: np.ndarray
    scale: np.ndarray
    eps: float
    rows: np.ndarray


def _feature_denominator(variant: Any, q: Any, k: Any, kwargs: Any, causal: bool) -> _FeatureDenominator | None:
    """``_FeatureDenominator`` for a variant tagged ``feature-denominator``, else None."""
    var = _variants.get(variant)
    params = var.split_kwargs(kwargs)[0]
    if "feature-denominator" not in var.tags(params):
        return None
    with np.errstate(all="ignore"):
        phi_q, phi_k, log_decays = var.quotient_features(q, k, causal=causal, **kwargs)
        fq, fk = np.asarray(phi_q, dtype=np.float64), np.asarray(phi_k, dtype=np.float64)
        g = None if log_decays is None else np.asarray(log_decays, dtype=np.float64)
        den, lean, scale = denominator_terms(fq, fk, causal=causal, g=g)
        rows = np.isfinite(den) & np.isfinite(lean) & np.isfinite(scale) & (scale >= TERMS_FLOOR)
    return _FeatureDenominator(fq, fk, g, den, lean, scale, float(params["eps"]), rows)


def _accumulator_roundoff(dtype: Any) -> float:
    """min(u, u_float32): kernels hold states and compute shared steps in at least float32."""
    return min(unit_roundoff(dtype), unit_roundoff("float32"))


def unresolved_entries(variant: Any, q: Any, k: Any, v: Any, *, causal: bool, dtype: Any, **kwargs: Any) -> np.ndarray:
    """The output entries (shaped as v) of the rows whose denominator den_i + eps one rounding of each
    feature stored in ``dtype`` can make 0: |den_i + eps| <= u lean_i + (u - u^2) scale_i
    (``spectra.denominator_terms``; proofs/low-precision-rule.md, "Unresolved denominators"). There the
    model's guarantees determine the output of no algorithm that stores its features in the dtype, not
    even its sign. Only for variants whose denominator is that of their features (tag
    ``feature-denominator``), and only in rows whose float64 terms are in range (``_FeatureDenominator``)."""
    none = np.zeros(np.shape(v), dtype=bool)
    f = _feature_denominator(variant, q, k, kwargs, causal)
    if f is None:
        return none
    u = unit_roundoff(dtype)
    with np.errstate(all="ignore"):
        reach = u * f.lean + (u - u * u) * f.scale
        rows = f.rows & np.isfinite(reach) & (np.abs(f.den + f.eps) <= reach)
    return none | rows[..., None]


def denominator_condition(variant: Any, q: Any, k: Any, *, causal: bool, **kwargs: Any) -> np.ndarray | None:
    """Per row (B, H, N), kappa_i = max(1, scale_i / |den_i + eps|): how much the denominator
    phi(q_i) . sum_{j (<= i)} phi(k_j) + eps cancels (``spectra.denominator_terms``). Any algorithm forms den_i
    from terms of total size scale_i, so its rounding there is kappa_i times larger relative to den_i + eps than
    the terms' own (proofs/backward-agreement.md, "Denominators that can vanish"). 1 for non-negative features
    with a positive denominator, or none and eps != 0; inf where a denominator is 0 or its terms out of range.
    None for a variant not tagged ``feature-denominator`` (no such terms to measure)."""
    f = _feature_denominator(variant, q, k, kwargs, causal)
    if f is None:
        return None
    with np.errstate(all="ignore"):
        kappa = np.maximum(1.0, f.scale / np.abs(f.den + f.eps))
    empty = (f.scale == 0) & (f.eps != 0)  # no terms: den_i + eps = eps exactly
    return np.where(empty, 1.0, np.where(f.rows & np.isfinite(kappa), kappa, np.inf))


def state_resolution(
    variant: Any, q: Any, k: Any, v: Any, *, causal: bool, dtype: Any, **kwargs: Any
) -> np.ndarray | None:
    """For a variant whose denominator is its features' (tag ``feature-denominator``), the first-order
    change of o_i = phi(q_i) . S_i / (phi(q_i) . z_i + eps) when every entry of the linear form's state,
    S_i = sum_{j (<= i)} phi(k_j) v_j^T and z_i = sum_j phi(k_j) (each key times its decays to row i where the
    causal definition has them), is rounded once at the accumulator's unit roundoff u_acc = min(u, u_float32)
    (kernels hold the state in at least float32):

        rho_i = u_acc (sum_c |phi(q_i)_c| |S_ic| + |o_i| sum_c |phi(q_i)_c| |z_ic|) / |phi(q_i) . z_i + eps|,

    shaped as v, 0 where not finite or the row's terms are out of range (``_FeatureDenominator``)
    (proofs/low-precision-rule.md, "The linear form's state"); None for other variants."""
    f = _feature_denominator(variant, q, k, kwargs, causal)
    if f is None:
        return None
    u_acc = _accumulator_roundoff(dtype)
    with np.errstate(all="ignore"):
        kv = f.fk[..., :, :, None] * np.asarray(v, dtype=np.float64)[..., :, None, :]  # (B, H, N, m, d_v)
        s = decayed_cumsum(kv, None if f.g is None else f.g[..., None], axis=-3) if causal else np.sum(
            kv, axis=-3, keepdims=True
        )
        den = f.den + f.eps
        o = np.sum(f.fq[..., None] * s, axis=-2) / den[..., None]
        moved = np.sum(np.abs(f.fq)[..., None] * np.abs(s), axis=-2) + np.abs(o) * f.lean[..., None]
        rho = moved / np.abs(den)[..., None] * u_acc
    return np.where(np.isfinite(rho) & f.rows[..., None], rho, 0.0)


def amplitude_resolution(
    variant: Any, q: Any, k: Any, v: Any, *, causal: bool, dtype: Any, **kwargs: Any
) -> np.ndarray | None:
    """For a variant whose denominator is its features' (tag ``feature-denominator``) and whose keys'
    features share rounded steps (``Variant.amplitude_rounding``: phi(k_s) scaled by 1 + delta_s, delta_s
    independent across groups of keys with root mean square sigma_s u_acc, u_acc = min(u, u_float32), one delta
    for the keys of a group (``AmplitudeRounding.groups``: the same computed amplitude); in the causal mode
    also every key s < t scaled alike by 1 + epsilon_t, the rounding of the decay into token t, of root mean
    square tau_t u_acc), the root mean square of the first-order move of
    o_i = sum_{s (<= i)} a_is v_s / (sum_s a_is + eps), a_is = phi(q_i) . phi(k_s) (times the decays from s to i):

        rho_i = u_acc sqrt( sum_G sigma_G^2 (sum_{s in G, s (<= i)} a_is (v_s - o_i))^2
                            + [causal] sum_{t <= i} tau_t^2 (sum_{s < t} a_is (v_s - o_i))^2 ) / |sum_s a_is + eps|,

    shaped as v, 0 where not finite or the row's terms are out of range (``_FeatureDenominator``)
    (proofs/low-precision-rule.md, "The keys' amplitudes"); None for other variants."""
    f = _feature_denominator(variant, q, k, kwargs, causal)
    model = None if f is None else _variants.get(variant).amplitude_rounding(q, k, causal=causal, **kwargs)
    if f is None or model is None:
        return None
    fq, fk = f.fq, f.fk
    u_acc = _accumulator_roundoff(dtype)
    v = np.asarray(v, dtype=np.float64)
    n = fq.shape[-2]
    sigma2 = np.asarray(model.keys)[..., None, :] ** 2  # (B, H, 1, N): per key
    tau2 = None if model.decays is None else np.asarray(model.decays)[..., None, :, None] ** 2  # (B, H, 1, N, 1)
    log_decay = None if f.g is None else np.cumsum(f.g, axis=-2)  # (B, H, N, 1 or m): G_i - G_s from s to i
    same = None  # (B, H, N keys, N groups) one-hot: key s in the group labelled g (``AmplitudeRounding.groups``)
    if model.groups is not None:
        same = (np.asarray(model.groups)[..., :, None] == np.arange(n)).astype(np.float64)
    rho = np.zeros(np.broadcast_shapes(fq.shape[:-1], v.shape[:-1]) + v.shape[-1:])
    width = 1 if f.g is None else f.g.shape[-1]
    rows = max(1, 2**22 // max(1, rho.size * width))  # rows per block: its (B, H, rows, N, d_v) terms stay below 2^22
    with np.errstate(all="ignore"):
        for lo in range(0, n, rows):
            hi = min(lo + rows, n)
            seen = np.arange(n)[None, :] <= np.arange(lo, hi)[:, None]  # (rows, N): s <= i
            a = _row_weights(fq[..., lo:hi, :], fk, log_decay, lo, hi, seen)
            if causal:
                a = np.where(seen, a, 0.0)
            den = np.sum(a, axis=-1) + f.eps
            o = (a @ v) / den[..., None]
            terms = a[..., None] * (v[..., None, :, :] - o[..., :, None, :])  # (B, H, rows, N, d_v)
            if same is None:
                moved = np.sum(sigma2[..., None] * terms**2, axis=-2)
            else:  # keys of one group move together: the square of their sum, at the group's sigma
                moved = np.sum(sigma2[..., None] * np.einsum("...isc,...sg->...igc", terms, same) ** 2, axis=-2)
            if tau2 is not None:  # the decay into t moves sum_{s < t} of the row's terms
                before = np.cumsum(terms, axis=-2) - terms
                moved = moved + np.sum(np.where(seen[..., None], tau2 * before**2, 0.0), axis=-2)
            rho[..., lo:hi, :] = np.sqrt(moved) / np.abs(den)[..., None] * u_acc
    return np.where(np.isfinite(rho) & f.rows[..., None], rho, 0.0)


def _row_weights(
    fq: np.ndarray, fk: np.ndarray, log_decay: np.ndarray | None, lo: int, hi: int, seen: np.ndarray
) -> np.ndarray:
    """a_is = sum_c phi(q_i)_c phi(k_s)_c exp(G_ic - G_sc) for the rows lo:hi (fq is theirs), G the cumulated log
    decays (None: no decays); 0 where s > i (``seen`` False) when there are decays, whose exponent there is positive."""
    if log_decay is None:
        return fq @ np.swapaxes(fk, -1, -2)
    gap = log_decay[..., lo:hi, None, :] - log_decay[..., None, :, :]  # (B, H, rows, N, c)
    decay = np.exp(np.where(seen[..., None], gap, -np.inf))
    if decay.shape[-1] == 1:
        return (fq @ np.swapaxes(fk, -1, -2)) * decay[..., 0]
    return np.einsum("...ic,...sc,...isc->...is", fq, fk, decay)


def own_rounding(variant: Any, q: Any, k: Any, v: Any, *, causal: bool, dtype: Any, **kwargs: Any) -> np.ndarray | None:
    """Entrywise, what rounding may move each output entry by beyond the naive forms' luck: k times the sum
    of one rounding of the linear form's state (``state_resolution``: a target may round its state, which
    the quadratic definition does not hold) and the keys' amplitudes' typical rounding
    (``amplitude_resolution``: one sample of which the naive forms are); None where the variant has
    neither. The low-precision rules excuse each entry's error up to its own, never another row's
    (proofs/low-precision-rule.md, "The linear form's state", "The keys' amplitudes")."""
    kw = {"causal": causal, "dtype": dtype, **kwargs}
    state, amplitude = (f(variant, q, k, v, **kw) for f in (state_resolution, amplitude_resolution))
    if state is None and amplitude is None:
        return None
    return LOW_PRECISION_K * np.sum([x for x in (state, amplitude) if x is not None], axis=0)


def row_scales(pbound: np.ndarray, magnitude: np.ndarray, u: float) -> np.ndarray:
    """c_i, broadcast over row i's entries (last axis): the row's largest probabilistic rounding bound, at least
    u times its slice's ``magnitude``, infinite where that bound is not finite. The low-precision rules also hold
    in the norm max_i |x_i| / c_i, each row against its own rounding sensitivity, so that one cancelling row's
    naive error does not become every other row's allowance (proofs/low-precision-rule.md, "Each row in its own
    scale")."""
    with np.errstate(invalid="ignore"):
        row = np.max(np.where(np.isnan(pbound), np.inf, pbound), axis=-1, keepdims=True)
    return np.broadcast_to(np.maximum(row, u * np.asarray(magnitude)), np.shape(magnitude))


COARSE_YARDSTICK = 0.1  # a yardstick off by this share of its slice's norm: said in the Finding's note


def _counted(details: dict[str, Any], key: str, mask: np.ndarray, text: str) -> int:
    """How many entries ``mask`` holds: recorded under ``key`` and said in the note (the count, then ``text``)
    where there are any."""
    n = int(np.sum(mask))
    if n:
        details[key] = n
        add_note(details, f"{n} {text}")
    return n


def output_distance(out: np.ndarray, truth_value: np.ndarray, dtype: Any) -> np.ndarray:
    """|out - truth| entrywise, an infinite output read as the value nearest the truth that rounds to it
    in ``dtype`` (its distance max(T - s truth, 0) for the infinity of sign s, T the overflow threshold:
    0 where the exact value is past the range; infinite in float64) and NaN as an infinite distance
    (proofs/fp-forward-error.md, "Past the dtype's range")."""
    with np.errstate(invalid="ignore"):
        to_inf = np.maximum(overflow_threshold(dtype) - np.sign(out) * truth_value, 0.0)
        d = np.where(np.isinf(out), to_inf, np.abs(out - truth_value))
    return np.where(np.isnan(d), np.inf, d)


def judged_in_range(forms: list[Naive], truth_value: np.ndarray, candidates: np.ndarray, u: float) -> np.ndarray:
    """The entries of ``candidates`` the low-precision rules can judge: where the naive definition is
    finite and decided by rounding, and beyond those, where another standard algorithm is, if one is on
    all of them (the definition overflowing where that algorithm does not is no excuse for the target:
    float16 softmax with |q.k| past 65504 before the scale, ``softmax.scaled_queries``)."""
    ranges = [f.in_range(truth_value, u) for f in forms]
    own = candidates & ranges[0]
    wider = candidates & np.logical_or.reduce(ranges)
    if (wider & ~own).any() and any(np.all(r[wider]) for r in ranges[1:]):
        return wider
    return own


def noise_bound(variant: Any, q: Any, k: Any, v: Any, *, causal: bool, bound32: Any = None, **kwargs: Any) -> Any:
    """The bound that tells rounding noise: the probabilistic bound at float32's unit roundoff (the least
    precision a kernel accumulates in; ``bound32`` when already computed). None for variants whose
    transitions contract: there the rounding model's radii wrap, and a large radius is not evidence of
    cancellation."""
    var = _variants.get(variant)
    if "contracting-transitions" in var.tags(var.split_kwargs(kwargs)[0]):
        return None
    if bound32 is None:
        bound32 = probabilistic_bound(var, q, k, v, causal=causal, dtype="float32", **kwargs)[0]
    return bound32


def rounding_noise(
    variant: Any, q: Any, k: Any, v: Any, *, causal: bool, magnitude: np.ndarray, bound32: Any = None, **kwargs: Any
) -> np.ndarray:
    """Entries whose ``noise_bound`` is finite and reaches half their ``magnitude`` (the largest value of
    their (batch, head) slice): rounding noise for every algorithm, which the low-precision rules do not
    judge (proofs/low-precision-rule.md). An infinite bound is the model's failure (a softmax of logits
    1e8, one-hot and exact in every dtype, overflows the ball's exp), not evidence of noise."""
    return noise_entries(noise_bound(variant, q, k, v, causal=causal, bound32=bound32, **kwargs), magnitude)


NOISE_EVIDENCE = 2.0**-10  # a row every standard algorithm computes to this share of its magnitude is no noise


def quiet_rows(
    variant: Any, kwargs: dict[str, Any], forms: list[Naive], truth_value: np.ndarray, magnitude: np.ndarray
) -> np.ndarray:
    """For a variant normalised by a data-dependent denominator (tag ``denominator``), the entries of the rows
    (broadcast over their entries) where every naive form (``Naive``) is finite and within ``NOISE_EVIDENCE``
    times the ``magnitude`` of the truth at every entry: the standard algorithms compute those rows well, so
    they are not rounding noise however vacuous the probabilistic bound is there (its balls do not see a factor
    common to a numerator and its denominator: a heavy-tailed key's amplitude made one float32 bound 40 times
    its row's magnitude where every algorithm errs 1e-6 of it). None elsewhere: there a vacuous bound is
    honest, and the naive forms can agree by luck (gram-diag-subtracted's A v - diag(A) v cancels exactly in
    every form, where float16 targets err 2.5e-4 of terms 1e3)."""
    var = _variants.get(variant)
    if "denominator" not in var.tags(var.split_kwargs(kwargs)[0]):
        return np.zeros(np.shape(truth_value), dtype=bool)
    with np.errstate(invalid="ignore"):
        worst = functools.reduce(np.maximum, [np.abs(f.value - truth_value) for f in forms])
        quiet = np.where(np.isnan(worst), False, worst < NOISE_EVIDENCE * magnitude)
    return np.broadcast_to(np.all(quiet, axis=-1, keepdims=True), quiet.shape)


def noise_entries(bound32: Any, magnitude: np.ndarray) -> np.ndarray:
    """``rounding_noise`` from the ``noise_bound`` ``bound32`` (None: no entry is noise)."""
    if bound32 is None:
        return np.zeros(np.shape(magnitude), dtype=bool)
    return np.isfinite(bound32) & (bound32 > 0) & ~(bound32 < 0.5 * magnitude)  # a zero bound: exact, not noise


def slice_magnitude(value: np.ndarray, v: Any) -> np.ndarray:
    """The magnitude a bound of an output entry must stay below to say anything: the largest |value| of
    its (batch, head) slice, or the largest |v| where outputs cancel (|o| <= max|v| for normalised
    attention), broadcast to value's shape."""
    value = np.asarray(value, dtype=np.float64)
    return np.maximum(_slice_scale(value), _slice_scale(np.broadcast_to(np.asarray(v, dtype=np.float64), value.shape)))


def per_slice(mask: np.ndarray) -> Iterator[tuple[tuple[int, ...], np.ndarray]]:
    """(index, mask restricted to it) for each (batch, head) slice (all axes but the last two) where
    ``mask`` has an entry: the low-precision rules judge each head on its own, so that a head of small
    magnitude is not hidden in the norm of the others."""
    for idx in np.ndindex(*mask.shape[:-2]):
        if mask[idx].any():
            m = np.zeros_like(mask)
            m[idx] = mask[idx]
            yield idx, m


def _slice_scale(x: np.ndarray) -> np.ndarray:
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


def _rule_by_rows(
    err: np.ndarray,
    mask: np.ndarray,
    scales: np.ndarray,
    t: Any,
    naive: Yardsticks,
    u: float,
    excuse: Callable[[], np.ndarray | None],
    pool: np.ndarray | None = None,
    terms: np.ndarray | None = None,
) -> Callable[[bool], tuple[float, bool]]:
    """The rule in norm with each row in its own scale c_i (``row_scales``): over the rows i of ``mask``,

        ||err_i||_2 <= k c_i max_j (||naive_j - truth_j||_2 / c_j) + f u max_j ||truth_j||_2 [+ f u ||s_i||_2],

    j over the rows of ``pool`` (default ``mask``), each row's norm over the entries of its mask, every
    yardstick net of the truth's bound as in the slice's rule; rows of no finite c are not judged. Returns a
    function of whether each entry's own rounding is first taken off ``err``, giving (ratio, settled):
    settled where the ratio is above 1 even at the truth's most favourable value. ``terms`` (entrywise s,
    ``term_scale``) adds f u ||s_i||_2 to row i's allowance: where a whole slice cancels, the naive forms can be
    exact by luck while a kernel's stored features round its terms at u |v| (a correct float16 linear-elu of
    N = 3, d_v = 1 whose outputs cancel to 1e-3 |v| failed at 18.7 without it)."""
    pool = mask if pool is None else pool
    c = scales[..., 0]
    rows, pooled = mask.any(axis=-1) & np.isfinite(c), pool.any(axis=-1) & np.isfinite(c)

    def row_norms(x: np.ndarray, m: np.ndarray) -> np.ndarray:
        return np.sqrt(np.sum(np.where(m, x, 0.0) ** 2, axis=-1))

    def largest(x: np.ndarray, over: np.ndarray) -> float:
        return float(np.max(np.where(over, np.where(np.isnan(x), np.inf, x), 0.0), initial=0.0))

    t_pool, t_rows = row_norms(t.bound, pool), row_norms(t.bound, mask)
    floor: float | np.ndarray = LOW_PRECISION_FLOOR_ULPS * u * largest(row_norms(t.value, pool), pooled)
    if terms is not None:
        floor = floor + LOW_PRECISION_FLOOR_ULPS * u * row_norms(np.where(np.isfinite(terms), terms, 0.0), mask)

    def ratios(e_t: np.ndarray, per_c: float) -> float:
        with np.errstate(all="ignore"):
            return largest(e_t / (LOW_PRECISION_K * per_c * c + floor), rows)

    def judge(excused: bool) -> tuple[float, bool]:
        own = excuse() if excused else None
        e = row_norms(err if own is None else np.maximum(err - own, 0.0), mask)

        def per_c(x: np.ndarray) -> float:
            with np.errstate(all="ignore"):
                return largest(np.maximum(row_norms(x, pool) - t_pool, 0.0) / c, pooled)

        rho = naive.error(t.value, pool, u, per_c, lambda p: ratios(e, p) > 1.0)
        with np.errstate(all="ignore"):
            most = rho + largest(2 * t_pool / c, pooled)
        return ratios(e, rho), ratios(np.maximum(e - 2 * t_rows, 0.0), most) > 1.0

    return judge


LOOSE_SHARE = 2.0**-6  # below float32's precision, a bound at least this share of its row's magnitude is loose


def loose_threshold(value: np.ndarray, v: Any, dtype: Any) -> np.ndarray:
    """The least bound, entrywise, that also holds its row to the rule: in dtypes less precise than float32,
    ``LOOSE_SHARE`` times the row's largest |value| (there bounds grow with n u on rows of any conditioning:
    gamma_80 is 3.9% in float16, so an output 3% off passed); the row's own values, not the slice's |v| (one
    value token of 2048 whose weight is 6e-6 raised every row's threshold, and an output 10% off passed
    again). In float32 and float64 ``row_magnitude``: a bound near the row's size there is the row's own
    ill-conditioning, which every algorithm meets with other luck (FAVOR+ exponents near 1e4, rounded in
    float32, failed the builtin at 8.3 against the naive forms' luck; proofs/low-precision-rule.md, "A loose
    bound")."""
    if not unit_roundoff(dtype) > unit_roundoff("float32"):
        return row_magnitude(value, v)
    return LOOSE_SHARE * row_extent(value)


def row_extent(value: np.ndarray) -> np.ndarray:
    """Each row's largest finite |value|, broadcast over the row: a bound not below it cannot tell the row
    from zero (whatever |v| is: NormAttention's rows have rms 1 for any V)."""
    a = np.abs(np.asarray(value, dtype=np.float64))
    a = np.where(np.isfinite(a), a, 0.0)
    return np.broadcast_to(np.max(a, axis=-1, keepdims=True, initial=0.0), a.shape)


def _truth_unknown(t: Any, mask: np.ndarray, magnitude: np.ndarray) -> bool:
    """Whether the truth ``t``'s bound on ``mask`` is not below half the ``magnitude`` there (in norm): the oracle
    did not resolve it (its bound cannot tell it from zero), and no rule in norm can judge against it."""
    return bool(np.sum(np.where(mask, t.bound, 0.0) ** 2) >= 0.25 * np.sum(np.where(mask, magnitude, 0.0) ** 2))


def _exactly_zero(t: Any, mask: np.ndarray) -> bool:
    """Whether the truth ``t`` is 0 on ``mask`` to within its own bound (in norm)."""
    return bool(np.sum(np.where(mask, t.value, 0.0) ** 2) <= np.sum(np.where(mask, t.bound, 0.0) ** 2))


def row_magnitude(value: np.ndarray, v: Any) -> np.ndarray:
    """The larger of each row's largest |value| and its slice's largest |v| (the scale of an output that cancels:
    |o| <= max|v| in normalised attention), broadcast to value's shape: a bound not below it cannot tell the
    row from zero."""
    value = np.asarray(value, dtype=np.float64)
    a = np.where(np.isfinite(value), np.abs(value), 0.0)
    values = _slice_scale(np.broadcast_to(np.asarray(v, dtype=np.float64), a.shape))
    return np.maximum(np.broadcast_to(np.max(a, axis=-1, keepdims=True, initial=0.0), a.shape), values)


@algorithm_underflow.judged_by(lambda name, output, variant, *args, **kw: _variants.get(variant))
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
    already be representable in dtype. The bounds are the definition's, and where those fail, with the
    variant's other standard algorithms' underflow share added (``algorithm_underflow.judged_by``; the
    definition's alone: ``check_agreement.__wrapped__``)."""
    var = _variants.get(variant)
    out = np.asarray(output, dtype=np.float64)
    u = unit_roundoff(dtype)
    with np.errstate(all="ignore"):
        # one pass: the bound, the float64 reference (its midpoints) and a float64 certificate of the truth
        model = rounding_evaluation(var, q, k, v, causal=causal, dtype=dtype, **kwargs)
    bound, approx = model.bound, model.value
    reach = flushing_reach(var, bound, q, k, v, causal=causal, dtype=dtype, **kwargs)
    unresolved = unresolved_entries(var, q, k, v, causal=causal, dtype=dtype, **kwargs)
    scale = slice_magnitude(approx, v)
    vacuous_guess = ~(bound < 0.5 * scale) | ~(bound < loose_threshold(approx, v, dtype))
    if vacuous_guess.any():
        pbound, probability = probabilistic_bound(var, q, k, v, causal=causal, dtype=dtype, **kwargs)
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

    naive = naive_yardsticks(var, q, k, v, causal=causal, dtype=dtype, **kwargs)

    @functools.cache
    def bound32() -> Any:
        """``noise_bound``, evaluated once, when the low-precision rule first has entries to judge."""
        same = pbound if u == unit_roundoff("float32") else None  # float32's bound is the gate's
        return noise_bound(var, q, k, v, causal=causal, bound32=same, **kwargs)

    @functools.cache
    def resolution() -> np.ndarray:
        """``resolution_radius``, evaluated once, when the rule first meets a slice whose exact value is 0."""
        return resolution_radius(var, q, k, v, causal=causal, dtype=dtype, **kwargs)

    @functools.cache
    def terms() -> np.ndarray:
        """``term_scale``, evaluated once, when the row scale first judges a loose row."""
        return term_scale(var, q, k, v, causal=causal, **kwargs)

    @functools.cache
    def excuse() -> np.ndarray | None:
        """``own_rounding``, evaluated once, when a slice first fails the naive yardsticks."""
        return own_rounding(var, q, k, v, causal=causal, dtype=dtype, **kwargs)

    @functools.cache
    def computed32() -> np.ndarray:
        """``accumulator_computes``, evaluated once, when a non-finite output meets no finite bound."""
        return accumulator_computes(var, q, k, v, causal=causal, dtype=dtype, **kwargs)

    # first without the rule's request (float64 mostly suffices): a sharper truth is asked for only when
    # the rule's verdict could change with it (``_Judged.rule_open``)
    first = np.where(vacuous_guess, np.minimum(pbound, bound), bound)
    need = first
    if vacuous_guess.any():
        lp_need = np.full(approx.shape, np.inf)
        for form in naive.forward:  # every yardstick the rule may take where it is in range (judged_in_range)
            with np.errstate(invalid="ignore"):
                miss = np.abs(form.value - approx)
            lp_need = np.minimum(lp_need, np.where(form.in_range(approx, u), np.maximum(fallback, miss), np.inf))
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
        atol = np.maximum(0.01 * request, 1e-300)
        if model.certificate is None:
            t = truth(var, q, k, v, causal=causal, digits=None, atol=atol, **kwargs)
        else:  # the separate truth only for the entries the model's certificate does not meet
            t = truth_given(var, q, k, v, model.certificate, causal=causal, digits=None, atol=atol, **kwargs)
        t = t.exact_where((model.bound == 0) & np.isfinite(approx), approx)  # a zero radius: exact
        judged = _judge(
            name, out, v, t, bound, pbound, probability, naive, u, dtype, bound32, resolution, reach, unresolved,
            excuse, functools.partial(quiet_rows, var, kwargs), terms, computed32,
        )  # fmt: skip
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
    naive: Yardsticks,
    u: float,
    dtype: Any,
    bound32: Callable[[], Any],
    resolution: Callable[[], np.ndarray],
    reach: np.ndarray | float = 0.0,
    unresolved: np.ndarray | None = None,
    excuse: Callable[[], np.ndarray | None] = lambda: None,
    quiet: Callable[[list[Naive], np.ndarray, np.ndarray], np.ndarray] | None = None,
    terms: Callable[[], np.ndarray | None] = lambda: None,
    computed32: Callable[[], np.ndarray] | None = None,
) -> _Judged:
    """The Finding of ``check_agreement`` on the truth ``t``, every error counted at its worst over the
    truth's bound; entries within ``reach`` of flushing (``flushing_reach`` at least their |truth|) are
    held to their bounds but say nothing of the output's accuracy: they are not counted as informative.
    ``unresolved`` entries (``unresolved_entries``) are judged by no rule; NaN there still fails.
    ``excuse`` (entrywise, or None): in a slice that fails the naive yardsticks, each entry's error less
    its own excuse is what the naive yardsticks judge. ``quiet`` (``quiet_rows`` of the variant): the rows that
    are no rounding noise however large their float32 bound. ``computed32`` (``accumulator_computes``): where a
    standard algorithm with float32 intermediates returns a finite output; a non-finite output there fails where
    its exact value is finite and in range, though no bound judges the entry."""
    rule_open = False
    flushed = ~t.undefined & (reach > 0) & ~(reach < np.abs(t.value))
    unresolved = np.zeros(np.shape(out), dtype=bool) if unresolved is None else ~t.undefined & unresolved
    defined = ~t.undefined & ~unresolved
    mag = slice_magnitude(np.where(defined, t.value, 0.0), v)
    dist = output_distance(out, t.value, dtype)
    err = dist + t.bound  # worst case over the truth's own uncertainty
    # infinities the entrywise bounds allow (the exact value past the range, or within a bound of it)
    out_of_range = defined & np.isinf(out) & (err <= np.where(np.isfinite(bound), bound, 0.0))
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
    for which, mask, b in (("worst-case", wc, bound), ("probabilistic", pr, pbound)):
        if not mask.any():
            continue
        r = np.where(mask, error_ratios(err, b), 0.0)
        idx = np.unravel_index(int(np.argmax(r)), r.shape)
        ratios[which] = float(r[idx])
        if float(r[idx]) > measured or worst_at is None:
            measured, worst_rule, worst_at = float(r[idx]), which, tuple(int(i) for i in idx)
    # 1b. a bound (worst-case or probabilistic) not below ``loose_threshold`` cannot tell its row from one a few
    # percent off: such rows are also held to the naive forms' error per unit of sensitivity,
    # pooled over every row of their slice that the naive forms compute in range (proofs/low-precision-rule.md,
    # "A loose bound")
    scales = functools.cache(lambda: row_scales(pbound, mag, u))  # the rows' c, once, for 1b and 3
    loose = loose_threshold(np.where(defined, t.value, 0.0), v, dtype)
    beside = (wc & ~(bound < loose)) | (pr & ~(pbound < loose))
    ruled = np.zeros_like(beside)  # the entries the row scale judges
    if beside.any() and np.isfinite(pbound[beside]).any():
        r_beside = -1.0
        for at, b_s in per_slice(beside):
            pool = np.zeros_like(defined)
            pool[at] = defined[at]
            pool = judged_in_range(naive.forward, t.value, pool, u)
            if (b_s & pool).any() and _truth_unknown(t, pool, mag):
                rule_open = True  # judged on a sharper truth, or not at all
                continue
            if not (b_s := b_s & pool).any() or _exactly_zero(t, pool):
                ruled |= b_s  # an exact 0 is its bound's to judge: the naive forms cancel it exactly by luck
                continue
            ruled |= b_s
            judge = _rule_by_rows(err, b_s, scales(), t, naive, u, excuse, pool, terms())
            r_b, settled = judge(False)
            if r_b > 1.0 and excuse() is not None and (excused := judge(True))[0] < r_b:
                r_b, settled = excused
            rule_open = rule_open or (r_b > 1.0 and not settled)
            if r_b > r_beside:
                r_beside, worst_beside = r_b, b_s
        if r_beside >= 0:
            ratios["row scale"] = r_beside
        if r_beside > measured:
            b_err = np.where(worst_beside, err, -1.0)
            measured, worst_rule = r_beside, "row scale"
            worst_at = tuple(int(i) for i in np.unravel_index(int(np.argmax(b_err)), b_err.shape))
    # 3. the low-precision rule, in norm over the entries left, where the naive definition is informative
    # and the entry is more than rounding noise at float32's unit roundoff (a non-finite output is never
    # noise: the rule judges it, and fails it where the naive definition is finite)
    b32 = bound32() if rest.any() else None
    noisy = rest & np.isfinite(out) & noise_entries(b32, mag)
    if quiet is not None and noisy.any():
        noisy &= ~quiet(naive.forward, t.value, mag)
    rest &= ~noisy
    lp_count = 0
    if rest.any():
        lp_all = judged_in_range(naive.forward, t.value, rest, u)
        # a slice whose truth the oracle did not resolve is not judged: its bound would read as "exactly 0" (the
        # delta rule's wrapping balls at N = 200: a bound of 6e29 on values near 1)
        unknown = functools.reduce(
            np.logical_or, (s for _, s in per_slice(lp_all) if _truth_unknown(t, s, mag)), np.zeros_like(lp_all)
        )
        unresolved_truth = "entries whose truth the oracle did not resolve: not judged"
        if _counted(details, "unresolved_truth_entries", unknown, unresolved_truth):
            rule_open = True  # a sharper truth is asked for first (the first request may be coarse)
            lp_all &= ~unknown
        r_lp, lp, coarsest = -1.0, lp_all, 0.0
        for at, lp_s in per_slice(lp_all):  # each (batch, head) slice on its own; the worst one reported

            def norm(x: np.ndarray, m: np.ndarray = lp_s) -> float:  # Frobenius norm over the rule's entries
                return float(np.sqrt(np.sum(np.where(m, x, 0.0) ** 2)))

            e_t, t_bound, size = norm(err), norm(t.bound), norm(t.value)
            norm_by = "slice"

            def rule(e: float, t_bound: float = t_bound, size: float = size) -> tuple[float, float]:
                """(yardstick error, bound) from the yardstick's distance to the truth's value, net of
                the truth's bound (the yardstick errs at least that much)."""
                e_n = max(e - t_bound, 0.0)
                return e_n, LOW_PRECISION_K * e_n + LOW_PRECISION_FLOOR_ULPS * u * size

            e_t_least = max(norm(dist) - t_bound, 0.0)  # at the truth's most favourable value
            exact_zero = _exactly_zero(t, lp_s)
            zero_yardstick = norm(resolution()) if exact_zero else float("inf")
            if np.isfinite(zero_yardstick):
                # a yardstick that rounds cancelling terms alike is exact by luck (tau (A v - diag(A) v) at
                # N = 1), so the yardstick is one rounding of every stored result instead, at least as large
                # as any standard algorithm's luck (where that is finite: an infinite one would pass anything)
                e_n, b_lp, yardstick = zero_yardstick, LOW_PRECISION_K * zero_yardstick, "resolution"
                details["exact_zero_slices"] = details.get("exact_zero_slices", 0) + 1
            else:
                yardstick = "naive"

                def fails(e: float, e_t: float = e_t) -> bool:  # the target fails against yardstick error e
                    return e_t > rule(e)[1]

                e_n, b_lp = rule(naive.error(t.value, lp_s, u, norm, fails))
                if exact_zero:  # without a finite resolution: the truth's own bound is no error of the target
                    e_t = e_t_least
                elif e_t > b_lp and (own := excuse()) is not None:
                    # the linear form's state and the keys' amplitudes rounded once move a cancelling row
                    # more than the naive definition's luck shows: each entry's error is excused up to its
                    # own rounding, never by another row's (proofs/low-precision-rule.md, "The linear form's
                    # state", "The keys' amplitudes")
                    beyond = norm(np.maximum(err - own, 0.0))
                    if beyond < e_t:
                        e_t, yardstick = beyond, "own rounding"
            coarsest = max(coarsest, e_n / size if size > 0 else 0.0)
            r_s = e_t / b_lp if b_lp > 0 else (0.0 if e_t == 0 else float("inf"))
            r_s = float("inf") if r_s != r_s else r_s  # inf / inf: no bound holds an infinite error
            # a failure that holds at the truth's most favourable value is settled; a pass always is
            b_most = LOW_PRECISION_K * (e_n + 2 * t_bound) + LOW_PRECISION_FLOOR_ULPS * u * (size + t_bound)
            rule_open = rule_open or (r_s > 1.0 and not e_t_least > b_most)
            if r_s <= 1.0 and not exact_zero:  # where the slice passes, each row in its own scale too
                # (proofs/low-precision-rule.md, "Each row in its own scale")
                by_rows = _rule_by_rows(err, lp_s, scales(), t, naive, u, excuse)
                r_rows, settled = by_rows(yardstick == "own rounding")
                if r_rows > 1.0 and yardstick == "naive" and (excused := by_rows(True))[0] < r_rows:
                    (r_rows, settled), yardstick = excused, "own rounding"
                rule_open = rule_open or (r_rows > 1.0 and not settled)
                if r_rows > r_s:
                    r_s, norm_by = r_rows, "rows"
            if r_s > r_lp:
                r_lp, lp = r_s, lp_s
                details["low_precision"] = {
                    "target_error": e_t,
                    "naive_error": e_n,
                    "output_norm": size,
                    "slice": list(at),
                    "norm": norm_by,
                    **({"yardstick": yardstick} if yardstick != "naive" else {}),
                }
        lp_count = int(lp_all.sum())
        if coarsest >= COARSE_YARDSTICK:  # the dtype computes that slice to no better than this
            details["yardstick_share"] = coarsest
            add_note(details, f"the rule's yardstick errs {coarsest:.0%} of a slice's norm: its verdict says little")
        if r_lp >= 0:
            ratios["low-precision rule"] = r_lp
            if r_lp > measured:
                lp_err = np.where(lp, err, -1.0)
                measured, worst_rule = r_lp, "low-precision rule"
                worst_at = tuple(int(i) for i in np.unravel_index(int(np.argmax(lp_err)), lp_err.shape))
        rest &= ~lp_all
    # rows whose bounds cannot tell them from zero (no entry's |truth| above its bound: a zero row passes), where
    # the row scale cannot judge them either: held to their bounds, said in the Finding, not counted as informative
    with np.errstate(invalid="ignore"):
        tells = (wc & (np.abs(t.value) > bound)) | (pr & (np.abs(t.value) > pbound))
    known_zero = np.all(~defined | (np.abs(t.value) <= t.bound), axis=-1, keepdims=True)
    blind = (wc | pr) & ~np.any(tells, axis=-1, keepdims=True) & ~known_zero & ~ruled & ~flushed
    unbounded = int(rest.sum()) + int(noisy.sum()) + int(blind.sum())
    # rounding noise says nothing of accuracy, but no correct algorithm leaves its worst-case bound there;
    # nor is a non-finite output within a finite bound where no rule is informative (every standard
    # algorithm in the dtype overflowing is no excuse: a kernel's float32 accumulators do not)
    held = (noisy | (rest & ~np.isfinite(out))) & np.isfinite(bound)
    if held.any():
        r = np.where(held, error_ratios(err, bound), 0.0)
        idx = np.unravel_index(int(np.argmax(r)), r.shape)
        ratios["worst-case"] = max(ratios.get("worst-case", 0.0), float(r[idx]))
        if float(r[idx]) > measured:
            measured, worst_rule, worst_at = float(r[idx]), "worst-case", tuple(int(i) for i in idx)
    # a non-finite output that no finite bound holds (the definition in the dtype underflows to 0/0 or overflows
    # there) fails where its exact value is finite and in the dtype's range and an algorithm with float32
    # intermediates computes it: a kernel's float32 registers do (xformers#96's float16 FAVOR+ features, which
    # PR #98 computes in float32; proofs/fp-forward-error.md, "Non-finite outputs")
    with np.errstate(invalid="ignore"):
        representable = np.abs(t.value) + t.bound < overflow_threshold(dtype)
    lost = defined & ~np.isfinite(out) & ~np.isfinite(bound) & representable & ~out_of_range
    if lost.any() and computed32 is not None:
        lost &= computed32()
        if _counted(
            details,
            "nonfinite_entries",
            lost,
            "non-finite entries whose exact value is finite and in range, and which float32 intermediates compute",
        ):
            measured, worst_rule = float("inf"), "non-finite"
            worst_at = tuple(int(i) for i in np.argwhere(lost)[0])
    if _counted(
        details,
        "unresolved_entries",
        unresolved,
        "entries in rows whose denominator one rounding of the stored features can make 0: not judged (NaN there is)",
    ):
        lost = unresolved & np.isnan(out)  # no rounding of the features makes a NaN of a resolved numerator
        if lost.any():
            measured, worst_rule = float("inf"), "unresolved"
            worst_at = tuple(int(i) for i in np.argwhere(lost)[0])
    judged = wc | pr
    abs_err = np.where(judged, dist, 0.0)
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
    informative = int((wc & (bound > 0) & ~flushed & ~out_of_range & ~blind).sum()) + lp_count
    informative += int((pr & (pbound > 0) & ~flushed & ~out_of_range & ~blind).sum())
    unruled = beside & ~ruled & ~blind & ~flushed  # loose bounds the rule cannot hold to their rows' scale
    out_of_rule = "where the rule cannot judge them (no standard algorithm in the dtype's range)"
    _counted(details, "loose_entries", unruled, f"entries judged by bounds too loose to tell 3% off, {out_of_rule}")
    _counted(
        details,
        "blind_entries",
        blind,
        f"entries in rows whose bounds cannot tell them from zero, {out_of_rule}: held to those bounds, not judged",
    )
    informative += int((held & ~noisy & ~out_of_range).sum())
    if out_of_range.any():
        details["out_of_range_entries"] = int(out_of_range.sum())  # exact values past the range, returned inf
    n_flushed = _counted(
        details,
        "flushed_entries",
        flushed,
        "entries within reach of flushing (its charges reach their magnitude): held to their bounds, not judged for "
        "accuracy",
    )
    n_beyond, n_unresolved = int(out_of_range.sum()), int(unresolved.sum())
    if (unbounded or n_flushed or n_beyond or n_unresolved) and not informative:  # only exact entries, or none
        details["unjudged"] = ["output"]
        floor = f"{unbounded} at the dtype's noise floor or unbounded"
        floor += f", {n_flushed} within reach of flushing" if n_flushed else ""
        floor += f", {n_beyond} past the dtype's range" if n_beyond else ""
        floor += f", {n_unresolved} in rows whose denominator the dtype does not resolve" if n_unresolved else ""
        details["note"] = f"no inexact entry judged ({floor})"
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
