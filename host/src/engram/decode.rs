//! EngramDecodeFwd (docs/ops.md §6): one fused decode step.
//!
//! `kk = e_t·W_K`, `vv = e_t·W_V` (f32 accumulate); `hn = rmsnorm(h_t, rms_w_h)`,
//! `kn = rmsnorm(q(kk), rms_w_h)`, `alpha = σ(Σ hn·kn / sqrt(d))`, `vh = alpha·vv`;
//! `u = rmsnorm(q(vh), rms_w_v)`; `conv = conv_w[K−1]·u + Σ_{p<K−1} conv_w[p]·state[L − (K−1−p)·δ]`;
//! `y_t = q(silu(conv) + vh)`; the state gains `q(u)` as its newest row.
//!
//! One kernel launch per step (kernels-gpu/src/engram/decode.rs): the projections are split over
//! column tiles × row splits, the split partials are summed by the last block of each tile, and
//! the last tile finishes the gating, norms, conv and state write (last-block-done tickets).
//! An [`EngramDecodePlan`] owns the f32 workspace and the ticket counters.
use cudarc::driver::{sys::CUdeviceptr, sys::CUstream, CudaSlice, DevicePtr, DevicePtrMut};
use half::{bf16, f16};

use crate::error::{check_len, check_positive, checked_product};
use crate::runtime::{launch, launch_cluster, launch_pdl, max_active_clusters, GraphReplay, LaunchDims};
use crate::{Error, Gpu, Result};

pub(crate) const KERNELS: &[&str] = &[
    "engram_decode_f16_v8_b1",
    "engram_decode_f16_v8_b2",
    "engram_decode_f16_v8_b4",
    "engram_decode_f16_v8_b8",
    "engram_decode_f16_v1_b4",
    "engram_decode_bf16_v8_b1",
    "engram_decode_bf16_v8_b2",
    "engram_decode_bf16_v8_b4",
    "engram_decode_bf16_v8_b8",
    "engram_decode_bf16_v1_b4",
    "engram_decode_f16_mma",
    "engram_decode_bf16_mma",
    "engram_decode_f16_fin8",
    "engram_decode_f16_fin1",
    "engram_decode_bf16_fin8",
    "engram_decode_bf16_fin1",
    "engram_decode_f16_finw4",
    "engram_decode_f16_finw2",
    "engram_decode_f16_finw1",
    "engram_decode_bf16_finw4",
    "engram_decode_bf16_finw2",
    "engram_decode_bf16_finw1",
    "engram_decode_f16_mmal",
    "engram_decode_bf16_mmal",
    "engram_decode_f16_finx4",
    "engram_decode_f16_finx2",
    "engram_decode_f16_finx1",
    "engram_decode_bf16_finx4",
    "engram_decode_bf16_finx2",
    "engram_decode_bf16_finx1",
    "engram_decode_f16_mmac",
    "engram_decode_bf16_mmac",
];

/// Number of SMs of the H200 the default launch geometry is sized for.
const SMS: usize = 132;

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
            w: checked_product("W_K", &[self.d_mem, self.d])?,
            rms: self.d,
            conv_w: checked_product("conv_w", &[self.kernel_size, self.d])?,
        };
        for (arg, n) in [
            ("e_t", lens.e),
            ("h_t", lens.h),
            ("conv_state", lens.state),
            ("W_K", lens.w),
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

/// How the projections `e_t·W_K`, `e_t·W_V` are computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeProjection {
    /// CUDA-core FMAs: each thread owns 8 columns × its rows for up to 8 batch rows; the
    /// block's row lanes are summed through shared memory.
    Simt,
    /// Tensor cores (`mma.sync.m16n8k16`, f32 accumulate): the sum over 16 rows per
    /// instruction happens inside the MMA, only warp partials go through shared memory.
    /// Needs the vectorised layout (16-byte aligned, `d % 8 == 0`); other calls use `Simt`.
    Mma,
}

/// How the step is finished after the projections (the gating, norms and conv need whole
/// projected rows, i.e. every block's partials).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeFinish {
    /// One launch: the last block of each column tile sums its tile's split partials, the last
    /// of those finishes every batch row (two last-block-done tickets: fence + atomic each).
    Ticket,
    /// Two launches: the projection kernel only writes its partials; a second kernel, one
    /// block per batch row, sums the row's partials into shared memory and finishes it. No
    /// fences or atomics; costs a second kernel start instead.
    SecondLaunch,
    /// Two launches, the second spreading each batch row over a whole block (v4): thread `t`
    /// owns `elems` consecutive columns (1, 2 or 4; 0 = automatic, see [`wide_finish`]), every
    /// load is issued up front, the row sums are block reductions, and the scalar chain uses
    /// `rsqrt.approx` + Newton and `rcp.approx` (within the tolerance chain, not bitwise the
    /// other finishes). Shapes it cannot take (a row wider than its block limit) use
    /// [`DecodeFinish::SecondLaunch`]'s kernel.
    Wide { elems: u32 },
}

/// Largest block of the wide finishing kernel per element width `E` = 4, 2, 1 (its registers:
/// up to 16 splits' partials per thread are loaded at once; `cargo xtask build` (v5): `_finw4`
/// 207–209, `_finw2` 72, `_finw1` 56 registers; 65536 per block allow 256 / 768+ / 1024
/// threads; the v4 limits are kept for margin).
const WIDE_MAX_THREADS: [(u32, u32); 3] = [(4, 256), (2, 256), (1, 512)];

/// Automatic element width of the wide finish: the smallest `E` whose block (one thread per
/// `E` columns) has at most this many threads.
const WIDE_AUTO_THREADS: u32 = 256;

/// The wide finishing kernel's `(E, threads)` for `shape` (public for tests): `elems` = 0 picks
/// the smallest `E` whose block has ≤ 256 threads, else the smallest that fits its limit; `E`
/// of 2 or 4 needs the vectorised layout (`aligned`: `d % 8 == 0`, 16-byte aligned buffers).
/// `None`: no width fits (the step then uses the [`DecodeFinish::SecondLaunch`] kernel).
#[doc(hidden)]
pub fn wide_finish(shape: &EngramDecodeShape, elems: u32, aligned: bool) -> Option<(u32, u32)> {
    let fits = |e: u32| -> Option<(u32, u32)> {
        let &(_, max) = WIDE_MAX_THREADS.iter().find(|(w, _)| *w == e)?;
        if e > 1 && !(aligned && shape.d.is_multiple_of(8)) {
            return None;
        }
        let threads = (shape.d.div_ceil(e as usize).div_ceil(32) * 32) as u32;
        (threads <= max).then_some((e, threads))
    };
    if elems != 0 {
        return fits(elems);
    }
    [1, 2, 4]
        .into_iter()
        .filter_map(fits)
        .find(|&(_, t)| t <= WIDE_AUTO_THREADS)
        .or_else(|| [1, 2, 4].into_iter().find_map(fits))
}

/// Launch configuration knobs of the decode kernel (defaults are the tuned choice; see
/// kernels-gpu/src/engram/NOTES.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeConfig {
    pub projection: DecodeProjection,
    /// Threads per block: 64, 128 or 256.
    pub block: u32,
    /// Depth of a split: `Simt`, `W` rows per thread (the split height is this times the
    /// block's row lanes); `Mma`, 16-row steps per warp (split height `16·warps·this`).
    /// 0 = automatic: `Simt`, one round of the kernel's unrolled loads (4 or 2 rows); `Mma`,
    /// one step; raised when needed to keep at most `max_blocks` blocks.
    pub rows_per_thread: u32,
    /// Upper bound on the grid size (tiles × splits) for the automatic split depth.
    pub max_blocks: u32,
    /// One launch with tickets, or a second finishing launch (which uses `block` threads).
    pub finish: DecodeFinish,
    /// Two-launch finishes: launch the finishing kernel as a programmatic dependent
    /// ([`crate::runtime`]'s `launch_pdl`): it starts while the projection kernel runs, loads
    /// its inputs (`h_t`, weights, state taps) and waits in `griddepcontrol.wait` before it
    /// reads the partials; the projection kernel then skips its L2 prefetch of those inputs.
    pub pdl: bool,
    /// Two-launch finishes with the `Mma` projection: the lean projection kernel (`_mmal`:
    /// bitwise the same partials, a shorter per-warp chain) where it applies — see
    /// [`lean_applies`]; elsewhere the `_mma` kernel.
    pub lean: bool,
    /// Seed-contract steps with the wide finish on the vectorised layout: the state shift is
    /// done by extra blocks of the finishing launch (after the batch rows' blocks; under PDL
    /// they run while the projection does) instead of by the projection launch.
    pub copy_in_finish: bool,
    /// The wide finish's v6 kernels (`_finx`): bitwise the `_finw` outputs from a shorter
    /// dependent chain (the inputs' and the partials' loads issued together, `1/d` and
    /// `1/sqrt(d)` from the host, the block sums' shared loads issued together).
    pub fast_finish: bool,
    /// Under PDL, the projection launch still prefetches the finishing kernel's inputs (`h_t`,
    /// weights, state taps) into L2 (mode 1 instead of 5): if the dependent launch does not
    /// overlap in practice, the finish then reads them from L2 instead of DRAM.
    pub pdl_prefetch: bool,
    /// One launch in one thread-block cluster (`_mmac`, v6) where [`cluster_applies`]: the lean
    /// projection keeps its reduced partial tiles in shared memory and the batch rows are
    /// finished inside the cluster through distributed shared memory (the wide finish's
    /// arithmetic); elsewhere (or if the device cannot schedule the cluster) the two launches.
    pub cluster: bool,
    /// A step's launches are submitted as one CUDA graph (safe and raw entries), captured once
    /// and replayed when the same pointers and `pos` recur (one graph per ring position, up to
    /// 32 cached), so the finishing kernel's
    /// dependent launch overlaps the projection. Inside a caller's stream capture the
    /// launches go straight into that capture.
    pub graph: bool,
}

impl Default for DecodeConfig {
    fn default() -> Self {
        Self {
            projection: DecodeProjection::Mma,
            block: 128,
            rows_per_thread: 0,
            max_blocks: 2 * SMS as u32,
            // Two launches: predicted ≈2× faster than the one-launch ticket chain
            // (kernels-gpu/src/engram/NOTES.md); the bench's `@ticket` row measures the other.
            finish: DecodeFinish::SecondLaunch,
            pdl: true,
            lean: false,
            copy_in_finish: false,
            fast_finish: false,
            pdl_prefetch: false,
            cluster: false,
            graph: true,
        }
    }
}

/// The finish [`DecodeConfig::for_shape`] plans: the wide finish (bench rows `@finw*`),
/// measured faster than the one-warp finish on every seed row (H200, 2026-11-29 session 3:
/// finish kernel 2.4–2.9 µs against 3.7–9.1).
const PLANNED_FINISH: DecodeFinish = DecodeFinish::Wide { elems: 0 };

/// Whether [`DecodeConfig::for_shape`] plans the lean MMA projection kernel (bench rows
/// `@lean*`; `@nolean` is the planner with the `_mma` kernel). Bitwise the same partials as
/// `_mma` from fewer instructions per warp (same work minus the per-row bounds, the 2-byte
/// `e_t` loads, the scalar shared-memory traffic); one-line switch.
const PLANNED_LEAN: bool = true;

/// Whether [`DecodeConfig::for_shape`] plans the v6 wide finish (`_finx`; bench rows `@nofx`
/// = the planner with the v5 `_finw` kernel). Bitwise the `_finw` outputs from the same work
/// minus the serial steps (same arithmetic in the same order); one-line switch.
const PLANNED_FAST_FINISH: bool = false;

/// Whether a call of `shape` with `config` takes the lean MMA projection kernel (`_mmal`):
/// `config.lean`, the `Mma` projection on the vectorised layout (`aligned`: `d % 8 == 0`,
/// 16-byte aligned buffers), a two-launch finish, `batch ≤ 8` (one MMA batch group) and
/// `d_mem % 16 == 0` (whole k-steps). Public for tests.
#[doc(hidden)]
pub fn lean_applies(shape: &EngramDecodeShape, config: &DecodeConfig, aligned: bool) -> bool {
    config.lean
        && config.projection == DecodeProjection::Mma
        && config.finish != DecodeFinish::Ticket
        && aligned
        && shape.d.is_multiple_of(8)
        && shape.batch <= 8
        && shape.d_mem.is_multiple_of(16)
}

/// Whether [`DecodeConfig::for_shape`] plans the one-launch cluster step where it applies
/// (bench rows `@cl`, `@cl-r2`); one-line switch. With it the planner also takes block 256
/// for d ≤ 256 (the cluster needs one thread per column and ≤ 16 blocks).
const PLANNED_CLUSTER: bool = false;

/// Largest cluster of the one-launch cluster step (non-portable above 8).
const CLUSTER_MAX_BLOCKS: u32 = 16;

/// Whether a call of `shape` with `config` and geometry `g` takes the one-launch cluster step
/// (`_mmac`): [`lean_applies`], `config.cluster`, a wide finish, at least two warps per block,
/// one thread per column (`d ≤ block`), a power-of-two number of 64-column tiles, at most 16
/// blocks, and at least one block per batch row. Public for tests.
#[doc(hidden)]
pub fn cluster_applies(shape: &EngramDecodeShape, config: &DecodeConfig, g: &DecodeGeometry, aligned: bool) -> bool {
    let blocks = g.tiles * g.splits;
    config.cluster
        && lean_applies(shape, config, aligned)
        && matches!(config.finish, DecodeFinish::Wide { .. })
        && g.mma
        && g.block >= 64
        && shape.d <= g.block as usize
        && g.tiles.is_power_of_two()
        && blocks <= CLUSTER_MAX_BLOCKS
        && shape.batch <= blocks as usize
}

impl DecodeConfig {
    /// The planner's configuration for `shape` ([`EngramDecodePlan::new`] uses it), from the
    /// H200 sweep of 2026-11-29 (session 3, `--variants`): the lean MMA projection at every
    /// batch (b1 5.41 µs against 6.30 for SIMT), block 128 for d ≤ 256 (b1 5.38, b8 5.44) and
    /// 256 above (b4 6.21 against 6.56), and [`PLANNED_FINISH`].
    pub fn for_shape(shape: &EngramDecodeShape) -> Self {
        let block = if shape.d <= 256 && !PLANNED_CLUSTER { 128 } else { 256 };
        Self {
            projection: DecodeProjection::Mma,
            block,
            finish: PLANNED_FINISH,
            lean: PLANNED_LEAN,
            fast_finish: PLANNED_FAST_FINISH,
            cluster: PLANNED_CLUSTER,
            ..Self::default()
        }
    }
}

/// Largest `d` whose reduced row (`2·d` f32) the finishing launch stages in shared memory;
/// larger rows go through the `kv` workspace.
const FIN_SHARED_MAX_D: usize = 4096;

/// The finishing launch of [`DecodeFinish::SecondLaunch`] for `shape`: `(mode, dynamic shared
/// bytes)` — mode 2 stages the row in shared memory, mode 3 in the workspace (public for tests).
#[doc(hidden)]
pub fn finish_launch_mode(shape: &EngramDecodeShape) -> (u32, u32) {
    if shape.d <= FIN_SHARED_MAX_D {
        (2, (8 * shape.d) as u32)
    } else {
        (3, 0)
    }
}

/// The launch geometry for one vector width (a CPU model of the kernel's partition; public
/// for tests).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeGeometry {
    /// Elements per thread along `d` (8: 16-byte loads; 1: any layout).
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
    /// Batch rows per projection pass (a compiled kernel variant).
    pub bb: u32,
    /// Tensor-core projection (64-column tiles, 16-row steps per warp).
    pub mma: bool,
}

impl DecodeGeometry {
    /// The geometry for `shape` with vector width `vec` (8 requires `d % 8 == 0`).
    pub fn new(shape: &EngramDecodeShape, config: &DecodeConfig, vec: u32) -> Result<Self> {
        if ![64, 128, 256].contains(&config.block) {
            return Err(Error::Shape { arg: "config.block", msg: format!("{} is not 64, 128 or 256", config.block) });
        }
        if config.max_blocks == 0 {
            return Err(Error::Shape { arg: "config.max_blocks", msg: "must be at least 1".into() });
        }
        let block = config.block as usize;
        if vec == 8 && config.projection == DecodeProjection::Mma {
            let (warps, tiles) = (block / 32, shape.d.div_ceil(64));
            let step = 16 * warps;
            let ksteps = if config.rows_per_thread > 0 {
                config.rows_per_thread as usize
            } else {
                // One 16-row step per warp (the kernel's round holds two: the grid spreads over
                // more SMs), more if the grid would exceed max_blocks.
                shape.d_mem.div_ceil(step * (config.max_blocks as usize / tiles).max(1))
            };
            let rows = (ksteps * step).min(shape.d_mem.div_ceil(step) * step);
            let splits = shape.d_mem.div_ceil(rows);
            return Self::checked(vec, config.block, 3, tiles, splits, rows, 8, true);
        }
        let nch = shape.d / vec as usize;
        // Column lanes: a warp's row segment is ≥ 128 bytes where d allows (8 lanes × 16 B).
        let cl = nch.next_power_of_two().min(if vec == 8 { 8 } else { 32 });
        let rl = block / cl;
        let tiles = nch.div_ceil(cl);
        let bb = match shape.batch {
            _ if vec == 1 => 4,
            1 => 1,
            2 => 2,
            3 | 4 => 4,
            _ => 8,
        };
        let rpt = if config.rows_per_thread > 0 {
            config.rows_per_thread as usize
        } else {
            // One round of the kernel's row unroll (4 rows, 2 for the 8-row batch variant:
            // every load in flight at once), more if the grid would exceed max_blocks.
            let unroll = if bb == 8 { 2 } else { 4 };
            let by_blocks = shape.d_mem.div_ceil(rl * (config.max_blocks as usize / tiles).max(1));
            by_blocks.max(unroll)
        };
        let rows = (rpt * rl).min(shape.d_mem.div_ceil(rl) * rl);
        let splits = shape.d_mem.div_ceil(rows);
        Self::checked(vec, config.block, cl.trailing_zeros(), tiles, splits, rows, bb, false)
    }

    #[allow(clippy::too_many_arguments)]
    fn checked(
        vec: u32,
        block: u32,
        cl_log: u32,
        tiles: usize,
        splits: usize,
        rows: usize,
        bb: u32,
        mma: bool,
    ) -> Result<Self> {
        if tiles > i32::MAX as usize || splits > 65535 {
            return Err(Error::Overflow { arg: "d_mem", msg: format!("grid {tiles}×{splits}") });
        }
        Ok(Self {
            vec,
            block,
            cl_log,
            tiles: tiles as u32,
            splits: splits as u32,
            rows_per_split: rows as u32,
            bb,
            mma,
        })
    }

    /// Column lanes per block.
    pub fn col_lanes(&self) -> u32 {
        1 << self.cl_log
    }

    /// Dynamic shared memory of one block, bytes.
    pub fn shared_bytes(&self) -> u32 {
        if self.mma {
            self.block / 32 * 4096 + 16
        } else {
            self.block * 2 * self.vec * 4 + 16
        }
    }

    /// The finishing kernel of [`DecodeFinish::SecondLaunch`] for this vector width.
    fn finish_kernel(&self, dtype: DecodeDtype) -> &'static str {
        KERNELS[12 + if self.vec == 8 { 0 } else { 1 } + if dtype == DecodeDtype::F16 { 0 } else { 2 }]
    }

    fn kernel(&self, dtype: DecodeDtype) -> &'static str {
        if self.mma {
            return KERNELS[if dtype == DecodeDtype::F16 { 10 } else { 11 }];
        }
        let i = match (self.vec, self.bb) {
            (8, 1) => 0,
            (8, 2) => 1,
            (8, 4) => 2,
            (8, _) => 3,
            _ => 4,
        };
        KERNELS[i + if dtype == DecodeDtype::F16 { 0 } else { 5 }]
    }
}

/// A decode step planned for one shape: the launch geometry and the device workspace
/// (split partials `[splits, batch, 2, d]` f32, the reduced projections `[batch, 2, d]` f32,
/// and the ticket counters, which every call leaves at zero).
///
/// Calls through one plan must be ordered on one stream (the workspace is reused); use a plan
/// per stream for concurrent steps.
pub struct EngramDecodePlan {
    shape: EngramDecodeShape,
    finish: DecodeFinish,
    config: DecodeConfig,
    lens: DecodeLens,
    geo: [DecodeGeometry; 2],
    part: Option<CudaSlice<f32>>,
    kv: CudaSlice<f32>,
    counters: CudaSlice<u32>,
    capture: Option<CudaSlice<u16>>,
    /// Whether the device schedules this plan's cluster (asked once, on the first call).
    cluster_ok: Option<bool>,
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

/// The input buffers of one safe call, in the order of docs/ops.md (the state is passed separately).
pub struct DecodeInputs<'a, T, B: DevicePtr<T>> {
    pub e_t: &'a B,
    pub h_t: &'a B,
    pub w_k: &'a B,
    pub w_v: &'a B,
    pub rms_w_h: &'a B,
    pub rms_w_v: &'a B,
    pub conv_w: &'a B,
    pub _t: std::marker::PhantomData<T>,
}

impl<'a, T, B: DevicePtr<T>> DecodeInputs<'a, T, B> {
    /// Groups the seven input buffers (`e_t, h_t, W_K, W_V, rms_w_h, rms_w_v, conv_w`).
    pub fn new(e_t: &'a B, h_t: &'a B, w_k: &'a B, w_v: &'a B, rms_w_h: &'a B, rms_w_v: &'a B, conv_w: &'a B) -> Self {
        Self { e_t, h_t, w_k, w_v, rms_w_h, rms_w_v, conv_w, _t: std::marker::PhantomData }
    }
}

impl EngramDecodePlan {
    /// Plans `shape` with the planner's configuration ([`DecodeConfig::for_shape`]) and
    /// allocates its workspace on `gpu`.
    ///
    /// Errors: the shape's [`EngramDecodeShape::lens`] errors; a driver error on allocation.
    pub fn new(gpu: &Gpu, shape: EngramDecodeShape) -> Result<Self> {
        Self::with_config(gpu, shape, DecodeConfig::for_shape(&shape))
    }

    /// As [`EngramDecodePlan::new`] with an explicit launch configuration.
    pub fn with_config(gpu: &Gpu, shape: EngramDecodeShape, config: DecodeConfig) -> Result<Self> {
        let lens = shape.lens()?;
        let g1 = DecodeGeometry::new(&shape, &config, 1)?;
        let g8 = if shape.d.is_multiple_of(8) { DecodeGeometry::new(&shape, &config, 8)? } else { g1 };
        let st = gpu.stream();
        let kv_len = 2 * lens.h;
        let max_splits = g1.splits.max(g8.splits) as usize;
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
            shape,
            finish: config.finish,
            config,
            lens,
            geo: [g8, g1],
            part,
            kv: st.alloc_zeros::<f32>(kv_len)?,
            counters: st.alloc_zeros::<u32>(g1.tiles.max(g8.tiles) as usize + 1)?,
            capture: None,
            cluster_ok: None,
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

    /// The geometry a call with 16-byte aligned tensors (`vec = 8`) or any layout uses.
    #[doc(hidden)]
    pub fn geometry(&self, aligned: bool) -> DecodeGeometry {
        self.geo[if aligned { 0 } else { 1 }]
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

    /// One decode step under docs/ops.md §6's contract: reads `conv_state`, writes `y_t` and
    /// `new_conv_state = concat(conv_state[:, 1:], q(u))` (a separate buffer).
    ///
    /// Buffers may be larger than the shape needs; 16-byte aligned buffers with `d % 8 == 0`
    /// take the vectorised kernel. `new_conv_state` must not overlap `conv_state` (use
    /// [`EngramDecodePlan::step_ring`] for an in-place state). Asynchronous on [`Gpu::stream`].
    ///
    /// Errors: [`Error::BufferTooSmall`] naming the buffer; a driver error from the launch.
    #[allow(clippy::too_many_arguments)]
    pub fn forward<T: DecodeElem, B: DevicePtr<T>>(
        &mut self,
        gpu: &Gpu,
        inputs: &DecodeInputs<'_, T, B>,
        conv_state: &impl DevicePtr<T>,
        y_t: &mut impl DevicePtrMut<T>,
        new_conv_state: &mut impl DevicePtrMut<T>,
    ) -> Result<()> {
        self.check_inputs(inputs)?;
        check_len("conv_state", self.lens.state, conv_state.len())?;
        check_len("y_t", self.lens.h, y_t.len())?;
        check_len("new_conv_state", self.lens.state, new_conv_state.len())?;
        let st = gpu.stream();
        let (raw, _g) = raw_inputs(inputs, st);
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
    pub fn step_ring<T: DecodeElem, B: DevicePtr<T>>(
        &mut self,
        gpu: &Gpu,
        inputs: &DecodeInputs<'_, T, B>,
        state: &mut impl DevicePtrMut<T>,
        pos: usize,
        y_t: &mut impl DevicePtrMut<T>,
    ) -> Result<usize> {
        self.check_inputs(inputs)?;
        check_len("state", self.lens.state, state.len())?;
        check_len("y_t", self.lens.h, y_t.len())?;
        let st = gpu.stream();
        let (raw, _g) = raw_inputs(inputs, st);
        let (s, _g1) = state.device_ptr_mut(st);
        let (y, _g2) = y_t.device_ptr_mut(st);
        // SAFETY: as in `forward`.
        unsafe { self.step_ring_raw(gpu, T::DTYPE, raw, s, pos, y, st.cu_stream()) }
    }

    fn check_inputs<T, B: DevicePtr<T>>(&self, i: &DecodeInputs<'_, T, B>) -> Result<()> {
        let l = &self.lens;
        check_len("e_t", l.e, i.e_t.len())?;
        check_len("h_t", l.h, i.h_t.len())?;
        check_len("W_K", l.w, i.w_k.len())?;
        check_len("W_V", l.w, i.w_v.len())?;
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

    /// The raw pointers of the plan's own buffers (`[part, kv, counters, capture]`, 0 when
    /// absent), taken before any launch or stream capture; the plan uses them on `gpu`'s
    /// stream only.
    fn plan_ptrs(&mut self, gpu: &Gpu) -> [CUdeviceptr; 4] {
        let st = gpu.stream();
        let part = self.part.as_ref().map_or(0, |p| p.device_ptr(st).0);
        let kv = self.kv.device_ptr_mut(st).0;
        let cnt = self.counters.device_ptr_mut(st).0;
        let dbg = self.capture.as_mut().map_or(0, |c| c.device_ptr_mut(st).0);
        [part, kv, cnt, dbg]
    }

    /// Runs one step's launches directly, or through the plan's graph (`config.graph`: one
    /// submission, so the finishing kernel's dependent launch overlaps the projection).
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
        wpos: u32,
        copy: bool,
        cs: CUstream,
    ) -> Result<()> {
        let pp = self.plan_ptrs(gpu);
        if !self.config.graph {
            return self.launch(gpu, dtype, i, s_in, s_out, y, pos, wpos, copy, pp, cs);
        }
        let mut key = vec![dtype as u64, i.e_t, i.h_t, i.w_k, i.w_v, i.rms_w_h, i.rms_w_v, i.conv_w];
        key.extend([s_in, s_out, y, pos as u64, wpos as u64, copy as u64]);
        key.extend(pp);
        let mut graph = std::mem::replace(&mut self.graph, GraphReplay::new());
        let r = graph.run(cs, key, || self.launch(gpu, dtype, i, s_in, s_out, y, pos, wpos, copy, pp, cs));
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
        wpos: u32,
        copy: bool,
        pp: [CUdeviceptr; 4],
        stream: CUstream,
    ) -> Result<()> {
        let s = self.shape;
        let aligned = s.d.is_multiple_of(8)
            && [i.e_t, i.h_t, i.w_k, i.w_v, i.rms_w_h, i.rms_w_v, i.conv_w, s_in, s_out, y].iter().all(|p| p % 16 == 0);
        let g = self.geometry(aligned);
        let lean = lean_applies(&s, &self.config, aligned);
        let f =
            gpu.function(if lean { KERNELS[22 + (dtype == DecodeDtype::Bf16) as usize] } else { g.kernel(dtype) })?;
        let dims = LaunchDims { grid: (g.tiles, g.splits, 1), block: (g.block, 1, 1), shared_bytes: g.shared_bytes() };
        // The one-launch cluster step: the whole grid is one cluster; shared memory adds the
        // partial tile (4096 bytes) and the reduction slots (640).
        let mut cluster = None;
        if lean && cluster_applies(&s, &self.config, &g, aligned) {
            let fc = gpu.function(KERNELS[30 + (dtype == DecodeDtype::Bf16) as usize])?;
            let blocks = g.tiles * g.splits;
            let cdims =
                LaunchDims { grid: (blocks, 1, 1), block: (g.block, 1, 1), shared_bytes: g.shared_bytes() + 4736 };
            let ok = match self.cluster_ok {
                Some(ok) => ok,
                None => {
                    let ok = max_active_clusters(fc, cdims, blocks, gpu.stream().cu_stream())? > 0;
                    self.cluster_ok = Some(ok);
                    ok
                }
            };
            if ok {
                cluster = Some((fc, cdims, blocks));
            }
        }
        let copy_all = copy;
        let [part, kv, cnt, dbg] = pp;
        let (mut e, mut h, mut si, mut wk, mut wv) = (i.e_t, i.h_t, s_in, i.w_k, i.w_v);
        let (mut rwh, mut rwv, mut cw, mut y, mut so) = (i.rms_w_h, i.rms_w_v, i.conv_w, y, s_out);
        let (mut part, mut kv, mut cnt, mut dbg) = (part, kv, cnt, dbg);
        let (mut b, mut dm, mut d) = (s.batch as u32, s.d_mem as u32, s.d as u32);
        let (mut l, mut k, mut dil) = (s.max_conv_len as u32, s.kernel_size as u32, s.dilation as u32);
        // The wide finish's extra blocks take the shift (`copy_in_finish`): `fin_copy` of them.
        let wide = match self.finish {
            DecodeFinish::Wide { elems } => wide_finish(&s, elems, aligned),
            _ => None,
        };
        let fin_copy = match wide {
            Some((_, threads)) if copy && aligned && self.config.copy_in_finish => {
                let units = s.batch * (s.max_conv_len - 1) * (s.d / 8);
                units.div_ceil(threads as usize) as u32
            }
            _ => 0,
        };
        let (mut pos, mut wpos, mut copy) = (pos, wpos, (copy && fin_copy == 0) as u32);
        let (mut splits, mut rs, mut cl_log, mut eps) = (g.splits, g.rows_per_split, g.cl_log, s.eps);
        let two = self.finish != DecodeFinish::Ticket;
        let pdl = two && self.config.pdl;
        // 0: one launch (tickets); 1: the projection launch; 5: the same without the L2
        // prefetch of the finish's inputs (the dependent finish kernel loads them itself).
        let mut mode = if pdl && !self.config.pdl_prefetch { 5 } else { two as u32 };
        let launch_fin = if pdl { launch_pdl } else { launch };
        macro_rules! args {
            () => {
                &mut [
                    &mut e,
                    &mut h,
                    &mut si,
                    &mut wk,
                    &mut wv,
                    &mut rwh,
                    &mut rwv,
                    &mut cw,
                    &mut y,
                    &mut so,
                    &mut part,
                    &mut kv,
                    &mut cnt,
                    &mut dbg,
                    &mut b,
                    &mut dm,
                    &mut d,
                    &mut l,
                    &mut k,
                    &mut dil,
                    &mut pos,
                    &mut wpos,
                    &mut copy,
                    &mut splits,
                    &mut rs,
                    &mut cl_log,
                    &mut eps,
                    &mut mode,
                ]
            };
        }
        if let Some((fc, cdims, blocks)) = cluster {
            // Mode 1 (the L2 prefetch of the finish's inputs), the state shift in this launch,
            // `cl_log` = log2(tiles).
            mode = 1;
            copy = copy_all as u32;
            cl_log = g.tiles.trailing_zeros();
            return launch_cluster(fc, cdims, blocks, stream, args!());
        }
        launch(f, dims, stream, args!())?;
        if !two {
            return Ok(());
        }
        if let Some((e, threads)) = wide {
            copy = (fin_copy > 0) as u32;
            let idx = match e {
                4 => 0,
                2 => 1,
                _ => 2,
            } + if dtype == DecodeDtype::F16 { 0 } else { 3 };
            let fast = self.config.fast_finish;
            if fast {
                // `_finx` takes `1/d` and `1/sqrt(d)` (correctly rounded, as the kernel's
                // `div_rn`/`sqrt_rn` give them) in the finishing launch's unused `rs`, `cl_log`.
                let df = s.d as f32;
                rs = (1.0f32 / df).to_bits();
                cl_log = (1.0f32 / df.sqrt()).to_bits();
            }
            let fin = gpu.function(KERNELS[if fast { 24 } else { 16 } + idx])?;
            let dims =
                LaunchDims { grid: (s.batch as u32 + fin_copy, 1, 1), block: (threads, 1, 1), shared_bytes: 640 };
            return launch_fin(fin, dims, stream, args!());
        }
        let fin = gpu.function(g.finish_kernel(dtype))?;
        let (m, shared_bytes) = finish_launch_mode(&s);
        mode = m;
        let dims = LaunchDims { grid: (s.batch as u32, 1, 1), block: (g.block, 1, 1), shared_bytes };
        launch_fin(fin, dims, stream, args!())
    }
}

/// The raw pointers of a safe call's inputs, with the guards that keep them stream-ordered.
#[allow(clippy::type_complexity)]
fn raw_inputs<'a, T, B: DevicePtr<T>>(
    i: &'a DecodeInputs<'_, T, B>,
    st: &'a std::sync::Arc<cudarc::driver::CudaStream>,
) -> (DecodeInputsRaw, Vec<cudarc::driver::SyncOnDrop<'a>>) {
    let mut guards = Vec::with_capacity(7);
    let mut p = |b: &'a B| {
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
