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

usage: python3 bench/peer_profile.py --workload NAME [--calls N] [--bench EXE] [--list]

The workloads are the bench's FFTC2CFwd rows (``rgk-bench --list``, no GPU needed), so their
shapes are written in one place; NAME is a row's name, or ``NAME-DTYPE`` where two rows share a
name (``throughput-4k-c64``, ``throughput-4k-c128``).
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def default_bench() -> str:
    """The bench binary: the device pack's, else this checkout's release build."""
    root = os.path.dirname(HERE)
    for rel in (".device/rgk-bench", "target/release/rgk-bench"):
        path = os.path.join(root, rel)
        if os.access(path, os.X_OK):
            return path
    return os.path.join(root, ".device/rgk-bench")


def fft_workloads(bench: str) -> dict:
    """{name: (shape, dtype)} from ``BENCH --list --op FFTC2CFwd`` (or its output in the
    environment variable ``RGK_BENCH_LIST``, which ``run.sh peer-profile`` sets so that no
    process starts under the profiler but this one): a row's own name where it is the only row
    of that name, else ``name-dtype``."""
    out = os.environ.get("RGK_BENCH_LIST")
    if not out:
        try:
            out = subprocess.run([bench, "--list", "--op", "FFTC2CFwd"], capture_output=True, text=True, check=True).stdout
        except (OSError, subprocess.CalledProcessError) as e:
            raise SystemExit(f"peer_profile: cannot list the bench's workloads with {bench}: {e}")
    rows = [json.loads(line) for line in out.splitlines() if line.strip()]
    names = [r["workload"] for r in rows]
    table = {}
    for r in rows:
        name = r["workload"] if names.count(r["workload"]) == 1 else f"{r['workload']}-{r['dtype']}"
        table[name] = (json.loads(r["shapes"]), r["dtype"])
    return table


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", help="an FFTC2CFwd seed workload (--list)")
    ap.add_argument("--calls", type=int, default=2, help="profiled calls of each implementation")
    ap.add_argument("--warmup", type=int, default=3, help="unprofiled calls first (TileOPs' JIT)")
    ap.add_argument("--bench", default=default_bench(), help="the rgk-bench binary whose rows name the workloads")
    ap.add_argument("--list", action="store_true", help="print the workloads and exit")
    args = ap.parse_args(argv)
    workloads = fft_workloads(args.bench)
    if args.list or not args.workload:
        print("\n".join(f"{k}: {s} {d}" for k, (s, d) in workloads.items()))
        return 0 if args.list else 2
    if args.workload not in workloads:
        print(f"peer_profile: unknown workload {args.workload!r} (one of: {', '.join(workloads)})", file=sys.stderr)
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

    shape, dt = workloads[args.workload]
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
