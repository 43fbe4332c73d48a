"""The search: run one property over inputs drawn by Hypothesis, climb toward the worst case with
``hypothesis.target``, and return the worst Finding (the shrunk counterexample when one fails).

Determinism: the examples are a function of ``seed``, the profile and the Hypothesis version, and of nothing
else: no example database, ``@seed(seed)`` with ``derandomize=False`` (derandomize=True would take the seed
from the test function's source and ignore ``seed``), and Hypothesis's harvest of literal constants from
"local" modules (every module outside site-packages and the standard library that happens to be imported,
e.g. the working directory's) switched off while a property runs (``_no_local_constants``). So the same
seed, target and versions give the same Findings from any working directory."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, given, reject, settings
from hypothesis import seed as hseed
from hypothesis import target as htarget
from hypothesis.errors import Flaky, Unsatisfiable

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

    def memory_estimate(self, variant: Any) -> int:
        """Bytes the largest input may need: ``memory_estimate`` at max_b, max_h, max_n, max_d."""
        return memory_estimate(self.max_n, self.max_d, b=self.max_b, h=self.max_h)

    def check_memory(self, variant: Any = None, *, budget: float | None = None) -> None:
        """A ValueError naming the size argument when ``memory_estimate`` exceeds ``budget`` bytes
        (default MEMORY_BUDGET)."""
        check_memory(
            self.memory_estimate(variant),
            budget,
            arg="domain.max_n" if self.max_n >= self.max_d else "domain.max_d",
            sizes=f"max_n={self.max_n}, max_d={self.max_d}, max_b={self.max_b}, max_h={self.max_h}",
        )

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


EXAMPLES_PER_UNDRAWN_KIND = 2

MEMORY_BUDGET = 4 * 2**30  # bytes; check(memory_budget=...) or the CLI's --memory-budget (GiB) changes it
# float64 arrays the check may hold at once per head: N x N ones (weights, their ball radii, masks, the
# Jacobian's blocks) and N x d ones (inputs, outputs, features, gradients, copies for the target)
_QUADRATIC_ARRAYS = 8
_LINEAR_ARRAYS = 32


def memory_estimate(n: int, d: int, *, b: int = 1, h: int = 1, quadratic: bool = True) -> int:
    """Bytes for float64 work arrays at batch b, heads h, length n, head dimension d:
    8 b h (8 n^2 [if quadratic] + 32 n d)."""
    return 8 * b * h * ((_QUADRATIC_ARRAYS * n * n if quadratic else 0) + _LINEAR_ARRAYS * n * d)


def _gib(x: float) -> str:
    return f"{x / 2**30:.3g} GiB"


def check_memory(need: int, budget: float | None, *, arg: str, sizes: str) -> None:
    budget = MEMORY_BUDGET if budget is None else budget
    if need > budget:
        raise ValueError(
            f"{arg}: {sizes} would need about {_gib(need)} (estimated as 8 B H (8 N^2 + 32 N d) bytes); "
            f"the memory budget is {_gib(budget)} (memory_budget=, or --memory-budget GiB)"
        )


@contextlib.contextmanager
def _no_local_constants() -> Iterator[None]:
    """Hypothesis (6.13x and later) mixes literal constants harvested from "local" modules into its draws
    (``providers._get_local_constants``): which modules are local depends on the working directory and
    on what was imported, so the example stream did too. Hand it no local constants while gramcheck
    searches (the cache of permitted constants is cleared on entry and on exit)."""
    try:
        from hypothesis.internal.conjecture import providers
    except ImportError:  # pragma: no cover - a Hypothesis without the provider module
        yield
        return
    real = getattr(providers, "_get_local_constants", None)
    if real is None:  # pragma: no cover - a Hypothesis from before local constants
        yield
        return
    empty = providers.Constants()
    providers.CONSTANTS_CACHE.cache.clear()
    providers._get_local_constants = lambda: empty
    try:
        yield
    finally:
        providers._get_local_constants = real
        providers.CONSTANTS_CACHE.cache.clear()


class _Failed(Exception):
    def __init__(self, finding: Finding):
        super().__init__(finding.name)
        self.finding = finding


def run_property(
    prop: Property, target: Target, *, causal: bool, domain: Domain = Domain(), profile_name: str = "ci", seed: int = 0
) -> Finding:
    """The worst Finding of ``prop`` over the examples of ``domain``; a failure is shrunk first. A property
    that does not apply under the target's hyperparameters gives a skipped Finding with the reason."""
    reason = prop.unless(target.variant, causal, dict(target.params)) if prop.unless is not None else None
    if reason:
        return Finding.skip(prop.name, reason, examples=0)
    # the domain's kinds, narrowed to the property's own (gradients: smooth kinds) where they overlap
    if domain.kinds is None:
        kinds = prop.kinds
    else:
        kinds = tuple(k for k in domain.kinds if k in prop.kinds) or tuple(domain.kinds)
    def strategy(ks: tuple[str, ...]) -> Any:
        return attention_inputs(
            target.variant,
            dtype=target.dtype,
            kinds=ks,
            max_n=max(domain.min_n, min(domain.max_n, prop.max_n or domain.max_n)),
            max_d=max(domain.min_d, min(domain.max_d, prop.max_d or domain.max_d)),
            min_n=domain.min_n,
            min_d=domain.min_d,
            max_b=domain.max_b,
            max_h=domain.max_h,
        )

    base = profile(profile_name)

    def cfg(examples: int) -> settings:
        return settings(  # seeded through @hseed below; the profiles are not derandomised (strategies.PROFILES)
            base,
            max_examples=examples,
            suppress_health_check=list(HealthCheck),
            report_multiple_bugs=False,
        )

    worst: list[Finding] = []
    count = [0]
    timed_out: list[Finding] = []
    drawn: set[str] = set()

    def search(ks: tuple[str, ...], examples: int) -> None:
        @hseed(seed)
        @cfg(examples)
        @given(strategy(ks))
        def run(ex: Any) -> None:
            # a hanging or crashing target is not called again: shrinking would wait out (or restart) every call
            f = timed_out[0] if timed_out else prop.fn(target, ex, causal=causal)
            if f is None:
                reject()
            drawn.add(ex.kind)
            if f.failure in ("timeout", "crashed") and not timed_out:
                f.details["examples"] = count[0] + 1  # the calls made; later ones replay this finding
                timed_out.append(f)
            count[0] += 1
            score = _score(f)
            htarget(score if math.isfinite(score) else 1e300, label=prop.name)
            if not worst or _worse(f, worst[0]):
                worst[:] = [f]
            if not f.passed:
                raise _Failed(f)  # one raise site: Hypothesis tells failures apart by where they are raised

        try:
            run()
        except Unsatisfiable:
            pass  # no input of these kinds met the premise; the others may have

    try:
        with _no_local_constants():
            search(kinds, domain.examples or base.max_examples)
            # hypothesis.target steers the examples toward the kinds that scored high: unless the domain
            # fixes the number of examples, every kind the search never drew gets examples of its own, so
            # that no kind of the domain goes unchecked
            if domain.examples is None:
                for k in [k for k in kinds if k not in drawn]:
                    search((k,), EXAMPLES_PER_UNDRAWN_KIND)
    except _Failed as failed:
        f = timed_out[0] if timed_out else failed.finding
        f.details.setdefault("examples", count[0])
        f.details["shrunk"] = True
        return f
    except Flaky as exc:
        return Finding(prop.name, math.inf, 1.0, details={"failure": "nondeterministic", "error": str(exc)[:500]})
    except Exception as exc:  # noqa: BLE001 - an unexpected error is reported, never raised
        return Finding(
            prop.name,
            math.inf,
            1.0,
            details={"failure": "internal-error", "error": f"{type(exc).__name__}: {str(exc)[:500]}"},
        )
    if not worst:
        return _no_examples(prop)
    f = worst[0]
    f.details["examples"] = count[0]
    f.details["kinds_drawn"] = [k for k in kinds if k in drawn]
    return f


def _no_examples(prop: Property) -> Finding:
    reason = "no input in the domain met the premise"
    return Finding.skip(prop.name, reason, examples=0, note=reason)


def _score(f: Finding) -> float:
    """How close to failing: 1 / margin (the ratio measured / bound of an upper bound; inf on failure
    without a ratio), so that every sense climbs the same way."""
    m = f.margin
    return 0.0 if m == math.inf else (math.inf if m == 0 or m != m else 1.0 / m)


def _worse(a: Finding, b: Finding) -> bool:
    return (not a.passed and b.passed) or _score(a) > _score(b)
