//! The runtime layer: one CUDA context, the kernel module (sm_90 cubin, or the PTX) loaded
//! once and its functions looked up per op family on first use, the stream of each handle, and
//! the launch helper every op uses.
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, OnceLock};

use cudarc::driver::{sys, CudaContext, CudaFunction, CudaModule, CudaStream};
use cudarc::nvrtc::Ptx;
use kernel_abi::KernelArgs;

use crate::{Error, Result};

/// The PTX of every kernel, built from `kernels-gpu` by `build.rs` (self-contained, sm_90).
pub const KERNELS_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/kernels.ptx"));

/// The same kernels as sm_90 machine code (a cubin assembled by `ptxas` at build time), or empty
/// when the build found no `ptxas`. [`Gpu::new`] loads it in preference to [`KERNELS_PTX`]: the
/// driver then has nothing to compile (the PTX takes it tens of seconds on an H200).
pub const KERNELS_CUBIN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/kernels.cubin"));

/// The `ptxas -v` report of the build's [`KERNELS_CUBIN`] (registers, stack and spills per
/// kernel), after the line naming that ptxas's release; empty when the build found no `ptxas`.
#[doc(hidden)]
pub const KERNELS_CUBIN_REPORT: &str = include_str!(concat!(env!("OUT_DIR"), "/kernels.ptxas.txt"));

/// Whether a CUDA driver library and at least one device are present. Never panics.
pub fn cuda_available() -> bool {
    // cudarc's loader panics when libcuda is missing: look for the library first.
    if !unsafe { sys::is_culib_present() } {
        return false;
    }
    CudaContext::device_count().map(|n| n > 0).unwrap_or(false)
}

/// A device with the library's kernels loaded, and the stream its safe entries launch on.
///
/// Create one per device with [`Gpu::new`] and reuse it. Creation opens the context and loads
/// the module (a fraction of a second from the embedded sm_90 machine code; tens of seconds
/// where the driver must compile the PTX); each op family's kernels are looked up on the
/// family's first launch. [`Gpu::with_stream`] and [`Gpu::new_stream`] give handles that share
/// the context and the loaded kernels but launch on another stream of that context; cloning
/// is cheap (two reference counts).
#[derive(Clone)]
pub struct Gpu {
    kernels: Arc<Kernels>,
    stream: Arc<CudaStream>,
}

/// The context's loaded module and, per op family, its functions once first used.
struct Kernels {
    ctx: Arc<CudaContext>,
    module: Arc<CudaModule>,
    from_cubin: bool,
    /// Entry name → index into [`crate::KERNEL_FAMILIES`].
    family_of: HashMap<&'static str, usize>,
    /// Per family: its functions, or the first entry the module lacks.
    families: Vec<OnceLock<std::result::Result<HashMap<&'static str, CudaFunction>, &'static str>>>,
}

impl Gpu {
    /// Opens device `ordinal`, creates a stream and loads the kernel module.
    ///
    /// Errors: [`Error::NoDevice`] when no driver or no such device is present; a driver error
    /// when the module fails to load.
    pub fn new(ordinal: usize) -> Result<Self> {
        if !unsafe { sys::is_culib_present() } {
            return Err(Error::NoDevice("libcuda.so (the NVIDIA driver) was not found".into()));
        }
        let count = CudaContext::device_count().map_err(|e| Error::NoDevice(e.to_string()))?;
        if ordinal as i64 >= count as i64 {
            return Err(Error::NoDevice(format!("device {ordinal} requested, {count} present")));
        }
        let ctx = CudaContext::new(ordinal)?;
        let stream = ctx.new_stream()?;
        // The embedded sm_90 machine code where the device takes it; otherwise (another GPU, a
        // build without ptxas, a driver older than that ptxas) the PTX, compiled by the driver.
        let cubin = if KERNELS_CUBIN.is_empty() {
            None
        } else {
            ctx.load_module(Ptx::from_binary(KERNELS_CUBIN.to_vec())).ok()
        };
        let from_cubin = cubin.is_some();
        let module = match cubin {
            Some(m) => m,
            None => ctx.load_module(Ptx::from_src(KERNELS_PTX))?,
        };
        let mut family_of = HashMap::new();
        for (i, (_, names)) in crate::KERNEL_FAMILIES.iter().enumerate() {
            for &name in names.iter() {
                family_of.insert(name, i);
            }
        }
        let families = crate::KERNEL_FAMILIES.iter().map(|_| OnceLock::new()).collect();
        Ok(Self { kernels: Arc::new(Kernels { ctx, module, from_cubin, family_of, families }), stream })
    }

    /// A handle on the same device and loaded kernels whose safe entries launch on `stream`.
    /// Buffers keep their own order across streams (cudarc records and waits on their events).
    ///
    /// Errors: [`Error::Shape`] naming `stream` when it belongs to another context.
    pub fn with_stream(&self, stream: Arc<CudaStream>) -> Result<Self> {
        if stream.context().cu_ctx() != self.kernels.ctx.cu_ctx() {
            return Err(Error::Shape { arg: "stream", msg: "belongs to another CUDA context than this Gpu's".into() });
        }
        Ok(Self { kernels: self.kernels.clone(), stream })
    }

    /// A handle on a new stream of the same context, sharing the loaded kernels.
    pub fn new_stream(&self) -> Result<Self> {
        let stream = self.kernels.ctx.new_stream()?;
        Ok(Self { kernels: self.kernels.clone(), stream })
    }

    /// Whether the kernels were loaded from the embedded machine code ([`KERNELS_CUBIN`]) rather
    /// than compiled from the PTX at load.
    pub fn kernels_from_cubin(&self) -> bool {
        self.kernels.from_cubin
    }

    /// The context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.kernels.ctx
    }

    /// The stream the safe entries launch on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The loaded module.
    pub fn module(&self) -> &Arc<CudaModule> {
        &self.kernels.module
    }

    /// The op families whose kernels have been looked up so far (a family is on its first
    /// launch, or when a planner query needs its functions); shared by every handle of this
    /// context.
    #[doc(hidden)]
    pub fn loaded_kernel_families(&self) -> Vec<&'static str> {
        let k = &self.kernels;
        crate::KERNEL_FAMILIES
            .iter()
            .zip(&k.families)
            .filter(|(_, f)| f.get().is_some())
            .map(|((n, _), _)| *n)
            .collect()
    }

    /// The kernel `name` (a PTX entry); its family's functions are looked up on first use.
    pub(crate) fn function(&self, name: &'static str) -> Result<&CudaFunction> {
        let k = &*self.kernels;
        let missing = || Error::MissingKernel(name.to_string());
        let &fam = k.family_of.get(name).ok_or_else(missing)?;
        let loaded = k.families[fam].get_or_init(|| {
            let mut map = HashMap::new();
            for &entry in crate::KERNEL_FAMILIES[fam].1.iter() {
                map.insert(entry, k.module.load_function(entry).map_err(|_| entry)?);
            }
            Ok(map)
        });
        match loaded {
            Ok(map) => map.get(name).ok_or_else(missing),
            Err(entry) => Err(Error::MissingKernel(entry.to_string())),
        }
    }
}

/// Orders a plan's uses of its own device memory (workspace, tables) across the streams of
/// its context: the safe entries may be called with [`Gpu`] handles on different streams, and
/// a call on a new stream first waits for the work queued on the previous one. Calls on one
/// stream (the common case) cost nothing. On drop, the stream the plan's memory was allocated
/// on (and is freed on) waits for the last stream that used it.
///
/// Declare it as the plan's first field so that it drops before the plan's buffers.
pub(crate) struct StreamOrder {
    home: Arc<CudaStream>,
    last: Arc<CudaStream>,
}

impl StreamOrder {
    /// Memory allocated (and freed) on `home`.
    pub(crate) fn new(home: &Arc<CudaStream>) -> Self {
        Self { home: home.clone(), last: home.clone() }
    }

    /// Called at the start of a use on `stream`, before anything is queued there. A stream
    /// being captured into a CUDA graph is left alone: a wait on an event recorded outside the
    /// capture would invalidate it, and the graph's replays are ordered by the stream they are
    /// launched on.
    ///
    /// Errors: [`Error::Shape`] naming `gpu` when `stream` belongs to another context than the
    /// plan's.
    pub(crate) fn enter(&mut self, stream: &Arc<CudaStream>) -> Result<()> {
        if Arc::ptr_eq(&self.last, stream) {
            return Ok(());
        }
        if stream.context().cu_ctx() != self.home.context().cu_ctx() {
            return Err(Error::Shape { arg: "gpu", msg: "the plan was made on another CUDA context".into() });
        }
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: `stream` is a live stream of this context.
        unsafe { sys::cuStreamIsCapturing(stream.cu_stream(), &mut status).result()? };
        if status == sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
            stream.join(&self.last)?;
            self.last = stream.clone();
        }
        Ok(())
    }
}

impl Drop for StreamOrder {
    fn drop(&mut self) {
        if !Arc::ptr_eq(&self.last, &self.home) {
            // A failure here leaves nothing to do better than the driver's own error later.
            let _ = self.home.join(&self.last);
        }
    }
}

/// One launch configuration.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchDims {
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    pub shared_bytes: u32,
}

/// One kernel launch as an op plans it: the PTX entry, its geometry and its arguments. The GPU
/// path launches exactly this; the CPU simulation (crate `sim`) runs the entry of that name on
/// the same arguments and geometry.
#[doc(hidden)]
#[derive(Clone, Copy, Debug)]
pub struct Planned<A> {
    pub kernel: &'static str,
    pub dims: LaunchDims,
    pub args: A,
    /// Launched as a programmatic dependent of the previous kernel on the stream
    /// ([`launch_pdl`]): it may start before that kernel ends and must not touch what that
    /// kernel writes before its `griddepcontrol.wait` (the CPU simulation runs every block up
    /// to its wait with the earlier kernels' writes, back to the last plain launch, undone).
    pub dependent: bool,
}

/// Launches `p` on `stream` as its planner says: a programmatic dependent ([`launch_pdl`])
/// when `p.dependent`, else a plain launch ([`launch`]).
///
/// # Safety
/// As [`launch`] and, for a dependent launch, [`launch_pdl`].
pub(crate) unsafe fn launch_planned<A: KernelArgs>(
    f: &CudaFunction,
    p: &Planned<A>,
    stream: sys::CUstream,
) -> Result<()> {
    if p.dependent {
        launch_pdl(f, p.dims, stream, &p.args)
    } else {
        launch(f, p.dims, stream, &p.args)
    }
}

/// Launches `f` on `stream` with its argument struct (the kernel's parameters are its fields).
///
/// # Safety
/// `A` must be the argument struct of `f` (`kernel_abi` names the kernel each struct is for),
/// and every pointer in it valid for the accesses the kernel makes with these dims.
pub(crate) unsafe fn launch<A: KernelArgs>(
    f: &CudaFunction,
    dims: LaunchDims,
    stream: sys::CUstream,
    args: &A,
) -> Result<()> {
    let mut args = *args;
    let mut params = args.params();
    cudarc::driver::result::launch_kernel(
        f.cu_function(),
        dims.grid,
        dims.block,
        dims.shared_bytes,
        stream,
        params.as_mut(),
    )?;
    Ok(())
}

/// The `cuLaunchKernelEx` configuration for `dims` with one launch attribute. `attr` must
/// outlive every use of the returned config (it points into it).
fn launch_config(dims: LaunchDims, stream: sys::CUstream, attr: &mut sys::CUlaunchAttribute) -> sys::CUlaunchConfig {
    sys::CUlaunchConfig {
        gridDimX: dims.grid.0,
        gridDimY: dims.grid.1,
        gridDimZ: dims.grid.2,
        blockDimX: dims.block.0,
        blockDimY: dims.block.1,
        blockDimZ: dims.block.2,
        sharedMemBytes: dims.shared_bytes,
        hStream: stream,
        attrs: attr,
        numAttrs: 1,
    }
}

/// `cuLaunchKernelEx` of `f` with one launch attribute and the kernel parameter array
/// `params`.
///
/// # Safety
/// As [`launch`].
unsafe fn launch_ex(
    f: &CudaFunction,
    dims: LaunchDims,
    stream: sys::CUstream,
    mut attr: sys::CUlaunchAttribute,
    params: &mut [*mut c_void],
) -> Result<()> {
    let cfg = launch_config(dims, stream, &mut attr);
    sys::cuLaunchKernelEx(&cfg, f.cu_function(), params.as_mut_ptr(), std::ptr::null_mut()).result()?;
    Ok(())
}

/// The launch attribute of a programmatic dependent launch.
fn programmatic_attribute() -> sys::CUlaunchAttribute {
    // SAFETY: a plain C struct/union; all-zero is a valid value before the fields are set.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    attr
}

/// Launches `f` on `stream` as a programmatic dependent launch (`cuLaunchKernelEx` with
/// `PROGRAMMATIC_STREAM_SERIALIZATION`): it may start before the previous kernel on the stream
/// completes, once that kernel executes `griddepcontrol.launch_dependents` (or finishes); the
/// kernel must execute `griddepcontrol.wait` (prim `grid_dependency_wait`) before touching
/// anything the previous kernel writes. Used to overlap a second kernel's launch and
/// independent loads with the first kernel of the same op.
///
/// # Safety
/// As [`launch`], plus the kernel's `griddepcontrol.wait` discipline above.
pub(crate) unsafe fn launch_pdl<A: KernelArgs>(
    f: &CudaFunction,
    dims: LaunchDims,
    stream: sys::CUstream,
    args: &A,
) -> Result<()> {
    let mut args = *args;
    let mut params = args.params();
    launch_ex(f, dims, stream, programmatic_attribute(), params.as_mut())
}

/// One op call's launches as a CUDA graph, replayed while the call's arguments are unchanged.
///
/// All kernels of a call reach the device in one submission, so a programmatic dependent
/// launch inside it (captured as a programmatic edge) can overlap its start-up with the
/// previous kernel; separate host launches arrive too far apart for that.
pub(crate) struct GraphReplay {
    /// The most recently used last, at most [`GRAPH_CACHE`] entries.
    cached: Vec<(Vec<u64>, Graph)>,
    /// A stream of our own to capture on when the caller's stream cannot be captured (the
    /// legacy and per-thread default streams); made on first need.
    side: Option<Arc<CudaStream>>,
}

/// Graphs a [`GraphReplay`] keeps (e.g. one per position of a ring-buffer state).
pub const GRAPH_CACHE: usize = 32;

/// An instantiated graph and its template, destroyed together.
struct Graph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
}

// SAFETY: CUDA graph and executable-graph handles are not tied to the thread that created
// them; the driver API takes them from any thread (with their context current), and `Graph`
// only hands them to the driver. Plans owning graphs can so move to another thread.
unsafe impl Send for Graph {}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: both handles were created by this value and are destroyed once.
        unsafe {
            let _ = sys::cuGraphExecDestroy(self.exec);
            let _ = sys::cuGraphDestroy(self.graph);
        }
    }
}

impl GraphReplay {
    pub(crate) fn new() -> Self {
        Self { cached: Vec::new(), side: None }
    }

    /// Launches on `stream` the kernels `body` launches on the stream it is given. When
    /// `stream` is being captured by the caller, `body` simply launches into that capture
    /// (whatever is cached). Otherwise it replays a cached graph when `key` (every pointer and
    /// scalar the launches use) equals a recent call's, or captures `body` (its launches are
    /// recorded, not executed), instantiates the graph, caches it under `key` (the least
    /// recently used of [`GRAPH_CACHE`] goes) and launches it on `stream`. The capture runs on
    /// `stream` itself, or — for the legacy and per-thread default streams, which cannot be
    /// captured — on a stream of this value's own. Host cost: a replay is one `cuGraphLaunch`;
    /// a new key costs a capture and an instantiation (tens of µs). Errors: `body`'s, or a
    /// driver error.
    ///
    /// # Safety
    /// `stream` must be a valid stream of `gpu`'s context, current on this thread; `body` may
    /// only enqueue work on the stream it is given (kernel launches), nothing that
    /// synchronizes or reads back.
    pub(crate) unsafe fn run(
        &mut self,
        gpu: &Gpu,
        stream: sys::CUstream,
        key: Vec<u64>,
        body: impl FnOnce(sys::CUstream) -> Result<()>,
    ) -> Result<()> {
        // First: inside the caller's own capture (PyTorch captures after warm-up calls, so the
        // key may well be cached) the launches go into that capture; replaying a graph into a
        // capturing stream would fail and lose the caller's capture.
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        sys::cuStreamIsCapturing(stream, &mut status).result()?;
        if status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
            return body(stream);
        }
        if let Some(i) = self.cached.iter().position(|(k, _)| *k == key) {
            let entry = self.cached.remove(i);
            sys::cuGraphLaunch(entry.1.exec, stream).result()?;
            self.cached.push(entry);
            return Ok(());
        }
        // The legacy default stream (PyTorch's default: the null handle or `CU_STREAM_LEGACY`,
        // 0x1) and the per-thread default stream (0x2) cannot be captured, but a graph
        // captured elsewhere can be launched into them.
        let capture = if stream.is_null() || stream as usize == 0x1 || stream as usize == 0x2 {
            if self.side.is_none() {
                self.side = Some(gpu.context().new_stream()?);
            }
            self.side.as_ref().expect("made above").cu_stream()
        } else {
            stream
        };
        sys::cuStreamBeginCapture_v2(capture, sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .result()?;
        // Ends the capture should `body` unwind, so that the stream does not stay capturing.
        let guard = EndCaptureOnUnwind(capture);
        let launched = body(capture);
        std::mem::forget(guard);
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        let ended = sys::cuStreamEndCapture(capture, &mut graph).result();
        if let Err(e) = launched.and(ended.map_err(Error::from)) {
            if !graph.is_null() {
                let _ = sys::cuGraphDestroy(graph);
            }
            return Err(e);
        }
        if graph.is_null() {
            return Err(Error::Shape { arg: "graph", msg: "stream capture recorded nothing".into() });
        }
        // A full cache drops its least recently used graph. Updating that executable graph to
        // the new capture (`cuGraphExecUpdate`) instead of instantiating another gained
        // nothing: 40.5 µs against 40.1 µs host time per miss (MHCPreFwd, H200).
        let mut exec: sys::CUgraphExec = std::ptr::null_mut();
        if let Err(e) = sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0).result() {
            let _ = sys::cuGraphDestroy(graph);
            return Err(e.into());
        }
        let g = Graph { graph, exec };
        sys::cuGraphLaunch(g.exec, stream).result()?;
        if self.cached.len() == GRAPH_CACHE {
            self.cached.remove(0);
        }
        self.cached.push((key, g));
        Ok(())
    }
}

/// Ends the stream capture of its stream when dropped (only on unwinding: the normal path
/// forgets it and ends the capture itself), discarding the partial graph.
struct EndCaptureOnUnwind(sys::CUstream);

impl Drop for EndCaptureOnUnwind {
    fn drop(&mut self) {
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: the stream is capturing (begun by `GraphReplay::run`), on this thread.
        unsafe {
            if sys::cuStreamEndCapture(self.0, &mut graph) == sys::CUresult::CUDA_SUCCESS && !graph.is_null() {
                let _ = sys::cuGraphDestroy(graph);
            }
        }
    }
}
