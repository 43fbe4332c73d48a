"""State passing in the forms: S_0 in, S_N out (B, H, d_k, d_v); two segments with the first's final
state as the second's initial state equal one pass; a zero initial state equals none, bit for bit."""

import pytest
import torch

from gramcheck.forms import SUB_BLOCK, linear_recurrence

B, H, N, DK, DV = 2, 2, 40, 4, 3


def _inputs(gate, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, N, d, generator=gen, dtype=dtype) for d in (DK, DK, DV))
    if gate is None:
        return q, k, v, None
    width = 1 if gate == "scalar" else DK
    g = -torch.rand(B, H, N, width, generator=gen, dtype=dtype) * 0.5
    return q, k, v, g


def _run(form, q, k, v, g, *, causal, lo, hi, s0=None, chunk=8):
    gs = None if g is None else g[:, :, lo:hi]
    return linear_recurrence(
        q[:, :, lo:hi],
        k[:, :, lo:hi],
        v[:, :, lo:hi],
        gs,
        causal=causal,
        form=form,
        chunk_size=chunk,
        initial_state=s0,
        output_final_state=True,
    )


def _definition_state(k, v, g):
    """S_N = sum_s diag(exp(b_N - b_s)) k_s v_s^T in float64."""
    state = torch.zeros(B, H, DK, DV, dtype=torch.float64)
    for t in range(k.shape[2]):
        if g is not None:
            state = g[:, :, t, :, None].exp() * state
        state = state + k[:, :, t, :, None] * v[:, :, t, None, :]
    return state


CASES = [
    (form, gate)
    for form in ("recurrent", "chunked", "parallel")
    for gate in (None, "scalar", "channel")
    if not (form == "parallel" and gate is None)  # the causal parallel form needs decays
]


@pytest.mark.parametrize("form,gate", CASES)
@pytest.mark.parametrize("split", [16, 13, 1])  # on a chunk boundary (chunk 8), off it, after one token
def test_two_segments_equal_one_pass(form, gate, split):
    q, k, v, g = _inputs(gate)
    whole, s_whole = _run(form, q, k, v, g, causal=True, lo=0, hi=N)
    first, s1 = _run(form, q, k, v, g, causal=True, lo=0, hi=split)
    second, s2 = _run(form, q, k, v, g, causal=True, lo=split, hi=N, s0=s1)
    torch.testing.assert_close(torch.cat([first, second], dim=2), whole, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(s2, s_whole, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(s_whole, _definition_state(k, v, g), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("form", ["recurrent", "chunked", "parallel"])
def test_non_causal_state_is_the_sum(form):
    q, k, v, _ = _inputs(None)
    s0 = torch.randn(B, H, DK, DV, dtype=torch.float64)
    out, state = _run(form, q, k, v, None, causal=False, lo=0, hi=N, s0=s0)
    expected = s0 + k.transpose(-1, -2) @ v
    torch.testing.assert_close(state, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out, q @ expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("form,gate", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_zero_initial_state_equals_none(form, gate, dtype):
    q, k, v, g = _inputs(gate, seed=1, dtype=dtype)
    plain = linear_recurrence(q, k, v, g, causal=True, form=form, chunk_size=8)
    zero = torch.zeros(B, H, DK, DV, dtype=dtype)
    out, _ = linear_recurrence(
        q, k, v, g, causal=True, form=form, chunk_size=8, initial_state=zero, output_final_state=True
    )
    assert torch.equal(out, plain)
    assert torch.equal(linear_recurrence(q, k, v, g, causal=True, form=form, chunk_size=8, initial_state=zero), plain)


def test_chunked_state_with_sub_blocks_and_a_strong_sub_block():
    """chunk > SUB_BLOCK: factored sub-blocks, one of them with a decay too strong to factor."""
    n = 4 * SUB_BLOCK + 5
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 1, n, DK, generator=gen, dtype=torch.float64) for _ in range(3))
    g = -torch.rand(1, 1, n, DK, generator=gen, dtype=torch.float64) * 0.1
    g[:, :, SUB_BLOCK + 3] = -400.0  # beyond exp(177) inside the second sub-block
    ref, s_ref = linear_recurrence(q, k, v, g, causal=True, form="recurrent", output_final_state=True)
    for split in (SUB_BLOCK + 3, 2 * SUB_BLOCK):
        a, s1 = linear_recurrence(
            q[:, :, :split],
            k[:, :, :split],
            v[:, :, :split],
            g[:, :, :split],
            causal=True,
            form="chunked",
            chunk_size=2 * SUB_BLOCK,
            output_final_state=True,
        )
        b, s2 = linear_recurrence(
            q[:, :, split:],
            k[:, :, split:],
            v[:, :, split:],
            g[:, :, split:],
            causal=True,
            form="chunked",
            chunk_size=2 * SUB_BLOCK,
            initial_state=s1,
            output_final_state=True,
        )
        torch.testing.assert_close(torch.cat([a, b], dim=2), ref, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(s2, s_ref, rtol=1e-12, atol=1e-12)


def test_bad_initial_state():
    q, k, v, g = _inputs("channel")
    with pytest.raises(ValueError, match=r"initial_state: got shape \(2, 2, 3, 4\)"):
        linear_recurrence(q, k, v, g, causal=True, initial_state=torch.zeros(B, H, DV, DK))
    with pytest.raises(TypeError, match="initial_state"):
        linear_recurrence(q, k, v, g, causal=True, initial_state=[[0.0]])
