//! MHCPostFwd (docs/ops.md §3).
use cudarc::driver::{sys::CUdeviceptr, sys::CUstream, DevicePtr, DevicePtrMut};
use half::bf16;

use crate::error::{check_len, check_positive, checked_product};
use crate::runtime::{launch_planned, LaunchDims, Planned};
use crate::{Gpu, Result};
use kernel_abi::{PostAnyArgs, PostRowsArgs};

/// The PTX entries of `kernel_abi::mhc_post_kernels!` (the list the kernels are declared
/// from): `KERNELS`, and the entry of each [`PostKernel`] variant.
macro_rules! post_kernel_table {
    ($($name:ident: $kind:ident, $body:ident, $entry:ident;)*) => {
        /// Every PTX entry of MHCPostFwd.
        pub(crate) const KERNELS: &[&str] = &[$(stringify!($name),)*];
        impl PostKernel {
            /// The PTX entry of the plan's kernel.
            pub fn kernel(&self) -> &'static str {
                match self {
                    $(Self::$kind { .. } => stringify!($name),)*
                }
            }
        }
    };
}
kernel_abi::mhc_post_kernels!(post_kernel_table);

/// Threads per block of both kernels: 128. 64…256 measured within one 32 ns CUPTI tick once the
/// grid is division-free (1.15 / 1.22 / 1.38 µs on the seed rows at 128).
const BLOCK: u32 = 128;

/// The kernel of one MHCPostFwd call (the planner [`PostKernel::plan`]; the launch only
/// matches on it).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PostKernel {
    /// `mhc_post_fwd_bf16_rows`: grid `(⌈c/8/block⌉, n, batch)`, one thread per 8 elements
    /// with 16-byte loads/stores, no index division (1.15 / 1.22 / 1.38 µs against 1.28 / 1.31
    /// / 1.50 for a 1-D grid with two u32 divisions per thread). Its idle lanes cost nothing:
    /// one block per batch row 1.41–1.44 µs at hidden-1280, one per stream row level (1.25–1.28
    /// against 1.23–1.25; docs/decisions/mhc.md).
    Rows { grid: (u32, u32, u32) },
    /// `mhc_post_fwd_bf16`: any alignment, `c` and size; one element per thread, grid-stride.
    Any { blocks: u32 },
}

impl PostKernel {
    /// The tuning table: `Rows` when `c % 8 == 0`, `x_layer_out`, `x_res` and `x_out` are
    /// 16-byte aligned (`aligned`) and the 3-D grid holds the shape, else `Any`.
    pub fn plan(shape: MhcPostShape, aligned: bool) -> Result<Self> {
        // Measured and deleted (docs/decisions/mhc.md): one thread per 8 columns × all n streams
        // (≈ 2× slower), 16 elements per thread (+0.03…+0.45 µs), `ld.global.nc.L2::256B` (no change).
        let (_, _, total) = shape.lens()?;
        Ok(if aligned && shape.c.is_multiple_of(8) && total < (1 << 31) && shape.batch < 65536 && shape.n < 65536 {
            Self::Rows { grid: ((shape.c / 8).div_ceil(BLOCK as usize) as u32, shape.n as u32, shape.batch as u32) }
        } else {
            Self::Any { blocks: total.div_ceil(BLOCK as usize).min(132 * 16) as u32 }
        })
    }
}

/// Sizes of one MHCPostFwd call: `batch` rows, `n` streams, `c` channels per stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MhcPostShape {
    pub batch: usize,
    pub n: usize,
    pub c: usize,
}

impl MhcPostShape {
    /// Checks every size is ≥ 1 and returns `(batch·c, batch·n, batch·n·c)` element counts of
    /// `x_layer_out`, `h_post` and `x_res`/`x_out`.
    pub fn lens(&self) -> Result<(usize, usize, usize)> {
        check_positive("batch", self.batch)?;
        check_positive("n", self.n)?;
        check_positive("c", self.c)?;
        Ok((
            checked_product("c", &[self.batch, self.c])?,
            checked_product("n", &[self.batch, self.n])?,
            checked_product("x_res", &[self.batch, self.n, self.c])?,
        ))
    }
}

/// The inputs of [`post_fwd`] (docs/ops.md §3): `x_layer_out` `[batch, c]` bf16, `h_post`
/// `[batch, n]` f32, `x_res` `[batch, n·c]` bf16. Any `cudarc` buffer or view.
#[derive(Clone, Copy)]
pub struct MhcPostInputs<'a> {
    pub x_layer_out: &'a dyn DevicePtr<bf16>,
    pub h_post: &'a dyn DevicePtr<f32>,
    pub x_res: &'a dyn DevicePtr<bf16>,
}

/// The output of [`post_fwd`] (docs/ops.md §3): `x_out` `[batch, n·c]` bf16.
pub struct MhcPostOutputs<'a> {
    pub x_out: &'a mut dyn DevicePtrMut<bf16>,
}

/// MHCPostFwd: `x_out[β, i·c + j] = q(h_post[β,i] · x_layer_out[β,j] + x_res[β, i·c + j])`
/// (docs/ops.md §3), computed in f32 (one FMA) and rounded to nearest-even bf16.
///
/// Shapes (row-major, contiguous): `x_layer_out` `[batch, c]` bf16, `h_post` `[batch, n]` f32,
/// `x_res` `[batch, n·c]` bf16, `x_out` `[batch, n·c]` bf16. Buffers may be larger than needed
/// and may be sub-views at any element offset (a 16-byte-aligned layout with `c % 8 == 0`
/// takes the vectorised kernel). Launches one kernel on [`Gpu::stream`]; asynchronous.
///
/// Errors: [`crate::Error::Shape`] for a zero size, [`crate::Error::BufferTooSmall`] naming the
/// buffer, [`crate::Error::Overflow`], or a driver error from the launch.
pub fn post_fwd(gpu: &Gpu, shape: MhcPostShape, inputs: MhcPostInputs<'_>, outputs: MhcPostOutputs<'_>) -> Result<()> {
    let MhcPostInputs { x_layer_out, h_post, x_res } = inputs;
    let MhcPostOutputs { x_out } = outputs;
    let (ly, lh, lr) = shape.lens()?;
    check_len("x_layer_out", ly, x_layer_out.len())?;
    check_len("h_post", lh, h_post.len())?;
    check_len("x_res", lr, x_res.len())?;
    check_len("x_out", lr, x_out.len())?;
    let stream = gpu.stream();
    let (y, _g1) = x_layer_out.device_ptr(stream);
    let (h, _g2) = h_post.device_ptr(stream);
    let (r, _g3) = x_res.device_ptr(stream);
    let (o, _g4) = x_out.device_ptr_mut(stream);
    // SAFETY: every buffer was checked to hold the elements the shape addresses.
    unsafe { post_fwd_raw(gpu, shape, y, h, r, o, stream.cu_stream()) }
}

/// [`post_fwd`] on raw device pointers, launched on `stream`.
///
/// # Safety
/// Each pointer must address device memory of `gpu`'s context holding at least the elements
/// [`post_fwd`] lists for `shape`, valid until the kernel finishes; `x_out` must not overlap
/// the inputs. Shapes are still validated (the `Err`s of [`post_fwd`]).
pub unsafe fn post_fwd_raw(
    gpu: &Gpu,
    shape: MhcPostShape,
    x_layer_out: CUdeviceptr,
    h_post: CUdeviceptr,
    x_res: CUdeviceptr,
    x_out: CUdeviceptr,
    stream: CUstream,
) -> Result<()> {
    match post_fwd_plan(shape, x_layer_out, h_post, x_res, x_out)? {
        PostLaunch::Rows(p) => launch_planned(gpu.function(p.kernel)?, &p, stream),
        PostLaunch::Any(p) => launch_planned(gpu.function(p.kernel)?, &p, stream),
    }
}

/// The launch of MHCPostFwd on these device addresses: one of the two kernels.
#[doc(hidden)]
#[derive(Clone, Copy, Debug)]
pub enum PostLaunch {
    Rows(Planned<PostRowsArgs>),
    Any(Planned<PostAnyArgs>),
}

/// The launch [`post_fwd_raw`] submits for `shape` on these device addresses (validated as
/// there).
#[doc(hidden)]
pub fn post_fwd_plan(
    shape: MhcPostShape,
    x_layer_out: CUdeviceptr,
    h_post: CUdeviceptr,
    x_res: CUdeviceptr,
    x_out: CUdeviceptr,
) -> Result<PostLaunch> {
    let (_, _, total) = shape.lens()?;
    let aligned = [x_layer_out, x_res, x_out].iter().all(|p| p % 16 == 0);
    let plan = PostKernel::plan(shape, aligned)?;
    let kernel = plan.kernel();
    let (x_layer_out, h_post, x_res, x_out) =
        (x_layer_out as *const u16, h_post as *const f32, x_res as *const u16, x_out as *mut u16);
    Ok(match plan {
        PostKernel::Rows { grid } => {
            let args = PostRowsArgs { x_layer_out, h_post, x_res, x_out, n: shape.n as u32, c: shape.c as u32 };
            let dims = LaunchDims { grid, block: (BLOCK, 1, 1), shared_bytes: 0 };
            PostLaunch::Rows(Planned { kernel, dims, args, dependent: false })
        }
        PostKernel::Any { blocks } => {
            let (n, c, total) = (shape.n as u64, shape.c as u64, total as u64);
            let args = PostAnyArgs { x_layer_out, h_post, x_res, x_out, n, c, total };
            let dims = LaunchDims { grid: (blocks, 1, 1), block: (BLOCK, 1, 1), shared_bytes: 0 };
            PostLaunch::Any(Planned { kernel, dims, args, dependent: false })
        }
    })
}
