"""GLA and RetNet: long sequences with strong decay stay finite in the chunked form and match the
recurrent form; RetNet's parallel form is the definition with D_nm = gamma^(n-m)."""

import numpy as np
import pytest
import torch

from gramcheck import variants as V
from gramcheck.variants.retnet import head_gammas


def test_default_retnet_gammas():
    np.testing.assert_array_equal(head_gammas(3), [1 - 2.0**-5, 1 - 2.0**-6, 1 - 2.0**-7])


def test_long_gla_with_strong_decay_is_finite_and_matches_recurrent():
    torch.manual_seed(0)
    B, H, N, d = 1, 1, 8192, 8
    q, k, v = (torch.randn(B, H, N, d, dtype=torch.float32) for _ in range(3))
    g = torch.full((B, H, N, d), -5.0)
    g[..., ::2] = -1e-3  # mixed: some channels with long memory
    gla = V.get("gla")
    chunked = gla.torch(q, k, v, causal=True, form="chunked", chunk_size=64, g=g)
    rec = gla.torch(q, k, v, causal=True, form="recurrent", g=g)
    assert torch.isfinite(chunked).all()
    rel = (chunked - rec).norm() / rec.norm()
    assert rel < 1e-5, rel


def test_naive_cumulative_decay_would_overflow():
    """Why log space: exp(-b_s) for the cumulative log-decay of this input overflows float32."""
    g = torch.full((64,), -5.0)
    assert not torch.isfinite(torch.exp(-g.cumsum(0))).all()


def test_long_retnet_chunked_matches_recurrent():
    torch.manual_seed(1)
    q, k, v = (torch.randn(1, 4, 8192, 8) for _ in range(3))
    rn = V.get("retnet")
    a = rn.torch(q, k, v, causal=True, form="chunked", chunk_size=128, gamma=np.exp(-5.0))
    b = rn.torch(q, k, v, causal=True, form="recurrent", gamma=np.exp(-5.0))
    assert torch.isfinite(a).all() and ((a - b).norm() / b.norm()) < 1e-5


def test_retnet_group_norm_is_v_scale_invariant():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 10, 4)) for _ in range(3))
    rn = V.get("retnet")
    a = rn.reference(q, k, v, causal=True, group_norm=True, norm_eps=0.0)
    b = rn.reference(q, k, 3.0 * v, causal=True, group_norm=True, norm_eps=0.0)
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_registry_lists_every_family():
    names = V.names()
    for n in [
        "softmax",
        "linear-elu",
        "linear-relu",
        "linear-unnormalised",
        "performer-positive",
        "performer-hyperbolic",
        "performer-trig",
        "qknorm-softmax",
        "qknorm-linear",
        "qknorm-performer",
        "transnormer-norm",
        "transnormer-diag",
        "gram-diag-subtracted",
        "gla",
        "retnet",
    ]:
        assert n in names
    d = V.get("gla").describe()
    assert d["forms"] == ["chunked", "recurrent", "parallel"] and "bounded-state" in d["declares"]
    assert V.get("gla") in V.list()


def test_diag_attention_is_block_local():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, 10, 4)) for _ in range(3))
    da = V.get("transnormer-diag")
    a = da.reference(q, k, v, block_size=4)
    v2 = v.copy()
    v2[0, 0, 8:] += 100.0  # only the last block sees it
    b = da.reference(q, k, v2, block_size=4)
    np.testing.assert_array_equal(a[0, 0, :8], b[0, 0, :8])
    assert np.all(a[0, 0, 8:] != b[0, 0, 8:])


def test_strong_then_weak_decay_keeps_relative_accuracy_in_chunks(monkeypatch):
    """g = [-4000, -0.01, -0.01, ...]: inside a chunk b_t - b_s is small while b is ~ -4000. Cumulative
    log-decays in float32 keep only 4000 * 2^-24 of b_t - b_s (relative error ~ 2e-4 in the decays); the
    forms accumulate them in float64 (forms._gate_dtype). The agreement check fails on the float32 way."""
    import torch

    import gramcheck.forms as forms
    from gramcheck.agreement import check_agreement

    N, d = 12, 2
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, N, d)).astype(np.float32).astype(np.float64) for _ in range(3))
    g = np.full((1, 1, N, d), -0.01)
    g[:, :, 0] = -4000.0
    g = g.astype(np.float32).astype(np.float64)
    args = [torch.tensor(x).float() for x in (q, k, v, g)]

    def run():
        out = V.get("gla").torch(args[0], args[1], args[2], causal=True, form="chunked", chunk_size=16, g=args[3])
        return check_agreement("agreement", out.double().numpy(), "gla", q, k, v, causal=True, dtype="float32", g=g)

    assert run().passed
    monkeypatch.setattr(forms, "_gate_dtype", lambda x: torch.float32)
    f = run()
    assert not f.passed and f.measured > 10


def _gated_inputs(n, width, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 2, n, 4, generator=gen, dtype=dtype) for _ in range(3))
    return q, k, v, _mixed_gates(n, width, dtype, gen)


def _mixed_gates(n, width, dtype, gen):
    """Mild gates with some moderate (a few nats), strong (beyond float32's factoring limit of 22 nats
    within a sub-block) and extreme (-91, -400: beyond float64's 177) ones, per channel."""
    g = -torch.rand(1, 2, n, width, generator=gen, dtype=dtype) * 0.5
    pick = torch.rand(1, 2, n, width, generator=gen)
    g = torch.where(pick < 0.15, g * 10, g)
    g = torch.where(pick > 0.9, torch.full_like(g, -30.0), g)
    g = torch.where(pick > 0.95, torch.full_like(g, -91.0), g)
    return torch.where(pick > 0.98, torch.full_like(g, -400.0), g)


@pytest.mark.parametrize("form", ["recurrent", "parallel", "chunked"])
@pytest.mark.parametrize("width", [1, 4])
@pytest.mark.parametrize("dtype,strong", [(torch.float32, -91.0), (torch.float64, -91.0), (torch.float64, -400.0)])
@pytest.mark.parametrize("chunk_size", [8, 64])
def test_a_strong_gate_gives_finite_gradients_equal_to_the_recurrent_ones(form, width, dtype, strong, chunk_size):
    """g = -0.1 except one token at `strong` (beyond the factoring limit of the dtype's chunk: 22 nats
    in float32, 177 in float64): the factored branch that torch.where discards must stay finite, or its
    backward is 0 * inf = NaN while the forward is finite. The gradients must also be the recurrent
    form's, and so must the outputs (float64: 1e-10 apart; float32: within 1e-4)."""
    from gramcheck.forms import linear_recurrence

    gen = torch.Generator().manual_seed(3)
    base = [torch.randn(1, 1, 20, 4, generator=gen, dtype=torch.float64) for _ in range(3)]
    for pos in (0, 7, 19):
        g = torch.full((1, 1, 20, width), -0.1, dtype=torch.float64)
        g[:, :, pos] = strong
        grads, outs = [], []
        for f, dt in ((form, dtype), ("recurrent", torch.float64)):
            leaves = [x.detach().to(dt).clone().requires_grad_(True) for x in (*base, g)]
            out = linear_recurrence(*leaves, causal=True, form=f, chunk_size=chunk_size)
            assert out.isfinite().all()
            (out * torch.linspace(-1, 1, out.numel(), dtype=dt).reshape(out.shape)).sum().backward()
            grads.append([x.grad for x in leaves])
            outs.append(out.detach().double())
        tol = 1e-10 if dtype == torch.float64 else 1e-4
        torch.testing.assert_close(*outs, rtol=tol, atol=tol)
        for name, got, want in zip("qkvg", *grads, strict=True):
            assert got.isfinite().all(), f"{form} d{name} not finite (strong gate at token {pos})"
            torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol, msg=f"{form} d{name}, token {pos}")


CAUSAL_CASES = [
    (form, width)
    for form in ("recurrent", "parallel", "chunked")
    for width in (None, 1, 4)
    if not (form == "parallel" and width is None)  # the causal parallel form needs decays
]


@pytest.mark.parametrize("form,width", CAUSAL_CASES)
@pytest.mark.parametrize("n", [2, 15, 16, 17, 32, 33, 50])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_forms_are_bit_exactly_causal(form, width, n, dtype):
    """Replacing the q, k, v, g of tokens >= t0 by fresh values (mixed and extreme gates) leaves the
    outputs of tokens < t0 bit-identical, in every form (chunk 32 = two sub-blocks of 16, so n covers
    sub-block and chunk boundaries)."""
    from gramcheck.forms import linear_recurrence

    w = 1 if width is None else width
    for seed in range(4):
        q, k, v, g = _gated_inputs(n, w, dtype, seed)
        g = None if width is None else g
        out = linear_recurrence(q, k, v, g, causal=True, form=form, chunk_size=32)
        gen = torch.Generator().manual_seed(100 + seed)
        for t0 in sorted({1, n // 2, n - 1}):
            q2, k2, v2 = (
                torch.cat([x[:, :, :t0], torch.randn_like(x[:, :, t0:]).normal_(generator=gen)], dim=2)
                for x in (q, k, v)
            )
            g2 = None if g is None else torch.cat([g[:, :, :t0], _mixed_gates(n, w, dtype, gen)[:, :, t0:]], dim=2)
            out2 = linear_recurrence(q2, k2, v2, g2, causal=True, form=form, chunk_size=32)
            assert torch.equal(out[:, :, :t0], out2[:, :, :t0]), f"{form}: tokens < {t0} changed (n={n}, seed {seed})"
