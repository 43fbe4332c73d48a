"""The oracle against plain float64 (benign inputs, N=256 d=32) and against all-mpmath at the precision
the oracle needed (ill-conditioned inputs: one batch item of three nearly cancels). Run:

    OMP_NUM_THREADS=1 python -m pytest benchmarks/test_bench_oracle.py --benchmark-only \\
        --benchmark-columns=median,iqr,rounds

Ratios for RESULTS.md come from ``python benchmarks/compare.py oracle`` (interleaved, CPU time)."""

from functools import partial

import numpy as np
import pytest
from compare import ORACLE_CASES, ill_inputs, oracle_inputs

from gramcheck.arith import F64, MP
from gramcheck.oracle import truth
from gramcheck.variants import get


@pytest.mark.parametrize("name", list(ORACLE_CASES))
@pytest.mark.parametrize("what", ["float64 reference", "truth digits=6"])
def test_benign(benchmark, name, what):
    params, causal = ORACLE_CASES[name]
    q, k, v, extras = oracle_inputs(name)
    benchmark.group = f"oracle benign {name}"
    if what == "float64 reference":
        out = benchmark(partial(get(name).reference, q, k, v, causal=causal, arith=F64, **params, **extras))
        assert np.isfinite(out).all()
    else:
        t = benchmark(partial(truth, name, q, k, v, causal=causal, digits=6, **params, **extras))
        assert t.met


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("what", ["truth digits=10", "plain mpmath"])
def test_ill_conditioned(benchmark, causal, what):
    var = get("linear-unnormalised")
    q, k, v = ill_inputs(causal)
    kw = dict(causal=causal, feature="identity")
    benchmark.group = f"oracle ill-conditioned causal={causal}"
    t = truth(var, q, k, v, digits=10, **kw)
    assert t.met and t.escalated
    if what == "truth digits=10":
        benchmark.pedantic(partial(truth, var, q, k, v, digits=10, **kw), rounds=3, iterations=1)
    else:
        benchmark.pedantic(partial(var.reference, q, k, v, arith=MP(t.prec), **kw), rounds=3, iterations=1)
    benchmark.extra_info["prec"] = t.prec
