//! CPU emulation of the FFT kernels: the kernel source itself (kernels-gpu/src/fft/{dft, cx,
//! stockham}.rs) compiled for the host against a software `prim` (thread and block indices in
//! thread-locals, `sync_threads` a real barrier over one OS thread per GPU thread, shared
//! memory a poisoned per-block buffer), launched with exactly the arguments the plan's
//! `execute_raw` passes ([`super::plan::pass_args`]) and the plan's own tables. Unlike the
//! index model (`model.rs`, a re-statement of the kernel's arithmetic), this runs the kernel
//! code, so a kernel/host disagreement (entry table, argument order, geometry, tables) shows.
#![allow(clippy::too_many_arguments)]

use std::cell::Cell;
use std::sync::{Arc, Barrier};

use super::plan::{pass_args, stage_table, twiddle_tables, Buf, Pass, PassArgs, PlanPtrs};

/// The kernels' primitives, in software (only those the FFT kernels use).
#[allow(dead_code)]
pub mod prim {
    use super::*;

    thread_local! {
        pub(super) static TID: Cell<u32> = const { Cell::new(0) };
        pub(super) static BID: Cell<u32> = const { Cell::new(0) };
        pub(super) static BDIM: Cell<u32> = const { Cell::new(0) };
        pub(super) static GDIM: Cell<u32> = const { Cell::new(0) };
        pub(super) static SMEM: Cell<usize> = const { Cell::new(0) };
        pub(super) static SMEM_LEN: Cell<usize> = const { Cell::new(0) };
        pub(super) static BAR: std::cell::RefCell<Option<Arc<Barrier>>> = const { std::cell::RefCell::new(None) };
    }

    pub fn thread_idx_x() -> u32 {
        TID.with(|c| c.get())
    }
    pub fn block_idx_x() -> u32 {
        BID.with(|c| c.get())
    }
    pub fn block_dim_x() -> u32 {
        BDIM.with(|c| c.get())
    }
    pub fn grid_dim_x() -> u32 {
        GDIM.with(|c| c.get())
    }
    pub fn sync_threads() {
        BAR.with(|b| {
            b.borrow().as_ref().expect("sync_threads outside a launch").wait();
        });
    }
    pub fn dyn_smem<T>() -> *mut T {
        SMEM.with(|c| c.get()) as *mut T
    }
    /// The shared-window address of the dynamic shared memory: not 0 (as on the GPU, where
    /// reserved and static shared memory come first), so an offset taken for an address shows.
    pub const SMEM_WINDOW: u32 = 0x400;
    pub fn dyn_smem_u32() -> u32 {
        SMEM_WINDOW
    }
    /// The host address of shared-window address `a` for a `T` access: checks that it lies in
    /// the block's dynamic shared memory (the launch's `smem_bytes`) and is naturally aligned.
    fn shared<T>(a: u32) -> *mut T {
        let len = SMEM_LEN.with(|c| c.get());
        let sz = std::mem::size_of::<T>();
        assert!(
            a >= SMEM_WINDOW && (a - SMEM_WINDOW) as usize + sz <= len,
            "shared access {a:#x} outside [{SMEM_WINDOW:#x}, +{len})"
        );
        assert!((a as usize).is_multiple_of(sz), "shared access {a:#x} misaligned for {sz} bytes");
        (SMEM.with(|c| c.get()) + (a - SMEM_WINDOW) as usize) as *mut T
    }
    /// # Safety
    /// None beyond the checks of `shared` (the block's buffer is live during the launch).
    pub unsafe fn lds_v2_f32(a: u32) -> (f32, f32) {
        let p = shared::<[f32; 2]>(a);
        ((*p)[0], (*p)[1])
    }
    /// # Safety
    /// As [`lds_v2_f32`].
    pub unsafe fn sts_v2_f32(a: u32, x: f32, y: f32) {
        *shared::<[f32; 2]>(a) = [x, y];
    }
    /// # Safety
    /// As [`lds_v2_f32`].
    pub unsafe fn lds_v2_f64(a: u32) -> (f64, f64) {
        let p = shared::<[f64; 2]>(a);
        ((*p)[0], (*p)[1])
    }
    /// # Safety
    /// As [`lds_v2_f32`].
    pub unsafe fn sts_v2_f64(a: u32, x: f64, y: f64) {
        *shared::<[f64; 2]>(a) = [x, y];
    }
    pub fn opaque_u32(v: u32) -> u32 {
        v
    }
    /// # Safety
    /// None needed (no access).
    pub unsafe fn prefetch_l2<T>(_p: *const T) {}
    /// `griddepcontrol.wait`: nothing to wait for in the emulation.
    pub fn grid_dependency_wait() {}
    /// # Safety
    /// None needed (no access).
    pub unsafe fn prefetch_l2_evict_last(_p: *const u8) {}
    /// # Safety
    /// `p` valid for two u32.
    pub unsafe fn ld_nc_v2_u32(p: *const u32) -> (u32, u32) {
        (*p, *p.add(1))
    }
    /// # Safety
    /// `p` valid for four u32.
    pub unsafe fn ld_nc_v4(p: *const u32) -> [u32; 4] {
        [*p, *p.add(1), *p.add(2), *p.add(3)]
    }
    /// The copy at once (the emulation has no asynchrony); checks the 16-byte alignment the
    /// GPU instruction requires.
    ///
    /// # Safety
    /// Both valid for 16 bytes.
    pub unsafe fn cp_async_16(dst: *mut u8, src: *const u8) {
        assert!((dst as usize).is_multiple_of(16) && (src as usize).is_multiple_of(16), "cp.async.16 misaligned");
        std::ptr::copy_nonoverlapping(src, dst, 16);
    }
    pub fn cp_async_commit_group() {}
    pub fn cp_async_wait_group_1() {}
    pub fn cp_async_wait_all() {}
}

#[allow(dead_code, unused_imports, clippy::all)]
#[path = "../../../kernels-gpu/src/fft/dft.rs"]
mod dft;

#[allow(dead_code, unused_imports, clippy::all)]
#[path = "../../../kernels-gpu/src/fft/cx.rs"]
mod cx;

#[allow(dead_code, unused_imports, clippy::all)]
#[path = "../../../kernels-gpu/src/fft/stockham.rs"]
mod stockham;

use dft::Cx;

type Kernel<T> = unsafe fn(
    *const Cx<T>,
    *mut Cx<T>,
    *const Cx<T>,
    *const Cx<T>,
    *const Cx<T>,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
);

/// A storage precision of the emulation: the kernel entry of a PTX name.
pub(crate) trait Elem: cx::Mem + Send + Sync + 'static {
    fn kernel(name: &str) -> Kernel<Self>;
    fn to_f64(self) -> f64;
    const BYTES: usize;
}

macro_rules! kernels {
    ($t:ty, $bytes:literal, $($name:ident),*) => {
        impl Elem for $t {
            fn kernel(name: &str) -> Kernel<Self> {
                match name {
                    $(stringify!($name) => stockham::$name,)*
                    _ => panic!("no kernel named {name}"),
                }
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
            const BYTES: usize = $bytes;
        }
    };
}
kernels!(
    f32,
    8,
    fft_c64_l1,
    fft_c64_l2,
    fft_c64_l3,
    fft_c64_l4,
    fft_c64_l5,
    fft_c64_l6,
    fft_c64_l7,
    fft_c64_l8,
    fft_c64_l9,
    fft_c64_l10,
    fft_c64_l11,
    fft_c64_l12,
    fft_c64_l13,
    fft_c64_l1_st,
    fft_c64_l2_st,
    fft_c64_l3_st,
    fft_c64_l4_st,
    fft_c64_l5_st,
    fft_c64_l6_st,
    fft_c64_l7_st,
    fft_c64_l8_st,
    fft_c64_l9_st,
    fft_c64_l10_st,
    fft_c64_l11_st,
    fft_c64_l12_st,
    fft_c64_l13_st,
    fft_c64_l1_stn,
    fft_c64_l2_stn,
    fft_c64_l3_stn,
    fft_c64_l4_stn,
    fft_c64_l5_stn,
    fft_c64_l6_stn,
    fft_c64_l7_stn,
    fft_c64_l8_stn,
    fft_c64_l9_stn,
    fft_c64_l10_stn,
    fft_c64_l11_stn,
    fft_c64_l12_stn,
    fft_c64_l13_stn,
    fft_c64_l10_st8,
    fft_c64_l12_st8,
    fft_c64_l10_st8p,
    fft_c64_l12_st8p,
    fft_c64_l9_stp,
    fft_c64_l10_stp,
    fft_c64_l12_stp,
    fft_c64_l6_sta,
    fft_c64_l9_sta,
    fft_c64_l10_sta,
    fft_c64_l13_sp1,
    fft_c64_l12_sp2,
    fft_c64_l13_sp2
);
kernels!(
    f64,
    16,
    fft_c128_l1,
    fft_c128_l2,
    fft_c128_l3,
    fft_c128_l4,
    fft_c128_l5,
    fft_c128_l6,
    fft_c128_l7,
    fft_c128_l8,
    fft_c128_l9,
    fft_c128_l10,
    fft_c128_l11,
    fft_c128_l12,
    fft_c128_l1_st,
    fft_c128_l2_st,
    fft_c128_l3_st,
    fft_c128_l4_st,
    fft_c128_l5_st,
    fft_c128_l6_st,
    fft_c128_l7_st,
    fft_c128_l8_st,
    fft_c128_l9_st,
    fft_c128_l10_st,
    fft_c128_l11_st,
    fft_c128_l12_st,
    fft_c128_l1_stn,
    fft_c128_l2_stn,
    fft_c128_l3_stn,
    fft_c128_l4_stn,
    fft_c128_l5_stn,
    fft_c128_l6_stn,
    fft_c128_l7_stn,
    fft_c128_l8_stn,
    fft_c128_l9_stn,
    fft_c128_l10_stn,
    fft_c128_l11_stn,
    fft_c128_l12_stn
);

/// Device memory of the emulation: a 16-byte aligned buffer of `len` complex elements.
struct DevBuf {
    mem: Vec<u128>,
}

impl DevBuf {
    fn new(bytes: usize, fill: u8) -> Self {
        let mut mem = vec![0u128; bytes.div_ceil(16).max(1)];
        // SAFETY: the Vec owns at least `bytes` bytes.
        unsafe { std::ptr::write_bytes(mem.as_mut_ptr() as *mut u8, fill, bytes) };
        DevBuf { mem }
    }
    fn addr(&mut self) -> u64 {
        self.mem.as_mut_ptr() as u64
    }
}

fn upload<T: Elem>(v: &[f64]) -> DevBuf {
    let mut b = DevBuf::new(v.len() * T::BYTES / 2, 0);
    let p = b.addr() as *mut T;
    for (i, &a) in v.iter().enumerate() {
        // SAFETY: in bounds (len reals of size BYTES / 2).
        unsafe { *p.add(i) = T::from_f64(a) };
    }
    b
}

/// The tables in one buffer, in the order given (256-byte aligned parts); returns the buffer
/// and each part's address.
fn upload_tables<T: Elem>(parts: &[&[f64]]) -> (DevBuf, Vec<u64>) {
    let bytes = |v: &[f64]| (v.len() * T::BYTES / 2).div_ceil(256) * 256;
    let all: Vec<f64> = parts
        .iter()
        .flat_map(|v| {
            let pad = bytes(v) / (T::BYTES / 2) - v.len();
            v.iter().copied().chain(std::iter::repeat_n(f64::NAN, pad))
        })
        .collect();
    let mut b = upload::<T>(&all);
    let mut at = b.addr();
    let addrs = parts
        .iter()
        .map(|v| {
            let a = at;
            at += bytes(v) as u64;
            a
        })
        .collect();
    (b, addrs)
}

/// Runs one launch: `a.grid` blocks of `a.threads` OS threads (one pool for the whole launch,
/// every block with its own shared memory, filled with 0xFF bytes: NaN for any float read
/// before it is written), the kernel's barriers as one `Barrier`.
fn launch<T: Elem>(k: Kernel<T>, a: &PassArgs) {
    let nthreads = a.threads as usize;
    let bar = Arc::new(Barrier::new(nthreads));
    let smem_bytes = (a.smem_bytes as usize).max(16);
    let mut smem: Vec<DevBuf> = (0..a.grid).map(|_| DevBuf::new(smem_bytes, 0xFF)).collect();
    let smem_addrs: Vec<u64> = smem.iter_mut().map(|b| b.addr()).collect();
    let a = *a;
    std::thread::scope(|s| {
        for tid in 0..a.threads {
            let bar = bar.clone();
            let smem_addrs = &smem_addrs;
            std::thread::Builder::new()
                .stack_size(16 << 20)
                .spawn_scoped(s, move || {
                    prim::TID.with(|c| c.set(tid));
                    prim::BDIM.with(|c| c.set(a.threads));
                    prim::GDIM.with(|c| c.set(a.grid));
                    prim::BAR.with(|b| *b.borrow_mut() = Some(bar.clone()));
                    prim::SMEM_LEN.with(|c| c.set(smem_bytes));
                    for b in 0..a.grid {
                        prim::BID.with(|c| c.set(b));
                        prim::SMEM.with(|c| c.set(smem_addrs[b as usize] as usize));
                        // SAFETY: the plan's buffers hold every element the pass addresses (the
                        // property under test; an out-of-bounds access is a test failure at
                        // best, as on the GPU).
                        unsafe {
                            k(
                                a.src as *const Cx<T>,
                                a.dst as *mut Cx<T>,
                                a.tw as *const Cx<T>,
                                a.lo as *const Cx<T>,
                                a.hi as *const Cx<T>,
                                a.log_c,
                                a.log_min,
                                a.log_mout,
                                a.count,
                                a.log_lt,
                                a.log_split,
                                a.flags,
                                a.sm_stride,
                            )
                        };
                        // Blocks run one after another (as if each had the whole GPU).
                        bar.wait();
                    }
                    prim::BAR.with(|b| *b.borrow_mut() = None);
                })
                .expect("spawning an emulated GPU thread");
        }
    });
    drop(smem);
}

/// Executes `passes` (a plan for `n = 2^log_n`, `batch` transforms) through the emulated
/// kernels exactly as `FftPlan::execute_raw` does (out of place, or in place with
/// `in_place`); `x` interleaved f64 (rounded to `T`), returns `y` in f64. Outputs and the
/// workspace start as NaN.
pub(crate) fn execute<T: Elem>(passes: &[Pass], log_n: u32, batch: usize, x: &[f64], in_place: bool) -> Vec<f64> {
    let reals = 2 * (batch << log_n);
    assert_eq!(x.len(), reals);
    // 0xFF bytes: a NaN in either precision.
    let nan = 0xFF;
    let mut xb = upload::<T>(x);
    let mut yb = DevBuf::new(reals * T::BYTES / 2, nan);
    let log_lt = passes.iter().map(|p| p.log_l).max().unwrap_or(0);
    let four_step = passes.len() > 1;
    let (tw, four) = twiddle_tables(log_n, log_lt, four_step || passes.iter().any(|p| p.split > 0));
    // The four-step tables at lower addresses than `tw` (the allocation order that the first
    // H200 run's `max(twlo, tw)` argument bug turned into wrong twiddles).
    let (_tables, addrs) = match &four {
        Some((lo, hi)) => upload_tables::<T>(&[lo, hi, &tw]),
        None => upload_tables::<T>(&[&tw]),
    };
    let mut work = if four_step { Some(DevBuf::new(reals * T::BYTES / 2, nan)) } else { None };
    let ptrs = PlanPtrs {
        tw: *addrs.last().unwrap(),
        twlo: if four.is_some() { addrs[0] } else { 0 },
        twhi: if four.is_some() { addrs[1] } else { 0 },
        work: work.as_mut().map_or(0, |b| b.addr()),
    };
    let (xa, ya) = if in_place { (xb.addr(), xb.addr()) } else { (xb.addr(), yb.addr()) };
    let prec = if T::BYTES == 8 { super::Precision::C64 } else { super::Precision::C128 };
    // Stage-table passes: each its own table, exactly its size (rounded up to 256 bytes, NaN
    // after it: an index past the table shows as a NaN result).
    let stw: Vec<Option<(DevBuf, Vec<u64>)>> =
        passes.iter().map(|p| p.st.then(|| upload_tables::<T>(&[&stage_table(p.log_l, p.e)]))).collect();
    for (p, st) in passes.iter().zip(&stw) {
        let a = pass_args(p, log_n, log_lt, ptrs, st.as_ref().map_or(0, |t| t.1[0]), xa, ya);
        // Every buffer a pass names is one the plan holds.
        assert!(p.src != Buf::Work || work.is_some(), "{p:?}");
        launch(T::kernel(super::FftPlan::pass_kernel(prec, p)), &a);
    }
    if passes.is_empty() {
        return x.iter().map(|&v| T::from_f64(v).to_f64()).collect();
    }
    let out = if in_place { xb.addr() } else { yb.addr() } as *const T;
    // SAFETY: `reals` values of T.
    (0..reals).map(|i| unsafe { *out.add(i) }.to_f64()).collect()
}

#[cfg(test)]
mod tests {
    use super::super::plan::{decompose, decompose_k, max_single_log, set_extra, split_pass, Knobs};
    use super::*;
    use crate::reference::{fft_c2c_fwd, fft_error, fft_error_bound};

    fn input(len: usize, seed: u64) -> Vec<f64> {
        let mut s = seed ^ 0x9E37_79B9_7F4A_7C15;
        (0..2 * len)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
            })
            .collect()
    }

    /// Runs the plan for `(n, batch)` through the emulated kernels; returns the rel L2 error
    /// after asserting it is within the GPU tests' bar.
    fn case<T: Elem>(log_n: u32, batch: usize, in_place: bool, grid: Option<u32>) -> f64 {
        case_st::<T>(log_n, batch, in_place, grid, None)
    }

    /// [`case`] with the stage-table kernels when `st` is `Some(max_threads)`: each pass shrunk
    /// to at most that many threads, or left on the `W_Lt` kernel if one transform needs more
    /// (as `FftPlan::new_opts` does for a kernel that allows fewer threads).
    fn case_st<T: Elem>(log_n: u32, batch: usize, in_place: bool, grid: Option<u32>, st: Option<(u32, bool)>) -> f64 {
        let elem = T::BYTES;
        let mut passes = if log_n == 0 { vec![] } else { decompose(log_n, batch, elem, max_single_log(elem)) };
        if let Some((m, hoist)) = st {
            for p in passes.iter_mut() {
                let mut q = p.clone();
                if q.shrink_to(m) {
                    *p = q;
                    p.st = true;
                    p.hoist = hoist;
                }
            }
        }
        if let Some(g) = grid {
            for p in passes.iter_mut().filter(|p| p.flags == 0 && p.log_min == 0) {
                p.grid = p.grid.min(g);
            }
        }
        let n = 1usize << log_n;
        let x = input(n * batch, (log_n as u64) << 20 | batch as u64);
        let xr: Vec<f64> = x.iter().map(|&v| T::from_f64(v).to_f64()).collect();
        let ours = execute::<T>(&passes, log_n, batch, &xr, in_place);
        let (rel, _) = fft_error(&ours, &fft_c2c_fwd(n, batch, &xr));
        let bound = fft_error_bound(n, elem == 16);
        assert!(
            rel <= bound,
            "emulated c{} n=2^{log_n} batch={batch} in_place={in_place} grid={grid:?} st={st:?}: rel {rel:e} > {bound:e}\n{passes:#?}",
            elem * 8
        );
        rel
    }

    /// Every length up to 2^16 in both precisions, several batches (1 and 2 for the four-step
    /// lengths), through the kernel code itself: this is the test that fails for the
    /// n = 2^15 bug of commit 83c77de on the GPU.
    #[test]
    fn emulated_kernels_every_length_to_2_16() {
        for log_n in 0..=16 {
            let batches: &[usize] = if log_n <= 10 { &[1, 3] } else { &[1, 2] };
            for &b in batches {
                case::<f32>(log_n, b, false, None);
                case::<f64>(log_n, b, false, None);
            }
        }
    }

    /// Longer four-step plans, uneven (n1 < n2) and even splits, batch 1 (every plan up to
    /// 2^22 is checked for geometry in `model.rs`; 2^20..2^22 take minutes here).
    #[test]
    fn emulated_kernels_long_lengths() {
        for log_n in [17, 18, 19] {
            case::<f32>(log_n, 1, false, None);
        }
        case::<f64>(17, 1, false, None);
    }

    /// In place, odd batches, persistent grids (fewer blocks than groups).
    #[test]
    fn emulated_kernels_in_place_odd_batches_persistent() {
        for (log_n, b) in [(3, 5), (12, 3), (13, 3), (14, 3), (15, 3), (15, 7)] {
            case::<f32>(log_n, b, true, None);
            case::<f64>(log_n, b, true, None);
            case::<f32>(log_n, b, false, None);
        }
        for (log_n, b) in [(6, 1001), (9, 300), (10, 37)] {
            case::<f32>(log_n, b, false, Some(5));
            case::<f64>(log_n, b, false, Some(3));
        }
    }

    /// [`case`] planned as `FftPlan::new_opts` does with hoisted stage tables and the session-4
    /// options: planner `knobs`, then ping-pong / staging where an extra kernel exists (each
    /// pass asserted to take the extra kernel when `expect_extra`). Max 512 threads per block.
    fn case_k(log_n: u32, batch: usize, in_place: bool, grid: Option<u32>, knobs: Knobs, pp: bool, staged: bool) {
        let mut passes = decompose_k(log_n, batch, 8, max_single_log(8), knobs);
        for p in passes.iter_mut() {
            p.st = true;
            p.hoist = true;
            assert!(p.shrink_to(512));
            set_extra(p, 8, pp, staged);
            if let Some(g) = grid {
                if p.flags == 0 && p.log_min == 0 {
                    p.grid = p.grid.min(g);
                }
            }
        }
        let n = 1usize << log_n;
        let x = input(n * batch, (log_n as u64) << 20 | batch as u64 | 1 << 40);
        let xr: Vec<f64> = x.iter().map(|&v| v as f32 as f64).collect();
        let ours = execute::<f32>(&passes, log_n, batch, &xr, in_place);
        let (rel, _) = fft_error(&ours, &fft_c2c_fwd(n, batch, &xr));
        let bound = fft_error_bound(n, false);
        assert!(
            rel <= bound,
            "emulated n=2^{log_n} batch={batch} in_place={in_place} grid={grid:?} {knobs:?} pp={pp} staged={staged}: rel {rel:e} > {bound:e}\n{passes:#?}"
        );
    }

    /// The session-4 kernels and planner knobs through the kernel code: 8 elements per thread
    /// (`_st8`, c64 1024 and 4096), ping-pong shared memory (`_stp`, `_st8p`), staged input
    /// (`_sta`: persistent grids whose blocks loop over several groups, a partial last group,
    /// in place), row-pass block sizes and four-step column counts.
    #[test]
    fn emulated_session4_kernels() {
        let e8 = Knobs { e8: true, ..Knobs::default() };
        for log_n in [10, 12] {
            for b in [1, 3] {
                case_k(log_n, b, false, None, e8, false, false);
                case_k(log_n, b, false, None, e8, true, false);
            }
            case_k(log_n, 3, true, None, e8, true, false);
            case_k(log_n, 5, false, Some(2), e8, false, false);
            case_k(log_n, 5, false, Some(2), e8, true, false);
        }
        // Session 8: 8 elements per thread in the four-step row pass (transposed store), with
        // and without ping-pong: 2^16 = 2^6 × 2^10 (odd batch, in place) and 2^18 = 2^6 × 2^12
        // (the GPU test also runs the balanced 2^20).
        for (log_n, log_n1) in [(16, 6), (18, 6)] {
            let k = Knobs { e8: true, log_n1, cols: 32, ..Knobs::default() };
            let cases: &[(usize, bool)] =
                if log_n == 16 { &[(1, false), (3, false), (2, true)] } else { &[(1, false)] };
            for &(b, in_place) in cases {
                case_k(log_n, b, in_place, None, k, false, false);
                case_k(log_n, b, in_place, None, k, true, false);
            }
            let passes = decompose_k(log_n, 1, 8, max_single_log(8), k);
            assert_eq!(passes.last().unwrap().e, 8, "2^{log_n}: the row pass takes 8 elements per thread");
        }
        for log_n in [9, 10, 12] {
            case_k(log_n, 3, false, None, Knobs::default(), true, false);
            case_k(log_n, 7, true, Some(2), Knobs::default(), true, false);
        }
        for (log_n, b) in [(6, 1001), (6, 3), (9, 37), (9, 1), (10, 13), (10, 2)] {
            case_k(log_n, b, false, None, Knobs::default(), false, true);
            case_k(log_n, b, false, Some(3), Knobs::default(), false, true);
            case_k(log_n, b, true, Some(2), Knobs::default(), false, true);
        }
        for rt in [64, 128, 512] {
            let k = Knobs { row_threads: rt, ..Knobs::default() };
            for log_n in [2, 6, 9, 10, 12, 13] {
                case_k(log_n, 3, false, None, k, false, false);
            }
            case_k(9, 37, false, Some(3), k, false, true);
        }
        // Split passes: 2^14 as 2 × 8192 and 4 × 4096, 2^15 as 4 × 8192, odd batches.
        for (log_n, log_r) in [(14, 1), (14, 2), (15, 2)] {
            // (Not in place: `execute_raw` copies `x` into the workspace first for that.)
            for (b, in_place) in [(1, false), (3, false), (2, false)] {
                let mut p = split_pass(log_n, b, log_r).expect("a split kernel");
                p.threads = p.threads.min(512);
                let n = 1usize << log_n;
                let x = input(n * b, (log_n as u64) << 20 | b as u64 | 1 << 41);
                let xr: Vec<f64> = x.iter().map(|&v| v as f32 as f64).collect();
                let ours = execute::<f32>(&[p], log_n, b, &xr, in_place);
                let (rel, _) = fft_error(&ours, &fft_c2c_fwd(n, b, &xr));
                assert!(rel <= fft_error_bound(n, false), "split n=2^{log_n} R=2^{log_r} batch={b}: {rel:e}");
            }
        }
        for cols in [2, 4, 8, 32] {
            let k = Knobs { cols, ..Knobs::default() };
            for log_n in [14, 15, 16] {
                case_k(log_n, 2, false, None, k, false, false);
            }
            case_k(15, 3, true, None, k, true, false);
        }
    }

    /// The stage-table kernels (`_st`, and `_stn` without hoisting): every length to 2^16 in both precisions (one- and
    /// two-pass plans), blocks shrunk to 256 and to 128 threads, in place, odd batches and
    /// persistent grids.
    #[test]
    fn emulated_stage_table_kernels() {
        for log_n in 1..=16 {
            let batches: &[usize] = if log_n <= 10 { &[1, 3] } else { &[1, 2] };
            for &b in batches {
                case_st::<f32>(log_n, b, false, None, Some((512, true)));
                case_st::<f64>(log_n, b, false, None, Some((256, true)));
            }
        }
        for (log_n, b) in [(12, 3), (13, 3), (15, 3), (16, 1)] {
            case_st::<f32>(log_n, b, true, None, Some((128, true)));
            case_st::<f64>(log_n, b, false, None, Some((128, true)));
        }
        for (log_n, b) in [(6, 1001), (9, 300), (10, 37), (12, 5)] {
            case_st::<f32>(log_n, b, false, Some(5), Some((512, true)));
            case_st::<f64>(log_n, b, false, Some(3), Some((256, true)));
        }
        case_st::<f32>(17, 1, false, None, Some((512, true)));
        // Without hoisting (`_stn`).
        for log_n in 1..=16 {
            let b = if log_n <= 10 { 3 } else { 2 };
            case_st::<f32>(log_n, b, false, None, Some((512, false)));
            case_st::<f64>(log_n, b, false, None, Some((512, false)));
        }
        case_st::<f32>(9, 300, false, Some(5), Some((512, false)));
        case_st::<f64>(12, 3, true, None, Some((256, false)));
    }
}
