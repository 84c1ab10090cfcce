//! The FFT planner: the kernel table, the tuning table (one row per `(precision, log2 n)` class,
//! each with its measured reason) and [`plan`], which turns a row into the passes a
//! [`super::FftPlan`] launches. No GPU needed except for the persistent-grid sizes ([`persist`],
//! given the device's SM count and occupancy); the CPU simulation (`sim/tests/fft.rs`) runs the same plans.
use super::Precision;
use crate::runtime::{LaunchDims, Planned};
use kernel_abi::{pass_policies, Elem, FftPassArgs, FftPassPolicy, Policy};

/// Longest transform one block computes, log2, by element size: c64 `2^13` (68 KiB of shared
/// memory, 512 threads), c128 `2^12` (68 KiB, 256 threads; its registers rule out 512).
pub(crate) fn max_single_log(elem_bytes: usize) -> u32 {
    if elem_bytes == 16 {
        12
    } else {
        13
    }
}
/// Longest transform a plan supports, log2: two passes of at most `2^max_single_log` each
/// (c64 `2^26`, c128 `2^24`).
pub(crate) fn max_log_n(elem_bytes: usize) -> u32 {
    2 * max_single_log(elem_bytes)
}
/// Most elements (n·batch) one plan addresses (the kernels index with u32).
pub const MAX_ELEMENTS: usize = 1 << 31;

/// Flags of a pass (the kernel's `flags` argument).
pub(crate) use kernel_abi::fft::{pad_shift, COL_MAP, OUT_SMEM, REVERSE_GROUPS, TW4};

/// Threads per block a row pass aims for (before the spreading rule), and the most any pass
/// plans.
const TARGET_THREADS: u32 = 256;
const MAX_THREADS: u32 = 512;
/// Streaming multiprocessors of the H200 (the spreading rule of the row passes).
const SMS: usize = 132;
/// Shared memory a multi-column pass may use per block (bytes).
const COLUMN_SMEM: usize = 160 * 1024;

/// How a pass kernel gets its stage twiddles and uses shared memory (shared with the kernel
/// list in `kernel_abi`).
pub use kernel_abi::fft::Form;
/// The layout parameters a pass kernel is compiled for (shared with the kernel list).
pub use kernel_abi::fft::Layout;

/// A PTX entry of the FFT: a pass policy of `kernel_abi::pass_policies` as a value (the entries
/// are declared in kernels-gpu/src/fft/stockham.rs).
#[derive(Debug, PartialEq, Eq)]
pub struct Kernel {
    pub name: &'static str,
    pub c128: bool,
    pub log_l: u32,
    /// Elements per thread (the kernel's `E`).
    pub e: u32,
    pub form: Form,
    /// Most threads per block the plan gives it: the largest power of two ≤ the driver's
    /// `MAX_THREADS_PER_BLOCK` for its sm_90 registers (ptxas), at most 512. 256 where the
    /// registers allow fewer than 512 (133–168 registers: 384–480 threads). The GPU test
    /// `kernel_thread_limits_match_the_device` checks every value against the driver.
    pub max_threads: u32,
    /// The layout parameters it is compiled for ([`Layout::Runtime`]: every pass's own).
    pub layout: Layout,
}

/// The kernel table from the policy types of `kernel_abi::fft_pass_kernels!` (one per PTX
/// entry), giving [`KERNELS`] and [`PTX_ENTRIES`].
macro_rules! kernel_table {
    ($($name:ident: $prec:ident, $log_l:literal, $e:literal, $form:ident, $max:literal, $layout:expr;)*) => {
        /// Every FFT kernel the planner launches (one row per PTX entry).
        pub const KERNELS: &[Kernel] = &[$(Kernel::of::<pass_policies::$name>(),)*];
        /// The FFT family's PTX entries: the names of [`KERNELS`] and the copy-chain floor's
        /// kernel (`super::CopyChain`).
        pub(crate) const PTX_ENTRIES: &[&str] = &[$(<pass_policies::$name as Policy>::ENTRY,)* super::floor::KERNEL];
    };
}
use Form::{Hoisted, PerStage, PingPong, Staged, StagedEvictFirst};

kernel_abi::fft_pass_kernels!(kernel_table);

impl Kernel {
    /// The table row of pass policy `P`.
    const fn of<P: FftPassPolicy>() -> Kernel {
        let () = P::VALID;
        Kernel {
            name: P::ENTRY,
            c128: matches!(P::PRECISION, Elem::C128),
            log_l: P::LOG_L,
            e: P::E,
            form: P::FORM,
            max_threads: P::MAX_THREADS,
            layout: P::LAYOUT,
        }
    }
}

/// The kernel of `form` for length `2^log_l` (of [`Layout::Runtime`]). Panics if there is none:
/// the tuning table names only existing kernels (`plan::tests::every_row_plans_existing_kernels`).
pub fn kernel(prec: Precision, log_l: u32, form: Form) -> &'static Kernel {
    let c128 = prec == Precision::C128;
    KERNELS
        .iter()
        .find(|k| k.c128 == c128 && k.log_l == log_l && k.form == form && k.layout == Layout::Runtime)
        .unwrap_or_else(|| panic!("no {prec:?} kernel of length 2^{log_l} in form {form:?}"))
}

/// The kernel compiled for exactly `p`'s layout (the same length, elements per thread and form
/// as `p.kernel`), if there is one: it computes the same outputs with its layout parameters as
/// constants.
fn fixed_layout_kernel(p: &Pass) -> Option<&'static Kernel> {
    let k = p.kernel;
    KERNELS.iter().find(|f| {
        f.c128 == k.c128 && f.log_l == k.log_l && f.e == k.e && f.form == k.form && f.layout.fixed() == Some(p.layout())
    })
}

/// The plan of one class of lengths (a row of [`TUNING`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Shape {
    /// `n = 1`: a device copy (no kernel).
    Copy,
    /// One pass of rows, `form` kernel. Row blocks aim for `threads` (halved while there are
    /// fewer than two blocks per SM, down to `min_threads`). `persistent`: when the blocks
    /// exceed two waves, launch one per resident slot, each looping over groups of rows.
    OnePass { form: Form, threads: u32, min_threads: u32, persistent: bool },
    /// Four-step `n = n1·n2`: a column pass of length `n1 = 2^log_n1` (`None`: `⌊log2 n / 2⌋`)
    /// with the four-step twiddle, then a row pass of length `n2` with a transposed store; at
    /// most `cols` transforms per block in the column pass and `rows` in the row pass; both
    /// passes in `form`. `persistent`: the column pass may run persistent blocks (as
    /// `OnePass`'s `persistent`); the per-stage 8-element kernels then prefetch each next group
    /// into L2 once the current group's loads have landed.
    FourStep { log_n1: Option<u32>, cols: usize, rows: usize, form: Form, persistent: bool },
}

/// One row of the tuning table: lengths `2^lo ..= 2^hi` of one precision.
pub(crate) struct Row {
    pub c128: bool,
    pub lo: u32,
    pub hi: u32,
    pub shape: Shape,
}

const fn one(form: Form, threads: u32, min_threads: u32, persistent: bool) -> Shape {
    Shape::OnePass { form, threads, min_threads, persistent }
}
const fn four_step_shape(log_n1: Option<u32>, cols: usize, rows: usize, form: Form, persistent: bool) -> Shape {
    assert!(!form.single_pass_only(), "a four-step pass cannot take a single-pass-only kernel");
    Shape::FourStep { log_n1, cols, rows, form, persistent }
}
const fn four(log_n1: Option<u32>, cols: usize, rows: usize, form: Form) -> Shape {
    four_step_shape(log_n1, cols, rows, form, false)
}
/// [`four`] with a persistent column pass.
const fn four_persistent(log_n1: Option<u32>, cols: usize, rows: usize, form: Form) -> Shape {
    four_step_shape(log_n1, cols, rows, form, true)
}
const fn row(c128: bool, lo: u32, hi: u32, shape: Shape) -> Row {
    Row { c128, lo, hi, shape }
}

/// The tuning table (H200, CUPTI device µs with the L2 flushed; `docs/decisions/fft.md` has
/// the alternatives). Every length of both precisions is in exactly one row.
#[rustfmt::skip]
pub(crate) const TUNING: &[Row] = &[
    row(false, 0, 0, Shape::Copy),
    // Up to 32 points: latency-bound single blocks; persistent grids lost at n ≤ 64
    // (shortconv-64: 19.54 one block per group against 21.12 persistent).
    row(false, 1, 5, one(Hoisted, 256, 64, false)),
    // shortconv-64: staged input 18.72 against 20.19 unstaged; 128-thread blocks 18.82
    // against 19.26 at 256.
    row(false, 6, 6, one(Staged, 128, 128, true)),
    // Hoisted stage twiddles: latency-4k 5.86 → 3.65, fnet-512 16.38 → 12.83 against the
    // per-stage / W_Lt-table loads.
    row(false, 7, 8, one(Hoisted, 256, 64, true)),
    // fnet-512: 64-thread blocks 11.33 against 12.74; staged input 9.70 against 11.17;
    // staged at 128 threads 10.05–10.08 against 9.76; the kernel's evict-first staging copies
    // 9.47 against 9.63.
    row(false, 9, 9, one(StagedEvictFirst, 64, 64, true)),
    // spectrogram-1k: 8 elements per thread with ping-pong buffers 3.46 against 3.81; the
    // single-pass 16-element ping-pong (radix 4, 16, 16) 3.07 / 3.42 against 3.10–3.14 / 3.39
    // (-b300), within a tick.
    row(false, 10, 10, one(PingPong, 256, 64, true)),
    row(false, 11, 11, one(Hoisted, 256, 64, true)),
    // throughput-4k: ping-pong 4.16 against 4.32 (8 elements per thread: 4.67). Two blocks
    // per transform after one radix-2 step (each reading the whole row): 4.40 against 3.68,
    // c128 7.26 against 5.95, latency-4k 3.01 against 2.98–3.01.
    row(false, 12, 12, one(PingPong, 256, 64, true)),
    // 8192 points at 16 elements: hoisting needs more registers than 512 threads allow.
    row(false, 13, 13, one(PerStage, 256, 64, true)),
    // longconv-16k: 64-point columns 13.70 against 14.98 balanced; 16 columns and 16 rows
    // per block (128- and 256-thread blocks) 11.71–11.74 against 12.51–12.53 at 32 and 32
    // (16 / 8 rows 11.71–11.74, 16 / 32 12.38, 8 / 16 12.13, 8 / 8 12.10, 32 / 16 11.87,
    // 32 / 8 11.87, 32 / 4 12.74, 32 / 2 17.07, 64 / 16 12.06).
    // Both passes run fixed-layout kernels (`fixed_layout_kernel`): 11.30 against 11.78; then
    // 32 rows per row-pass block (512 threads; the fixed 256-point kernel takes 76 registers
    // against 102) 11.01 against 11.26 at 16, 8 rows 11.42–11.49, 32 columns 11.29.
    row(false, 14, 14, four(Some(6), 16, 32, Hoisted)),
    row(false, 15, 15, four(None, 16, 16, Hoisted)),
    // longconv-64k: 64-point columns 11.52 against 12.24; 32 per block 11.04 against 11.52;
    // 4 rows per row-pass block (256 threads) 9.60 against 10.66 at 8 (512 threads, one block
    // per SM on 64 SMs), 11.70 at 2; 16 / 64 columns 9.69–9.79 / 9.95 against 9.63–9.76.
    // Both passes fixed-layout: 8.10 against 9.54–9.66; with fixed layouts 256 × 256 9.31,
    // 128 × 512 8.93 against 8.03.
    row(false, 16, 16, four(Some(6), 32, 4, Hoisted)),
    row(false, 17, 18, four(None, 16, 16, Hoisted)),
    // 1024-point rows in 256-thread blocks, as for 2^16.
    row(false, 19, 19, four(None, 16, 4, Hoisted)),
    // 1024-point and longer passes: the hoisting kernels' registers halve the column blocks
    // (scientific-1m: hoisted 176.8, per-stage 138.3).
    row(false, 20, 26, four(None, 16, 16, PerStage)),
    row(true, 0, 0, Shape::Copy),
    row(true, 1, 6, one(Hoisted, 256, 64, false)),
    // throughput-4k c128: hoisted 6.62 against 8.54 (W_Lt table).
    row(true, 7, 11, one(Hoisted, 256, 64, true)),
    row(true, 12, 12, one(PerStage, 256, 64, true)),
    row(true, 13, 19, four(None, 16, 16, Hoisted)),
    // scientific-1m: 512-point columns 126.5 against 138.4 balanced; per-stage twiddles as
    // for c64 (hoisted 176.8); 4 columns 126.3–126.4 against 120.1–120.3, 1 row per row-pass
    // block 194.8; the column pass persistent (one block per SM looping, each prefetching its
    // next tile after the current group's loads) 117.4–117.8 against 120.9–121.0; the row pass
    // persistent as well (the same prefetch of its next rows) 114.9 against 114.4–114.7; the
    // 2048-point row kernel at 16 elements fitted to two 256-thread blocks per SM 99.04–99.07
    // against 114.46–114.50 (same device call, A B B A).
    // The row pass runs its fixed-layout kernel: 93.63–93.76 against 94.34–94.46 (the column
    // pass fixed too: 101.2). The column kernel with launch bounds (kernels-gpu, 118 registers
    // instead of 82): 92.83–93.06 against 93.76–93.86.
    row(true, 20, 20, four_persistent(Some(9), 16, 16, PerStage)),
    row(true, 21, 24, four(None, 16, 16, PerStage)),
];

/// The tuning row of `2^log_n` in `prec` (every supported length has one).
pub(crate) fn tuning(prec: Precision, log_n: u32) -> Shape {
    let c128 = prec == Precision::C128;
    TUNING
        .iter()
        .find(|r| r.c128 == c128 && (r.lo..=r.hi).contains(&log_n))
        .unwrap_or_else(|| panic!("no tuning row for {prec:?} 2^{log_n}"))
        .shape
}

/// Which buffer a pass reads or writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Buf {
    X,
    Y,
    Work,
}

/// One kernel launch: `count` transforms of length `2^log_l`, `2^log_c` per block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pass {
    pub kernel: &'static Kernel,
    /// The kernel when `x` is not 16-byte aligned (a sub-view): for a staged pass the hoisted
    /// kernel of the same length and geometry; otherwise `kernel`.
    pub unaligned: &'static Kernel,
    pub log_l: u32,
    /// Elements per thread (the kernel's `E`).
    pub e: u32,
    pub log_c: u32,
    pub log_min: u32,
    pub log_mout: u32,
    pub count: u32,
    pub flags: u32,
    /// Shared-memory elements between consecutive transforms of a block.
    pub sm_stride: u32,
    pub threads: u32,
    /// Groups of `2^log_c` transforms (`⌈count / 2^log_c⌉`).
    pub blocks: u32,
    /// Blocks launched (`≤ blocks`; fewer makes them persistent: each loops over groups).
    pub grid: u32,
    /// With `persistent` from the tuning row: may run fewer blocks than groups.
    pub persistent: bool,
    pub smem_bytes: u32,
    pub src: Buf,
    pub dst: Buf,
}

impl Pass {
    /// `(log_c, log_min, log_mout, flags)` as a fixed-layout kernel has them ([`Layout::fixed`]):
    /// every flag but `WAIT_FIRST`, which stays a kernel argument.
    pub fn layout(&self) -> (u32, u32, u32, u32) {
        (self.log_c, self.log_min, self.log_mout, self.flags & !kernel_abi::fft::WAIT_FIRST)
    }
}

/// Elements per thread of the kernel for length `2^log_l` in its hoisted, per-stage and staged
/// forms.
#[cfg(test)]
pub(crate) fn elems_per_thread(log_l: u32, elem_bytes: usize, form: Form) -> u32 {
    match (log_l, elem_bytes, form) {
        // c64: radix-8 stages where they take no more stages than radix 16: fewer registers,
        // more blocks per SM for the short, memory-bound lengths (32 = 4·8, 64 = 8·8, 512 = 8³).
        (5 | 6 | 9, 8, _) => 8,
        // c128 2048-point per-stage (scientific-1m's row pass): 16 elements, three stages
        // instead of four, fitted to 128 registers (two 256-thread blocks per SM).
        (11, 16, PerStage) => 16,
        // c128: 16 elements take ~150 registers (one 256-thread block per SM); 8 take ~80.
        (3..=11, 16, _) => 8,
        _ => (1u32 << log_l).min(16),
    }
}

/// Shared-memory elements one transform of length `2^log_l` occupies: one pad element after
/// every `2^shift` (the kernel's `sidx`, [`pad_shift`]), so strided Stockham accesses avoid bank
/// conflicts.
pub(crate) fn smem_len(log_l: u32, shift: u32) -> u32 {
    let l = 1u32 << log_l;
    l + (l >> shift)
}

/// The shared-memory stride between the `c` transforms of a block whose last loop reads
/// element `k` of every transform with consecutive threads on consecutive transforms (the
/// transposed store, `OUT_SMEM`): the smallest stride `≥ len` that is `W/c` modulo the `W`
/// elements of one 128-byte wavefront (1 when `c ≥ W`), so the `W` elements one wavefront
/// serves (`W/c` consecutive `k` of each of `c` transforms) fall in distinct banks.
fn transposed_stride(len: u32, c: u32, elem_bytes: usize) -> u32 {
    let w = 128 / elem_bytes as u32;
    let want = (w / c).max(1);
    len + (want + w - len % w) % w
}

/// Most threads per block a column pass aims for with `e` elements per thread: the c128 kernel
/// with 16 elements takes ~150 registers (so 256).
fn column_threads(e: u32, elem_bytes: usize) -> u32 {
    if elem_bytes == 16 && e == 16 {
        256
    } else {
        MAX_THREADS
    }
}

fn floor_pow2(v: usize) -> usize {
    if v == 0 {
        0
    } else {
        1 << (usize::BITS - 1 - v.leading_zeros())
    }
}

/// A pass of `count` transforms on `kernel`, at most `max_c` per block; `row_threads`
/// `(target, min)` for a row pass.
#[allow(clippy::too_many_arguments)]
fn pass(
    kernel: &'static Kernel,
    unaligned: &'static Kernel,
    count: usize,
    max_c: usize,
    elem_bytes: usize,
    log_min: u32,
    log_mout: u32,
    flags: u32,
    pad: u32,
    src: Buf,
    dst: Buf,
    row_threads: (u32, u32),
    persistent: bool,
) -> Pass {
    let (log_l, e) = (kernel.log_l, kernel.e);
    for k in [kernel, unaligned] {
        assert!(
            !k.form.single_pass_only() || (log_min, log_mout, flags) == (0, 0, 0),
            "{} runs single-pass plans only",
            k.name
        );
    }
    let l = 1usize << log_l;
    let row = flags & (COL_MAP | OUT_SMEM) == 0;
    let tpt = l / e as usize;
    // Column passes take up to 512 threads for more columns per block (longer coalesced runs).
    let target = if row { row_threads.0 } else { column_threads(e, elem_bytes) };
    let by_threads = (target as usize / tpt).max(1);
    let len = smem_len(log_l, pad_shift(elem_bytes as u32, log_l, e));
    let sm_stride = len + pad;
    let by_smem = floor_pow2((COLUMN_SMEM / (sm_stride as usize * elem_bytes)).max(1));
    let mut c = floor_pow2(by_threads.min(max_c).min(by_smem).max(1));
    if row {
        // Row passes: spread over at least two blocks per SM where the batch allows, down to
        // `min` threads per block (short batches are latency-bound: more SMs, more loads in
        // flight).
        while c > 1 && count.div_ceil(c) < 2 * SMS && (c / 2) * tpt >= row_threads.1 as usize {
            c /= 2;
        }
    }
    // The kernel's register limit (`Kernel::max_threads`): fewer transforms per block.
    while c * tpt > kernel.max_threads as usize && c > 1 {
        c /= 2;
    }
    assert!(c * tpt <= kernel.max_threads as usize, "{} cannot run {tpt} threads per transform", kernel.name);
    let sm_stride = if flags & OUT_SMEM != 0 { transposed_stride(len, c as u32, elem_bytes) } else { sm_stride };
    let mut smem = c * sm_stride as usize * elem_bytes;
    match kernel.form {
        PingPong => smem *= 2,
        Staged | StagedEvictFirst => smem += 2 * (c << log_l) * elem_bytes,
        Hoisted | PerStage => {}
    }
    Pass {
        kernel,
        unaligned,
        log_l,
        e,
        log_c: c.trailing_zeros(),
        log_min,
        log_mout,
        count: count as u32,
        flags,
        sm_stride,
        threads: (c * tpt) as u32,
        blocks: count.div_ceil(c) as u32,
        grid: count.div_ceil(c) as u32,
        persistent,
        smem_bytes: smem as u32,
        src,
        dst,
    }
}

/// The passes for `batch` transforms of `2^log_n` in `prec`, from its [`TUNING`] row:
///
/// - one pass: rows in and out;
/// - four-step, `n = n1·n2`, element `j = j1·n2 + j2`: pass 1 transforms the `n2` columns
///   (length `n1`, stride `n2`) and multiplies output `k1` of column `j2` by `W_n^{j2·k1}`, into
///   the workspace in the same layout; pass 2 transforms the `n1` rows of the workspace
///   (length `n2`) and stores output `k2` of row `k1` at `y[k1 + n1·k2]`, its blocks taking
///   their groups last first (`REVERSE_GROUPS`: the rows pass 1 wrote last are still in L2;
///   scientific-1m 101.1 → 99.4 µs).
///
/// Persistent row passes get `grid = blocks` here; [`persist`] sizes them for a device.
pub fn plan(prec: Precision, log_n: u32, batch: usize) -> Vec<Pass> {
    match tuning(prec, log_n) {
        Shape::Copy => Vec::new(),
        Shape::OnePass { form, threads, min_threads, persistent } => {
            let kn = kernel(prec, log_n, form);
            let unaligned = if form.staged() { kernel(prec, log_n, Hoisted) } else { kn };
            vec![one_pass(kn, unaligned, batch, (threads, min_threads), persistent)]
        }
        Shape::FourStep { log_n1, cols, rows, form, persistent } => {
            four_step(prec, log_n, batch, log_n1.unwrap_or(log_n / 2), cols, rows, form, persistent)
        }
    }
}

/// The one-pass plan of `batch` rows on `kernel` (see [`plan`]).
pub fn one_pass(
    kernel: &'static Kernel,
    unaligned: &'static Kernel,
    batch: usize,
    row_threads: (u32, u32),
    persistent: bool,
) -> Pass {
    let elem = if kernel.c128 { 16 } else { 8 };
    let max_c = batch.next_power_of_two();
    pass(kernel, unaligned, batch, max_c, elem, 0, 0, 0, 0, Buf::X, Buf::Y, row_threads, persistent)
}

/// The four-step plan with columns of `2^log_n1` (see [`plan`]), at most `cols` columns per
/// block of the column pass and `rows` rows per block of the row pass; `persistent`: the column
/// pass may loop ([`persist`]).
#[allow(clippy::too_many_arguments)]
pub fn four_step(
    prec: Precision,
    log_n: u32,
    batch: usize,
    log_n1: u32,
    cols: usize,
    rows: usize,
    form: Form,
    persistent: bool,
) -> Vec<Pass> {
    let elem = prec.element_bytes();
    let log_n2 = log_n - log_n1;
    let (n1, n2) = (1usize << log_n1, 1usize << log_n2);
    let (k1, k2) = (kernel(prec, log_n1, form), kernel(prec, log_n2, form));
    let none = (TARGET_THREADS, 64);
    let col = COL_MAP | TW4;
    let transposed = OUT_SMEM | REVERSE_GROUPS;
    let mut passes = vec![
        pass(k1, k1, batch * n2, n2.min(cols), elem, log_n2, log_n2, col, 1, Buf::X, Buf::Work, none, persistent),
        pass(k2, k2, batch * n1, n1.min(rows), elem, 0, log_n1, transposed, 1, Buf::Work, Buf::Y, none, false),
    ];
    for p in &mut passes {
        if let Some(f) = fixed_layout_kernel(p) {
            assert!(f.max_threads >= p.threads, "{} cannot run {} threads", f.name, p.threads);
            p.kernel = f;
            p.unaligned = f;
        }
    }
    passes
}

/// Sizes a persistent pass (a row pass, or the column pass of a `four_persistent` plan) for a
/// device of `sms` SMs on which `resident` blocks of it fit per SM: when its groups exceed two
/// waves, one block per resident slot, each looping.
pub fn persist(p: &mut Pass, sms: u32, resident: u32) {
    let resident = resident.max(1);
    if p.persistent && p.blocks > 2 * sms * resident {
        p.grid = sms * resident;
    }
}

/// `log2` of the lo table of the four-step twiddle `W_n^p = lo[p mod 2^s] · hi[p >> s]`.
pub(crate) fn split_log(log_n: u32) -> u32 {
    log_n.div_ceil(2)
}

/// The four-step tables `(lo, hi)` of `W_n^p = lo[p mod 2^s] · hi[p >> s]`
/// (`s = split_log(log_n)`), interleaved f64. The c128 kernels read them; the c64 kernels
/// compute `W_n^p` (`kernels-gpu` `Mem::twiddle`).
pub fn four_step_tables(log_n: u32) -> (Vec<f64>, Vec<f64>) {
    use crate::reference::twiddle;
    let log_split = split_log(log_n);
    let nn = 1u64 << log_n;
    let lo: Vec<f64> = (0..1u64 << log_split).flat_map(|i| <[f64; 2]>::from(twiddle(i, nn))).collect();
    let hi: Vec<f64> =
        (0..1u64 << (log_n - log_split)).flat_map(|i| <[f64; 2]>::from(twiddle(i << log_split, nn))).collect();
    (lo, hi)
}

/// The per-stage twiddle table of the kernels for length `2^log_l` with `e` elements per
/// thread, interleaved f64: stages `s = 1..nst` (radix `e`, `Ns = 2^(first + log_e·(s−1))`,
/// `first = log_l − log_e·(nst−1)`) one after another, stage `s` as `[r − 1][k]` =
/// `W_{Ns·e}^{r·k}` for `1 ≤ r < e`, `k < Ns` (the kernel's `stage_twiddles`; each value
/// rounded once from f64). Never empty (one unused element for one-stage lengths, so the table
/// is a valid allocation).
pub fn stage_table(log_l: u32, e: u32) -> Vec<f64> {
    use crate::reference::twiddle;
    let log_e = e.trailing_zeros();
    let nst = log_l.div_ceil(log_e);
    let first = log_l - log_e * (nst - 1);
    let mut v = Vec::new();
    for s in 1..nst {
        let ls = first + log_e * (s - 1);
        let ns = 1u64 << ls;
        for r in 1..e as u64 {
            for k in 0..ns {
                v.extend(<[f64; 2]>::from(twiddle(r * k, ns * e as u64)));
            }
        }
    }
    if v.is_empty() {
        v = vec![1.0, 0.0];
    }
    v
}

/// One pass's kernel launch: its arguments and its launch shape.
#[derive(Clone, Copy, Debug)]
pub struct PassArgs {
    pub kernel: FftPassArgs,
    pub grid: u32,
    pub threads: u32,
    pub smem_bytes: u32,
}

/// Device addresses of a plan's four-step tables and workspace (0 where absent).
#[derive(Clone, Copy, Debug)]
pub struct PlanPtrs {
    pub twlo: u64,
    pub twhi: u64,
    pub work: u64,
}

/// The launch arguments of pass `p` of a plan for `n = 2^log_n`, on buffers `x`, `y`; `stw` is
/// the pass's stage table.
pub fn pass_args(p: &Pass, log_n: u32, ptrs: PlanPtrs, stw: u64, x: u64, y: u64) -> PassArgs {
    let buf = |b: Buf| match b {
        Buf::X => x,
        Buf::Y => y,
        Buf::Work => ptrs.work,
    };
    PassArgs {
        kernel: FftPassArgs {
            x: buf(p.src) as *const u8,
            y: buf(p.dst) as *mut u8,
            tw: stw as *const u8,
            // One-pass plans have no four-step tables (0); pass a valid address all the same.
            // (Not `twlo.max(stw)`: that picks `stw` whenever the allocator placed the table
            // below it.)
            twlo: (if ptrs.twlo != 0 { ptrs.twlo } else { stw }) as *const u8,
            twhi: (if ptrs.twhi != 0 { ptrs.twhi } else { stw }) as *const u8,
            log_c: p.log_c,
            log_min: p.log_min,
            log_mout: p.log_mout,
            count: p.count,
            log_split: split_log(log_n),
            flags: p.flags,
            sm_stride: p.sm_stride,
        },
        grid: p.grid,
        threads: p.threads,
        smem_bytes: p.smem_bytes,
    }
}

/// Pass `i` of a plan (`passes[i]`) as its launch on buffers `x`, `y`: [`pass_args`], the
/// pass's kernel (its `unaligned` one when `x` of the pass is not 16-byte aligned, or always
/// with `force_unaligned`), and every pass after the first a programmatic dependent of the one
/// before (its launch, block start-up and twiddle loads overlap the previous pass:
/// longconv-16k 13.57 → 12.99 µs).
#[allow(clippy::too_many_arguments)]
pub fn pass_launch(
    passes: &[Pass],
    i: usize,
    log_n: u32,
    ptrs: PlanPtrs,
    stw: u64,
    x: u64,
    y: u64,
    force_unaligned: bool,
) -> Planned<FftPassArgs> {
    let p = &passes[i];
    let a = pass_args(p, log_n, ptrs, stw, x, y);
    // The staged kernels copy 16-byte chunks: an 8-byte aligned `x` (a sub-view) takes the
    // pass's `unaligned` kernel (same table and geometry).
    let aligned = (a.kernel.x as u64).is_multiple_of(16);
    let kernel = if aligned && !force_unaligned { p.kernel } else { p.unaligned };
    Planned {
        kernel: kernel.name,
        dims: LaunchDims { grid: (a.grid, 1, 1), block: (a.threads, 1, 1), shared_bytes: a.smem_bytes },
        args: a.kernel,
        dependent: i > 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) const PRECS: [Precision; 2] = [Precision::C64, Precision::C128];

    /// The ping-pong kernels are compiled for single-pass plans: a four-step plan on them is
    /// refused at plan time (the tuning table's rows are checked at compile time).
    #[test]
    #[should_panic(expected = "runs single-pass plans only")]
    fn four_step_refuses_single_pass_only_kernels() {
        four_step(Precision::C64, 22, 1, 10, 16, 16, PingPong, false);
    }

    /// The tuning table covers every supported length of both precisions exactly once, and
    /// every row plans kernels that exist.
    #[test]
    fn every_row_plans_existing_kernels() {
        for prec in PRECS {
            for log_n in 0..=max_log_n(prec.element_bytes()) {
                let c128 = prec == Precision::C128;
                let rows = TUNING.iter().filter(|r| r.c128 == c128 && (r.lo..=r.hi).contains(&log_n)).count();
                assert_eq!(rows, 1, "{prec:?} 2^{log_n}");
                plan(prec, log_n, 3);
            }
        }
        assert!(TUNING.iter().all(|r| r.hi <= max_log_n(if r.c128 { 16 } else { 8 })));
    }

    /// Every kernel of the table is planned for some length, and the hoisted / per-stage
    /// kernels take the elements per thread the planner's stage tables assume.
    #[test]
    fn every_kernel_is_planned() {
        let mut used = std::collections::BTreeSet::new();
        for prec in PRECS {
            for log_n in 0..=max_log_n(prec.element_bytes()) {
                for p in plan(prec, log_n, 5) {
                    used.insert(p.kernel.name);
                    used.insert(p.unaligned.name);
                }
            }
        }
        let all: std::collections::BTreeSet<_> = KERNELS.iter().map(|k| k.name).collect();
        assert_eq!(used, all);
        for k in KERNELS.iter().filter(|k| matches!(k.form, Hoisted | PerStage | Staged | StagedEvictFirst)) {
            assert_eq!(k.e, elems_per_thread(k.log_l, if k.c128 { 16 } else { 8 }, k.form), "{}", k.name);
        }
    }

    /// A kernel compiled for a fixed layout runs only passes of exactly that layout, and a
    /// four-step pass of a layout some kernel is compiled for always runs that kernel.
    #[test]
    fn fixed_layout_kernels_run_exactly_their_layout() {
        for prec in PRECS {
            for log_n in 0..=max_log_n(prec.element_bytes()) {
                for batch in [1, 3, 64] {
                    for p in plan(prec, log_n, batch) {
                        if let Some(fixed) = p.kernel.layout.fixed() {
                            assert_eq!(fixed, p.layout(), "{}", p.kernel.name);
                        } else {
                            assert!(
                                fixed_layout_kernel(&p).is_none(),
                                "{prec:?} 2^{log_n}: {} runs a layout a kernel is compiled for",
                                p.kernel.name
                            );
                        }
                    }
                }
            }
        }
    }

    /// `(x, y, tw, twlo, twhi)` of a pass's arguments, as addresses.
    fn addrs(a: &PassArgs) -> (u64, u64, u64, u64, u64) {
        let k = &a.kernel;
        (k.x as u64, k.y as u64, k.tw as u64, k.twlo as u64, k.twhi as u64)
    }

    /// The tables reach the kernel whatever the allocator's address order.
    #[test]
    fn pass_args_pass_the_tables_in_any_address_order() {
        let passes = plan(Precision::C64, 15, 2);
        for (stw, twlo, twhi, work) in [(0x1000, 0x2000, 0x3000, 0x4000), (0x9000, 0x2000, 0x3000, 0x4000)] {
            let ptrs = PlanPtrs { twlo, twhi, work };
            let a = pass_args(&passes[0], 15, ptrs, stw, 0x10_0000, 0x20_0000);
            assert_eq!(addrs(&a), (0x10_0000, work, stw, twlo, twhi));
            let a = pass_args(&passes[1], 15, ptrs, stw, 0x10_0000, 0x20_0000);
            assert_eq!(addrs(&a), (work, 0x20_0000, stw, twlo, twhi));
        }
        // One-pass plans: no four-step tables, the stage table in their place.
        let one = plan(Precision::C64, 10, 3);
        let a = pass_args(&one[0], 10, PlanPtrs { twlo: 0, twhi: 0, work: 0 }, 0x7000, 1 << 20, 2 << 20);
        assert_eq!(addrs(&a), (1 << 20, 2 << 20, 0x7000, 0x7000, 0x7000));
    }

    /// The stage table holds exactly the entries the kernel's `stage_twiddles` indexes:
    /// stage offsets `Σ (E − 1)·Ns`, entry `(r − 1)·Ns + k` = `W_{Ns·E}^{r·k}`.
    #[test]
    fn stage_table_layout() {
        use crate::reference::twiddle;
        for kn in KERNELS {
            let (log_l, e) = (kn.log_l, kn.e);
            let log_e = e.trailing_zeros();
            let nst = log_l.div_ceil(log_e);
            let first = log_l - log_e * (nst - 1);
            let t = stage_table(log_l, e);
            let mut off = 0usize;
            for s in 1..nst {
                let ls = first + log_e * (s - 1);
                for r in 1..e as usize {
                    for k in [0usize, (1 << ls) - 1, (1 << ls) / 2] {
                        let i = off + ((r - 1) << ls) + k;
                        let w = twiddle((r * k) as u64, (e as u64) << ls);
                        assert_eq!((t[2 * i], t[2 * i + 1]), w, "{} s={s} r={r} k={k}", kn.name);
                    }
                }
                off += ((e - 1) as usize) << ls;
            }
            assert_eq!(t.len(), 2 * off.max(1), "{}", kn.name);
        }
    }

    /// Every planned pass fits its kernel and a block, covers its transforms, and keeps a
    /// column block's columns in one matrix; persistent grids only shrink the launch.
    #[test]
    fn every_pass_fits_its_kernel() {
        for prec in PRECS {
            let elem = prec.element_bytes();
            for log_n in 0..=max_log_n(elem) {
                for batch in [1, 3, 64, 300, 65536] {
                    if (batch << log_n) > MAX_ELEMENTS {
                        continue;
                    }
                    for mut p in plan(prec, log_n, batch) {
                        assert!(p.threads >= 1 && p.threads <= p.kernel.max_threads, "{p:?}");
                        assert_eq!(p.threads << p.e.trailing_zeros(), (1u32 << p.log_c) << p.log_l, "{p:?}");
                        assert!(p.smem_bytes as usize <= 227 * 1024, "{p:?}");
                        assert!((p.blocks as usize) << p.log_c >= p.count as usize, "{p:?}");
                        assert_eq!((p.count as usize) << p.log_l, batch << log_n, "{p:?}");
                        if p.log_min > 0 || p.log_mout > 0 {
                            assert!(p.log_c <= p.log_min.max(p.log_mout), "{p:?}");
                            // Only a column pass (strided input) may loop; the row pass with
                            // its transposed store never does.
                            assert!(!p.persistent || p.log_min > 0, "{p:?}");
                        }
                        persist(&mut p, 132, 4);
                        assert!(p.grid >= 1 && p.grid <= p.blocks, "{p:?}");
                    }
                }
            }
        }
    }
}
