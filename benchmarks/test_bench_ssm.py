"""CPU time of Mamba2's SSD forms: chunked (intra-chunk quadratic + inter-chunk states) against the
recurrent form and against fla's naive_chunk_simple_gla (pure torch, loaded by file path), N = 4096,
d_k = d_v = 64, B = H = 1, float32. Run:

    OMP_NUM_THREADS=1 python -m pytest benchmarks/test_bench_ssm.py -s

The entries run interleaved (one call of each per round, ``ROUNDS`` rounds), timed with process CPU time;
the test prints the median per entry, its ratio to the chunked form, the thread count and the BLAS kernel
(threadpoolctl), and checks that every entry computes the same output.
"""

from __future__ import annotations

import importlib.util
import os
import statistics
import time
from pathlib import Path

import pytest
import torch

from gramcheck import variants as V

N, D, ROUNDS = 4096, 64, 7


def _fla_simple_gla():
    spec_fla = importlib.util.find_spec("fla")
    if spec_fla is None or spec_fla.origin is None or importlib.util.find_spec("einops") is None:
        return None
    path = Path(spec_fla.origin).parent / "ops" / "simple_gla" / "naive.py"
    spec = importlib.util.spec_from_file_location("bench_fla_naive_simple_gla", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _blas() -> str:
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "threadpoolctl not installed"
    info = threadpool_info()
    return (
        "; ".join(
            f"{i.get('internal_api')} {i.get('version')} {i.get('architecture')} threads={i.get('num_threads')}"
            for i in info
        )
        or "none reported"
    )


def test_ssd_chunked_vs_recurrent_and_fla():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 1, N, D) for _ in range(3))
    g = -torch.rand(1, 1, N) * 0.1
    var = V.get("mamba2")
    entries = {
        "chunked C=64": lambda: var.torch(q, k, v, causal=True, form="chunked", chunk_size=64, g=g),
        "chunked C=256": lambda: var.torch(q, k, v, causal=True, form="chunked", chunk_size=256, g=g),
        "recurrent": lambda: var.torch(q, k, v, causal=True, form="recurrent", g=g),
    }
    fla = _fla_simple_gla()
    if fla is not None:
        qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
        gt = g.transpose(1, 2).contiguous()
        entries["fla naive_chunk_simple_gla C=64"] = lambda: fla.naive_chunk_simple_gla(
            qt, kt, vt, gt, chunk_size=64, scale=1.0
        )[0].transpose(1, 2)
    outs = {name: fn() for name, fn in entries.items()}  # warm-up, and the outputs compared below
    ref = outs["recurrent"]
    for name, o in outs.items():
        assert torch.isfinite(o).all(), name
        rel = float((o - ref).norm() / ref.norm())
        assert rel < 1e-5, (name, rel)
    times: dict[str, list[float]] = {name: [] for name in entries}
    with torch.no_grad():
        for _ in range(ROUNDS):
            for name, fn in entries.items():
                t0 = time.process_time()
                fn()
                times[name].append(time.process_time() - t0)
    base = statistics.median(times["chunked C=64"])
    print(f"\nSSD (mamba2) N={N} d={D} float32, {ROUNDS} interleaved rounds, CPU time (process_time)")
    print(f"torch threads={torch.get_num_threads()} OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}")
    print(f"BLAS: {_blas()}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:34s} median {med * 1e3:8.1f} ms  min {min(ts) * 1e3:8.1f} ms  ratio {med / base:5.2f}")
    if fla is None:
        pytest.skip("fla not installed: only gramcheck's forms were timed")
