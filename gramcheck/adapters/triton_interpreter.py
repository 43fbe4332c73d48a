"""Run Triton kernels on CPU tensors through Triton's interpreter (``TRITON_INTERPRET=1``).

The interpreter executes a ``@triton.jit`` function as NumPy code, which is enough to run
flash-linear-attention's kernels on a machine without a GPU, once three gaps are closed:

1. Autotuning: ``Autotuner.run`` benchmarks every config through the active GPU driver, which does not
   exist ("0 active drivers"). ``Autotuner.prune_configs`` is replaced to keep one config, index
   ``config_index() % len(configs)`` (after the kernel's own ``early_config_prune``; ``perf_model`` needs
   a device and is skipped), so ``run`` never benchmarks; ``Autotuner._bench`` is replaced to raise
   should anything still ask for a benchmark. ``set_config_index(i)`` chooses another config (a sweep
   over i covers every config) and clears the choices already cached.
2. Loop variables: the interpreter runs ``for i in range(...)`` / ``for i in tl.range(...)`` as a
   Python loop, so the body sees a Python int where compiled Triton has an int32 tensor, and
   ``i.to(tl.int64)`` fails. The interpreter's AST transformer is extended to rebind the loop
   variable as a tensor at the top of the body (``tl.static_range`` loops keep Python ints: their
   variables are compile-time constants in compiled Triton too).
3. ``fla.ops.utils.op.gather = tl.gather`` binds the unpatched builtin at import time, which the
   interpreter's per-launch patching of ``triton.language`` never reaches; it is replaced (in every
   loaded ``fla`` module that holds it) by a function that looks ``tl.gather`` up at call time.

Limits of the interpreter (why some requests are refused): its ``tl.dot`` on bfloat16 operands is
wrong (errors of order 1e9; triton-lang/triton issue 11584), so bfloat16 is refused, and it ignores TF32
(float32 dots are exact float32 products).

Import order: ``@triton.jit`` reads ``TRITON_INTERPRET`` when a kernel is *defined*, i.e. when fla's
kernel modules are imported. ``prepare_environment()`` sets ``TRITON_INTERPRET=1`` when no GPU is
visible, the variable is unset and no ``fla.ops`` module is loaded yet; when fla's kernels were already
defined for a GPU that is absent, it raises with the fix. The patches were read against triton
``SUPPORTED_TRITON``; any other version, or internals that differ, raise ``InterpreterShimError``
naming the version. ``install()`` is idempotent and does nothing on a GPU run unless ``force=True``.
"""

from __future__ import annotations

import ast
import os
import sys
from typing import Any

SUPPORTED_TRITON = ("3.9.0",)
BF16_REASON = (
    "bfloat16 is refused under the Triton interpreter: its tl.dot on bfloat16 operands is wrong "
    "(errors of order 1e9, triton-lang/triton issue 11584); run bfloat16 on a GPU"
)

_STATE: dict[str, Any] = {"installed": False, "config_index": 0, "autotuners": None}


class InterpreterShimError(RuntimeError):
    """Triton's internals are not those the shim patches, or the interpreter cannot be enabled."""


def interpreter_enabled() -> bool:
    """True when ``TRITON_INTERPRET`` asks for the interpreter (triton's own reading of the variable)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")


def gpu_available() -> bool:
    """True when torch sees a CUDA (or ROCm) device."""
    import torch

    return bool(torch.cuda.is_available())


def prepare_environment() -> None:
    """Make sure fla's kernels will run: on a GPU nothing changes; without one, ``TRITON_INTERPRET=1``
    is set when it is unset and fla's kernel modules are not yet imported (they read it at definition),
    and an error with the fix is raised when they were imported without it."""
    if gpu_available() or interpreter_enabled():
        return
    loaded = sorted(m for m in sys.modules if m == "fla.ops" or m.startswith("fla.ops."))
    if loaded:
        raise InterpreterShimError(
            "no GPU is visible and fla's Triton kernels were imported without TRITON_INTERPRET=1 "
            f"({loaded[0]} is loaded): set TRITON_INTERPRET=1 in the environment, or import "
            "gramcheck.adapters.fla_kernels before anything imports fla.ops"
        )
    os.environ["TRITON_INTERPRET"] = "1"


def active() -> bool:
    """Whether the shim's patches are installed in this process."""
    return bool(_STATE["installed"])


def check_dtype(dtype: Any) -> None:
    """Refuse bfloat16 while the interpreter runs the kernels (``BF16_REASON``)."""
    if active() and "bfloat16" in str(dtype):
        raise ValueError(f"dtype: got {dtype}; {BF16_REASON}")


def config_index() -> int:
    return int(_STATE["config_index"])


def set_config_index(index: int) -> None:
    """Keep config ``index % len(configs)`` of every autotuned kernel from now on (cached choices are
    dropped, so the next launch of each kernel uses the new index)."""
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError(f"index: got {index!r}; expected a non-negative int")
    _STATE["config_index"] = index
    for tuner in list(_STATE["autotuners"] or ()):
        tuner.cache.clear()


def _triton_parts() -> tuple[Any, Any, Any, Any]:
    """(triton, autotuner module, interpreter module, version) after checking every internal patched."""
    import triton

    version = getattr(triton, "__version__", "unknown")
    if version not in SUPPORTED_TRITON:
        raise InterpreterShimError(
            f"triton {version}: the interpreter shim was written against triton "
            f"{', '.join(SUPPORTED_TRITON)} (Autotuner.prune_configs/_bench, the interpreter's "
            "ASTTransformer); install triton==3.9.0 (the fla-kernels extra) or run on a GPU"
        )
    from triton.runtime import autotuner, interpreter

    needed = [
        (autotuner, "Autotuner"),
        (getattr(autotuner, "Autotuner", None), "prune_configs"),
        (getattr(autotuner, "Autotuner", None), "_bench"),
        (interpreter, "ASTTransformer"),
        (interpreter, "FunctionRewriter"),
        (interpreter, "InterpretedFunction"),
        (interpreter, "interpreter_semantic"),
        (getattr(interpreter, "FunctionRewriter", None), "ast_transformer"),
        (getattr(interpreter, "InterpretedFunction", None), "rewritten_fn"),
    ]
    missing = [name for obj, name in needed if obj is None or not hasattr(obj, name)]
    if missing:
        raise InterpreterShimError(
            f"triton {version}: its internals differ from what the interpreter shim patches "
            f"(missing {', '.join(missing)}); install triton==3.9.0 (the fla-kernels extra)"
        )
    return triton, autotuner, interpreter, version


def _is_range_call(node: ast.expr) -> bool:
    """``range(...)`` or ``<module>.range(...)`` (tl.range), not ``static_range``."""
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    return (isinstance(f, ast.Name) and f.id == "range") or (isinstance(f, ast.Attribute) and f.attr == "range")


def _loop_transformer(base: type) -> Any:
    class LoopVariableTransformer(base):  # type: ignore[misc, valid-type]
        """The interpreter's transformer, plus: ``for i in range(..)`` rebinds ``i`` as a tensor."""

        def visit_For(self, node: ast.For) -> ast.AST:
            node = self.generic_visit(node)  # type: ignore[assignment]
            if isinstance(node.target, ast.Name) and _is_range_call(node.iter):
                name = node.target.id
                wrap = ast.Assign(
                    targets=[ast.Name(id=name, ctx=ast.Store())],
                    value=ast.Call(
                        func=ast.Attribute(
                            value=ast.Name(id="interpreter_semantic", ctx=ast.Load()), attr="to_tensor", ctx=ast.Load()
                        ),
                        args=[ast.Name(id=name, ctx=ast.Load()), ast.Constant(value=False)],
                        keywords=[],
                    ),
                )
                node.body.insert(0, ast.copy_location(wrap, node))
            return node

    return LoopVariableTransformer()


def _patch_fla_gather() -> int:
    """Replace ``tl.gather`` bound at import time in loaded fla modules; returns how many were replaced."""
    import triton.language as tl

    original = _STATE.get("tl_gather")
    if original is None:
        original = _STATE["tl_gather"] = tl.gather

    def gather(src: Any, index: Any, axis: Any, **kwargs: Any) -> Any:
        return tl.gather(src, index, axis)  # looked up at call time: the interpreter's patched builtin

    gather.gramcheck_shim = True  # type: ignore[attr-defined]
    count = 0
    for name, mod in list(sys.modules.items()):
        if (name == "fla" or name.startswith("fla.")) and mod is not None and getattr(mod, "gather", None) is original:
            mod.gather = gather  # type: ignore[attr-defined]
            count += 1
    return count


def install(*, force: bool = False) -> bool:
    """Install the three patches when the interpreter runs without a GPU (or always with ``force``);
    returns whether the shim is active. Idempotent: a second call changes nothing (the gather patch is
    re-applied to fla modules imported since)."""
    if not force and (not interpreter_enabled() or gpu_available()):
        return active()
    triton, autotuner, interpreter, version = _triton_parts()
    if not _STATE["installed"]:
        import weakref

        tuners: weakref.WeakSet[Any] = weakref.WeakSet()
        _STATE["autotuners"] = tuners

        def prune_configs(self: Any, kwargs: dict[str, Any]) -> list[Any]:
            tuners.add(self)
            configs = list(self.configs)
            if self.early_config_prune:
                configs = list(self.early_config_prune(self.configs, self.nargs, **kwargs)) or configs
            return [configs[config_index() % len(configs)]]

        def _bench(self: Any, *args: Any, config: Any, **meta: Any) -> Any:
            raise InterpreterShimError(
                f"triton {version}: the interpreter shim keeps one autotuner config; benchmarking {config} "
                "needs a GPU driver"
            )

        prune_configs.gramcheck_shim = True  # type: ignore[attr-defined]
        _bench.gramcheck_shim = True  # type: ignore[attr-defined]
        _STATE["originals"] = (
            autotuner.Autotuner.prune_configs,
            autotuner.Autotuner._bench,
            interpreter.FunctionRewriter.ast_transformer,
        )
        autotuner.Autotuner.prune_configs = prune_configs
        autotuner.Autotuner._bench = _bench
        interpreter.FunctionRewriter.ast_transformer = _loop_transformer(interpreter.ASTTransformer)
        interpreter.InterpretedFunction.rewritten_fn.clear()  # rewritten without the loop patch
        _STATE["installed"] = True
    _patch_fla_gather()
    return True


def versions() -> dict[str, Any]:
    """What a certificate records: triton's version and whether its interpreter ran the kernels."""
    try:
        import triton

        tv: str | None = triton.__version__
    except ImportError:  # pragma: no cover
        tv = None
    return {"triton": tv, "triton_interpreter": interpreter_enabled()}
