"""Arb (python-flint) behind the arithmetic shim: every variant's definition evaluated in it encloses the
exact output (checked against mpmath at 400 bits), branch points inside a ball cover both branches, and
quotients by balls containing 0 follow the oracle's conventions."""

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
        with MP(400).context():
            fill = np.where(exact_undefined, 0.0, value)
            dist = MP(400).to_float64(np.abs(np.asarray(exact, dtype=object) - MP(400).asarray(fill)))
        ok = ~exact_undefined
        assert np.all(dist[ok] <= bound[ok] * (1 + 2.0**-50)), (name, causal, np.max(dist[ok] / bound[ok]))
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
    from flint import arb

    ar = ArbArith(60)
    with ar.context():
        q = ar.div(
            np.array([arb(1), arb(1), arb(0)], dtype=object), np.array([arb(0), arb(2, 3), arb(0)], dtype=object)
        )
        value, bound, undefined = ar.certify64(q)
    assert undefined.tolist() == [True, False, True]
    assert value[1] == 0.5 and math.isinf(bound[1])  # midpoint quotient, radius unbounded: escalate, not undefined
