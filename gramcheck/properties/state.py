"""State passing (proofs/state-passing.md): a target that takes ``initial_state`` S_0 (B, H, d_k, d_v) and
returns ``(out, final_state)`` with ``output_final_state=True`` (fla's convention) is checked for

* state-agreement: out and S_N from a nonzero S_0 agree with the definition's, within 2 R(u) each;
* state-split: running [0, t) then [t, N) from the carried state equals one pass over [0, N), within the
  two computations' rounding bounds, for t at and off chunk boundaries;
* state-chain: a prefill, then one call per token, each from the state the call before returned as it came,
  agrees with the definition as one pass must (a decode loop, where a state carried in 16 bits is rounded whole
  at every call);
* zero-initial-state: S_0 = 0 gives what no S_0 gives, within the two rounding bounds (bit identity is
  recorded, not required: a kernel may take another code path when handed a state).

The bounds are the rounding model of the definition (proofs/fp-forward-error.md) run from the same S_0,
and, for the carried state, the definition's own propagation of a state error (linear, with non-negative
coefficients: decays and |q|).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import algorithm_underflow
from ..agreement import (
    LOW_PRECISION_FLOOR_ULPS,
    LOW_PRECISION_K,
    REASSOCIATION_FACTOR,
    REVERSED,
    WIDE_PRODUCTS,
    Yardsticks,
    loose_threshold,
    output_distance,
    per_slice,
    slice_magnitude,
)
from ..arith import BALL_F64, F64, RoundedArith, rounding_model
from ..findings import Finding, add_note, error_ratios
from ..forms import CHUNK_SIZES
from ..oracle import escalation_arith
from ..precision import max_finite, overflow_threshold, round_to, smallest_subnormal, unit_roundoff
from ..strategies import AttentionInputs
from ..targets import Target
from .base import arrays_of, guarded, output_difference
from .invariants import _rng


def state_passing(variant: Any, causal: bool, params: dict[str, Any]) -> bool:
    """Applicability: causal, a variant with a recurrent state, and no output norm (GroupNorm is applied
    to the output, not the state, and does not propagate a state error linearly)."""
    return causal and "state-passing" in variant.tags(params) and not params.get("group_norm")


def _not_declared(name: str, target: Target) -> Finding:
    return Finding.skip(name, f"{target.name} takes no initial_state/output_final_state")


def initial_state_of(target: Target, ex: AttentionInputs, salt: str = "state") -> np.ndarray:
    """A nonzero S_0 (B, H, d_k, d_v) drawn from the example, of the size of the state the inputs build:
    ``initial_state_at`` max|k| max|v|, k the keys as the recurrence writes them (``Variant.written_keys``).
    Scaled by the raw keys, the delta rule's S_0 was up to 1000 times any state its l2-normalised writes build,
    and the rule's floor, which counts S_0's terms, let final states 2^-10 off pass there."""
    keys = target.variant.written_keys(ex.k, **target.params, **ex.extras)
    return initial_state_at(ex, float(np.max(np.abs(keys))) * float(np.max(np.abs(ex.v))), salt)


def initial_state_at(ex: AttentionInputs, scale: float, salt: str = "state") -> np.ndarray:
    """S_0 (B, H, d_k, d_v) with independent N(0, c^2) entries, c = ``scale`` but at least 1 and at most a
    sixteenth of the dtype's overflow threshold (so that S_0 is finite in it), drawn from the example and
    ``salt``, rounded to the example's dtype."""
    B, H, N, dk = ex.q.shape
    scale = min(max(scale, 1.0), overflow_threshold(ex.dtype) / 16)
    s0 = _rng(ex, salt).standard_normal((B, H, dk, ex.v.shape[-1])) * scale
    return round_to(s0, ex.dtype)


def _reference(target: Target, ex: AttentionInputs, arith: Any, **opts: Any) -> Any:
    return target.variant.reference(
        ex.q, ex.k, ex.v, causal=True, arith=arith, output_final_state=True, **target.params, **ex.extras, **opts
    )


def state_truth(target: Target, ex: AttentionInputs, s0: np.ndarray | None, atol: tuple[np.ndarray, ...]) -> tuple:
    """((out, S_N) exact to within ``atol`` (per part), (their enclosure radii)): the variant's own certified
    float64 evaluation where it has one (``Variant.enclosure``: the delta rule's, whose ball radii wrap from
    N ~ 60), then float64 balls, the oracle's multiprecision balls (``oracle.escalation_arith``: Arb where
    python-flint is installed) at 128, 256, 512 bits only where that falls short; entrywise the
    tighter of the enclosure and the last balls (both enclose the exact value)."""
    own = target.variant.enclosure(
        ex.q, ex.k, ex.v, causal=True, output_final_state=True, initial_state=s0, **target.params, **ex.extras
    )
    if own is not None and all(np.all(r <= a) for r, a in zip(own[1], atol, strict=True)):
        return own
    for arith in (BALL_F64, *(escalation_arith(p) for p in (128, 256, 512))):
        balls = _reference(target, ex, arith, initial_state=s0)
        with arith.context():
            vals = tuple(np.asarray(arith.to_float64(b), dtype=np.float64) for b in balls)
            rads = tuple(np.asarray(arith.radius(b), dtype=np.float64) for b in balls)
        # the float64 rounding of an mpmath midpoint: half an ulp of the value
        rads = tuple(r + np.abs(v) * 2.0**-53 for r, v in zip(rads, vals, strict=True))
        if all(np.all(r <= a) for r, a in zip(rads, atol, strict=True)):
            break
    if own is not None:
        tighter = tuple(o < r for o, r in zip(own[1], rads, strict=True))
        vals = tuple(np.where(t, o, b) for t, o, b in zip(tighter, own[0], vals, strict=True))
        rads = tuple(np.where(t, o, r) for t, o, r in zip(tighter, own[1], rads, strict=True))
    return vals, rads


def state_bound(
    target: Target, ex: AttentionInputs, s0: np.ndarray | None, dtype: str | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """2 R(u) of (out, S_N) computed from S_0 in the target's dtype, or in ``dtype``
    (proofs/state-passing.md)."""
    dtype = target.dtype if dtype is None else dtype
    model = rounding_model(dtype)
    balls = _reference(target, ex, model, initial_state=s0)
    with model.context():
        radii = [np.asarray(model.radius(b), dtype=np.float64) for b in balls]
    kw = {**target.params, **ex.extras, "initial_state": s0, "output_final_state": True}
    share = algorithm_underflow.added_share(
        target.variant, model, balls, ex.q, ex.k, ex.v, causal=True, dtype=dtype, **kw
    )
    out_b, st_b = (REASSOCIATION_FACTOR * (r + s) for r, s in zip(radii, share, strict=True))
    return out_b, st_b


def carried_by_decays(target: Target, ex: AttentionInputs, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(s |q_t|^T (D_t x), D_N x) for x >= 0 (B, H, d_k, d_v): the definition from S_0 = x on |q| with zero keys
    and values, so that the decays D_t alone carry it (features phi(|q|) >= |phi(q)| for the monotone
    non-negative feature maps; a bonus or a skip term reads the values, here zero)."""
    with np.errstate(all="ignore"):
        out, st = target.variant.reference(
            np.abs(ex.q),
            np.zeros_like(ex.k),
            np.zeros_like(ex.v),
            causal=True,
            output_final_state=True,
            initial_state=x,
            **target.params,
            **ex.extras,
        )
    slack = 1 + 1e-12 * (ex.q.shape[-2] + ex.q.shape[-1])  # float64 evaluation of non-negative sums
    return np.abs(out) * slack, np.abs(st) * slack


def propagation(target: Target, ex: AttentionInputs, err: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Upper bounds on |out(S_0 + E) - out(S_0)| and |S_N(S_0 + E) - S_N(S_0)| for |E| <= err: the definition
    is affine in S_0. Where the transitions are decays, with coefficients s q_t diag(decay) (and decay for
    S_N): ``carried_by_decays`` of err. Where they contract (the delta rule: alpha_t (I - beta k k^T)),
    |s q_t^T P_t E| <= |s q_t^T P_t| err and |P_N E| <= |P_N| err with P_t the product of the transitions
    (``transitions``): the signed transitions applied to err bound nothing (they may cancel where another E of
    the same size does not), and their norms ignore that a write erases the directions it writes."""
    if "contracting-transitions" not in target.variant.tags(target.params):
        return carried_by_decays(target, ex, err)
    reads, product = transitions(target, ex)
    return np.abs(reads) @ err, np.abs(product) @ err


def transitions(target: Target, ex: AttentionInputs) -> tuple[np.ndarray, np.ndarray]:
    """(s q_t^T P_t (B, H, N, d_k), P_N (B, H, d_k, d_k)), P_t the product of a linear recurrence's transitions
    up to t: the definition run from S_0 = I with zero values of d_k columns (each column of the state evolves
    apart), with a slack for its float64 rounding (n u_64 of the largest entry; the transitions' products are
    at most 1)."""
    B, H, N, dk = ex.q.shape
    eye = np.broadcast_to(np.eye(dk), (B, H, dk, dk)).copy()
    with np.errstate(all="ignore"):
        reads, product = target.variant.reference(
            ex.q, ex.k, np.zeros((B, H, N, dk)), causal=True, output_final_state=True, initial_state=eye,
            **target.params, **ex.extras,
        )  # fmt: skip
    slack = 1e-15 * (N + dk)
    largest = np.max(np.abs(reads), axis=(-2, -1), keepdims=True, initial=0.0)
    return np.abs(reads) + slack * largest, np.abs(product) + slack


def extras_along(
    extras: Mapping[str, np.ndarray], axis: int, size: int, fn: Callable[[np.ndarray], np.ndarray]
) -> dict[str, Any]:
    """The extra inputs with ``fn`` applied to each that has ``size`` entries on ``axis`` (0: the batch, 2: the
    tokens, as q's; per-token and per-row inputs), the others (rwkv6's bonus u (H, d_k)) as they are."""
    return {n: fn(x) if x.ndim >= 3 and x.shape[axis] == size else x for n, x in extras.items()}


def _segment(ex: AttentionInputs, a: int, b: int) -> AttentionInputs:
    from dataclasses import replace

    extras = extras_along(ex.extras, 2, ex.q.shape[-2], lambda x: x[:, :, a:b])
    return replace(ex, q=ex.q[:, :, a:b], k=ex.k[:, :, a:b], v=ex.v[:, :, a:b], extras=extras)


def frobenius(err: np.ndarray) -> float:
    """||err||_F with a NaN entry counted as inf."""
    return float(np.sqrt(np.sum(np.where(np.isnan(err), np.inf, err) ** 2)))


@dataclass(frozen=True)
class NormPart:
    """A part judged as a whole: ||err||_F <= bound, ``err`` the entrywise errors (NaN: inf)."""

    err: np.ndarray
    bound: float

    @property
    def error(self) -> float:
        return frobenius(self.err)

    def first_failing(self, axis: int) -> int:
        """The shortest prefix along ``axis`` whose errors already exceed the bound in norm."""
        e = np.where(np.isnan(self.err), np.inf, self.err)
        per = np.sum(np.moveaxis(e, axis, -1).reshape(-1, e.shape[axis]) ** 2, axis=0)
        return int(np.flatnonzero(np.sqrt(np.cumsum(per)) > self.bound)[0])


def parts_finding(
    name: str,
    ex: AttentionInputs,
    parts: Mapping[str, tuple[np.ndarray, np.ndarray] | NormPart],
    *,
    token_axis: dict[str, int] | None = None,
    **details: Any,
) -> Finding:
    """measured = max over named parts of err / bound (NaN error: inf), or of ||err|| / bound for a
    ``NormPart``; details name the worst entry ('part[i,j,...]', or the part judged in norm), its error
    and bound, the shape, and for parts with a token axis the first failing token (for a part in norm,
    the end of the shortest failing prefix) and its position in each stressed chunk size."""
    worst_name, worst_r = "", -1.0
    worst_idx: tuple[Any, ...] = ()
    firsts: dict[str, int] = {}
    for part, value in parts.items():
        axis = (token_axis or {}).get(part)
        if isinstance(value, NormPart):
            e = value.error
            r_part = 0.0 if e == 0 else (e / value.bound if value.bound > 0 else math.inf)
            if r_part > worst_r:
                worst_name, worst_idx, worst_r = f"{part} in norm", (), r_part
                details["worst_error"], details["worst_bound"] = e, float(value.bound)
            if axis is not None and r_part > 1:
                firsts[part] = value.first_failing(axis)
            continue
        err, bound = value
        err = np.asarray(err, dtype=np.float64)
        bound = np.broadcast_to(np.asarray(bound, dtype=np.float64), err.shape)
        r = error_ratios(err, bound)
        if not r.size:
            continue
        i = np.unravel_index(int(np.argmax(r)), r.shape)
        if float(r[i]) > worst_r:
            worst_name, worst_idx, worst_r = part, i, float(r[i])
            details["worst_error"] = float(err[i])
            details["worst_bound"] = float(bound[i])
        if axis is not None and np.any(r > 1):
            bad = np.any(np.moveaxis(r > 1, axis, -1).reshape(-1, r.shape[axis]), axis=0)
            firsts[part] = int(np.flatnonzero(bad)[0])
    measured = max(worst_r, 0.0)
    passed = measured <= 1.0
    details["entry"] = f"{worst_name}[{','.join(str(int(j)) for j in worst_idx)}]" if worst_idx else worst_name
    details["shape"] = [int(x) for x in ex.q.shape] + [int(ex.v.shape[-1])]
    if firsts:
        t = min(firsts.values())
        details["first_failing_token"] = t
        details["chunk_position"] = {str(c): t % c for c in CHUNK_SIZES}
    return Finding(
        name,
        measured,
        1.0,
        rigour="sampled",
        counterexample=None if passed else ex.summary(),
        details=details,
        arrays=None if passed else arrays_of(ex),
    )


@guarded("state-agreement")
@algorithm_underflow.judged_property
def state_agreement(target: Target, ex: AttentionInputs, *, causal: bool) -> Finding | None:
    """From a nonzero S_0: |out - out*| <= 2 R_out(u) and |S_N - S_N*| <= 2 R_S(u) componentwise, * the
    definition run from the same S_0 (proofs/state-passing.md)."""
    if not target.passes_state:
        return _not_declared("state-agreement", target)
    s0 = initial_state_of(target, ex)
    out, st = target.run(ex.q, ex.k, ex.v, causal=True, initial_state=s0, output_final_state=True, **ex.extras)
    return judged_from(target, ex, s0, out, st, "state-agreement")


def judged_from(
    target: Target,
    ex: AttentionInputs,
    s0: np.ndarray | None,
    out: np.ndarray,
    st: np.ndarray,
    name: str,
    **details: Any,
) -> Finding:
    """The Finding ``name`` on the target's (out, S_N) from S_0 (None: none) on ``ex``: each against the
    definition's, within 2 R(u) where that bound judges and the low-precision rule in norm where it is vacuous
    (``Vacuous``)."""
    b_out, b_st = state_bound(target, ex, s0)
    vac = vacuous(target, ex, s0, (b_out, b_st))
    truths, rads = state_truth(target, ex, s0, vac.truth_request((b_out, b_st)))
    # an infinite output is measured from the nearest value that rounds to it, as agreement does (an exact value
    # past the dtype's range is returned as inf by every correct form)
    dists = tuple(output_distance(x, t, target.dtype) for x, t in zip((out, st), truths, strict=True))
    errors = tuple(d + r for d, r in zip(dists, rads, strict=True))
    # the entries the bound does not judge are still held to it where it is finite (no correct algorithm leaves
    # its worst-case bound, as agreement holds its noise), at the truth's most favourable value (the truth may be
    # known only coarsely there)
    held = tuple(
        np.where(m, np.maximum(d - r, 0.0), e) for m, d, r, e in zip(vac.unbounded, dists, rads, errors, strict=True)
    )
    parts: dict[str, Any] = {"out": (held[0], b_out), "final_state": (held[1], b_st)}
    rule_parts, rule = vac.rule_parts(
        target, ex, s0, truths, rads, errors, 1.0, initial_state_terms(target, ex, s0),
        writes=_writes(target, lambda: initial_state_terms(target, ex, s0, writes=True)),
    )  # fmt: skip
    parts.update(rule_parts)
    return parts_finding(
        name,
        ex,
        parts,
        token_axis={"out": 2},
        **({} if s0 is None else {"initial_state_max": float(np.max(np.abs(s0)))}),
        **vac.counts(rule),
        **details,
    )


CHAIN_CALLS = 128  # decode calls at most


def chain_segments(ex: AttentionInputs) -> list[AttentionInputs]:
    """A prefill and a decode loop: [0, p) and then one call per token up to N, p = max(1, N - CHAIN_CALLS)."""
    n = ex.q.shape[-2]
    p = max(1, n - CHAIN_CALLS)
    return [_segment(ex, 0, p)] + [_segment(ex, t, t + 1) for t in range(p, n)]


@guarded("state-chain")
@algorithm_underflow.judged_property
def state_chain(target: Target, ex: AttentionInputs, *, causal: bool) -> Finding | None:
    """A prefill [0, p) from S_0, then one call per token, each from the final state the call before returned,
    passed back as it came (``Target.run_chain``; S_0 in the dtype of a state the target returns): the outputs
    and the last state agree with the definition's from S_0 over [0, N) as one call's must (``judged_from``). A
    state carried at float32 or wider between calls rounds no more than a recurrence's own held state does each
    token; one carried in a 16-bit dtype is rounded whole at every call, which compounds where the writes do not
    erase it (proofs/state-passing.md, "2b. state-chain")."""
    if not target.passes_state:
        return _not_declared("state-chain", target)
    n = ex.q.shape[-2]
    if n < 2:
        return None
    s0 = initial_state_of(target, ex)
    segments = chain_segments(ex)
    out, st, carried = target.run_chain([arrays_of(seg) for seg in segments], initial_state=s0)
    f = judged_from(
        target, ex, s0, out, st, "state-chain", prefill=segments[0].q.shape[-2], calls=len(segments),
        state_dtype=carried,
    )  # fmt: skip
    if not f.passed and unit_roundoff(carried) > unit_roundoff("float32"):
        add_note(f.details, f"the state came back in {carried}: a decode loop rounds it whole at every call")
    return f


@dataclass(frozen=True)
class Vacuous:
    """Where the rounding bounds of (out, S_N) say nothing: not below half the magnitude of their
    (batch, head) slice, as agreement decides (``agreement.slice_magnitude``); and ``loose``, where they are
    below it but not below ``agreement.loose_threshold`` (a state's row is a key coordinate's d_v entries), which
    the bound judges and the rule in norm judges too."""

    out: np.ndarray
    state: np.ndarray
    sizes: tuple[np.ndarray, np.ndarray]
    u: float
    noise: tuple[np.ndarray, np.ndarray]
    loose: tuple[np.ndarray, np.ndarray]

    @property
    def any(self) -> bool:
        """Whether the rule in norm has entries to judge."""
        return bool(self.out.any() or self.state.any() or self.loose[0].any() or self.loose[1].any())

    @property
    def unbounded(self) -> tuple[np.ndarray, np.ndarray]:
        """Entries the rounding bound does not judge: the rule's and the noise."""
        return self.out | self.noise[0], self.state | self.noise[1]

    def truth_request(self, bounds: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """1% of the bound where it judges; nothing more than float64 gives elsewhere (``judgeable``)."""
        return tuple(np.where(m, np.inf, 0.01 * b) for m, b in zip((self.out, self.state), bounds, strict=True))  # type: ignore[return-value]

    def judgeable(self, rads: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """The vacuous entries the rule in norm can judge: the truth known to u |slice| / 100 there (the
        float64 truth; the delta rule's float64 balls wrap at moderate N, and mpmath balls there cost
        minutes: such entries are counted as unjudged instead)."""
        masks = (self.out | self.loose[0], self.state | self.loose[1])
        return tuple(  # type: ignore[return-value]
            m & (r <= self.u * size / 100) for m, r, size in zip(masks, rads, self.sizes, strict=True)
        )

    def rule_parts(
        self,
        target: Target,
        ex: AttentionInputs,
        s0: np.ndarray | None,
        truths: tuple[np.ndarray, ...],
        rads: tuple[np.ndarray, ...],
        errors: tuple[np.ndarray, ...],
        factor: float,
        terms: tuple[Any, Any],
        slack: tuple[Any, Any] = (0.0, 0.0),
        writes: Callable[[], tuple[Any, Any]] | None = None,
    ) -> tuple[dict[str, NormPart], tuple[np.ndarray, np.ndarray]]:
        """The parts of (out, S_N) the rule in norm judges, one per (batch, head) slice and, for the outputs of a
        long slice, one per window of ``RULE_WINDOW`` tokens (``rule_in_norm``): ``errors``
        against ``factor`` times the rule's bound (``rule_in_norm``, floored at ``terms``: the terms of the
        states the runs start from, ``initial_state_terms``; where that fails, ``writes()``: the same terms with
        the writes a chunk sums, for the delta rule) plus the norm of ``slack`` (what the property's own
        handling adds: state-split's rounding of the carried state), and the entries it judges: those of
        ``judgeable`` where the definition evaluated in the dtype is finite (the others have no yardstick, as
        agreement's ``judged_in_range``: counted as unjudged, a NaN there still fails) and the exact value is
        within the dtype's range (an infinite output there is measured by ``agreement.output_distance``)."""
        rule = self.judgeable((rads[0], rads[1]))
        parts: dict[str, NormPart] = {}
        if not any(m.any() for m in rule):
            return parts, rule
        names = ("out", "final_state")
        orders = Yardsticks(lambda rounding: naive_with_state(target, ex, s0, rounding), state_roundings(target.dtype))
        past = overflow_threshold(target.dtype)
        rule = tuple(  # type: ignore[assignment]
            m & np.isfinite(d) & ~(np.abs(t) >= past) for m, d, t in zip(rule, orders.forward[0], truths, strict=True)
        )

        def judged_by(runs: list[tuple[np.ndarray, np.ndarray]], terms: tuple[Any, Any] = terms) -> dict[str, NormPart]:
            parts = {}
            naives = ([o for o, _ in runs], [s for _, s in runs])
            for name, mask, err, truth, rad, naive, term, extra in zip(
                names, rule, errors, truths, rads, naives, terms, slack, strict=True
            ):
                extra = np.broadcast_to(extra, err.shape)
                window = RULE_WINDOW if name == "out" else None
                for label, idx, j, bound in rule_in_norm(mask, truth, rad, naive, target.dtype, term, window):
                    key = f"{name}[{','.join(map(str, idx))}]{label}"
                    parts[key] = NormPart(err[idx][j], factor * bound + frobenius(extra[idx][j]))
            return parts

        parts = judged_by(orders.forward)
        if any(not p.error <= p.bound for p in parts.values()):
            parts = judged_by(orders.every)
        if writes is not None and any(not p.error <= p.bound for p in parts.values()):
            parts = judged_by(orders.every, writes())
        return parts, rule

    def counts(self, rule: tuple[np.ndarray, np.ndarray]) -> dict[str, Any]:
        """The Finding's counts; ``unjudged`` names the parts with unjudged entries (a check's note says so)."""
        names = ("out", "final_state")
        unjudged = [n for n, m, j in zip(names, (self.out, self.state), rule, strict=True) if (m & ~j).any()]
        return {
            **({"unjudged": unjudged} if unjudged else {}),
            "vacuous_entries": {n: int(m.sum()) for n, m in zip(names, (self.out, self.state), strict=True)},
            "loose_entries": {n: int(m.sum()) for n, m in zip(names, self.loose, strict=True)},
            "noise_entries": {n: int(m.sum()) for n, m in zip(names, self.noise, strict=True)},
            "unjudged_entries": {
                n: int((m & ~j).sum()) for n, m, j in zip(names, (self.out, self.state), rule, strict=True)
            },
        }


def vacuous(target: Target, ex: AttentionInputs, s0: np.ndarray | None, bounds: tuple[np.ndarray, ...]) -> Vacuous:
    with np.errstate(all="ignore"):
        a_out, a_st = (np.asarray(x, dtype=np.float64) for x in _reference(target, ex, F64, initial_state=s0))
    sizes = slice_magnitude(a_out, ex.v), slice_magnitude(a_st, 0.0)
    masks = [~(b < 0.5 * size) for b, size in zip(bounds, sizes, strict=True)]
    rows = loose_threshold(a_out, ex.v, target.dtype), loose_threshold(a_st, 0.0, target.dtype)
    loose = [~m & ~(b < r) for m, b, r in zip(masks, bounds, rows, strict=True)]
    # rounding noise, as agreement's gate: where even float32's bound says nothing (a result cancelling
    # below float32's rounding), no kernel's error is more than noise; counted, not judged. Not where the
    # transitions contract (the delta rule's): there the model's radii wrap, and a large one is no evidence of
    # cancellation (``agreement.noise_bound``; a gated-deltanet final state doubled passed as noise)
    u = unit_roundoff(target.dtype)
    if "contracting-transitions" in target.variant.tags(target.params):
        noise = [np.zeros_like(m) for m in masks]
    else:
        b32 = bounds if u <= unit_roundoff("float32") else state_bound(target, ex, s0, "float32")
        noise = [m & ~(b < 0.5 * size) for m, b, size in zip(masks, b32, sizes, strict=True)]
    return Vacuous(masks[0] & ~noise[0], masks[1] & ~noise[1], sizes, u, (noise[0], noise[1]), (loose[0], loose[1]))


def state_roundings(dtype: Any) -> tuple[dict[str, bool], ...]:
    """The state rule's other yardstick roundings: the other summation order and, below float32, each product of
    two tensors formed in float32 as a kernel forms it. Where the rule judges a slice of one entry (a final state
    at d_k = d_v = 1) the first rounding's error is a sample of one, and its product roundings cancelled its
    features' on inputs where a correct kernel failed (proofs/low-precision-rule.md, "Products in float32").
    The forward rules keep the other order alone: there the products rounding made ill-conditioned inputs' yardstick
    3-5 times looser, and no false alarm asked for it."""
    if unit_roundoff(dtype) > unit_roundoff("float32"):
        return (REVERSED, WIDE_PRODUCTS)
    return (REVERSED,)


def naive_with_state(
    target: Target, ex: AttentionInputs, s0: np.ndarray | None, rounding: Mapping[str, bool] | None = None
) -> list[tuple[np.ndarray, np.ndarray]]:
    """(out, S_N) of the definition, then of each other standard algorithm of the variant
    (``Variant.algorithms``), evaluated in the target's dtype (``RoundedArith``: the state held in
    float32, the output stored in the dtype) from S_0: the low-precision rule's yardsticks; ``rounding``:
    ``RoundedArith``'s further options (``state_roundings``)."""
    ar = RoundedArith(target.dtype, **(rounding or {}))
    kw = {**target.params, **ex.extras, "initial_state": s0, "output_final_state": True}
    with np.errstate(all="ignore"):
        runs = [_reference(target, ex, ar, initial_state=s0)]
        runs += target.variant.algorithms(ex.q, ex.k, ex.v, causal=True, arith=ar, **kw)
    return [(ar.stored(o), ar.to_float64(s)) for o, s in runs]


def initial_state_terms(
    target: Target, ex: AttentionInputs, s0: np.ndarray | None, writes: bool = False
) -> tuple[np.ndarray | float, np.ndarray | float]:
    """The terms of the size of the state that a standard algorithm combines into (out, S_N): where the
    transitions only decay, s |q_t|^T (D_t |S_0|) and D_N |S_0|, D_t the decays alone (``carried_by_decays``;
    0 without S_0). Where they contract (the delta rule), chunk by chunk of the longest standard chunk size c:
    within a chunk from b the chunked algorithm combines the state it starts from, the definition's S_b (S_0 at
    b = 0), into each of its t - b corrections so far (times sqrt(t - b)), whatever later writes erase, and the
    rounding that leaves (in units of u) travels on through the transitions (``propagation``;
    proofs/state-passing.md, "The floor of the rule"). With ``writes``, the chunk's state also counts the writes
    it sums (``chunk_writes``)."""
    finite = lambda x: np.where(np.isfinite(x), x, 0.0)  # noqa: E731
    if "contracting-transitions" not in target.variant.tags(target.params):
        if s0 is None:
            return 0.0, 0.0
        out, st = (finite(x) for x in carried_by_decays(target, ex, np.abs(s0)))
        return out, st
    B, H, n, dk = ex.q.shape
    c = max(CHUNK_SIZES)
    outs = []
    state = np.zeros((B, H, dk, ex.v.shape[-1])) if s0 is None else np.asarray(s0, dtype=np.float64)
    r = np.zeros(np.shape(state))
    for b in range(0, n, c):
        seg = _segment(ex, b, min(b + c, n))
        m = seg.q.shape[-2]
        d_out, d_st = (finite(x) for x in carried_by_decays(target, seg, np.abs(state)))
        outs.append(d_out * np.sqrt(np.arange(1, m + 1))[:, None])
        r_st = d_st * math.sqrt(m)
        if writes:
            w_out, w_st = chunk_writes(target, seg)
            outs[-1], r_st = outs[-1] + w_out, r_st + w_st
        if b > 0:
            p_out, p_st = (finite(x) for x in propagation(target, seg, r))
            outs[-1] = outs[-1] + p_out
            r_st = r_st + p_st
        if b + c < n:
            state = finite(_reference(target, seg, F64, initial_state=state)[1])
        r = r_st
    return np.concatenate(outs, axis=-2), r


def _yardstick_distance(x: np.ndarray, truth: np.ndarray, dtype: Any) -> np.ndarray:
    """|x - truth| of a yardstick's value x; an infinity where the exact value is in the dtype's top binade is read
    as the target's are (``agreement.output_distance``): rounding an exact 65308 to inf in float16 is 212 off, and
    read as infinite it left the slice no yardstick (linear-unnormalised, heavy tails: the builtin failed at 1.52).
    Below the top binade an infinity is an intermediate's overflow, not a rounding of the result, and leaves the
    yardstick unfinished there (as a distance it would allow any error)."""
    top = np.abs(truth) >= max_finite(dtype) / 2
    with np.errstate(invalid="ignore"):
        return np.where(np.isinf(x) & ~top, np.inf, output_distance(x, truth, dtype))


def _writes(target: Target, terms: Callable[[], tuple[Any, Any]]) -> Callable[[], tuple[Any, Any]] | None:
    """``terms`` where the chunk's writes count (``chunk_writes``: contracting transitions), else None."""
    return terms if "contracting-transitions" in target.variant.tags(target.params) else None


def chunk_writes(target: Target, seg: AttentionInputs) -> tuple[np.ndarray, np.ndarray]:
    """The writes a chunked delta rule sums over the m tokens of a chunk, whatever the sums cancel to. It forms the
    chunk's writes from a zero state (U, by forward substitution; the state it starts from enters through W S_b,
    counted apart by ``initial_state_terms``): each k_j U_j^T = S^0_j - alpha_j S^0_{j-1}, at most w_j = |S^0_j| +
    |S^0_{j-1}| in the definition's states S^0 from zero at the chunk's start. Write j enters the sum that updates
    the state and the substitution of every later token of the chunk, so output t is floored at s |q_t|^T W_t and
    the chunk's final state at W_m, with W_t^2 = sum_{j<=t} (t - j + 1) (D_{t<-j} w_j)^2 (a root sum of squares, the
    size of a sum's rounding). Returns (s |q_t|^T W_t (B, H, m, d_v), W_m (B, H, d_k, d_v));
    proofs/state-passing.md, "The writes a chunk sums"."""
    B, H, m, dk = seg.q.shape
    zero = np.zeros((B, H, dk, seg.v.shape[-1]))
    states = _basis_reads(target, seg, seg.k, seg.v, zero)
    eye = np.broadcast_to(np.eye(dk), (B, H, dk, dk))
    # D_{t<-0} up to a factor (the scale and eps of the query e_i), as D_{t<-j} = c_t / c_j needs
    c = np.einsum("bhtii->bht", _basis_reads(target, seg, np.zeros_like(seg.k), np.zeros((B, H, m, dk)), eye)) / dk
    with np.errstate(all="ignore"):
        before = np.concatenate([zero[:, :, None], np.abs(states[:, :, :-1])], axis=2)
        undone = (np.abs(states) + before) / c[..., None, None]  # w_j / c_j
        sq = np.where(np.isnan(undone), np.inf, undone) ** 2
        at = np.arange(m)[:, None, None]
        # sum_{j<=t} (t - j + 1) x_j^2: each write enters the sum that forms it and every later token's solve
        grown = np.sqrt(np.maximum((at + 1) * np.cumsum(sq, axis=2) - np.cumsum(at * sq, axis=2), 0.0))
        # W_t, and W_t / alpha_t for the reads, which apply token t's decay: c_{t-1} (c_{-1} = 1) for c_t
        w, unread = (x[..., None, None] * grown for x in (c, np.concatenate([np.ones((B, H, 1)), c[..., :-1]], -1)))
    w, unread = (np.where(np.isfinite(x), x, 0.0) for x in (w, unread))  # a decay that underflowed: no known size
    return _read_per_token(target, seg, unread), w[:, :, -1]


def _read_per_token(target: Target, seg: AttentionInputs, states: np.ndarray) -> np.ndarray:
    """(B, H, m, d_v): s |q_t|^T alpha_t X_t for the states X_t (B, H, m, d_k, d_v) >= 0, each read by its own token
    (the definition on token t alone from X_t with zero keys and values; the tokens folded into the batch axis)."""
    B, H, m, dk = seg.q.shape
    fold = lambda x: np.moveaxis(x, 2, 0).reshape(m * B, *x.shape[1:2], 1, *x.shape[3:])  # noqa: E731
    extras = extras_along(seg.extras, 2, m, fold)
    x = np.moveaxis(states, 2, 0).reshape(m * B, H, dk, -1)
    with np.errstate(all="ignore"):
        out = target.variant.reference(
            fold(np.abs(seg.q)), np.zeros((m * B, H, 1, dk)), np.zeros((m * B, H, 1, x.shape[-1])), causal=True,
            initial_state=x, **target.params, **extras,
        )  # fmt: skip
    out = np.asarray(out, dtype=np.float64).reshape(m, B, H, -1)
    return np.abs(np.moveaxis(out, 0, 2))


def _basis_reads(target: Target, seg: AttentionInputs, k: np.ndarray, v: np.ndarray, state: np.ndarray) -> np.ndarray:
    """(B, H, m, d_k, d_v): the definition's states S_t of every token, run from ``state`` on the keys ``k`` and
    values ``v``: row i of S_t read by the query e_i at scale 1 (the d_k queries folded into the batch axis, with
    every input that has one), up to the l2 normalisation's eps of the queries."""
    B, H, m, dk = seg.q.shape
    tile = lambda x: np.concatenate([x] * dk, axis=0)  # noqa: E731
    queries = np.broadcast_to(np.eye(dk)[:, None, None, None, :], (dk, B, H, m, dk)).reshape(dk * B, H, m, dk)
    extras = extras_along(seg.extras, 0, B, tile)
    with np.errstate(all="ignore"):
        reads = target.variant.reference(
            queries, tile(k), tile(v), causal=True, initial_state=tile(state), **{**target.params, "scale": 1.0},
            **extras,
        )  # fmt: skip
    return np.asarray(reads, dtype=np.float64).reshape(dk, B, H, m, -1).transpose(1, 2, 3, 0, 4)


TRUTH_RADII = 100.0  # the rule's floor in radii of the truth at least (``rule_in_norm``)
RULE_WINDOW = 64  # tokens: the chunk of production kernels, over which the rule in norm also judges outputs


def rule_in_norm(
    judged: np.ndarray,
    truth: np.ndarray,
    rad: np.ndarray,
    naives: list[np.ndarray],
    dtype: Any,
    terms: np.ndarray | float = 0.0,
    window: int | None = None,
) -> list[tuple[str, tuple[int, ...], np.ndarray, float]]:
    """(label, slice index, its judged entries, bound) per (batch, head) slice with judged entries: the
    low-precision rule in norm (proofs/low-precision-rule.md), ||T - truth||_J <= 2 ||naive - truth||_J +
    2 ||max(u |truth|, u_s terms)||_J, the naive error the largest over the definition and the other
    algorithms that are finite there (``_yardstick_distance``), net of the truth's radius (the caller adds the
    radius to the error);
    ``terms``: the magnitude of the terms of S_0 that every algorithm rounds in the precision it holds the
    state in, u_s (``initial_state_terms``; float32 below float64). A definition that is not finite there
    gives no yardstick: bound 0 (``Vacuous.rule_parts`` leaves such entries out). With ``window``, the entries
    of each ``window`` rows of a longer slice (tokens, for outputs) are judged the same way on their own too
    (label ' tokens a-b'): in the slice's norm an error confined to a few rows hides behind the rounding of all
    the others (outputs 0.5% off after token 64 passed at 0.92; proofs/state-passing.md, "Windows")."""
    u = unit_roundoff(dtype)
    # the truth is known to its radius: the floor is at least 100 radii (an exact 0 known to +-1e-15 gave a bound
    # of 1e-61, which the error, radius included, failed by 1e46; the judged radius is at most u |slice| / 100)
    scale = np.maximum(np.abs(truth), terms * (min(u, unit_roundoff("float32")) / u))
    scale = np.maximum(scale, TRUTH_RADII * rad / (LOW_PRECISION_FLOOR_ULPS * u))
    out = []
    for idx, mask in per_slice(judged):
        j = mask[idx]
        parts = [("", j)]
        length = j.shape[-2] if j.ndim >= 2 else 0
        if window is not None and length >= 2 * window:  # windows of window rows, the last taking the remainder
            starts = list(range(0, length - window + 1, window))
            for a, b in zip(starts, [*starts[1:], length], strict=True):
                jw = np.zeros_like(j)
                jw[..., a:b, :] = j[..., a:b, :]
                parts.append((f" tokens {a}-{b - 1}", jw))
        for label, jw in parts:
            if not jw.any():
                continue
            errs = [_yardstick_distance(x[idx], truth[idx], dtype)[jw] for x in naives]
            finite = bool(np.all(np.isfinite(errs[0])))
            naive_err = max(frobenius(e) for e in errs if np.all(np.isfinite(e))) if finite else 0.0
            yard = max(naive_err - frobenius(rad[idx][jw]), 0.0)
            bound = LOW_PRECISION_K * yard + LOW_PRECISION_FLOOR_ULPS * u * frobenius(scale[idx][jw])
            out.append((label, idx, jw, bound if finite else 0.0))
    return out


def split_point(ex: AttentionInputs) -> int:
    """t in [1, N - 1]: a chunk boundary or its neighbour (c - 1, c, c + 1 for multiples c of the chunk
    sizes) when N reaches one, else any; chosen by the example."""
    n = ex.q.shape[-2]
    rng = _rng(ex, "split")
    near = sorted({m + o for c in CHUNK_SIZES for m in range(c, n, c) for o in (-1, 0, 1) if 1 <= m + o <= n - 1})
    if near and rng.random() < 0.75:
        return int(rng.choice(near))
    return int(rng.integers(1, n))


@guarded("state-split")
@algorithm_underflow.judged_property
def state_split(target: Target, ex: AttentionInputs, *, causal: bool) -> Finding | None:
    """[0, t) from S_0, then [t, N) from the carried state, equals one pass over [0, N) from S_0:
    |split - full| <= B_full + B_split, with B_split the rounding bounds of both segments plus the
    propagation of the carried state's error (its bound and its rounding to the dtype)."""
    if not target.passes_state:
        return _not_declared("state-split", target)
    n = ex.q.shape[-2]
    if n < 2:
        return None
    t = split_point(ex)
    s0 = initial_state_of(target, ex) if _rng(ex, "zero").random() < 0.75 else None
    first, second = _segment(ex, 0, t), _segment(ex, t, n)
    out, st = target.run(ex.q, ex.k, ex.v, causal=True, initial_state=s0, output_final_state=True, **ex.extras)
    o1, s1 = target.run(
        first.q, first.k, first.v, causal=True, initial_state=s0, output_final_state=True, **first.extras
    )
    carried = round_to(s1, target.dtype)  # passed in the target's dtype
    if not np.all(np.isfinite(carried)) and np.all(np.isfinite(s1)):
        return None  # the state leaves the dtype's range: it cannot be passed in it, no example of the property
    o2, s2 = target.run(
        second.q, second.k, second.v, causal=True, initial_state=carried, output_final_state=True, **second.extras
    )
    b_out, b_st = state_bound(target, ex, s0)
    b1_out, b1_st = state_bound(target, first, s0)
    b2_out, b2_st = state_bound(target, second, carried)
    p_out, p_st = propagation(target, second, b1_st + np.abs(carried - s1))
    split_out = np.concatenate([o1, o2], axis=2)
    bound_out = b_out + np.concatenate([b1_out, b2_out + p_out], axis=2)
    bound_st = b_st + b2_st + p_st
    # where a bound says nothing, both runs are held to the rule in norm: their difference to twice it
    vac = vacuous(target, ex, s0, (bound_out, bound_st))
    diffs = output_difference(split_out, out, target.dtype), output_difference(s2, st, target.dtype)
    parts: dict[str, Any] = {"out": (diffs[0], bound_out), "final_state": (diffs[1], bound_st)}  # all held to them
    rule: tuple[np.ndarray, np.ndarray] = (np.zeros_like(vac.out), np.zeros_like(vac.state))
    if vac.any:
        truths, rads = state_truth(target, ex, s0, vac.truth_request((bound_out, bound_st)))
        # the definition's state at t, not the target's: a target could widen the rule with a state it returns
        # too large (erased by the next write at no cost)
        with np.errstate(all="ignore"):
            exact_t = np.asarray(_reference(target, first, F64, initial_state=s0)[1], dtype=np.float64)
        exact_t = np.where(np.isfinite(exact_t), exact_t, 0.0)
        # the second segment starts from the carried state: its terms count from t on
        def split_terms(writes: bool) -> tuple[Any, Any]:
            t_full, t_first, t_second = (
                initial_state_terms(target, seg, s, writes) for seg, s in ((ex, s0), (first, s0), (second, exact_t))
            )
            both = np.concatenate(
                [np.broadcast_to(t_first[0], np.shape(o1)), np.broadcast_to(t_second[0], np.shape(o2))], axis=2
            )
            return np.maximum(t_full[0], both), np.maximum(t_full[1], t_second[1])

        # the carried state's rounding to the dtype, at most that of the definition's state: relative, and in the
        # subnormals absolute (rwkv6 in float16, a state of 3e-7 decayed from S_0 carried 7% off)
        most = 2 * unit_roundoff(target.dtype) * np.abs(exact_t) + smallest_subnormal(target.dtype)
        rounding = np.minimum(np.abs(carried - s1), most)
        r_out, r_st = propagation(target, second, np.where(np.isfinite(rounding), rounding, 0.0))
        slack = (np.concatenate([np.zeros(np.shape(o1)), r_out], axis=2), r_st)
        rule_parts, rule = vac.rule_parts(
            target, ex, s0, truths, rads, diffs, 2.0, split_terms(False), slack,
            _writes(target, lambda: split_terms(True)),
        )  # fmt: skip
        parts.update(rule_parts)
    return parts_finding(
        "state-split",
        ex,
        parts,
        token_axis={"out": 2},
        **vac.counts(rule),
        split=t,
        split_chunk_position={str(c): t % c for c in CHUNK_SIZES},
        initial_state="nonzero" if s0 is not None else "none",
    )


@guarded("zero-initial-state")
@algorithm_underflow.judged_property
def zero_initial_state(target: Target, ex: AttentionInputs, *, causal: bool) -> Finding | None:
    """S_0 = 0 gives the output and final state that no S_0 gives, within the two rounding bounds;
    ``bit_identical`` records whether they are the same bits."""
    if not target.passes_state:
        return _not_declared("zero-initial-state", target)
    B, H, N, dk = ex.q.shape
    zero = np.zeros((B, H, dk, ex.v.shape[-1]))
    a_out, a_st = target.run(ex.q, ex.k, ex.v, causal=True, output_final_state=True, **ex.extras)
    z_out, z_st = target.run(ex.q, ex.k, ex.v, causal=True, initial_state=zero, output_final_state=True, **ex.extras)
    b_out, b_st = state_bound(target, ex, None)
    same = bool(np.array_equal(a_out, z_out, equal_nan=True) and np.array_equal(a_st, z_st, equal_nan=True))
    return parts_finding(
        "zero-initial-state",
        ex,
        {  # NaN in both runs is no agreement: the definition's state-passing results are finite
            "out": (output_difference(a_out, z_out, target.dtype, nan_agrees=False), 2 * b_out),
            "final_state": (output_difference(a_st, z_st, target.dtype, nan_agrees=False), 2 * b_st),
        },
        token_axis={"out": 2},
        bit_identical=same,
    )
