"""The oracle certifies float64 when it can and escalates to mpmath when it cannot."""

import numpy as np
from helpers import make_inputs

from gramcheck import variants as V
from gramcheck.arith import MP
from gramcheck.featuremaps import random_projection
from gramcheck.oracle import truth


def test_float64_suffices_on_a_benign_input():
    q, k, v, _ = make_inputs("softmax", N=16)
    t = truth("softmax", q, k, v, digits=8)
    assert t.arithmetic == "float64" and t.met and not t.escalated
    exact = MP(300).to_float64(V.get("softmax").reference(q, k, v, arith=MP(300)))
    assert np.all(np.abs(t.value - exact) <= t.bound)


def test_cancellation_forces_mpmath_and_the_bound_holds():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, 8, 4)) for _ in range(3))
    k[..., 1::2, :] = k[..., 0::2, :] * (1 + 1e-11)  # near-duplicate keys ...
    v[..., 1::2, :] = -v[..., 0::2, :]  # ... with opposite values: the output nearly cancels
    f64 = V.get("linear-unnormalised").reference(q, k, v, feature="identity")
    exact = MP(400).to_float64(V.get("linear-unnormalised").reference(q, k, v, feature="identity", arith=MP(400)))
    assert np.max(np.abs(f64 - exact) / np.abs(exact)) > 1e-6  # float64 really loses digits here
    t = truth("linear-unnormalised", q, k, v, feature="identity", digits=10)
    assert t.escalated and t.met and t.prec > 53
    assert np.all(np.abs(t.value - exact) <= t.bound)
    assert np.all(t.bound <= 1e-10 * np.abs(exact) * 1.0001 + 2**-52 * np.abs(exact))


def test_exp_overflow_forces_mpmath():
    """Unstabilised trig features overflow exp(|x|^2/2) in float64; mpmath has no overflow."""
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, 1, 8, 4)) for _ in range(3))
    k = k / np.linalg.norm(k, axis=-1, keepdims=True) * 60 * 4**0.25
    w = random_projection(16, 4, seed=0)
    assert np.isnan(V.get("performer-trig").reference(q, k, v, projection=w, stabilize=False)).all()
    t = truth("performer-trig", q, k, v, projection=w, stabilize=False, digits=10)
    assert t.escalated and t.met
    exact = MP(800).to_float64(V.get("performer-trig").reference(q, k, v, projection=w, stabilize=False, arith=MP(800)))
    assert np.all(np.abs(t.value - exact) <= t.bound)


def test_undefined_output_is_reported_not_invented():
    """relu features with a query of all-negative entries: 0/0 in exact arithmetic."""
    q, k, v, _ = make_inputs("linear-relu", N=6, d=3)
    q[0, 0, 2, :] = -1.0
    t = truth("linear-relu", q, k, v, digits=8)
    assert t.undefined[0, 0, 2].all()
    assert np.isfinite(t.value[~t.undefined]).all() and (~t.undefined).sum() > t.undefined.sum()
