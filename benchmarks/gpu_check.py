"""The device check, prepared for a machine with a GPU (one short run; see benchmarks/RESULTS.md):

    python benchmarks/gpu_check.py --out $OUT/gpu.json

1. agreement and causality of every built-in torch form on ``cuda`` in float32 and bfloat16, against the
   same oracle as on CPU (inputs are moved to the device, outputs back);
2. timings of the causal forms at N = 4096, d = 64 in float32 and bfloat16 (median of 20,
   CUDA-synchronised), as ratios within the run. Skips with a message, exit 0, where CUDA is not available.
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
    p.add_argument("--device", default="cuda", help="cpu: a dry run of the same checks")
    p.add_argument("--variants", default="", help="comma-separated variant names (default: all)")
    p.add_argument("--part", choices=("all", "agreement", "timings"), default="all")
    args = p.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 0
    on_gpu = args.device == "cuda"
    result: dict = {
        "device": torch.cuda.get_device_name(0) if on_gpu else args.device,
        "torch": torch.__version__,
        "agreement": [],
        "timings": [],
    }
    wanted = [n for n in args.variants.split(",") if n]
    for var in [v for v in V.list() if args.part != "timings" and (not wanted or v.name in wanted)]:
        modes = [True] if "causal-only" in var.declares else [False, True]
        for dtype in ("float32", "bfloat16"):
            for causal in modes:
                props = ["agreement"] + (["causality"] if causal else [])
                r = check(
                    f"builtin:{var.name}",
                    causal=causal,
                    dtype=dtype,
                    device=args.device,
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
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    for dtype in (torch.float32, torch.bfloat16) if args.part != "agreement" else ():
        q, k, v = (torch.randn(1, 4, n, d, device=args.device, dtype=dtype) for _ in range(3))
        g = -torch.rand(1, 4, n, d, device=args.device, dtype=dtype) * 0.1
        cases = [
            ("linear-elu", "chunked", {}),
            ("linear-elu", "recurrent", {}),
            ("softmax", "parallel", {}),
            ("gla", "chunked", {"g": g}),
            ("retnet", "chunked", {}),
        ]
        for name, form, extra in cases:
            times = []
            for rep in range(21):  # the first call warms up and is not timed
                t0 = time.perf_counter()
                V.get(name).torch(q, k, v, causal=True, form=form, chunk_size=64, **extra)
                sync()
                if rep:
                    times.append(time.perf_counter() - t0)
            result["timings"].append(
                {"variant": name, "form": form, "dtype": str(dtype)[6:], "median_ms": 1e3 * statistics.median(times)}
            )
    base = min((t["median_ms"] for t in result["timings"]), default=1.0)
    for t in result["timings"]:
        t["ratio"] = t["median_ms"] / base
        print(t, flush=True)
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
