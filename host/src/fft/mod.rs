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
//! Storage: interleaved complex, `x: [batch, n]` contiguous, element `j` of transform `b` at
//! reals `2(b·n + j)` (re) and `2(b·n + j) + 1` (im); c64 buffers are `f32` slices of
//! `2·n·batch`, c128 buffers `f64` slices of `2·n·batch` (a `[*B, n, 2]` real view, as
//! `torch.view_as_real` gives).
use cudarc::driver::sys::{CUdeviceptr, CUfunction_attribute_enum, CUstream};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};

use crate::error::check_len;
use crate::runtime::{launch, launch_pdl, GraphReplay, LaunchDims};
use crate::{Error, Gpu, Result};

#[cfg(test)]
mod emu;
mod floor;
#[cfg(test)]
mod model;
mod plan;

pub use floor::CopyChain;
pub use plan::MAX_ELEMENTS;

/// Streaming multiprocessors assumed when the driver does not say (the H200's 132; the count
/// only sizes persistent grids, never changes a result).
const DEFAULT_SMS: u32 = 132;
use plan::{decompose_k, max_log_n, max_single_log, Pass, PlanPtrs};

const KERNELS_C64: [&str; 13] = [
    "fft_c64_l1",
    "fft_c64_l2",
    "fft_c64_l3",
    "fft_c64_l4",
    "fft_c64_l5",
    "fft_c64_l6",
    "fft_c64_l7",
    "fft_c64_l8",
    "fft_c64_l9",
    "fft_c64_l10",
    "fft_c64_l11",
    "fft_c64_l12",
    "fft_c64_l13",
];
const KERNELS_C128: [&str; 12] = [
    "fft_c128_l1",
    "fft_c128_l2",
    "fft_c128_l3",
    "fft_c128_l4",
    "fft_c128_l5",
    "fft_c128_l6",
    "fft_c128_l7",
    "fft_c128_l8",
    "fft_c128_l9",
    "fft_c128_l10",
    "fft_c128_l11",
    "fft_c128_l12",
];

/// The stage-table kernels (same lengths, `_st`): per-stage coalesced twiddle tables, loaded
/// at kernel start.
const KERNELS_C64_ST: [&str; 13] = [
    "fft_c64_l1_st",
    "fft_c64_l2_st",
    "fft_c64_l3_st",
    "fft_c64_l4_st",
    "fft_c64_l5_st",
    "fft_c64_l6_st",
    "fft_c64_l7_st",
    "fft_c64_l8_st",
    "fft_c64_l9_st",
    "fft_c64_l10_st",
    "fft_c64_l11_st",
    "fft_c64_l12_st",
    "fft_c64_l13_st",
];
const KERNELS_C128_ST: [&str; 12] = [
    "fft_c128_l1_st",
    "fft_c128_l2_st",
    "fft_c128_l3_st",
    "fft_c128_l4_st",
    "fft_c128_l5_st",
    "fft_c128_l6_st",
    "fft_c128_l7_st",
    "fft_c128_l8_st",
    "fft_c128_l9_st",
    "fft_c128_l10_st",
    "fft_c128_l11_st",
    "fft_c128_l12_st",
];

/// The stage-table kernels without hoisting (`_stn`): twiddles loaded in each stage.
const KERNELS_C64_STN: [&str; 13] = [
    "fft_c64_l1_stn",
    "fft_c64_l2_stn",
    "fft_c64_l3_stn",
    "fft_c64_l4_stn",
    "fft_c64_l5_stn",
    "fft_c64_l6_stn",
    "fft_c64_l7_stn",
    "fft_c64_l8_stn",
    "fft_c64_l9_stn",
    "fft_c64_l10_stn",
    "fft_c64_l11_stn",
    "fft_c64_l12_stn",
    "fft_c64_l13_stn",
];
const KERNELS_C128_STN: [&str; 12] = [
    "fft_c128_l1_stn",
    "fft_c128_l2_stn",
    "fft_c128_l3_stn",
    "fft_c128_l4_stn",
    "fft_c128_l5_stn",
    "fft_c128_l6_stn",
    "fft_c128_l7_stn",
    "fft_c128_l8_stn",
    "fft_c128_l9_stn",
    "fft_c128_l10_stn",
    "fft_c128_l11_stn",
    "fft_c128_l12_stn",
];

/// PTX entries of the FFT.
pub(crate) const KERNELS: &[&str] = &[
    KERNELS_C64[0],
    KERNELS_C64[1],
    KERNELS_C64[2],
    KERNELS_C64[3],
    KERNELS_C64[4],
    KERNELS_C64[5],
    KERNELS_C64[6],
    KERNELS_C64[7],
    KERNELS_C64[8],
    KERNELS_C64[9],
    KERNELS_C64[10],
    KERNELS_C64[11],
    KERNELS_C64[12],
    KERNELS_C128[0],
    KERNELS_C128[1],
    KERNELS_C128[2],
    KERNELS_C128[3],
    KERNELS_C128[4],
    KERNELS_C128[5],
    KERNELS_C128[6],
    KERNELS_C128[7],
    KERNELS_C128[8],
    KERNELS_C128[9],
    KERNELS_C128[10],
    KERNELS_C128[11],
    KERNELS_C64_ST[0],
    KERNELS_C64_ST[1],
    KERNELS_C64_ST[2],
    KERNELS_C64_ST[3],
    KERNELS_C64_ST[4],
    KERNELS_C64_ST[5],
    KERNELS_C64_ST[6],
    KERNELS_C64_ST[7],
    KERNELS_C64_ST[8],
    KERNELS_C64_ST[9],
    KERNELS_C64_ST[10],
    KERNELS_C64_ST[11],
    KERNELS_C64_ST[12],
    KERNELS_C128_ST[0],
    KERNELS_C128_ST[1],
    KERNELS_C128_ST[2],
    KERNELS_C128_ST[3],
    KERNELS_C128_ST[4],
    KERNELS_C128_ST[5],
    KERNELS_C128_ST[6],
    KERNELS_C128_ST[7],
    KERNELS_C128_ST[8],
    KERNELS_C128_ST[9],
    KERNELS_C128_ST[10],
    KERNELS_C128_ST[11],
    KERNELS_C64_STN[0],
    KERNELS_C64_STN[1],
    KERNELS_C64_STN[2],
    KERNELS_C64_STN[3],
    KERNELS_C64_STN[4],
    KERNELS_C64_STN[5],
    KERNELS_C64_STN[6],
    KERNELS_C64_STN[7],
    KERNELS_C64_STN[8],
    KERNELS_C64_STN[9],
    KERNELS_C64_STN[10],
    KERNELS_C64_STN[11],
    KERNELS_C64_STN[12],
    KERNELS_C128_STN[0],
    KERNELS_C128_STN[1],
    KERNELS_C128_STN[2],
    KERNELS_C128_STN[3],
    KERNELS_C128_STN[4],
    KERNELS_C128_STN[5],
    KERNELS_C128_STN[6],
    KERNELS_C128_STN[7],
    KERNELS_C128_STN[8],
    KERNELS_C128_STN[9],
    KERNELS_C128_STN[10],
    KERNELS_C128_STN[11],
    plan::EXTRA_KERNEL_NAMES[0],
    plan::EXTRA_KERNEL_NAMES[1],
    plan::EXTRA_KERNEL_NAMES[2],
    plan::EXTRA_KERNEL_NAMES[3],
    plan::EXTRA_KERNEL_NAMES[4],
    plan::EXTRA_KERNEL_NAMES[5],
    plan::EXTRA_KERNEL_NAMES[6],
    plan::EXTRA_KERNEL_NAMES[7],
    plan::EXTRA_KERNEL_NAMES[8],
    plan::EXTRA_KERNEL_NAMES[9],
    plan::SPLIT_KERNELS[0].0,
    plan::SPLIT_KERNELS[1].0,
    plan::SPLIT_KERNELS[2].0,
    floor::KERNEL,
];

/// The complex storage type of a transform.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Precision {
    /// complex64: interleaved `(f32 re, f32 im)`, 8 bytes per element.
    C64,
    /// complex128: interleaved `(f64 re, f64 im)`, 16 bytes per element.
    C128,
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

/// When a row pass launches fewer blocks than it has groups of transforms (persistent blocks
/// that loop, prefetching their next group into L2 while computing the current one).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Persist {
    /// Persistent when the groups exceed two waves of resident blocks; then one block per
    /// resident slot (the default).
    Auto,
    /// Never: one block per group.
    Never,
    /// Persistent whenever the groups exceed `k` blocks per SM; then `k` blocks per SM.
    PerSm(u32),
}

/// Plan options (for tuning and the bench's variant rows); [`FftOptions::default`] is what
/// [`FftPlan::new`] uses.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FftOptions {
    /// Persistent grids of the row passes.
    pub persist: Persist,
    /// Run the stage-table kernels (`fft_*_l*_st`: per-stage twiddle tables read coalesced,
    /// every stage's twiddles loaded at kernel start instead of after each barrier). A pass
    /// whose stage-table kernel allows fewer threads per block than the plan chose takes fewer
    /// transforms per block, or the `W_Lt`-table kernel if even one is too many.
    pub stage_twiddles: bool,
    /// With `stage_twiddles`: load every stage's twiddles at kernel start (`_st` kernels, more
    /// registers); `false`: in each stage, after its barrier (`_stn`, the registers of the
    /// `W_Lt` kernels).
    pub hoist_twiddles: bool,
    /// With hoisted stage tables: c64 one-pass lengths 1024 and 4096 with 8 elements per thread
    /// (kernels `fft_c64_l{10,12}_st8`: 128 / 512 threads per transform, 4 radix-8 stages).
    pub e8: bool,
    /// With hoisted stage tables: ping-pong shared memory where a kernel exists (c64 512, 1024,
    /// 4096; `_stp`, `_st8p`): one barrier per stage instead of two.
    pub ping_pong: bool,
    /// With hoisted stage tables: the row pass's input `cp.async`-staged in shared memory, the
    /// next group's copy overlapping the current group (c64 64, 512, 1024; `_sta`). Falls
    /// back to the `_st` kernel at execution when `x` is not 16-byte aligned.
    pub staged: bool,
    /// Row passes: threads per block aimed for and the floor of the halving rule (0: 256,
    /// halving down to 64 while there are fewer than two blocks per SM).
    pub row_threads: u32,
    /// Four-step passes: most transforms (columns) per block (0: 16).
    pub cols: u32,
    /// With stage tables: c64 n = 2^14 / 2^15 in ONE pass of `2^split` blocks per transform
    /// where a kernel exists (`split` 1: 16384 as 2 × 8192; 2: 16384 as 4 × 4096, 32768 as
    /// 4 × 8192), each block computing every `2^split`-th output from the whole input (no
    /// workspace). 0: off.
    pub split: u32,
    /// Passes after the first are programmatic dependent launches (every kernel lets the next
    /// start at entry and waits for the previous before touching memory): the next pass's
    /// launch and block start-up overlap the current pass.
    pub pdl: bool,
    /// Multi-pass plans: the safe entries submit a call's passes as one CUDA graph (captured
    /// on the first call with a pair of buffers, replayed when it recurs), so the dependent
    /// launches actually overlap (separate host launches reach the device too far apart).
    pub graph: bool,
    /// Four-step plans: `log2` of the column-pass length `n1` (`n = n1·n2`, pass 1 transforms
    /// the `n2` columns of length `n1`, pass 2 the `n1` rows of length `n2`). 0, or a split whose
    /// lengths do not both fit one pass: the balanced `n1 = 2^⌊log2 n / 2⌋`.
    pub log_n1: u32,
    /// Every pass waits for the previous one (`griddepcontrol.wait`) at kernel entry, before
    /// loading its twiddles (session 6); `false`: after issuing the twiddle loads, so a
    /// dependent pass's twiddle round trip overlaps the previous pass (session 7).
    pub wait_first: bool,
}

impl Default for FftOptions {
    /// The v1 kernels (`W_Lt` twiddle tables read after each barrier), persistent grids `Auto`.
    fn default() -> Self {
        FftOptions {
            persist: Persist::Auto,
            stage_twiddles: false,
            hoist_twiddles: true,
            e8: false,
            ping_pong: false,
            staged: false,
            row_threads: 0,
            cols: 0,
            split: 0,
            pdl: true,
            graph: true,
            log_n1: 0,
            wait_first: false,
        }
    }
}

impl FftOptions {
    /// What [`FftPlan::new`] plans for `n` (measured on the H200, 2026-11-29 session 3, bench
    /// `--variants`): the stage-table kernels everywhere (latency-4k 5.86 → 3.65 µs,
    /// throughput-4k 6.66 → 4.38, fnet-512 16.38 → 12.83); their twiddles hoisted to kernel start
    /// except for n ≥ 2^20 (scientific-1m: hoisted 176.8, in-stage 138.3, v1 155.8 — the
    /// hoisting kernels' registers shrink the 1024-point column passes); no persistent grid for
    /// n ≤ 64 (shortconv-64: 19.54 against 21.12).
    ///
    /// Session 4 (H200, `--variants`, graph submission): c64 1024 with 8 elements per thread
    /// and ping-pong shared memory (spectrogram-1k 3.81 → 3.46 µs, -b300 4.22 → 4.03), c64
    /// 4096 with ping-pong (throughput-4k 4.32 → 4.16), row-pass blocks of 64 threads at c64
    /// 512 (fnet-512 12.74 → 11.33) and of 128 at c64 64 (shortconv-64 19.26 → 18.82).
    ///
    /// Session 5: uneven four-step splits `n1 = 2^6` for c64 2^14 and 2^16, `n1 = 2^9` for c128
    /// 2^20 (longconv-16k 14.98 → 13.70 µs, longconv-64k 12.24 → 11.52, scientific-1m 138.4 →
    /// 126.5).
    pub fn for_shape(n: usize, _batch: usize, precision: Precision) -> Self {
        let c64 = precision == Precision::C64;
        // Session 6 (with the 32-bit shared-memory exchanges): the staged row pass wins on
        // c64 512 (fnet-512 11.17 → 9.70 µs) and 64 (shortconv-64 20.19 → 18.72).
        let staged = c64 && (n == 64 || n == 512);
        FftOptions {
            persist: if n <= 64 && !staged { Persist::Never } else { Persist::Auto },
            staged,
            stage_twiddles: true,
            hoist_twiddles: n < 1 << 20,
            e8: c64 && n == 1024,
            ping_pong: c64 && (n == 1024 || n == 4096),
            row_threads: match (c64, n) {
                (true, 512) => 64,
                (true, 64) => 128,
                _ => 0,
            },
            // Shorter column passes (more columns per block, longer coalesced runs).
            log_n1: match (c64, n) {
                (true, 0x4000) | (true, 0x10000) => 6,
                (false, 0x100000) => 9,
                _ => 0,
            },
            // With those 64-point columns, 32 per block (session 6: 16k 13.98 → 13.28 µs, 64k
            // 11.52 → 11.04; no change on the c128 1M).
            cols: if c64 && (n == 0x4000 || n == 0x10000) { 32 } else { 0 },
            ..FftOptions::default()
        }
    }
}

/// A prepared batched forward FFT of `batch` transforms of length `n` (docs/ops.md §1).
///
/// Holds the twiddle tables and the workspace (device memory of the [`Gpu`] it was made on).
/// Executions of one plan must not overlap in time (they share the workspace): the safe
/// entries take `&mut self`; the raw entry leaves this to the caller.
pub struct FftPlan {
    n: usize,
    batch: usize,
    precision: Precision,
    passes: Vec<Pass>,
    // The device buffers below are owned here and used through `ptrs`.
    /// Twiddles `W_Lt^i`, `i < Lt` (Lt = the longest pass length), interleaved.
    #[allow(dead_code)]
    tw: Option<CudaSlice<u8>>,
    /// Four-step twiddles `W_n^i` (`i < 2^s`) and `W_n^{i·2^s}` (`i < n/2^s`).
    #[allow(dead_code)]
    twlo: Option<CudaSlice<u8>>,
    #[allow(dead_code)]
    twhi: Option<CudaSlice<u8>>,
    work: Option<CudaSlice<u8>>,
    /// Per pass: its stage table (stage-table passes), else `None`.
    #[allow(dead_code)]
    stw: Vec<Option<CudaSlice<u8>>>,
    stw_ptrs: Vec<CUdeviceptr>,
    ptrs: [CUdeviceptr; 4],
    log_lt: u32,
    pdl: bool,
    use_graph: bool,
    wait_first: bool,
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
    /// Plans `batch` forward transforms of length `n` in `precision` on `gpu`.
    ///
    /// Errors: [`Error::Shape`] naming `n` (0, not a power of two, above [`Precision::max_len`]) or
    /// `batch` (0); [`Error::Overflow`] naming `batch` when `n·batch` exceeds
    /// [`MAX_ELEMENTS`]; a driver error from the uploads or the allocation.
    pub fn new(gpu: &Gpu, n: usize, batch: usize, precision: Precision) -> Result<Self> {
        Self::new_opts(gpu, n, batch, precision, FftOptions::for_shape(n, batch, precision))
    }

    /// [`FftPlan::new`] with an explicit persistent-grid choice (for tuning and its bench rows).
    #[doc(hidden)]
    pub fn new_with(gpu: &Gpu, n: usize, batch: usize, precision: Precision, persist: Persist) -> Result<Self> {
        Self::new_opts(gpu, n, batch, precision, FftOptions { persist, ..FftOptions::default() })
    }

    /// [`FftPlan::new`] with explicit [`FftOptions`] (for tuning and the bench's variant rows).
    #[doc(hidden)]
    pub fn new_opts(gpu: &Gpu, n: usize, batch: usize, precision: Precision, opts: FftOptions) -> Result<Self> {
        let persist = opts.persist;
        let log_n = validate(n, batch, precision)?;
        let elem = precision.element_bytes();
        let hoisted = opts.stage_twiddles && opts.hoist_twiddles;
        let mut knobs =
            plan::Knobs { e8: opts.e8 && hoisted, row_threads: opts.row_threads, cols: opts.cols, log_n1: opts.log_n1 };
        if knobs.e8 && log_n >= 1 && log_n <= max_single_log(elem) {
            // The 8-element kernels must take the whole transform in one block (≤ 128 registers
            // at 512 threads); otherwise plan as without them.
            let p = &decompose_k(log_n, batch, elem, max_single_log(elem), knobs)[0];
            if let Some(name) = plan::extra_kernel(p.log_l, p.e, false, false) {
                let f = gpu.function(name)?;
                let mt = f.get_attribute(CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?;
                if (mt as u32) < (p.threads >> p.log_c) {
                    knobs.e8 = false;
                }
            }
        }
        let split = if precision == Precision::C64 && opts.stage_twiddles && opts.split > 0 {
            plan::split_pass(log_n, batch, opts.split)
        } else {
            None
        };
        let is_split = split.is_some();
        let mut passes = match split {
            Some(p) => vec![p],
            None if log_n == 0 => Vec::new(),
            None => decompose_k(log_n, batch, elem, max_single_log(elem), knobs),
        };
        let log_lt = passes.iter().map(|p| p.log_l).max().unwrap_or(0);
        let sms = gpu
            .context()
            .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map(|v| v.max(1) as u32)
            .unwrap_or(DEFAULT_SMS);
        for p in passes.iter_mut() {
            if opts.stage_twiddles && p.split == 0 {
                let mut q = p.clone();
                q.st = true;
                q.hoist = opts.hoist_twiddles;
                let f = gpu.function(Self::pass_kernel(precision, &q))?;
                let max_threads =
                    f.get_attribute(CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?;
                if q.shrink_to(max_threads as u32) {
                    *p = q;
                }
                if p.st && (opts.ping_pong || opts.staged) {
                    let mut q = p.clone();
                    if plan::set_extra(&mut q, elem, opts.ping_pong, opts.staged) {
                        let f = gpu.function(Self::pass_kernel(precision, &q))?;
                        let mt = f.get_attribute(CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?;
                        if mt as u32 >= q.threads {
                            *p = q;
                        }
                    }
                }
            }
            let f = gpu.function(Self::pass_kernel(precision, p))?;
            let max_threads = f.get_attribute(CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?;
            if (max_threads as u32) < p.threads {
                return Err(Error::Shape {
                    arg: "n",
                    msg: format!(
                        "the pass of length 2^{} needs {} threads per block, its kernel allows {max_threads}",
                        p.log_l, p.threads
                    ),
                });
            }
            let attr = CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
            if p.smem_bytes > 48 * 1024 && f.get_attribute(attr)? < p.smem_bytes as i32 {
                f.set_attribute(attr, p.smem_bytes as i32)?;
            }
            if p.flags == 0 && p.log_min == 0 && p.split == 0 {
                let occ =
                    f.occupancy_max_active_blocks_per_multiprocessor(p.threads, p.smem_bytes as usize, None)?.max(1);
                let per_sm = match persist {
                    Persist::Auto if p.blocks > 2 * sms * occ => Some(occ),
                    Persist::PerSm(k) if p.blocks > sms * k.max(1) => Some(k.max(1)),
                    _ => None,
                };
                if let Some(k) = per_sm {
                    p.grid = sms * k;
                }
            }
        }
        let four_step = passes.len() > 1 || is_split;
        let (tw, twlo, twhi) = if passes.is_empty() {
            (None, None, None)
        } else {
            let (tw, four) = plan::twiddle_tables(log_n, log_lt, four_step);
            let tw = Some(upload(gpu, precision, &tw)?);
            match four {
                Some((lo, hi)) => (tw, Some(upload(gpu, precision, &lo)?), Some(upload(gpu, precision, &hi)?)),
                None => (tw, None, None),
            }
        };
        let work = if four_step { Some(gpu.stream().alloc_zeros::<u8>(n * batch * elem)?) } else { None };
        let stw = passes
            .iter()
            .map(|p| if p.st { upload(gpu, precision, &plan::stage_table(p.log_l, p.e)).map(Some) } else { Ok(None) })
            .collect::<Result<Vec<_>>>()?;
        let stw_ptrs = stw.iter().map(|s| raw_ptr(gpu, s)).collect();
        // The tables must be on the device before an execution on any other stream.
        gpu.stream().synchronize()?;
        let ptrs = [raw_ptr(gpu, &tw), raw_ptr(gpu, &twlo), raw_ptr(gpu, &twhi), raw_ptr(gpu, &work)];
        Ok(Self {
            n,
            batch,
            precision,
            passes,
            tw,
            twlo,
            twhi,
            work,
            stw,
            stw_ptrs,
            ptrs,
            log_lt,
            pdl: opts.pdl,
            use_graph: opts.graph,
            wait_first: opts.wait_first,
            graph: GraphReplay::new(),
        })
    }

    fn kernel_names_st(p: Precision, hoist: bool) -> &'static [&'static str] {
        match (p, hoist) {
            (Precision::C64, true) => &KERNELS_C64_ST,
            (Precision::C128, true) => &KERNELS_C128_ST,
            (Precision::C64, false) => &KERNELS_C64_STN,
            (Precision::C128, false) => &KERNELS_C128_STN,
        }
    }

    /// The kernel of a pass (its length, precision, table kind, elements per thread,
    /// ping-pong and staging).
    fn pass_kernel(prec: Precision, p: &Pass) -> &'static str {
        if p.split > 0 {
            let k = plan::SPLIT_KERNELS.iter().find(|k| (k.1, k.2) == (p.log_l, p.split));
            return k.expect("split passes are planned only where a kernel exists").0;
        }
        if prec == Precision::C64 && p.st && p.hoist {
            if let Some(name) = plan::extra_kernel(p.log_l, p.e, p.pp, p.staged) {
                return name;
            }
        }
        debug_assert!(!p.pp && !p.staged && p.e == plan::elems_per_thread(p.log_l, prec.element_bytes()), "{p:?}");
        let names = if p.st { Self::kernel_names_st(prec, p.hoist) } else { Self::kernel_names(prec) };
        names[p.log_l as usize - 1]
    }

    /// The PTX entry of every pass, in launch order (for tests and reports).
    #[doc(hidden)]
    pub fn pass_kernels(&self) -> Vec<&'static str> {
        self.passes.iter().map(|p| Self::pass_kernel(self.precision, p)).collect()
    }

    /// How many passes run the stage-table kernels (for tests and reports).
    #[doc(hidden)]
    pub fn stage_table_passes(&self) -> usize {
        self.passes.iter().filter(|p| p.st).count()
    }

    fn kernel_names(p: Precision) -> &'static [&'static str] {
        match p {
            Precision::C64 => &KERNELS_C64,
            Precision::C128 => &KERNELS_C128,
        }
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
    /// Reals (f32 or f64) each of `x` and `y` must hold: `2·n·batch`.
    pub fn buffer_len(&self) -> usize {
        2 * self.n * self.batch
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

    /// Executes the plan out of place on [`Gpu::stream`]: `y = FFT(x)`, c64 (`f32` buffers of at
    /// least `2·n·batch` reals, interleaved re/im). Asynchronous.
    ///
    /// Errors: [`Error::Shape`] (`x`) if the plan is c128, [`Error::BufferTooSmall`] naming `x`
    /// or `y`, a driver error from the launch.
    pub fn execute_c64(&mut self, gpu: &Gpu, x: &impl DevicePtr<f32>, y: &mut impl DevicePtrMut<f32>) -> Result<()> {
        self.execute_typed(gpu, Precision::C64, x, y)
    }

    /// In-place c64 execution: `xy = FFT(xy)` (otherwise as [`FftPlan::execute_c64`]).
    pub fn execute_c64_inplace(&mut self, gpu: &Gpu, xy: &mut impl DevicePtrMut<f32>) -> Result<()> {
        self.execute_inplace_typed(gpu, Precision::C64, xy)
    }

    /// Executes the plan out of place on [`Gpu::stream`], c128 (`f64` buffers of at least
    /// `2·n·batch` reals). Errors as [`FftPlan::execute_c64`].
    pub fn execute_c128(&mut self, gpu: &Gpu, x: &impl DevicePtr<f64>, y: &mut impl DevicePtrMut<f64>) -> Result<()> {
        self.execute_typed(gpu, Precision::C128, x, y)
    }

    /// In-place c128 execution.
    pub fn execute_c128_inplace(&mut self, gpu: &Gpu, xy: &mut impl DevicePtrMut<f64>) -> Result<()> {
        self.execute_inplace_typed(gpu, Precision::C128, xy)
    }

    /// The safe out-of-place entries: `T` is the real type of `precision` (checked by the caller's
    /// signature), buffers are checked here.
    fn execute_typed<T>(
        &mut self,
        gpu: &Gpu,
        precision: Precision,
        x: &impl DevicePtr<T>,
        y: &mut impl DevicePtrMut<T>,
    ) -> Result<()> {
        self.check_precision(precision)?;
        check_len("x", self.buffer_len(), x.len())?;
        check_len("y", self.buffer_len(), y.len())?;
        let st = gpu.stream();
        let (xp, _g1) = x.device_ptr(st);
        let (yp, _g2) = y.device_ptr_mut(st);
        let cs = st.cu_stream();
        if !self.use_graph || self.passes.len() < 2 {
            // SAFETY: both buffers hold the elements the plan addresses; &mut self: no overlap.
            return unsafe { self.execute_raw(gpu, xp, yp, cs) };
        }
        let mut graph = std::mem::replace(&mut self.graph, GraphReplay::new());
        // SAFETY: as above; the body only enqueues this plan's passes on `cs`.
        let r = unsafe { graph.run(cs, vec![xp, yp], || self.execute_raw(gpu, xp, yp, cs)) };
        self.graph = graph;
        r
    }

    /// The safe in-place entries (x == y is supported by the kernels).
    fn execute_inplace_typed<T>(
        &mut self,
        gpu: &Gpu,
        precision: Precision,
        xy: &mut impl DevicePtrMut<T>,
    ) -> Result<()> {
        self.check_precision(precision)?;
        check_len("x", self.buffer_len(), xy.len())?;
        let st = gpu.stream();
        let (p, _g) = xy.device_ptr_mut(st);
        // SAFETY: the buffer holds the elements the plan addresses.
        unsafe { self.execute_raw(gpu, p, p, st.cu_stream()) }
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
        let [tw, twlo, twhi, work] = self.ptrs;
        let ptrs = PlanPtrs { tw, twlo, twhi, work };
        let log_n = self.n.trailing_zeros();
        for (i, (p, &stw)) in self.passes.iter().zip(&self.stw_ptrs).enumerate() {
            let mut a = plan::pass_args(p, log_n, self.log_lt, ptrs, stw, x, y);
            if p.split > 0 && x == y {
                // Every block of a split pass reads its whole transform while the others write
                // it: in place, read a copy in the workspace.
                cudarc::driver::result::memcpy_dtod_async(work, x, bytes as usize, stream)?;
                a.src = work;
            }
            let f = if p.staged && !a.src.is_multiple_of(16) {
                // The staged kernel copies 16-byte chunks: an 8-byte aligned `x` (a sub-view)
                // takes the same pass's unstaged kernel (same table, geometry; less shared memory).
                gpu.function(Self::pass_kernel(self.precision, &Pass { staged: false, ..p.clone() }))?
            } else {
                gpu.function(Self::pass_kernel(self.precision, p))?
            };
            let (mut src, mut dst, mut tw, mut lo, mut hi) = (a.src, a.dst, a.tw, a.lo, a.hi);
            let (mut log_c, mut log_min, mut log_mout, mut count) = (a.log_c, a.log_min, a.log_mout, a.count);
            let (mut log_lt, mut log_split, mut sm_stride) = (a.log_lt, a.log_split, a.sm_stride);
            let mut flags = if self.wait_first { a.flags | plan::WAIT_FIRST } else { a.flags };
            let dims = LaunchDims { grid: (a.grid, 1, 1), block: (a.threads, 1, 1), shared_bytes: a.smem_bytes };
            // Every pass after the first as a programmatic dependent of the one before.
            let launch_pass = if self.pdl && i > 0 { launch_pdl } else { launch };
            launch_pass(
                f,
                dims,
                stream,
                &mut [
                    &mut src,
                    &mut dst,
                    &mut tw,
                    &mut lo,
                    &mut hi,
                    &mut log_c,
                    &mut log_min,
                    &mut log_mout,
                    &mut count,
                    &mut log_lt,
                    &mut log_split,
                    &mut flags,
                    &mut sm_stride,
                ],
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::plan::decompose;
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

    #[test]
    fn every_pass_fits_a_block() {
        for elem in [8, 16] {
            for log_n in 1..=max_log_n(elem) {
                for batch in [1, 3, 64, 300, 65536] {
                    if (batch << log_n) > MAX_ELEMENTS {
                        continue;
                    }
                    for p in decompose(log_n, batch, elem, max_single_log(elem)) {
                        assert!(p.threads >= 1 && p.threads <= plan::max_threads(p.e, elem), "{p:?}");
                        assert!(p.smem_bytes as usize <= 227 * 1024, "{p:?}");
                        assert!(p.log_l <= max_single_log(elem) && p.e <= 1 << p.log_l, "{p:?}");
                        assert!((p.blocks as usize) << p.log_c >= p.count as usize, "{p:?}");
                        if p.log_min > 0 || p.log_mout > 0 {
                            // Column passes: a block's columns lie in one matrix.
                            assert!(p.log_c <= p.log_min.max(p.log_mout), "{p:?}");
                        }
                    }
                }
            }
        }
    }
}
