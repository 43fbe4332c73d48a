"""Gram spectra: the factor path (thin QR of each factor, SVD of the m x m core) against a dense SVD of
the N x N matrix, at the largest N where the dense SVD takes a few seconds (N = 2048) and at N = 16384,
where dense would need 2 GiB for A alone. Run:

    python -m pytest benchmarks/test_bench_spectra.py --benchmark-only --benchmark-columns=median,iqr,rounds

Agreement (max |s_factor - s_dense| / s_1 at N = 2048) is asserted within the two floors by
tests/test_spectra.py and printed here for RESULTS.md.
"""

import numpy as np
import pytest

from gramcheck import spectra

M = 256


def _factors(n, seed=0):
    rng = np.random.default_rng(seed)
    # elu+1-like positive features: a dominant mean direction, as linear attention produces
    return np.abs(rng.standard_normal((n, M))) + 0.1, np.abs(rng.standard_normal((n, M))) + 0.1


@pytest.mark.benchmark(group="Gram spectrum, m=256")
@pytest.mark.parametrize("n", [2048, 16384])
def test_factor_path(benchmark, n):
    fq, fk = _factors(n)
    sp = benchmark(spectra.factor_spectrum, fq, fk, precision="float64")
    assert sp.rank == M


@pytest.mark.benchmark(group="Gram spectrum, m=256")
def test_dense_svd_n2048(benchmark):
    fq, fk = _factors(2048)
    dense = benchmark.pedantic(spectra.dense_spectrum, args=(fq @ fk.T,), rounds=3, iterations=1)
    fact = spectra.factor_spectrum(fq, fk, precision="float64")
    r = min(dense.rank, fact.rank)
    rel = float(np.max(np.abs(dense.values[:r] - fact.values[:r])) / dense.values[0])
    benchmark.extra_info["max_rel_difference"] = rel
    print(f"\nN=2048 m=256: max |s_factor - s_dense| / s_1 = {rel:.2e}; floors {fact.floor:.2e}, {dense.floor:.2e}")
    assert np.all(np.abs(dense.values[:r] - fact.values[:r]) <= dense.floor + fact.floor)
