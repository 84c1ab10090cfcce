//! A CPU model of the kernel passes (kernels-gpu/src/fft/stockham.rs), in f64, mirroring its
//! index arithmetic thread by thread and barrier by barrier, so the plan's decomposition and
//! the Stockham addressing are tested without a GPU.
use super::plan::{elems_per_thread, sidx, Buf, Pass, COL_MAP, OUT_SMEM, TW4};
use crate::reference::twiddle;

type C = (f64, f64);

fn mul(a: C, b: C) -> C {
    (a.0 * b.0 - a.1 * b.1, a.0 * b.1 + a.1 * b.0)
}

fn dft(a: &mut [C]) {
    let r = a.len();
    let b: Vec<C> = a.to_vec();
    for (k, out) in a.iter_mut().enumerate() {
        *out = b.iter().enumerate().fold((0.0, 0.0), |s, (j, &v)| {
            let w = twiddle((j * k) as u64, r as u64);
            let p = mul(v, w);
            (s.0 + p.0, s.1 + p.1)
        });
    }
}

fn base(t: u32, log_l: u32, log_m: u32) -> u32 {
    ((t >> log_m) << (log_l + log_m)) + (t & ((1 << log_m) - 1))
}

/// Runs `passes` on `x` (interleaved f64 pairs) and returns `y`.
pub(crate) fn run(passes: &[Pass], log_n: u32, batch: usize, elem: usize, x: &[f64]) -> Vec<f64> {
    let total = batch << log_n;
    let xs: Vec<C> = (0..total).map(|i| (x[2 * i], x[2 * i + 1])).collect();
    let mut work = vec![(f64::NAN, f64::NAN); total];
    let mut y = vec![(f64::NAN, f64::NAN); total];
    if log_n == 0 {
        y.copy_from_slice(&xs);
    }
    let log_lt = passes.iter().map(|p| p.log_l).max().unwrap_or(0);
    let tw: Vec<C> = (0..1u64 << log_lt).map(|i| twiddle(i, 1 << log_lt)).collect();
    let split = super::plan::split_log(log_n);
    let lo: Vec<C> = (0..1u64 << split).map(|i| twiddle(i, 1 << log_n)).collect();
    let hi: Vec<C> = (0..1u64 << (log_n - split)).map(|i| twiddle(i << split, 1 << log_n)).collect();
    for p in passes {
        let src: Vec<C> = match p.src {
            Buf::X => xs.clone(),
            Buf::Work => work.clone(),
            Buf::Y => y.clone(),
        };
        let dst = match p.dst {
            Buf::Work => &mut work,
            _ => &mut y,
        };
        run_pass(p, elem, log_lt, split, &tw, &lo, &hi, &src, dst);
    }
    y.iter().flat_map(|c| [c.0, c.1]).collect()
}

#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
fn run_pass(p: &Pass, elem: usize, log_lt: u32, split: u32, tw: &[C], lo: &[C], hi: &[C], x: &[C], y: &mut [C]) {
    let e = p.e as usize;
    assert_eq!(p.e, elems_per_thread(p.log_l, elem));
    let log_e = e.trailing_zeros();
    let log_l = p.log_l;
    let log_tpt = log_l - log_e;
    let nst = log_l.div_ceil(log_e);
    let first = log_l - log_e * (nst - 1);
    let min_mask = (1u32 << p.log_min) - 1;
    let tw4 = |v: C, m: u32, k: u32| -> C {
        let q = m * k;
        mul(v, mul(lo[(q & ((1 << split) - 1)) as usize], hi[(q >> split) as usize]))
    };
    for block in 0..p.blocks {
        let mut sm = vec![(f64::NAN, f64::NAN); (p.sm_stride << p.log_c) as usize];
        let t0 = block << p.log_c;
        let threads: Vec<(u32, u32, u32)> = (0..p.threads)
            .map(|tid| {
                let (ci, jt) = if p.flags & COL_MAP != 0 {
                    (tid & ((1 << p.log_c) - 1), tid >> p.log_c)
                } else {
                    (tid >> log_tpt, tid & ((1 << log_tpt) - 1))
                };
                (ci, jt, t0 + ci)
            })
            .collect();
        let mut regs = vec![vec![(0.0, 0.0); e]; p.threads as usize];
        for s in 0..nst {
            let lr = if s == 0 { first } else { log_e };
            let ls = if s == 0 { 0 } else { first + log_e * (s - 1) };
            let r_n = 1usize << lr;
            let from_global = s == 0;
            let to_global = s == nst - 1 && p.flags & OUT_SMEM == 0;
            let quarter = 1u32 << (log_l - lr);
            let tpt = 1u32 << log_tpt;
            // Read phase (all threads), then the barrier.
            for (th, &(ci, jt, t)) in threads.iter().enumerate() {
                for el in 0..e {
                    let j = jt + (el / r_n) as u32 * tpt;
                    let idx = j + (el % r_n) as u32 * quarter;
                    regs[th][el] = if from_global {
                        if t < p.count {
                            x[(base(t, log_l, p.log_min) + (idx << p.log_min)) as usize]
                        } else {
                            (0.0, 0.0)
                        }
                    } else {
                        sm[(ci * p.sm_stride + sidx(idx)) as usize]
                    };
                }
            }
            // Twiddles, butterflies, write phase.
            let ns_mask = (1u32 << ls) - 1;
            for (th, &(ci, jt, t)) in threads.iter().enumerate() {
                let v = &mut regs[th];
                for el in 0..e {
                    let r = (el % r_n) as u32;
                    if ls > 0 && r != 0 {
                        let k = (jt + (el / r_n) as u32 * tpt) & ns_mask;
                        v[el] = mul(v[el], tw[((r * k) << (log_lt - ls - lr)) as usize]);
                    }
                }
                for q in 0..e / r_n {
                    dft(&mut v[q * r_n..(q + 1) * r_n]);
                }
                for (el, &val) in v.iter().enumerate() {
                    let j = jt + (el / r_n) as u32 * tpt;
                    let k = j & ns_mask;
                    let o = ((j - k) << lr) + k + (((el % r_n) as u32) << ls);
                    if to_global {
                        if t < p.count {
                            let val = if p.flags & TW4 != 0 { tw4(val, t & min_mask, o) } else { val };
                            y[(base(t, log_l, p.log_mout) + (o << p.log_mout)) as usize] = val;
                        }
                    } else {
                        sm[(ci * p.sm_stride + sidx(o)) as usize] = val;
                    }
                }
            }
        }
        if p.flags & OUT_SMEM != 0 {
            for tid in 0..p.threads {
                for q in 0..e as u32 {
                    let el = tid + q * p.threads;
                    let c2 = el & ((1 << p.log_c) - 1);
                    let k = el >> p.log_c;
                    let t2 = t0 + c2;
                    if t2 < p.count {
                        let mut val = sm[(c2 * p.sm_stride + sidx(k)) as usize];
                        if p.flags & TW4 != 0 {
                            val = tw4(val, t2 & min_mask, k);
                        }
                        y[(base(t2, log_l, p.log_mout) + (k << p.log_mout)) as usize] = val;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::plan::{decompose, decompose_k, max_single_log, Knobs};
    use super::*;
    use crate::reference::{fft_c2c_fwd, fft_error};

    fn input(len: usize, seed: u64) -> Vec<f64> {
        let mut s = seed;
        (0..2 * len)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
            })
            .collect()
    }

    fn check(log_n: u32, batch: usize, elem: usize, max_single: u32) {
        let passes = if log_n == 0 { vec![] } else { decompose(log_n, batch, elem, max_single) };
        let n = 1usize << log_n;
        let x = input(n * batch, (log_n as u64) << 8 | batch as u64);
        let ours = run(&passes, log_n, batch, elem, &x);
        let (rel, _) = fft_error(&ours, &fft_c2c_fwd(n, batch, &x));
        assert!(rel < 1e-14, "n=2^{log_n} batch={batch} elem={elem} max_single={max_single}: rel {rel:e} {passes:?}");
    }

    /// One-pass plans, every length the plan uses one pass for (long ones at batch 1).
    #[test]
    fn single_pass_model_matches_reference() {
        for elem in [8, 16] {
            for log_n in 0..=max_single_log(elem) {
                for batch in [1, 3, 5] {
                    if log_n > 10 && batch > 1 {
                        continue;
                    }
                    check(log_n, batch, elem, max_single_log(elem));
                }
            }
        }
    }

    /// Four-step plans, exercised at small n by lowering the one-pass limit.
    #[test]
    fn four_step_model_matches_reference() {
        for max_single in [2, 3, 5] {
            for log_n in max_single + 1..=2 * max_single {
                for batch in [1, 3] {
                    check(log_n, batch, 8, max_single);
                    check(log_n, batch, 16, max_single);
                }
            }
        }
        // The plan's own four-step split at its smallest length.
        for elem in [8, 16] {
            check(max_single_log(elem) + 1, 1, elem, max_single_log(elem));
        }
        // Uneven splits (`FftOptions::log_n1`): every column length the one-pass limit allows.
        for max_single in [3, 5] {
            for log_n in max_single + 1..=2 * max_single {
                for log_n1 in 1..log_n {
                    let k = Knobs { log_n1, ..Knobs::default() };
                    for (batch, elem) in [(1, 8), (3, 16)] {
                        let passes = decompose_k(log_n, batch, elem, max_single, k);
                        let n = 1usize << log_n;
                        let x = input(n * batch, (log_n as u64) << 8 | batch as u64 | (log_n1 as u64) << 16);
                        let (rel, _) = fft_error(&run(&passes, log_n, batch, elem, &x), &fft_c2c_fwd(n, batch, &x));
                        assert!(rel < 1e-14, "n=2^{log_n} n1=2^{log_n1} batch={batch}: rel {rel:e} {passes:?}");
                    }
                }
            }
        }
    }
}

/// The kernels' own in-register butterflies (kernels-gpu/src/fft/dft.rs, device-independent),
/// compiled for the CPU and checked against the definition in f32 and f64.
#[cfg(test)]
#[allow(dead_code, unused_imports, clippy::all)]
#[path = "../../../kernels-gpu/src/fft/dft.rs"]
mod kernel_dft;

#[cfg(test)]
mod dft_tests {
    use super::kernel_dft::{dft, Cx};
    use crate::reference::{dft_naive, fft_error};

    fn case<const R: usize>() -> (f64, f64) {
        let x: Vec<f64> = (0..2 * R).map(|i| ((i * 7919 % 31) as f64 - 15.0) / 8.0).collect();
        let want = dft_naive(R, 1, &x);
        let mut a64 = [Cx { re: 0f64, im: 0f64 }; R];
        let mut a32 = [Cx { re: 0f32, im: 0f32 }; R];
        for j in 0..R {
            a64[j] = Cx { re: x[2 * j], im: x[2 * j + 1] };
            a32[j] = Cx { re: x[2 * j] as f32, im: x[2 * j + 1] as f32 };
        }
        dft::<f64, R>(&mut a64);
        dft::<f32, R>(&mut a32);
        let g64: Vec<f64> = a64.iter().flat_map(|c| [c.re, c.im]).collect();
        let g32: Vec<f64> = a32.iter().flat_map(|c| [c.re as f64, c.im as f64]).collect();
        (fft_error(&g64, &want).0, fft_error(&g32, &want).0)
    }

    #[test]
    fn kernel_butterflies_match_the_dft() {
        for (r, (e64, e32)) in
            [(2, case::<2>()), (4, case::<4>()), (8, case::<8>()), (16, case::<16>()), (32, case::<32>())]
        {
            assert!(e64 < 1e-15, "radix {r}: f64 rel error {e64:e}");
            assert!(e32 < 2e-7, "radix {r}: f32 rel error {e32:e}");
        }
    }
}

/// Geometry of every plan the planner makes (no arithmetic): for each pass, the kernel's
/// first-stage global reads and its final global writes (row or `OUT_SMEM` store, as in
/// `run_pass`) each hit every element of the pass's buffer exactly once, shared-memory slots
/// stay inside the block's allocation, and twiddle indices inside their tables.
#[cfg(test)]
mod geometry {
    use super::super::plan::{decompose_k, max_single_log, split_log, Knobs, MAX_ELEMENTS};
    use super::*;

    fn check_plan(log_n: u32, batch: usize, elem: usize) {
        check_plan_k(log_n, batch, elem, Knobs::default());
    }

    fn check_plan_k(log_n: u32, batch: usize, elem: usize, knobs: Knobs) {
        let passes = decompose_k(log_n, batch, elem, max_single_log(elem), knobs);
        let total = batch << log_n;
        let log_lt = passes.iter().map(|p| p.log_l).max().unwrap();
        let split = split_log(log_n);
        for p in &passes {
            let e = p.e;
            let log_e = e.trailing_zeros();
            let log_l = p.log_l;
            let log_tpt = log_l - log_e;
            let tpt = 1u32 << log_tpt;
            let nst = log_l.div_ceil(log_e);
            let first = log_l - log_e * (nst - 1);
            let out_smem = p.flags & OUT_SMEM != 0;
            assert_eq!((p.count as usize) << log_l, total, "{p:?}");
            assert!(p.sm_stride > sidx((1 << log_l) - 1), "{p:?}");
            assert_eq!(p.threads << log_e, (1u32 << p.log_c) << log_l, "{p:?}");
            let (mut read, mut written) = (vec![0u8; total], vec![0u8; total]);
            for block in 0..p.blocks {
                let t0 = block << p.log_c;
                for tid in 0..p.threads {
                    let (ci, jt) = if p.flags & COL_MAP != 0 {
                        (tid & ((1 << p.log_c) - 1), tid >> p.log_c)
                    } else {
                        (tid >> log_tpt, tid & (tpt - 1))
                    };
                    let t = t0 + ci;
                    for s in 0..nst {
                        let lr = if s == 0 { first } else { log_e };
                        let ls = if s == 0 { 0 } else { first + log_e * (s - 1) };
                        let r_n = 1u32 << lr;
                        let quarter = 1u32 << (log_l - lr);
                        let ns_mask = (1u32 << ls) - 1;
                        for el in 0..e {
                            let j = jt + (el / r_n) * tpt;
                            let idx = j + (el % r_n) * quarter;
                            assert!(idx < 1 << log_l);
                            if s == 0 && t < p.count {
                                read[(base(t, log_l, p.log_min) + (idx << p.log_min)) as usize] += 1;
                            }
                            if s > 0 {
                                assert!(ci * p.sm_stride + sidx(idx) < p.smem_bytes / elem as u32);
                                let r = el % r_n;
                                assert!(((r * (j & ns_mask)) << (log_lt - ls - lr)) < 1 << log_lt);
                            }
                            let k = j & ns_mask;
                            let o = ((j - k) << lr) + k + ((el % r_n) << ls);
                            assert!(o < 1 << log_l);
                            if s == nst - 1 && !out_smem && t < p.count {
                                written[(base(t, log_l, p.log_mout) + (o << p.log_mout)) as usize] += 1;
                                if p.flags & TW4 != 0 {
                                    let q = (t & ((1 << p.log_min) - 1)) * o;
                                    assert!((q >> split) < 1 << (log_n - split));
                                }
                            } else if s < nst - 1 || out_smem {
                                assert!(ci * p.sm_stride + sidx(o) < p.smem_bytes / elem as u32);
                            }
                        }
                    }
                    if out_smem {
                        for q in 0..e {
                            let el = tid + q * p.threads;
                            let (c2, k) = (el & ((1 << p.log_c) - 1), el >> p.log_c);
                            if t0 + c2 < p.count {
                                assert!(k < 1 << log_l);
                                written[(base(t0 + c2, log_l, p.log_mout) + (k << p.log_mout)) as usize] += 1;
                            }
                        }
                    }
                }
            }
            assert!(read.iter().all(|&c| c == 1), "n=2^{log_n} batch={batch}: reads not a bijection {p:?}");
            assert!(written.iter().all(|&c| c == 1), "n=2^{log_n} batch={batch}: writes not a bijection {p:?}");
        }
    }

    /// Every plan for n = 2^1..2^22, both precisions, at the GPU tests' batch counts.
    #[test]
    fn every_plan_to_2_22_reads_and_writes_each_element_once() {
        for elem in [8, 16] {
            for log_n in 1..=22 {
                for batch in [1usize, 2, 3, 7, 33, 64, 300] {
                    if (batch << log_n) > (1 << 22).min(MAX_ELEMENTS) && batch > 1 {
                        continue;
                    }
                    check_plan(log_n, batch, elem);
                }
            }
        }
    }

    /// The session-4 planner knobs (`FftOptions::{e8, row_threads, cols}`) on the same plans.
    #[test]
    fn planner_knobs_read_and_write_each_element_once() {
        let knobs = [
            Knobs { e8: true, ..Knobs::default() },
            Knobs { row_threads: 64, ..Knobs::default() },
            Knobs { row_threads: 128, ..Knobs::default() },
            Knobs { row_threads: 512, ..Knobs::default() },
            Knobs { cols: 2, ..Knobs::default() },
            Knobs { cols: 4, ..Knobs::default() },
            Knobs { cols: 8, ..Knobs::default() },
            Knobs { cols: 32, ..Knobs::default() },
            Knobs { log_n1: 7, ..Knobs::default() },
            Knobs { log_n1: 9, ..Knobs::default() },
            Knobs { log_n1: 8, ..Knobs::default() },
            Knobs { log_n1: 11, ..Knobs::default() },
        ];
        for k in knobs {
            for elem in [8, 16] {
                for log_n in 1..=20 {
                    for batch in [1usize, 3, 33, 300] {
                        if (batch << log_n) > 1 << 20 && batch > 1 {
                            continue;
                        }
                        check_plan_k(log_n, batch, elem, k);
                    }
                }
            }
        }
    }
}
