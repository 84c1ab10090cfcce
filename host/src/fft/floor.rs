//! The copy-chain floor of an FFT plan: the same bytes moved by plain device copies, one copy
//! per pass of the plan (`x → y` for one pass; `x → scratch → y` for two), launched the way
//! the plan launches its passes (programmatic dependent launches, one CUDA graph per call).
//! No FFT of those bytes in that many passes can be faster than this chain by more than noise;
//! the bench reports `ours ÷ floor` from both measured in the same run.
use cudarc::driver::sys::{CUdeviceptr, CUstream};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};

use super::FftPlan;
use crate::error::check_len;
use crate::runtime::{launch, launch_pdl, GraphReplay, LaunchDims};
use crate::{Error, Gpu, Result};
use kernel_abi::DeviceCopyArgs;

/// The copy kernel (kernels-gpu `copy.rs`).
pub(crate) const KERNEL: &str = "device_copy_16b";

/// Threads per block of the copy kernel (with two chunks per thread the fastest copy of the FFT
/// rows' bytes measured; the kernel's doc has the sweep).
const THREADS: u32 = 256;
/// 16-byte chunks per thread in one round (the kernel's `COPY_UNROLL`); the kernel loops over
/// its grid, so this only sizes the grid to one round.
const CHUNKS_PER_THREAD: u64 = 2;

/// A chain of device copies standing in for a plan's passes (see the module doc).
#[doc(hidden)]
pub struct CopyChain {
    bytes: usize,
    passes: usize,
    /// The intermediate of a chain of two copies (as the plan's workspace), and its address,
    /// taken once: a `device_ptr` inside a stream capture would record events into it.
    #[allow(dead_code)]
    scratch: Option<CudaSlice<u8>>,
    scratch_ptr: CUdeviceptr,
    graph: GraphReplay,
}

impl CopyChain {
    /// The chain for `plan`: one copy for a one-pass plan, two for a two-pass plan (the
    /// planner makes no more), each of its `n·batch` elements, launched as the plan
    /// launches (the second copy a programmatic dependent, multi-pass chains as one CUDA graph).
    ///
    /// Errors: [`Error::Shape`] naming `n` when the plan's bytes are not a multiple of 16 (the
    /// copy moves 16-byte chunks); a driver error from the scratch allocation.
    pub fn for_plan(gpu: &Gpu, plan: &FftPlan) -> Result<Self> {
        let bytes = plan.n() * plan.batch() * plan.precision().element_bytes();
        if !bytes.is_multiple_of(16) {
            return Err(Error::Shape { arg: "n", msg: format!("n·batch holds {bytes} bytes, not a multiple of 16") });
        }
        let passes = plan.launches().clamp(1, 2);
        let scratch = if passes > 1 { Some(gpu.stream().alloc_zeros::<u8>(bytes)?) } else { None };
        let scratch_ptr = scratch.as_ref().map_or(0, |s| {
            let (p, _g) = s.device_ptr(gpu.stream());
            p
        });
        // The scratch must exist before a run on any stream.
        gpu.stream().synchronize()?;
        Ok(Self { bytes, passes, scratch, scratch_ptr, graph: GraphReplay::new() })
    }

    /// Copies in the chain.
    pub fn passes(&self) -> usize {
        self.passes
    }

    /// Runs the chain on [`Gpu::stream`]: `y = x` through the scratch buffer, `T` the real type
    /// of the plan's precision (`f32` for c64, `f64` for c128). Asynchronous.
    ///
    /// Errors: [`Error::BufferTooSmall`] naming `x` or `y`, [`Error::Shape`] naming `x` or `y`
    /// when a buffer is not 16-byte aligned, a driver error.
    pub fn run<T>(&mut self, gpu: &Gpu, x: &impl DevicePtr<T>, y: &mut impl DevicePtrMut<T>) -> Result<()> {
        let elems = self.bytes / std::mem::size_of::<T>();
        check_len("x", elems, x.len())?;
        check_len("y", elems, y.len())?;
        let st = gpu.stream();
        let (xp, _g1) = x.device_ptr(st);
        let (yp, _g2) = y.device_ptr_mut(st);
        for (arg, p) in [("x", xp), ("y", yp)] {
            if !p.is_multiple_of(16) {
                return Err(Error::Shape { arg, msg: format!("address {p:#x} is not aligned to 16 bytes") });
            }
        }
        let cs = st.cu_stream();
        if self.passes < 2 {
            // SAFETY: both buffers hold `bytes`, checked above; the scratch is ours.
            return unsafe { self.launch_chain(gpu, xp, yp, cs) };
        }
        let mut graph = std::mem::replace(&mut self.graph, GraphReplay::new());
        // SAFETY: as above; the body only enqueues the chain's copies on `cs`.
        let r = unsafe { graph.run(gpu, cs, vec![xp, yp], |s| self.launch_chain(gpu, xp, yp, s)) };
        self.graph = graph;
        r
    }

    /// # Safety
    /// `x` and `y` must address `bytes` bytes of device memory, 16-byte aligned.
    unsafe fn launch_chain(&self, gpu: &Gpu, x: CUdeviceptr, y: CUdeviceptr, stream: CUstream) -> Result<()> {
        let f = gpu.function(KERNEL)?;
        let chunks = (self.bytes / 16) as u64;
        let per_block = THREADS as u64 * CHUNKS_PER_THREAD;
        let grid = chunks.div_ceil(per_block).clamp(1, i32::MAX as u64) as u32;
        let dims = LaunchDims { grid: (grid, 1, 1), block: (THREADS, 1, 1), shared_bytes: 0 };
        let scratch = self.scratch_ptr;
        for i in 0..self.passes {
            let src = (if i == 0 { x } else { scratch }) as *const u32;
            let dst = (if i + 1 == self.passes { y } else { scratch }) as *mut u32;
            let args = DeviceCopyArgs { src, dst, chunks };
            if i > 0 {
                launch_pdl(f, dims, stream, &args)?;
            } else {
                launch(f, dims, stream, &args)?;
            }
        }
        Ok(())
    }
}
