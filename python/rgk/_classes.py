"""Op classes with TileOPs 0.1.0's constructors and call signatures, on rgk's kernels. Inputs
are made contiguous as TileOPs does; everything else is validated by the native module."""
import torch

from . import ops

# The gate conv's rmsnorm epsilon is fixed in its kernels (docs/ops.md §4).
_GATE_EPS = 1e-6


class _Op(torch.nn.Module):
    def __init__(self, *, target=None):
        super().__init__()
        if target is not None:
            raise ValueError("invalid `target`: rgk has one set of kernels (leave it None)")


class FFTC2CFwdOp(_Op):
    """``torch.fft.fft`` over the last axis (complex64/complex128, power-of-two length)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return ops.fft_c2c(input.contiguous())


class MHCPreFwdOp(_Op):
    """MHCPreFwd → ``(x_res, x_layer, h_post)``."""

    def __init__(self, alpha_pre, alpha_post, alpha_res, sinkhorn_repeat, sinkhorn_eps=0.02,
                 *, target=None):
        super().__init__(target=target)
        self.alpha_pre, self.alpha_post, self.alpha_res = alpha_pre, alpha_post, alpha_res
        self.sinkhorn_repeat, self.sinkhorn_eps = sinkhorn_repeat, sinkhorn_eps

    def forward(self, phi, x, b):
        return ops.mhc_pre(phi.contiguous(), x.contiguous(), b.contiguous(), self.alpha_pre,
                           self.alpha_post, self.alpha_res, self.sinkhorn_repeat,
                           self.sinkhorn_eps)


class MHCPostFwdOp(_Op):
    """MHCPostFwd → ``x_out``."""

    def forward(self, x_layer_out, h_post, x_res):
        return ops.mhc_post(x_layer_out.contiguous(), h_post.contiguous(), x_res.contiguous())


class MHCPostPreFwdOp(MHCPreFwdOp):
    """MHCPostPreFwd (rgk's own; TileOPs has no fused transition): ``MHCPostFwdOp`` of layer L,
    then ``MHCPreFwdOp`` of layer L+1 on its output, the pre half's constructor →
    ``(x_out, x_res, x_layer, h_post)``."""

    def forward(self, x_layer_out, h_post, x_res, phi, b):
        return ops.mhc_post_pre(x_layer_out.contiguous(), h_post.contiguous(), x_res.contiguous(),
                                phi.contiguous(), b.contiguous(), self.alpha_pre, self.alpha_post,
                                self.alpha_res, self.sinkhorn_repeat, self.sinkhorn_eps)


def _check_gate_eps(eps):
    if eps != _GATE_EPS:
        raise ValueError(f"invalid `eps`: rgk's gate conv kernels use {_GATE_EPS}, got {eps}")


class EngramGateConvFwdOp(_Op):
    """EngramGateConvFwd → ``(Y, vhat, alpha, rrms_h, rrms_k, rrms_v)``."""

    def __init__(self, eps=1e-6, *, target=None):
        super().__init__(target=target)
        _check_gate_eps(eps)
        self.eps = eps

    def forward(self, H, k, v, rms_w_h, rms_w_v, conv_w):
        return ops.gate_conv_fwd(*(t.contiguous() for t in (H, k, v, rms_w_h, rms_w_v, conv_w)))


class EngramGateConvBwdOp(_Op):
    """EngramGateConvBwd → ``(dH, dk, dv, drms_w_h, drms_w_v, dconv_w)``. ``vhat`` and
    ``rrms_v`` are accepted for TileOPs' signature; rgk's backward recomputes them."""

    def __init__(self, eps=1e-6, *, target=None):
        super().__init__(target=target)
        _check_gate_eps(eps)
        self.eps = eps

    def forward(self, dY, H, k, v, rms_w_h, rms_w_v, conv_w, vhat, alpha, rrms_h, rrms_k,
                rrms_v):
        return ops.gate_conv_bwd(*(t.contiguous() for t in (dY, H, k, v, rms_w_h, rms_w_v,
                                                           conv_w, alpha, rrms_h, rrms_k)))


class EngramDecodeFwdOp(_Op):
    """EngramDecodeFwd, one step → ``(y_t, new_conv_state)``; a ``conv_state`` shorter than
    ``max_conv_len`` is left-padded with zeros, as TileOPs does."""

    def __init__(self, max_conv_len, conv_kernel_size, dilation, eps=1e-6, *, target=None):
        super().__init__(target=target)
        self.max_conv_len, self.conv_kernel_size = max_conv_len, conv_kernel_size
        self.dilation, self.eps = dilation, eps

    def forward(self, e_t, h_t, conv_state, W_K, W_V, rms_w_h, rms_w_v, conv_w):
        if conv_w.dim() != 2 or conv_w.shape[0] != self.conv_kernel_size:
            raise ValueError(f"invalid `conv_w`: shape {list(conv_w.shape)}, expected "
                             f"[{self.conv_kernel_size}, d]")
        if conv_state.dim() == 3 and conv_state.shape[1] < self.max_conv_len:
            pad = self.max_conv_len - conv_state.shape[1]
            conv_state = torch.nn.functional.pad(conv_state, (0, 0, pad, 0))
        elif conv_state.dim() == 3 and conv_state.shape[1] != self.max_conv_len:
            raise ValueError(f"invalid `conv_state`: {conv_state.shape[1]} steps, more than "
                             f"max_conv_len = {self.max_conv_len}")
        return ops.decode_fwd(*(t.contiguous() for t in (e_t, h_t, conv_state, W_K, W_V,
                                                         rms_w_h, rms_w_v, conv_w)),
                              dilation=self.dilation, eps=self.eps)
