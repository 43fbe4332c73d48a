"""Stability certificates: canonical JSON of a ``Report`` with its environment, domain and seed, a content
hash, counterexamples as .npz files beside it, an optional ed25519 signature, and ``verify`` that re-runs it.

Canonical JSON: keys sorted, no whitespace, floats as Python's shortest round-trip repr, non-finite floats
as the strings "inf", "-inf", "nan", UTF-8, one trailing newline. ``content_hash`` is the SHA-256 of the
canonical JSON of the certificate without its ``content_hash`` and ``signature`` fields: a changed byte
anywhere is detected (integrity), but anyone can recompute it. ``signature`` (optional) is an ed25519
signature of the canonical JSON without the ``signature`` field (so it covers ``content_hash`` too): it
tells who issued the file (authenticity). Neither tells whether the issuer told the truth; ``verify``
re-runs the check for that. The schema is ``gramcheck/schema/certificate-v1.json`` (JSON Schema 2020-12).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import inspect
import io
import json
import math
import platform
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .findings import passed_verdicts
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
    """SHA-256 of the canonical JSON without ``content_hash`` and ``signature`` (integrity only: anyone
    can recompute it)."""
    body = {k: v for k, v in cert.items() if k not in ("content_hash", "signature")}
    return hashlib.sha256(canonical_json(body).encode("utf-8")).hexdigest()


# --------------------------------------------------------------------------------------------------
# signatures (ed25519 through the ``cryptography`` package: the optional extra ``sign``)
# --------------------------------------------------------------------------------------------------
def _crypto() -> Any:
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise ValueError(
            "signing: needs the 'cryptography' package (pip install 'gramcheck[sign]')"
        ) from None
    return serialization, ed25519


def signed_bytes(cert: dict[str, Any]) -> bytes:
    """What a signature covers: the canonical JSON of the certificate without its ``signature``."""
    return canonical_json({k: v for k, v in cert.items() if k != "signature"}).encode("utf-8")


def keygen(private_path: str | Path, public_path: str | Path) -> str:
    """Write a new ed25519 key pair as PEM (private key PKCS#8, unencrypted, mode 0600; public key
    SubjectPublicKeyInfo); returns the public key's fingerprint (SHA-256 of its 32 raw bytes, hex)."""
    serialization, ed25519 = _crypto()
    key = ed25519.Ed25519PrivateKey.generate()
    private_path, public_path = Path(private_path), Path(public_path)
    if private_path.absolute().resolve() == public_path.absolute().resolve():
        raise ValueError(
            f"keygen: got {str(private_path)!r} as both the private and the public key file; expected two different "
            "paths (the public key would overwrite the private one)"
        )
    for name, p in (("private key", private_path), ("public key", public_path)):
        if p.exists():
            raise ValueError(f"keygen: {name} file {p} exists; expected a new path (never overwritten)")
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    private_path.touch(mode=0o600)
    private_path.write_bytes(pem)
    public_path.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return _fingerprint(_raw_public(key.public_key()))


def _raw_public(pub: Any) -> bytes:
    serialization, _ = _crypto()
    return pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _fingerprint(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def _load_key(path: str | Path, *, private: bool, arg: str) -> Any:
    serialization, ed25519 = _crypto()
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"{arg}: cannot read {path}: {exc}") from None
    try:
        key = (
            serialization.load_pem_private_key(data, password=None)
            if private
            else serialization.load_pem_public_key(data)
        )
    except (ValueError, TypeError) as exc:
        kind = "private" if private else "public"
        raise ValueError(f"{arg}: {path} is not an unencrypted PEM {kind} key ({exc})") from None
    want = ed25519.Ed25519PrivateKey if private else ed25519.Ed25519PublicKey
    if not isinstance(key, want):
        raise ValueError(f"{arg}: {path} holds a {type(key).__name__}; expected an ed25519 key (gramcheck keygen)")
    return key


def sign(cert: dict[str, Any], private_key: str | Path) -> dict[str, Any]:
    """``cert`` with a ``signature`` field: ed25519 over ``signed_bytes(cert)``, with the public key."""
    key = _load_key(private_key, private=True, arg="sign_key")
    body = {k: v for k, v in cert.items() if k != "signature"}
    sig = key.sign(signed_bytes(body))
    body["signature"] = {"algorithm": "ed25519", "public_key": _raw_public(key.public_key()).hex(), "value": sig.hex()}
    return body


def check_signature(cert: dict[str, Any], trusted_key: str | Path | None = None, *, where: str = "") -> str | None:
    """Check ``cert``'s signature; returns the signer's fingerprint (None when unsigned and no trusted key
    was asked for). With ``trusted_key`` the file must be signed by that key. Every problem is a
    CertificateError."""
    sig = cert.get("signature")
    if sig is None:
        if trusted_key is not None:
            raise CertificateError(f"certificate: {where} is not signed; expected a signature by {trusted_key}")
        return None
    _, ed25519 = _crypto()
    from cryptography.exceptions import InvalidSignature

    try:
        raw = bytes.fromhex(sig["public_key"])
        pub = ed25519.Ed25519PublicKey.from_public_bytes(raw)
        pub.verify(bytes.fromhex(sig["value"]), signed_bytes(cert))
    except (ValueError, InvalidSignature):
        raise CertificateError(
            f"certificate: {where} signature does not match its content (changed after signing, or forged)"
        ) from None
    if trusted_key is not None:
        trusted = _raw_public(_load_key(trusted_key, private=False, arg="trusted_key"))
        if trusted != raw:
            raise CertificateError(
                f"certificate: {where} is signed by key {_fingerprint(raw)[:16]}, not by the trusted key "
                f"{_fingerprint(trusted)[:16]} ({trusted_key})"
            )
    return _fingerprint(raw)


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
ENVIRONMENT_KEYS = (
    *("python", "numpy", "mpmath", "python_flint", "torch", "hypothesis"),
    *("fla", "triton", "triton_interpreter"),
)
FLA_KERNEL_SPECS = ("fla:", "gramcheck.adapters.fla_kernels:")


def _flint_version() -> str:
    import flint

    return str(flint.__version__)


def environment(device: str, dtype: str, *, target_spec: str = "", subnormals: str = "gradual") -> dict[str, Any]:
    """Versions that can change results (python, numpy, mpmath, python-flint when the oracle escalates in
    Arb, torch, hypothesis: the example stream is a function of the seed and the Hypothesis version), the
    device and dtype checked, and the target's underflow where it flushes subnormals (``subnormals``:
    absent means gradual, so that certificates of gradual targets keep their bytes); for a target that
    runs fla's Triton kernels (``target_spec`` starting with one of FLA_KERNEL_SPECS) also fla, triton
    and triton_interpreter."""
    import hypothesis
    import mpmath

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "mpmath": mpmath.__version__,
        "hypothesis": hypothesis.__version__,
        "device": device,
        "dtype": dtype,
    }
    if subnormals != "gradual":
        env["subnormals"] = subnormals
    from .arb_arith import ArbArith
    from .oracle import escalation_arith

    # the oracle's escalation arithmetic (Arb where python-flint is installed, else mpmath balls)
    env["python_flint"] = _flint_version() if isinstance(escalation_arith(53), ArbArith) else None
    try:
        import torch

        env["torch"] = torch.__version__
    except ImportError:  # pragma: no cover
        env["torch"] = None
    if target_spec.startswith(FLA_KERNEL_SPECS):
        from .adapters import fla_kernels

        env.update(fla_kernels.environment())
    return env


# --------------------------------------------------------------------------------------------------
# the target's source: its module and the modules it imports from the same top-level package
# --------------------------------------------------------------------------------------------------
def _normalised_ast(tree: ast.AST) -> str:
    """``ast.dump`` without positions and without docstrings: comments, formatting and docstrings never
    change it; any change to code does."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = node.body
            first = body[0].value if body and isinstance(body[0], ast.Expr) else None
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree, annotate_fields=False, include_attributes=False)


def _imported_modules(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """Absolute names of the modules ``tree`` (module ``module``) imports, relative imports resolved;
    ``from m import x`` counts m and m.x (x may be a submodule)."""
    names: set[str] = set()
    pkg = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = pkg.split(".") if pkg else []
                base_parts = parts[: len(parts) - (node.level - 1)] if node.level > 1 else parts
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if base:
                names.add(base)
                names.update(f"{base}.{a.name}" for a in node.names)
    return names


def _module_file(name: str) -> tuple[str, bool] | None:
    """(source path, is_package) of module ``name`` where it has Python source; None otherwise."""
    mod = sys.modules.get(name)
    path = getattr(mod, "__file__", None) if mod is not None else None
    is_pkg = hasattr(mod, "__path__") if mod is not None else False
    if path is None:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            return None
        if spec is None or not spec.origin or not spec.has_location:
            return None
        path, is_pkg = spec.origin, spec.submodule_search_locations is not None
    return (path, is_pkg) if str(path).endswith(".py") else None


def source_hash(fn: Any, module: str | None = None) -> str | None:
    """SHA-256 over the normalised AST (``_normalised_ast``: comments, layout and docstrings do not
    count) of the module defining ``fn`` (through ``functools.partial`` and decorators' ``__wrapped__``),
    of ``module`` (where a 'module:attr' target is defined: a partial's own module is functools), and of
    every module each imports, directly or through each other, from its top-level package. None where
    there is no Python source (builtins, C code, ``__main__``)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    fn = inspect.unwrap(fn)
    roots = [m for m in (module, getattr(fn, "__module__", None)) if isinstance(m, str) and m != "__main__"]
    if not roots:
        return None
    seen: dict[str, str] = {}
    todo = [(m, m.split(".")[0]) for m in dict.fromkeys(roots)]
    while todo:
        name, top = todo.pop()
        if name in seen:
            continue
        found = _module_file(name)
        if found is None:
            if name in roots:
                return None
            continue
        path, is_pkg = found
        try:
            tree = ast.parse(Path(path).read_text(encoding="utf-8"), filename=str(path))
        except (OSError, SyntaxError, UnicodeDecodeError):
            if name in roots:
                return None
            continue
        imports = _imported_modules(tree, name, is_pkg)
        seen[name] = _normalised_ast(tree)
        todo.extend((m, top) for m in imports if (m == top or m.startswith(top + ".")) and m not in seen)
    h = hashlib.sha256()
    for name in sorted(seen):
        h.update(f"{name}\n{seen[name]}\n".encode())
    return h.hexdigest()


@dataclass
class Certificate:
    """A certificate as a dict (``data``) plus its counterexample files (name -> bytes)."""

    data: dict[str, Any]
    attachments: dict[str, bytes]

    @property
    def passed(self) -> bool:
        return bool(self.data["passed"])

    def sign(self, private_key: str | Path) -> Certificate:
        """Add an ed25519 signature by ``private_key`` (a PEM file from ``gramcheck keygen``)."""
        self.data = sign(self.data, private_key)
        return self

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


def from_report(
    report: Report,
    *,
    target_spec: str,
    source: str | None,
    stem: str = "certificate",
    requested: list[str] | None = None,
) -> Certificate:
    """The certificate of ``report``; ``target_spec`` is what ``verify`` re-imports ('module:attr' or
    'builtin:NAME'), ``source`` the target's ``source_hash`` (or None), ``requested`` the property names
    asked for (None: every applicable one; ``verify`` re-runs what was requested and fails on any
    property the file lacks)."""
    from . import __version__

    entries = []
    attachments: dict[str, bytes] = {}
    for f in report.findings:
        entry = {
            "property": f.name,
            "verdict": f.verdict,
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
        "environment": environment(report.device, report.dtype, target_spec=target_spec, subnormals=report.subnormals),
        "domain": report.domain,
        "profile": report.profile,
        "seed": report.seed,
        "limits": report.limits,
        "requested": None if requested is None else list(requested),
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


MAX_NESTING = 64  # a certificate nests about 8 levels; anything far deeper is not one


def _max_nesting(text: str) -> int:
    """The deepest bracket nesting of a JSON text (brackets inside strings skipped), without recursion."""
    depth = best = 0
    in_str = escaped = False
    for ch in text:
        if in_str:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            best = max(best, depth)
        elif ch in "]}":
            depth -= 1
    return best


def load(path: str | Path) -> dict[str, Any]:
    """Read and validate a certificate: JSON, schema version, JSON Schema, content hash. Every problem is
    a CertificateError naming the file and what was expected."""
    import jsonschema

    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CertificateError(f"certificate: cannot read {path}: {exc}") from None
    depth = _max_nesting(text)
    if depth > MAX_NESTING:
        raise CertificateError(
            f"certificate: {path} nests JSON {depth} levels deep; a gramcheck certificate nests at most {MAX_NESTING}"
        )
    try:
        data = json.loads(text, object_pairs_hook=_unique_keys)
    except DuplicateKeyError as exc:
        raise CertificateError(
            f"certificate: {path} repeats the key {exc.key!r} in one object; a certificate's keys are unique (a "
            "reader that takes another of the two would read another certificate)"
        ) from None
    except json.JSONDecodeError as exc:
        raise CertificateError(
            f"certificate: {path} is not valid JSON ({exc.msg} at line {exc.lineno}); expected a gramcheck certificate"
        ) from None
    except RecursionError:  # pragma: no cover - _max_nesting bounds the depth first
        raise CertificateError(f"certificate: {path} nests JSON too deeply") from None
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
    names = [e["property"] for e in data["properties"]]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise CertificateError(f"certificate: {path} lists the properties {twice} more than once; expected each once")
    verdicts = passed_verdicts([e["verdict"] for e in data["properties"]])
    if data["passed"] != verdicts:
        raise CertificateError(
            f"certificate: {path} says passed={data['passed']} but its properties' verdicts say {verdicts} (a "
            "certificate passes when no property failed and at least one was judged)"
        )
    check_signature(data, where=str(path))
    if text != canonical_json(data):
        raise CertificateError(
            f"certificate: {path} is not in canonical form (sorted keys, no whitespace, as gramcheck writes it): the "
            "file was rewritten after it was written, and its bytes are not the ones hashed and signed"
        )
    folder = path.parent.resolve()
    for entry in data["properties"]:
        name = entry.get("counterexample_file")
        if name:
            blob_path = path.parent / name
            inside = (
                not Path(name).is_absolute()
                and Path(name).name == name
                and blob_path.resolve().parent == folder
            )
            if not inside:
                raise CertificateError(
                    f"certificate: counterexample_file {name!r} of property {entry['property']!r} is outside the "
                    f"certificate's folder; expected a file name beside {path.name}"
                )
            if not blob_path.exists():
                raise CertificateError(f"certificate: counterexample file {blob_path} is missing")
            if hashlib.sha256(blob_path.read_bytes()).hexdigest() != entry["counterexample_sha256"]:
                raise CertificateError(f"certificate: counterexample file {blob_path} does not match its hash")
    return data


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Human-readable differences in what was checked and what it gave: settings, the target's name, every
    field of every property's entry (verdict, values, details, counterexample), and properties present in
    one certificate only. Environment and source differences are not results: see
    ``environment_differences`` and ``source_changed``."""
    out = []
    for key in ("variant", "params", "causal", "domain", "profile", "seed", "limits", "requested", "passed"):
        if key == "limits" and key not in old:
            continue  # written before limits were recorded: verify ran with the defaults
        if old.get(key) != new.get(key):
            out.append(f"{key}: {old.get(key)!r} -> {new.get(key)!r}")
    if old["target"].get("name") != new["target"].get("name"):
        out.append(f"target.name: {old['target'].get('name')!r} -> {new['target'].get('name')!r}")
    for key, default in (("device", None), ("dtype", None), ("subnormals", "gradual")):
        a, b = (c["environment"].get(key, default) for c in (old, new))
        if a != b:
            out.append(f"environment.{key}: {a!r} -> {b!r}")
    olds = {e["property"]: e for e in old["properties"]}
    news = {e["property"]: e for e in new["properties"]}
    for name in sorted(set(olds) | set(news)):
        a, b = olds.get(name), news.get(name)
        if a is None:
            assert b is not None
            out.append(f"property {name}: missing from the certificate (the re-run checks it: {b['verdict']})")
            continue
        if b is None:
            out.append(f"property {name}: in the certificate but not applicable or not requested on re-run")
            continue
        for field in sorted((set(a) | set(b)) - {"counterexample_file"}):  # named by where it lies; its hash compared
            x, y = a.get(field), b.get(field)
            if field == "details":
                x, y = ({k: v for k, v in d.items() if k not in NOT_COMPARED} for d in (x or {}, y or {}))
            out += _field_differences(f"property {name}.{field}", x, y)
    return out


# details that are the target's own words (its exception's text, which may hold ids or times): its failure kind
# and verdict are compared
NOT_COMPARED = {"error"}


def _field_differences(where: str, a: Any, b: Any) -> list[str]:
    """'where: a -> b' where the canonical JSON of a and b differ; for two dicts, per key (``where.key``)."""
    if canonical_json(a) == canonical_json(b):
        return []
    if isinstance(a, dict) and isinstance(b, dict):
        keys = sorted(set(a) | set(b))
        return [d for key in keys for d in _field_differences(f"{where}.{key}", a.get(key), b.get(key))]
    return [f"{where}: {_short(a)} -> {_short(b)}"]


def _short(x: Any, limit: int = 200) -> str:
    """repr(x), cut to ``limit`` characters (a details dict can be long)."""
    r = repr(x)
    return r if len(r) <= limit else r[:limit] + f"... ({len(r)} characters)"


class DuplicateKeyError(ValueError):
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json's object_pairs_hook: the object, or DuplicateKeyError on a key given twice."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKeyError(key)
        out[key] = value
    return out


def environment_differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Differences in gramcheck's and the libraries' versions (reported; a result that differs is what
    fails a verification, unless verification is strict)."""
    out = []
    if old.get("gramcheck_version") != new.get("gramcheck_version"):
        out.append(f"gramcheck_version: {old.get('gramcheck_version')!r} -> {new.get('gramcheck_version')!r}")
    for key in ENVIRONMENT_KEYS:
        a, b = old["environment"].get(key), new["environment"].get(key)
        if a != b:
            out.append(f"environment.{key}: {a!r} -> {b!r}")
    return out


def source_changed(old: dict[str, Any], new: dict[str, Any]) -> bool:
    return old["target"].get("source_sha256") != new["target"].get("source_sha256")
