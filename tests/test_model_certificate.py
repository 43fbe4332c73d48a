"""One pass for the rounding bound and the truth: the rounding model's radii, scaled by lambda =
``RoundingModel.float64_scale``, bound the error of its float64 midpoints (proofs/ball-arithmetic.md,
"One pass for the rounding bound and the truth"). Checked against the definition evaluated in mpmath
at 400 bits on adversarial inputs, for tightness, and against deliberate breaks."""

import numpy as np
import pytest

import gramcheck.agreement as agreement
from gramcheck import variants as V
from gramcheck.agreement import check_agreement, naive_definition, rounding_evaluation
from gramcheck.arith import BALL_F64, MP, RoundingModel, rounding_model
from gramcheck.featuremaps import random_projection
from gramcheck.oracle import truth, truth_given
from gramcheck.precision import round_to

HI = MP(400)


def _excess(value, bound, exact_mp):
    """max over entries of |value - exact| / bound, |value - exact| computed in mpmath and rounded up
    (> 1: the bound does not contain the exact value)."""
    with HI.context():
        d = HI.to_float64(np.abs(np.asarray(exact_mp, dtype=object) - HI.asarray(value)))
    d = d * (1 + 2.0**-50)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(d == 0, 0.0, d / bound)
    return float(np.max(r))


def _case(name, seed=0):
    """(variant, q, k, v, kwargs): adversarial inputs, B = 1, N = 12, d = 4."""
    rng = np.random.default_rng(seed)
    B, H, N, d = 1, 1, 12, 4
    q, k, v = (rng.standard_normal((B, H, N, d)) for _ in range(3))
    kw = {"causal": True}
    if name == "softmax-large-logits":  # logits ~ 1e3: weights underflow far below the row maximum
        return "softmax", q * 12, k * 12, v, {"causal": False}
    if name == "softmax-cancel":  # near-duplicate keys, opposite values: outputs cancel to ~1e-9
        k[..., 1::2, :] = k[..., 0::2, :] * (1 + 1e-9)
        v[..., 1::2, :] = -v[..., 0::2, :]
        return "softmax", q, k, v, {"causal": False}
    if name == "linear-elu-cancel":
        k[..., 1::2, :] = k[..., 0::2, :] * (1 + 1e-11)
        v[..., 1::2, :] = -v[..., 0::2, :]
        return "linear-elu", q, k, v, kw
    if name == "linear-elu-small-denominators":  # phi(q) = exp(q) ~ 1e-13 in every channel
        return "linear-elu", q - 30.0, k - 3.0, v * 1e3, kw
    if name == "performer-underflow":  # |x|^2 / 2 ~ 1e3: features underflow, stabilisers shift them back
        return "performer-positive", q * 10, k * 10, v, {"causal": False, "projection": random_projection(8, d, seed=1)}
    if name == "performer-cancel":
        k[..., 1::2, :] = k[..., 0::2, :]
        v[..., 1::2, :] = -v[..., 0::2, :] * (1 + 1e-10)
        return "performer-positive", q, k, v, {**kw, "projection": random_projection(8, d, seed=1)}
    if name == "gla-strong-decay":  # alpha ~ 1e-6 per step: the state forgets within a token
        return "gla", q, k, v, {**kw, "g": np.full((B, H, N, d), np.log(1e-6)) * 16, "gate_tau": 16.0}
    if name == "gla-cancel":  # alpha ~ 1 - 1e-12: long memory, values cancelling
        k[..., 1::2, :] = k[..., 0::2, :] * (1 + 1e-11)
        v[..., 1::2, :] = -v[..., 0::2, :]
        return "gla", q, k, v, {**kw, "g": np.full((B, H, N, d), -1e-12)}
    if name == "retnet-cancel":
        q, k, v = (np.repeat(x, 2, axis=1) for x in (q, k, v))  # H = 2: two decays
        k[..., 1::2, :] = k[..., 0::2, :] * (1 + 1e-11)
        v[..., 1::2, :] = -v[..., 0::2, :]
        return "retnet", q, k, v, kw
    if name == "retnet-ill":  # large values with small queries: outputs dominated by rounding of big terms
        return "retnet", q * 1e-8, k * 1e8, v * 1e150, kw
    if name == "deltanet-cancel":
        k[..., 1::2, :] = k[..., 0::2, :] * (1 + 1e-11)
        v[..., 1::2, :] = -v[..., 0::2, :]
        return "deltanet", q, k, v, {**kw, "beta": rng.uniform(0.9, 1.0, (B, H, N))}
    if name == "deltanet-strong":  # beta near 2: the transition along k reflects
        return "deltanet", q, k, v, {**kw, "beta": rng.uniform(1.9, 2.0, (B, H, N))}
    raise KeyError(name)


CASES = [
    "softmax-large-logits",
    "softmax-cancel",
    "linear-elu-cancel",
    "linear-elu-small-denominators",
    "performer-underflow",
    "performer-cancel",
    "gla-strong-decay",
    "gla-cancel",
    "retnet-cancel",
    "retnet-ill",
    "deltanet-cancel",
    "deltanet-strong",
]


def _certificate(case, scale=1.0):
    """(the model's float64 certificate, with its lambda times ``scale``; the exact value in mpmath)."""
    name, q, k, v, kw = _case(case)
    model = rounding_model("float32")
    model.float64_scale *= scale
    ball = V.get(name).reference(q, k, v, arith=model, **kw)
    return model.float64_certificate(ball), V.get(name).reference(q, k, v, arith=HI, **kw), (name, q, k, v, kw)


@pytest.mark.parametrize("case", CASES)
def test_the_scaled_model_radius_contains_the_exact_value(case):
    cert, exact, (name, q, k, v, kw) = _certificate(case)
    assert cert is not None  # no branch straddled, no square root reached 0
    value, bound = cert
    assert np.all(np.isfinite(bound))
    assert _excess(value, bound, exact) <= 1.0
    # the value is the float64 reference, and the bound as tight as the float64 ball's own radius
    np.testing.assert_array_equal(value, V.get(name).reference(q, k, v, **kw))
    r64 = BALL_F64.radius(V.get(name).reference(q, k, v, arith=BALL_F64, **kw))
    assert np.all(r64 <= bound) and np.all(bound <= 1.001 * r64)


def test_the_bound_is_nearly_tight_somewhere():
    """Not vacuous: float64's actual error reaches a quarter of the bound (gla with strong decays:
    the output is a few exact products, each rounded once)."""
    cert, exact, _ = _certificate("gla-strong-decay")
    assert _excess(*cert, exact) > 0.25


@pytest.mark.parametrize("case", ["gla-strong-decay", "gla-cancel"])
def test_a_too_small_lambda_is_caught(case):
    """The check above can fail: lambda / 16 leaves exact values outside."""
    cert, exact, _ = _certificate(case, scale=2.0**-4)
    assert _excess(*cert, exact) > 1.0


def _sqrt_at_zero(model):
    """sqrt((1 + t) - 1) for t = 1e-17: float64 computes sqrt(0) = 0; the exact value is 3.16e-9."""
    with model.context():
        return model.sqrt((model.asarray(np.array([1.0])) + 1e-17) - 1.0)


def test_a_square_root_reaching_zero_gives_no_certificate(monkeypatch):
    model = rounding_model("float32")
    ball = _sqrt_at_zero(model)
    assert not model.scales and model.float64_certificate(ball) is None
    exact = [HI.sqrt(HI.asarray(np.array([1e-17])))[0]]
    assert _excess(model.to_float64(ball), model.radius(ball), exact) <= 1.0  # the model's own ball holds
    # the deliberate break: without the fallback, the scaled radius would miss the exact value
    monkeypatch.setattr(RoundingModel, "sqrt", lambda self, x: super(RoundingModel, self).sqrt(x))
    broken = rounding_model("float32")
    value, bound = broken.float64_certificate(_sqrt_at_zero(broken))
    assert _excess(value, bound, exact) > 1e3


def test_a_straddling_branch_gives_no_certificate():
    model = rounding_model("float32")
    with model.context():
        x = (model.asarray(np.array([1.0, 2.0])) + 1e-17) - 1.0  # midpoints 0 and 1, radii ~ 6e-8
        model.where_pos(x, x * 3.0 + 1.0, model.exp(x))  # at 0 both branches are 1: the same value
        assert model.scales
        y = x - 1e-9  # straddles 0 with branches 1 - 2e-9 and 1 - 1e-9
        model.where_pos(y, y * 2.0 + 1.0, y + 1.0)
    assert not model.scales


def test_float64_targets_scale_by_one():
    """eta_64 = 2^-1074 is the float64 model's own eta: lambda = 1 (the model radius itself)."""
    assert rounding_model("float64").float64_scale == 1.0
    m32 = rounding_model("float32")
    assert m32.float64_scale == 2.0**-29 and m32.float64_scale * m32.b.u >= 2.0**-53


def _benign(name, N=32, d=8, dtype="float32"):
    rng = np.random.default_rng(3)
    q, k, v = (round_to(rng.standard_normal((2, 1, N, d)), dtype) for _ in range(3))
    kw = {"causal": True}
    if name == "gla":
        kw["g"] = round_to(np.log(rng.uniform(0.9, 0.999, (2, 1, N, d))), dtype)
    return q, k, v, kw


def _no_truth(*a, **kw):
    raise AssertionError("the separate truth pass ran")


@pytest.mark.parametrize("name", ["softmax", "linear-elu", "gla"])
def test_agreement_on_benign_float32_needs_no_second_pass(name, monkeypatch):
    q, k, v, kw = _benign(name)
    out = naive_definition(name, q, k, v, dtype="float32", **kw)
    monkeypatch.setattr("gramcheck.oracle.truth", _no_truth)
    monkeypatch.setattr(agreement, "truth", _no_truth)
    f = check_agreement("agreement", out, name, q, k, v, dtype="float32", **kw)
    assert f.passed and f.details["oracle"] == "float64"


@pytest.mark.parametrize(("name", "dtype", "N"), [("linear-elu", "float32", 32), ("softmax", "bfloat16", 300)])
def test_agreement_verdicts_are_those_of_the_separate_truth(name, dtype, N, monkeypatch):
    """Same verdicts and ratios (to the truth bounds' few parts in 1e6) as with the separate truth, for
    a passing and a failing output; bfloat16 at N = 300 (gamma_n infinite: no certificate is met) falls
    back to the separate truth."""
    q, k, v, kw = _benign(name, N=N, dtype=dtype)
    good = naive_definition(name, q, k, v, dtype=dtype, **kw)
    bad = good + 0.05 * np.abs(good).max()
    new = [check_agreement("a", o, name, q, k, v, dtype=dtype, **kw) for o in (good, bad)]
    ev = rounding_evaluation(name, q, k, v, dtype=dtype, **kw)
    assert ev.certificate is not None and (dtype == "float32") == bool(np.all(np.isfinite(ev.certificate[1])))
    monkeypatch.setattr(RoundingModel, "float64_certificate", lambda self, x: None)
    old = [check_agreement("a", o, name, q, k, v, dtype=dtype, **kw) for o in (good, bad)]
    assert [f.passed for f in new] == [f.passed for f in old] == [True, False]
    for a, b in zip(new, old, strict=True):
        assert a.measured == pytest.approx(b.measured, rel=1e-5)
        assert a.details["judged_by"] == b.details["judged_by"]


def test_truth_given_escalates_only_what_the_certificate_misses():
    """Entries the given certificate meets are kept; the batch item it misses gets the truth's."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((3, 1, 8, 4)) for _ in range(3))
    ref = V.get("softmax").reference(q, k, v)
    bound = np.full(ref.shape, 1e-14)
    bound[1, 0, 5] = np.inf  # item 1, token 5: the causal prefix 0..5 of item 1 is recomputed
    t = truth_given("softmax", q, k, v, (ref, bound), causal=True, digits=None, atol=1e-12)
    full = truth("softmax", q[1:2], k[1:2], v[1:2], causal=True, digits=None, atol=1e-12)
    assert t.met and t.tried[0] == "float64 (given)" and t.tried[1:] == ["float64-coarse"]
    np.testing.assert_array_equal(t.bound[[0, 2]], bound[[0, 2]])
    np.testing.assert_array_equal(t.value[1, :, :6], full.value[0, :, :6])
    np.testing.assert_array_equal(t.bound[1, :, 6:], bound[1, :, 6:])
    np.testing.assert_array_equal(
        t.bound[1, :, :6],
        truth("softmax", q[1:2, :, :6], k[1:2, :, :6], v[1:2, :, :6], causal=True, digits=None, atol=1e-12).bound[0],
    )
    with pytest.raises(ValueError, match="digits"):
        truth_given("softmax", q, k, v, (ref, bound), digits=None, atol=None)


def test_truth_given_slices_an_initial_state_with_its_batch_items():
    """The escalation slice keeps each batch item's initial state (it once passed the whole batch's)."""
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((3, 1, 6, 4)) for _ in range(3))
    g = np.log(rng.uniform(0.5, 0.9, (3, 1, 6, 4)))
    s0 = rng.standard_normal((3, 1, 4, 4))
    kw = {"causal": True, "g": g, "initial_state": s0}
    ref = V.get("gla").reference(q, k, v, **kw)
    bound = np.full(ref.shape, 1e-12)
    bound[2, 0, 3] = np.inf
    t = truth_given("gla", q, k, v, (ref, bound), digits=None, atol=1e-10, **kw)
    sub = truth("gla", q[2:], k[2:], v[2:], causal=True, g=g[2:], initial_state=s0[2:], digits=None, atol=1e-10)
    assert t.met
    np.testing.assert_array_equal(t.value[2, :, :4], sub.value[0, :, :4])
