"""CPU timings of the delta-rule torch forms (gramcheck.delta_forms) and fla's naive references, causal,
N = 4096, d_k = d_v = 64, B = H = 1, float32, unit keys (l2norm=False: the same computation as fla's naive
code, which does not normalise). Run:

    OMP_NUM_THREADS=1 python -m pytest benchmarks/test_bench_delta.py --benchmark-only \\
        --benchmark-timer=time.process_time --benchmark-columns=median,iqr,rounds

or, for CPU-time ratios from interleaved rounds (each round calls every entry once, in turn):

    OMP_NUM_THREADS=1 python benchmarks/test_bench_delta.py [rounds]
"""

from __future__ import annotations

import importlib.util
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from gramcheck import variants as V

N, D, CHUNK = 4096, 64, 64


def _inputs() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 1, N, D) for _ in range(3))
    k = k / k.norm(dim=-1, keepdim=True)
    return {"q": q, "k": k, "v": v, "beta": torch.rand(1, 1, N) * 2, "g": -torch.rand(1, 1, N) * 0.1}


def _fla(op: str) -> Any:
    spec = importlib.util.find_spec("fla")
    if spec is None or spec.origin is None or importlib.util.find_spec("einops") is None:
        return None
    path = Path(spec.origin).parent / "ops" / op / "naive.py"
    s = importlib.util.spec_from_file_location(f"bench_fla_naive_{op}", path)
    if s is None or s.loader is None:
        return None
    mod = importlib.util.module_from_spec(s)
    s.loader.exec_module(mod)
    return mod


def entries() -> dict[str, tuple[str, Any]]:
    """name -> (group, zero-argument callable)."""
    x = _inputs()
    q, k, v, beta, g = x["q"], x["k"], x["v"], x["beta"], x["g"]
    dn, gdn = V.get("deltanet"), V.get("gated-deltanet")
    out: dict[str, tuple[str, Any]] = {
        "deltanet chunked C=64": (
            "deltanet",
            lambda: dn.torch(q, k, v, causal=True, form="chunked", chunk_size=CHUNK, beta=beta, l2norm=False),
        ),
        "deltanet recurrent": (
            "deltanet",
            lambda: dn.torch(q, k, v, causal=True, form="recurrent", beta=beta, l2norm=False),
        ),
        "gated-deltanet chunked C=64": (
            "gated-deltanet",
            lambda: gdn.torch(q, k, v, causal=True, form="chunked", chunk_size=CHUNK, beta=beta, g=g, l2norm=False),
        ),
        "gated-deltanet recurrent": (
            "gated-deltanet",
            lambda: gdn.torch(q, k, v, causal=True, form="recurrent", beta=beta, g=g, l2norm=False),
        ),
    }
    dr, gdr = _fla("delta_rule"), _fla("gated_delta_rule")
    if dr is not None:  # (B, H, T, D) layout, scale d^-1/2 built in
        out["fla delta_rule_chunkwise C=64"] = (
            "deltanet",
            lambda: dr.delta_rule_chunkwise(q, k, v, beta, chunk_size=CHUNK),
        )
        out["fla delta_rule_recurrence"] = ("deltanet", lambda: dr.delta_rule_recurrence(q, k, v, beta))
    if gdr is not None:  # (B, T, H, D) layout
        qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))
        bt, gt = beta.transpose(1, 2).contiguous(), g.transpose(1, 2).contiguous()
        out["fla naive_chunk_gated_delta_rule C=64"] = (
            "gated-deltanet",
            lambda: gdr.naive_chunk_gated_delta_rule(qt, kt, vt, gt, bt, chunk_size=CHUNK),
        )
        out["fla naive_recurrent_gated_delta_rule"] = (
            "gated-deltanet",
            lambda: gdr.naive_recurrent_gated_delta_rule(qt, kt, vt, bt, gt),
        )
    return out


ENTRIES = entries()


@pytest.mark.parametrize("name", list(ENTRIES))
def test_delta_rule(benchmark: Any, name: str) -> None:
    group, fn = ENTRIES[name]
    benchmark.group = f"{group} causal, N={N} d={D} float32"
    out = benchmark(fn)
    o = out[0] if isinstance(out, tuple) else out
    assert torch.isfinite(o).all()


def interleaved(rounds: int = 5) -> dict[str, float]:
    """Median CPU time (time.process_time, seconds) of each entry over ``rounds`` rounds; each round calls
    every entry once, in turn, after one warm-up call each."""
    fns = {n: f for n, (_, f) in ENTRIES.items()}
    for f in fns.values():
        f()
    times: dict[str, list[float]] = {n: [] for n in fns}
    for _ in range(rounds):
        for n, f in fns.items():
            t0 = time.process_time()
            f()
            times[n].append(time.process_time() - t0)
    return {n: statistics.median(ts) for n, ts in times.items()}


if __name__ == "__main__":
    med = interleaved(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    for group in ("deltanet", "gated-deltanet"):
        names = [n for n, (gr, _) in ENTRIES.items() if gr == group]
        base = min(med[n] for n in names)
        print(f"\n{group}, N={N}, d={D}, float32 (CPU time, median of interleaved rounds)")
        for n in sorted(names, key=med.get):
            print(f"  {n:42s} {1e3 * med[n]:9.1f} ms   x{med[n] / base:6.2f}")
