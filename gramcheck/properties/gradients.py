"""Gradients: gradcheck in float64, finite gradients in the target dtype, Jacobian spectral norms against
analytic bounds, and gradient growth through stacked residual layers (proofs/jacobian-bounds.md)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ..findings import Finding
from ..strategies import AttentionInputs
from ..targets import Target, TargetError
from .base import guarded, ratio_finding, with_counterexample
from .invariants import _rng, _undefined

POWER_ITERATIONS = 40
GRADIENT_KINDS = ("gaussian", "near-duplicate", "anti-aligned")  # smooth inputs, away from kinks


def _torch() -> Any:
    import torch

    return torch


def _call64(target: Target, causal: bool, extras: dict[str, Any], free: Sequence[str] = ()) -> Callable[..., Any]:
    """The target as a function of q, k, v and then of the extra inputs named in ``free`` (the rest fixed)."""

    def f(q: Any, k: Any, v: Any, *xs: Any) -> Any:
        return target.call_torch(q, k, v, causal=causal, **{**extras, **dict(zip(free, xs, strict=True))})

    return f


def internal_precision(target: Target, ex: AttentionInputs, causal: bool) -> str:
    """The precision the target computes in when called in float64: float64 when its float64 output
    agrees with the truth within the float64 rounding bound, float32 when only within the float32 bound
    (a float32 computation inside, as fla's naive references do), else float64 (its error is then
    the agreement property's finding, not the gradients' one). Asked of q, k, v moved by a relative 2^-30
    (``full_mantissas``): on an example drawn in a low precision a float32 computation may be exact (a
    one-token output is its value) and would pass for float64."""
    from ..agreement import rounding_bound
    from ..oracle import truth

    ex = full_mantissas(ex)
    kw = {**target.params, **ex.extras}
    with np.errstate(all="ignore"):
        out = target(ex.q, ex.k, ex.v, causal=causal, dtype="float64", **ex.extras)
        b64 = rounding_bound(target.variant, ex.q, ex.k, ex.v, causal=causal, dtype="float64", **kw)
        t = truth(target.variant, ex.q, ex.k, ex.v, causal=causal, digits=None, atol=0.01 * b64 + 1e-300, **kw)
        err = np.where(t.undefined, 0.0, np.abs(out - t.value) + t.bound)
        if bool(np.all(err <= b64)):
            return "float64"
        b32 = rounding_bound(target.variant, ex.q, ex.k, ex.v, causal=causal, dtype="float32", **kw)
    return "float32" if bool(np.all(err <= b32)) else "float64"


def full_mantissas(ex: AttentionInputs) -> AttentionInputs:
    """``ex`` with q, k and v times 1 + 2^-30 r, r uniform in [-1, 1] (seeded by the example): values no float32
    holds, whose rounding a float32 computation cannot avoid."""
    rng = _rng(ex, "mantissas")
    q, k, v = (x * (1.0 + 2.0**-30 * rng.uniform(-1.0, 1.0, np.shape(x))) for x in (ex.q, ex.k, ex.v))
    return replace(ex, q=q, k=k, v=v, dtype="float64")


def difference_noise(target: Target, ex: AttentionInputs, causal: bool, prec: str) -> np.ndarray:
    """Per output entry, a bound E_i on |f^_i(x) - f_i(x)| for the target computing in ``prec`` from float64
    inputs: C R(u_prec) (``agreement.REASSOCIATION_FACTOR`` times the definition's rounding model in ``prec``)
    with every input widened by its own rounding to ``prec``, u_prec |x| (none for float64); inf where the
    model gives no finite bound."""
    from ..agreement import REASSOCIATION_FACTOR
    from ..arith import rounding_model
    from ..precision import unit_roundoff

    u = unit_roundoff(prec) if prec != "float64" else 0.0
    arrays = {"q": ex.q, "k": ex.k, "v": ex.v, **ex.extras}
    radii = {n: u * np.abs(np.asarray(x, dtype=np.float64)) for n, x in arrays.items()}
    model = rounding_model(prec)
    with np.errstate(all="ignore"):
        out = target.variant.reference(
            ex.q, ex.k, ex.v, causal=causal, arith=model, input_radii=radii, **target.params, **ex.extras
        )
        noise = REASSOCIATION_FACTOR * np.asarray(model.radius(out), dtype=np.float64)
    return np.where(np.isfinite(noise), noise, np.inf)


def difference_weights(noise: np.ndarray, prec: str) -> np.ndarray:
    """Per output entry, w_i = max(1, 2 E_i / (eps atol)) (``noise`` E_i from ``difference_noise``): dividing
    output i by w_i before torch's gradcheck (|analytic - numeric| <= atol + rtol |numeric| entrywise) holds
    row i of the Jacobian to atol_i = max(atol, 2 E_i / eps) with rtol unchanged. (f^(x + h) - f^(x - h)) / 2h
    errs from the exact difference quotient by at most (E_i(x + h) + E_i(x - h)) / 2h, and 2 E_i / h allows the
    bound to double within a step (proofs/jacobian-bounds.md). An entry without a finite bound keeps w_i = 1:
    an unbounded noise proves nothing, and taking it would pass anything."""
    tol = GRADCHECK_TOLERANCES[prec]
    with np.errstate(invalid="ignore", over="ignore"):
        w = 2.0 * noise / (tol["eps"] * tol["atol"])
    return np.where(np.isfinite(w), np.maximum(w, 1.0), 1.0)


# gradcheck tolerances per internal precision: central differences of a function computed with unit
# roundoff u have error ~ c u |f| / eps + eps^2 |f^(3)| / 6 (proofs/jacobian-bounds.md)
GRADCHECK_TOLERANCES = {
    "float64": {"eps": 1e-6, "atol": 1e-5, "rtol": 1e-3},
    "float32": {"eps": 1e-3, "atol": 5e-3, "rtol": 5e-3},
}
JACOBIAN_SLACK = {"float64": (1e-7, 1e-9), "float32": (1e-4, 1e-4)}  # (relative, absolute per (1 + max|x|^2))


def _verdict(name: str, passed: bool, ex: AttentionInputs, **details: Any) -> Finding:
    return with_counterexample(Finding(name, 0.0 if passed else 1.0, 0.0, details=details), ex)


@guarded("gradcheck")
def gradcheck(target: Target, ex: AttentionInputs, *, causal: bool) -> Finding | None:
    """torch.autograd.gradcheck of the target in float64 (analytic against central differences), with respect to
    q, k, v and the differentiable extra inputs (decays, gates, bonus: a wrong dg or dbeta is wrong in float64
    too). Where the rule applies (the definition smooth, or its denominators measured and nonzero on the example:
    ``backward.measured_denominators``), a target that computes in float32 inside (``internal_precision``) has
    its gradients judged by backward-agreement's float32 rule instead (``backward.judge_in_float32``), and a
    float64 one by that rule as well (``at_least_float32``); elsewhere each row of the Jacobian is held to its
    own output's rounding noise over the difference step (``difference_weights``)."""
    from .backward import denominator_condition, judge_in_float32, measured_denominators

    if _undefined(target, ex, causal):
        return None
    no_grad = _detached(target, ex, causal, "gradcheck")
    if no_grad is not None:
        return no_grad
    prec = internal_precision(target, ex, causal)
    # the rule judges where the definition's denominators are measured and nonzero on this example
    ruled = measured_denominators(target.variant, causal, dict(target.params)) and bool(
        np.all(np.isfinite(denominator_condition(target, ex, causal)))
    )
    info: dict[str, Any] = {"computes_in": prec}
    if prec == "float32" and ruled:
        note = "computes in float32 internally: its gradients judged by backward-agreement's float32 rule"
        return judge_in_float32(target, ex, causal, "gradcheck", info, note)
    differences = central_differences(target, ex, causal, prec, info)
    if prec != "float64" or not ruled:
        return differences
    return at_least_float32(target, ex, causal, differences)


def central_differences(target: Target, ex: AttentionInputs, causal: bool, prec: str, info: dict[str, Any]) -> Finding:
    """torch.autograd.gradcheck of the float64 call with ``prec``'s tolerances (``GRADCHECK_TOLERANCES``), each
    output's row held to its rounding noise in ``prec`` over the step (``difference_weights``); the extra inputs
    within a step of their range's edge held fixed."""
    torch = _torch()
    from torch.autograd.gradcheck import GradcheckError

    info = dict(info)
    t = target.tensors({"q": ex.q, "k": ex.k, "v": ex.v, **ex.extras}, requires_grad=True, dtype="float64")
    q, k, v = t.pop("q"), t.pop("k"), t.pop("v")
    if prec != "float64":
        info.setdefault(
            "note",
            f"computes in {prec} internally: central differences with {prec} tolerances, each output's row held "
            "to that output's rounding noise over the step",
        )
    free = _free_extras(target, ex, 2 * GRADCHECK_TOLERANCES[prec]["eps"])
    for n in free:
        t[n].requires_grad_(True)
    fixed = [n for n in ex.extras if target.variant.input(n).differentiable and n not in free]
    if fixed:
        info["held_fixed"] = fixed  # within a difference step of their range's edge (a decay of exactly 1)
    weights = difference_weights(difference_noise(target, ex, causal, prec), prec)
    if np.any(weights > 1.0):
        info["rows_loosened"] = int(np.sum(weights > 1.0))  # rows whose atol is their output's rounding noise
    try:
        fn = _call64(target, causal, t, free)
        if np.any(weights > 1.0):
            w = torch.as_tensor(weights, dtype=torch.float64, device=q.device)
            unweighted = fn
            fn = lambda *xs: unweighted(*xs) / w  # noqa: E731
        ok = torch.autograd.gradcheck(fn, (q, k, v, *(t[n] for n in free)), **GRADCHECK_TOLERANCES[prec])
    except GradcheckError as err:
        return _verdict("gradcheck", False, ex, error=str(err).splitlines()[0][:300], **info)
    return _verdict("gradcheck", bool(ok), ex, **info)


def backward_precision(target: Target, ex: AttentionInputs, causal: bool) -> str:
    """float32 when the float64 call's gradients of q, k and v, on inputs no float32 holds (``full_mantissas``),
    differ from the definition's float64 gradients on most entries by more than float64 could (median relative
    error above 1e-10: a float32 backward rounds every entry); else float64. A float64 backward with a bug
    confined to some entries (small entries dropped) errs on those entries only."""
    from .backward import definition_gradients, target_gradients

    full = full_mantissas(ex)
    arrays = {"q": full.q, "k": full.k, "v": full.v, **full.extras}
    w = _rng(ex, "backward-precision").standard_normal(ex.v.shape)
    names = ["q", "k", "v"]
    with np.errstate(all="ignore"):
        ref = definition_gradients(target, arrays, names, w, None, causal=causal, dtype="float64")
        got = target_gradients(target, arrays, names, w, None, causal=causal, call_dtype="float64")
        rel = [np.abs(got[n] - ref[n]) / np.maximum(np.abs(ref[n]), 1e-300) for n in names]
    errors = np.concatenate([r.ravel() for r in rel])
    errors = errors[np.isfinite(errors)]
    return "float32" if errors.size and float(np.median(errors)) > 1e-10 else "float64"


def at_least_float32(target: Target, ex: AttentionInputs, causal: bool, differences: Finding) -> Finding:
    """A float64 target (its forward float64-accurate) is held to backward-agreement's float32 rule as well as to
    central differences (``backward.judge_in_float32``): its gradients are at least as accurate as a float32
    computation of them. Central differences at rtol 1e-3 pass a dq 1e-4 off, some 1700 u_32
    (proofs/backward-agreement.md, "Float64 targets"). Where they fail at float64's tolerances, the rule passes
    and the backward computes in float32 (``backward_precision``: a float64 forward with a float32 backward,
    whose dg of an exact 0 comes out 1e-5), central differences judge at float32's tolerances instead."""
    from .backward import judge_in_float32

    note = "float64 inside: its gradients held to backward-agreement's float32 rule as well as to central differences"
    info = {**differences.details, "central_differences": differences.verdict}
    f = judge_in_float32(target, ex, causal, "gradcheck", info, note)
    if f is None or (not differences.passed and not f.passed):
        return differences
    if differences.passed:
        return f
    if backward_precision(target, ex, causal) != "float32":
        return differences
    info = {k: x for k, x in differences.details.items() if k != "error"}
    info["note"] = (
        "its forward computes in float64, its backward in float32 (central differences at float64's tolerances "
        f"fail: {differences.details.get('error', '')}; the float32 rule passes): central differences with float32 "
        "tolerances"
    )
    loose = central_differences(target, ex, causal, "float32", info)
    if not loose.passed:
        return loose
    return replace(f, details={**f.details, "central_differences": "passed at float32's tolerances"})


def _free_extras(target: Target, ex: AttentionInputs, margin: float) -> list[str]:
    """The differentiable extra inputs that central differences of step ``margin`` / 2 keep inside their range
    (a log-decay of exactly 0, a write strength of 0: the step would leave the variant's domain)."""
    out = []
    for n, x in ex.extras.items():
        spec = target.variant.input(n)
        if spec.differentiable and bool(np.all((x >= spec.low + margin) & (x <= spec.high - margin))):
            out.append(n)
    return out


@guarded("finite-gradients")
def finite_gradients(target: Target, ex: AttentionInputs, *, causal: bool) -> Finding | None:
    """Where the output is finite, the gradients of <o, w> (w fixed, seeded) with respect to q, k, v
    are finite in the target's dtype, wherever the definition's own gradients in that dtype are: a
    gradient that is not finite in the definition evaluated in the dtype too is the dtype's range
    exhausted, not the target's failure (FAVOR+ features underflowing to a denominator whose square
    overflows), and is counted in ``shared_with_definition``."""
    torch = _torch()
    if _undefined(target, ex, causal):
        return None
    t = target.tensors({"q": ex.q, "k": ex.k, "v": ex.v, **ex.extras}, requires_grad=True)
    q, k, v = t.pop("q"), t.pop("k"), t.pop("v")
    o = target.call_torch(q, k, v, causal=causal, **t)
    if not bool(torch.isfinite(o).all()):
        return None  # a non-finite forward is agreement's finding, not this one's
    w = torch.as_tensor(_rng(ex, "w").standard_normal(o.shape)).to(dtype=o.dtype, device=o.device)
    grads = target.gradients((o * w).sum(), (q, k, v))
    missing = [n for n, g in zip("qkv", grads, strict=True) if g is None]
    cut = _disconnected(target, ex, missing, w.detach().cpu().double().numpy(), causal)
    if cut:
        f = Finding("finite-gradients", math.inf, 0.0, details=_disconnected_details(target, cut))
        return with_counterexample(f, ex)
    used = {n: g for n, g in zip("qkv", grads, strict=True) if g is not None}
    nonfinite = {n: ~np.isfinite(g.detach().cpu().double().numpy()) for n, g in used.items()}
    details: dict[str, Any] = {}
    if any(x.any() for x in nonfinite.values()):
        from .backward import definition_gradients

        arrays = {"q": ex.q, "k": ex.k, "v": ex.v, **ex.extras}
        w64 = w.detach().cpu().double().numpy()
        ref = definition_gradients(target, arrays, list(nonfinite), w64, None, causal=causal, dtype=target.dtype)
        shared = {n: x & ~np.isfinite(ref[n]) for n, x in nonfinite.items()}
        details["shared_with_definition"] = {n: int(x.sum()) for n, x in shared.items()}
        nonfinite = {n: x & ~shared[n] for n, x in nonfinite.items()}
    bad = {n: int(x.sum()) for n, x in nonfinite.items()}
    details["nonfinite_entries"] = bad
    return with_counterexample(Finding("finite-gradients", float(sum(bad.values())), 0.0, details=details), ex)


EXACT_JACOBIAN_SIZE = 512


def spectral_norm(f: Callable[[Any], Any], x: Any, *, iterations: int = POWER_ITERATIONS, seed: int = 0) -> float:
    """||J_f(x)||_2: exactly (SVD of the full Jacobian) when x has at most EXACT_JACOBIAN_SIZE entries,
    else by power iteration on J^T J (jvp then vjp), which converges from below, so the estimate never
    exceeds the true norm (up to rounding)."""
    torch = _torch()
    from torch.autograd.functional import jacobian, jvp, vjp

    if x.numel() <= EXACT_JACOBIAN_SIZE:
        try:
            jac = jacobian(f, x, vectorize=True)
        except (RuntimeError, TargetError):
            # a custom backward (autograd.Function) that vmap cannot batch, raised through the target's guarded
            # backward; a backward that fails for another reason fails again unbatched, and is the finding
            jac = jacobian(f, x, vectorize=False)
        mat = jac.reshape(-1, x.numel()).detach().cpu().numpy()
        if not np.all(np.isfinite(mat)):
            return math.inf
        return float(np.linalg.norm(mat, 2)) if mat.size else 0.0
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(x.shape, generator=g, dtype=x.dtype).to(x.device)
    u = u / u.norm()
    sigma = 0.0
    for _ in range(iterations):
        _, ju = jvp(f, x, u)
        _, jtju = vjp(f, x, ju)
        n = float(jtju.norm())
        if n == 0 or not math.isfinite(n):
            return float(ju.norm()) if n == 0 else n
        sigma = math.sqrt(n)
        u = jtju / n
    return sigma


def _slices(ex: AttentionInputs) -> list[tuple[int, int]]:
    return list(np.ndindex(*ex.q.shape[:2]))


def _slice_extras(target: Target, extras: dict[str, Any], b: int, h: int) -> dict[str, Any]:
    """The extra inputs restricted to one (b, h) pair (each spec knows its axes)."""
    return {n: target.variant.input(n).head(x, b, h) for n, x in extras.items()}


def _analytic(
    target: Target, causal: bool, q: np.ndarray, k: np.ndarray, v: np.ndarray, extras: dict[str, Any]
) -> dict[str, float]:
    """Analytic bounds on the norms of dO/dQ, dO/dK, dO/dV for one slice q, k, v of shape (1, 1, N, d)."""
    return target.variant.jacobian_bounds(q, k, v, causal=causal, params=target.params, extras=extras)


def _slack(*xs: np.ndarray, precision: str = "float64") -> float:
    """Absolute slack for a derivative evaluated in float64: its entries scale at most like products
    of two input magnitudes, and are computed to about 1e-9 of that (u64 times the condition of
    a derivative that vanishes, e.g. dO/dQ at N = 1, where the exact bound is 0); 1e-4 for a target
    computing in float32 internally."""
    m = max(float(np.max(np.abs(x))) for x in xs)
    return JACOBIAN_SLACK[precision][1] * (1.0 + m * m)


@guarded("jacobian-norm")
def jacobian_norm(target: Target, ex: AttentionInputs, *, causal: bool) -> Finding | None:
    """||dO/dV||_2 = ||P||_2 <= sqrt(||P||_1 ||P||_inf) and, where derived, ||dO/dQ||_2 and ||dO/dK||_2
    against their analytic bounds; power-iteration estimates (from below) in float64, per (b, h)."""
    if _undefined(target, ex, causal):
        return None
    no_grad = _detached(target, ex, causal, "jacobian-norm")
    if no_grad is not None:
        return no_grad
    prec = internal_precision(target, ex, causal)
    t = target.tensors({"q": ex.q, "k": ex.k, "v": ex.v, **ex.extras}, dtype="float64")
    q, k, v = t.pop("q"), t.pop("k"), t.pop("v")
    est, bnd, labels = [], [], []
    for b, h in _slices(ex):
        sl = (slice(b, b + 1), slice(h, h + 1))
        fs = _call64(target, causal, _slice_extras(target, t, b, h))
        ana = _analytic(target, causal, ex.q[sl], ex.k[sl], ex.v[sl], _slice_extras(target, ex.extras, b, h))
        for wrt, bound in ana.items():
            args = {"q": q[sl], "k": k[sl], "v": v[sl]}

            def g(x: Any, wrt: str = wrt, args: dict = args, fs: Callable[..., Any] = fs) -> Any:
                return fs(**{**args, wrt: x})

            est.append(spectral_norm(g, args[wrt]))
            bnd.append(bound)
            labels.append(f"{wrt}[{b},{h}]")
    est_a, bnd_a = np.array(est), np.array(bnd)
    rel = JACOBIAN_SLACK[prec][0]
    fnd = ratio_finding(
        "jacobian-norm", est_a, bnd_a * (1 + rel) + _slack(ex.q, ex.k, ex.v, precision=prec), ex, rigour="sampled"
    )
    fnd.details["computes_in"] = prec
    fnd.details.update(
        estimates=dict(zip(labels, map(float, est_a), strict=True)),
        bounds=dict(zip(labels, map(float, bnd_a), strict=True)),
        tightness=float(np.max(est_a / np.where(bnd_a > 0, bnd_a, np.inf))),
    )
    return fnd


DEPTH = 4


@guarded("depth-growth")
def depth_growth(target: Target, ex: AttentionInputs, *, causal: bool) -> Finding | None:
    """L = 4 residual self-attention layers x_{l+1} = x_l + f(x_l, x_l, x_l): ||dx_L/dx_0||_2 <=
    prod_l (1 + b_Q(x_l) + b_K(x_l) + b_V(x_l)) with the analytic per-layer bounds (proofs/jacobian-bounds.md)."""
    torch = _torch()
    x0 = ex.q
    if _undefined(target, replace(ex, k=x0, v=x0), causal):
        return None
    no_grad = _detached(target, replace(ex, k=x0, v=x0), causal, "depth-growth")
    if no_grad is not None:
        return no_grad
    prec = internal_precision(target, replace(ex, k=x0, v=x0), causal)
    t = target.tensors({"x": x0}, dtype="float64")
    extras = target.tensors(ex.extras, dtype="float64")
    layer = _call64(target, causal, extras)

    def stack(x: Any) -> Any:
        for _ in range(DEPTH):
            x = x + layer(x, x, x)
        return x

    bound = 1.0
    xl = t["x"]
    for depth in range(DEPTH):
        xn = xl.detach().cpu().numpy()
        lx = replace(ex, q=xn, k=xn, v=xn)
        if _undefined(target, lx, causal):
            return None
        per = max(
            1
            + sum(
                _analytic(
                    target,
                    causal,
                    xn[b : b + 1, h : h + 1],
                    xn[b : b + 1, h : h + 1],
                    xn[b : b + 1, h : h + 1],
                    _slice_extras(target, ex.extras, b, h),
                ).values()
            )
            for b, h in _slices(ex)
        )
        bound *= per
        if depth < DEPTH - 1:
            with torch.no_grad():
                xl = xl + layer(xl, xl, xl)
            if not bool(torch.isfinite(xl).all()):
                return None
    est = spectral_norm(stack, t["x"])
    rel = JACOBIAN_SLACK[prec][0]
    f = ratio_finding("depth-growth", np.array([est]), np.array([bound * (1 + rel) + _slack(x0, precision=prec)]), ex)
    f.details.update(estimate=est, bound=bound, depth=DEPTH, per_layer_growth=est ** (1 / DEPTH), computes_in=prec)
    return f


def depth_growth_unless(variant: Any, causal: bool, params: dict[str, Any]) -> str | None:
    """Why depth-growth cannot be checked under these hyperparameters (None when it can)."""
    if "jacobian-qk" not in variant.tags(params):
        return (
            f"the analytic Q and K Jacobian bounds (proofs/jacobian-bounds.md) do not hold for {variant.name} "
            f"with these hyperparameters (eps = {params.get('eps')})"
        )
    return None


def _detached(target: Target, ex: AttentionInputs, causal: bool, name: str) -> Finding | None:
    """A failing Finding when the target's float64 output carries no gradient with respect to q, k, v
    (a detached output: every Jacobian estimate would be 0 and pass any upper bound), else None."""
    t = target.tensors({"q": ex.q, "k": ex.k, "v": ex.v, **ex.extras}, requires_grad=True, dtype="float64")
    q, k, v = t.pop("q"), t.pop("k"), t.pop("v")
    o = target.call_torch(q, k, v, causal=causal, **t)
    if o.requires_grad and o.grad_fn is not None:
        used = target.gradients(o.sum(), (q, k, v))
        missing = [n for n, g in zip("qkv", used, strict=True) if g is None]
        cut = _disconnected(target, ex, missing, np.ones(tuple(o.shape)), causal)
        if not cut:
            return None
        details = _disconnected_details(target, cut)
    else:
        why = "the output is detached from q, k, v (no gradient)"
        details = {"error": f"{target.name}: {why}", "missing_gradient": True}
    f = Finding(name, math.inf, 1.0, details=details)
    return with_counterexample(f, ex)


def _disconnected(target: Target, ex: AttentionInputs, missing: list[str], w: np.ndarray, causal: bool) -> list[str]:
    """The inputs among ``missing`` (those of q, k, v whose gradient of <o, w> autograd gave as None: no
    path from the target's output) on which the variant's output depends: the float64 definition's
    gradient of <o, w> with respect to it is not negligible, larger than ``backward.CANCELLED`` times
    the loss's sensitivity to a relative change of every input over the input's size (a gradient that
    vanishes exactly or by cancellation, as dq and dk of a normalised form at N = 1, may be None)."""
    if not missing:
        return []
    from .backward import CANCELLED, definition_gradients, gradient_sizes

    arrays = {"q": ex.q, "k": ex.k, "v": ex.v, **ex.extras}
    with np.errstate(all="ignore"):
        ref = definition_gradients(target, arrays, ["q", "k", "v"], w, None, causal=causal, dtype="float64")
    sizes = gradient_sizes(arrays, {n: np.nan_to_num(g, nan=np.inf) for n, g in ref.items()}, ["q", "k", "v"])
    return [n for n in missing if sizes[n][0] > CANCELLED * sizes[n][1]]


def _disconnected_details(target: Target, cut: list[str]) -> dict[str, Any]:
    """The details of a Finding failed by gradients that do not reach ``cut``."""
    names = ", ".join(cut)
    return {
        "error": (
            f"{target.name}: no gradient reaches {names} (autograd gives None: the output is not connected to "
            f"{names} through autograd), though the variant's output depends on {names}"
        ),
        "missing_gradient": True,
        "disconnected": list(cut),
    }
