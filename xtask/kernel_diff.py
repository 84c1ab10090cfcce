#!/usr/bin/env python3
"""Which kernels differ between two builds: the sm_90 machine code (cubin) each executable
embeds (the bench, a test executable, or a cubin file itself), disassembled with nvdisasm and
compared kernel by kernel, addresses left out and branch labels numbered per kernel.

    python3 xtask/kernel_diff.py A B [--show KERNEL]

Prints the kernels only one build has, the kernels whose SASS differs (with their instruction
counts) and how many are identical. `--show KERNEL` prints that kernel's differing lines.
Exit 0 when every kernel is identical, 1 when any differs, 2 on an error.
Used to check that a refactor changed no kernel, or that a build's kernels are those of
another (docs/decisions/fft.md: the subsets of a combined build).
"""
import argparse
import difflib
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

EM_CUDA = 190


def cubins(data):
    """The embedded 64-bit ELF images for EM_CUDA in `data` (a whole cubin is one)."""
    out = []
    i = -1
    while True:
        i = data.find(b"\x7fELF", i + 1)
        if i < 0:
            return out
        if len(data) < i + 0x40 or data[i + 4] != 2:
            continue
        if struct.unpack_from("<H", data, i + 18)[0] != EM_CUDA:
            continue
        # The image ends at the last of its header tables and sections.
        phoff, shoff = struct.unpack_from("<QQ", data, i + 0x20)
        phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", data, i + 0x36)
        end = max(phoff + phentsize * phnum, shoff + shentsize * shnum)
        for k in range(shnum):
            h = i + shoff + k * shentsize
            if h + 0x28 > len(data):
                break
            kind = struct.unpack_from("<I", data, h + 4)[0]
            offset, size = struct.unpack_from("<QQ", data, h + 0x18)
            if kind != 8:  # SHT_NOBITS takes no bytes in the file
                end = max(end, offset + size)
        if i + end <= len(data):
            out.append(data[i:i + end])


def nvdisasm():
    """nvdisasm where ptx-build's `find_cuda_tool` looks: on PATH, in /usr/local/cuda/bin, or in
    an nvidia-cuda-* wheel of this Python (./x installs nvidia-cuda-nvdisasm)."""
    found = shutil.which("nvdisasm") or shutil.which("nvdisasm", path="/usr/local/cuda/bin")
    if found:
        return found
    try:
        import nvidia
    except ImportError:
        return None
    for d in nvidia.__path__:
        for sub in ("cu13", "cuda_nvcc", "cuda_cuobjdump", "cuda_nvdisasm"):
            p = os.path.join(d, sub, "bin", "nvdisasm")
            if os.path.isfile(p):
                return p
    return None


class Error(Exception):
    """A build that cannot be compared (exit 2)."""


def normalise(lines):
    """A kernel's instructions and label lines, addresses left out and branch labels numbered
    afresh in order of first appearance (so a moved branch target still differs)."""
    names = {}

    def label(m):
        return "L%d" % names.setdefault(m.group(0), len(names))

    out = []
    for line in lines:
        line = re.sub(r"/\*[0-9a-f]+\*/", "", line).strip()
        out.append(re.sub(r"\.L_x_\d+", label, line))
    return out


def kernels(path, tool):
    """{kernel: [normalised SASS lines]} of the one cubin `path` is or embeds."""
    try:
        data = open(path, "rb").read()
    except OSError as e:
        raise Error(f"{path}: {e.strerror}")
    images = cubins(data)
    if len(images) != 1:
        raise Error(f"{path}: {len(images)} sm_90 cubins found, expected one")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(images[0])
        f.flush()
        run = subprocess.run([tool, "-c", f.name], capture_output=True, text=True)
    if run.returncode != 0:
        raise Error(f"{path}: nvdisasm failed: {run.stderr.strip()[:200]}")
    return parse(run.stdout)


def parse(text):
    """{kernel: [normalised SASS lines]} of nvdisasm's output: a kernel starts at its
    `.section .text.NAME` line."""
    raw = {}
    cur = None
    for line in text.splitlines():
        m = re.match(r"\s*\.section\s+\.text\.([^,\s]+)", line)
        if m:
            cur = m.group(1)
            raw[cur] = []
            continue
        t = line.strip()
        if cur is None or not t or t.startswith("//"):
            continue
        # Instructions (`/*addr*/ … ;`, a long one continued on the next lines) and branch
        # labels; the section's directives and the kernel's name lines are left out.
        if re.match(r"\.L_x_\d+:$", t) or (not t.startswith(".") and not t.endswith(":")):
            raw[cur].append(t)
    return {k: normalise(v) for k, v in raw.items()}


def count(sass):
    """Instructions: the lines that end an instruction (`;`)."""
    return sum(1 for l in sass if l.rstrip().endswith(";"))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--show", metavar="KERNEL", help="print this kernel's differing lines")
    args = ap.parse_args(argv)
    tool = nvdisasm()
    if tool is None:
        print("kernel_diff: nvdisasm not found (pip install nvidia-cuda-nvdisasm)", file=sys.stderr)
        return 2
    try:
        a, b = kernels(args.a, tool), kernels(args.b, tool)
    except Error as e:
        print(f"kernel_diff: {e}", file=sys.stderr)
        return 2
    only_a = sorted(set(a) - set(b))
    only_b = sorted(set(b) - set(a))
    differ = sorted(k for k in set(a) & set(b) if a[k] != b[k])
    same = len(set(a) & set(b)) - len(differ)
    for k in only_a:
        print(f"only in {args.a}: {k}")
    for k in only_b:
        print(f"only in {args.b}: {k}")
    for k in differ:
        print(f"differs: {k} ({count(a[k])} → {count(b[k])} instructions)")
    print(f"{same} identical, {len(differ)} differ, {len(only_a)} + {len(only_b)} in one build only")
    if args.show:
        if args.show not in a or args.show not in b:
            print(f"kernel_diff: {args.show} is not in both builds", file=sys.stderr)
            return 2
        sys.stdout.writelines(difflib.unified_diff(
            [l + "\n" for l in a[args.show]], [l + "\n" for l in b[args.show]], args.a, args.b, n=2))
    return 1 if differ or only_a or only_b else 0


if __name__ == "__main__":
    sys.exit(main())
