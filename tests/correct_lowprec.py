"""Correct attention implementations that compute in a lower precision than they are called with (as
flash-linear-attention's naive references do: float32 inside, whatever the input dtype). No property may
fail them; gradient checks judge them at the precision they compute in."""

from __future__ import annotations

from gramcheck import variants as V


def softmax_in_float32(q, k, v, *, causal):
    """The builtin softmax computed in float32 and cast back to the input dtype."""
    dt = q.dtype
    return V.get("softmax").torch(q.float(), k.float(), v.float(), causal=causal).to(dt)


def linear_elu_in_float32(q, k, v, *, causal):
    """The builtin elu+1 linear attention computed in float32 and cast back."""
    dt = q.dtype
    return V.get("linear-elu").torch(q.float(), k.float(), v.float(), causal=causal, form="chunked").to(dt)
