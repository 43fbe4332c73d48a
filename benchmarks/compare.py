"""Side-by-side timings for benchmarks/RESULTS.md: CPU-time ratios, medians of interleaved runs in one
process (every entry of a group runs once per round, rounds alternate), thread counts and the BLAS
kernel printed first. Run from the repository root:

    OMP_NUM_THREADS=1 python benchmarks/compare.py forms   [--n 1024 4096 16384] [--rounds 3] [--groups ...]
    OMP_NUM_THREADS=1 python benchmarks/compare.py memory  [--n 1024 4096 16384] [--groups ...]
    OMP_NUM_THREADS=1 python benchmarks/compare.py oracle  [--rounds 3]
    python benchmarks/compare.py check [--rounds 2]
    python benchmarks/compare.py variants [--limit 600]   (the ci check of every builtin variant, one process each)
    OMP_NUM_THREADS=1 python benchmarks/compare.py share [--variants ...]   (where a ci check spends its CPU)
    OMP_NUM_THREADS=1 python benchmarks/compare.py spectra [--n 2048 4096] [--rounds 2]

``memory`` runs every entry in a fresh subprocess and reports the peak resident set size (ru_maxrss)
above the RSS just before the call (after a warm-up call at N = 64): torch's CPU allocator does not go
through Python's allocator, so tracemalloc does not see tensors, and the torch profiler's CPU memory
events were not reliable here.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, os.environ.get("GRAMCHECK_SRC", str(ROOT)))  # another checkout, to compare

H, D = 4, 64


def environment() -> str:
    import numpy as np
    import torch
    from threadpoolctl import threadpool_info

    blas = [
        f"{p['internal_api']} {p.get('version')} {p.get('architecture')} ({p['num_threads']} threads, {p['prefix']})"
        for p in threadpool_info()
        if p["user_api"] == "blas"
    ]
    return (
        f"torch {torch.__version__} ({torch.get_num_threads()} threads), numpy {np.__version__}, "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, "
        f"GRAMCHECK_THREADS={os.environ.get('GRAMCHECK_THREADS', 'unset')}, cpus {os.cpu_count()}; BLAS: "
        + "; ".join(blas)
    )


def interleaved(entries: dict[str, Callable[[], Any]], rounds: int) -> dict[str, tuple[float, float]]:
    """(median CPU seconds, median wall seconds) per entry; one warm-up call each first."""
    for fn in entries.values():
        fn()
    cpu: dict[str, list[float]] = {k: [] for k in entries}
    wall: dict[str, list[float]] = {k: [] for k in entries}
    for _ in range(rounds):
        for name, fn in entries.items():
            c0, w0 = time.process_time(), time.perf_counter()
            fn()
            cpu[name].append(time.process_time() - c0)
            wall[name].append(time.perf_counter() - w0)
    return {k: (statistics.median(cpu[k]), statistics.median(wall[k])) for k in entries}


def table(title: str, res: dict[str, tuple[float, float]], base: str) -> None:
    print(f"\n### {title}\n\n| entry | CPU median | wall median | CPU ratio to {base} |\n| --- | --- | --- | --- |")
    b = res[base][0]
    for name, (c, w) in res.items():
        print(f"| {name} | {c * 1e3:.1f} ms | {w * 1e3:.1f} ms | {c / b:.2f} |")


# --------------------------------------------------------------------------------------------------
# the forms and their peers
# --------------------------------------------------------------------------------------------------
def form_entries(n: int, which: str | None = None) -> dict[str, Callable[[], Any]]:
    import numpy as np
    import torch

    from gramcheck import variants as V
    from gramcheck.adapters.fla import _naive
    from gramcheck.forms import linear_recurrence
    from gramcheck.variants.retnet import head_gammas

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, H, n, D) for _ in range(3))
    g = torch.nn.functional.logsigmoid(torch.randn(1, H, n, D)) / 16  # fla's GLA gate (gate_logit_normalizer 16)
    gla, rn, lin = V.get("gla"), V.get("retnet"), V.get("linear-elu")
    naive_sgla = _naive("simple_gla").naive_chunk_simple_gla
    naive_gla = _naive("gla").naive_recurrent_gla
    lg = torch.as_tensor(np.log(head_gammas(H)), dtype=torch.float32).reshape(1, 1, H).expand(1, n, H)
    qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    gt = g.transpose(1, 2).contiguous()
    s = D**-0.5
    g_head = lg[:, :1].reshape(1, H, 1, 1).expand(1, H, n, 1)  # RetNet's per-head log gamma, per token
    entries: dict[str, Callable[[], Any]] = {
        "gla chunked C=64": lambda: linear_recurrence(q * s, k, v, g, causal=True, form="chunked", chunk_size=64),
        "gla recurrent": lambda: linear_recurrence(q * s, k, v, g, causal=True, form="recurrent"),
        "fla naive_recurrent_gla": lambda: naive_gla(qt, kt, vt, gt),
        "gla variant chunked (with input checks)": lambda: gla.torch(
            q, k, v, causal=True, form="chunked", chunk_size=64, g=g
        ),
        "retnet chunked C=64": lambda: linear_recurrence(
            q * s, k, v, g_head, causal=True, form="chunked", chunk_size=64
        ),
        "fla naive_chunk_simple_gla C=64": lambda: naive_sgla(qt, kt, vt, lg, chunk_size=64),
        "retnet recurrent": lambda: linear_recurrence(q * s, k, v, g_head, causal=True, form="recurrent"),
        "retnet variant chunked (with input checks)": lambda: rn.torch(
            q, k, v, causal=True, form="chunked", chunk_size=64
        ),
        "linear-elu chunked C=64": lambda: lin.torch(q, k, v, causal=True, form="chunked", chunk_size=64),
        "linear-elu recurrent": lambda: lin.torch(q, k, v, causal=True, form="recurrent"),
        **performer_entries(q, k, v),
    }
    if which is not None:
        return {which: entries[which]}
    return entries


PERFORMER_FEATURES = 256


def performer_entries(q: Any, k: Any, v: Any) -> dict[str, Callable[[], Any]]:
    """Non-causal FAVOR+ with m = 256 positive features: the variant's torch form with performer-pytorch's
    definition (feature eps 1e-4, projection shift) against FastAttention itself, built once with the
    same projection (the module's construction and draw are not timed)."""
    import torch
    from performer_pytorch import FastAttention

    from gramcheck import variants as V
    from gramcheck.adapters.performer import PARAMS
    from gramcheck.featuremaps import random_projection

    w = torch.as_tensor(random_projection(PERFORMER_FEATURES, D, seed=0), dtype=torch.float32)
    attn = FastAttention(dim_heads=D, nb_features=PERFORMER_FEATURES, causal=False)
    with torch.no_grad():
        attn.projection_matrix.copy_(w)
    perf = V.get("performer-positive")
    return {
        "performer variant, non-causal": lambda: perf.torch(q, k, v, causal=False, projection=w, **PARAMS),
        "performer-pytorch FastAttention": lambda: attn(q, k, v),
    }


GROUPS: dict[str, tuple[str, tuple[str, ...]]] = {  # group: (mode, entries; the first is the ratios' base)
    "gla": (
        "causal",
        ("gla chunked C=64", "gla recurrent", "fla naive_recurrent_gla", "gla variant chunked (with input checks)"),
    ),
    "retnet": (
        "causal",
        (
            "retnet chunked C=64",
            "fla naive_chunk_simple_gla C=64",
            "retnet recurrent",
            "retnet variant chunked (with input checks)",
        ),
    ),
    "linear-elu": ("causal", ("linear-elu chunked C=64", "linear-elu recurrent")),
    "performer": ("non-causal", ("performer variant, non-causal", "performer-pytorch FastAttention")),
}


def cmd_forms(args: argparse.Namespace) -> None:
    for n in args.n:
        entries = form_entries(n)
        for group in args.groups or GROUPS:
            mode, names = GROUPS[group]
            res = interleaved({k: entries[k] for k in names}, args.rounds)
            table(f"{group}, {mode}, float32, B=1 H={H} N={n} d={D}", res, names[0])


def cmd_memory(args: argparse.Namespace) -> None:
    print("\n### peak RSS above the RSS before the call (MiB), fresh subprocess per entry\n")
    names = [k for group in args.groups or GROUPS for k in GROUPS[group][1]]
    print("| entry | " + " | ".join(f"N={n}" for n in args.n) + " |\n| --- |" + " --- |" * len(args.n))
    for name in names:
        cells = []
        for n in args.n:
            out = subprocess.run(
                [sys.executable, __file__, "_rss", name, str(n)], capture_output=True, text=True, check=True
            ).stdout
            cells.append(f"{json.loads(out.strip().splitlines()[-1])['peak_mib']:.0f}")
        print(f"| {name} | " + " | ".join(cells) + " |")


def _rss(name: str, n: int) -> None:
    """Child: build the inputs, warm up at N = 64, then report the peak RSS increase of one call."""
    form_entries(64, name)[name]()
    fn = form_entries(n, name)[name]
    base = _current_rss_kib()
    fn()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    print(json.dumps({"peak_mib": max(peak - base, 0) / 1024}))


def _current_rss_kib() -> int:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") // 1024


# --------------------------------------------------------------------------------------------------
# the oracle
# --------------------------------------------------------------------------------------------------
ORACLE_CASES = {
    "softmax": ({}, False),
    "linear-elu": ({}, True),
    "performer-positive": ({}, False),
    "gla": ({}, True),
    "retnet": ({}, True),
}


def oracle_inputs(name: str, n: int = 256, d: int = 32) -> tuple[Any, ...]:
    import numpy as np

    from gramcheck.featuremaps import random_projection
    from gramcheck.variants import get

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, n, d)) for _ in range(3))
    extras: dict[str, Any] = {}
    var = get(name)
    if "projection" in var.input_names:
        extras["projection"] = random_projection(2 * d, d, seed=0)
    if "g" in var.input_names:
        extras["g"] = np.log(rng.uniform(0.9, 0.999, (1, 1, n, d)))
    return q, k, v, extras


def cmd_oracle(args: argparse.Namespace) -> None:
    from gramcheck.agreement import rounding_bound
    from gramcheck.arith import F64
    from gramcheck.oracle import truth
    from gramcheck.variants import get

    for name, (params, causal) in ORACLE_CASES.items():
        q, k, v, extras = oracle_inputs(name)
        var = get(name)
        kw = dict(causal=causal, **params, **extras)
        atol = 0.01 * rounding_bound(name, q, k, v, dtype="float32", **kw)  # what check_agreement asks
        res = interleaved(
            {
                "plain float64 reference": partial(var.reference, q, k, v, arith=F64, **kw),
                "truth (digits=6, as the accuracy property)": partial(truth, name, q, k, v, digits=6, **kw),
                "truth (atol = 1% of the float32 bound)": partial(truth, name, q, k, v, digits=None, atol=atol, **kw),
                "float32 rounding bound": partial(rounding_bound, name, q, k, v, dtype="float32", **kw),
                "agreement's oracle, two passes (bound, then truth)": partial(_two_passes, name, q, k, v, kw),
                "agreement's oracle, one pass (bound and certificate)": partial(_one_pass, name, q, k, v, kw),
            },
            args.rounds,
        )
        table(
            f"oracle, {name}{' causal' if causal else ''}, N=256 d=32, benign (standard normal)",
            res,
            "plain float64 reference",
        )
    cmd_oracle_ill(args)


def _two_passes(name: str, q: Any, k: Any, v: Any, kw: dict[str, Any]) -> Any:
    """check_agreement's oracle before the one-pass certificate: the rounding bound, then the truth."""
    from gramcheck.agreement import rounding_bound
    from gramcheck.oracle import truth

    bound = rounding_bound(name, q, k, v, dtype="float32", **kw)
    return truth(name, q, k, v, digits=None, atol=0.01 * bound, **kw)


def _one_pass(name: str, q: Any, k: Any, v: Any, kw: dict[str, Any]) -> Any:
    """check_agreement's oracle: one rounding-model pass, whose scaled radii certify the float64 value
    (proofs/ball-arithmetic.md, "One pass for the rounding bound and the truth"); the truth only where not."""
    from gramcheck.agreement import rounding_evaluation
    from gramcheck.oracle import truth, truth_given

    ev = rounding_evaluation(name, q, k, v, dtype="float32", **kw)
    if ev.certificate is None:
        return truth(name, q, k, v, digits=None, atol=0.01 * ev.bound, **kw)
    return truth_given(name, q, k, v, ev.certificate, digits=None, atol=0.01 * ev.bound, **kw)


def ill_inputs(causal: bool, B: int = 3, H: int = 2, N: int = 24, d: int = 4) -> tuple[Any, ...]:
    """Batch item 1 of 3 nearly cancels (near-duplicate keys with opposite values; float64 loses about 6
    digits there): causal, in its first four tokens only; non-causal, in all its tokens."""
    import numpy as np

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((B, H, N, d)) for _ in range(3))
    pairs, firsts = (slice(1, 4, 2), slice(0, 3, 2)) if causal else (slice(1, None, 2), slice(0, None, 2))
    k[1, :, pairs] = k[1, :, firsts] * (1 + 1e-11)
    v[1, :, pairs] = -v[1, :, firsts]
    return q, k, v


def _oracle_backend(mode: str, fn: Any) -> Any:
    """fn() with the oracle's escalation arithmetic forced (GRAMCHECK_ORACLE), restored afterwards."""
    old = os.environ.get("GRAMCHECK_ORACLE")
    os.environ["GRAMCHECK_ORACLE"] = mode
    try:
        return fn()
    finally:
        if old is None:
            del os.environ["GRAMCHECK_ORACLE"]
        else:
            os.environ["GRAMCHECK_ORACLE"] = old


def cmd_oracle_ill(args: argparse.Namespace) -> None:
    from gramcheck.arith import MP, BallMP
    from gramcheck.oracle import truth
    from gramcheck.variants import get

    var = get("linear-unnormalised")
    for causal in (True, False):
        q, k, v = ill_inputs(causal)
        t = truth(var, q, k, v, causal=causal, feature="identity", digits=10)
        prec = t.prec
        kw = dict(causal=causal, feature="identity")
        res = interleaved(
            {
                "truth (digits=10)": partial(truth, var, q, k, v, digits=10, **kw),
                "truth, escalating in ball-mpmath": partial(
                    _oracle_backend, "mpmath", partial(truth, var, q, k, v, digits=10, **kw)
                ),
                f"all plain mpmath[{prec}]": partial(var.reference, q, k, v, arith=MP(prec), **kw),
                f"all ball-mpmath[{prec}]": partial(var.reference, q, k, v, arith=BallMP(prec), **kw),
            },
            args.rounds,
        )
        table(
            f"oracle, linear-unnormalised{' causal' if causal else ''}, ill-conditioned (B=3 H=2 N=24 d=4, one "
            f"batch item cancels), truth used {t.arithmetic}",
            res,
            "truth (digits=10)",
        )


# --------------------------------------------------------------------------------------------------
# one check
# --------------------------------------------------------------------------------------------------
def cmd_check(args: argparse.Namespace) -> None:
    cmd = [sys.executable, "-m", "gramcheck", "check", "builtin:linear-elu", "--causal"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("OMP_NUM_THREADS", None)
    res: dict[str, list[tuple[float, float]]] = {}
    for _ in range(args.rounds):
        for threads in ("0", "1"):
            env["GRAMCHECK_THREADS"] = threads
            w0 = time.perf_counter()
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            subprocess.run(cmd, env=env, capture_output=True, check=False)
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
            res.setdefault(threads, []).append((cpu, time.perf_counter() - w0))
    print("\n### `gramcheck check builtin:linear-elu --causal` (ci profile), separate processes, interleaved\n")
    print("| GRAMCHECK_THREADS | CPU median | wall median |\n| --- | --- | --- |")
    for threads, runs in res.items():
        label = "0 (torch/BLAS defaults)" if threads == "0" else threads
        cpu = statistics.median(r[0] for r in runs)
        wall = statistics.median(r[1] for r in runs)
        print(f"| {label} | {cpu:.2f} s | {wall:.2f} s |")


def _check_cpu(root: Path, name: str, causal: bool, limit: float) -> tuple[float, float, str]:
    """(CPU s, wall s, verdict line) of ``gramcheck check builtin:NAME [--causal]`` run from the checkout
    ``root`` in its own process."""
    env = dict(os.environ, PYTHONPATH=str(root), GRAMCHECK_THREADS="1")
    cmd = [sys.executable, "-m", "gramcheck", "check", f"builtin:{name}", *(["--causal"] if causal else [])]
    w0 = time.perf_counter()
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        out = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True, check=False, timeout=limit).stdout
        verdicts = out.strip().splitlines()[-1] if out.strip() else "no output"
    except subprocess.TimeoutExpired:
        verdicts = f"stopped after {limit} s"
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime), time.perf_counter() - w0, verdicts


def cmd_variants(args: argparse.Namespace) -> None:
    """The ci check of every builtin variant (causal where it has a causal mode), one process each; with
    ``--against CHECKOUT``, the same check from that checkout too, the two alternating in order round by round,
    the median CPU of ``--rounds`` each and their ratio."""
    from gramcheck import variants as V

    print("\n### `gramcheck check builtin:NAME [--causal]` (ci profile), one process per variant\n")
    if args.against is None:
        print("| variant | mode | CPU | wall | verdicts |\n| --- | --- | --- | --- | --- |")
    else:
        print(f"| variant | mode | CPU | CPU at {args.against} | ratio | verdicts | verdicts there |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
    for name in args.variants or V.names():
        causal = "causal" in V.get(name).tags()
        mode = "causal" if causal else "non-causal"
        if args.against is None:
            cpu, wall, verdicts = _check_cpu(ROOT, name, causal, args.limit)
            print(f"| {name} | {mode} | {cpu:.1f} s | {wall:.1f} s | {verdicts} |", flush=True)
            continue
        runs: dict[Path, list[float]] = {ROOT: [], Path(args.against): []}
        said: dict[Path, str] = {}
        for r in range(args.rounds):
            for root in list(runs) if r % 2 == 0 else list(runs)[::-1]:
                cpu, _, said[root] = _check_cpu(root, name, causal, args.limit)
                runs[root].append(cpu)
        here, there = (statistics.median(v) for v in runs.values())
        print(
            f"| {name} | {mode} | {here:.1f} s | {there:.1f} s | {here / there:.2f} | {said[ROOT]} | "
            f"{said[Path(args.against)]} |",
            flush=True,
        )


# where a check spends its CPU: the cumulative time of these functions (over all their calls) in a profile
SHARE_OF = {
    "the oracle's truth": ("gramcheck/oracle.py", "truth"),
    "rounding bounds (model balls)": ("gramcheck/agreement.py", "rounding_bound"),
    "probabilistic bounds": ("gramcheck/agreement.py", "probabilistic_bound"),
    "naive definitions in the dtype": ("gramcheck/agreement.py", "naive_forms"),
    "the target's calls": ("gramcheck/targets.py", "call_torch"),
    "backward agreement": ("gramcheck/properties/backward.py", "backward_agreement"),
    "gradcheck": ("gramcheck/properties/gradients.py", "gradcheck"),
}


def cmd_share(args: argparse.Namespace) -> None:
    """The ci check of each variant in this process under cProfile: each part's cumulative CPU time as a
    share of the check's (parts overlap: the truth runs inside agreement and backward agreement)."""
    import cProfile
    import pstats

    import torch  # imported before profiling: its import is not the check's cost

    from gramcheck import variants as V
    from gramcheck.api import check

    torch.set_num_threads(1)
    print("\n### Share of a `ci` check's CPU, cProfile (cumulative over all calls)\n")
    print("| variant | check CPU | " + " | ".join(SHARE_OF) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in SHARE_OF) + " |")
    for name in args.variants or V.names():
        causal = "causal" in V.get(name).tags()
        prof = cProfile.Profile(time.process_time)
        c0 = time.process_time()
        prof.runcall(check, f"builtin:{name}", causal=causal)
        total = time.process_time() - c0
        stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
        cells = []
        for path, fn in SHARE_OF.values():
            cum = sum(v[3] for (f, _, n), v in stats.items() if f.endswith(path) and n == fn)
            cells.append(f"{100 * cum / total:.0f}%")
        print(f"| {name} | {total:.1f} s | " + " | ".join(cells) + " |", flush=True)


def cmd_spectra(args: argparse.Namespace) -> None:
    """The Gram spectrum of phi(Q) phi(K)^T (m = 256 positive features) from its factors against a dense
    SVD of the N x N matrix, with the largest difference of the two spectra relative to s_1."""
    import numpy as np

    from gramcheck import spectra

    m = 256
    for n in [x for x in args.n if x <= 4096]:  # dense needs 8 N^2 bytes per copy and O(N^3) time
        rng = np.random.default_rng(0)
        fq, fk = (np.abs(rng.standard_normal((n, m))) + 0.1 for _ in range(2))
        gram = fq @ fk.T
        res = interleaved(
            {
                "factor spectrum (QR of each factor, SVD of the m x m core)": partial(
                    spectra.factor_spectrum, fq, fk, precision="float64"
                ),
                "dense SVD of the N x N Gram matrix": partial(spectra.dense_spectrum, gram),
            },
            args.rounds,
        )
        fact, dense = spectra.factor_spectrum(fq, fk, precision="float64"), spectra.dense_spectrum(gram)
        r = min(fact.rank, dense.rank)
        rel = float(np.max(np.abs(dense.values[:r] - fact.values[:r])) / dense.values[0])
        table(f"Gram spectrum, N={n}, m={m} (max |difference| / s_1 = {rel:.1e})", res, next(iter(res)))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_rss":
        _rss(sys.argv[2], int(sys.argv[3]))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["forms", "memory", "oracle", "check", "variants", "share", "spectra"])
    ap.add_argument("--n", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variants", nargs="+", help="variants: the builtin variants to check (default: all)")
    ap.add_argument("--groups", nargs="+", choices=list(GROUPS), help="forms, memory: these groups only")
    ap.add_argument("--limit", type=float, default=600.0, help="variants: seconds per check before it is stopped")
    ap.add_argument("--against", default=None, help="variants: another checkout to time the same checks from")
    args = ap.parse_args()
    print(environment())
    commands = {"forms": cmd_forms, "memory": cmd_memory, "oracle": cmd_oracle, "check": cmd_check,
                "variants": cmd_variants, "share": cmd_share, "spectra": cmd_spectra}  # fmt: skip
    commands[args.what](args)


if __name__ == "__main__":
    main()
