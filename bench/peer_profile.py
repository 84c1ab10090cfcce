#!/usr/bin/env python3
"""Our kernels and the alternatives' (TileOPs', torch.compile's, …) on the bench's own inputs in
one process, each call after the bench's own L2 flush (a 256 MiB ``bitwise_not_``, which leaves
L2 full of dirty lines), for Nsight Compute.

The inputs are a bench run's: ``rgk-bench --op OP --workload NAME --no-alternatives --work-dir
DIR`` writes them (one safetensors file per row, with the f64 references) and
``DIR/manifest.json`` names them, with each row's parameters; the implementations are built by
``torch_alternatives.build_alternatives``, the same code the bench times. Only the timed calls
run inside an NVTX range named ``profiled``; the flushes, the warm-up calls (TileOPs' JIT,
torch.compile) and the set-up do not. Run it under

    ncu --replay-mode application --cache-control none --clock-control none \\
        --nvtx --nvtx-include "profiled/" --section WarpStateStats --section SourceCounters \\
        -o REPORT python3 bench/peer_profile.py --manifest DIR/manifest.json --workload latency-4k

(application replay re-runs the whole process per metric pass, so every pass sees the flushed
state and the same inputs). ``bash .device/run.sh peer-profile WORKLOAD`` makes the inputs and
does this on the GPU machine, and summarises the report (``xtask/sass_hotspots.py`` per kernel).

usage: python3 bench/peer_profile.py --manifest FILE [--op OP] --workload NAME [--impl A,B]
                                     [--calls N] [--warmup N] [--list] [--device cuda|cpu]

NAME is a row's workload name among the manifest's rows of OP (default FFTC2CFwd), or
``NAME-DTYPE`` where two rows share a name (``throughput-4k-c64``, ``throughput-4k-c128``).
The implementations are the bench's names: ``rgk-torch`` (ours, through the Python package),
``tileops``, ``torch-compile``, and the eager one (``torch-cufft`` or ``torch-ref``).
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_IMPLS = "rgk-torch,tileops"


def manifest_workloads(manifest: str, op: str) -> dict:
    """{name: entry} for the manifest's rows of `op`: a row's own workload name where it is the
    only row of that name, else ``name-dtype``."""
    try:
        with open(manifest) as f:
            entries = json.load(f)["entries"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"peer_profile: cannot read the bench's manifest {manifest}: {e}")
    rows = [e for e in entries if e.get("op") == op]
    names = [r.get("workload") for r in rows]
    table = {}
    for r in rows:
        name = r["workload"] if names.count(r["workload"]) == 1 else f"{r['workload']}-{r['dtype']}"
        table[name] = r
    return table


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--manifest", required=True, help="a bench run's manifest.json (its --work-dir)")
    ap.add_argument("--op", default="FFTC2CFwd", help="the op of the row (default FFTC2CFwd)")
    ap.add_argument("--workload", help="the row's workload name (--list)")
    ap.add_argument("--impl", default=DEFAULT_IMPLS,
                    help=f"comma-separated implementations to profile (default {DEFAULT_IMPLS})")
    ap.add_argument("--calls", type=int, default=2, help="profiled calls of each implementation")
    ap.add_argument("--warmup", type=int, default=3, help="unprofiled calls first (TileOPs' JIT, torch.compile)")
    ap.add_argument("--list", action="store_true", help="print the manifest's rows of --op and exit")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cpu: the same calls without the flush or the NVTX range (the CPU test's dry run)")
    args = ap.parse_args(argv)
    workloads = manifest_workloads(args.manifest, args.op)
    if args.list or not args.workload:
        print("\n".join(f"{k}: {e.get('dtype')} {e.get('file')}" for k, e in workloads.items()))
        return 0 if args.list else 2
    if args.workload not in workloads:
        print(f"peer_profile: no {args.op} row {args.workload!r} in {args.manifest} "
              f"(one of: {', '.join(workloads) or 'none'})", file=sys.stderr)
        return 2
    if args.calls < 1 or args.warmup < 1:
        print("peer_profile: --calls and --warmup must be at least 1", file=sys.stderr)
        return 2
    wanted = [s for s in args.impl.split(",") if s]
    if not wanted or len(set(wanted)) != len(wanted):
        print(f"peer_profile: --impl {args.impl!r}: name each implementation once", file=sys.stderr)
        return 2

    import torch
    if args.device == "cuda" and not torch.cuda.is_available():
        print("peer_profile: no CUDA device", file=sys.stderr)
        return 2
    sys.path.insert(0, HERE)
    import torch_alternatives as ta

    entry = workloads[args.workload]
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    inputs, refs = ta.load_entry(entry, os.path.dirname(os.path.abspath(args.manifest)), dev)
    packages = {}
    for name, load in ((ta.RGK_TORCH_NAME, ta.load_rgk_torch), (ta.TILEOPS_NAME, ta.load_tileops)):
        if name in wanted:
            ops, _version, why = load()
            if ops is None:
                print(f"peer_profile: {name} unavailable: {why}", file=sys.stderr)
                return 2
            packages[name] = ops
    alts = dict(ta.build_alternatives(args.op, inputs, entry.get("params") or {},
                                      "torch-compile" not in wanted, packages.get(ta.TILEOPS_NAME),
                                      packages.get(ta.RGK_TORCH_NAME)))
    missing = [w for w in wanted if w not in alts]
    if missing:
        print(f"peer_profile: {args.op} has no implementation {', '.join(missing)} "
              f"(one of: {', '.join(alts)})", file=sys.stderr)
        return 2
    calls = {}
    for name in wanted:
        call = alts[name]()
        for _ in range(args.warmup):
            out = call()
        ta._sync(dev)
        _per, rel, mab, nonfinite = ta.output_errors(out, refs)
        bad = f", non-finite {', '.join(nonfinite)}" if nonfinite else ""
        print(f"{name}: rel_l2 {rel if rel is None else format(rel, '.3e')}, "
              f"max_abs {mab if mab is None else format(mab, '.3e')}{bad}", flush=True)
        calls[name] = call
    flush_buf = torch.zeros(ta.FLUSH_BYTES // 4, dtype=torch.int32, device=dev) if cuda else None
    # Alternating, so no implementation always follows another's flush pattern.
    for _ in range(args.calls):
        for name in wanted:
            if cuda:
                flush_buf.bitwise_not_()
                torch.cuda.synchronize()
                torch.cuda.nvtx.range_push("profiled")
            calls[name]()
            if cuda:
                torch.cuda.nvtx.range_pop()
            ta._sync(dev)
    print(f"peer_profile: {args.op} {args.workload}: {args.calls} profiled calls each of {', '.join(wanted)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
