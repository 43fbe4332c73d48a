"""``check``: run the property catalogue against an attention function (the bound-checking API)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import properties as _properties
from . import variants as _variants
from .precision import dtype_name
from .report import Report
from .search import Domain, run_property
from .strategies import KINDS, PROFILES
from .targets import Target, builtin, resolve
from .validation import check_choice

if TYPE_CHECKING:
    from .certificate import Certificate


def make_target(
    target: Any,
    variant: Any = None,
    *,
    dtype: Any = "float32",
    device: str = "cpu",
    params: dict[str, Any] | None = None,
    timeout: float | None = 60.0,
    form: str | None = None,
) -> Target:
    """A Target from a callable, 'module:attr', 'builtin:NAME' (``variant`` defaults to NAME) or 'fla:OP'
    (fla's Triton op OP; ``variant`` defaults to the op's first variant, ``params`` to the op's own)."""
    if isinstance(target, Target):
        return target
    fn, name = resolve(target)
    if name is not None:  # builtin:NAME
        if variant is not None and _variants.get(variant).name != name:
            raise ValueError(f"variant: got {variant!r} for target builtin:{name}; expected {name!r} or None")
        t = builtin(name, form=form, dtype=dtype, **(params or {}))
        t.device, t.timeout = device, timeout
        return t
    if isinstance(target, str) and target.startswith("fla:"):
        from .adapters import fla_kernels

        bound, var_name, merged = fla_kernels.bind(target.split(":", 1)[1], variant, params)
        return Target(
            bound, _variants.get(var_name), dtype=dtype_name(dtype), device=device, params=merged, name=target,
            timeout=timeout,
        )  # fmt: skip
    if variant is None:
        raise ValueError("variant: got None; expected the name of the variant the target implements")
    label = target if isinstance(target, str) else getattr(fn, "__qualname__", repr(fn))
    return Target(
        fn,
        _variants.get(variant),
        dtype=dtype_name(dtype),
        device=device,
        params=params or {},
        name=label,
        timeout=timeout,
    )


def check(
    target: Callable[..., Any] | str | Target,
    variant: Any = None,
    *,
    causal: bool = False,
    dtype: Any = "float32",
    device: str = "cpu",
    domain: Domain | dict[str, Any] | None = None,
    properties: Sequence[str] | None = None,
    profile: str = "ci",
    seed: int = 0,
    params: dict[str, Any] | None = None,
    timeout: float | None = 60.0,
    progress: Callable[[str, int, int], None] | None = None,
) -> Report:
    """Check ``target`` as an implementation of ``variant`` (B, H, N, d layout) and return a Report.

    ``properties``: names from ``gramcheck.properties.names()`` (default: every property applicable to
    the variant, mode and dtype); ``domain``: a ``Domain`` or its fields as a dict (kinds, max_n, max_d,
    max_b, max_h, examples); ``profile``: 'ci' (fast, derandomised) or 'thorough'; ``params``: the
    hyperparameters the target implements (passed to the reference); ``progress(name, done, total)`` is
    called before each property and once at the end (name '')."""
    check_choice("profile", profile, tuple(PROFILES))
    t = make_target(target, variant, dtype=dtype, device=device, params=params, timeout=timeout)
    var = t.variant
    var.check_causal(causal)
    dom = domain if isinstance(domain, Domain) else Domain(**(domain or {}))
    for k in dom.kinds or ():
        check_choice("domain.kinds", k, KINDS)
    if properties is None:
        props = _properties.applicable(var, causal, dict(t.params), dtype=t.dtype)
    else:
        props = [_properties.get(p) for p in properties]
    report = Report(t.name, var.name, causal, t.dtype, device, profile, seed, dom.to_dict(), params=dict(t.overrides))
    for i, p in enumerate(props):
        if progress is not None:
            progress(p.name, i, len(props))
        report.findings.append(run_property(p, t, causal=causal, domain=dom, profile_name=profile, seed=seed))
    if progress is not None:
        progress("", len(props), len(props))
    return report


def target_spec(target: Any) -> str:
    """What a certificate records so that ``verify`` can re-import the target."""
    if isinstance(target, str):
        return target
    if isinstance(target, Target):
        return target.name
    mod, qual = getattr(target, "__module__", None), getattr(target, "__qualname__", None)
    if mod and qual and "<locals>" not in qual and mod != "__main__":
        return f"{mod}:{qual}"
    return f"python:{qual or repr(target)}"


def certify(
    target: Callable[..., Any] | str,
    variant: Any = None,
    *,
    out: str | None = None,
    **kwargs: Any,
) -> Certificate:
    """Run ``check`` and turn its Report into a Certificate (written to ``out`` when given, with its
    counterexample .npz files beside it). Same keywords as ``check``."""
    report = check(target, variant, **kwargs)
    cert = certificate_of(report, target, stem="certificate" if out is None else Path(out).stem)
    if out is not None:
        cert.write(out)
    return cert


def certificate_of(report: Report, target: Any, *, spec: str | None = None, stem: str = "certificate") -> Certificate:
    """The Certificate of ``report`` for ``target`` (a callable, 'module:attr', 'builtin:NAME' or a Target):
    records ``spec`` (default ``target_spec(target)``) and the SHA-256 of the target's source, none for
    gramcheck's own forms."""
    from .certificate import from_report, source_hash

    spec = target_spec(target) if spec is None else spec
    fn = target.fn if isinstance(target, Target) else resolve(target)[0]
    src = None if spec.startswith("builtin:") or fn is None else source_hash(fn)
    return from_report(report, target_spec=spec, source=src, stem=stem)


@dataclass
class Verification:
    """``ok``: the re-run reproduced every verdict and value; ``differences`` lists what changed."""

    ok: bool
    differences: list[str]
    original: dict[str, Any]
    rerun: dict[str, Any]


def verify(path: str | Path) -> Verification:
    """Load a certificate (schema, content hash and counterexample hashes are checked; a problem raises
    CertificateError), re-run the same check and compare."""
    from .certificate import CertificateError, differences, load

    data = load(path)
    spec = data["target"]["spec"]
    if spec.startswith("python:"):
        raise CertificateError(
            f"certificate: target {spec!r} was a local callable; verify needs an importable 'module:attr' target"
        )
    env = data["environment"]
    cert = certify(
        spec,
        None if spec.startswith("builtin:") else data["variant"],
        causal=data["causal"],
        dtype=env["dtype"],
        device=env["device"],
        domain=data["domain"],
        properties=[e["property"] for e in data["properties"]],
        profile=data["profile"],
        seed=data["seed"],
        params=data["params"] or None,
    )
    diffs = differences(data, cert.data)
    return Verification(not diffs, diffs, data, cert.data)
