//! CPU emulation of the FFT kernels: the kernel source itself (kernels-gpu/src/fft/{dft, cx,
//! stockham}.rs) compiled for the host against a software `prim` (thread and block indices in
//! thread-locals, `sync_threads` a real barrier over one OS thread per GPU thread, shared
//! memory a poisoned per-block buffer), launched with exactly the arguments the plan's
//! `execute_raw` passes ([`super::plan::pass_args`]) and the plan's own tables. It runs the
//! kernel code, so a kernel/host disagreement (entry table, argument order, geometry, tables)
//! shows. Every kernel of the planner's table runs here.
#![allow(clippy::too_many_arguments)]

use std::cell::Cell;
use std::sync::{Arc, Barrier};

use super::plan::{four_step_tables, pass_args, stage_table, Buf, Pass, PassArgs, PlanPtrs};
use kernel_abi::FftPassArgs;

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
    pub fn grid_launch_dependents() {}
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

/// A pass kernel (the host build of its PTX entry).
type Kernel = unsafe fn(FftPassArgs);

/// The host build of the pass kernel named `name` (every row of
/// `kernel_abi::fft_pass_kernels!`, the list the PTX entries are declared from).
macro_rules! kernel_by_name {
    ($($name:ident: $prec:ident, $log_l:literal, $e:literal, $form:ident, $max:literal;)*) => {
        fn kernel_named(name: &str) -> Kernel {
            match name {
                $(stringify!($name) => stockham::$name,)*
                _ => panic!("no kernel named {name}"),
            }
        }
    };
}
kernel_abi::fft_pass_kernels!(kernel_by_name);

/// A storage precision of the emulation.
pub(crate) trait Elem: cx::Mem + Send + Sync + 'static {
    fn to_f64(self) -> f64;
    const BYTES: usize;
}

impl Elem for f32 {
    fn to_f64(self) -> f64 {
        self as f64
    }
    const BYTES: usize = 8;
}

impl Elem for f64 {
    fn to_f64(self) -> f64 {
        self
    }
    const BYTES: usize = 16;
}

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
/// A pass's arguments shared by the emulated threads (device addresses into buffers that
/// outlive the launch; the kernel's own synchronisation orders the accesses).
struct SendArgs(FftPassArgs);
// SAFETY: see above; the emulated threads use the pointers as the GPU's threads would.
unsafe impl Sync for SendArgs {}

fn launch(k: Kernel, a: &PassArgs) {
    let nthreads = a.threads as usize;
    let bar = Arc::new(Barrier::new(nthreads));
    let smem_bytes = (a.smem_bytes as usize).max(16);
    let mut smem: Vec<DevBuf> = (0..a.grid).map(|_| DevBuf::new(smem_bytes, 0xFF)).collect();
    let smem_addrs: Vec<u64> = smem.iter_mut().map(|b| b.addr()).collect();
    let (grid, threads) = (a.grid, a.threads);
    let args = SendArgs(a.kernel);
    let args = &args;
    std::thread::scope(|s| {
        for tid in 0..threads {
            let bar = bar.clone();
            let smem_addrs = &smem_addrs;
            std::thread::Builder::new()
                .stack_size(16 << 20)
                .spawn_scoped(s, move || {
                    prim::TID.with(|c| c.set(tid));
                    prim::BDIM.with(|c| c.set(threads));
                    prim::GDIM.with(|c| c.set(grid));
                    prim::BAR.with(|b| *b.borrow_mut() = Some(bar.clone()));
                    prim::SMEM_LEN.with(|c| c.set(smem_bytes));
                    for b in 0..grid {
                        prim::BID.with(|c| c.set(b));
                        prim::SMEM.with(|c| c.set(smem_addrs[b as usize] as usize));
                        // SAFETY: the plan's buffers hold every element the pass addresses (the
                        // property under test; an out-of-bounds access is a test failure at
                        // best, as on the GPU).
                        unsafe { k(args.0) };
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
/// workspace start as NaN. `unaligned`: every pass runs its `unaligned` kernel (as for an
/// 8-byte aligned `x`).
pub(crate) fn execute<T: Elem>(
    passes: &[Pass],
    log_n: u32,
    batch: usize,
    x: &[f64],
    in_place: bool,
    unaligned: bool,
) -> Vec<f64> {
    let reals = 2 * (batch << log_n);
    assert_eq!(x.len(), reals);
    // 0xFF bytes: a NaN in either precision.
    let nan = 0xFF;
    let mut xb = upload::<T>(x);
    let mut yb = DevBuf::new(reals * T::BYTES / 2, nan);
    let four_step = passes.len() > 1;
    // The four-step tables at lower addresses than the stage tables (the allocation order in
    // which a `max(twlo, tw)` argument would pick the wrong table).
    let four = four_step.then(|| four_step_tables(log_n));
    let (_four_tables, four_addrs) = match &four {
        Some((lo, hi)) => upload_tables::<T>(&[lo, hi]),
        None => upload_tables::<T>(&[]),
    };
    let mut work = if four_step { Some(DevBuf::new(reals * T::BYTES / 2, nan)) } else { None };
    let ptrs = PlanPtrs {
        twlo: if four_step { four_addrs[0] } else { 0 },
        twhi: if four_step { four_addrs[1] } else { 0 },
        work: work.as_mut().map_or(0, |b| b.addr()),
    };
    let (xa, ya) = if in_place { (xb.addr(), xb.addr()) } else { (xb.addr(), yb.addr()) };
    // Each pass its own stage table, exactly its size (rounded up to 256 bytes, NaN after it:
    // an index past the table shows as a NaN result).
    let stw: Vec<(DevBuf, Vec<u64>)> =
        passes.iter().map(|p| upload_tables::<T>(&[&stage_table(p.log_l, p.e)])).collect();
    for (p, st) in passes.iter().zip(&stw) {
        let a = pass_args(p, log_n, ptrs, st.1[0], xa, ya);
        // Every buffer a pass names is one the plan holds.
        assert!(p.src != Buf::Work || work.is_some(), "{p:?}");
        let kernel = if unaligned { p.unaligned } else { p.kernel };
        launch(kernel_named(kernel.name), &a);
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
    use super::super::plan::{four_step, kernel, one_pass, persist, plan, Form, KERNELS};
    use super::super::Precision;
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

    /// Runs `passes` (for `2^log_n`, `batch`) through the emulated kernels; asserts the rel L2
    /// error is within the GPU tests' bar.
    fn check(prec: Precision, passes: &[Pass], log_n: u32, batch: usize, in_place: bool, unaligned: bool) {
        let n = 1usize << log_n;
        let x = input(n * batch, (log_n as u64) << 20 | batch as u64);
        let (ours, xr) = match prec {
            Precision::C64 => {
                let xr: Vec<f64> = x.iter().map(|&v| v as f32 as f64).collect();
                (execute::<f32>(passes, log_n, batch, &xr, in_place, unaligned), xr)
            }
            Precision::C128 => (execute::<f64>(passes, log_n, batch, &x, in_place, unaligned), x),
        };
        let (rel, _) = fft_error(&ours, &fft_c2c_fwd(n, batch, &xr));
        let bound = fft_error_bound(n, prec == Precision::C128);
        let kernels: Vec<_> = passes.iter().map(|p| p.kernel.name).collect();
        assert!(
            rel <= bound,
            "emulated {prec:?} n=2^{log_n} batch={batch} in_place={in_place} unaligned={unaligned} {kernels:?}: rel {rel:e} > {bound:e}\n{passes:#?}"
        );
    }

    /// The shipped plan of `(prec, 2^log_n, batch)`; with `slots`, persistent row passes sized
    /// for a device of that many block slots (1 SM), so blocks loop over several groups.
    fn shipped(prec: Precision, log_n: u32, batch: usize, slots: Option<u32>) -> Vec<Pass> {
        let mut passes = plan(prec, log_n, batch);
        if let Some(s) = slots {
            for p in passes.iter_mut() {
                persist(p, 1, s);
                if p.persistent {
                    // The two-wave rule leaves short batches unlooped; loop them anyway.
                    p.grid = p.grid.min(s);
                }
            }
        }
        passes
    }

    /// The planner's plans for every length up to 2^16 in both precisions, several batches
    /// (1 and 2 for the four-step lengths), through the kernel code itself.
    #[test]
    fn emulated_plans_every_length_to_2_16() {
        for log_n in 0..=16 {
            let batches: &[usize] = if log_n <= 10 { &[1, 3] } else { &[1, 2] };
            for &b in batches {
                for prec in [Precision::C64, Precision::C128] {
                    check(prec, &shipped(prec, log_n, b, None), log_n, b, false, false);
                }
            }
        }
    }

    /// Longer four-step plans, uneven (n1 < n2) and even splits, batch 1.
    #[test]
    fn emulated_plans_long_lengths() {
        for log_n in [17, 18, 19] {
            check(Precision::C64, &shipped(Precision::C64, log_n, 1, None), log_n, 1, false, false);
        }
        check(Precision::C128, &shipped(Precision::C128, 17, 1, None), 17, 1, false, false);
    }

    /// In place, odd batches, persistent grids (blocks looping over groups, a partial last
    /// group; the staged kernels' double-buffered copies), and the staged passes' `unaligned`
    /// kernels.
    #[test]
    fn emulated_plans_in_place_odd_batches_persistent() {
        for (log_n, b) in [(3, 5), (12, 3), (13, 3), (14, 3), (15, 3), (15, 7)] {
            for prec in [Precision::C64, Precision::C128] {
                check(prec, &shipped(prec, log_n, b, None), log_n, b, true, false);
                check(prec, &shipped(prec, log_n, b, None), log_n, b, false, false);
            }
        }
        for (log_n, b) in [(6, 1001), (6, 3), (7, 37), (9, 37), (9, 1), (10, 13), (10, 2), (11, 5), (12, 5), (13, 3)] {
            for slots in [1, 3] {
                check(Precision::C64, &shipped(Precision::C64, log_n, b, Some(slots)), log_n, b, false, false);
            }
            check(Precision::C64, &shipped(Precision::C64, log_n, b, Some(2)), log_n, b, true, false);
            check(Precision::C64, &shipped(Precision::C64, log_n, b, Some(2)), log_n, b, false, true);
        }
        for (log_n, b) in [(7, 300), (9, 37), (11, 5), (12, 5)] {
            check(Precision::C128, &shipped(Precision::C128, log_n, b, Some(3)), log_n, b, false, false);
        }
    }

    /// The per-stage kernels (planned for n ≥ 2^20, beyond the emulation's reach, and the
    /// longest one-pass lengths): each as a row pass, and c128 in the four-step passes of 2^18
    /// and 2^19 (column pass with the four-step twiddle, row pass with the transposed store).
    #[test]
    fn emulated_per_stage_kernels() {
        for kn in KERNELS.iter().filter(|k| k.form == Form::PerStage) {
            let prec = if kn.c128 { Precision::C128 } else { Precision::C64 };
            for (b, in_place) in [(1, false), (3, true)] {
                let p = one_pass(kn, kn, b, (256, 64), false);
                check(prec, &[p], kn.log_l, b, in_place, false);
            }
        }
        for log_n in [18, 19] {
            check(
                Precision::C128,
                &four_step(Precision::C128, log_n, 1, 9, 16, Form::PerStage),
                log_n,
                1,
                false,
                false,
            );
        }
        // Every kernel of the table ran somewhere in these tests (the others through the plans).
        assert_eq!(kernel(Precision::C64, 13, Form::PerStage).name, "fft_c64_l13_tw_per_stage");
    }
}
