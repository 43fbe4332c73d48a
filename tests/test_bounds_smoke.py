"""Bounds quoted in the variants' docstrings, checked where they are tight (proofs/ files named)."""

import numpy as np
import pytest

from gramcheck import variants as V


@pytest.mark.parametrize("a", [0.5, 0.9, 0.99])
def test_gated_state_bound_holds_and_is_tight(a):
    """proofs/gated-state-bound.md: constant k, v >= 0 and alpha = a reach (1 - a^t)/(1 - a) M exactly."""
    N, d = 400, 3
    k = np.full((1, 1, N, d), 0.7)
    v = np.full((1, 1, N, d), 1.3)
    g = np.full((1, 1, N, d), np.log(a))
    # o_t = S_t^T q_t with q = e_0 reads row 0 of the state
    q = np.zeros((1, 1, N, d))
    q[..., 0] = 1.0
    out = V.get("gla").reference(q, k, v, causal=True, g=g)
    t = np.arange(1, N + 1)
    M = 0.7 * 1.3
    bound_t = M * (1 - a**t) / (1 - a)
    np.testing.assert_allclose(out[0, 0, :, 0], bound_t, rtol=1e-12)
    assert np.all(out[0, 0, :, 0] <= M / (1 - a) * (1 + 1e-12))
    # random inputs within the uniform bound
    rng = np.random.default_rng(0)
    kr, vr = rng.standard_normal((1, 1, N, d)), rng.standard_normal((1, 1, N, d))
    gr = np.log(rng.uniform(0.01, a, (1, 1, N, d)))
    Mr = np.max(np.abs(kr)[..., :, None] * np.abs(vr)[..., None, :], axis=2)  # (1, 1, d, d)
    for c in range(d):
        qc = np.zeros((1, 1, N, d))
        qc[..., c] = 1.0
        rows = V.get("gla").reference(qc, kr, vr, causal=True, g=gr)  # row c of S_t
        assert np.all(np.abs(rows) <= Mr[:, :, c, None, :] / (1 - a) + 1e-12)


def _weights(name, q, k, **kw):
    n = q.shape[-2]
    v = np.broadcast_to(np.eye(n), q.shape[:2] + (n, n)).copy()
    return V.get(name).reference(q, k, v, **kw)


@pytest.mark.parametrize("tau", [0.5, 2.0, 5.0])
def test_qknorm_weight_range(tau):
    """proofs/qknorm-weight-range.md: extremal input attains the sharp range; the stated range holds."""
    n, d = 6, 4
    rng = np.random.default_rng(1)
    u = rng.standard_normal(d)
    q = np.broadcast_to(u, (1, 1, n, d)).copy()
    k = np.broadcast_to(-u, (1, 1, n, d)).copy()
    k[0, 0, 0] = u * 3.0  # parallel to every query, the others anti-parallel
    p = _weights("qknorm-softmax", q, k, norm="l2", tau=tau, norm_eps=0.0)
    e = np.exp(2 * tau)
    np.testing.assert_allclose(p[0, 0, :, 0], e / (e + n - 1), rtol=1e-12)
    np.testing.assert_allclose(p[0, 0, :, 1:], 1 / (e + n - 1), rtol=1e-12)
    assert np.all(p[0, 0, :, 0] <= e / n)  # the stated (loose) range
    assert np.all(p >= np.exp(-2 * tau) / n)
    # random inputs: inside the sharp range, for l2 and layernorm
    for norm in ("l2", "layernorm"):
        qr, kr = rng.standard_normal((2, 1, 2, n, d)) * 10
        pr = _weights("qknorm-softmax", qr, kr, norm=norm, tau=tau)
        assert np.all(pr <= 1 / (1 + (n - 1) / e) + 1e-15) and np.all(pr >= 1 / (1 + (n - 1) * e) - 1e-15)
