"""flash-linear-attention (fla-core 0.6.0): chunk_simple_gla (and chunk_lightning_attn, which calls it with
fla's slope schedule) misses float32 accuracy on a head with a strong constant decay; the token-by-token
fused_recurrent_simple_gla does not.

    B = 1, H = 2, N = 70, d = 16, scale 0.25, g = 0 on head 0 and g = -4 per token on head 1
    (lightning's decay for head 1 of 2 at layer 0: -(8 / H)(1 - layer_idx / num_layers) h = -4)

gramcheck's agreement check measures chunk_simple_gla at 4.1x its float32 rounding bound (index
[0, 1, 57, 4], |error| 2.6e-7 against a bound of 6.4e-8; 1.2x on another seed); fused_recurrent_simple_gla
stays at 0.07x and gramcheck's own chunked form (chunk 64 or 16) at 0.05x on the same input, so the bound
is attainable by a chunked algorithm. The cause inside fla's kernel is not established here.

    TRITON_INTERPRET=1 python examples/fla_discrepancies/strong_head_decay.py

(the interpreter computes float32 dots exactly in float32; on a GPU, run benchmarks/gpu_check_fla.py).
tests/test_fla_kernels.py::test_chunked_simple_gla_misses_the_bound_on_a_strongly_decaying_head records it.
"""

import numpy as np
import torch

from gramcheck.adapters import triton_interpreter

triton_interpreter.prepare_environment()
triton_interpreter.install()

from fla.ops.simple_gla import chunk_simple_gla, fused_recurrent_simple_gla  # noqa: E402

from gramcheck.agreement import check_agreement  # noqa: E402


def main() -> None:
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((1, 2, 70, 16)).astype(np.float32).astype(np.float64) for _ in range(3))
    g = np.zeros((1, 2, 70, 1))
    g[:, 1] = -4.0
    for fn in (chunk_simple_gla, fused_recurrent_simple_gla):
        o, _ = fn(*(torch.tensor(x).float().transpose(1, 2) for x in (q, k, v)),
                  g=torch.tensor(g[..., 0]).float().transpose(1, 2), scale=0.25)  # fmt: skip
        out = o.transpose(1, 2).double().numpy()
        f = check_agreement("agreement", out, "gla", q, k, v, causal=True, dtype="float32", g=g, scale=0.25)
        print(f"{fn.__name__:28s} error / float32 bound = {f.measured:.3g}  at {f.counterexample}")


if __name__ == "__main__":
    main()
