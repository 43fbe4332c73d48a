"""The oracle certifies float64 when it can and escalates to mpmath when it cannot."""

import numpy as np
import pytest
from helpers import make_inputs

from gramcheck import variants as V
from gramcheck.arith import MP
from gramcheck.featuremaps import random_projection
from gramcheck.oracle import escalation_arith, truth


@pytest.fixture(params=["mpmath", "arb"])
def backend(request, monkeypatch):
    """The oracle's escalation arithmetic: ball-mpmath, or Arb (python-flint) where installed."""
    from gramcheck.arb_arith import available

    if request.param == "arb" and not available():
        pytest.skip("python-flint not installed")
    monkeypatch.setenv("GRAMCHECK_ORACLE", request.param)
    return request.param


def _distance(value, exact_mp):
    """|value - exact| for an mpmath array exact_mp, computed in mpmath and rounded up to float64 (the
    exact value itself is not representable: comparing with its float64 rounding would be off by up to
    half an ulp)."""
    with MP(300).context():
        d = MP(300).to_float64(np.abs(np.asarray(exact_mp, dtype=object) - MP(300).asarray(value)))
    return d * (1 + 2.0**-50)


def test_float64_suffices_on_a_benign_input():
    q, k, v, _ = make_inputs("softmax", N=16)
    t = truth("softmax", q, k, v, digits=8)
    assert t.arithmetic == "float64-coarse" and t.met and not t.escalated
    exact = MP(300).to_float64(V.get("softmax").reference(q, k, v, arith=MP(300)))
    assert np.all(np.abs(t.value - exact) <= t.bound)


def test_cancellation_forces_mpmath_and_the_bound_holds(backend):
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, 8, 4)) for _ in range(3))
    k[..., 1::2, :] = k[..., 0::2, :] * (1 + 1e-11)  # near-duplicate keys ...
    v[..., 1::2, :] = -v[..., 0::2, :]  # ... with opposite values: the output nearly cancels
    f64 = V.get("linear-unnormalised").reference(q, k, v, feature="identity")
    exact_mp = V.get("linear-unnormalised").reference(q, k, v, feature="identity", arith=MP(400))
    exact = MP(400).to_float64(exact_mp)
    assert np.max(np.abs(f64 - exact) / np.abs(exact)) > 1e-6  # float64 really loses digits here
    t = truth("linear-unnormalised", q, k, v, feature="identity", digits=10)
    assert t.escalated and t.met and t.prec > 53
    assert np.all(_distance(t.value, exact_mp) <= t.bound)
    assert np.all(t.bound <= 1e-10 * np.abs(exact) * 1.0001 + 2**-52 * np.abs(exact))


def test_exp_overflow_forces_mpmath(backend):
    """Unstabilised trig features overflow exp(|x|^2/2) in float64; mpmath has no overflow."""
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, 1, 8, 4)) for _ in range(3))
    k = k / np.linalg.norm(k, axis=-1, keepdims=True) * 60 * 4**0.25
    w = random_projection(16, 4, seed=0)
    assert np.isnan(V.get("performer-trig").reference(q, k, v, projection=w, stabilize=False)).all()
    t = truth("performer-trig", q, k, v, projection=w, stabilize=False, digits=10)
    assert t.escalated and t.met
    exact_mp = V.get("performer-trig").reference(q, k, v, projection=w, stabilize=False, arith=MP(800))
    assert np.all(_distance(t.value, exact_mp) <= t.bound)


def test_undefined_output_is_reported_not_invented(backend):
    """relu features with a query of all-negative entries: 0/0 in exact arithmetic."""
    q, k, v, _ = make_inputs("linear-relu", N=6, d=3)
    q[0, 0, 2, :] = -1.0
    t = truth("linear-relu", q, k, v, digits=8)
    assert t.undefined[0, 0, 2].all() and t.tried[-1] == escalation_arith(t.prec).name
    assert np.isfinite(t.value[~t.undefined]).all() and (~t.undefined).sum() > t.undefined.sum()


def _cancelling(causal, B=3, H=2, N=24, d=4):
    """Batch item 1 cancels: causal, its first four tokens (rows 1 and 3 fall short); non-causal, all."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((B, H, N, d)) for _ in range(3))
    pairs = slice(1, 4, 2) if causal else slice(1, None, 2)
    firsts = slice(0, 3, 2) if causal else slice(0, None, 2)
    k[1, :, pairs] = k[1, :, firsts] * (1 + 1e-11)
    v[1, :, pairs] = -v[1, :, firsts]
    return q, k, v


@pytest.mark.parametrize("causal", [True, False])
def test_row_escalation_gives_the_same_truth_as_whole_tensor_escalation(causal, monkeypatch, backend):
    import gramcheck.oracle as oracle

    var = V.get("linear-unnormalised")
    q, k, v = _cancelling(causal)
    shapes = []
    real = oracle._escalation_slice
    monkeypatch.setattr(oracle, "_escalation_slice", lambda *a, **kw: shapes.append(r := real(*a, **kw)) or r)
    rows = truth(var, q, k, v, causal=causal, feature="identity", digits=10)
    whole = truth(var, q, k, v, causal=causal, feature="identity", digits=10, rows=False)
    sub_q = shapes[0][1][0]
    assert sub_q.shape == ((1, 2, 4, 4) if causal else (1, 2, 24, 4))  # batch item 1; causal: 4 tokens
    exact_mp = var.reference(q, k, v, causal=causal, feature="identity", arith=MP(300))
    exact = MP(300).to_float64(exact_mp)
    for t in (rows, whole):
        assert t.escalated and t.met and t.arithmetic == escalation_arith(t.prec).name
        assert np.all(_distance(t.value, exact_mp) <= t.bound)
    assert rows.prec == whole.prec
    region = (1, slice(None), slice(0, 4) if causal else slice(None))
    np.testing.assert_array_equal(rows.value[region], whole.value[region])
    assert np.all(rows.bound <= 1e-10 * np.abs(exact) * 1.0001 + 2**-52 * np.abs(exact))


def test_causal_rounding_variants_are_not_cut_to_a_prefix():
    """Performer's exact causality rests on its stabiliser cancelling (not with feature_eps > 0): only
    batch items are sliced for it."""
    from gramcheck.oracle import _escalation_slice

    q, k, v, extras = make_inputs("performer-positive", B=2, N=8, d=4)
    need = np.zeros((2, 2, 8, 4), dtype=bool)
    need[1, 0, 2] = True
    idx, (qs, *_rest) = _escalation_slice(V.get("performer-positive"), need, (q, k, v), causal=True, kwargs=extras)
    assert qs.shape == (1, 2, 8, 4) and list(idx[0]) == [1]
    idx, (qs, _, _, kw) = _escalation_slice(
        V.get("gla"), need, (q, k, v), causal=True, kwargs={"g": -np.ones((2, 2, 8, 4))}
    )
    assert qs.shape == (1, 2, 3, 4) and kw["g"].shape == (1, 2, 3, 4)


def test_precision_comes_from_the_shortfall_not_doubling(backend):
    from gramcheck.arith import BALL_F64
    from gramcheck.oracle import GUARD_BITS

    var = V.get("linear-unnormalised")
    q, k, v = _cancelling(True)
    t = truth(var, q, k, v, causal=True, feature="identity", digits=10)
    ball = var.reference(q, k, v, causal=True, feature="identity", arith=BALL_F64)
    value, bound = BALL_F64.to_float64(ball), BALL_F64.radius(ball)
    short = np.log2(bound / (1e-10 * np.abs(value)))
    assert t.tried == ["float64-coarse", "float64", escalation_arith(t.prec).name]  # met at the first precision tried
    assert t.prec == 53 + int(np.ceil(short.max())) + GUARD_BITS < 2 * 53


@pytest.mark.parametrize("prec", [None, 80])
def test_exact_operand_fast_path_gives_identical_radii(prec, monkeypatch):
    from gramcheck.arith import BALL_F64, Ball, BallArith, BallMP

    ar = BALL_F64 if prec is None else BallMP(prec)
    rng = np.random.default_rng(3)
    with ar.context():
        exact_a = ar.asarray(rng.standard_normal((2, 5, 7)))
        exact_b = ar.asarray(rng.standard_normal((2, 7, 3)))
        fuzzy_a = ar.exp(exact_a) * ar.asarray(rng.standard_normal((2, 5, 7)))
        fuzzy_b = ar.exp(exact_b) - 1.5
        cases = [(exact_a, exact_b), (exact_a, fuzzy_b), (fuzzy_a, exact_b), (fuzzy_a, fuzzy_b)]

        exact_c = ar.asarray(rng.standard_normal((2, 5, 7)))
        products = [(exact_a, exact_c), (exact_a, fuzzy_a), (fuzzy_a, exact_c), (fuzzy_a, fuzzy_a)]

        def radii(unflag):
            out = [ar.matmul(a, b).rad for a, b in cases]
            out += [ar.sum(x, axis=-1).rad for x in (exact_a, fuzzy_a)]
            out += [ar.cumsum(x, axis=-2).rad for x in (exact_a, fuzzy_a)]
            out += [(unflag(a) * unflag(b)).rad for a, b in products]  # elementwise: by the exact flag
            return out

        fast = radii(lambda x: x)
        monkeypatch.setattr(BallArith, "_exact", staticmethod(lambda x: False))
        general = radii(lambda x: Ball(ar, x.mid, x.rad))
    for f, g in zip(fast, general, strict=True):
        assert np.shape(f) == np.shape(g)
        assert all(x == y for x, y in zip(np.ravel(f), np.ravel(g), strict=True))  # bit for bit (mpf compares exactly)


def test_the_truth_of_a_final_state_is_asked_of_state_truth():
    """``truth`` certifies the output; asked for (out, S_N) it says where the state's truth is, rather than
    failing on a pair inside the coarse pass."""
    from gramcheck.oracle import truth_given

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, 5, 3)) for _ in range(3))
    with pytest.raises(ValueError, match="^output_final_state: got True; .*state_truth"):
        truth("retnet", q, k, v, causal=True, output_final_state=True)
    with pytest.raises(ValueError, match="^output_final_state: got True"):
        truth_given("retnet", q, k, v, (np.zeros((1, 1, 5, 3)),) * 2, causal=True, output_final_state=True)
    assert truth("retnet", q, k, v, causal=True, output_final_state=False).met
