"""Statistical checks of a FAVOR+ target's outputs over its own random draws (proofs/favor-output.md).

A target that draws its own random features (no ``projection`` keyword: ``Target.own_draws``) cannot be
compared with the reference on the same draw. Its outputs o are then checked as random variables: the
target is called R = ``DRAWS`` times on one input, each call a fresh draw of m = ``features`` iid N(0, I)
features, and with the exact output r, the bias bound beta and the second-moment bound mu of
``bounds.favor_output_moments``, at every entry e (P entries, false-alarm rate ``ALPHA`` per example,
Bonferroni over the entries):

* output-unbiased: |mean_R o_e - r_e| <= beta_e + t_e, t_e from Bernstein's inequality with
  Var o_e <= mu_e and |o_e - E o_e| <= hi_e - lo_e (the outputs lie in the hull of the values), L =
  ln(2P / alpha);
* output-mse: mean_R (o_e - r_e)^2 <= mu_e + t'_e, one-sided Bernstein with Var (o - r)^2 <= D_e^2 mu_e and
  width D_e^2, L = ln(P / alpha).

The rate is per evaluated input: a check evaluates at most ``max_examples`` inputs plus the
shrinker's, each with fresh draws (seeded by the input and the check's seed), so by the union bound its
false-alarm rate is at most alpha times the number of inputs evaluated (a few hundred at most: < 1e-3).

Power: an implementation whose mean is off by |E o_e - r_e| >= beta_e + 2 t_e at one entry fails
output-unbiased with probability >= 1 - alpha / P under the same variance premise; the Finding records the
smallest such offset relative to the value range (``detectable_offset``). A target that takes
``projection`` is given a fresh iid draw on every call, so both properties also apply to it (opt-in).
Queries and keys are rescaled so that every scaled row has |x| <= ``NORM_CAP`` (the estimator's variance
grows like exp(|x + y|^2); beyond that the test says nothing). A target that returns the same output on
two calls does not redraw: the draws cannot be averaged and the properties are skipped with that reason.
"""

from __future__ import annotations

import math
import zlib
from typing import Any

import numpy as np

from ..bounds import bernstein_deviation, favor_output_moments
from ..featuremaps import random_projection
from ..findings import Finding
from ..precision import unit_roundoff
from ..strategies import AttentionInputs
from ..targets import Target
from .base import guarded, ratio_finding

DRAWS = 512
ALPHA = 1e-6
NORM_CAP = 0.6
STATISTICAL = ("output-unbiased", "output-mse")


def applies(variant: Any, causal: bool, params: dict[str, Any]) -> bool:
    """Random features with positive weights (FAVOR+ positive and hyperbolic): outputs in the value hull."""
    tags = variant.tags(params)
    return "random-features" in tags and "row-normalisation" in tags


def unless(variant: Any, causal: bool, params: dict[str, Any]) -> str | None:
    if params.get("feature_eps") or params.get("eps"):
        return "an eps added to the features or the denominator biases the estimator: the bounds assume none"
    return None


def _capped(x: np.ndarray, root_scale: float) -> np.ndarray:
    """Rows rescaled (directions kept) so that |root_scale x| <= NORM_CAP."""
    norms = np.linalg.norm(x, axis=-1, keepdims=True) * root_scale
    return x * np.minimum(1.0, NORM_CAP / np.maximum(norms, 1e-300))


def _call_draw(target: Target, ts: dict[str, Any], causal: bool, r: int, m: int, seed: int) -> np.ndarray:
    """The target's output (float64) on the tensors ``ts`` with its r-th draw: its own, or, for a target
    taking the projection, a fresh iid one (m, d) seeded by ``seed`` + r."""
    spec = next(s for s in target.variant.inputs if s.size_param)
    d = ts["q"].shape[-1]
    extra = {} if spec.name in target.own_draws else target.tensors(
        {spec.name: random_projection(m, d, kind="iid", seed=seed + r)}
    )
    out = target.call_torch(ts["q"], ts["k"], ts["v"], causal=causal, draw=r, **extra)
    return out.detach().double().cpu().numpy()


def _redraws(target: Target, causal: bool, d: int, m: int) -> bool:
    """Whether two calls of the target on a fixed generic input (Gaussian, N = 4) give different outputs: an
    input can give equal outputs on every draw by itself (all keys 0), a target that does not redraw gives
    them on every input."""
    rng = np.random.default_rng(0)
    ts = target.tensors({n: rng.standard_normal((1, 1, 4, d)) * 0.5 for n in ("q", "k", "v")})
    first, second = (_call_draw(target, ts, causal, r, m, 0) for r in range(2))
    return not bool(np.array_equal(first, second))


def _draws(
    name: str, target: Target, ex: AttentionInputs, causal: bool
) -> tuple[np.ndarray, dict[str, Any]] | Finding | None:
    """R outputs (R, B, H, N, d_v) in float64 on the capped input, with what the bounds need; a skipped
    Finding when the target does not redraw; None (not an example) when this input alone gives one output
    whatever the draw, and the target redraws on a generic one."""
    var, params = target.variant, target.params
    spec = next(s for s in var.inputs if s.size_param)
    d = ex.q.shape[-1]
    root = math.sqrt(var.scale(params, d))
    ts = target.tensors({"q": _capped(ex.q, root), "k": _capped(ex.k, root), "v": ex.v})
    q, k, v = (ts[n].detach().double().cpu().numpy() for n in ("q", "k", "v"))
    own = spec.name in target.own_draws
    m = int(params[spec.size_param or ""]) if own else int(ex.extras[spec.name].shape[0])
    # fresh projections for a target taking them: a function of the whole input and the check's seed
    seed = zlib.crc32(b"".join(np.ascontiguousarray(x).tobytes() for x in (q, k, v)), target.draw_seed & 0xFFFFFFFF)
    moments = favor_output_moments(q * root, k * root, v, m, params["kind"], causal=causal)
    random = bool(np.any(moments["spread"] > 0))  # else every output is one value whatever the draw (n = 1)
    outs = []
    for r in range(DRAWS):
        outs.append(_call_draw(target, ts, causal, r, m, seed))
        if r == 1 and random and np.array_equal(outs[0], outs[1]):
            if _redraws(target, causal, d, m):
                return None
            return Finding.skip(
                name,
                f"{target.name} returned the same output on two calls: it does not redraw its {spec.name}, so "
                f"its draws cannot be averaged (give it a {spec.name!r} keyword to check it exactly)",
            )
    info = {"draws": DRAWS, "alpha": ALPHA, "features": m, "own_draw": own, "norm_cap": NORM_CAP,
            "premise": "iid N(0, I) features, a fresh draw per call (orthogonal features: not proved)"}  # fmt: skip
    return np.stack(outs), {**moments, "info": info, "n": q.shape[-2], "m": m, "u": unit_roundoff(target.dtype)}


def _rounding(mo: dict[str, Any]) -> np.ndarray:
    """A first-order allowance for the target's own rounding: each positive weight phi(q).phi(k_j) carries
    a relative error of at most (m + 8) u (its exponentials and its m-term sum), the sums over n keys
    n u more, which moves the normalised mean o by at most 2 (m + n + 8) u (hi - lo); forming the weighted
    sum and the quotient adds 2 (n + 2) u max(|lo|, |hi|). A small fraction of the statistical tolerance
    in float32; in bfloat16 with many features it can exceed the value range, and the test then says
    little (``detectable_offset``)."""
    relative = 2.0 * (mo["m"] + mo["n"] + 8) * mo["u"] * (mo["hi"] - mo["lo"])
    return relative + 2.0 * (mo["n"] + 2) * mo["u"] * np.maximum(np.abs(mo["lo"]), np.abs(mo["hi"]))


def _unbiased(o: np.ndarray, mo: dict[str, Any], P: int) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """|mean_R o - r| against bias + t (module docstring), with the smallest offset detected over the
    entries that vary with the draw (None where none does: a causal first row is v whatever the draw)."""
    width = mo["hi"] - mo["lo"]
    t = bernstein_deviation(mo["mse"], width, DRAWS, math.log(2 * P / ALPHA))
    varies = width > 0
    offset = (mo["bias"] + 2 * t)[varies] / width[varies]
    err = np.abs(o.mean(axis=0) - mo["exact"])
    return err, mo["bias"] + t + _rounding(mo), {"detectable_offset": float(np.max(offset)) if offset.size else None}


def _mse(o: np.ndarray, mo: dict[str, Any], P: int) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """mean_R (o - r)^2 against mu + t' (module docstring)."""
    slack = _rounding(mo)
    spread = mo["spread"] + slack
    t = bernstein_deviation(spread**2 * mo["mse"], spread**2, DRAWS, math.log(P / ALPHA))
    return np.mean((o - mo["exact"]) ** 2, axis=0), mo["mse"] + t + 2 * slack * spread, {}


def _statistical(name: str, judge: Any) -> Any:
    """The property ``name``: R draws on the input, judged entrywise by ``judge(o, moments, P)``."""

    @guarded(name)
    def prop(target: Target, ex: AttentionInputs, *, causal: bool) -> Finding | None:
        got = _draws(name, target, ex, causal)
        if got is None or isinstance(got, Finding):
            return got
        o, mo = got
        err, bound, extra = judge(o, mo, o[0].size)
        return ratio_finding(name, err, bound, ex, rigour="statistical", **mo["info"], **extra)

    prop.__doc__ = judge.__doc__
    return prop


output_unbiased = _statistical("output-unbiased", _unbiased)
output_mse = _statistical("output-mse", _mse)
