//! EngramDecodeFwd (docs/ops.md §6): one fused decode step.
//!
//! `kk = e_t·W_K`, `vv = e_t·W_V` (f32 accumulate); `hn = rmsnorm(h_t, rms_w_h)`,
//! `kn = rmsnorm(q(kk), rms_w_h)`, `alpha = σ(Σ hn·kn / sqrt(d))`, `vh = alpha·vv`;
//! `u = rmsnorm(q(vh), rms_w_v)`; `conv = conv_w[K−1]·u + Σ_{p<K−1} conv_w[p]·state[L − (K−1−p)·δ]`;
//! `y_t = q(silu(conv) + vh)`; the state gains `q(u)` as its newest row.
//!
//! Two launches per step (kernels-gpu/src/engram/decode.rs), submitted as one CUDA graph: the
//! projection kernel splits `e_t·W` over column tiles × row splits and writes f32 partials; the
//! finishing kernel, one block per batch row and a programmatic dependent of the first, sums
//! the row's partials and does the gating, norms, conv and state write.
//! [`plan_decode_steps`] picks both kernels from the tuning table
//! (docs/decisions/engram_decode.md); an [`EngramDecodePlan`] owns the plan and the workspace.
use cudarc::driver::{sys::CUdeviceptr, sys::CUstream, CudaSlice, DevicePtr, DevicePtrMut};
use half::{bf16, f16};
use kernel_abi::engram::decode::DecodeKernel;
use kernel_abi::{
    decode_finish_warp_shared_bytes, decode_project_shared_bytes, EngramDecodeArgs, DECODE_FINISH_BLOCK_SHARED_BYTES,
    DECODE_MMA_K_STEP, DECODE_MMA_TILE_COLS,
};
use kernel_abi::{decode_policies, DecodePolicy, Elem, Policy};

use crate::error::{check_len, check_positive, checked_product};
use crate::runtime::{launch_planned, GraphReplay, LaunchDims, Planned, StreamOrder};
use crate::{Error, Gpu, Result};

/// The decode step's PTX entries, from the policy types of `kernel_abi::decode_kernels!` (the
/// list the kernels are declared from): [`KERNELS`] ([`planned_kernels`] launches each of them)
/// and [`POLICIES`], which [`entry_of`] searches.
macro_rules! decode_entry_table {
    ($($name:ident: $kind:ident, $dt:ident, $cols:literal;)*) => {
        /// Every PTX entry of the decode step.
        pub(crate) const KERNELS: &[&str] = &[$(<decode_policies::$name as Policy>::ENTRY,)*];
        /// Every policy's kernel, element type, columns and entry.
        const POLICIES: &[(DecodeKernel, Elem, u32, &str)] = &[$(policy_row::<decode_policies::$name>(),)*];
    };
}
kernel_abi::decode_kernels!(decode_entry_table);

const fn policy_row<P: DecodePolicy>() -> (DecodeKernel, Elem, u32, &'static str) {
    let () = P::VALID;
    (P::KERNEL, P::ELEM, P::COLS, P::ENTRY)
}

/// The entry of `kind` in `dtype` with `cols` columns per lane or thread; `None` where the
/// family has no such kernel.
fn entry_of(kind: DecodeKernel, dtype: DecodeDtype, cols: u32) -> Option<&'static str> {
    let elem = match dtype {
        DecodeDtype::F16 => Elem::F16,
        DecodeDtype::Bf16 => Elem::Bf16,
    };
    POLICIES.iter().find(|&&(k, e, c, _)| k == kind && e == elem && c == cols).map(|row| row.3)
}

/// [`entry_of`], or [`Error::MissingKernel`] naming what the plan asked for (a planner/table
/// mismatch, which the planner sweep tests would show).
fn entry(kind: DecodeKernel, dtype: DecodeDtype, cols: u32) -> Result<&'static str> {
    entry_of(kind, dtype, cols).ok_or_else(|| Error::MissingKernel(format!("{kind:?} {dtype:?} cols={cols}")))
}

/// The storage dtype of one EngramDecodeFwd call (every tensor has it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeDtype {
    F16,
    Bf16,
}

/// The 16-bit element types the decode step accepts (`half::f16`, `half::bf16`).
pub trait DecodeElem: crate::verify::Half + cudarc::driver::DeviceRepr {
    const DTYPE: DecodeDtype;
}
impl DecodeElem for f16 {
    const DTYPE: DecodeDtype = DecodeDtype::F16;
}
impl DecodeElem for bf16 {
    const DTYPE: DecodeDtype = DecodeDtype::Bf16;
}

/// Sizes and parameters of one decode step.
///
/// Tensors (row-major, contiguous, all one dtype): `e_t [batch, d_mem]`, `h_t [batch, d]`,
/// `conv_state [batch, max_conv_len, d]`, `W_K`, `W_V` `[d_mem, d]`, `rms_w_h`, `rms_w_v` `[d]`,
/// `conv_w [kernel_size, d]`; outputs `y_t [batch, d]` and the state `[batch, max_conv_len, d]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EngramDecodeShape {
    pub batch: usize,
    pub d_mem: usize,
    pub d: usize,
    /// `L`: rows of the conv state (time steps kept).
    pub max_conv_len: usize,
    /// `K`: conv taps (the newest is `u` itself, the other `K−1` come from the state).
    pub kernel_size: usize,
    /// `δ`: distance in steps between taps.
    pub dilation: usize,
    /// The rmsnorm epsilon (docs/ops.md: 1e-6).
    pub eps: f32,
}

/// Element counts of every tensor of a shape (see [`EngramDecodeShape::lens`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeLens {
    /// `e_t`: `batch·d_mem`.
    pub e: usize,
    /// `h_t` and `y_t`: `batch·d`.
    pub h: usize,
    /// `conv_state` and the new state: `batch·L·d`.
    pub state: usize,
    /// `W_K`, `W_V`: `d_mem·d` each.
    pub w: usize,
    /// `rms_w_h`, `rms_w_v`: `d`.
    pub rms: usize,
    /// `conv_w`: `K·d`.
    pub conv_w: usize,
}

/// Largest element count of any tensor or workspace (the kernel indexes with u32).
const MAX_ELEMS: usize = (1 << 31) - 1;

impl EngramDecodeShape {
    /// A shape with the `eps = 1e-6` of docs/ops.md.
    pub fn new(batch: usize, d_mem: usize, d: usize, max_conv_len: usize, kernel_size: usize, dilation: usize) -> Self {
        Self { batch, d_mem, d, max_conv_len, kernel_size, dilation, eps: 1e-6 }
    }

    /// Validates the shape (every size ≥ 1, `max_conv_len ≥ (kernel_size−1)·dilation`, a
    /// finite `eps ≥ 0`, every tensor below 2^31 elements) and returns the element counts.
    ///
    /// Errors: [`Error::Shape`] naming the size, [`Error::Overflow`] naming the tensor.
    pub fn lens(&self) -> Result<DecodeLens> {
        check_positive("batch", self.batch)?;
        check_positive("d_mem", self.d_mem)?;
        check_positive("d", self.d)?;
        check_positive("max_conv_len", self.max_conv_len)?;
        check_positive("kernel_size", self.kernel_size)?;
        check_positive("dilation", self.dilation)?;
        let reach = checked_product("max_conv_len", &[self.kernel_size - 1, self.dilation])?;
        if self.max_conv_len < reach {
            return Err(Error::Shape {
                arg: "max_conv_len",
                msg: format!(
                    "{} is shorter than (kernel_size−1)·dilation = ({}−1)·{} = {reach}",
                    self.max_conv_len, self.kernel_size, self.dilation
                ),
            });
        }
        if !(self.eps.is_finite() && self.eps >= 0.0) {
            return Err(Error::Shape { arg: "eps", msg: format!("{} is not a finite value ≥ 0", self.eps) });
        }
        let lens = DecodeLens {
            e: checked_product("e_t", &[self.batch, self.d_mem])?,
            h: checked_product("h_t", &[self.batch, self.d])?,
            state: checked_product("conv_state", &[self.batch, self.max_conv_len, self.d])?,
            w: checked_product("w_k", &[self.d_mem, self.d])?,
            rms: self.d,
            conv_w: checked_product("conv_w", &[self.kernel_size, self.d])?,
        };
        for (arg, n) in [
            ("e_t", lens.e),
            ("h_t", lens.h),
            ("conv_state", lens.state),
            ("w_k", lens.w),
            ("conv_w", lens.conv_w),
            ("batch", checked_product("batch", &[2, self.batch, self.d])?),
        ] {
            if n > MAX_ELEMS {
                return Err(Error::Overflow { arg, msg: format!("{n} elements (the kernel's limit is 2^31 − 1)") });
            }
        }
        Ok(lens)
    }
}

/// Largest grid (tiles × splits) of the automatic split depth: two blocks per SM of the H200
/// (132 SMs).
const MAX_BLOCKS: usize = 264;

/// The projection launch's kernel.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeProjectionKernel {
    /// `project_mma_b8k16`: tensor cores, `batch ≤ 8`, `d_mem % 16 == 0`, vectorised layout;
    /// bitwise the partials of [`DecodeProjectionKernel::Mma`] from a shorter per-warp chain.
    MmaB8K16,
    /// `project_mma`: tensor cores, any batch and `d_mem`, vectorised layout.
    Mma,
    /// `project_scalar`: CUDA-core FMAs, one column per lane, 4 batch rows per pass, any layout.
    Scalar,
}

impl DecodeProjectionKernel {
    fn entry(self, dtype: DecodeDtype) -> Result<&'static str> {
        match self {
            Self::MmaB8K16 => entry(DecodeKernel::ProjectMmaB8K16, dtype, 8),
            Self::Mma => entry(DecodeKernel::ProjectMma, dtype, 8),
            Self::Scalar => entry(DecodeKernel::ProjectScalar, dtype, 1),
        }
    }
}

/// The finishing launch's kernel (one block per batch row, a programmatic dependent of the
/// projection launch).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeFinishKernel {
    /// `finish_block_{cols}col`: thread `t` owns columns `[cols·t, cols·t + cols)`; block
    /// reductions, `rsqrt.approx` + Newton and `rcp.approx` (within the tolerance chain, not
    /// bitwise the warp finish). `DECODE_FINISH_BLOCK_SHARED_BYTES` of dynamic shared memory.
    Block { cols: u32, threads: u32 },
    /// `finish_warp_{cols}col_shared` / `_kv` (`cols` 8 on the vectorised layout, else 1): the
    /// block sums the row's partials into shared memory (`staged_in_shared`, `8·d` bytes) or
    /// into the `kv` workspace, then warp 0 finishes the row with correctly rounded sqrt and
    /// division.
    Warp { cols: u32, threads: u32, staged_in_shared: bool },
}

impl DecodeFinishKernel {
    fn entry(self, dtype: DecodeDtype) -> Result<&'static str> {
        match self {
            Self::Block { cols, .. } => entry(DecodeKernel::FinishBlock, dtype, cols),
            Self::Warp { cols, staged_in_shared: true, .. } => entry(DecodeKernel::FinishWarpShared, dtype, cols),
            Self::Warp { cols, staged_in_shared: false, .. } => entry(DecodeKernel::FinishWarpKv, dtype, cols),
        }
    }
}

/// The two launches of one step on one layout.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeStepPlan {
    pub projection: DecodeProjectionKernel,
    pub geometry: DecodeGeometry,
    pub finish: DecodeFinishKernel,
}

impl DecodeStepPlan {
    /// The PTX entries the step launches, in launch order. Errors: [`Error::MissingKernel`]
    /// when the plan names a kernel the family does not declare.
    pub fn entries(&self, dtype: DecodeDtype) -> Result<[&'static str; 2]> {
        Ok([self.projection.entry(dtype)?, self.finish.entry(dtype)?])
    }
}

/// A shape's plans: the vectorised layout (`d % 8 == 0`, every buffer 16-byte aligned; `None`
/// when `d % 8 ≠ 0`) and any other layout.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeStepPlans {
    pub vectorised: Option<DecodeStepPlan>,
    pub any_layout: DecodeStepPlan,
}

/// The finish a tuning row takes.
#[derive(Clone, Copy, Debug)]
enum FinishRule {
    /// [`DecodeFinishKernel::Block`] with this many columns per thread.
    Block { cols: u32 },
    /// [`DecodeFinishKernel::Warp`].
    Warp,
}

/// One shape class of the tuning table.
struct TuningRow {
    /// The vectorised layout (else any layout).
    vectorised: bool,
    /// The row applies for `d ≤ max_d`.
    max_d: usize,
    /// Threads per projection block (and per warp-finish block).
    block: u32,
    finish: FinishRule,
    /// The measurement behind the row (H200, bench `--variants`).
    #[allow(dead_code)]
    why: &'static str,
}

/// The decode step's tuning table: the first row whose layout matches with `d ≤ max_d` wins.
/// The projection kernel is not a tuning choice: the vectorised layout takes the MMA projection
/// (serving-b1 5.41 µs against 6.30 for the SIMT projection), in its `b8k16` form wherever its
/// limits hold (bitwise the same partials, fewer instructions); any other layout the scalar one.
const TUNING: &[TuningRow] = &[
    TuningRow {
        vectorised: true,
        max_d: 256,
        block: 128,
        finish: FinishRule::Block { cols: 1 },
        why: "serving-b1 5.38, -b8 5.44 µs at block 128; block finish 2.4-2.9 µs against 3.7-9.1 for the warp finish",
    },
    TuningRow {
        vectorised: true,
        max_d: 512,
        block: 256,
        finish: FinishRule::Block { cols: 2 },
        why: "serving-b4 6.21 µs at block 256 against 6.56 at 128; ≤ 256 finishing threads",
    },
    TuningRow {
        vectorised: true,
        max_d: 1024,
        block: 256,
        finish: FinishRule::Block { cols: 4 },
        why: "256 threads × 4 columns: the 4-column finish's register limit (207-209 registers)",
    },
    TuningRow {
        vectorised: true,
        max_d: usize::MAX,
        block: 256,
        finish: FinishRule::Warp,
        why: "rows wider than the block finish takes",
    },
    TuningRow {
        vectorised: false,
        max_d: 256,
        block: 128,
        finish: FinishRule::Block { cols: 1 },
        why: "as the vectorised d ≤ 256 row",
    },
    TuningRow {
        vectorised: false,
        max_d: 512,
        block: 256,
        finish: FinishRule::Block { cols: 1 },
        why: "1 column per thread up to 512 threads (56 registers)",
    },
    TuningRow {
        vectorised: false,
        max_d: usize::MAX,
        block: 256,
        finish: FinishRule::Warp,
        why: "rows wider than the block finish takes",
    },
];

/// Largest `d` whose reduced row (`2·d` f32) the warp finish stages in shared memory; larger
/// rows go through the `kv` workspace.
const FIN_SHARED_MAX_D: usize = 4096;

/// The planner: the step's launches for `shape` on both layouts (public for tests and the
/// reachability check).
///
/// Errors: the shape's [`EngramDecodeShape::lens`] errors; [`Error::Overflow`] for a grid the
/// device cannot launch.
#[doc(hidden)]
pub fn plan_decode_steps(shape: &EngramDecodeShape) -> Result<DecodeStepPlans> {
    shape.lens()?;
    let vectorised = if shape.d.is_multiple_of(8) { Some(plan_step(shape, true)?) } else { None };
    Ok(DecodeStepPlans { vectorised, any_layout: plan_step(shape, false)? })
}

fn plan_step(shape: &EngramDecodeShape, vectorised: bool) -> Result<DecodeStepPlan> {
    let row = TUNING
        .iter()
        .find(|r| r.vectorised == vectorised && shape.d <= r.max_d)
        .expect("the tuning table ends with an unbounded row per layout");
    // SIMT projection on the vectorised layout (8 columns × 1-8 batch rows per thread): b1 6.30 µs
    // against 5.41 for the MMA one; b4/b8 +2.9 and +7.3 µs.
    let projection = match () {
        _ if !vectorised => DecodeProjectionKernel::Scalar,
        _ if shape.batch <= 8 && shape.d_mem.is_multiple_of(16) => DecodeProjectionKernel::MmaB8K16,
        // The bounded kernel where the b8k16 one applies: b4 8.58, b8 8.22 µs against 6.37, 5.28.
        _ => DecodeProjectionKernel::Mma,
    };
    let geometry = DecodeGeometry::new(shape, row.block, vectorised)?;
    let finish = match row.finish {
        FinishRule::Block { cols } => {
            DecodeFinishKernel::Block { cols, threads: (shape.d.div_ceil(cols as usize).div_ceil(32) * 32) as u32 }
        }
        FinishRule::Warp => DecodeFinishKernel::Warp {
            cols: if vectorised { 8 } else { 1 },
            threads: row.block,
            staged_in_shared: shape.d <= FIN_SHARED_MAX_D,
        },
    };
    Ok(DecodeStepPlan { projection, geometry, finish })
}

/// Every PTX entry the planner launches over a grid of shapes covering every tuning row, both
/// layouts, both dtypes and every fallback (`batch > 8`, `d_mem % 16 ≠ 0`, `d % 8 ≠ 0`, rows
/// wider than the block finish and than its shared-memory staging).
#[doc(hidden)]
pub fn planned_kernels(_gpu: &Gpu) -> Result<std::collections::BTreeSet<&'static str>> {
    let mut out = std::collections::BTreeSet::new();
    for batch in [1, 8, 9] {
        for d_mem in [16, 520] {
            for d in [7, 8, 256, 264, 512, 520, 1024, 1032, 4096, 4104] {
                let plans = plan_decode_steps(&EngramDecodeShape::new(batch, d_mem, d, 4, 2, 1))?;
                for p in plans.vectorised.iter().chain([&plans.any_layout]) {
                    for dtype in [DecodeDtype::F16, DecodeDtype::Bf16] {
                        out.extend(p.entries(dtype)?);
                    }
                }
            }
        }
    }
    Ok(out)
}

/// The projection launch geometry (a CPU model of the kernels' partition; public for tests).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeGeometry {
    /// Elements per thread along `d` (8: the MMA tiles' 16-byte loads; 1: the scalar kernel).
    pub vec: u32,
    /// Threads per block.
    pub block: u32,
    /// log2 of the column lanes per block (each lane owns `vec` columns).
    pub cl_log: u32,
    /// Column tiles (`grid.x`).
    pub tiles: u32,
    /// Row splits (`grid.y`).
    pub splits: u32,
    /// `W` rows per split.
    pub rows_per_split: u32,
    /// Tensor-core projection (64-column tiles, 16-row steps per warp).
    pub mma: bool,
}

impl DecodeGeometry {
    /// The geometry for `shape` at `block` threads (64, 128 or 256): the MMA partition (`mma`,
    /// requires `d % 8 == 0`) or the scalar one. Each split is one round of the kernel's loads
    /// (one 16-row step per warp; 4 rows per thread), deeper where the grid would exceed
    /// 264 blocks (two per SM).
    pub fn new(shape: &EngramDecodeShape, block: u32, mma: bool) -> Result<Self> {
        if ![64, 128, 256].contains(&block) {
            return Err(Error::Shape { arg: "block", msg: format!("{block} is not 64, 128 or 256") });
        }
        let nt = block as usize;
        if mma {
            let (warps, tiles) = (nt / 32, shape.d.div_ceil(DECODE_MMA_TILE_COLS as usize));
            let step = DECODE_MMA_K_STEP as usize * warps;
            let ksteps = shape.d_mem.div_ceil(step * (MAX_BLOCKS / tiles).max(1));
            let rows = (ksteps * step).min(shape.d_mem.div_ceil(step) * step);
            let splits = shape.d_mem.div_ceil(rows);
            // 8 lanes of 8 columns per tile (no MMA kernel reads `cl_log`).
            let cl_log = (DECODE_MMA_TILE_COLS / 8).trailing_zeros();
            return Self::checked(8, block, cl_log, tiles, splits, rows, true);
        }
        // Column lanes: a warp's row segment is as long as d allows (up to 32 lanes).
        let cl = shape.d.next_power_of_two().min(32);
        let rl = nt / cl;
        let tiles = shape.d.div_ceil(cl);
        let rpt = shape.d_mem.div_ceil(rl * (MAX_BLOCKS / tiles).max(1)).max(4);
        let rows = (rpt * rl).min(shape.d_mem.div_ceil(rl) * rl);
        let splits = shape.d_mem.div_ceil(rows);
        Self::checked(1, block, cl.trailing_zeros(), tiles, splits, rows, false)
    }

    fn checked(vec: u32, block: u32, cl_log: u32, tiles: usize, splits: usize, rows: usize, mma: bool) -> Result<Self> {
        if tiles > i32::MAX as usize || splits > 65535 {
            return Err(Error::Overflow { arg: "d_mem", msg: format!("grid {tiles}×{splits}") });
        }
        Ok(Self { vec, block, cl_log, tiles: tiles as u32, splits: splits as u32, rows_per_split: rows as u32, mma })
    }

    /// Column lanes per block.
    pub fn col_lanes(&self) -> u32 {
        1 << self.cl_log
    }

    /// Dynamic shared memory of one block, bytes.
    pub fn shared_bytes(&self) -> u32 {
        decode_project_shared_bytes(self.block, self.vec, self.mma)
    }
}

/// A decode step planned for one shape: the planner's launches ([`plan_decode_steps`]) and the
/// device workspace (split partials `[splits, batch, 2, d]` f32 and the reduced projections
/// `[batch, 2, d]` f32).
///
/// The safe entries may be called on any stream of the context (a [`Gpu`] handle from
/// [`Gpu::with_stream`]): a call on another stream than the previous one waits for it (the
/// workspace is reused). Use a plan per stream for concurrent steps.
pub struct EngramDecodePlan {
    order: StreamOrder,
    shape: EngramDecodeShape,
    steps: DecodeStepPlans,
    lens: DecodeLens,
    part: Option<CudaSlice<f32>>,
    kv: CudaSlice<f32>,
    capture: Option<CudaSlice<u16>>,
    graph: GraphReplay,
}

/// The input pointers of one raw call, in the order of docs/ops.md.
#[derive(Clone, Copy, Debug)]
pub struct DecodeInputsRaw {
    pub e_t: CUdeviceptr,
    pub h_t: CUdeviceptr,
    pub w_k: CUdeviceptr,
    pub w_v: CUdeviceptr,
    pub rms_w_h: CUdeviceptr,
    pub rms_w_v: CUdeviceptr,
    pub conv_w: CUdeviceptr,
}

/// The read-only inputs of one safe decode step (docs/ops.md §6; `w_k, w_v` are the op's
/// `W_K, W_V`), all of the call's dtype `T`: `e_t` `[batch, d_mem]`, `h_t` `[batch, d]`, `w_k,
/// w_v` `[d_mem, d]`, `rms_w_h, rms_w_v` `[d]`, `conv_w` `[K, d]`. The state `conv_state` is
/// passed on its own ([`EngramDecodePlan::forward`] reads it, [`EngramDecodePlan::step_ring`]
/// updates it in place). Any `cudarc` buffer or view.
pub struct DecodeInputs<'a, T> {
    pub e_t: &'a dyn DevicePtr<T>,
    pub h_t: &'a dyn DevicePtr<T>,
    pub w_k: &'a dyn DevicePtr<T>,
    pub w_v: &'a dyn DevicePtr<T>,
    pub rms_w_h: &'a dyn DevicePtr<T>,
    pub rms_w_v: &'a dyn DevicePtr<T>,
    pub conv_w: &'a dyn DevicePtr<T>,
}

// Shared references only: copyable without bounds on `T`.
impl<T> Clone for DecodeInputs<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for DecodeInputs<'_, T> {}

/// The outputs of [`EngramDecodePlan::forward`] (docs/ops.md §6): `y_t` `[batch, d]` and
/// `new_conv_state` `[batch, max_conv_len, d]`, dtype `T`.
pub struct DecodeOutputs<'a, T> {
    pub y_t: &'a mut dyn DevicePtrMut<T>,
    pub new_conv_state: &'a mut dyn DevicePtrMut<T>,
}

impl EngramDecodePlan {
    /// Plans `shape` ([`plan_decode_steps`]) and allocates its workspace on `gpu`.
    ///
    /// Errors: the shape's [`EngramDecodeShape::lens`] errors; a driver error on allocation.
    pub fn new(gpu: &Gpu, shape: EngramDecodeShape) -> Result<Self> {
        let lens = shape.lens()?;
        let steps = plan_decode_steps(&shape)?;
        let st = gpu.stream();
        let kv_len = 2 * lens.h;
        let max_splits =
            steps.vectorised.map_or(0, |p| p.geometry.splits).max(steps.any_layout.geometry.splits) as usize;
        let part = if max_splits > 1 {
            let n = checked_product("workspace", &[max_splits, kv_len])?;
            if n > MAX_ELEMS {
                return Err(Error::Overflow { arg: "workspace", msg: format!("{n} f32 partials") });
            }
            Some(st.alloc_zeros::<f32>(n)?)
        } else {
            None
        };
        Ok(Self {
            order: StreamOrder::new(st),
            shape,
            steps,
            lens,
            part,
            kv: st.alloc_zeros::<f32>(kv_len)?,
            capture: None,
            graph: GraphReplay::new(),
        })
    }

    /// The planned shape.
    pub fn shape(&self) -> &EngramDecodeShape {
        &self.shape
    }

    /// The element counts of the shape's tensors.
    pub fn lens(&self) -> DecodeLens {
        self.lens
    }

    /// The planned launches on both layouts.
    #[doc(hidden)]
    pub fn steps(&self) -> &DecodeStepPlans {
        &self.steps
    }

    /// Test hook: when on, every later call also writes its rounded intermediates `q(kk)` and
    /// `q(vh)` (`[2, batch, d]`, the call's dtype) for [`EngramDecodePlan::intermediates`].
    #[doc(hidden)]
    pub fn capture_intermediates(&mut self, gpu: &Gpu, on: bool) -> Result<()> {
        if on && self.capture.is_none() {
            self.capture = Some(gpu.stream().alloc_zeros::<u16>(2 * self.lens.h)?);
        } else if !on {
            self.capture = None;
        }
        Ok(())
    }

    /// Test hook: the `(q(kk), q(vh))` of the last call made with capture on (synchronizes).
    #[doc(hidden)]
    pub fn intermediates<T: DecodeElem>(&self, gpu: &Gpu) -> Result<(Vec<T>, Vec<T>)> {
        let Some(c) = &self.capture else {
            return Err(Error::Shape { arg: "capture", msg: "capture_intermediates is off".into() });
        };
        let raw: Vec<u16> = gpu.stream().clone_dtoh(c)?;
        let conv = |r: &[u16]| -> Vec<T> {
            r.iter()
                .map(|&b| match T::DTYPE {
                    DecodeDtype::F16 => T::round_f64(f16::from_bits(b).to_f64()),
                    DecodeDtype::Bf16 => T::round_f64(bf16::from_bits(b).to_f64()),
                })
                .collect()
        };
        let h = self.lens.h;
        Ok((conv(&raw[..h]), conv(&raw[h..2 * h])))
    }

    /// One decode step under docs/ops.md §6's contract: reads [`DecodeInputs`] and
    /// `conv_state`, writes the [`DecodeOutputs`] `y_t` and `new_conv_state = concat(conv_state[:,
    /// 1:], q(u))` (a separate buffer).
    ///
    /// Buffers may be larger than the shape needs; 16-byte aligned buffers with `d % 8 == 0`
    /// take the tensor-core kernels. `new_conv_state` must not overlap `conv_state` (use
    /// [`EngramDecodePlan::step_ring`] for an in-place state). Asynchronous on [`Gpu::stream`].
    ///
    /// Errors: [`Error::BufferTooSmall`] naming the buffer (its field name, or `conv_state`); a
    /// driver error from the launch.
    pub fn forward<T: DecodeElem>(
        &mut self,
        gpu: &Gpu,
        inputs: DecodeInputs<'_, T>,
        conv_state: &impl DevicePtr<T>,
        outputs: DecodeOutputs<'_, T>,
    ) -> Result<()> {
        let DecodeOutputs { y_t, new_conv_state } = outputs;
        self.check_inputs(&inputs)?;
        check_len("conv_state", self.lens.state, conv_state.len())?;
        check_len("y_t", self.lens.h, y_t.len())?;
        check_len("new_conv_state", self.lens.state, new_conv_state.len())?;
        let st = gpu.stream();
        self.order.enter(st)?;
        let (raw, _g) = raw_inputs(&inputs, st);
        let (s, _g1) = conv_state.device_ptr(st);
        let (y, _g2) = y_t.device_ptr_mut(st);
        let (ns, _g3) = new_conv_state.device_ptr_mut(st);
        // SAFETY: every buffer was checked to hold what the shape addresses; the guards keep
        // them alive and ordered on the stream.
        unsafe { self.forward_raw(gpu, T::DTYPE, raw, s, y, ns, st.cu_stream()) }
    }

    /// One decode step on a ring-buffer state, in place: logical row `t` (0 = oldest) of
    /// batch row `b` is physical row `(pos + t) mod L`. The step reads its taps, then writes
    /// `q(u)` over physical row `pos` (the oldest, which the shift drops) and returns the
    /// next call's `pos`, `(pos + 1) mod L`. Starting from a seed-contract state at `pos = 0`,
    /// the logical state after every step equals [`EngramDecodePlan::forward`]'s new state,
    /// bit for bit, and `y_t` is identical.
    ///
    /// Errors: as [`EngramDecodePlan::forward`]; [`Error::Shape`] for `pos ≥ max_conv_len`.
    pub fn step_ring<T: DecodeElem>(
        &mut self,
        gpu: &Gpu,
        inputs: DecodeInputs<'_, T>,
        state: &mut impl DevicePtrMut<T>,
        pos: usize,
        y_t: &mut impl DevicePtrMut<T>,
    ) -> Result<usize> {
        self.check_inputs(&inputs)?;
        check_len("state", self.lens.state, state.len())?;
        check_len("y_t", self.lens.h, y_t.len())?;
        let st = gpu.stream();
        self.order.enter(st)?;
        let (raw, _g) = raw_inputs(&inputs, st);
        let (s, _g1) = state.device_ptr_mut(st);
        let (y, _g2) = y_t.device_ptr_mut(st);
        // SAFETY: as in `forward`.
        unsafe { self.step_ring_raw(gpu, T::DTYPE, raw, s, pos, y, st.cu_stream()) }
    }

    fn check_inputs<T>(&self, i: &DecodeInputs<'_, T>) -> Result<()> {
        let l = &self.lens;
        check_len("e_t", l.e, i.e_t.len())?;
        check_len("h_t", l.h, i.h_t.len())?;
        check_len("w_k", l.w, i.w_k.len())?;
        check_len("w_v", l.w, i.w_v.len())?;
        check_len("rms_w_h", l.rms, i.rms_w_h.len())?;
        check_len("rms_w_v", l.rms, i.rms_w_v.len())?;
        check_len("conv_w", l.conv_w, i.conv_w.len())
    }

    /// [`EngramDecodePlan::forward`] on raw device pointers, launched on `stream`.
    ///
    /// # Safety
    /// Every pointer must address device memory of `gpu`'s context holding the elements of
    /// [`DecodeLens`] in `dtype`, valid until the kernel finishes; `y_t` and `new_conv_state`
    /// must not overlap each other or any input. Calls with this plan must be stream-ordered.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn forward_raw(
        &mut self,
        gpu: &Gpu,
        dtype: DecodeDtype,
        inputs: DecodeInputsRaw,
        conv_state: CUdeviceptr,
        y_t: CUdeviceptr,
        new_conv_state: CUdeviceptr,
        stream: CUstream,
    ) -> Result<()> {
        let l = self.shape.max_conv_len as u32;
        self.submit(gpu, dtype, inputs, conv_state, new_conv_state, y_t, 0, l - 1, true, stream)
    }

    /// [`EngramDecodePlan::step_ring`] on raw device pointers, launched on `stream`; returns
    /// the next `pos`.
    ///
    /// # Safety
    /// As [`EngramDecodePlan::forward_raw`]; `state` is read and written in place and must
    /// not overlap `y_t` or an input.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn step_ring_raw(
        &mut self,
        gpu: &Gpu,
        dtype: DecodeDtype,
        inputs: DecodeInputsRaw,
        state: CUdeviceptr,
        pos: usize,
        y_t: CUdeviceptr,
        stream: CUstream,
    ) -> Result<usize> {
        let l = self.shape.max_conv_len;
        if pos >= l {
            return Err(Error::Shape { arg: "pos", msg: format!("{pos} is not below max_conv_len = {l}") });
        }
        self.submit(gpu, dtype, inputs, state, state, y_t, pos as u32, pos as u32, false, stream)?;
        Ok((pos + 1) % l)
    }

    /// The raw pointers of the plan's own buffers (`[part, kv, capture]`, 0 when absent),
    /// taken before any launch or stream capture; the plan uses them on `gpu`'s stream only.
    fn plan_ptrs(&mut self, gpu: &Gpu) -> [CUdeviceptr; 3] {
        let st = gpu.stream();
        let part = self.part.as_ref().map_or(0, |p| p.device_ptr(st).0);
        let kv = self.kv.device_ptr_mut(st).0;
        let dbg = self.capture.as_mut().map_or(0, |c| c.device_ptr_mut(st).0);
        [part, kv, dbg]
    }

    /// Runs one step's two launches through the plan's graph: one submission, so the
    /// finishing kernel's dependent launch overlaps the projection (separate host launches:
    /// +0.5-1.4 µs; graph without the dependent launch: +0.9-1.3 µs). The graph is captured
    /// once per set of pointers and `pos` (up to 32 cached) and replayed; inside a caller's
    /// stream capture the launches go straight into that capture.
    #[allow(clippy::too_many_arguments)]
    unsafe fn submit(
        &mut self,
        gpu: &Gpu,
        dtype: DecodeDtype,
        i: DecodeInputsRaw,
        s_in: CUdeviceptr,
        s_out: CUdeviceptr,
        y: CUdeviceptr,
        pos: u32,
        write_row: u32,
        shift_state: bool,
        cs: CUstream,
    ) -> Result<()> {
        let pp = self.plan_ptrs(gpu);
        let mut key = vec![dtype as u64, i.e_t, i.h_t, i.w_k, i.w_v, i.rms_w_h, i.rms_w_v, i.conv_w];
        key.extend([s_in, s_out, y, pos as u64, write_row as u64, shift_state as u64]);
        key.extend(pp);
        let mut graph = std::mem::replace(&mut self.graph, GraphReplay::new());
        let r =
            graph.run(gpu, cs, key, |s| self.launch(gpu, dtype, i, s_in, s_out, y, pos, write_row, shift_state, pp, s));
        self.graph = graph;
        r
    }

    #[allow(clippy::too_many_arguments)]
    unsafe fn launch(
        &mut self,
        gpu: &Gpu,
        dtype: DecodeDtype,
        i: DecodeInputsRaw,
        s_in: CUdeviceptr,
        s_out: CUdeviceptr,
        y: CUdeviceptr,
        pos: u32,
        write_row: u32,
        shift_state: bool,
        pp: [CUdeviceptr; 3],
        stream: CUstream,
    ) -> Result<()> {
        let [projection, finish] =
            decode_step_launches(&self.shape, &self.steps, dtype, i, s_in, s_out, y, pos, write_row, shift_state, pp)?;
        // One launch with last-block-done tickets: b1/b4/b8 9.55/12.86/14.50 µs vs 8.50/13.84/9.92 (warp finish).
        // One launch in one thread-block cluster, finish over distributed shared memory: 5.54/5.92/5.92 µs.
        launch_planned(gpu.function(projection.kernel)?, &projection, stream)?;
        // The finish as a programmatic dependent (`launch_pdl`): it starts while the projection
        // runs and waits in `griddepcontrol.wait` before it reads the partials.
        launch_planned(gpu.function(finish.kernel)?, &finish, stream)
    }
}

/// The two launches of one decode step (projection, then the finish), as
/// `EngramDecodePlan`'s calls submit them: `steps` planned for `shape`, the layout picked by
/// the pointers' alignment, `pp` = the plan's `[partials, kv, intermediates]` buffers (0 when
/// absent).
#[doc(hidden)]
#[allow(clippy::too_many_arguments)]
pub fn decode_step_launches(
    shape: &EngramDecodeShape,
    steps: &DecodeStepPlans,
    dtype: DecodeDtype,
    i: DecodeInputsRaw,
    s_in: CUdeviceptr,
    s_out: CUdeviceptr,
    y: CUdeviceptr,
    pos: u32,
    write_row: u32,
    shift_state: bool,
    pp: [CUdeviceptr; 3],
) -> Result<[Planned<EngramDecodeArgs>; 2]> {
    let s = *shape;
    let vectorised =
        [i.e_t, i.h_t, i.w_k, i.w_v, i.rms_w_h, i.rms_w_v, i.conv_w, s_in, s_out, y].iter().all(|p| p % 16 == 0);
    let step = match steps.vectorised {
        Some(p) if vectorised => p,
        _ => steps.any_layout,
    };
    let g = step.geometry;
    let dims = LaunchDims { grid: (g.tiles, g.splits, 1), block: (g.block, 1, 1), shared_bytes: g.shared_bytes() };
    let [partials, kv, intermediates] = pp;
    let ptr = |p: CUdeviceptr| p as *const u16;
    // The projection launch; its finishing kernel is a programmatic dependent.
    // L2 prefetch of the finish's inputs by the projection under PDL: 4.86/5.89/5.02 µs vs 4.56/5.36/4.48.
    let projection = EngramDecodeArgs {
        e_t: ptr(i.e_t),
        h_t: ptr(i.h_t),
        conv_state: ptr(s_in),
        w_k: ptr(i.w_k),
        w_v: ptr(i.w_v),
        rms_w_h: ptr(i.rms_w_h),
        rms_w_v: ptr(i.rms_w_v),
        conv_w: ptr(i.conv_w),
        y_t: y as *mut u16,
        new_conv_state: s_out as *mut u16,
        partials: partials as *mut f32,
        kv: kv as *mut f32,
        intermediates: intermediates as *mut u16,
        batch: s.batch as u32,
        d_mem: s.d_mem as u32,
        d: s.d as u32,
        max_conv_len: s.max_conv_len as u32,
        kernel_size: s.kernel_size as u32,
        dilation: s.dilation as u32,
        pos,
        write_row,
        shift_state: shift_state as u32,
        splits: g.splits,
        rows_per_split: g.rows_per_split,
        col_lanes_log2: g.cl_log,
        eps: s.eps,
    };
    // State shift in extra blocks of the block finish, under PDL: predicted −0.1…−0.3 µs at b8, never faster.
    // Finish with `1/d` from the host and its loads before the dependent wait: 4.69/5.76/4.99 µs (+0.1–0.5).
    let batch = projection.batch;
    let (fin_dims, finish) = match step.finish {
        DecodeFinishKernel::Block { threads, .. } => (
            LaunchDims { grid: (batch, 1, 1), block: (threads, 1, 1), shared_bytes: DECODE_FINISH_BLOCK_SHARED_BYTES },
            // The block finish does not read `shift_state`.
            EngramDecodeArgs { shift_state: 0, ..projection },
        ),
        DecodeFinishKernel::Warp { threads, staged_in_shared, .. } => {
            let shared_bytes = if staged_in_shared { decode_finish_warp_shared_bytes(projection.d) } else { 0 };
            (LaunchDims { grid: (batch, 1, 1), block: (threads, 1, 1), shared_bytes }, projection)
        }
    };
    Ok([
        Planned { kernel: step.projection.entry(dtype)?, dims, args: projection, dependent: false },
        Planned { kernel: step.finish.entry(dtype)?, dims: fin_dims, args: finish, dependent: true },
    ])
}

/// The raw pointers of a safe call's inputs, with the guards that keep them stream-ordered.
#[allow(clippy::type_complexity)]
fn raw_inputs<'a, T>(
    i: &DecodeInputs<'a, T>,
    st: &'a std::sync::Arc<cudarc::driver::CudaStream>,
) -> (DecodeInputsRaw, Vec<cudarc::driver::SyncOnDrop<'a>>) {
    let mut guards = Vec::with_capacity(7);
    let mut p = |b: &'a dyn DevicePtr<T>| {
        let (ptr, g) = b.device_ptr(st);
        guards.push(g);
        ptr
    };
    let raw = DecodeInputsRaw {
        e_t: p(i.e_t),
        h_t: p(i.h_t),
        w_k: p(i.w_k),
        w_v: p(i.w_v),
        rms_w_h: p(i.rms_w_h),
        rms_w_v: p(i.rms_w_v),
        conv_w: p(i.conv_w),
    };
    (raw, guards)
}
