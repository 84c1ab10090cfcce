#!/usr/bin/env python3
"""Summarise Nsight Compute's SASS source page (`bash .device/run.sh source …` → source.csv):
the total warp-state samples by stall reason, then every instruction with at least MIN samples
(and every barrier, reduction, exit and dependent-launch wait that executed), with the running
sample count, so the phases of a kernel can be read off in program order.

usage: python3 xtask/sass_hotspots.py source.csv [MIN]
"""
import csv
import sys


def main(path: str, threshold: int) -> None:
    rows = list(csv.reader(open(path)))
    # The page opens with a line naming the kernel, then the header.
    start = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    hdr, data = rows[start], rows[start + 1:]
    # The SourceCounters section names its columns ("stall_long_sb", ...); a report made with
    # --metrics (run.sh peer-profile) names them by metric (smsp__pcsamp_warps_issue_stalled_X).
    metric = "smsp__pcsamp_warps_issue_stalled_"
    hdr = [f"stall_{h[len(metric):]}" if h.startswith(metric) and not h.endswith("_not_issued") else h for h in hdr]
    hdr = [{"smsp__pcsamp_sample_count": "Warp Stall Sampling (All Samples)",
            "inst_executed": "Instructions Executed"}.get(h, h) for h in hdr]
    data = [r for r in data if len(r) == len(hdr)]
    col = {h: i for i, h in enumerate(hdr)}
    stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    samples = "Warp Stall Sampling (All Samples)"

    def num(r, h):
        v = r[col[h]].strip()
        return int(float(v)) if v not in ("", "-", "n/a") else 0

    total = sum(num(r, samples) for r in data)
    by_reason = {h[len("stall_"):]: sum(num(r, h) for r in data) for h in stalls}
    print(f"samples {total}:", " ".join(f"{k}={v}" for k, v in sorted(by_reason.items(), key=lambda x: -x[1]) if v))
    marks = ("BAR.SYNC", "REDG", "EXIT", "DEPBAR", "ACQBULK")
    running = 0
    for k, r in enumerate(data):
        s, ex = num(r, samples), num(r, "Instructions Executed")
        src = r[col["Source"]].strip()
        running += s
        if s >= threshold or (ex > 0 and any(m in src for m in marks)):
            why = " ".join(f"{h[len('stall_'):]}={num(r, h)}" for h in stalls if num(r, h))
            print(f"{k:5d} cum={running:6d} ex={ex:7d} s={s:4d} {src[:58]:58s} {why}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 10)
