"""flash-linear-attention (fla-core 0.6.0): fused_recurrent_rwkv6 drops the gradient of its final state.

Its autograd Function's ``backward(ctx, do, dht)`` never passes ``dht`` on: the reverse recurrence of
``fused_recurrent_rwkv6_bwd_kernel_dkv`` starts from zero. A loss that reads the returned final state
(state passing across segments, truncated BPTT) then gets wrong dk, dv, dw and d initial_state; dr and du
are unaffected. chunk_rwkv6 is right.

    B = 1, T = 20, H = 1, K = V = 16, scale 0.25, L = <W, o> + <W_S, h_T>

    chunk_rwkv6           vs the float64 definition: max |error| dk 1.9e-06, dv 1.7e-06, dw 5.2e-06, dh0 2.2e-07
    fused_recurrent_rwkv6 vs the float64 definition: max |error| dk 7.2e+00, dv 8.7e+00, dw 2.1e+01, dh0 2.3e-01
    (both agree to 1e-6 when the loss reads only o)

gramcheck's backward-agreement property found it (1.6e6x its tolerance on dv at the last token, N = 70):
tests/test_fla_kernels.py::test_backward_agrees_with_the_definitions_gradients records it.

    TRITON_INTERPRET=1 python examples/fla_discrepancies/rwkv6_final_state_gradient.py
"""

import torch

from gramcheck.adapters import triton_interpreter

triton_interpreter.prepare_environment()
triton_interpreter.install()

from fla.ops.rwkv6 import chunk_rwkv6, fused_recurrent_rwkv6  # noqa: E402


def definition(r, k, v, w, u, scale, h0):
    """o_t = (s r_t)^T (S_{t-1} + diag(u) k_t v_t^T), S_t = diag(exp(w_t)) S_{t-1} + k_t v_t^T; (B, T, H, K)."""
    state, outs = h0.clone(), []
    for t in range(r.shape[1]):
        kv = k[:, t, :, :, None] * v[:, t, :, None, :]
        outs.append(torch.einsum("bhk,bhkv->bhv", r[:, t] * scale, state + u[None, :, :, None] * kv))
        state = torch.exp(w[:, t])[..., None] * state + kv
    return torch.stack(outs, 1), state


def gradients(fn, inputs, dtype, read_state):
    xs = [x.to(dtype).clone().requires_grad_() for x in inputs]
    o, ht = fn(*xs[:5], scale=0.25, initial_state=xs[5], output_final_state=True)
    gen = torch.Generator().manual_seed(1)
    loss = (o * torch.randn(o.shape, generator=gen).to(dtype)).sum()
    if read_state:
        loss = loss + (ht * torch.randn(ht.shape, generator=gen).to(dtype)).sum()
    loss.backward()
    return [x.grad.double() for x in xs]


def main() -> None:
    torch.manual_seed(0)
    B, T, H, K = 1, 20, 1, 16
    r, k, v = (torch.randn(B, T, H, K) for _ in range(3))
    w = torch.nn.functional.logsigmoid(torch.randn(B, T, H, K) + 2)
    inputs = (r, k, v, w, torch.randn(H, K), torch.randn(B, H, K, K))

    def reference(*a, scale, initial_state, output_final_state):
        return definition(*a, scale, initial_state)

    for read_state in (False, True):
        truth = gradients(reference, inputs, torch.float64, read_state)
        for fn in (chunk_rwkv6, fused_recurrent_rwkv6):
            got = gradients(fn, inputs, torch.float32, read_state)
            names = ("r", "k", "v", "w", "u", "h0")
            errs = ", ".join(f"d{n} {(a - b).abs().max():.1e}" for n, a, b in zip(names, got, truth, strict=True))
            print(f"loss reads h_T: {read_state!s:5}  {fn.__name__:22} max |error|: {errs}")


if __name__ == "__main__":
    main()
