"""The ``gramcheck`` command (argparse; rich tables and progress).

    gramcheck list                                   variants, forms, properties
    gramcheck check TARGET --variant V [options]     table of findings; exit 1 on any failure
    gramcheck certify TARGET --variant V -o FILE     the same, written as a certificate
    gramcheck verify FILE [--trusted-key PUB.pem]    re-run a certificate; exit 1 on a changed result
    gramcheck keygen PRIVATE.pem PUBLIC.pem          an ed25519 key pair for certify --sign-key
    gramcheck spectrum --variant V --n N --d D       spectral diagnostics of generated inputs [--plot PNG]
    gramcheck demo                                   every built-in variant: table + ./certificates/

Exit codes: 0 success, 1 a property failed, a certificate did not reproduce or records failures (unless
--accept-recorded-failures), 2 bad arguments or input. Progress: a live display on a terminal, otherwise
one line per property on stderr as each finishes.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import __version__
from . import properties as _properties
from . import variants as _variants
from .arith import SUBNORMALS
from .strategies import KINDS, PROFILES, VALUE_DIMS
from .validation import check_positive_number


def _console() -> Any:
    from rich.console import Console

    return Console(width=max(shutil.get_terminal_size((140, 40)).columns, 140))


def _param(text: str) -> tuple[str, Any]:
    """KEY=VALUE with VALUE parsed as JSON when it parses (numbers, true/false/null), else a string."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"--param: got {text!r}; expected KEY=VALUE")
    key, raw = text.split("=", 1)
    if not key:
        raise argparse.ArgumentTypeError(f"--param: got {text!r}; expected KEY=VALUE with a non-empty KEY")
    try:
        return key, json.loads(raw)
    except json.JSONDecodeError:
        return key, raw


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"got {text!r}; expected a positive integer") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"got {n}; expected a positive integer")
    return n


def _gib(text: str) -> float:
    """A positive finite number of GiB (``--memory-budget``; ``validation.check_positive_number``)."""
    try:
        x = check_positive_number("--memory-budget", float(text), unit="GiB", default="4")
    except ValueError:
        raise argparse.ArgumentTypeError(f"got {text!r}; expected a positive finite number of GiB") from None
    assert x is not None
    return x


def _check_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    domain = {
        "max_n": args.max_n,
        "max_d": args.max_d,
        "examples": args.examples,
        "kinds": tuple(args.kind) if args.kind else None,
        "value_dims": args.value_dims,
    }
    return {
        "causal": args.causal,
        "dtype": args.dtype,
        "device": args.device,
        "subnormals": args.subnormals,
        "domain": domain,
        "properties": args.property or None,
        "profile": args.profile,
        "seed": args.seed,
        "params": dict(args.param) if args.param else None,
        "timeout": args.timeout,
        "isolation": "process" if args.isolate else "thread",
        "memory_budget": None if args.memory_budget is None else args.memory_budget * 2**30,
    }


_VERDICT_STYLE = {"pass": "[green]pass[/green]", "fail": "[red]FAIL[/red]", "skipped": "[dim]skipped[/dim]"}


def _findings_table(title: str, findings: Sequence[Any]) -> Any:
    from rich.markup import escape
    from rich.table import Table

    from .report import note

    table = Table(title=escape(title))
    for col in ("property", "verdict", "measured", "bound", "margin", "rigour", "examples", "note"):
        table.add_column(col, justify="right" if col in ("measured", "bound", "margin", "examples") else "left")
    for f in findings:
        table.add_row(
            f.name,
            _VERDICT_STYLE[f.verdict],
            f"{f.measured:.3g}",
            f"{f.bound:.3g}",
            f"{f.margin:.3g}",
            f.rigour,
            str(f.details.get("examples", "")),
            escape(note(f)),
        )
    return table


def _streamer(console: Any) -> tuple[Any, Any]:
    """(context manager, on_finding): a rich progress display on a terminal; otherwise one line per
    property on stderr, printed as each finishes."""
    import contextlib

    from .report import render_finding

    if sys.stderr.isatty():
        from rich.progress import Progress

        bar = Progress(console=console, transient=True)
        task = bar.add_task("checking")

        def on_finding(f: Any, done: int, total: int) -> None:
            bar.update(task, description=f.name, completed=done, total=total)
            bar.console.print(render_finding(f), markup=False)

        return bar, on_finding

    def on_line(f: Any, done: int, total: int) -> None:
        counter = f"[{done}/{total}] " if total else ""
        print(f"{counter}{render_finding(f)}", file=sys.stderr, flush=True)

    return contextlib.nullcontext(), on_line


def _run_check(args: argparse.Namespace) -> Any:
    """``api.check`` with results streamed as each property finishes; returns the Report."""
    from .api import check

    ctx, on_finding = _streamer(_console())
    with ctx:
        return check(args.target, args.variant, on_finding=on_finding, **_check_kwargs(args))


def cmd_list(args: argparse.Namespace) -> int:
    from rich.table import Table

    console = _console()
    table = Table(title="gramcheck variants")
    for col in ("name", "forms", "hyperparameters (defaults)", "inputs", "tags", "summary"):
        table.add_column(col)
    for v in _variants.list():
        d = v.describe()
        params = ", ".join(f"{k}={val!r}" for k, val in d["params"].items())
        tags = ", ".join(d["declares"])
        table.add_row(v.name, ", ".join(d["forms"]), params, ", ".join(d["inputs"]), tags, v.summary)
    console.print(table)
    props = Table(title="gramcheck properties")
    for col in ("name", "proof", "summary"):
        props.add_column(col)
    for p in _properties.CATALOGUE:
        props.add_row(p.name + ("" if p.default else " (diagnostic)"), f"proofs/{p.proof}", p.summary)
    console.print(props)
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    report = _run_check(args)
    if args.json:  # standard JSON: non-finite numbers as the strings "inf", "-inf", "nan"
        print(json.dumps(report.to_dict(), sort_keys=True, allow_nan=False))
    else:
        console = _console()
        console.print(_findings_table(report.summary().splitlines()[0], report.findings))
        for line in report.tally():
            console.print(line, markup=False)
    return 0 if report.passed else 1


def cmd_certify(args: argparse.Namespace) -> int:
    from rich.markup import escape

    from .api import certificate_of
    from .validation import check_writable_file

    check_writable_file("-o", args.output)  # before the run
    report = _run_check(args)
    cert = certificate_of(report, args.target, stem=Path(args.output).stem)
    if args.sign_key:
        cert.sign(args.sign_key)
    path = cert.write(args.output)
    console = _console()
    console.print(_findings_table(report.summary().splitlines()[0], report.findings))
    console.print(
        f"certificate written to {escape(str(path))} ({'passed' if cert.passed else 'NOT PASSED'}; "
        f"{len(cert.attachments)} counterexample file(s))"
    )
    return 0 if cert.passed else 1


def cmd_verify(args: argparse.Namespace) -> int:
    from rich.markup import escape

    from .api import verify

    result = verify(
        args.certificate,
        strict=args.strict,
        trusted_key=args.trusted_key,
        isolation="process" if args.isolate else None,
        accept_recorded_failures=args.accept_recorded_failures,
    )
    console = _console()
    n = len(result.original["properties"])
    if result.signer:
        trust = "the trusted key" if args.trusted_key else "an untrusted key (pass --trusted-key to check who)"
        console.print(f"signed by {trust}, fingerprint {result.signer[:16]}", markup=False)
    for d in result.environment:
        console.print(f"  environment differs (reported{', fails under --strict' if args.strict else ''}): {d}",
                      markup=False)
    if not result.reproduced:
        console.print(f"[red]{escape(args.certificate)}: did not reproduce: {result.status}[/red]")
        for d in result.differences:
            console.print(f"  {d}", markup=False)
        return 1
    recorded = "passed" if result.original["passed"] else "failed (as recorded)"
    console.print(f"{args.certificate}: {result.status} ({n} properties, {recorded}; covers {result.coverage})",
                  markup=False, soft_wrap=True)
    if not result.ok:
        console.print("the certificate records failures, or judged nothing: exit 1 (--accept-recorded-failures to "
                      "accept them)", markup=False)
        return 1
    return 0


def cmd_keygen(args: argparse.Namespace) -> int:
    from .certificate import keygen

    fp = keygen(args.private, args.public)
    print(f"ed25519 key pair: private {args.private} (keep it secret), public {args.public}; fingerprint {fp[:16]}")
    return 0


def cmd_spectrum(args: argparse.Namespace) -> int:
    from rich.table import Table

    from . import spectra
    from .search import check_memory, memory_estimate
    from .strategies import attention_inputs, sample

    var = _variants.get(args.variant)
    causal = args.causal or "causal-only" in var.declares
    check_memory(
        memory_estimate(args.n, args.d, quadratic=var.features_fn is None),
        None if args.memory_budget is None else args.memory_budget * 2**30,
        arg="--n" if args.n >= args.d else "--d",
        sizes=f"--n {args.n} --d {args.d}",
    )
    ex = sample(
        attention_inputs(
            var, kinds=[args.kind], min_n=args.n, max_n=args.n, min_d=args.d, max_d=args.d, max_h=1, m=args.m
        ),
        seed=args.seed,
    )
    params = dict(args.param) if args.param else {}
    sps = spectra.gram_spectra(var, ex.q, ex.k, causal=causal, normalised=args.normalised, **params, **ex.extras)
    table = Table(
        title=f"{var.name}: spectrum of the {'weight' if args.normalised else 'Gram'} matrix, "
        f"kind {args.kind}, N={args.n}, d={args.d}{', causal' if causal else ''}"
    )
    for col in (
        "head",
        "method",
        "arithmetic",
        "rank",
        "unresolved",
        "floor",
        "s_1",
        "s_r",
        "condition",
        "eff. rank",
        "energy share",
    ):
        table.add_column(col)
    for sp in sps:
        s1 = f"{sp.values[0]:.4g}" if sp.rank else "-"
        sr = f"{sp.values[-1]:.4g}" if sp.rank else "-"
        table.add_row(
            str(sp.head),
            sp.method,
            sp.arithmetic,
            str(sp.rank),
            str(sp.unresolved),
            f"{sp.floor:.2g}",
            s1,
            sr,
            f"{sp.condition:.4g}",
            f"{sp.effective_rank:.3g}",
            f"{sp.energy_share:.4f}",
        )
    console = _console()
    console.print(table)
    if var.features_fn is not None:
        fq, fk = var.features(ex.q, ex.k, **params, **ex.extras)
        margin = spectra.normaliser_margin(fq, fk, causal=causal)
        console.print(f"normaliser margin {margin['margin']:.4g}, range {margin['range']:.4g}")
    if sps[0].note:
        console.print(sps[0].note, markup=False)
    if args.plot:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            console.print("--plot needs matplotlib (pip install matplotlib); no plot written")
            return 2
        fig, ax = plt.subplots(figsize=(6, 4))
        for sp in sps:
            ax.semilogy(range(1, sp.rank + 1), sp.values, marker=".", label=f"head {sp.head}")
            ax.axhline(sp.floor, linestyle=":", linewidth=0.8)
        ax.set_xlabel("index")
        ax.set_ylabel("singular value")
        ax.set_title(f"{var.name} ({args.kind}), dotted: resolution floor")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=100, metadata={"Software": None})
        console.print(f"plot written to {args.plot}", markup=False)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    t0 = time.perf_counter()
    console = _console()
    ctx, on_finding = _streamer(console)
    with ctx:
        table, certs, failed = run_demo(seed=args.seed, out=Path(args.output), on_finding=on_finding)
    console.print(table)
    console.print(certs)
    console.print(f"{failed} failed; certificates in {args.output}/; {time.perf_counter() - t0:.1f} s", markup=False)
    return 1 if failed else 0


def _add_check_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", help="'module:attr', or 'builtin:NAME' for gramcheck's own torch form")
    p.add_argument("--variant", help="the variant the target implements (default for builtin: NAME)")
    p.add_argument("--causal", action="store_true", help="check the causal mode")
    p.add_argument("--dtype", default="float32", choices=["float64", "float32", "bfloat16", "float16"])
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--subnormals", default="gradual", choices=SUBNORMALS,
        help="'flush' for a target whose arithmetic flushes results below the smallest normal to zero",
    )  # fmt: skip
    p.add_argument("--profile", default="ci", choices=sorted(PROFILES))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--property", action="append", choices=_properties.names(), help="repeatable; default all")
    p.add_argument("--kind", action="append", choices=KINDS, help="input kinds to draw (repeatable)")
    p.add_argument("--max-n", type=_positive, default=None, help="largest N (default: the profile's)")
    p.add_argument("--max-d", type=_positive, default=None, help="largest d (default: the profile's)")
    p.add_argument(
        "--value-dims", default="same", choices=VALUE_DIMS,
        help="'any' draws d_v apart from d_k (rectangular heads); default d_v = d_k",
    )  # fmt: skip
    p.add_argument("--examples", type=_positive, default=None, help="examples per property (default: profile's)")
    p.add_argument("--param", action="append", type=_param, help="hyperparameter KEY=VALUE (repeatable)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds one target call may take")
    p.add_argument(
        "--isolate", action="store_true", help="run the target in a worker process (killed on timeout or crash)"
    )
    p.add_argument("--memory-budget", type=_gib, default=None, help="GiB the check may use (default 4)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gramcheck",
        description="Property tests, error bounds and stability certificates for linear and kernelized attention.",
    )
    p.add_argument("--version", action="version", version=f"gramcheck {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="variants, forms and properties").set_defaults(fn=cmd_list)
    c = sub.add_parser("check", help="check a target; exit 1 on any failure")
    _add_check_options(c)
    c.add_argument("--json", action="store_true", help="print the report as JSON")
    c.set_defaults(fn=cmd_check)
    ce = sub.add_parser("certify", help="check a target and write a certificate")
    _add_check_options(ce)
    ce.add_argument("-o", "--output", default="certificate.json")
    ce.add_argument("--sign-key", help="ed25519 private key (PEM, from 'gramcheck keygen') to sign the certificate")
    ce.set_defaults(fn=cmd_certify)
    v = sub.add_parser("verify", help="re-run a certificate; exit 1 on any difference")
    v.add_argument("certificate")
    v.add_argument("--trusted-key", help="ed25519 public key (PEM): the certificate must be signed by it")
    v.add_argument("--strict", action="store_true", help="a different environment (versions) fails too")
    v.add_argument(
        "--accept-recorded-failures", action="store_true", help="exit 0 when a certificate reproduces its failures"
    )
    v.add_argument("--isolate", action="store_true", help="run the target in a worker process")
    v.set_defaults(fn=cmd_verify)
    k = sub.add_parser(
        "keygen", help="write an ed25519 key pair for signing certificates (two new, different paths; never overwrites)"
    )
    k.add_argument("private")
    k.add_argument("public")
    k.set_defaults(fn=cmd_keygen)
    s = sub.add_parser("spectrum", help="spectral diagnostics of generated inputs")
    s.add_argument("--variant", required=True, choices=_variants.names())
    s.add_argument("--n", type=_positive, default=64)
    s.add_argument("--d", type=_positive, default=16)
    s.add_argument("--m", type=_positive, default=None, help="random features (random-feature variants)")
    s.add_argument("--kind", default="gaussian", choices=KINDS)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--causal", action="store_true")
    s.add_argument("--normalised", action="store_true", help="the row-normalised weight matrix instead of A")
    s.add_argument("--param", action="append", type=_param)
    s.add_argument("--plot", help="write a PNG of the singular values (needs matplotlib)")
    s.add_argument("--memory-budget", type=_gib, default=None, help="GiB the spectra may use (default 4)")
    s.set_defaults(fn=cmd_spectrum)
    d = sub.add_parser("demo", help="check every built-in variant; table and certificates")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("-o", "--output", default="certificates")
    d.set_defaults(fn=cmd_demo)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    # targets in the working directory import as they do under `python -m gramcheck` and pytest
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    args = build_parser().parse_args(argv)
    from .certificate import CertificateError

    try:
        return int(args.fn(args))
    except (ValueError, TypeError, CertificateError) as exc:  # bad input: a clear message, exit 2
        print(f"gramcheck {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
