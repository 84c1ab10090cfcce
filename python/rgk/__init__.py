"""rgk: pure-Rust GPU kernels (batched complex FFT, mHC pre/post, Engram gated conv and decode)
as PyTorch operators, and the fused mHC layer transition (``ops.mhc_post_pre``).

    import torch, rgk
    x = torch.randn(64, 4096, dtype=torch.complex64, device="cuda")
    y = rgk.ops.fft_c2c(x)          # == torch.fft.fft(x)

``rgk.ops`` is the functional front end (``torch.ops.rgk.*`` underneath: torch.compile, CUDA
graphs and autograd work through it); the classes below take TileOPs 0.1.0's constructor and
call signatures, so ``from tileops... import MHCPreFwdOp`` becomes ``from rgk import MHCPreFwdOp``.
"""
from . import _rgk, ops
from ._classes import (EngramDecodeFwdOp, EngramGateConvBwdOp, EngramGateConvFwdOp,
                       FFTC2CFwdOp, MHCPostFwdOp, MHCPostPreFwdOp, MHCPreFwdOp)

cuda_available = _rgk.cuda_available

__all__ = ["ops", "cuda_available", "FFTC2CFwdOp", "MHCPreFwdOp", "MHCPostFwdOp", "MHCPostPreFwdOp",
           "EngramGateConvFwdOp", "EngramGateConvBwdOp", "EngramDecodeFwdOp"]
