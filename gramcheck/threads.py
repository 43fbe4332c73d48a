"""Thread limits for property checks.

A property check evaluates targets and references on tiny tensors (N <= 32, d <= 8 in the ci profile),
where a parallel region costs more than the work in it: a 64 x 64 ``tril`` mask took 6-12 ms with two
torch threads against 8 us with one, and OpenBLAS's 1024 x 256 QR took seconds with two threads under
load against 0.09 s with one (benchmarks/RESULTS.md). ``limited`` runs a block with torch's intra-op
threads and every BLAS/OpenMP pool threadpoolctl finds capped at ``n``, and restores both afterwards.

torch keeps its thread count per OS thread (OpenMP's nthreads ICV): a limit set in the calling thread
does not reach a worker thread that already ran torch code, such as a Target's persistent worker.
``pinned`` wraps a callable so that it applies the limit in whichever thread runs it.

The count comes from the ``threads`` argument, else the environment variable ``GRAMCHECK_THREADS``,
else 1. ``0`` leaves every setting as it is.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from typing import Any

ENV = "GRAMCHECK_THREADS"
DEFAULT = 1


def resolve(threads: int | None = None) -> int:
    """The thread count to use: ``threads``, else $GRAMCHECK_THREADS, else 1 (0: leave settings alone)."""
    if threads is None:
        raw = os.environ.get(ENV, "").strip()
        if not raw:
            return DEFAULT
        try:
            threads = int(raw)
        except ValueError:
            raise ValueError(f"{ENV}: got {raw!r}; expected a non-negative integer (0: leave threads alone)") from None
        name = ENV
    else:
        name = "threads"
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
        raise ValueError(f"{name}: got {threads!r}; expected a non-negative integer (0: leave threads alone)")
    return threads


def _torch() -> Any:
    try:
        import torch
    except ImportError:  # the references run without torch
        return None
    return torch


@contextlib.contextmanager
def limited(threads: int | None = None) -> Iterator[int]:
    """Run the block with at most ``resolve(threads)`` torch intra-op threads (in this thread and in
    threads that start torch work inside the block) and BLAS/OpenMP threads; restores them on exit.
    Yields the count (0: nothing was changed)."""
    n = resolve(threads)
    if n == 0:
        yield 0
        return
    from threadpoolctl import threadpool_limits

    torch = _torch()
    old = None if torch is None else torch.get_num_threads()
    if torch is not None and old != n:
        torch.set_num_threads(n)
    try:
        with threadpool_limits(limits=n):
            yield n
    finally:
        if torch is not None and old != n:
            torch.set_num_threads(old)


def pinned(fn: Callable[..., Any], threads: int | None = None) -> Callable[..., Any]:
    """``fn`` running with at most ``resolve(threads)`` torch threads in whichever thread calls it (the
    previous count of that thread is restored after each call; BLAS pools are process-wide and are
    left to ``limited``)."""
    n = resolve(threads)
    torch = _torch()
    if n == 0 or torch is None:
        return fn

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        old = torch.get_num_threads()
        if old == n:
            return fn(*args, **kwargs)
        torch.set_num_threads(n)
        try:
            return fn(*args, **kwargs)
        finally:
            torch.set_num_threads(old)

    return call
