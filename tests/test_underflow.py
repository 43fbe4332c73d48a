"""Underflow in the rounding model: gradual underflow's unit on every operation; for a target declared to
flush subnormals to zero (``Target.subnormals``, ``precision.subnormals``), also the smallest normal number
T, charged only where a result, an operand, a product or a partial sum may be a nonzero number below T. A
flushing unit charged to every operation passed wrong outputs (proofs/fp-forward-error.md, "Underflow")."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import pytest
import torch

import gramcheck.agreement as A
from gramcheck.arith import rounding_model
from gramcheck.precision import subnormals
from gramcheck.properties.accuracy import agreement
from gramcheck.strategies import AttentionInputs
from gramcheck.targets import Target, builtin


@contextlib.contextmanager
def _flushing_on() -> Iterator[None]:
    """torch on this CPU with FTZ/DAZ set, as a GPU kernel built with -ftz (or Triton's exp) computes."""
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush denormals")
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


@pytest.fixture
def flushing() -> Iterator[None]:
    with _flushing_on():
        yield


def _agreement(scale: float, mode: str = "gradual") -> tuple[np.ndarray, object]:
    """RetNet, d = 1, one token: o = q k v with q k = 0.9 * 2^-126 * scale, computed by the builtin and
    judged with its subnormals modelled as ``mode``."""
    t = builtin("retnet", dtype="float32")
    q, k, v = (np.full((1, 1, 1, 1), x) for x in (0.9 * scale * 2.0**-63, 2.0**-63, 1.0))
    out = t(q, k, v, causal=True)
    with subnormals(mode):
        return out, A.check_agreement("agreement", out, t.variant, q, k, v, causal=True, dtype="float32", **t.params)


def test_a_kernel_that_flushes_subnormals_passes_and_the_bound_is_nearly_tight(flushing):
    """q k = 0.9 * 2^-126 is flushed to 0: the error is 0.9 * 2^-126. Under gradual underflow's eta
    (2^-149) alone this correct kernel fails by a factor of about 10^6; a flushing eta (2^-126) charged to
    every operation passed it but also passed wrong outputs (the test below). Declared to flush, and
    charged where a value may be below 2^-126 (the product, then the scale, the decay and the product with
    v), it passes within a factor of 10."""
    out, f = _agreement(1.0, "flush")
    assert out.item() == 0.0
    assert f.passed and f.measured > 0.1, f
    assert _agreement(1.0)[1].measured > 1e5


def test_a_target_declared_to_flush_is_judged_so_by_its_properties(flushing):
    """``Target(subnormals='flush')``: the property wrapper models its subnormals as declared; the same
    kernel undeclared fails."""
    t = builtin("retnet", dtype="float32")
    q, k, v = (np.full((1, 1, 1, 1), x) for x in (0.9 * 2.0**-63, 2.0**-63, 1.0))
    ex = AttentionInputs(q, k, v, {}, "saved", "float32", {})
    declared = Target(t.fn, t.variant, dtype="float32", params=dict(t.params), subnormals="flush")
    assert agreement(declared, ex, causal=True).passed
    assert not agreement(t, ex, causal=True).passed
    with pytest.raises(ValueError, match="subnormals: got 'ftz'"):
        Target(t.fn, t.variant, subnormals="ftz")


@pytest.mark.parametrize("exponent, factor", [(-60, 1.01), (-60, 1.03), (-61, 1.10)])
def test_outputs_a_few_percent_off_fail_where_no_result_underflows(exponent, factor, monkeypatch):
    """RetNet, float32, N = 64, d = 16, q = 2^e, k = 2^(e+1), v > 0.5: every product q_ti s k_ji
    gamma^(t-j) is a normal float32 number above 1.08 * 2^-126, so no kernel flushes and the builtin errs
    3e-7. Outputs 1-10% off fail; with a flushing eta charged to every operation they passed the
    worst-case tier (0.29, 0.88, 0.73: found by a hostile review)."""
    import gramcheck.precision as P
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
    flushing = {"float32": 2.0**-126, "tf32": 2.0**-126, "bfloat16": 2.0**-126}
    gradual = P.smallest_subnormal
    monkeypatch.setattr(P, "underflow_unit", lambda dtype: flushing.get(P.dtype_name(dtype), gradual(dtype)))
    assert agreement(tr * factor).passed


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


@pytest.mark.parametrize(
    "dtype, eta", [("float32", 2.0**-149), ("bfloat16", 2.0**-133), ("float16", 2.0**-24), ("float64", 2.0**-1074)]
)
def test_the_rounding_models_underflow_unit_is_the_smallest_subnormal(dtype, eta):
    assert rounding_model(dtype).b.eta == eta


T = 2.0**-126


def test_a_partial_sum_that_may_cancel_below_the_smallest_normal_is_charged(flushing):
    """[1.5 T, -T] sums to 0.5 T, which a flushing kernel returns as 0: the model charges T there. Terms of
    one sign at or above T have every partial sum at or above T and are charged only their rounding."""
    terms = torch.tensor([1.5 * T, -T], dtype=torch.float32)  # made before FTZ would flush them
    with subnormals("flush"):
        model = rounding_model("float32")
    mixed = model.sum(model.asarray(np.array([1.5 * T, -T])), axis=0)
    same = model.sum(model.asarray(np.array([1.5 * T, 1.5 * T])), axis=0)
    with _flushing_on():
        got = terms.sum().item()
    assert got == 0.0 and 0.5 * T <= model.radius(mixed) <= 2 * T
    assert model.radius(same) < 2.0**-20 * T


def test_an_operand_below_the_smallest_normal_may_be_read_as_zero():
    """x = 2^-130 times y = 2^20: a kernel under DAZ reads x as 0 and returns 0, off by 2^-110, far above
    T; the model gives such an operand its own magnitude as radius."""
    x, y = torch.tensor([2.0**-130]), torch.tensor([2.0**20])
    with subnormals("flush"):
        model = rounding_model("float32")
    product = model.asarray(np.array([2.0**-130])) * model.asarray(np.array([2.0**20]))
    with _flushing_on():
        got = (x * y).item()
    assert got == 0.0 and model.radius(product)[0] >= 2.0**-110


@pytest.mark.parametrize("name", ["retnet", "linear-unnormalised", "gla", "softmax"])
@pytest.mark.parametrize("exponent", [-62, -63, -64])
def test_correct_kernels_pass_under_flushing_where_intermediates_straddle_the_smallest_normal(name, exponent):
    """Signed q, k of magnitude 2^e: the scores q.k sit around 2^(2e), across 2^-126, and cancel; the builtin
    forms, run with FTZ/DAZ on and declared to flush, pass agreement; so does the plain run, undeclared."""
    from helpers import make_inputs

    q, k, v, extras = make_inputs(name, N=24, d=8, H=1, seed=2, dtype="float32")
    q, k = q * 2.0**exponent, k * 2.0**exponent
    causal = name != "softmax"
    for flush in (True, False):
        t = builtin(name, dtype="float32")  # a new worker thread: it inherits the FP flags it starts with
        with _flushing_on() if flush else contextlib.nullcontext():
            out = t(q, k, v, causal=causal, **extras)
        with subnormals("flush" if flush else "gradual"):
            f = A.check_agreement(
                "agreement", out, t.variant, q, k, v, causal=causal, dtype="float32", **t.params, **extras
            )
        assert f.passed, (flush, f)


@pytest.mark.parametrize("name", ["retnet", "gla"])
def test_outputs_a_few_percent_off_at_the_smallest_normal_fail_unless_the_target_flushes(name):
    """q, k of magnitude 2^-62 with random signs: outputs near 2^-121, built from terms that cross 2^-126.
    Undeclared (gradual underflow), outputs 3% off fail; a kernel declared to flush may lose every term
    below 2^-126 there, and its bound says so (the same outputs pass it): the declaration is the user's."""
    from helpers import make_inputs

    q, k, v, extras = make_inputs(name, N=24, d=8, H=1, seed=2, dtype="float32")
    q, k = q * 2.0**-62, k * 2.0**-62
    t = builtin(name, dtype="float32")
    off = t(q, k, v, causal=True, **extras) * 1.03

    def judged(mode):
        with subnormals(mode):
            kw = {**t.params, **extras}
            return A.check_agreement("agreement", off, t.variant, q, k, v, causal=True, dtype="float32", **kw)

    assert judged("gradual").measured > 10
    assert judged("flush").passed


def test_the_declaration_reaches_the_report_and_is_not_certified(tmp_path):
    """``check(subnormals='flush')`` declares it on the target and the Report; a certificate cannot record
    it, so ``certify`` refuses before checking, and so does ``certificate_of`` a flushing Report."""
    import gramcheck
    from gramcheck.api import certificate_of, make_target

    assert make_target("builtin:retnet", subnormals="flush").subnormals == "flush"
    report = gramcheck.check("builtin:retnet", causal=True, properties=["agreement"], subnormals="flush",
                             domain={"examples": 1, "max_n": 4, "max_d": 2})  # fmt: skip
    assert report.subnormals == "flush" and report.passed
    with pytest.raises(ValueError, match="subnormals: got 'flush'; a certificate"):
        certificate_of(report, "builtin:retnet")
    with pytest.raises(ValueError, match="subnormals: got 'flush'; a certificate"):
        gramcheck.certify("builtin:retnet", causal=True, subnormals="flush", out=str(tmp_path / "c.json"))
    assert not (tmp_path / "c.json").exists()
    with pytest.raises(ValueError, match="subnormals: got 'ftz'"):
        make_target("builtin:retnet", subnormals="ftz")
