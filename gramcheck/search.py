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
from dataclasses import dataclass, replace
from typing import Any

from hypothesis import HealthCheck, given, reject, settings
from hypothesis import seed as hseed
from hypothesis import target as htarget
from hypothesis.errors import Flaky, Unsatisfiable

from . import threads as _threads
from .arith import subnormals
from .findings import Finding, add_note
from .locate import annotate
from .properties import Property
from .strategies import HEAD_SIZES, KINDS, VALUE_DIMS, attention_inputs, profile, sample
from .targets import Target
from .validation import check_choice, check_names, check_positive_number

# per profile: the largest N and d drawn and the compute budget on B * H * N * d (a ci check of one variant
# stays under a minute on 2 cores: benchmarks/RESULTS.md)
PROFILE_SIZES: dict[str, dict[str, int]] = {
    "ci": {"max_n": 320, "max_d": 64, "budget": 2**14},
    "thorough": {"max_n": 1024, "max_d": 128, "budget": 2**16},
}
# properties that differentiate the target: their own N cap, unless the domain sets ``grad_max_n``
GRADIENT_PROPERTIES = ("gradcheck", "jacobian-norm", "depth-growth", "finite-gradients", "backward-agreement")


@dataclass(frozen=True)
class Domain:
    """Where inputs are drawn: kinds, sizes and the number of examples. None: the profile's
    (``PROFILE_SIZES``; examples from the profile's settings).

    N is drawn with weight on the boundaries of ``chunks`` (c - 1, c, c + 1, 2c - 1, 2c, 2c + 1) and d
    with weight on head sizes 16, 32, 64, 128, under ``budget`` on B * H * N * d (d shrinks first, then
    N, never below min_d / min_n). ``gates`` fixes the regimes of the variant's extra inputs (the regimes
    their InputSpecs name, e.g. decays: 'extreme' reaches exp(-100) per token; the delta rule's write
    strengths: 'expansive' beta in (2, 3]); ``grad_max_n`` sets the sequence length of the gradient
    properties (each has its own cap otherwise). ``value_dims``: 'same' draws d_v = d_k; 'any' draws d_v on its
    own in [1, max_d] (with the same weight on head sizes), for targets that take rectangular heads (GLA's
    expand_v, Gated DeltaNet, Mamba2: a kernel that allocates its output or state like q fails there)."""

    kinds: tuple[str, ...] | None = None
    max_n: int | None = None
    max_d: int | None = None
    max_b: int = 1  # the state properties and backward-agreement draw two rows whatever it is (Property.min_b)
    max_h: int = 2
    examples: int | None = None
    min_n: int = 1
    min_d: int = 1  # min_d = max_d fixes the head dimension (targets whose hyperparameters depend on d)
    chunks: tuple[int, ...] = (64,)
    budget: int | None = None
    gates: tuple[str, ...] | None = None
    grad_max_n: int | None = None
    value_dims: str = "same"

    def __post_init__(self) -> None:
        check_choice("domain.value_dims", self.value_dims, VALUE_DIMS)
        for name in ("max_n", "max_d", "max_b", "max_h", "min_n", "min_d", "budget", "grad_max_n"):
            value = getattr(self, name)
            if value is None and name in ("max_n", "max_d", "budget", "grad_max_n"):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"domain.{name}: got {value!r}; expected a positive integer")
        if (self.max_n is not None and self.min_n > self.max_n) or (self.max_d is not None and self.min_d > self.max_d):
            raise ValueError(
                f"domain: got N in [{self.min_n}, {self.max_n}], d in [{self.min_d}, {self.max_d}]; expected min <= max"
            )
        if self.examples is not None and (
            isinstance(self.examples, bool) or not isinstance(self.examples, int) or self.examples < 1
        ):
            raise ValueError(f"domain.examples: got {self.examples!r}; expected a positive integer or None")
        if self.kinds is not None:
            object.__setattr__(self, "kinds", check_names("domain.kinds", self.kinds, KINDS))
        chunks = tuple(self.chunks) if self.chunks is not None else ()
        if any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in chunks):
            raise ValueError(f"domain.chunks: got {self.chunks!r}; expected positive integer chunk sizes")
        object.__setattr__(self, "chunks", chunks)
        if self.gates is not None:
            from . import variants as _variants

            known = sorted({r for v in _variants.list() for s in v.inputs for r in (*s.regimes, *s.on_request)})
            object.__setattr__(self, "gates", check_names("domain.gates", self.gates, tuple(known)))

    def resolved(self, profile_name: str) -> Domain:
        """The domain with the profile's sizes filled in where None (min_n / min_d raise them if larger)."""
        sizes = PROFILE_SIZES[check_choice("profile", profile_name, tuple(PROFILE_SIZES))]
        return replace(
            self,
            max_n=self.max_n if self.max_n is not None else max(self.min_n, sizes["max_n"]),
            max_d=self.max_d if self.max_d is not None else max(self.min_d, sizes["max_d"]),
            budget=self.budget if self.budget is not None else sizes["budget"],
        )

    def memory_estimate(self, variant: Any) -> int:
        """Bytes the largest input may need: ``memory_estimate`` at max_b, max_h, max_n, max_d."""
        max_n, max_d = self._sizes()
        return memory_estimate(max_n, max_d, b=self.max_b, h=self.max_h)

    def _sizes(self) -> tuple[int, int]:
        """(max_n, max_d) of a resolved domain (``resolved`` fills them from the profile)."""
        if self.max_n is None or self.max_d is None:
            raise ValueError("domain: max_n and max_d are unset; resolve the domain for a profile first")
        return self.max_n, self.max_d

    def check_memory(self, variant: Any = None, *, budget: float | None = None) -> None:
        """A ValueError naming the size argument when ``memory_estimate`` exceeds ``budget`` bytes
        (default MEMORY_BUDGET)."""
        max_n, max_d = self._sizes()
        check_memory(
            self.memory_estimate(variant),
            budget,
            arg="domain.max_n" if max_n >= max_d else "domain.max_d",
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
            "chunks": list(self.chunks),
            "budget": self.budget,
            "gates": list(self.gates) if self.gates else None,
            "grad_max_n": self.grad_max_n,
            **({} if self.value_dims == "same" else {"value_dims": self.value_dims}),
        }



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
    """A ValueError naming ``arg`` when ``need`` bytes exceed ``budget`` (bytes: None for MEMORY_BUDGET; a
    budget that is not a positive finite number is an error naming memory_budget)."""
    budget = check_positive_number("memory_budget", budget, unit="bytes", default=f"{_gib(MEMORY_BUDGET)}")
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


class _Skipped(_Failed):
    """An example's Finding says the property does not apply to the target (``Finding.skip``): no example is one."""


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
    """The worst Finding of ``prop`` over the examples of ``domain``; a failure is shrunk first. A property
    that does not apply under the target's hyperparameters gives a skipped Finding with the reason. Runs
    with ``threads`` torch and BLAS threads (default $GRAMCHECK_THREADS, else 1; gramcheck.threads)."""
    reason = prop.unless(target.variant, causal, dict(target.params)) if prop.unless is not None else None
    if not reason and target.own_draws and not prop.any_draw:
        drawn = ", ".join(target.own_draws)
        reason = (
            f"the target draws its own {drawn} (it takes no such keyword): the reference cannot evaluate the "
            "same draw, so this target is checked statistically (output-unbiased, output-mse)"
        )
    if reason:
        return Finding.skip(prop.name, reason, examples=0)
    n = _threads.resolve(threads)
    fn = target.fn
    target.fn = _threads.pinned(fn, n)  # the target runs in its own worker thread: limit it there
    target.draw_seed = seed  # a target drawing its own randomness draws it seeded by the check's seed
    try:
        with _threads.limited(n), subnormals(target.subnormals):
            return _run_property(prop, target, causal=causal, domain=domain, profile_name=profile_name, seed=seed)
    finally:
        target.fn = fn


def _run_property(
    prop: Property, target: Target, *, causal: bool, domain: Domain, profile_name: str, seed: int
) -> Finding:
    domain = domain.resolved(profile_name)
    assert domain.max_n is not None and domain.max_d is not None
    # the domain's kinds, narrowed to the property's own (gradients: smooth kinds) where they overlap
    if domain.kinds is None:
        kinds = prop.kinds
    else:
        kinds = tuple(k for k in domain.kinds if k in prop.kinds) or tuple(domain.kinds)
    cap_n = prop.max_n
    if domain.grad_max_n is not None and prop.name in GRADIENT_PROPERTIES:
        cap_n = domain.grad_max_n
    sizes: dict[str, Any] = {
        "max_n": max(domain.min_n, min(domain.max_n, cap_n or domain.max_n)),
        "max_d": max(domain.min_d, min(domain.max_d, prop.max_d or domain.max_d)),
        "min_n": domain.min_n,
        "min_d": domain.min_d,
        "max_b": max(domain.max_b, prop.min_b),
        "max_h": domain.max_h,
        "chunks": domain.chunks,
        "budget": domain.budget,
        "gate_regimes": domain.gates,
        "head_sizes": HEAD_SIZES,
        "value_dims": domain.value_dims,
    }
    strategy = attention_inputs(target.variant, dtype=target.dtype, kinds=kinds, **sizes)
    rows = prop.min_b if prop.min_b > domain.max_b else None  # recorded where the domain says fewer
    base = profile(profile_name)
    budget = int(min(domain.examples or base.max_examples, prop.max_examples or math.inf))
    # a third of the examples is kept for the kinds the search does not draw (one explicit example each)
    reserve = min(len(kinds), budget // 3) if len(kinds) > 1 else 0
    state = _State()
    result = _search(prop, target, causal, strategy, budget - reserve, base, seed, state)
    if result is None:
        for kind in [k for k in kinds if k not in state.drawn][:reserve]:
            one = attention_inputs(target.variant, dtype=target.dtype, kinds=(kind,), **sizes)
            with _no_local_constants():
                ex = sample(one, seed=seed, index=2)
            f = _guarded_call(prop, target, ex, causal)
            if f is not None and f.skipped:
                f.details["examples"] = 0
                return f
            state.drawn[kind] = state.drawn.get(kind, 0) + 1
            if f is None:
                continue
            state.count += 1
            state.record(f)
            if not f.passed:
                # shrink it: a search over that kind alone (its first failure is shrunk by Hypothesis)
                again = _State()
                shrunk = _search(prop, target, causal, one, max(4, reserve), base, seed, again)
                if isinstance(shrunk, Finding) and not shrunk.passed and again.failing:
                    f, ex = shrunk, again.failing[0]
                    f.details["shrunk"] = True
                else:
                    f.details["shrunk"] = False
                state.absorb(again)
                f.details["examples"] = state.count
                _coverage(f, kinds, state, rows)
                annotate(f, prop, target, ex, causal=causal, chunks=domain.chunks)
                return f
    if isinstance(result, Finding) and result.skipped:
        return result  # the property does not apply to this target: no example, no coverage
    if isinstance(result, Finding):
        if result.details.get("failure") not in ("nondeterministic", "internal-error") or state.failing:
            _coverage(result, kinds, state, rows)
        if state.failing and not state.timed_out and not result.passed:
            annotate(result, prop, target, state.failing[0], causal=causal, chunks=domain.chunks)
        return result
    if not state.worst:
        return _no_examples(prop)
    f = state.worst[0]
    f.details["examples"] = state.count
    _coverage(f, kinds, state, rows)
    if state.count <= budget * FEW_EXAMPLES:
        rest = "the others fell outside the property's premise or were not drawn"
        add_note(f.details, f"judged on {state.count} of the {budget} examples asked for; {rest}")
    return f


FEW_EXAMPLES = 0.25  # a pass judged on no more than this share of the examples asked for says so in its note


class _State:
    """What one search saw: the worst Finding, the examples evaluated, kinds drawn, the failing input."""

    def __init__(self) -> None:
        self.worst: list[Finding] = []
        self.count = 0
        self.timed_out: list[Finding] = []
        self.drawn: dict[str, int] = {}
        self.failing: list[Any] = []
        # how many examples' Findings could not judge each part (``details["unjudged"]``)
        self.unjudged: dict[str, int] = {}

    def absorb(self, other: _State) -> None:
        """Count ``other``'s examples, kinds and unjudged parts as this search's own (a shrink search's)."""
        self.count += other.count
        for mine, theirs in ((self.drawn, other.drawn), (self.unjudged, other.unjudged)):
            for key, n in theirs.items():
                mine[key] = mine.get(key, 0) + n

    def record(self, f: Finding) -> None:
        """Keep f if it is the worst so far, and count the parts it could not judge."""
        for part in f.details.get("unjudged", ()):
            self.unjudged[part] = self.unjudged.get(part, 0) + 1
        if not self.worst or _worse(f, self.worst[0]):
            self.worst[:] = [f]


def _guarded_call(prop: Property, target: Target, ex: Any, causal: bool) -> Finding | None:
    try:
        return prop.fn(target, ex, causal=causal)
    except Exception as exc:  # noqa: BLE001 - an unexpected error is reported, never raised
        return Finding(
            prop.name,
            math.inf,
            1.0,
            details={"failure": "internal-error", "error": f"{type(exc).__name__}: {str(exc)[:500]}"},
        )


def _search(
    prop: Property, target: Target, causal: bool, strategy: Any, examples: int, base: Any, seed: int, state: _State
) -> Finding | None:
    """Hypothesis over ``strategy``: the shrunk failing Finding, an error Finding, or None when every
    example passed (``state`` then holds the worst)."""
    cfg = settings(  # seeded through @hseed below; the profiles are not derandomised (strategies.PROFILES)
        base,
        max_examples=max(1, examples),
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
    )

    @hseed(seed)
    @cfg
    @given(strategy)
    def search(ex: Any) -> None:
        # a hanging or crashing target is not called again: shrinking would wait out (or restart) every call
        f = state.timed_out[0] if state.timed_out else prop.fn(target, ex, causal=causal)
        if f is not None and f.skipped:
            raise _Skipped(f)
        state.drawn[ex.kind] = state.drawn.get(ex.kind, 0) + 1
        if f is None:
            reject()
        if f.failure in ("timeout", "crashed") and not state.timed_out:
            f.details["examples"] = state.count + 1  # the calls made; later ones replay this finding
            state.timed_out.append(f)
        state.count += 1
        score = _score(f)
        htarget(score if math.isfinite(score) else 1e300, label=prop.name)
        state.record(f)
        if not f.passed:
            state.failing[:] = [ex]
            raise _Failed(f)  # one raise site: Hypothesis tells failures apart by where they are raised

    try:
        with _no_local_constants():
            search()
    except _Skipped as skipped:
        skipped.finding.details["examples"] = 0
        return skipped.finding
    except _Failed as failed:
        f = state.timed_out[0] if state.timed_out else failed.finding
        f.details.setdefault("examples", state.count)
        f.details["shrunk"] = True
        return f
    except Flaky as exc:
        return Finding(
            prop.name, math.inf, 1.0, details={"failure": "nondeterministic", "error": str(exc)[:500]}
        )
    except Unsatisfiable:
        return None
    except Exception as exc:  # noqa: BLE001 - an unexpected error is reported, never raised
        return Finding(
            prop.name,
            math.inf,
            1.0,
            details={"failure": "internal-error", "error": f"{type(exc).__name__}: {str(exc)[:500]}"},
        )
    return None


def _coverage(f: Finding, kinds: tuple[str, ...], state: _State, max_b: int | None = None) -> None:
    """Finding.details: examples per kind, the property's kinds that no example drew, the parts that some
    example could not judge (all examples', not only the reported one's), and ``max_b``, the batch rows
    drawn where the property draws more than the domain says (``Property.min_b``)."""
    f.details["kinds_drawn"] = dict(sorted(state.drawn.items()))
    if max_b is not None:
        f.details["max_b"] = max_b
    missing = [k for k in kinds if k not in state.drawn]
    if missing:
        f.details["kinds_not_drawn"] = missing
    if state.unjudged:
        f.details["unjudged"] = sorted(state.unjudged)
        counts = ", ".join(f"{p} on {n} of {max(state.count, n)}" for p, n in sorted(state.unjudged.items()))
        add_note(f.details, f"not judged: {counts} examples")


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
