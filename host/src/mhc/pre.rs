//! MHCPreFwd (docs/ops.md §2): the mHC pre-layer projection, Sinkhorn normalisation and stream
//! mixing — by default in two launches on one stream submitted as a CUDA graph (the second a
//! programmatic dependent launch), the split-K partials summed as integer fixed-point limbs
//! (`PreConfig::fixed_point`: order-independent, so bitwise reproducible); optionally in one
//! launch of a thread-block cluster or one cooperative launch with a grid barrier
//! (`kernels-gpu/src/mhc/pre.rs` describes the kernels).
use cudarc::driver::{sys, sys::CUdeviceptr, sys::CUstream, CudaSlice, DevicePtr, DevicePtrMut};
use half::bf16;

use crate::error::{check_len, check_positive, checked_product};
use crate::runtime::{
    launch, launch_cluster, launch_cooperative, launch_pdl, max_active_clusters, GraphReplay, KernelArg, LaunchDims,
};
use crate::{Error, Gpu, Result};

pub(crate) const KERNEL_PARTIAL: &str = "mhc_pre_partial";
pub(crate) const KERNEL_MIX: &str = "mhc_pre_mix";
pub(crate) const KERNEL_FUSED: &str = "mhc_pre_fused";
pub(crate) const KERNEL_PARTIAL_MMA: &str = "mhc_pre_partial_mma";
pub(crate) const KERNEL_MIX4: &str = "mhc_pre_mix4";
pub(crate) const KERNEL_PARTIAL_MMA5: &str = "mhc_pre_partial_mma5";
pub(crate) const KERNEL_MIX5: &str = "mhc_pre_mix5";
pub(crate) const KERNEL_PARTIAL_MMA5_TS: &str = "mhc_pre_partial_mma5_ts";
pub(crate) const KERNEL_MIX5_TS: &str = "mhc_pre_mix5_ts";

/// u64 stamps per block of `mhc_pre_partial_mma5_ts` (the kernel's `MMA5_STAMPS`): entry, slab
/// and x staged, MMA tiles in shared memory, last partial store issued.
pub const MMA5_STAMPS: usize = 4;
/// u64 stamps per block of `mhc_pre_mix5_ts` (the kernel's `MIX5_STAMPS`): entry, prologue done,
/// `griddepcontrol.wait` returned, partials loaded, logits summed, coefficients broadcast,
/// outputs stored (issued), SM id.
pub const MIX5_STAMPS: usize = 8;
pub(crate) const KERNEL_COOP: &str = "mhc_pre_coop";
pub(crate) const KERNEL_PARTIAL_FX: &str = "mhc_pre_partial_fx";
pub(crate) const KERNEL_MIX_FX: &str = "mhc_pre_mix_fx";
pub(crate) const KERNELS: &[&str] = &[
    KERNEL_PARTIAL,
    KERNEL_MIX,
    KERNEL_FUSED,
    KERNEL_PARTIAL_MMA,
    KERNEL_MIX4,
    KERNEL_PARTIAL_MMA5,
    KERNEL_MIX5,
    KERNEL_PARTIAL_MMA5_TS,
    KERNEL_MIX5_TS,
    KERNEL_COOP,
    KERNEL_PARTIAL_FX,
    KERNEL_MIX_FX,
];
/// Largest n of the lean kernel 2 (`mhc_pre_mix4`: a padded 4×4 R in one warp's registers).
const NMAX_MIX4: usize = 4;
/// Bytes of `mhc_pre_mix4`'s shared memory before its x tile (`tot[32]` f64, `hs[4]`, `ra[16]`).
const MIX4_SMEM_HEAD: usize = 336;

/// `mhc_pre_mix5`'s dynamic shared memory (mirror of the kernel's `mix5_smem`): `ssw[32]` f64,
/// then one f64 per thread.
pub fn mix5_smem_bytes(block: usize) -> usize {
    256 + 8 * block
}

/// Batch rows per group in kernel 1 (the kernel's `BT`).
const BT: usize = 4;
/// x elements per thread in kernel 2's tile (the kernel's `UN`).
const UN: usize = 8;
/// Largest kernel-1 grid (keeps kernel 2's partial reads small).
const MAX_GRID: usize = 256;
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

/// The scalar parameters of docs/ops.md §2.
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

/// Which implementation [`MhcPre`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrePath {
    /// One launch of a thread-block cluster when the shape fits it (n ≤ 4; each block's phi slab,
    /// x columns and partials in shared memory; a schedulable cluster), else two launches.
    Auto,
    /// One launch of a thread-block cluster; a shape that does not fit is an error.
    Fused,
    /// Two ordinary launches (split-K partials through a workspace, then reduce and mix): any shape.
    TwoLaunch,
}

/// Launch configuration (tuning; [`Default`] is the measured choice).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PreConfig {
    /// The implementation.
    pub path: PrePath,
    /// One-launch path: the largest cluster (blocks along the channels), 1..=16; sizes above 8
    /// need the device's non-portable cluster support (the plan falls back to smaller ones).
    pub cluster: u32,
    /// One-launch path: batch rows per cluster (clusters run side by side along the batch);
    /// 0 = 8 (one group of the kernel's 8 rows per cluster).
    pub batch_per_cluster: u32,
    /// One-launch path: threads per block, a multiple of 32 in `32..=512`.
    pub fused_block: u32,
    /// Threads per block of kernel 1 (split-K partials), a multiple of 32 in 32..=1024.
    pub block: u32,
    /// Upper bound on kernel 1's grid (blocks); `None` = the device's SM count. Capped at 256.
    pub max_grid: Option<u32>,
    /// Threads per block of kernel 2 (reduction, coefficients, mixing), a multiple of 32 in
    /// 32..=1024; each block mixes up to this many channel columns of one batch row. 0 = by rule:
    /// 256 with `fixed_point`, else 512 (the planned value is `PreGeometry::mix_block`).
    pub mix_block: u32,
    /// Two-launch path: kernel 1 on fp64 tensor cores (`mhc_pre_partial_mma`) where the shape
    /// allows it (n ≤ 4, the block's slab within shared memory), else the FMA kernel.
    pub mma_partials: bool,
    /// Threads per block of the tensor-core kernel 1, a multiple of 32 in 32..=512; 0 = by rule
    /// ([`auto_mma_block`]: 256, or 512 when one round of its slot sums needs more threads).
    pub mma_block: u32,
    /// Launch kernel 2 as a programmatic dependent launch (its start-up and x loads overlap
    /// kernel 1; it waits for kernel 1's partials in `griddepcontrol.wait`).
    pub pdl: bool,
    /// Two-launch path, n ≤ 4: kernel 2 is the lean `mhc_pre_mix4` (one warp per quantity's
    /// partial sum, coefficients and Sinkhorn in one warp's registers); else `mhc_pre_mix`.
    pub lean_mix: bool,
    /// Two-launch path with the tensor-core kernel 1: launch it in thread-block clusters of up
    /// to this many blocks (a power of two dividing its grid, ≤ 16); each cluster's rank-0 block
    /// sums the cluster's partials through distributed shared memory, so kernel 2 reads
    /// `G / cluster` partials per quantity instead of `G`. 1 = no clusters.
    pub partial_cluster: u32,
    /// [`MhcPre::run`] submits the call's kernels as one CUDA graph (captured on the first call
    /// and replayed while the buffers and parameters are unchanged), so kernel 2's dependent
    /// launch can overlap kernel 1. Not used by the raw entry [`pre_fwd_raw`].
    pub graph: bool,
    /// Two-launch path, v5 (n ≤ 4, tensor-core kernel 1, batch ≤ 65535; else ignored): kernel 1
    /// `mhc_pre_partial_mma5` stores its partials block-major (`[g][β][q]`, straight from the
    /// slot sums), kernel 2 `mhc_pre_mix5` computes r from x and each thread's column before
    /// `griddepcontrol.wait`, then one load round, one barrier, the coefficients in every warp's
    /// registers and the mixing from registers. Kernel 2's tiles are `mix_block` columns (one
    /// per thread); `partial_cluster` is ignored.
    pub v5: bool,
    /// v6, one cooperative launch (`mhc_pre_coop`, where the shape allows: n ≤ 4, the tensor-core
    /// kernel 1's slab within shared memory, the grid co-resident; else the v5 pair): the v5
    /// kernel 1's partials, a grid-wide barrier instead of the second launch, then v5 kernel 2's
    /// chain, each block mixing `⌈c/tiles⌉` columns of one batch row. Grid: kernel 1's
    /// (`max_grid`), block `mma_block`. Needs no graph (one launch).
    pub coop: bool,
    /// Diagnostic (the v5 and v8 pairs; 0 = off): the device address of a u64 buffer that receives
    /// `%globaltimer` stamps (ns) — kernel 1's blocks first ([`MMA5_STAMPS`] words each, `grid ×
    /// groups` blocks), then kernel 2's ([`MIX5_STAMPS`] each, `tiles × batch` blocks) — from
    /// the `_ts` twins of the v5 kernels, which also run the v8 bodies (same arithmetic, same
    /// outputs). See
    /// [`PreGeometry::stamp_words`].
    pub stamps: u64,
    /// v8 (with the v5 pair where it applies): deterministic fixed-point
    /// split-K sums. Kernel 1 (`mhc_pre_partial_fx`) adds each block partial as four 48-bit
    /// integer limbs (`red.global.add.u64`; range 2^-64 … 2^128) into one accumulator per
    /// (batch row, logit) instead of storing `G` partials; kernel 2 (`mhc_pre_mix_fx`) loads
    /// one accumulator per lane after `griddepcontrol.wait` — no cross-warp sum, no barrier.
    /// Integer addition is associative: bitwise reproducible. The workspace then carries state
    /// between calls (two accumulator halves and an epoch word; see [`pre_fwd_raw`]).
    pub fixed_point: bool,
}

impl Default for PreConfig {
    /// Two launches: measured faster than the one-launch cluster on every seed row (see
    /// `kernels-gpu/src/mhc/NOTES.md`, v3/v3.1); the v5 pair (session 5, H200: 6.43 → 5.70,
    /// 6.75 → 5.98, 7.55 → 6.62 µs on the seed rows) with fixed-point sums and the block rules
    /// (session 8: 5.76 → 5.0, 5.95 → 5.4, 6.59 → 5.95 µs).
    fn default() -> Self {
        Self {
            path: PrePath::TwoLaunch,
            cluster: 16,
            batch_per_cluster: 0,
            fused_block: 512,
            block: 256,
            max_grid: Some(64),
            mix_block: 0,
            mma_partials: true,
            mma_block: 0,
            pdl: true,
            lean_mix: true,
            partial_cluster: 1,
            graph: true,
            v5: true,
            coop: false,
            stamps: 0,
            fixed_point: true,
        }
    }
}

/// The one-launch geometry: `groups` clusters of `cluster` blocks (grid `(cluster, groups)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FusedGeometry {
    /// Blocks per cluster; block `ρ` owns channel columns `[ρ·cw, min((ρ+1)·cw, c))`.
    pub cluster: u32,
    /// Channel columns per block.
    pub cw: u32,
    /// Batch rows per cluster.
    pub batch_per_cluster: u32,
    /// Clusters (`ceil(batch / batch_per_cluster)`).
    pub groups: u32,
    /// Threads per block.
    pub block: u32,
    /// Dynamic shared memory per block, bytes.
    pub smem: u32,
}

/// Batch rows per group of `mhc_pre_fused` (the kernel's `BTF`, the fp64 MMA's M = 8).
const BTF: usize = 8;
/// Largest n of the one-launch path (the kernel's `NMAX_FUSED`).
const NMAX_FUSED: usize = 4;
/// Largest block of the one-launch path (the kernel's `.maxntid`).
const MAX_FUSED_BLOCK: u32 = 512;

/// `mhc_pre_fused`'s dynamic shared memory (mirror of its `layout_fused`), bytes.
pub fn fused_smem_bytes(block: usize, n: usize, cw: usize) -> usize {
    let m = n * n + 2 * n;
    let (mq, nn, rows, ntt) = (m + 1, n * n, n * cw, m.div_ceil(8) + 1);
    (4 * rows * m).next_multiple_of(16)
        + (2 * BTF * rows).next_multiple_of(16)
        + 8 * (block / 32) * ntt * 64
        + 8 * (2 * BTF * mq + BTF * nn)
        + 4 * (2 * BTF * nn + BTF * n + m)
}

impl FusedGeometry {
    /// The one-launch geometry for `shape` with clusters of at most `cluster` blocks, or why it
    /// does not fit (`Err` names the argument: `config.fused_block`, `config.cluster`, or `c`
    /// when a block's phi slab and staging exceed `max_smem`).
    pub fn new(shape: MhcPreShape, max_smem: usize, config: PreConfig, cluster: u32) -> Result<Self> {
        shape.lens()?;
        let MhcPreShape { batch, n, c } = shape;
        let block = config.fused_block;
        if block == 0 || !block.is_multiple_of(32) || block > MAX_FUSED_BLOCK {
            return Err(Error::Shape {
                arg: "config.fused_block",
                msg: format!("{block} is not a multiple of 32 in 32..={MAX_FUSED_BLOCK}"),
            });
        }
        if n > NMAX_FUSED {
            return Err(Error::Shape { arg: "n", msg: format!("n = {n} exceeds {NMAX_FUSED} on the one-launch path") });
        }
        if !(1..=16).contains(&cluster) {
            return Err(Error::Shape { arg: "config.cluster", msg: format!("{cluster} is not in 1..=16") });
        }
        let cs = (cluster as usize).min(c);
        let cw = c.div_ceil(cs);
        let cs = c.div_ceil(cw);
        let smem = fused_smem_bytes(block as usize, n, cw);
        if smem > max_smem || BTF * n * cw > 1 << 16 {
            return Err(Error::Shape {
                arg: "c",
                msg: format!(
                    "one launch needs {smem} bytes of shared memory per block (n = {n}, {cw} columns per \
                     block), the device has {max_smem}"
                ),
            });
        }
        let bpc = match config.batch_per_cluster {
            0 => BTF.min(batch),
            b => (b as usize).min(batch),
        };
        let groups = batch.div_ceil(bpc);
        if groups > 65535 {
            return Err(Error::Overflow { arg: "x", msg: format!("{groups} clusters along y exceed 65535") });
        }
        Ok(Self {
            cluster: cs as u32,
            cw: cw as u32,
            batch_per_cluster: bpc as u32,
            groups: groups as u32,
            block,
            smem: smem as u32,
        })
    }
}

/// The launch geometry of one shape on one device (computed on the CPU; see [`PrePlan::new`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PreGeometry {
    /// Kernel 1 blocks; block `g` owns channel columns `[g·cols, min((g+1)·cols, c))`.
    pub grid: u32,
    /// Kernel 1 threads per block.
    pub block: u32,
    /// Channel columns per kernel-1 block.
    pub cols: u32,
    /// Columns per staged tile in kernel 1 (≤ cols).
    pub jc: u32,
    /// Batch rows per group in kernel 1 (≤ 4).
    pub bg: u32,
    /// Kernel 1 dynamic shared memory per block, bytes.
    pub smem: u32,
    /// Kernel 2 threads per block.
    pub mix_block: u32,
    /// Channel columns per kernel-2 block (`n·jt ≤ 8·mix_block`).
    pub jt: u32,
    /// Kernel-2 blocks per batch row (`ceil(c/jt)`); kernel 2's grid is `batch·tiles`.
    pub tiles: u32,
    /// log2 of the slices S per quantity in kernel 2's partial reduction.
    pub slices_log2: u32,
    /// Kernel 2 dynamic shared memory per block, bytes.
    pub mix_smem: u32,
    /// Kernel 2 is the lean `mhc_pre_mix4` (n ≤ 4 and `config.lean_mix`), else `mhc_pre_mix`.
    pub mix4: bool,
    /// The v5 pair (`config.v5` where it applies): `mhc_pre_partial_mma5` + `mhc_pre_mix5`, grid
    /// `(tiles, batch)` with `jt = min(c, mix_block)`; `mix4` is then also set, `k1_cluster` 1.
    pub v5: bool,
    /// The one-cooperative-launch geometry (`config.coop` where it applies; [`PrePlan::new`]
    /// drops it when the device cannot hold the grid resident).
    pub coop: Option<CoopGeometry>,
    /// The v8 pair (`config.fixed_point` with the v5 pair): `mhc_pre_partial_fx` +
    /// `mhc_pre_mix_fx`, the v5 grids; the workspace holds the accumulators.
    pub fx: bool,
    /// Kernel 1 (tensor-core version only) runs in clusters of this many blocks along x, and
    /// writes `grid / k1_cluster` partials per quantity (1: no clusters, `grid` partials).
    pub k1_cluster: u32,
    /// Workspace length, u64 words (`batch·(n²+2n+1)·grid` f64 partials; with `coop`,
    /// `batch·(n²+2n+1)·coop.grid1` partials and one barrier word).
    pub workspace: usize,
    /// Kernel 1 runs on fp64 tensor cores (`mhc_pre_partial_mma`): `(block, shared bytes,
    /// batch rows per y-block, y-blocks)`; `None`: the FMA kernel (`mhc_pre_partial`).
    pub mma: Option<(u32, u32, u32, u32)>,
}

/// The geometry of `mhc_pre_coop` (v6, one cooperative launch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CoopGeometry {
    /// Blocks (all resident): `max(grid1, batch·tiles)`.
    pub grid: u32,
    /// Phase-1 blocks; block `g` owns channel columns `[g·cw, min((g+1)·cw, c))`.
    pub grid1: u32,
    /// Channel columns per phase-1 block.
    pub cw: u32,
    /// Phase 2: column tiles per batch row; block `g < batch·tiles` mixes tile `g / batch` of row
    /// `g mod batch`.
    pub tiles: u32,
    /// Columns per phase-2 tile.
    pub jt: u32,
    /// Threads per block.
    pub block: u32,
    /// Dynamic shared memory per block, bytes.
    pub smem: u32,
}

impl CoopGeometry {
    /// The v6 geometry for `shape`: phase 1 as the v5 kernel 1 (`cols` columns per block over
    /// `grid1` blocks), phase 2 spreading the batch rows' columns over about as many blocks.
    /// `None` when n > 4 or the slab does not fit `max_smem`.
    fn new(shape: MhcPreShape, max_smem: usize, block: u32, cols: usize) -> Option<Self> {
        let MhcPreShape { batch, n, c } = shape;
        if n > NMAX_MIX4 || !(32..=MAX_FUSED_BLOCK).contains(&block) || !block.is_multiple_of(32) {
            return None;
        }
        let grid1 = c.div_ceil(cols);
        let smem = fused_smem_bytes(block as usize, n, cols).max(8 * block as usize);
        if smem > max_smem || BTF * n * cols > 1 << 16 {
            return None;
        }
        let tiles = (grid1 / batch).max(1);
        let jt = c.div_ceil(tiles);
        let tiles = c.div_ceil(jt);
        let grid = grid1.max(batch.checked_mul(tiles)?);
        if grid > 65535 {
            return None;
        }
        Some(Self {
            grid: grid as u32,
            grid1: grid1 as u32,
            cw: cols as u32,
            tiles: tiles as u32,
            jt: jt as u32,
            block,
            smem: smem as u32,
        })
    }
}

/// The kernels' `FastDiv` magic for divisor `d`: `⌊2^32/d⌋ + 1`; `(a·magic) >> 32 = a / d`
/// exactly for `a, d ≤ 2^16`.
pub fn fastdiv_magic(d: u32) -> u64 {
    (1u64 << 32) / d as u64 + 1
}

/// Kernel 1's dynamic shared memory (mirror of `layout1`), bytes.
pub fn partial_smem_bytes(block: usize, bg: usize, n: usize, jc: usize) -> usize {
    let mq = n * n + 2 * n + 1;
    (8 * (BT * block + bg * mq) + 2 * bg * n * jc).next_multiple_of(16)
}

/// Kernel 2's dynamic shared memory (mirror of `layout2`), bytes.
pub fn mix_smem_bytes(slices: usize, n: usize, jt: usize) -> usize {
    let mq = n * n + 2 * n + 1;
    (8 * (mq * slices + mq + n * n) + 4 * (2 * n * n + n) + 2 * n * jt).next_multiple_of(16)
}

fn check_block(arg: &'static str, block: u32) -> Result<()> {
    if block == 0 || !block.is_multiple_of(32) || block > 1024 {
        return Err(Error::Shape { arg, msg: format!("{block} is not a multiple of 32 in 32..=1024") });
    }
    Ok(())
}

/// u64 words of the two-launch workspace: one f64 partial per (batch row, quantity, kernel-1
/// block), quantities = the `n²+2n` logits and Σx²; with `fx` (v8), two halves of
/// [`FX_WORDS`] words per (batch row, logit) and the epoch word.
fn pair_workspace(shape: MhcPreShape, grid: usize, fx: bool) -> Result<usize> {
    if fx {
        return Ok(2 * checked_product("x", &[shape.batch, shape.logits(), FX_WORDS])? + 1);
    }
    checked_product("x", &[shape.batch, shape.logits() + 1, grid])
}

/// Kernel 1's block (tensor-core kernels) when `PreConfig::mma_block` is 0: 256 threads, or 512
/// when the block's slot sums — 4 threads per (batch row of its group of ≤ 8, quantity) —
/// would need a second round at 256 (batch ≥ 3 for n = 4). Measured on the H200 (session 8,
/// fixed-point pair): hidden-2560 (batch 4) 6.25 → 5.95 µs at 512, hidden-1920 (batch 2)
/// 5.44 → 5.70 µs (worse) at 512.
pub fn auto_mma_block(shape: MhcPreShape) -> u32 {
    let items = 4 * shape.batch.min(BTF) * (shape.logits() + 1);
    if items > 256 {
        512
    } else {
        256
    }
}

/// u64 words per (batch row, logit) accumulator of the v8 kernels (the kernels' `FX_WORDS`:
/// four integer limbs and a count of non-finite partials).
pub const FX_WORDS: usize = 5;

impl PreGeometry {
    /// u64 words of a `PreConfig::stamps` buffer for this geometry (v5 pair): kernel 1's blocks
    /// then kernel 2's; `None` when the geometry is not the v5 pair.
    pub fn stamp_words(&self, batch: usize) -> Option<(usize, usize)> {
        match self.mma {
            Some((_, _, _, groups)) if self.v5 && self.coop.is_none() => {
                Some((self.grid as usize * groups as usize * MMA5_STAMPS, self.tiles as usize * batch * MIX5_STAMPS))
            }
            _ => None,
        }
    }

    /// The geometry for `shape` on a device with `sms` multiprocessors and `max_smem` bytes of
    /// opt-in shared memory per block. Kernel 1: the columns split evenly over `min(c, sms,
    /// max_grid, 256)` blocks, up to 4 batch rows per group, staged tiles of at most 32 KiB.
    /// Kernel 2: tiles of `jt = min(c, mix_block, ⌊8·mix_block/n⌋)` columns per batch row.
    ///
    /// Errors: those of [`MhcPreShape::lens`]; [`Error::Shape`] naming `config.block` or
    /// `config.mix_block` for a bad block size, `n` when even one batch row and one column
    /// exceed `max_smem` (or kernel 2's tile cannot hold one column); [`Error::Overflow`]
    /// naming `x` when the workspace or the grid exceeds 32-bit indexing.
    pub fn new(shape: MhcPreShape, sms: usize, max_smem: usize, config: PreConfig) -> Result<Self> {
        let lens = shape.lens()?;
        check_block("config.block", config.block)?;
        // Kernel 2's block by rule: 256 for the fixed-point pair (its blocks no longer read one
        // partial per kernel-1 block, so more, smaller blocks win), 512 otherwise.
        let config = match config.mix_block {
            0 if config.fixed_point && config.v5 && shape.n <= NMAX_MIX4 => PreConfig { mix_block: 256, ..config },
            0 => PreConfig { mix_block: 512, ..config },
            _ => config,
        };
        check_block("config.mix_block", config.mix_block)?;
        let block = config.block;
        let MhcPreShape { batch, n, c } = shape;
        let mq = shape.logits() + 1;
        let limit = config.max_grid.map_or(usize::MAX, |g| g.max(1) as usize);
        let target = c.min(sms.max(1)).min(limit).min(MAX_GRID);
        let cols = c.div_ceil(target);
        let grid = c.div_ceil(cols);
        let mut bg = batch.min(BT);
        let tile = |bg: usize| cols.min((XS_BUDGET / (2 * bg * n)).max(1));
        let mut jc = tile(bg);
        while partial_smem_bytes(block as usize, bg, n, jc) > max_smem && bg > 1 {
            bg -= 1;
            jc = tile(bg);
        }
        if partial_smem_bytes(block as usize, bg, n, jc) > max_smem {
            jc = 1;
        }
        let smem = partial_smem_bytes(block as usize, bg, n, jc);
        let too_big = |smem: usize| Error::Shape {
            arg: "n",
            msg: format!("n = {n} needs {smem} bytes of shared memory per block, the device has {max_smem}"),
        };
        if smem > max_smem {
            return Err(too_big(smem));
        }
        // The kernels' multiply-high divisions need every divisor and dividend ≤ 2^16.
        debug_assert!(jc <= 1 << 14 && bg * n * jc <= 1 << 16);

        let mb = config.mix_block as usize;
        if n > UN * mb {
            return Err(Error::Shape { arg: "n", msg: format!("n = {n} exceeds {UN}·mix_block = {}", UN * mb) });
        }
        let kb = if config.mma_block == 0 { auto_mma_block(shape) } else { config.mma_block };
        let mma_ok = config.mma_partials
            && n <= NMAX_FUSED
            && kb >= 32
            && kb.is_multiple_of(32)
            && kb <= MAX_FUSED_BLOCK
            && fused_smem_bytes(kb as usize, n, cols) <= max_smem
            && BTF * n * cols <= 1 << 16;
        // v5 needs the tensor-core kernel 1 (its block-major partial layout).
        let v5 = config.v5 && config.lean_mix && n <= NMAX_MIX4 && batch <= 65535 && mma_ok;
        let jt = if v5 { c.min(mb) } else { c.min(mb).min(UN * mb / n) };
        let tiles = c.div_ceil(jt);
        // S: a power of two, (m+1)·S ≤ mix_block where possible, S ≤ 32 and S ≤ G.
        let mut slices_log2 = 0;
        while slices_log2 < 5 && mq << (slices_log2 + 1) <= mb && 1 << (slices_log2 + 1) <= grid {
            slices_log2 += 1;
        }
        let mix4 = config.lean_mix && n <= NMAX_MIX4;
        let mut mix_smem = mix_smem_bytes(1 << slices_log2, n, jt);
        if mix4 {
            mix_smem = (MIX4_SMEM_HEAD + 2 * n * jt).next_multiple_of(16);
        }
        if v5 {
            mix_smem = mix5_smem_bytes(mb);
        }
        if mix_smem > max_smem {
            return Err(too_big(mix_smem));
        }
        let coop = if config.coop && mma_ok { CoopGeometry::new(shape, max_smem, kb, cols) } else { None };
        let fx = v5 && config.fixed_point;
        let workspace = match coop {
            Some(cg) => checked_product("x", &[batch, mq, cg.grid1 as usize])? + 1,
            None => pair_workspace(shape, grid, fx)?,
        };
        let mix_grid = checked_product("x", &[batch, tiles])?;
        if workspace >= 1 << 31 || mix_grid >= 1 << 31 || lens.x_layer >= 1 << 31 {
            return Err(Error::Overflow { arg: "x", msg: format!("batch {batch}: workspace or grid exceeds 2^31") });
        }
        let mb = kb;
        let mma = mma_ok.then(|| {
            let bpc = BTF.min(batch);
            (mb, fused_smem_bytes(mb as usize, n, cols) as u32, bpc as u32, batch.div_ceil(bpc) as u32)
        });
        Ok(Self {
            grid: grid as u32,
            block,
            cols: cols as u32,
            jc: jc as u32,
            bg: bg as u32,
            smem: smem as u32,
            mix_block: config.mix_block,
            jt: jt as u32,
            tiles: tiles as u32,
            slices_log2,
            mix_smem: mix_smem as u32,
            mix4,
            v5,
            coop,
            fx,
            k1_cluster: match mma {
                Some(_) if v5 => 1,
                Some(_) => {
                    let mut k = config.partial_cluster.clamp(1, 16).next_power_of_two();
                    while k > 1 && (k > config.partial_cluster.max(1) || grid % k as usize != 0) {
                        k /= 2;
                    }
                    k
                }
                None => 1,
            },
            workspace,
            mma,
        })
    }
}

/// Raises (never lowers: other plans of the same kernel may need more) the kernel's dynamic
/// shared memory limit to `smem` bytes when that exceeds the default 48 KiB.
fn raise_smem_limit(f: &cudarc::driver::CudaFunction, smem: u32) -> Result<()> {
    let attr = sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
    if smem as usize > SMEM_DEFAULT && f.get_attribute(attr)? < smem as i32 {
        f.set_attribute(attr, smem as i32)?;
    }
    Ok(())
}

/// A validated shape with its launch geometry on one device (no device memory).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrePlan {
    pub shape: MhcPreShape,
    pub config: PreConfig,
    /// The two-launch geometry (used when `fused` is `None`).
    pub geometry: PreGeometry,
    /// The one-launch geometry, when the configuration and the device allow it.
    pub fused: Option<FusedGeometry>,
}

impl PrePlan {
    /// Queries the device (SM count, opt-in shared memory, occupancy) and computes the geometry.
    ///
    /// Errors: those of [`PreGeometry::new`]; a driver error; [`Error::Shape`] naming
    /// `config.block` / `config.mix_block` when no block of this size fits on a multiprocessor.
    pub fn new(gpu: &Gpu, shape: MhcPreShape, config: PreConfig) -> Result<Self> {
        use sys::CUdevice_attribute as A;
        let ctx = gpu.context();
        let sms = ctx.attribute(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as usize;
        let max_smem = ctx.attribute(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)? as usize;
        let geometry = PreGeometry::new(shape, sms, max_smem, config)?;
        let (k1, k1_arg, k1_block, k1_smem) = match geometry.mma {
            Some((block, smem, _, _)) if geometry.v5 && config.stamps != 0 => {
                (KERNEL_PARTIAL_MMA5_TS, "config.mma_block", block, smem)
            }
            Some((block, smem, _, _)) if geometry.fx => (KERNEL_PARTIAL_FX, "config.mma_block", block, smem),
            Some((block, smem, _, _)) if geometry.v5 => (KERNEL_PARTIAL_MMA5, "config.mma_block", block, smem),
            Some((block, smem, _, _)) => (KERNEL_PARTIAL_MMA, "config.mma_block", block, smem),
            None => (KERNEL_PARTIAL, "config.block", geometry.block, geometry.smem),
        };
        let k2 = if geometry.v5 && config.stamps != 0 {
            KERNEL_MIX5_TS
        } else if geometry.fx {
            KERNEL_MIX_FX
        } else if geometry.v5 {
            KERNEL_MIX5
        } else if geometry.mix4 {
            KERNEL_MIX4
        } else {
            KERNEL_MIX
        };
        for (name, arg, block, smem) in
            [(k1, k1_arg, k1_block, k1_smem), (k2, "config.mix_block", geometry.mix_block, geometry.mix_smem)]
        {
            let f = gpu.function(name)?;
            raise_smem_limit(f, smem)?;
            let per_sm = f.occupancy_max_active_blocks_per_multiprocessor(block, smem as usize, None)?;
            if per_sm == 0 {
                return Err(Error::Shape {
                    arg,
                    msg: format!("{block} threads with {smem} bytes of shared memory do not fit on a multiprocessor"),
                });
            }
        }
        let mut geometry = geometry;
        if let Some(cg) = geometry.coop {
            // Every block of a cooperative launch must be resident at once; else the v5 pair.
            let f = gpu.function(KERNEL_COOP)?;
            raise_smem_limit(f, cg.smem)?;
            let per_sm = f.occupancy_max_active_blocks_per_multiprocessor(cg.block, cg.smem as usize, None)?;
            if (per_sm as usize).saturating_mul(sms) < cg.grid as usize {
                geometry.coop = None;
                geometry.workspace = pair_workspace(shape, geometry.grid as usize, geometry.fx)?;
            }
        }
        if let Some((block, smem, _, groups)) = geometry.mma {
            if geometry.k1_cluster > 1 {
                let f = gpu.function(KERNEL_PARTIAL_MMA)?;
                let dims = LaunchDims { grid: (geometry.grid, groups, 1), block: (block, 1, 1), shared_bytes: smem };
                // The largest schedulable cluster size ≤ the planned one (halving).
                while geometry.k1_cluster > 1
                    && max_active_clusters(f, dims, geometry.k1_cluster, gpu.stream().cu_stream())? == 0
                {
                    geometry.k1_cluster /= 2;
                }
            }
        }
        let fused = match config.path {
            PrePath::TwoLaunch => None,
            PrePath::Auto => Self::fused_geometry(gpu, shape, max_smem, config).ok(),
            PrePath::Fused => Some(Self::fused_geometry(gpu, shape, max_smem, config)?),
        };
        Ok(Self { shape, config, geometry, fused })
    }

    /// The largest cluster ≤ `config.cluster` whose geometry fits and that the device can
    /// schedule (sizes tried: the configured one, then halving).
    fn fused_geometry(gpu: &Gpu, shape: MhcPreShape, max_smem: usize, config: PreConfig) -> Result<FusedGeometry> {
        let f = gpu.function(KERNEL_FUSED)?;
        let mut cluster = config.cluster;
        loop {
            let g = FusedGeometry::new(shape, max_smem, config, cluster)?;
            raise_smem_limit(f, g.smem)?;
            let dims = LaunchDims { grid: (g.cluster, g.groups, 1), block: (g.block, 1, 1), shared_bytes: g.smem };
            if max_active_clusters(f, dims, g.cluster, gpu.stream().cu_stream())? > 0 {
                return Ok(g);
            }
            if cluster <= 1 {
                return Err(Error::Shape {
                    arg: "config.cluster",
                    msg: "no cluster of this block size and shared memory can be scheduled".into(),
                });
            }
            cluster /= 2;
        }
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
    graph: GraphReplay,
}

impl MhcPre {
    /// Plans `shape` with the default configuration and allocates the workspace
    /// (`geometry.workspace` u64 words: 8·batch·(n²+2n+1)·grid bytes of f64 partials).
    pub fn new(gpu: &Gpu, shape: MhcPreShape) -> Result<Self> {
        Self::with_config(gpu, shape, PreConfig::default())
    }

    /// As [`MhcPre::new`] with an explicit launch configuration.
    pub fn with_config(gpu: &Gpu, shape: MhcPreShape, config: PreConfig) -> Result<Self> {
        let plan = PrePlan::new(gpu, shape, config)?;
        // The one-launch path needs no workspace (one word keeps the buffer non-empty).
        let words = if plan.fused.is_some() { 1 } else { plan.geometry.workspace };
        let workspace = gpu.stream().alloc_zeros::<u64>(words)?;
        Ok(Self { plan, workspace, graph: GraphReplay::new() })
    }

    pub fn plan(&self) -> &PrePlan {
        &self.plan
    }

    /// Runs MHCPreFwd (docs/ops.md §2) on [`Gpu::stream`]; asynchronous. Per batch row β:
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
        let cs = st.cu_stream();
        let call = || unsafe { pre_fwd_raw(gpu, &self.plan, params, p, xp, bp, r, y, h, w, ws_len, cs) };
        if !self.plan.config.graph || self.plan.geometry.coop.is_some() {
            // One launch (v6) gains nothing from a graph but the host's submission cost.
            return call();
        }
        let scalars = [params.alpha_pre, params.alpha_post, params.alpha_res, params.sinkhorn_eps];
        let mut key = vec![p, xp, bp, r, y, h, w, ws_len as u64, params.sinkhorn_repeat as u64];
        key.extend(scalars.iter().map(|v| v.to_bits() as u64));
        // SAFETY: `call` only launches kernels on the plan's stream.
        unsafe { self.graph.run(cs, key, call) }
    }
}

/// MHCPreFwd on raw device pointers with a caller-owned workspace, launched on `stream`:
/// one cluster launch when `plan.fused` is set (the workspace is then not used), one
/// cooperative launch when `plan.geometry.coop` is set, else two kernels (split-K partials
/// into the workspace, then reduction, coefficients and mixing).
///
/// `workspace` (two-launch and cooperative plans): at least `plan.geometry.workspace` u64
/// words, 8-byte aligned. Two launches: scratch only (any contents, no reset needed: the first
/// kernel overwrites every word the second reads). Cooperative: the last word is the grid
/// barrier's counter — it must be zero before the first call with this workspace and left to
/// the kernel afterwards (every call returns its low 31 bits to zero); the rest is scratch.
/// Fixed-point pair (`plan.geometry.fx`): the whole workspace is state — all zero before the
/// first call with it, then left to the kernels (each call's kernel 1 adds into the half the
/// last word's parity names and zeroes the other; kernel 2 flips the parity).
/// One workspace must not serve two calls that may run concurrently (different streams).
///
/// # Safety
/// Each pointer must address device memory of `gpu`'s context holding at least the elements
/// [`MhcPreShape::lens`] lists for `plan.shape`, valid until the kernels finish; outputs must
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
    let s = plan.shape;
    if let Some(fg) = plan.fused {
        let f = gpu.function(KERNEL_FUSED)?;
        let (mut phi, mut xp, mut bp, mut r, mut y, mut h) = (phi, x, b, x_res, x_layer, h_post);
        let (mut batch, mut n, mut c) = (s.batch as u32, s.n as u32, s.c as u32);
        let (mut cw, mut bpc) = (fg.cw, fg.batch_per_cluster);
        let (mut a_pre, mut a_post, mut a_res) = (params.alpha_pre, params.alpha_post, params.alpha_res);
        let (mut rep, mut eps) = (params.sinkhorn_repeat, params.sinkhorn_eps);
        let mut inv_sqrt_nc = 1.0 / ((s.n * s.c) as f64).sqrt();
        let dims = LaunchDims { grid: (fg.cluster, fg.groups, 1), block: (fg.block, 1, 1), shared_bytes: fg.smem };
        return launch_cluster(
            f,
            dims,
            fg.cluster,
            stream,
            &mut [
                &mut phi,
                &mut xp,
                &mut bp,
                &mut r,
                &mut y,
                &mut h,
                &mut batch,
                &mut n,
                &mut c,
                &mut cw,
                &mut bpc,
                &mut a_pre,
                &mut a_post,
                &mut a_res,
                &mut rep,
                &mut eps,
                &mut inv_sqrt_nc,
            ],
        );
    }
    check_len("workspace", geo.workspace, workspace_len)?;
    if !workspace.is_multiple_of(8) {
        return Err(Error::Shape { arg: "workspace", msg: "not 8-byte aligned".into() });
    }
    if let Some(cg) = geo.coop {
        return launch_coop(plan, cg, params, [phi, x, b, x_res, x_layer, h_post], workspace, stream, gpu);
    }
    if let Some((block, smem, bpc, groups)) = geo.mma {
        let stamped = geo.v5 && plan.config.stamps != 0;
        let f = gpu.function(match (geo.v5, stamped) {
            (true, true) => KERNEL_PARTIAL_MMA5_TS,
            (true, false) if geo.fx => KERNEL_PARTIAL_FX,
            (true, false) => KERNEL_PARTIAL_MMA5,
            _ => KERNEL_PARTIAL_MMA,
        })?;
        let (mut phi, mut xp, mut w) = (phi, x, workspace);
        let (mut batch, mut n, mut c, mut cw, mut bpc) = (s.batch as u32, s.n as u32, s.c as u32, geo.cols, bpc);
        let (mut ts, mut fx) = (plan.config.stamps, geo.fx as u32);
        let dims = LaunchDims { grid: (geo.grid, groups, 1), block: (block, 1, 1), shared_bytes: smem };
        let args: &mut [&mut dyn KernelArg] = if stamped {
            &mut [&mut phi, &mut xp, &mut w, &mut batch, &mut n, &mut c, &mut cw, &mut bpc, &mut ts, &mut fx]
        } else {
            &mut [&mut phi, &mut xp, &mut w, &mut batch, &mut n, &mut c, &mut cw, &mut bpc]
        };
        if geo.k1_cluster > 1 {
            launch_cluster(f, dims, geo.k1_cluster, stream, args)?;
        } else {
            launch(f, dims, stream, args)?;
        }
    } else {
        launch_partial(plan, phi, x, workspace, stream, gpu)?;
    }
    if geo.v5 {
        return launch_mix5(plan, params, x, b, x_res, x_layer, h_post, workspace, stream, gpu);
    }
    launch_mix(plan, params, x, b, x_res, x_layer, h_post, workspace, stream, gpu)
}

/// v6 (`mhc_pre_coop`): one cooperative launch; `bufs` = phi, x, b, x_res, x_layer, h_post.
/// The barrier word is the workspace's last u64 word.
#[allow(clippy::too_many_arguments)]
unsafe fn launch_coop(
    plan: &PrePlan,
    cg: CoopGeometry,
    params: MhcPreParams,
    bufs: [CUdeviceptr; 6],
    workspace: CUdeviceptr,
    stream: CUstream,
    gpu: &Gpu,
) -> Result<()> {
    let s = plan.shape;
    let f = gpu.function(KERNEL_COOP)?;
    let [mut phi, mut xp, mut bp, mut r, mut y, mut h] = bufs;
    let mut w = workspace;
    let mut bar = workspace + 8 * (plan.geometry.workspace as u64 - 1);
    let (mut batch, mut n, mut c) = (s.batch as u32, s.n as u32, s.c as u32);
    let (mut cw, mut grid1, mut jt) = (cg.cw, cg.grid1, cg.jt);
    let (mut a_pre, mut a_post, mut a_res) = (params.alpha_pre, params.alpha_post, params.alpha_res);
    let (mut rep, mut eps) = (params.sinkhorn_repeat, params.sinkhorn_eps);
    let mut inv_sqrt_nc = 1.0 / ((s.n * s.c) as f64).sqrt();
    let dims = LaunchDims { grid: (cg.grid, 1, 1), block: (cg.block, 1, 1), shared_bytes: cg.smem };
    launch_cooperative(
        f,
        dims,
        stream,
        &mut [
            &mut phi,
            &mut xp,
            &mut bp,
            &mut w,
            &mut bar,
            &mut r,
            &mut y,
            &mut h,
            &mut batch,
            &mut n,
            &mut c,
            &mut cw,
            &mut grid1,
            &mut jt,
            &mut a_pre,
            &mut a_post,
            &mut a_res,
            &mut rep,
            &mut eps,
            &mut inv_sqrt_nc,
        ],
    )
}

/// Kernel 1, FMA version (`mhc_pre_partial`).
unsafe fn launch_partial(
    plan: &PrePlan,
    phi: CUdeviceptr,
    x: CUdeviceptr,
    workspace: CUdeviceptr,
    stream: CUstream,
    gpu: &Gpu,
) -> Result<()> {
    let (s, geo) = (plan.shape, plan.geometry);
    let f1 = gpu.function(KERNEL_PARTIAL)?;
    // Kernel 1: split-K partials.
    let (mut phi, mut xp, mut w) = (phi, x, workspace);
    let (mut batch, mut n, mut c) = (s.batch as u32, s.n as u32, s.c as u32);
    let (mut cols, mut jc, mut bg) = (geo.cols, geo.jc, geo.bg);
    let mut ngroups = s.batch.div_ceil(geo.bg as usize) as u32;
    let mut njc_full = geo.cols.div_ceil(geo.jc);
    let mut mc = (s.logits() as u32 + 1).min(geo.block);
    let mut mc_magic = fastdiv_magic(mc);
    let mut jc_magic = fastdiv_magic(geo.jc);
    let dims = LaunchDims { grid: (geo.grid, 1, 1), block: (geo.block, 1, 1), shared_bytes: geo.smem };
    launch(
        f1,
        dims,
        stream,
        &mut [
            &mut phi,
            &mut xp,
            &mut w,
            &mut batch,
            &mut n,
            &mut c,
            &mut cols,
            &mut jc,
            &mut bg,
            &mut ngroups,
            &mut njc_full,
            &mut mc,
            &mut mc_magic,
            &mut jc_magic,
        ],
    )?;

    Ok(())
}

/// Kernel 2: reduction, coefficients, mixing (stream order: after kernel 1).
#[allow(clippy::too_many_arguments)]
unsafe fn launch_mix(
    plan: &PrePlan,
    params: MhcPreParams,
    x: CUdeviceptr,
    b: CUdeviceptr,
    x_res: CUdeviceptr,
    x_layer: CUdeviceptr,
    h_post: CUdeviceptr,
    workspace: CUdeviceptr,
    stream: CUstream,
    gpu: &Gpu,
) -> Result<()> {
    let (s, geo) = (plan.shape, plan.geometry);
    let f2 = gpu.function(if geo.mix4 { KERNEL_MIX4 } else { KERNEL_MIX })?;
    let (mut xp, mut bp, mut w) = (x, b, workspace);
    let (mut r, mut y, mut h) = (x_res, x_layer, h_post);
    // Kernel 1's partials per quantity: one per block, or one per cluster.
    let (mut n, mut c, mut grid1) = (s.n as u32, s.c as u32, geo.grid / geo.k1_cluster);
    let (mut tiles, mut jt, mut ls) = (geo.tiles, geo.jt, geo.slices_log2);
    let mut jt_magic = fastdiv_magic(geo.jt);
    let mut jl_magic = fastdiv_magic(s.c as u32 - (geo.tiles - 1) * geo.jt);
    let (mut a_pre, mut a_post, mut a_res) = (params.alpha_pre, params.alpha_post, params.alpha_res);
    let (mut rep, mut eps) = (params.sinkhorn_repeat, params.sinkhorn_eps);
    let mut inv_sqrt_nc = 1.0 / ((s.n * s.c) as f64).sqrt();
    let dims = LaunchDims {
        grid: (s.batch as u32 * geo.tiles, 1, 1),
        block: (geo.mix_block, 1, 1),
        shared_bytes: geo.mix_smem,
    };
    let launch2 = if plan.config.pdl { launch_pdl } else { launch };
    launch2(
        f2,
        dims,
        stream,
        &mut [
            &mut xp,
            &mut bp,
            &mut w,
            &mut r,
            &mut y,
            &mut h,
            &mut n,
            &mut c,
            &mut grid1,
            &mut tiles,
            &mut jt,
            &mut jt_magic,
            &mut jl_magic,
            &mut ls,
            &mut a_pre,
            &mut a_post,
            &mut a_res,
            &mut rep,
            &mut eps,
            &mut inv_sqrt_nc,
        ],
    )
}

/// Kernel 2, v5 (`mhc_pre_mix5`): grid `(tiles, batch)`, after `mhc_pre_partial_mma5`.
#[allow(clippy::too_many_arguments)]
unsafe fn launch_mix5(
    plan: &PrePlan,
    params: MhcPreParams,
    x: CUdeviceptr,
    b: CUdeviceptr,
    x_res: CUdeviceptr,
    x_layer: CUdeviceptr,
    h_post: CUdeviceptr,
    workspace: CUdeviceptr,
    stream: CUstream,
    gpu: &Gpu,
) -> Result<()> {
    let (s, geo) = (plan.shape, plan.geometry);
    let stamped = plan.config.stamps != 0;
    let f2 = gpu.function(match (stamped, geo.fx) {
        (true, _) => KERNEL_MIX5_TS,
        (false, true) => KERNEL_MIX_FX,
        (false, false) => KERNEL_MIX5,
    })?;
    let (mut xp, mut bp, mut w) = (x, b, workspace);
    let (mut r, mut y, mut h) = (x_res, x_layer, h_post);
    let (mut batch, mut n, mut c, mut grid1) = (s.batch as u32, s.n as u32, s.c as u32, geo.grid);
    let (mut a_pre, mut a_post, mut a_res) = (params.alpha_pre, params.alpha_post, params.alpha_res);
    let (mut rep, mut eps) = (params.sinkhorn_repeat, params.sinkhorn_eps);
    let mut inv_sqrt_nc = 1.0 / ((s.n * s.c) as f64).sqrt();
    // The stamps of kernel 2 follow kernel 1's in the diagnostic buffer.
    let mut ts = plan.config.stamps + 8 * plan.geometry.stamp_words(s.batch).map_or(0, |(k1, _)| k1) as u64;
    let dims =
        LaunchDims { grid: (geo.tiles, s.batch as u32, 1), block: (geo.mix_block, 1, 1), shared_bytes: geo.mix_smem };
    let launch2 = if plan.config.pdl { launch_pdl } else { launch };
    let mut fx = geo.fx as u32;
    let mut args: [&mut dyn KernelArg; 18] = [
        &mut xp,
        &mut bp,
        &mut w,
        &mut r,
        &mut y,
        &mut h,
        &mut batch,
        &mut n,
        &mut c,
        &mut grid1,
        &mut a_pre,
        &mut a_post,
        &mut a_res,
        &mut rep,
        &mut eps,
        &mut inv_sqrt_nc,
        &mut ts,
        &mut fx,
    ];
    launch2(f2, dims, stream, &mut args[..if stamped { 18 } else { 16 }])
}
