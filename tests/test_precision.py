import math

import mpmath
import pytest

from gramcheck.precision import gamma, gamma_tilde, mp_precision, unit_roundoff


@pytest.mark.parametrize(
    "dtype,bits", [("float64", 53), ("float32", 24), ("tf32", 11), ("bfloat16", 8), ("float16", 11)]
)
def test_unit_roundoff_is_half_machine_epsilon(dtype, bits):
    assert unit_roundoff(dtype) == 2.0**-bits


def test_unit_roundoff_matches_numpy_and_torch_epsilon():
    import numpy as np
    import torch

    assert unit_roundoff(np.float32) == np.finfo(np.float32).eps / 2
    for t in (torch.float64, torch.float32, torch.bfloat16, torch.float16):
        assert unit_roundoff(t) == torch.finfo(t).eps / 2


def test_gamma_formula_and_domain():
    u = 2.0**-24
    assert gamma(10, "float32") == pytest.approx(10 * u / (1 - 10 * u), rel=1e-15)
    assert gamma(0) == 0.0
    assert gamma(2**24, "float32") == math.inf  # n u = 1: no bound of this form
    with pytest.raises(ValueError, match="n"):
        gamma(-1)


def test_gamma_tilde_formula_and_its_growth_against_gamma():
    """gamma~_n(lambda) = exp(lambda sqrt(n) u + n u^2 / (1 - u)) - 1, elementwise on arrays; it grows like
    sqrt(n) (gamma_n like n), so it is below gamma_n from n = lambda^2 on, and it stays finite where
    gamma_n has no bound (n u >= 1)."""
    import numpy as np

    u = unit_roundoff("float32")
    expected = math.expm1(8 * math.sqrt(100) * u + 100 * u * u / (1 - u))
    assert gamma_tilde(100, "float32") == pytest.approx(expected, rel=1e-15)
    assert gamma_tilde(400, "float32", lam=1.0) == pytest.approx(20 * u, rel=1e-5)  # lambda sqrt(n) u + O(u^2)
    arr = gamma_tilde(np.array([0.0, 16.0, 64.0, 1024.0]), "float32")
    assert arr[0] == 0.0 and arr[1] > gamma(16, "float32") and arr[3] < gamma(1024, "float32")
    assert gamma_tilde(64, "float32") == pytest.approx(gamma(64, "float32"), rel=1e-4)
    assert math.isfinite(gamma_tilde(300, "bfloat16")) and gamma(300, "bfloat16") == math.inf
    with pytest.raises(ValueError, match="n: got minimum -1"):
        gamma_tilde(-1)


def test_unknown_dtype_names_argument():
    with pytest.raises(ValueError, match="dtype"):
        unit_roundoff("int8")


def test_mp_precision_restores_even_on_error():
    before = mpmath.mp.prec
    with mp_precision(200):
        assert mpmath.mp.prec == 200
    assert mpmath.mp.prec == before
    with pytest.raises(RuntimeError):
        with mp_precision(300):
            raise RuntimeError("boom")
    assert mpmath.mp.prec == before


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_the_overflow_threshold_is_the_least_magnitude_that_rounds_to_infinity(dtype):
    """Cast as a kernel stores its accumulator: from float32 for the 16-bit formats, from float64 for float32
    (torch casts float64 to float16 through float32, which rounds 65519.99... up to 65520 first)."""
    import numpy as np
    import torch

    from gramcheck.precision import overflow_threshold

    wide = torch.float64 if dtype == "float32" else torch.float32
    t = torch.tensor(overflow_threshold(dtype), dtype=torch.float64).to(wide)
    assert float(t) == overflow_threshold(dtype)  # representable in the accumulator
    below = torch.nextafter(t, torch.zeros_like(t))
    got = torch.stack([t, -t, below, -below]).to(getattr(torch, dtype)).double().numpy()
    assert np.isposinf(got[0]) and np.isneginf(got[1]) and np.all(np.isfinite(got[2:])), got
    assert overflow_threshold("float64") == math.inf
