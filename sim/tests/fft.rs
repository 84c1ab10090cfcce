//! FFTC2CFwd on the CPU: the planner's passes (`rgk::fft::plan`) run as exactly the launches
//! `FftPlan::execute_raw` submits (`pass_launch`: kernel, arguments, geometry, dependency) on
//! the plan's own tables, so a kernel/host disagreement (entry table, argument order,
//! geometry, tables, a read before the grid-dependency wait) shows. Every kernel
//! of the planner's table runs here; the rel L2 error is held to the GPU tests' bar.
use kernel_abi::FftPassArgs;
use kernels_gpu::fft::cx::Mem;
use rgk::fft::plan::{
    four_step, four_step_tables, kernel, one_pass, pass_launch, persist, plan, stage_table, Buf, Form, Layout, Pass,
    PlanPtrs, KERNELS,
};
use rgk::fft::Precision;
use rgk::reference::{fft_c2c_fwd, fft_error, fft_error_bound};
use sim::DevBuf;

/// A storage precision of the simulation.
trait Elem: Mem + Copy + 'static {
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

/// `bytes` bytes of `fill`.
fn filled(bytes: usize, fill: u8) -> DevBuf {
    DevBuf::from_slice(&vec![fill; bytes])
}

fn upload<T: Elem>(v: &[f64]) -> DevBuf {
    let t: Vec<T> = v.iter().map(|&a| T::from_f64(a)).collect();
    DevBuf::from_slice(&t)
}

/// The tables in one buffer, in the order given (256-byte aligned parts, NaN padding); returns
/// the buffer and each part's address.
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

/// Executes `passes` (a plan for `n = 2^log_n`, `batch` transforms) as `FftPlan::execute_raw`
/// does (out of place, or in place with `in_place`); `x` interleaved f64 (rounded to `T`),
/// returns `y` in f64. Outputs and the workspace start as NaN. `unaligned`: every pass runs its
/// `unaligned` kernel (as for an 8-byte aligned `x`).
fn execute<T: Elem>(passes: &[Pass], log_n: u32, batch: usize, x: &[f64], in_place: bool, unaligned: bool) -> Vec<f64> {
    let reals = 2 * (batch << log_n);
    assert_eq!(x.len(), reals);
    // 0xFF bytes: a NaN in either precision.
    let nan = 0xFF;
    let mut xb = upload::<T>(x);
    let mut yb = filled(reals * T::BYTES / 2, nan);
    let four_step = passes.len() > 1;
    // The four-step tables at lower addresses than the stage tables (the allocation order in
    // which a `max(twlo, tw)` argument would pick the wrong table); none where the kernels
    // compute the twiddles (c64), as `FftPlan` uploads none.
    let four = (four_step && !T::COMPUTED_TWIDDLES).then(|| four_step_tables(log_n));
    let (_four_tables, four_addrs) = match &four {
        Some((lo, hi)) => upload_tables::<T>(&[lo, hi]),
        None => upload_tables::<T>(&[]),
    };
    let mut work = if four_step { Some(filled(reals * T::BYTES / 2, nan)) } else { None };
    let ptrs = PlanPtrs {
        twlo: if four.is_some() { four_addrs[0] } else { 0 },
        twhi: if four.is_some() { four_addrs[1] } else { 0 },
        work: work.as_mut().map_or(0, |b| b.addr()),
    };
    let (xa, ya) = if in_place { (xb.addr(), xb.addr()) } else { (xb.addr(), yb.addr()) };
    // Each pass its own stage table, exactly its size (rounded up to 256 bytes, NaN after it:
    // an index past the table shows as a NaN result).
    let stw: Vec<(DevBuf, Vec<u64>)> =
        passes.iter().map(|p| upload_tables::<T>(&[&stage_table(p.log_l, p.e)])).collect();
    for (i, (p, st)) in passes.iter().zip(&stw).enumerate() {
        // Every buffer a pass names is one the plan holds.
        assert!(p.src != Buf::Work || work.is_some(), "{p:?}");
        sim::run::<FftPassArgs>(sim::fft, &pass_launch(passes, i, log_n, ptrs, st.1[0], xa, ya, unaligned));
    }
    if passes.is_empty() {
        return x.iter().map(|&v| T::from_f64(v).to_f64()).collect();
    }
    let out = if in_place { &xb } else { &yb };
    out.read::<T>().into_iter().take(reals).map(|v| v.to_f64()).collect()
}

fn input(len: usize, seed: u64) -> Vec<f64> {
    let mut s = seed ^ 0x9E37_79B9_7F4A_7C15;
    (0..2 * len)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
        })
        .collect()
}

/// Runs `passes` (for `2^log_n`, `batch`) on the CPU; asserts the rel L2 error is within the
/// GPU tests' bar.
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
        "{prec:?} n=2^{log_n} batch={batch} in_place={in_place} unaligned={unaligned} {kernels:?}: rel {rel:e} > {bound:e}\n{passes:#?}"
    );
}

/// The shipped plan of `(prec, 2^log_n, batch)`; with `slots`, persistent row passes sized for
/// a device of that many block slots (1 SM), so blocks loop over several groups.
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

/// The planner's plans for every length up to 2^16 in both precisions, several batches (1 and
/// 2 for the four-step lengths), through the kernel code itself.
#[test]
fn plans_every_length_to_2_16() {
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
fn plans_long_lengths() {
    for log_n in [17, 18, 19] {
        check(Precision::C64, &shipped(Precision::C64, log_n, 1, None), log_n, 1, false, false);
    }
    check(Precision::C128, &shipped(Precision::C128, 17, 1, None), 17, 1, false, false);
}

/// In place, odd batches, persistent grids (blocks looping over groups, a partial last group;
/// the staged kernels' double-buffered copies), and the staged passes' `unaligned` kernels.
#[test]
fn plans_in_place_odd_batches_persistent() {
    for (log_n, b) in [(3, 5), (12, 3), (13, 3), (14, 3), (15, 3), (15, 7)] {
        for prec in [Precision::C64, Precision::C128] {
            check(prec, &shipped(prec, log_n, b, None), log_n, b, true, false);
            check(prec, &shipped(prec, log_n, b, None), log_n, b, false, false);
        }
    }
    // 1024 points at batch ≥ 527 and odd: the ping-pong pass's blocks of two rows end in a
    // partial group.
    for (log_n, b) in [
        (6, 1001),
        (6, 3),
        (7, 37),
        (9, 37),
        (9, 1),
        (10, 13),
        (10, 2),
        (10, 529),
        (10, 1001),
        (11, 5),
        (12, 5),
        (12, 529),
        (13, 3),
    ] {
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

/// Four-step plans whose column pass loops (`four_persistent`, planned for scientific-1m,
/// beyond the simulation's reach): blocks over several groups of columns, the per-stage
/// kernels prefetching each next group (c128 2^18: the shipped 512-point per-stage kernel), and
/// a hoisted c128 and c64 plan (no prefetch); the row pass as planned.
#[test]
fn persistent_column_passes() {
    for (prec, log_n, log_n1, b, form) in [
        (Precision::C128, 18, 9, 1, Form::PerStage),
        (Precision::C128, 14, 7, 3, Form::Hoisted),
        (Precision::C64, 16, 6, 2, Form::Hoisted),
    ] {
        for slots in [1, 3] {
            let mut passes = four_step(prec, log_n, b, log_n1, 16, 16, form, true);
            assert!(passes[0].persistent && !passes[1].persistent);
            persist(&mut passes[0], 1, slots);
            assert!(passes[0].grid == slots && passes[0].blocks > 2 * slots, "{:?}", passes[0]);
            check(prec, &passes, log_n, b, slots == 3, false);
        }
    }
}

/// The per-stage kernels (planned for n ≥ 2^20 and the longest one-pass lengths): each as a
/// one-pass row, and c128 in the four-step passes of 2^19 and 2^20 (column pass with the
/// four-step twiddle, row pass with the transposed store).
#[test]
fn per_stage_kernels() {
    // (A fixed-layout kernel runs only its own layout: through the four-step plans below.)
    for kn in KERNELS.iter().filter(|k| k.form == Form::PerStage && k.layout == Layout::Runtime) {
        let prec = if kn.c128 { Precision::C128 } else { Precision::C64 };
        for (b, in_place) in [(1, false), (3, true)] {
            let p = one_pass(kn, kn, b, (256, 64), false);
            check(prec, &[p], kn.log_l, b, in_place, false);
        }
    }
    // The 2048-point kernel (16 elements per thread) as a row pass (scientific-1m's split) and
    // as a column pass.
    for (log_n, log_n1) in [(19, 9), (20, 9), (20, 11)] {
        check(
            Precision::C128,
            &four_step(Precision::C128, log_n, 1, log_n1, 16, 16, Form::PerStage, false),
            log_n,
            1,
            false,
            false,
        );
    }
    // Every kernel of the table ran somewhere in these tests (the others through the plans).
    assert_eq!(kernel(Precision::C64, 13, Form::PerStage).name, "fft_c64_l13_tw_per_stage");
}

/// The c64 kernels' computed twiddle (`Mem::twiddle`, the four-step twiddle of every c64
/// column pass) against the f64 reference, every `q` up to 2^16 and a stride through longer
/// lengths: within one f32 ulp of 1 in each part (the two-level table product it replaced has
/// two rounded factors and a rounded product).
#[test]
fn computed_twiddles_match_the_reference() {
    let mut worst = 0f64;
    for log_n in 3..=26u32 {
        let n = 1u64 << log_n;
        let step = (n >> 16).max(1);
        let mut q = 0u64;
        while q < n {
            for qq in [q, (q + 1).min(n - 1), n - 1 - q] {
                let w = <f32 as Mem>::twiddle(qq as u32, log_n);
                let (re, im) = rgk::reference::twiddle(qq, n);
                let err = (w.re as f64 - re).abs().max((w.im as f64 - im).abs());
                worst = worst.max(err);
                assert!(err <= f32::EPSILON as f64, "2^{log_n}, q {qq}: ({}, {}) against ({re}, {im})", w.re, w.im);
            }
            q += step;
        }
    }
    eprintln!("computed twiddles: worst error {worst:.3e} ({:.2} ulp of 1)", worst / f32::EPSILON as f64);
}
