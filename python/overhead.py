"""Host time per eager call of rgk's ops from Python, and where it goes.

    python3 python/overhead.py      # needs a CUDA device and the installed package

For each op on a seed shape, µs per call: the least over 20 loops of 500 calls, each loop
ending in one synchronisation (every row's device time is below its host time, so this is the
host's), the process pinned to one CPU (the machine's host timings vary by up to 2× between
runs; the least is the most repeatable):
  rgk.ops     the functional front end as users call it (eager, no gradient: straight to the
              native op);
  torch.ops   the same op through torch's dispatcher (torch.ops.rgk.<op>: dispatch, the Python
              autograd wrapper, then the native op);
  native      the native op alone (rgk._rgk.<op>(..., direct=False): Python → Rust, reading and
              validating the tensors, allocating the outputs, plan lookup, launches);
  rejected    the native op refusing its last input (a wrong dtype): Python → Rust and reading
              and checking the tensors, nothing allocated or launched (the exception included);
  outputs     allocating the op's outputs alone, as the native op does (new_empty of an empty
              tensor of the output's dtype);
  torch noop  a torch.library op with the same tensors that allocates the outputs and launches
              nothing: torch's dispatch and allocation alone.
"""
import os
import time

import torch

import rgk
from rgk import _rgk

N, LOOPS = 500, 20


def per_call_us(fn):
    best = float("inf")
    for _ in range(50):
        fn()
    for _ in range(LOOPS):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(N):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / N * 1e6)
    return best


_NOOP = torch.library.Library("rgk_overhead", "DEF")
_NOOP.define("post(Tensor x_layer_out, Tensor h_post, Tensor x_res) -> Tensor")
_NOOP.impl("post", lambda a, h, r: torch.empty(r.shape, dtype=r.dtype, device=r.device), "CUDA")
_NOOP.define("fft(Tensor x) -> Tensor")
_NOOP.impl("fft", lambda x: torch.empty(x.shape, dtype=x.dtype, device=x.device), "CUDA")
_NOOP.define("pre(Tensor phi, Tensor x, Tensor b) -> (Tensor, Tensor, Tensor)")
_NOOP.impl("pre", lambda phi, x, b: (
    torch.empty(x.shape, dtype=x.dtype, device=x.device),
    torch.empty(x.shape[0], x.shape[1] // 4, dtype=x.dtype, device=x.device),
    torch.empty(x.shape[0], 4, dtype=torch.float32, device=x.device)), "CUDA")


def main():
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[-1]})
    dev = torch.device("cuda", torch.cuda.current_device())
    x = torch.randn(4096, dtype=torch.complex64, device=dev)
    xf = torch.zeros(4096, device=dev)
    xl = torch.randn(1, 1280, device=dev).bfloat16()
    hp = torch.rand(1, 4, device=dev)
    xr = torch.randn(1, 5120, device=dev).bfloat16()
    phi = torch.randn(5120, 24, device=dev) / 100
    b = torch.randn(24, device=dev)
    pre_args = (1.0, 1.0, 1.0, 20, 0.02)

    def rejected(f):
        def call():
            try:
                f()
            except ValueError:
                pass
        return call

    templates = {d: torch.empty(0, dtype=d, device=dev) for d in (torch.complex64, torch.bfloat16, torch.float32)}

    def empty(*specs):
        specs = [(templates[d], shape) for d, shape in specs]
        return lambda: [like.new_empty(*shape) for like, shape in specs]

    rows = [
        ("FFTC2CFwd latency-4k",
         lambda: rgk.ops.fft_c2c(x),
         lambda: torch.ops.rgk.fft_c2c(x),
         lambda: _rgk.fft_c2c(x, False),
         rejected(lambda: _rgk.fft_c2c(xf, False)),
         empty((torch.complex64, (4096,))),
         lambda: torch.ops.rgk_overhead.fft(x)),
        ("MHCPostFwd hidden-1280",
         lambda: rgk.ops.mhc_post(xl, hp, xr),
         lambda: torch.ops.rgk.mhc_post(xl, hp, xr),
         lambda: _rgk.mhc_post(xl, hp, xr, False),
         rejected(lambda: _rgk.mhc_post(xl, hp, phi, False)),
         empty((torch.bfloat16, (1, 5120))),
         lambda: torch.ops.rgk_overhead.post(xl, hp, xr)),
        ("MHCPreFwd hidden-1280 (two kernels, one graph)",
         lambda: rgk.ops.mhc_pre(phi, xr, b, *pre_args),
         lambda: torch.ops.rgk.mhc_pre(phi, xr, b, *pre_args),
         lambda: _rgk.mhc_pre(phi, xr, b, *pre_args, False),
         rejected(lambda: _rgk.mhc_pre(phi, xr, xr, *pre_args, False)),
         empty((torch.bfloat16, (1, 5120)), (torch.bfloat16, (1, 1280)), (torch.float32, (1, 4))),
         lambda: torch.ops.rgk_overhead.pre(phi, xr, b)),
    ]
    print("| op | rgk.ops µs | torch.ops µs | native µs | rejected µs | outputs µs | torch noop µs |")
    print("|---|---|---|---|---|---|---|")
    for name, *fns in rows:
        print(f"| {name} | " + " | ".join(f"{per_call_us(f):.1f}" for f in fns) + " |", flush=True)

    # The ops with more tensors, on shapes small enough for the device to keep up with the host.
    bf = torch.bfloat16
    g = [torch.randn(1, 64, 512, device=dev).to(bf) for _ in range(3)]
    gw = [torch.ones(512, device=dev).to(bf), torch.ones(512, device=dev).to(bf),
          torch.randn(4, 512, device=dev).to(bf)]
    _, _, alpha, rrms_h, rrms_k, _ = rgk.ops.gate_conv_fwd(*g, *gw)
    dy = torch.randn(1, 64, 512, device=dev).to(bf)
    saved = (alpha, rrms_h, rrms_k)
    dec = (torch.randn(1, 1024, device=dev).to(bf), torch.randn(1, 512, device=dev).to(bf),
           torch.randn(1, 8, 512, device=dev).to(bf), torch.randn(1024, 512, device=dev).to(bf) / 32,
           torch.randn(1024, 512, device=dev).to(bf) / 32, torch.ones(512, device=dev).to(bf),
           torch.ones(512, device=dev).to(bf), torch.randn(4, 512, device=dev).to(bf))
    more = [
        ("MHCPostPreFwd hidden-1280 (4 outputs)",
         lambda: rgk.ops.mhc_post_pre(xl, hp, xr, phi, b, *pre_args),
         lambda: torch.ops.rgk.mhc_post_pre(xl, hp, xr, phi, b, *pre_args),
         lambda: _rgk.mhc_post_pre(xl, hp, xr, phi, b, *pre_args, False),
         empty((bf, (1, 5120)), (bf, (1, 5120)), (bf, (1, 1280)), (torch.float32, (1, 4)))),
        ("EngramGateConvFwd [1, 64, 512] bf16 (6 outputs)",
         lambda: rgk.ops.gate_conv_fwd(*g, *gw),
         lambda: torch.ops.rgk.gate_conv_fwd(*g, *gw),
         lambda: _rgk.gate_conv_fwd(*g, *gw, False),
         empty((bf, (1, 64, 512)), (bf, (1, 64, 512)), *[(torch.float32, (1, 64))] * 4)),
        ("EngramGateConvBwd [1, 64, 512] bf16 (6 outputs; and a workspace, not in outputs)",
         lambda: rgk.ops.gate_conv_bwd(dy, *g, *gw, *saved),
         lambda: torch.ops.rgk.gate_conv_bwd(dy, *g, *gw, *saved),
         lambda: _rgk.gate_conv_bwd(dy, *g, *gw, *saved, False),
         empty(*[(bf, (1, 64, 512))] * 3, (torch.float32, (512,)), (torch.float32, (512,)),
               (torch.float32, (4, 512)))),
        ("EngramDecodeFwd B 1, d_mem 1024, d 512 bf16 (2 outputs)",
         lambda: rgk.ops.decode_fwd(*dec, dilation=2),
         lambda: torch.ops.rgk.decode_fwd(*dec, 2, 1e-6),
         lambda: _rgk.decode_fwd(*dec, 2, 1e-6, False),
         empty((bf, (1, 512)), (bf, (1, 8, 512)))),
    ]
    print()
    print("| op | rgk.ops µs | torch.ops µs | native µs | outputs µs |")
    print("|---|---|---|---|---|")
    for name, *fns in more:
        print(f"| {name} | " + " | ".join(f"{per_call_us(f):.1f}" for f in fns) + " |", flush=True)


if __name__ == "__main__":
    main()
