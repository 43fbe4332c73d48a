"""Every torch form of every variant against the oracle, within the gamma-based bound of
gramcheck.agreement (proofs/fp-forward-error.md), in float64 and float32; forms against each other."""

import zlib

import numpy as np
import pytest
import torch
from helpers import causal_modes, make_inputs, to_torch

from gramcheck import variants as V
from gramcheck.agreement import check_agreement, rounding_bound

CASES = [
    (var.name, form, causal) for var in V.list() for causal in causal_modes(var.name) for form in var.forms_for(causal)
]


def _run(var, form, causal, dtype, q, k, v, ex, chunk_size=7):
    t = {a: to_torch(b, dtype) for a, b in ex.items()}
    out = var.torch(
        to_torch(q, dtype), to_torch(k, dtype), to_torch(v, dtype), causal=causal, form=form, chunk_size=chunk_size, **t
    )
    assert out.dtype == getattr(torch, dtype)
    return out.double().numpy()


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name,form,causal", CASES)
def test_torch_form_agrees_with_reference(name, form, causal, dtype):
    var = V.get(name)
    q, k, v, ex = make_inputs(name, dtype=dtype, N=21, seed=zlib.crc32(f"{name}/{form}".encode()) % 1000)
    if name == "linear-relu":  # keep every denominator positive: relu features of shifted inputs
        q, k = np.abs(q) + 0.5, np.abs(k) + 0.5
    out = _run(var, form, causal, dtype, q, k, v, ex)
    f = check_agreement("agreement", out, var, q, k, v, causal=causal, dtype=dtype, **ex)
    assert f.passed, f


@pytest.mark.parametrize("name", [v.name for v in V.list() if "chunked" in v.forms])
def test_forms_agree_for_every_chunk_size(name):
    """parallel == recurrent == chunked (chunk 1, 7, N, and non-divisors of N) within the sum of their
    bounds, in float32, causal (or non-causal where the parallel form is the only non-causal one)."""
    var = V.get(name)
    N = 30
    q, k, v, ex = make_inputs(name, dtype="float32", N=N, seed=3)
    if name == "linear-relu":
        q, k = np.abs(q) + 0.5, np.abs(k) + 0.5
    for causal in causal_modes(name):
        bound = rounding_bound(var, q, k, v, causal=causal, dtype="float32", **ex)
        base = _run(var, "recurrent", causal, "float32", q, k, v, ex)
        for form, cs in [
            ("chunked", 1),
            ("chunked", 7),
            ("chunked", N),
            ("chunked", 4),
            ("chunked", 64),
            ("parallel", 1),
        ]:
            if form not in var.forms_for(causal):
                continue
            other = _run(var, form, causal, "float32", q, k, v, ex, chunk_size=cs)
            assert np.all(np.abs(other - base) <= 2 * bound), (form, cs, causal, np.max(np.abs(other - base) / bound))


def test_a_broken_form_fails_agreement():
    """The check can fail: a chunked form whose intra-chunk product runs in bfloat16 is caught in float32."""
    var = V.get("linear-elu")
    q, k, v, _ = make_inputs("linear-elu", dtype="float32", N=21)
    good = _run(var, "chunked", True, "float32", q, k, v, {})
    bad = _run(var, "chunked", True, "bfloat16", q, k, v, {})
    assert check_agreement("a", good, var, q, k, v, causal=True, dtype="float32").passed
    f = check_agreement("a", bad, var, q, k, v, causal=True, dtype="float32")
    assert not f.passed and f.measured > 10 and f.counterexample is not None


def test_mpmath_reference_agrees_with_float64_on_well_conditioned_input():
    from gramcheck.arith import BALL_F64, MP

    for var in V.list():
        q, k, v, ex = make_inputs(var.name, N=9, d=4, H=1, m=8)
        for causal in causal_modes(var.name):
            f64 = var.reference(q, k, v, causal=causal, **ex)
            mp = MP(120).to_float64(var.reference(q, k, v, causal=causal, arith=MP(120), **ex))
            rad = BALL_F64.radius(var.reference(q, k, v, causal=causal, arith=BALL_F64, **ex))
            defined = np.isfinite(mp)  # relu: a query with no positive entry gives 0/0
            np.testing.assert_array_equal(np.isfinite(f64), defined)
            assert np.all(np.abs(f64 - mp)[defined] <= rad[defined]), var.name
            assert np.all(rad[defined] <= 1e-10 * (np.abs(mp[defined]) + 1)), var.name  # float64 suffices


@pytest.mark.parametrize("name", [v.name for v in V.list() if v.algorithms_fn])
@pytest.mark.parametrize("n", [5, 64, 130])
def test_the_variants_other_algorithms_are_the_definition(name, n):
    """Variant.algorithms (the low-precision rules' second yardstick, proofs/low-precision-rule.md): each
    equals the definition in float64 in every mode, over less than one chunk of 64 tokens, exactly one,
    and two with a padded third; for a state-passing variant also from a nonzero S_0, final state
    included."""
    var = V.get(name)
    for causal in causal_modes(var):
        q, k, v, ex = make_inputs(var, N=n, d=4, seed=n)
        if causal and "state-passing" in var.tags():
            s0 = np.random.default_rng(n).standard_normal((1, 2, 4, 4))
            ex = {**ex, "initial_state": s0, "output_final_state": True}
        ref = var.reference(q, k, v, causal=causal, **ex)
        for got in var.algorithms(q, k, v, causal=causal, **ex):
            for out, want in zip(*((got, ref) if isinstance(ref, tuple) else ((got,), (ref,))), strict=True):
                assert np.max(np.abs(out - want)) < 1e-13 * np.max(np.abs(want)), (name, causal)
