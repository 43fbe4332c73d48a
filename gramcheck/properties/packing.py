"""Packed variable-length sequences (proofs/state-passing.md, section packing): a target that takes
``cu_seqlens`` (int64 (S + 1,), B = 1) is checked for

* packing: the packed call gives the outputs, final states (state-passing variants, from nonzero initial
  states) and gradients that running each sequence alone gives, within the two computations' bounds;
* packing-isolation: replacing every token of the other sequences changes no output of a sequence, bit
  for bit (no state, chunk or normaliser crosses a boundary).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from .. import algorithm_underflow
from ..agreement import output_distance
from ..findings import Finding
from ..forms import CHUNK_SIZES
from ..precision import overflow_threshold, round_to
from ..strategies import AttentionInputs
from ..targets import Target, taped
from .backward import definition_gradients, differentiable, smooth_definition, target_gradients
from .base import bound_of, guarded, output_difference
from .invariants import _rng, _undefined, replacement
from .state import _segment, extras_along, initial_state_of, parts_finding, state_bound

BACKWARD_K = 2.0


def packable(variant: Any, causal: bool, params: dict[str, Any]) -> bool:
    """Applicability: causal mode (packed kernels are causal ones)."""
    return causal


def _not_declared(name: str, target: Target) -> Finding:
    return Finding.skip(name, f"{target.name} takes no cu_seqlens")


def cu_seqlens_of(ex: AttentionInputs, n: int) -> np.ndarray:
    """1 to 3 cuts in [1, N - 1], at chunk boundaries or their neighbours where N reaches them; chosen by
    the example."""
    rng = _rng(ex, "cu")
    near = sorted({m + o for c in CHUNK_SIZES for m in range(c, n, c) for o in (-1, 0, 1) if 1 <= m + o <= n - 1})
    count = int(rng.integers(1, min(3, n - 1) + 1))
    cuts: set[int] = set()
    while len(cuts) < count:
        cuts.add(int(rng.choice(near)) if near and rng.random() < 0.6 else int(rng.integers(1, n)))
    return np.array([0, *sorted(cuts), n], dtype=np.int64)


def _row(ex: AttentionInputs) -> AttentionInputs:
    """Batch 0 only (packing needs B = 1)."""
    extras = extras_along(ex.extras, 0, ex.q.shape[0], lambda x: x[:1])
    return replace(ex, q=ex.q[:1], k=ex.k[:1], v=ex.v[:1], extras=extras)


@guarded("packing")
@algorithm_underflow.judged_property
def packing(target: Target, ex: AttentionInputs, *, causal: bool) -> Finding | None:
    """Packed = each sequence alone: outputs and states within the sum of the two runs' 2 R(u), gradients
    within twice the backward rule's bound (proofs/backward-agreement.md) of each sequence, below float64 where
    the definition is smooth (``smooth_definition``); elsewhere ``details["unjudged"]`` names the gradients."""
    if not target.packs:
        return _not_declared("packing", target)
    ex = _row(ex)
    n = ex.q.shape[-2]
    if n < 2 or _undefined(target, ex, causal):
        return None
    cu = cu_seqlens_of(ex, n)
    segs = [_segment(ex, int(a), int(b)) for a, b in zip(cu[:-1], cu[1:], strict=True)]
    stateful = "state-passing" in target.variant.tags(target.params) and target.passes_state
    s0s = [initial_state_of(target, s, f"pack{i}") for i, s in enumerate(segs)] if stateful else None
    opts: dict[str, Any] = {"output_final_state": True} if stateful else {}
    packed = target.run(
        ex.q,
        ex.k,
        ex.v,
        causal=causal,
        cu_seqlens=cu,
        initial_state=None if s0s is None else np.concatenate(s0s, axis=0),
        **opts,
        **ex.extras,
    )
    alone = [
        target.run(s.q, s.k, s.v, causal=causal, initial_state=None if s0s is None else s0s[i], **opts, **s.extras)
        for i, s in enumerate(segs)
    ]
    if stateful:
        bounds = [state_bound(target, s, s0s[i]) for i, s in enumerate(segs)]  # type: ignore[index]
        out_a = np.concatenate([a[0] for a in alone], axis=2)
        st_a = np.concatenate([a[1] for a in alone], axis=0)
        b_out, b_st = (2 * np.concatenate([b[i] for b in bounds], axis=2 - 2 * i) for i in (0, 1))
        parts = {
            "out": (output_difference(packed[0], out_a, target.dtype), b_out),
            "final_state": (output_difference(packed[1], st_a, target.dtype), b_st),
        }
    else:
        out_a = np.concatenate(alone, axis=2)
        b = np.concatenate([bound_of(target, s, causal=causal) for s in segs], axis=2)
        parts = {"out": (output_difference(packed, out_a, target.dtype), 2 * b)}
    # float64 has no yardstick of its own (the definition's float64 gradients are the reference); where a
    # denominator can vanish the bound below takes no measure of its cancellation, and two correct forms (recurrent
    # packed, chunked alone) differed by 1e8 times it: the Finding says the gradients went unjudged
    compared = target.dtype != "float64" and smooth_definition(target.variant, causal, dict(target.params))
    if compared:
        parts.update(_gradient_parts(target, ex, segs, cu, s0s, causal=causal))
    return parts_finding(
        "packing",
        ex,
        parts,
        # gradients with a token axis only (rwkv6's bonus u is (H, d_k): an axis 2 there was an internal error)
        token_axis={"out": 2, **{f"d{n}": 2 for n in differentiable(target, ex) if _per_token(ex, n)}},
        cu_seqlens=[int(c) for c in cu],
        **({} if compared else {"unjudged": ["gradients"]}),
    )


def _gradient_parts(
    target: Target,
    ex: AttentionInputs,
    segs: list[AttentionInputs],
    cu: np.ndarray,
    s0s: list[np.ndarray] | None,
    *,
    causal: bool,
) -> dict[str, tuple[np.ndarray, Any]]:
    """|G_packed - G_alone| per gradient tensor, against twice the rule k e_naive + 4 u max|G*| of the
    sequences (the larger over the sequences)."""
    from ..precision import unit_roundoff

    rng = _rng(ex, "pack-w")
    w = round_to(rng.standard_normal(ex.v.shape), target.dtype)
    names = differentiable(target, ex)
    a, b = [int(x) for x in cu[:-1]], [int(x) for x in cu[1:]]
    alone, naive, ref = [], [], []
    for i, s in enumerate(segs):
        arrays = {"q": s.q, "k": s.k, "v": s.v, **s.extras}
        ws = None
        if s0s is not None:
            arrays["initial_state"] = s0s[i]
            ws = np.zeros_like(s0s[i])
        wi = w[:, :, a[i] : b[i]]
        alone.append(target_gradients(target, arrays, names, wi, ws, causal=causal))
        ref.append(definition_gradients(target, arrays, names, wi, ws, causal=causal, dtype="float64"))
        naive.append(definition_gradients(target, arrays, names, wi, ws, causal=causal, dtype=target.dtype))
    packed_arrays = {"q": ex.q, "k": ex.k, "v": ex.v, **ex.extras}
    packed = _packed_gradients(target, packed_arrays, names, w, cu, s0s, causal=causal)
    u = unit_roundoff(target.dtype)
    out: dict[str, tuple[np.ndarray, Any]] = {}
    for n in names:
        g_alone = _join(n, [x[n] for x in alone], ex)
        e = max(_naive_error(nv[n], rf[n], target.dtype) for nv, rf in zip(naive, ref, strict=True))
        scale = max(float(np.max(np.abs(rf[n]), initial=0.0)) for rf in ref)
        # NaN where both are NaN (features underflowing to 0/0 alike) is agreement's finding, not this one's
        diff = output_difference(packed[n], g_alone, target.dtype)
        # a shared input's gradient sums the sequences' parts: where a part is past the range (inf alone, and
        # inf - inf), the packed gradient is measured against the exact whole, in range or not
        thr = overflow_threshold(target.dtype)
        summed = not _per_token(ex, n) and n != "initial_state"
        past_part = _join(n, [(np.abs(rf[n]) >= thr).astype(np.float64) for rf in ref], ex) > 0
        whole = ~np.isfinite(g_alone) & past_part & summed
        if whole.any():
            exact = _join(n, [rf[n] for rf in ref], ex)
            diff = np.where(whole, output_distance(packed[n], exact, target.dtype), diff)
        out[f"d{n}"] = (diff, 2 * (BACKWARD_K * e + 4 * u * scale))
    return out


def _per_token(ex: AttentionInputs, name: str) -> bool:
    """Whether input ``name`` has a token axis (axis 2)."""
    x = getattr(ex, name) if name in ("q", "k", "v") else ex.extras.get(name)
    return x is not None and np.ndim(x) >= 3


def _naive_error(naive: np.ndarray, ref: np.ndarray, dtype: Any) -> float:
    """max |naive - ref| over the entries whose exact value is within the dtype's range (past it, every form
    returns inf, which says nothing of rounding) and which the definition in the dtype computes (a 0/0 there
    has no yardstick): backward-agreement's yardstick. One such entry made the bound of the whole tensor
    infinite, and a packed gradient off anywhere else passed."""
    with np.errstate(invalid="ignore"):
        d = np.where((np.abs(ref) >= overflow_threshold(dtype)) | ~np.isfinite(naive), 0.0, np.abs(naive - ref))
    return float(np.max(d, initial=0.0))


def _join(name: str, parts: list[np.ndarray], ex: AttentionInputs) -> np.ndarray:
    """Per-token gradients are concatenated along N; shared inputs' gradients add up."""
    if parts[0].ndim >= 3 and parts[0].shape[:2] == ex.q.shape[:2] and name != "initial_state":
        return np.concatenate(parts, axis=2)
    return np.sum(parts, axis=0)


def _packed_gradients(
    target: Target,
    arrays: dict[str, np.ndarray],
    names: list[str],
    w: np.ndarray,
    cu: np.ndarray,
    s0s: list[np.ndarray] | None,
    *,
    causal: bool,
) -> dict[str, np.ndarray]:
    """Gradients of <W, o> through the target on the packed row (replayed in a judgment made twice:
    ``targets.taped``)."""

    def run() -> dict[str, np.ndarray]:
        import torch

        t = target.tensors(arrays)
        leaves = {n: t[n].detach().requires_grad_(True) for n in names}
        t.update(leaves)
        opts: dict[str, Any] = {"cu_seqlens": torch.as_tensor(cu)}
        if s0s is not None:
            opts["initial_state"] = target.tensors({"s": np.concatenate(s0s, axis=0)})["s"]
        with torch.enable_grad():
            o = target.call_torch(t.pop("q"), t.pop("k"), t.pop("v"), causal=causal, **t, **opts)
            gs = target.gradients((o * torch.as_tensor(w).to(o.dtype)).sum(), list(leaves.values()))
        return {
            n: (np.zeros(arrays[n].shape) if g is None else g.detach().double().numpy())
            for n, g in zip(names, gs, strict=True)
        }

    s0 = None if s0s is None else np.concatenate(s0s, axis=0)
    others = {"loss w": w, "cu_seqlens": cu, "initial_state": s0}
    return taped(target, "packed-gradients", (causal, tuple(names)), arrays, run, others)


@guarded("packing-isolation")
def packing_isolation(target: Target, ex: AttentionInputs, *, causal: bool) -> Finding | None:
    """Replacing every token outside sequence i (q, k, v and per-token inputs) changes no output of
    sequence i, bit for bit (within the two runs' rounding bounds for a ``causal-rounding`` variant);
    checked for every sequence. A state-passing target runs from nonzero initial states, one per
    sequence, and sequence i's final state is held to the same (a state decayed by another sequence's
    gates is a leak too)."""
    if not target.packs:
        return _not_declared("packing-isolation", target)
    ex = _row(ex)
    n = ex.q.shape[-2]
    if n < 2:
        return None
    cu = cu_seqlens_of(ex, n)
    stateful = "state-passing" in target.variant.tags(target.params) and target.passes_state
    opts: dict[str, Any] = {}
    if stateful:
        segs = [_segment(ex, int(a), int(b)) for a, b in zip(cu[:-1], cu[1:], strict=True)]
        s0 = np.concatenate([initial_state_of(target, s, f"isolation{i}") for i, s in enumerate(segs)], axis=0)
        opts = {"initial_state": s0, "output_final_state": True}

    def run(x: AttentionInputs) -> tuple[np.ndarray, np.ndarray | None]:
        res = target.run(x.q, x.k, x.v, causal=causal, cu_seqlens=cu, **opts, **x.extras)
        return (res[0], res[1]) if stateful else (res, None)

    base, base_state = run(ex)
    rng = _rng(ex, "isolation")
    diffs = np.zeros_like(base)
    state_diffs = None if base_state is None else np.zeros_like(base_state)
    # bit-exact, unless the variant is causal only up to rounding (a stabiliser that cancels in exact
    # arithmetic, as for the causality property): then within the two runs' rounding bounds
    rounding = "causal-rounding" in target.variant.declares
    tol = np.zeros_like(base)
    for i, (a, b) in enumerate(zip(cu[:-1], cu[1:], strict=True)):
        other = np.ones(n, dtype=bool)
        other[a:b] = False
        # only per-token arrays are copied (a copy of a shared input can change its memory layout, and
        # with it the bits of a matmul)
        changed = replace(
            ex,
            q=ex.q.copy(),
            k=ex.k.copy(),
            v=ex.v.copy(),
            extras={k: x.copy() for k, x in ex.extras.items()},
        )
        for x in (changed.q, changed.k, changed.v):
            x[:, :, other] = replacement(rng, x[:, :, other].shape, x, ex.dtype)
        for name, x in changed.extras.items():
            spec = target.variant.input(name)
            if spec.per_token:  # redrawn by the input's own spec, within its range
                fresh = spec.draw(rng, x[:, :, other].shape, spec.regimes[0])
                x[:, :, other] = np.clip(round_to(fresh, ex.dtype), spec.low, spec.high)
        if _undefined(target, changed, causal):
            continue
        out, state = run(changed)
        if state_diffs is not None:  # sequence i's row of the final states
            assert state is not None and base_state is not None
            state_diffs[i] = output_difference(state[i], base_state[i])
        if rounding:  # the bounds of the packed definition: each sequence from its own first token
            both = bound_of(target, ex, causal=causal, cu_seqlens=cu) + bound_of(
                target, changed, causal=causal, cu_seqlens=cu
            )
            tol[:, :, a:b] = both[:, :, a:b]
        diffs[:, :, a:b] = output_difference(out[:, :, a:b], base[:, :, a:b])  # equal infinities and NaN in both agree
    parts: dict[str, Any] = {"out": (diffs, tol)}
    if state_diffs is not None:
        parts["final_state"] = (state_diffs, np.zeros_like(state_diffs))
    return parts_finding(
        "packing-isolation",
        ex,
        parts,
        token_axis={"out": 2},
        cu_seqlens=[int(c) for c in cu],
        mode="rounding" if rounding else "bit-exact",
        changed_entries=int(np.count_nonzero(diffs)),
    )
