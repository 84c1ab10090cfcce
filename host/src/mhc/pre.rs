//! MHCPreFwd (docs/ops.md §2): the mHC pre-layer projection, Sinkhorn normalisation and stream
//! mixing in two kernels on one stream — split-K partial logits (kernel 1), then reduction,
//! coefficients and mixing (kernel 2, a programmatic dependent launch) — submitted by
//! [`MhcPre::run`] as one CUDA graph. [`PrePlan::new`] is the planner: it picks the kernel pair
//! from the shape (the tuning table [`PreClass::of`]) and fixes its geometry; the launch code
//! only matches on the plan. `kernels-gpu/src/mhc/pre.rs` describes the kernels and
//! `docs/decisions/mhc.md` the measurements behind the choices.
use cudarc::driver::{sys, sys::CUdeviceptr, sys::CUstream, CudaSlice, DevicePtr, DevicePtrMut};
use half::bf16;

use crate::error::{check_len, check_positive, checked_product};
use crate::runtime::{launch_planned, GraphReplay, LaunchDims, Planned};
use crate::{Error, Gpu, Result};
use kernel_abi::mhc as abi;
use kernel_abi::{PreMixArgs, PreMixFixedPointArgs, PrePartialFmaArgs, PrePartialSlabArgs};

/// MHCPreFwd's kernels from `kernel_abi::mhc_pre_kernels!` (the list the PTX entries are
/// declared from): [`PreKernel`] and [`KERNELS`].
macro_rules! pre_kernel_table {
    ($($name:ident: $kind:ident, $body:ident, $entry:ident;)*) => {
        /// A kernel of MHCPreFwd (the kernel column of `kernel_abi::mhc_pre_kernels!`).
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub(crate) enum PreKernel {
            $($kind,)*
        }
        impl PreKernel {
            /// The PTX entry.
            pub(crate) const fn name(self) -> &'static str {
                match self {
                    $(Self::$kind => stringify!($name),)*
                }
            }
        }
        /// Every PTX entry of MHCPreFwd.
        pub(crate) const KERNELS: &[&str] = &[$(stringify!($name),)*];
    };
}
kernel_abi::mhc_pre_kernels!(pre_kernel_table);

/// Batch rows per group of `mhc_pre_partial_fma`.
const BT: usize = abi::BT as usize;
/// x elements per thread in the staged tile of `mhc_pre_mix` / `mhc_pre_mix_small_n` (the
/// kernels' `UN`).
const UN: usize = abi::UN as usize;
/// Shared-memory budget for the staged x of one `mhc_pre_partial_fma` tile, bytes.
const XS_BUDGET: usize = 32 * 1024;
/// Dynamic shared memory available without opting in, bytes.
const SMEM_DEFAULT: usize = 48 * 1024;
/// Batch rows per group of the slab kernel 1 (the kernels' `BTF`: one x tile per group).
const BTF: usize = abi::BTF as usize;
/// Largest n of the slab kernel 1 and of the register-coefficient kernels 2 (the kernels'
/// `NMAX_SMALL_N`: a 4×4 R in one warp).
const NMAX_SMALL_N: usize = abi::NMAX_SMALL_N as usize;
/// Bytes of `mhc_pre_mix_small_n`'s shared memory before its x tile (`tot[32]` f64, `hs[4]`,
/// `ra[16]`; the kernel's `MIX4_SMEM_HEAD`).
const MIX_SMALL_N_SMEM_HEAD: usize = abi::MIX_SMALL_N_SMEM_HEAD as usize;
/// Largest grid y (CUDA): `mhc_pre_mix_fixed_point` runs one y-block per batch row, the
/// slab kernel 1 one per group of 8 batch rows.
const MAX_GRID_Y: usize = 65535;

/// u64 words per (batch row, logit) accumulator of the fixed-point pair (the kernels'
/// `ACC_WORDS`: four integer limbs and a count of non-finite partials).
#[doc(hidden)]
pub const ACC_WORDS: usize = abi::ACC_WORDS as usize;
/// f64 logit scales per batch row after the fixed-point pair's epoch word (the kernels'
/// `ROW_SCALES`).
#[doc(hidden)]
pub const ROW_SCALES: usize = abi::ROW_SCALES as usize;

// ---------------------------------------------------------------- tuning table

/// The kernel pair of a shape: the MHCPreFwd tuning table, one row per shape class
/// ([`PreClass::of`]; the geometry constants below it). H200 times are the bench's seed rows
/// hidden-1280 / 1920 / 2560 (n = 4, batch 1 / 2 / 4), CUPTI device time after an L2 flush.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreClass {
    /// Tensor-core partials added as fixed-point limbs + one column per thread of kernel 2:
    /// 5.06 / 5.47 / 5.92 µs against 5.52 / 5.90 / 6.69 for the same pair storing block
    /// partials (kernel 2 then sums 64 partials per logit across warps).
    FixedPoint,
    /// Slab partials + staged tiles with register coefficients, where kernel 2's
    /// `(tiles, batch)` grid does not fit (batch > 65535).
    SlabPartials,
    /// FMA partials + staged tiles with register coefficients, where one block's phi slab
    /// exceeds shared memory (large c) or the slab kernel's grid y (batch > 524280).
    FmaSmallN,
    /// n > 4: FMA partials + staged tiles with block-parallel coefficients (any n).
    FmaAnyN,
}

/// Kernel-1 grid cap: 64 blocks. 32: 5.60 / 6.50 / 7.01 µs against 5.70 / 5.98 / 6.62; 96 and
/// 128: 6.18 / 6.11 / 7.10 and 6.50 / 6.61 / 7.44 against 5.73 / 5.92 / 6.46 (fewer blocks
/// lengthen the phi walk, more lengthen kernel 2's partial sums). Fixed-point pair: 40 / 96 /
/// 128: 4.99 / 5.44 / 5.89, 5.12 / 5.63 / 6.40, 6.02 / 6.11 / 7.71 against 5.02 / 5.36 / 5.92
/// (more blocks, more limb-add contention).
const PARTIAL_GRID_CAP: usize = 64;
/// Kernel-1 grid cap of the fixed-point pair at batch ≤ 2: 48 blocks. Each accumulator word
/// takes one limb add per block, and the adds' drain before kernel 1 completes is on the path
/// (docs/decisions/mhc.md): at one or two batch rows the chains are short enough that fewer
/// blocks win (same device call, A B B A, µs, MHCPreFwd / MHCPostPreFwd: hidden-1280 3.62 / 3.84
/// against 3.74 / 3.87 at 64, hidden-1920 3.94 / 4.26 against 3.97 / 4.26); at batch 4 they
/// lose (hidden-2560 4.64 / 5.12 against 4.54–4.58 / 4.90–4.93); 80: 3.81–3.84 / 4.06–4.07 /
/// 4.61–4.62 and 3.90 / 4.38 / 4.93.
const FIXED_POINT_SMALL_BATCH_GRID_CAP: usize = 48;
/// Kernel-1 partial blocks (`grid × groups`) from which the fixed-point accumulators take
/// [`abi::ACC_COPIES_MAX`] copies per half (each accumulator line then takes half the limb
/// adds, and kernel 2 loads twice the words): MHCPreFwd hidden-2560 (128 partial blocks)
/// 4.38–4.42 µs against 4.58 with one copy, and MHCPostPreFwd hidden-2560 likewise (with its
/// groups of 2, [`slab_batch_per_group`]); at 48 or 64 partial blocks one copy wins
/// (two: hidden-1280 3.58 against 3.49–3.52, MHCPostPreFwd hidden-2560 in its former one group
/// of 4, 64 partial blocks, 4.90–4.93 against 4.86–4.90; same device call, A B … B A, outputs
/// bitwise equal). Four copies: 3.81 /
/// 4.10–4.13 / 4.51; the count as a launch argument instead of a constant per entry: +0.2 µs.
const ACC_COPIES_MIN_PARTIAL_BLOCKS: u32 = 128;
/// `mhc_pre_partial_fma`'s block: 256 threads.
const FMA_BLOCK: u32 = 256;
/// Kernel 2's block for n ≤ 4 with stored partials (`mhc_pre_mix_small_n`): 256 threads.
const MIX_BLOCK_SMALL_N: u32 = abi::MIX_BLOCK_SMALL_N;
/// The fixed-point kernel 2's block (`mhc_pre_mix_fixed_point`, one column per thread): 128
/// threads, one warp per scheduler. Every warp runs the coefficient chain after its wait, and
/// two warps on one scheduler slow each other's chain (same device call, A B B A, µs: MHCPreFwd
/// 3.78 / 4.00–4.03 / 4.58–4.61 against 3.90 / 4.13 / 4.74 at 256, MHCPostPreFwd 3.87–3.94 /
/// 4.22–4.32 / 4.93–4.96 against 4.00–4.16 / 4.32–4.45 / 4.93–5.06; 64 threads 3.74 / 4.06 /
/// 4.64 and 4.03 / 4.26 / 5.06). Before (with a pass over x before the wait): 256 against 512,
/// 5.06 / 5.34 / 6.18 against 5.38 / 5.82 / 6.40.
const MIX_BLOCK_FIXED_POINT: u32 = 128;
/// Kernel 2's block for n > 4: 512 threads (`mhc_pre_mix`'s tiles of 8 x values per thread).
const MIX_BLOCK_ANY_N: u32 = 512;

impl PreClass {
    /// The row of the tuning table for `shape`; `slab_fits`: the slab kernel 1's phi slab
    /// and staged x fit shared memory at the planned grid ([`slab_fits`]).
    pub fn of(shape: MhcPreShape, slab_fits: bool) -> Self {
        // Measured against the shipped pair on the seed rows and deleted (docs/decisions/mhc.md):
        // - one launch of a 16-block cluster, DSMEM exchange: 9.54 / 10.30 / 10.90 against 6.82 / 7.26 / 8.32 µs;
        // - kernel 1 in 8-block clusters summing partials through DSMEM: +1.1 µs (kernel 1 +1.7);
        // - one cooperative launch with a grid barrier: 6.56 / 6.59 / 7.23 against 5.76 / 6.05 / 6.50 µs;
        // - a polled counter instead of `griddepcontrol.wait`: +0.7…+1.0 µs;
        // - block-major stored partials with the column-per-thread kernel 2: +0.4…+0.8 µs;
        // - block-parallel coefficients (`mhc_pre_mix`) for n ≤ 4: 9.86 / 9.86 / 11.04 against 6.82 / 7.26 / 8.32;
        // - a kernel 1 without tensor cores (one lane per quantity): +1.7…+2.6 µs;
        // - one launch whose last-arriving blocks (arrival counter, polled) mix: 6.56 / 7.87 / 8.88 against 4.77 / 5.38 / 5.86 µs;
        // - kernel 2 as a plain launch, Σx² a 25th accumulator of kernel 1: 5.89 / 6.37 / 6.98 against 4.86 / 5.25 / 5.73 µs;
        // - kernel 1 without shared memory (phi and x loaded per lane into registers, slot butterfly): 8.67 / 12.26 / 22.35 µs;
        // - kernel 1's products as f64 FMAs from the slab (two conversions per product): kernel 1 +0.1…+1.0 µs;
        // - kernel 1's products on fp64 tensor cores (DMMA re-layout of the slab, warp tiles, a second barrier): op 4.96 / 5.28 / 5.78 against 4.51 / 4.90 / 5.89 µs (fused op 4.96 / 5.50 / 6.08 against 4.77 / 5.18 / 5.98);
        // - two f32 chains per thread instead of four: kernel 1 +0.13…+0.17 µs at hidden-1280 and -1920;
        // - one thread per (quantity, slot) for all the group's batch rows (phi loaded once): kernel 1 +0.35…+1.25 µs;
        // - DMMA operands straight from global memory (no slab): kernel 1 +0.5…+2.3 µs;
        // - the accumulator words spread one per 128-byte line (or 32-byte sector): kernel 2 ends +0.9 (+0.3) µs later;
        // - Σx² as kernel 1's 25th item in f32 chains (no Σx² pass in kernel 2): +0.03…+0.39 µs, kernel 1 +0.16…+0.32;
        // - Σx² as kernel 1's 25th accumulator in f64 per slot thread: kernel 1 +0.5…+0.8 µs (row blocks ship instead);
        // - eight threads per kernel-1 block partial instead of four: +0…+0.9 µs;
        // - kernel 2 with launch bounds (more registers): fused op +0.13…+0.32 µs;
        // - kernel 2's column conversions after its Σx² pass, the pass's loads unbranched: +0…+0.38 µs.
        let groups = shape.batch.div_ceil(BTF);
        match (shape.n <= NMAX_SMALL_N, slab_fits && groups <= MAX_GRID_Y, shape.batch <= MAX_GRID_Y) {
            (true, true, true) => Self::FixedPoint,
            (true, true, false) => Self::SlabPartials,
            (true, false, _) => Self::FmaSmallN,
            (false, _, _) => Self::FmaAnyN,
        }
    }
}

/// Batch rows per y-block of the slab kernel 1 (each y-block stages the phi slab and one x
/// tile of its rows). MHCPreFwd splits a batch of 3 to 8 rows (one group of [`BTF`]) into
/// groups of 2, so that a block's partials fit 256 threads (measured with 4 threads per (batch
/// row, quantity); the logit quads take 96 per batch row at n = 4): hidden-2560 (batch 4) 5.70
/// against 5.92 µs in one group of 4 at 512 threads; one row per group 5.82 (and at hidden-1920,
/// batch 2, 5.12 against 4.90 in one group); with kernel 1's row blocks, one group of 4 again
/// 5.06 against 4.96–4.99 µs (same device call, bitwise equal). Larger batches keep groups of 8 (not measured with pairs), whose count is what [`PreClass::of`] checks
/// against the grid's y limit. The fused MHCPostPreFwd takes the same groups: once the row
/// blocks issue every load of their row at once (`row_sumsq` in `kernels-gpu/src/mhc/pre.rs`), its
/// hidden-2560 row in groups of 2 with two accumulator copies takes 4.58–4.61 µs against
/// 4.93–4.96 in one group of 4 (kernel 1 2.94 against 3.26–3.30; same device call, A B … B A).
/// Before that fix, groups of 2 had measured 4.90–4.96 against 4.93–4.96: the row blocks'
/// three DRAM round trips (two rounds of loads, the second round's first half issued after
/// the first chunk's use) were then the end of its kernel 1.
#[doc(hidden)]
pub fn slab_batch_per_group(batch: usize) -> usize {
    if batch <= 2 || batch > BTF {
        batch.clamp(1, BTF)
    } else {
        2
    }
}

/// The slab kernel 1's block for groups of `bpc` batch rows: 256 threads, or 512 when its block
/// partials — 4 threads per (batch row of its group, quantity) in the stored-partials kernel,
/// no fewer than the fixed-point kernel's 16 per (batch row, four logits) — would need a second
/// round at 256 (measured with the tensor-core product it replaced: hidden-2560 (batch 4) 6.25 → 5.95 µs
/// at 512, hidden-1920 (batch 2) 5.44 → 5.70 µs (worse) at 512; 128 threads: kernel 1 3.07 /
/// 4.03 / 4.99 µs against 3.07 / 3.39 / 3.87). 128 threads for one-row groups with the f32
/// chains (2026-12-04): MHCPreFwd hidden-1280 −0.04 µs, MHCPostPreFwd +0.16 µs.
#[doc(hidden)]
pub fn slab_block(shape: MhcPreShape, bpc: usize) -> u32 {
    let items = 4 * bpc * (shape.logits() + 1);
    if items > 256 {
        512
    } else {
        256
    }
}

// ---------------------------------------------------------------- shape and parameters

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

    /// `1/√(n·c)`, the kernels' factor from `√Σx²` to the RMS of a row.
    pub(crate) fn inv_sqrt_nc(&self) -> f64 {
        1.0 / ((self.n * self.c) as f64).sqrt()
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

// ---------------------------------------------------------------- plan

/// Geometry of a slab kernel 1 (`mhc_pre_partial_slab[_fixed_point]`): grid
/// `(grid, groups)`, block `(block, 1, 1)`.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlabPartialGrid {
    /// Blocks along x; block `g` owns channel columns `[g·cols, min((g+1)·cols, c))`.
    pub grid: u32,
    /// Channel columns per block.
    pub cols: u32,
    /// Batch rows per y-block (≤ 8: one staged x tile).
    pub batch_per_group: u32,
    /// y-blocks (`⌈batch / batch_per_group⌉`).
    pub groups: u32,
    /// Threads per block.
    pub block: u32,
    /// Dynamic shared memory per block, bytes ([`slab_partial_smem_bytes`]).
    pub smem: u32,
    /// Fixed point: copies of the accumulators per epoch half (1, or [`abi::ACC_COPIES_MAX`] from
    /// [`ACC_COPIES_MIN_PARTIAL_BLOCKS`] partial blocks, taken by the `_acc2` entries of
    /// MHCPreFwd and of the fused MHCPostPreFwd); 1 for stored partials.
    pub acc_copies: u32,
}

impl SlabPartialGrid {
    /// The launch: `(grid, groups)` partial blocks; with `row_blocks` (the fixed-point kernels
    /// 1), one more block per batch row of a group after them (Σx² and the logit scales),
    /// whose warp sums share the slab's dynamic shared memory ([`abi::ROW_BLOCK_SMEM`]).
    pub(crate) fn launch_dims(&self, row_blocks: bool) -> LaunchDims {
        let (extra, smem) =
            if row_blocks { (self.batch_per_group, self.smem.max(abi::ROW_BLOCK_SMEM)) } else { (0, self.smem) };
        LaunchDims { grid: (self.grid + extra, self.groups, 1), block: (self.block, 1, 1), shared_bytes: smem }
    }
}

/// Geometry of `mhc_pre_partial_fma`: grid `(grid, 1, 1)`, block `(block, 1, 1)`.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FmaPartialGrid {
    /// Blocks; block `g` owns channel columns `[g·cols, min((g+1)·cols, c))`.
    pub grid: u32,
    /// Channel columns per block.
    pub cols: u32,
    /// Columns per staged tile (≤ cols).
    pub jc: u32,
    /// Batch rows per group (≤ 4).
    pub bg: u32,
    /// Threads per block.
    pub block: u32,
    /// Dynamic shared memory per block, bytes ([`partial_smem_bytes`]).
    pub smem: u32,
}

/// Kernel 1 of a plan (split-K partial logits and Σx²).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Partials {
    /// `mhc_pre_partial_slab_fixed_point`: phi slab, f32 FMAs; each block partial added as integer
    /// limbs into one accumulator per (batch row, logit); `mhc_pre_partial_slab_fixed_point_acc2`
    /// when `acc_copies` is 2 (block `g` into copy `g mod 2`).
    SlabFixedPoint(SlabPartialGrid),
    /// `mhc_pre_partial_slab`: phi slab, f32 FMAs; block partials to `part[(β·(m+1) + q)·G + g]`.
    Slab(SlabPartialGrid),
    /// `mhc_pre_partial_fma`: f64 FMAs over staged tiles; the same partial layout as `Slab`.
    Fma(FmaPartialGrid),
}

/// Geometry of a staged-tile kernel 2 (`mhc_pre_mix` / `mhc_pre_mix_small_n`): grid
/// `(batch·tiles, 1, 1)`, block `(block, 1, 1)`.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileMix {
    /// Threads per block.
    pub block: u32,
    /// Channel columns per block (`n·jt ≤ 8·block`).
    pub jt: u32,
    /// Blocks per batch row (`⌈c/jt⌉`).
    pub tiles: u32,
    /// log2 of the slices S per quantity in `mhc_pre_mix`'s partial reduction.
    pub slices_log2: u32,
    /// Dynamic shared memory per block, bytes.
    pub smem: u32,
}

/// Geometry of `mhc_pre_mix_fixed_point`: grid `(tiles, batch)`, one column per thread.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ColumnMix {
    /// Threads per block (= columns per block).
    pub block: u32,
    /// Blocks per batch row (`⌈c/block⌉`).
    pub tiles: u32,
    /// Dynamic shared memory per block, bytes (`256 + 8·block`).
    pub smem: u32,
    /// Kernel 1's [`SlabPartialGrid::acc_copies`] (the `_acc2` entry at 2).
    pub acc_copies: u32,
}

/// Kernel 2 of a plan (reduction, coefficients, mixing; a programmatic dependent launch).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mix {
    /// `mhc_pre_mix_fixed_point`: the logits from the fixed-point accumulators
    /// (`mhc_pre_mix_fixed_point_acc2`, summing both copies, when `acc_copies` is 2).
    FixedPoint(ColumnMix),
    /// `mhc_pre_mix_small_n` (n ≤ 4): one warp per quantity's partial sum, coefficients in one
    /// warp's registers.
    SmallN(TileMix),
    /// `mhc_pre_mix` (any n): slice sums of the partials, block-parallel coefficients.
    AnyN(TileMix),
}

impl Partials {
    /// The PTX entry.
    pub fn kernel(&self) -> &'static str {
        match self {
            Self::SlabFixedPoint(g) if g.acc_copies > 1 => PreKernel::PartialSlabFixedPointAcc2.name(),
            Self::SlabFixedPoint(_) => PreKernel::PartialSlabFixedPoint.name(),
            Self::Slab(_) => PreKernel::PartialSlab.name(),
            Self::Fma(_) => PreKernel::PartialFma.name(),
        }
    }

    /// Blocks along x (= partials per quantity when they are stored).
    pub fn grid(&self) -> u32 {
        match self {
            Self::SlabFixedPoint(g) | Self::Slab(g) => g.grid,
            Self::Fma(g) => g.grid,
        }
    }

    /// Copies of the fixed-point accumulators per epoch half (1 for the stored-partials kernels).
    pub fn acc_copies(&self) -> u32 {
        match self {
            Self::SlabFixedPoint(g) | Self::Slab(g) => g.acc_copies,
            Self::Fma(_) => 1,
        }
    }

    /// `(threads per block, dynamic shared bytes)`.
    fn block_smem(&self) -> (u32, u32) {
        match self {
            Self::SlabFixedPoint(g) | Self::Slab(g) => (g.block, g.smem),
            Self::Fma(g) => (g.block, g.smem),
        }
    }
}

impl Mix {
    /// The PTX entry.
    pub fn kernel(&self) -> &'static str {
        match self {
            Self::FixedPoint(g) if g.acc_copies > 1 => PreKernel::MixFixedPointAcc2.name(),
            Self::FixedPoint(_) => PreKernel::MixFixedPoint.name(),
            Self::SmallN(_) => PreKernel::MixSmallN.name(),
            Self::AnyN(_) => PreKernel::Mix.name(),
        }
    }

    /// `(threads per block, dynamic shared bytes)`.
    fn block_smem(&self) -> (u32, u32) {
        match self {
            Self::FixedPoint(g) => (g.block, g.smem),
            Self::SmallN(g) | Self::AnyN(g) => (g.block, g.smem),
        }
    }
}

/// The slab kernel 1's dynamic shared memory (mirror of the kernel's `layout_slab`), bytes:
/// phi slab, staged x and the group's partials.
#[doc(hidden)]
pub fn slab_partial_smem_bytes(n: usize, cw: usize) -> usize {
    let m = n * n + 2 * n;
    let rows = n * cw;
    (4 * rows * m).next_multiple_of(16) + (2 * BTF * rows).next_multiple_of(16) + 8 * BTF * (m + 1)
}

/// `mhc_pre_partial_fma`'s dynamic shared memory (mirror of `layout1`), bytes.
#[doc(hidden)]
pub fn partial_smem_bytes(block: usize, bg: usize, n: usize, jc: usize) -> usize {
    let mq = n * n + 2 * n + 1;
    (8 * (BT * block + bg * mq) + 2 * bg * n * jc).next_multiple_of(16)
}

/// `mhc_pre_mix`'s dynamic shared memory (mirror of `layout2`), bytes.
#[doc(hidden)]
pub fn mix_smem_bytes(slices: usize, n: usize, jt: usize) -> usize {
    let mq = n * n + 2 * n + 1;
    (8 * (mq * slices + mq + n * n) + 4 * (2 * n * n + n) + 2 * n * jt).next_multiple_of(16)
}

/// Whether the slab kernel 1 fits `shape` with `cols` columns per block: n ≤ 4, its
/// shared memory within `max_smem`, and its multiply-high indices ≤ 2^16.
#[doc(hidden)]
pub fn slab_fits(shape: MhcPreShape, cols: usize, max_smem: usize) -> bool {
    let n = shape.n;
    n <= NMAX_SMALL_N && slab_partial_smem_bytes(n, cols) <= max_smem && BTF * n * cols <= 1 << 16
}

/// A validated shape with its kernel pair and launch geometry on one device (no device
/// memory): what [`pre_fwd_raw`] launches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrePlan {
    pub shape: MhcPreShape,
    /// Workspace length, u64 words: the fixed-point pair's two accumulator halves of
    /// `acc_copies·batch·(n²+2n)·5` words (`kernel_abi::mhc::acc_word`), an epoch word and three
    /// f64 logit scales per batch row, else one f64 partial per (batch row,
    /// quantity, kernel-1 block), the quantities being the `n²+2n` logits and Σx².
    pub workspace: usize,
    /// Kernel 1.
    #[doc(hidden)]
    pub partials: Partials,
    /// Kernel 2.
    #[doc(hidden)]
    pub mix: Mix,
}

impl PrePlan {
    /// Plans `shape` on `gpu`: the device's SM count and opt-in shared memory into
    /// [`PrePlan::for_device`], then raises the kernels' shared-memory limits and checks one
    /// block of each fits on a multiprocessor.
    ///
    /// Errors: those of [`PrePlan::for_device`]; a driver error; [`Error::Shape`] naming `n`
    /// when a block of either kernel does not fit on a multiprocessor.
    pub fn new(gpu: &Gpu, shape: MhcPreShape) -> Result<Self> {
        use sys::CUdevice_attribute as A;
        let ctx = gpu.context();
        let sms = ctx.attribute(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as usize;
        let max_smem = ctx.attribute(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)? as usize;
        let plan = Self::for_device(shape, sms, max_smem)?;
        for (name, (block, smem)) in
            [(plan.partials.kernel(), plan.partials.block_smem()), (plan.mix.kernel(), plan.mix.block_smem())]
        {
            prepare_kernel(gpu, name, block, smem)?;
        }
        Ok(plan)
    }

    /// The scalar parameters as words of a graph-cache key (a call's launches depend on them).
    pub(crate) fn key_words(params: MhcPreParams) -> [u64; 5] {
        let bits = |v: f32| v.to_bits() as u64;
        let MhcPreParams { alpha_pre, alpha_post, alpha_res, sinkhorn_repeat, sinkhorn_eps } = params;
        [sinkhorn_repeat as u64, bits(alpha_pre), bits(alpha_post), bits(alpha_res), bits(sinkhorn_eps)]
    }

    /// The planner, on the CPU: the kernel pair of `shape` ([`PreClass::of`]) and its geometry on
    /// a device with `sms` multiprocessors and `max_smem` bytes of opt-in shared memory per block.
    /// Kernel 1: the columns split evenly over `min(c, sms, 64)` blocks (48 for the fixed-point
    /// pair at batch ≤ 2). Kernel 2: tiles of
    /// `jt = min(c, block, ⌊8·block/n⌋)` columns per batch row (one column per thread for the
    /// fixed-point pair).
    ///
    /// Errors: those of [`MhcPreShape::lens`]; [`Error::Shape`] naming `n` when even one batch
    /// row and one column exceed `max_smem` (or kernel 2's tile cannot hold one column);
    /// [`Error::Overflow`] naming `x` when the workspace or a grid exceeds 32-bit indexing.
    #[doc(hidden)]
    pub fn for_device(shape: MhcPreShape, sms: usize, max_smem: usize) -> Result<Self> {
        let lens = shape.lens()?;
        let MhcPreShape { batch, n, c } = shape;
        let mq = shape.logits() + 1;
        let split = |cap: usize| {
            let cols = c.div_ceil(c.min(sms.max(1)).min(cap));
            (cols, c.div_ceil(cols))
        };
        let (mut cols, mut grid) = split(PARTIAL_GRID_CAP);
        let class = PreClass::of(shape, slab_fits(shape, cols, max_smem));
        if class == PreClass::FixedPoint && batch <= 2 {
            let (cols_small, grid_small) = split(FIXED_POINT_SMALL_BATCH_GRID_CAP);
            if PreClass::of(shape, slab_fits(shape, cols_small, max_smem)) == class {
                (cols, grid) = (cols_small, grid_small);
            }
        }
        let too_big = |smem: usize| Error::Shape {
            arg: "n",
            msg: format!("n = {n} needs {smem} bytes of shared memory per block, the device has {max_smem}"),
        };
        let slab_grid = || {
            let bpc = slab_batch_per_group(batch);
            let block = slab_block(shape, bpc);
            let groups = batch.div_ceil(bpc) as u32;
            let acc_copies = if class == PreClass::FixedPoint
                && grid as u32 >= abi::ACC_COPIES_MAX
                && grid as u32 * groups >= ACC_COPIES_MIN_PARTIAL_BLOCKS
            {
                abi::ACC_COPIES_MAX
            } else {
                1
            };
            SlabPartialGrid {
                grid: grid as u32,
                cols: cols as u32,
                batch_per_group: bpc as u32,
                groups,
                block,
                smem: slab_partial_smem_bytes(n, cols) as u32,
                acc_copies,
            }
        };
        let partials = match class {
            PreClass::FixedPoint => Partials::SlabFixedPoint(slab_grid()),
            PreClass::SlabPartials => Partials::Slab(slab_grid()),
            PreClass::FmaSmallN | PreClass::FmaAnyN => {
                let block = FMA_BLOCK as usize;
                let mut bg = batch.min(BT);
                let tile = |bg: usize| cols.min((XS_BUDGET / (2 * bg * n)).max(1));
                let mut jc = tile(bg);
                while partial_smem_bytes(block, bg, n, jc) > max_smem && bg > 1 {
                    bg -= 1;
                    jc = tile(bg);
                }
                if partial_smem_bytes(block, bg, n, jc) > max_smem {
                    jc = 1;
                }
                let smem = partial_smem_bytes(block, bg, n, jc);
                if smem > max_smem {
                    return Err(too_big(smem));
                }
                // The kernel's multiply-high divisions need every divisor and dividend ≤ 2^16.
                debug_assert!(jc <= 1 << 14 && bg * n * jc <= 1 << 16);
                Partials::Fma(FmaPartialGrid {
                    grid: grid as u32,
                    cols: cols as u32,
                    jc: jc as u32,
                    bg: bg as u32,
                    block: FMA_BLOCK,
                    smem: smem as u32,
                })
            }
        };
        let mb = if class == PreClass::FixedPoint {
            MIX_BLOCK_FIXED_POINT
        } else if n <= NMAX_SMALL_N {
            MIX_BLOCK_SMALL_N
        } else {
            MIX_BLOCK_ANY_N
        } as usize;
        if n > UN * mb {
            return Err(Error::Shape { arg: "n", msg: format!("n = {n} exceeds {UN}·{mb} (kernel 2's tile)") });
        }
        let (mix, tiles, workspace) = if class == PreClass::FixedPoint {
            let tiles = c.div_ceil(c.min(mb));
            let mix = Mix::FixedPoint(ColumnMix {
                block: mb as u32,
                tiles: tiles as u32,
                smem: abi::mix_fixed_point_smem(mb as u32),
                acc_copies: partials.acc_copies(),
            });
            // The accumulator halves (`abi::acc_word`), the epoch word, then three logit scales
            // per batch row.
            let copies = partials.acc_copies() as usize;
            (
                mix,
                tiles,
                2 * checked_product("x", &[copies, batch, shape.logits(), ACC_WORDS])? + 1 + ROW_SCALES * batch,
            )
        } else {
            let jt = c.min(mb).min(UN * mb / n);
            let tiles = c.div_ceil(jt);
            // S: a power of two, (m+1)·S ≤ block where possible, S ≤ 32 and S ≤ G.
            let mut slices_log2 = 0;
            while slices_log2 < 5 && mq << (slices_log2 + 1) <= mb && 1 << (slices_log2 + 1) <= grid {
                slices_log2 += 1;
            }
            let small_n = n <= NMAX_SMALL_N;
            let smem = if small_n {
                (MIX_SMALL_N_SMEM_HEAD + 2 * n * jt).next_multiple_of(16)
            } else {
                mix_smem_bytes(1 << slices_log2, n, jt)
            };
            let tm = TileMix { block: mb as u32, jt: jt as u32, tiles: tiles as u32, slices_log2, smem: smem as u32 };
            let mix = if small_n { Mix::SmallN(tm) } else { Mix::AnyN(tm) };
            (mix, tiles, checked_product("x", &[batch, mq, grid])?)
        };
        let mix_smem = mix.block_smem().1 as usize;
        if mix_smem > max_smem {
            return Err(too_big(mix_smem));
        }
        let mix_grid = checked_product("x", &[batch, tiles])?;
        if workspace >= 1 << 31 || mix_grid >= 1 << 31 || lens.x_layer >= 1 << 31 {
            return Err(Error::Overflow { arg: "x", msg: format!("batch {batch}: workspace or grid exceeds 2^31") });
        }
        Ok(Self { shape, workspace, partials, mix })
    }

    /// The PTX entries this plan launches (kernel 1, kernel 2).
    #[doc(hidden)]
    pub fn kernels(&self) -> [&'static str; 2] {
        [self.partials.kernel(), self.mix.kernel()]
    }
}

/// Readies kernel `name` for blocks of `block` threads with `smem` bytes of dynamic shared
/// memory: raises its limit ([`raise_smem_limit`]) and checks one block fits on a
/// multiprocessor. Errors: [`Error::Shape`] naming `n` when it does not, or a driver error.
pub(crate) fn prepare_kernel(gpu: &Gpu, name: &'static str, block: u32, smem: u32) -> Result<()> {
    let f = gpu.function(name)?;
    raise_smem_limit(f, smem)?;
    if f.occupancy_max_active_blocks_per_multiprocessor(block, smem as usize, None)? == 0 {
        return Err(Error::Shape {
            arg: "n",
            msg: format!("{name}: {block} threads with {smem} bytes of shared memory do not fit on a multiprocessor"),
        });
    }
    Ok(())
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

/// Shapes that between them reach every row of the tuning table and every fallback (the
/// reachability sweep of `planned_kernels`).
pub(crate) const SWEEP_SHAPES: &[MhcPreShape] = &[
    MhcPreShape { batch: 1, n: 4, c: 1280 },
    MhcPreShape { batch: 2, n: 4, c: 1920 },
    MhcPreShape { batch: 4, n: 4, c: 2560 },
    // 8 groups of 8 rows: the `_acc2` pair from 16 SMs up.
    MhcPreShape { batch: 64, n: 4, c: 1280 },
    MhcPreShape { batch: 5, n: 3, c: 7 },
    MhcPreShape { batch: 3, n: 1, c: 1 },
    MhcPreShape { batch: 70_000, n: 4, c: 8 },
    MhcPreShape { batch: 600_000, n: 1, c: 1 },
    MhcPreShape { batch: 1, n: 4, c: 70_000 },
    MhcPreShape { batch: 2, n: 2, c: 200_000 },
    MhcPreShape { batch: 9, n: 8, c: 1030 },
    MhcPreShape { batch: 2, n: 16, c: 300 },
];

// ---------------------------------------------------------------- op and launch

/// The inputs of [`MhcPre::run`] (docs/ops.md §2): `phi` `[n·c, n²+2n]` f32, `x` `[batch, n·c]`
/// bf16, `b` `[n²+2n]` f32. Any `cudarc` buffer or view.
#[derive(Clone, Copy)]
pub struct MhcPreInputs<'a> {
    pub phi: &'a dyn DevicePtr<f32>,
    pub x: &'a dyn DevicePtr<bf16>,
    pub b: &'a dyn DevicePtr<f32>,
}

/// The outputs of [`MhcPre::run`] (docs/ops.md §2): `x_res` `[batch, n·c]` bf16, `x_layer`
/// `[batch, c]` bf16, `h_post` `[batch, n]` f32.
pub struct MhcPreOutputs<'a> {
    pub x_res: &'a mut dyn DevicePtrMut<bf16>,
    pub x_layer: &'a mut dyn DevicePtrMut<bf16>,
    pub h_post: &'a mut dyn DevicePtrMut<f32>,
}

/// MHCPreFwd for one shape, owning its workspace: create once, [`MhcPre::run`] many times.
///
/// ```no_run
/// use rgk::{bf16, Gpu, mhc::{MhcPre, MhcPreInputs, MhcPreOutputs, MhcPreParams, MhcPreShape}};
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
/// let inputs = MhcPreInputs { phi: &phi, x: &x, b: &b };
/// let outputs = MhcPreOutputs { x_res: &mut x_res, x_layer: &mut x_layer, h_post: &mut h_post };
/// op.run(&gpu, MhcPreParams::default(), inputs, outputs)?;
/// # Ok(()) }
/// ```
pub struct MhcPre {
    plan: PrePlan,
    workspace: CudaSlice<u64>,
    graph: GraphReplay,
}

impl MhcPre {
    /// Plans `shape` ([`PrePlan::new`]) and allocates the workspace (`plan.workspace` u64
    /// words, zeroed).
    pub fn new(gpu: &Gpu, shape: MhcPreShape) -> Result<Self> {
        let plan = PrePlan::new(gpu, shape)?;
        let workspace = gpu.stream().alloc_zeros::<u64>(plan.workspace)?;
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
    /// The two kernels are submitted as one CUDA graph (captured on the first call and replayed
    /// while the buffers and parameters are unchanged): inside a graph the second kernel's
    /// programmatic dependent launch overlaps the first (direct launches arrive too far apart
    /// for that: 7.36 / 7.71 / 8.74 µs against 5.76 / 6.05 / 6.50 on the seed rows).
    ///
    /// Errors: [`Error::BufferTooSmall`] naming the buffer, [`Error::Shape`] naming a bad
    /// parameter, or a driver error from the launch.
    pub fn run(
        &mut self,
        gpu: &Gpu,
        params: MhcPreParams,
        inputs: MhcPreInputs<'_>,
        outputs: MhcPreOutputs<'_>,
    ) -> Result<()> {
        let MhcPreInputs { phi, x, b } = inputs;
        let MhcPreOutputs { x_res, x_layer, h_post } = outputs;
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
        // SAFETY: every buffer was checked to hold the elements the shape addresses, `&mut`
        // borrows keep the outputs apart from the inputs; the calls are ordered on this stream.
        unsafe { self.run_raw(gpu, params, [p, xp, bp], [r, y, h], st.cu_stream()) }
    }

    /// [`MhcPre::run`] on raw device pointers, launched on `stream` through this value's graph
    /// and with its workspace: `inputs` = `[phi, x, b]`, `outputs` = `[x_res, x_layer,
    /// h_post]`. Errors: those of [`pre_fwd_raw`], or a driver error.
    ///
    /// # Safety
    /// As [`pre_fwd_raw`] for the pointers; `stream` belongs to `gpu`'s context, and all calls
    /// with one `MhcPre` are ordered on one stream (the workspace carries state between them).
    /// The workspace's buffer events are recorded on [`Gpu::stream`], not on `stream`: with
    /// another stream, the caller keeps this `MhcPre` alive until its launches finish.
    pub unsafe fn run_raw(
        &mut self,
        gpu: &Gpu,
        params: MhcPreParams,
        inputs: [CUdeviceptr; 3],
        outputs: [CUdeviceptr; 3],
        stream: CUstream,
    ) -> Result<()> {
        let [p, xp, bp] = inputs;
        let [r, y, h] = outputs;
        let ws_len = self.workspace.len();
        let (w, _g) = self.workspace.device_ptr_mut(gpu.stream());
        let plan = &self.plan;
        let call = |s| pre_fwd_raw(gpu, plan, params, p, xp, bp, r, y, h, w, ws_len, s);
        let mut key = vec![p, xp, bp, r, y, h, w, ws_len as u64];
        key.extend(PrePlan::key_words(params));
        self.graph.run(gpu, stream, key, call)
    }
}

/// MHCPreFwd on raw device pointers with a caller-owned workspace, launched on `stream` as two
/// kernels (the second a programmatic dependent launch; no graph).
///
/// `workspace`: at least `plan.workspace` u64 words, 8-byte aligned. With the fixed-point pair
/// (n ≤ 4, batch ≤ 65535, the usual case) the whole workspace is state: all zero before the
/// first call with it, then left to the kernels (each call's kernel 1 adds into the half the
/// epoch word's parity names and zeroes the other, and rewrites the three logit scales per
/// batch row that follow the epoch word; kernel 2 flips the parity). Otherwise it is
/// scratch (any contents: kernel 1 overwrites every word kernel 2 reads). One workspace must
/// not serve two calls that may run concurrently (different streams).
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
    let (partials, mix) = pre_fwd_launches(plan, params, phi, x, b, x_res, x_layer, h_post, workspace, workspace_len)?;
    match partials {
        PrePartialsLaunch::Slab(p) => launch_planned(gpu.function(p.kernel)?, &p, stream)?,
        PrePartialsLaunch::Fma(p) => launch_planned(gpu.function(p.kernel)?, &p, stream)?,
    }
    match mix {
        PreMixLaunch::FixedPoint(p) => launch_planned(gpu.function(p.kernel)?, &p, stream),
        PreMixLaunch::Tile(p) => launch_planned(gpu.function(p.kernel)?, &p, stream),
    }
}

/// Kernel 1 of an MHCPreFwd launch pair.
#[doc(hidden)]
#[derive(Clone, Copy, Debug)]
pub enum PrePartialsLaunch {
    Slab(Planned<PrePartialSlabArgs>),
    Fma(Planned<PrePartialFmaArgs>),
}

/// Kernel 2 of an MHCPreFwd launch pair.
#[doc(hidden)]
#[derive(Clone, Copy, Debug)]
pub enum PreMixLaunch {
    FixedPoint(Planned<PreMixFixedPointArgs>),
    Tile(Planned<PreMixArgs>),
}

/// The two launches [`pre_fwd_raw`] submits for `plan` on these device addresses (validated
/// as there).
#[doc(hidden)]
#[allow(clippy::too_many_arguments)]
pub fn pre_fwd_launches(
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
) -> Result<(PrePartialsLaunch, PreMixLaunch)> {
    plan.shape.lens()?;
    params.validate()?;
    check_len("workspace", plan.workspace, workspace_len)?;
    if !workspace.is_multiple_of(8) {
        return Err(Error::Shape { arg: "workspace", msg: "not 8-byte aligned".into() });
    }
    let s = plan.shape;
    let kernel = plan.partials.kernel();
    let (phi, x, part_ws) = (phi as *const f32, x as *const u16, workspace as *mut f64);
    let (batch, n, c) = (s.batch as u32, s.n as u32, s.c as u32);
    let inv_sqrt_nc = s.inv_sqrt_nc();
    let partials = match plan.partials {
        Partials::SlabFixedPoint(g) | Partials::Slab(g) => {
            let args = PrePartialSlabArgs {
                phi,
                x,
                part_ws,
                batch,
                n,
                c,
                cw: g.cols,
                bpc: g.batch_per_group,
                alpha_pre: params.alpha_pre,
                alpha_post: params.alpha_post,
                alpha_res: params.alpha_res,
                inv_sqrt_nc,
            };
            let dims = g.launch_dims(matches!(plan.partials, Partials::SlabFixedPoint(_)));
            PrePartialsLaunch::Slab(Planned { kernel, dims, args, dependent: false })
        }
        Partials::Fma(g) => {
            let mc = (s.logits() as u32 + 1).min(g.block);
            let args = PrePartialFmaArgs {
                phi,
                x,
                part_ws,
                batch,
                n,
                c,
                cols: g.cols,
                jc: g.jc,
                bg: g.bg,
                ngroups: s.batch.div_ceil(g.bg as usize) as u32,
                njc_full: g.cols.div_ceil(g.jc),
                mc,
                mc_magic: abi::fastdiv_magic(mc),
                jc_magic: abi::fastdiv_magic(g.jc),
            };
            let dims = LaunchDims { grid: (g.grid, 1, 1), block: (g.block, 1, 1), shared_bytes: g.smem };
            PrePartialsLaunch::Fma(Planned { kernel, dims, args, dependent: false })
        }
    };
    let kernel = plan.mix.kernel();
    let (bias, part_ws) = (b as *const f32, part_ws as *const f64);
    let (x_res, x_layer, h_post) = (x_res as *mut u16, x_layer as *mut u16, h_post as *mut f32);
    let grid1 = plan.partials.grid();
    let (alpha_pre, alpha_post, alpha_res) = (params.alpha_pre, params.alpha_post, params.alpha_res);
    let (repeat, eps) = (params.sinkhorn_repeat, params.sinkhorn_eps);
    let mix = match plan.mix {
        Mix::FixedPoint(g) => {
            let args =
                PreMixFixedPointArgs { x, bias, part_ws, x_res, x_layer, h_post, batch, n, c, grid1, repeat, eps };
            let dims = LaunchDims { grid: (g.tiles, s.batch as u32, 1), block: (g.block, 1, 1), shared_bytes: g.smem };
            PreMixLaunch::FixedPoint(Planned { kernel, dims, args, dependent: true })
        }
        Mix::SmallN(g) | Mix::AnyN(g) => {
            let args = PreMixArgs {
                x,
                bias,
                part_ws,
                x_res,
                x_layer,
                h_post,
                n,
                c,
                grid1,
                tiles: g.tiles,
                jt: g.jt,
                jt_magic: abi::fastdiv_magic(g.jt),
                jl_magic: abi::fastdiv_magic(s.c as u32 - (g.tiles - 1) * g.jt),
                ls: g.slices_log2,
                alpha_pre,
                alpha_post,
                alpha_res,
                repeat,
                eps,
                inv_sqrt_nc,
            };
            let dims =
                LaunchDims { grid: (s.batch as u32 * g.tiles, 1, 1), block: (g.block, 1, 1), shared_bytes: g.smem };
            PreMixLaunch::Tile(Planned { kernel, dims, args, dependent: true })
        }
    };
    Ok((partials, mix))
}
