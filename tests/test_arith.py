"""The ball arithmetics enclose the exact result; plain F64 and MP evaluate the same formula."""

import numpy as np
import pytest

from gramcheck.arith import BALL_F64, F64, MP, BallMP, rounding_model

HI = MP(500)


def _formula(ar, x, y):
    """Exercises every operation of the shim, with cancellation (x - y for y close to x)."""
    a = ar.exp(x) - ar.exp(y) * 0.999
    b = ar.log(ar.abs(x) + 1.0) * ar.sqrt(ar.abs(y) + 0.5)
    c = ar.sin(x) * ar.cos(y) + ar.where_pos(x, x + 1.0, ar.exp(ar.minimum(x, 0.0)))
    m = ar.matmul(ar.mT(a), b) / (ar.sum(ar.abs(c), axis=0, keepdims=True) + 1.0)
    return ar.cumsum(m, axis=0) + ar.maximum(m, 0.0)


def _eval(ar, x, y):
    with ar.context():
        return _formula(ar, ar.asarray(x), ar.asarray(y))


@pytest.mark.parametrize("seed", range(5))
def test_ball_f64_encloses_the_exact_value(seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((6, 5))
    y = x + rng.standard_normal((6, 5)) * 1e-9  # heavy cancellation in exp(x) - 0.999 exp(y)
    exact = HI.to_float64(_eval(HI, x, y))
    ball = _eval(BALL_F64, x, y)
    err = np.abs(BALL_F64.to_float64(ball) - exact)
    assert np.all(err <= BALL_F64.radius(ball))
    # and the midpoint is the plain float64 evaluation
    np.testing.assert_array_equal(BALL_F64.to_float64(ball), _eval(F64, x, y))


def test_ball_mp_encloses_and_shrinks_with_precision():
    rng = np.random.default_rng(7)
    x, y = rng.standard_normal((4, 3)), rng.standard_normal((4, 3))
    exact = HI.to_float64(_eval(HI, x, y))
    r80 = BallMP(80).radius(_eval(BallMP(80), x, y))
    r160 = BallMP(160).radius(_eval(BallMP(160), x, y))
    assert np.all(np.abs(BallMP(160).to_float64(_eval(BallMP(160), x, y)) - exact) <= r160 + 2**-52 * np.abs(exact))
    assert np.all(r160 < r80 * 2.0**-70)


def test_ball_radius_of_one_exp_is_about_one_ulp():
    """Not loose: one exp of an exact input costs (2u + rounding) |y|, not more."""
    with BALL_F64.context():
        b = BALL_F64.exp(BALL_F64.asarray(np.array([0.3, -2.0, 5.0])))
    ratio = BALL_F64.radius(b) / np.abs(BALL_F64.to_float64(b))
    assert np.all(ratio < 3.1 * 2.0**-53) and np.all(ratio > 1.9 * 2.0**-53)


def test_division_by_a_ball_containing_zero_is_unbounded():
    with BALL_F64.context():
        den = BALL_F64.asarray(np.array([1e-300])) - BALL_F64.asarray(np.array([1e-300])) * (1 + 2**-52)
        q = BALL_F64.asarray(np.array([1.0])) / den
    assert np.isinf(BALL_F64.radius(q)).all()


def test_mp_division_by_zero_is_ieee_like():
    ar = MP(64)
    with ar.context():
        out = ar.div(ar.asarray(np.array([1.0, 0.0, -2.0])), ar.asarray(np.zeros(3)))
    f = ar.to_float64(out)
    assert f[0] == np.inf and np.isnan(f[1]) and f[2] == -np.inf


def test_rounding_model_uses_the_dtype_unit_roundoff():
    m32 = rounding_model("float32")
    with m32.context():
        s = m32.sum(m32.asarray(np.ones(1000)), axis=0)
    # gamma_999(u32) * 1000 (+ the radius's own inflation): about 999 * 1000 * 2^-24
    assert float(m32.radius(s)) == pytest.approx(999 * 1000 * 2.0**-24, rel=0.02)


def test_mp_requires_at_least_53_bits():
    with pytest.raises(ValueError, match="prec"):
        MP(40)


def test_an_unbounded_radius_against_an_exact_zero_is_unknown_not_nan():
    """inf * 0 in a radius product (a vacuous row of a softmax against the zeros of V = I) is NaN in
    float64; the radius reads it as inf (unknown), never as a number a tolerance could be compared with.
    The bfloat16 softmax's rows-sum-to-one then counts the row as uncertifiable instead of failing it."""
    from gramcheck import properties as P
    from gramcheck.arith import Ball
    from gramcheck.precision import round_to
    from gramcheck.strategies import AttentionInputs
    from gramcheck.targets import builtin

    m = rounding_model("bfloat16")
    a = Ball(m, np.array([[1.0, 2.0]]), np.array([[np.inf, 0.0]]))
    r = m.radius(m.matmul(a, np.array([[0.0], [1.0]])))
    assert np.all(np.isinf(r)) and not np.any(np.isnan(r))
    rng = np.random.default_rng(0)  # N = 2, d = 31: the bfloat16 model's logits radius reaches 0.7
    q, k, v = (round_to(rng.standard_normal((1, 1, 2, 31)), "bfloat16") for _ in range(3))
    ex = AttentionInputs(q, k, v, {}, "gaussian", "bfloat16")
    f = P.get("rows-sum-to-one").fn(builtin("softmax", dtype="bfloat16"), ex, causal=False)
    assert f.passed and f.details["uncertifiable_entries"] >= 1, f

