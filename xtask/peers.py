#!/usr/bin/env python3
"""Packs the peer alternatives for a GPU machine without a network (run by `cargo xtask peers`).

TileOPs 0.1.0 and the exact versions it runs with on torch 2.11 / Python 3.12 are downloaded as
wheels from PyPI into DIR/wheels, unpacked into one site folder (DIR/site), trimmed of what a
CUDA machine never loads, and packed as DIR/peers.tar.xz (about 36 MB). `.device/run.sh` unpacks
it into a temporary folder and puts it on PYTHONPATH before the bench.

Versions: tilelang 0.1.12 is tileops 0.1.0's pin; apache-tvm-ffi 0.1.11 because tilelang 0.1.12
needs <= 0.1.11 (0.1.12 aborts the import); libtvm_compiler links z3. tileops declares
torch >= 2.13 but imports and runs correctly on torch 2.11, hence --no-deps.

Usage: python3 xtask/peers.py DIR
       python3 xtask/peers.py --pins   (prints the pinned requirements, for `cargo xtask bench`)
"""
import lzma
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import zipfile

WHEELS = ["tileops==0.1.0", "tilelang==0.1.12", "apache-tvm-ffi==0.1.11", "z3-solver==4.15.4.0",
          "torch-c-dlpack-ext==0.1.5"]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64"]


def download(wheels: str):
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
           "--no-deps", "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
           "-d", wheels]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    subprocess.run(cmd + WHEELS, check=True)


def unpack(wheels: str, site: str):
    shutil.rmtree(site, ignore_errors=True)
    os.makedirs(site)
    for name in sorted(os.listdir(wheels)):
        if not name.endswith(".whl"):
            continue
        with zipfile.ZipFile(os.path.join(wheels, name)) as z:
            for info in z.infolist():
                path = z.extract(info, site)
                mode = info.external_attr >> 16
                if mode and not info.is_dir():
                    os.chmod(path, stat.S_IMODE(mode) | stat.S_IRUSR)


def trim(site: str):
    # ROCm only (44 MB); a z3 executable nobody runs; libz3.so twice (keep the versioned file).
    shutil.rmtree(os.path.join(site, "tilelang", "3rdparty", "composable_kernel"), ignore_errors=True)
    for name in os.listdir(site):
        if name.startswith("z3_solver-") and name.endswith(".data"):
            shutil.rmtree(os.path.join(site, name))
    lib = os.path.join(site, "z3", "lib")
    versioned = sorted(n for n in os.listdir(lib) if n.startswith("libz3.so."))
    if versioned and os.path.isfile(os.path.join(lib, "libz3.so")):
        os.remove(os.path.join(lib, "libz3.so"))
        os.symlink(versioned[-1], os.path.join(lib, "libz3.so"))


def pack(site: str, out: str):
    tmp = out + ".tmp"
    with lzma.open(tmp, "w", preset=6) as f, tarfile.open(fileobj=f, mode="w") as t:
        t.add(site, arcname="site")
    os.replace(tmp, out)


def main() -> int:
    if sys.argv[1:] == ["--pins"]:
        print(" ".join(WHEELS))
        return 0
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    top = sys.argv[1]
    wheels, site, out = (os.path.join(top, n) for n in ("wheels", "site", "peers.tar.xz"))
    # Only the pinned wheels: a folder left from other pins would mix versions.
    shutil.rmtree(wheels, ignore_errors=True)
    os.makedirs(wheels)
    download(wheels)
    unpack(wheels, site)
    trim(site)
    pack(site, out)
    shutil.rmtree(site)
    print(f"peers: {out} ({os.path.getsize(out) / 2**20:.1f} MiB): {', '.join(WHEELS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
