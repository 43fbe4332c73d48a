import numpy as np
import pytest

from gramcheck.arith import F64, MP
from gramcheck.featuremaps import as_torch, elu1, favor, random_projection, relu
from gramcheck.torch_arith import TORCH


def test_elu1_is_positive_and_continuous():
    x = np.array([-700.0, -1.0, -1e-300, 0.0, 1e-300, 2.0])
    y = elu1(F64, x)
    assert np.all(y > 0)
    np.testing.assert_allclose(y, [np.exp(-700.0), np.exp(-1.0), 1.0, 1.0, 1.0, 3.0])
    # positive in exact arithmetic, but exp underflows below about -745 in float64: a zero feature
    assert elu1(F64, np.array([-800.0]))[0] == 0.0


def test_relu_vanishes_on_half_space():
    np.testing.assert_array_equal(relu(F64, np.array([-1.0, 0.0, 2.0])), [0.0, 0.0, 2.0])


@pytest.mark.parametrize("kind", ["positive", "hyperbolic"])
def test_positive_features_are_positive_even_for_huge_inputs(kind):
    rng = np.random.default_rng(0)
    w = random_projection(32, 8, seed=0)
    x = rng.standard_normal((1, 1, 16, 8)) * 50.0  # exp(w.x) overflows without the stabiliser
    for is_query in (True, False):
        f = favor(F64, x, w, kind=kind, is_query=is_query)
        assert np.all(np.isfinite(f)) and np.all(f >= 0)
        # at least the maximising feature survives, so no row is all zero for queries
        if is_query:
            assert np.all(f.max(axis=-1) > 0)


def test_trig_features_can_be_negative():
    w = random_projection(32, 4, seed=0)
    x = np.random.default_rng(1).standard_normal((1, 1, 8, 4))
    assert (favor(F64, x, w, kind="trig", is_query=True) < 0).any()


def test_favor_same_formula_in_torch_and_mpmath():
    w = random_projection(16, 4, kind="orf", seed=3)
    x = np.random.default_rng(2).standard_normal((1, 2, 5, 4))
    for kind in ("positive", "hyperbolic", "trig"):
        ref = MP(100).to_float64(_mp_favor(x, w, kind))
        t = favor(TORCH, as_torch(x, _f64()), as_torch(w, _f64()), kind=kind, is_query=False).numpy()
        np.testing.assert_allclose(t, ref, rtol=1e-13, atol=1e-15)


def _f64():
    import torch

    return torch.zeros((), dtype=torch.float64)


def _mp_favor(x, w, kind):
    ar = MP(100)
    with ar.context():
        return favor(ar, ar.asarray(x), ar.asarray(w), kind=kind, is_query=False)


def test_orf_rows_orthogonal_within_a_block_and_norms():
    d = 8
    w = random_projection(20, d, kind="orf", scaling="sqrt_d", seed=5)
    np.testing.assert_allclose(np.linalg.norm(w, axis=1), np.sqrt(d), rtol=1e-14)
    for start in (0, 8):
        blk = w[start : start + d]
        gram = blk @ blk.T
        np.testing.assert_allclose(gram - np.diag(np.diag(gram)), 0.0, atol=1e-12)
    wc = random_projection(20, d, kind="orf", scaling="chi", seed=5)
    # chi(d) norms: not all equal, mean near sqrt(d - 1/2)
    assert np.std(np.linalg.norm(wc, axis=1)) > 0.05


def test_same_seed_same_matrix_across_backends():
    import torch

    a = random_projection(12, 6, kind="orf", seed=42)
    b = random_projection(12, 6, kind="orf", seed=42)
    np.testing.assert_array_equal(a, b)
    t = as_torch(a, torch.zeros((), dtype=torch.float64))
    np.testing.assert_array_equal(t.numpy(), a)
    assert not np.array_equal(a, random_projection(12, 6, kind="orf", seed=43))


def test_bad_projection_arguments():
    with pytest.raises(ValueError, match="kind"):
        random_projection(4, 4, kind="gaussian")
    with pytest.raises(ValueError, match="m"):
        random_projection(0, 4)
