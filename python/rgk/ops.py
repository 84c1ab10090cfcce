"""rgk's ops as PyTorch operators (namespace ``torch.ops.rgk``), defined with ``torch.library``:
a schema, a CUDA implementation that allocates the outputs with torch and launches rgk's kernels
on torch's current stream, a fake (meta) implementation for ``torch.compile`` and shape
propagation, and autograd where the op has a backward.

The CUDA implementation is the native module's op: it validates every input (device, dtype,
shape, contiguity, alignment) before anything is allocated or launched — an invalid one raises
``ValueError`` naming the argument — allocates the outputs and launches. Scalar arguments are
numbers (anything ``float()``/``int()`` accepts without parsing a string: Python numbers, NumPy
scalars, 0-d tensors); ``sinkhorn_repeat`` and ``dilation`` non-negative integers.

The functional front end (``rgk.ops.fft_c2c`` etc.) calls the native op directly, which returns
``None`` without doing anything when torch's dispatcher has something to add (a gradient to
record, a trace, transform, dispatch mode or profiler, a tensor subclass, a lazy conjugate or
negative view, a meta tensor); then, and under ``torch.compile``, the call goes through
``torch.ops.rgk``. Both paths run the same implementation; the direct one saves the dispatcher
and the Python autograd wrapper.
"""
from typing import Tuple

import torch

from . import _rgk

_LIB = torch.library.Library("rgk", "DEF")
_LIB.define("fft_c2c(Tensor x) -> Tensor")
_LIB.define("mhc_post(Tensor x_layer_out, Tensor h_post, Tensor x_res) -> Tensor")
_LIB.define(
    "mhc_pre(Tensor phi, Tensor x, Tensor b, float alpha_pre, float alpha_post, float alpha_res, "
    "int sinkhorn_repeat, float sinkhorn_eps) -> (Tensor, Tensor, Tensor)"
)
_LIB.define(
    "mhc_post_pre(Tensor x_layer_out, Tensor h_post, Tensor x_res, Tensor phi, Tensor b, "
    "float alpha_pre, float alpha_post, float alpha_res, int sinkhorn_repeat, float sinkhorn_eps) "
    "-> (Tensor, Tensor, Tensor, Tensor)"
)
_LIB.define(
    "gate_conv_fwd(Tensor h, Tensor k, Tensor v, Tensor rms_w_h, Tensor rms_w_v, Tensor conv_w) "
    "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)"
)
_LIB.define(
    "gate_conv_bwd(Tensor dy, Tensor h, Tensor k, Tensor v, Tensor rms_w_h, Tensor rms_w_v, "
    "Tensor conv_w, Tensor alpha, Tensor rrms_h, Tensor rrms_k) "
    "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)"
)
_LIB.define(
    "decode_fwd(Tensor e_t, Tensor h_t, Tensor conv_state, Tensor w_k, Tensor w_v, Tensor rms_w_h, "
    "Tensor rms_w_v, Tensor conv_w, int dilation, float eps) -> (Tensor, Tensor)"
)

try:
    _is_compiling = torch.compiler.is_compiling
except AttributeError:  # a torch without it: always through the dispatcher
    def _is_compiling() -> bool:
        return True


def _direct(*tensors) -> bool:
    """Whether a front-end call on `tensors` may skip torch's dispatcher (the native op's own
    rule, plus torch.compile, which must see the op)."""
    return not _is_compiling() and _rgk.dispatcher_free(*tensors)


def _dims(x: torch.Tensor, name: str, rank: int) -> Tuple[int, ...]:
    """x's shape, or ValueError naming `name` when its rank is not `rank` (the fake
    implementations' check; the native ops check everything)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"invalid `{name}`: expected a tensor, got {type(x).__name__}")
    if x.dim() != rank:
        raise ValueError(f"invalid `{name}`: has {x.dim()} dimensions, expected {rank}")
    return tuple(x.shape)


def _stream_count(phi: torch.Tensor) -> int:
    m = _dims(phi, "phi", 2)[1]
    n = int(round((m + 1) ** 0.5)) - 1
    if n < 1 or n * n + 2 * n != m:
        raise ValueError(f"invalid `phi`: width {m} is not n² + 2n for a stream count n ≥ 1")
    return n


# --------------------------------------------------------------------------------------------
# Output shapes (the fake implementations)
# --------------------------------------------------------------------------------------------

def _post_out(x_layer_out, h_post, x_res):
    b, c = _dims(x_layer_out, "x_layer_out", 2)
    n = _dims(h_post, "h_post", 2)[1]
    return x_layer_out.new_empty((b, n * c))


def _pre_out(phi, x, b):
    n = _stream_count(phi)
    batch, nc = _dims(x, "x", 2)
    c = nc // n
    return (x.new_empty((batch, nc)), x.new_empty((batch, c)),
            x.new_empty((batch, n), dtype=torch.float32))


def _post_pre_out(x_layer_out, h_post, x_res, phi, b):
    x_out = _post_out(x_layer_out, h_post, x_res)
    return (x_out,) + _pre_out(phi, x_out, b)


def _gate_fwd_out(h, *_):
    m, t, _d = _dims(h, "h", 3)
    f32 = dict(dtype=torch.float32)
    return (torch.empty_like(h), torch.empty_like(h), h.new_empty((m, t), **f32),
            h.new_empty((m, t), **f32), h.new_empty((m, t), **f32), h.new_empty((m, t), **f32))


def _gate_bwd_out(dy, h, k, v, rms_w_h, rms_w_v, conv_w, *_):
    d = _dims(dy, "dy", 3)[2]
    f32 = dict(dtype=torch.float32)
    return (torch.empty_like(dy), torch.empty_like(dy), torch.empty_like(dy),
            dy.new_empty((d,), **f32), dy.new_empty((d,), **f32), dy.new_empty((4, d), **f32))


def _decode_out(e_t, h_t, conv_state, *_):
    return torch.empty_like(h_t), torch.empty_like(conv_state)


# --------------------------------------------------------------------------------------------
# CUDA implementations: the native ops (also registered for CPU tensors, where the native op's
# device check raises the ValueError naming the argument)
# --------------------------------------------------------------------------------------------

_NAMES = ("fft_c2c", "mhc_post", "mhc_pre", "mhc_post_pre", "gate_conv_fwd", "gate_conv_bwd",
          "decode_fwd")


def _dispatched(native):
    def impl(*args):
        return native(*args, False)
    return impl


for _name in _NAMES:
    _impl = _dispatched(getattr(_rgk, _name))
    _LIB.impl(_name, _impl, "CUDA")
    _LIB.impl(_name, _impl, "CPU")


# --------------------------------------------------------------------------------------------
# Fake implementations: output shapes and dtypes only
# --------------------------------------------------------------------------------------------

@torch.library.register_fake("rgk::fft_c2c")
def _(x):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


torch.library.register_fake("rgk::mhc_post")(_post_out)


@torch.library.register_fake("rgk::mhc_pre")
def _(phi, x, b, alpha_pre, alpha_post, alpha_res, sinkhorn_repeat, sinkhorn_eps):
    return _pre_out(phi, x, b)


@torch.library.register_fake("rgk::mhc_post_pre")
def _(x_layer_out, h_post, x_res, phi, b, alpha_pre, alpha_post, alpha_res, sinkhorn_repeat,
      sinkhorn_eps):
    return _post_pre_out(x_layer_out, h_post, x_res, phi, b)


@torch.library.register_fake("rgk::gate_conv_fwd")
def _(h, k, v, rms_w_h, rms_w_v, conv_w):
    return _gate_fwd_out(h)


@torch.library.register_fake("rgk::gate_conv_bwd")
def _(dy, h, k, v, rms_w_h, rms_w_v, conv_w, alpha, rrms_h, rrms_k):
    return _gate_bwd_out(dy, h, k, v, rms_w_h, rms_w_v, conv_w)


@torch.library.register_fake("rgk::decode_fwd")
def _(e_t, h_t, conv_state, w_k, w_v, rms_w_h, rms_w_v, conv_w, dilation, eps):
    return _decode_out(e_t, h_t, conv_state)


# --------------------------------------------------------------------------------------------
# Autograd
# --------------------------------------------------------------------------------------------

# FFT: y = F x with F symmetric, so the vector-Jacobian product is F^H g = conj(F conj(g)).
def _fft_backward(ctx, g):
    return torch.conj_physical(torch.ops.rgk.fft_c2c(torch.conj_physical(g).contiguous()))


torch.library.register_autograd("rgk::fft_c2c", _fft_backward)


# MHCPost: x_out = h_post ⊗ x_layer_out + x_res (bf16 storage, f32 arithmetic).
def _post_setup(ctx, inputs, output):
    x_layer_out, h_post, _ = inputs
    ctx.save_for_backward(x_layer_out, h_post)


def _post_backward(ctx, g):
    x_layer_out, h_post = ctx.saved_tensors
    b, c = x_layer_out.shape
    n = h_post.shape[1]
    g3 = g.float().reshape(b, n, c)
    d_layer = torch.einsum("bnc,bn->bc", g3, h_post.float()).to(x_layer_out.dtype)
    d_h = torch.einsum("bnc,bc->bn", g3, x_layer_out.float())
    return d_layer, d_h.to(h_post.dtype), g


torch.library.register_autograd("rgk::mhc_post", _post_backward, setup_context=_post_setup)


def mhc_pre_reference(phi, x, b, alpha_pre, alpha_post, alpha_res, sinkhorn_repeat,
                      sinkhorn_eps):
    """MHCPreFwd in torch f32 ops (docs/ops.md §2), differentiable: the backward of
    ``rgk.ops.mhc_pre`` until a fused backward kernel exists. Outputs unrounded (f32)."""
    n = _stream_count(phi)
    batch, nc = x.shape
    c = nc // n
    xf = x.float()
    # vector_norm: its gradient at an all-zero row is 0 (sqrt of a sum of squares gives NaN).
    r = torch.linalg.vector_norm(xf, dim=-1, keepdim=True) / (nc ** 0.5) + 1e-4
    h = xf @ phi.float()
    pre = torch.sigmoid(alpha_pre * h[:, :n] / r + b[:n])
    post = 2 * torch.sigmoid(alpha_post * h[:, n:2 * n] / r + b[n:2 * n])
    res = (alpha_res * h[:, 2 * n:] / r + b[2 * n:]).reshape(batch, n, n)
    res = (res - res.amax(-1, keepdim=True)).exp()
    for _ in range(sinkhorn_repeat):
        res = res / (res.sum(-1, keepdim=True) + sinkhorn_eps)
        res = res / (res.sum(-2, keepdim=True) + sinkhorn_eps)
    xs = xf.reshape(batch, n, c)
    x_res = torch.einsum("bik,bkc->bic", res, xs).reshape(batch, nc)
    x_layer = torch.einsum("bk,bkc->bc", pre, xs)
    return x_res, x_layer, post


def _pre_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:3])
    ctx.params = inputs[3:]


def _pre_backward(ctx, g_res, g_layer, g_post):
    """First-order gradients only (the recomputed forward is differentiated once)."""
    phi, x, b = ctx.saved_tensors
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_(need) for t, need in zip((phi, x, b), ctx.needs_input_grad)]
        outs = mhc_pre_reference(*leaves, *ctx.params)
        pairs = [(o, g) for o, g in zip(outs, (g_res, g_layer, g_post)) if g is not None]
        wrt = [t for t in leaves if t.requires_grad]
        grads = iter(torch.autograd.grad([o for o, _ in pairs], wrt,
                                         [g.float() for _, g in pairs], allow_unused=True))
    out = [next(grads) if t.requires_grad else None for t in leaves]
    return tuple(None if gr is None else gr.to(t.dtype) for gr, t in zip(out, (phi, x, b))) + (
        None,) * 5


torch.library.register_autograd("rgk::mhc_pre", _pre_backward, setup_context=_pre_setup)


# MHCPostPre: the post half's formula, then ``mhc_pre_reference``, recomputed in f32 and
# differentiated once (x_out's rounding passes the gradient straight through, as between the two
# separate ops); a gradient on x_out adds to what the pre half sends back.
def _post_pre_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:5])
    ctx.params = inputs[5:]


def _post_pre_backward(ctx, g_out, g_res, g_layer, g_post):
    ins = ctx.saved_tensors
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_(need) for t, need in zip(ins, ctx.needs_input_grad)]
        x_layer_out, h_post, x_res, phi, b = leaves
        batch, c = x_layer_out.shape
        n = h_post.shape[1]
        x_out = (h_post.float().unsqueeze(-1) * x_layer_out.float().unsqueeze(1)
                 + x_res.float().reshape(batch, n, c)).reshape(batch, n * c)
        outs = (x_out,) + tuple(mhc_pre_reference(phi, x_out, b, *ctx.params))
        pairs = [(o, g) for o, g in zip(outs, (g_out, g_res, g_layer, g_post)) if g is not None]
        wrt = [t for t in leaves if t.requires_grad]
        grads = iter(torch.autograd.grad([o for o, _ in pairs], wrt,
                                         [g.float() for _, g in pairs], allow_unused=True))
    out = [next(grads) if t.requires_grad else None for t in leaves]
    return tuple(None if gr is None else gr.to(t.dtype) for gr, t in zip(out, ins)) + (None,) * 5


torch.library.register_autograd("rgk::mhc_post_pre", _post_pre_backward, setup_context=_post_pre_setup)


# EngramGateConv: the backward kernel; gradients flow through Y only (vhat, alpha and the
# reciprocal rms values are what the backward reads, not differentiable outputs).
def _gate_setup(ctx, inputs, output):
    _, _, alpha, rrms_h, rrms_k, _ = output
    ctx.save_for_backward(*inputs, alpha, rrms_h, rrms_k)
    ctx.mark_non_differentiable(*output[1:])


def _gate_backward(ctx, g_y, *_):
    h, k, v, rms_w_h, rms_w_v, conv_w, alpha, rrms_h, rrms_k = ctx.saved_tensors
    if g_y is None:
        return (None,) * 6
    dh, dk, dv, dwh, dwv, dcw = torch.ops.rgk.gate_conv_bwd(
        g_y.contiguous(), h, k, v, rms_w_h, rms_w_v, conv_w, alpha, rrms_h, rrms_k)
    return dh, dk, dv, dwh.to(rms_w_h.dtype), dwv.to(rms_w_v.dtype), dcw.to(conv_w.dtype)


torch.library.register_autograd("rgk::gate_conv_fwd", _gate_backward, setup_context=_gate_setup)


def _decode_backward(ctx, *grads):
    raise RuntimeError("rgk.ops.decode_fwd is inference-only: it has no backward")


torch.library.register_autograd("rgk::decode_fwd", _decode_backward)


# --------------------------------------------------------------------------------------------
# The functional front end
# --------------------------------------------------------------------------------------------

def fft_c2c(x: torch.Tensor) -> torch.Tensor:
    """``torch.fft.fft(x, dim=-1)`` for complex64/complex128 ``x`` of power-of-two length."""
    if not _is_compiling():
        y = _rgk.fft_c2c(x, True)
        if y is not None:
            return y
    return torch.ops.rgk.fft_c2c(x)


def mhc_post(x_layer_out, h_post, x_res) -> torch.Tensor:
    """MHCPostFwd: ``x_out[β, i·c + j] = bf16(h_post[β, i]·x_layer_out[β, j] + x_res[β, i·c + j])``."""
    if not _is_compiling():
        out = _rgk.mhc_post(x_layer_out, h_post, x_res, True)
        if out is not None:
            return out
    return torch.ops.rgk.mhc_post(x_layer_out, h_post, x_res)


def mhc_pre(phi, x, b, alpha_pre=1.0, alpha_post=1.0, alpha_res=1.0, sinkhorn_repeat=1,
            sinkhorn_eps=0.02):
    """MHCPreFwd → ``(x_res, x_layer, h_post)``."""
    if not _is_compiling():
        out = _rgk.mhc_pre(phi, x, b, alpha_pre, alpha_post, alpha_res, int(sinkhorn_repeat),
                           sinkhorn_eps, True)
        if out is not None:
            return out
    return torch.ops.rgk.mhc_pre(phi, x, b, float(alpha_pre), float(alpha_post), float(alpha_res),
                                 int(sinkhorn_repeat), float(sinkhorn_eps))


def mhc_post_pre(x_layer_out, h_post, x_res, phi, b, alpha_pre=1.0, alpha_post=1.0,
                 alpha_res=1.0, sinkhorn_repeat=1, sinkhorn_eps=0.02):
    """MHCPostPreFwd, an mHC layer boundary: ``mhc_post`` of layer L, then ``mhc_pre`` of
    layer L+1 on its output, in two kernels → ``(x_out, x_res, x_layer, h_post)``; bitwise the
    two ops' outputs."""
    if not _is_compiling():
        out = _rgk.mhc_post_pre(x_layer_out, h_post, x_res, phi, b, alpha_pre, alpha_post,
                                alpha_res, int(sinkhorn_repeat), sinkhorn_eps, True)
        if out is not None:
            return out
    return torch.ops.rgk.mhc_post_pre(x_layer_out, h_post, x_res, phi, b, float(alpha_pre),
                                      float(alpha_post), float(alpha_res), int(sinkhorn_repeat),
                                      float(sinkhorn_eps))


def gate_conv_fwd(h, k, v, rms_w_h, rms_w_v, conv_w):
    """EngramGateConvFwd → ``(y, vhat, alpha, rrms_h, rrms_k, rrms_v)``; differentiable
    through ``y``."""
    if not _is_compiling():
        out = _rgk.gate_conv_fwd(h, k, v, rms_w_h, rms_w_v, conv_w, True)
        if out is not None:
            return out
    return torch.ops.rgk.gate_conv_fwd(h, k, v, rms_w_h, rms_w_v, conv_w)


def gate_conv_bwd(dy, h, k, v, rms_w_h, rms_w_v, conv_w, alpha, rrms_h, rrms_k):
    """EngramGateConvBwd → ``(dh, dk, dv, drms_w_h, drms_w_v, dconv_w)`` (weight gradients
    f32)."""
    args = (dy, h, k, v, rms_w_h, rms_w_v, conv_w, alpha, rrms_h, rrms_k)
    if not _is_compiling():
        out = _rgk.gate_conv_bwd(*args, True)
        if out is not None:
            return out
    return torch.ops.rgk.gate_conv_bwd(*args)


def decode_fwd(e_t, h_t, conv_state, w_k, w_v, rms_w_h, rms_w_v, conv_w, dilation=1, eps=1e-6):
    """EngramDecodeFwd, one step → ``(y_t, new_conv_state)`` (inference only)."""
    tensors = (e_t, h_t, conv_state, w_k, w_v, rms_w_h, rms_w_v, conv_w)
    if not _is_compiling():
        out = _rgk.decode_fwd(*tensors, int(dilation), eps, True)
        if out is not None:
            return out
    return torch.ops.rgk.decode_fwd(*tensors, int(dilation), float(eps))
