"""Probe: python-flint's arb (ball arithmetic in C) against the shim's ball-mpmath, for one ball matmul
and one elementwise exp at the precision the ill-conditioned oracle case needed (88 bits). Not a
dependency: exits with a message without python-flint. Run:

    OMP_NUM_THREADS=1 python benchmarks/flint_probe.py
"""

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

try:
    import flint
except ImportError:
    print("python-flint is not installed (pip install python-flint); nothing measured")
    sys.exit(0)

from gramcheck.arith import MP, BallMP  # noqa: E402


def t(f, r=3):
    f()
    c = time.process_time()
    for _ in range(r):
        f()
    return (time.process_time() - c) / r * 1e3


def main():
    rng = np.random.default_rng(0)
    n, d, prec = 64, 32, 88
    A, Bm = rng.standard_normal((n, d)), rng.standard_normal((d, n))
    ar, mp = BallMP(prec), MP(prec)
    with ar.context():
        a, b = ar.exp(ar.asarray(A)), ar.asarray(Bm)  # an inexact and an exact operand
        tb = t(lambda: ar.matmul(a, b))
        xa = ar.asarray(A)
        tbe = t(lambda: ar.exp(xa))
    with mp.context():
        pa, pb = mp.exp(mp.asarray(A)), mp.asarray(Bm)
        tp = t(lambda: mp.matmul(pa, pb))
    flint.ctx.prec = prec
    fa = flint.arb_mat([[flint.arb(float(x)).exp() for x in row] for row in A])
    fb = flint.arb_mat([[flint.arb(float(x)) for x in row] for row in Bm])
    tf = t(lambda: fa * fb, 10)
    conv = t(lambda: flint.arb_mat([[flint.arb(float(x)) for x in row] for row in A]))
    back = t(lambda: [[(e.mid(), e.rad()) for e in row] for row in (fa * fb).tolist()])
    fx = [flint.arb(float(x)) for x in A.ravel()]
    te = t(lambda: [x.exp() for x in fx])
    print(f"python-flint {flint.__version__}, {prec} bits")
    print("| operation | ball-mpmath (shim) | plain mpmath | flint arb |\n| --- | --- | --- | --- |")
    print(
        f"| ({n}x{d}) @ ({d}x{n}) | {tb:.1f} ms | {tp:.1f} ms | {tf:.2f} ms (arb_mat; + {conv:.2f} ms in, "
        f"{back:.2f} ms out) |"
    )
    print(f"| exp of {A.size} entries | {tbe:.1f} ms | | {te:.2f} ms (list of arb) |")


if __name__ == "__main__":
    main()
