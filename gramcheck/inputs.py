"""Extra inputs of attention variants (beyond q, k, v), each described once by an ``InputSpec``.

A variant lists its extra inputs (``Variant.inputs``); validation, the strategies, the causality
property, the gradient properties and the demo ask the spec, never the input's name:

* where it lives: ``axes`` from ``AXES`` -- ("B", "H", "N", "dk") per token and channel (GLA's and
  RWKV-6's log-decays), ("B", "H", "N") one scalar per head and token (Mamba2's dt*A, Gated DeltaNet's
  alpha, the delta rule's beta; fla's layout (B, T, H) transposed), ("H", "dk") per head and channel
  (RWKV-6's bonus u), ("m", "dk") a random matrix shared by every head (FAVOR+ projection);
* what it may hold: every entry in [``low``, ``high``] (a log-decay is <= 0);
* how it is drawn adversarially: ``draw(rng, shape, regime)`` with a regime from ``regimes``;
* how causality perturbs it: ``future(x, t, rng)`` redraws the positions after t (per-token inputs);
* how a per-head slice is taken: ``head(x, b, h)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .validation import check_array, check_same_kind

AXES = ("B", "H", "N", "dk", "dv", "m")

Draw = Callable[[np.random.Generator, tuple[int, ...], str], np.ndarray]


@dataclass(frozen=True)
class InputSpec:
    """One extra input: name, axes, range, adversarial draw (see the module docstring)."""

    name: str
    axes: tuple[str, ...]
    draw: Draw
    regimes: tuple[str, ...] = ("default",)
    benign: str = "default"  # the regime of demonstrations (well-conditioned values)
    low: float = -math.inf
    high: float = math.inf
    differentiable: bool = True
    summary: str = ""
    broadcast: tuple[str, ...] = ()  # axes that may also have size 1 (one decay shared by every channel)
    on_request: tuple[str, ...] = ()  # regimes drawn only when a domain names them (outside the contract)
    # a random draw (the random-feature matrix) a target may make itself instead of taking it: such a
    # target is checked statistically, and ``size_param`` names the hyperparameter giving the draw's size
    size_param: str | None = None

    def __post_init__(self) -> None:
        unknown = [a for a in self.axes if a not in AXES]
        if unknown:
            raise ValueError(f"axes: got {unknown}; expected names from {AXES}")

    @property
    def layout(self) -> str:
        return "(" + ", ".join("d_k" if a == "dk" else "d_v" if a == "dv" else a for a in self.axes) + ")"

    @property
    def per_token(self) -> bool:
        return "N" in self.axes

    @property
    def log_decay(self) -> bool:
        """A per-token log-decay (every entry <= 0, unbounded below): its gradient is a reverse sum of
        terms that cancel, and its absolute value is no meaningful magnitude."""
        return self.per_token and self.high == 0.0 and self.low == -math.inf

    def shape(self, dims: Mapping[str, int]) -> tuple[int, ...]:
        """The expected shape given the sizes of the axes."""
        return tuple(int(dims[a]) for a in self.axes)

    def check(self, x: Any, dims: Mapping[str, int]) -> None:
        """Shape, dtype kind, finiteness and range; ValueError naming the input otherwise."""
        check_array(self.name, x, ndim=len(self.axes), layout=self.layout)
        expected = tuple(
            s if a not in dims or (a in self.broadcast and s == 1) else dims[a]
            for a, s in zip(self.axes, x.shape, strict=True)
        )
        if tuple(x.shape) != expected:
            raise ValueError(f"{self.name}: got shape {tuple(x.shape)}; expected {expected} = {self.layout}")
        if bool((x < self.low).any()) or bool((x > self.high).any()):
            raise ValueError(f"{self.name}: has entries outside [{self.low:g}, {self.high:g}]; expected {self.summary}")

    def head(self, x: Any, b: int, h: int) -> Any:
        """The slice of one (batch, head) pair, keeping the axes (length 1)."""
        idx = tuple(
            slice(b, b + 1) if a == "B" else slice(h, h + 1) if a == "H" else slice(None) for a in self.axes
        )
        return x[idx]

    def future(self, x: np.ndarray, t: int, rng: np.random.Generator, regime: str | None = None) -> np.ndarray:
        """A copy of x whose positions after t are redrawn (per-token inputs); others unchanged."""
        out = np.array(x, dtype=np.float64, copy=True)
        if not self.per_token:
            return out
        n_axis = self.axes.index("N")
        idx = tuple(slice(t + 1, None) if i == n_axis else slice(None) for i in range(out.ndim))
        fresh = self.draw(rng, out[idx].shape, regime or self.regimes[0])
        out[idx] = np.clip(fresh, self.low, self.high)
        return out


def check_extras(specs: tuple[InputSpec, ...], extras: Mapping[str, Any], dims: Mapping[str, int], like: Any) -> None:
    """Check every given extra against its spec and against ``like`` (same array kind, dtype, device)."""
    for spec in specs:
        x = extras.get(spec.name)
        if x is not None:
            spec.check(x, dims)
            check_same_kind([("q", like), (spec.name, x)])


def draw_extras(
    specs: tuple[InputSpec, ...],
    dims: Mapping[str, int],
    *,
    dtype: Any,
    seed: int,
    regimes: Mapping[str, str] | None = None,
) -> dict[str, np.ndarray]:
    """Every spec's input drawn in its regime (default: its benign one), rounded to ``dtype`` (returned
    as float64) and kept in the spec's range."""
    from .precision import round_to

    out = {}
    for spec in specs:
        regime = (regimes or {}).get(spec.name, spec.benign)
        values = spec.draw(np.random.default_rng(seed), spec.shape(dims), regime)
        out[spec.name] = np.clip(round_to(values, dtype), spec.low, spec.high)
    return out


# --------------------------------------------------------------------------------------------------
# draws (float64 values in the spec's range; the strategies round them to the target's dtype)
# --------------------------------------------------------------------------------------------------
DECAY_REGIMES = ("long-memory", "short-memory", "mixed", "extreme", "moderate")


def draw_log_decay(rng: np.random.Generator, shape: tuple[int, ...], regime: str) -> np.ndarray:
    """Log-decays g <= 0. long-memory: alpha = e^g in [0.99, 1); short-memory: alpha in [1e-6, 0.05];
    mixed: alternate long and short along the last axis; extreme: g in [-100, -20] on a random half of
    the entries and near 0 elsewhere (126+ binary orders of decay inside one chunk); moderate:
    g in [-0.5, -1e-3] (benign, for demonstrations)."""
    long_g = np.log(rng.uniform(0.99, 1.0 - 1e-6, shape))
    if regime == "long-memory":
        return long_g
    short_g = np.log(rng.uniform(1e-6, 0.05, shape))
    if regime == "short-memory":
        return short_g
    if regime == "mixed":
        alternate = np.arange(shape[-1]) % 2 == 0 if shape else np.array(True)
        return np.where(alternate, long_g, short_g)
    if regime == "extreme":
        return np.where(rng.random(shape) < 0.5, -rng.uniform(20.0, 100.0, shape), long_g)
    if regime == "moderate":
        return -rng.uniform(1e-3, 0.5, shape)
    raise ValueError(f"regime: got {regime!r}; expected one of {DECAY_REGIMES}")


def draw_unit(high: float) -> Draw:
    """Values in [0, high]: uniform, near the edges (0 and high), or at the edges exactly."""

    def draw(rng: np.random.Generator, shape: tuple[int, ...], regime: str) -> np.ndarray:
        if regime == "uniform":
            return rng.uniform(0.0, high, shape)
        if regime == "edges":
            return np.where(rng.random(shape) < 0.5, rng.uniform(0, 1e-3, shape), high - rng.uniform(0, 1e-3, shape))
        if regime == "extreme":
            return np.where(rng.random(shape) < 0.5, 0.0, high)
        raise ValueError(f"regime: got {regime!r}; expected one of ('uniform', 'edges', 'extreme')")

    return draw


def draw_gaussian(rng: np.random.Generator, shape: tuple[int, ...], regime: str) -> np.ndarray:
    """N(0, 1) entries (default), or N(0, 1) times 10^U(-3, 3) per entry (mixed scales)."""
    x = rng.standard_normal(shape)
    return x if regime == "default" else x * 10.0 ** rng.uniform(-3, 3, shape)


def draw_projection(rng: np.random.Generator, shape: tuple[int, ...], regime: str) -> np.ndarray:
    """An orthogonal random-feature matrix (m, d_k) (featuremaps.random_projection, kind ``regime``)."""
    from .featuremaps import random_projection

    return random_projection(shape[0], shape[1], kind=regime, seed=int(rng.integers(0, 2**32)))


# --------------------------------------------------------------------------------------------------
# the standard specs
# --------------------------------------------------------------------------------------------------
def channel_log_decay(name: str = "g") -> InputSpec:
    """Per-token, per-channel log-decays (B, H, N, d_k) <= 0 (GLA, RWKV-6's w); (B, H, N, 1) shares one
    decay across the channels (fla's simple GLA)."""
    return InputSpec(
        name, ("B", "H", "N", "dk"), draw_log_decay, DECAY_REGIMES[:4], "moderate", high=0.0,
        summary="log-decays <= 0", broadcast=("dk",),
    )


def scalar_log_decay(name: str = "g") -> InputSpec:
    """One log-decay per head and token (B, H, N) <= 0 (Mamba2's dt*A, Gated DeltaNet, simple GLA)."""
    return InputSpec(
        name, ("B", "H", "N"), draw_log_decay, DECAY_REGIMES[:4], "moderate", high=0.0, summary="log-decays <= 0"
    )


def write_strength(name: str = "beta", high: float = 2.0) -> InputSpec:
    """Per-token write strengths (B, H, N) in [0, high] (the delta rule's beta)."""
    return InputSpec(
        name, ("B", "H", "N"), draw_unit(high), ("uniform", "edges", "extreme"), "uniform", low=0.0, high=high,
        summary=f"values in [0, {high:g}]",
    )


def head_channel(name: str) -> InputSpec:
    """An unconstrained per-head, per-channel parameter (H, d_k) (RWKV-6's bonus u)."""
    return InputSpec(name, ("H", "dk"), draw_gaussian, ("default", "mixed"), summary="finite values")


def projection(name: str = "projection") -> InputSpec:
    """The random-feature matrix (m, d_k), shared by every head; not differentiated. A target may draw it
    itself (no ``projection`` keyword): the hyperparameter ``features`` then gives its m."""
    return InputSpec(
        name, ("m", "dk"), draw_projection, ("orf",), "orf", differentiable=False,
        summary="a finite (m, d_k) matrix", size_param="features",
    )
