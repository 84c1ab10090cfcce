#!/usr/bin/env python3
"""CPU test of bench/torch_alternatives.py.

Builds small random inputs for every op of docs/ops.md, computes the
reference outputs with an independent float64 numpy implementation of the
formulas (written here, sharing no code with the script), writes a manifest
plus safetensors files in the input contract of torch_alternatives.py, runs
the script with ``--device cpu`` and checks each eager alternative's errors:
rel_l2 <= 1e-2 for f16/bf16 outputs and <= 1e-4 for f32/f64 outputs; for the
backward (autograd vs numpy analytic gradients from the identities of docs/ops.md §5)
<= 1e-3, except bf16 gradients whose storage rounding alone is ~1e-3 (1e-2).
torch-compile rows (with --with-compile) get 1e-3 for f32 outputs: inductor
by default skips the internal f32 -> 16-bit -> f32 roundings.
The numpy analytic backward is itself checked against finite differences.
It also unit-tests the kernel-record parsing used for GPU timing and the
timing bookkeeping (with a fake timer), and checks
that a broken entry gets an error row without stopping the run.

Run:  python3 bench/test_torch_alternatives.py [--with-compile]
(--with-compile also runs and checks the torch-compile alternatives; slow on
a CPU.)
"""

import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "torch_alternatives.py")

TORCH_DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}


# ---------------------------------------------------------------- numpy helpers

def q_np(x, dtype):
    """Round float64 values to f16 / bf16 (round to nearest even), back to f64."""
    x = np.asarray(x, dtype=np.float64)
    if dtype == "f16":
        return x.astype(np.float16).astype(np.float64)
    if dtype == "bf16":
        f = x.astype(np.float32)
        bits = f.view(np.uint32).astype(np.uint64)
        lsb = (bits >> 16) & 1
        bits = ((bits + 0x7FFF + lsb) >> 16) << 16
        return bits.astype(np.uint32).view(np.float32).astype(np.float64)
    if dtype == "f32":
        return x.astype(np.float32).astype(np.float64)
    raise ValueError(dtype)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def rmsnorm_np(x, w, eps):
    r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return x * r * w, r[..., 0]


def store(x, dtype):
    """numpy f64 -> torch tensor in the storage dtype."""
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64)).to(TORCH_DTYPES[dtype])


def stored_values(t):
    return t.to(torch.float64).numpy()


# ---------------------------------------------------------------- numpy references

def mhc_pre_np(phi, x, b, n, c, a_pre, a_post, a_res, repeat, s_eps):
    B = x.shape[0]
    x_res = np.zeros((B, n * c))
    x_layer = np.zeros((B, c))
    h_post = np.zeros((B, n))
    for beta in range(B):
        xb = x[beta]
        r = np.sqrt(np.sum(xb ** 2)) / np.sqrt(n * c) + 1e-4
        h = xb @ phi
        H_pre = sigmoid(a_pre * h[:n] / r + b[:n])
        h_post[beta] = 2.0 * sigmoid(a_post * h[n:2 * n] / r + b[n:2 * n])
        R = np.empty((n, n))
        for i in range(n):
            for k in range(n):
                R[i, k] = a_res * h[2 * n + i * n + k] / r + b[2 * n + i * n + k]
        R = np.exp(R - R.max(axis=1, keepdims=True))
        for _ in range(repeat):
            R = R / (R.sum(axis=1, keepdims=True) + s_eps)
            R = R / (R.sum(axis=0, keepdims=True) + s_eps)
        for i in range(n):
            for j in range(c):
                x_res[beta, i * c + j] = sum(R[i, k] * xb[k * c + j] for k in range(n))
        for j in range(c):
            x_layer[beta, j] = sum(H_pre[k] * xb[k * c + j] for k in range(n))
    return x_res, x_layer, h_post


def mhc_post_np(x_layer_out, h_post, x_res):
    B, n = h_post.shape
    c = x_layer_out.shape[1]
    out = np.zeros((B, n * c))
    for beta in range(B):
        for i in range(n):
            out[beta, i * c:(i + 1) * c] = h_post[beta, i] * x_layer_out[beta] + x_res[beta, i * c:(i + 1) * c]
    return out


def engram_fwd_np(H, k, v, wh, wv, cw, eps, dtype=None):
    """docs/ops.md §4 in f64; dtype=None means q = identity (the forward of docs/ops.md §5)."""
    q = (lambda a: a) if dtype is None else (lambda a: q_np(a, dtype))
    M, T, d = H.shape
    hn, rrms_h = rmsnorm_np(H, wh, eps)
    kn, rrms_k = rmsnorm_np(k, wh, eps)
    alpha = sigmoid(np.sum(hn * kn, axis=-1) / np.sqrt(d))
    vh = alpha[..., None] * v
    vhat = q(vh)
    u, rrms_v = rmsnorm_np(vhat, wv, eps)
    conv = np.zeros_like(u)
    for t in range(T):
        for p in range(4):
            if t - 3 + p >= 0:
                conv[:, t, :] += cw[p] * u[:, t - 3 + p, :]
    Y = conv * sigmoid(conv) + vh
    return dict(Y=Y, vhat=vhat, alpha=alpha, rrms_h=rrms_h, rrms_k=rrms_k, rrms_v=rrms_v,
                hn=hn, kn=kn, vh=vh, u=u, conv=conv)


def rmsnorm_bwd_np(dy, x, r, w):
    """y = x*r*w: dx = r*(dy*w) - x*r^3*mean(dy*w*x); dw = sum dy*x*r."""
    r = r[..., None]
    dx = r * (dy * w) - x * r ** 3 * np.mean(dy * w * x, axis=-1, keepdims=True)
    dw = np.sum(dy * x * r, axis=tuple(range(dy.ndim - 1)))
    return dx, dw


def engram_bwd_np(dY, H, k, v, wh, wv, cw, eps):
    """docs/ops.md §5 analytic gradients of L = sum(dY * Y), Y the f64 forward with q = identity."""
    f = engram_fwd_np(H, k, v, wh, wv, cw, eps, dtype=None)
    M, T, d = H.shape
    s = 1.0 / np.sqrt(d)
    conv, u, alpha = f["conv"], f["u"], f["alpha"]
    sg = sigmoid(conv)
    dconv = dY * sg * (1.0 + conv * (1.0 - sg))
    du = np.zeros_like(u)
    dcw = np.zeros_like(cw)
    for t in range(T):
        for p in range(4):
            if t + 3 - p < T:
                du[:, t, :] += cw[p] * dconv[:, t + 3 - p, :]
            if t - 3 + p >= 0:
                dcw[p] += np.sum(dconv[:, t, :] * u[:, t - 3 + p, :], axis=0)
    dx_u, dwv = rmsnorm_bwd_np(du, f["vh"], f["rrms_v"], wv)
    dvh = dY + dx_u
    dv = alpha[..., None] * dvh
    dz = alpha * (1.0 - alpha) * np.sum(dvh * v, axis=-1)
    dhn = dz[..., None] * s * f["kn"]
    dkn = dz[..., None] * s * f["hn"]
    dH, dwh1 = rmsnorm_bwd_np(dhn, H, f["rrms_h"], wh)
    dk, dwh2 = rmsnorm_bwd_np(dkn, k, f["rrms_k"], wh)
    return dict(dH=dH, dk=dk, dv=dv, drms_w_h=dwh1 + dwh2, drms_w_v=dwv, dconv_w=dcw)


def engram_decode_np(e_t, h_t, conv_state, W_K, W_V, wh, wv, cw, L, dil, K, eps, dtype):
    d = h_t.shape[-1]
    kk = e_t @ W_K
    vv = e_t @ W_V
    hn, _ = rmsnorm_np(h_t, wh, eps)
    kn, _ = rmsnorm_np(q_np(kk, dtype), wh, eps)
    alpha = sigmoid(np.sum(hn * kn, axis=-1, keepdims=True) / np.sqrt(d))
    vh = alpha * vv
    u, _ = rmsnorm_np(q_np(vh, dtype), wv, eps)
    conv = cw[K - 1] * u
    for p in range(K - 1):
        conv = conv + cw[p] * conv_state[:, L - (K - 1 - p) * dil, :]
    y = conv * sigmoid(conv) + vh
    new_state = np.concatenate([conv_state[:, 1:, :], q_np(u, dtype)[:, None, :]], axis=1)
    return y, new_state


def check_bwd_np_by_finite_differences():
    """The numpy analytic backward against central differences of the f64 forward."""
    rng = np.random.default_rng(7)
    M, T, d, eps = 2, 5, 6, 1e-6
    H = rng.standard_normal((M, T, d))
    k = rng.standard_normal((M, T, d)) * 0.5
    v = rng.standard_normal((M, T, d)) * 0.5
    wh = 1 + 0.3 * rng.standard_normal(d)
    wv = 1 + 0.3 * rng.standard_normal(d)
    cw = 0.5 * rng.standard_normal((4, d))
    dY = rng.standard_normal((M, T, d))
    args = dict(H=H, k=k, v=v, wh=wh, wv=wv, cw=cw)
    grads = engram_bwd_np(dY, H, k, v, wh, wv, cw, eps)
    gname = dict(H="dH", k="dk", v="dv", wh="drms_w_h", wv="drms_w_v", cw="dconv_w")

    def loss(a):
        return np.sum(dY * engram_fwd_np(a["H"], a["k"], a["v"], a["wh"], a["wv"], a["cw"], eps)["Y"])

    h = 1e-6
    for name, arr in args.items():
        num = np.zeros_like(arr)
        for idx in np.ndindex(arr.shape):
            plus = {kk: vv.copy() for kk, vv in args.items()}
            minus = {kk: vv.copy() for kk, vv in args.items()}
            plus[name][idx] += h
            minus[name][idx] -= h
            num[idx] = (loss(plus) - loss(minus)) / (2 * h)
        g = grads[gname[name]]
        err = np.linalg.norm(g - num) / np.linalg.norm(num)
        assert err < 1e-6, f"numpy analytic {gname[name]} vs finite differences: {err:.2e}"
    print("numpy analytic backward matches finite differences")


# ---------------------------------------------------------------- test data

def build_cases(rng):
    """Returns a list of (entry_without_file, tensors, output_dtypes)."""
    cases = []

    def rn(*shape, scale=1.0):
        return rng.standard_normal(shape) * scale

    # FFTC2CFwd: batched c64, multi-batch-dim c64, unbatched c128.
    for wl, shape, dt in (("b8-n64", (8, 64), "c64"), ("b2x3-n16", (2, 3, 16), "c64"),
                          ("nobatch-n32", (32,), "c128")):
        z = rn(*shape, 2)
        real_t = torch.float32 if dt == "c64" else torch.float64
        x = torch.from_numpy(z).to(real_t)
        xc = x.to(torch.float64).numpy()
        y = np.fft.fft(xc[..., 0] + 1j * xc[..., 1], axis=-1)
        ref = torch.from_numpy(np.stack([y.real, y.imag], axis=-1))
        cases.append(({"op": "FFTC2CFwd", "workload": wl, "dtype": dt, "params": {}},
                      {"x": x, "ref.y": ref}, {"y": "f32" if dt == "c64" else "f64"}))

    # MHCPreFwd (second case leaves out ref.h_post: the contract allows missing refs).
    for wl, (B, n, c, a_pre, a_post, a_res, rep, s_eps), drop in (
            ("B3-n4-c32", (3, 4, 32, 0.8, 1.3, 0.7, 2, 0.02), None),
            ("B2-n2-c16", (2, 2, 16, 1.0, 1.0, 1.0, 0, 0.05), "ref.h_post")):
        phi = store(rn(n * c, n * n + 2 * n), "f32")
        x = store(rn(B, n * c), "bf16")
        b = store(rn(n * n + 2 * n), "f32")
        x_res, x_layer, h_post = mhc_pre_np(stored_values(phi), stored_values(x), stored_values(b),
                                            n, c, a_pre, a_post, a_res, rep, s_eps)
        t = {"phi": phi, "x": x, "b": b, "ref.x_res": torch.from_numpy(x_res),
             "ref.x_layer": torch.from_numpy(x_layer), "ref.h_post": torch.from_numpy(h_post)}
        if drop:
            del t[drop]
        params = {"n": n, "c": c, "alpha_pre": a_pre, "alpha_post": a_post, "alpha_res": a_res,
                  "sinkhorn_repeat": rep, "sinkhorn_eps": s_eps}
        cases.append(({"op": "MHCPreFwd", "workload": wl, "dtype": "bf16", "params": params}, t,
                      {"x_res": "bf16", "x_layer": "bf16", "h_post": "f32"}))

    # MHCPostFwd
    B, n, c = 3, 4, 24
    xlo = store(rn(B, c), "bf16")
    hp = store(2 * (1 / (1 + np.exp(-rn(B, n)))), "f32")
    xr = store(rn(B, n * c), "bf16")
    out = mhc_post_np(stored_values(xlo), stored_values(hp), stored_values(xr))
    cases.append(({"op": "MHCPostFwd", "workload": "B3-n4-c24", "dtype": "bf16",
                   "params": {"n": n, "c": c}},
                  {"x_layer_out": xlo, "h_post": hp, "x_res": xr, "ref.x_out": torch.from_numpy(out)},
                  {"x_out": "bf16"}))

    # MHCPostPreFwd: the post half's stored output, then the pre half of it.
    phi = store(rn(n * c, n * n + 2 * n), "f32")
    b = store(rn(n * n + 2 * n), "f32")
    xo = store(out, "bf16")
    x_res, x_layer, h_post = mhc_pre_np(stored_values(phi), stored_values(xo), stored_values(b),
                                        n, c, 1.0, 1.0, 1.0, 1, 0.02)
    cases.append(({"op": "MHCPostPreFwd", "workload": "B3-n4-c24", "dtype": "bf16",
                   "params": {"n": n, "c": c, "alpha_pre": 1.0, "alpha_post": 1.0, "alpha_res": 1.0,
                              "sinkhorn_repeat": 1, "sinkhorn_eps": 0.02}},
                  {"x_layer_out": xlo, "h_post": hp, "x_res": xr, "phi": phi, "b": b,
                   "ref.x_out": torch.from_numpy(stored_values(xo)),
                   "ref.x_res": torch.from_numpy(x_res), "ref.x_layer": torch.from_numpy(x_layer),
                   "ref.h_post": torch.from_numpy(h_post)},
                  {"x_out": "bf16", "x_res": "bf16", "x_layer": "bf16", "h_post": "f32"}))

    eps = 1e-6
    for dt, (M, T, d) in (("f16", (2, 9, 32)), ("bf16", (3, 7, 48))):
        # Non-unit rms weights and larger scales than the anchor's draws.
        H = store(rn(M, T, d, scale=1.5), dt)
        k = store(rn(M, T, d, scale=0.7), dt)
        v = store(rn(M, T, d, scale=0.5), dt)
        wh = store(1 + 0.3 * rn(d), dt)
        wv = store(1 + 0.3 * rn(d), dt)
        cw = store(rn(4, d, scale=0.4), dt)
        Hn, kn_, vn, whn, wvn, cwn = map(stored_values, (H, k, v, wh, wv, cw))

        # EngramGateConvFwd
        f = engram_fwd_np(Hn, kn_, vn, whn, wvn, cwn, eps, dtype=dt)
        t = {"H": H, "k": k, "v": v, "rms_w_h": wh, "rms_w_v": wv, "conv_w": cw}
        for name in ("Y", "vhat", "alpha", "rrms_h", "rrms_k", "rrms_v"):
            t["ref." + name] = torch.from_numpy(np.ascontiguousarray(f[name]))
        cases.append(({"op": "EngramGateConvFwd", "workload": f"M{M}-T{T}-d{d}", "dtype": dt,
                       "params": {"eps": eps}}, t,
                      {"Y": dt, "vhat": dt, "alpha": "f32", "rrms_h": "f32", "rrms_k": "f32",
                       "rrms_v": "f32"}))

        # EngramGateConvBwd (saved tensors from the rounded forward, as the Rust side stores them)
        dY = store(rn(M, T, d, scale=0.3), dt)
        g = engram_bwd_np(stored_values(dY), Hn, kn_, vn, whn, wvn, cwn, eps)
        t = {"dY": dY, "H": H, "k": k, "v": v, "vhat": store(f["vhat"], dt),
             "rms_w_h": wh, "rms_w_v": wv, "conv_w": cw}
        for name in ("alpha", "rrms_h", "rrms_k", "rrms_v"):
            t[name] = store(f[name], "f32")
        for name, val in g.items():
            t["ref." + name] = torch.from_numpy(np.ascontiguousarray(val))
        cases.append(({"op": "EngramGateConvBwd", "workload": f"M{M}-T{T}-d{d}", "dtype": dt,
                       "params": {"eps": eps}}, t,
                      {"dH": dt, "dk": dt, "dv": dt, "drms_w_h": "f32", "drms_w_v": "f32",
                       "dconv_w": "f32"}))

    # EngramDecodeFwd
    for dt, (B, d_mem, d, L, dil, K) in (("f16", (3, 24, 16, 7, 2, 4)),
                                          ("bf16", (2, 40, 32, 4, 1, 4)),
                                          ("f16", (1, 16, 8, 9, 3, 3))):
        e_t = store(rn(B, d_mem, scale=0.5), dt)
        h_t = store(rn(B, d, scale=1.3), dt)
        cs = store(rn(B, L, d, scale=0.5), dt)
        W_K = store(rn(d_mem, d, scale=0.3), dt)
        W_V = store(rn(d_mem, d, scale=0.3), dt)
        wh = store(1 + 0.3 * rn(d), dt)
        wv = store(1 + 0.3 * rn(d), dt)
        cw = store(rn(K, d, scale=0.4), dt)
        y, ns = engram_decode_np(*map(stored_values, (e_t, h_t, cs, W_K, W_V, wh, wv, cw)),
                                 L, dil, K, eps, dt)
        t = {"e_t": e_t, "h_t": h_t, "conv_state": cs, "W_K": W_K, "W_V": W_V, "rms_w_h": wh,
             "rms_w_v": wv, "conv_w": cw, "ref.y_t": torch.from_numpy(y),
             "ref.new_conv_state": torch.from_numpy(ns)}
        cases.append(({"op": "EngramDecodeFwd", "workload": f"B{B}-L{L}-dil{dil}-K{K}", "dtype": dt,
                       "params": {"max_conv_len": L, "dilation": dil, "kernel_size": K, "eps": eps}},
                      t, {"y_t": dt, "new_conv_state": dt}))
    return cases


def tolerance(op, impl, out_dtype):
    if op == "EngramGateConvBwd":
        return 1e-2 if out_dtype == "bf16" else 1e-3
    if out_dtype in ("f16", "bf16"):
        return 1e-2
    # Inductor (default config) drops the f32 -> 16-bit -> f32 round trips that
    # the internal q(...) asks for, so f32 outputs downstream of them (rrms_v)
    # move by ~one 16-bit rounding.
    return 1e-3 if impl == "torch-compile" else 1e-4


# ---------------------------------------------------------------- tests

def test_kernel_records():
    """union_length, and kernel_interval on activity records laid out as CUPTI writes them."""
    import ctypes
    import struct
    sys.path.insert(0, HERE)
    import torch_alternatives as ta

    assert ta.union_length([(0, 10), (5, 12), (20, 25)]) == 17
    assert ta.union_length([(0, 10), (2, 3)]) == 10
    assert ta.union_length([]) == 0
    # kind u32, cache config u8, shared-memory config u8, registers u16, two u32 enums, start, end.
    kernel = struct.pack("<IBBHIIQQ", 10, 0, 0, 32, 0, 0, 1_000_123, 1_003_456)
    memset = struct.pack("<IBBHIIQQ", 2, 0, 0, 0, 0, 0, 5, 9)
    for raw, want in ((kernel, (1_000_123, 1_003_456)), (memset, None)):
        buf = ctypes.create_string_buffer(raw, len(raw))
        got = ta.kernel_interval(ctypes.addressof(buf))
        assert got == want, (got, want)
    print("union_length / kernel_interval ok")


def test_timing_flow():
    """run_entry's timing bookkeeping with a fake timer (no GPU here): call
    counts within [min, max] from the budget, forward-then-reverse order with
    half of the calls per pass, pooled statistics."""
    sys.path.insert(0, HERE)
    import argparse
    import torch_alternatives as ta

    class FakeTimer:
        def __init__(self):
            self.log = []

        def iteration_seconds(self, call, reps=5):
            return 0.01

        def profile(self, call, ncalls):
            call()
            self.log.append((call, ncalls))
            return [(1_000_000 * (len(self.log) * 1000 + i), 3) for i in range(ncalls)]

    rng = np.random.default_rng(5)
    B, n, c = 2, 4, 8
    with tempfile.TemporaryDirectory() as tmp:
        save_file({"x_layer_out": store(rng.standard_normal((B, c)), "bf16"),
                   "h_post": store(rng.standard_normal((B, n)), "f32"),
                   "x_res": store(rng.standard_normal((B, n * c)), "bf16")},
                  os.path.join(tmp, "post.safetensors"))
        entry = {"op": "MHCPostFwd", "workload": "w", "dtype": "bf16", "file": "post.safetensors",
                 "params": {"n": n, "c": c}}
        args = argparse.Namespace(skip_compile=False, min_calls=10, max_calls=100, budget_s=0.37)
        timer = FakeTimer()
        saved = ta._compile
        ta._compile = lambda fn: fn  # keep inductor out of this bookkeeping test
        try:
            rows = ta.run_entry(entry, tmp, torch.device("cpu"), timer, args)
        finally:
            ta._compile = saved
    assert [r["impl"] for r in rows] == ["torch-ref", "torch-compile"], rows
    (c_a, n_a), (c_b, n_b), (c_c, n_c), (c_d, n_d) = timer.log
    assert c_a is c_d and c_b is c_c and c_a is not c_b, "order must be a, b, b, a"
    assert (n_a, n_b, n_c, n_d) == (19, 19, 18, 18), timer.log
    for r in rows:
        assert "error" not in r, r
        assert r["calls"] == 37 and r["kernels_per_call"] == 3, r
        assert r["p10_ms"] <= r["ms"] <= r["p90_ms"], r
        assert r["errors"] == {} and r["rel_l2_err"] is None  # the file holds no ref.*
    # torch-ref: pass-1 samples (1000 + i) ms, i < 19, and pass-2 (4000 + i) ms, i < 18.
    want = float(np.median([1000 + i for i in range(19)] + [4000 + i for i in range(18)]))
    assert rows[0]["ms"] == want, (rows[0]["ms"], want)
    print("timing bookkeeping ok")


def test_package_host_times():
    """A package's host time per call is measured for every entry its op class can run; an
    entry it cannot set up is left out (its own run reports the error), not fatal."""
    sys.path.insert(0, HERE)
    import torch_alternatives as ta

    class Post(torch.nn.Module):  # a stand-in package: TileOPs' MHCPostFwdOp signature
        def forward(self, x_layer_out, h_post, x_res):
            return x_res.clone()

    cases = [c for c in build_cases(np.random.default_rng(7)) if c[0]["op"] == "MHCPostFwd"]
    with tempfile.TemporaryDirectory() as tmp:
        entries = []
        for entry, tensors, _ in cases:
            fname = f"{entry['workload']}.safetensors"
            save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(tmp, fname))
            entries.append(dict(entry, file=fname))
        entries.append({"op": "MHCPostFwd", "workload": "missing-file", "dtype": "bf16",
                        "file": "does-not-exist.safetensors", "params": {}})
        times = ta.package_host_times(entries, tmp, torch.device("cpu"), "stand-in",
                                      {"MHCPostFwdOp": Post})
    assert set(times) == {ta._entry_key(e) for e in entries[:-1]}, times
    assert all(t > 0 for t in times.values()), times
    print(f"host times ok ({len(times)} entries)")


def test_script(with_compile):
    rng = np.random.default_rng(1234)
    cases = build_cases(rng)
    with tempfile.TemporaryDirectory() as tmp:
        entries = []
        for i, (entry, tensors, _) in enumerate(cases):
            fname = f"{entry['op']}__{entry['workload']}__{entry['dtype']}.safetensors"
            save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(tmp, fname))
            entries.append(dict(entry, file=fname))
        # A broken entry: must give an error row and not stop the run.
        entries.insert(1, {"op": "MHCPostFwd", "workload": "missing-file", "dtype": "bf16",
                           "file": "does-not-exist.safetensors", "params": {}})
        manifest = os.path.join(tmp, "manifest.json")
        with open(manifest, "w") as f:
            json.dump({"entries": entries}, f)
        out_path = os.path.join(tmp, "alternatives.json")
        cmd = [sys.executable, SCRIPT, "--manifest", manifest, "--out", out_path, "--device", "cpu"]
        if not with_compile:
            cmd.append("--skip-compile")
        proc = subprocess.run(cmd, capture_output=True, text=True)
        print(proc.stdout)
        if proc.returncode != 0:
            print(proc.stderr)
        assert proc.returncode == 0, f"script exited {proc.returncode}"
        with open(out_path) as f:
            doc = json.load(f)

        # Unreadable manifest -> non-zero exit.
        bad = subprocess.run([sys.executable, SCRIPT, "--manifest", os.path.join(tmp, "nope.json"),
                              "--out", os.path.join(tmp, "x.json"), "--device", "cpu"],
                             capture_output=True, text=True)
        assert bad.returncode != 0

        # The profiling script on the same manifest: the row's inputs, the implementations
        # built by the same code, each output's error against the reference, then the calls.
        check_peer_profile(manifest, cases)

    assert doc["torch"] == torch.__version__ and doc["device"] == "cpu"
    rows = doc["rows"]
    broken = [r for r in rows if r["workload"] == "missing-file"]
    assert len(broken) == 1 and "error" in broken[0], broken

    failures = []
    checked = 0
    for entry, tensors, out_dtypes in cases:
        mine = [r for r in rows if (r["op"], r["workload"], r["dtype"]) ==
                (entry["op"], entry["workload"], entry["dtype"])]
        impls = {r["impl"] for r in mine}
        eager = "torch-cufft" if entry["op"] == "FFTC2CFwd" else (
            "torch" if entry["op"] == "EngramGateConvBwd" else "torch-ref")
        want = {eager} | ({"torch-compile"} if with_compile else set())
        if impls != want:
            failures.append(f"{entry['op']} {entry['workload']}: impls {impls} != {want}")
            continue
        refs = {k[4:] for k in tensors if k.startswith("ref.")}
        for r in mine:
            tag = f"{r['op']} {r['workload']} {r['dtype']} {r['impl']}"
            if r.get("error"):
                failures.append(f"{tag}: error {r['error']}")
                continue
            assert r["ms"] is None
            if set(r["errors"]) != refs:
                failures.append(f"{tag}: error outputs {set(r['errors'])} != refs {refs}")
            for name, e in r["errors"].items():
                tol = tolerance(r["op"], r["impl"], out_dtypes[name])
                checked += 1
                if e["rel_l2_err"] is None or e["rel_l2_err"] > tol:
                    failures.append(f"{tag} {name}: rel_l2 {e['rel_l2_err']} > {tol}")
            worst = max(e["rel_l2_err"] for e in r["errors"].values())
            if abs(r["rel_l2_err"] - worst) > 0:
                failures.append(f"{tag}: row rel_l2 {r['rel_l2_err']} != worst {worst}")
    for f_ in failures:
        print("FAIL:", f_)
    assert not failures, f"{len(failures)} failures"
    print(f"script rows ok ({checked} output errors checked)")


PEER_PROFILE = os.path.join(HERE, "peer_profile.py")


def check_peer_profile(manifest, cases):
    """`bench/peer_profile.py --device cpu` (its dry run: no flush, no NVTX) on one row of each
    of two ops: it must find the row, build its eager alternative, report a finite error small
    against the reference and make every call."""
    done = 0
    for op, impl in (("MHCPostFwd", "torch-ref"), ("FFTC2CFwd", "torch-cufft")):
        entry = next(e for e, _, _ in cases if e["op"] == op)
        names = [e["workload"] for e, _, _ in cases if e["op"] == op]
        name = entry["workload"] if names.count(entry["workload"]) == 1 else f"{entry['workload']}-{entry['dtype']}"
        row = [sys.executable, PEER_PROFILE, "--manifest", manifest, "--op", op, "--workload", name,
               "--device", "cpu"]
        proc = subprocess.run(row + ["--impl", impl, "--calls", "2", "--warmup", "1"], capture_output=True, text=True)
        assert proc.returncode == 0, f"peer_profile {op} {name}: {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        lines = proc.stdout.strip().splitlines()
        assert lines[-1] == f"peer_profile: {op} {name}: 2 profiled calls each of {impl}", lines
        head = [ln for ln in lines if ln.startswith(f"{impl}: rel_l2 ")]
        assert len(head) == 1 and "non-finite" not in head[0], lines
        rel = float(head[0].split()[2].rstrip(","))
        assert 0 <= rel < (1e-2 if op == "MHCPostFwd" else 1e-5), head
        done += 1
        # An implementation the op does not have is refused with the ones it has.
        bad = subprocess.run(row + ["--impl", "nope"], capture_output=True, text=True)
        assert bad.returncode == 2 and f"has no implementation nope (one of: {impl}" in bad.stderr, bad.stderr
    print(f"peer_profile dry runs ok ({done} rows)")


def main():
    with_compile = "--with-compile" in sys.argv[1:]
    torch.manual_seed(0)
    test_kernel_records()
    test_timing_flow()
    check_bwd_np_by_finite_differences()
    test_package_host_times()
    test_script(with_compile)
    print("5 passed, 0 failed")


if __name__ == "__main__":
    main()
