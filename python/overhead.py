"""Host time per eager call of rgk's ops from Python, and where it goes.

    python3 python/overhead.py      # needs a CUDA device and the installed package

For each op on a seed shape, µs per call (N calls in a tight loop, one synchronisation; every
row's device time is below its host time, so this is the host's):
  rgk.ops     the functional front end as users call it (eager, no gradient: straight to the
              native module, output allocation included);
  torch.ops   the same op through torch's dispatcher (torch.ops.rgk.<op>: dispatch, the Python
              autograd wrapper, output allocation, the native call);
  native      the native call alone (rgk._rgk.<op> on preallocated tensors: Python → Rust,
              validation, plan lookup, launches);
  launch-free the native call rejected at validation (a wrong dtype on the last output): the
              Python → Rust cost and the checks, nothing launched;
  torch noop  a torch.library op with the same schema that returns an empty tensor: torch's
              dispatch and allocation alone.
"""
import time

import torch

import rgk
from rgk import _rgk
from rgk.ops import _stream, _t

N = 2000


def per_call_us(fn):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(N):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / N * 1e6


_NOOP = torch.library.Library("rgk_overhead", "DEF")
_NOOP.define("post(Tensor x_layer_out, Tensor h_post, Tensor x_res) -> Tensor")
_NOOP.impl("post", lambda a, h, r: r.new_empty(r.shape), "CUDA")
_NOOP.define("fft(Tensor x) -> Tensor")
_NOOP.impl("fft", lambda x: torch.empty_like(x), "CUDA")
_NOOP.define("pre(Tensor phi, Tensor x, Tensor b) -> (Tensor, Tensor, Tensor)")
_NOOP.impl("pre", lambda phi, x, b: (x.new_empty(x.shape), x.new_empty((x.shape[0], x.shape[1] // 4)),
                                     x.new_empty((x.shape[0], 4), dtype=torch.float32)), "CUDA")


def main():
    dev = "cuda"
    x = torch.randn(4096, dtype=torch.complex64, device=dev)
    y = torch.empty_like(x)
    xl = torch.randn(1, 1280, device=dev).bfloat16()
    hp = torch.rand(1, 4, device=dev)
    xr = torch.randn(1, 5120, device=dev).bfloat16()
    xo = torch.empty_like(xr)
    bad = torch.empty(xr.shape, dtype=torch.float16, device=dev)
    phi = torch.randn(5120, 24, device=dev) / 100
    b = torch.randn(24, device=dev)
    pre_out = (torch.empty_like(xr), torch.empty_like(xl), torch.empty_like(hp))
    pre_args = (1.0, 1.0, 1.0, 20, 0.02)
    rows = [
        ("FFTC2CFwd latency-4k",
         lambda: rgk.ops.fft_c2c(x),
         lambda: torch.ops.rgk.fft_c2c(x),
         lambda: _rgk.fft_c2c(_t(x), _t(y), _stream(x)),
         lambda: _rgk.fft_c2c(_t(x), _t(y.real), _stream(x)),
         lambda: torch.ops.rgk_overhead.fft(x)),
        ("MHCPostFwd hidden-1280",
         lambda: rgk.ops.mhc_post(xl, hp, xr),
         lambda: torch.ops.rgk.mhc_post(xl, hp, xr),
         lambda: _rgk.mhc_post(_t(xl), _t(hp), _t(xr), _t(xo), _stream(xl)),
         lambda: _rgk.mhc_post(_t(xl), _t(hp), _t(xr), _t(bad), _stream(xl)),
         lambda: torch.ops.rgk_overhead.post(xl, hp, xr)),
        ("MHCPreFwd hidden-1280 (two kernels, one graph)",
         lambda: rgk.ops.mhc_pre(phi, xr, b, *pre_args),
         lambda: torch.ops.rgk.mhc_pre(phi, xr, b, *pre_args),
         lambda: _rgk.mhc_pre(_t(phi), _t(xr), _t(b), *(_t(o) for o in pre_out), *pre_args, _stream(xr)),
         lambda: _rgk.mhc_pre(_t(phi), _t(xr), _t(b), _t(pre_out[0]), _t(pre_out[1]), _t(bad), *pre_args,
                              _stream(xr)),
         lambda: torch.ops.rgk_overhead.pre(phi, xr, b)),
    ]
    print("| op | rgk.ops µs | torch.ops µs | native µs | launch-free µs | torch noop µs |")
    print("|---|---|---|---|---|---|")
    for name, front, full, native, rejected, noop in rows:
        def swallow(f=rejected):
            try:
                f()
            except ValueError:
                pass
        print(f"| {name} | {per_call_us(front):.1f} | {per_call_us(full):.1f} | {per_call_us(native):.1f} | "
              f"{per_call_us(swallow):.1f} | {per_call_us(noop):.1f} |")


if __name__ == "__main__":
    main()
