"""How many of the bug set's bugs a default ``gramcheck.check`` catches, and how many fixed twins it fails.

    python benchmarks/bugset/run.py [--seeds 0] [--jobs 2] [--only ID ...] [--json FILE]

Each twin of each Case (benchmarks/bugset/cases.py) is checked with the ``ci`` profile and the default
domain, as a user would, in a worker process of its own (one thread each). A bug is caught when its buggy
twin fails a property for some seed; a false alarm is a fixed twin failing one. Prints the environment,
one row per case and the totals.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import pkgutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_NUM_THREADS", "1")


def cases() -> list[Any]:
    """Every Case of the package's modules, in module then list order."""
    import benchmarks.bugset as pkg

    found = []
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        mod = importlib.import_module(f"benchmarks.bugset.{info.name}")
        found += list(getattr(mod, "CASES", []))
    ids = [c.id for c in found]
    dup = {i for i in ids if ids.count(i) > 1}
    if dup:
        raise ValueError(f"bug set: case ids {sorted(dup)} are not unique")
    return found


def _one(case_id: str, twin: str, seed: int) -> dict[str, Any]:
    """Check one twin of one case; the failing properties with measured and bound, and the CPU time."""
    import gramcheck

    case = next(c for c in cases() if c.id == case_id)
    t0 = time.process_time()
    try:
        report = gramcheck.check(
            getattr(case, twin),
            case.variant,
            causal=case.causal,
            dtype=case.dtype,
            params=dict(case.params),
            domain=None if case.domain is None else dict(case.domain),
            seed=seed,
            properties=None if case.properties is None else list(case.properties),
        )
        failed = [f"{f.name} {f.measured:.3g}/{f.bound:.3g}" for f in report.findings if not f.passed]
        error = None
    except Exception as exc:  # an error of the check itself is a result too
        failed, error = [], f"{type(exc).__name__}: {exc}"
    return {"id": case_id, "twin": twin, "seed": seed, "failed": failed, "error": error,
            "cpu_s": round(time.process_time() - t0, 1)}


def fails_through_its_flaw(case: Any, fixed_runs: list[dict[str, Any]]) -> bool:
    """Whether the fixed twin's runs fail through its upstream fix's own flaw (``Case.flaw``, shown by
    tests/test_bugset.py): some property fails, every failing one is among ``Case.flaw_properties``, and no
    check raised. Any other failure of a fixed twin is a false alarm."""
    failed = {x.split()[0] for r in fixed_runs for x in r["failed"]}
    return bool(failed) and failed <= set(case.flaw_properties) and not any(r["error"] for r in fixed_runs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--only", nargs="+", default=None)
    ap.add_argument("--json", default=None, help="write one JSON line per checked twin")
    args = ap.parse_args(argv)
    import torch

    import gramcheck

    print(f"gramcheck {gramcheck.__version__}, torch {torch.__version__}, {os.cpu_count()} CPUs, "
          f"{args.jobs} worker processes of 1 thread, seeds {args.seeds}, profile ci, default domain")
    todo = [c for c in cases() if args.only is None or c.id in args.only]
    jobs = [(c.id, twin, s) for c in todo for twin in ("buggy", "fixed") for s in args.seeds]
    with ProcessPoolExecutor(args.jobs) as pool:
        results = list(pool.map(_one, *zip(*jobs, strict=True)))
    if args.json:
        Path(args.json).write_text("".join(json.dumps(r) + "\n" for r in results))
    by = {(r["id"], r["twin"]): [] for r in results}
    for r in results:
        by[(r["id"], r["twin"])].append(r)
    print("| case | variant | kind | dtype | bug caught by | fixed twin fails | CPU s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    caught = alarms = flawed = 0
    for c in todo:
        b, f = by[(c.id, "buggy")], by[(c.id, "fixed")]
        b_fail = sorted({x for r in b for x in r["failed"]} | {r["error"] for r in b if r["error"]})
        f_fail = sorted({x for r in f for x in r["failed"]} | {r["error"] for r in f if r["error"]})
        caught += any(r["failed"] for r in b)
        flaw = fails_through_its_flaw(c, f)
        flawed += flaw
        alarms += bool(f_fail) and not flaw
        cpu = sum(r["cpu_s"] for r in b + f)
        fixed_col = "; ".join(f_fail) + (f" (the upstream fix's flaw: {c.flaw})" if flaw else "")
        print(f"| {c.id} | {c.variant} | {c.kind} | {c.dtype} | {'; '.join(b_fail) or 'MISSED'} | "
              f"{fixed_col or '-'} | {cpu:.0f} |")
    n = len(todo)
    rate = 100 * caught / max(n, 1)
    print(f"\ncaught {caught} of {n} bugs ({rate:.0f}%); false alarms on {alarms} of {n} fixed twins; "
          f"{flawed} fixed twins fail through a flaw of the upstream fix itself (Case.flaw)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
