"""Targets that misbehave at the process level, importable by a worker process ('isolation_targets:NAME')."""

import os
import sys
import time

from gramcheck import variants as V


def ok(q, k, v, *, causal):
    return V.get("linear-elu").torch(q, k, v, causal=causal)


def exits_7(q, k, v, *, causal):
    os._exit(7)


def system_exit(q, k, v, *, causal):
    sys.exit(3)


def keyboard_interrupt(q, k, v, *, causal):
    raise KeyboardInterrupt


def sleeps(q, k, v, *, causal):
    time.sleep(30)
    return ok(q, k, v, causal=causal)


def raises_long(q, k, v, *, causal):
    raise RuntimeError("boom: the kernel needs d_k divisible by 16 " + "x" * 300)


def raises_with_an_id(q, k, v, *, causal):
    """Raises with a number that differs on every call (an object's id): the same failure, other words."""
    raise ValueError(f"kernel state {id(object())} is not ready")
