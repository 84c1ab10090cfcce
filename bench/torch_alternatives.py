#!/usr/bin/env python3
"""Time the PyTorch "alternatives" of the project's six ops and report their error.

Contract: the op definitions and the measurement method of the project's
README ("Benchmark method").

Usage::

    python3 bench/torch_alternatives.py --manifest DIR/manifest.json \
        --out DIR/alternatives.json [--min-calls 50] [--max-calls 200] \
        [--budget-s 2.0] [--only OP[,OP...]] [--device cuda|cpu] [--skip-compile]
        [--skip-tileops]

Input (written by the Rust bench):
  manifest.json = {"entries": [{"op", "workload", "dtype", "file", "params"}]},
  ``file`` relative to the manifest's folder.  Each safetensors file holds the
  op's inputs under the names of docs/ops.md plus f64 reference outputs named
  ``ref.<output>`` (any of them may be missing; errors are computed only for
  outputs with a ref).  Complex tensors (FFT) are stored as their real view
  ``[..., 2]`` (f32 for c64, f64 for c128).

Alternatives (per op):
  FFTC2CFwd           torch-cufft (torch.fft.fft(x, dim=-1)), torch-compile
  EngramGateConvBwd   torch (autograd on the f32 forward, q = identity),
                      torch-compile (same with the forward torch.compile'd)
  every other op      torch-ref (eager composition of the formulas of docs/ops.md, f32
                      math, rounding to the storage dtype where docs/ops.md says q),
                      torch-compile (torch.compile of the same function)
  tileops             every op: TileOPs 0.1.0 (the peer, PyPI ``tileops``), its op
                      classes called as its README shows, when the package imports
                      (``cargo xtask peers`` packs it for a GPU machine without a
                      network); otherwise one line says why and the others run.
                      Its first call per op and shape JIT-compiles (3-14 s, cached by
                      TileLang) and is never timed.  Its error is compared with the
                      eager alternative's (or, if that failed, another torch one's):
                      a row whose worst rel_l2 over its outputs is over
                      MISMATCH_FACTOR times that one's and over the dtype's
                      MISMATCH_FLOOR, or that has a non-finite output, is marked
                      "mismatch" (a different function, not a rounding difference):
                      still timed and shown, never the fastest.  The check is per
                      row (worst output against worst output); each output's error
                      is in the row's "errors".  TileOPs gets its own copies of the
                      inputs.
  rgk-torch           every op: our kernels through rgk's own Python package
                      (python/, the TileOPs-compatible classes over torch.library
                      operators), when it imports: timed like an alternative, never
                      counted as one (it is us); its row also has "host_us", the host
                      time of one eager call (200 calls in a tight loop, one
                      synchronisation), measured for every entry before the CUPTI
                      subscriber starts; so has TileOPs' row, measured the same way
                      after rgk's.
  torch.compile runs with its default config (dynamic=False, dynamo reset per
  entry).  Note inductor's default elides f32 -> 16-bit -> f32 round trips
  (emulate_precision_casts=False), so the compiled rows may skip the
  internal q(...); that shows in their error columns.

Timing (CUDA only): device time from CUPTI kernel records, collected by a plain
CUPTI activity subscriber (ctypes, concurrent-kernel records), the Rust
bench's method: before every timed call a 256 MiB int32 buffer is rewritten
with ``bitwise_not_`` (flushes the 60 MB L2), then a synchronize and a forced
CUPTI flush (its records dropped), the call, a synchronize and a forced flush:
the records delivered then are the call's kernels, and its device time is the
length of the union of their [start, end) intervals.  torch.profiler is not
used: one profiler session over many calls delivers the records only at its
end, and the same kernels measure 0.1-0.4 us longer that way.  Each
implementation gets N calls, min-calls <= N <= max-calls,
N limited by --budget-s of wall time; the implementations of an op are timed
in forward then reverse order (half of the calls each pass), samples pooled.
Warm-up (compilation, plan creation, allocation) is never timed.

Errors: rel_l2 = ||out - ref||_2 / ||ref||_2 and max_abs, in float64 on the
CPU (complex compared as the [..., 2] real view).  Before an alternative is
timed, each of its outputs must have the row's dtype (complex64/complex128 for
c64/c128, the 16-bit dtype for 16-bit outputs, float32 for the f32 outputs:
h_post, alpha, rrms_*, drms_w_*, dconv_w) and exactly the reference's shape;
otherwise the row records the error and is not timed.  A row reports the worst
(max) over its outputs and a per-output dict; non-finite values are written
as null and listed under "nonfinite_outputs".

Output alternatives.json =
  {"torch", "gpu", "device", "rows": [{"op", "workload", "dtype", "impl",
   "ms", "p10_ms", "p90_ms", "calls", "kernels_per_call", "rel_l2_err",
   "max_abs_err", "errors": {output: {"rel_l2_err", "max_abs_err"}},
   "warmup_first_s" (wall time of set-up + first call, i.e. compile),
   ["error"], ["mismatch"], ["nonfinite_outputs"]}], "tileops": version or null,
   "tileops_unavailable": reason or null}
"dtype" is the manifest entry's; it tells apart workloads that share a name
(FFT throughput-4k exists in c64 and c128).  The file is rewritten after every
manifest entry, so a crash keeps what was done.  One failing alternative records "error" in its row and the run goes on.  With
``--device cpu`` nothing is timed (ms = null): each alternative runs once and
only its errors are reported.  Exit status is 0 unless the manifest cannot be
read.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import json
import math
import os
import sys
import time
import traceback
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F

FLUSH_BYTES = 256 * 1024 * 1024

Outputs = Dict[str, torch.Tensor]


# --------------------------------------------------------------------------
# The ops, written from the formulas of docs/ops.md (f32 math; q = cast to storage dtype)
# --------------------------------------------------------------------------


def _rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """rmsnorm over the last axis, f32: returns (x*rrms*w, rrms squeezed)."""
    rrms = torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + eps)
    return x * rrms * w, rrms.squeeze(-1)


def fft_c2c_fwd(x: torch.Tensor) -> torch.Tensor:
    """docs/ops.md §1: unnormalised forward FFT along the last axis."""
    return torch.fft.fft(x, dim=-1)


def make_mhc_pre_fwd(n: int, c: int, alpha_pre: float, alpha_post: float, alpha_res: float,
                     sinkhorn_repeat: int, sinkhorn_eps: float) -> Callable:
    """docs/ops.md §2.  Returns fn(phi, x, b) -> (x_res, x_layer, h_post)."""

    def mhc_pre_fwd(phi: torch.Tensor, x: torch.Tensor, b: torch.Tensor):
        B = x.shape[0]
        xf = x.float()                                                    # [B, n*c]
        r = xf.square().sum(dim=-1, keepdim=True).sqrt() / math.sqrt(n * c) + 1e-4  # [B, 1]
        h = xf @ phi                                                      # [B, n*n+2n]
        h_pre = torch.sigmoid(alpha_pre * h[:, :n] / r + b[:n])           # [B, n]
        h_post = 2.0 * torch.sigmoid(alpha_post * h[:, n:2 * n] / r + b[n:2 * n])
        R = (alpha_res * h[:, 2 * n:] / r + b[2 * n:]).reshape(B, n, n)
        R = R - R.amax(dim=-1, keepdim=True)
        R = R.exp()
        for _ in range(sinkhorn_repeat):
            R = R / (R.sum(dim=-1, keepdim=True) + sinkhorn_eps)          # rows
            R = R / (R.sum(dim=-2, keepdim=True) + sinkhorn_eps)          # columns
        xv = xf.reshape(B, n, c)
        x_res = (R @ xv).to(x.dtype).reshape(B, n * c)
        x_layer = (h_pre.unsqueeze(1) @ xv).squeeze(1).to(x.dtype)
        return x_res, x_layer, h_post

    return mhc_pre_fwd


def mhc_post_fwd(x_layer_out: torch.Tensor, h_post: torch.Tensor, x_res: torch.Tensor):
    """docs/ops.md §3: x_out[b, i*c+j] = q(h_post[b,i] * x_layer_out[b,j] + x_res[b,i*c+j])."""
    B, n = h_post.shape
    c = x_layer_out.shape[1]
    out = h_post.unsqueeze(-1) * x_layer_out.float().unsqueeze(1) + x_res.float().reshape(B, n, c)
    return out.to(x_res.dtype).reshape(B, n * c)


def make_mhc_post_pre_fwd(pre: Callable) -> Callable:
    """docs/ops.md §7: the post half, then the pre half `pre` (``make_mhc_pre_fwd``) of its
    output.  Returns fn(x_layer_out, h_post, x_res, phi, b) -> (x_out, x_res, x_layer, h_post)."""

    def mhc_post_pre_fwd(x_layer_out, h_post, x_res, phi, b):
        x_out = mhc_post_fwd(x_layer_out, h_post, x_res)
        return (x_out, *pre(phi, x_out, b))

    return mhc_post_pre_fwd


def engram_gate_conv_fwd(H, k, v, rms_w_h, rms_w_v, conv_w, eps: float):
    """docs/ops.md §4.  Storage dtype = H.dtype; with f32 inputs every q is the identity
    (that is the forward docs/ops.md §5 differentiates).  Returns
    (Y, vhat, alpha, rrms_h, rrms_k, rrms_v)."""
    dt = H.dtype
    d = H.shape[-1]
    T = H.shape[-2]
    wh = rms_w_h.float()
    wv = rms_w_v.float()
    cw = conv_w.float()
    hn, rrms_h = _rmsnorm(H.float(), wh, eps)
    kn, rrms_k = _rmsnorm(k.float(), wh, eps)
    alpha = torch.sigmoid((hn * kn).sum(dim=-1) / math.sqrt(d))           # [M, T]
    vh = alpha.unsqueeze(-1) * v.float()
    vhat = vh.to(dt)
    u, rrms_v = _rmsnorm(vhat.float(), wv, eps)
    up = F.pad(u, (0, 0, 3, 0))                                           # u = 0 before t = 0
    conv = cw[0] * up[..., 0:T, :]
    for p in range(1, 4):
        conv = conv + cw[p] * up[..., p:p + T, :]
    Y = (F.silu(conv) + vh).to(dt)
    return Y, vhat, alpha, rrms_h, rrms_k, rrms_v


def make_engram_gate_conv_fwd(eps: float) -> Callable:
    def fn(H, k, v, rms_w_h, rms_w_v, conv_w):
        return engram_gate_conv_fwd(H, k, v, rms_w_h, rms_w_v, conv_w, eps)
    return fn


def make_engram_gate_conv_fwd_y(eps: float) -> Callable:
    """Forward returning only Y, for autograd (docs/ops.md §5)."""
    def fn(H, k, v, rms_w_h, rms_w_v, conv_w):
        return engram_gate_conv_fwd(H, k, v, rms_w_h, rms_w_v, conv_w, eps)[0]
    return fn


def make_engram_decode_fwd(L: int, dilation: int, K: int, eps: float) -> Callable:
    """docs/ops.md §6.  Returns fn(e_t, h_t, conv_state, W_K, W_V, rms_w_h, rms_w_v, conv_w)
    -> (y_t, new_conv_state)."""

    def engram_decode_fwd(e_t, h_t, conv_state, W_K, W_V, rms_w_h, rms_w_v, conv_w):
        dt = h_t.dtype
        d = h_t.shape[-1]
        ef = e_t.float()
        kk = ef @ W_K.float()
        vv = ef @ W_V.float()
        wh = rms_w_h.float()
        wv = rms_w_v.float()
        cw = conv_w.float()
        hn, _ = _rmsnorm(h_t.float(), wh, eps)
        kn, _ = _rmsnorm(kk.to(dt).float(), wh, eps)
        alpha = torch.sigmoid((hn * kn).sum(dim=-1, keepdim=True) / math.sqrt(d))
        vh = alpha * vv
        u, _ = _rmsnorm(vh.to(dt).float(), wv, eps)
        conv = cw[K - 1] * u
        for p in range(K - 1):
            conv = conv + cw[p] * conv_state[:, L - (K - 1 - p) * dilation, :].float()
        y_t = (F.silu(conv) + vh).to(dt)
        new_conv_state = torch.cat([conv_state[:, 1:, :], u.to(dt).unsqueeze(1)], dim=1)
        return y_t, new_conv_state

    return engram_decode_fwd


# --------------------------------------------------------------------------
# Alternatives: each builder returns [(impl_name, factory)], where factory()
# sets up (outside any timing) and returns call() -> {output_name: tensor}.
# --------------------------------------------------------------------------

OUTPUTS = {
    "FFTC2CFwd": ["y"],
    "MHCPreFwd": ["x_res", "x_layer", "h_post"],
    "MHCPostFwd": ["x_out"],
    "MHCPostPreFwd": ["x_out", "x_res", "x_layer", "h_post"],
    "EngramGateConvFwd": ["Y", "vhat", "alpha", "rrms_h", "rrms_k", "rrms_v"],
    "EngramGateConvBwd": ["dH", "dk", "dv", "drms_w_h", "drms_w_v", "dconv_w"],
    "EngramDecodeFwd": ["y_t", "new_conv_state"],
}


def _compile(fn: Callable) -> Callable:
    # One static-shape compile per workload (dynamo is reset per entry).
    return torch.compile(fn, dynamic=False)


def _named_call(f: Callable, args: Sequence[torch.Tensor], names: Sequence[str]) -> Callable:
    """call() running f(*args) and naming its outputs (a lone tensor is the first output)."""
    def call() -> Outputs:
        out = f(*args)
        if isinstance(out, torch.Tensor):
            out = (out,)
        return dict(zip(names, out))
    return call


def _plain_alternatives(op: str, fn: Callable, args: Sequence[torch.Tensor],
                        eager_name: str, skip_compile: bool):
    names = OUTPUTS[op]

    def factory(f):
        def make():
            return _named_call(f, args, names)
        return make

    alts = [(eager_name, factory(fn))]
    if not skip_compile:
        alts.append(("torch-compile", factory(_compile(fn))))
    return alts


def _bwd_alternatives(t: Dict[str, torch.Tensor], params: dict, skip_compile: bool):
    eps = float(params.get("eps", 1e-6))
    dt = t["H"].dtype

    def factory(compiled: bool):
        def make():
            fwd = make_engram_gate_conv_fwd_y(eps)
            if compiled:
                fwd = _compile(fwd)
            leaves = [t[name].float().detach().requires_grad_(True)
                      for name in ("H", "k", "v", "rms_w_h", "rms_w_v", "conv_w")]
            dY = t["dY"].float()
            Y = fwd(*leaves)  # forward once, outside the timed region

            def call() -> Outputs:
                g = torch.autograd.grad(Y, leaves, dY, retain_graph=True)
                return {"dH": g[0].to(dt), "dk": g[1].to(dt), "dv": g[2].to(dt),
                        "drms_w_h": g[3].float(), "drms_w_v": g[4].float(),
                        "dconv_w": g[5].float()}
            return call
        return make

    alts = [("torch", factory(False))]
    if not skip_compile:
        alts.append(("torch-compile", factory(True)))
    return alts


def build_alternatives(op: str, t: Dict[str, torch.Tensor], params: dict, skip_compile: bool,
                       tileops: Optional[dict] = None, rgk_torch: Optional[dict] = None):
    """t: the entry's input tensors, already on the target device; `tileops`: TileOPs' op
    classes (``load_tileops``) or None; `rgk_torch`: rgk's package classes
    (``load_rgk_torch``) or None.  The eager alternative comes first."""
    alts = torch_alternatives(op, t, params, skip_compile)
    if tileops is not None:
        alts.append(tileops_alternative(op, t, params, tileops))
    if rgk_torch is not None and op in RGK_TORCH_OPS:
        alts.append(class_alternative(RGK_TORCH_NAME, op, t, params, rgk_torch))
    return alts


def torch_alternatives(op: str, t: Dict[str, torch.Tensor], params: dict, skip_compile: bool):
    if op == "FFTC2CFwd":
        # clone: a fresh complex tensor, not a view (dynamo fails to replay the
        # view_as_complex of a safetensors-loaded tensor)
        x = torch.view_as_complex(t["x"].contiguous()).clone()
        return _plain_alternatives(op, fft_c2c_fwd, [x], "torch-cufft", skip_compile)
    if op == "MHCPreFwd":
        phi, x, b = t["phi"], t["x"], t["b"]
        n = int(params.get("n", 0)) or int(round(math.sqrt(phi.shape[1] + 1) - 1))
        c = int(params.get("c", 0)) or x.shape[1] // n
        fn = make_mhc_pre_fwd(n, c, float(params.get("alpha_pre", 1.0)),
                              float(params.get("alpha_post", 1.0)),
                              float(params.get("alpha_res", 1.0)),
                              int(params.get("sinkhorn_repeat", 1)),
                              float(params.get("sinkhorn_eps", 0.02)))
        return _plain_alternatives(op, fn, [phi, x, b], "torch-ref", skip_compile)
    if op == "MHCPostFwd":
        return _plain_alternatives(op, mhc_post_fwd, [t["x_layer_out"], t["h_post"], t["x_res"]],
                                   "torch-ref", skip_compile)
    if op == "MHCPostPreFwd":
        phi = t["phi"]
        n = int(params.get("n", 0)) or int(round(math.sqrt(phi.shape[1] + 1) - 1))
        c = int(params.get("c", 0)) or t["x_layer_out"].shape[1]
        pre = make_mhc_pre_fwd(n, c, float(params.get("alpha_pre", 1.0)),
                               float(params.get("alpha_post", 1.0)),
                               float(params.get("alpha_res", 1.0)),
                               int(params.get("sinkhorn_repeat", 1)),
                               float(params.get("sinkhorn_eps", 0.02)))
        args = [t[k] for k in ("x_layer_out", "h_post", "x_res", "phi", "b")]
        return _plain_alternatives(op, make_mhc_post_pre_fwd(pre), args, "torch-ref", skip_compile)
    if op == "EngramGateConvFwd":
        fn = make_engram_gate_conv_fwd(float(params.get("eps", 1e-6)))
        args = [t[k] for k in ("H", "k", "v", "rms_w_h", "rms_w_v", "conv_w")]
        return _plain_alternatives(op, fn, args, "torch-ref", skip_compile)
    if op == "EngramGateConvBwd":
        return _bwd_alternatives(t, params, skip_compile)
    if op == "EngramDecodeFwd":
        K = int(params.get("kernel_size", t["conv_w"].shape[0]))
        L = int(params.get("max_conv_len", t["conv_state"].shape[1]))
        fn = make_engram_decode_fwd(L, int(params.get("dilation", 1)), K,
                                    float(params.get("eps", 1e-6)))
        args = [t[k] for k in ("e_t", "h_t", "conv_state", "W_K", "W_V",
                               "rms_w_h", "rms_w_v", "conv_w")]
        return _plain_alternatives(op, fn, args, "torch-ref", skip_compile)
    raise ValueError(f"unknown op {op!r}")


# --------------------------------------------------------------------------
# TileOPs 0.1.0, the peer: its op classes on the same inputs
# --------------------------------------------------------------------------

TILEOPS_NAME = "tileops"
# A row whose worst rel_l2 exceeds both MISMATCH_FACTOR x the torch alternative's and the
# row dtype's floor computes a different function: TileOPs' own rounding choices stay well
# inside (measured on the 27 seed rows: at most 1.8x). The floors sit far above each storage
# type's rounding noise and far below what a different formula gives.
MISMATCH_FACTOR = 10.0
MISMATCH_FLOOR = {"c64": 1e-5, "c128": 1e-13, "f16": 1e-3, "bf16": 8e-3}


def load_tileops():
    """Returns (namespace of TileOPs' op classes, version, None) or (None, None, reason)."""
    try:
        import importlib.metadata as md
        from tileops.fft import FFTC2CFwdOp
        from tileops.sequence_modeling import (EngramDecodeFwdOp, EngramGateConvBwdOp,
                                               EngramGateConvFwdOp, MHCPostFwdOp, MHCPreFwdOp)
        try:
            version = md.version("tileops")
        except Exception:
            version = "unknown"
    except BaseException as exc:  # ImportError, or a native library failing to load
        return None, None, _short_error(exc)
    ops = dict(FFTC2CFwdOp=FFTC2CFwdOp, MHCPreFwdOp=MHCPreFwdOp, MHCPostFwdOp=MHCPostFwdOp,
               EngramGateConvFwdOp=EngramGateConvFwdOp, EngramGateConvBwdOp=EngramGateConvBwdOp,
               EngramDecodeFwdOp=EngramDecodeFwdOp)
    return ops, version, None


def tileops_alternative(op: str, t: Dict[str, torch.Tensor], params: dict, ops: dict):
    """(name, factory) calling TileOPs' class for `op` (see ``class_alternative``)."""
    return class_alternative(TILEOPS_NAME, op, t, params, ops)


def class_alternative(name: str, op: str, t: Dict[str, torch.Tensor], params: dict, ops: dict):
    """(name, factory) calling the op class for `op` from `ops` (TileOPs' classes, or rgk's
    package, which takes the same signatures) on its own copies of the entry's tensors (an op
    that wrote an input could not change what the other alternatives see).  A set-up failure is
    raised by the factory, so it becomes this row's error alone."""
    try:
        return name, _class_call(op, {k: v.clone() for k, v in t.items()}, params, ops)
    except Exception as exc:
        why = _short_error(exc)

        def failed():
            raise RuntimeError(f"{name} set-up: {why}")
        return name, failed


# rgk's own Python package (python/): our kernels called on torch tensors through
# torch.library, timed like an alternative but never counted as one (it is us).
RGK_TORCH_NAME = "rgk-torch"
# The ops the package has a class for.
RGK_TORCH_OPS = ("FFTC2CFwd", "MHCPreFwd", "MHCPostFwd", "MHCPostPreFwd", "EngramGateConvFwd",
                 "EngramGateConvBwd", "EngramDecodeFwd")


def load_rgk_torch():
    """Returns (rgk's op classes, version, None) or (None, None, reason)."""
    try:
        import importlib.metadata as md
        import rgk
        if not rgk.cuda_available():
            return None, None, "rgk: no CUDA device"
        try:
            version = md.version("rgk")
        except Exception:
            version = "unknown"
    except BaseException as exc:
        return None, None, _short_error(exc)
    ops = {name: getattr(rgk, name) for name in (
        "FFTC2CFwdOp", "MHCPreFwdOp", "MHCPostFwdOp", "MHCPostPreFwdOp", "EngramGateConvFwdOp",
        "EngramGateConvBwdOp", "EngramDecodeFwdOp")}
    return ops, version, None


def _class_call(op: str, t: Dict[str, torch.Tensor], params: dict, ops: dict):
    """make() → call() running the op class for `op` from `ops` (TileOPs' signatures)."""
    names = OUTPUTS[op]
    eps = float(params.get("eps", 1e-6))
    if op == "FFTC2CFwd":
        x = torch.view_as_complex(t["x"].contiguous()).clone()
        make_op, args = (lambda: ops["FFTC2CFwdOp"]()), [x]
    elif op == "MHCPreFwd":
        make_op = lambda: ops["MHCPreFwdOp"](float(params.get("alpha_pre", 1.0)),
                                             float(params.get("alpha_post", 1.0)),
                                             float(params.get("alpha_res", 1.0)),
                                             int(params.get("sinkhorn_repeat", 1)),
                                             float(params.get("sinkhorn_eps", 0.02)))
        args = [t["phi"], t["x"], t["b"]]
    elif op == "MHCPostFwd":
        make_op, args = (lambda: ops["MHCPostFwdOp"]()), [t["x_layer_out"], t["h_post"], t["x_res"]]
    elif op == "MHCPostPreFwd":
        # The fused class where the package has one (rgk), else the post and pre classes back to
        # back (TileOPs has no fused transition).
        def make_op():
            pre_params = (float(params.get("alpha_pre", 1.0)), float(params.get("alpha_post", 1.0)),
                          float(params.get("alpha_res", 1.0)), int(params.get("sinkhorn_repeat", 1)),
                          float(params.get("sinkhorn_eps", 0.02)))
            if "MHCPostPreFwdOp" in ops:
                return ops["MHCPostPreFwdOp"](*pre_params)
            post = ops["MHCPostFwdOp"]()
            pre = ops["MHCPreFwdOp"](*pre_params)

            def post_pre(x_layer_out, h_post, x_res, phi, b):
                x_out = post(x_layer_out, h_post, x_res).reshape(x_res.shape)
                return (x_out, *pre(phi, x_out, b))
            return post_pre
        args = [t[k] for k in ("x_layer_out", "h_post", "x_res", "phi", "b")]
    elif op == "EngramGateConvFwd":
        make_op = lambda: ops["EngramGateConvFwdOp"](eps)
        args = [t[k] for k in ("H", "k", "v", "rms_w_h", "rms_w_v", "conv_w")]
    elif op == "EngramGateConvBwd":
        # vhat, alpha, rrms_* are what a forward saves; the bench exports them from the f64
        # forward reference (vhat rounded to the dtype), the same values our backward reads.
        make_op = lambda: ops["EngramGateConvBwdOp"](eps)
        args = [t[k] for k in ("dY", "H", "k", "v", "rms_w_h", "rms_w_v", "conv_w", "vhat",
                               "alpha", "rrms_h", "rrms_k", "rrms_v")]
    elif op == "EngramDecodeFwd":
        K = int(params.get("kernel_size", t["conv_w"].shape[0]))
        L = int(params.get("max_conv_len", t["conv_state"].shape[1]))
        make_op = lambda: ops["EngramDecodeFwdOp"](L, K, int(params.get("dilation", 1)), eps)
        args = [t[k] for k in ("e_t", "h_t", "conv_state", "W_K", "W_V", "rms_w_h", "rms_w_v",
                               "conv_w")]
    else:
        raise ValueError(f"unknown op {op!r}")

    def make():
        return _named_call(make_op(), args, names)

    return make


def semantic_mismatch(row: dict, eager: dict, row_dtype: Optional[str]) -> Optional[str]:
    """Why `row`'s outputs are not the op's function, judged against a torch alternative's
    error on the same inputs (`eager`); None when they are."""
    bad = sorted(name for name, e in (row.get("errors") or {}).items() if e.get("rel_l2_err") is None)
    if bad or row.get("nonfinite_outputs"):
        return "non-finite or missing error on " + ", ".join(bad or row["nonfinite_outputs"])
    ours, ref = row.get("rel_l2_err"), eager.get("rel_l2_err")
    if ours is None or ref is None:
        return None
    if ours > max(MISMATCH_FACTOR * ref, MISMATCH_FLOOR.get(row_dtype or "", 0.0)):
        worst = max((row["errors"] or {}).items(), key=lambda kv: kv[1]["rel_l2_err"] or 0.0)[0]
        return (f"rel_l2 {ours:.2e} ({worst}) against {eager.get('impl')} {ref:.2e} on the same "
                f"inputs (> {MISMATCH_FACTOR:g}x)")
    return None


# --------------------------------------------------------------------------
# Output dtype and shape: checked before an alternative's time is accepted
# --------------------------------------------------------------------------

F32_OUTPUTS = {"h_post", "alpha", "rrms_h", "rrms_k", "rrms_v", "drms_w_h", "drms_w_v", "dconv_w"}
ROW_DTYPES = {"c64": torch.complex64, "c128": torch.complex128, "f16": torch.float16,
              "bf16": torch.bfloat16}


def check_output_spec(out: Outputs, refs: Dict[str, torch.Tensor], row_dtype: Optional[str]):
    """Raises ValueError unless every referenced output exists with the row's dtype and the
    reference's shape (complex outputs: the reference holds their [..., 2] real view)."""
    want_dtype = ROW_DTYPES.get(row_dtype or "")
    for name, ref in refs.items():
        if name not in out:
            raise ValueError(f"output {name} missing")
        o = out[name]
        want = torch.float32 if name in F32_OUTPUTS else want_dtype
        if want is not None and o.dtype != want:
            raise ValueError(f"output {name}: dtype {o.dtype}, the row needs {want}")
        shape = list(o.shape) + ([2] if o.is_complex() else [])
        if shape != list(ref.shape):
            raise ValueError(f"output {name}: shape {list(o.shape)}, the reference is "
                             f"{list(ref.shape)}{' (real view)' if o.is_complex() else ''}")


# --------------------------------------------------------------------------
# Errors against the f64 reference
# --------------------------------------------------------------------------


def _finite_or_none(v: float) -> Optional[float]:
    return float(v) if math.isfinite(v) else None


def output_errors(out: Outputs, refs: Dict[str, torch.Tensor]):
    """Returns (per-output dict, worst rel_l2, worst max_abs, nonfinite names)."""
    per: Dict[str, dict] = {}
    nonfinite: List[str] = []
    worst_rel: Optional[float] = 0.0
    worst_abs: Optional[float] = 0.0
    for name, ref in refs.items():
        if name not in out:
            continue
        o = out[name].detach().to("cpu")
        if o.is_complex():
            o = torch.view_as_real(o)
        o = o.to(torch.float64)
        r = ref.to(torch.float64)
        if o.shape != r.shape:
            if o.numel() == r.numel():
                o = o.reshape(r.shape)
            else:
                per[name] = {"rel_l2_err": None, "max_abs_err": None,
                             "error": f"shape {list(o.shape)} != ref {list(r.shape)}"}
                worst_rel = worst_abs = None
                continue
        diff = o - r
        dn = float(torch.linalg.vector_norm(diff))
        rn = float(torch.linalg.vector_norm(r))
        rel = dn / rn if rn > 0 else (0.0 if dn == 0 else math.inf)
        mab = float(diff.abs().max()) if diff.numel() else 0.0
        if not bool(torch.isfinite(o).all()):
            nonfinite.append(name)
        per[name] = {"rel_l2_err": _finite_or_none(rel), "max_abs_err": _finite_or_none(mab)}
        if worst_rel is not None:
            worst_rel = None if not math.isfinite(rel) else max(worst_rel, rel)
        if worst_abs is not None:
            worst_abs = None if not math.isfinite(mab) else max(worst_abs, mab)
    if not per:
        worst_rel = worst_abs = None
    return per, worst_rel, worst_abs, nonfinite


# --------------------------------------------------------------------------
# Device timing through CUPTI kernel records
# --------------------------------------------------------------------------

# CUpti_ActivityKind: CONCURRENT_KERNEL.  Every kernel record version since 4 has
# `kind` (u32) at offset 0 and `start`, `end` (u64 ns) at offsets 16 and 24.
_CUPTI_KIND_CONCURRENT_KERNEL = 10
_CUPTI_BUFFER_BYTES = 4 << 20
_CUPTI_SONAMES = ("libcupti.so.13", "libcupti.so.12", "libcupti.so")


def kernel_interval(record_address: int) -> Optional[Tuple[int, int]]:
    """(start_ns, end_ns) of a CUPTI activity record at `record_address` if it is a kernel
    record, else None."""
    if ctypes.c_uint32.from_address(record_address).value != _CUPTI_KIND_CONCURRENT_KERNEL:
        return None
    return (ctypes.c_uint64.from_address(record_address + 16).value,
            ctypes.c_uint64.from_address(record_address + 24).value)


def _load_cupti():
    """libcupti: the one `RGK_CUPTI` names, else the copy already in the process (torch
    brings one) or the first on the library path (the Rust bench's), else the one bundled with
    torch's wheels."""
    tried = []
    candidates = [os.environ["RGK_CUPTI"]] if os.environ.get("RGK_CUPTI") else []
    candidates += list(_CUPTI_SONAMES)
    torch_site = os.path.dirname(os.path.dirname(torch.__file__))
    candidates += sorted(glob.glob(os.path.join(torch_site, "nvidia", "*", "lib", "libcupti.so*")))
    for name in candidates:
        try:
            return ctypes.CDLL(name)
        except OSError as exc:
            tried.append(f"{name}: {exc}")
    raise RuntimeError("libcupti not found (set RGK_CUPTI to its path): " + "; ".join(tried))


class KernelRecords:
    """A plain CUPTI activity subscriber (concurrent-kernel records only), the Rust bench's
    method: `drain()` forces CUPTI to deliver every pending record and returns the kernel
    intervals collected since the previous drain.

    torch.profiler is not used: one profiler session over many calls leaves the records
    undelivered between calls, and the same kernels then measure 0.1–0.4 µs longer (FFT
    spectrogram-1k 3.33 against 2.95 µs, same process, same CUPTI library, 2026-12-04)."""

    def __init__(self):
        self._lib = _load_cupti()
        self._buffers: Dict[int, object] = {}
        self._intervals: List[Tuple[int, int]] = []
        req_t = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_void_p),
                                 ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t))
        done_t = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p,
                                  ctypes.c_size_t, ctypes.c_size_t)
        # Kept on self: CUPTI holds the C function pointers for the life of the process.
        self._requested = req_t(self._buffer_requested)
        self._completed = done_t(self._buffer_completed)
        rc = self._lib.cuptiActivityRegisterCallbacks(self._requested, self._completed)
        if rc != 0:
            raise RuntimeError(f"cuptiActivityRegisterCallbacks: CUPTI error {rc}")
        rc = self._lib.cuptiActivityEnable(_CUPTI_KIND_CONCURRENT_KERNEL)
        if rc != 0:
            raise RuntimeError(f"cuptiActivityEnable(CONCURRENT_KERNEL): CUPTI error {rc}")

    def _buffer_requested(self, buffer, size, max_records):
        raw = ctypes.create_string_buffer(_CUPTI_BUFFER_BYTES + 8)
        address = (ctypes.addressof(raw) + 7) & ~7  # CUPTI wants 8-byte alignment
        self._buffers[address] = raw
        buffer[0] = address
        size[0] = _CUPTI_BUFFER_BYTES
        max_records[0] = 0

    def _buffer_completed(self, _ctx, _stream, buffer, _size, valid):
        record = ctypes.c_void_p()
        while self._lib.cuptiActivityGetNextRecord(ctypes.c_void_p(buffer),
                                                   ctypes.c_size_t(valid),
                                                   ctypes.byref(record)) == 0:
            iv = kernel_interval(record.value)
            if iv is not None:
                self._intervals.append(iv)
        self._buffers.pop(buffer, None)

    def drain(self) -> List[Tuple[int, int]]:
        rc = self._lib.cuptiActivityFlushAll(1)
        if rc != 0:
            raise RuntimeError(f"cuptiActivityFlushAll: CUPTI error {rc}")
        out, self._intervals = self._intervals, []
        return out


def union_length(intervals: Sequence[Tuple[int, int]]) -> int:
    """Length of the union of [start, end) intervals."""
    total = 0
    cur_s = cur_e = None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


class CudaTimer:
    def __init__(self, device: torch.device, records: KernelRecords, no_flush: bool = False):
        self.device = device
        self.records = records
        self.no_flush = no_flush
        self.flush_buf = torch.zeros(FLUSH_BYTES // 4, dtype=torch.int32, device=device)
        if not self.profile(lambda: torch.empty(1, device=device).fill_(1.0), 2):
            raise RuntimeError("CUPTI delivered no kernel record for a test kernel")

    def flush(self):
        # --no-flush (diagnostic): code and data may stay in L2 between calls.
        if not self.no_flush:
            self.flush_buf.bitwise_not_()

    def iteration_seconds(self, call: Callable, reps: int = 5) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            self.flush()
            torch.cuda.synchronize()
            call()
            torch.cuda.synchronize()
        return (time.perf_counter() - t0) / reps

    def profile(self, call: Callable, ncalls: int) -> List[Tuple[int, int]]:
        """(device time in ns = union of the call's kernel intervals, kernel count) per call:
        flush, synchronize, drain, call, synchronize, drain — as the Rust bench."""
        calls = []
        for _ in range(ncalls):
            self.flush()
            torch.cuda.synchronize()
            self.records.drain()
            call()
            torch.cuda.synchronize()
            recs = self.records.drain()
            if not recs:
                raise RuntimeError("CUPTI delivered no kernel record for a timed call")
            calls.append((union_length(recs), len(recs)))
        return calls


# --------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------


def _short_error(exc: BaseException) -> str:
    msg = f"{type(exc).__name__}: {exc}".strip()
    lines = [ln for ln in msg.splitlines() if ln.strip()]
    msg = " | ".join(lines[:3])
    return msg[:500]


def _sync(device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def _base_row(entry: dict, impl: Optional[str]) -> dict:
    return {"op": entry.get("op"), "workload": entry.get("workload"), "dtype": entry.get("dtype"),
            "impl": impl, "ms": None, "p10_ms": None, "p90_ms": None, "calls": 0,
            "kernels_per_call": None, "rel_l2_err": None, "max_abs_err": None, "errors": {}}


def _entry_key(entry: dict) -> Tuple[Optional[str], Optional[str], Optional[str]]:
    return entry.get("op"), entry.get("workload"), entry.get("dtype")


def _load_package(skip: bool, flag: str, device: torch.device, load):
    """`load()` (a package's (ops, version, None) or (None, None, reason)) unless the package
    is skipped by `flag` or there is no CUDA device."""
    if skip:
        return None, None, flag
    if device.type != "cuda":
        return None, None, "no CUDA device"
    return load()


def load_entry(entry: dict, base_dir: str, device: torch.device):
    """(inputs on `device`, f64 references by output name) of a manifest entry: its safetensors
    file (relative to `base_dir`), the references stored as ``ref.NAME``."""
    from safetensors.torch import load_file

    tensors = load_file(os.path.join(base_dir, entry["file"]), device="cpu")
    refs = {k[len("ref."):]: v for k, v in tensors.items() if k.startswith("ref.")}
    inputs = {k: v.to(device) for k, v in tensors.items() if not k.startswith("ref.")}
    return inputs, refs


def package_host_times(entries: Sequence[dict], base_dir: str, device: torch.device,
                       name: str, ops: dict) -> Dict[tuple, float]:
    """Host time of one eager call through a Python package's op classes (`ops`: rgk's or
    TileOPs') in µs per entry: 20 warm-up calls (TileOPs compiles its kernels there), then the
    time to issue 200 calls in a tight loop, taken before the synchronisation that follows it
    (with the synchronisation a row whose device time exceeds its host time, scientific-1m,
    measured its device time).  Measured before the CUPTI subscriber starts, so no profiler
    cost is charged to the package (a torch.profiler session left torch's allocations about
    3x slower for the process: empty_like 1.8 -> 5.5 us on the H200).  rgk's are measured
    before TileOPs is imported."""
    times = {}
    for entry in entries:
        try:
            inputs, _ = load_entry(entry, base_dir, device)
            make = class_alternative(name, entry.get("op"), inputs, entry.get("params") or {},
                                     ops)[1]
            call = make()
            for _ in range(20):
                call()
            _sync(device)
            t0, n = time.perf_counter(), 200
            for _ in range(n):
                call()
            t1 = time.perf_counter()
            _sync(device)
            times[_entry_key(entry)] = round((t1 - t0) / n * 1e6, 2)
        except Exception as exc:  # the entry's own run reports the error
            print(f"  {name} host time, {entry.get('workload')}: {_short_error(exc)}",
                  file=sys.stderr)
    return times


def run_entry(entry: dict, base_dir: str, device: torch.device, timer: Optional[CudaTimer],
              args, tileops: Optional[dict] = None, rgk_torch: Optional[dict] = None,
              host_us: Optional[Dict[str, float]] = None) -> List[dict]:
    op = entry.get("op")
    params = entry.get("params") or {}
    try:
        inputs, refs = load_entry(entry, base_dir, device)
        torch._dynamo.reset()
        alts = build_alternatives(op, inputs, params, args.skip_compile, tileops, rgk_torch)
    except Exception as exc:
        row = _base_row(entry, "setup")
        row["error"] = "setup: " + _short_error(exc)
        traceback.print_exc(file=sys.stderr)
        return [row]

    rows = {name: _base_row(entry, name) for name, _ in alts}
    calls: Dict[str, Callable] = {}
    n_calls: Dict[str, int] = {}

    # Set-up and warm-up (compilation happens here), then the errors.
    for name, make in alts:
        row = rows[name]
        try:
            t0 = time.perf_counter()
            call = make()
            out = call()
            _sync(device)
            row["warmup_first_s"] = round(time.perf_counter() - t0, 3)
            if timer is not None:
                for _ in range(2):
                    out = call()
                _sync(device)
            check_output_spec(out, refs, entry.get("dtype"))
            per, worst_rel, worst_abs, nonfinite = output_errors(out, refs)
            del out
            row.update(errors=per, rel_l2_err=worst_rel, max_abs_err=worst_abs)
            if nonfinite:
                row["nonfinite_outputs"] = nonfinite
            if timer is not None:
                it = timer.iteration_seconds(call)
                n = int(args.budget_s / max(it, 1e-9))
                n_calls[name] = max(args.min_calls, min(args.max_calls, n))
            calls[name] = call
        except Exception as exc:
            row["error"] = _short_error(exc)
            traceback.print_exc(file=sys.stderr)

    # The eager alternative, or the first other torch alternative that ran.
    packages = (TILEOPS_NAME, RGK_TORCH_NAME)
    judge = next((name for name, _ in alts if name not in packages and name in calls), None)
    for pkg in packages:
        if pkg not in calls or judge is None:
            continue
        why = semantic_mismatch(rows[pkg], rows[judge], entry.get("dtype"))
        if why:
            rows[pkg]["mismatch"] = why
            print(f"  {op} {entry.get('workload')} {entry.get('dtype')}: {pkg} mismatch: {why}",
                  file=sys.stderr)

    # Timing: forward then reverse order, half of the calls each pass.
    if timer is not None:
        samples: Dict[str, List[Tuple[int, int]]] = {name: [] for name in calls}
        order = [name for name, _ in alts if name in calls]
        for pass_idx, pass_order in enumerate((order, order[::-1])):
            for name in pass_order:
                if name not in calls:
                    continue
                total = n_calls[name]
                n = total - total // 2 if pass_idx == 0 else total // 2
                if n <= 0:
                    continue
                try:
                    samples[name].extend(timer.profile(calls[name], n))
                except Exception as exc:
                    rows[name]["error"] = "timing: " + _short_error(exc)
                    traceback.print_exc(file=sys.stderr)
                    del calls[name]
        for name, smp in samples.items():
            if name not in calls or not smp:
                continue
            t_ms = np.array([s for s, _ in smp], dtype=np.float64) / 1e6
            k = np.array([c for _, c in smp], dtype=np.float64)
            kmed = float(np.median(k))
            rows[name].update(ms=float(np.median(t_ms)), p10_ms=float(np.percentile(t_ms, 10)),
                              p90_ms=float(np.percentile(t_ms, 90)), calls=len(smp),
                              kernels_per_call=int(kmed) if kmed.is_integer() else kmed)
        for pkg, us in (host_us or {}).items():
            if pkg in calls:
                rows[pkg]["host_us"] = us
    else:
        for name in calls:
            rows[name]["calls"] = 1  # ran once, untimed

    calls.clear()
    return [rows[name] for name, _ in alts]


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def print_row(row: dict):
    line = (f"{row['op'] or '?':18s} {row['workload'] or '?':20s} {row['dtype'] or '':5s} "
            f"{row['impl'] or '-':14s} ms {_fmt(row['ms'], '.4f')} "
            f"[{_fmt(row['p10_ms'], '.4f')}..{_fmt(row['p90_ms'], '.4f')}] "
            f"n={row['calls']} k={_fmt(row['kernels_per_call'], '')} "
            f"rel_l2 {_fmt(row['rel_l2_err'], '.2e')} max_abs {_fmt(row['max_abs_err'], '.2e')}")
    if row.get("error"):
        line += f"  ERROR {row['error'][:160]}"
    if row.get("mismatch"):
        line += f"  MISMATCH {row['mismatch'][:160]}"
    print(line, flush=True)


def write_json(path: str, doc: dict):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, path)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--manifest", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--min-calls", type=int, default=50)
    ap.add_argument("--max-calls", type=int, default=200)
    ap.add_argument("--budget-s", type=float, default=2.0,
                    help="wall-time budget for the timed calls of one implementation")
    ap.add_argument("--only", default=None, help="comma-separated op names to run")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--skip-compile", action="store_true",
                    help="leave out the torch-compile alternatives (testing aid)")
    ap.add_argument("--skip-tileops", action="store_true",
                    help="leave out the TileOPs alternative")
    ap.add_argument("--skip-rgk-torch", action="store_true",
                    help="leave out rgk's own Python package (the rgk-torch column)")
    ap.add_argument("--no-flush", action="store_true",
                    help="diagnostic (rgk-bench --no-flush): no L2 flush before the timed calls")
    args = ap.parse_args(argv)
    args.max_calls = max(args.max_calls, args.min_calls)

    try:
        with open(args.manifest) as f:
            manifest = json.load(f)
        entries = manifest["entries"]
        assert isinstance(entries, list)
    except Exception as exc:
        print(f"cannot read manifest {args.manifest}: {exc}", file=sys.stderr)
        return 2
    base_dir = os.path.dirname(os.path.abspath(args.manifest))

    if args.device == "cuda" and not torch.cuda.is_available():
        print("warning: CUDA is not available; running on the CPU, untimed", file=sys.stderr)
        args.device = "cpu"
    device = torch.device(args.device)
    only = set(args.only.split(",")) if args.only else None
    entries = [e for e in entries if only is None or e.get("op") in only]

    rgk_torch, rgk_version, rgk_why = _load_package(args.skip_rgk_torch, "--skip-rgk-torch",
                                                    device, load_rgk_torch)
    print(f"rgk-torch: {rgk_version or f'not available ({rgk_why})'}", flush=True)
    # Before anything else touches the process (TileOPs' import, the CUPTI subscriber):
    # see package_host_times.
    host_us = {RGK_TORCH_NAME: package_host_times(entries, base_dir, device, RGK_TORCH_NAME,
                                                  rgk_torch)} if rgk_torch else {}
    tileops, tileops_version, why = _load_package(args.skip_tileops, "--skip-tileops", device,
                                                  load_tileops)
    if tileops is None:
        print(f"tileops: not available ({why}); timing the other alternatives", flush=True)
    else:
        print(f"tileops: {tileops_version}", flush=True)
        host_us[TILEOPS_NAME] = package_host_times(entries, base_dir, device, TILEOPS_NAME,
                                                   tileops)

    timer = None
    gpu = None
    timing_error = None
    if device.type == "cuda":
        gpu = torch.cuda.get_device_name(device)
        try:
            timer = CudaTimer(device, KernelRecords(), args.no_flush)
        except Exception as exc:  # no usable kernel records: report errors only
            timing_error = "timing unavailable: " + _short_error(exc)
            traceback.print_exc(file=sys.stderr)
    doc = {"torch": torch.__version__, "gpu": gpu, "device": device.type, "rows": [],
           "tileops": tileops_version, "tileops_unavailable": why,
           "rgk_torch": rgk_version, "rgk_torch_unavailable": rgk_why}

    for entry in entries:
        key = _entry_key(entry)
        entry_host_us = {pkg: t[key] for pkg, t in host_us.items() if key in t}
        for row in run_entry(entry, base_dir, device, timer, args, tileops, rgk_torch,
                             entry_host_us if timer is not None else None):
            if timing_error and not row.get("error"):
                row["error"] = timing_error
            print_row(row)
            doc["rows"].append(row)
        write_json(args.out, doc)
    write_json(args.out, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
