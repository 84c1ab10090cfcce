//! MHCPreFwd (SPEC.md §2): the mHC pre-layer projection, Sinkhorn normalisation and stream
//! mixing, in one launch (`kernels-gpu/src/mhc/pre.rs` describes the algorithm).
use std::ffi::c_void;

use cudarc::driver::{sys, sys::CUdeviceptr, sys::CUstream, CudaSlice, DevicePtr, DevicePtrMut};
use half::bf16;

use crate::error::{check_len, check_positive, checked_product};
use crate::runtime::{launch, KernelArg, LaunchDims};
use crate::{Error, Gpu, Result};

pub(crate) const KERNEL: &str = "mhc_pre_fwd";
pub(crate) const KERNELS: &[&str] = &[KERNEL];

/// Batch rows per group (the kernel's `BT`).
const BT: usize = 4;
/// Largest grid the kernel's reduction handles (`32·GL`).
const MAX_GRID: usize = 256;
/// Workspace words before the partials (the kernel's `WS_HEADER`).
const WS_HEADER: usize = 16;
/// Shared-memory budget for the staged x of one tile, bytes.
const XS_BUDGET: usize = 32 * 1024;
/// Dynamic shared memory available without opting in, bytes.
const SMEM_DEFAULT: usize = 48 * 1024;

/// Sizes of one MHCPreFwd call: `batch` rows, `n` streams, `c` channels per stream.
/// `phi` is `[n·c, n²+2n]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MhcPreShape {
    pub batch: usize,
    pub n: usize,
    pub c: usize,
}

/// Element counts of every buffer of a [`MhcPreShape`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MhcPreLens {
    /// `phi`: `n·c · (n²+2n)` f32.
    pub phi: usize,
    /// `x` and `x_res`: `batch · n·c` bf16.
    pub x: usize,
    /// `b`: `n²+2n` f32.
    pub b: usize,
    /// `x_layer`: `batch · c` bf16.
    pub x_layer: usize,
    /// `h_post`: `batch · n` f32.
    pub h_post: usize,
}

impl MhcPreShape {
    /// The shape from the tensors' dimensions: `phi: [phi_rows, phi_cols]`, `x: [batch, ·]`.
    /// `n` is recovered from `phi_cols = n² + 2n`, then `c = phi_rows / n`.
    ///
    /// Errors: [`Error::Shape`] naming `phi` when `phi_cols` is not `n²+2n` for an integer
    /// `n ≥ 1`, or `phi_rows` is not a positive multiple of `n`; `batch` when it is 0.
    pub fn from_phi(batch: usize, phi_rows: usize, phi_cols: usize) -> Result<Self> {
        check_positive("batch", batch)?;
        // n² + 2n = cols  ⇔  (n+1)² = cols + 1.
        let root = (phi_cols as f64 + 1.0).sqrt().round() as usize;
        let n = root.saturating_sub(1);
        if n == 0 || n.checked_mul(n + 2) != Some(phi_cols) {
            return Err(Error::Shape {
                arg: "phi",
                msg: format!("second dimension {phi_cols} is not n²+2n for any n ≥ 1"),
            });
        }
        if phi_rows == 0 || !phi_rows.is_multiple_of(n) {
            return Err(Error::Shape {
                arg: "phi",
                msg: format!("first dimension {phi_rows} is not a positive multiple of n = {n}"),
            });
        }
        Ok(Self { batch, n, c: phi_rows / n })
    }

    /// `n² + 2n`: the number of logits per batch row (phi's second dimension).
    pub fn logits(&self) -> usize {
        self.n * self.n + 2 * self.n
    }

    /// Checks every size is ≥ 1 and that the kernel's 32-bit indices hold (`phi` and `x` below
    /// 2^31 elements); returns the buffer lengths.
    pub fn lens(&self) -> Result<MhcPreLens> {
        check_positive("batch", self.batch)?;
        check_positive("n", self.n)?;
        check_positive("c", self.c)?;
        let m = checked_product("n", &[self.n, self.n + 2])?;
        let nc = checked_product("c", &[self.n, self.c])?;
        let lens = MhcPreLens {
            phi: checked_product("phi", &[nc, m])?,
            x: checked_product("x", &[self.batch, nc])?,
            b: m,
            x_layer: checked_product("x_layer", &[self.batch, self.c])?,
            h_post: checked_product("h_post", &[self.batch, self.n])?,
        };
        for (arg, len) in [("phi", lens.phi), ("x", lens.x)] {
            if len >= 1 << 31 {
                return Err(Error::Overflow { arg, msg: format!("{len} elements (the kernel indexes below 2^31)") });
            }
        }
        Ok(lens)
    }
}

/// The scalar parameters of SPEC.md §2.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MhcPreParams {
    pub alpha_pre: f32,
    pub alpha_post: f32,
    pub alpha_res: f32,
    /// Sinkhorn iterations (each: rows, then columns), ≥ 0.
    pub sinkhorn_repeat: u32,
    /// Added to every row/column sum before dividing; > 0.
    pub sinkhorn_eps: f32,
}

impl Default for MhcPreParams {
    /// The seed workloads' values: alphas 1, one Sinkhorn iteration, eps 0.02.
    fn default() -> Self {
        Self { alpha_pre: 1.0, alpha_post: 1.0, alpha_res: 1.0, sinkhorn_repeat: 1, sinkhorn_eps: 0.02 }
    }
}

impl MhcPreParams {
    /// Errors: [`Error::Shape`] naming a non-finite alpha or an eps that is not finite and > 0.
    pub fn validate(&self) -> Result<()> {
        for (arg, v) in [("alpha_pre", self.alpha_pre), ("alpha_post", self.alpha_post), ("alpha_res", self.alpha_res)]
        {
            if !v.is_finite() {
                return Err(Error::Shape { arg, msg: format!("{v} is not finite") });
            }
        }
        if !(self.sinkhorn_eps.is_finite() && self.sinkhorn_eps > 0.0) {
            return Err(Error::Shape {
                arg: "sinkhorn_eps",
                msg: format!("{} is not finite and > 0", self.sinkhorn_eps),
            });
        }
        Ok(())
    }
}

/// Launch configuration (tuning; [`Default`] is the measured choice).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PreConfig {
    /// Threads per block, a multiple of 32 in 32..=1024.
    pub block: u32,
    /// Upper bound on the grid (blocks); `None` = the device's SM count. Capped at 256.
    pub max_grid: Option<u32>,
    /// `cuLaunchCooperativeKernel` (the driver guarantees every block is resident, which the
    /// grid-wide exchange needs) instead of a plain launch (co-residency then relies on
    /// grid ≤ SMs and an otherwise idle device: for measurements only).
    pub cooperative: bool,
}

impl Default for PreConfig {
    fn default() -> Self {
        Self { block: 256, max_grid: None, cooperative: true }
    }
}

/// The launch geometry of one shape on one device (computed on the CPU; see [`PrePlan::new`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PreGeometry {
    /// Blocks; block `g` owns channel columns `[g·cols, min((g+1)·cols, c))`.
    pub grid: u32,
    /// Threads per block.
    pub block: u32,
    /// Channel columns per block.
    pub cols: u32,
    /// Columns per staged tile (≤ cols).
    pub jc: u32,
    /// Batch rows per group (≤ 4).
    pub bg: u32,
    /// Dynamic shared memory per block, bytes.
    pub smem: u32,
    /// Workspace length, u64 words.
    pub workspace: usize,
}

/// The kernel's `FastDiv` magic for divisor `d`: `⌊2^32/d⌋ + 1`; `(a·magic) >> 32 = a / d`
/// exactly for `a, d ≤ 2^16`.
pub fn fastdiv_magic(d: u32) -> u64 {
    (1u64 << 32) / d as u64 + 1
}

/// Dynamic shared memory of the kernel's layout (mirror of `layout` in the kernel), bytes.
pub fn smem_bytes(block: usize, bg: usize, n: usize, jc: usize) -> usize {
    let m = n * n + 2 * n;
    let mq = m + 1;
    let b = 16 + 8 * (BT * block + 2 * bg * mq) + 4 * (bg * n * n + bg * n + m) + 2 * bg * n * jc;
    b.next_multiple_of(16)
}

impl PreGeometry {
    /// The geometry for `shape` on a device with `sms` multiprocessors and `max_smem` bytes of
    /// opt-in shared memory per block: the columns split evenly over `min(c, sms, max_grid,
    /// 256)` blocks, up to 4 batch rows per group, staged tiles of at most 32 KiB.
    ///
    /// Errors: those of [`MhcPreShape::lens`]; [`Error::Shape`] naming `config.block` for a
    /// bad block size, `n` when even one batch row and one column exceed `max_smem`.
    pub fn new(shape: MhcPreShape, sms: usize, max_smem: usize, config: PreConfig) -> Result<Self> {
        let lens = shape.lens()?;
        let block = config.block;
        if block == 0 || !block.is_multiple_of(32) || block > 1024 {
            return Err(Error::Shape {
                arg: "config.block",
                msg: format!("{block} is not a multiple of 32 in 32..=1024"),
            });
        }
        let MhcPreShape { batch, n, c } = shape;
        let limit = config.max_grid.map_or(usize::MAX, |g| g.max(1) as usize);
        let target = c.min(sms.max(1)).min(limit).min(MAX_GRID);
        let cols = c.div_ceil(target);
        let grid = c.div_ceil(cols);
        let mut bg = batch.min(BT);
        let tile = |bg: usize| cols.min((XS_BUDGET / (2 * bg * n)).max(1));
        let mut jc = tile(bg);
        while smem_bytes(block as usize, bg, n, jc) > max_smem && bg > 1 {
            bg -= 1;
            jc = tile(bg);
        }
        if smem_bytes(block as usize, bg, n, jc) > max_smem {
            jc = 1;
        }
        let smem = smem_bytes(block as usize, bg, n, jc);
        // The kernel's multiply-high divisions need jc and every dividend (≤ bg·n·jc) ≤ 2^16.
        debug_assert!(jc <= 1 << 14 && bg * n * jc <= 1 << 16);
        if smem > max_smem {
            return Err(Error::Shape {
                arg: "n",
                msg: format!("n = {n} needs {smem} bytes of shared memory per block, the device has {max_smem}"),
            });
        }
        let q = batch * (shape.logits() + 1);
        let workspace = checked_product("x", &[q, grid + 1])?
            .checked_add(WS_HEADER)
            .ok_or_else(|| Error::Overflow { arg: "x", msg: "workspace size".into() })?;
        if q * grid >= 1 << 31 || lens.x_layer >= 1 << 31 {
            return Err(Error::Overflow { arg: "x", msg: format!("batch {batch}: workspace indices exceed 2^31") });
        }
        Ok(Self {
            grid: grid as u32,
            block,
            cols: cols as u32,
            jc: jc as u32,
            bg: bg as u32,
            smem: smem as u32,
            workspace,
        })
    }
}

/// A validated shape with its launch geometry on one device (no device memory).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrePlan {
    pub shape: MhcPreShape,
    pub config: PreConfig,
    pub geometry: PreGeometry,
}

impl PrePlan {
    /// Queries the device (SM count, opt-in shared memory, occupancy) and computes the geometry.
    ///
    /// Errors: those of [`PreGeometry::new`]; a driver error; [`Error::Shape`] naming
    /// `config.block` when no block of this size fits on a multiprocessor.
    pub fn new(gpu: &Gpu, shape: MhcPreShape, config: PreConfig) -> Result<Self> {
        use sys::CUdevice_attribute as A;
        let ctx = gpu.context();
        let sms = ctx.attribute(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as usize;
        let max_smem = ctx.attribute(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)? as usize;
        let geometry = PreGeometry::new(shape, sms, max_smem, config)?;
        let f = gpu.function(KERNEL)?;
        if geometry.smem as usize > SMEM_DEFAULT {
            f.set_attribute(
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                geometry.smem as i32,
            )?;
        }
        let per_sm = f.occupancy_max_active_blocks_per_multiprocessor(geometry.block, geometry.smem as usize, None)?;
        if per_sm == 0 {
            return Err(Error::Shape {
                arg: "config.block",
                msg: format!(
                    "{} threads with {} bytes of shared memory do not fit on a multiprocessor",
                    geometry.block, geometry.smem
                ),
            });
        }
        Ok(Self { shape, config, geometry })
    }
}

/// MHCPreFwd for one shape, owning its workspace: create once, [`MhcPre::run`] many times.
///
/// ```no_run
/// use rgk::{bf16, Gpu, mhc::{MhcPre, MhcPreParams, MhcPreShape}};
/// # fn main() -> Result<(), rgk::Error> {
/// let gpu = Gpu::new(0)?;
/// let s = MhcPreShape { batch: 2, n: 4, c: 1920 };
/// let l = s.lens()?;
/// let st = gpu.stream();
/// let phi = st.alloc_zeros::<f32>(l.phi)?;
/// let x = st.alloc_zeros::<bf16>(l.x)?;
/// let b = st.alloc_zeros::<f32>(l.b)?;
/// let (mut x_res, mut x_layer) = (st.alloc_zeros::<bf16>(l.x)?, st.alloc_zeros::<bf16>(l.x_layer)?);
/// let mut h_post = st.alloc_zeros::<f32>(l.h_post)?;
/// let mut op = MhcPre::new(&gpu, s)?;
/// op.run(&gpu, MhcPreParams::default(), &phi, &x, &b, &mut x_res, &mut x_layer, &mut h_post)?;
/// # Ok(()) }
/// ```
pub struct MhcPre {
    plan: PrePlan,
    workspace: CudaSlice<u64>,
}

impl MhcPre {
    /// Plans `shape` with the default configuration and allocates the zeroed workspace
    /// (`geometry.workspace` u64 words: 8·(16 + (batch·(n²+2n+1))·(grid+1)) bytes).
    pub fn new(gpu: &Gpu, shape: MhcPreShape) -> Result<Self> {
        Self::with_config(gpu, shape, PreConfig::default())
    }

    /// As [`MhcPre::new`] with an explicit launch configuration.
    pub fn with_config(gpu: &Gpu, shape: MhcPreShape, config: PreConfig) -> Result<Self> {
        let plan = PrePlan::new(gpu, shape, config)?;
        let workspace = gpu.stream().alloc_zeros::<u64>(plan.geometry.workspace)?;
        Ok(Self { plan, workspace })
    }

    pub fn plan(&self) -> &PrePlan {
        &self.plan
    }

    /// Runs MHCPreFwd (SPEC.md §2) on [`Gpu::stream`]; asynchronous. Per batch row β:
    /// `r = ‖x_β‖₂/√(n·c) + 1e-4`, logits `h = x_β·phi`, `H_pre = σ(alpha_pre·h[..n]/r + b)`,
    /// `h_post = 2σ(alpha_post·h[n..2n]/r + b)`, `R` = Sinkhorn of `exp(alpha_res·h[2n..]/r + b
    /// − row max)`; `x_res[β, i·c+j] = q(Σ_k R[i,k]·x[β, k·c+j])`, `x_layer[β, j] =
    /// q(Σ_k H_pre[k]·x[β, k·c+j])`.
    ///
    /// Shapes (row-major, contiguous): `phi` `[n·c, n²+2n]` f32, `x` `[batch, n·c]` bf16, `b`
    /// `[n²+2n]` f32; outputs `x_res` `[batch, n·c]` bf16, `x_layer` `[batch, c]` bf16,
    /// `h_post` `[batch, n]` f32. Buffers may be longer; outputs must not overlap inputs.
    /// Deterministic: the same inputs give the same bits on every run.
    ///
    /// Errors: [`Error::BufferTooSmall`] naming the buffer, [`Error::Shape`] naming a bad
    /// parameter, or a driver error from the launch.
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &mut self,
        gpu: &Gpu,
        params: MhcPreParams,
        phi: &impl DevicePtr<f32>,
        x: &impl DevicePtr<bf16>,
        b: &impl DevicePtr<f32>,
        x_res: &mut impl DevicePtrMut<bf16>,
        x_layer: &mut impl DevicePtrMut<bf16>,
        h_post: &mut impl DevicePtrMut<f32>,
    ) -> Result<()> {
        let l = self.plan.shape.lens()?;
        check_len("phi", l.phi, phi.len())?;
        check_len("x", l.x, x.len())?;
        check_len("b", l.b, b.len())?;
        check_len("x_res", l.x, x_res.len())?;
        check_len("x_layer", l.x_layer, x_layer.len())?;
        check_len("h_post", l.h_post, h_post.len())?;
        let st = gpu.stream();
        let (p, _g1) = phi.device_ptr(st);
        let (xp, _g2) = x.device_ptr(st);
        let (bp, _g3) = b.device_ptr(st);
        let (r, _g4) = x_res.device_ptr_mut(st);
        let (y, _g5) = x_layer.device_ptr_mut(st);
        let (h, _g6) = h_post.device_ptr_mut(st);
        let ws_len = self.workspace.len();
        let (w, _g7) = self.workspace.device_ptr_mut(st);
        // SAFETY: every buffer was checked to hold the elements the shape addresses; the
        // workspace belongs to this plan and is used on this stream only.
        unsafe { pre_fwd_raw(gpu, &self.plan, params, p, xp, bp, r, y, h, w, ws_len, st.cu_stream()) }
    }
}

/// MHCPreFwd on raw device pointers with a caller-owned workspace, launched on `stream`.
///
/// `workspace`: at least `plan.geometry.workspace` u64 words, 8-byte aligned, zero-filled
/// before its first use and afterwards used only by this function (it carries an epoch
/// counter between calls; no reset is needed). One workspace must not serve two calls that may
/// run concurrently (different streams).
///
/// # Safety
/// Each pointer must address device memory of `gpu`'s context holding at least the elements
/// [`MhcPreShape::lens`] lists for `plan.shape`, valid until the kernel finishes; outputs must
/// not overlap the inputs or each other. Shapes and parameters are still validated.
#[allow(clippy::too_many_arguments)]
pub unsafe fn pre_fwd_raw(
    gpu: &Gpu,
    plan: &PrePlan,
    params: MhcPreParams,
    phi: CUdeviceptr,
    x: CUdeviceptr,
    b: CUdeviceptr,
    x_res: CUdeviceptr,
    x_layer: CUdeviceptr,
    h_post: CUdeviceptr,
    workspace: CUdeviceptr,
    workspace_len: usize,
    stream: CUstream,
) -> Result<()> {
    plan.shape.lens()?;
    params.validate()?;
    let geo = plan.geometry;
    check_len("workspace", geo.workspace, workspace_len)?;
    if !workspace.is_multiple_of(8) {
        return Err(Error::Shape { arg: "workspace", msg: "not 8-byte aligned".into() });
    }
    let f = gpu.function(KERNEL)?;
    let s = plan.shape;
    let (mut phi, mut x, mut b, mut r, mut y, mut h, mut w) = (phi, x, b, x_res, x_layer, h_post, workspace);
    let (mut batch, mut n, mut c) = (s.batch as u32, s.n as u32, s.c as u32);
    let (mut cols, mut jc, mut bg) = (geo.cols, geo.jc, geo.bg);
    let (mut a_pre, mut a_post, mut a_res) = (params.alpha_pre, params.alpha_post, params.alpha_res);
    let (mut rep, mut eps) = (params.sinkhorn_repeat, params.sinkhorn_eps);
    let mut inv_sqrt_nc = 1.0 / ((s.n * s.c) as f64).sqrt();
    let mut ngroups = s.batch.div_ceil(geo.bg as usize) as u32;
    let mut njc_full = geo.cols.div_ceil(geo.jc);
    let mut mc = (s.logits() as u32 + 1).min(geo.block);
    let mut mc_magic = fastdiv_magic(mc);
    let mut jc_magic = fastdiv_magic(geo.jc);
    let args: &mut [&mut dyn KernelArg] = &mut [
        &mut phi,
        &mut x,
        &mut b,
        &mut r,
        &mut y,
        &mut h,
        &mut w,
        &mut batch,
        &mut n,
        &mut c,
        &mut cols,
        &mut jc,
        &mut bg,
        &mut a_pre,
        &mut a_post,
        &mut a_res,
        &mut rep,
        &mut eps,
        &mut inv_sqrt_nc,
        &mut ngroups,
        &mut njc_full,
        &mut mc,
        &mut mc_magic,
        &mut jc_magic,
    ];
    if plan.config.cooperative {
        let mut params: Vec<*mut c_void> = args.iter_mut().map(|a| a.as_param()).collect();
        sys::cuLaunchCooperativeKernel(
            f.cu_function(),
            geo.grid,
            1,
            1,
            geo.block,
            1,
            1,
            geo.smem,
            stream,
            params.as_mut_ptr(),
        )
        .result()?;
        Ok(())
    } else {
        let dims = LaunchDims { grid: (geo.grid, 1, 1), block: (geo.block, 1, 1), shared_bytes: geo.smem };
        launch(f, dims, stream, args)
    }
}
