"""Where a failure lives: the Finding of a failed property is annotated with what a reader needs first
(the property, the entry, measured against bound, the shape) and, in causal mode, the smallest prefix
length N' of the failing input that still fails, with its last token's position in each chunk size
(t mod c, t = N' - 1): a dropped chunk-boundary term shows as t mod 64 = 0 or 63.

Keys added to ``Finding.details``: ``property``, ``shape`` ([B, H, N, d_k, d_v]), ``entry`` (when the
property names one), ``error_at_entry`` and ``bound_at_entry`` (when known), ``smallest_failing_n``,
``chunk_position`` ({chunk size: (N' - 1) mod chunk}), ``located_by`` ('prefix search')."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .findings import Finding
from .forms import CHUNK_SIZES

# failure kinds of the target itself: a prefix search would only repeat them
_TARGET_FAILURES = ("raised", "timeout", "wrong-type", "wrong-shape", "wrong-dtype", "wrong-device", "mutates-inputs")


def describe(f: Finding, prop_name: str, ex: Any) -> None:
    """The reader's first keys, from what the property recorded."""
    d = f.details
    d.setdefault("property", prop_name)
    d.setdefault("shape", [int(x) for x in ex.q.shape] + [int(ex.v.shape[-1])])
    ce = f.counterexample or {}
    if "entry" not in d:
        idx = ce.get("index") if isinstance(ce, dict) else None
        idx = idx if idx is not None else d.get("worst_index")
        if idx is not None:
            d["entry"] = f"out[{','.join(str(int(i)) for i in idx)}]"
    err = d.get("worst_error", ce.get("error") if isinstance(ce, dict) else None)
    bnd = d.get("worst_bound", ce.get("bound") if isinstance(ce, dict) else None)
    if err is not None:
        d.setdefault("error_at_entry", float(err))
    if bnd is not None:
        d.setdefault("bound_at_entry", float(bnd))


def smallest_failing_prefix(
    prop: Any, target: Any, ex: Any, *, causal: bool, chunks: Sequence[int] = CHUNK_SIZES
) -> dict[str, Any]:
    """Binary search for the smallest N' <= N whose prefix fails ``prop`` (causal mode: a prefix's outputs
    are the first N' outputs of the whole, so failure is monotone in N' for output checks). About log2 N
    property evaluations; {} when the prefix search does not apply."""
    from .properties.state import _segment

    n = ex.q.shape[-2]
    if not causal:
        return {}

    def fails(m: int) -> bool:
        try:
            r = prop.fn(target, _segment(ex, 0, m), causal=causal)
        except Exception:  # noqa: BLE001 - a prefix the property cannot evaluate does not locate anything
            return False
        return r is not None and not r.passed

    lo, hi = 1, n  # hi fails (the whole input); find the smallest failing m
    if n > 1 and fails(1):
        hi = 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fails(mid):
            hi = mid
        else:
            lo = mid
    return {
        "smallest_failing_n": hi,
        "chunk_position": {str(c): (hi - 1) % c for c in sorted(set(chunks) | {16, 64})},
        "located_by": "prefix search",
    }


def annotate(f: Finding, prop: Any, target: Any, ex: Any, *, causal: bool, chunks: Sequence[int]) -> None:
    """Add the reader's keys to a failed Finding, and the smallest failing prefix where it applies."""
    describe(f, prop.name, ex)
    if f.details.get("failure") in _TARGET_FAILURES:
        return
    f.details.update(smallest_failing_prefix(prop, target, ex, causal=causal, chunks=chunks))
