"""Deliberately broken attention implementations, each breaking exactly one thing a property checks.
They follow gramcheck's calling convention fn(q, k, v, *, causal, **extras) on torch tensors."""

from __future__ import annotations

import math

import torch

from gramcheck import variants as V
from gramcheck.featuremaps import elementwise, favor
from gramcheck.torch_arith import TORCH
from gramcheck.variants.common import torch_normalised


def performer_without_stabiliser(q, k, v, *, causal, projection):
    """FAVOR+ positive features with no max subtraction: features underflow to 0 for large norms."""
    w = projection.to(q.dtype)
    fq = favor(TORCH, q, w, is_query=True, stabilize=False)
    fk = favor(TORCH, k, w, is_query=False, stabilize=False)
    return torch_normalised(fq, fk, v, causal=causal, form="chunked", chunk_size=4)


def softmax_leaking_one_future_token(q, k, v, *, causal):
    """Causal softmax whose mask keeps j <= i + 1: token i sees token i + 1."""
    n = q.shape[-2]
    logits = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        keep = torch.ones(n, n, dtype=torch.bool).tril(1)
        logits = logits.masked_fill(~keep, -math.inf)
    return torch.softmax(logits, -1) @ v


def linear_with_huge_eps(q, k, v, *, causal):
    """elu+1 linear attention with eps = 1 added to the denominator (the definition has eps = 0)."""
    phi = elementwise("elu1")
    return torch_normalised(phi(TORCH, q), phi(TORCH, k), v, causal=causal, form="recurrent", chunk_size=1, eps=1.0)


def linear_with_detached_features(q, k, v, *, causal):
    """Right values, wrong gradients: the query feature map is detached from autograd."""
    phi = elementwise("elu1")
    return torch_normalised(phi(TORCH, q.detach()), phi(TORCH, k), v, causal=causal, form="chunked", chunk_size=4)


def gla_with_inverted_decay(q, k, v, *, causal, g):
    """GLA whose state is multiplied by exp(-g) >= 1 instead of exp(g): the state grows without bound."""
    from gramcheck.forms import linear_recurrence

    return linear_recurrence(q, k, v, -g, causal=True, form="recurrent")


def linear_with_position_bias(q, k, v, *, causal):
    """Adds a tiny position-dependent term: not permutation-equivariant."""
    out = V.get("linear-elu").torch(q, k, v, causal=causal, form="chunked", chunk_size=4)
    return out + 1e-3 * torch.arange(q.shape[-2], dtype=q.dtype)[:, None]


def qknorm_without_key_norm(q, k, v, *, causal):
    """QK-norm softmax that normalises q but not k: not invariant to scaling k."""
    from gramcheck.variants.qknorm import qk_normalise

    qn = qk_normalise(TORCH, q, norm="layernorm", tau=1.0, norm_eps=1e-6)
    return V.get("softmax").torch(qn, k, v, causal=causal, scale=1.0)


def qknorm_with_doubled_temperature(q, k, v, *, causal):
    """Claims tau = 1, computes with tau = 2: weights leave the range of tau = 1."""
    return V.get("qknorm-softmax").torch(q, k, v, causal=causal, tau=2.0)


def normattention_without_norm(q, k, v, *, causal):
    """TransNormer NormAttention with the output norm left out: not invariant to scaling V."""
    phi = elementwise("elu1")
    from gramcheck.forms import linear_recurrence

    return linear_recurrence(phi(TORCH, q), phi(TORCH, k), v, causal=causal, form="chunked", chunk_size=4)


def unnormalised_times_n(q, k, v, *, causal):
    """Unnormalised linear attention multiplied by N: grows faster than the bound allows."""
    return V.get("linear-unnormalised").torch(q, k, v, causal=causal) * q.shape[-2]


def softmax_shifted(q, k, v, *, causal):
    """Adds 0.5 to every output: leaves the convex hull of the values."""
    return V.get("softmax").torch(q, k, v, causal=causal) + 0.5


def softmax_amplified_values(q, k, v, *, causal):
    """O = 1.5 P V: right shape, Jacobian with respect to V 1.5 times too large."""
    return 1.5 * V.get("softmax").torch(q, k, v, causal=causal)


def coarse_output(q, k, v, *, causal):
    """Correct formula, output rounded through float8 (e4m3): far beyond bfloat16's error."""
    out = V.get("linear-elu").torch(q, k, v, causal=causal, form="chunked", chunk_size=4)
    return out.to(torch.float8_e4m3fn).to(q.dtype)


def performer_with_halved_rows(q, k, v, *, causal, projection):
    """FAVOR+ whose denominator is doubled: rows of weights sum to 1/2, so the output misses the exact
    softmax output by more than the kernel error can explain."""
    return V.get("performer-positive").torch(q, k, v, causal=causal, projection=projection) / 2


class _UnreducedTrig(type(TORCH)):
    """The torch arithmetic with sin and cos that clamp their argument to [-pi, pi] instead of reducing it."""

    def sin(self, x):
        return torch.sin(x.clamp(-math.pi, math.pi))

    def cos(self, x):
        return torch.cos(x.clamp(-math.pi, math.pi))


def performer_trig_unreduced_arguments(q, k, v, *, causal, projection):
    """Trigonometric FAVOR+ whose sin and cos clamp w.x to [-pi, pi]: off by 100% and more on ordinary
    inputs (a noise gate that judged nothing of bfloat16 trigonometric outputs passed it)."""
    w = projection.to(q.dtype)
    fq = favor(_UnreducedTrig(), q, w, kind="trig", is_query=True)
    fk = favor(_UnreducedTrig(), k, w, kind="trig", is_query=False)
    return torch_normalised(fq, fk, v, causal=causal, form="chunked", chunk_size=64)


def performer_global_key_stabiliser(q, k, v, *, causal, projection):
    """Causal FAVOR+ as the reference code writes it: keys stabilised by their maximum over *all* tokens.
    A future outlier key moves the shift for every earlier key: past outputs change (and can underflow to
    0/0), so the form is not causal in floating point."""
    w = projection.to(q.dtype)
    fq = favor(TORCH, q, w, is_query=True)
    fk = favor(TORCH, k, w, is_query=False)
    return torch_normalised(fq, fk, v, causal=causal, form="chunked", chunk_size=4)


def hangs_forever(q, k, v, *, causal):
    """Never returns (the CLI test checks that gramcheck still finishes and exits)."""
    import time

    while True:
        time.sleep(0.5)


def softmax_plus_one(q, k, v, *, causal):
    """softmax(QK^T / sqrt(d)) V + 1: in bfloat16 the worst-case rounding bound exceeds the output itself."""
    return V.get("softmax").torch(q, k, v, causal=causal) + 1.0


def softmax_off_three_percent(q, k, v, *, causal):
    """Every output 3% too large: within the worst-case bfloat16 bound, far beyond its typical error."""
    return V.get("softmax").torch(q, k, v, causal=causal) * 1.03


def softmax_detached(q, k, v, *, causal):
    """Right values, no gradient at all: the output is detached from autograd."""
    return V.get("softmax").torch(q, k, v, causal=causal).detach()


def linear_elu_with_eps_idiom(q, k, v, *, causal):
    """The common ``den + 1e-6`` idiom: correct when run with params eps=1e-6."""
    phi = elementwise("elu1")
    return torch_normalised(phi(TORCH, q), phi(TORCH, k), v, causal=causal, form="chunked", chunk_size=4, eps=1e-6)


def linear_elu_plus_one_feature(q, k, v, *, causal):
    """phi(x) = elu(x) + 1 written with F.elu: exp(x) - 1 + 1 is exactly 0 in float32 for x < -17, so a
    row of strongly negative queries or keys gives 0/0 (the definition's elu1 keeps exp(x) > 0)."""
    fq, fk = torch.nn.functional.elu(q) + 1, torch.nn.functional.elu(k) + 1
    return torch_normalised(fq, fk, v, causal=causal, form="recurrent", chunk_size=1)


# ------------------------------------------------------------------------------------------------------
# state passing, packing and backward (targets that take initial_state / cu_seqlens, custom backward)
# ------------------------------------------------------------------------------------------------------
def gla_ignoring_initial_state(q, k, v, *, causal, g, initial_state=None, output_final_state=False):
    """GLA that accepts initial_state and drops it: outputs and final state start from 0."""
    return V.get("gla").torch(q, k, v, causal=True, g=g, output_final_state=output_final_state)


def gla_transposed_state(q, k, v, *, causal, g, initial_state=None, output_final_state=False):
    """GLA that keeps its state as (d_v, d_k): it reads initial_state and returns final_state transposed
    (the shapes agree when d_k == d_v)."""
    s0 = None if initial_state is None else initial_state.transpose(-1, -2)
    res = V.get("gla").torch(q, k, v, causal=True, g=g, initial_state=s0, output_final_state=output_final_state)
    if output_final_state:
        return res[0], res[1].transpose(-1, -2)
    return res


def gla_state_stored_in_dtype(q, k, v, *, causal, g, initial_state=None, output_final_state=False):
    """GLA whose state is right within a call (float32) but returned in the inputs' dtype, so that a decode loop
    stores it in 16 bits between calls (ollama#15865: the state written back as bfloat16)."""
    res = _gla_with_state(q, k, v, g, initial_state, output_final_state)
    if output_final_state:
        return res[0], res[1].to(q.dtype)
    return res


def gla_decode_step_without_decay(q, k, v, *, causal, g, initial_state=None, output_final_state=False):
    """GLA whose one-token fast path (a decode step) forgets the decay of the state it is given: S_1 = S_0 +
    k v^T for N = 1; longer calls are right."""
    if q.shape[-2] == 1:
        g = torch.zeros_like(g)
    return _gla_with_state(q, k, v, g, initial_state, output_final_state)


def _gla_with_state(q, k, v, g, initial_state, output_final_state):
    kw = {"initial_state": initial_state, "output_final_state": output_final_state}
    return V.get("gla").torch(q, k, v, causal=True, g=g, **kw)


def gla_final_state_halved(q, k, v, *, causal, g, initial_state=None, output_final_state=False):
    """GLA whose returned final state is half the true one past 64 tokens (outputs right)."""
    res = _gla_with_state(q, k, v, g, initial_state, output_final_state)
    if output_final_state and q.shape[-2] > 64:
        return res[0], res[1] * 0.5
    return res


def gla_initial_state_undecayed(q, k, v, *, causal, g, initial_state=None, output_final_state=False):
    """GLA that adds S_0 to its final state without S_0's decay through the sequence, past 64 tokens."""
    res = _gla_with_state(q, k, v, g, initial_state, output_final_state)
    if not output_final_state or initial_state is None or q.shape[-2] <= 64:
        return res
    lost = 1 - g.double().sum(-2).exp()  # (B, H, d_k)
    return res[0], res[1] + (lost[..., None] * initial_state.double()).to(res[1].dtype)


def gla_final_state_three_percent_off(q, k, v, *, causal, g, initial_state=None, output_final_state=False):
    """GLA whose returned final state is 3% off (outputs right)."""
    res = _gla_with_state(q, k, v, g, initial_state, output_final_state)
    return (res[0], res[1] * 1.03) if output_final_state else res


def gla_initial_state_three_percent_off(q, k, v, *, causal, g, initial_state=None, output_final_state=False):
    """GLA whose outputs carry the initial state's contribution 3% off (final state right)."""
    res = _gla_with_state(q, k, v, g, initial_state, output_final_state)
    if initial_state is None:
        return res
    zero = _gla_with_state(q, k, v, g, None, output_final_state)
    out, zero = (r[0] if output_final_state else r for r in (res, zero))
    out = out + (0.03 * (out.double() - zero.double())).to(out.dtype)
    return (out, res[1]) if output_final_state else out


def _with_backward(forward, corrupt):
    """forward(*inputs) with its exact autograd backward, then ``corrupt(grads, inputs)`` applied: a custom
    autograd.Function whose forward is correct and whose backward is written separately (as kernels are)."""

    class Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *inputs):
            ctx.save_for_backward(*inputs)
            return forward(*inputs)

        @staticmethod
        def backward(ctx, do):
            inputs = ctx.saved_tensors
            with torch.enable_grad():
                leaves = [x.detach().requires_grad_() for x in inputs]
                grads = torch.autograd.grad(forward(*leaves), leaves, do)
            return corrupt(list(grads), inputs)

    return Fn.apply


def with_changed_gradient(fn, name, change):
    """The target callable ``fn`` whose gradient with respect to its input ``name`` (q, k, v or a keyword input
    such as initial_state) is ``change(grad)``; its forward is fn's (``_with_backward`` on the identity)."""

    def wrapped(q, k, v, *, causal, **kw):
        x = {"q": q, "k": k, "v": v, **kw}
        if x.get(name) is not None:
            x[name] = _with_backward(torch.clone, lambda grads, inputs: (change(grads[0]),))(x[name])
        return fn(x.pop("q"), x.pop("k"), x.pop("v"), causal=causal, **x)

    return wrapped


def retnet_decays_in_the_input_dtype(q, k, v, *, causal):
    """RetNet whose decays gamma_h = 1 - 2^(-5-h) are held in the inputs' dtype: in bfloat16 they round to
    1 for h >= 4 (1 - 2^-9 is a tie, to even), and those heads never decay."""
    from gramcheck.variants.retnet import head_gammas

    gamma = torch.as_tensor(head_gammas(q.shape[1]), dtype=q.dtype).double().tolist()
    return V.get("retnet").torch(q, k, v, causal=True, form="chunked", chunk_size=64, gamma=gamma)


def gla_decays_five_percent_strong(q, k, v, *, causal, g):
    """GLA whose log-decays are 5% too strong (g * 1.05): 2% off in norm with long-memory gates."""
    return V.get("gla").torch(q, k, v, causal=True, form="chunked", chunk_size=64, g=(g.float() * 1.05).to(g.dtype))


def mamba2_decays_five_percent_strong(q, k, v, *, causal, g):
    """Mamba2 whose log-decays are 5% too strong."""
    return V.get("mamba2").torch(q, k, v, causal=True, form="chunked", chunk_size=64, g=(g.float() * 1.05).to(g.dtype))


def retnet_dv_missing_scale(q, k, v, *, causal):
    """RetNet whose backward forgets the query scale s = 1/sqrt(d) in dv (dv is 1/s times too large)."""

    def forward(q, k, v):
        return V.get("retnet").torch(q, k, v, causal=True, form="chunked", chunk_size=16)

    def corrupt(grads, inputs):
        grads[2] = grads[2] * math.sqrt(inputs[0].shape[-1])
        return tuple(grads)

    return _with_backward(forward, corrupt)(q, k, v)


def retnet_without_backward(q, k, v, *, causal):
    """RetNet whose backward is not implemented (raises NotImplementedError, as fla's
    fused_recurrent_gated_delta_rule does)."""

    def forward(q, k, v):
        return V.get("retnet").torch(q, k, v, causal=True, form="chunked", chunk_size=16)

    def corrupt(grads, inputs):
        raise NotImplementedError("backward pass is not implemented")

    return _with_backward(forward, corrupt)(q, k, v)


def retnet_nan_backward(q, k, v, *, causal):
    """RetNet whose backward returns NaN in dq's first entry (an uninitialised accumulator), where every
    gradient of the definition is finite."""

    def forward(q, k, v):
        return V.get("retnet").torch(q, k, v, causal=True, form="chunked", chunk_size=16)

    def corrupt(grads, inputs):
        grads[0] = grads[0].clone()
        grads[0].view(-1)[0] = float("nan")
        return tuple(grads)

    return _with_backward(forward, corrupt)(q, k, v)


def gla_dk_missing_decay(q, k, v, *, causal, g):
    """GLA whose backward drops a decay factor in dk: dk_s / alpha_s, as when the decay to token s is read
    cumulated through s - 1 instead of s."""

    def forward(q, k, v, g):
        return V.get("gla").torch(q, k, v, causal=True, g=g, form="chunked", chunk_size=16)

    def corrupt(grads, inputs):
        grads[1] = grads[1] * torch.exp(-inputs[3])
        return tuple(grads)

    return _with_backward(forward, corrupt)(q, k, v, g)


def linear_elu_detached_denominator(q, k, v, *, causal):
    """elu+1 linear attention whose normaliser is computed outside autograd (as when the denominator is
    accumulated under no_grad or in a buffer): right values, dq and dk without the denominator's term."""
    from gramcheck.forms import linear_recurrence

    phi = elementwise("elu1")
    va = torch.cat([v, v.new_ones(*v.shape[:-1], 1)], dim=-1)
    out = linear_recurrence(phi(TORCH, q), phi(TORCH, k), va, None, causal=causal, form="chunked", chunk_size=16)
    return out[..., :-1] / out[..., -1:].detach()


def qknorm_softmax_detached_norm(q, k, v, *, causal):
    """QK-norm softmax (layernorm, tau = 1) whose backward treats each row's standard deviation as a
    constant: right values, dq and dk without the normalisation's Jacobian."""

    def normed(x):
        c = x - x.mean(-1, keepdim=True)
        return c / torch.sqrt((c * c).mean(-1, keepdim=True) + 1e-6).detach() / math.sqrt(x.shape[-1])

    return V.get("softmax").torch(normed(q), normed(k), v, causal=causal, scale=1.0)


def deltanet_detached_keys(q, k, v, *, causal, beta):
    """DeltaNet whose keys are detached from autograd: right values, dk = 0."""
    return V.get("deltanet").torch(q, k.detach(), v, causal=causal, form="chunked", chunk_size=16, beta=beta)


def qknorm_performer_detached_queries(q, k, v, *, causal, projection):
    """QK-norm FAVOR+ whose queries are detached from autograd: right values, dq = 0."""
    return V.get("qknorm-performer").torch(
        q.detach(), k, v, causal=causal, form="chunked", chunk_size=16, projection=projection
    )


def gla_packed_leaking_state(q, k, v, *, causal, g, cu_seqlens=None, initial_state=None, output_final_state=False):
    """Packed GLA that runs the whole row as one sequence: the state of one sequence flows into the next."""
    out = V.get("gla").torch(q, k, v, causal=True, g=g, form="chunked", chunk_size=16)
    if not output_final_state:
        return out
    packed = V.get("gla").torch(
        q, k, v, causal=True, g=g, cu_seqlens=cu_seqlens, initial_state=initial_state, output_final_state=True
    )
    return out, packed[1]


def gla_uninitialised_state(q, k, v, *, causal, g, initial_state=None, output_final_state=False):
    """GLA that, without an initial_state, starts from whatever its state buffer held (here 1e-3 everywhere)
    instead of zero; given a state it is correct."""
    if initial_state is None:
        initial_state = q.new_full((q.shape[0], q.shape[1], q.shape[-1], v.shape[-1]), 1e-3, dtype=torch.float32)
    return V.get("gla").torch(
        q, k, v, causal=True, g=g, initial_state=initial_state, output_final_state=output_final_state
    )


def gla_state_as_dv_dk(q, k, v, *, causal, g, initial_state=None, output_final_state=False):
    """Returns its final state as (B, H, d_v, d_k): a wrong shape whenever d_k != d_v."""
    res = V.get("gla").torch(
        q, k, v, causal=True, g=g, initial_state=initial_state, output_final_state=output_final_state
    )
    return (res[0], res[1].transpose(-1, -2)) if output_final_state else res


def softmax_scaled_after_product(q, k, v, *, causal):
    """softmax((Q K^T) s) V with Q K^T formed in the input dtype before the scale, as the definition writes
    it (ultralytics/ultralytics#24990): in float16 |q.k| past 65504 is inf before s brings it into range."""
    import math

    import torch

    logits = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal:
        n = q.shape[-2]
        logits = logits.masked_fill(~torch.ones(n, n, dtype=torch.bool, device=q.device).tril(), -math.inf)
    return torch.softmax(logits, dim=-1) @ v


def gla_states_of_the_first_batch_row(q, k, v, *, causal, g, initial_state=None, output_final_state=False):
    """GLA whose state kernel misses the batch offset (RWKV-LM#241, fla's i_bh/i_nh pointer fixes): every
    batch row starts from row 0's initial state and returns row 0's final state; right when B = 1."""
    s0 = None if initial_state is None else initial_state[:1].expand_as(initial_state)
    res = _gla_with_state(q, k, v, g, s0, output_final_state)
    if output_final_state:
        return res[0], res[1][:1].expand_as(res[1]).clone()
    return res


def linear_elu_masked_by_product(q, k, v, *, causal):
    """Causal normalised elu + 1 attention with the mask applied as a product: in float16 a future score
    past 65504 is inf, and inf * 0 is NaN in every row before it (the builtin chunked form did this)."""
    fq, fk = torch.nn.functional.elu(q) + 1, torch.nn.functional.elu(k) + 1
    n = q.shape[-2]
    s = (fq @ fk.transpose(-1, -2)) * torch.ones(n, n, dtype=q.dtype).tril()
    return ((s.float() @ v.float()) / s.float().sum(-1, keepdim=True)).to(q.dtype)


def rwkv6_in_float32_with_dq_five_percent_off(q, k, v, *, causal, g, u):
    """RWKV-6 computed in float32 whose backward scales dq by 1.05 (the forward is unchanged: q + 0.05 (q -
    stop_gradient(q)) equals q)."""
    from correct_lowprec import rwkv6_in_float32

    return rwkv6_in_float32(q + 0.05 * (q - q.detach()), k, v, causal=causal, g=g, u=u)


def linear_elu_output_shaped_like_q(q, k, v, *, causal):
    """elu+1 linear attention that allocates its output like q, as a kernel written for square heads does
    (``o = torch.empty_like(q)``): right wherever d_v = d_k, the wrong shape elsewhere."""
    res = V.get("linear-elu").torch(q, k, v, causal=causal)
    out = torch.zeros_like(q)
    n = min(q.shape[-1], v.shape[-1])
    out[..., :n] = res[..., :n]
    return out


def rwkv6_in_float32_with_dg_detached(q, k, v, *, causal, g, u):
    """RWKV-6 computed in float32 whose backward drops dg (the decays detached: the forward is unchanged)."""
    from correct_lowprec import rwkv6_in_float32

    return rwkv6_in_float32(q, k, v, causal=causal, g=g.detach(), u=u)


def linear_elu_float32_inside_with_float64_path_dq_halved(q, k, v, *, causal):
    """elu+1 linear attention computed in float32 inside; called in float64 (and only then) its backward halves
    dq (the float64 entry point's own wrapper is wrong, the float32 one right)."""
    from correct_lowprec import linear_elu_in_float32

    if q.dtype == torch.float64:
        q = q - 0.5 * (q - q.detach())
    return linear_elu_in_float32(q, k, v, causal=causal)


def gla_first_packed_backward_wrong():
    """A GLA whose first packed backward doubles dq (a lazily initialised buffer), right from then on."""
    calls = []

    def fn(q, k, v, *, causal, g, initial_state=None, output_final_state=False, cu_seqlens=None):
        if cu_seqlens is not None and q.requires_grad:
            calls.append(1)
            if len(calls) == 1:
                q = q + (q - q.detach())
        kw = {"initial_state": initial_state, "output_final_state": output_final_state, "cu_seqlens": cu_seqlens}
        return V.get("gla").torch(q, k, v, causal=causal, g=g, **{n: x for n, x in kw.items() if x is not None})

    return fn


def packed_backward_scaled(variant: str, name: str, factor: float):
    """The builtin ``variant`` whose backward scales d``name`` by ``factor`` when it runs packed sequences (its
    forward, and every unpacked run, right)."""

    def fn(q, k, v, *, causal, cu_seqlens=None, **kw):
        x = {"q": q, "k": k, "v": v}
        if cu_seqlens is not None:
            kw["cu_seqlens"] = cu_seqlens
            if x[name].requires_grad:
                x[name] = x[name] + (factor - 1.0) * (x[name] - x[name].detach())
        return V.get(variant).torch(x["q"], x["k"], x["v"], causal=causal, **kw)

    return fn


def softmax_in_float32_with_dq_garbage_on_duplicate_keys(q, k, v, *, causal):
    """softmax computed in float32 whose dq gains 10 rowsum(W) where every key coincides to within 1e-4 (the
    forward is unchanged). There dq cancels to ~1e-9 against terms of ~5: a gradient no float32 rule resolves,
    and an error 30 times its terms' size."""
    from correct_lowprec import softmax_in_float32

    out = softmax_in_float32(q, k, v, causal=causal)
    spread = float((k - k[..., :1, :]).abs().amax() / k.abs().amax().clamp_min(1e-300))
    if spread < 1e-4 and q.shape[2] > 1:
        out = out + 10.0 * (q - q.detach()).sum(-1, keepdim=True)
    return out


def linear_relu_in_float32_with_dq_ten_percent_off(q, k, v, *, causal):
    """relu linear attention computed in float32 whose backward scales dq by 1.1 (the forward unchanged)."""
    from correct_lowprec import linear_relu_in_float32

    return linear_relu_in_float32(q + 0.1 * (q - q.detach()), k, v, causal=causal)
