"""The search: run one property over inputs drawn by Hypothesis, climb toward the worst case with
``hypothesis.target``, and return the worst Finding (the shrunk counterexample when one fails).

Determinism: the examples are a function of ``seed`` and the profile (no example database), so the same
seed, target and versions give the same Findings."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, given, reject, settings
from hypothesis import seed as hseed
from hypothesis import target as htarget
from hypothesis.errors import Flaky, Unsatisfiable

from . import threads as _threads
from .findings import Finding
from .properties import Property
from .strategies import attention_inputs, profile
from .targets import Target


@dataclass(frozen=True)
class Domain:
    """Where inputs are drawn: kinds, size caps and the number of examples (None: the profile's)."""

    kinds: tuple[str, ...] | None = None
    max_n: int = 32
    max_d: int = 8
    max_b: int = 1
    max_h: int = 2
    examples: int | None = None
    min_n: int = 1
    min_d: int = 1  # min_d = max_d fixes the head dimension (targets whose hyperparameters depend on d)

    def __post_init__(self) -> None:
        for name in ("max_n", "max_d", "max_b", "max_h", "min_n", "min_d"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"domain.{name}: got {value!r}; expected a positive integer")
        if self.min_n > self.max_n or self.min_d > self.max_d:
            raise ValueError(
                f"domain: got N in [{self.min_n}, {self.max_n}], d in [{self.min_d}, {self.max_d}]; expected min <= max"
            )
        if self.examples is not None and (
            isinstance(self.examples, bool) or not isinstance(self.examples, int) or self.examples < 1
        ):
            raise ValueError(f"domain.examples: got {self.examples!r}; expected a positive integer or None")
        if self.kinds is not None:
            object.__setattr__(self, "kinds", tuple(self.kinds))

    def to_dict(self) -> dict[str, Any]:
        return {
            "kinds": list(self.kinds) if self.kinds else None,
            "min_n": self.min_n,
            "min_d": self.min_d,
            "max_n": self.max_n,
            "max_d": self.max_d,
            "max_b": self.max_b,
            "max_h": self.max_h,
            "examples": self.examples,
        }


class _Failed(Exception):
    def __init__(self, finding: Finding):
        super().__init__(finding.name)
        self.finding = finding


def run_property(
    prop: Property,
    target: Target,
    *,
    causal: bool,
    domain: Domain = Domain(),
    profile_name: str = "ci",
    seed: int = 0,
    threads: int | None = None,
) -> Finding:
    """The worst Finding of ``prop`` over the examples of ``domain``; a failure is shrunk first. Runs
    with ``threads`` torch and BLAS threads (default $GRAMCHECK_THREADS, else 1; gramcheck.threads)."""
    n = _threads.resolve(threads)
    fn = target.fn
    target.fn = _threads.pinned(fn, n)  # the target runs in its own worker thread: limit it there
    try:
        with _threads.limited(n):
            return _run_property(prop, target, causal=causal, domain=domain, profile_name=profile_name, seed=seed)
    finally:
        target.fn = fn


def _run_property(
    prop: Property, target: Target, *, causal: bool, domain: Domain, profile_name: str, seed: int
) -> Finding:
    # the domain's kinds, narrowed to the property's own (gradients: smooth kinds) where they overlap
    if domain.kinds is None:
        kinds = prop.kinds
    else:
        kinds = tuple(k for k in domain.kinds if k in prop.kinds) or tuple(domain.kinds)
    strategy = attention_inputs(
        target.variant,
        dtype=target.dtype,
        kinds=kinds,
        max_n=max(domain.min_n, min(domain.max_n, prop.max_n or domain.max_n)),
        max_d=max(domain.min_d, min(domain.max_d, prop.max_d or domain.max_d)),
        min_n=domain.min_n,
        min_d=domain.min_d,
        max_b=domain.max_b,
        max_h=domain.max_h,
    )
    base = profile(profile_name)
    cfg = settings(
        base,
        derandomize=False,
        database=None,
        max_examples=domain.examples or base.max_examples,
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
    )
    worst: list[Finding] = []
    count = [0]
    timed_out: list[Finding] = []

    @hseed(seed)
    @cfg
    @given(strategy)
    def search(ex: Any) -> None:
        # a hanging target is not called again: shrinking would wait out every call
        f = timed_out[0] if timed_out else prop.fn(target, ex, causal=causal)
        if f is None:
            reject()
        if f.failure == "timeout" and not timed_out:
            f.details["examples"] = count[0] + 1  # the calls made; later ones replay this finding
            timed_out.append(f)
        count[0] += 1
        score = f.measured / f.bound if f.bound > 0 else f.measured
        htarget(score if math.isfinite(score) else 1e300, label=prop.name)
        if not worst or _worse(f, worst[0]):
            worst[:] = [f]
        if not f.passed:
            raise _Failed(f)  # one raise site: Hypothesis tells failures apart by where they are raised

    try:
        search()
    except _Failed as failed:
        f = timed_out[0] if timed_out else failed.finding
        f.details.setdefault("examples", count[0])
        f.details["shrunk"] = True
        return f
    except Flaky as exc:
        return Finding(
            prop.name, False, math.inf, 1.0, details={"failure": "nondeterministic", "error": str(exc)[:500]}
        )
    except Unsatisfiable:
        return _no_examples(prop)
    except Exception as exc:  # noqa: BLE001 - an unexpected error is reported, never raised
        return Finding(
            prop.name,
            False,
            math.inf,
            1.0,
            details={"failure": "internal-error", "error": f"{type(exc).__name__}: {str(exc)[:500]}"},
        )
    if not worst:
        return _no_examples(prop)
    f = worst[0]
    f.details["examples"] = count[0]
    return f


def _no_examples(prop: Property) -> Finding:
    return Finding(prop.name, True, 0.0, 1.0, details={"examples": 0, "note": "no input in the domain met the premise"})


def _worse(a: Finding, b: Finding) -> bool:
    ra = a.measured / a.bound if a.bound > 0 else a.measured
    rb = b.measured / b.bound if b.bound > 0 else b.measured
    return (not a.passed and b.passed) or ra > rb
