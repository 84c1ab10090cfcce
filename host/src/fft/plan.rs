//! How a plan splits a transform into kernel passes (no GPU needed: the CPU model in
//! `model.rs` and the GPU plan both use it).

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

/// Flags of a pass (the kernel's `flags` argument; kernels-gpu/src/fft/stockham.rs).
pub(crate) const COL_MAP: u32 = 1;
pub(crate) const OUT_SMEM: u32 = 2;
pub(crate) const TW4: u32 = 4;
/// Wait for the previous pass at kernel entry (before the twiddle loads).
pub(crate) const WAIT_FIRST: u32 = 8;

/// Threads per block a pass aims for, and the most it may use.
const TARGET_THREADS: u32 = 256;
const MAX_THREADS: u32 = 512;
/// Streaming multiprocessors of the H200.
const SMS: usize = 132;
/// Shared memory a multi-column pass may use per block (bytes).
const COLUMN_SMEM: usize = 160 * 1024;

/// Which buffer a pass reads or writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Buf {
    X,
    Y,
    Work,
}

/// One kernel launch: `count` transforms of length `2^log_l`, `2^log_c` per block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Pass {
    pub log_l: u32,
    /// Elements per thread (the kernel's compile-time `E`).
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
    pub smem_bytes: u32,
    pub src: Buf,
    pub dst: Buf,
    /// The pass runs the stage-table kernel (`fft_*_l*_st`: twiddles from [`stage_table`],
    /// coalesced, loaded at kernel start); `false`: the `W_Lt` table kernel.
    pub st: bool,
    /// With `st`: the hoisting kernel (`_st`, twiddles loaded at kernel start) rather than
    /// `_stn` (loaded in each stage).
    pub hoist: bool,
    /// Ping-pong shared memory (kernels `_stp`, `_st8p`: two Stockham buffers, one barrier per
    /// stage); `smem_bytes` includes the second buffer.
    pub pp: bool,
    /// Staged input (kernels `_sta`: the block's next group of rows `cp.async`-copied into
    /// shared memory while the current one computes); `smem_bytes` includes the two staging
    /// buffers.
    pub staged: bool,
    /// `log2 R` of a split pass (kernels `_sp1`, `_sp2`: `R` blocks per transform of length
    /// `R·2^log_l`, see [`split_pass`]); 0 otherwise.
    pub split: u32,
}

/// The split kernels: `(name, log_l, log_r, hoisted stage tables)`.
pub(crate) const SPLIT_KERNELS: [(&str, u32, u32, bool); 3] =
    [("fft_c64_l13_sp1", 13, 1, false), ("fft_c64_l12_sp2", 12, 2, true), ("fft_c64_l13_sp2", 13, 2, false)];

/// The one-pass plan of a c64 transform of length `2^log_n` split `R = 2^log_r` ways, if a
/// split kernel exists for it: `batch·R` virtual transforms of length `2^(log_n − log_r)`, one
/// per block, virtual transform `t` computing outputs `k·R + t mod R` of transform `t / R`
/// (kernels-gpu `Ctx::log_r`); its output stride `R` is the pass's `log_mout`. Needs the
/// four-step tables of `log_n` (the `W_n^{r·j}` twiddles).
pub(crate) fn split_pass(log_n: u32, batch: usize, log_r: u32) -> Option<Pass> {
    let log_l = log_n.checked_sub(log_r)?;
    let k = SPLIT_KERNELS.iter().find(|k| (k.1, k.2) == (log_l, log_r))?;
    let mut p = pass(Knobs::default(), log_l, batch << log_r, 1, 8, 0, log_r, 0, 0, Buf::X, Buf::Y);
    p.st = true;
    p.hoist = k.3;
    p.split = log_r;
    Some(p)
}

/// Planner knobs (host `FftOptions`; `Knobs::default()` is the committed planner).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Knobs {
    /// c64 one-pass lengths 2^10 and 2^12 with 8 elements per thread (kernels `_st8*`).
    pub e8: bool,
    /// Row passes: threads per block aimed for, and the floor of the halving rule (0: 256,
    /// halving down to 64).
    pub row_threads: u32,
    /// Four-step passes: most columns (transforms) per block (0: 16).
    pub cols: u32,
    /// Four-step plans: `log2` of the column length `n1` (0 or out of range: `⌊log2 n / 2⌋`).
    pub log_n1: u32,
}

/// The extra kernels of session 4 (kernels-gpu/src/fft/stockham.rs, all c64 with hoisted
/// stage tables): `(name, log_l, e, ping-pong, staged)`.
const EXTRA_KERNELS: [(&str, u32, u32, bool, bool); 10] = [
    ("fft_c64_l10_st8", 10, 8, false, false),
    ("fft_c64_l12_st8", 12, 8, false, false),
    ("fft_c64_l10_st8p", 10, 8, true, false),
    ("fft_c64_l12_st8p", 12, 8, true, false),
    ("fft_c64_l9_stp", 9, 8, true, false),
    ("fft_c64_l10_stp", 10, 16, true, false),
    ("fft_c64_l12_stp", 12, 16, true, false),
    ("fft_c64_l6_sta", 6, 8, false, true),
    ("fft_c64_l9_sta", 9, 8, false, true),
    ("fft_c64_l10_sta", 10, 16, false, true),
];

/// The PTX names of [`EXTRA_KERNELS`].
pub(crate) const EXTRA_KERNEL_NAMES: [&str; 10] = [
    EXTRA_KERNELS[0].0,
    EXTRA_KERNELS[1].0,
    EXTRA_KERNELS[2].0,
    EXTRA_KERNELS[3].0,
    EXTRA_KERNELS[4].0,
    EXTRA_KERNELS[5].0,
    EXTRA_KERNELS[6].0,
    EXTRA_KERNELS[7].0,
    EXTRA_KERNELS[8].0,
    EXTRA_KERNELS[9].0,
];

/// The extra kernel for a c64 hoisted stage-table pass of length `2^log_l` with `e` elements
/// per thread, ping-pong `pp` and staging `staged`, if there is one. (The plain `_st` kernels
/// are not in this table.)
pub(crate) fn extra_kernel(log_l: u32, e: u32, pp: bool, staged: bool) -> Option<&'static str> {
    EXTRA_KERNELS.iter().find(|k| (k.1, k.2, k.3, k.4) == (log_l, e, pp, staged)).map(|k| k.0)
}

impl Pass {
    /// Halves the transforms per block until the block has at most `max_threads` threads (a
    /// kernel whose registers allow fewer threads than the plan chose). `false` if even one
    /// transform per block needs more.
    pub(crate) fn shrink_to(&mut self, max_threads: u32) -> bool {
        let tpt = self.threads >> self.log_c;
        let per = self.smem_bytes >> self.log_c;
        while self.threads > max_threads && self.log_c > 0 {
            self.log_c -= 1;
            self.threads = tpt << self.log_c;
            self.blocks = (self.count as usize).div_ceil(1 << self.log_c) as u32;
            self.grid = self.blocks;
            self.smem_bytes = per << self.log_c;
        }
        self.threads <= max_threads
    }
}

/// Elements per thread of the kernel for length `2^log_l` (must match the `entry!` table of
/// kernels-gpu/src/fft/stockham.rs).
pub(crate) fn elems_per_thread(log_l: u32, elem_bytes: usize) -> u32 {
    match (log_l, elem_bytes) {
        // c64: radix-8 stages where they take no more stages than radix 16: fewer registers,
        // more blocks per SM for the short, memory-bound lengths (32 = 4·8, 64 = 8·8, 512 = 8³).
        (5 | 6 | 9, 8) => 8,
        // c128: 16 elements take ~150 registers (one 256-thread block per SM); 8 take ~80.
        (3..=11, 16) => 8,
        _ => (1u32 << log_l).min(16),
    }
}

/// Shared-memory elements one transform of length `2^log_l` occupies: one pad element after
/// every 16 (the kernel's `sidx`), so strided Stockham accesses avoid bank conflicts.
pub(crate) fn smem_len(log_l: u32) -> u32 {
    let l = 1u32 << log_l;
    l + (l >> 4)
}

/// The kernel's shared-memory slot of element `i` of a transform (used by the CPU model).
#[cfg(test)]
pub(crate) fn sidx(i: u32) -> u32 {
    i + (i >> 4)
}

/// Most threads per block the kernel with `e` elements per thread may use: ≤ 128 registers
/// per thread at 512 threads; the c128 kernel with 16 elements takes ~165 (so 256).
pub(crate) fn max_threads(e: u32, elem_bytes: usize) -> u32 {
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

/// A pass of `count` transforms of length `2^log_l`, at most `max_c` per block.
#[allow(clippy::too_many_arguments)]
fn pass(
    knobs: Knobs,
    log_l: u32,
    count: usize,
    max_c: usize,
    elem_bytes: usize,
    log_min: u32,
    log_mout: u32,
    flags: u32,
    pad: u32,
    src: Buf,
    dst: Buf,
) -> Pass {
    let l = 1usize << log_l;
    let row = flags & (COL_MAP | OUT_SMEM) == 0;
    // 8 elements per thread (`_st8` kernels): row passes, including the four-step row pass with
    // its transposed `OUT_SMEM` store (session 8), not the column pass.
    let e8_ok = flags & (COL_MAP | TW4) == 0 && log_min == 0;
    let e = if knobs.e8 && e8_ok && elem_bytes == 8 && (log_l == 10 || log_l == 12) {
        8
    } else {
        elems_per_thread(log_l, elem_bytes)
    };
    let tpt = l / e as usize;
    // Column passes take up to MAX_THREADS for more columns per block (longer coalesced runs).
    let target = if !row {
        max_threads(e, elem_bytes)
    } else if knobs.row_threads > 0 {
        knobs.row_threads.min(max_threads(e, elem_bytes))
    } else {
        TARGET_THREADS
    };
    let min_row = if knobs.row_threads > 0 { knobs.row_threads.min(max_threads(e, elem_bytes)) as usize } else { 64 };
    let by_threads = (target as usize / tpt).max(1);
    let sm_stride = smem_len(log_l) + pad;
    let by_smem = floor_pow2((COLUMN_SMEM / (sm_stride as usize * elem_bytes)).max(1));
    let mut c = floor_pow2(by_threads.min(max_c).min(by_smem).max(1));
    if flags & COL_MAP == 0 && flags & OUT_SMEM == 0 {
        // Row passes: spread over at least two blocks per SM where the batch allows, down to
        // 64 threads per block (short batches are latency-bound: more SMs, more loads in flight).
        while c > 1 && count.div_ceil(c) < 2 * SMS && (c / 2) * tpt >= min_row {
            c /= 2;
        }
    }
    let threads = (c * tpt) as u32;
    debug_assert!(threads <= max_threads(e, elem_bytes));
    Pass {
        log_l,
        e,
        log_c: c.trailing_zeros(),
        log_min,
        log_mout,
        count: count as u32,
        flags,
        sm_stride,
        threads,
        blocks: count.div_ceil(c) as u32,
        grid: count.div_ceil(c) as u32,
        smem_bytes: (c * sm_stride as usize * elem_bytes) as u32,
        src,
        dst,
        st: false,
        hoist: false,
        pp: false,
        staged: false,
        split: 0,
    }
}

/// The passes of a plan for `n = 2^log_n` (`1 ≤ log_n ≤ MAX_LOG_N`), `batch` transforms,
/// elements of `elem_bytes`; `max_single` is the longest one-pass length (log2; the plan uses
/// [`MAX_SINGLE_LOG`], tests of the index logic use less).
///
/// - `n ≤ 2^max_single`: one pass, rows in and out.
/// - otherwise four-step with `n = n1·n2` (`n1 = 2^⌊log_n/2⌋ ≤ n2`), element `j = j1·n2 + j2`:
///   pass 1 transforms the `n2` columns (length `n1`, stride `n2`) and multiplies output `k1`
///   of column `j2` by `W_n^{j2·k1}`, into the workspace in the same layout; pass 2 transforms
///   the `n1` rows of the workspace (length `n2`) and stores output `k2` of row `k1` at
///   `y[k1 + n1·k2]`.
#[cfg(test)]
pub(crate) fn decompose(log_n: u32, batch: usize, elem_bytes: usize, max_single: u32) -> Vec<Pass> {
    decompose_k(log_n, batch, elem_bytes, max_single, Knobs::default())
}

/// The passes of a plan (see `decompose`) with planner [`Knobs`].
pub(crate) fn decompose_k(log_n: u32, batch: usize, elem_bytes: usize, max_single: u32, k: Knobs) -> Vec<Pass> {
    assert!(log_n >= 1 && log_n <= 2 * max_single);
    if log_n <= max_single {
        let max_c = batch.next_power_of_two();
        return vec![pass(k, log_n, batch, max_c, elem_bytes, 0, 0, 0, 0, Buf::X, Buf::Y)];
    }
    // The balanced split unless the knob asks for another whose two lengths each fit one pass.
    let log_n1 = match k.log_n1 {
        // (here log_n > max_single ≥ l, so log_n − l ≥ 1)
        l if l >= 1 && l <= max_single && log_n - l <= max_single => l,
        _ => log_n / 2,
    };
    let log_n2 = log_n - log_n1;
    let (n1, n2) = (1usize << log_n1, 1usize << log_n2);
    let cols = if k.cols > 0 { k.cols as usize } else { 16 };
    vec![
        pass(k, log_n1, batch * n2, n2.min(cols), elem_bytes, log_n2, log_n2, COL_MAP | TW4, 1, Buf::X, Buf::Work),
        pass(k, log_n2, batch * n1, n1.min(cols), elem_bytes, 0, log_n1, OUT_SMEM, 1, Buf::Work, Buf::Y),
    ]
}

/// Makes `p` (a hoisted stage-table pass) ping-pong and/or staged where an extra kernel exists
/// for it (staging only for row passes), adding the shared memory; `false` (and `p` unchanged)
/// otherwise.
pub(crate) fn set_extra(p: &mut Pass, elem_bytes: usize, pp: bool, staged: bool) -> bool {
    let row = p.flags == 0 && p.log_min == 0 && p.log_mout == 0;
    if elem_bytes != 8 || !p.st || !p.hoist || (staged && !row) || extra_kernel(p.log_l, p.e, pp, staged).is_none() {
        return false;
    }
    let c = 1u32 << p.log_c;
    if pp {
        p.smem_bytes += c * p.sm_stride * elem_bytes as u32;
    }
    if staged {
        p.smem_bytes += 2 * (c << p.log_l) * elem_bytes as u32;
    }
    p.pp = pp;
    p.staged = staged;
    true
}

/// `log2` of the lo table of the four-step twiddle `W_n^p = lo[p mod 2^s] · hi[p >> s]`.
pub(crate) fn split_log(log_n: u32) -> u32 {
    log_n.div_ceil(2)
}

/// The four-step tables `(lo, hi)`, interleaved f64.
pub(crate) type FourStepTables = (Vec<f64>, Vec<f64>);

/// The plan's twiddle tables in f64, interleaved (re, im): `tw[i] = W_Lt^i` for `i < Lt`
/// (`Lt = 2^log_lt`, the longest pass), and for a four-step plan (`four_step`) the two-level
/// table of `W_n^p = lo[p mod 2^s] · hi[p >> s]` (`s = split_log(log_n)`).
pub(crate) fn twiddle_tables(log_n: u32, log_lt: u32, four_step: bool) -> (Vec<f64>, Option<FourStepTables>) {
    use crate::reference::{twiddle, twiddle_table};
    let tw = twiddle_table(1 << log_lt, 1 << log_lt);
    if !four_step {
        return (tw, None);
    }
    let log_split = split_log(log_n);
    let nn = 1u64 << log_n;
    let lo: Vec<f64> = (0..1u64 << log_split).flat_map(|i| <[f64; 2]>::from(twiddle(i, nn))).collect();
    let hi: Vec<f64> =
        (0..1u64 << (log_n - log_split)).flat_map(|i| <[f64; 2]>::from(twiddle(i << log_split, nn))).collect();
    (tw, Some((lo, hi)))
}

/// The per-stage twiddle table of the stage-table kernels for length `2^log_l` with `e`
/// elements per thread, interleaved f64: stages `s = 1..nst` (radix `e`, `Ns = 2^(first +
/// log_e·(s−1))`, `first = log_l − log_e·(nst−1)`) one after another, stage `s` as `[r − 1][k]`
/// = `W_{Ns·e}^{r·k}` for `1 ≤ r < e`, `k < Ns` (the kernel's `stage_twiddles`; each value
/// rounded once from f64, as the `W_Lt` table). Never empty (one unused element for
/// one-stage lengths, so the table is a valid allocation).
pub(crate) fn stage_table(log_l: u32, e: u32) -> Vec<f64> {
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

/// The arguments of one pass's kernel launch, in the kernel's parameter order
/// (kernels-gpu/src/fft/stockham.rs `entry!`), and its launch shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PassArgs {
    pub src: u64,
    pub dst: u64,
    pub tw: u64,
    pub lo: u64,
    pub hi: u64,
    pub log_c: u32,
    pub log_min: u32,
    pub log_mout: u32,
    pub count: u32,
    pub log_lt: u32,
    pub log_split: u32,
    pub flags: u32,
    pub sm_stride: u32,
    pub grid: u32,
    pub threads: u32,
    pub smem_bytes: u32,
}

/// Device addresses of a plan's tables and workspace (0 where absent).
#[derive(Clone, Copy, Debug)]
pub(crate) struct PlanPtrs {
    pub tw: u64,
    pub twlo: u64,
    pub twhi: u64,
    pub work: u64,
}

/// The launch arguments of pass `p` of a plan for `n = 2^log_n`, on buffers `x`, `y`; `stw` is
/// the pass's stage table (used when `p.st`; 0 otherwise).
pub(crate) fn pass_args(p: &Pass, log_n: u32, log_lt: u32, ptrs: PlanPtrs, stw: u64, x: u64, y: u64) -> PassArgs {
    let buf = |b: Buf| match b {
        Buf::X => x,
        Buf::Y => y,
        Buf::Work => ptrs.work,
    };
    PassArgs {
        src: buf(p.src),
        dst: buf(p.dst),
        tw: if p.st { stw } else { ptrs.tw },
        // One-pass plans have no four-step tables (0); pass a valid address all the same. (Not
        // `twlo.max(tw)`: that picks `tw` whenever the allocator placed the table below it —
        // the n = 2^15 failure of the first H200 run.)
        lo: if ptrs.twlo != 0 { ptrs.twlo } else { ptrs.tw },
        hi: if ptrs.twhi != 0 { ptrs.twhi } else { ptrs.tw },
        log_c: p.log_c,
        log_min: p.log_min,
        log_mout: p.log_mout,
        count: p.count,
        log_lt,
        log_split: split_log(log_n),
        flags: p.flags,
        sm_stride: p.sm_stride,
        grid: p.grid,
        threads: p.threads,
        smem_bytes: p.smem_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The four-step tables reach the kernel whatever the allocator's address order (the
    /// first H200 run passed `max(twlo, tw)`, i.e. the wrong table when `twlo < tw`).
    #[test]
    fn pass_args_pass_the_tables_in_any_address_order() {
        let passes = decompose(15, 2, 8, max_single_log(8));
        for (tw, twlo, twhi, work) in [(0x1000, 0x2000, 0x3000, 0x4000), (0x9000, 0x2000, 0x3000, 0x4000)] {
            let ptrs = PlanPtrs { tw, twlo, twhi, work };
            for p in &passes {
                let a = pass_args(p, 15, 8, ptrs, 0, 0x10_0000, 0x20_0000);
                assert_eq!((a.tw, a.lo, a.hi), (tw, twlo, twhi));
            }
            let a = pass_args(&passes[0], 15, 8, ptrs, 0, 0x10_0000, 0x20_0000);
            assert_eq!((a.src, a.dst), (0x10_0000, work));
            let a = pass_args(&passes[1], 15, 8, ptrs, 0, 0x10_0000, 0x20_0000);
            assert_eq!((a.src, a.dst), (work, 0x20_0000));
        }
        // One-pass plans: no four-step tables, `tw` in their place.
        let one = decompose(10, 3, 8, max_single_log(8));
        let a = pass_args(&one[0], 10, 10, PlanPtrs { tw: 0x5000, twlo: 0, twhi: 0, work: 0 }, 0, 1 << 20, 2 << 20);
        assert_eq!((a.tw, a.lo, a.hi, a.src, a.dst), (0x5000, 0x5000, 0x5000, 1 << 20, 2 << 20));
        // Stage-table passes get their own table in `tw`.
        let mut st = one[0].clone();
        st.st = true;
        let a = pass_args(&st, 10, 10, PlanPtrs { tw: 0x5000, twlo: 0, twhi: 0, work: 0 }, 0x7000, 1 << 20, 2 << 20);
        assert_eq!((a.tw, a.lo, a.hi), (0x7000, 0x5000, 0x5000));
    }

    /// The stage table holds exactly the entries the kernel's `stage_twiddles` indexes:
    /// stage offsets `Σ (E − 1)·Ns`, entry `(r − 1)·Ns + k` = `W_{Ns·E}^{r·k}`.
    #[test]
    fn stage_table_layout() {
        use crate::reference::twiddle;
        for elem in [8, 16] {
            for log_l in 1..=max_single_log(elem) {
                let e = elems_per_thread(log_l, elem);
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
                            assert_eq!((t[2 * i], t[2 * i + 1]), w, "l={log_l} s={s} r={r} k={k}");
                        }
                    }
                    off += ((e - 1) as usize) << ls;
                }
                assert_eq!(t.len(), 2 * off.max(1), "l={log_l}");
            }
        }
    }

    /// Shrinking a pass to fewer threads keeps every transform covered and the geometry
    /// consistent.
    #[test]
    fn shrink_keeps_the_geometry() {
        for elem in [8, 16] {
            for log_n in 1..=max_log_n(elem) {
                for batch in [1, 3, 64, 300] {
                    for p in decompose(log_n, batch, elem, max_single_log(elem)) {
                        let mut q = p.clone();
                        let tpt = p.threads >> p.log_c;
                        let ok = q.shrink_to(256);
                        assert_eq!(ok, tpt <= 256, "{p:?}");
                        assert_eq!(q.threads, tpt << q.log_c);
                        assert!(q.threads <= 256 || q.log_c == 0);
                        assert!((q.blocks as usize) << q.log_c >= q.count as usize);
                        assert_eq!(q.smem_bytes, p.smem_bytes >> (p.log_c - q.log_c));
                    }
                }
            }
        }
    }
}
