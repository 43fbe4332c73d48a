"""Stability certificates: canonical JSON of a ``Report`` with its environment, domain and seed, a content
hash, counterexamples as .npz files beside it, and ``verify`` that re-runs it.

Canonical JSON: keys sorted, no whitespace, floats as Python's shortest round-trip repr, non-finite floats
as the strings "inf", "-inf", "nan", UTF-8, one trailing newline. ``content_hash`` is the SHA-256 of the
canonical JSON of the certificate without its ``content_hash`` field, so a changed byte anywhere is
detected. The schema is ``gramcheck/schema/certificate-v1.json`` (JSON Schema 2020-12).
"""

from __future__ import annotations

import hashlib
import inspect
import io
import json
import math
import platform
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .report import Report

SCHEMA_VERSION = 1
SCHEMA_FILE = Path(__file__).parent / "schema" / "certificate-v1.json"


class CertificateError(ValueError):
    """A certificate file that is unreadable, malformed, tampered with or from a newer schema."""


# --------------------------------------------------------------------------------------------------
# canonical JSON
# --------------------------------------------------------------------------------------------------
def _plain(x: Any) -> Any:
    """JSON-ready, deterministic: numpy scalars to Python, non-finite floats to strings, tuples to lists."""
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        f = float(x)
        if math.isnan(f):
            return "nan"
        if math.isinf(f):
            return "inf" if f > 0 else "-inf"
        return f
    if isinstance(x, np.ndarray):
        return _plain(x.tolist())
    if x is None or isinstance(x, str):
        return x
    return repr(x)


def canonical_json(obj: Any) -> str:
    return json.dumps(_plain(obj), sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False) + "\n"


def content_hash(cert: dict[str, Any]) -> str:
    body = {k: v for k, v in cert.items() if k != "content_hash"}
    return hashlib.sha256(canonical_json(body).encode("utf-8")).hexdigest()


# --------------------------------------------------------------------------------------------------
# counterexamples: deterministic .npz (fixed zip timestamps, sorted names)
# --------------------------------------------------------------------------------------------------
def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        for name in sorted(arrays):
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            arr = io.BytesIO()
            np.lib.format.write_array(arr, np.ascontiguousarray(arrays[name]), allow_pickle=False)
            zf.writestr(info, arr.getvalue())
    return buf.getvalue()


# --------------------------------------------------------------------------------------------------
# building
# --------------------------------------------------------------------------------------------------
FLA_KERNEL_SPECS = ("fla:", "gramcheck.adapters.fla_kernels:")


def environment(device: str, dtype: str, *, target_spec: str = "") -> dict[str, Any]:
    """python, numpy, mpmath, torch, device, dtype; for a target that runs fla's Triton kernels
    (``target_spec`` starting with one of FLA_KERNEL_SPECS) also fla, triton and triton_interpreter."""
    import mpmath

    env = {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "mpmath": mpmath.__version__,
        "device": device,
        "dtype": dtype,
    }
    try:
        import torch

        env["torch"] = torch.__version__
    except ImportError:  # pragma: no cover
        env["torch"] = None
    if target_spec.startswith(FLA_KERNEL_SPECS):
        from .adapters import fla_kernels

        env.update(fla_kernels.environment())
    return env


def source_hash(fn: Any) -> str | None:
    """SHA-256 of the target's source text where Python can find it (None for builtins and C code)."""
    try:
        src = inspect.getsource(inspect.unwrap(fn))
    except (OSError, TypeError):
        return None
    return hashlib.sha256(src.encode("utf-8")).hexdigest()


@dataclass
class Certificate:
    """A certificate as a dict (``data``) plus its counterexample files (name -> bytes)."""

    data: dict[str, Any]
    attachments: dict[str, bytes]

    @property
    def passed(self) -> bool:
        return bool(self.data["passed"])

    def to_json(self) -> str:
        return canonical_json(self.data)

    def write(self, path: str | Path) -> Path:
        """Write the JSON to ``path`` and each counterexample beside it; returns the JSON's path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json(), encoding="utf-8")
        for name, blob in self.attachments.items():
            (path.parent / name).write_bytes(blob)
        return path


def from_report(report: Report, *, target_spec: str, source: str | None, stem: str = "certificate") -> Certificate:
    """The certificate of ``report``; ``target_spec`` is what ``verify`` re-imports ('module:attr' or
    'builtin:NAME'), ``source`` the SHA-256 of the target's source (or None)."""
    from . import __version__

    entries = []
    attachments: dict[str, bytes] = {}
    for f in report.findings:
        entry = {
            "property": f.name,
            "verdict": "pass" if f.passed else "fail",
            "measured": f.measured,
            "bound": f.bound,
            "margin": f.margin,
            "rigour": f.rigour,
            "examples": int(f.details.get("examples", 0)),
            "failure": f.failure,
            "details": {k: v for k, v in f.details.items() if k not in ("examples",)},
            "counterexample": f.counterexample,
            "counterexample_file": None,
            "counterexample_sha256": None,
        }
        if not f.passed and f.arrays:
            blob = npz_bytes(f.arrays)
            name = f"{stem}.{f.name}.npz"
            attachments[name] = blob
            entry["counterexample_file"] = name
            entry["counterexample_sha256"] = hashlib.sha256(blob).hexdigest()
        entries.append(entry)
    data: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "gramcheck_version": __version__,
        "target": {"spec": target_spec, "name": report.target, "source_sha256": source},
        "variant": report.variant,
        "params": report.params,
        "causal": report.causal,
        "environment": environment(report.device, report.dtype, target_spec=target_spec),
        "domain": report.domain,
        "profile": report.profile,
        "seed": report.seed,
        "passed": report.passed,
        "properties": entries,
    }
    data = _plain(data)
    data["content_hash"] = content_hash(data)
    return Certificate(data, attachments)


# --------------------------------------------------------------------------------------------------
# loading and verifying
# --------------------------------------------------------------------------------------------------
def schema() -> dict[str, Any]:
    return json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))


def load(path: str | Path) -> dict[str, Any]:
    """Read and validate a certificate: JSON, schema version, JSON Schema, content hash. Every problem is
    a CertificateError naming the file and what was expected."""
    import jsonschema

    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CertificateError(f"certificate: cannot read {path}: {exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CertificateError(
            f"certificate: {path} is not valid JSON ({exc.msg} at line {exc.lineno}); expected a gramcheck certificate"
        ) from None
    if not isinstance(data, dict):
        raise CertificateError(f"certificate: {path} holds a JSON {type(data).__name__}; expected an object")
    version = data.get("schema_version")
    if isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION:
        raise CertificateError(
            f"certificate: {path} has schema_version {version}; this gramcheck reads up to "
            f"{SCHEMA_VERSION} (upgrade gramcheck)"
        )
    try:
        jsonschema.validate(data, schema())
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(top level)"
        raise CertificateError(f"certificate: {path} does not match the schema at {where}: {exc.message}") from None
    if data["content_hash"] != content_hash(data):
        raise CertificateError(f"certificate: {path} content hash mismatch: the file was changed after it was written")
    for entry in data["properties"]:
        name = entry.get("counterexample_file")
        if name:
            blob_path = path.parent / name
            if not blob_path.exists():
                raise CertificateError(f"certificate: counterexample file {blob_path} is missing")
            if hashlib.sha256(blob_path.read_bytes()).hexdigest() != entry["counterexample_sha256"]:
                raise CertificateError(f"certificate: counterexample file {blob_path} does not match its hash")
    return data


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Human-readable differences between two certificates (environment differences are listed too)."""
    out = []
    for key in ("gramcheck_version", "variant", "params", "causal", "domain", "profile", "seed", "passed"):
        if old.get(key) != new.get(key):
            out.append(f"{key}: {old.get(key)!r} -> {new.get(key)!r}")
    if old["target"].get("source_sha256") != new["target"].get("source_sha256"):
        out.append("target source changed (source_sha256 differs)")
    for key, val in old["environment"].items():
        if new["environment"].get(key) != val:
            out.append(f"environment.{key}: {val!r} -> {new['environment'].get(key)!r}")
    olds = {e["property"]: e for e in old["properties"]}
    news = {e["property"]: e for e in new["properties"]}
    for name in sorted(set(olds) | set(news)):
        a, b = olds.get(name), news.get(name)
        if a is None or b is None:
            out.append(f"property {name}: {'added' if a is None else 'missing'} on re-run")
            continue
        for field in ("verdict", "measured", "bound", "examples", "rigour", "failure"):
            if a.get(field) != b.get(field):
                out.append(f"property {name}.{field}: {a.get(field)!r} -> {b.get(field)!r}")
    return out
