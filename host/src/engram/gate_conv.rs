//! EngramGateConvFwd / EngramGateConvBwd (docs/ops.md §4–§5): Engram context gating fused with
//! the causal depthwise conv (kernel size 4), training forward and its backward.
//!
//! Kernels: `kernels-gpu/src/engram/gate_conv.rs`; decisions and measurements:
//! `docs/decisions/engram_gate.md`. The forward is one launch; the backward is two (row-parallel
//! gradients with per-block partial weight gradients, then a fixed-order reduction of the
//! partials: bitwise deterministic).
//!
//! Each op has one planner ([`plan_fwd`], [`plan_bwd`]) that reads its tuning table
//! ([`FWD_TUNING`], [`BWD_TUNING`]) and the layout (`d`, alignment, `M`) and returns an explicit
//! plan; the launch code only matches on the plan.
use std::collections::BTreeSet;

use cudarc::driver::{sys::CUdeviceptr, sys::CUstream, DevicePtr, DevicePtrMut};

use crate::error::{check_len, check_positive, checked_product};
use crate::runtime::{launch_planned, GraphReplay, LaunchDims, Planned};
use crate::verify::Half;
use crate::{Error, Gpu, Result};
use kernel_abi::engram::gate::layout::{
    bwd_smem_bytes, bwd_split_smem_bytes, dpad, fwd_smem_bytes, fwd_stream_smem_floats, CONV_TAPS, FWD_SMEM_WL,
    GRAD_ROWS,
};
use kernel_abi::engram::gate::{chunk_row_magic, warp_row_magic, DconvScratch, GateKernel};
use kernel_abi::{gate_policies, Elem, GatePolicy, Policy};
use kernel_abi::{GateBwdArgs, GateBwdReduceArgs, GateBwdSplitArgs, GateFwdArgs, GateFwdSmemArgs};

/// `eps` of the three rmsnorms (docs/ops.md §4).
pub const EPS: f32 = 1e-6;
/// Causal conv kernel size (docs/ops.md §4).
pub const KERNEL_SIZE: usize = CONV_TAPS;

/// The family's PTX entries, from the policy types of `kernel_abi::gate_kernels!` (the list the
/// kernels are declared from): [`KERNELS`] (each launched by some plan: [`planned_kernels`])
/// and [`POLICIES`], which [`entry_of`] searches.
macro_rules! gate_entry_table {
    ($($name:ident: $kind:ident, $dt:ident, $nv:literal;)*) => {
        /// Every PTX entry of the family.
        pub(crate) const KERNELS: &[&str] = &[$(<gate_policies::$name as Policy>::ENTRY,)*];
        /// Every policy's kernel, element type, chunks per lane and entry.
        const POLICIES: &[(GateKernel, Elem, u32, &str)] = &[$(policy_row::<gate_policies::$name>(),)*];
    };
}
kernel_abi::gate_kernels!(gate_entry_table);

const fn policy_row<P: GatePolicy>() -> (GateKernel, Elem, u32, &'static str) {
    let () = P::VALID;
    (P::KERNEL, P::ELEM, P::NV, P::ENTRY)
}

/// The entry of `kind` for `dtype` (`bf16`: bf16, else f16; ignored by the f32 reductions) with
/// `nv` chunks per lane of a resident row (0 for the others); `None` where the family has no
/// such kernel.
fn entry_of(kind: GateKernel, bf16: bool, nv: usize) -> Option<&'static str> {
    let dtype_ok = |e: Elem| !e.is_half() || (e == Elem::Bf16) == bf16;
    POLICIES.iter().find(|&&(k, e, n, _)| k == kind && dtype_ok(e) && n as usize == nv).map(|row| row.3)
}

/// [`entry_of`], or [`Error::MissingKernel`] naming what the plan asked for (a planner/table
/// mismatch, which the planner sweep test would show).
fn entry(kind: GateKernel, bf16: bool, nv: usize) -> Result<&'static str> {
    entry_of(kind, bf16, nv)
        .ok_or_else(|| Error::MissingKernel(format!("{kind:?} {} nv={nv}", if bf16 { "bf16" } else { "f16" })))
}

/// Largest dynamic shared memory used without opting in (bytes).
const SMEM_DEFAULT: usize = 48 * 1024;

/// Largest dynamic shared memory of the split-rows backward (opted in above 48 KiB; well inside
/// sm_90's 227 KiB, leaving room for the reduce kernel's blocks beside it under PDL).
const SPLIT_SMEM_MAX: usize = 64 * 1024;

/// Sizes of one EngramGateConv call: `m` sequences of `t` rows of `d` channels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngramGateShape {
    pub m: usize,
    pub t: usize,
    pub d: usize,
}

impl EngramGateShape {
    /// Checks every size is ≥ 1 and the index ranges of the kernels (`M·T < 2^31`,
    /// `d < 2^28`); returns `(M·T·d, M·T)`: the element counts of a `[M,T,d]` tensor and of a
    /// `[M,T]` per-row tensor.
    pub fn lens(&self) -> Result<(usize, usize)> {
        check_positive("m", self.m)?;
        check_positive("t", self.t)?;
        check_positive("d", self.d)?;
        let rows = checked_product("t", &[self.m, self.t])?;
        if rows >= 1 << 31 {
            return Err(Error::Overflow { arg: "t", msg: format!("M·T = {rows} rows ≥ 2^31") });
        }
        if self.d >= 1 << 28 {
            return Err(Error::Overflow { arg: "d", msg: format!("d = {} ≥ 2^28", self.d) });
        }
        Ok((checked_product("d", &[self.m, self.t, self.d])?, rows))
    }
}

/// One shape class of the forward's tuning table: from `d_min` up (the first row whose `d_min`
/// ≤ d applies).
pub(crate) struct FwdTuning {
    pub d_min: usize,
    /// Rows of one sequence per block (`R`); the block has `R+3` row warps (3 halo rows).
    pub rows_per_block: u32,
    /// Shared-memory kernels only: warps beyond the `R+3` row warps; they take part in the
    /// weight loads and phase 2 (`R·ceil(d/8)` chunks over the block; bitwise the same outputs).
    pub extra_warps: u32,
}

/// The forward's tuning table (H200, bench `--variants`, device µs; shared-memory kernels).
pub(crate) const FWD_TUNING: [FwdTuning; 3] = [
    // train-s96: R 3 with 5 extra phase-2 warps, 4.54 µs against 4.70 without (R 1: 5.34)
    FwdTuning { d_min: 768, rows_per_block: 3, extra_warps: 5 },
    // train-s64: R 2 with 2 extra warps, 3.49 µs against 3.68 without (R 3: 4.06)
    FwdTuning { d_min: 512, rows_per_block: 2, extra_warps: 2 },
    // train-s32 / s128: R 2 without extra warps (3.07 / 3.20 µs; the planner's R on every row)
    FwdTuning { d_min: 0, rows_per_block: 2, extra_warps: 0 },
];

/// One shape class of the backward's tuning table (as [`FwdTuning`]).
pub(crate) struct BwdTuning {
    pub d_min: usize,
    /// Rows of one sequence per block (`R`); `R+6` rows with the halo (3 each side).
    pub rows_per_block: u32,
    /// Warps per output column group in the reduce kernel (`S`).
    pub reduce_segments: u32,
    /// The reduce kernel with 16-byte loads and this many threads per segment row (where
    /// `d % 4 == 0` and the workspace is 16-byte aligned), else the scalar reduce.
    pub reduce_vec4_threads: Option<u32>,
}

/// The backward's tuning table (H200, bench `--variants`, graph submission, device µs).
pub(crate) const BWD_TUNING: [BwdTuning; 2] = [
    // train-s96: R 3, S 32, 16-byte reduce with 8 threads per segment row: 8.67 µs against
    // 8.90 (scalar reduce, S 16) and 8.77 (16-byte, S 16)
    BwdTuning { d_min: 768, rows_per_block: 3, reduce_segments: 32, reduce_vec4_threads: Some(8) },
    // train-s32/s64/s128: R 2, S 16, scalar reduce (the 16-byte reduce is neutral to +0.2 µs
    // here: s64 6.43 against 6.21)
    BwdTuning { d_min: 0, rows_per_block: 2, reduce_segments: 16, reduce_vec4_threads: None },
];

fn fwd_tuning(d: usize) -> &'static FwdTuning {
    FWD_TUNING.iter().find(|t| d >= t.d_min).unwrap_or(&FWD_TUNING[FWD_TUNING.len() - 1])
}

fn bwd_tuning(d: usize) -> &'static BwdTuning {
    BWD_TUNING.iter().find(|t| d >= t.d_min).unwrap_or(&BWD_TUNING[BWD_TUNING.len() - 1])
}

// Every row of the tables fits the resident layouts (d ≤ 1024) in the kernels' limits, so a
// resident row always takes a shared-memory forward and the split backward's shared memory
// never passes SPLIT_SMEM_MAX where its `u` and `dconv` fit in 48 KiB: those cases need no
// fallback.
const _: () = {
    let mut i = 0;
    while i < FWD_TUNING.len() {
        let r = FWD_TUNING[i].rows_per_block;
        assert!(fwd_smem_bytes(1024, r) <= SMEM_DEFAULT);
        assert!(5 * 1024usize.div_ceil(8) <= FWD_SMEM_WL * (r as usize + 3) * 32);
        assert!(r + 3 + FWD_TUNING[i].extra_warps <= 32);
        i += 1;
    }
    let mut i = 0;
    while i < BWD_TUNING.len() {
        let r = BWD_TUNING[i].rows_per_block;
        assert!(r >= 1 && r + 6 <= 32);
        let mut d = 8;
        while d <= 1024 {
            if bwd_u_fits(d, r) {
                assert!(bwd_split_smem_bytes(d, r, bwd_split_warps(d, r)) <= SPLIT_SMEM_MAX);
                assert!(split_nv(d, bwd_split_warps(d, r)) <= 2);
            }
            d += 8;
        }
        i += 1;
    }
};

/// The forward kernel of a plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FwdKernel {
    /// `u` in shared memory, grid `(ntiles, M)`, the per-launch constants from the host: the
    /// resident layouts (`d % 8 == 0`, `d ≤ 1024`, 16-byte aligned) with `d ≥ 16` and
    /// `M ≤ 65535`.
    Smem { nv: usize },
    /// The same algorithm on a 1-D grid with the constants computed in the kernel (bitwise
    /// `Smem` where |conv| and |alpha's logit| < 87): resident layouts with `M > 65535` or
    /// `d = 8`.
    SmemGrid1d { nv: usize },
    /// Rows streamed through L1 with 16-byte accesses: `d > 1024`, `d % 8 == 0`, aligned.
    StreamVec8,
    /// Rows streamed with scalar accesses: any `d`, any alignment.
    StreamScalar,
}

impl FwdKernel {
    fn entry(self, bf16: bool) -> Result<&'static str> {
        match self {
            Self::Smem { nv } => entry(GateKernel::FwdSmem, bf16, nv),
            Self::SmemGrid1d { nv } => entry(GateKernel::FwdSmemGrid1d, bf16, nv),
            Self::StreamVec8 => entry(GateKernel::FwdStreamVec8, bf16, 0),
            Self::StreamScalar => entry(GateKernel::FwdStreamScalar, bf16, 0),
        }
    }
}

/// What the forward launches for one call.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FwdPlan {
    pub kernel: FwdKernel,
    pub t_len: u32,
    pub d: u32,
    pub rows_per_block: u32,
    pub ntiles: u32,
    pub dims: LaunchDims,
}

/// `ceil(d/8)` chunks per lane of a resident row (1..=4) when `d % 8 == 0`, `d ≤ 1024` and the
/// 16-bit buffers are 16-byte aligned; `None` otherwise (streaming kernels).
fn resident_nv(d: usize, aligned: bool) -> Option<usize> {
    (d.is_multiple_of(8) && aligned && d <= 1024).then(|| d.div_ceil(256))
}

/// The forward's planner: the kernel and its geometry for `shape` (`aligned`: every 16-bit
/// buffer 16-byte aligned).
pub(crate) fn plan_fwd(shape: EngramGateShape, aligned: bool) -> Result<FwdPlan> {
    shape.lens()?;
    let d = shape.d;
    let tune = fwd_tuning(d);
    let r = tune.rows_per_block;
    let ntiles = shape.t.div_ceil(r as usize);
    let blocks = u32::try_from(shape.m * ntiles)
        .map_err(|_| Error::Overflow { arg: "m", msg: format!("{} blocks", shape.m * ntiles) })?;
    let smem_warps = r + 3 + tune.extra_warps;
    let (kernel, grid, warps, shared_bytes) = match resident_nv(d, aligned) {
        // grid (ntiles, M): M ≤ 65535; the host's chunk-index multiplier needs d ≥ 16
        Some(nv) if d >= 16 && shape.m <= 65535 => {
            (FwdKernel::Smem { nv }, (ntiles as u32, shape.m as u32, 1), smem_warps, fwd_smem_bytes(d, r))
        }
        Some(nv) => (FwdKernel::SmemGrid1d { nv }, (blocks, 1, 1), smem_warps, fwd_smem_bytes(d, r)),
        None if d.is_multiple_of(8) && aligned => {
            (FwdKernel::StreamVec8, (blocks, 1, 1), r + 3, 4 * fwd_stream_smem_floats(r) as usize)
        }
        None => (FwdKernel::StreamScalar, (blocks, 1, 1), r + 3, 4 * fwd_stream_smem_floats(r) as usize),
    };
    let dims = LaunchDims { grid, block: (warps * 32, 1, 1), shared_bytes: shared_bytes as u32 };
    Ok(FwdPlan { kernel, t_len: shape.t as u32, d: d as u32, rows_per_block: r, ntiles: ntiles as u32, dims })
}

/// The backward's main kernel of a plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BwdMain {
    /// Every tile row split over `warps_per_row` warps; weights, `u`, `dconv` in shared memory,
    /// approximate σ and rsqrt, stage 3 in one pass: resident layouts whose `u` + `dconv` fit
    /// in 48 KiB, `M ≤ 65535` (grid `(ntiles, M)`).
    Split { nv: usize, warps_per_row: u32 },
    /// One warp per tile row, the row resident in registers, correctly rounded σ: resident
    /// layouts where the split kernel does not fit (`u` + `dconv` over 48 KiB, or `M > 65535`).
    RowWarp { nv: usize },
    /// One warp per tile row streamed with 16-byte accesses: `d > 1024`, `d % 8 == 0`, aligned.
    StreamVec8,
    /// One warp per tile row streamed with scalar accesses: any `d`, any alignment.
    StreamScalar,
}

impl BwdMain {
    fn entry(self, bf16: bool) -> Result<&'static str> {
        match self {
            Self::Split { nv, .. } => entry(GateKernel::BwdSplit, bf16, nv),
            Self::RowWarp { nv } => entry(GateKernel::BwdRowWarp, bf16, nv),
            Self::StreamVec8 => entry(GateKernel::BwdStreamVec8, bf16, 0),
            Self::StreamScalar => entry(GateKernel::BwdStreamScalar, bf16, 0),
        }
    }
}

/// The backward's reduce kernel of a plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BwdReduce {
    /// 16-byte loads, a thread per 4 consecutive outputs (bitwise the scalar reduce at the same
    /// S: the same order of every sum).
    Vec4,
    /// A thread per output, 32 per segment row.
    Scalar,
}

impl BwdReduce {
    fn entry(self) -> Result<&'static str> {
        match self {
            Self::Vec4 => entry(GateKernel::BwdReduceVec4, true, 0),
            Self::Scalar => entry(GateKernel::BwdReduceScalar, true, 0),
        }
    }
}

/// What the backward launches for one call: the main kernel, then the reduce kernel as its
/// programmatic dependent.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BwdPlan {
    pub main: BwdMain,
    pub t_len: u32,
    pub d: u32,
    pub rows_per_block: u32,
    pub ntiles: u32,
    /// Partial-weight-gradient blocks (`M·ntiles`).
    pub blocks: u32,
    /// Where the row-warp kernels keep `dconv`: shared memory, or global scratch after the
    /// partials in the workspace.
    pub dconv_in_smem: bool,
    pub main_dims: LaunchDims,
    pub reduce: BwdReduce,
    pub reduce_dims: LaunchDims,
    /// f32 elements of the workspace.
    pub workspace_len: usize,
}

/// The backward's planner (`aligned`: every 16-bit buffer 16-byte aligned; `workspace_aligned`:
/// the workspace 16-byte aligned).
pub(crate) fn plan_bwd(shape: EngramGateShape, aligned: bool, workspace_aligned: bool) -> Result<BwdPlan> {
    shape.lens()?;
    let d = shape.d;
    let tune = bwd_tuning(d);
    let r = tune.rows_per_block;
    let sg = tune.reduce_segments;
    let ntiles = shape.t.div_ceil(r as usize);
    let nblocks = shape.m * ntiles;
    let blocks = u32::try_from(nblocks).map_err(|_| Error::Overflow { arg: "m", msg: format!("{nblocks} blocks") })?;
    let in_smem = bwd_scratch_in_smem(d, r);
    let mut workspace_len = checked_product("workspace", &[nblocks, GRAD_ROWS, d])?;
    if !in_smem {
        workspace_len += checked_product("workspace", &[nblocks, r as usize + 3, dpad(d)])?;
    }
    let nv = resident_nv(d, aligned);
    let row_warp_dims = LaunchDims {
        grid: (blocks, 1, 1),
        block: ((r + 6) * 32, 1, 1),
        shared_bytes: bwd_smem_bytes(d, r, in_smem) as u32,
    };
    let (main, main_dims) = match nv {
        Some(_) if bwd_u_fits(d, r) && shape.m <= 65535 => {
            let w = bwd_split_warps(d, r);
            let dims = LaunchDims {
                grid: (ntiles as u32, shape.m as u32, 1),
                block: ((r + 6) * w * 32, 1, 1),
                shared_bytes: bwd_split_smem_bytes(d, r, w) as u32,
            };
            (BwdMain::Split { nv: split_nv(d, w), warps_per_row: w }, dims)
        }
        Some(nv) => (BwdMain::RowWarp { nv }, row_warp_dims),
        None if d.is_multiple_of(8) && aligned => (BwdMain::StreamVec8, row_warp_dims),
        None => (BwdMain::StreamScalar, row_warp_dims),
    };
    let (reduce, reduce_dims) = match tune.reduce_vec4_threads {
        Some(xw) if d.is_multiple_of(4) && workspace_aligned => {
            let grid = ((GRAD_ROWS * d / 4).div_ceil(xw as usize) as u32, 1, 1);
            (BwdReduce::Vec4, LaunchDims { grid, block: (xw, sg, 1), shared_bytes: 16 * xw * sg })
        }
        _ => {
            let grid = ((GRAD_ROWS * d).div_ceil(32) as u32, 1, 1);
            (BwdReduce::Scalar, LaunchDims { grid, block: (32, sg, 1), shared_bytes: 4 * 32 * sg })
        }
    };
    Ok(BwdPlan {
        main,
        t_len: shape.t as u32,
        d: d as u32,
        rows_per_block: r,
        ntiles: ntiles as u32,
        blocks,
        dconv_in_smem: in_smem,
        main_dims,
        reduce,
        reduce_dims,
        workspace_len,
    })
}

/// Every PTX entry the planners launch over a grid of valid shapes that covers every row of
/// [`FWD_TUNING`] and [`BWD_TUNING`] and every fallback (d = 8, d % 8 ≠ 0, d > 1024, `u` +
/// `dconv` over 48 KiB, M > 65535, unaligned buffers or workspace), both dtypes; an error if a
/// planned block exceeds its kernel's thread limit on this device.
#[doc(hidden)]
pub fn planned_kernels(gpu: &Gpu) -> Result<BTreeSet<&'static str>> {
    let mut set = BTreeSet::new();
    let ds = [8, 13, 16, 200, 256, 264, 512, 520, 760, 768, 770, 800, 816, 824, 1000, 1024, 1032, 4096, 4100, 8192];
    for d in ds {
        for m in [1, 7, 65536] {
            for t in [1, 5, 257] {
                let shape = EngramGateShape { m, t, d };
                for aligned in [true, false] {
                    for bf16 in [true, false] {
                        let f = plan_fwd(shape, aligned)?;
                        set.insert(f.kernel.entry(bf16)?);
                        check_block_fits(gpu.function(f.kernel.entry(bf16)?)?, f.dims.block.0)?;
                        for workspace_aligned in [true, false] {
                            let p = plan_bwd(shape, aligned, workspace_aligned)?;
                            set.insert(p.main.entry(bf16)?);
                            set.insert(p.reduce.entry()?);
                            check_block_fits(gpu.function(p.main.entry(bf16)?)?, p.main_dims.block.0)?;
                        }
                    }
                }
            }
        }
    }
    Ok(set)
}

/// The PTX entries the planners launch for one call of each op (`aligned`: every 16-bit buffer
/// 16-byte aligned, `workspace_aligned` likewise for the backward's workspace): `[forward,
/// backward main, backward reduce]`. For tests that check a shape reaches the kernel it is
/// meant to.
#[doc(hidden)]
pub fn planned_entries(
    shape: EngramGateShape,
    bf16: bool,
    aligned: bool,
    workspace_aligned: bool,
) -> Result<[&'static str; 3]> {
    let p = plan_bwd(shape, aligned, workspace_aligned)?;
    Ok([plan_fwd(shape, aligned)?.kernel.entry(bf16)?, p.main.entry(bf16)?, p.reduce.entry()?])
}

/// Most threads per block of the split backward's two-chunk kernels (`_r2`, NV = 2): they use
/// 82–94 registers per thread, for which the driver allows 640–736 threads per block on sm_90
/// (a 27-warp block at d = 800 failed to launch). The GPU sweep in [`planned_kernels`] checks
/// every planned block against the driver's limit.
const SPLIT_NV2_MAX_THREADS: u32 = 576;

/// Warps per tile row of the split backward at `R` rows per block: enough for one 8-element
/// chunk per lane (`ceil(ceil(d/8)/32)`), as many as fit in 32 warps (`(R+6)·W ≤ 32`), at
/// least 1; blocks of the two-chunk kernels within [`SPLIT_NV2_MAX_THREADS`].
const fn bwd_split_warps(d: usize, rows_per_block: u32) -> u32 {
    let want = d.div_ceil(8).div_ceil(32);
    let want = if want < 1 { 1 } else { want as u32 };
    let cap = 32 / (rows_per_block + 6);
    let mut w = if want < cap { want } else { cap };
    if w < 1 {
        w = 1;
    }
    while w > 1 && split_nv(d, w) == 2 && (rows_per_block + 6) * w * 32 > SPLIT_NV2_MAX_THREADS {
        w -= 1;
    }
    w
}

/// Chunks per lane of the split backward's rows: `ceil(ceil(d/8) / (32·W))`, at least 1.
const fn split_nv(d: usize, w: u32) -> usize {
    let nv = d.div_ceil(8).div_ceil(32 * w as usize);
    if nv < 1 {
        1
    } else {
        nv
    }
}

/// Whether the split backward's `u` and `dconv` (with the scalars) fit in 48 KiB.
const fn bwd_u_fits(d: usize, r: u32) -> bool {
    bwd_scratch_in_smem(d, r) && bwd_smem_bytes(d, r, true) + 4 * (r as usize + 6) * dpad(d) <= SMEM_DEFAULT
}

/// Where the row-warp backward keeps `dconv` of a block's tile: shared memory when it fits in
/// 48 KiB.
const fn bwd_scratch_in_smem(d: usize, r: u32) -> bool {
    bwd_smem_bytes(d, r, true) <= SMEM_DEFAULT
}

/// Checks the kernel can run `threads` per block (its register use may allow fewer than 1024;
/// blocks of at most 256 threads fit every kernel here and skip the driver query).
fn check_block_fits(f: &cudarc::driver::CudaFunction, threads: u32) -> Result<()> {
    if threads <= 256 {
        return Ok(());
    }
    let max = f.max_threads_per_block()? as u32;
    if threads > max {
        return Err(Error::Shape {
            arg: "d",
            msg: format!("the planned block of {threads} threads exceeds the kernel's {max}"),
        });
    }
    Ok(())
}

fn is_bf16<T: Half>() -> Result<bool> {
    match T::NAME {
        "bf16" => Ok(true),
        "f16" => Ok(false),
        other => Err(Error::Shape { arg: "dtype", msg: format!("{other} is not f16 or bf16") }),
    }
}

/// `(1/d, 1/√d)` correctly rounded: the bits of the kernels' `div.rn(1, d)` and
/// `div.rn(1, sqrt.rn(d))`.
fn recip_d(d: u32) -> (f32, f32) {
    let df = d as f32;
    (1.0 / df, 1.0 / df.sqrt())
}

/// Launches a forward plan. `inputs` = `[h, k, v, rms_w_h, rms_w_v, conv_w]`, `outputs` =
/// `[y, vhat, alpha, rrms_h, rrms_k, rrms_v]`.
///
/// # Safety
/// As [`gate_conv_fwd_raw`].
unsafe fn launch_fwd(
    gpu: &Gpu,
    plan: &FwdPlan,
    bf16: bool,
    inputs: [CUdeviceptr; 6],
    outputs: [CUdeviceptr; 6],
    stream: CUstream,
) -> Result<()> {
    match fwd_launch(plan, bf16, inputs, outputs)? {
        GateFwdLaunch::Smem(p) => launch_planned(checked_function(gpu, &p)?, &p, stream),
        GateFwdLaunch::Tiled(p) => launch_planned(checked_function(gpu, &p)?, &p, stream),
    }
}

/// The planned kernel's function, checked to fit its block on a multiprocessor.
fn checked_function<'g, A>(gpu: &'g Gpu, p: &Planned<A>) -> Result<&'g cudarc::driver::CudaFunction> {
    let f = gpu.function(p.kernel)?;
    check_block_fits(f, p.dims.block.0)?;
    Ok(f)
}

/// The launch of an EngramGateConvFwd plan.
#[doc(hidden)]
#[derive(Clone, Copy, Debug)]
pub enum GateFwdLaunch {
    Smem(Planned<GateFwdSmemArgs>),
    Tiled(Planned<GateFwdArgs>),
}

/// The launch of a forward plan on these device addresses (see [`launch_fwd`]).
fn fwd_launch(
    plan: &FwdPlan,
    bf16: bool,
    inputs: [CUdeviceptr; 6],
    outputs: [CUdeviceptr; 6],
) -> Result<GateFwdLaunch> {
    let kernel = plan.kernel.entry(bf16)?;
    let dims = plan.dims;
    let [h, k, v, rms_w_h, rms_w_v, conv_w] = inputs.map(|p| p as *const u16);
    let [y, vhat, alpha, rrms_h, rrms_k, rrms_v] = outputs;
    let (y, vhat) = (y as *mut u16, vhat as *mut u16);
    let [alpha, rrms_h, rrms_k, rrms_v] = [alpha, rrms_h, rrms_k, rrms_v].map(|p| p as *mut f32);
    let (t_len, d, rows_per_block, eps) = (plan.t_len, plan.d, plan.rows_per_block, EPS);
    Ok(match plan.kernel {
        FwdKernel::Smem { .. } => {
            let (inv_d, inv_sqrt_d) = recip_d(d);
            let chunk_magic = chunk_row_magic(d as usize);
            let args = GateFwdSmemArgs {
                h,
                k,
                v,
                rms_w_h,
                rms_w_v,
                conv_w,
                y,
                vhat,
                alpha,
                rrms_h,
                rrms_k,
                rrms_v,
                t_len,
                d,
                rows_per_block,
                inv_d,
                inv_sqrt_d,
                chunk_magic,
                eps,
            };
            GateFwdLaunch::Smem(Planned { kernel, dims, args, dependent: false })
        }
        FwdKernel::SmemGrid1d { .. } | FwdKernel::StreamVec8 | FwdKernel::StreamScalar => {
            let args = GateFwdArgs {
                h,
                k,
                v,
                rms_w_h,
                rms_w_v,
                conv_w,
                y,
                vhat,
                alpha,
                rrms_h,
                rrms_k,
                rrms_v,
                t_len,
                d,
                rows_per_block,
                ntiles: plan.ntiles,
                eps,
            };
            GateFwdLaunch::Tiled(Planned { kernel, dims, args, dependent: false })
        }
    })
}

/// Launches a backward plan: the main kernel, then the reduce kernel as its programmatic
/// dependent. `inputs` = `[dy, h, k, v, rms_w_h, rms_w_v, conv_w]`, `saved` = `[alpha, rrms_h,
/// rrms_k]`, `outputs` = `[dh, dk, dv, drms_w_h, drms_w_v, dconv_w]`; `workspace` holds
/// `plan.workspace_len` f32.
///
/// # Safety
/// As [`gate_conv_bwd_raw`].
#[allow(clippy::too_many_arguments)]
unsafe fn launch_bwd(
    gpu: &Gpu,
    plan: &BwdPlan,
    bf16: bool,
    inputs: [CUdeviceptr; 7],
    saved: [CUdeviceptr; 3],
    workspace: CUdeviceptr,
    outputs: [CUdeviceptr; 6],
    stream: CUstream,
) -> Result<()> {
    let (main, reduce) = bwd_launches(plan, bf16, inputs, saved, workspace, outputs)?;
    match main {
        GateBwdMainLaunch::Split(p) => {
            let f = checked_function(gpu, &p)?;
            // the split kernel's shared memory may pass 48 KiB (d = 768, R = 3: ≈ 54 KiB)
            let attr = cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
            let bytes = p.dims.shared_bytes as usize;
            if bytes > SMEM_DEFAULT && f.get_attribute(attr)? < bytes as i32 {
                f.set_attribute(attr, bytes as i32)?;
            }
            launch_planned(f, &p, stream)?;
        }
        GateBwdMainLaunch::Tiled(p) => launch_planned(checked_function(gpu, &p)?, &p, stream)?,
    }
    // the reduce kernel waits for the main kernel's partials with `griddepcontrol.wait`; its
    // launch and start-up overlap the main kernel (bitwise the same outputs as a plain launch)
    launch_planned(gpu.function(reduce.kernel)?, &reduce, stream)
}

/// The main kernel's launch of an EngramGateConvBwd plan.
#[doc(hidden)]
#[derive(Clone, Copy, Debug)]
pub enum GateBwdMainLaunch {
    Split(Planned<GateBwdSplitArgs>),
    Tiled(Planned<GateBwdArgs>),
}

/// The two launches of a backward plan on these device addresses (see [`launch_bwd`]).
fn bwd_launches(
    plan: &BwdPlan,
    bf16: bool,
    inputs: [CUdeviceptr; 7],
    saved: [CUdeviceptr; 3],
    workspace: CUdeviceptr,
    outputs: [CUdeviceptr; 6],
) -> Result<(GateBwdMainLaunch, Planned<GateBwdReduceArgs>)> {
    let (kernel, dims) = (plan.main.entry(bf16)?, plan.main_dims);
    let [dy, h, k, v, rms_w_h, rms_w_v, conv_w] = inputs.map(|p| p as *const u16);
    let [alpha, rrms_h, rrms_k] = saved.map(|p| p as *const f32);
    let [dh, dk, dv, drms_w_h, drms_w_v, dconv_w] = outputs;
    let [dh, dk, dv] = [dh, dk, dv].map(|p| p as *mut u16);
    let [drms_w_h, drms_w_v, dconv_w] = [drms_w_h, drms_w_v, dconv_w].map(|p| p as *mut f32);
    let part = workspace as *mut f32;
    let (t_len, d, rows_per_block, eps) = (plan.t_len, plan.d, plan.rows_per_block, EPS);
    let main = match plan.main {
        BwdMain::Split { warps_per_row, .. } => {
            let (inv_d, inv_sqrt_d) = recip_d(d);
            let args = GateBwdSplitArgs {
                dy,
                h,
                k,
                v,
                rms_w_h,
                rms_w_v,
                conv_w,
                alpha,
                rrms_h,
                rrms_k,
                dh,
                dk,
                dv,
                part,
                t_len,
                d,
                rows_per_block,
                warps_per_row,
                warp_row_magic: warp_row_magic(warps_per_row),
                inv_sqrt_d,
                inv_d,
                eps,
            };
            GateBwdMainLaunch::Split(Planned { kernel, dims, args, dependent: false })
        }
        BwdMain::RowWarp { .. } | BwdMain::StreamVec8 | BwdMain::StreamScalar => {
            // dconv in shared memory, else in the workspace after the partials
            let scratch = if plan.dconv_in_smem {
                DconvScratch::Shared
            } else {
                DconvScratch::Global(part.wrapping_add(plan.blocks as usize * GRAD_ROWS * d as usize))
            };
            let scratch = scratch.arg();
            let args = GateBwdArgs {
                dy,
                h,
                k,
                v,
                rms_w_h,
                rms_w_v,
                conv_w,
                alpha,
                rrms_h,
                rrms_k,
                dh,
                dk,
                dv,
                part,
                scratch,
                t_len,
                d,
                rows_per_block,
                ntiles: plan.ntiles,
                eps,
            };
            GateBwdMainLaunch::Tiled(Planned { kernel, dims, args, dependent: false })
        }
    };
    let args = GateBwdReduceArgs { part, drms_w_h, drms_w_v, dconv_w, nblocks: plan.blocks, d };
    Ok((main, Planned { kernel: plan.reduce.entry()?, dims: plan.reduce_dims, args, dependent: true }))
}

/// The inputs of [`gate_conv_fwd`] (docs/ops.md §4; `h` is the op's `H`): `h, k, v` `[M,T,d]`,
/// `rms_w_h, rms_w_v` `[d]`, `conv_w` `[4,d]`, all dtype `T`. Any `cudarc` buffer or view.
pub struct GateConvFwdInputs<'a, T> {
    pub h: &'a dyn DevicePtr<T>,
    pub k: &'a dyn DevicePtr<T>,
    pub v: &'a dyn DevicePtr<T>,
    pub rms_w_h: &'a dyn DevicePtr<T>,
    pub rms_w_v: &'a dyn DevicePtr<T>,
    pub conv_w: &'a dyn DevicePtr<T>,
}

/// The outputs of [`gate_conv_fwd`] (docs/ops.md §4; `y` is the op's `Y`): `y, vhat`
/// `[M,T,d]` dtype `T`; `alpha, rrms_h, rrms_k, rrms_v` `[M,T]` f32 (what the backward takes).
pub struct GateConvFwdOutputs<'a, T> {
    pub y: &'a mut dyn DevicePtrMut<T>,
    pub vhat: &'a mut dyn DevicePtrMut<T>,
    pub alpha: &'a mut dyn DevicePtrMut<f32>,
    pub rrms_h: &'a mut dyn DevicePtrMut<f32>,
    pub rrms_k: &'a mut dyn DevicePtrMut<f32>,
    pub rrms_v: &'a mut dyn DevicePtrMut<f32>,
}

/// The inputs of [`gate_conv_bwd`] (docs/ops.md §5; `dy, h` are the op's `dY, H`): `dy, h, k,
/// v, vhat` `[M,T,d]`, `rms_w_h, rms_w_v` `[d]`, `conv_w` `[4,d]`, dtype `T`; the forward's
/// `alpha, rrms_h, rrms_k, rrms_v` `[M,T]` f32.
pub struct GateConvBwdInputs<'a, T> {
    pub dy: &'a dyn DevicePtr<T>,
    pub h: &'a dyn DevicePtr<T>,
    pub k: &'a dyn DevicePtr<T>,
    pub v: &'a dyn DevicePtr<T>,
    pub vhat: &'a dyn DevicePtr<T>,
    pub rms_w_h: &'a dyn DevicePtr<T>,
    pub rms_w_v: &'a dyn DevicePtr<T>,
    pub conv_w: &'a dyn DevicePtr<T>,
    pub alpha: &'a dyn DevicePtr<f32>,
    pub rrms_h: &'a dyn DevicePtr<f32>,
    pub rrms_k: &'a dyn DevicePtr<f32>,
    pub rrms_v: &'a dyn DevicePtr<f32>,
}

/// The outputs of [`gate_conv_bwd`] (docs/ops.md §5; `dh` is the op's `dH`): `dh, dk, dv`
/// `[M,T,d]` dtype `T`; `drms_w_h, drms_w_v` `[d]` and `dconv_w` `[4,d]` f32.
pub struct GateConvBwdOutputs<'a, T> {
    pub dh: &'a mut dyn DevicePtrMut<T>,
    pub dk: &'a mut dyn DevicePtrMut<T>,
    pub dv: &'a mut dyn DevicePtrMut<T>,
    pub drms_w_h: &'a mut dyn DevicePtrMut<f32>,
    pub drms_w_v: &'a mut dyn DevicePtrMut<f32>,
    pub dconv_w: &'a mut dyn DevicePtrMut<f32>,
}

// Shared references only: copyable without bounds on `T`.
impl<T> Clone for GateConvFwdInputs<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for GateConvFwdInputs<'_, T> {}
impl<T> Clone for GateConvBwdInputs<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for GateConvBwdInputs<'_, T> {}

/// f32 elements of the workspace [`gate_conv_bwd`] needs for `shape`: per-block partial weight
/// gradients `[blocks, 6, d]`, plus `[blocks, R+3, ceil(d/8)·8]` for `dconv` where it does not
/// fit in shared memory (large `d`).
pub fn bwd_workspace_len(shape: EngramGateShape) -> Result<usize> {
    Ok(plan_bwd(shape, true, true)?.workspace_len)
}

/// EngramGateConvFwd (docs/ops.md §4), for `T` = [`crate::f16`] or [`crate::bf16`].
///
/// [`GateConvFwdInputs`] (row-major, contiguous, dtype `T`): `h, k, v` `[M,T,d]`; `rms_w_h,
/// rms_w_v` `[d]`; `conv_w` `[4,d]`. [`GateConvFwdOutputs`]: `y, vhat` `[M,T,d]` (`T`), `alpha, rrms_h, rrms_k, rrms_v`
/// `[M,T]` f32. All arithmetic f32, `eps` = 1e-6; `y = q(silu(conv) + vh)` with the
/// unrounded `vh`, `u` formed from the rounded `vhat`. Buffers may be larger than needed; a
/// 16-byte-aligned layout with `d % 8 == 0` takes the vectorised kernels. One launch on
/// [`Gpu::stream`]; asynchronous.
///
/// Errors: [`Error::Shape`] for a zero size, [`Error::BufferTooSmall`] naming the buffer (its
/// field name), [`Error::Overflow`], or a driver error from the launch.
///
/// ```no_run
/// use rgk::{bf16, Gpu};
/// use rgk::engram::{gate_conv_fwd, EngramGateShape, GateConvFwdInputs, GateConvFwdOutputs};
/// # fn main() -> Result<(), rgk::Error> {
/// let gpu = Gpu::new(0)?;
/// let s = EngramGateShape { m: 2, t: 64, d: 512 };
/// let (n, rows) = s.lens()?;
/// let st = gpu.stream();
/// let x = st.alloc_zeros::<bf16>(n)?;
/// let w = st.alloc_zeros::<bf16>(4 * s.d)?;
/// let (mut y, mut vhat) = (st.alloc_zeros::<bf16>(n)?, st.alloc_zeros::<bf16>(n)?);
/// let mut f = [(); 4].map(|_| st.alloc_zeros::<f32>(rows).unwrap());
/// let [alpha, rrms_h, rrms_k, rrms_v] = &mut f;
/// let inputs = GateConvFwdInputs { h: &x, k: &x, v: &x, rms_w_h: &w, rms_w_v: &w, conv_w: &w };
/// let outputs = GateConvFwdOutputs { y: &mut y, vhat: &mut vhat, alpha, rrms_h, rrms_k, rrms_v };
/// gate_conv_fwd(&gpu, s, inputs, outputs)?;
/// # Ok(()) }
/// ```
pub fn gate_conv_fwd<T: Half>(
    gpu: &Gpu,
    shape: EngramGateShape,
    inputs: GateConvFwdInputs<'_, T>,
    outputs: GateConvFwdOutputs<'_, T>,
) -> Result<()> {
    let (n, rows) = shape.lens()?;
    let d = shape.d;
    let GateConvFwdInputs { h, k, v, rms_w_h, rms_w_v, conv_w } = inputs;
    let GateConvFwdOutputs { y, vhat, alpha, rrms_h, rrms_k, rrms_v } = outputs;
    check_len("h", n, h.len())?;
    check_len("k", n, k.len())?;
    check_len("v", n, v.len())?;
    check_len("rms_w_h", d, rms_w_h.len())?;
    check_len("rms_w_v", d, rms_w_v.len())?;
    check_len("conv_w", KERNEL_SIZE * d, conv_w.len())?;
    check_len("y", n, y.len())?;
    check_len("vhat", n, vhat.len())?;
    check_len("alpha", rows, alpha.len())?;
    check_len("rrms_h", rows, rrms_h.len())?;
    check_len("rrms_k", rows, rrms_k.len())?;
    check_len("rrms_v", rows, rrms_v.len())?;
    let st = gpu.stream();
    let (ph, _g0) = h.device_ptr(st);
    let (pk, _g1) = k.device_ptr(st);
    let (pv, _g2) = v.device_ptr(st);
    let (pwh, _g3) = rms_w_h.device_ptr(st);
    let (pwv, _g4) = rms_w_v.device_ptr(st);
    let (pcw, _g5) = conv_w.device_ptr(st);
    let (py, _g6) = y.device_ptr_mut(st);
    let (pq, _g7) = vhat.device_ptr_mut(st);
    let (pa, _g8) = alpha.device_ptr_mut(st);
    let (prh, _g9) = rrms_h.device_ptr_mut(st);
    let (prk, _g10) = rrms_k.device_ptr_mut(st);
    let (prv, _g11) = rrms_v.device_ptr_mut(st);
    // SAFETY: every buffer was checked to hold the elements the shape addresses.
    unsafe { gate_conv_fwd_raw::<T>(gpu, shape, ph, pk, pv, pwh, pwv, pcw, py, pq, pa, prh, prk, prv, st.cu_stream()) }
}

/// [`gate_conv_fwd`] on raw device pointers, launched on `stream`.
///
/// # Safety
/// Each pointer must address device memory of `gpu`'s context holding at least the elements
/// [`gate_conv_fwd`] lists for `shape`, valid until the kernel finishes; outputs must not
/// overlap each other or the inputs. Shapes are still validated.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gate_conv_fwd_raw<T: Half>(
    gpu: &Gpu,
    shape: EngramGateShape,
    h: CUdeviceptr,
    k: CUdeviceptr,
    v: CUdeviceptr,
    rms_w_h: CUdeviceptr,
    rms_w_v: CUdeviceptr,
    conv_w: CUdeviceptr,
    y: CUdeviceptr,
    vhat: CUdeviceptr,
    alpha: CUdeviceptr,
    rrms_h: CUdeviceptr,
    rrms_k: CUdeviceptr,
    rrms_v: CUdeviceptr,
    stream: CUstream,
) -> Result<()> {
    let inputs = [h, k, v, rms_w_h, rms_w_v, conv_w];
    let outputs = [y, vhat, alpha, rrms_h, rrms_k, rrms_v];
    let bf16 = is_bf16::<T>()?;
    let aligned = inputs.iter().chain(&outputs[..2]).all(|p| p % 16 == 0);
    let plan = plan_fwd(shape, aligned)?;
    launch_fwd(gpu, &plan, bf16, inputs, outputs, stream)
}

/// The launch [`gate_conv_fwd_raw`] submits for `shape` on these device addresses
/// (`inputs` = `[h, k, v, rms_w_h, rms_w_v, conv_w]`, `outputs` = `[y, vhat, alpha, rrms_h,
/// rrms_k, rrms_v]`).
#[doc(hidden)]
pub fn gate_conv_fwd_launch<T: Half>(
    shape: EngramGateShape,
    inputs: [CUdeviceptr; 6],
    outputs: [CUdeviceptr; 6],
) -> Result<GateFwdLaunch> {
    let aligned = inputs.iter().chain(&outputs[..2]).all(|p| p % 16 == 0);
    fwd_launch(&plan_fwd(shape, aligned)?, is_bf16::<T>()?, inputs, outputs)
}

/// EngramGateConvBwd (docs/ops.md §5), for `T` = [`crate::f16`] or [`crate::bf16`]: the exact
/// gradients of `L = Σ dY·Y` with `Y` the f32 forward, the rounding `q` taken as the identity.
///
/// [`GateConvBwdInputs`] (dtype `T` unless said): `dy, h, k, v, vhat` `[M,T,d]`; `rms_w_h, rms_w_v` `[d]`;
/// `conv_w` `[4,d]`; `alpha, rrms_h, rrms_k, rrms_v` `[M,T]` f32 as the forward returned them.
/// Because `q` is the identity here, `vh = alpha·v` and its rrms are recomputed in f32 from
/// `v` and `alpha`: `vhat` and `rrms_v` (which carry the forward's rounding) are validated but
/// not read. `workspace`: at least [`bwd_workspace_len`] f32 (contents ignored, overwritten).
/// [`GateConvBwdOutputs`]: `dh, dk, dv` `[M,T,d]` (`T`); `drms_w_h, drms_w_v` `[d]`, `dconv_w`
/// `[4,d]` f32, sums over all M·T rows reduced in a fixed order (bitwise deterministic). Two launches on
/// [`Gpu::stream`]; asynchronous.
///
/// Errors: as [`gate_conv_fwd`], and [`Error::BufferTooSmall`] for `workspace`.
pub fn gate_conv_bwd<T: Half>(
    gpu: &Gpu,
    shape: EngramGateShape,
    inputs: GateConvBwdInputs<'_, T>,
    workspace: &mut impl DevicePtrMut<f32>,
    outputs: GateConvBwdOutputs<'_, T>,
) -> Result<()> {
    let GateConvBwdInputs { dy, h, k, v, vhat, rms_w_h, rms_w_v, conv_w, alpha, rrms_h, rrms_k, rrms_v } = inputs;
    let GateConvBwdOutputs { dh, dk, dv, drms_w_h, drms_w_v, dconv_w } = outputs;
    let (n, rows) = shape.lens()?;
    let d = shape.d;
    check_len("dy", n, dy.len())?;
    check_len("h", n, h.len())?;
    check_len("k", n, k.len())?;
    check_len("v", n, v.len())?;
    check_len("vhat", n, vhat.len())?;
    check_len("rms_w_h", d, rms_w_h.len())?;
    check_len("rms_w_v", d, rms_w_v.len())?;
    check_len("conv_w", KERNEL_SIZE * d, conv_w.len())?;
    check_len("alpha", rows, alpha.len())?;
    check_len("rrms_h", rows, rrms_h.len())?;
    check_len("rrms_k", rows, rrms_k.len())?;
    check_len("rrms_v", rows, rrms_v.len())?;
    check_len("workspace", bwd_workspace_len(shape)?, workspace.len())?;
    check_len("dh", n, dh.len())?;
    check_len("dk", n, dk.len())?;
    check_len("dv", n, dv.len())?;
    check_len("drms_w_h", d, drms_w_h.len())?;
    check_len("drms_w_v", d, drms_w_v.len())?;
    check_len("dconv_w", KERNEL_SIZE * d, dconv_w.len())?;
    let st = gpu.stream();
    let (pg, _g0) = dy.device_ptr(st);
    let (ph, _g1) = h.device_ptr(st);
    let (pk, _g2) = k.device_ptr(st);
    let (pv, _g3) = v.device_ptr(st);
    let (pwh, _g4) = rms_w_h.device_ptr(st);
    let (pwv, _g5) = rms_w_v.device_ptr(st);
    let (pcw, _g6) = conv_w.device_ptr(st);
    let (pa, _g7) = alpha.device_ptr(st);
    let (prh, _g8) = rrms_h.device_ptr(st);
    let (prk, _g9) = rrms_k.device_ptr(st);
    let (pws, _g10) = workspace.device_ptr_mut(st);
    let (pdh, _g11) = dh.device_ptr_mut(st);
    let (pdk, _g12) = dk.device_ptr_mut(st);
    let (pdv, _g13) = dv.device_ptr_mut(st);
    let (pdwh, _g14) = drms_w_h.device_ptr_mut(st);
    let (pdwv, _g15) = drms_w_v.device_ptr_mut(st);
    let (pdcw, _g16) = dconv_w.device_ptr_mut(st);
    // SAFETY: every buffer was checked to hold the elements the shape addresses.
    unsafe {
        run_bwd::<T>(
            gpu,
            shape,
            [pg, ph, pk, pv, pwh, pwv, pcw],
            [pa, prh, prk],
            pws,
            [pdh, pdk, pdv, pdwh, pdwv, pdcw],
            st.cu_stream(),
        )
    }
}

/// EngramGateConvBwd for one shape, submitting each call's two launches as one CUDA graph:
/// captured on the first call with a set of pointers, replayed when the same pointers recur (up
/// to 32 sets cached), so the reduce kernel's programmatic dependent launch overlaps the main
/// kernel (separate host launches reach the device too far apart for that). Inside a caller's
/// own stream capture the launches go straight into that capture.
pub struct GateConvBwdPlan {
    shape: EngramGateShape,
    graph: GraphReplay,
}

impl GateConvBwdPlan {
    /// Errors: those of [`EngramGateShape::lens`].
    pub fn new(shape: EngramGateShape) -> Result<Self> {
        shape.lens()?;
        Ok(Self { shape, graph: GraphReplay::new() })
    }

    /// [`gate_conv_bwd_raw`] with this plan's shape, through the plan's graph: `inputs` =
    /// `[dy, h, k, v, rms_w_h, rms_w_v, conv_w]`, `saved` = `[alpha, rrms_h, rrms_k]`, `outputs`
    /// = `[dh, dk, dv, drms_w_h, drms_w_v, dconv_w]`. Errors: those of [`gate_conv_bwd_raw`],
    /// or a driver error.
    ///
    /// # Safety
    /// As [`gate_conv_bwd_raw`]; calls with one plan must be stream-ordered.
    pub unsafe fn run_raw<T: Half>(
        &mut self,
        gpu: &Gpu,
        inputs: [CUdeviceptr; 7],
        saved: [CUdeviceptr; 3],
        workspace: CUdeviceptr,
        outputs: [CUdeviceptr; 6],
        stream: CUstream,
    ) -> Result<()> {
        let shape = self.shape;
        let call = |s| run_bwd::<T>(gpu, shape, inputs, saved, workspace, outputs, s);
        let mut key = vec![is_bf16::<T>()? as u64, workspace];
        key.extend(inputs.iter().chain(&saved).chain(&outputs));
        self.graph.run(gpu, stream, key, call)
    }
}

/// [`gate_conv_bwd`] on raw device pointers, launched on `stream`. `vhat` and `rrms_v` are not
/// read (see [`gate_conv_bwd`]) and are not taken.
///
/// # Safety
/// Each pointer must address device memory of `gpu`'s context holding at least the elements
/// [`gate_conv_bwd`] lists for `shape` (`workspace`: [`bwd_workspace_len`] f32), valid until
/// the kernels finish; outputs and workspace must not overlap each other or the inputs.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gate_conv_bwd_raw<T: Half>(
    gpu: &Gpu,
    shape: EngramGateShape,
    dy: CUdeviceptr,
    h: CUdeviceptr,
    k: CUdeviceptr,
    v: CUdeviceptr,
    rms_w_h: CUdeviceptr,
    rms_w_v: CUdeviceptr,
    conv_w: CUdeviceptr,
    alpha: CUdeviceptr,
    rrms_h: CUdeviceptr,
    rrms_k: CUdeviceptr,
    workspace: CUdeviceptr,
    dh: CUdeviceptr,
    dk: CUdeviceptr,
    dv: CUdeviceptr,
    drms_w_h: CUdeviceptr,
    drms_w_v: CUdeviceptr,
    dconv_w: CUdeviceptr,
    stream: CUstream,
) -> Result<()> {
    run_bwd::<T>(
        gpu,
        shape,
        [dy, h, k, v, rms_w_h, rms_w_v, conv_w],
        [alpha, rrms_h, rrms_k],
        workspace,
        [dh, dk, dv, drms_w_h, drms_w_v, dconv_w],
        stream,
    )
}

/// Plans and launches the backward on raw pointers (see [`launch_bwd`]).
///
/// # Safety
/// As [`gate_conv_bwd_raw`].
unsafe fn run_bwd<T: Half>(
    gpu: &Gpu,
    shape: EngramGateShape,
    inputs: [CUdeviceptr; 7],
    saved: [CUdeviceptr; 3],
    workspace: CUdeviceptr,
    outputs: [CUdeviceptr; 6],
    stream: CUstream,
) -> Result<()> {
    let bf16 = is_bf16::<T>()?;
    let aligned = inputs.iter().chain(&outputs[..3]).all(|p| p % 16 == 0);
    let plan = plan_bwd(shape, aligned, workspace.is_multiple_of(16))?;
    launch_bwd(gpu, &plan, bf16, inputs, saved, workspace, outputs, stream)
}

/// The two launches [`gate_conv_bwd_raw`] submits for `shape` on these device addresses
/// (`inputs` = `[dy, h, k, v, rms_w_h, rms_w_v, conv_w]`, `saved` = `[alpha, rrms_h, rrms_k]`,
/// `outputs` = `[dh, dk, dv, drms_w_h, drms_w_v, dconv_w]`).
#[doc(hidden)]
pub fn gate_conv_bwd_launches<T: Half>(
    shape: EngramGateShape,
    inputs: [CUdeviceptr; 7],
    saved: [CUdeviceptr; 3],
    workspace: CUdeviceptr,
    outputs: [CUdeviceptr; 6],
) -> Result<(GateBwdMainLaunch, Planned<GateBwdReduceArgs>)> {
    let aligned = inputs.iter().chain(&outputs[..3]).all(|p| p % 16 == 0);
    let plan = plan_bwd(shape, aligned, workspace.is_multiple_of(16))?;
    bwd_launches(&plan, is_bf16::<T>()?, inputs, saved, workspace, outputs)
}
