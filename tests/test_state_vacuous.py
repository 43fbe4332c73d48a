"""State properties where the rounding bound of the output or the final state says nothing (bfloat16 and
float16 at long N): such entries are judged by the low-precision rule in norm, per (batch, head) slice,
as agreement judges them (proofs/state-passing.md, "Vacuous bounds")."""

from __future__ import annotations

import numpy as np
import pytest
from broken import gla_final_state_halved, gla_initial_state_undecayed

from gramcheck.inputs import draw_log_decay
from gramcheck.precision import round_to
from gramcheck.properties.state import state_agreement, state_split
from gramcheck.strategies import AttentionInputs
from gramcheck.targets import Target, builtin


def _recurrent_gla(q, k, v, *, causal, g, initial_state=None, output_final_state=False):
    import gramcheck.variants as V

    kw = {"initial_state": initial_state, "output_final_state": output_final_state}
    return V.get("gla").torch(q, k, v, causal=True, g=g, form="recurrent", chunk_size=1, **kw)


def _long(dtype: str) -> AttentionInputs:
    rng = np.random.default_rng(0)
    q, k, v = (round_to(rng.standard_normal((1, 2, 300, 16)), dtype) for _ in range(3))
    g = round_to(draw_log_decay(rng, (1, 2, 300, 16), "long-memory"), dtype)
    return AttentionInputs(q, k, v, {"g": g}, "long-memory", dtype, {})


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_wrong_final_states_fail_where_the_bound_is_vacuous(dtype):
    """N = 300, long-memory gates: 2 R(u) of S_N reaches 1e9-6e10 in bfloat16 against |S_N| ~ 30, and a
    final state half the true one, or carrying S_0 without its decay, passed state-agreement at the
    builtin's 0.0079 (state-split at 0.0027). Now the builtin passes both, those targets fail."""
    ex = _long(dtype)
    t = builtin("gla", dtype=dtype)
    for f in (state_agreement(t, ex, causal=True), state_split(t, ex, causal=True)):
        assert f.passed and f.details["vacuous_entries"]["final_state"] > 0, f
    # a correct form that computes otherwise: token by token, state accumulated in float32
    recurrent = Target(_recurrent_gla, t.variant, dtype=dtype, params=dict(t.params), name="recurrent")
    assert state_agreement(recurrent, ex, causal=True).passed and state_split(recurrent, ex, causal=True).passed
    halved = Target(gla_final_state_halved, t.variant, dtype=dtype, params=dict(t.params), name="halved")
    undecayed = Target(gla_initial_state_undecayed, t.variant, dtype=dtype, params=dict(t.params), name="undecayed")
    assert state_agreement(halved, ex, causal=True).measured > 10
    assert state_agreement(undecayed, ex, causal=True).measured > 10
    assert state_split(undecayed, ex, causal=True).measured > 10
