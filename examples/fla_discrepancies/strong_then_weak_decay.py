"""flash-linear-attention (fla-core 0.6.0): chunk_gla and chunk_simple_gla lose float32 accuracy when a
strong decay is followed by weak ones inside one chunk; fused_recurrent_gla does not.

    g = [g0, -0.01, -0.01, ...]   (log-decays; g0 = -4000, -400, -40)

The chunked kernels form b_t = cumsum(g) within a chunk in float32 and use exp(b_t - b_s). With
|b| ~ |g0| the float32 cumsum keeps only |g0| * 2^-24 of the differences b_t - b_s ~ 0.01 (t - s), so
the decays exp(b_t - b_s) are off by ~|g0| * 6e-8 relative: at g0 = -4000 the outputs carry absolute errors
~1e-3 on entries of size ~5 (about 180x gramcheck's float32 rounding bound; 3x already at g0 = -40). The
token-by-token kernel multiplies decays step by step and stays at float32 accuracy.

Run (CPU, Triton's interpreter; on a GPU drop nothing, it runs compiled):

    TRITON_INTERPRET=1 python examples/fla_discrepancies/strong_then_weak_decay.py

It needs only torch, numpy and fla (gramcheck's adapter is used for the interpreter patches on CPU);
the reference is the recurrence S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T, o_t = S_t^T (q_t / sqrt(d)) in
float64. gramcheck reproduces it with gramcheck.check("fla:chunk_gla", "gla", ...) on the same input, and
tests/test_fla_kernels.py::test_chunked_gla_loses_accuracy_after_a_strong_decay records it.
"""

import numpy as np
import torch

from gramcheck.adapters import triton_interpreter

triton_interpreter.prepare_environment()  # TRITON_INTERPRET=1 when no GPU, before fla's kernels load
triton_interpreter.install()  # autotuner without benchmarks, loop variables as tensors (CPU only)

from fla.ops.gla import chunk_gla, fused_recurrent_gla  # noqa: E402


def reference(q, k, v, g, scale):
    """float64 recurrence on (B, T, H, d) arrays."""
    B, T, H, d = q.shape
    S = np.zeros((B, H, d, v.shape[-1]))
    out = np.zeros((B, T, H, v.shape[-1]))
    for t in range(T):
        S = np.exp(g[:, t])[..., None] * S + k[:, t, :, :, None] * v[:, t, :, None, :]
        out[:, t] = np.einsum("bhk,bhkv->bhv", q[:, t] * scale, S)
    return out


def main() -> None:
    T, d = 12, 2
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, T, 1, d)).astype(np.float32) for _ in range(3))
    for g0 in (-4000.0, -400.0, -40.0):
        g = np.full((1, T, 1, d), -0.01, dtype=np.float32)
        g[:, 0] = g0
        ref = reference(*(x.astype(np.float64) for x in (q, k, v, g)), d**-0.5)
        for fn in (chunk_gla, fused_recurrent_gla):
            o, _ = fn(*(torch.from_numpy(x) for x in (q, k, v, g)))
            err = np.abs(o.double().numpy() - ref).max()
            size = np.abs(ref).max()
            print(f"g0 = {g0:7.0f}  {fn.__name__:20s} max |o - reference| = {err:.2e}  (max |o| {size:.2f})")


if __name__ == "__main__":
    main()
