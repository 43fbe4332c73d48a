"""Process isolation against the worker thread: the first call (worker start) and the cost per call.

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python benchmarks/isolation_overhead.py
"""

import time

import numpy as np

from gramcheck.api import make_target

rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((1, 2, 32, 8)) for _ in range(3))
for iso in ("thread", "process"):
    t = make_target("builtin:linear-elu", dtype="float32")
    if iso == "process":
        t = t.isolated()
    t0 = time.perf_counter()
    t(q, k, v, causal=True)
    first = time.perf_counter() - t0
    n = 200
    t0 = time.perf_counter()
    for _ in range(n):
        t(q, k, v, causal=True)
    per = (time.perf_counter() - t0) / n
    t.close()
    print(f"{iso}: first call {first*1e3:.0f} ms, then {per*1e6:.0f} us per call (B,H,N,d = 1,2,32,8)")
