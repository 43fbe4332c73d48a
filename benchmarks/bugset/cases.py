"""One re-implemented bug from a peer's tracker and its upstream-fixed twin.

A Case is a pair of gramcheck targets, ``fn(q, k, v, *, causal, **extras)`` on torch tensors (B, H, N, d),
that differ only by the bug as reported and fixed upstream. ``gramcheck.check`` catches the bug when the
buggy target fails at least one property; it raises a false alarm when the fixed twin fails one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Case:
    """``buggy`` and ``fixed`` as targets of ``variant`` (hyperparameters ``params``), checked in
    ``dtype`` with ``causal``; ``source`` is the tracker thread (URL) whose bug ``buggy`` reproduces,
    ``summary`` says what the bug is and how upstream fixed it, ``kind`` is where it lives (forward,
    backward, state, varlen, chunk-boundary, decay, normaliser, features, precision).

    ``properties``: the properties a user of the upstream code runs, where not every default one (an
    inference-only op has no backward); None: the default check. ``flaw``: where the upstream fix itself
    breaks a property gramcheck checks, what it breaks, with ``shows_flaw`` computing it directly on the
    fixed twin (tests/test_bugset.py runs it) and ``flaw_properties`` the properties it fails; a fixed twin
    failing those properties alone is reported apart from the false alarms (any other failure is one), never
    counted as caught or hidden."""

    id: str
    source: str
    summary: str
    kind: str
    variant: str
    buggy: Callable[..., Any]
    fixed: Callable[..., Any]
    causal: bool = True
    dtype: str = "float32"
    params: Mapping[str, Any] = field(default_factory=dict)
    domain: Mapping[str, Any] | None = None
    properties: tuple[str, ...] | None = None
    flaw: str = ""
    shows_flaw: Callable[[], bool] | None = None
    flaw_properties: tuple[str, ...] = ()
