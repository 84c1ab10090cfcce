#!/usr/bin/env python3
"""Our kernels and TileOPs' on the same inputs in one process, each call after the bench's own
L2 flush (a 256 MiB ``bitwise_not_``, which leaves L2 full of dirty lines), for Nsight Compute.

Only the timed calls run inside an NVTX range named ``profiled``; the flushes, the warm-up
calls (TileOPs' JIT) and the set-up do not. Run it under

    ncu --replay-mode application --cache-control none --clock-control none \\
        --nvtx --nvtx-include "profiled/" --section WarpStateStats --section SourceCounters \\
        -o REPORT python3 bench/peer_profile.py --workload latency-4k

(application replay re-runs the whole process per metric pass, so every pass sees the flushed
state; the inputs come from a fixed seed, so every pass sees the same data).
``bash .device/run.sh peer-profile WORKLOAD`` does this on the GPU machine and summarises the
report (``xtask/sass_hotspots.py`` per kernel).

usage: python3 bench/peer_profile.py --workload NAME [--calls N] [--list]
"""
import argparse
import sys

# FFTC2CFwd seed workloads: (shape, complex dtype name).
FFT_WORKLOADS = {
    "latency-4k": ([4096], "c64"),
    "throughput-4k": ([64, 4096], "c64"),
    "throughput-4k-c128": ([64, 4096], "c128"),
    "longconv-16k": ([64, 16384], "c64"),
    "longconv-64k": ([8, 65536], "c64"),
    "spectrogram-1k": ([256, 1024], "c64"),
    "fnet-512": ([4096, 512], "c64"),
    "shortconv-64": ([65536, 64], "c64"),
    "scientific-1m": ([4, 1048576], "c128"),
    "spectrogram-1k-b300": ([300, 1024], "c64"),
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", help="an FFTC2CFwd seed workload (--list)")
    ap.add_argument("--calls", type=int, default=2, help="profiled calls of each implementation")
    ap.add_argument("--warmup", type=int, default=3, help="unprofiled calls first (TileOPs' JIT)")
    ap.add_argument("--list", action="store_true", help="print the workloads and exit")
    args = ap.parse_args(argv)
    if args.list or not args.workload:
        print("\n".join(f"{k}: {s} {d}" for k, (s, d) in FFT_WORKLOADS.items()))
        return 0 if args.list else 2
    if args.workload not in FFT_WORKLOADS:
        print(f"peer_profile: unknown workload {args.workload!r} (--list)", file=sys.stderr)
        return 2
    if args.calls < 1:
        print("peer_profile: --calls must be at least 1", file=sys.stderr)
        return 2

    import torch
    if not torch.cuda.is_available():
        print("peer_profile: no CUDA device", file=sys.stderr)
        return 2
    import rgk
    from tileops.fft import FFTC2CFwdOp as TileOpsFFT
    from torch_alternatives import FLUSH_BYTES  # this script's folder: the bench's flush size

    shape, dt = FFT_WORKLOADS[args.workload]
    dtype = torch.complex64 if dt == "c64" else torch.complex128
    dev = torch.device("cuda")
    g = torch.Generator(device="cpu").manual_seed(20261129)
    x = torch.randn(*shape, generator=g, dtype=dtype).to(dev)
    impls = [("rgk", rgk.FFTC2CFwdOp()), ("tileops", TileOpsFFT())]
    flush_buf = torch.zeros(FLUSH_BYTES // 4, dtype=torch.int32, device=dev)
    ref = torch.fft.fft(x.to(torch.complex128), dim=-1)
    for name, op in impls:
        for _ in range(args.warmup):
            y = op(x)
        torch.cuda.synchronize()
        err = (torch.linalg.vector_norm(y.to(torch.complex128) - ref) / torch.linalg.vector_norm(ref)).item()
        print(f"{name}: rel_l2 {err:.3e}", flush=True)
    # Alternating, so neither always follows the other's flush pattern.
    for _ in range(args.calls):
        for name, op in impls:
            flush_buf.bitwise_not_()
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_push("profiled")
            op(x)
            torch.cuda.nvtx.range_pop()
            torch.cuda.synchronize()
    print(f"peer_profile: {args.workload}: {args.calls} profiled calls each of {', '.join(n for n, _ in impls)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
