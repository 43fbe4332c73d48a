"""Hypothesis strategies for adversarial attention inputs (Q, K, V[, extras]) in layout (B, H, N, d).

Every strategy draws its *numerical character* (condition number, duplicate distance, outlier scale,
degrees of freedom, norm, gate range, sizes) through Hypothesis, so that shrinking moves toward the
simple case (small N and d, condition number 1, no duplicates, no outliers) and ``hypothesis.target``
can climb on those parameters; the bulk entries come from a NumPy generator seeded by a drawn integer.
All arrays are float64 holding values exactly representable in the requested ``dtype``
(``precision.round_to``), so a target in that dtype receives exactly what the reference evaluates.

What each kind promises, recorded in ``AttentionInputs.meta`` and checked in tests/test_strategies.py:

* ``gaussian``        iid N(0, 1) entries.
* ``spectrum``        each (b, h) slice of Q (and of K) is U diag(s) W^T with Haar U, W and singular
                      values log-spaced from 1 down to 1/cond, cond = 10^c, c in [0, 12] (meta: cond),
                      capped per dtype at 0.1 / (u sqrt(min(N, d))) so rounding keeps it within 10%.
* ``low-rank``        Q and K of exact rank <= r < d: products of integer N x r and r x d factors with
                      entries in {-1, 0, 1}, exact in every dtype (meta: rank r).
* ``near-duplicate``  a fraction f of keys are copies of one key plus a perturbation of norm delta
                      (meta: fraction, delta; measured: max distance to the anchor key).
* ``outliers``        n_out tokens of q, k, v whose norm is scale = 10..1000 times the median norm
                      of the other tokens (over all batches and heads): attention sinks; meta: scale.
* ``heavy-tail``      Student-t entries with nu in [1, 4] degrees of freedom, and per-head and
                      per-channel scales spanning up to 10^s (mixed scales).
* ``overflow``        rows scaled to a norm R chosen so that exp(R^2 / sqrt(d)) overflows the dtype
                      (past log(max) of float16/float32): exp(w.x) and unstabilised exp(q.k) overflow.
* ``large-magnitude`` entries of size 18..25 (meta: scale), with a random subset of q and k rows made
                      all-negative (every entry below -scale): a mild-overflow regime inside float32's
                      exponent range (|x| <= 60, where exp(x) stays a float32 normal) that reaches exp(x) - 1 + 1 = 0
                      for x < -17 (``F.elu(x) + 1`` in float32) and unstabilised exponentials.
* ``anti-aligned``    k_j = -c q_j + noise of norm eps c |q_j| (eps <= 0.1, so cos(q_j, k_j) < -0.99): q.k
                      very negative, softmax weights vanish and positive random features have large
                      relative error; meta: factor c, noise eps.
* ``degenerate``      zero rows in q and k, and N = 1 or d = 1 drawn with high probability.
* ``long``            N near the size budget ``max_n`` (d small so N * d stays within budget).

A variant's extra inputs (log-decays, write strengths, random matrices, ...) are drawn by their own
specs (``gramcheck.inputs``) in a regime drawn from the spec's regimes (meta: regimes, by input name).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

from .inputs import draw_extras
from .precision import dtype_name, max_finite, round_to, unit_roundoff
from .validation import check_choice, check_names

VALUE_DIMS = ("same", "any")  # d_v = d_k, or drawn on its own (attention_inputs, search.Domain.value_dims)
KINDS = (
    "gaussian",
    "spectrum",
    "low-rank",
    "near-duplicate",
    "outliers",
    "heavy-tail",
    "overflow",
    "large-magnitude",
    "anti-aligned",
    "degenerate",
    "long",
)
HEAD_SIZES = (16, 32, 64, 128)  # production head sizes, drawn with weight when the domain reaches them

# Hypothesis's ``explain`` phase traces every line the shrunk failure runs (sys.settrace) to report
# which branches it took: on an mpmath escalation that is a 10-100x slowdown and the report says nothing a
# Finding does not; gramcheck runs every other phase.
PHASES = (Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink)

# Hypothesis settings profiles. ``ci``: 25 examples; ``thorough``: 400. Both are seeded, not derandomised:
# gramcheck's search applies ``@seed(seed)``, so the examples are a function of the seed (derandomize=True
# would take the seed from the test function's source and ignore ``seed``); no example database (the same
# seed gives the same examples on every machine); no deadline (a target's first call may compile).
PROFILES: dict[str, settings] = {
    "ci": settings(
        max_examples=25,
        phases=PHASES,
        derandomize=False,
        database=None,
        deadline=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    ),
    "thorough": settings(
        max_examples=400,
        phases=PHASES,
        derandomize=False,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    ),
}
for _name, _s in PROFILES.items():
    settings.register_profile(f"gramcheck-{_name}", _s)


def profile(name: str) -> settings:
    """The settings of profile ``name`` ('ci' or 'thorough')."""
    return PROFILES[check_choice("profile", name, tuple(PROFILES))]


@dataclass
class AttentionInputs:
    """One drawn input: q, k (B, H, N, d_k), v (B, H, N, d_v) as float64 holding ``dtype`` values, the
    variant's extra inputs, the kind that made it and what that kind promised (``meta``)."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    extras: dict[str, Any] = field(default_factory=dict)
    kind: str = "gaussian"
    dtype: str = "float64"
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return tuple(self.q.shape)  # type: ignore[return-value]

    def __repr__(self) -> str:  # compact: Hypothesis prints it for every falsifying example
        meta = {k: v for k, v in self.meta.items() if not isinstance(v, list)}
        return f"AttentionInputs(kind={self.kind!r}, dtype={self.dtype!r}, shape={self.shape}, meta={meta})"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # Hypothesis's printer: the compact form too
        p.text(repr(self))

    def summary(self) -> dict[str, Any]:
        """A JSON-friendly description (for counterexamples): kind, shapes, meta, input norms."""
        return {
            "kind": self.kind,
            "dtype": self.dtype,
            "shape": list(self.q.shape),
            "d_v": int(self.v.shape[-1]),
            "meta": {k: (float(v) if isinstance(v, (float, np.floating)) else v) for k, v in self.meta.items()},
            "max_abs": {n: float(np.max(np.abs(x))) for n, x in (("q", self.q), ("k", self.k), ("v", self.v))},
        }


# --------------------------------------------------------------------------------------------------
# building blocks: NumPy constructions from drawn parameters (written once, used by the strategies)
# --------------------------------------------------------------------------------------------------
def haar_orthogonal(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    """n x k matrix with orthonormal columns, Haar distributed (sign-corrected QR of a Gaussian)."""
    qf, rf = np.linalg.qr(rng.standard_normal((n, k)))
    return qf * np.sign(np.where(np.diag(rf) == 0, 1.0, np.diag(rf)))


def with_spectrum(rng: np.random.Generator, n: int, d: int, singular_values: np.ndarray) -> np.ndarray:
    """U diag(s) W^T (n x d) with Haar U (n x r), W (d x r), r = len(s) <= min(n, d)."""
    r = len(singular_values)
    return (haar_orthogonal(rng, n, r) * singular_values) @ haar_orthogonal(rng, d, r).T


def log_spaced(cond: float, r: int) -> np.ndarray:
    """r singular values from 1 down to 1/cond, log-spaced (exactly 1 and 1/cond at the ends)."""
    if r == 1:
        return np.ones(1)
    return np.power(10.0, -np.linspace(0.0, math.log10(cond), r))


# --------------------------------------------------------------------------------------------------
# strategies
# --------------------------------------------------------------------------------------------------
_SEEDS = st.integers(min_value=0, max_value=2**32 - 1)


def _value_dim(draw: Any, kind: str, max_d: int, heads: Sequence[int]) -> int:
    """d_v drawn on its own: 1, 2 or max_d for the degenerate kind, else in [1, max_d], at a head size half the
    time."""
    if kind == "degenerate":
        return int(draw(st.sampled_from(sorted({1, min(2, max_d), max_d}))))
    dv_int = st.integers(1, max_d)
    return int(draw(st.one_of(dv_int, st.sampled_from(list(heads))) if heads else dv_int))


@st.composite
def _qkv(draw: Any, kind: str, B: int, H: int, N: int, d: int, dv: int, dtype: str) -> tuple[Any, ...]:
    """(q, k, v, meta) of one kind, before rounding to the dtype."""
    rng = np.random.default_rng(draw(_SEEDS))
    shape, vshape = (B, H, N, d), (B, H, N, dv)
    g = rng.standard_normal
    meta: dict[str, Any] = {}
    if kind == "gaussian":
        return g(shape), g(shape), g(vshape), meta
    if kind == "spectrum":
        # rounding to the dtype moves singular values by up to u |Q|_F <= u sqrt(r) (s_1 = 1): cap the
        # condition number where that stays within 10% of the smallest one
        r = min(N, d)
        c_max = min(12.0, math.log10(0.1 / (unit_roundoff(dtype) * math.sqrt(r))))
        cond = 10.0 ** draw(st.floats(0.0, max(c_max, 0.0))) if r > 1 else 1.0  # one value: cond 1
        s = log_spaced(cond, r)
        q, k = (np.stack([[with_spectrum(rng, N, d, s) for _ in range(H)] for _ in range(B)]) for _ in range(2))
        meta.update(cond=cond, rank=r)
        return q, k, g(vshape), meta
    if kind == "low-rank":
        # integer factors with entries in {-1, 0, 1}: products are small integers, exact in every dtype,
        # so the rank survives rounding
        r = draw(st.integers(1, min(N, d) - 1))
        q, k = (
            (rng.integers(-1, 2, (B, H, N, r)) @ rng.integers(-1, 2, (B, H, r, d))).astype(np.float64) for _ in range(2)
        )
        meta.update(rank=r)
        return q, k, g(vshape), meta
    if kind == "near-duplicate":
        frac = draw(st.floats(0.0, 1.0))
        delta = 10.0 ** draw(st.floats(-8.0, 0.0))
        k = g(shape)
        n_dup = int(round(frac * (N - 1)))
        idx = rng.choice(np.arange(1, N), size=n_dup, replace=False) if n_dup else np.zeros(0, dtype=int)
        noise = g((B, H, n_dup, d))
        noise *= delta / np.maximum(np.linalg.norm(noise, axis=-1, keepdims=True), 1e-300)
        k[:, :, idx] = k[:, :, :1] + noise
        meta.update(fraction=frac, delta=delta, duplicates=idx.tolist(), anchor=0)
        return g(shape), k, g(vshape), meta
    if kind == "outliers":
        scale = 10.0 ** draw(st.floats(1.0, 3.0))
        n_out = draw(st.integers(1, max(1, N // 4)))
        q, k, v = g(shape), g(shape), g(vshape)
        idx = rng.choice(N, size=n_out, replace=False)
        for x in (q, k, v):
            med = np.median(np.delete(np.linalg.norm(x, axis=-1), idx, axis=-1)) if n_out < N else 1.0
            row = x[:, :, idx]
            x[:, :, idx] = row / np.linalg.norm(row, axis=-1, keepdims=True) * scale * med
        meta.update(scale=scale, outliers=sorted(idx.tolist()))
        return q, k, v, meta
    if kind == "heavy-tail":
        nu = draw(st.floats(1.0, 4.0))
        spread = draw(st.floats(0.0, 3.0))  # log10 of the largest / smallest scale
        head = 10.0 ** rng.uniform(0, spread, (1, H, 1, 1))
        chan = 10.0 ** rng.uniform(0, spread, (1, 1, 1, d))
        q, k = (rng.standard_t(nu, shape) * head * chan for _ in range(2))
        meta.update(nu=nu, spread=10.0**spread)
        return q, k, rng.standard_t(nu, vshape), meta
    if kind == "overflow":
        # |q|^2 / sqrt(d) (the softmax logit of q with itself) and |x|^2 past the exponent range
        excess = draw(st.floats(1.25, 4.0))  # 25% past the edge, so rounding cannot undo it
        R = math.sqrt(excess * math.log(max_finite(dtype)) * math.sqrt(d))
        q, k = g(shape), g(shape)
        q, k = (x / np.linalg.norm(x, axis=-1, keepdims=True) * R for x in (q, k))
        meta.update(norm=R, excess=excess)
        return q, k, g(vshape), meta
    if kind == "large-magnitude":
        scale = 10.0 ** draw(st.floats(1.25, 1.4))
        q, k = g(shape) * scale, g(shape) * scale
        for x in (q, k):
            neg = rng.random(N) < draw(st.floats(0.0, 1.0))
            neg[rng.integers(N)] = True  # at least one such row in q and in k
            x[:, :, neg] = -(scale + np.abs(x[:, :, neg]))  # every entry of these rows below -scale < -17
        q, k = (np.clip(x, -60.0, 60.0) for x in (q, k))
        meta.update(scale=scale)
        return q, k, g(vshape), meta
    if kind == "anti-aligned":
        c = 10.0 ** draw(st.floats(0.0, 1.5))
        noise = 10.0 ** draw(st.floats(-6.0, -1.0))
        q = g(shape) * draw(st.floats(1.0, 4.0))
        z = g(shape)
        # noise of norm noise * c |q_j| per token: the angle to -q_j stays below asin(noise) <= asin(0.1)
        size = noise * c * np.linalg.norm(q, axis=-1, keepdims=True)
        z *= size / np.maximum(np.linalg.norm(z, axis=-1, keepdims=True), 1e-300)
        k = -c * q + z
        meta.update(factor=c, noise=noise)
        return q, k, g(vshape), meta
    if kind == "degenerate":
        q, k, v = g(shape), g(shape), g(vshape)
        zq = rng.random(N) < draw(st.floats(0.0, 1.0))
        zk = rng.random(N) < draw(st.floats(0.0, 1.0))
        q[:, :, zq] = 0.0
        k[:, :, zk] = 0.0
        meta.update(zero_q=np.flatnonzero(zq).tolist(), zero_k=np.flatnonzero(zk).tolist())
        return q, k, v, meta
    if kind == "long":
        return g(shape), g(shape), g(vshape), meta
    raise ValueError(f"kinds: got {kind!r}; expected one of {KINDS}")


@st.composite
def attention_inputs(
    draw: Any,
    variant: Any = None,
    *,
    dtype: Any = "float64",
    kinds: Sequence[str] | None = None,
    max_n: int = 64,
    max_d: int = 16,
    max_b: int = 1,
    max_h: int = 2,
    m: int | None = None,
    gate: str | None = None,
    min_n: int = 1,
    min_d: int = 1,
    chunks: Sequence[int] = (),
    budget: int | None = None,
    gate_regimes: Sequence[str] | None = None,
    head_sizes: Sequence[int] = (),
    value_dims: str = "same",
) -> AttentionInputs:
    """Adversarial inputs for ``variant`` (a name, a Variant or None for plain q, k, v): one of
    ``kinds`` (default all) with sizes B <= max_b, H <= max_h, N <= max_n, d <= max_d, rounded to
    ``dtype``. N is drawn at the boundaries of ``chunks`` (c - 1, c, c + 1, 2c - 1, 2c, 2c + 1) half
    the time, d at the ``head_sizes`` within range half the time, and B * H * N * d is kept
    within ``budget`` (d reduced first, then N, not below min_d / min_n). ``value_dims`` 'same': d_v = d;
    'any': d_v drawn on its own in [1, max_d] as d is (at the head sizes half the time), within the budget
    (shrinking toward 1). Extras: each of the variant's
    extra inputs drawn by its spec (``gate`` fixes the regime of the inputs that know it, ``gate_regimes``
    limits the choice; a random matrix has m = 2 d rows by default). Shrinks toward B = H = 1,
    N = d = 1 and the simplest parameters of the kind."""
    from . import variants as _variants

    dt = dtype_name(dtype)
    kinds = KINDS if kinds is None else check_names("kinds", kinds, KINDS)
    if not 1 <= min_n <= max_n or not 1 <= min_d <= max_d:
        raise ValueError(
            f"max_n, max_d: got N in [{min_n}, {max_n}], d in [{min_d}, {max_d}]; expected 1 <= min <= max"
        )
    var = None if variant is None else _variants.get(variant)
    kind = draw(st.sampled_from(kinds))
    B = draw(st.integers(1, max(1, max_b)))
    H = draw(st.integers(1, max(1, max_h)))
    boundaries = sorted({m + o for c in chunks for m in (c, 2 * c) for o in (-1, 0, 1) if min_n <= m + o <= max_n})
    heads = [h for h in head_sizes if min_d <= h <= max_d]
    if kind == "long":
        N = draw(st.integers(max(min_n, max_n // 2), max_n))
        d = draw(st.integers(min_d, max(min_d, min(max_d, 4))))
    elif kind == "degenerate":
        N = draw(st.sampled_from(sorted({max(min_n, x) for x in (1, 2, max_n)})))
        d = draw(st.sampled_from(sorted({max(min_d, x) for x in (1, 2, max_d)})))
    else:
        n_int = st.integers(min_n, max_n)
        N = draw(st.one_of(n_int, st.sampled_from(boundaries)) if boundaries else n_int)
        d_int = st.integers(min_d, max_d)
        d = draw(st.one_of(d_int, st.sampled_from(heads)) if heads else d_int)
    if budget is not None and B * H * N * d > budget:
        d = max(min_d, min(d, budget // (B * H * N)))
        if B * H * N * d > budget:
            N = max(min_n, budget // (B * H * d))
    if kind in ("near-duplicate", "low-rank"):
        N = max(N, 2)
    if kind == "low-rank":
        d = max(d, 2)
    dv = d if check_choice("value_dims", value_dims, VALUE_DIMS) == "same" else _value_dim(draw, kind, max_d, heads)
    if budget is not None and B * H * N * dv > budget:
        dv = max(1, min(dv, budget // (B * H * N)))
    q, k, v, meta = draw(_qkv(kind, B, H, N, d, dv, dt))
    extras: dict[str, np.ndarray] = {}
    dims = {"B": B, "H": H, "N": N, "dk": d, "dv": dv, "m": 2 * d if m is None else m}
    regimes: dict[str, str] = {}
    for spec in var.inputs if var is not None else ():
        known = spec.regimes + spec.on_request
        allowed = tuple(r for r in known if gate_regimes and r in gate_regimes) or spec.regimes
        regimes[spec.name] = gate if gate in spec.regimes else draw(st.sampled_from(allowed))
        extras.update(draw_extras((spec,), dims, dtype=dt, seed=draw(_SEEDS), regimes=regimes))
    if regimes:
        meta["regimes"] = regimes
    big = max_finite(dt)  # heavy tails can leave float16's range: keep every input finite
    q, k, v = (np.clip(round_to(np.clip(x, -big, big), dt), -big, big) for x in (q, k, v))
    return AttentionInputs(q, k, v, extras, kind, dt, meta)


def sample(strategy: Any, seed: int = 0, index: int = 5) -> Any:
    """A deterministic draw from ``strategy``: the ``index``-th example Hypothesis generates under
    ``seed`` (for diagnostics outside a search, e.g. ``gramcheck spectrum``)."""
    from hypothesis import Phase, given
    from hypothesis import seed as hseed

    out: list[Any] = []

    @hseed(seed)
    @settings(
        max_examples=index + 1,
        database=None,
        derandomize=False,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        deadline=None,
    )
    @given(strategy)
    def collect(x: Any) -> None:
        out.append(x)

    collect()
    return out[-1]
