#!/usr/bin/env python3
"""CPU test of the device tools' Python parts: `bench/ab_compare.py --runs` (the A/B table of
`run.sh abn` and `run.sh ab`) on runs written here, `bench/peer_profile.py`'s workload names,
read from a bench manifest written here, and `xtask/kernel_diff.py` (the cubin an executable
embeds; with a built cubin and nvdisasm, which kernels differ).

Run:  python3 bench/test_bench_tools.py
"""
import contextlib
import glob
import io
import json
import os
import struct
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "xtask"))

import ab_compare  # noqa: E402
import kernel_diff  # noqa: E402
import peer_profile  # noqa: E402


def write_run(d, n, tag, times_us, digests, errs=(1.3e-7, None), verified=(True, True)):
    rows = [
        {"op": "FFTC2CFwd", "workload": "latency-4k", "dtype": "c64", "ours_ms": times_us[0] / 1e3, "rel_l2_err": errs[0],
         "verified": verified[0]},
        {"op": "MHCPreFwd", "workload": "hidden-1280", "dtype": "bf16", "ours_ms": times_us[1] / 1e3, "rel_l2_err": errs[1],
         "verified": verified[1]},
    ]
    with open(os.path.join(d, f"{n:02d}-{tag}.json"), "w") as f:
        json.dump({"rows": rows, "startup_ms": 1000 + n}, f)
    # As the bench prints them: one `OP NAME: verified=… (detail)` line per row, the detail
    # with a digest where the op prints one (None: no digest).
    with open(os.path.join(d, f"{n:02d}-{tag}.log"), "w") as f:
        for r, b in zip(rows, digests):
            detail = f"rel_l2 1e-7, bits {b}" if b is not None else "5 elements, 0 failures"
            f.write(f"{r['op']} {r['workload']}: verified={str(r['verified']).lower()} ({detail})\n")


def table(runs):
    """`ab_compare.runs` over `runs` [(tag, [fft µs, mhc µs], digests[, verified])], numbered in
    order: the FFT row's line, the mHC row's line, and every line."""
    with tempfile.TemporaryDirectory() as d:
        for n, (tag, times, digests, *verified) in enumerate(runs, 1):
            write_run(d, n, tag, times, digests, verified=verified[0] if verified else (True, True))
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            ab_compare.runs(d)
    lines = out.getvalue().splitlines()
    row = lambda name: next(l for l in lines if name in l)  # noqa: E731
    return row("latency-4k"), row("hidden-1280"), lines


def test_ab_compare_marks_moves_and_digests():
    fft, mhc, lines = table([
        ("base", [2.98, 3.55], ["aa", "bb"]),
        ("cur", [2.80, 3.56], ["aa", "bb"]),
        ("cur", [2.82, 3.54], ["aa", "bc"]),
        ("base", [2.96, 3.55], ["aa", "bb"]),
    ])
    # Means 2.97 against 2.81: −0.16 µs and −5.4 %, beyond both bounds.
    assert "2.98 / 2.96 (1.30e-07)" in fft and "2.80 / 2.82 (1.30e-07) Δ -0.16 **" in fft, fft
    assert fft.endswith("| bitwise equal |"), fft
    # 3.55 against 3.55: inside the bounds; the second cur run's digest differs.
    assert "Δ +0.00 |" in mhc and "**" not in mhc, mhc
    assert "differ from base: cur" in mhc, mhc
    assert lines[-1] == "rows beyond 3 % and 0.1 µs against base: cur 1", lines[-1]
    assert lines[0].startswith("startup_ms: 01-base 1001"), lines[0]


def test_ab_compare_small_moves_are_not_marked():
    # +0.12 µs on 3.55 is 3.4 %: beyond both; +0.09 is under 0.1 µs; +0.11 on 4.0 is 2.75 %.
    fft, mhc, lines = table([("cur", [3.55, 4.00], ["a", "b"]), ("D", [3.67, 4.11], ["a", "b"]), ("E", [3.64, 4.00], ["a", "b"])])
    assert "3.67 (1.30e-07) Δ +0.12 **" in fft and "3.64 (1.30e-07) Δ +0.09 |" in fft, fft
    assert "4.11 Δ +0.11 |" in mhc, mhc
    assert lines[-1] == "rows beyond 3 % and 0.1 µs against cur: D 1, E 0", lines[-1]


def test_ab_compare_digests_stay_with_their_rows():
    # The first row prints no digest: the second row's digest must not move up to it.
    fft, mhc, _ = table([("cur", [2.98, 3.55], [None, "bb"]), ("D", [2.98, 3.55], [None, "bc"])])
    assert fft.endswith("| no digests |"), fft
    assert mhc.endswith("| differ from cur: D |"), mhc


def test_ab_compare_marks_failed_verification():
    # A diagnostic build with wrong FFT outputs: its rows are timed and marked.
    fft, mhc, _ = table([("cur", [2.98, 3.55], ["a", "b"]), ("TW0", [2.70, 3.55], ["ff", "b"], (False, True))])
    assert fft.endswith("| differ from cur: TW0; FAILED verification: TW0 |"), fft
    assert mhc.endswith("| bitwise equal |"), mhc


def write_manifest(d, entries):
    path = os.path.join(d, "manifest.json")
    with open(path, "w") as f:
        json.dump({"entries": entries}, f)
    return path


def test_peer_profile_names_come_from_the_manifest():
    entries = [
        {"op": "FFTC2CFwd", "workload": "latency-4k", "dtype": "c64", "file": "a.safetensors"},
        {"op": "FFTC2CFwd", "workload": "throughput-4k", "dtype": "c64", "file": "b.safetensors"},
        {"op": "FFTC2CFwd", "workload": "throughput-4k", "dtype": "c128", "file": "c.safetensors"},
        {"op": "MHCPostFwd", "workload": "hidden-1280", "dtype": "bf16", "file": "d.safetensors"},
    ]
    with tempfile.TemporaryDirectory() as d:
        manifest = write_manifest(d, entries)
        fft = peer_profile.manifest_workloads(manifest, "FFTC2CFwd")
        assert {k: v["file"] for k, v in fft.items()} == {
            "latency-4k": "a.safetensors",
            "throughput-4k-c64": "b.safetensors",
            "throughput-4k-c128": "c.safetensors",
        }, fft
        mhc = peer_profile.manifest_workloads(manifest, "MHCPostFwd")
        assert list(mhc) == ["hidden-1280"] and mhc["hidden-1280"]["dtype"] == "bf16", mhc
        # An ambiguous name is refused with the names that are not (before torch is imported).
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc = peer_profile.main(["--manifest", manifest, "--workload", "throughput-4k"])
        assert rc == 2 and "throughput-4k-c64, throughput-4k-c128" in err.getvalue(), err.getvalue()
        # A row of another op is not found under the default op.
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc = peer_profile.main(["--manifest", manifest, "--workload", "hidden-1280"])
        assert rc == 2 and "no FFTC2CFwd row 'hidden-1280'" in err.getvalue(), err.getvalue()
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = peer_profile.main(["--manifest", manifest, "--op", "MHCPostFwd", "--list"])
        assert rc == 0 and out.getvalue().strip() == "hidden-1280: bf16 d.safetensors", out.getvalue()
        # Each implementation named once.
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc = peer_profile.main(["--manifest", manifest, "--workload", "latency-4k", "--impl", "tileops,tileops"])
        assert rc == 2 and "name each implementation once" in err.getvalue(), err.getvalue()


def test_peer_profile_without_a_manifest_says_so():
    try:
        peer_profile.manifest_workloads("/nonexistent/manifest.json", "FFTC2CFwd")
    except SystemExit as e:
        assert "cannot read the bench's manifest" in str(e), e
    else:
        raise AssertionError("no error for a missing manifest")


def elf(machine, body=b"\x11" * 40):
    """A minimal 64-bit ELF image: header, `body`, one (null) section header at the end."""
    shoff = 64 + len(body)
    head = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)
    head += struct.pack("<HHIQQQIHHHHHH", 2, machine, 1, 0, 0, shoff, 0, 64, 0, 0, 64, 1, 0)
    assert len(head) == 64
    return head + body + bytes(64)


def test_kernel_diff_finds_the_embedded_cubin():
    cuda = elf(kernel_diff.EM_CUDA)
    blob = b"junk" * 10 + elf(62) + b"\x7fELF-not-a-header" + cuda + b"tail" * 5
    assert kernel_diff.cubins(blob) == [cuda]
    assert kernel_diff.cubins(cuda) == [cuda]
    assert kernel_diff.cubins(b"nothing here") == []


def test_kernel_diff_reads_kernels_and_their_labels():
    text = """
//--------------------- .text.a --------------------------
	.section	.text.a,"ax",@progbits
	.align	128
        .global         a
a:
.text.a:
        /*0000*/                   BRA `(.L_x_7) ;
.L_x_7:
        /*0010*/                   EXIT ;
.L_x_8:


//--------------------- .text.b --------------------------
	.section	.text.b,"ax",@progbits
b:
.text.b:
        /*0000*/                   EXIT ;
"""
    k = kernel_diff.parse(text)
    assert k == {"a": ["BRA `(L0) ;", "L0:", "EXIT ;", "L1:"], "b": ["EXIT ;"]}, k
    # Labels are numbered per kernel: other numbers, same code; a moved label differs.
    assert kernel_diff.parse(text.replace("_7", "_3").replace("_8", "_4")) == k
    moved = text.replace(".L_x_7:\n        /*0010*/                   EXIT ;", "        /*0010*/                   EXIT ;\n.L_x_7:")
    assert kernel_diff.parse(moved)["a"] != k["a"]


def section(image, name):
    """(offset, size) of the section `name` of an ELF image."""
    shoff = struct.unpack_from("<Q", image, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", image, 0x3A)
    strtab = struct.unpack_from("<Q", image, shoff + shstrndx * shentsize + 0x18)[0]
    for k in range(shnum):
        h = shoff + k * shentsize
        at = strtab + struct.unpack_from("<I", image, h)[0]
        if image[at:image.index(b"\0", at)].decode() == name:
            return struct.unpack_from("<QQ", image, h + 0x18)
    raise KeyError(name)


def test_kernel_diff_names_the_kernel_that_differs():
    tool = kernel_diff.nvdisasm()
    targets = [t for t in (os.path.join(HERE, "..", "target"), os.environ.get("CARGO_TARGET_DIR")) if t]
    found = sorted(f for t in targets for f in glob.glob(os.path.join(t, "*", "build", "rgk-*", "out", "kernels.cubin")))
    if tool is None or not found:
        print("skipped: no built cubin or no nvdisasm")
        return
    image = open(found[0], "rb").read()
    names = sorted(kernel_diff.kernels(found[0], tool))
    victim = names[len(names) // 2]
    # The kernel's first two instructions swapped (each 16 bytes on sm_90): valid code, other SASS.
    at, size = section(image, ".text." + victim)
    assert size >= 32
    swapped = bytearray(image)
    swapped[at:at + 16], swapped[at + 16:at + 32] = image[at + 16:at + 32], image[at:at + 16]
    with tempfile.TemporaryDirectory() as d:
        same = os.path.join(d, "same-bench")
        with open(same, "wb") as f:
            f.write(b"host code" * 100 + image + b"more host code")
        other = os.path.join(d, "other.cubin")
        with open(other, "wb") as f:
            f.write(bytes(swapped))
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc_same = kernel_diff.main([found[0], same])
            rc_other = kernel_diff.main([same, other])
    text = out.getvalue()
    assert rc_same == 0 and f"{len(names)} identical, 0 differ" in text, text
    assert rc_other == 1 and f"differs: {victim} (" in text and f"{len(names) - 1} identical, 1 differ" in text, text


if __name__ == "__main__":
    tests = [v for k, v in sorted(globals().items()) if k.startswith("test_")]
    for t in tests:
        t()
        print(f"ok {t.__name__}")
    print(f"{len(tests)} passed")
