"""The rounding model's underflow: gradual underflow by default, and kernels that flush results below the
smallest normal to zero where the target declares it (``subnormals="flush"``); a flushing unit charged to
every operation passed wrong outputs, so flushing is charged only where a result may fall below the
smallest normal (proofs/fp-forward-error.md, "Underflow" and "Flushing kernels")."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import gramcheck.agreement as A
from gramcheck.arith import rounding_model, subnormals
from gramcheck.targets import builtin


@pytest.fixture
def flushing():
    """torch on this CPU with FTZ/DAZ set, as a GPU kernel built with -ftz (or Triton's exp) computes."""
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush denormals")
    yield
    torch.set_flush_denormal(False)


def _agreement(scale: float) -> tuple[np.ndarray, object]:
    """RetNet, d = 1, one token: o = q k v with q k = 0.9 * 2^-126 * scale, computed by the builtin."""
    t = builtin("retnet", dtype="float32")
    q, k, v = (np.full((1, 1, 1, 1), x) for x in (0.9 * scale * 2.0**-63, 2.0**-63, 1.0))
    out = t(q, k, v, causal=True)
    return out, A.check_agreement("agreement", out, t.variant, q, k, v, causal=True, dtype="float32", **t.params)


def test_a_kernel_that_flushes_subnormals_fails_the_gradual_model_and_is_not_judged_where_flushing_reaches(
    flushing,
):
    """q k = 0.9 * 2^-126 is flushed to 0: the error is 0.9 * 2^-126. Against gradual underflow's charges
    (2^-150 per result) this correct kernel fails by a factor of about 10^6. Declared flushing may move
    the output by more than its magnitude (four results charged 2^-126: q k, the scale, the decay and v):
    the entry is not judged, and the Finding says so."""
    out, f = _agreement(1.0)
    assert out.item() == 0.0
    assert not f.passed and f.measured > 1e5, f
    with subnormals("flush"):
        _, f = _agreement(1.0)
    assert f.passed and f.details["unjudged"] == ["output"] and f.details["flushed_entries"] == 1, f


def _flushed(fn, *xs):
    """fn(*xs) in float32 torch with FTZ/DAZ set, as float64."""
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush denormals")
    try:
        return fn(*(torch.tensor(x, dtype=torch.float32) for x in xs)).double().numpy()
    finally:
        torch.set_flush_denormal(False)


def _run_flushing(t, q, k, v, **ex):
    """The target's causal output computed under FTZ/DAZ (its worker thread is created inside, so it flushes)."""
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush denormals")
    try:
        return t(q, k, v, causal=True, **ex)
    finally:
        torch.set_flush_denormal(False)


def _flush_model():
    with subnormals("flush"):
        return rounding_model("float32")


def test_the_flushing_charge_of_an_inner_product_is_tight_where_every_product_is_flushed():
    """16 positive products of 0.99 * 2^-126 each: a flushing kernel returns 0, an error of 15.84 * 2^-126;
    the model charges 2^-126 per product and nothing for the additions (products of one sign)."""
    a, b = np.full((1, 16), 0.99 * 2.0**-63), np.full((16, 1), 2.0**-63)
    exact = 16 * 0.99 * 2.0**-126
    got = _flushed(torch.matmul, a, b)
    assert got.item() == 0.0
    model = _flush_model()
    radius = model.radius(model.matmul(model.asarray(a), model.asarray(b))).item()
    assert exact <= radius <= exact / 0.98, radius / exact


def test_a_partial_sum_that_cancels_below_the_smallest_normal_is_charged():
    """1.5 * 2^-126 - 2^-126: two normal products whose sum 0.5 * 2^-126 a flushing kernel returns as 0.
    Gradual underflow returns it exactly; the flushing model charges the one addition of mixed signs."""
    a, b = np.array([[1.5 * 2.0**-63, -(2.0**-63)]]), np.array([[2.0**-63], [2.0**-63]])
    assert _flushed(torch.matmul, a, b).item() == 0.0
    model = _flush_model()
    x = model.matmul(model.asarray(a), model.asarray(b))
    assert model.radius(x).item() >= 0.5 * 2.0**-126
    s = model.sum(model.asarray(np.array([1.5 * 2.0**-126, -(2.0**-126)])), axis=0)
    assert model.radius(s).item() >= 0.5 * 2.0**-126
    c = model.cumsum(model.asarray(np.array([2.0**-125, -(2.0**-126), 2.0**-125])), axis=0)
    assert model.radius(c)[1] >= 2.0**-126 and model.radius(c)[0] < 2.0**-140
    d = model.asarray(np.array([1.5 * 2.0**-126])) + model.asarray(np.array([-(2.0**-126)]))
    assert model.radius(d).item() >= 0.5 * 2.0**-126
    gradual = rounding_model("float32")
    assert gradual.radius(gradual.sum(gradual.asarray(np.array([1.5 * 2.0**-126, -(2.0**-126)])), axis=0)) < 2.0**-140


def test_sums_of_one_sign_and_normal_results_are_not_charged_for_flushing():
    model = _flush_model()
    s = model.sum(model.asarray(np.array([2.0**-126, 0.0, 3 * 2.0**-126])), axis=0)
    assert model.radius(s).item() < 2.0**-133  # rounding alone, no 2^-126
    p = model.matmul(model.asarray(np.full((2, 8), 2.0**-60)), model.asarray(np.full((8, 2), 2.0**-60)))
    assert np.all(model.radius(p) < 2.0**-133)


def test_a_subnormal_operand_reads_as_zero_under_flushing():
    """DAZ: 2^-130 times 2^10 is 2^-120 exactly, and 0 for a kernel that reads the operand as 0."""
    x, y = np.array([2.0**-130]), np.array([2.0**10])
    assert _flushed(torch.mul, x, y).item() == 0.0
    model = _flush_model()
    assert model.radius(model.asarray(x) * model.asarray(y)).item() >= 2.0**-120


def test_flushing_leaves_float16_on_the_gradual_model():
    with subnormals("flush"):
        assert rounding_model("float16").name == "ball-model-float16"
        assert rounding_model("bfloat16").name == "ball-model-bfloat16-flush"
    with pytest.raises(ValueError, match="subnormals"):
        with subnormals("ftz"):
            pass


@pytest.mark.parametrize("exponent, factor", [(-60, 1.01), (-60, 1.03), (-61, 1.10)])
def test_outputs_a_few_percent_off_fail_where_no_result_underflows(exponent, factor):
    """RetNet, float32, N = 64, d = 16, q = 2^e, k = 2^(e+1), v > 0.5: every product q_ti s k_ji
    gamma^(t-j) is a normal float32 number above 1.08 * 2^-126, so no kernel flushes and the builtin errs
    3e-7. Outputs 1-10% off fail; with a flushing eta (2^-126) charged to every operation they passed the
    worst-case tier (0.29, 0.88, 0.73: found by a hostile review)."""
    from gramcheck.oracle import truth
    from gramcheck.precision import round_to

    rng = np.random.default_rng(1)
    q = np.full((1, 1, 64, 16), 2.0**exponent)
    k = np.full((1, 1, 64, 16), 2.0 ** (exponent + 1))
    v = round_to(np.abs(rng.standard_normal((1, 1, 64, 16))) + 0.5, "float32")
    t = builtin("retnet", dtype="float32")
    tr = truth(t.variant, q, k, v, causal=True, **t.params).value

    def agreement(out):
        return A.check_agreement("agreement", out, t.variant, q, k, v, causal=True, dtype="float32", **t.params)

    assert agreement(t(q, k, v, causal=True)).passed
    assert not agreement(tr * factor).passed
    with subnormals("flush"):  # nothing can fall below the smallest normal here: the same verdicts
        assert agreement(t(q, k, v, causal=True)).passed
        assert not agreement(tr * factor).passed


def test_a_flushing_kernel_passes_on_normal_results_where_a_zero_output_fails(flushing):
    """At q k = 0.9 * 2^-118, above the flushing range, the flushing kernel computes the result and passes,
    and an output of 0 fails."""
    t = builtin("retnet", dtype="float32")
    q, k, v = (np.full((1, 1, 1, 1), x) for x in (0.9 * 2.0**-55, 2.0**-63, 1.0))
    assert A.check_agreement(
        "agreement", t(q, k, v, causal=True), t.variant, q, k, v, causal=True, dtype="float32", **t.params
    ).passed
    f = A.check_agreement("agreement", np.zeros((1, 1, 1, 1)), t.variant, q, k, v, causal=True, dtype="float32")
    assert not f.passed and f.measured > 20, f
    with subnormals("flush"):
        f = A.check_agreement("agreement", np.zeros((1, 1, 1, 1)), t.variant, q, k, v, causal=True, dtype="float32")
    assert not f.passed and f.measured > 20, f


@pytest.mark.parametrize(
    "dtype, eta", [("float32", 2.0**-149), ("bfloat16", 2.0**-133), ("float16", 2.0**-24), ("float64", 2.0**-1074)]
)
def test_the_rounding_models_underflow_unit_is_the_smallest_subnormal(dtype, eta):
    assert rounding_model(dtype).b.eta == eta


# --- the other algorithms' underflow share (gramcheck.algorithm_underflow) ------------------------------
def _delta_inputs(name: str, dtype: str, seed: int = 0, v_exponent: int = 0, g: float | None = None):
    """q, k ~ N(0, 1), v ~ N(0, 1) 2^v_exponent, beta uniform in [0, 2], gates drawn ('mixed') or all g."""
    from gramcheck.inputs import draw_log_decay
    from gramcheck.precision import round_to
    from gramcheck.variants import get
    from gramcheck.variants.deltanet import draw_beta

    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((1, 2, 32, 8)) for _ in range(3))
    q, k, v = (round_to(x, dtype) for x in (q, k, v * 2.0**v_exponent))
    ex = {"beta": round_to(draw_beta(rng, (1, 2, 32), "uniform"), dtype)}
    if "g" in get(name).input_names:
        gates = draw_log_decay(rng, (1, 2, 32), "mixed") if g is None else np.full((1, 2, 32), g)
        ex["g"] = np.minimum(round_to(gates, dtype), 0.0)
    return q, k, v, ex


@pytest.mark.parametrize(
    "name, dtype, wrong, v_exponent, g",
    [
        *(
            (name, dtype, wrong, 0, None)
            for dtype in ("bfloat16", "float32", "float16")
            for name, wrong in (
                ("gated-deltanet", "last token zeroed"),
                ("gated-deltanet", "v_0 dropped"),
                ("deltanet", "v_0 dropped"),
            )
        ),
        ("deltanet", "bfloat16", "first token zeroed", -123, None),
        ("gated-deltanet", "float16", "v_0 dropped", -12, -5.0),
    ],
)
def test_the_underflow_share_passes_none_of_the_wrong_outputs_reviews_found(name, dtype, wrong, v_exponent, g):
    """The wrong delta-rule outputs that the largest bound over the algorithms passed in bfloat16 (the last
    token zeroed: 2.21 -> 0.57; v_0 dropped: 1.97 -> 0.55, and 2.68 -> 0.64 for DeltaNet), their float32
    and float16 twins, and those a hostile review passed when the model charged eta to every operation
    and every product: DeltaNet in bfloat16 with v 2^-123 and its first token (0.5-2.7 times the smallest
    normal) zeroed (0.87 against 2.13), Gated DeltaNet in float16 with v 2^-12 and v_0 dropped (0.78
    against 2.82). Each fails with the chunked algorithm's underflow share, to within 1% of its measure
    without it. At ordinary magnitudes no intermediate of the chunked algorithm can underflow and the
    share is exactly 0; in float16 it is never charged."""
    from gramcheck.algorithm_underflow import underflow_share
    from gramcheck.variants import get

    q, k, v, ex = _delta_inputs(name, dtype, v_exponent=v_exponent, g=g)
    t = builtin(name, dtype=dtype)
    out = np.array(t(q, k, v, causal=True, **ex), dtype=np.float64)
    if wrong == "last token zeroed":
        out[..., -1, :] = 0.0
    elif wrong == "first token zeroed":
        out[..., 0, :] = 0.0
    else:
        v0 = v.copy()
        v0[..., 0, :] = 0.0
        out = np.asarray(t(q, k, v0, causal=True, **ex), dtype=np.float64)
    kw = {**t.params, **ex}
    f = A.check_agreement("agreement", out, t.variant, q, k, v, causal=True, dtype=dtype, **kw)
    alone = A.check_agreement.__wrapped__("agreement", out, get(name), q, k, v, causal=True, dtype=dtype, **kw)
    assert not f.passed and f.details["algorithms_underflow"], f
    assert f.measured == pytest.approx(alone.measured, rel=1e-2)
    value = get(name).reference(q, k, v, causal=True, **kw)
    share = underflow_share(get(name), q, k, v, causal=True, dtype=dtype, like=value, **kw)
    assert (share.max() == 0.0) == (v_exponent == 0 or dtype == "float16")


def test_the_underflow_share_is_the_algorithms_charges_of_eta():
    """Gated DeltaNet from a large state through decays of e^-29 and e^-74 (tests/data, the input of
    test_yardsticks' subnormal-output test): the chunked algorithm evaluated in float32 (RoundedArith,
    gradual underflow) errs up to 31 subnormal units at entries of 3e-45, beyond the definition's bound,
    and within it plus the share; with eta = 0 in both evaluations the share vanishes, and it is charged
    where the chunked algorithm's cumulative decay is subnormal (tokens 4 on), nowhere before."""
    from pathlib import Path

    from helpers import raw_key_initial_state

    from gramcheck.algorithm_underflow import underflow_share
    from gramcheck.arith import RoundedArith
    from gramcheck.strategies import AttentionInputs
    from gramcheck.variants.deltanet import chunked_reference

    a = dict(np.load(Path(__file__).parent / "data" / "gated_deltanet_state_underflow.npz"))
    q, k, v = a.pop("q"), a.pop("k"), a.pop("v")
    t = builtin("gated-deltanet", dtype="float32")
    s0 = raw_key_initial_state(t, AttentionInputs(q, k, v, a, "outliers", "float32", {}))
    var = t.variant
    kw = {"causal": True, **t.params, **a, "initial_state": s0}
    exact = var.reference(q, k, v, **kw)
    out_share = underflow_share(var, q, k, v, dtype="float32", like=exact, **kw)
    ar = RoundedArith("float32")
    with np.errstate(all="ignore"):
        naive = ar.stored(var._run(chunked_reference, q, k, v, True, ar, {**t.params, **a, "initial_state": s0}))
    err = np.abs(naive - exact)
    definition = A.rounding_bound(var, q, k, v, dtype="float32", **kw)
    assert np.any(err > definition)
    assert np.all(err <= definition + 2 * out_share)
    assert out_share[..., :4, :].max() == 0 < out_share[..., 4:, :].max()


def test_the_underflow_share_on_a_two_token_decay_is_within_three_times_the_error():
    """How tight the share is: Gated DeltaNet, N = 2, d = 1, q = k = 1, v = 0, beta = 0, decays e^-47.4 and
    e^-53.0 from S_0 = 472 (the worst of 300 such draws). The output S_0 e^-100.3 is a float32 subnormal;
    the definition multiplies S_0 by each decay (normal values) and the chunked algorithm forms the
    cumulative decay, a subnormal, first, so in float32 it errs 2.7e-43, 191 times the definition's R
    and 0.41 of R + U_A. Most of the rest is exp's charge, a whole subnormal unit (it is trusted to one
    ulp) where this exp errs half of one (proofs/fp-forward-error.md, "Other algorithms' underflow"); a
    share 1.6 times as loose fails this test (with eta charged to every product, zeros included, it
    was 0.098)."""
    from gramcheck.algorithm_underflow import underflow_share
    from gramcheck.arith import RoundedArith
    from gramcheck.variants.deltanet import chunked_reference

    t = builtin("gated-deltanet", dtype="float32")
    var = t.variant
    q = k = np.ones((1, 1, 2, 1))
    v, beta = np.zeros((1, 1, 2, 1)), np.zeros((1, 1, 2))
    g = np.array([float.fromhex("-0x1.7ae56ap+5"), float.fromhex("-0x1.a79c2cp+5")]).reshape(1, 1, 2)
    s0 = np.full((1, 1, 1, 1), float.fromhex("0x1.d85f26p+8"))
    extras = {**t.params, "beta": beta, "g": g, "initial_state": s0}
    exact = var.reference(q, k, v, causal=True, **extras)
    ar = RoundedArith("float32")
    with np.errstate(all="ignore"):
        naive = ar.stored(var._run(chunked_reference, q, k, v, True, ar, extras))
    err = np.abs(naive - exact)[..., 1, 0]
    r_def = A.rounding_bound(var, q, k, v, causal=True, dtype="float32", **extras)[..., 1, 0] / A.REASSOCIATION_FACTOR
    share = underflow_share(var, q, k, v, causal=True, dtype="float32", like=exact, **extras)[..., 1, 0]
    assert np.all(err > 100 * r_def)
    assert np.all(err <= r_def + share) and np.all(err >= 0.25 * (r_def + share))


# --- the charges themselves (gramcheck.arith.BallArith._underflow) ----------------------------------------
def _ties_up(n: int) -> tuple[np.ndarray, np.ndarray]:
    """a = 1.5 and b_l = (4 l + 1) eta: each product (6 l + 1.5) eta is a tie between subnormals and
    rounds to the even one above, an error of +eta / 2, the most underflow can make."""
    eta = 2.0**-149
    return np.full(n, 1.5), (4 * np.arange(n) + 1) * eta


@pytest.mark.parametrize("zeros", [0, 5])
def test_an_inner_product_of_subnormal_products_errs_its_whole_charge(zeros):
    """float32 (numpy: each product rounded, the subnormal sum exact): the error is eta / 2 per nonzero
    product, which is what the model charges, to within its relative terms; zero products (here ``zeros``
    of 16) are charged nothing. Charged eta per product of the inner dimension, as before, the bound was 2
    and 2.9 times the error."""
    a, b = _ties_up(16)
    a[:zeros] = 0.0
    computed = np.sum(a.astype(np.float32) * b.astype(np.float32), dtype=np.float32)
    err = abs(float(computed) - float(np.dot(a, b)))
    assert err == (16 - zeros) * 2.0**-150
    ar = rounding_model("float32")
    with ar.context():
        bound = float(ar.radius(ar.matmul(a[None, :], b[:, None]))[0, 0])
    assert err <= bound <= 1.001 * err


def test_an_elementwise_product_is_charged_underflow_only_where_it_may_be_subnormal():
    """The product of 1.5 and (4 l + 1) eta errs eta / 2 (a tie, float32) and is charged that; a product
    whose ball lies above the smallest normal is charged u |y| only, and an exact zero nothing."""
    ar = rounding_model("float32")
    a, b = _ties_up(4)
    tiny = 2.0**-126
    with ar.context():
        sub = ar.radius(ar.asarray(a) * ar.asarray(b))
        normal = ar.radius(ar.asarray(a) * ar.asarray(b * 2.0**30))
        zero = ar.radius(ar.asarray(np.zeros(4)) * ar.asarray(b))
    err = np.abs((a.astype(np.float32) * b.astype(np.float32)).astype(np.float64) - a * b)
    assert np.all(err == 2.0**-150) and np.all(err <= sub) and np.all(sub <= 1.001 * err)
    y = a * b * 2.0**30
    assert np.all(y > tiny) and np.all(normal <= 1.001 * ar.b.u * y)
    assert np.all(zero == 0.0)


def test_an_exact_zero_output_is_bounded_by_zero_and_judged_exactly():
    """GLA in float64 with a query of zeros: its output is exactly 0 in every algorithm, and no product
    that reaches it is nonzero, so its bound is 0 (before, n eta). The builtin's exact 0 passes (0 against
    0 is no error, and the truth's certificate at an exact entry is exact, not rounded up to 2^-1074);
    one subnormal there fails."""
    from gramcheck.findings import error_ratios

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, 4, 2)) for _ in range(3))
    q[..., 1, :] = 0.0
    g = -rng.uniform(0, 0.01, (1, 1, 4, 2))
    t = builtin("gla", dtype="float64")
    kw = {**t.params, "g": g}
    out = np.asarray(t(q, k, v, causal=True, g=g), dtype=np.float64)
    assert np.all(out[..., 1, :] == 0.0)
    assert A.rounding_bound(t.variant, q, k, v, causal=True, dtype="float64", **kw)[..., 1, :].max() == 0.0
    ok = A.check_agreement("agreement", out, t.variant, q, k, v, causal=True, dtype="float64", **kw)
    assert ok.passed, ok
    off = out.copy()
    off[0, 0, 1, 0] = 2.0**-1074
    bad = A.check_agreement("agreement", off, t.variant, q, k, v, causal=True, dtype="float64", **kw)
    assert not bad.passed and bad.measured == np.inf, bad
    assert list(error_ratios([0.0, 1.0, 1.0, np.nan], [0.0, 0.0, 2.0, 1.0])) == [0.0, np.inf, 0.5, np.inf]


def test_an_exact_zero_output_of_the_delta_rule_passes_against_its_enclosure():
    """DeltaNet in float32 with q_0 = 0 (seed 1's ci check, N = 320, d = 1, found it): the first output is
    exactly 0 and its bound is 0; the delta rule's certified enclosure, which charges eta to every
    operation, left the truth 9e-302 wide there and the exact builtin failed at inf. The model's zero
    radius certifies the entry (``Truth.exact_where``); one subnormal there still fails."""
    from pathlib import Path

    ex = dict(np.load(Path(__file__).parent / "data" / "deltanet_f32_zero_first_query.npz"))
    q, k, v = ex.pop("q"), ex.pop("k"), ex.pop("v")
    assert np.all(q[..., 0, :] == 0.0)
    t = builtin("deltanet", dtype="float32")
    kw = {**t.params, **ex}
    out = np.asarray(t(q, k, v, causal=True, **ex), dtype=np.float64)
    assert np.all(out[..., 0, :] == 0.0)
    assert A.rounding_bound(t.variant, q, k, v, causal=True, dtype="float32", **kw)[..., 0, :].max() == 0.0
    ok = A.check_agreement("agreement", out, t.variant, q, k, v, causal=True, dtype="float32", **kw)
    assert ok.passed, ok
    out[0, 0, 0, 0] = 2.0**-149
    bad = A.check_agreement("agreement", out, t.variant, q, k, v, causal=True, dtype="float32", **kw)
    assert not bad.passed and bad.measured == np.inf, bad


def test_an_agreement_that_judged_no_inexact_entry_says_so():
    """Gated DeltaNet in bfloat16 with v ~ 2^-133 (bfloat16's smallest subnormal) and q_0 = 0 (a hostile
    review's case): every output is within a few subnormal units of 0, 120 of 128 entries are at the noise
    floor and the other 8 are exact (bound 0). Any output that is exact there passes, zeros included; the
    Finding says it judged no inexact entry (``details["unjudged"]``), which the check's note carries. At
    ordinary magnitudes the same Finding has no such mark."""
    from gramcheck.precision import round_to
    from gramcheck.variants.deltanet import draw_beta

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, 16, 8)) for _ in range(3))
    q[..., 0, :] = 0.0
    beta = draw_beta(rng, (1, 1, 16), "uniform")
    g = np.full((1, 1, 16), -0.5) * rng.uniform(0.5, 1, (1, 1, 16))
    t = builtin("gated-deltanet", dtype="bfloat16")
    for scale, marked in ((2.0**-133, True), (1.0, False)):
        qb, kb, vb = (round_to(x, "bfloat16") for x in (q, k, v * scale))
        ex = {"beta": round_to(beta, "bfloat16"), "g": np.minimum(round_to(g, "bfloat16"), 0.0)}
        out = np.asarray(t(qb, kb, vb, causal=True, **ex), dtype=np.float64)
        f = A.check_agreement("agreement", out, t.variant, qb, kb, vb, causal=True, dtype="bfloat16", **t.params, **ex)
        assert f.passed and (f.details.get("unjudged") == ["output"]) == marked, f.details


# --- declared flushing against the builtin forms under FTZ/DAZ ------------------------------------------
def _flushing_case(name: str, form: str):
    """A hostile review's inputs where the production forms' states flush and the definition's products
    do not: RetNet with q * 2^50, k, v * 2^-63; linear attention with v * 2^-122; Gated DeltaNet with
    v * 2^-116 (N = 40, d = 8, float32). The builtin form's output is computed under FTZ/DAZ."""
    from gramcheck.inputs import draw_log_decay
    from gramcheck.precision import round_to
    from gramcheck.variants.deltanet import draw_beta

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 40, 8)) for _ in range(3))
    scales, ex = {"retnet": (2.0**50, 2.0**-63, 2.0**-63), "linear-unnormalised": (1, 1, 2.0**-122)}, {}
    if name == "gated-deltanet":
        scales[name] = (1, 1, 2.0**-116)
        ex = {"beta": round_to(draw_beta(rng, (1, 2, 40), "uniform"), "float32")}
        ex["g"] = np.minimum(round_to(draw_log_decay(rng, (1, 2, 40), "mixed"), "float32"), 0.0)
    q, k, v = (round_to(x * s, "float32") for x, s in zip((q, k, v), scales[name], strict=True))
    t = builtin(name, form=form, dtype="float32")
    out = _run_flushing(t, q, k, v, **ex)

    def agreement(o):
        return A.check_agreement("agreement", o, t.variant, q, k, v, causal=True, dtype="float32", **ex, **t.params)

    return out, agreement, (q, k, v, ex, t)


@pytest.mark.parametrize("name", ["retnet", "linear-unnormalised", "gated-deltanet"])
@pytest.mark.parametrize("form", ["chunked", "recurrent"])
def test_flushing_forms_pass_when_declared_and_fail_under_gradual_underflow(name, form):
    """The forms' states flush (k v^T near 2^-126) where the definition's products do not: gradual
    underflow's bound fails these correct outputs by > 10^4; declared flushing passes them through the
    production orders' share (``Variant.orders_for``). An output 30% off fails wherever flushing cannot
    reach an entry's magnitude; where it can (638 of RetNet's 640 entries here: a correct flushing kernel
    errs 12%) it passes within the bound and the Finding counts those entries; NaN fails everywhere."""
    from gramcheck.oracle import truth

    out, agreement, (q, k, v, ex, t) = _flushing_case(name, form)
    f = agreement(out)
    assert not f.passed and f.measured > 1e4, f
    with subnormals("flush"):
        f = agreement(out)
        assert f.passed and f.measured > 0.01, f
        tr = truth(t.variant, q, k, v, causal=True, **ex, **t.params).value
        wrong, nan = agreement(tr * 1.3), agreement(np.full_like(tr, np.nan))
    assert not nan.passed and nan.measured == np.inf, nan
    if name == "retnet":
        assert f.details["flushed_entries"] > 0.9 * out.size and "reach of flushing" in f.details["note"], f.details
        assert wrong.passed and wrong.details["flushed_entries"] > 0.9 * out.size, wrong.details
    else:
        assert f.details["judged_by"]["worst-case"] > 0, f
        assert not wrong.passed and wrong.measured > 3, wrong


@pytest.mark.parametrize("name", ["mamba2", "gla", "linear-unnormalised"])
def test_a_flushing_charge_is_at_most_what_it_flushes(name):
    """A result far below 2^-126 errs by its own magnitude when flushed, not by 2^-126: exp(-100) after a
    state of 2^123 (mamba2, GLA: o_1 = 1 + 4e-7), and q k = 2^-200 before v = 2^121 (identity features:
    o_1 = 1). Charged 2^-126 each, outputs 1% off passed at 0.08 (a hostile review); charged
    min(2^-126, their magnitude) they fail, and the correct flushing kernels pass."""
    from gramcheck.oracle import truth
    from gramcheck.precision import round_to

    if name == "linear-unnormalised":
        q = np.array([1.0, 2.0**-100]).reshape(1, 1, 2, 1)
        k = np.array([2.0**-100, 2.0**100]).reshape(1, 1, 2, 1)
        v = np.array([2.0**121, 1.0]).reshape(1, 1, 2, 1)
        t, ex = builtin(name, form="recurrent", dtype="float32", feature="identity"), {}
    else:
        q = k = np.ones((1, 1, 3, 1))
        v = np.array([2.0**123, 1.0, 1.0]).reshape(1, 1, 3, 1)
        g = np.array([0.0, -100.0, 0.0]).reshape((1, 1, 3, 1) if name == "gla" else (1, 1, 3))
        t, ex = builtin(name, form="recurrent", dtype="float32"), {"g": round_to(g, "float32")}
    out = _run_flushing(t, q, k, v, **ex)
    tr = truth(t.variant, q, k, v, causal=True, **ex, **t.params).value
    with subnormals("flush"):
        f = A.check_agreement("agreement", out, t.variant, q, k, v, causal=True, dtype="float32", **ex, **t.params)
        wrong = tr.copy()
        wrong[..., 1:, :] *= 1.01
        w = A.check_agreement("agreement", wrong, t.variant, q, k, v, causal=True, dtype="float32", **ex, **t.params)
    assert f.passed, f
    assert not w.passed and w.measured > 100, w


def test_a_target_keeps_its_own_underflow_declaration():
    from gramcheck.api import check

    t = builtin("retnet", dtype="float32")
    with pytest.raises(ValueError, match="subnormals: got 'flush'"):
        check(t, causal=True, subnormals="flush", properties=["agreement"])


def test_the_orders_of_a_definition_equal_it_in_exact_arithmetic():
    """Every evaluation order a definition reaches computes the definition (float64, N = 70 across a chunk
    boundary), and the variants with no shared product reach none."""
    from gramcheck import variants
    from gramcheck.inputs import draw_extras
    from gramcheck.variants.common import evaluation_order

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 70, 4)) for _ in range(3))
    reached = {}
    for var in variants.list():
        ex = draw_extras(var.inputs, {"B": 1, "H": 2, "N": 70, "dk": 4, "dv": 4, "m": 8}, dtype="float64", seed=1)
        for causal in (True, False):
            if not causal and "causal-only" in var.tags():
                continue
            ref = var.reference(q, k, v, causal=causal, **ex)
            for order in var.orders_for(causal):
                with evaluation_order(order) as used:
                    got = var.reference(q, k, v, causal=causal, **ex)
                assert used[0]
                ok = np.isfinite(ref)
                np.testing.assert_allclose(got[ok], ref[ok], rtol=1e-9, atol=1e-12 * np.max(np.abs(ref[ok])))
            reached[var.name, causal] = var.orders_for(causal)
    assert reached["retnet", True] == ("recurrent", "chunked", "chunked-factored")
    assert reached["gla", True] == ("chunked",) and reached["mamba2", True] == ("chunked", "chunked-factored")
    assert reached["softmax", True] == () and reached["rwkv6", True] == () and reached["deltanet", True] == ()
    assert reached["linear-elu", False] == ("recurrent",)
    assert reached["performer-positive", True] == ()  # its linear form is listed (algorithms_for)


@pytest.mark.parametrize("name", ["retnet", "mamba2"])
def test_chunked_forms_that_factor_a_scalar_decay_into_the_queries_pass_when_declared(name):
    """The builtin chunked form (as fla's chunked simple-GLA) computes (q_t P_t) . (k_s / P_s): with q just
    above 2^-126 and a mild decay, q_t P_t flushes and every output is lost, where the per-pair scores of
    the plain chunked order stay normal. The 'chunked-factored' order charges it: the output passes, each
    entry counted within reach of flushing (a hostile review's false alarm at 1.67e5)."""
    from gramcheck.inputs import draw_extras
    from gramcheck.precision import round_to

    t = builtin(name, form="chunked", dtype="float32")
    ex = draw_extras(t.variant.inputs, {"B": 1, "H": 1, "N": 40, "dk": 4, "dv": 4}, dtype="float32", seed=0)
    if "g" in ex:
        ex["g"] = round_to(np.full(ex["g"].shape, -0.05), "float32")
    q = round_to(np.full((1, 1, 40, 4), 1.2 * 2.0**-126 / (0.5 if name == "retnet" else 1.0)), "float32")
    k = v = np.ones((1, 1, 40, 4))
    out = _run_flushing(t, q, k, v, **ex)
    assert np.mean(out == 0) > 0.5  # past the first rows every output is lost
    assert "chunked-factored" in t.variant.orders_for(True)
    with subnormals("flush"):
        f = A.check_agreement("agreement", out, t.variant, q, k, v, causal=True, dtype="float32", **ex, **t.params)
    assert f.passed and f.details["flushed_entries"] == out.size, f
