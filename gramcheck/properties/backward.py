"""Backward agreement (proofs/backward-agreement.md): the target's gradients in its own dtype against the
gradients of the definition.

For L = <W, o> (+ <W_S, S_N> for a state-passing target, run from a nonzero S_0), with W, W_S fixed and
representable in the dtype, each gradient G_x (x in q, k, v, the differentiable extra inputs, and the
initial state) is compared with the reference G*_x, autograd of the definition evaluated in float64:

    max |G_x - G*_x| <= k max |N_x - G*_x| + (4 u + gamma~_n(lambda; u_32)) s_x,   k = 2,
    s_x = max(max |G*_x|, T_x) componentwise,   n = N + d_k + d_v,

N_x being autograd of the same definition evaluated in the target's dtype (the low-precision rule of the
forward, proofs/low-precision-rule.md, applied per gradient tensor, as FlashAttention's backward tests
do) and T_x the size of each entry's terms: the chain rule's sum over paths of the products of the
partials' sizes (``gramcheck.gradient_terms``). The floor is the final roundings' 4 u s_x in the
target's dtype plus Higham and Mary's probabilistic bound of an accumulation of n terms in float32 (the
least precision any kernel accumulates in), n bounding the roundings on any chain-rule path (a sum over
the tokens of terms formed by inner products over the head dimensions): a correct float32 algorithm that
sums in another order than the definition errs by that much. Applies to float32, bfloat16 and float16
targets; a float64 target is held to the rule in float32 (``judge_in_float32``: at least float32's accuracy).
A state-passing target is judged on its plain call too.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any

import numpy as np

from ..agreement import denominator_condition as _denominator_condition
from ..agreement import naive_definition, output_distance
from ..autodiff import TorchDefinition
from ..findings import Finding
from ..gradient_terms import TermArith
from ..precision import gamma, gamma_tilde, overflow_threshold, round_to, smallest_subnormal, unit_roundoff
from ..strategies import AttentionInputs
from ..targets import Target, taped
from .base import guarded
from .invariants import _rng, _undefined
from .state import NormPart, frobenius, initial_state_of, parts_finding, state_passing

BACKWARD_K = 2.0
BACKWARD_FLOOR_ULPS = 4.0
ACCUMULATOR = "float32"  # the least precision a kernel accumulates in (fla's kernels; tensor cores)
CANCELLED = 2.0**-40  # a reference gradient this small against its natural size vanishes by cancellation


def _torch() -> Any:
    import torch

    return torch


def differentiable(target: Target, ex: AttentionInputs) -> list[str]:
    """The inputs whose gradients are checked: q, k, v and the extra inputs that are not fixed draws."""
    return ["q", "k", "v", *[n for n in ex.extras if target.variant.input(n).differentiable]]


def _loss(res: Any, w: Any, ws: Any) -> Any:
    if isinstance(res, (tuple, list)):
        return (res[0] * w.to(res[0].dtype)).sum() + (res[1] * ws.to(res[1].dtype)).sum()
    return (res * w.to(res.dtype)).sum()


def _grads(
    loss: Any, leaves: dict[str, Any], target: Target | None = None, missing: list[str] | None = None
) -> dict[str, np.ndarray]:
    """Gradients of loss as float64 arrays (zeros where unused, whose names are appended to ``missing``
    when given); through ``target.gradients`` for a target."""
    if target is None:
        gs = _torch().autograd.grad(loss, list(leaves.values()), allow_unused=True)
    else:
        gs = target.gradients(loss, list(leaves.values()))
    if missing is not None:
        missing.extend(n for n, g in zip(leaves, gs, strict=True) if g is None)
    return {
        n: (np.zeros(tuple(x.shape)) if g is None else g.detach().to("cpu").double().numpy())
        for (n, x), g in zip(leaves.items(), gs, strict=True)
    }


def definition_gradients(
    target: Target,
    arrays: dict[str, np.ndarray],
    names: list[str],
    w: np.ndarray,
    ws: np.ndarray | None,
    *,
    causal: bool,
    dtype: str,
    fn: Any = None,
    carried_shift: bool = False,
) -> dict[str, np.ndarray]:
    """Gradients of L = <W, o> (+ <W_S, S_N>) through the variant's definition (or its other standard
    algorithm ``fn``, one of ``Variant.algorithms_for``) evaluated in ``dtype``; ``carried_shift``: with
    the gradient through its stabilising maxima (``TorchDefinition``)."""
    torch = _torch()
    ar = TorchDefinition(dtype, carried_shift=carried_shift)
    t = {n: ar.asarray(x).requires_grad_(n in names) for n, x in arrays.items()}
    with torch.enable_grad():
        res = _run_definition(target, ar, t, causal=causal, fn=fn)
        res = (ar.stored(res[0]), res[1]) if isinstance(res, (tuple, list)) else ar.stored(res)
        loss = _loss(res, torch.as_tensor(w), None if ws is None else torch.as_tensor(ws))
        return _grads(loss, {n: t[n] for n in names})


def _run_definition(target: Target, ar: Any, t: dict[str, Any], *, causal: bool, fn: Any = None) -> Any:
    """The variant's definition (or ``fn``, same signature) in arithmetic ``ar`` on the values ``t`` (q,
    k, v, extras and, when present, the initial state, whose final state is then returned with the
    output)."""
    extras = {n: x for n, x in t.items() if n not in ("q", "k", "v", "initial_state")}
    opts: dict[str, Any] = {}
    if "initial_state" in t:
        opts = {"initial_state": t["initial_state"], "output_final_state": True}
    fn = target.variant.reference_fn if fn is None else fn
    return fn(ar, t["q"], t["k"], t["v"], causal=causal, **target.params, **extras, **opts)


def _largest(diff: np.ndarray) -> float:
    return float(np.max(np.where(np.isnan(diff), np.inf, diff), initial=0.0))


def yardstick_error(naive: list[dict[str, np.ndarray]], ref: dict[str, np.ndarray], name: str, size: Any) -> float:
    """The largest ``size`` of N_x - G*_x over the definition's gradient in the dtype (``naive[0]``; a
    non-finite entry counts as inf) and each other standard algorithm's that is finite (one that
    overflows says nothing of rounding), as the forward's yardstick (agreement.yardstick_error)."""
    first = size(np.abs(naive[0][name] - ref[name]))
    rest = [size(np.abs(g[name] - ref[name])) for g in naive[1:] if np.all(np.isfinite(g[name]))]
    return max([first, *rest])


def target_gradients(
    target: Target,
    arrays: dict[str, np.ndarray],
    names: list[str],
    w: np.ndarray,
    ws: np.ndarray | None,
    *,
    causal: bool,
    missing: list[str] | None = None,
    call_dtype: str | None = None,
) -> dict[str, np.ndarray]:
    """Gradients of the same L through the target, called in its dtype (or ``call_dtype``: its own backward); the
    inputs no gradient reaches (autograd gives None: zeros here) are appended to ``missing`` when given. Replayed
    in a judgment made twice (``targets.taped``)."""

    def run() -> tuple[dict[str, np.ndarray], list[str]]:
        torch = _torch()
        t = target.tensors(arrays, dtype=call_dtype)
        for n in names:
            t[n] = t[n].detach().requires_grad_(True)
        leaves = {n: t[n] for n in names}
        opts = {"output_final_state": True} if "initial_state" in t else {}
        cut: list[str] = []
        with torch.enable_grad():
            res = target.call_torch(t.pop("q"), t.pop("k"), t.pop("v"), causal=causal, **t, **opts)
            loss = _loss(res, torch.as_tensor(w), None if ws is None else torch.as_tensor(ws))
            return _grads(loss, leaves, target, cut), cut

    options = (causal, tuple(names), call_dtype or target.dtype)
    grads, cut = taped(target, "gradients", options, arrays, run, {"loss w": w, "loss ws": ws})
    if missing is not None:
        missing.extend(cut)
    return grads


def _is_log_decay(target: Target, name: str) -> bool:
    return name not in ("q", "k", "v", "initial_state") and target.variant.input(name).log_decay


def gradient_terms(
    target: Target,
    arrays: dict[str, np.ndarray],
    names: list[str],
    w: np.ndarray,
    ws: np.ndarray | None,
    *,
    causal: bool,
) -> dict[str, np.ndarray]:
    """Componentwise size of each gradient's terms: the chain rule's sum over paths of |products of
    local partials|, seeded with |W| (and |W_S|), through the variant's definition (gramcheck.gradient_terms)."""
    ar = TermArith()
    t = {n: ar.asarray(x) for n, x in arrays.items()}
    with ar.context():
        res = _run_definition(target, ar, t, causal=causal)
        outs = res if isinstance(res, (tuple, list)) else (res,)
        ar.backward([(o, s) for o, s in zip(outs, (w, ws), strict=False) if s is not None])
    return {n: np.zeros(np.shape(arrays[n])) if t[n].adj is None else np.asarray(t[n].adj) for n in names}


def log_decay_terms(arrays: dict[str, np.ndarray], ref: dict[str, np.ndarray], name: str) -> np.ndarray:
    """The size of the terms of a log-decay gradient: with decays entering as exp(b_t - b_s), b the
    cumulative log-decays, dL/dg_r = sum_{t >= r} (q_t * dq_t - k_t * dk_t) (+ S_0 * dS_0 summed over
    d_v at r = 0), a sum of N terms that cancel; their magnitudes summed over the tokens (and channels
    where g is one per head), broadcast to g's shape."""
    g = arrays[name]
    per = np.abs(arrays["q"] * ref["q"]) + np.abs(arrays["k"] * ref["k"])  # (B, H, N, d_k)
    if "initial_state" in ref:
        s0 = np.sum(np.abs(arrays["initial_state"] * ref["initial_state"]), axis=-1)  # (B, H, d_k)
        per = per + s0[:, :, None, :] / per.shape[2]
    if g.ndim == 3 or g.shape[-1] == 1:
        per = np.sum(per, axis=-1, keepdims=True)
    total = np.sum(per, axis=2, keepdims=True)  # (B, H, 1, c)
    return np.broadcast_to(total if g.ndim == 4 else total[..., 0], g.shape)


def gradient_sizes(
    arrays: dict[str, np.ndarray], ref: dict[str, np.ndarray], names: list[str]
) -> dict[str, tuple[float, float]]:
    """Per input x of ``names``: (max |G*_x|, its natural size), the natural size being L's sensitivity to a
    relative change of every input, sum_y max|G*_y| max|y|, over max|x| (0 where x is 0): the size of x's
    gradient even where it vanishes by cancellation (dq and dk of a normalised form at N = 1)."""
    size = {n: float(np.max(np.abs(arrays[n]), initial=0.0)) for n in names}
    largest = {n: float(np.max(np.abs(ref[n]), initial=0.0)) for n in names}
    sensitivity = sum(largest[n] * size[n] for n in names)
    return {n: (largest[n], sensitivity / size[n] if size[n] > 0 else 0.0) for n in names}


def accumulation_length(ex: AttentionInputs) -> int:
    """n = N + d_k + d_v: the roundings of an accumulation on any chain-rule path of an attention gradient
    (a sum over at most N tokens of terms formed by inner products over d_k and d_v)."""
    return int(ex.q.shape[2] + ex.q.shape[-1] + ex.v.shape[-1])


def smooth_definition(variant: Any, causal: bool, params: dict[str, Any]) -> bool:
    """The definition's gradient is well conditioned wherever it exists: no denominator can vanish (relu
    and trig features excluded: near a vanishing denominator the gradient of the definition itself loses
    every digit, and normaliser-margin reports those inputs)."""
    return "vanishing-denominator" not in variant.tags(params)


def measured_denominators(variant: Any, causal: bool, params: dict[str, Any]) -> bool:
    """The rule applies: the definition is smooth, or its denominators can vanish but are its features'
    (``feature-denominator``), whose cancellation each example measures (``denominator_condition``)."""
    return smooth_definition(variant, causal, params) or "feature-denominator" in variant.tags(params)


def denominator_condition(target: Target, ex: AttentionInputs, causal: bool) -> np.ndarray:
    """Per row (B, H, N), the factor kappa_i >= 1 by which the cancellation of row i's denominator enlarges the
    roundings that pass through it (``agreement.denominator_condition``); ones for a smooth definition."""
    if smooth_definition(target.variant, causal, dict(target.params)):
        return np.ones(ex.q.shape[:3])
    kappa = _denominator_condition(
        target.variant, ex.q, ex.k, causal=causal, **target.params, **ex.extras
    )  # fmt: skip
    return np.full(ex.q.shape[:3], np.inf) if kappa is None else kappa


@guarded("backward-agreement")
def backward_agreement(target: Target, ex: AttentionInputs, *, causal: bool) -> Finding | None:
    """Per gradient tensor: max|G - G*| <= 2 max|N - G*| + (4 u + gamma~_n) max(max|G*|, T) (module
    docstring)."""
    if target.dtype == "float64":
        note = "float64 target: its gradients held to the float32 rule (at least float32's accuracy)"
        return judge_in_float32(target, ex, causal, "backward-agreement", {}, note)
    if unit_roundoff(target.dtype) > unit_roundoff("float32") and signed_denominator(target.variant, target.params):
        return Finding.skip("backward-agreement", SIGNED_IN_16_BITS)
    return judge_backward(target, ex, causal=causal, dtype=target.dtype)


SIGNED_IN_16_BITS = (
    "signed features in a 16-bit dtype: on almost every example no gradient is judgeable, each one's floor (scaled "
    "by the denominators' cancellation) reaching its own size, also in norm (proofs/backward-agreement.md, "
    "\"Denominators that can vanish\"); gradcheck holds the float64 call to the float32 rule"
)


def signed_denominator(variant: Any, params: Any) -> bool:
    """A denominator that can cancel: it can vanish and its weights are not all non-negative (trig features; relu's
    vanish only where every term is 0)."""
    tags = variant.tags(params)
    return "vanishing-denominator" in tags and "normalised-rows" not in tags


def judge_in_float32(
    target: Target, ex: AttentionInputs, causal: bool, name: str, info: dict[str, Any], note: str
) -> Finding | None:
    """The float64 call of the target held to the rule in float32, on the example rounded to float32: against the
    definition's float64 gradients with the definition's own float32 gradients as the yardstick. For a float64
    target (backward-agreement, and gradcheck after central differences) it claims float32's accuracy, which
    every correct float64 target has, its backward's float32 parts included (proofs/backward-agreement.md,
    "Float64 targets"); for one that computes in float32 inside it replaces central differences, which resolve
    a Jacobian entry only to about u_32 |f| / eps (a bonus of 1000, RWKV-6, makes every output row's noise
    larger than dg). Named ``name``, with ``info`` and ``note`` added to the details."""
    rounded = {n: round_to(np.asarray(x, dtype=np.float64), "float32") for n, x in ex.extras.items()}
    ex32 = replace(
        ex, q=round_to(ex.q, "float32"), k=round_to(ex.k, "float32"), v=round_to(ex.v, "float32"),
        extras=rounded, dtype="float32",
    )  # fmt: skip
    f = judge_backward(target, ex32, causal=causal, dtype="float32", call_dtype="float64")
    if f is None:
        return None
    own = f.details.get("note")
    return replace(f, name=name, details={**f.details, **info, "note": note + (f"; {own}" if own else "")})


def judge_backward(
    target: Target, ex: AttentionInputs, *, causal: bool, dtype: str, call_dtype: str | None = None
) -> Finding | None:
    """``backward_agreement``'s judgment with the rule of ``dtype``: the target called in its own dtype (or
    ``call_dtype``) on ``ex`` (representable in ``dtype``), its gradients held to the rule in ``dtype`` (the
    yardstick: the definition's gradients in ``dtype``; the floor: ``dtype``'s unit roundoff). ``dtype`` is the
    target's own, or float32 for a float64 target (``judge_in_float32``). A state-passing target is judged on
    both of its calls, from a nonzero S_0 returning S_N and plain (kernels branch on USE_INITIAL_STATE and
    STORE_FINAL_STATE): the worse of the two, named in ``call``."""
    if _undefined(target, ex, causal):
        return None
    kappa = denominator_condition(target, ex, causal)
    if not np.all(np.isfinite(kappa)):
        return None  # a denominator of the definition is 0 here (or its terms out of range): outside the domain
    stateful = state_passing(target.variant, causal, dict(target.params)) and target.passes_state
    calls = {"with initial and final state": True, "plain": False} if stateful else {"plain": False}
    found = {}
    for call, with_state in calls.items():
        f = _judge_call(target, ex, causal, dtype, call_dtype, with_state, kappa)
        if f is not None:
            found[call] = f
    if not found:
        return None
    call = max(found, key=lambda c: found[c].measured)
    worst = found[call]
    if stateful:
        worst.details["call"] = call
        worst.details["calls"] = {c: f.measured for c, f in found.items()}
        judged = [g for f in found.values() for g in f.details.get("gradients", [])]
        worst.details["gradients"] = list(dict.fromkeys(judged))
    return worst


def _judge_call(
    target: Target,
    ex: AttentionInputs,
    causal: bool,
    dtype: str,
    call_dtype: str | None,
    with_state: bool,
    kappa: np.ndarray,
) -> Finding | None:
    """``judge_backward``'s judgment of one call: with an initial state (L gains <W_S, S_N>, and dS_0 is judged)
    or without; ``kappa`` the denominators' condition per row (``denominator_condition``)."""
    arrays: dict[str, np.ndarray] = {"q": ex.q, "k": ex.k, "v": ex.v, **ex.extras}
    rng = _rng(ex, "backward")
    w = round_to(rng.standard_normal(ex.v.shape), dtype)
    ws = None
    if with_state:
        arrays["initial_state"] = initial_state_of(target, ex, "backward-state")
        ws = round_to(rng.standard_normal(arrays["initial_state"].shape), dtype)
    names = differentiable(target, ex) + (["initial_state"] if ws is not None else [])
    ref = definition_gradients(target, arrays, names, w, ws, causal=causal, dtype="float64")
    if not all(np.all(np.isfinite(g)) for g in ref.values()):
        return None  # the exact gradient is not finite here: outside the domain
    # a stabiliser that does not cancel has two gradient conventions: judged against the nearer one
    carried = definition_gradients(target, arrays, names, w, ws, causal=causal, dtype="float64", carried_shift=True)
    refs = {"shift held": ref}
    if any(not np.allclose(carried[n], ref[n], rtol=1e-12, atol=0.0) for n in names):
        refs["shift carried"] = carried
    findings = {
        c: _judge_gradients(
            target, ex, arrays, names, w, ws, r, causal=causal, dtype=dtype, call_dtype=call_dtype, kappa=kappa
        )
        for c, r in refs.items()
    }
    judged = {c: f for c, f in findings.items() if f is not None}
    if not judged:
        return None
    convention = min(judged, key=lambda c: judged[c].measured)
    best = judged[convention]
    if len(refs) > 1:
        best.details["gradient_convention"] = convention
    return best


def _judge_gradients(
    target: Target,
    ex: AttentionInputs,
    arrays: dict[str, np.ndarray],
    names: list[str],
    w: np.ndarray,
    ws: np.ndarray | None,
    ref: dict[str, np.ndarray],
    *,
    causal: bool,
    dtype: str,
    call_dtype: str | None = None,
    kappa: np.ndarray | None = None,
) -> Finding | None:
    """``judge_backward``'s judgment against the reference gradients ``ref``, by the rule of ``dtype``; every
    rounding the floor counts enlarged by the denominators' condition ``kappa`` (per output row, weighting the
    terms of the paths through that row; ones by default)."""
    kappa = np.ones(ex.q.shape[:3]) if kappa is None else kappa
    naive = [
        definition_gradients(target, arrays, names, w, ws, causal=causal, dtype=dtype, fn=fn)
        for fn in (None, *target.variant.algorithms_for(causal))
    ]
    terms = gradient_terms(target, arrays, names, w, ws, causal=causal)
    # the terms with every path from output row i weighted by that row's kappa_i (``denominator_condition``): the
    # rounding of den_i reaches an input only along the paths through o_i
    weighted = terms if np.all(kappa == 1.0) else gradient_terms(
        target, arrays, names, w * kappa[..., None], ws, causal=causal
    )  # fmt: skip
    missing: list[str] = []
    got = target_gradients(target, arrays, names, w, ws, causal=causal, missing=missing, call_dtype=call_dtype)
    contracting = "contracting-transitions" in target.variant.tags(target.params)
    length = accumulation_length(ex)
    floor_rel = BACKWARD_FLOOR_ULPS * unit_roundoff(dtype) + gamma_tilde(length, ACCUMULATOR)
    # gradual underflow: each of the n roundings on a path may underflow in the accumulator, and the stored
    # gradient in the dtype, each by its smallest subnormal (a float32 dS_0 of 4e-42 off by one subnormal)
    underflow = length * smallest_subnormal(ACCUMULATOR) + smallest_subnormal(dtype)
    parts: dict[str, Any] = {}
    no_yardstick: dict[str, int] = {}

    @functools.cache
    def nan_forward() -> np.ndarray:
        """The (batch, head) slices where the target's forward output and the definition's in the dtype are both
        non-finite at a row whose exact output is finite (the forward's own 0/0, which agreement leaves
        unjudged): there a non-finite gradient is that NaN's autograd, not the backward's failure."""
        kw = {**target.params, **ex.extras}
        out = np.asarray(target(ex.q, ex.k, ex.v, causal=causal, dtype=call_dtype, **ex.extras), dtype=np.float64)
        mine = naive_definition(target.variant, ex.q, ex.k, ex.v, causal=causal, dtype=dtype, **kw)
        exact = target.reference(ex.q, ex.k, ex.v, causal=causal, **ex.extras)
        both = ~np.isfinite(out) & ~np.isfinite(mine) & np.isfinite(exact)
        return np.any(both, axis=(-2, -1))

    def excused(name: str) -> np.ndarray:
        """``nan_forward`` broadcast over a gradient's (batch, head) slices; for a batch-free one, wherever some
        slice is."""
        g, slices = ref[name], nan_forward()
        if name == "initial_state" or (g.ndim >= 3 and g.shape[:2] == ex.q.shape[:2]):
            return np.broadcast_to(slices.reshape(slices.shape + (1,) * (g.ndim - 2)), g.shape)
        return np.broadcast_to(np.any(slices), g.shape)

    naive_err, scales = {}, {}
    unjudged: list[str] = []
    in_norm: list[str] = []
    sizes = gradient_sizes(arrays, ref, names)

    for n in names:
        # an exact gradient past the dtype's range is returned as inf by every correct backward: measured by its
        # distance to the nearest value that rounds to it (``agreement.output_distance``), and left out of the
        # yardstick, whose own inf there says nothing of rounding (gla's dg of 2.8e5 in float16)
        past = np.abs(ref[n]) >= overflow_threshold(dtype)
        # an entry no standard algorithm computes in the dtype (the definition's intermediates overflow, or its
        # features underflow to 0/0) gives no yardstick: each algorithm's yardstick is taken over the entries it
        # computes (one NaN made the whole tensor's yardstick infinite, and any finite error passed), and such
        # entries are held to the worst case of an accumulation of n terms in the dtype instead (``no_yardstick``)
        computed = [{n: np.where(np.isfinite(g[n]), g[n], ref[n])} for g in naive]
        blind = functools.reduce(np.logical_and, [~np.isfinite(g[n]) for g in naive]) & ~past
        if blind.any():
            no_yardstick[f"d{n}"] = int(blind.sum())

        def within(size: Any, past: np.ndarray = past) -> Any:
            return lambda d: size(np.where(past, 0.0, d))

        e_n = yardstick_error(computed, ref, n, within(_largest))
        largest, natural = sizes[n]
        own_size = largest if largest > CANCELLED * natural else natural  # natural where G*_x cancels to 0
        scale = np.maximum(largest, terms[n])
        if _is_log_decay(target, n):  # production kernels form dg as a reverse sum that cancels
            scale = np.maximum(scale, log_decay_terms(arrays, ref, n))
        # whether the floor can judge the tensor entrywise is the terms' question; the denominators' cancellation
        # loosens each entry's bound by its own terms' kappa (one row whose denominator nearly vanishes left every
        # entry of dq unjudged, and a negated dq passed; its kappa given to every key it sees passed a doubled dk)
        judges = float(np.max(floor_rel * scale + underflow)) < own_size
        with np.errstate(all="ignore"):
            cond = np.where(terms[n] > 0, weighted[n] / terms[n], 1.0)  # kappa_i averaged over each entry's terms
        scale = scale * cond
        floor = floor_rel * scale + underflow
        naive_err[f"d{n}"], scales[f"d{n}"] = e_n, float(np.max(scale))
        err = np.where(np.isnan(got[n]), np.inf, output_distance(got[n], ref[n], dtype))
        if blind.any():
            err = np.where(blind & excused(n), 0.0, err)
        if judges:
            bound = np.where(blind, BACKWARD_K * gamma(length, ACCUMULATOR) * scale, BACKWARD_K * e_n) + floor
            parts[f"d{n}"] = (err, bound)
            continue
        # the floor alone admits an error as large as the gradient. Through contracting transitions T is
        # the size of an expansion no backward forms, and roundings stay relative to the values: judge the
        # tensor in norm, with the floor relative to the larger of its own norm and its natural size (the
        # rounding of larger intermediates reaches a small gradient). Elsewhere (normalisations that
        # cancel) the roundings follow the terms: not judged.
        own_norm = frobenius(ref[n]) if largest > CANCELLED * natural and contracting else 0.0
        # each entry's floor in norm, scaled by its kappa: sqrt(sum_e kappa_e^2 max(G*_e, natural)^2) at most
        scale_norm = max(frobenius(cond * ref[n]) if own_norm else 0.0, natural * frobenius(cond))
        bound = BACKWARD_K * yardstick_error(naive, ref, n, within(frobenius)) + floor_rel * scale_norm + underflow
        if blind.any() or bound >= own_norm:
            # no bound below the gradient's own size (or no yardstick for every entry of a tensor judged as a
            # whole): the tensor is not judged, but it is still held, in norm, to the loosest of the rule's
            # bounds (entrywise with the blind entries' worst case, and in norm), which no correct algorithm
            # leaves: an error far beyond it (a dq of 180 where the terms are 5) fails
            entrywise = np.where(blind, BACKWARD_K * gamma(length, ACCUMULATOR) * scale, BACKWARD_K * e_n) + floor
            loosest = max(bound, frobenius(entrywise))
            unjudged.append(f"d{n}")
            parts[f"d{n}"] = NormPart(err, loosest)
            continue
        in_norm.append(f"d{n}")
        parts[f"d{n}"] = NormPart(err, bound)
    held_only = [p for k, p in parts.items() if k in unjudged]
    if len(held_only) == len(parts) and all(p.error <= p.bound for p in held_only):
        return None  # no gradient of this input can be judged, and none leaves the loosest bound: not an example
    token_axis = {f"d{n}": 2 for n in names if n not in ("initial_state",) and np.ndim(arrays[n]) >= 3}
    details: dict[str, Any] = {"naive_errors": naive_err, "gradient_scales": scales, "k": BACKWARD_K}
    details["floor"] = {"relative": floor_rel, "accumulation_length": length, "underflow": underflow}
    if no_yardstick:
        details["no_yardstick_entries"] = no_yardstick
    if np.any(kappa > 1.0):
        details["denominator_condition"] = float(np.max(kappa))
    details["gradients"] = [f"d{n}" for n in names]
    notes = []
    if in_norm:
        details["judged_in_norm"] = in_norm
        notes.append(f"judged in norm (the floor {floor_rel:.2g} T reaches entries): {', '.join(in_norm)}")
    if unjudged:
        details["unjudged"] = unjudged
        notes.append(
            "not judged (the floor reaches the gradient's own size, also in norm; held only to the rule's loosest "
            f"bound): {', '.join(unjudged)}"
        )
    if no_yardstick:
        counts = ", ".join(f"{k} {v}" for k, v in no_yardstick.items())
        notes.append(
            "entries no standard algorithm computes in the dtype, held to the worst case of an accumulation in it "
            f"(a non-finite one excused only where the forward is the dtype's own 0/0): {counts}"
        )
    if missing:
        details["disconnected"] = [f"d{n}" for n in missing]
        notes.append(
            "no gradient reaches " + ", ".join(missing) + " (autograd gives None): compared as zeros"
        )
    if notes:
        details["note"] = "; ".join(notes)
    return parts_finding("backward-agreement", ex, parts, token_axis=token_axis, **details)
