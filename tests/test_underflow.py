"""The rounding model's underflow unit: float32-computing kernels may flush subnormal results to zero
(proofs/fp-forward-error.md, "Underflow")."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import gramcheck.agreement as A
from gramcheck.arith import rounding_model
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


def test_a_kernel_that_flushes_subnormals_passes_and_the_bound_is_nearly_tight(flushing, monkeypatch):
    """q k = 0.9 * 2^-126 is flushed to 0: the error is 0.9 * 2^-126, more than 0.1 of the bound. Under
    gradual underflow's eta (2^-149) this correct kernel failed by a factor of about 10^6."""
    out, f = _agreement(1.0)
    assert out.item() == 0.0
    assert f.passed and f.measured > 0.1, f
    import gramcheck.precision as P

    monkeypatch.setattr(P, "underflow_unit", P.smallest_subnormal)
    assert _agreement(1.0)[1].measured > 1e5


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
    "dtype, eta", [("float32", 2.0**-126), ("bfloat16", 2.0**-126), ("float16", 2.0**-24), ("float64", 2.0**-1074)]
)
def test_the_rounding_models_underflow_unit(dtype, eta):
    """A float32 flush for the formats computed in float32; gradual underflow where the result is stored
    in float16 or float64."""
    assert rounding_model(dtype).b.eta == eta
