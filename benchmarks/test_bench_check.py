"""One property check (``api.check('builtin:linear-elu', causal=True)``, ci profile) with the default
single thread and with torch/BLAS defaults (threads=0). Run:

    python -m pytest benchmarks/test_bench_check.py --benchmark-only --benchmark-columns=median,iqr,rounds

(without OMP_NUM_THREADS, so that threads=0 sees the machine's default). The command-line figures in
RESULTS.md come from ``python benchmarks/compare.py check``."""

import pytest

from gramcheck import api


@pytest.mark.parametrize("threads", [1, 0])
def test_check_linear_elu_causal(benchmark, threads):
    benchmark.group = "check builtin:linear-elu --causal"
    report = benchmark.pedantic(
        api.check, args=("builtin:linear-elu",), kwargs={"causal": True, "threads": threads}, rounds=2, iterations=1
    )
    assert all(f.passed for f in report.findings)
