//! MHCPostFwd (docs/ops.md §3).
use cudarc::driver::{sys::CUdeviceptr, sys::CUstream, DevicePtr, DevicePtrMut};
use half::bf16;

use crate::error::{check_len, check_positive, checked_product};
use crate::runtime::{launch, LaunchDims};
use crate::{Gpu, Result};

pub(crate) const KERNEL_ROWS: &str = "mhc_post_fwd_bf16_rows";
pub(crate) const KERNEL_ANY: &str = "mhc_post_fwd_bf16";

/// Launch configuration (for tuning; [`PostConfig::default`] is what [`post_fwd`] uses).
///
/// The vectorised kernel runs a division-free grid `(⌈c/8/block⌉, n, batch)`, one thread per
/// 8 elements with 16-byte loads/stores; it applies when `c % 8 == 0` and `x_layer_out`,
/// `x_res`, `x_out` are 16-byte aligned. Otherwise a general grid-stride kernel runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PostConfig {
    /// Threads per block (a multiple of 32, at most 1024).
    pub block: u32,
}

impl Default for PostConfig {
    /// The block size measured fastest on the H200 (kernels-gpu/src/mhc/NOTES.md).
    fn default() -> Self {
        Self { block: 128 }
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
pub fn post_fwd(
    gpu: &Gpu,
    shape: MhcPostShape,
    x_layer_out: &impl DevicePtr<bf16>,
    h_post: &impl DevicePtr<f32>,
    x_res: &impl DevicePtr<bf16>,
    x_out: &mut impl DevicePtrMut<bf16>,
) -> Result<()> {
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
    post_fwd_raw_with(gpu, shape, PostConfig::default(), x_layer_out, h_post, x_res, x_out, stream)
}

/// [`post_fwd_raw`] with an explicit launch configuration (for tuning and its benchmark).
///
/// # Safety
/// As [`post_fwd_raw`].
#[doc(hidden)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn post_fwd_raw_with(
    gpu: &Gpu,
    shape: MhcPostShape,
    config: PostConfig,
    x_layer_out: CUdeviceptr,
    h_post: CUdeviceptr,
    x_res: CUdeviceptr,
    x_out: CUdeviceptr,
    stream: CUstream,
) -> Result<()> {
    let (_, _, total) = shape.lens()?;
    if config.block == 0 || !config.block.is_multiple_of(32) || config.block > 1024 {
        return Err(crate::Error::Shape {
            arg: "config.block",
            msg: format!("{} is not a multiple of 32 in 32..=1024", config.block),
        });
    }
    let aligned = [x_layer_out, x_res, x_out].iter().all(|p| p % 16 == 0);
    let block = config.block;
    let (mut y, mut h, mut r, mut o) = (x_layer_out, h_post, x_res, x_out);
    if aligned && shape.c.is_multiple_of(8) && total < (1 << 31) && shape.batch < 65536 && shape.n < 65536 {
        let (mut n, mut c) = (shape.n as u32, shape.c as u32);
        let grid = ((shape.c / 8).div_ceil(block as usize) as u32, n, shape.batch as u32);
        let dims = LaunchDims { grid, block: (block, 1, 1), shared_bytes: 0 };
        launch(gpu.function(KERNEL_ROWS)?, dims, stream, &mut [&mut y, &mut h, &mut r, &mut o, &mut n, &mut c])
    } else {
        let f = gpu.function(KERNEL_ANY)?;
        let blocks = total.div_ceil(block as usize).min(132 * 16) as u32;
        let dims = LaunchDims { grid: (blocks, 1, 1), block: (block, 1, 1), shared_bytes: 0 };
        let (mut n, mut c, mut t) = (shape.n as u64, shape.c as u64, total as u64);
        launch(f, dims, stream, &mut [&mut y, &mut h, &mut r, &mut o, &mut n, &mut c, &mut t])
    }
}
