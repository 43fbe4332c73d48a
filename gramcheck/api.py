"""``check``: run the property catalogue against an attention function (the bound-checking API)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import properties as _properties
from . import threads as _threads
from . import variants as _variants
from .arith import SUBNORMALS
from .findings import Finding
from .precision import dtype_name
from .report import Report
from .search import Domain, run_property
from .strategies import PROFILES
from .targets import DEFAULT_ISOLATION, ISOLATIONS, Target, builtin, resolve
from .validation import check_choice, check_writable_file

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
    subnormals: str = "gradual",
) -> Target:
    """A Target from a callable, 'module:attr', 'builtin:NAME' (``variant`` defaults to NAME) or 'fla:OP'
    (fla's Triton op OP; ``variant`` defaults to the op's first variant, ``params`` to the op's own);
    ``subnormals``: 'flush' for a target whose arithmetic flushes results below the smallest normal to
    zero (``arith.subnormals``). A Target is returned as it is."""
    if isinstance(target, Target):
        if subnormals != "gradual" and subnormals != target.subnormals:
            raise ValueError(
                f"subnormals: got {subnormals!r} for a Target declared {target.subnormals!r}; expected the "
                "Target's own declaration (make_target(..., subnormals=...))"
            )
        return target
    fn, name = resolve(target)
    _check_device(device)
    if params is not None and not isinstance(params, Mapping):
        raise TypeError(f"params: got {params!r} ({type(params).__name__}); expected a dict of hyperparameters")
    if dtype is None:  # numpy reads None as float64
        raise TypeError("dtype: got None; expected one of float64, float32, bfloat16, float16 (or a torch dtype)")
    if dtype_name(dtype) == "tf32":
        raise ValueError(
            "dtype: got 'tf32'; tf32 is a matmul precision mode, not a torch dtype a target can be called in; "
            "expected one of float64, float32, bfloat16, float16"
        )
    _check_timeout(timeout)
    if name is not None:  # builtin:NAME
        if variant is not None and _variants.get(variant).name != name:
            raise ValueError(f"variant: got {variant!r} for target builtin:{name}; expected {name!r} or None")
        t = builtin(name, form=form, dtype=dtype, **(params or {}))
        t.device, t.timeout = device, timeout
        t.subnormals = check_choice("subnormals", subnormals, SUBNORMALS)
        return t
    if isinstance(target, str) and target.startswith("fla:"):
        from .adapters import fla_kernels

        bound, var_name, merged = fla_kernels.bind(target.split(":", 1)[1], variant, params)
        return Target(
            bound, _variants.get(var_name), dtype=dtype_name(dtype), device=device, params=merged, name=target,
            timeout=timeout, subnormals=subnormals,
        )  # fmt: skip
    if variant is None:
        raise ValueError("variant: got None; expected the name of the variant the target implements")
    label = target_spec(target)
    label = label.removeprefix("python:")
    t = Target(
        fn,
        _variants.get(variant),
        dtype=dtype_name(dtype),
        device=device,
        params=params or {},
        name=label,
        timeout=timeout,
        subnormals=subnormals,
    )
    if isinstance(target, str):
        t.rebuild = ("import", target)
    return t


def _check_device(device: Any) -> None:
    """A device torch knows and this machine has (a tensor can be made on it)."""
    if not isinstance(device, str):
        raise TypeError(f"device: got {device!r} ({type(device).__name__}); expected a string such as 'cpu' or 'cuda'")
    try:
        import torch
    except ImportError:  # pragma: no cover
        raise ValueError("device: targets are torch functions; torch is not installed (pip install torch)") from None
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as exc:
        raise ValueError(f"device: got {device!r}; not a torch device ({exc})") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"device: got {device!r}; this machine has no CUDA device (torch.cuda.is_available() is False)"
        )
    try:
        torch.empty(1, device=dev)
    except (RuntimeError, AssertionError) as exc:
        raise ValueError(f"device: got {device!r}; torch cannot allocate on it ({str(exc)[:200]})") from None


def _check_timeout(timeout: Any) -> None:
    if timeout is None:
        return
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0 or timeout == math.inf:
        raise ValueError(f"timeout: got {timeout!r}; expected a positive finite number of seconds, or None")


def _domain(domain: Any) -> Domain:
    """A Domain from ``domain``: a Domain, a dict of its fields, or None (the profile's)."""
    if domain is None or isinstance(domain, Domain):
        return domain or Domain()
    if not isinstance(domain, dict):
        raise TypeError(
            f"domain: got {domain!r} ({type(domain).__name__}); expected a Domain, a dict of its fields or None"
        )
    unknown = sorted(set(domain) - {f.name for f in fields(Domain)})
    if unknown:
        raise TypeError(
            f"domain: got the field {unknown[0]!r}; expected fields of Domain: "
            f"{', '.join(f.name for f in fields(Domain))}"
        )
    return Domain(**domain)


def check_seed(seed: Any) -> int:
    """``seed`` itself when it is an integer (a TypeError naming ``seed`` otherwise)."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed: got {seed!r} ({type(seed).__name__}); expected an integer")
    return seed


def check_domain(
    var: Any, domain: Domain | dict[str, Any] | None, profile: str, *, memory_budget: float | None = None
) -> Domain:
    """``domain`` as a Domain, its kinds known (``strategies.KINDS``) and the largest input of the sizes
    ``profile`` draws within ``memory_budget`` bytes (``Domain.check_memory``); a ValueError naming the
    argument otherwise."""
    dom = _domain(domain)  # its kinds and gates are checked by Domain itself
    dom.resolved(profile).check_memory(var, budget=memory_budget)
    return dom


def check(
    target: Callable[..., Any] | str | Target,
    variant: Any = None,
    *,
    causal: bool = False,
    dtype: Any = "float32",
    device: str = "cpu",
    subnormals: str = "gradual",
    domain: Domain | dict[str, Any] | None = None,
    properties: Sequence[str] | None = None,
    profile: str = "ci",
    seed: int = 0,
    params: dict[str, Any] | None = None,
    timeout: float | None = 60.0,
    progress: Callable[[str, int, int], None] | None = None,
    on_finding: Callable[[Finding, int, int], None] | None = None,
    memory_budget: float | None = None,
    isolation: str = DEFAULT_ISOLATION,
    threads: int | None = None,
) -> Report:
    """Check ``target`` as an implementation of ``variant`` (B, H, N, d layout) and return a Report.

    ``properties``: names from ``gramcheck.properties.names()`` (default: every property applicable to
    the variant, mode and dtype); ``domain``: a ``Domain`` or its fields as a dict (kinds, max_n, max_d,
    max_b, max_h, examples, chunks, budget, gates, grad_max_n, value_dims; sizes default to the profile's);
    ``profile``: 'ci' (fast, seeded by ``seed``) or 'thorough'; ``params``: the
    hyperparameters the target implements (passed to the reference); ``subnormals``: 'flush' where the
    target's arithmetic flushes results below the smallest normal to zero (FTZ/DAZ, -ftz builds, Triton's
    approximate exp on a GPU), so that the rounding bounds charge flushing where a result may fall there
    (``arith.subnormals``; recorded in the Report and the certificate); ``progress(name, done, total)`` is
    called before each property and once at the end (name ''); ``on_finding(finding, done, total)`` as
    each property finishes. ``memory_budget`` (bytes; default ``search.MEMORY_BUDGET``) bounds the
    estimated memory of the largest input (``Domain.memory_estimate``): a larger domain is a ValueError
    before anything runs. ``isolation``: 'thread' (the target runs on a worker thread of this process)
    or 'process' (in a worker process that is killed after a timeout and restarted after a crash);
    ``threads``: torch and BLAS threads while checking (default $GRAMCHECK_THREADS, else 1: the inputs
    are tiny and a parallel region costs more than their work; 0 leaves the settings alone)."""
    check_choice("profile", profile, tuple(PROFILES))
    check_choice("isolation", isolation, ISOLATIONS)
    seed = check_seed(seed)
    t = make_target(target, variant, dtype=dtype, device=device, params=params, timeout=timeout, subnormals=subnormals)
    var = t.variant
    causal = var.check_causal(causal)
    dom = check_domain(var, domain, profile, memory_budget=memory_budget)
    props = select_properties(var, causal, dict(t.params), t.dtype, properties, own_draws=bool(t.own_draws))
    report = Report(
        t.name,
        var.name,
        causal,
        t.dtype,
        device,
        profile,
        seed,
        dom.resolved(profile).to_dict(),  # the sizes drawn, as a certificate must state them
        params=dict(t.overrides),
        requested=None if properties is None else [p.name for p in props],
        subnormals=t.subnormals,
        limits={"timeout": t.timeout, "memory_budget": memory_budget},
    )
    n_threads = _threads.resolve(threads)  # validated before any work
    if isolation == "process":
        t = t.isolated()
    try:
        for i, p in enumerate(props):
            if progress is not None:
                progress(p.name, i, len(props))
            f = run_property(
                p, t, causal=causal, domain=dom, profile_name=profile, seed=seed, threads=n_threads
            )
            report.findings.append(f)
            if on_finding is not None:
                on_finding(f, i + 1, len(props))
    finally:
        t.close()
    if progress is not None:
        progress("", len(props), len(props))
    return report


def select_properties(
    var: Any,
    causal: bool,
    params: dict[str, Any],
    dtype: str,
    properties: Sequence[str] | None,
    *,
    own_draws: bool = False,
) -> list[Any]:
    """The properties to run: every applicable one (catalogue order), or the ones asked for, each of
    which must apply to the variant, mode and dtype (a ValueError naming it otherwise). For a target that
    draws its own random features (``own_draws``) the default adds the statistical properties."""
    applicable = _properties.applicable(var, causal, params, dtype=dtype, include_diagnostics=True)
    if properties is None:
        return [p for p in applicable if p.default or (own_draws and p.name in _properties.STATISTICAL)]
    if isinstance(properties, str):
        raise TypeError(f"properties: got the string {properties!r}; expected a list of property names")
    if not properties:
        raise ValueError("properties: got an empty list; expected property names, or None for every applicable one")
    out = []
    names = {p.name for p in applicable}
    for name in properties:
        p = _properties.get(name)
        if p.name not in names:
            mode = "causal" if causal else "non-causal"
            raise ValueError(
                f"properties: {p.name!r} does not apply to variant {var.name!r} ({mode}, {dtype}); "
                f"applicable: {', '.join(sorted(names))}"
            )
        if p not in out:
            out.append(p)
    return out


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
    sign_key: str | Path | None = None,
    **kwargs: Any,
) -> Certificate:
    """Run ``check`` and turn its Report into a Certificate (written to ``out`` when given, with its
    counterexample .npz files beside it; signed with the ed25519 PEM key ``sign_key`` when given).
    Same keywords as ``check``. ``out`` is checked before the run (a file path that can be written)."""
    if out is not None:
        check_writable_file("out", out)
    report = check(target, variant, **kwargs)
    cert = certificate_of(report, target, stem="certificate" if out is None else Path(out).stem)
    if sign_key is not None:
        cert.sign(sign_key)
    if out is not None:
        cert.write(out)
    return cert


def certificate_of(report: Report, target: Any, *, spec: str | None = None, stem: str = "certificate") -> Certificate:
    """The Certificate of ``report`` for ``target`` (a callable, 'module:attr', 'builtin:NAME' or a Target):
    records ``spec`` (default ``target_spec(target)``), the properties requested (``report.requested``)
    and the target's ``source_hash`` (none for gramcheck's own forms)."""
    from .certificate import from_report, source_hash

    spec = target_spec(target) if spec is None else spec
    fn = target.fn if isinstance(target, Target) else resolve(target)[0]
    module = spec.split(":")[0] if ":" in spec and not spec.startswith(("builtin:", "python:", "fla:")) else None
    src = None if spec.startswith("builtin:") or fn is None else source_hash(fn, module)
    return from_report(report, target_spec=spec, source=src, stem=stem, requested=report.requested)


@dataclass
class Verification:
    """The re-run of a certificate. ``reproduced``: every setting, verdict, value and detail reproduced, no
    applicable (or requested) property is missing from the file, and (``strict``) the environment is the
    same. ``ok``: reproduced, and the certificate records a pass (or ``accept_recorded_failures``): a
    reproduced record of failures is not an ok. ``differences``: results that changed; ``environment``:
    version differences (reported, failing only when strict); ``source_changed``: the target's source hash
    differs; ``signer``: the signing key's fingerprint (None when unsigned); ``coverage``: which properties
    the certificate covers (every applicable one, or a requested subset, named)."""

    differences: list[str]
    original: dict[str, Any]
    rerun: dict[str, Any]
    environment: list[str] = field(default_factory=list)
    source_changed: bool = False
    signer: str | None = None
    strict: bool = False
    accept_recorded_failures: bool = False
    coverage: str = ""

    @property
    def reproduced(self) -> bool:
        return not self.differences and not (self.strict and self.environment)

    @property
    def ok(self) -> bool:
        """Reproduced, and a pass, or (``accept_recorded_failures``) a record of failures: never a record of
        nothing judged."""
        failed = any(e["verdict"] == "fail" for e in self.original["properties"])
        return self.reproduced and (bool(self.original["passed"]) or (self.accept_recorded_failures and failed))

    @property
    def status(self) -> str:
        """'reproduced', 'source changed, results identical', 'environment changed' (strict) or
        'results changed'."""
        if self.differences:
            return "results changed"
        if self.strict and self.environment:
            return "environment changed"
        return "source changed, results identical" if self.source_changed else "reproduced"


def verify(
    path: str | Path,
    *,
    strict: bool = False,
    trusted_key: str | Path | None = None,
    isolation: str | None = None,
    accept_recorded_failures: bool = False,
) -> Verification:
    """Load a certificate (schema, canonical bytes, content hash, counterexample hashes and any signature are
    checked; a problem raises CertificateError; with ``trusted_key`` it must be signed by that ed25519 public
    key), re-run the check it records (the requested properties, or every applicable one) and compare. The
    result is ``ok`` only when it reproduced and records a pass (``accept_recorded_failures``: or failures)."""
    from .certificate import (
        CertificateError,
        check_signature,
        differences,
        environment_differences,
        load,
        source_changed,
    )

    data = load(path)
    signer = check_signature(data, trusted_key, where=str(path))
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
        subnormals=env.get("subnormals", "gradual"),
        domain=data["domain"],
        properties=data["requested"],
        profile=data["profile"],
        seed=data["seed"],
        params=data["params"] or None,
        isolation=isolation or DEFAULT_ISOLATION,
        **data.get("limits", {}),
    )
    diffs = differences(data, cert.data)
    envs = environment_differences(data, cert.data)
    return Verification(
        diffs, data, cert.data, envs, source_changed(data, cert.data), signer, strict, accept_recorded_failures,
        _coverage(data),
    )  # fmt: skip


def _coverage(data: dict[str, Any]) -> str:
    """Which properties a certificate covers: every applicable one (``requested`` null), or the subset it names."""
    if data["requested"] is None:
        return "every applicable property"
    var = _variants.get(data["variant"])
    params = dict(var.resolve_params(data["params"] or {}))
    names = [p.name for p in select_properties(var, data["causal"], params, data["environment"]["dtype"], None)]
    left = [n for n in names if n not in data["requested"]]
    subset = f"only the requested {', '.join(data['requested'])}"
    return subset + (f" (not checked: {', '.join(left)})" if left else "")
