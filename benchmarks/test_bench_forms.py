"""CPU timings of the torch forms (pytest-benchmark). Run:

    python -m pytest benchmarks --benchmark-only --benchmark-columns=median,iqr,rounds

Figures and the ratios between them (same run) go in benchmarks/RESULTS.md.
"""

import pytest
import torch

from gramcheck import variants as V

N, D = 4096, 64


@pytest.fixture(scope="module")
def qkv():
    torch.manual_seed(0)
    return tuple(torch.randn(1, 1, N, D) for _ in range(3))


@pytest.fixture(scope="module")
def gates():
    torch.manual_seed(1)
    return -torch.rand(1, 1, N, D) * 0.1


@pytest.mark.benchmark(group="linear-elu causal, N=4096 d=64")
@pytest.mark.parametrize("form,chunk", [("chunked", 64), ("chunked", 256), ("recurrent", 1)])
def test_linear_elu(benchmark, qkv, form, chunk):
    q, k, v = qkv
    out = benchmark(V.get("linear-elu").torch, q, k, v, causal=True, form=form, chunk_size=chunk)
    assert torch.isfinite(out).all()


@pytest.mark.benchmark(group="linear-elu causal, N=4096 d=64")
def test_softmax_same_shape(benchmark, qkv):
    q, k, v = qkv
    out = benchmark(V.get("softmax").torch, q, k, v, causal=True)
    assert torch.isfinite(out).all()


@pytest.mark.benchmark(group="gla, N=4096 d=64")
@pytest.mark.parametrize("form,chunk", [("chunked", 64), ("recurrent", 1)])
def test_gla(benchmark, qkv, gates, form, chunk):
    q, k, v = qkv
    out = benchmark(V.get("gla").torch, q, k, v, causal=True, form=form, chunk_size=chunk, g=gates)
    assert torch.isfinite(out).all()


@pytest.mark.benchmark(group="retnet, N=4096 d=64")
@pytest.mark.parametrize("form,chunk", [("chunked", 64), ("recurrent", 1)])
def test_retnet(benchmark, qkv, form, chunk):
    q, k, v = qkv
    out = benchmark(V.get("retnet").torch, q, k, v, causal=True, form=form, chunk_size=chunk)
    assert torch.isfinite(out).all()
