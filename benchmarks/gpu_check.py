"""The device check, prepared for a machine with a GPU (one short run; see benchmarks/RESULTS.md):

    python benchmarks/gpu_check.py --out $OUT/gpu.json

1. agreement and causality of every built-in torch form on ``cuda`` in float32 and bfloat16, against the
   same oracle as on CPU (inputs are moved to the device, outputs back);
2. timings of the causal forms at N = 4096, d = 64 (median of 20, CUDA-synchronised), as ratios within
   the run. Skips with a message, exit 0, where CUDA is not available.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def main() -> int:
    import torch

    from gramcheck import check
    from gramcheck import variants as V

    p = argparse.ArgumentParser()
    p.add_argument("--out", default="gpu.json")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 0
    result: dict = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "agreement": [], "timings": []}
    for var in V.list():
        modes = [True] if "causal-only" in var.declares else [False, True]
        for dtype in ("float32", "bfloat16"):
            for causal in modes:
                props = ["agreement"] + (["causality"] if causal else [])
                r = check(
                    f"builtin:{var.name}",
                    causal=causal,
                    dtype=dtype,
                    device="cuda",
                    properties=props,
                    domain={"max_n": 64, "max_d": 16, "examples": 10},
                )
                for f in r.findings:
                    result["agreement"].append(
                        {
                            "variant": var.name,
                            "causal": causal,
                            "dtype": dtype,
                            "property": f.name,
                            "passed": f.passed,
                            "measured": f.measured,
                        }
                    )
                    print(var.name, causal, dtype, f.name, f.passed, f"{f.measured:.3g}", flush=True)
    n, d = 4096, 64
    q, k, v = (torch.randn(1, 4, n, d, device="cuda") for _ in range(3))
    g = -torch.rand(1, 4, n, d, device="cuda") * 0.1
    cases = [
        ("linear-elu", "chunked", {}),
        ("linear-elu", "recurrent", {}),
        ("softmax", "parallel", {}),
        ("gla", "chunked", {"g": g}),
        ("retnet", "chunked", {}),
    ]
    for name, form, extra in cases:

        def fn(name: str = name, form: str = form, extra: dict = extra) -> None:
            V.get(name).torch(q, k, v, causal=True, form=form, chunk_size=64, **extra)

        fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(20):
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        result["timings"].append({"variant": name, "form": form, "median_ms": 1e3 * statistics.median(times)})
    base = min(t["median_ms"] for t in result["timings"])
    for t in result["timings"]:
        t["ratio"] = t["median_ms"] / base
        print(t, flush=True)
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
