//! FFTC2CFwd: batched 1-D complex-to-complex forward FFT (docs/ops.md §1),
//! `y[b, k] = Σ_{j<n} x[b, j] · exp(-2πi·j·k/n)`, for every power of two `n` from 1 to 2^26.
//!
//! A [`FftPlan`] is made once for `(n, batch, precision)`: it chooses the passes (one
//! shared-memory Stockham kernel for `n ≤ 2^13`, a two-pass four-step scheme above), computes
//! the twiddle tables on the host in f64 ([`crate::reference::twiddle`], rounded once to f32
//! for c64), uploads them and allocates the workspace. [`FftPlan::execute_c64`] /
//! [`FftPlan::execute_c128`] (and the in-place and raw variants) then launch on a stream with
//! no host allocation beyond the launch arguments.
//!
//! Storage: `x: [batch, n]` contiguous complex, element `j` of transform `b` at index
//! `b·n + j`. The safe entries take device buffers of [`num_complex::Complex<f32>`] (c64) or
//! [`num_complex::Complex<f64>`] (c128) elements; `cudarc` has no `DeviceRepr` for them, so
//! [`clone_htod`], [`alloc_zeros`] and [`clone_dtoh`] move them to and from the device, and
//! [`view_as_complex`] / [`view_as_complex_mut`] view an interleaved real buffer (`[*B, n, 2]`,
//! as `torch.view_as_real` gives) as complex without a copy.
//!
//! ```no_run
//! use rgk::{fft::{self, FftPlan, Precision}, Complex, Gpu};
//! # fn main() -> Result<(), rgk::Error> {
//! let gpu = Gpu::new(0)?;
//! let (n, batch) = (4096, 8);
//! let mut plan = FftPlan::new(&gpu, n, batch, Precision::C64)?;
//! let x = fft::clone_htod(gpu.stream(), &vec![Complex::new(1.0f32, 0.0); n * batch])?;
//! let mut y = fft::alloc_zeros::<f32>(gpu.stream(), n * batch)?;
//! plan.execute_c64(&gpu, &x, &mut y)?;
//! let host: Vec<Complex<f32>> = fft::clone_dtoh(gpu.stream(), &y)?;
//! # Ok(()) }
//! ```
use std::sync::Arc;

use cudarc::driver::sys::{CUdeviceptr, CUfunction_attribute_enum, CUstream};
use cudarc::driver::{
    CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceRepr, ValidAsZeroBits,
};
use num_complex::Complex;

use crate::error::check_len;
use crate::runtime::{launch_planned, GraphReplay, StreamOrder};
use crate::{Error, Gpu, Result};

mod floor;
// The planner, public for the CPU simulation of the kernels (crate `sim`): not part of the API.
#[doc(hidden)]
pub mod plan;

#[doc(hidden)]
pub use floor::CopyChain;
pub use plan::MAX_ELEMENTS;

/// Streaming multiprocessors assumed when the driver does not say (the H200's 132; the count
/// only sizes persistent grids, never changes a result).
const DEFAULT_SMS: u32 = 132;
use plan::{max_log_n, Pass, PlanPtrs};

/// PTX entries of the FFT (the planner's kernels and the copy-chain floor's).
pub(crate) const KERNELS: &[&str] = plan::PTX_ENTRIES;

/// The complex storage type of a transform.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Precision {
    /// complex64: interleaved `(f32 re, f32 im)`, 8 bytes per element.
    C64,
    /// complex128: interleaved `(f64 re, f64 im)`, 16 bytes per element.
    C128,
}

/// The real component type of a complex FFT element: `f32` (c64) or `f64` (c128). Sealed.
pub trait Real: DeviceRepr + ValidAsZeroBits + Copy + Default + sealed::Sealed + 'static {
    /// The transform precision of `Complex<Self>` elements.
    const PRECISION: Precision;
}
impl Real for f32 {
    const PRECISION: Precision = Precision::C64;
}
impl Real for f64 {
    const PRECISION: Precision = Precision::C128;
}
mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
}

/// The interleaved reals of a complex slice (`Complex<R>` is `#[repr(C)] { re, im }`).
fn as_reals<R: Real>(v: &[Complex<R>]) -> &[R] {
    // SAFETY: `Complex<R>` is `repr(C)` of two `R`: the same memory as `2·len` reals.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<R>(), 2 * v.len()) }
}

/// Moves an interleaved real device buffer (`2·len` reals) into a complex one of `len`
/// elements (the same allocation, no copy).
fn into_complex<R: Real>(stream: &Arc<CudaStream>, reals: CudaSlice<R>) -> CudaSlice<Complex<R>> {
    let len = reals.len() / 2;
    // SAFETY: the allocation holds `2·len` reals = `len` complex elements of the same
    // alignment; every bit pattern is a valid `Complex<R>`; ownership moves to the new slice.
    let mut c = unsafe { stream.upgrade_device_ptr::<Complex<R>>(reals.leak(), len) };
    // Record the new slice's write event after the copy or memset enqueued on `stream`, so a
    // use on another stream waits for it (the events of `upgrade_device_ptr` start unrecorded).
    drop(c.device_ptr_mut(stream));
    c
}

/// Copies `host` to a new device buffer of complex elements on `stream` (what
/// `CudaStream::clone_htod` does for `DeviceRepr` types).
pub fn clone_htod<R: Real>(stream: &Arc<CudaStream>, host: &[Complex<R>]) -> Result<CudaSlice<Complex<R>>> {
    let reals = stream.clone_htod(as_reals(host))?;
    Ok(into_complex(stream, reals))
}

/// A new zeroed device buffer of `len` complex elements on `stream`.
pub fn alloc_zeros<R: Real>(stream: &Arc<CudaStream>, len: usize) -> Result<CudaSlice<Complex<R>>> {
    let n = len.checked_mul(2).ok_or_else(|| Error::Overflow { arg: "len", msg: format!("2·{len} reals") })?;
    let reals = stream.alloc_zeros::<R>(n)?;
    Ok(into_complex(stream, reals))
}

/// Copies a device buffer of complex elements to the host (synchronizes `stream`).
pub fn clone_dtoh<R: Real>(stream: &Arc<CudaStream>, dev: &impl DevicePtr<Complex<R>>) -> Result<Vec<Complex<R>>> {
    let mut host = vec![Complex::<R>::default(); dev.len()];
    {
        let (p, _g) = dev.device_ptr(stream);
        // SAFETY: `host` is `Complex<R>` plain data of `len` elements; the device buffer
        // holds as many; the copy is complete after the synchronize below.
        let bytes =
            unsafe { std::slice::from_raw_parts_mut(host.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(&host[..])) };
        stream.context().bind_to_thread()?;
        unsafe { cudarc::driver::result::memcpy_dtoh_async(bytes, p, stream.cu_stream()) }?;
    }
    stream.synchronize()?;
    Ok(host)
}

/// An interleaved real buffer (`[…, 2]`: re, im) viewed as complex elements, without a copy;
/// `len / 2` elements (an odd trailing real is left out). A view whose address is not a
/// multiple of the element size is refused by the executions ([`Error::Shape`]).
pub fn view_as_complex<'a, R: Real>(reals: &CudaView<'a, R>) -> CudaView<'a, Complex<R>> {
    // SAFETY: `len/2` complex elements fit in `len` reals; every bit pattern is valid.
    unsafe { reals.transmute::<Complex<R>>(reals.len() / 2) }.expect("len/2 complex elements fit in len reals")
}

/// [`view_as_complex`] for a mutable view.
pub fn view_as_complex_mut<'b, R: Real>(reals: &'b mut CudaViewMut<'_, R>) -> CudaViewMut<'b, Complex<R>> {
    let len = reals.len() / 2;
    // SAFETY: as in `view_as_complex`.
    unsafe { reals.transmute_mut::<Complex<R>>(len) }.expect("len/2 complex elements fit in len reals")
}

impl Precision {
    /// Longest supported transform: 2^26 for c64, 2^24 for c128 (two passes of at most 2^13,
    /// resp. 2^12).
    pub fn max_len(self) -> usize {
        1 << max_log_n(self.element_bytes())
    }

    /// Bytes of one complex element.
    pub fn element_bytes(self) -> usize {
        match self {
            Precision::C64 => 8,
            Precision::C128 => 16,
        }
    }
}

/// A prepared batched forward FFT of `batch` transforms of length `n` (docs/ops.md §1).
///
/// Holds the twiddle tables and the workspace (device memory of the [`Gpu`] it was made on).
/// Executions of one plan must not overlap in time (they share the workspace): the safe
/// entries take `&mut self` and may be called on any stream of the context (a [`Gpu`] handle
/// from [`Gpu::with_stream`]); an execution on another stream than the previous one waits for
/// it. The raw entry leaves all of this to the caller.
pub struct FftPlan {
    order: StreamOrder,
    n: usize,
    batch: usize,
    precision: Precision,
    passes: Vec<Pass>,
    // The device buffers below are owned here and used through `ptrs` / `stw_ptrs`.
    /// Four-step twiddles `W_n^i` (`i < 2^s`) and `W_n^{i·2^s}` (`i < n/2^s`).
    #[allow(dead_code)]
    twlo: Option<CudaSlice<u8>>,
    #[allow(dead_code)]
    twhi: Option<CudaSlice<u8>>,
    work: Option<CudaSlice<u8>>,
    /// Per pass: its stage table.
    #[allow(dead_code)]
    stw: Vec<CudaSlice<u8>>,
    stw_ptrs: Vec<CUdeviceptr>,
    ptrs: PlanPtrs,
    graph: GraphReplay,
}

/// Checks `(n, batch)` and returns `log2 n`. Errors name `n` or `batch`.
fn validate(n: usize, batch: usize, precision: Precision) -> Result<u32> {
    if n == 0 {
        return Err(Error::Shape { arg: "n", msg: "must be at least 1".into() });
    }
    if !n.is_power_of_two() {
        return Err(Error::Shape { arg: "n", msg: format!("{n} is not a power of two") });
    }
    let log_n = n.trailing_zeros();
    if n > precision.max_len() {
        return Err(Error::Shape {
            arg: "n",
            msg: format!("{n} exceeds the longest supported {precision:?} length {}", precision.max_len()),
        });
    }
    if batch == 0 {
        return Err(Error::Shape { arg: "batch", msg: "must be at least 1".into() });
    }
    match n.checked_mul(batch) {
        Some(t) if t <= MAX_ELEMENTS => Ok(log_n),
        _ => Err(Error::Overflow {
            arg: "batch",
            msg: format!("n·batch = {n}·{batch} exceeds {MAX_ELEMENTS} elements (or usize)"),
        }),
    }
}

fn upload(gpu: &Gpu, prec: Precision, v: &[f64]) -> Result<CudaSlice<u8>> {
    let bytes: Vec<u8> = match prec {
        Precision::C64 => v.iter().flat_map(|&a| (a as f32).to_le_bytes()).collect(),
        Precision::C128 => v.iter().flat_map(|&a| a.to_le_bytes()).collect(),
    };
    Ok(gpu.stream().clone_htod(&bytes)?)
}

fn raw_ptr(gpu: &Gpu, s: &Option<CudaSlice<u8>>) -> CUdeviceptr {
    match s {
        Some(s) => {
            let (p, _guard) = s.device_ptr(gpu.stream());
            p
        }
        None => 0,
    }
}

impl FftPlan {
    /// Plans `batch` forward transforms of length `n` in `precision` on `gpu`: the passes of
    /// the tuning table's row for `n` (`plan.rs`), persistent row passes sized for the device.
    ///
    /// Errors: [`Error::Shape`] naming `n` (0, not a power of two, above [`Precision::max_len`]) or
    /// `batch` (0); [`Error::Overflow`] naming `batch` when `n·batch` exceeds
    /// [`MAX_ELEMENTS`]; a driver error from the uploads or the allocation.
    pub fn new(gpu: &Gpu, n: usize, batch: usize, precision: Precision) -> Result<Self> {
        let log_n = validate(n, batch, precision)?;
        let elem = precision.element_bytes();
        let mut passes = plan::plan(precision, log_n, batch);
        let sms = gpu
            .context()
            .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map(|v| v.max(1) as u32)
            .unwrap_or(DEFAULT_SMS);
        for p in passes.iter_mut() {
            for k in [p.kernel, p.unaligned] {
                let f = gpu.function(k.name)?;
                // The kernel table's `max_threads` comes from the sm_90 registers of the build;
                // a build whose registers allow fewer threads fails here, not at launch.
                let max = f.get_attribute(CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?;
                if (max as u32) < p.threads {
                    return Err(Error::Shape {
                        arg: "n",
                        msg: format!("{} allows {max} threads per block, the plan needs {}", k.name, p.threads),
                    });
                }
                let attr = CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
                if p.smem_bytes > 48 * 1024 && f.get_attribute(attr)? < p.smem_bytes as i32 {
                    f.set_attribute(attr, p.smem_bytes as i32)?;
                }
            }
            if p.persistent {
                // Blocks resident per SM: the kernel's registers and the pass's shared memory.
                let f = gpu.function(p.kernel.name)?;
                let resident =
                    f.occupancy_max_active_blocks_per_multiprocessor(p.threads, p.smem_bytes as usize, None)?;
                plan::persist(p, sms, resident);
            }
        }
        // The c64 kernels compute the four-step twiddles (`kernels-gpu` `Mem::twiddle`).
        let (twlo, twhi) = if passes.len() > 1 && precision == Precision::C128 {
            let (lo, hi) = plan::four_step_tables(log_n);
            (Some(upload(gpu, precision, &lo)?), Some(upload(gpu, precision, &hi)?))
        } else {
            (None, None)
        };
        let work = if passes.len() > 1 { Some(gpu.stream().alloc_zeros::<u8>(n * batch * elem)?) } else { None };
        let stw = passes
            .iter()
            .map(|p| upload(gpu, precision, &plan::stage_table(p.log_l, p.e)))
            .collect::<Result<Vec<_>>>()?;
        let stw_ptrs = stw.iter().map(|s| s.device_ptr(gpu.stream()).0).collect();
        // The tables must be on the device before an execution on any other stream.
        gpu.stream().synchronize()?;
        let ptrs = PlanPtrs { twlo: raw_ptr(gpu, &twlo), twhi: raw_ptr(gpu, &twhi), work: raw_ptr(gpu, &work) };
        let order = StreamOrder::new(gpu.stream());
        Ok(Self {
            order,
            n,
            batch,
            precision,
            passes,
            twlo,
            twhi,
            work,
            stw,
            stw_ptrs,
            ptrs,
            graph: GraphReplay::new(),
        })
    }

    /// The PTX entry of every pass, in launch order (for tests and reports).
    #[doc(hidden)]
    pub fn pass_kernels(&self) -> Vec<&'static str> {
        self.passes.iter().map(|p| p.kernel.name).collect()
    }

    /// Transform length.
    pub fn n(&self) -> usize {
        self.n
    }
    /// Number of transforms.
    pub fn batch(&self) -> usize {
        self.batch
    }
    /// Storage precision.
    pub fn precision(&self) -> Precision {
        self.precision
    }
    /// Number of kernel launches one execution makes (0 for `n = 1`: a device copy).
    pub fn launches(&self) -> usize {
        self.passes.len()
    }
    /// Bytes of device workspace the plan holds (0 for one-pass plans).
    pub fn workspace_bytes(&self) -> usize {
        self.work.as_ref().map_or(0, |w| w.len())
    }
    /// Complex elements each of `x` and `y` must hold: `n·batch`.
    pub fn buffer_len(&self) -> usize {
        self.n * self.batch
    }

    fn check_precision(&self, want: Precision) -> Result<()> {
        if self.precision != want {
            return Err(Error::Shape {
                arg: "x",
                msg: format!("the plan is {:?}, the buffers are {want:?}", self.precision),
            });
        }
        Ok(())
    }

    /// Executes the plan out of place on [`Gpu::stream`]: `y = FFT(x)`, c64 (buffers of at least
    /// `n·batch` [`Complex<f32>`] elements). Asynchronous.
    ///
    /// Errors: [`Error::Shape`] (`x`) if the plan is c128, [`Error::BufferTooSmall`] naming `x`
    /// or `y`, a driver error from the launch.
    pub fn execute_c64(
        &mut self,
        gpu: &Gpu,
        x: &impl DevicePtr<Complex<f32>>,
        y: &mut impl DevicePtrMut<Complex<f32>>,
    ) -> Result<()> {
        self.execute_typed(gpu, x, y)
    }

    /// In-place c64 execution: `xy = FFT(xy)` (otherwise as [`FftPlan::execute_c64`]).
    pub fn execute_c64_inplace(&mut self, gpu: &Gpu, xy: &mut impl DevicePtrMut<Complex<f32>>) -> Result<()> {
        self.execute_inplace_typed(gpu, xy)
    }

    /// Executes the plan out of place on [`Gpu::stream`], c128 (buffers of at least `n·batch`
    /// [`Complex<f64>`] elements). Errors as [`FftPlan::execute_c64`].
    pub fn execute_c128(
        &mut self,
        gpu: &Gpu,
        x: &impl DevicePtr<Complex<f64>>,
        y: &mut impl DevicePtrMut<Complex<f64>>,
    ) -> Result<()> {
        self.execute_typed(gpu, x, y)
    }

    /// In-place c128 execution.
    pub fn execute_c128_inplace(&mut self, gpu: &Gpu, xy: &mut impl DevicePtrMut<Complex<f64>>) -> Result<()> {
        self.execute_inplace_typed(gpu, xy)
    }

    /// The safe out-of-place entries: the element type gives the precision, buffers are
    /// checked here.
    fn execute_typed<R: Real>(
        &mut self,
        gpu: &Gpu,
        x: &impl DevicePtr<Complex<R>>,
        y: &mut impl DevicePtrMut<Complex<R>>,
    ) -> Result<()> {
        self.check_precision(R::PRECISION)?;
        check_len("x", self.buffer_len(), x.len())?;
        check_len("y", self.buffer_len(), y.len())?;
        let st = gpu.stream();
        self.order.enter(st)?;
        let (xp, _g1) = x.device_ptr(st);
        let (yp, _g2) = y.device_ptr_mut(st);
        // SAFETY: both buffers hold the elements the plan addresses; &mut self: no overlap.
        unsafe { self.run_raw(gpu, xp, yp, st.cu_stream()) }
    }

    /// The safe in-place entries (x == y is supported by the kernels).
    fn execute_inplace_typed<R: Real>(&mut self, gpu: &Gpu, xy: &mut impl DevicePtrMut<Complex<R>>) -> Result<()> {
        self.check_precision(R::PRECISION)?;
        check_len("x", self.buffer_len(), xy.len())?;
        let st = gpu.stream();
        self.order.enter(st)?;
        let (p, _g) = xy.device_ptr_mut(st);
        // SAFETY: the buffer holds the elements the plan addresses.
        unsafe { self.run_raw(gpu, p, p, st.cu_stream()) }
    }

    /// [`FftPlan::execute_raw`], with a multi-pass plan's launches submitted as one CUDA graph
    /// (captured on the first call with a pair of pointers, replayed when it recurs, up to 32
    /// pairs): separate host launches reach the device too far apart for the dependent
    /// launches to overlap (longconv-64k 11.65 against 12.11 µs). Single-pass plans launch
    /// directly. Errors: those of [`FftPlan::execute_raw`].
    ///
    /// # Safety
    /// As [`FftPlan::execute_raw`]; `stream` belongs to `gpu`'s context, and the plan outlives
    /// the launches (nothing here orders its drop after them).
    pub unsafe fn run_raw(&mut self, gpu: &Gpu, x: CUdeviceptr, y: CUdeviceptr, stream: CUstream) -> Result<()> {
        if self.passes.len() < 2 {
            return self.execute_raw(gpu, x, y, stream);
        }
        let mut graph = std::mem::replace(&mut self.graph, GraphReplay::new());
        let r = graph.run(gpu, stream, vec![x, y], |s| self.execute_raw(gpu, x, y, s));
        self.graph = graph;
        r
    }

    /// Executes the plan on raw device pointers, launched on `stream`: `y = FFT(x)`, each a
    /// `[batch, n]` interleaved complex array of the plan's precision. `x == y` (in place) is
    /// supported; partially overlapping buffers are an error.
    ///
    /// Errors: [`Error::Shape`] naming `x` or `y` if a pointer is not aligned to the element
    /// size, or naming `y` if the buffers overlap without being equal; a driver error.
    ///
    /// # Safety
    /// `x` and `y` must address `n·batch` elements of device memory of `gpu`'s context, valid
    /// until the launches finish; no other execution of this plan may run at the same time.
    pub unsafe fn execute_raw(&self, gpu: &Gpu, x: CUdeviceptr, y: CUdeviceptr, stream: CUstream) -> Result<()> {
        let elem = self.precision.element_bytes() as u64;
        for (arg, p) in [("x", x), ("y", y)] {
            if p % elem != 0 {
                return Err(Error::Shape { arg, msg: format!("address {p:#x} is not aligned to {elem} bytes") });
            }
        }
        let bytes = (self.n * self.batch) as u64 * elem;
        if x != y && x < y + bytes && y < x + bytes {
            return Err(Error::Shape { arg: "y", msg: "overlaps x without being the same buffer".into() });
        }
        if self.passes.is_empty() {
            if x != y {
                cudarc::driver::result::memcpy_dtod_async(y, x, bytes as usize, stream)?;
            }
            return Ok(());
        }
        let log_n = self.n.trailing_zeros();
        for (i, &stw) in self.stw_ptrs.iter().enumerate() {
            let l = plan::pass_launch(&self.passes, i, log_n, self.ptrs, stw, x, y, false);
            launch_planned(gpu.function(l.kernel)?, &l, stream)?;
        }
        Ok(())
    }
}

/// Every PTX entry the planner launches, swept over every length of both precisions and
/// batches that reach every tuning row, persistent grid and fallback (the staged passes'
/// `unaligned` kernels), plus the copy-chain floor's kernel ([`CopyChain`]). Equal to the
/// family's PTX entries (GPU test `planned_kernels_are_the_ptx_entries`).
#[doc(hidden)]
pub fn planned_kernels(gpu: &Gpu) -> Result<std::collections::BTreeSet<&'static str>> {
    let mut names = std::collections::BTreeSet::new();
    for precision in [Precision::C64, Precision::C128] {
        for log_n in 0..=max_log_n(precision.element_bytes()) {
            for batch in [1, 3, 300] {
                for p in plan::plan(precision, log_n, batch) {
                    names.insert(p.kernel.name);
                    names.insert(p.unaligned.name);
                }
            }
        }
    }
    names.insert(floor::KERNEL);
    // Every name is an entry of the loaded module.
    for name in &names {
        gpu.function(name)?;
    }
    Ok(names)
}

/// The driver's `MAX_THREADS_PER_BLOCK` of every planned kernel, by name (for the GPU test of
/// the kernel table's `max_threads`: `plan.rs` `Kernel::max_threads`).
#[doc(hidden)]
pub fn kernel_thread_limits(gpu: &Gpu) -> Result<Vec<(&'static str, u32, i32)>> {
    plan::KERNELS
        .iter()
        .map(|k| {
            let f = gpu.function(k.name)?;
            let max = f.get_attribute(CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?;
            Ok((k.name, k.max_threads, max))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_the_argument() {
        let shape_arg = |r: Result<u32>| match r {
            Err(Error::Shape { arg, .. }) => arg,
            other => panic!("expected a shape error, got {other:?}"),
        };
        let (c64, c128) = (Precision::C64, Precision::C128);
        assert_eq!(shape_arg(validate(0, 1, c64)), "n");
        assert_eq!(shape_arg(validate(3, 1, c64)), "n");
        assert_eq!(shape_arg(validate(1000, 4, c128)), "n");
        assert_eq!(shape_arg(validate(1 << 27, 1, c64)), "n");
        assert_eq!(shape_arg(validate(1 << 25, 1, c128)), "n");
        assert_eq!(shape_arg(validate(8, 0, c64)), "batch");
        assert!(matches!(validate(1 << 20, 1 << 12, c64), Err(Error::Overflow { arg: "batch", .. })));
        assert!(matches!(validate(1 << 24, usize::MAX / 2, c128), Err(Error::Overflow { arg: "batch", .. })));
        assert_eq!(validate(1, 1, c64).unwrap(), 0);
        assert_eq!(validate(1 << 22, 4, c128).unwrap(), 22);
        assert_eq!(validate(1 << 26, 1, c64).unwrap(), 26);
        assert_eq!(validate(1 << 24, 1, c128).unwrap(), 24);
        assert_eq!(validate(1 << 20, 1 << 11, c64).unwrap(), 20);
    }
}
