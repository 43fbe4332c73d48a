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


def softmax_with_custom_backward(q, k, v, *, causal):
    """The builtin softmax behind a torch.autograd.Function whose backward recomputes through autograd
    (correct gradients) after a host round trip of the incoming gradient: vmap cannot batch it, so
    vectorised Jacobians fail."""
    import torch

    class _Attention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            ctx.save_for_backward(q, k, v)
            return V.get("softmax").torch(q, k, v, causal=causal)

        @staticmethod
        def backward(ctx, grad):
            grad = torch.as_tensor(grad.detach().cpu().numpy())  # a host round trip, as some kernels do
            q, k, v = (x.detach().requires_grad_(True) for x in ctx.saved_tensors)
            with torch.enable_grad():
                out = V.get("softmax").torch(q, k, v, causal=causal)
                return torch.autograd.grad(out, (q, k, v), grad)

    return _Attention.apply(q, k, v)


def softmax_sdpa(q, k, v, *, causal):
    """torch's scaled_dot_product_attention (its math reference scales Q and K by sqrt(s) each)."""
    import torch.nn.functional as F

    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


PERFORMER_EPS = {"feature_eps": 1e-2, "shift": "projection"}


def performer_shift_carried(q, k, v, *, causal, projection):
    """FAVOR+ (positive features, feature_eps 1e-2, projection shift) differentiated through its
    stabilising maximum, which with feature_eps > 0 does not cancel: plain autograd of the formula, the
    other gradient convention to performer-pytorch's detached shift."""
    from gramcheck.autodiff import TorchDefinition

    var = V.get("performer-positive")
    ar = TorchDefinition(q.dtype, device=q.device, carried_shift=True)
    params = var.resolve_params(PERFORMER_EPS)
    return var.reference_fn(ar, q, k, v, causal=causal, projection=projection, **params)


def performer_in_dtype(name: str, dtype: str, form: str = "chunked"):
    """The builtin FAVOR+ variant ``name`` with its features computed and stored in the input dtype (as
    performer-pytorch computes them outside autocast), where the builtin computes them in float32: every
    feature's exponent rounds as the definition's does in that dtype, which the low-precision rule's
    yardsticks must accept."""
    from gramcheck.featuremaps import favor_causal
    from gramcheck.targets import Target
    from gramcheck.torch_arith import TORCH
    from gramcheck.variants.common import torch_normalised
    from gramcheck.variants.performer import _features, prefix_stabilised

    var = V.get(name)
    p = var.resolve_params({})

    def favor_in_dtype(q, k, v, *, causal, projection):
        w, eps, g = projection.to(dtype=q.dtype, device=q.device), p["eps"], None
        if causal and prefix_stabilised(p, eps):
            fq, fk, g = favor_causal(TORCH, q, k, w, kind=p["kind"], scale=p["scale"])
        else:
            fq, fk = _features(TORCH, q, k, w, p)
        return torch_normalised(fq, fk, v, causal=causal, form=form, chunk_size=64, eps=eps, g=g)

    return Target(favor_in_dtype, var, dtype=dtype, params=dict(p), name=f"{name} (features in {dtype})")


def rwkv6_in_float32(q, k, v, *, causal, g, u, initial_state=None, output_final_state=False):
    """The builtin RWKV-6 computed in float32 (every input cast, as fla's naive references do) and cast back."""
    dt = q.dtype
    f32 = lambda x: None if x is None else x.float()  # noqa: E731
    r = V.get("rwkv6").torch(
        f32(q), f32(k), f32(v), causal=causal, g=f32(g), u=f32(u), initial_state=f32(initial_state),
        output_final_state=output_final_state,
    )
    return (r[0].to(dt), r[1].to(dt)) if isinstance(r, tuple) else r.to(dt)


def linear_elu_in_float32_float64_only(q, k, v, *, causal):
    """elu+1 linear attention computed in float32 inside, whose entry point takes float64 tensors only."""
    import torch

    if q.dtype != torch.float64:
        raise NotImplementedError("float64 inputs only")
    return linear_elu_in_float32(q, k, v, causal=causal)


def linear_relu_in_float32(q, k, v, *, causal):
    """The builtin relu linear attention computed in float32 and cast back (a denominator that can vanish: gradcheck
    judges it by the float32 rule where the example's denominators do not)."""
    dt = q.dtype
    return V.get("linear-relu").torch(q.float(), k.float(), v.float(), causal=causal, form="chunked").to(dt)


def with_float32_backward(fn, change=None):
    """``fn`` whose forward runs as called (float64) and whose backward is autograd of ``fn`` in float32 (a
    float64 forward with a float32 backward kernel); ``change(name, grad)``, when given, alters a gradient (for
    the broken twin)."""
    import torch

    def target(q, k, v, *, causal, **kw):
        names = ["q", "k", "v", *[n for n, x in kw.items() if torch.is_tensor(x)]]
        other = {n: x for n, x in kw.items() if not torch.is_tensor(x)}

        def run(xs):
            a = dict(zip(names, xs, strict=True))
            r = fn(a.pop("q"), a.pop("k"), a.pop("v"), causal=causal, **a, **other)
            return tuple(r) if isinstance(r, (tuple, list)) else (r,)

        class _Float32Backward(torch.autograd.Function):
            @staticmethod
            def forward(ctx, *xs):
                ctx.save_for_backward(*xs)
                with torch.no_grad():
                    return run(xs)

            @staticmethod
            def backward(ctx, *grads):
                xs = ctx.saved_tensors
                low = [x.detach().float().requires_grad_() for x in xs]
                with torch.enable_grad():
                    gs = torch.autograd.grad(run(low), low, [g.float() for g in grads], allow_unused=True)
                out = [None if g is None else g.to(x.dtype) for g, x in zip(gs, xs, strict=True)]
                if change is not None:
                    out = [g if g is None else change(n, g) for n, g in zip(names, out, strict=True)]
                return tuple(out)

        res = _Float32Backward.apply(q, k, v, *[kw[n] for n in names[3:]])
        return res if len(res) > 1 else res[0]

    return target


def trig_with_split_denominators(q, k, v, *, causal, projection):
    """Trig-feature FAVOR+ in the inputs' dtype whose denominators den_i = sum_j phi(q_i) . phi(k_j) sum the
    positive terms and the negative terms apart: exact in exact arithmetic, its rounding of den_i u scale_i, kappa_i
    times u |den_i| where the terms cancel (proofs/backward-agreement.md, "Denominators that can vanish"). Its
    features are unstabilised (exp(|x|^2 / 2) unshifted): correct only on inputs of small norm, where they and their
    gradients stay in range, as the test that uses it picks them; not a reference for ``check``."""
    import torch

    from gramcheck.torch_arith import TORCH
    from gramcheck.variants.performer import _features

    var = V.get("performer-trig")
    fq, fk = _features(TORCH, q, k, projection.to(q.dtype), {**var.resolve_params({}), "stabilize": False})
    terms = fq[..., :, None, :] * fk[..., None, :, :]  # (B, H, N, N, m)
    if causal:
        n = q.shape[2]
        terms = terms * torch.tril(torch.ones(n, n, dtype=q.dtype))[..., None]
    den = terms.clamp(min=0).sum((-1, -2)) - (-terms).clamp(min=0).sum((-1, -2))
    return (terms.sum(-1) @ v) / den[..., None]
