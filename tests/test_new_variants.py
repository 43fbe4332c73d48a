"""Mamba2 (SSD), RWKV-6, Lightning Attention and Based: the reference in every arithmetic, every torch form
against the oracle, forms against each other, long sequences with strong decays, state passing, gradients,
fla's naive references, and the builtin targets against their own property catalogue."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from gramcheck import variants as V
from gramcheck.agreement import check_agreement, rounding_bound
from gramcheck.arith import BALL_F64, F64, MP, rounding_model
from gramcheck.precision import round_to
from gramcheck.state import final_state, gated_scan, initial_readout
from gramcheck.variants.based import denominators, key_counts, normaliser_lower_bound
from gramcheck.variants.common import ref_normalised_gated

NAMES = ("mamba2", "rwkv6", "lightning", "based")
RECURRENT = ("mamba2", "rwkv6", "lightning")


def make(name, *, B=1, H=2, N=12, d=4, dtype="float64", seed=0, g_low=0.0, g_high=1.0, g=None):
    """Seeded Gaussian q, k, v and the variant's extras, rounded to ``dtype`` (returned as float64).
    Log-decays are -U(g_low, g_high) (or the constant ``g``)."""
    rng = np.random.default_rng(seed)
    q, k, v = (round_to(rng.standard_normal((B, H, N, d)), dtype) for _ in range(3))
    ex = {}
    if name in ("mamba2", "rwkv6"):
        shape = (B, H, N) if name == "mamba2" else (B, H, N, d)
        vals = -rng.uniform(g_low, g_high, shape) if g is None else np.full(shape, float(g))
        ex["g"] = np.minimum(round_to(vals, dtype), 0.0)
    if name == "rwkv6":
        ex["u"] = round_to(rng.standard_normal((H, d)), dtype)
    return q, k, v, ex


def tt(x, dtype="float64", grad=False):
    return torch.tensor(np.asarray(x), dtype=getattr(torch, dtype), requires_grad=grad)


def run(name, form, q, k, v, ex, *, dtype="float64", chunk_size=7, causal=True, **params):
    var = V.get(name)
    t = {a: tt(b, dtype) for a, b in ex.items()}
    out = var.torch(
        tt(q, dtype), tt(k, dtype), tt(v, dtype), causal=causal, form=form, chunk_size=chunk_size, **t, **params
    )
    return out


def modes(name):
    return [True] if "causal-only" in V.get(name).declares else [True, False]


# --------------------------------------------------------------------------------------------------
# the reference in every arithmetic
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_reference_float64_matches_mpmath_and_ball_encloses_it(name):
    var = V.get(name)
    q, k, v, ex = make(name, N=10, d=3, seed=1)
    for causal in modes(name):
        f64 = var.reference(q, k, v, causal=causal, **ex)
        mp = MP(200).to_float64(var.reference(q, k, v, causal=causal, arith=MP(200), **ex))
        ball = var.reference(q, k, v, causal=causal, arith=BALL_F64, **ex)
        mid, rad = BALL_F64.to_float64(ball), BALL_F64.radius(ball)
        assert np.all(np.isfinite(mp))
        assert np.all(np.abs(mid - mp) <= rad), name  # the ball encloses the 200-bit value
        assert np.all(np.abs(f64 - mp) <= rad), name
        assert np.all(rad <= 1e-12 * (np.abs(mp) + 1)), name  # and is tight: float64 suffices here
        assert not np.array_equal(f64, var.reference(q, k, 2 * v + 1, causal=causal, **ex))


# --------------------------------------------------------------------------------------------------
# torch forms against the oracle and against each other
# --------------------------------------------------------------------------------------------------
CASES = [(n, f, c) for n in NAMES for c in modes(n) for f in V.get(n).forms_for(c)]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name,form,causal", CASES)
def test_form_agrees_with_oracle(name, form, causal, dtype):
    q, k, v, ex = make(name, N=21, d=4, dtype=dtype, seed=3)
    out = run(name, form, q, k, v, ex, dtype=dtype, causal=causal)
    assert out.dtype == getattr(torch, dtype)
    f = check_agreement("agreement", out.double().numpy(), name, q, k, v, causal=causal, dtype=dtype, **ex)
    assert f.passed, f


@pytest.mark.parametrize("name", NAMES)
def test_forms_agree_for_chunk_sizes_1_7_64_and_n(name):
    N = 30
    q, k, v, ex = make(name, N=N, dtype="float32", seed=4)
    for causal in modes(name):
        bound = rounding_bound(name, q, k, v, causal=causal, dtype="float32", **ex)
        base = run(name, "recurrent", q, k, v, ex, dtype="float32", causal=causal).double().numpy()
        others = [("chunked", cs) for cs in (1, 7, 64, N)]
        if "parallel" in V.get(name).forms_for(causal):
            others.append(("parallel", 1))
        for form, cs in others:
            o = run(name, form, q, k, v, ex, dtype="float32", chunk_size=cs, causal=causal).double().numpy()
            ratio = np.max(np.abs(o - base) / bound)
            assert ratio <= 2, (form, cs, causal, ratio)


def test_mamba2_skip_d_per_head():
    q, k, v, ex = make("mamba2", H=3, N=9, seed=5)
    var = V.get("mamba2")
    base = var.reference(q, k, v, causal=True, **ex)
    with_d = var.reference(q, k, v, causal=True, D=[0.5, -1.0, 2.0], **ex)
    np.testing.assert_allclose(with_d - base, np.array([0.5, -1.0, 2.0])[None, :, None, None] * v, atol=1e-14)
    for form in var.forms:
        out = run("mamba2", form, q, k, v, ex, D=[0.5, -1.0, 2.0]).numpy()
        f = check_agreement("a", out, "mamba2", q, k, v, causal=True, dtype="float64", D=[0.5, -1.0, 2.0], **ex)
        assert f.passed, (form, f)
    with pytest.raises(ValueError, match="D: got 2 values"):
        var.reference(q, k, v, causal=True, D=[1.0, 2.0], **ex)


def test_bad_extra_shapes_name_the_argument():
    q, k, v, ex = make("mamba2", N=5)
    with pytest.raises(ValueError, match="^g: got shape"):
        V.get("mamba2").torch(tt(q), tt(k), tt(v), causal=True, g=tt(ex["g"][..., None].repeat(4, -1)))
    q, k, v, ex = make("rwkv6", N=5)
    with pytest.raises(ValueError, match="^u: got shape"):
        V.get("rwkv6").reference(q, k, v, causal=True, g=ex["g"], u=ex["u"][:1])
    with pytest.raises(ValueError, match="^initial_state: got shape"):
        V.get("rwkv6").reference(q, k, v, causal=True, initial_state=np.zeros((1, 2, 4, 3)), **ex)
    with pytest.raises(ValueError, match="^layer_idx"):
        V.get("lightning").reference(q, k, v, causal=True, layer_idx=3, num_layers=2)


# --------------------------------------------------------------------------------------------------
# long sequences, strong decays
# --------------------------------------------------------------------------------------------------
def _long_inputs(name, N, seed=0):
    """float32-exact inputs; log-decays mixing strong (down to -100) and weak ones."""
    q, k, v, ex = make(name, B=1, H=4 if name == "lightning" else 1, N=N, d=2, dtype="float32", seed=seed)
    if "g" in ex:
        rng = np.random.default_rng(seed + 1)
        strong = rng.random(ex["g"].shape) < 0.3
        g = np.where(strong, -rng.uniform(20.0, 100.0, ex["g"].shape), -rng.uniform(0.0, 0.05, ex["g"].shape))
        g[:, :, :8] = -100.0
        ex["g"] = round_to(g, "float32")
    return q, k, v, ex


@pytest.mark.parametrize("name", RECURRENT)
def test_chunked_long_sequence_with_strong_decays_is_accurate(name, monkeypatch):
    N = 8192
    q, k, v, ex = _long_inputs(name, N)
    out = run(name, "chunked", q, k, v, ex, dtype="float32", chunk_size=64)
    assert torch.isfinite(out).all()
    f = check_agreement("agreement", out.double().numpy(), name, q, k, v, causal=True, dtype="float32", **ex)
    assert f.passed, f
    if "g" in ex:  # the check can fail: cumulative log-decays summed in float32 lose b_t - b_s (|b| ~ 1e5)
        import gramcheck.forms as forms

        monkeypatch.setattr(forms, "_gate_dtype", lambda x: torch.float32)
        out = run(name, "chunked", q, k, v, ex, dtype="float32", chunk_size=64)
        bad = check_agreement("agreement", out.double().numpy(), name, q, k, v, causal=True, dtype="float32", **ex)
        assert not bad.passed and bad.measured > 10, bad


def test_based_chunked_long_sequence_is_accurate():
    """Based at N = 8192 in float32 against the definition evaluated as its (mathematically identical)
    token recurrence over [V, 1]: truth from float64 balls, bound 2 R(u_float32) from the rounding model
    of the same recurrence (the N x N definition does not fit in memory in ball arithmetic)."""
    N = 8192
    q, k, v, _ = _long_inputs("based", N)
    var = V.get("based")
    out = run("based", "chunked", q, k, v, {}, dtype="float32", chunk_size=64).double().numpy()
    assert np.isfinite(out).all()
    zero = np.zeros(q.shape[:-1] + (1,))

    def recur(ar):
        with ar.context():
            fq, fk = var.features(q, k, arith=ar)  # Taylor features evaluated in ar
            return ref_normalised_gated(ar, fq, fk, ar.asarray(v), ar.asarray(zero))

    model = rounding_model("float32")
    bound = 2 * model.radius(recur(model))
    exact = recur(BALL_F64)
    err = np.abs(out - BALL_F64.to_float64(exact)) + BALL_F64.radius(exact)
    assert np.max(err / bound) <= 1, np.max(err / bound)


# --------------------------------------------------------------------------------------------------
# RWKV-6's exclusive decay without division
# --------------------------------------------------------------------------------------------------
def _division_chunked_rwkv6(r, k, v, g, u, c):
    """The factorised chunk form: inside a chunk A_ts = (r_t exp(b_t) / exp(g_t)) . (k_s exp(-b_s)) for s < t,
    b the inclusive cumulative log-decay from the chunk's start (exclusive decay by division)."""
    B, H, N, dk = r.shape
    state = r.new_zeros(B, H, dk, v.shape[-1])
    outs = []
    for i in range(0, N, c):
        rc, kc, vc, gc = (x[:, :, i : i + c] for x in (r, k, v, g))
        n = rc.shape[2]
        b = gc.cumsum(2)
        r_ex = rc * b.exp() / gc.exp()
        k_in = kc * (-b).exp()
        a = (r_ex @ k_in.transpose(-1, -2)) * torch.ones(n, n).tril(-1)
        bonus = (rc * u[None, :, None, :] * kc).sum(-1, keepdim=True) * vc
        outs.append(a @ vc + r_ex @ state + bonus)
        state = b[:, :, -1, :, None].exp() * state + (kc * (b[:, :, -1:] - b).exp()).transpose(-1, -2) @ vc
    return torch.cat(outs, dim=2)


def test_rwkv6_strong_decay_at_chunk_start_division_fails_shifted_form_passes():
    c, N = 16, 40
    q, k, v, ex = make("rwkv6", N=N, d=4, dtype="float32", seed=7, g=-60.0)
    s = 0.5
    args = [tt(x, "float32") for x in (q, k, v, ex["g"], ex["u"])]
    mild = make("rwkv6", N=N, d=4, dtype="float32", seed=7, g_high=0.1)[3]["g"]
    # the division form is right when decays are mild (so the comparison is meaningful) ...
    ok = _division_chunked_rwkv6(args[0] * s, args[1], args[2], tt(mild, "float32"), args[4], c)
    f_ok = check_agreement(
        "a", ok.double().numpy(), "rwkv6", q, k, v, causal=True, dtype="float32", scale=s, g=mild, u=ex["u"]
    )
    assert f_ok.passed, f_ok
    # ... and explodes with g = -60 per token: exp(-b_s) = exp(60 (s + 1)) overflows float32
    bad = _division_chunked_rwkv6(args[0] * s, args[1], args[2], args[3], args[4], c)
    assert not torch.isfinite(bad).all()
    for form in V.get("rwkv6").forms:
        out = run("rwkv6", form, q, k, v, ex, dtype="float32", chunk_size=c, scale=s)
        assert torch.isfinite(out).all()
        f = check_agreement("a", out.double().numpy(), "rwkv6", q, k, v, causal=True, dtype="float32", scale=s, **ex)
        assert f.passed, (form, f)


def test_rwkv6_current_token_only_through_u():
    """o_1 = (s r_1 * u . k_1) v_1, and the decay g_t of token t does not act on o_t."""
    q, k, v, ex = make("rwkv6", H=1, N=6, seed=8)
    var = V.get("rwkv6")
    o = var.reference(q, k, v, causal=True, scale=1.0, **ex)
    np.testing.assert_allclose(o[0, 0, 0], (q[0, 0, 0] * ex["u"][0] * k[0, 0, 0]).sum() * v[0, 0, 0], rtol=1e-14)
    g2 = ex["g"].copy()
    g2[:, :, 3] -= 5.0
    o2 = var.reference(q, k, v, causal=True, scale=1.0, g=g2, u=ex["u"])
    np.testing.assert_array_equal(o[:, :, :4], o2[:, :, :4])
    assert np.all(o[:, :, 4:] != o2[:, :, 4:])


# --------------------------------------------------------------------------------------------------
# state passing
# --------------------------------------------------------------------------------------------------
def test_state_identities_equal_the_recurrence_in_mpmath():
    ar = MP(200)
    rng = np.random.default_rng(9)
    q, k, v = (rng.standard_normal((1, 2, 7, 3)) for _ in range(3))
    for c in (1, 3):
        g = -rng.uniform(0, 2, (1, 2, 7, c))
        s0 = rng.standard_normal((1, 2, 3, 3))
        with ar.context():
            Q, K, Vv, G, S0 = (ar.asarray(x) for x in (q, k, v, g, s0))
            o_full, s_full = gated_scan(ar, Q, K, Vv, G, S0)
            o_zero, _ = gated_scan(ar, Q, K, Vv, G)
            b = ar.cumsum(G, axis=2)
            last = b[..., -1:, :]
            o_id = o_zero + initial_readout(ar, Q, ar.exp(b), S0)
            s_id = final_state(ar, K, Vv, ar.exp(last - b), ar.exp(last), S0)
            assert np.max(np.abs(ar.to_float64(o_full - o_id))) < 1e-50
            assert np.max(np.abs(ar.to_float64(s_full - s_id))) < 1e-50


@pytest.mark.parametrize("name", RECURRENT)
def test_split_sequence_with_state_passing_equals_one_pass(name):
    N, cs = 29, 8
    q, k, v, ex = make(name, N=N, seed=10)
    var = V.get(name)

    def cut(x, a, b):
        return x[:, :, a:b] if x.ndim >= 3 and x.shape[2] == N else x

    full_ref, s_ref = var.reference(q, k, v, causal=True, output_final_state=True, **ex)
    for t in (16, 13):  # on and off a chunk boundary
        ex1 = {n: cut(x, 0, t) for n, x in ex.items()}
        ex2 = {n: cut(x, t, N) for n, x in ex.items()}
        # the reference: exact identity (to float64 rounding)
        o1, s1 = var.reference(q[:, :, :t], k[:, :, :t], v[:, :, :t], causal=True, output_final_state=True, **ex1)
        o2, s2 = var.reference(
            q[:, :, t:], k[:, :, t:], v[:, :, t:], causal=True, output_final_state=True, initial_state=s1, **ex2
        )
        np.testing.assert_allclose(np.concatenate([o1, o2], axis=2), full_ref, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(s2, s_ref, rtol=1e-12, atol=1e-12)
        for form in var.forms:
            for dtype in ("float64", "float32"):
                kw = {"dtype": dtype, "chunk_size": cs, "output_final_state": True}
                a1, st1 = run(name, form, q[:, :, :t], k[:, :, :t], v[:, :, :t], ex1, **kw)
                a2, st2 = run(name, form, q[:, :, t:], k[:, :, t:], v[:, :, t:], ex2, initial_state=st1, **kw)
                out = torch.cat([a1, a2], dim=2).double().numpy()
                f = check_agreement("split", out, name, q, k, v, causal=True, dtype=dtype, **ex)
                assert f.passed, (t, form, dtype, f)
                tol = 1e-12 if dtype == "float64" else 1e-4
                np.testing.assert_allclose(st2.double().numpy(), s_ref, rtol=tol, atol=tol * np.abs(s_ref).max())


@pytest.mark.parametrize("name", RECURRENT)
def test_final_state_obeys_the_gated_state_bound_tightly(name):
    """|S_N| <= max_s |k_s||v_s|^T (1 - a^N)/(1 - a) (proofs/gated-state-bound.md), with a the decay bound;
    equality for constant k, v >= 0 and constant decay a."""
    from gramcheck.bounds import gated_state_bound

    var = V.get(name)
    mod = __import__(f"gramcheck.variants.{name}", fromlist=["decay_bound"])
    H = 2 if name == "lightning" else 1
    N, d = 40, 3
    params = {"layer_idx": 0, "num_layers": 2} if name == "lightning" else {}
    # random inputs: the bound holds
    q, k, v, ex = make(name, H=H, N=N, d=d, seed=11)
    if name == "lightning":  # head 0 has no decay: keep only head 1 (lambda = e^-4)
        q, k, v = q[:, 1:2], k[:, 1:2], v[:, 1:2]
        alpha = float(np.exp(-4.0))
    else:
        alpha = mod.decay_bound(params, ex, H)
    _, s = (
        var.reference(q, k, v, causal=True, output_final_state=True, **ex)
        if name != "lightning"
        else (None, _lightning_head1_state(q, k, v))
    )
    assert np.all(np.abs(s) <= gated_state_bound(k, v, alpha) * (1 + 1e-12))
    # constant inputs: tight
    kc, vc = np.ones((1, 1, N, d)), np.full((1, 1, N, d), 2.0)
    a = 0.5
    exc = {"g": np.full((1, 1, N), np.log(a))} if name == "mamba2" else {}
    if name == "rwkv6":
        exc = {"g": np.full((1, 1, N, d), np.log(a)), "u": np.zeros((1, d))}
    if name == "lightning":
        a = float(np.exp(-4.0))
        sc = _lightning_head1_state(kc, kc, vc)
    else:
        _, sc = var.reference(kc, kc, vc, causal=True, output_final_state=True, **exc)
    exact = 2.0 * (1 - a**N) / (1 - a)
    np.testing.assert_allclose(sc, exact, rtol=1e-14)
    assert np.max(sc / gated_state_bound(kc, vc, a)) > 1 - 1e-12


def _lightning_head1_state(q, k, v):
    """Final state of head 1 of a 2-head Lightning layer (lambda = e^-4) fed (q, k, v) in that head."""
    z = np.zeros_like(q)
    _, s = V.get("lightning").reference(
        np.concatenate([z, q], 1),
        np.concatenate([z, k], 1),
        np.concatenate([z, v], 1),
        causal=True,
        output_final_state=True,
    )
    return s[:, 1:2]


# --------------------------------------------------------------------------------------------------
# gradients
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_gradcheck_float64(name):
    q, k, v, ex = make(name, N=5, d=2, seed=12)
    var = V.get(name)
    names = sorted(ex)
    stateful = name in RECURRENT
    s0 = np.random.default_rng(1).standard_normal((1, 2, 2, 2))

    def f(form, *xs):
        extras = dict(zip(names, xs[3 : 3 + len(names)], strict=True))
        if stateful:  # gradients through S_0 and the final state too
            extras.update(initial_state=xs[-1], output_final_state=True)
        return var.torch(*xs[:3], causal=True, form=form, chunk_size=2, **extras)

    for form in var.forms_for(True):
        ins = [tt(x, grad=True) for x in (q, k, v, *(ex[n] for n in names))]
        if stateful:
            ins.append(tt(s0, grad=True))
        ok = torch.autograd.gradcheck(lambda *xs, form=form: f(form, *xs), tuple(ins), eps=1e-6, atol=1e-6, rtol=1e-4)
        assert ok, (name, form)


# --------------------------------------------------------------------------------------------------
# fla's naive references (loaded by file path; they compute in float32)
# --------------------------------------------------------------------------------------------------
def _fla_file(op, filename):
    spec_fla = importlib.util.find_spec("fla")
    if spec_fla is None or spec_fla.origin is None or importlib.util.find_spec("einops") is None:
        pytest.skip("fla-core and einops are needed")
    path = Path(spec_fla.origin).parent / "ops" / op / filename
    spec = importlib.util.spec_from_file_location(f"fla_naive_{op}_{filename[:-3]}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _bthk(x):
    return tt(x, "float32").transpose(1, 2).contiguous()


def test_mamba2_matches_fla_simple_gla_naive():
    fla = _fla_file("simple_gla", "naive.py")
    q, k, v, ex = make("mamba2", B=2, H=2, N=70, d=4, dtype="float32", seed=13)
    s0 = round_to(np.random.default_rng(0).standard_normal((2, 2, 4, 4)), "float32")
    g = tt(ex["g"], "float32").transpose(1, 2)  # (B, T, H)
    o1, s1 = fla.naive_recurrent_simple_gla(
        _bthk(q), _bthk(k), _bthk(v), g, scale=1.0, initial_state=tt(s0, "float32"), output_final_state=True
    )
    o2, s2 = fla.naive_chunk_simple_gla(
        _bthk(q),
        _bthk(k),
        _bthk(v),
        g,
        initial_state=tt(s0, "float32"),
        output_final_state=True,
        chunk_size=16,
        scale=1.0,
    )
    ref, s_ref = V.get("mamba2").reference(q, k, v, causal=True, initial_state=s0, output_final_state=True, **ex)
    for o, s in ((o1, s1), (o2, s2)):
        f = check_agreement(
            "fla",
            o.transpose(1, 2).double().numpy(),
            "mamba2",
            q,
            k,
            v,
            causal=True,
            dtype="float32",
            initial_state=s0,
            **ex,
        )
        assert f.passed, f
        np.testing.assert_allclose(s.double().numpy(), s_ref, rtol=1e-5, atol=1e-5 * np.abs(s_ref).max())


def test_fla_naive_chunk_simple_gla_loses_strong_then_weak_decays():
    """Where fla differs: naive_chunk_simple_gla sums the log-decays in float32 (b ~ -4000, b_t - b_s ~ -0.01
    keep only 4000 * 2^-24 of the difference) and misses the float32 bound; its recurrent naive form and
    gramcheck's chunked SSD form (float64 cumulative sums) pass on the same input."""
    fla = _fla_file("simple_gla", "naive.py")
    N = 64
    q, k, v, ex = make("mamba2", B=1, H=1, N=N, d=4, dtype="float32", seed=3)
    g = np.full((1, 1, N), -0.01)
    g[:, :, 0] = -4000.0
    ex["g"] = round_to(g, "float32")
    gt = tt(ex["g"], "float32").transpose(1, 2)

    def agree(o):
        return check_agreement("a", o.double().numpy(), "mamba2", q, k, v, causal=True, dtype="float32", **ex)

    chunk = fla.naive_chunk_simple_gla(_bthk(q), _bthk(k), _bthk(v), gt, chunk_size=64, scale=1.0)[0]
    rec = fla.naive_recurrent_simple_gla(_bthk(q), _bthk(k), _bthk(v), gt, scale=1.0)[0]
    bad = agree(chunk.transpose(1, 2))
    assert not bad.passed and bad.measured > 10, bad
    assert agree(rec.transpose(1, 2)).passed
    assert agree(run("mamba2", "chunked", q, k, v, ex, dtype="float32", chunk_size=64)).passed


def test_rwkv6_matches_fla_naive():
    rec = _fla_file("rwkv6", "recurrent_naive.py")
    chk = _fla_file("rwkv6", "chunk_naive.py")
    q, k, v, ex = make("rwkv6", B=1, H=2, N=64, d=4, dtype="float32", seed=14)
    args = [tt(x, "float32") for x in (q, k, v, ex["g"], ex["u"])]
    o1, _ = rec.naive_recurrent_rwkv6(*args, scale=0.5)
    f = check_agreement("fla", o1.double().numpy(), "rwkv6", q, k, v, causal=True, dtype="float32", scale=0.5, **ex)
    assert f.passed, f
    o2 = chk.naive_chunk_rwkv6(*args, chunk_size=16)  # applies no scale
    f = check_agreement("fla", o2.double().numpy(), "rwkv6", q, k, v, causal=True, dtype="float32", scale=1.0, **ex)
    assert f.passed, f


def test_lightning_matches_fla_slope_schedule_and_naive():
    fla = _fla_file("simple_gla", "naive.py")
    from gramcheck.variants.lightning import log_decays

    H, L = 4, 2
    for layer in (0, 1):  # fla: g_gamma = -(8 / H * (1 - layer_idx / L)) * arange(H) in float32
        fla_g = -(8 / H * (1 - layer / L)) * torch.arange(H, dtype=torch.float)
        np.testing.assert_array_equal(fla_g.double().numpy(), log_decays(H, layer, L))  # exact in float32 here
    q, k, v, _ = make("lightning", H=H, N=40, d=4, dtype="float32", seed=15)
    g = (-(8 / H) * torch.arange(H, dtype=torch.float)).reshape(1, 1, H).expand(1, 40, H)
    o, _ = fla.naive_recurrent_simple_gla(_bthk(q), _bthk(k), _bthk(v), g)
    f = check_agreement("fla", o.transpose(1, 2).double().numpy(), "lightning", q, k, v, causal=True, dtype="float32")
    assert f.passed, f


def test_based_matches_fla_naive():
    fla = _fla_file("based", "naive.py")
    q, k, v, _ = make("based", H=2, N=256, d=4, dtype="float32", seed=16)
    a = [tt(x, "float32") for x in (q, k, v)]
    for o in (fla.naive_parallel_based(*a, use_norm=True), fla.naive_chunk_based(*a, chunk_size=64)):
        f = check_agreement(
            "fla", o.double().numpy(), "based", q[:, :, :], k, v, causal=True, dtype="float32", eps=1e-6
        )
        assert f.passed, f


# --------------------------------------------------------------------------------------------------
# Based's normaliser bound (proofs/based-normaliser.md)
# --------------------------------------------------------------------------------------------------
def test_based_denominator_bound_holds_and_is_tight():
    rng = np.random.default_rng(17)
    for causal in (True, False):
        for _ in range(5):
            q, k = (3 * rng.standard_normal((1, 2, 20, 4)) for _ in range(2))
            den = denominators(F64, q, k, causal=causal)
            assert np.all(den >= normaliser_lower_bound(key_counts(20, causal)) * (1 - 1e-12))
    # z = q . k / sqrt(d) = -1 for every pair: kernel 1/2 everywhere, den_i = n_i / 2 exactly
    d, N = 4, 12
    q = np.zeros((1, 1, N, d))
    k = np.zeros((1, 1, N, d))
    q[..., 0], k[..., 0] = 1.0, -2.0  # q . k = -2 = -sqrt(d)
    for causal in (True, False):
        ball = denominators(BALL_F64, q, k, causal=causal)  # encloses the exact den_i
        den, rad = BALL_F64.to_float64(ball)[0, 0], BALL_F64.radius(ball)[0, 0]
        lower = normaliser_lower_bound(key_counts(N, causal))
        assert np.all(np.abs(den - lower) <= rad) and np.all(rad <= 1e-13 * lower)  # equality, exactly


# --------------------------------------------------------------------------------------------------
# the builtin targets against their own catalogue
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_builtin_passes_its_catalogue(name):
    from gramcheck.api import check

    rep = check(f"builtin:{name}", causal=True, dtype="float32", domain={"max_n": 16, "max_d": 8})
    assert len(rep.findings) >= 5
    assert rep.passed, [(f.name, f.measured, f.details) for f in rep.failures]


@pytest.mark.parametrize("name", ["rwkv6", "lightning"])
def test_scale_rules_reach_the_reference_and_the_forms(name):
    """scale="d^-1" means 1/d in the reference and in the torch forms (hyperparams.scale_value)."""
    from gramcheck.inputs import draw_extras

    var = V.get(name)
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 9, 4)) for _ in range(3))
    extras = draw_extras(var.inputs, {"B": 1, "H": 2, "N": 9, "dk": 4, "dv": 4, "m": 8}, dtype="float64", seed=1)
    rule = var.reference(q, k, v, causal=True, scale="d^-1", **extras)
    assert np.array_equal(rule, var.reference(q, k, v, causal=True, scale=0.25, **extras))
    t = {n: torch.as_tensor(x) for n, x in {"q": q, "k": k, "v": v, **extras}.items()}
    out = var.torch(t.pop("q"), t.pop("k"), t.pop("v"), causal=True, scale="d^-1", **t)
    assert np.allclose(out.numpy(), rule, rtol=1e-10, atol=1e-12)
