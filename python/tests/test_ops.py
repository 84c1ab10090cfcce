"""Tests of the rgk PyTorch package. The CPU tests run anywhere torch imports (CI); the GPU
tests need a CUDA device and compare every op with the torch formulas of docs/ops.md
(bench/torch_alternatives.py), through the functional API and the TileOPs-compatible classes,
plus autograd, torch.compile, CUDA graph capture and torch.library.opcheck."""
import math
import os
import sys

import pytest
import torch

import rgk

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import torch_alternatives as ref  # noqa: E402

GPU = torch.cuda.is_available() and rgk.cuda_available()
gpu = pytest.mark.skipif(not GPU, reason="skipped: no CUDA device")
DEV = "cuda"



# ---------------------------------------------------------------------------------------------
# Shapes of the ops' inputs (seed workloads and a few others)
# ---------------------------------------------------------------------------------------------

def pre_inputs(batch, n, c, device, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    m = n * n + 2 * n
    phi = (torch.randn(n * c, m, generator=g) / math.sqrt(n * c)).to(device)
    x = torch.randn(batch, n * c, generator=g).to(torch.bfloat16).to(device)
    b = (0.1 * torch.randn(m, generator=g)).to(device)
    return phi, x, b


def post_inputs(batch, n, c, device, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    x_layer_out = torch.randn(batch, c, generator=g).to(torch.bfloat16).to(device)
    h_post = (2 * torch.rand(batch, n, generator=g)).to(device)
    x_res = torch.randn(batch, n * c, generator=g).to(torch.bfloat16).to(device)
    return x_layer_out, h_post, x_res


def gate_inputs(m, t, d, dtype, device, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    h, k, v = (torch.randn(m, t, d, generator=g).to(dtype).to(device) for _ in range(3))
    rms_w_h = (1 + 0.2 * torch.randn(d, generator=g)).to(dtype).to(device)
    rms_w_v = (1 + 0.2 * torch.randn(d, generator=g)).to(dtype).to(device)
    conv_w = (0.5 * torch.randn(4, d, generator=g)).to(dtype).to(device)
    return h, k, v, rms_w_h, rms_w_v, conv_w


def decode_inputs(batch, d_mem, d, L, K, dtype, device, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    r = lambda *s, scale=1.0: (scale * torch.randn(*s, generator=g)).to(dtype).to(device)  # noqa: E731
    return (r(batch, d_mem), r(batch, d), r(batch, L, d), r(d_mem, d, scale=d_mem ** -0.5),
            r(d_mem, d, scale=d_mem ** -0.5), (1 + r(d, scale=0.2).float()).to(dtype),
            (1 + r(d, scale=0.2).float()).to(dtype), r(K, d, scale=0.5))


# ---------------------------------------------------------------------------------------------
# CPU: import, fake-tensor shapes, invalid inputs
# ---------------------------------------------------------------------------------------------

def test_import_without_gpu_and_ops_registered():
    for name in ("fft_c2c", "mhc_post", "mhc_pre", "mhc_post_pre", "gate_conv_fwd", "gate_conv_bwd",
                 "decode_fwd"):
        assert hasattr(torch.ops.rgk, name)
    assert isinstance(rgk.cuda_available(), bool)


def test_fake_tensor_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        x = torch.empty(3, 5, 256, dtype=torch.complex128, device=DEV)
        y = rgk.ops.fft_c2c(x)
        assert y.shape == x.shape and y.dtype == x.dtype
        x_res, x_layer, h_post = rgk.ops.mhc_pre(*pre_inputs(2, 4, 1920, "meta"))
        assert (x_res.shape, x_layer.shape, h_post.shape) == ((2, 7680), (2, 1920), (2, 4))
        assert (x_res.dtype, x_layer.dtype, h_post.dtype) == (torch.bfloat16,) * 2 + (torch.float32,)
        out = rgk.ops.mhc_post(*post_inputs(4, 4, 2560, "meta"))
        assert out.shape == (4, 10240) and out.dtype == torch.bfloat16
        phi, _, b = pre_inputs(4, 4, 2560, "meta")
        outs = rgk.ops.mhc_post_pre(*post_inputs(4, 4, 2560, "meta"), phi, b)
        assert [tuple(o.shape) for o in outs] == [(4, 10240), (4, 10240), (4, 2560), (4, 4)]
        assert [o.dtype for o in outs] == [torch.bfloat16] * 3 + [torch.float32]
        outs = rgk.ops.gate_conv_fwd(*gate_inputs(2, 64, 512, torch.float16, "meta"))
        assert [tuple(o.shape) for o in outs] == [(2, 64, 512)] * 2 + [(2, 64)] * 4
        assert [o.dtype for o in outs] == [torch.float16] * 2 + [torch.float32] * 4
        h, k, v, wh, wv, cw = gate_inputs(2, 64, 512, torch.bfloat16, "meta")
        f32 = torch.empty(2, 64, device="meta")
        grads = rgk.ops.gate_conv_bwd(h, h, k, v, wh, wv, cw, f32, f32, f32)
        assert [tuple(o.shape) for o in grads] == [(2, 64, 512)] * 3 + [(512,), (512,), (4, 512)]
        y_t, state = rgk.ops.decode_fwd(*decode_inputs(4, 1024, 512, 20, 4, torch.float16, "meta"),
                                        dilation=5)
        assert y_t.shape == (4, 512) and state.shape == (4, 20, 512)


def assert_not_direct(t):
    assert not rgk.ops._direct(t)


def test_front_end_goes_through_the_dispatcher_when_it_must():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from rgk.ops import _direct
    x = torch.zeros(4, dtype=torch.complex64)
    assert _direct(x, torch.nn.Parameter(torch.zeros(2), requires_grad=False))
    assert not _direct(x, torch.zeros(2, requires_grad=True))  # a gradient to record
    with torch.no_grad():
        assert _direct(x, torch.zeros(2, requires_grad=True))
    assert not _direct(torch.zeros(2, device="meta"))  # shapes from the fake implementation
    with FakeTensorMode():
        assert not _direct(torch.zeros(2))
    with torch.autograd.profiler.profile():
        assert not _direct(x)
    assert not _direct(x, [1, 2])
    # Lazy conjugate and negative views: the dispatcher materialises them.
    assert not _direct(x.conj())
    assert not _direct(x, torch._neg_view(torch.zeros(2)))
    # torch.jit.trace must see the op; forward-mode AD must see its duals.
    torch.jit.trace(lambda t: (assert_not_direct(t), t + 1)[1], (torch.zeros(2),), check_trace=False)
    import torch.autograd.forward_ad as fwAD
    with fwAD.dual_level():
        assert not _direct(fwAD.make_dual(torch.zeros(2), torch.ones(2)))
    with torch.overrides.TorchFunctionMode():
        assert not _direct(x)
    # Meta tensors outside a fake mode: shapes, nothing launched.
    assert rgk.ops.mhc_post(*post_inputs(3, 4, 64, "meta")).shape == (3, 256)


@pytest.mark.parametrize("call, arg", [
    (lambda: rgk.ops.fft_c2c(torch.zeros(8, dtype=torch.complex64)), "x"),
    (lambda: rgk.ops.mhc_post(*post_inputs(1, 4, 64, "cpu")), "x_layer_out"),
    (lambda: rgk.ops.mhc_pre(*pre_inputs(1, 4, 64, "cpu")), "x"),
    (lambda: rgk.ops.mhc_post_pre(*post_inputs(1, 4, 64, "cpu"), *pre_inputs(1, 4, 64, "cpu")[::2]),
     "x_layer_out"),
    (lambda: rgk.ops.gate_conv_fwd(*gate_inputs(1, 8, 64, torch.float16, "cpu")), "h"),
    (lambda: rgk.ops.decode_fwd(*decode_inputs(1, 64, 32, 8, 4, torch.bfloat16, "cpu")), "e_t"),
])
def test_cpu_tensors_raise_naming_the_argument(call, arg):
    with pytest.raises(ValueError, match=f"`{arg}`.*not a CUDA tensor"):
        call()


def test_wrong_rank_raises_naming_the_argument():
    with pytest.raises(ValueError, match="`h_post`"):
        rgk.ops.mhc_post(torch.zeros(2, 64, dtype=torch.bfloat16), torch.zeros(8),
                         torch.zeros(2, 256, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="`x_layer_out`.*expected a tensor"):
        rgk._rgk.mhc_post([1.0], torch.zeros(2, 4), torch.zeros(2, 256, dtype=torch.bfloat16), False)
    with pytest.raises(ValueError, match="`phi`.*n² \\+ 2n"):
        rgk.ops.mhc_pre(torch.zeros(64, 23), torch.zeros(1, 64, dtype=torch.bfloat16), torch.zeros(23))
    # Shapes whose outputs the kernels would leave partly unwritten are refused.
    with pytest.raises(ValueError, match="`phi`.*positive multiple"):
        rgk.ops.mhc_pre(torch.zeros(0, 24), torch.zeros(1, 0, dtype=torch.bfloat16), torch.zeros(24))
    with pytest.raises(ValueError, match="`h_post`.*no streams"):
        rgk.ops.mhc_post_pre(torch.zeros(1, 64, dtype=torch.bfloat16), torch.zeros(1, 0),
                             torch.zeros(1, 0, dtype=torch.bfloat16), torch.zeros(0, 0), torch.zeros(0))


def test_tileops_class_arguments_checked():
    with pytest.raises(ValueError, match="`eps`"):
        rgk.EngramGateConvFwdOp(eps=1e-5)
    with pytest.raises(ValueError, match="`target`"):
        rgk.FFTC2CFwdOp(target="cuda")


# ---------------------------------------------------------------------------------------------
# GPU: values against the torch formulas
# ---------------------------------------------------------------------------------------------

def rel_l2(a, b):
    a, b = torch.view_as_real(a) if a.is_complex() else a, torch.view_as_real(b) if b.is_complex() else b
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@gpu
@pytest.mark.parametrize("shape, dtype", [
    ((4096,), torch.complex64), ((64, 4096), torch.complex64), ((64, 4096), torch.complex128),
    ((8, 65536), torch.complex64), ((256, 1024), torch.complex64), ((3, 5, 256), torch.complex128),
    ((7, 1), torch.complex64), ((2, 1 << 20), torch.complex128), ((300, 1024), torch.complex64),
])
def test_fft_matches_f64_and_is_no_less_accurate_than_cufft(shape, dtype):
    g = torch.Generator(device="cpu").manual_seed(sum(shape))
    x = torch.randn(*shape, dtype=dtype, generator=g).to(DEV)
    y_ref = torch.fft.fft(x.to(torch.complex128))
    y = rgk.ops.fft_c2c(x)
    assert y.dtype == dtype and y.shape == x.shape
    ours = rel_l2(y, y_ref)
    if dtype == torch.complex64:
        cufft = rel_l2(torch.fft.fft(x), y_ref)
        assert ours <= cufft, (ours, cufft)  # docs/ops.md §1: never less accurate than cuFFT
    else:  # the reference is cuFFT itself: a bound a few units of f64 rounding wide
        assert ours < 1.5e-15, ours
    # Deterministic, and the class front end is the same op.
    assert torch.equal(rgk.FFTC2CFwdOp()(x), y)


@gpu
@pytest.mark.parametrize("batch, n, c", [(1, 4, 1280), (2, 4, 1920), (4, 4, 2560), (3, 2, 100), (5, 4, 8)])
def test_mhc_post_matches_formula(batch, n, c):
    x_layer_out, h_post, x_res = post_inputs(batch, n, c, DEV, seed=c)
    out = rgk.MHCPostFwdOp()(x_layer_out, h_post, x_res)
    want = ref.mhc_post_fwd(x_layer_out, h_post, x_res)
    torch.testing.assert_close(out.float(), want.float(), rtol=2 ** -7, atol=1e-6)


@gpu
@pytest.mark.parametrize("batch, n, c", [(1, 4, 1280), (2, 4, 1920), (4, 4, 2560), (3, 6, 96), (2, 1, 64)])
def test_mhc_pre_matches_formula(batch, n, c):
    phi, x, b = pre_inputs(batch, n, c, DEV, seed=c)
    params = (1.0, 0.8, 1.2, 2, 0.02)
    for _ in range(2):  # the second call runs on the cached plan and workspace
        x_res, x_layer, h_post = rgk.MHCPreFwdOp(*params)(phi, x, b)
    w_res, w_layer, w_post = ref.make_mhc_pre_fwd(n, c, *params)(phi, x, b)
    torch.testing.assert_close(x_res.float(), w_res.float(), rtol=2 ** -7, atol=1e-3)
    torch.testing.assert_close(x_layer.float(), w_layer.float(), rtol=2 ** -7, atol=1e-3)
    torch.testing.assert_close(h_post, w_post, rtol=1e-5, atol=1e-6)


@gpu
@pytest.mark.parametrize("batch, n, c", [(1, 4, 1280), (2, 4, 1920), (4, 4, 2560), (3, 2, 100), (2, 6, 64)])
def test_mhc_post_pre_is_post_then_pre_bitwise(batch, n, c):
    x_layer_out, h_post, x_res = post_inputs(batch, n, c, DEV, seed=c)
    phi, _, b = pre_inputs(batch, n, c, DEV, seed=c + 1)
    params = (1.0, 0.8, 1.2, 2, 0.02)
    for _ in range(2):  # the second call runs on the cached plan and workspace
        ours = rgk.ops.mhc_post_pre(x_layer_out, h_post, x_res, phi, b, *params)
    x_out = rgk.ops.mhc_post(x_layer_out, h_post, x_res)
    want = (x_out,) + rgk.ops.mhc_pre(phi, x_out, b, *params)
    for name, o, w in zip(("x_out", "x_res", "x_layer", "h_post"), ours, want):
        assert torch.equal(o.view(torch.int16 if o.dtype == torch.bfloat16 else torch.int32),
                           w.view(torch.int16 if w.dtype == torch.bfloat16 else torch.int32)), name


GATE_SHAPES = [((1, 32, 256), torch.float16), ((2, 64, 512), torch.float16),
               ((1, 128, 256), torch.bfloat16), ((3, 96, 768), torch.bfloat16),
               ((2, 5, 24), torch.float16)]


@gpu
@pytest.mark.parametrize("shape, dtype", GATE_SHAPES)
def test_gate_conv_fwd_matches_formula(shape, dtype):
    ins = gate_inputs(*shape, dtype, DEV, seed=shape[2])
    outs = rgk.EngramGateConvFwdOp()(*ins)
    want = ref.engram_gate_conv_fwd(*ins, 1e-6)
    tol = dict(rtol=2 ** -7, atol=1e-2) if dtype == torch.bfloat16 else dict(rtol=2 ** -10, atol=2e-3)
    for name, o, w in zip(("y", "vhat", "alpha", "rrms_h", "rrms_k", "rrms_v"), outs, want):
        assert o.dtype == w.dtype, name
        if o.dtype == torch.float32:
            torch.testing.assert_close(o, w, rtol=1e-5, atol=1e-6, msg=name)
        else:
            torch.testing.assert_close(o.float(), w.float(), **tol, msg=name)


def gate_grads_reference(ins, dy):
    leaves = [t.float().detach().requires_grad_(True) for t in ins]
    y = ref.engram_gate_conv_fwd(*leaves, 1e-6)[0]
    return torch.autograd.grad(y, leaves, dy.float())


@gpu
@pytest.mark.parametrize("shape, dtype", GATE_SHAPES)
def test_gate_conv_bwd_and_autograd_match_autograd_of_the_f32_forward(shape, dtype):
    ins = gate_inputs(*shape, dtype, DEV, seed=shape[1])
    dy = torch.randn(*shape, generator=torch.Generator().manual_seed(1)).to(dtype).to(DEV)
    want = gate_grads_reference(ins, dy)
    _, vhat, alpha, rrms_h, rrms_k, rrms_v = rgk.ops.gate_conv_fwd(*ins)
    got = rgk.EngramGateConvBwdOp()(dy, *ins, vhat, alpha, rrms_h, rrms_k, rrms_v)
    for name, o, w in zip(("dh", "dk", "dv", "drms_w_h", "drms_w_v", "dconv_w"), got, want):
        err = rel_l2(o, w)
        assert err < (2e-2 if o.dtype == torch.bfloat16 else 4e-3), (name, err)
    leaves = [t.detach().requires_grad_(True) for t in ins]
    y = rgk.ops.gate_conv_fwd(*leaves)[0]
    y.backward(dy)
    for name, leaf, o in zip(("h", "k", "v", "rms_w_h", "rms_w_v", "conv_w"), leaves, got):
        assert leaf.grad.dtype == leaf.dtype, name
        torch.testing.assert_close(leaf.grad, o.to(leaf.dtype), rtol=0, atol=0, msg=name)


@gpu
@pytest.mark.parametrize("batch, d_mem, d, L, dilation, K, dtype", [
    (1, 512, 256, 12, 3, 4, torch.float16), (4, 1024, 512, 20, 5, 4, torch.float16),
    (8, 512, 256, 18, 3, 4, torch.bfloat16), (3, 96, 40, 6, 1, 3, torch.bfloat16),
])
def test_decode_matches_formula(batch, d_mem, d, L, dilation, K, dtype):
    ins = decode_inputs(batch, d_mem, d, L, K, dtype, DEV, seed=d)
    y_t, state = rgk.EngramDecodeFwdOp(L, K, dilation)(*ins)
    w_y, w_state = ref.make_engram_decode_fwd(L, dilation, K, 1e-6)(*ins)
    tol = dict(rtol=2 ** -7, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=2 ** -10, atol=4e-3)
    torch.testing.assert_close(y_t.float(), w_y.float(), **tol)
    torch.testing.assert_close(state[:, :-1], w_state[:, :-1], rtol=0, atol=0)
    torch.testing.assert_close(state[:, -1].float(), w_state[:, -1].float(), **tol)
    with pytest.raises(RuntimeError, match="inference-only"):
        leaves = [t.detach().requires_grad_(True) for t in ins]
        rgk.ops.decode_fwd(*leaves, dilation=dilation)[0].float().sum().backward()


# ---------------------------------------------------------------------------------------------
# GPU: autograd of FFT, post and pre; invalid CUDA tensors
# ---------------------------------------------------------------------------------------------

@gpu
def test_fft_autograd_matches_torch():
    x = torch.randn(4, 1024, dtype=torch.complex128, device=DEV)
    g = torch.randn(4, 1024, dtype=torch.complex128, device=DEV)
    a = x.clone().requires_grad_(True)
    rgk.ops.fft_c2c(a).backward(g)
    b = x.clone().requires_grad_(True)
    torch.fft.fft(b).backward(g)
    assert rel_l2(a.grad, b.grad) < 1e-14


@gpu
def test_mhc_post_and_pre_autograd_match_torch():
    x_layer_out, h_post, x_res = post_inputs(2, 4, 256, DEV)
    leaves = [t.detach().float().requires_grad_(True) for t in (x_layer_out, h_post, x_res)]
    g = torch.randn(2, 1024, device=DEV)
    ref.mhc_post_fwd(*leaves).float().backward(g)
    ours = [t.detach().clone().requires_grad_(True) for t in (x_layer_out, h_post, x_res)]
    rgk.ops.mhc_post(*ours).float().backward(g)
    for name, o, w in zip(("x_layer_out", "h_post", "x_res"), ours, leaves):
        assert o.grad.dtype == o.dtype, name
        assert rel_l2(o.grad.float(), w.grad) < 1e-2, name
    phi, x, b = pre_inputs(2, 4, 256, DEV)
    leaves = [t.detach().clone().requires_grad_(True) for t in (phi, x, b)]
    outs = rgk.ops.mhc_pre(*leaves)
    sum(o.float().square().sum() for o in outs).backward()
    wl = [t.detach().float().requires_grad_(True) for t in (phi, x, b)]
    wo = ref.make_mhc_pre_fwd(4, 256, 1.0, 1.0, 1.0, 1, 0.02)(*wl)  # an independent formula
    sum(o.to(t.dtype).float().square().sum() for o, t in zip(wo, outs)).backward()
    for name, o, w in zip(("phi", "x", "b"), leaves, wl):
        assert rel_l2(o.grad.float(), w.grad) < 2e-2, name


@gpu
def test_mhc_post_pre_autograd_matches_the_two_ops():
    ins = post_inputs(2, 4, 256, DEV) + pre_inputs(2, 4, 256, DEV)[::2]
    ours = [t.detach().clone().requires_grad_(True) for t in ins]
    outs = rgk.ops.mhc_post_pre(*ours)
    sum(o.float().square().sum() for o in outs).backward()
    theirs = [t.detach().clone().requires_grad_(True) for t in ins]
    x_out = rgk.ops.mhc_post(*theirs[:3])
    wo = (x_out,) + rgk.ops.mhc_pre(theirs[3], x_out, theirs[4])
    sum(o.float().square().sum() for o in wo).backward()
    for name, o, w in zip(("x_layer_out", "h_post", "x_res", "phi", "b"), ours, theirs):
        assert o.grad.dtype == o.dtype, name
        assert rel_l2(o.grad.float(), w.grad.float()) < 2e-2, name


@gpu
def test_invalid_cuda_tensors_raise_naming_the_argument():
    x_layer_out, h_post, x_res = post_inputs(2, 4, 64, DEV)
    with pytest.raises(ValueError, match="`h_post`.*dtype"):
        rgk.ops.mhc_post(x_layer_out, h_post.double(), x_res)
    with pytest.raises(ValueError, match="`x_res`.*shape"):
        rgk.ops.mhc_post(x_layer_out, h_post, x_res[:, :-8])
    with pytest.raises(ValueError, match="`x_layer_out`.*contiguous"):
        rgk.ops.mhc_post(torch.empty(64, 2, dtype=torch.bfloat16, device=DEV).t(), h_post, x_res)
    with pytest.raises(ValueError, match="`x`.*power of two|`n`|length"):
        rgk.ops.fft_c2c(torch.zeros(3, 12, dtype=torch.complex64, device=DEV))
    h, k, v, wh, wv, cw = gate_inputs(1, 8, 64, torch.float16, DEV)
    with pytest.raises(ValueError, match="`k`.*dtype"):
        rgk.ops.gate_conv_fwd(h, k.bfloat16(), v, wh, wv, cw)
    with pytest.raises(ValueError, match="`h`.*no channels"):
        rgk.ops.gate_conv_fwd(*gate_inputs(1, 8, 0, torch.float16, DEV))


# ---------------------------------------------------------------------------------------------
# GPU: opcheck, torch.compile, CUDA graphs, a training step
# ---------------------------------------------------------------------------------------------

def op_samples():
    gi = gate_inputs(2, 16, 64, torch.bfloat16, DEV)
    _, _, alpha, rrms_h, rrms_k, _ = rgk.ops.gate_conv_fwd(*gi)
    dy = torch.randn(2, 16, 64, device=DEV).bfloat16()
    return [
        (torch.ops.rgk.fft_c2c, (torch.randn(4, 256, dtype=torch.complex64, device=DEV),)),
        (torch.ops.rgk.mhc_post, post_inputs(2, 4, 64, DEV)),
        (torch.ops.rgk.mhc_pre, pre_inputs(2, 4, 64, DEV) + (1.0, 1.0, 1.0, 1, 0.02)),
        (torch.ops.rgk.mhc_post_pre,
         post_inputs(2, 4, 64, DEV) + pre_inputs(2, 4, 64, DEV)[::2] + (1.0, 1.0, 1.0, 1, 0.02)),
        (torch.ops.rgk.gate_conv_fwd, gi),
        (torch.ops.rgk.gate_conv_bwd, (dy,) + gi + (alpha, rrms_h, rrms_k)),
        (torch.ops.rgk.decode_fwd, decode_inputs(2, 64, 32, 8, 4, torch.float16, DEV) + (2, 1e-6)),
    ]


GRAD_OPS = {"fft_c2c", "mhc_post", "mhc_pre", "mhc_post_pre", "gate_conv_fwd"}


@gpu
def test_opcheck_every_op():
    for op, args in op_samples():
        torch.library.opcheck(op, args)
        if op._qualified_op_name.split("::")[1] in GRAD_OPS:  # inputs needing gradients: backward too
            grad_args = tuple(a.detach().clone().requires_grad_(a.is_floating_point() or a.is_complex())
                              if isinstance(a, torch.Tensor) else a for a in args)
            torch.library.opcheck(op, grad_args)


@gpu
def test_front_end_direct_path_matches_the_dispatcher_bitwise():
    for op, args in op_samples():
        front = getattr(rgk.ops, op._qualified_op_name.split("::")[1])
        assert rgk.ops._direct(*(a for a in args if isinstance(a, torch.Tensor)))
        direct, dispatched = front(*args), op(*args)
        for d, o in zip(direct if isinstance(direct, tuple) else (direct,),
                        dispatched if isinstance(dispatched, tuple) else (dispatched,)):
            assert d.dtype == o.dtype and d.shape == o.shape and torch.equal(d, o), op
    # A lazy conjugate view: the front end must transform the conjugate, not the raw storage.
    x = torch.randn(4, 256, dtype=torch.complex64, device=DEV)
    assert torch.equal(rgk.ops.fft_c2c(x.conj()), rgk.ops.fft_c2c(x.conj().resolve_conj()))
    assert not torch.equal(rgk.ops.fft_c2c(x.conj()), rgk.ops.fft_c2c(x))


def fresh_like(args, seed):
    """New values in tensors of the same shapes and dtypes (the graph replays on them)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    out = []
    for a in args:
        if isinstance(a, torch.Tensor) and (a.is_floating_point() or a.is_complex()):
            out.append(torch.randn(a.shape, generator=g, dtype=a.dtype).to(a.device))
        else:
            out.append(a)
    return out


@gpu
def test_torch_compile_fullgraph_and_cuda_graph_capture():
    samples = op_samples()
    for op, args in samples:
        eager = op(*args)
        compiled = torch.compile(lambda *a: op(*a), fullgraph=True)(*args)
        for e, c in zip(eager if isinstance(eager, tuple) else (eager,),
                        compiled if isinstance(compiled, tuple) else (compiled,)):
            assert torch.equal(e, c), op
    # torch.cuda.graph's pattern: warm up on a side stream, capture on another stream, then
    # replay on new inputs copied into the captured ones, twice, and capture a second graph.
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for op, args in samples:
            op(*args)
    torch.cuda.current_stream().wait_stream(s)
    for op, args in samples:
        graphs = []
        for _ in range(2):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static = op(*args)
            graphs.append((graph, static if isinstance(static, tuple) else (static,)))
        for seed in (1, 2):
            for a, f in zip(args, fresh_like(args, seed)):
                if isinstance(a, torch.Tensor) and (a.is_floating_point() or a.is_complex()):
                    a.copy_(f)
            for graph, static in graphs:
                graph.replay()
                torch.cuda.synchronize()
                eager = op(*args)
                for e, c in zip(eager if isinstance(eager, tuple) else (eager,), static):
                    assert torch.equal(e, c), (op, seed)


@gpu
def test_empty_inputs_give_empty_outputs():
    assert rgk.ops.fft_c2c(torch.zeros(0, 64, dtype=torch.complex64, device=DEV)).shape == (0, 64)
    assert rgk.ops.mhc_post(*post_inputs(0, 4, 64, DEV)).shape == (0, 256)
    assert [tuple(t.shape) for t in rgk.ops.mhc_pre(*pre_inputs(0, 4, 64, DEV))] == [(0, 256), (0, 64), (0, 4)]
    gi = gate_inputs(0, 8, 64, torch.float16, DEV)
    outs = rgk.ops.gate_conv_fwd(*gi)
    assert outs[0].shape == (0, 8, 64)
    empty = torch.zeros(0, 8, device=DEV)
    grads = rgk.ops.gate_conv_bwd(gi[0], *gi, empty, empty, empty)
    for w in grads[3:]:
        assert w.abs().sum().item() == 0
    y_t, state = rgk.ops.decode_fwd(*decode_inputs(0, 64, 32, 8, 4, torch.float16, DEV))
    assert y_t.shape == (0, 32) and state.shape == (0, 8, 32)


@gpu
def test_zero_row_of_x_has_finite_pre_gradients():
    phi, x, b = pre_inputs(2, 4, 64, DEV)
    x[1].zero_()
    leaves = [t.detach().clone().requires_grad_(True) for t in (phi, x, b)]
    sum(o.float().sum() for o in rgk.ops.mhc_pre(*leaves)).backward()
    for t in leaves:
        assert torch.isfinite(t.grad.float()).all()


@gpu
def test_outputs_are_fresh_tensors_and_the_device_is_restored():
    x_layer_out, h_post, x_res = post_inputs(2, 4, 64, DEV)
    for out in (rgk.ops.mhc_post(x_layer_out, h_post, x_res),
                torch.ops.rgk.mhc_post(x_layer_out, h_post, x_res)):
        assert out.data_ptr() not in (x_layer_out.data_ptr(), h_post.data_ptr(), x_res.data_ptr())
        assert out.is_contiguous() and out.device == x_res.device
    before = torch.cuda.current_device()
    for dev in range(torch.cuda.device_count()):
        rgk.ops.mhc_post(*post_inputs(2, 4, 64, f"cuda:{dev}"))
        assert torch.cuda.current_device() == before


def assert_trains_alike(ours, theirs, x, target, lr):
    """Five SGD steps of each model on the mean squared error to `target`: ours learns, and
    its losses stay within 2 % of the pure-torch model's."""
    losses = []
    for model in (ours, theirs):
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        run = []
        for _ in range(5):
            loss = (model(x).float() - target.float()).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            run.append(loss.item())
        losses.append(run)
    assert losses[0][-1] < losses[0][0]
    for a, b in zip(*losses):
        assert abs(a - b) <= 2e-2 * abs(b), losses


@gpu
def test_engram_gate_block_trains_like_torch():
    torch.manual_seed(0)
    d = 64

    class Block(torch.nn.Module):
        def __init__(self, gate):
            super().__init__()
            self.wk, self.wv = torch.nn.Linear(d, d, bias=False), torch.nn.Linear(d, d, bias=False)
            self.rms_w_h, self.rms_w_v = torch.nn.Parameter(torch.ones(d)), torch.nn.Parameter(torch.ones(d))
            self.conv_w = torch.nn.Parameter(0.3 * torch.randn(4, d))
            self.gate = gate

        def forward(self, h):
            return h + self.gate(h, self.wk(h), self.wv(h), self.rms_w_h, self.rms_w_v, self.conv_w)

    ours = Block(lambda *a: rgk.ops.gate_conv_fwd(*a)[0]).to(DEV)
    theirs = Block(lambda *a: ref.engram_gate_conv_fwd(*a, 1e-6)[0]).to(DEV)
    theirs.load_state_dict(ours.state_dict())
    # f32 storage would make our kernels f32: run both on bf16-valued f32 data through bf16 ops.
    ours, theirs = ours.bfloat16(), theirs.bfloat16()
    x = torch.randn(2, 32, d, device=DEV).bfloat16()
    target = torch.randn(2, 32, d, device=DEV).bfloat16()
    assert_trains_alike(ours, theirs, x, target, lr=0.05)


@gpu
def test_mhc_layer_trains_like_torch():
    """An mHC layer around a linear layer (pre → linear → post), trained for a few steps: the
    losses follow the pure-torch composition's."""
    torch.manual_seed(1)
    n, c, batch = 4, 128, 3

    class Layer(torch.nn.Module):
        def __init__(self, pre, post):
            super().__init__()
            m = n * n + 2 * n
            self.phi = torch.nn.Parameter(torch.randn(n * c, m) / math.sqrt(n * c))
            self.b = torch.nn.Parameter(0.1 * torch.randn(m))
            self.linear = torch.nn.Linear(c, c)
            self.pre, self.post = pre, post

        def forward(self, x):
            x_res, x_layer, h_post = self.pre(self.phi, x, self.b)
            y = self.linear(x_layer.float()).to(torch.bfloat16)
            return self.post(y, h_post, x_res)

    def torch_pre(phi, x, b):
        x_res, x_layer, h_post = rgk.ops.mhc_pre_reference(phi, x, b, 1.0, 1.0, 1.0, 1, 0.02)
        return x_res.to(torch.bfloat16), x_layer.to(torch.bfloat16), h_post

    ours = Layer(lambda *a: rgk.ops.mhc_pre(*a), rgk.ops.mhc_post).to(DEV)
    theirs = Layer(torch_pre, ref.mhc_post_fwd).to(DEV)
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(batch, n * c, device=DEV).bfloat16()
    target = torch.randn(batch, n * c, device=DEV)
    assert_trains_alike(ours, theirs, x, target, lr=0.1)
