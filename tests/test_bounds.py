"""gramcheck.bounds: each bound holds, and is attained (or nearly) on the input its proof names."""

import math

import numpy as np
import pytest
import torch
from torch.autograd.functional import jacobian

from gramcheck import bounds
from gramcheck.featuremaps import random_projection
from gramcheck.properties.gradients import spectral_norm


def _norm2(f, x):
    return float(np.linalg.norm(jacobian(f, x).reshape(-1, x.numel()).numpy(), 2))


def _softmax(q, k, v, s=1.0):
    return torch.softmax(q @ k.T * s, -1) @ v


def _linear(q, k, v):
    fq, fk = torch.nn.functional.elu(q) + 1, torch.nn.functional.elu(k) + 1
    a = fq @ fk.T
    return (a @ v) / a.sum(-1, keepdim=True)


# proofs/row-normalisation.md ------------------------------------------------------------------------
@pytest.mark.parametrize("eps", [0.01, 0.2, 0.5, 0.9])
def test_row_normalisation_sharp_bound_is_attained(eps):
    """delta = +eps on p-mass q*, -eps elsewhere attains 2 eps / (1 + sqrt(1 - eps^2)) exactly."""
    q_star = (math.sqrt(1 - eps**2) - (1 - eps)) / (2 * eps)
    p = np.array([q_star, 1 - q_star])
    k_hat = p * np.array([1 + eps, 1 - eps])
    l1 = np.abs(k_hat / k_hat.sum() - p).sum()
    assert l1 == pytest.approx(float(bounds.row_normalisation_l1(eps, tight=True)), rel=1e-12)
    assert l1 <= float(bounds.row_normalisation_l1(eps)) + 1e-15
    # random relative errors within eps never exceed the sharp bound
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(2, 8))
        pk = rng.dirichlet(np.ones(n))
        kh = pk * (1 + rng.uniform(-eps, eps, n))
        assert np.abs(kh / kh.sum() - pk).sum() <= float(bounds.row_normalisation_l1(eps, tight=True)) * (1 + 1e-12)


def test_row_normalisation_output_bound_is_attained():
    """With two values the output moves by exactly (L1 / 2) * range."""
    p, p_hat = np.array([[0.3, 0.7]]), np.array([[0.5, 0.5]])
    v = np.array([[1.0], [-2.0]])
    l1 = np.abs(p_hat - p).sum(1)
    moved = np.abs(p_hat @ v - p @ v)
    np.testing.assert_allclose(moved, bounds.row_normalisation_output(l1, v), rtol=1e-12)
    with pytest.raises(ValueError, match="^eps"):
        bounds.row_normalisation_l1(1.0)


# proofs/favor-mse.md --------------------------------------------------------------------------------
def test_favor_mse_closed_forms():
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal((2, 5, 4)) * 0.5
    sm = bounds.softmax_kernel(x, y)
    z2 = ((x + y) ** 2).sum(-1)
    pos = bounds.favor_mse(x, y, 8, "positive")
    np.testing.assert_allclose(pos, np.exp(z2) * sm**2 * (1 - np.exp(-z2)) / 8, rtol=1e-12)  # the paper's form
    np.testing.assert_allclose(bounds.favor_mse(x, y, 8, "hyperbolic"), 0.5 * (1 - np.exp(-z2)) * pos, rtol=1e-12)
    d2 = ((x - y) ** 2).sum(-1)
    np.testing.assert_allclose(
        bounds.favor_mse(x, y, 8, "trig"), np.exp(z2) / sm**2 * (1 - np.exp(-d2)) ** 2 / 16, rtol=1e-12
    )
    # positive features are accurate where SM is small, trig ones blow up there
    far = np.array([3.0, 0, 0, 0])
    assert bounds.favor_mse(far, -far, 8, "positive") < 1e-10 < 1e5 < bounds.favor_mse(far, -far, 8, "trig")
    assert np.all(bounds.orf_mse_reduction(x, y, 4, 4) >= 0)
    with pytest.raises(ValueError, match="^m: got 5"):
        bounds.orf_mse_reduction(x, y, 5, 4)


def test_orf_blocks_have_condition_equal_to_their_row_norm_ratio():
    for cond, ratio in bounds.orf_block_condition(random_projection(24, 8, kind="orf", seed=3), 8):
        assert cond == pytest.approx(ratio, rel=1e-12)
    iid = bounds.orf_block_condition(random_projection(24, 8, kind="iid", seed=3), 8)
    assert all(c > 2 * r for c, r in iid)


# proofs/unnormalised-growth.md ----------------------------------------------------------------------
@pytest.mark.parametrize("causal", [False, True])
def test_unnormalised_growth_is_attained_by_constant_inputs(causal):
    n, m = 12, 3
    fq, fk, v = np.full((n, m), 0.5), np.full((n, m), 2.0), np.full((n, 2), 1.5)
    a = np.tril(fq @ fk.T) if causal else fq @ fk.T
    o = a @ v
    np.testing.assert_allclose(o.max(1), bounds.unnormalised_output_bound(fq, fk, v, causal=causal), rtol=1e-12)


# proofs/jacobian-bounds.md --------------------------------------------------------------------------
def test_jacobian_v_bound_is_attained_by_uniform_weights():
    n = 5
    q, k, v = torch.zeros(n, 3, dtype=torch.float64), torch.zeros(n, 3, dtype=torch.float64), torch.randn(n, 2).double()
    p = torch.softmax(q @ k.T, -1).numpy()
    assert _norm2(lambda vv: _softmax(q, k, vv), v) == pytest.approx(bounds.jacobian_v_bound(p), rel=1e-12)


def test_softmax_q_and_k_bounds_are_attained_with_two_keys():
    s = 0.7
    q = torch.tensor([[0.3, -1.2]], dtype=torch.float64)
    k = torch.tensor([[1.0, 0.5], [-0.4, 2.0]], dtype=torch.float64)
    v = torch.tensor([[1.0, -1.0], [-2.0, 2.0]], dtype=torch.float64)
    p = torch.softmax(q @ k.T * s, -1).numpy()
    jq = _norm2(lambda qq: _softmax(qq, k, v, s), q)
    assert jq == pytest.approx(bounds.softmax_jacobian_q_bound(p, k.numpy(), v.numpy(), s), rel=1e-10)
    k_eq = torch.tensor([[1.0, 0.5], [1.0, 0.5]], dtype=torch.float64)  # equal weights 1/2
    p_eq = torch.softmax(q @ k_eq.T * s, -1).numpy()
    jk = _norm2(lambda kk: _softmax(q, kk, v, s), k_eq)
    assert jk == pytest.approx(bounds.softmax_jacobian_k_bound(p_eq, q.numpy(), v.numpy(), s), rel=1e-10)
    # on random inputs the bounds hold
    rng = np.random.default_rng(4)
    for _ in range(20):
        qr, kr, vr = (torch.tensor(rng.standard_normal((6, 3))) for _ in range(3))
        pr = torch.softmax(qr @ kr.T * s, -1).numpy()
        assert _norm2(lambda qq, kr=kr, vr=vr: _softmax(qq, kr, vr, s), qr) <= bounds.softmax_jacobian_q_bound(
            pr, kr.numpy(), vr.numpy(), s
        ) * (1 + 1e-9)
        assert _norm2(lambda kk, qr=qr, vr=vr: _softmax(qr, kk, vr, s), kr) <= bounds.softmax_jacobian_k_bound(
            pr, qr.numpy(), vr.numpy(), s
        ) * (1 + 1e-9)


def test_linear_attention_q_and_k_bounds():
    """K bound: attained with one query and two positive keys (elu' = 1). Q bound: within 7% on the
    construction of proofs/jacobian-bounds.md (elu+1 features cannot be orthogonal where phi' = 1, so
    equality is out of reach); never exceeded."""
    v = torch.tensor([[1.0], [-1.0]], dtype=torch.float64)
    q = torch.tensor([[0.5, 1.0]], dtype=torch.float64)
    k = torch.tensor([[2.0, 0.3], [0.1, 1.5]], dtype=torch.float64)
    fq, fk = (torch.nn.functional.elu(x) + 1 for x in (q, k))
    jk = _norm2(lambda kk: _linear(q, kk, v), k)
    assert jk == pytest.approx(bounds.linear_jacobian_k_bound(fq.numpy(), fk.numpy(), v.numpy()), rel=1e-10)
    ratios = []
    for gap in (2.0, 6.0, 12.0):
        qg = torch.tensor([[gap, 0.01]], dtype=torch.float64)
        kg = torch.tensor([[gap, -30.0], [-30.0, 1.0]], dtype=torch.float64)  # the second key's weight -> 0
        fqg, fkg = (torch.nn.functional.elu(x) + 1 for x in (qg, kg))
        ratios.append(
            _norm2(lambda qq, kg=kg: _linear(qq, kg, v), qg)
            / bounds.linear_jacobian_q_bound(fqg.numpy(), fkg.numpy(), v.numpy())
        )
    assert all(r <= 1 + 1e-12 for r in ratios) and ratios[-1] > 0.92


def test_spectral_norm_power_iteration_matches_exact():
    a = torch.tensor(np.random.default_rng(5).standard_normal((30, 30)))
    x = torch.zeros(30, 30, dtype=torch.float64)  # 900 entries: the power-iteration path
    est = spectral_norm(lambda z: a @ z, x, iterations=200)
    assert est == pytest.approx(float(np.linalg.norm(a.numpy(), 2)), rel=1e-6)
    assert est <= float(np.linalg.norm(a.numpy(), 2)) * (1 + 1e-12)


def test_gated_state_bound_function():
    k = np.array([[1.0, -2.0], [0.5, 0.5]])
    v = np.array([[3.0], [-1.0]])
    np.testing.assert_allclose(bounds.gated_state_bound(k, v, 0.5), [[6.0], [12.0]])
    with pytest.raises(ValueError, match="^alpha_max"):
        bounds.gated_state_bound(k, v, 1.0)


def test_qknorm_weight_range_function():
    lo, hi = bounds.qknorm_weight_range(4, 1.0)
    assert lo == pytest.approx(1 / (1 + 3 * math.e**2)) and hi == pytest.approx(1 / (1 + 3 * math.e**-2))
    assert bounds.qknorm_weight_range(1, 5.0) == (1.0, 1.0)


def test_normattention_v_bound_attained_at_one_token():
    """N = 1: dO/dV = (sqrt(d)/r)(I - u u^T/r^2) a, of norm exactly sqrt(d)/r * a (d >= 2)."""
    from gramcheck.torch_arith import TORCH
    from gramcheck.variants.common import rms_normalise

    fq, fk = torch.tensor([[1.5, 0.2]], dtype=torch.float64), torch.tensor([[0.7, 1.1]], dtype=torch.float64)
    v = torch.tensor([[0.3, -2.0, 0.8]], dtype=torch.float64)
    eps = 1e-6

    def norm_attention(vv):
        return rms_normalise(TORCH, (fq @ fk.T) @ vv, eps)

    a = (fq @ fk.T).numpy()
    assert _norm2(norm_attention, v) == pytest.approx(
        bounds.normattention_jacobian_v_bound(a, v.numpy(), eps=eps), rel=1e-10
    )
    rng = np.random.default_rng(6)
    for _ in range(10):
        fq2, fk2 = (torch.tensor(np.abs(rng.standard_normal((5, 3)))) for _ in range(2))
        v2 = torch.tensor(rng.standard_normal((5, 4)))
        a2 = (fq2 @ fk2.T).numpy()
        f = lambda vv, fq2=fq2, fk2=fk2: rms_normalise(TORCH, (fq2 @ fk2.T) @ vv, eps)  # noqa: E731
        assert _norm2(f, v2) <= bounds.normattention_jacobian_v_bound(a2, v2.numpy(), eps=eps) * (1 + 1e-9)
