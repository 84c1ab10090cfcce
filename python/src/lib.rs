//! `rgk._rgk`: rgk's ops on tensors that PyTorch allocated. Python passes each tensor as a
//! tuple `(data_ptr, dtype, shape, strides, device)` (`dtype` as `str(tensor.dtype)`, `device`
//! the CUDA ordinal or −1 for a tensor elsewhere) and torch's current stream as an integer;
//! every tensor is validated here (device, dtype, shape, contiguity, alignment, outputs
//! disjoint from inputs) before anything is launched, and an invalid one raises `ValueError`
//! naming the argument. The kernels run on torch's stream in the primary context torch uses,
//! made current on the calling thread for the call (autograd runs backward on its own
//! threads) and the thread's previous context restored after it (torch's current device).
//! The module links no libtorch.
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use cudarc::driver::sys::{self, CUcontext, CUstream};
use cudarc::driver::CudaStream;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use rgk::engram::{
    bwd_workspace_len, gate_conv_fwd_raw, DecodeDtype, DecodeInputsRaw, EngramDecodePlan, EngramDecodeShape,
    EngramGateShape, GateConvBwdPlan,
};
use rgk::fft::{FftPlan, Precision};
use rgk::mhc::{post_fwd_raw, MhcPostPre, MhcPostShape, MhcPre, MhcPreParams, MhcPreShape};
use rgk::{bf16, f16, Gpu};

/// A tensor as Python describes it: `(data_ptr, dtype, shape, strides, device)`.
#[derive(FromPyObject)]
struct Tensor(u64, String, Vec<i64>, Vec<i64>, i64);

/// The element types the ops take.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Dtype {
    F16,
    Bf16,
    F32,
    C64,
    C128,
}

impl Dtype {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "torch.float16" => Self::F16,
            "torch.bfloat16" => Self::Bf16,
            "torch.float32" => Self::F32,
            "torch.complex64" => Self::C64,
            "torch.complex128" => Self::C128,
            _ => return None,
        })
    }
    fn torch_name(self) -> &'static str {
        match self {
            Self::F16 => "torch.float16",
            Self::Bf16 => "torch.bfloat16",
            Self::F32 => "torch.float32",
            Self::C64 => "torch.complex64",
            Self::C128 => "torch.complex128",
        }
    }
    fn bytes(self) -> u64 {
        match self {
            Self::F16 | Self::Bf16 => 2,
            Self::F32 => 4,
            Self::C64 => 8,
            Self::C128 => 16,
        }
    }
}

fn bad(arg: &str, msg: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(format!("invalid `{arg}`: {msg}"))
}

/// rgk's errors as Python exceptions: invalid inputs `ValueError` (naming the argument),
/// device and driver failures `RuntimeError`.
fn py_err(e: rgk::Error) -> PyErr {
    match e.arg() {
        Some(_) => PyValueError::new_err(e.to_string()),
        None => PyRuntimeError::new_err(e.to_string()),
    }
}

impl Tensor {
    fn device(&self, arg: &str) -> PyResult<i64> {
        if self.4 < 0 {
            return Err(bad(arg, "is not a CUDA tensor (rgk's ops run on CUDA tensors)"));
        }
        Ok(self.4)
    }
    fn dtype(&self, arg: &str) -> PyResult<Dtype> {
        Dtype::parse(&self.1).ok_or_else(|| bad(arg, format!("dtype {} is not one rgk's ops take", self.1)))
    }
    fn shape(&self) -> &[i64] {
        &self.2
    }
    /// The device address after checking device, dtype, shape, row-major contiguity and
    /// element alignment.
    fn check(&self, arg: &str, device: i64, dtype: Dtype, shape: &[usize]) -> PyResult<u64> {
        let dev = self.device(arg)?;
        if dev != device {
            return Err(bad(arg, format!("is on cuda:{dev}, the other tensors on cuda:{device}")));
        }
        let got = self.dtype(arg)?;
        if got != dtype {
            return Err(bad(arg, format!("dtype {}, expected {}", self.1, dtype.torch_name())));
        }
        if self.2.len() != shape.len() || self.2.iter().zip(shape).any(|(&a, &b)| a as usize != b) {
            return Err(bad(arg, format!("shape {:?}, expected {:?}", self.2, shape)));
        }
        if self.3.len() != self.2.len() {
            return Err(bad(arg, format!("{} strides for {} dimensions", self.3.len(), self.2.len())));
        }
        // An empty tensor has no layout to check.
        if !shape.contains(&0) {
            let mut expect = 1i64;
            for (&size, &stride) in self.2.iter().zip(&self.3).rev() {
                if size != 1 && stride != expect {
                    return Err(bad(arg, format!("is not contiguous (strides {:?}, shape {:?})", self.3, self.2)));
                }
                expect *= size;
            }
        }
        if !self.0.is_multiple_of(dtype.bytes()) {
            return Err(bad(
                arg,
                format!("address {:#x} is not aligned to its {}-byte elements", self.0, dtype.bytes()),
            ));
        }
        Ok(self.0)
    }

    /// The checked tensor's bytes `[start, end)` (after [`Tensor::check`]).
    fn span(&self, dtype: Dtype) -> (u64, u64) {
        let n: i64 = self.2.iter().product();
        (self.0, self.0 + n as u64 * dtype.bytes())
    }
}

/// `ValueError` naming the first output whose bytes overlap an input's or another output's
/// (the kernels read inputs while they write outputs).
fn disjoint(outputs: &[(&str, (u64, u64))], inputs: &[(&str, (u64, u64))]) -> PyResult<()> {
    for (i, (name, (a0, a1))) in outputs.iter().enumerate() {
        let others = inputs.iter().chain(&outputs[i + 1..]);
        for (other, (b0, b1)) in others {
            if a0 < a1 && b0 < b1 && a0 < b1 && b0 < a1 {
                return Err(bad(name, format!("overlaps `{other}`")));
            }
        }
    }
    Ok(())
}

/// One tensor's expected dtype and shape: `(name, tensor, dtype, shape)`.
type Spec<'a> = (&'a str, &'a Tensor, Dtype, &'a [usize]);

/// [`Tensor::check`] of every input and output, then [`disjoint`]: the addresses, inputs then
/// outputs, in order.
fn check_all(device: i64, inputs: &[Spec], outputs: &[Spec]) -> PyResult<Vec<u64>> {
    let mut p = Vec::with_capacity(inputs.len() + outputs.len());
    for (name, t, dtype, shape) in inputs.iter().chain(outputs) {
        p.push(t.check(name, device, *dtype, shape)?);
    }
    fn spans<'a>(v: &[Spec<'a>]) -> Vec<(&'a str, (u64, u64))> {
        v.iter().map(|(n, t, d, _)| (*n, t.span(*d))).collect()
    }
    disjoint(&spans(outputs), &spans(inputs))?;
    Ok(p)
}

fn dim(arg: &str, t: &Tensor, rank: usize) -> PyResult<Vec<usize>> {
    if t.shape().len() != rank {
        return Err(bad(arg, format!("has {} dimensions, expected {rank}", t.shape().len())));
    }
    Ok(t.shape().iter().map(|&s| s as usize).collect())
}

/// The module's handle on one device, its context current on this thread until drop, which
/// makes the thread's previous context current again (torch reads its current device there).
/// While torch captures the call's stream, the thread's capture mode is relaxed for the call.
struct Current {
    gpu: Gpu,
    previous: Option<CUcontext>,
    _relaxed: RelaxedCapture,
}

/// The thread's capture mode before the call, put back on drop (when it was changed).
struct RelaxedCapture(Option<sys::CUstreamCaptureMode>);

impl Drop for RelaxedCapture {
    fn drop(&mut self) {
        if let Some(mut mode) = self.0 {
            // SAFETY: puts back the mode this thread had when the call began.
            let _ = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
        }
    }
}

impl Drop for Current {
    fn drop(&mut self) {
        if let Some(p) = self.previous.filter(|&p| p != self.gpu.context().cu_ctx()) {
            // SAFETY: `p` was current on this thread when the call began (a live context).
            let _ = unsafe { cudarc::driver::result::ctx::set_current(p) };
        }
    }
}

/// One loaded module per device (the primary context torch uses), for the process's life,
/// made current on this thread for a call on torch's stream `stream`.
///
/// torch captures CUDA graphs in its global capture mode, which forbids this thread calls the
/// driver deems unsafe during a capture (allocation, synchronisation, module loading) even on
/// other streams. A call made while torch captures `stream` may still have to build a plan (its
/// tables go to our own stream, which is synchronised; torch.cuda.graph captures on a stream
/// of its own, so the warm-up's plans do not serve it) or load a kernel family on first use:
/// for the call, the thread's mode is relaxed (`cuThreadExchangeStreamCaptureMode`, the
/// driver's way for a library to do such work during a capture); its launches on `stream`
/// are captured as always. The very first call on a device cannot run inside a capture (the
/// module load synchronises the context): it raises `RuntimeError` saying so, nothing launched.
fn gpu(device: i64, stream: u64) -> PyResult<Current> {
    static GPUS: OnceLock<Mutex<HashMap<i64, Gpu>>> = OnceLock::new();
    let previous = cudarc::driver::result::ctx::get_current().map_err(|e| py_err(e.into()))?;
    let mut map = lock(GPUS.get_or_init(Default::default));
    let g = match map.get(&device) {
        Some(g) => g.clone(),
        None => {
            // Loading the module synchronises the context, which no capture survives (torch's
            // current context is the device's: torch made it current for the tensors).
            if previous.is_some() && capturing(stream as CUstream)? {
                return Err(PyRuntimeError::new_err(format!(
                    "rgk: the first rgk call on cuda:{device} is inside a CUDA graph capture; call \
                     any rgk op on this device once before capturing (torch.cuda.graph's warm-up does)"
                )));
            }
            let g = Gpu::new(device as usize).map_err(py_err)?;
            // torch orders all work on its own streams, and every plan here serves one stream:
            // cudarc's cross-stream buffer events would only add waits — and a wait on an event
            // recorded outside a graph capture invalidates torch's capture.
            // SAFETY: no cudarc buffer of this context is shared between streams here.
            unsafe { g.context().disable_event_tracking() };
            map.insert(device, g.clone());
            g
        }
    };
    drop(map);
    g.context().bind_to_thread().map_err(|e| py_err(e.into()))?;
    // From here on an error drops `current`, which makes the previous context current again.
    let mut current = Current { gpu: g, previous, _relaxed: RelaxedCapture(None) };
    if capturing(stream as CUstream)? {
        let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: sets this thread's mode; `RelaxedCapture` puts the previous one back on drop.
        unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) }.result().map_err(|e| py_err(e.into()))?;
        current._relaxed.0 = Some(mode);
    }
    Ok(current)
}

/// Plans cached per key (device, shape, stream), at most [`CACHE_ENTRIES`] per op: a new key
/// beyond them first evicts the oldest (after the context is idle, so its buffers are free to
/// go), except inside a graph capture.
struct Cache<K, V> {
    entries: HashMap<K, (u64, V)>,
    next: u64,
}

const CACHE_ENTRIES: usize = 32;

impl<K, V> Default for Cache<K, V> {
    fn default() -> Self {
        Self { entries: HashMap::new(), next: 0 }
    }
}

impl<K: Eq + std::hash::Hash + Clone, V> Cache<K, V> {
    fn get_or_make(
        &mut self,
        b: &Current,
        cu: CUstream,
        key: K,
        make: impl FnOnce() -> PyResult<V>,
    ) -> PyResult<&mut V> {
        if !self.entries.contains_key(&key) {
            if self.entries.len() >= CACHE_ENTRIES && !capturing(cu)? {
                b.gpu.context().synchronize().map_err(|e| py_err(e.into()))?;
                let oldest = self.entries.iter().min_by_key(|(_, (seq, _))| *seq).map(|(k, _)| k.clone());
                if let Some(k) = oldest {
                    self.entries.remove(&k);
                }
            }
            let v = make()?;
            self.entries.insert(key.clone(), (self.next, v));
            self.next += 1;
        }
        Ok(&mut self.entries.get_mut(&key).expect("present").1)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether torch is capturing `cu` into a CUDA graph.
fn capturing(cu: CUstream) -> PyResult<bool> {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: `cu` is torch's live stream of the current context.
    unsafe { sys::cuStreamIsCapturing(cu, &mut status) }.result().map_err(|e| py_err(e.into()))?;
    Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// A handle on torch's stream `stream` of `b`'s context.
fn on_stream(b: &Current, stream: u64) -> PyResult<(Gpu, CUstream)> {
    let cu = stream as CUstream;
    // SAFETY: torch owns the stream, keeps it alive during the call, and orders our launches
    // with its own work on it; the handle lives no longer than the call or the cached plans
    // keyed by this stream.
    let s: Arc<CudaStream> = unsafe { b.gpu.context().wrap_borrowed_stream(cu) };
    Ok((b.gpu.with_stream(s).map_err(py_err)?, cu))
}

/// Builds a plan (its tables, workspace): on torch's stream, or — while torch captures that
/// stream — on the module's own stream, synchronised before the plan is used, so that nothing
/// of the plan is recorded into (or freed with) the caller's graph.
fn build<T>(b: &Current, torch: &Gpu, cu: CUstream, make: impl FnOnce(&Gpu) -> rgk::Result<T>) -> PyResult<T> {
    if capturing(cu)? {
        let v = make(&b.gpu).map_err(py_err)?;
        b.gpu.stream().synchronize().map_err(|e| py_err(e.into()))?;
        Ok(v)
    } else {
        make(torch).map_err(py_err)
    }
}

/// `y = FFT(x)` over the last axis; `x`, `y`: `[*batch, n]` complex64 or complex128 (`y` may be
/// `x`: in place).
#[pyfunction]
fn fft_c2c(x: Tensor, y: Tensor, stream: u64) -> PyResult<()> {
    let device = x.device("x")?;
    let dtype = x.dtype("x")?;
    let precision = match dtype {
        Dtype::C64 => Precision::C64,
        Dtype::C128 => Precision::C128,
        _ => return Err(bad("x", format!("dtype {}, expected torch.complex64 or torch.complex128", x.1))),
    };
    let shape: Vec<usize> = x.shape().iter().map(|&s| s as usize).collect();
    let Some((&n, lead)) = shape.split_last() else {
        return Err(bad("x", "is a scalar; the transform runs over the last axis"));
    };
    let batch: usize = lead.iter().product();
    let xp = x.check("x", device, dtype, &shape)?;
    let yp = y.check("y", device, dtype, &shape)?;
    if batch == 0 {
        return Ok(());
    }
    let b = gpu(device, stream)?;
    let (g, cu) = on_stream(&b, stream)?;
    // Plans hold device tables and a workspace: one per stream, so calls on different
    // streams never share a workspace.
    type Key = (i64, usize, usize, bool, u64);
    static PLANS: OnceLock<Mutex<Cache<Key, FftPlan>>> = OnceLock::new();
    let mut plans = lock(PLANS.get_or_init(Default::default));
    let key = (device, n, batch, precision == Precision::C128, stream);
    let plan = plans.get_or_make(&b, cu, key, || build(&b, &g, cu, |h| FftPlan::new(h, n, batch, precision)))?;
    // SAFETY: both tensors were checked to hold `batch·n` elements of the plan's precision on
    // this device (the same buffer, or disjoint: `execute_raw` refuses a partial overlap);
    // torch keeps them alive until the stream passes the launches. Multi-pass plans go as one
    // graph (launched into torch's stream, whichever it is), so their dependent launches overlap.
    unsafe { plan.run_raw(&g, xp, yp, cu) }.map_err(py_err)
}

/// MHCPostFwd: `x_out = q(h_post ⊗ x_layer_out + x_res)`; `x_layer_out [B, c]` bf16, `h_post
/// [B, n]` f32, `x_res`, `x_out` `[B, n·c]` bf16.
#[pyfunction]
fn mhc_post(x_layer_out: Tensor, h_post: Tensor, x_res: Tensor, x_out: Tensor, stream: u64) -> PyResult<()> {
    let device = x_layer_out.device("x_layer_out")?;
    let [b, c] = dim("x_layer_out", &x_layer_out, 2)?[..] else { unreachable!() };
    let [_, n] = dim("h_post", &h_post, 2)?[..] else { unreachable!() };
    let (bf, bc, bn, bnc) = (Dtype::Bf16, [b, c], [b, n], [b, n * c]);
    let p = check_all(
        device,
        &[("x_layer_out", &x_layer_out, bf, &bc), ("h_post", &h_post, Dtype::F32, &bn), ("x_res", &x_res, bf, &bnc)],
        &[("x_out", &x_out, bf, &bnc)],
    )?;
    let [y, h, r, o] = p[..] else { unreachable!() };
    if b * n * c == 0 {
        return Ok(());
    }
    let g = gpu(device, stream)?;
    // SAFETY: every tensor was checked to hold the elements the shape addresses, the output
    // to overlap no input.
    unsafe { post_fwd_raw(&g.gpu, MhcPostShape { batch: b, n, c }, y, h, r, o, stream as CUstream) }.map_err(py_err)
}

/// MHCPreFwd: `phi [n·c, n²+2n]` f32, `x [B, n·c]` bf16, `b [n²+2n]` f32 → `x_res [B, n·c]`
/// bf16, `x_layer [B, c]` bf16, `h_post [B, n]` f32.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn mhc_pre(
    phi: Tensor,
    x: Tensor,
    b: Tensor,
    x_res: Tensor,
    x_layer: Tensor,
    h_post: Tensor,
    alpha_pre: f32,
    alpha_post: f32,
    alpha_res: f32,
    sinkhorn_repeat: u32,
    sinkhorn_eps: f32,
    stream: u64,
) -> PyResult<()> {
    let device = x.device("x")?;
    let [nc, m] = dim("phi", &phi, 2)?[..] else { unreachable!() };
    // m = n² + 2n  ⇔  n = sqrt(m + 1) − 1.
    let n = ((m + 1) as f64).sqrt().round() as usize - 1;
    if n == 0 || n * n + 2 * n != m {
        return Err(bad("phi", format!("width {m} is not n² + 2n for a stream count n ≥ 1")));
    }
    if nc % n != 0 {
        return Err(bad("phi", format!("height {nc} is not a multiple of n = {n}")));
    }
    let c = nc / n;
    let [batch, _] = dim("x", &x, 2)?[..] else { unreachable!() };
    let (bf, f32) = (Dtype::Bf16, Dtype::F32);
    let p = check_all(
        device,
        &[("phi", &phi, f32, &[nc, m]), ("x", &x, bf, &[batch, nc]), ("b", &b, f32, &[m])],
        &[
            ("x_res", &x_res, bf, &[batch, nc]),
            ("x_layer", &x_layer, bf, &[batch, c]),
            ("h_post", &h_post, f32, &[batch, n]),
        ],
    )?;
    let [p_phi, p_x, p_b, p_res, p_layer, p_h] = p[..] else { unreachable!() };
    let params = MhcPreParams { alpha_pre, alpha_post, alpha_res, sinkhorn_repeat, sinkhorn_eps };
    if batch * c == 0 {
        return Ok(());
    }
    let bound = gpu(device, stream)?;
    let (g, cu) = on_stream(&bound, stream)?;
    // The plan and its workspace per stream: the fixed-point pair keeps accumulator state in
    // the workspace between calls, which calls on one stream keep in order.
    type Key = (i64, usize, usize, usize, u64);
    static PLANS: OnceLock<Mutex<Cache<Key, MhcPre>>> = OnceLock::new();
    let mut plans = lock(PLANS.get_or_init(Default::default));
    let key = (device, batch, n, c, stream);
    let op = plans
        .get_or_make(&bound, cu, key, || build(&bound, &g, cu, |h| MhcPre::new(h, MhcPreShape { batch, n, c })))?;
    // SAFETY: every tensor was checked to hold the elements the plan's shape addresses, the
    // outputs to overlap nothing; the plan (its workspace, its graph) serves this stream only.
    // Its two kernels go as one graph, so the second one's dependent launch overlaps the first.
    unsafe { op.run_raw(&g, params, [p_phi, p_x, p_b], [p_res, p_layer, p_h], cu) }.map_err(py_err)
}

/// MHCPostPreFwd (the mHC layer transition): layer L's `x_layer_out [B, c]` bf16, `h_post
/// [B, n]` f32, `x_res [B, n·c]` bf16 and layer L+1's `phi [n·c, n²+2n]` f32, `b [n²+2n]` f32 →
/// `x_out [B, n·c]` bf16 (the post half's output) and layer L+1's `x_res`, `x_layer`, `h_post`.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn mhc_post_pre(
    x_layer_out: Tensor,
    h_post: Tensor,
    x_res: Tensor,
    phi: Tensor,
    b: Tensor,
    x_out: Tensor,
    next_x_res: Tensor,
    next_x_layer: Tensor,
    next_h_post: Tensor,
    alpha_pre: f32,
    alpha_post: f32,
    alpha_res: f32,
    sinkhorn_repeat: u32,
    sinkhorn_eps: f32,
    stream: u64,
) -> PyResult<()> {
    let device = x_layer_out.device("x_layer_out")?;
    let [batch, c] = dim("x_layer_out", &x_layer_out, 2)?[..] else { unreachable!() };
    let [_, n] = dim("h_post", &h_post, 2)?[..] else { unreachable!() };
    let m = n * n + 2 * n;
    let nc = n * c;
    let (bf, f32) = (Dtype::Bf16, Dtype::F32);
    let p = check_all(
        device,
        &[
            ("x_layer_out", &x_layer_out, bf, &[batch, c]),
            ("h_post", &h_post, f32, &[batch, n]),
            ("x_res", &x_res, bf, &[batch, nc]),
            ("phi", &phi, f32, &[nc, m]),
            ("b", &b, f32, &[m]),
        ],
        &[
            ("x_out", &x_out, bf, &[batch, nc]),
            ("next_x_res", &next_x_res, bf, &[batch, nc]),
            ("next_x_layer", &next_x_layer, bf, &[batch, c]),
            ("next_h_post", &next_h_post, f32, &[batch, n]),
        ],
    )?;
    let [py, ph, pr, pphi, pb, po, nr, nl, nh] = p[..] else { unreachable!() };
    let params = MhcPreParams { alpha_pre, alpha_post, alpha_res, sinkhorn_repeat, sinkhorn_eps };
    if batch * c == 0 || n == 0 {
        return Ok(());
    }
    let bound = gpu(device, stream)?;
    let (g, cu) = on_stream(&bound, stream)?;
    // One plan and workspace per stream, as for mhc_pre (the fused pair keeps its accumulator
    // state in the workspace).
    type Key = (i64, usize, usize, usize, u64);
    static PLANS: OnceLock<Mutex<Cache<Key, MhcPostPre>>> = OnceLock::new();
    let mut plans = lock(PLANS.get_or_init(Default::default));
    let key = (device, batch, n, c, stream);
    let op = plans
        .get_or_make(&bound, cu, key, || build(&bound, &g, cu, |h| MhcPostPre::new(h, MhcPreShape { batch, n, c })))?;
    // SAFETY: every tensor was checked to hold the elements the plan's shape addresses, the
    // outputs to overlap nothing; the plan serves this stream only.
    unsafe { op.run_raw(&g, params, [py, ph, pr, pphi, pb], po, [nr, nl, nh], cu) }.map_err(py_err)
}

fn half_dtype(arg: &str, t: &Tensor) -> PyResult<Dtype> {
    match t.dtype(arg)? {
        d @ (Dtype::F16 | Dtype::Bf16) => Ok(d),
        _ => Err(bad(arg, format!("dtype {}, expected torch.float16 or torch.bfloat16", t.1))),
    }
}

/// EngramGateConvFwd: `h, k, v [M, T, d]`, `rms_w_h, rms_w_v [d]`, `conv_w [4, d]` (one 16-bit
/// dtype) → `y, vhat [M, T, d]` (the dtype), `alpha, rrms_h, rrms_k, rrms_v [M, T]` f32.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn gate_conv_fwd(
    h: Tensor,
    k: Tensor,
    v: Tensor,
    rms_w_h: Tensor,
    rms_w_v: Tensor,
    conv_w: Tensor,
    y: Tensor,
    vhat: Tensor,
    alpha: Tensor,
    rrms_h: Tensor,
    rrms_k: Tensor,
    rrms_v: Tensor,
    stream: u64,
) -> PyResult<()> {
    let device = h.device("h")?;
    let dt = half_dtype("h", &h)?;
    let [m, t, d] = dim("h", &h, 3)?[..] else { unreachable!() };
    let (x3, r2, w, cw) = ([m, t, d], [m, t], [d], [4, d]);
    let f32 = Dtype::F32;
    let p = check_all(
        device,
        &[
            ("h", &h, dt, &x3),
            ("k", &k, dt, &x3),
            ("v", &v, dt, &x3),
            ("rms_w_h", &rms_w_h, dt, &w),
            ("rms_w_v", &rms_w_v, dt, &w),
            ("conv_w", &conv_w, dt, &cw),
        ],
        &[
            ("y", &y, dt, &x3),
            ("vhat", &vhat, dt, &x3),
            ("alpha", &alpha, f32, &r2),
            ("rrms_h", &rrms_h, f32, &r2),
            ("rrms_k", &rrms_k, f32, &r2),
            ("rrms_v", &rrms_v, f32, &r2),
        ],
    )?;
    if m * t * d == 0 {
        return Ok(());
    }
    let g = gpu(device, stream)?;
    let shape = EngramGateShape { m, t, d };
    let s = stream as CUstream;
    // SAFETY: every tensor was checked to hold the elements the shape addresses, the outputs
    // to overlap nothing.
    unsafe {
        match dt {
            Dtype::F16 => gate_conv_fwd_raw::<f16>(
                &g.gpu, shape, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10], p[11], s,
            ),
            _ => gate_conv_fwd_raw::<bf16>(
                &g.gpu, shape, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10], p[11], s,
            ),
        }
    }
    .map_err(py_err)
}

/// f32 elements of the workspace [`gate_conv_bwd`] needs for `(m, t, d)`.
#[pyfunction]
fn gate_conv_bwd_workspace(m: usize, t: usize, d: usize) -> PyResult<usize> {
    if m * t * d == 0 {
        return Ok(0);
    }
    bwd_workspace_len(EngramGateShape { m, t, d }).map_err(py_err)
}

/// EngramGateConvBwd: `dy, h, k, v [M, T, d]`, the weights, the forward's `alpha, rrms_h,
/// rrms_k [M, T]` f32 and a workspace of [`gate_conv_bwd_workspace`] f32 → `dh, dk, dv`
/// (the dtype), `drms_w_h, drms_w_v [d]`, `dconv_w [4, d]` f32.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn gate_conv_bwd(
    dy: Tensor,
    h: Tensor,
    k: Tensor,
    v: Tensor,
    rms_w_h: Tensor,
    rms_w_v: Tensor,
    conv_w: Tensor,
    alpha: Tensor,
    rrms_h: Tensor,
    rrms_k: Tensor,
    workspace: Tensor,
    dh: Tensor,
    dk: Tensor,
    dv: Tensor,
    drms_w_h: Tensor,
    drms_w_v: Tensor,
    dconv_w: Tensor,
    stream: u64,
) -> PyResult<()> {
    let device = dy.device("dy")?;
    let dt = half_dtype("dy", &dy)?;
    let [m, t, d] = dim("dy", &dy, 3)?[..] else { unreachable!() };
    let shape = EngramGateShape { m, t, d };
    let empty = m * t * d == 0;
    let ws_len = if empty { 0 } else { bwd_workspace_len(shape).map_err(py_err)? };
    let (x3, r2, w, cw, ws) = ([m, t, d], [m, t], [d], [4, d], [ws_len]);
    let f32 = Dtype::F32;
    let p = check_all(
        device,
        &[
            ("dy", &dy, dt, &x3),
            ("h", &h, dt, &x3),
            ("k", &k, dt, &x3),
            ("v", &v, dt, &x3),
            ("rms_w_h", &rms_w_h, dt, &w),
            ("rms_w_v", &rms_w_v, dt, &w),
            ("conv_w", &conv_w, dt, &cw),
            ("alpha", &alpha, f32, &r2),
            ("rrms_h", &rrms_h, f32, &r2),
            ("rrms_k", &rrms_k, f32, &r2),
        ],
        &[
            ("workspace", &workspace, f32, &ws),
            ("dh", &dh, dt, &x3),
            ("dk", &dk, dt, &x3),
            ("dv", &dv, dt, &x3),
            ("drms_w_h", &drms_w_h, f32, &w),
            ("drms_w_v", &drms_w_v, f32, &w),
            ("dconv_w", &dconv_w, f32, &cw),
        ],
    )?;
    // An empty batch: the caller zeroes the weight gradients.
    if empty {
        return Ok(());
    }
    let bound = gpu(device, stream)?;
    let cu = stream as CUstream;
    // A plan holds the graphs of its two launches (replayed while the pointers recur): one
    // per stream.
    type Key = (i64, [usize; 3], u64);
    static PLANS: OnceLock<Mutex<Cache<Key, GateConvBwdPlan>>> = OnceLock::new();
    let mut plans = lock(PLANS.get_or_init(Default::default));
    let plan =
        plans.get_or_make(&bound, cu, (device, [m, t, d], stream), || GateConvBwdPlan::new(shape).map_err(py_err))?;
    let inputs = [p[0], p[1], p[2], p[3], p[4], p[5], p[6]];
    let (saved, ws_ptr, outputs) = ([p[7], p[8], p[9]], p[10], [p[11], p[12], p[13], p[14], p[15], p[16]]);
    // SAFETY: every tensor was checked to hold the elements the shape addresses, the outputs
    // and the workspace to overlap nothing; the plan serves this stream only. Its two kernels
    // go as one graph, so the reduce kernel's dependent launch overlaps the main one.
    unsafe {
        match dt {
            Dtype::F16 => plan.run_raw::<f16>(&bound.gpu, inputs, saved, ws_ptr, outputs, cu),
            _ => plan.run_raw::<bf16>(&bound.gpu, inputs, saved, ws_ptr, outputs, cu),
        }
    }
    .map_err(py_err)
}

/// EngramDecodeFwd, one step: `e_t [B, d_mem]`, `h_t [B, d]`, `conv_state [B, L, d]`, `w_k,
/// w_v [d_mem, d]`, `rms_w_h, rms_w_v [d]`, `conv_w [K, d]` (one 16-bit dtype) → `y_t [B, d]`,
/// `new_conv_state [B, L, d]`.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn decode_fwd(
    e_t: Tensor,
    h_t: Tensor,
    conv_state: Tensor,
    w_k: Tensor,
    w_v: Tensor,
    rms_w_h: Tensor,
    rms_w_v: Tensor,
    conv_w: Tensor,
    y_t: Tensor,
    new_conv_state: Tensor,
    dilation: usize,
    eps: f32,
    stream: u64,
) -> PyResult<()> {
    let device = e_t.device("e_t")?;
    let dt = half_dtype("e_t", &e_t)?;
    let [batch, d_mem] = dim("e_t", &e_t, 2)?[..] else { unreachable!() };
    let [_, l, d] = dim("conv_state", &conv_state, 3)?[..] else { unreachable!() };
    let [kernel_size, _] = dim("conv_w", &conv_w, 2)?[..] else { unreachable!() };
    let (e2, h2, w2, v1, c2, s3) = ([batch, d_mem], [batch, d], [d_mem, d], [d], [kernel_size, d], [batch, l, d]);
    let p = check_all(
        device,
        &[
            ("e_t", &e_t, dt, &e2),
            ("h_t", &h_t, dt, &h2),
            ("w_k", &w_k, dt, &w2),
            ("w_v", &w_v, dt, &w2),
            ("rms_w_h", &rms_w_h, dt, &v1),
            ("rms_w_v", &rms_w_v, dt, &v1),
            ("conv_w", &conv_w, dt, &c2),
            ("conv_state", &conv_state, dt, &s3),
        ],
        &[("y_t", &y_t, dt, &h2), ("new_conv_state", &new_conv_state, dt, &s3)],
    )?;
    let raw =
        DecodeInputsRaw { e_t: p[0], h_t: p[1], w_k: p[2], w_v: p[3], rms_w_h: p[4], rms_w_v: p[5], conv_w: p[6] };
    let (s_in, y, s_out) = (p[7], p[8], p[9]);
    if batch * d == 0 {
        return Ok(());
    }
    let mut shape = EngramDecodeShape::new(batch, d_mem, d, l, kernel_size, dilation);
    shape.eps = eps;
    let bound = gpu(device, stream)?;
    let (g, cu) = on_stream(&bound, stream)?;
    // A plan owns its partial-sum workspace: one per stream.
    type Key = (i64, [usize; 6], u32, u64);
    static PLANS: OnceLock<Mutex<Cache<Key, EngramDecodePlan>>> = OnceLock::new();
    let mut plans = lock(PLANS.get_or_init(Default::default));
    let key = (device, [batch, d_mem, d, l, kernel_size, dilation], eps.to_bits(), stream);
    let plan = plans.get_or_make(&bound, cu, key, || build(&bound, &g, cu, |h| EngramDecodePlan::new(h, shape)))?;
    let dtype = if dt == Dtype::F16 { DecodeDtype::F16 } else { DecodeDtype::Bf16 };
    // SAFETY: every tensor was checked to hold the elements the shape addresses, the outputs
    // to overlap nothing.
    unsafe { plan.forward_raw(&g, dtype, raw, s_in, y, s_out, cu) }.map_err(py_err)
}

/// Whether a CUDA driver and device are present (no module is loaded).
#[pyfunction]
fn cuda_available() -> bool {
    rgk::cuda_available()
}

#[pymodule]
fn _rgk(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(fft_c2c, m)?)?;
    m.add_function(wrap_pyfunction!(mhc_post, m)?)?;
    m.add_function(wrap_pyfunction!(mhc_pre, m)?)?;
    m.add_function(wrap_pyfunction!(mhc_post_pre, m)?)?;
    m.add_function(wrap_pyfunction!(gate_conv_fwd, m)?)?;
    m.add_function(wrap_pyfunction!(gate_conv_bwd_workspace, m)?)?;
    m.add_function(wrap_pyfunction!(gate_conv_bwd, m)?)?;
    m.add_function(wrap_pyfunction!(decode_fwd, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_available, m)?)?;
    Ok(())
}
