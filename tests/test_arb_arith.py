"""Arb (python-flint) behind the arithmetic shim: every variant's definition evaluated in it encloses the
exact output (checked against mpmath at 400 bits, in mpmath), branch points inside a ball cover both
branches, quotients by balls containing 0 are unknown and by an exact 0 undefined, roots of balls reaching
below 0 cover 0, and bounds are rounded up even below float64's normal range."""

import math

import numpy as np
import pytest
from helpers import causal_modes, make_inputs

from gramcheck import variants as V
from gramcheck.arb_arith import ArbArith, available
from gramcheck.arith import MP

pytestmark = pytest.mark.skipif(not available(), reason="python-flint not installed")


@pytest.mark.parametrize("name", V.names())
def test_every_definition_is_enclosed(name):
    q, k, v, extras = make_inputs(name, N=7, d=3, H=2, seed=3)
    ar = ArbArith(60)
    for causal in causal_modes(name):
        ball = V.get(name).reference(q, k, v, causal=causal, arith=ar, **extras)
        exact = V.get(name).reference(q, k, v, causal=causal, arith=MP(400), **extras)
        value, bound, undefined = ar.certify64(ball)
        exact_undefined = np.isnan(MP(400).to_float64(exact))  # 0/0: relu features of a negative query
        assert np.array_equal(undefined, exact_undefined), name
        ok = ~exact_undefined
        with MP(400).context():  # the distance compared in mpmath, not after rounding it to float64
            fill = np.where(exact_undefined, 0.0, value)
            dist = np.abs(np.asarray(exact, dtype=object) - MP(400).asarray(fill))
            assert all(d <= b for d, b in zip(dist[ok], bound[ok], strict=True)), (name, causal)
        # 60 bits: the enclosure is narrow, not merely valid
        assert np.all(bound[ok] <= 2.0**-40 * np.max(np.abs(value[ok]))), (name, np.max(bound[ok]))


def test_a_branch_point_inside_the_ball_covers_both_branches():
    from flint import arb

    ar = ArbArith(60)
    with ar.context():
        x = np.array([arb(0, 0.5), arb(1, 0.5), arb(-1, 0.5)], dtype=object)
        r = ar.where_pos(x, ar.asarray(np.array([10.0, 10.0, 10.0])), ar.asarray(np.array([-10.0, -10.0, -10.0])))
        assert r[0].contains(10) and r[0].contains(-10)
        assert r[1].contains(10) and not r[1].contains(-10)
        assert r[2].contains(-10) and not r[2].contains(10)
        m = ar.maximum(x, 0.0)
        assert m[0].contains(0) and m[0].contains(0.5) and m[2].contains(0) and not m[2].contains(-1)


def test_quotients_by_balls_containing_zero():
    """x / [0 +- r] is unknown at this precision (escalate), not undefined; x / 0 exactly is undefined."""
    from flint import arb

    ar = ArbArith(60)
    with ar.context():
        num = np.array([arb(1), arb(1), arb(0), arb(1e300)], dtype=object)
        q = ar.div(num, np.array([arb(0), arb(2, 3), arb(0), arb(1e-10, 2e-10)], dtype=object))
        value, bound, undefined = ar.certify64(q)
    assert undefined.tolist() == [True, False, True, False]
    assert math.isinf(bound[1]) and math.isinf(bound[3])


def test_a_square_root_of_a_ball_reaching_below_zero_covers_zero():
    from flint import arb

    ar = ArbArith(60)
    with ar.context():
        r = ar.sqrt(np.array([arb(0, 1e-3), arb(-1e-6, 1e-6), arb(4)], dtype=object))
    assert r[0].contains(0) and r[0].contains(arb(1e-3).sqrt()) and r[1].contains(0) and r[2].contains(2)


@pytest.mark.parametrize("backend", ["arb", "mpmath"])
def test_subnormal_outputs_are_bounded_from_above(backend, monkeypatch):
    """Softmax over three equal keys with v = (2^-1074, 0, 0): the output 2^-1074 / 3 is below float64's
    smallest subnormal. The bound must still cover the distance from the float64 value (a relative
    margin does nothing there; the conversion rounds up)."""
    from gramcheck.oracle import truth

    monkeypatch.setenv("GRAMCHECK_ORACLE", backend)
    q = np.zeros((1, 1, 3, 1))
    v = np.array([2.0**-1074, 0.0, 0.0]).reshape(1, 1, 3, 1)
    t = truth("softmax", q, q, v, causal=False, digits=10, max_prec=200)
    exact = V.get("softmax").reference(q, q, v, causal=False, arith=MP(400))
    with MP(400).context():
        dist = np.abs(np.asarray(exact, dtype=object) - MP(400).asarray(t.value))
        assert all(d <= b for d, b in zip(np.ravel(dist), np.ravel(t.bound), strict=True)), (dist, t.bound)


def test_a_cancelling_output_norm_is_certified_not_undefined():
    """TransNormer's output norm over v = (1e20, -1e20, 1) with equal weights: sqrt and quotients of balls
    around 0 at low precision. Arb's indeterminate balls there are unknown, so the oracle escalates and
    certifies the exact output (0.9999963...), as the mpmath balls do."""
    from gramcheck.oracle import truth

    q = np.zeros((1, 1, 3, 1))
    k = np.full((1, 1, 3, 1), -1.0)
    v = np.array([1e20, -1e20, 1.0]).reshape(1, 1, 3, 1)
    t = truth("transnormer-norm", q, k, v, causal=False, digits=10)
    assert t.met and not t.undefined.any() and t.arithmetic.startswith("arb")
    exact = V.get("transnormer-norm").reference(q, k, v, causal=False, arith=MP(400))
    with MP(400).context():
        dist = np.abs(np.asarray(exact, dtype=object) - MP(400).asarray(t.value))
        assert all(d <= b for d, b in zip(np.ravel(dist), np.ravel(t.bound), strict=True))


def test_concurrent_evaluations_keep_their_own_precision():
    """flint's precision is one setting per process: a thread that enters a 600-bit evaluation while
    another is inside a 60-bit one must not change the first one's precision (the context holds a lock)."""
    import threading
    import time

    from flint import arb

    inside, entering, done = threading.Event(), threading.Event(), threading.Event()
    out = {}

    def third_radius(ar):
        return ar.radius(ar.div(np.array([arb(1)], dtype=object), np.array([arb(3)], dtype=object)))[0]

    def low():
        ar = ArbArith(60)
        with ar.context():
            inside.set()
            entering.wait(5)
            time.sleep(0.05)  # the other thread, were it not locked out, is now inside at 600 bits
            out[60] = third_radius(ar)
        done.set()

    def high():
        inside.wait(5)
        entering.set()
        ar = ArbArith(600)
        with ar.context():
            done.wait(5)
            out[600] = third_radius(ar)

    threads = [threading.Thread(target=low), threading.Thread(target=high)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert 2.0**-62 < out[60] < 2.0**-58 and out[600] < 2.0**-590, out
