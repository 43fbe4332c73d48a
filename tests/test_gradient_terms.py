"""The size of a gradient's terms (gramcheck.gradient_terms): the chain rule's sum over paths of |products
of partials|. Exactly the absolute expansion of a multilinear form, exactly |gradient| where no sign can
cancel, the closed forms of a quotient and a softmax row, and nonzero where the gradient cancels to 0."""

import numpy as np
import pytest

from gramcheck.gradient_terms import TermArith
from gramcheck.properties.backward import definition_gradients, gradient_terms
from gramcheck.targets import builtin
from gramcheck.variants.common import masked_softmax

RNG = np.random.default_rng(7)


def _gla_arrays(positive: bool) -> dict[str, np.ndarray]:
    shape = (1, 2, 9, 3)
    draw = (lambda s: RNG.uniform(0.1, 1.0, s)) if positive else RNG.standard_normal
    return {
        "q": draw(shape),
        "k": draw(shape),
        "v": draw(shape),
        "g": -RNG.uniform(0.01, 2.0, shape),
        "initial_state": draw((1, 2, 3, 3)),
    }


def test_multilinear_terms_are_the_absolute_expansion():
    """GLA is multilinear in q, k, v, S_0 with positive decays: every entry's terms are the monomials of its
    expansion, so T equals the float64 gradient of the definition at |q|, |k|, |v|, |S_0|, |W|, |W_S|."""
    t = builtin("gla")
    arrays = _gla_arrays(positive=False)
    w, ws = RNG.standard_normal((1, 2, 9, 3)), RNG.standard_normal((1, 2, 3, 3))
    names = ["q", "k", "v", "initial_state"]
    terms = gradient_terms(t, arrays, names, w, ws, causal=True)
    absolute = {n: (x if n == "g" else np.abs(x)) for n, x in arrays.items()}
    expansion = definition_gradients(t, absolute, names, np.abs(w), np.abs(ws), causal=True, dtype="float64")
    for n in names:
        np.testing.assert_allclose(terms[n], expansion[n], rtol=1e-12, err_msg=n)


@pytest.mark.parametrize("name", ["gla", "linear-elu", "linear-unnormalised"])
def test_terms_equal_the_gradient_where_no_sign_can_cancel(name):
    """With q, k, v, W > 0 an unnormalised form's gradients in q, k, v are sums of positive terms: T = |G|
    exactly (the size is not loose where nothing cancels)."""
    t = builtin(name)
    arrays = _gla_arrays(positive=True)
    arrays.pop("initial_state")
    if name != "gla":
        arrays.pop("g")
    w = RNG.uniform(0.1, 1.0, (1, 2, 9, 3))
    names = ["q", "k", "v"]
    terms = gradient_terms(t, arrays, names, w, None, causal=True)
    ref = definition_gradients(t, arrays, names, w, None, causal=True, dtype="float64")
    for n in names if name != "linear-elu" else ["v"]:  # a normaliser's path enters q and k with a minus
        np.testing.assert_allclose(terms[n], np.abs(ref[n]), rtol=1e-12, err_msg=n)
    if name == "linear-elu":
        assert np.all(terms["q"] > np.abs(ref["q"]) * 1.01), "the denominator's path adds terms that cancel"


def _terms(f, *xs, w):
    ar = TermArith()
    vs = [ar.asarray(x) for x in xs]
    with ar.context():
        ar.backward([(f(ar, *vs), w)])
    return [v.adj for v in vs]


def test_quotient_terms():
    """L = <W, a / b>: T_a = |W| / |b|, T_b = |W| |a| / b^2."""
    a, b, w = RNG.standard_normal(5), RNG.uniform(0.5, 2.0, 5) * RNG.choice([-1, 1], 5), RNG.standard_normal(5)
    ta, tb = _terms(lambda ar, x, y: ar.div(x, y), a, b, w=w)
    np.testing.assert_allclose(ta, np.abs(w) / np.abs(b), rtol=1e-14)
    np.testing.assert_allclose(tb, np.abs(w) * np.abs(a) / b**2, rtol=1e-14)


def test_softmax_row_terms():
    """L = <W, softmax(x)>: dL/dx_j = p_j (W_j - sum_i p_i W_i), whose terms are p_j (|W_j| + sum_i p_i |W_i|)
    (the numerator's path and the normaliser's)."""
    x, w = RNG.standard_normal((1, 6)), RNG.standard_normal((1, 6))
    (tx,) = _terms(lambda ar, y: masked_softmax(ar, y, None), x, w=w)
    p = np.exp(x) / np.exp(x).sum()
    np.testing.assert_allclose(tx, p * (np.abs(w) + np.sum(p * np.abs(w))), rtol=1e-13)


def test_a_gradient_that_cancels_to_zero_keeps_its_terms():
    """One token of normalised attention: o = v whatever k is, so dL/dk = 0 exactly, computed from terms that
    cancel (a backward evaluating them in low precision errs by u times their size, not by 0)."""
    t = builtin("linear-elu")
    arrays = {n: RNG.standard_normal((1, 1, 1, 4)) for n in ("q", "k", "v")}
    w = RNG.standard_normal((1, 1, 1, 4))
    ref = definition_gradients(t, arrays, ["k"], w, None, causal=True, dtype="float64")
    terms = gradient_terms(t, arrays, ["k"], w, None, causal=True)
    assert np.max(np.abs(ref["k"])) <= 1e-15 * np.max(terms["k"])
    assert np.all(terms["k"] > 0)


def test_a_tie_at_a_branch_point_sends_the_adjoint_through():
    """maximum(x, 0) at x == 0: torch's clamp passes the gradient there, so the terms must too (T >= |G|)."""
    x, w = np.array([0.0, 1.0, -1.0]), np.array([2.0, -3.0, 5.0])
    (tx,) = _terms(lambda ar, y: ar.maximum(y, 0.0), x, w=w)
    np.testing.assert_array_equal(tx, [2.0, 3.0, 0.0])
