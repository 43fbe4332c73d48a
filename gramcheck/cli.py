"""The ``gramcheck`` command (argparse; rich tables)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from . import __version__
from . import variants as _variants


def _console():  # type: ignore[no-untyped-def]
    import shutil

    from rich.console import Console

    return Console(width=max(shutil.get_terminal_size((140, 40)).columns, 140))


def cmd_list(args: argparse.Namespace) -> int:
    from rich.table import Table

    table = Table(title="gramcheck variants")
    for col in ("name", "forms", "declares", "inputs", "summary"):
        table.add_column(col)
    for v in _variants.list():
        table.add_row(v.name, ", ".join(v.forms), ", ".join(sorted(v.declares)), ", ".join(v.inputs), v.summary)
    _console().print(table)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from rich.table import Table

    from .demo import run_demo

    t0 = time.perf_counter()
    table = Table(title="gramcheck demo: built-in torch forms against the oracle (error / gamma-bound)")
    for col in ("variant", "form", "mode", "dtype", "oracle", "max err", "err/bound", "verdict"):
        table.add_column(col, justify="right" if col in ("max err", "err/bound") else "left")
    failed = 0
    dtypes = tuple(args.dtype) if args.dtype else ("float32", "float64")
    for f in run_demo(dtypes=dtypes, seed=args.seed):
        d = f.details
        failed += not f.passed
        table.add_row(
            d["variant"],
            d["form"],
            "causal" if d["causal"] else "full",
            d["dtype"],
            d["oracle"],
            f"{d.get('max_abs_error', float('nan')):.2e}",
            f"{f.measured:.3f}",
            "[green]pass[/green]" if f.passed else "[red]FAIL[/red]",
        )
    console = _console()
    console.print(table)
    console.print(f"{table.row_count} checks, {failed} failed, {time.perf_counter() - t0:.1f} s")
    return 1 if failed else 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gramcheck", description=__doc__)
    p.add_argument("--version", action="version", version=f"gramcheck {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="variants, forms and declared properties").set_defaults(fn=cmd_list)
    d = sub.add_parser("demo", help="check every built-in variant against the oracle and print a table")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--dtype", action="append", choices=["float32", "float64"], help="repeatable; default both")
    d.set_defaults(fn=cmd_demo)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.fn(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
