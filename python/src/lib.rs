//! `rgk._rgk`: rgk's ops on PyTorch tensors. Each op takes the tensors themselves, reads their
//! address, dtype, shape, strides and device, validates every input (device, dtype, shape,
//! contiguity, alignment) before anything is allocated or launched — an invalid one raises
//! `ValueError` naming the argument — allocates the outputs (`new_empty` of an empty tensor of
//! each output's dtype), and launches on torch's current stream in the primary context torch
//! uses, made current on the calling thread for the call (autograd runs backward on its own
//! threads) and the thread's previous context restored after it (torch's current device). The module links no libtorch: torch is reached
//! through Python, its functions looked up once.
//!
//! Every op's last argument, `direct`, says who calls: `True` from the functional front end,
//! which then gets `None` (nothing done) when torch's dispatcher has something to add — a
//! gradient to record, a trace, a transform, a mode or profiler, a tensor subclass, a lazy
//! conjugate or negative view, a meta tensor — and calls `torch.ops.rgk` instead; `False` from
//! the dispatcher's own CUDA and CPU implementations of those operators.
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use cudarc::driver::sys::{self, CUcontext, CUstream};
use cudarc::driver::CudaStream;
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple};
use rgk::engram::{
    bwd_workspace_len, gate_conv_fwd_raw, DecodeDtype, DecodeInputsRaw, EngramDecodePlan, EngramDecodeShape,
    EngramGateShape, GateConvBwdPlan,
};
use rgk::fft::{FftPlan, Precision};
use rgk::mhc::{post_fwd_raw, MhcPostPre, MhcPostShape, MhcPre, MhcPreParams, MhcPreShape};
use rgk::{bf16, f16, Gpu};

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
    const ALL: [Dtype; 5] = [Self::F16, Self::Bf16, Self::F32, Self::C64, Self::C128];
    /// The name of the torch dtype (`torch.<name>`).
    fn torch_attr(self) -> &'static str {
        match self {
            Self::F16 => "float16",
            Self::Bf16 => "bfloat16",
            Self::F32 => "float32",
            Self::C64 => "complex64",
            Self::C128 => "complex128",
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

/// The torch objects the module calls, looked up on the first op call.
struct Torch {
    tensor: Py<PyAny>,
    parameter: Py<PyAny>,
    /// `torch.float16` … in [`Dtype::ALL`]'s order.
    dtypes: [Py<PyAny>; 5],
    empty: Py<PyAny>,
    /// `torch._C._cuda_getCurrentRawStream(ordinal)` (what `torch.cuda.current_stream` reads),
    /// absent from torch builds without CUDA.
    raw_stream: Option<Py<PyAny>>,
    /// What decides whether the dispatcher has something to add; `None` (a torch without one
    /// of these): every front-end call goes through the dispatcher.
    direct: Option<DirectChecks>,
}

struct DirectChecks {
    grad_enabled: Py<PyAny>,
    dispatch_modes: Py<PyAny>,
    functorch_active: Py<PyAny>,
    profiling: Py<PyAny>,
    jit_tracing: Py<PyAny>,
    function_modes: Py<PyAny>,
    /// `torch.autograd.forward_ad` (its `_current_level` ≥ 0 inside a dual level).
    forward_ad: Py<PyAny>,
}

fn torch(py: Python<'_>) -> PyResult<&'static Torch> {
    static TORCH: PyOnceLock<Torch> = PyOnceLock::new();
    TORCH.get_or_try_init(py, || {
        let torch = py.import("torch")?;
        let c = torch.getattr("_C")?;
        let mut dtypes = Vec::with_capacity(5);
        for d in Dtype::ALL {
            dtypes.push(torch.getattr(d.torch_attr())?.unbind());
        }
        let direct = (|| -> PyResult<DirectChecks> {
            let forward_ad = py.import("torch.autograd.forward_ad")?;
            forward_ad.getattr("_current_level")?;
            Ok(DirectChecks {
                grad_enabled: torch.getattr("is_grad_enabled")?.unbind(),
                dispatch_modes: c.getattr("_len_torch_dispatch_stack")?.unbind(),
                functorch_active: c.getattr("_are_functorch_transforms_active")?.unbind(),
                profiling: torch.getattr("autograd")?.getattr("_profiler_enabled")?.unbind(),
                jit_tracing: c.getattr("_get_tracing_state")?.unbind(),
                function_modes: c.getattr("_is_torch_function_mode_enabled")?.unbind(),
                forward_ad: forward_ad.into_any().unbind(),
            })
        })()
        .ok();
        Ok(Torch {
            tensor: torch.getattr("Tensor")?.unbind(),
            parameter: torch.getattr("nn")?.getattr("Parameter")?.unbind(),
            dtypes: dtypes.try_into().unwrap_or_else(|_| unreachable!("five dtypes")),
            empty: torch.getattr("empty")?.unbind(),
            raw_stream: c.getattr("_cuda_getCurrentRawStream").ok().map(Bound::unbind),
            direct,
        })
    })
}

/// Whether torch's state lets a front-end call skip the dispatcher: no dispatch or
/// torch-function mode (fake tensors, flop counters), functorch transform, forward-mode AD
/// level, profiler or `torch.jit.trace` active. `Some(grad enabled)` when it does.
/// `torch.compile` is the front end's own check: it must see the op.
fn state_allows_direct(py: Python<'_>, t: &Torch) -> PyResult<Option<bool>> {
    let Some(d) = &t.direct else { return Ok(None) };
    let call = |f: &Py<PyAny>| f.bind(py).call0();
    if call(&d.dispatch_modes)?.extract::<usize>()? != 0
        || call(&d.functorch_active)?.is_truthy()?
        || call(&d.profiling)?.is_truthy()?
        || !call(&d.jit_tracing)?.is_none()
        || call(&d.function_modes)?.is_truthy()?
        || d.forward_ad.bind(py).getattr(intern!(py, "_current_level"))?.extract::<i64>()? >= 0
    {
        return Ok(None);
    }
    Ok(Some(call(&d.grad_enabled)?.is_truthy()?))
}

/// A plain tensor or parameter: no subclass that could override what an op does.
fn plain(py: Python<'_>, t: &Torch, x: &Bound<'_, PyAny>) -> bool {
    let ty = x.get_type();
    ty.is(t.tensor.bind(py)) || ty.is(t.parameter.bind(py))
}

/// A tensor as the ops see it.
struct Tensor<'py> {
    obj: Bound<'py, PyAny>,
    ptr: u64,
    dtype: Option<Dtype>,
    /// The torch dtype, for messages.
    dtype_obj: Bound<'py, PyAny>,
    shape: Vec<i64>,
    strides: Vec<i64>,
    /// The CUDA ordinal, or −1 for a tensor elsewhere.
    device: i64,
    meta: bool,
}

fn ints(t: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
    t.cast::<PyTuple>()?.iter().map(|v| v.extract::<i64>()).collect()
}

/// `x` as the ops see it, or `TypeError` naming `arg` when it is not a tensor.
fn describe<'py>(py: Python<'py>, t: &Torch, arg: &str, x: &Bound<'py, PyAny>) -> PyResult<Tensor<'py>> {
    if !x.is_instance(t.tensor.bind(py))? {
        return Err(PyTypeError::new_err(format!("invalid `{arg}`: expected a tensor, got {}", x.get_type().name()?)));
    }
    let dtype_obj = x.getattr(intern!(py, "dtype"))?;
    let dtype = Dtype::ALL.into_iter().zip(&t.dtypes).find(|(_, o)| o.bind(py).is(&dtype_obj)).map(|(d, _)| d);
    let cuda = x.getattr(intern!(py, "is_cuda"))?.is_truthy()?;
    let device = if cuda { x.call_method0(intern!(py, "get_device"))?.extract()? } else { -1 };
    // A meta tensor has no address.
    let meta = !cuda && x.getattr(intern!(py, "is_meta"))?.is_truthy()?;
    let ptr = if meta { 0 } else { x.call_method0(intern!(py, "data_ptr"))?.extract()? };
    Ok(Tensor {
        ptr,
        dtype,
        dtype_obj,
        shape: ints(&x.getattr(intern!(py, "shape"))?)?,
        strides: ints(&x.call_method0(intern!(py, "stride"))?)?,
        device,
        meta,
        obj: x.clone(),
    })
}

/// `x` described ([`describe`]) for a front-end call, or `None` when the dispatcher has
/// something to add for it ([`plain`], [`Tensor::dispatcher_free`]).
fn describe_if_dispatcher_free<'py>(
    py: Python<'py>,
    t: &Torch,
    arg: &str,
    x: &Bound<'py, PyAny>,
    grad: bool,
) -> PyResult<Option<Tensor<'py>>> {
    if !plain(py, t, x) {
        return Ok(None);
    }
    let d = describe(py, t, arg, x)?;
    Ok(if d.dispatcher_free(grad)? { Some(d) } else { None })
}

/// The call's tensors described, in order; `None` when `direct` and torch's dispatcher has
/// something to add ([`state_allows_direct`], [`describe_if_dispatcher_free`]).
fn inputs<'py, const N: usize>(
    py: Python<'py>,
    direct: bool,
    args: [(&str, &Bound<'py, PyAny>); N],
) -> PyResult<Option<(&'static Torch, [Tensor<'py>; N])>> {
    let t = torch(py)?;
    let grad = if direct {
        match state_allows_direct(py, t)? {
            Some(grad) => grad,
            None => return Ok(None),
        }
    } else {
        false
    };
    let mut v = Vec::with_capacity(N);
    for (arg, x) in args {
        let d = if direct {
            match describe_if_dispatcher_free(py, t, arg, x, grad)? {
                Some(d) => d,
                None => return Ok(None),
            }
        } else {
            describe(py, t, arg, x)?
        };
        v.push(d);
    }
    Ok(Some((t, v.try_into().unwrap_or_else(|_| unreachable!("N tensors")))))
}

impl Tensor<'_> {
    /// Whether the dispatcher has nothing to add for this (plain) tensor: not a meta tensor
    /// (the fake implementation gives its outputs), not a lazy negative or conjugate view (the
    /// dispatcher materialises those; the kernels would read the raw storage; only complex
    /// tensors carry the conjugate bit), no gradient to record when `grad` is enabled.
    fn dispatcher_free(&self, grad: bool) -> PyResult<bool> {
        let py = self.obj.py();
        Ok(!self.meta
            && !self.obj.call_method0(intern!(py, "is_neg"))?.is_truthy()?
            && !(matches!(self.dtype, Some(Dtype::C64 | Dtype::C128) | None)
                && self.obj.call_method0(intern!(py, "is_conj"))?.is_truthy()?)
            && !(grad && self.obj.getattr(intern!(py, "requires_grad"))?.is_truthy()?))
    }

    fn device(&self, arg: &str) -> PyResult<i64> {
        if self.device < 0 {
            return Err(bad(arg, "is not a CUDA tensor (rgk's ops run on CUDA tensors)"));
        }
        Ok(self.device)
    }
    fn dtype(&self, arg: &str) -> PyResult<Dtype> {
        self.dtype.ok_or_else(|| bad(arg, format!("dtype {} is not one rgk's ops take", self.dtype_obj)))
    }
    /// The sizes after checking the rank.
    fn dims<const R: usize>(&self, arg: &str) -> PyResult<[usize; R]> {
        if self.shape.len() != R {
            return Err(bad(arg, format!("has {} dimensions, expected {R}", self.shape.len())));
        }
        Ok(std::array::from_fn(|i| self.shape[i] as usize))
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
            return Err(bad(arg, format!("dtype {}, expected torch.{}", self.dtype_obj, dtype.torch_attr())));
        }
        if self.shape.len() != shape.len() || self.shape.iter().zip(shape).any(|(&a, &b)| a as usize != b) {
            return Err(bad(arg, format!("shape {:?}, expected {:?}", self.shape, shape)));
        }
        if self.strides.len() != self.shape.len() {
            return Err(bad(arg, format!("{} strides for {} dimensions", self.strides.len(), self.shape.len())));
        }
        // An empty tensor has no layout to check.
        if !shape.contains(&0) {
            let mut expect = 1i64;
            for (&size, &stride) in self.shape.iter().zip(&self.strides).rev() {
                if size != 1 && stride != expect {
                    return Err(bad(
                        arg,
                        format!("is not contiguous (strides {:?}, shape {:?})", self.strides, self.shape),
                    ));
                }
                expect *= size;
            }
        }
        if !self.ptr.is_multiple_of(dtype.bytes()) {
            return Err(bad(
                arg,
                format!("address {:#x} is not aligned to its {}-byte elements", self.ptr, dtype.bytes()),
            ));
        }
        Ok(self.ptr)
    }
}

/// One input's expected dtype and shape: `(name, tensor, dtype, shape)`.
type Spec<'a, 'py> = (&'a str, &'a Tensor<'py>, Dtype, &'a [usize]);

/// [`Tensor::check`] of every input: their addresses, in order.
fn check_all<const N: usize>(device: i64, specs: [Spec; N]) -> PyResult<[u64; N]> {
    let mut p = [0; N];
    for (i, (name, t, dtype, shape)) in specs.into_iter().enumerate() {
        p[i] = t.check(name, device, dtype, shape)?;
    }
    Ok(p)
}

/// Fresh outputs on CUDA device `device`: their tensors and addresses. Each is `new_empty`
/// (`new_zeros` where `zeroed`) of an empty tensor of its dtype on the device, made once: fewer
/// arguments for torch to parse than `torch.empty`'s. Fresh allocations overlap no input.
fn outputs<'py, const N: usize>(
    py: Python<'py>,
    t: &Torch,
    device: i64,
    specs: [(&[usize], Dtype); N],
    zeroed: bool,
) -> PyResult<([Bound<'py, PyAny>; N], [u64; N])> {
    /// An empty tensor per (device, dtype).
    type Templates = Vec<((i64, Dtype), Py<PyAny>)>;
    static TEMPLATES: Mutex<Templates> = Mutex::new(Vec::new());
    let method = if zeroed { intern!(py, "new_zeros") } else { intern!(py, "new_empty") };
    let mut tensors = Vec::with_capacity(N);
    let mut ptrs = [0; N];
    for (i, (shape, dtype)) in specs.into_iter().enumerate() {
        let found = lock(&TEMPLATES).iter().find(|(k, _)| *k == (device, dtype)).map(|(_, x)| x.clone_ref(py));
        let template = match found {
            Some(x) => x,
            None => {
                let kw = PyDict::new(py);
                kw.set_item(intern!(py, "dtype"), t.dtypes[dtype as usize].bind(py))?;
                kw.set_item(intern!(py, "device"), device)?;
                let x = t.empty.bind(py).call((0,), Some(&kw))?.unbind();
                lock(&TEMPLATES).push(((device, dtype), x.clone_ref(py)));
                x
            }
        };
        let x = template.bind(py).call_method1(method, PyTuple::new(py, shape)?)?;
        ptrs[i] = x.call_method0(intern!(py, "data_ptr"))?.extract()?;
        tensors.push(x);
    }
    Ok((tensors.try_into().unwrap_or_else(|_| unreachable!("N outputs")), ptrs))
}

/// torch's current stream on CUDA device `device`.
fn current_stream(py: Python<'_>, t: &Torch, device: i64) -> PyResult<u64> {
    match &t.raw_stream {
        Some(f) => f.bind(py).call1((device,))?.extract(),
        None => py
            .import("torch")?
            .getattr("cuda")?
            .call_method1("current_stream", (device,))?
            .getattr("cuda_stream")?
            .extract(),
    }
}

fn tuple<'py, const N: usize>(py: Python<'py>, outs: [Bound<'py, PyAny>; N]) -> PyResult<Option<Bound<'py, PyAny>>> {
    Ok(Some(PyTuple::new(py, outs)?.into_any()))
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

/// `y = FFT(x)` over the last axis; `x`: `[*batch, n]` complex64 or complex128 → `y` of its
/// shape and dtype.
#[pyfunction]
fn fft_c2c<'py>(py: Python<'py>, x: &Bound<'py, PyAny>, direct: bool) -> PyResult<Option<Bound<'py, PyAny>>> {
    let Some((t, [x])) = inputs(py, direct, [("x", x)])? else { return Ok(None) };
    let device = x.device("x")?;
    let dtype = x.dtype("x")?;
    let precision = match dtype {
        Dtype::C64 => Precision::C64,
        Dtype::C128 => Precision::C128,
        _ => return Err(bad("x", format!("dtype {}, expected torch.complex64 or torch.complex128", x.dtype_obj))),
    };
    let shape: Vec<usize> = x.shape.iter().map(|&s| s as usize).collect();
    let Some((&n, lead)) = shape.split_last() else {
        return Err(bad("x", "is a scalar; the transform runs over the last axis"));
    };
    let batch: usize = lead.iter().product();
    let [xp] = check_all(device, [("x", &x, dtype, &shape)])?;
    let ([y], [yp]) = outputs(py, t, device, [(&shape, dtype)], false)?;
    if batch == 0 {
        return Ok(Some(y));
    }
    let stream = current_stream(py, t, device)?;
    let b = gpu(device, stream)?;
    let (g, cu) = on_stream(&b, stream)?;
    // Plans hold device tables and a workspace: one per stream, so calls on different
    // streams never share a workspace.
    type Key = (i64, usize, usize, bool, u64);
    static PLANS: OnceLock<Mutex<Cache<Key, FftPlan>>> = OnceLock::new();
    let mut plans = lock(PLANS.get_or_init(Default::default));
    let key = (device, n, batch, precision == Precision::C128, stream);
    let plan = plans.get_or_make(&b, cu, key, || build(&b, &g, cu, |h| FftPlan::new(h, n, batch, precision)))?;
    // SAFETY: `x` was checked to hold `batch·n` elements of the plan's precision on this
    // device, `y` is a fresh tensor of as many; torch keeps both alive until the stream passes
    // the launches. Multi-pass plans go as one graph (launched into torch's stream, whichever
    // it is), so their dependent launches overlap.
    unsafe { plan.run_raw(&g, xp, yp, cu) }.map_err(py_err)?;
    Ok(Some(y))
}

/// MHCPostFwd: `x_out = q(h_post ⊗ x_layer_out + x_res)`; `x_layer_out [B, c]` bf16, `h_post
/// [B, n]` f32, `x_res` `[B, n·c]` bf16 → `x_out [B, n·c]` bf16.
#[pyfunction]
fn mhc_post<'py>(
    py: Python<'py>,
    x_layer_out: &Bound<'py, PyAny>,
    h_post: &Bound<'py, PyAny>,
    x_res: &Bound<'py, PyAny>,
    direct: bool,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let args = [("x_layer_out", x_layer_out), ("h_post", h_post), ("x_res", x_res)];
    let Some((t, [y, h, r])) = inputs(py, direct, args)? else { return Ok(None) };
    let [b, c] = y.dims("x_layer_out")?;
    let [_, n] = h.dims("h_post")?;
    let device = y.device("x_layer_out")?;
    let bf = Dtype::Bf16;
    let [p_y, p_h, p_r] = check_all(
        device,
        [("x_layer_out", &y, bf, &[b, c]), ("h_post", &h, Dtype::F32, &[b, n]), ("x_res", &r, bf, &[b, n * c])],
    )?;
    let ([x_out], [o]) = outputs(py, t, device, [(&[b, n * c], bf)], false)?;
    if b * n * c == 0 {
        return Ok(Some(x_out));
    }
    let stream = current_stream(py, t, device)?;
    let g = gpu(device, stream)?;
    // SAFETY: every input was checked to hold the elements the shape addresses; the output is
    // a fresh tensor of as many.
    unsafe { post_fwd_raw(&g.gpu, MhcPostShape { batch: b, n, c }, p_y, p_h, p_r, o, stream as CUstream) }
        .map_err(py_err)?;
    Ok(Some(x_out))
}

/// `n` for `phi`'s width `m = n² + 2n`, or `ValueError` naming `phi`.
fn stream_count(m: usize) -> PyResult<usize> {
    // m = n² + 2n  ⇔  n = sqrt(m + 1) − 1.
    let n = ((m + 1) as f64).sqrt().round() as usize - 1;
    if n == 0 || n * n + 2 * n != m {
        return Err(bad("phi", format!("width {m} is not n² + 2n for a stream count n ≥ 1")));
    }
    Ok(n)
}

/// MHCPreFwd: `phi [n·c, n²+2n]` f32, `x [B, n·c]` bf16, `b [n²+2n]` f32 → `(x_res [B, n·c]`
/// bf16, `x_layer [B, c]` bf16, `h_post [B, n]` f32`)`.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn mhc_pre<'py>(
    py: Python<'py>,
    phi: &Bound<'py, PyAny>,
    x: &Bound<'py, PyAny>,
    b: &Bound<'py, PyAny>,
    alpha_pre: f32,
    alpha_post: f32,
    alpha_res: f32,
    sinkhorn_repeat: u32,
    sinkhorn_eps: f32,
    direct: bool,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let Some((t, [phi, x, b])) = inputs(py, direct, [("phi", phi), ("x", x), ("b", b)])? else { return Ok(None) };
    let [nc, m] = phi.dims("phi")?;
    let n = stream_count(m)?;
    if nc == 0 || nc % n != 0 {
        return Err(bad("phi", format!("height {nc} is not a positive multiple of n = {n}")));
    }
    let c = nc / n;
    let [batch, _] = x.dims("x")?;
    let device = x.device("x")?;
    let (bf, f32) = (Dtype::Bf16, Dtype::F32);
    let [p_phi, p_x, p_b] =
        check_all(device, [("phi", &phi, f32, &[nc, m]), ("x", &x, bf, &[batch, nc]), ("b", &b, f32, &[m])])?;
    let (outs, [p_res, p_layer, p_h]) =
        outputs(py, t, device, [(&[batch, nc], bf), (&[batch, c], bf), (&[batch, n], f32)], false)?;
    let result = tuple(py, outs)?;
    if batch * c == 0 {
        return Ok(result);
    }
    let params = MhcPreParams { alpha_pre, alpha_post, alpha_res, sinkhorn_repeat, sinkhorn_eps };
    let stream = current_stream(py, t, device)?;
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
    // SAFETY: every input was checked to hold the elements the plan's shape addresses; the
    // outputs are fresh tensors of the plan's shapes; the plan (its workspace, its graph) serves
    // this stream only. Its two kernels go as one graph, so the second one's dependent launch
    // overlaps the first.
    unsafe { op.run_raw(&g, params, [p_phi, p_x, p_b], [p_res, p_layer, p_h], cu) }.map_err(py_err)?;
    Ok(result)
}

/// MHCPostPreFwd (the mHC layer transition): layer L's `x_layer_out [B, c]` bf16, `h_post
/// [B, n]` f32, `x_res [B, n·c]` bf16 and layer L+1's `phi [n·c, n²+2n]` f32, `b [n²+2n]` f32 →
/// `(x_out [B, n·c]` bf16 (the post half's output) and layer L+1's `x_res`, `x_layer`,
/// `h_post)`.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn mhc_post_pre<'py>(
    py: Python<'py>,
    x_layer_out: &Bound<'py, PyAny>,
    h_post: &Bound<'py, PyAny>,
    x_res: &Bound<'py, PyAny>,
    phi: &Bound<'py, PyAny>,
    b: &Bound<'py, PyAny>,
    alpha_pre: f32,
    alpha_post: f32,
    alpha_res: f32,
    sinkhorn_repeat: u32,
    sinkhorn_eps: f32,
    direct: bool,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let args = [("x_layer_out", x_layer_out), ("h_post", h_post), ("x_res", x_res), ("phi", phi), ("b", b)];
    let Some((t, [y, h, r, phi, b])) = inputs(py, direct, args)? else { return Ok(None) };
    let [batch, c] = y.dims("x_layer_out")?;
    let [_, n] = h.dims("h_post")?;
    // As mhc_pre's `phi` check: no streams or no channels leave outputs with elements unwritten.
    if n == 0 {
        return Err(bad("h_post", "has no streams (n = 0)"));
    }
    if c == 0 {
        return Err(bad("x_layer_out", "has no channels (c = 0)"));
    }
    let device = y.device("x_layer_out")?;
    let m = n * n + 2 * n;
    let nc = n * c;
    let (bf, f32) = (Dtype::Bf16, Dtype::F32);
    let [py_, ph, pr, pphi, pb] = check_all(
        device,
        [
            ("x_layer_out", &y, bf, &[batch, c]),
            ("h_post", &h, f32, &[batch, n]),
            ("x_res", &r, bf, &[batch, nc]),
            ("phi", &phi, f32, &[nc, m]),
            ("b", &b, f32, &[m]),
        ],
    )?;
    let (outs, [po, nr, nl, nh]) =
        outputs(py, t, device, [(&[batch, nc], bf), (&[batch, nc], bf), (&[batch, c], bf), (&[batch, n], f32)], false)?;
    let result = tuple(py, outs)?;
    if batch == 0 {
        return Ok(result);
    }
    let params = MhcPreParams { alpha_pre, alpha_post, alpha_res, sinkhorn_repeat, sinkhorn_eps };
    let stream = current_stream(py, t, device)?;
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
    // SAFETY: every input was checked to hold the elements the plan's shape addresses; the
    // outputs are fresh tensors of the plan's shapes; the plan serves this stream only.
    unsafe { op.run_raw(&g, params, [py_, ph, pr, pphi, pb], po, [nr, nl, nh], cu) }.map_err(py_err)?;
    Ok(result)
}

fn half_dtype(arg: &str, t: &Tensor) -> PyResult<Dtype> {
    match t.dtype(arg)? {
        d @ (Dtype::F16 | Dtype::Bf16) => Ok(d),
        _ => Err(bad(arg, format!("dtype {}, expected torch.float16 or torch.bfloat16", t.dtype_obj))),
    }
}

/// EngramGateConvFwd: `h, k, v [M, T, d]`, `rms_w_h, rms_w_v [d]`, `conv_w [4, d]` (one 16-bit
/// dtype) → `(y, vhat [M, T, d]` (the dtype), `alpha, rrms_h, rrms_k, rrms_v [M, T]` f32`)`.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn gate_conv_fwd<'py>(
    py: Python<'py>,
    h: &Bound<'py, PyAny>,
    k: &Bound<'py, PyAny>,
    v: &Bound<'py, PyAny>,
    rms_w_h: &Bound<'py, PyAny>,
    rms_w_v: &Bound<'py, PyAny>,
    conv_w: &Bound<'py, PyAny>,
    direct: bool,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let args = [("h", h), ("k", k), ("v", v), ("rms_w_h", rms_w_h), ("rms_w_v", rms_w_v), ("conv_w", conv_w)];
    let Some((t, [h, k, v, wh, wv, cw])) = inputs(py, direct, args)? else { return Ok(None) };
    let device = h.device("h")?;
    let dt = half_dtype("h", &h)?;
    let [m, t_, d] = h.dims("h")?;
    if d == 0 && m * t_ > 0 {
        return Err(bad("h", "has no channels (d = 0): the rms norms of its rows are undefined"));
    }
    let (x3, r2, f32) = ([m, t_, d], [m, t_], Dtype::F32);
    let p = check_all(
        device,
        [
            ("h", &h, dt, &x3),
            ("k", &k, dt, &x3),
            ("v", &v, dt, &x3),
            ("rms_w_h", &wh, dt, &[d]),
            ("rms_w_v", &wv, dt, &[d]),
            ("conv_w", &cw, dt, &[4, d]),
        ],
    )?;
    let (outs, o) =
        outputs(py, t, device, [(&x3, dt), (&x3, dt), (&r2, f32), (&r2, f32), (&r2, f32), (&r2, f32)], false)?;
    let result = tuple(py, outs)?;
    if m * t_ * d == 0 {
        return Ok(result);
    }
    let stream = current_stream(py, t, device)?;
    let g = gpu(device, stream)?;
    let shape = EngramGateShape { m, t: t_, d };
    let s = stream as CUstream;
    // SAFETY: every input was checked to hold the elements the shape addresses; the outputs
    // are fresh tensors of as many.
    unsafe {
        match dt {
            Dtype::F16 => gate_conv_fwd_raw::<f16>(
                &g.gpu, shape, p[0], p[1], p[2], p[3], p[4], p[5], o[0], o[1], o[2], o[3], o[4], o[5], s,
            ),
            _ => gate_conv_fwd_raw::<bf16>(
                &g.gpu, shape, p[0], p[1], p[2], p[3], p[4], p[5], o[0], o[1], o[2], o[3], o[4], o[5], s,
            ),
        }
    }
    .map_err(py_err)?;
    Ok(result)
}

/// EngramGateConvBwd: `dy, h, k, v [M, T, d]`, the weights, the forward's `alpha, rrms_h,
/// rrms_k [M, T]` f32 → `(dh, dk, dv` (the dtype), `drms_w_h, drms_w_v [d]`, `dconv_w [4, d]`
/// f32`)`; its workspace is a torch tensor of the call.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn gate_conv_bwd<'py>(
    py: Python<'py>,
    dy: &Bound<'py, PyAny>,
    h: &Bound<'py, PyAny>,
    k: &Bound<'py, PyAny>,
    v: &Bound<'py, PyAny>,
    rms_w_h: &Bound<'py, PyAny>,
    rms_w_v: &Bound<'py, PyAny>,
    conv_w: &Bound<'py, PyAny>,
    alpha: &Bound<'py, PyAny>,
    rrms_h: &Bound<'py, PyAny>,
    rrms_k: &Bound<'py, PyAny>,
    direct: bool,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let args = [
        ("dy", dy),
        ("h", h),
        ("k", k),
        ("v", v),
        ("rms_w_h", rms_w_h),
        ("rms_w_v", rms_w_v),
        ("conv_w", conv_w),
        ("alpha", alpha),
        ("rrms_h", rrms_h),
        ("rrms_k", rrms_k),
    ];
    let Some((t, [dy, h, k, v, wh, wv, cw, al, rh, rk])) = inputs(py, direct, args)? else { return Ok(None) };
    let device = dy.device("dy")?;
    let dt = half_dtype("dy", &dy)?;
    let [m, t_, d] = dy.dims("dy")?;
    let shape = EngramGateShape { m, t: t_, d };
    let (x3, r2, f32) = ([m, t_, d], [m, t_], Dtype::F32);
    let p = check_all(
        device,
        [
            ("dy", &dy, dt, &x3),
            ("h", &h, dt, &x3),
            ("k", &k, dt, &x3),
            ("v", &v, dt, &x3),
            ("rms_w_h", &wh, dt, &[d]),
            ("rms_w_v", &wv, dt, &[d]),
            ("conv_w", &cw, dt, &[4, d]),
            ("alpha", &al, f32, &r2),
            ("rrms_h", &rh, f32, &r2),
            ("rrms_k", &rk, f32, &r2),
        ],
    )?;
    let empty = m * t_ * d == 0;
    let (grads, o) = outputs(py, t, device, [(&x3, dt), (&x3, dt), (&x3, dt)], false)?;
    // With no rows the weight gradients are sums over nothing: zeros, nothing launched.
    let (wgrads, w) = outputs(py, t, device, [(&[d], f32), (&[d], f32), (&[4, d], f32)], empty)?;
    let [dh, dk, dv] = grads;
    let [dwh, dwv, dcw] = wgrads;
    let result = tuple(py, [dh, dk, dv, dwh, dwv, dcw])?;
    if empty {
        return Ok(result);
    }
    let ws_len = bwd_workspace_len(shape).map_err(py_err)?;
    let ([_workspace], [ws]) = outputs(py, t, device, [(&[ws_len], f32)], false)?;
    let stream = current_stream(py, t, device)?;
    let bound = gpu(device, stream)?;
    let cu = stream as CUstream;
    // A plan holds the graphs of its two launches (replayed while the pointers recur): one
    // per stream.
    type Key = (i64, [usize; 3], u64);
    static PLANS: OnceLock<Mutex<Cache<Key, GateConvBwdPlan>>> = OnceLock::new();
    let mut plans = lock(PLANS.get_or_init(Default::default));
    let plan =
        plans.get_or_make(&bound, cu, (device, [m, t_, d], stream), || GateConvBwdPlan::new(shape).map_err(py_err))?;
    let inputs = [p[0], p[1], p[2], p[3], p[4], p[5], p[6]];
    let (saved, outputs) = ([p[7], p[8], p[9]], [o[0], o[1], o[2], w[0], w[1], w[2]]);
    // SAFETY: every input was checked to hold the elements the shape addresses; the outputs
    // and the workspace are fresh tensors of as many (the workspace stays alive until the
    // stream passes the launches: torch's allocator reuses a freed block only in stream order);
    // the plan serves this stream only. Its two kernels go as one graph, so the reduce kernel's
    // dependent launch overlaps the main one.
    unsafe {
        match dt {
            Dtype::F16 => plan.run_raw::<f16>(&bound.gpu, inputs, saved, ws, outputs, cu),
            _ => plan.run_raw::<bf16>(&bound.gpu, inputs, saved, ws, outputs, cu),
        }
    }
    .map_err(py_err)?;
    Ok(result)
}

/// EngramDecodeFwd, one step: `e_t [B, d_mem]`, `h_t [B, d]`, `conv_state [B, L, d]`, `w_k,
/// w_v [d_mem, d]`, `rms_w_h, rms_w_v [d]`, `conv_w [K, d]` (one 16-bit dtype) → `(y_t [B, d]`,
/// `new_conv_state [B, L, d])`.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn decode_fwd<'py>(
    py: Python<'py>,
    e_t: &Bound<'py, PyAny>,
    h_t: &Bound<'py, PyAny>,
    conv_state: &Bound<'py, PyAny>,
    w_k: &Bound<'py, PyAny>,
    w_v: &Bound<'py, PyAny>,
    rms_w_h: &Bound<'py, PyAny>,
    rms_w_v: &Bound<'py, PyAny>,
    conv_w: &Bound<'py, PyAny>,
    dilation: usize,
    eps: f32,
    direct: bool,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let args = [
        ("e_t", e_t),
        ("h_t", h_t),
        ("conv_state", conv_state),
        ("w_k", w_k),
        ("w_v", w_v),
        ("rms_w_h", rms_w_h),
        ("rms_w_v", rms_w_v),
        ("conv_w", conv_w),
    ];
    let Some((t, [e, h, st, wk, wv, rwh, rwv, cw])) = inputs(py, direct, args)? else { return Ok(None) };
    let device = e.device("e_t")?;
    let dt = half_dtype("e_t", &e)?;
    let [batch, d_mem] = e.dims("e_t")?;
    let [_, l, d] = st.dims("conv_state")?;
    let [kernel_size, _] = cw.dims("conv_w")?;
    let (h2, s3) = ([batch, d], [batch, l, d]);
    let p = check_all(
        device,
        [
            ("e_t", &e, dt, &[batch, d_mem]),
            ("h_t", &h, dt, &h2),
            ("w_k", &wk, dt, &[d_mem, d]),
            ("w_v", &wv, dt, &[d_mem, d]),
            ("rms_w_h", &rwh, dt, &[d]),
            ("rms_w_v", &rwv, dt, &[d]),
            ("conv_w", &cw, dt, &[kernel_size, d]),
            ("conv_state", &st, dt, &s3),
        ],
    )?;
    let (outs, [y, s_out]) = outputs(py, t, device, [(&h2, dt), (&s3, dt)], false)?;
    let result = tuple(py, outs)?;
    if batch * d == 0 {
        return Ok(result);
    }
    let raw =
        DecodeInputsRaw { e_t: p[0], h_t: p[1], w_k: p[2], w_v: p[3], rms_w_h: p[4], rms_w_v: p[5], conv_w: p[6] };
    let mut shape = EngramDecodeShape::new(batch, d_mem, d, l, kernel_size, dilation);
    shape.eps = eps;
    let stream = current_stream(py, t, device)?;
    let bound = gpu(device, stream)?;
    let (g, cu) = on_stream(&bound, stream)?;
    // A plan owns its partial-sum workspace: one per stream.
    type Key = (i64, [usize; 6], u32, u64);
    static PLANS: OnceLock<Mutex<Cache<Key, EngramDecodePlan>>> = OnceLock::new();
    let mut plans = lock(PLANS.get_or_init(Default::default));
    let key = (device, [batch, d_mem, d, l, kernel_size, dilation], eps.to_bits(), stream);
    let plan = plans.get_or_make(&bound, cu, key, || build(&bound, &g, cu, |h| EngramDecodePlan::new(h, shape)))?;
    let dtype = if dt == Dtype::F16 { DecodeDtype::F16 } else { DecodeDtype::Bf16 };
    // SAFETY: every input was checked to hold the elements the shape addresses; the outputs
    // are fresh tensors of as many.
    unsafe { plan.forward_raw(&g, dtype, raw, p[7], y, s_out, cu) }.map_err(py_err)?;
    Ok(result)
}

/// Whether a front-end call on these tensors may skip torch's dispatcher (the rule of
/// [`inputs`]; `torch.compile` is checked by the caller).
#[pyfunction]
#[pyo3(name = "dispatcher_free", signature = (*tensors))]
fn dispatcher_free_py(py: Python<'_>, tensors: &Bound<'_, PyTuple>) -> PyResult<bool> {
    let t = torch(py)?;
    let Some(grad) = state_allows_direct(py, t)? else { return Ok(false) };
    for x in tensors.iter() {
        if describe_if_dispatcher_free(py, t, "tensor", &x, grad)?.is_none() {
            return Ok(false);
        }
    }
    Ok(true)
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
    m.add_function(wrap_pyfunction!(gate_conv_bwd, m)?)?;
    m.add_function(wrap_pyfunction!(decode_fwd, m)?)?;
    m.add_function(wrap_pyfunction!(dispatcher_free_py, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_available, m)?)?;
    Ok(())
}
