"""gramcheck.strategies: each kind produces what it promises; shrinking ends at a small input."""

import math

import numpy as np
import pytest
import torch
from hypothesis import find, given, target
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from gramcheck import strategies as S
from gramcheck import variants as V
from gramcheck.precision import max_finite, round_to, unit_roundoff

MANY = hsettings(S.profile("ci"), max_examples=40)


def inputs(kind, dtype="float64", variant=None, **kw):
    return S.attention_inputs(variant, dtype=dtype, kinds=[kind], **kw)


def _slices(x):
    B, H = x.shape[:2]
    return [x[b, h] for b in range(B) for h in range(H)]


@MANY
@given(st.data())
def test_representable_finite_and_shaped(data):
    dtype = data.draw(st.sampled_from(["float64", "float32", "bfloat16", "float16"]))
    name = data.draw(st.sampled_from(["gla", "performer-positive", "softmax"]))
    ex = data.draw(S.attention_inputs(name, dtype=dtype, max_n=20, max_d=6))
    B, H, N, d = ex.q.shape
    assert ex.k.shape == ex.q.shape and ex.v.shape[:3] == (B, H, N)
    assert 1 <= N <= 20 and 1 <= d <= 6 or ex.kind in ("near-duplicate", "low-rank")
    for x in (ex.q, ex.k, ex.v, *ex.extras.values()):
        assert np.all(np.isfinite(x))
        np.testing.assert_array_equal(round_to(x, dtype), x)  # exactly representable
        t = torch.as_tensor(x).to(getattr(torch, dtype)).double().numpy()
        np.testing.assert_array_equal(t, x)  # and torch receives exactly these values
    if "g" in ex.extras:
        assert np.all(ex.extras["g"] <= 0)
    V.get(name).reference(ex.q, ex.k, ex.v, causal=True, **ex.extras)  # valid input for the variant


@MANY
@given(st.data())
def test_spectrum_kind_has_the_drawn_condition_number(data):
    dtype = data.draw(st.sampled_from(["float64", "float32", "float16"]))
    ex = data.draw(inputs("spectrum", dtype, max_n=24, max_d=8))
    cond = ex.meta["cond"]
    assert cond <= 0.1 / (unit_roundoff(dtype) * math.sqrt(min(ex.q.shape[-2:]))) * 1.0001 or cond == 1.0
    for x in (ex.q, ex.k):
        for a in _slices(x):
            s = np.linalg.svd(a, compute_uv=False)
            assert s[0] / s[-1] == pytest.approx(cond, rel=0.25)


@MANY
@given(st.data())
def test_low_rank_kind_is_exactly_low_rank_in_every_dtype(data):
    dtype = data.draw(st.sampled_from(["float64", "bfloat16", "float16"]))
    ex = data.draw(inputs("low-rank", dtype, max_n=24, max_d=8))
    r = ex.meta["rank"]
    assert r < ex.q.shape[-1]
    for a in _slices(ex.q) + _slices(ex.k):
        assert np.linalg.matrix_rank(a) <= r


@MANY
@given(st.data())
def test_near_duplicate_keys_are_within_the_drawn_distance(data):
    dtype = data.draw(st.sampled_from(["float64", "float32"]))
    ex = data.draw(inputs("near-duplicate", dtype, max_n=32, max_d=8))
    k, dup = ex.k, ex.meta["duplicates"]
    assert len(dup) == round(ex.meta["fraction"] * (k.shape[-2] - 1))
    if dup:
        dist = np.linalg.norm(k[:, :, dup] - k[:, :, :1], axis=-1)
        slack = 4 * unit_roundoff(dtype) * np.max(np.abs(k)) * math.sqrt(k.shape[-1])  # the rounding of both
        assert np.all(dist <= ex.meta["delta"] + slack)


@MANY
@given(st.data())
def test_outlier_tokens_have_the_drawn_norm_ratio(data):
    ex = data.draw(inputs("outliers", "float32", max_n=32, max_d=8))
    idx = ex.meta["outliers"]
    for x in (ex.q, ex.k, ex.v):
        norms = np.linalg.norm(x, axis=-1)
        rest = np.delete(norms, idx, axis=-1)
        if rest.size:
            # every outlier row sits at scale x the median norm of the other rows, up to float32 rounding
            np.testing.assert_allclose(norms[:, :, idx], ex.meta["scale"] * np.median(rest), rtol=1e-5)


@MANY
@given(st.data())
def test_overflow_kind_overflows_exp_in_its_dtype(data):
    dtype = data.draw(st.sampled_from(["float16", "float32"]))
    ex = data.draw(inputs("overflow", dtype, max_n=8, max_d=8))
    d = ex.q.shape[-1]
    logits = np.einsum("bhnd,bhnd->bhn", ex.q, ex.q) / math.sqrt(d)  # q_i . q_i / sqrt(d)
    assert np.all(logits > math.log(max_finite(dtype)) * 0.99)
    qt = torch.as_tensor(ex.q).to(getattr(torch, dtype))
    assert not torch.isfinite(torch.exp((qt * qt).sum(-1) / math.sqrt(d))).all()


@MANY
@given(st.data())
def test_anti_aligned_and_heavy_tail_and_degenerate(data):
    ex = data.draw(inputs("anti-aligned", max_n=16, max_d=6))
    cos = np.einsum("bhnd,bhnd->bhn", ex.q, ex.k) / (np.linalg.norm(ex.q, axis=-1) * np.linalg.norm(ex.k, axis=-1))
    assert np.all(cos < -0.99), cos  # the noise is at most 0.1 of c |q_j|: an angle below asin(0.1)
    ht = data.draw(inputs("heavy-tail", max_n=16, max_d=6))
    assert 1.0 <= ht.meta["nu"] <= 4.0
    dg = data.draw(inputs("degenerate", max_n=16, max_d=6))
    assert dg.q.shape[-2] in (1, 2, 16) and dg.q.shape[-1] in (1, 2, 6)
    for z in dg.meta["zero_q"]:
        assert not dg.q[:, :, z].any()


def test_heavy_tail_kind_has_heavy_tails():
    """Over many draws, nu <= 2 gives kurtosis far beyond a Gaussian's (3)."""
    ex = find(inputs("heavy-tail", max_n=64, max_d=16), lambda e: e.meta["nu"] <= 1.5 and e.q.size >= 512)
    x = ex.q.ravel() / np.std(ex.q)
    assert np.mean(x**4) > 6


@MANY
@given(st.data())
def test_gates_promise_their_memory(data):
    ex = data.draw(S.attention_inputs("gla", kinds=["gaussian"], max_n=16, max_d=6))
    alpha = np.exp(ex.extras["g"])
    regime = ex.meta["regimes"]["g"]
    if regime == "long-memory":
        assert np.all(alpha >= 0.99)
    elif regime == "short-memory":
        assert np.all(alpha <= 0.05 + 1e-12)
    elif regime == "mixed":
        assert np.all(alpha[..., 0::2] >= 0.99) and np.all(alpha[..., 1::2] <= 0.05 + 1e-12)
    else:  # extreme: each decay is either long-memory or at most e^-20 (down to e^-100)
        assert regime == "extreme"
        strong = alpha <= np.exp(-20.0) * (1 + 1e-6)
        assert np.all(strong | (alpha >= 0.99)) and np.all(alpha >= np.exp(-100.0) * (1 - 1e-2))


def test_long_kind_reaches_the_size_budget():
    ex = find(inputs("long", max_n=512), lambda e: True)
    assert ex.q.shape[-2] >= 256


def test_shrinking_ends_at_a_small_input():
    """A planted failing property (fails when the condition number exceeds 1e3) shrinks to the
    smallest input that can fail it: 2 x 2 slices, B = H = 1, condition number just above 1e3."""
    ex = find(
        S.attention_inputs(max_n=64, max_d=16, max_h=4, kinds=["gaussian", "spectrum", "outliers"]),
        lambda e: e.kind == "spectrum" and e.meta["cond"] > 1e3,
        settings=hsettings(S.profile("ci"), max_examples=500),
    )
    assert ex.q.shape == (1, 1, 2, 2)
    assert 1e3 < ex.meta["cond"] <= 1e4  # Hypothesis shrinks floats toward simple values (10^4)


def test_shrinking_a_real_failure_relu_zero_denominator():
    """Planted failure on real mathematics: linear-relu's reference output is undefined (0/0) when a
    query has no positive overlap with any key. The shrunk example is tiny."""

    def undefined(e):
        out = V.get("linear-relu").reference(e.q, e.k, e.v)
        return not np.all(np.isfinite(out))

    ex = find(S.attention_inputs("linear-relu", max_n=32, max_d=8), undefined, settings=S.profile("ci"))
    assert ex.q.shape[-2] <= 2 and ex.q.shape[-1] <= 2


@hsettings(S.profile("ci"), max_examples=30)
@given(inputs("spectrum", max_n=16, max_d=6))
def test_usable_with_hypothesis_target(ex):
    target(math.log10(ex.meta["cond"]), label="log10 cond")
    assert ex.meta["cond"] >= 1.0


def test_profiles_and_bad_arguments():
    # seeded by the search (@seed), not derandomised: derandomize=True would ignore the seed
    assert not S.profile("ci").derandomize and S.profile("ci").database is None
    assert S.profile("thorough").max_examples > S.profile("ci").max_examples
    with pytest.raises(ValueError, match="^profile: got 'fast'"):
        S.profile("fast")
    with pytest.raises(ValueError, match="^kinds: got 'nope'"):
        find(inputs("nope"), lambda e: True)
    with pytest.raises(ValueError, match="^variant: got 'nope'"):
        find(S.attention_inputs("nope"), lambda e: True)
