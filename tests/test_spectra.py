"""gramcheck.spectra: the factor path against dense SVD and mpmath (proofs/gram-spectrum.md)."""

import math

import mpmath
import numpy as np
import pytest

from gramcheck import spectra
from gramcheck import variants as V
from gramcheck.featuremaps import random_projection
from gramcheck.strategies import log_spaced, with_spectrum


def _factors(n, m, cond, seed):
    rng = np.random.default_rng(seed)
    return with_spectrum(rng, n, m, log_spaced(cond, m)), with_spectrum(rng, n, m, log_spaced(10.0, m))


def _mp_singular_values(a, prec=400):
    with mpmath.workprec(prec):
        s = mpmath.svd_r(mpmath.matrix(a.tolist()), compute_uv=False)
        return np.array(sorted((float(x) for x in s), reverse=True))


@pytest.mark.parametrize("n,m,cond", [(8, 4, 1e3), (64, 16, 1e6), (256, 32, 1e8), (512, 16, 1e10)])
def test_factor_path_matches_dense_svd_within_both_floors(n, m, cond):
    fq, fk = _factors(n, m, cond, seed=n + m)
    sp = spectra.factor_spectrum(fq, fk, precision="float64")
    dense = spectra.dense_spectrum(fq @ fk.T)
    r = min(sp.rank, dense.rank)
    assert r >= 1
    err = np.abs(sp.values[:r] - dense.values[:r])
    # both carry an absolute error of at most their floor (Weyl); the difference is within the sum
    assert np.all(err <= sp.floor + dense.floor), (err.max(), sp.floor, dense.floor)
    # the floor is not vacuous: it is a small multiple of u times the scale
    assert sp.floor <= spectra.resolution_constant(n, m) * 2**-53 * np.linalg.norm(fq, 2) * np.linalg.norm(fk, 2) * 1.01


def test_factor_path_matches_mpmath_at_condition_1e14():
    n, m = 48, 8
    rng = np.random.default_rng(3)
    fq = with_spectrum(rng, n, m, log_spaced(1e14, m))
    fk = with_spectrum(rng, n, m, np.ones(m))  # orthonormal columns: sigma(A) = sigma(fq)
    exact = _mp_singular_values(_mp_product(fq, fk))
    f64 = spectra.factor_spectrum(fq, fk, precision="float64")
    # float64: every reported value is within its floor of the truth, and values below the floor are
    # reported as unresolved, not as numbers
    assert np.all(np.abs(f64.values - exact[: f64.rank]) <= f64.floor)
    assert f64.rank + f64.unresolved == m
    assert np.all(exact[f64.rank :] <= 2 * f64.floor)
    auto = spectra.factor_spectrum(fq, fk)  # escalates: the smallest value is 1e-14 of the largest
    assert auto.arithmetic.startswith("mpmath")
    assert auto.rank == m and auto.unresolved == 0
    np.testing.assert_allclose(auto.values, exact[:m], rtol=1e-10)
    assert auto.condition == pytest.approx(exact[0] / exact[m - 1], rel=1e-10)
    assert auto.condition == pytest.approx(1e14, rel=1e-3)


def _mp_product(fq, fk):
    """fq fk^T exactly (mpmath at 300 bits) as an object array, for the mpmath SVD."""
    with mpmath.workprec(300):
        a = mpmath.matrix(fq.tolist()) * mpmath.matrix(fk.tolist()).T
        return np.array(a.tolist(), dtype=object)


def test_exact_low_rank_is_reported_as_unresolved_not_noise():
    rng = np.random.default_rng(5)
    n, m, r = 40, 8, 3
    fq = (rng.integers(-1, 2, (n, r)) @ rng.integers(-1, 2, (r, m))).astype(float)
    fk = rng.standard_normal((n, m))
    true_rank = np.linalg.matrix_rank(fq)
    for precision in ("float64", "auto"):
        sp = spectra.factor_spectrum(fq, fk, precision=precision)
        assert sp.rank == true_rank and sp.unresolved == m - true_rank
        assert sp.values.size == true_rank and np.all(sp.values > sp.floor)
    assert "numerically zero" in spectra.factor_spectrum(fq, fk).note


def test_large_m_is_not_escalated_but_flagged():
    n, m = 128, 80
    fq, fk = _factors(n, m, 1e15, seed=2)
    sp = spectra.factor_spectrum(fq, fk, mp_max_m=64)
    assert sp.arithmetic == "float64" and "mp_max_m" in sp.note


def test_feature_gram_spectrum_is_the_squared_singular_values():
    rng = np.random.default_rng(7)
    fk = with_spectrum(rng, 100, 12, log_spaced(1e3, 12))
    sp = spectra.feature_gram_spectrum(fk)
    lam = np.sort(np.linalg.eigvalsh(fk.T @ fk))[::-1]
    np.testing.assert_allclose(sp.values, lam, rtol=1e-9)
    assert sp.condition == pytest.approx(1e6, rel=1e-6)  # kappa(G) = kappa(fk)^2


def test_summaries_on_known_spectra():
    eq = np.ones(5)
    assert spectra.effective_rank(eq) == pytest.approx(5.0)
    assert spectra.energy_share(eq) == pytest.approx(0.2)
    one = np.array([1.0, 0.0, 0.0])
    assert spectra.effective_rank(one) == pytest.approx(1.0)
    assert spectra.energy_share(one) == pytest.approx(1.0)
    s = np.array([3.0, 1.0])
    p = s / s.sum()
    assert spectra.effective_rank(s) == pytest.approx(math.exp(-(p * np.log(p)).sum()))
    assert spectra.energy_share(s) == pytest.approx(0.9)
    assert spectra.energy_share(np.array([1e200, 1e200])) == pytest.approx(0.5)  # no overflow


def test_normaliser_margin():
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((2, 1, 1, 30, 6))
    fq, fk = V.get("linear-elu").features(q, k)
    mg = spectra.normaliser_margin(fq, fk)
    assert mg["margin"] == pytest.approx(1.0) and 0 < mg["range"] <= 1
    # relu: a query orthogonal to every key's support has a zero denominator
    fq2, fk2 = np.zeros((1, 1, 3, 2)), np.zeros((1, 1, 3, 2))
    fq2[..., 0, 0], fq2[..., 1:, 1] = 1.0, 1.0
    fk2[..., :, 1] = 1.0
    assert spectra.normaliser_margin(fq2, fk2)["min_denominator"] == 0.0
    # signed (trig) features: cancellation shows as a margin well below 1
    w = random_projection(8, 6, seed=1)
    ft = V.get("performer-trig").features(q, -q, projection=w)
    assert spectra.normaliser_margin(*ft)["margin"] < 0.5


@pytest.mark.parametrize("name", ["linear-elu", "performer-positive", "qknorm-linear", "transnormer-norm"])
def test_gram_spectra_factor_path_equals_dense_matrix(name):
    rng = np.random.default_rng(11)
    q, k = rng.standard_normal((2, 1, 2, 64, 8)) * 0.5
    kw = {"projection": random_projection(16, 8, kind="orf", seed=2)} if "projection" in V.get(name).input_names else {}
    fq, fk = V.get(name).features(q, k, **kw)
    for sp in spectra.gram_spectra(name, q, k, **kw):
        b, h = sp.head
        dense = spectra.dense_spectrum(fq[b, h] @ fk[b, h].T)
        assert sp.method == "factors" and sp.rank == dense.rank
        assert np.all(np.abs(sp.values - dense.values) <= sp.floor + dense.floor)
    if "v-scale-invariant" not in V.get(name).declares:  # P = diag(1/den) A against O = M V on V = I
        for sp in spectra.gram_spectra(name, q, k, normalised=True, **kw):
            m = spectra.attention_matrix(name, q, k, **kw)[sp.head]
            dense = spectra.dense_spectrum(m)
            r = min(sp.rank, dense.rank)
            assert np.all(np.abs(sp.values[:r] - dense.values[:r]) <= sp.floor + dense.floor + 1e-12 * dense.values[0])


def test_dense_fallback_says_why():
    rng = np.random.default_rng(1)
    q, k = rng.standard_normal((2, 1, 1, 16, 4))
    (sp,) = spectra.gram_spectra("softmax", q, k)
    assert sp.method == "dense" and "no low-rank factorisation" in sp.note
    logits = q[0, 0] @ k[0, 0].T / 2.0
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    np.testing.assert_allclose(sp.values, np.linalg.svd(p, compute_uv=False)[: sp.rank], rtol=1e-10)
    (sc,) = spectra.gram_spectra("linear-elu", q, k, causal=True)
    assert sc.method == "dense" and "causal" in sc.note
    g = -np.abs(rng.standard_normal(q.shape))
    (sr,) = spectra.gram_spectra("gla", q, k, causal=True, g=g)
    assert sr.method == "dense"
    with pytest.raises(ValueError, match="not linear in v"):
        spectra.attention_matrix("transnormer-norm", q, k)


def test_bad_factor_shapes_name_the_argument():
    with pytest.raises(ValueError, match=r"^fk: got shape \(5, 3\); expected \(N, 4\)"):
        spectra.factor_spectrum(np.ones((5, 4)), np.ones((5, 3)))
    with pytest.raises(ValueError, match="^fq: contains NaN"):
        spectra.factor_spectrum(np.full((5, 4), np.nan), np.ones((5, 4)))
    with pytest.raises(ValueError, match="^precision"):
        spectra.factor_spectrum(np.ones((5, 4)), np.ones((5, 4)), precision=20)
