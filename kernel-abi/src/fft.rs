//! FFTC2CFwd pass kernels.

/// Pass flag: the column (transform within the block) in the low thread-index bits, so a
/// warp's global accesses run over consecutive columns (for `M > 1`).
pub const COL_MAP: u32 = 1;
/// Pass flag: the last stage writes shared memory; a final loop stores it with the column
/// mapping (for a transposed output, `M_out > 1`, from a row-mapped pass).
pub const OUT_SMEM: u32 = 2;
/// Pass flag: multiply output `k` of transform `t` by `W_n^{(t mod M_in)·k}` (the four-step
/// twiddle: computed by the c64 kernels, from the two-level table `twlo[p mod S]·twhi[p/S]` by
/// the c128 kernels).
pub const TW4: u32 = 4;
/// Pass flag: wait for the previous pass (programmatic dependent launch) at kernel entry,
/// before the twiddle loads. The planner never sets it: the wait after the twiddle loads
/// measured faster (longconv-64k 10.34 against 10.88 µs). The flag stays a runtime test because
/// the branch is what keeps ptxas from hoisting the wait above the twiddle loads (an
/// unconditional wait is hoisted: SASS checked, longconv-64k +0.43 µs). The ping-pong kernels
/// (single-pass plans only, never a dependent launch) ignore it and wait unconditionally, a
/// no-op for them.
pub const WAIT_FIRST: u32 = 8;
/// Pass flag: block `b` takes group `grid − 1 − b` first (then every `grid`-th as usual), so the
/// blocks that start first read the groups a previous pass wrote last. Set on the row pass of a
/// four-step plan: the column pass's last-written workspace rows are the ones still in L2.
pub const REVERSE_GROUPS: u32 = 16;

/// log2 of the elements between two pad elements of a transform's shared-memory slot (the
/// kernels' `sidx(i) = i + (i >> shift)`; the host sizes the slot from it) for a pass kernel of
/// `elem_bytes`-byte elements, length `2^log_l` and `e` elements per thread. One 128-byte
/// wavefront holds 16 c64 or 8 c128 elements. A first stage of radix `R` writes at stride `R`;
/// with a pad after every 16 those writes are conflict-free for c64 at any `R ≤ 16` and for c128
/// only at `R = 16` (two-way conflicts at `R ≤ 8`); a pad after every 8 makes c128 radix ≤ 8
/// conflict-free, and with it each later radix-8 stage (and a radix-16 one after a radix-8 first stage).
pub const fn pad_shift(elem_bytes: u32, log_l: u32, e: u32) -> u32 {
    let log_e = e.trailing_zeros();
    let first = log_l - log_e * (log_l.div_ceil(log_e) - 1);
    let eight = if e <= 8 { first < 4 } else { first == 3 };
    if elem_bytes == 16 && eight {
        3
    } else {
        4
    }
}

kernel_args! {
    /// Every FFT pass kernel: `fft_c64_*` (elements are `f32` pairs) and `fft_c128_*` (`f64`
    /// pairs). One launch is one pass of a plan: `count` transforms of length `2^LOG_L` (the
    /// entry's), `2^log_c` per block; transform `t` reads element `j` at
    /// `(t / M_in)·L·M_in + t mod M_in + j·M_in` of `x` and writes output `k` likewise with
    /// `M_out` into `y` (`M = 2^log_min`, `2^log_mout`). Grid, block and dynamic shared memory
    /// come from the host planner's pass geometry (`host/src/fft/plan.rs`). The `_ping_pong`
    /// entries ([`Form::single_pass_only`]) read rows in natural order and ignore `log_min`,
    /// `log_mout` and `flags` (as if all 0).
    pub struct FftPassArgs / fft_pass_entry {
        /// Input: interleaved complex elements of the kernel's precision.
        pub x: *const u8,
        /// Output (may equal `x`: in place).
        pub y: *mut u8,
        /// The pass's per-stage twiddle table (host `stage_table`).
        pub tw: *const u8,
        /// Four-step twiddles `W_n^i`, `i < 2^log_split` (a valid address in one-pass plans).
        pub twlo: *const u8,
        /// Four-step twiddles `W_n^{i·2^log_split}`.
        pub twhi: *const u8,
        /// `log2` of the transforms per block.
        pub log_c: u32,
        /// `log2 M_in`.
        pub log_min: u32,
        /// `log2 M_out`.
        pub log_mout: u32,
        /// Transforms in the launch.
        pub count: u32,
        /// `log2 S` of the four-step table split.
        pub log_split: u32,
        /// [`COL_MAP`] | [`OUT_SMEM`] | [`TW4`] | [`WAIT_FIRST`] | [`REVERSE_GROUPS`].
        pub flags: u32,
        /// Elements of shared memory per transform of the block (its Stockham buffer, padded).
        pub sm_stride: u32,
    }
}

/// How a pass kernel gets its stage twiddles and uses shared memory (the form column of
/// [`fft_pass_kernels!`](crate::fft_pass_kernels)). Every kernel reads a per-stage twiddle table (coalesced).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// Every stage's twiddles loaded at kernel entry, in flight with the data loads.
    Hoisted,
    /// Twiddles loaded in each stage after its barrier (fewer registers: the 8192-point c64 /
    /// 4096-point c128 passes at 16 elements, and the 512-point and longer passes of
    /// `n ≥ 2^20`, whose blocks the hoisted kernels' registers would halve; the c128
    /// 2048-point one at 16 elements, fitted to 128 registers).
    PerStage,
    /// Hoisted, with two shared-memory Stockham buffers: one barrier per stage instead of two.
    /// Single-pass plans only ([`Form::single_pass_only`]).
    PingPong,
    /// Hoisted, the row pass's input copied into shared memory by 16-byte `cp.async`, the
    /// block's next group of rows copied while the current one computes (needs a 16-byte
    /// aligned `x`).
    Staged,
    /// [`Form::Staged`] with the copies carrying an L2 evict-first policy
    /// (`createpolicy.fractional.L2::evict_first`): after the bench's L2 flush every line the
    /// outputs allocate evicts another, and with the consumed input lines first in line fewer
    /// of those evictions are write-backs of dirty lines.
    StagedEvictFirst,
}

/// Whether a row of [`fft_pass_kernels!`](crate::fft_pass_kernels) is a valid pass kernel: a
/// complex precision, a length `2^log_l` with `1 ≤ log_l ≤ 13`, `e` elements per thread a power
/// of two in `2..=16` and at most the length, at most 4 radix-`e` stages (the kernel body keeps
/// the twiddles of three twiddled stages after the first), `max_threads` a power of two in
/// `32..=512`, and one transform's `2^log_l / e` threads within `max_threads`.
pub const fn pass_row_is_valid(precision: crate::Elem, log_l: u32, e: u32, max_threads: u32) -> bool {
    matches!(precision, crate::Elem::C64 | crate::Elem::C128)
        && log_l >= 1
        && log_l <= 13
        && e.is_power_of_two()
        && e >= 2
        && e <= 16
        && e <= 1 << log_l
        && log_l.div_ceil(e.trailing_zeros()) <= 4
        && max_threads.is_power_of_two()
        && max_threads >= 32
        && max_threads <= 512
        && (1 << log_l) / e <= max_threads
}

impl Form {
    /// Whether every stage's twiddles are loaded at kernel entry (all but [`Form::PerStage`]).
    pub const fn hoists_twiddles(self) -> bool {
        !matches!(self, Self::PerStage)
    }
    /// Whether the pass uses two shared-memory Stockham buffers.
    pub const fn ping_pong(self) -> bool {
        matches!(self, Self::PingPong)
    }
    /// Whether the row pass's input is staged into shared memory by `cp.async`.
    pub const fn staged(self) -> bool {
        matches!(self, Self::Staged | Self::StagedEvictFirst)
    }
    /// Whether the staging copies carry an L2 evict-first policy.
    pub const fn stages_evict_first(self) -> bool {
        matches!(self, Self::StagedEvictFirst)
    }
    /// Whether the kernels of this form are compiled for single-pass plans only: rows in
    /// natural order in and out (`log_min = log_mout = 0`), no flags.
    pub const fn single_pass_only(self) -> bool {
        matches!(self, Self::PingPong)
    }
    /// One line: how the pass gets its twiddles and uses shared memory.
    pub const fn about(self) -> &'static str {
        match self {
            Self::Hoisted => "pass, every stage's twiddles loaded at kernel entry",
            Self::PerStage => "pass, each stage's twiddles loaded after its barrier",
            Self::PingPong => "pass, twiddles hoisted, two shared-memory buffers (one barrier per stage)",
            Self::Staged => "pass, twiddles hoisted, input staged into shared memory by cp.async",
            Self::StagedEvictFirst => {
                "pass, twiddles hoisted, input staged into shared memory by cp.async with an L2 evict-first policy"
            }
        }
    }
}

/// The layout parameters a pass kernel is compiled for (the layout column of
/// [`fft_pass_kernels!`](crate::fft_pass_kernels)). A kernel of a fixed layout ignores the
/// arguments `log_c`, `log_min`, `log_mout` and every flag but [`WAIT_FIRST`]: with them
/// compile-time constants its index arithmetic folds and the flag branches go (longconv-16k's
/// column pass 6.56–6.59 → 5.79 µs of kernel time, -64k's two passes 9.54–9.66 → 8.10 µs of op
/// time).
/// The planner substitutes one only for a pass of exactly its layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Every layout parameter from the pass arguments.
    Runtime,
    /// `Columns(log_c, log_m)`: the column pass of a four-step plan, `2^log_c` columns per
    /// block of a `[L, 2^log_m]` matrix (`log_min = log_mout = log_m`, [`COL_MAP`] | [`TW4`]).
    Columns(u32, u32),
    /// `Rows(log_c, log_mout)`: the row pass of a four-step plan, `2^log_c` rows per block, the
    /// output transposed to stride `2^log_mout` ([`OUT_SMEM`] | [`REVERSE_GROUPS`]).
    Rows(u32, u32),
}

impl Layout {
    /// `(log_c, log_min, log_mout, flags)` of a fixed layout (`None` for [`Layout::Runtime`]).
    pub const fn fixed(self) -> Option<(u32, u32, u32, u32)> {
        match self {
            Self::Runtime => None,
            Self::Columns(log_c, log_m) => Some((log_c, log_m, log_m, COL_MAP | TW4)),
            Self::Rows(log_c, log_mout) => Some((log_c, 0, log_mout, OUT_SMEM | REVERSE_GROUPS)),
        }
    }
}

/// An FFT pass kernel variant (a type of [`pass_policies`]).
pub trait FftPassPolicy: crate::Policy {
    /// `C64` or `C128`.
    const PRECISION: crate::Elem;
    /// `log2` of the transform length.
    const LOG_L: u32;
    /// Elements per thread (the radix of its stages).
    const E: u32;
    /// Twiddles and shared memory.
    const FORM: Form;
    /// The most threads per block the planner gives it (from its sm_90 registers).
    const MAX_THREADS: u32;
    /// The layout parameters it is compiled for.
    const LAYOUT: Layout;
    /// Evaluates to `()`, or stops the build where the policy is not a valid pass kernel
    /// ([`pass_row_is_valid`]; every generated policy is checked, the error names the type).
    const VALID: () = assert!(
        pass_row_is_valid(Self::PRECISION, Self::LOG_L, Self::E, Self::MAX_THREADS),
        "the FFT pass policy is not a valid pass kernel"
    );
}

/// Declares the policy type of each row of [`fft_pass_kernels!`](crate::fft_pass_kernels),
/// rejecting at compile time a row that is not a valid pass kernel.
macro_rules! pass_policy_types {
    ($($name:ident: $prec:ident, $log_l:literal, $e:literal, $form:ident, $max:literal, $layout:expr;)*) => {
        $(policy_type!(
            $name,
            concat!("[`", stringify!($form), "`](crate::Form::", stringify!($form), "), ", stringify!($prec), ", length 2^", stringify!($log_l), ", ", stringify!($e), " elements per thread, at most ", stringify!($max), " threads."),
            $crate::Form::$form.about(),
            FftPassPolicy {
                const PRECISION: $crate::Elem = $crate::elem!($prec);
                const LOG_L: u32 = $log_l;
                const E: u32 = $e;
                const FORM: $crate::Form = $crate::Form::$form;
                const MAX_THREADS: u32 = $max;
                const LAYOUT: $crate::fft::Layout = {
                    #[allow(unused_imports)]
                    use $crate::fft::Layout::*;
                    $layout
                };
            }
        );)*
    };
}

/// The FFT pass kernel variants, one type per row of
/// [`fft_pass_kernels!`](crate::fft_pass_kernels) (named after its PTX entry).
pub mod pass_policies {
    crate::fft_pass_kernels!(pass_policy_types);
}

/// The FFT pass kernels, one row per PTX entry: `name: precision, log_l, e, form, max_threads,
/// layout;` (length `2^log_l`, `e` elements per thread; `form`: a [`Form`]; `max_threads`: the
/// most threads per block the planner gives it, from its sm_90 registers; `layout`: a
/// [`Layout`], `Runtime` or the one four-step pass it is compiled for). Each row is a type of
/// [`pass_policies`], checked by
/// [`pass_row_is_valid`] at compile time. Expands to `$cb! { rows }`: the device crate declares
/// each entry from it (`kernels-gpu/src/fft/stockham.rs`), the host builds its kernel table
/// from it (`host/src/fft/plan.rs`), so the two cannot list different kernels.
#[macro_export]
macro_rules! fft_pass_kernels {
    ($cb:ident) => {
        $cb! {
            fft_c64_l1_tw_hoisted: c64, 1, 2, Hoisted, 512, Runtime;
            fft_c64_l2_tw_hoisted: c64, 2, 4, Hoisted, 512, Runtime;
            fft_c64_l3_tw_hoisted: c64, 3, 8, Hoisted, 512, Runtime;
            fft_c64_l4_tw_hoisted: c64, 4, 16, Hoisted, 512, Runtime;
            fft_c64_l5_tw_hoisted: c64, 5, 8, Hoisted, 512, Runtime;
            fft_c64_l6_tw_hoisted: c64, 6, 8, Hoisted, 512, Runtime;
            fft_c64_l6_tw_hoisted_cols16_m256: c64, 6, 8, Hoisted, 512, Columns(4, 8);
            fft_c64_l6_tw_hoisted_cols32_m1024: c64, 6, 8, Hoisted, 512, Columns(5, 10);
            fft_c64_l7_tw_hoisted: c64, 7, 16, Hoisted, 512, Runtime;
            fft_c64_l8_tw_hoisted: c64, 8, 16, Hoisted, 512, Runtime;
            fft_c64_l8_tw_hoisted_rows32_out64: c64, 8, 16, Hoisted, 512, Rows(5, 6);
            fft_c64_l9_tw_hoisted: c64, 9, 8, Hoisted, 512, Runtime;
            fft_c64_l10_tw_hoisted: c64, 10, 16, Hoisted, 512, Runtime;
            fft_c64_l10_tw_hoisted_rows4_out64: c64, 10, 16, Hoisted, 512, Rows(2, 6);
            fft_c64_l11_tw_hoisted: c64, 11, 16, Hoisted, 512, Runtime;
            fft_c64_l10_tw_per_stage: c64, 10, 16, PerStage, 512, Runtime;
            fft_c64_l11_tw_per_stage: c64, 11, 16, PerStage, 512, Runtime;
            fft_c64_l12_tw_per_stage: c64, 12, 16, PerStage, 512, Runtime;
            fft_c64_l13_tw_per_stage: c64, 13, 16, PerStage, 512, Runtime;
            fft_c64_l10_radix8_ping_pong: c64, 10, 8, PingPong, 512, Runtime;
            fft_c64_l12_ping_pong: c64, 12, 16, PingPong, 512, Runtime;
            fft_c64_l6_staged: c64, 6, 8, Staged, 512, Runtime;
            fft_c64_l9_staged: c64, 9, 8, StagedEvictFirst, 512, Runtime;
            fft_c128_l1_tw_hoisted: c128, 1, 2, Hoisted, 512, Runtime;
            fft_c128_l2_tw_hoisted: c128, 2, 4, Hoisted, 512, Runtime;
            fft_c128_l3_tw_hoisted: c128, 3, 8, Hoisted, 512, Runtime;
            fft_c128_l4_tw_hoisted: c128, 4, 8, Hoisted, 512, Runtime;
            fft_c128_l5_tw_hoisted: c128, 5, 8, Hoisted, 512, Runtime;
            fft_c128_l6_tw_hoisted: c128, 6, 8, Hoisted, 512, Runtime;
            fft_c128_l7_tw_hoisted: c128, 7, 8, Hoisted, 256, Runtime;
            fft_c128_l8_tw_hoisted: c128, 8, 8, Hoisted, 256, Runtime;
            fft_c128_l9_tw_hoisted: c128, 9, 8, Hoisted, 256, Runtime;
            fft_c128_l10_tw_hoisted: c128, 10, 8, Hoisted, 256, Runtime;
            fft_c128_l11_tw_hoisted: c128, 11, 8, Hoisted, 256, Runtime;
            fft_c128_l9_tw_per_stage: c128, 9, 8, PerStage, 512, Runtime;
            fft_c128_l10_tw_per_stage: c128, 10, 8, PerStage, 512, Runtime;
            fft_c128_l11_tw_per_stage: c128, 11, 16, PerStage, 256, Runtime;
            fft_c128_l11_tw_per_stage_rows2_out512: c128, 11, 16, PerStage, 256, Rows(1, 9);
            fft_c128_l12_tw_per_stage: c128, 12, 16, PerStage, 512, Runtime;
        }
    };
}
