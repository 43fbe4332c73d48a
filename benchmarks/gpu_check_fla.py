"""The device check of flash-linear-attention's Triton kernels, prepared for a machine with a GPU (one
short run; the table goes to benchmarks/RESULTS.md):

    python benchmarks/gpu_check_fla.py --out $OUT/fla_gpu.md [--examples 4] [--ops chunk_gla,...]
    python benchmarks/gpu_check_fla.py --device cpu --ops chunk_gla --examples 1   # dry run, interpreter

Every op of ``gramcheck.adapters.fla_kernels`` whose variant is registered, checked as the target
``fla:OP`` on ``cuda`` in float32, bfloat16 and float16 with the same properties as the CPU tests
(agreement, causality; finite-gradients in float32), plus chunk vs fused_recurrent agreement of each pair
on one input, and the strong-then-weak-decay input of examples/fla_discrepancies/ on chunk_gla and
fused_recurrent_gla (does the compiled kernel lose the same accuracy?). Writes a markdown table (op |
variant | dtype | passed | failed, with measured values) and prints each row as it goes. On a GPU the
kernels run compiled (the interpreter shim stays off), so bfloat16 is checked there; float32 dots may use
TF32 on Ampere and newer (fla leaves Triton's default), which agreement's float32 bound reports as a
failure rather than hides. Exits 0 with a message where CUDA is not available.
"""

from __future__ import annotations

import argparse
import sys
import time

DTYPES = ("float32", "bfloat16", "float16")
# hyperparameters that differ from the variants' defaults where the defaults hide something (a scale
# of 1 with d = 16 keeps entries large) or fla needs one (linear attention without a feature map)
PARAMS = {
    "gla": {"scale": 0.25},
    "linear-unnormalised": {"feature": "identity", "divisor": 4.0},
}


def _variant_for(op: object, registered: set[str]) -> str | None:
    names = [v for v in op.variants if v in registered]  # type: ignore[attr-defined]
    if op.name.startswith(("chunk_simple_gla", "fused_recurrent_simple_gla")):  # type: ignore[attr-defined]
        names = [v for v in names if v != "gla"] or []  # gla's strategies draw per-channel decays
    return names[0] if names else None


def _pair_row(op: str, pair: str, variant: str, dtype: str, params: dict, device: str) -> str:
    import numpy as np

    from gramcheck.agreement import rounding_bound
    from gramcheck.api import make_target
    from gramcheck.strategies import attention_inputs, sample

    a = make_target(f"fla:{op}", variant, dtype=dtype, device=device, params=params, timeout=None)
    b = make_target(f"fla:{pair}", variant, dtype=dtype, device=device, params=params, timeout=None)
    ex = sample(attention_inputs(variant, dtype=dtype, kinds=["gaussian"], min_n=65, max_n=70, min_d=16), seed=0)
    oa = a(ex.q, ex.k, ex.v, causal=True, **ex.extras)
    ob = b(ex.q, ex.k, ex.v, causal=True, **ex.extras)
    bound = rounding_bound(variant, ex.q, ex.k, ex.v, causal=True, dtype=dtype, **a.params, **ex.extras)
    ratio = float(np.max(np.abs(oa - ob) / (2 * bound)))
    return f"| {op} vs {pair} | {variant} | {dtype} | {'forms agree' if ratio <= 1 else ''} | " + (
        "" if ratio <= 1 else f"forms differ: {ratio:.3g} x 2 C R(u)"
    ) + " |"


def _strong_decay_row(op: str, device: str) -> str:
    """examples/fla_discrepancies/strong_then_weak_decay.py's input (g = [-4000, -0.01, ...]) in float32."""
    import numpy as np

    from gramcheck.agreement import check_agreement
    from gramcheck.api import make_target

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, 12, 2)).astype(np.float32).astype(np.float64) for _ in range(3))
    g = np.full((1, 1, 12, 2), -0.01).astype(np.float32).astype(np.float64)
    g[:, :, 0] = -4000.0
    t = make_target(f"fla:{op}", "gla", device=device, params={"scale": 1.0}, timeout=None)
    f = check_agreement("agreement", t(q, k, v, causal=True, g=g), "gla", q, k, v, causal=True, dtype="float32",
                        g=g, **t.params)  # fmt: skip
    verdict = ("agreement", "") if f.passed else ("", f"agreement {f.measured:.3g}/1")
    return f"| {op}, strong then weak decay | gla | float32 | {verdict[0]} | {verdict[1]} |"


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="fla_gpu.md")
    p.add_argument("--examples", type=int, default=4)
    p.add_argument("--ops", default="", help="comma-separated op names (default: all)")
    p.add_argument("--device", default="cuda", help="cpu: a dry run through Triton's interpreter (bfloat16 refused)")
    args = p.parse_args()
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 0
    from gramcheck import check
    from gramcheck import variants as V
    from gramcheck.adapters import fla_kernels, triton_interpreter

    triton_interpreter.prepare_environment()  # only without a GPU: TRITON_INTERPRET=1 before fla loads
    registered = set(V.names())
    wanted = [o for o in args.ops.split(",") if o] or fla_kernels.names()
    lines = [
        f"fla {fla_kernels.fla_version()}, triton {triton_interpreter.versions()['triton']}, "
        f"torch {torch.__version__}, {torch.cuda.get_device_name(0) if args.device == 'cuda' else args.device}; "
        f"examples per property {args.examples}, N <= 70, d <= 16.",
        "",
        "| fla op | variant | dtype | properties passed | what failed (measured / bound) |",
        "| --- | --- | --- | --- | --- |",
    ]
    print("\n".join(lines), flush=True)
    domain = {"examples": args.examples, "max_n": 70, "max_d": 16, "max_b": 1, "max_h": 2}
    for name in wanted:
        op = fla_kernels.get(name)
        variant = _variant_for(op, registered)
        if variant is None:
            row = f"| {name} | {', '.join(op.variants)} | - | - | variant not registered |"
            lines.append(row)
            print(row, flush=True)
            continue
        params = PARAMS.get(variant, {})
        for dtype in DTYPES:
            props = ["agreement", "causality"] + (["finite-gradients"] if dtype == "float32" else [])
            t0 = time.perf_counter()
            try:
                r = check(f"fla:{name}", variant, causal=True, dtype=dtype, device=args.device, params=params,
                          properties=props, domain=domain, timeout=None)  # fmt: skip
                ok = ", ".join(f.name for f in r.findings if f.passed)
                bad = "; ".join(
                    f"{f.name} {f.measured:.3g}/{f.bound:.3g}" + (f" [{f.failure}]" if f.failure else "")
                    for f in r.findings
                    if not f.passed
                )
            except Exception as exc:  # noqa: BLE001 - recorded in the table
                ok, bad = "", f"{type(exc).__name__}: {str(exc)[:160]}"
            row = f"| {name} | {variant} | {dtype} | {ok} | {bad} | "
            lines.append(row + f"<!-- {time.perf_counter() - t0:.1f} s -->")
            print(row, flush=True)
            if op.pair and name.startswith("chunk") and op.pair.startswith("fused_recurrent"):
                try:
                    row = _pair_row(name, op.pair, variant, dtype, params, args.device)
                except Exception as exc:  # noqa: BLE001 - recorded in the table
                    row = f"| {name} vs {op.pair} | {variant} | {dtype} | | {type(exc).__name__}: {str(exc)[:160]} |"
                lines.append(row)
                print(row, flush=True)
    for name in [o for o in ("chunk_gla", "fused_recurrent_gla") if o in wanted]:
        row = _strong_decay_row(name, args.device)
        lines.append(row)
        print(row, flush=True)
    with open(args.out, "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
