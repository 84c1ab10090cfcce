//! FFTC2CFwd on the GPU against the f64 CPU reference (docs/ops.md §1): every power-of-two length
//! 2^0..2^22 in c64 and c128, the ten seed shapes, odd batch counts, in place, plan reuse and
//! the argument errors. Each case reports its relative L2 error; the bar
//! (`rgk::reference::fft_error_bound`) grows like √log2 n. Outputs are poisoned (NaN) first.
use rand::rngs::StdRng;
use rand_distr::{Distribution, Normal};
use rgk::fft::{FftOptions, FftPlan, Persist, Precision};
use rgk::reference::{fft_c2c_fwd, fft_error, fft_error_bound};
use rgk::{Error, Gpu};
use rgk_tests::{fresh_rng, gpu_or_skip, randn_f32};

/// Runs one plan out of place (or in place) on fresh randn input; returns the rel L2 error
/// after asserting it is within the bar.
fn run(gpu: &Gpu, rng: &mut StdRng, n: usize, batch: usize, prec: Precision, in_place: bool) -> f64 {
    run_with(gpu, rng, n, batch, prec, in_place, FftOptions::default())
}

fn opts(persist: Persist, stage_twiddles: bool) -> FftOptions {
    FftOptions { persist, stage_twiddles, hoist_twiddles: true, ..FftOptions::default() }
}

fn run_with(
    gpu: &Gpu,
    rng: &mut StdRng,
    n: usize,
    batch: usize,
    prec: Precision,
    in_place: bool,
    opts: FftOptions,
) -> f64 {
    run_kernels(gpu, rng, n, batch, prec, in_place, opts).0
}

/// [`run_with`], also returning the plan's kernels (`FftPlan::pass_kernels`).
fn run_kernels(
    gpu: &Gpu,
    rng: &mut StdRng,
    n: usize,
    batch: usize,
    prec: Precision,
    in_place: bool,
    opts: FftOptions,
) -> (f64, Vec<&'static str>) {
    let len = 2 * n * batch;
    let st = gpu.stream();
    let mut plan =
        FftPlan::new_opts(gpu, n, batch, prec, opts).unwrap_or_else(|e| panic!("plan n={n} batch={batch}: {e}"));
    let (ours, x64): (Vec<f64>, Vec<f64>) = match prec {
        Precision::C64 => {
            let x = randn_f32(rng, len, 1.0);
            let dx = st.clone_htod(&x).unwrap();
            let out: Vec<f32> = if in_place {
                let mut d = dx;
                plan.execute_c64_inplace(gpu, &mut d).unwrap();
                st.clone_dtoh(&d).unwrap()
            } else {
                let mut dy = st.clone_htod(&vec![f32::NAN; len]).unwrap();
                plan.execute_c64(gpu, &dx, &mut dy).unwrap();
                st.clone_dtoh(&dy).unwrap()
            };
            (out.iter().map(|&v| v as f64).collect(), x.iter().map(|&v| v as f64).collect())
        }
        Precision::C128 => {
            let d = Normal::new(0f64, 1f64).unwrap();
            let x: Vec<f64> = (0..len).map(|_| d.sample(rng)).collect();
            let dx = st.clone_htod(&x).unwrap();
            let out: Vec<f64> = if in_place {
                let mut d = dx;
                plan.execute_c128_inplace(gpu, &mut d).unwrap();
                st.clone_dtoh(&d).unwrap()
            } else {
                let mut dy = st.clone_htod(&vec![f64::NAN; len]).unwrap();
                plan.execute_c128(gpu, &dx, &mut dy).unwrap();
                st.clone_dtoh(&dy).unwrap()
            };
            (out, x)
        }
    };
    let reference = fft_c2c_fwd(n, batch, &x64);
    let (rel, max_abs) = fft_error(&ours, &reference);
    let bound = fft_error_bound(n, prec == Precision::C128);
    println!(
        "{prec:?} n=2^{} batch={batch}{}: rel_l2 {rel:.3e} (bar {bound:.1e}), max_abs {max_abs:.3e}, {} launch(es), {} stage-table, {:?}",
        n.trailing_zeros(),
        if in_place { " in place" } else { "" },
        plan.launches(),
        plan.stage_table_passes(),
        plan.pass_kernels()
    );
    assert!(rel <= bound, "{prec:?} n={n} batch={batch} {opts:?}: rel_l2 {rel:e} above {bound:e}");
    (rel, plan.pass_kernels())
}

fn batch_for(log_n: u32) -> usize {
    match log_n {
        0..=12 => 3,
        13..=18 => 2,
        _ => 1,
    }
}

#[test]
fn every_length_c64() {
    let Some(gpu) = gpu_or_skip("fft::every_length_c64") else { return };
    let mut rng = fresh_rng("fft::every_length_c64");
    for log_n in 0..=22 {
        run(&gpu, &mut rng, 1 << log_n, batch_for(log_n), Precision::C64, false);
    }
}

#[test]
fn every_length_c128() {
    let Some(gpu) = gpu_or_skip("fft::every_length_c128") else { return };
    let mut rng = fresh_rng("fft::every_length_c128");
    for log_n in 0..=22 {
        run(&gpu, &mut rng, 1 << log_n, batch_for(log_n), Precision::C128, false);
    }
}

/// The ten workloads of the seed table of docs/ops.md, `(batch, n, precision)`.
const SEED_ROWS: [(usize, usize, Precision); 10] = [
    (1, 4096, Precision::C64),
    (64, 4096, Precision::C64),
    (64, 4096, Precision::C128),
    (64, 16384, Precision::C64),
    (8, 65536, Precision::C64),
    (256, 1024, Precision::C64),
    (4096, 512, Precision::C64),
    (65536, 64, Precision::C64),
    (4, 1 << 20, Precision::C128),
    (300, 1024, Precision::C64),
];

/// The ten workloads of the seed table of docs/ops.md.
#[test]
fn seed_shapes() {
    let Some(gpu) = gpu_or_skip("fft::seed_shapes") else { return };
    let mut rng = fresh_rng("fft::seed_shapes");
    for (batch, n, prec) in SEED_ROWS {
        run(&gpu, &mut rng, n, batch, prec, false);
    }
}

/// The ten workloads with the planner's plans (`FftPlan::new`, i.e. `FftOptions::for_shape`:
/// the kernels the bench times), against the f64 reference; prints each plan's kernels.
#[test]
fn seed_shapes_planned() {
    let Some(gpu) = gpu_or_skip("fft::seed_shapes_planned") else { return };
    let mut rng = fresh_rng("fft::seed_shapes_planned");
    for (batch, n, prec) in SEED_ROWS {
        let (err, kernels) = run_kernels(&gpu, &mut rng, n, batch, prec, false, FftOptions::for_shape(n, batch, prec));
        println!("planned n={n} batch={batch} {prec:?}: rel_l2 {err:.2e}, passes {kernels:?}");
    }
}

/// The stage-table kernels (`FftOptions::stage_twiddles`, bench rows `@st*`): every length
/// 2^1..2^22 in both precisions, the ten seed shapes, odd batches, in place, persistent
/// grids; and the same without hoisting (`hoist_twiddles: false`, bench rows `@stn`). Each
/// case prints how many of its passes run a stage-table kernel (a pass whose kernel allows
/// too few threads keeps the W_Lt kernel).
#[test]
fn stage_table_kernels() {
    let Some(gpu) = gpu_or_skip("fft::stage_table_kernels") else { return };
    let mut rng = fresh_rng("fft::stage_table_kernels");
    let o = opts(Persist::Auto, true);
    for prec in [Precision::C64, Precision::C128] {
        for log_n in 1..=22 {
            run_with(&gpu, &mut rng, 1 << log_n, batch_for(log_n), prec, false, o);
        }
        for n in [2, 64, 1024, 4096, 1 << 13, 1 << 15] {
            for batch in [1, 7, 33] {
                if n * batch <= 1 << 19 {
                    run_with(&gpu, &mut rng, n, batch, prec, false, o);
                }
            }
            run_with(&gpu, &mut rng, n, 3, prec, true, o);
        }
        run_with(&gpu, &mut rng, 64, 1001, prec, false, o);
        run_with(&gpu, &mut rng, 1 << 20, 1, prec, true, o);
    }
    for (batch, n, prec) in SEED_ROWS {
        for persist in [Persist::Auto, Persist::Never, Persist::PerSm(2)] {
            run_with(&gpu, &mut rng, n, batch, prec, false, opts(persist, true));
        }
        // `_stn`: the same tables, loaded in each stage.
        run_with(
            &gpu,
            &mut rng,
            n,
            batch,
            prec,
            false,
            FftOptions { hoist_twiddles: false, ..opts(Persist::Auto, true) },
        );
    }
    for prec in [Precision::C64, Precision::C128] {
        let stn = FftOptions { hoist_twiddles: false, ..o };
        for log_n in 1..=22 {
            run_with(&gpu, &mut rng, 1 << log_n, batch_for(log_n), prec, false, stn);
        }
        run_with(&gpu, &mut rng, 4096, 3, prec, true, stn);
        run_with(&gpu, &mut rng, 64, 1001, prec, false, opts(Persist::PerSm(1), true));
    }
}

/// The session-4 options (bench rows `@e8`, `@e8p`, `@pp`, `@sta`, `@sta-sm2`, `@t128`, `@t64`,
/// `@c4`, `@c8`, `@c32`, `@sp2`, `@sp4`): every length each can take, the seed shapes, odd batches, in place,
/// persistent grids; the seed shapes assert that the intended kernel ran.
#[test]
fn session4_variants() {
    let Some(gpu) = gpu_or_skip("fft::session4_variants") else { return };
    let mut rng = fresh_rng("fft::session4_variants");
    let c64 = Precision::C64;
    // The session-3 planner (the options these rows add one at a time to); the session-4
    // planner's own choices run in `seed_shapes`.
    let base = |n: usize, b, p| FftOptions {
        e8: false,
        ping_pong: false,
        row_threads: 0,
        staged: false,
        persist: if n <= 64 { Persist::Never } else { Persist::Auto },
        ..FftOptions::for_shape(n, b, p)
    };
    let e8 = |n, b| FftOptions { e8: true, ..base(n, b, c64) };
    let e8p = |n, b| FftOptions { e8: true, ping_pong: true, ..base(n, b, c64) };
    let pp = |n, b| FftOptions { ping_pong: true, ..base(n, b, c64) };
    let sta = |n, b, persist| FftOptions { staged: true, persist, ..base(n, b, c64) };
    let expect = |(_, k): (f64, Vec<&'static str>), want: &str| assert_eq!(k, [want], "kernels");
    // 8 elements per thread, with and without ping-pong: 1024 and 4096 (the seed shapes, odd
    // batches, in place, persistent); every other length falls back to the planner's kernels.
    for (n, l) in [(1024, 10), (4096, 12)] {
        for batch in [1, 2, 3, 7, 33, 64, 256, 300] {
            expect(run_kernels(&gpu, &mut rng, n, batch, c64, false, e8(n, batch)), &format!("fft_c64_l{l}_st8"));
            expect(run_kernels(&gpu, &mut rng, n, batch, c64, false, e8p(n, batch)), &format!("fft_c64_l{l}_st8p"));
        }
        run_kernels(&gpu, &mut rng, n, 3, c64, true, e8(n, 3));
        run_kernels(&gpu, &mut rng, n, 3, c64, true, e8p(n, 3));
        for k in [1, 2] {
            let o = FftOptions { persist: Persist::PerSm(k), ..e8(n, 700) };
            run_kernels(&gpu, &mut rng, n, 700, c64, false, o);
            run_kernels(&gpu, &mut rng, n, 700, c64, false, FftOptions { ping_pong: true, ..o });
        }
    }
    for log_n in 0..=16 {
        let n = 1 << log_n;
        run_with(&gpu, &mut rng, n, batch_for(log_n), c64, false, e8p(n, batch_for(log_n)));
        run_with(&gpu, &mut rng, n, batch_for(log_n), c64, false, pp(n, batch_for(log_n)));
        for persist in [Persist::Auto, Persist::PerSm(1)] {
            run_with(&gpu, &mut rng, n, batch_for(log_n), c64, false, sta(n, batch_for(log_n), persist));
        }
    }
    // Ping-pong: 512, 1024, 4096.
    for (n, l) in [(512, 9), (1024, 10), (4096, 12)] {
        for batch in [1, 3, 7, 33, 64, 256, 300, 4096] {
            expect(run_kernels(&gpu, &mut rng, n, batch, c64, false, pp(n, batch)), &format!("fft_c64_l{l}_stp"));
        }
        run_kernels(&gpu, &mut rng, n, 5, c64, true, pp(n, 5));
        run_kernels(&gpu, &mut rng, n, 1001, c64, false, FftOptions { persist: Persist::PerSm(1), ..pp(n, 1001) });
    }
    // Ping-pong in the four-step passes (column pass and transposed `OUT_SMEM` store) of
    // 2^18 = 512 × 512 and 2^20 = 1024 × 1024.
    for log_n in [18, 20] {
        let n = 1 << log_n;
        for (batch, in_place) in [(1, false), (3, false), (2, true)] {
            let (_, k) = run_kernels(&gpu, &mut rng, n, batch, c64, in_place, pp(n, batch));
            println!("  ping-pong four-step kernels {k:?}");
        }
    }
    // Session 8: 8 elements per thread (and ping-pong) in the four-step row pass with its
    // transposed store — 2^16 as the planner splits it (2^6 columns × 1024-point rows), 2^18
    // split as 2^6 × 2^12 (4096-point rows), 2^20 balanced (1024-point rows; the planner does
    // not hoist the stage tables at 2^20, and the 8-element kernels are hoisted ones).
    for log_n in [16, 18, 20] {
        let n = 1 << log_n;
        let n1 = |o: FftOptions| match log_n {
            18 => FftOptions { log_n1: 6, ..o },
            20 => FftOptions { hoist_twiddles: true, ..o },
            _ => o,
        };
        for (batch, in_place) in [(1, false), (3, false), (2, true), (8, false)] {
            for o in [n1(e8(n, batch)), n1(e8p(n, batch))] {
                let (_, k) = run_kernels(&gpu, &mut rng, n, batch, c64, in_place, o);
                let want =
                    format!("fft_c64_l{}_st8{}", if log_n == 18 { 12 } else { 10 }, if o.ping_pong { "p" } else { "" });
                assert_eq!(k.last().copied(), Some(want.as_str()), "2^{log_n}: row-pass kernel");
            }
        }
    }
    // Staged input: 64, 512, 1024 under every persistent-grid choice (blocks looping over
    // 1, 2 or many groups, a partial last group), in place, and an 8-byte aligned sub-view
    // (the unstaged fallback).
    for (n, l) in [(64, 6), (512, 9), (1024, 10)] {
        for batch in [1, 3, 7, 33, 300, 1001, 4096, 65536] {
            if n * batch > 1 << 22 {
                continue;
            }
            for persist in [Persist::Auto, Persist::Never, Persist::PerSm(1), Persist::PerSm(2)] {
                expect(
                    run_kernels(&gpu, &mut rng, n, batch, c64, false, sta(n, batch, persist)),
                    &format!("fft_c64_l{l}_sta"),
                );
            }
            run_kernels(&gpu, &mut rng, n, batch, c64, true, sta(n, batch, Persist::PerSm(1)));
        }
        let batch = 333;
        let len = 2 * n * batch;
        let st = gpu.stream();
        let mut plan = FftPlan::new_opts(&gpu, n, batch, c64, sta(n, batch, Persist::PerSm(1))).unwrap();
        let mut xs = vec![f32::NAN; 2];
        xs.extend(randn_f32(&mut rng, len, 1.0));
        let dx = st.clone_htod(&xs).unwrap();
        let mut dy = st.clone_htod(&vec![f32::NAN; len]).unwrap();
        plan.execute_c64(&gpu, &dx.slice(2..), &mut dy).unwrap();
        let ours: Vec<f64> = st.clone_dtoh(&dy).unwrap().iter().map(|&v| v as f64).collect();
        let x64: Vec<f64> = xs[2..].iter().map(|&v| v as f64).collect();
        let (rel, _) = fft_error(&ours, &fft_c2c_fwd(n, batch, &x64));
        println!("staged n={n} misaligned x: rel_l2 {rel:.3e}");
        assert!(rel <= fft_error_bound(n, false), "staged n={n} misaligned x: {rel:e}");
    }
    // Split passes (`FftOptions::split`): 2^14 as 2 × 8192 and 4 × 4096, 2^15 as 4 × 8192,
    // odd batches, in place (through a workspace copy); other lengths plan as without.
    for (n, split, want) in
        [(1 << 14, 1, "fft_c64_l13_sp1"), (1 << 14, 2, "fft_c64_l12_sp2"), (1 << 15, 2, "fft_c64_l13_sp2")]
    {
        for batch in [1, 2, 3, 7, 64] {
            let o = FftOptions { split, ..base(n, batch, c64) };
            expect(run_kernels(&gpu, &mut rng, n, batch, c64, false, o), want);
        }
        let o = FftOptions { split, ..base(n, 3, c64) };
        expect(run_kernels(&gpu, &mut rng, n, 3, c64, true, o), want);
    }
    for split in [1, 2] {
        for log_n in 1..=18 {
            let n = 1 << log_n;
            run_with(&gpu, &mut rng, n, batch_for(log_n), c64, false, FftOptions { split, ..base(n, 2, c64) });
        }
    }
    // Row-pass block sizes and four-step column counts, both precisions.
    for prec in [Precision::C64, Precision::C128] {
        for rt in [64, 128] {
            for log_n in 1..=13 {
                let n = 1 << log_n;
                for batch in [3, 33] {
                    run_with(
                        &gpu,
                        &mut rng,
                        n,
                        batch,
                        prec,
                        false,
                        FftOptions { row_threads: rt, ..base(n, batch, prec) },
                    );
                }
            }
        }
        for cols in [1, 2, 4, 8, 32] {
            for log_n in 12..=20 {
                let n = 1 << log_n;
                run_with(&gpu, &mut rng, n, batch_for(log_n), prec, false, FftOptions { cols, ..base(n, 1, prec) });
            }
            run_with(&gpu, &mut rng, 1 << 15, 3, prec, true, FftOptions { cols, ..base(1 << 15, 3, prec) });
        }
        // Uneven four-step splits (`log_n1`), including ones the plan must refuse (it falls
        // back to the balanced split): the seed lengths and odd batches, in place once.
        for log_n in [14u32, 15, 16, 18, 20] {
            let n = 1 << log_n;
            for log_n1 in [log_n / 2 - 2, log_n / 2 - 1, log_n / 2 + 1, log_n / 2 + 2, 1, log_n - 1] {
                let o = FftOptions { log_n1, ..FftOptions::for_shape(n, 3, prec) };
                run_with(&gpu, &mut rng, n, batch_for(log_n).max(3), prec, false, o);
            }
            let o = FftOptions { log_n1: log_n / 2 + 1, ..FftOptions::for_shape(n, 2, prec) };
            run_with(&gpu, &mut rng, n, 2, prec, true, o);
        }
    }
    // The ten seed shapes under every session-4 option (the bench's variant rows).
    for (batch, n, prec) in SEED_ROWS {
        let b = base(n, batch, prec);
        let is64 = prec == c64;
        let one_pass = n <= if is64 { 1 << 13 } else { 1 << 12 };
        // (option, whether it changes this row's plan: the bench's variant rows)
        for (o, applies) in [
            (FftOptions { e8: true, ..b }, is64 && matches!(n, 1024 | 4096)),
            (FftOptions { e8: true, ping_pong: true, ..b }, is64 && matches!(n, 1024 | 4096)),
            (FftOptions { ping_pong: true, ..b }, is64 && matches!(n, 512 | 1024 | 4096)),
            (FftOptions { staged: true, persist: Persist::Auto, ..b }, is64 && matches!(n, 64 | 512 | 1024)),
            (FftOptions { staged: true, persist: Persist::PerSm(2), ..b }, is64 && matches!(n, 64 | 512 | 1024)),
            (FftOptions { row_threads: 128, ..b }, one_pass),
            (FftOptions { row_threads: 64, ..b }, one_pass),
            (FftOptions { cols: 4, ..b }, !one_pass),
            (FftOptions { cols: 8, ..b }, !one_pass),
            (FftOptions { cols: 32, ..b }, !one_pass),
            (FftOptions { split: 1, ..b }, is64 && n == 1 << 14),
            (FftOptions { split: 2, ..b }, is64 && n == 1 << 14),
        ] {
            if applies {
                run_with(&gpu, &mut rng, n, batch, prec, false, o);
            }
        }
    }
}

#[test]
fn odd_batches() {
    let Some(gpu) = gpu_or_skip("fft::odd_batches") else { return };
    let mut rng = fresh_rng("fft::odd_batches");
    for prec in [Precision::C64, Precision::C128] {
        for n in [2, 16, 64, 1024, 1 << 13, 1 << 14, 1 << 15] {
            for batch in [1, 3, 7, 33] {
                if n * batch > 1 << 19 {
                    continue;
                }
                run(&gpu, &mut rng, n, batch, prec, false);
            }
        }
        run(&gpu, &mut rng, 64, 1001, prec, false);
        run(&gpu, &mut rng, 2, 100_003, prec, false);
    }
}

#[test]
fn in_place() {
    let Some(gpu) = gpu_or_skip("fft::in_place") else { return };
    let mut rng = fresh_rng("fft::in_place");
    for prec in [Precision::C64, Precision::C128] {
        for (n, batch) in [(1, 5), (8, 3), (4096, 3), (1 << 13, 2), (1 << 16, 3), (1 << 20, 1)] {
            run(&gpu, &mut rng, n, batch, prec, true);
        }
    }
}

/// Persistent grids (blocks looping over groups of transforms), forced small.
#[test]
fn persistent_grids() {
    let Some(gpu) = gpu_or_skip("fft::persistent_grids") else { return };
    let mut rng = fresh_rng("fft::persistent_grids");
    for prec in [Precision::C64, Precision::C128] {
        for (n, batch) in [(2, 40_000), (64, 20_001), (512, 1001), (1024, 700), (4096, 300)] {
            for k in [1, 2] {
                run_with(&gpu, &mut rng, n, batch, prec, false, opts(Persist::PerSm(k), false));
                run_with(&gpu, &mut rng, n, batch, prec, false, opts(Persist::PerSm(k), true));
            }
            run_with(&gpu, &mut rng, n, batch, prec, true, opts(Persist::PerSm(1), false));
            run_with(&gpu, &mut rng, n, batch, prec, true, opts(Persist::PerSm(1), true));
        }
    }
}

/// One plan executed many times gives bitwise the same output; sub-views at element offsets.
/// Multi-pass plans submitted as a CUDA graph with programmatic dependent launches (the
/// planner's default) give the bits of direct launches without them — on the capturing call
/// and on replays with new data in the same buffers; so does the session-6 wait order
/// (`wait_first`).
#[test]
fn graph_and_pdl_are_bitwise_direct() {
    let Some(gpu) = gpu_or_skip("fft::graph_and_pdl") else { return };
    let mut rng = fresh_rng("fft::graph_and_pdl");
    let st = gpu.stream();
    for (n, batch, prec) in [
        (1 << 14, 3, Precision::C64),
        (1 << 16, 2, Precision::C64),
        (1 << 20, 1, Precision::C128),
        (1 << 13, 5, Precision::C128),
    ] {
        let planned = FftOptions::for_shape(n, batch, prec);
        let mut graphed = FftPlan::new_opts(&gpu, n, batch, prec, planned).unwrap();
        let direct = FftOptions { graph: false, pdl: false, ..planned };
        let mut plain = FftPlan::new_opts(&gpu, n, batch, prec, direct).unwrap();
        // The session-6 order: each pass waits at entry, before its twiddle loads.
        let wait_first = FftOptions { wait_first: true, ..planned };
        let mut first = FftPlan::new_opts(&gpu, n, batch, prec, wait_first).unwrap();
        let len = 2 * n * batch;
        match prec {
            Precision::C64 => {
                let mut dx = st.alloc_zeros::<f32>(len).unwrap();
                let mut dy = st.alloc_zeros::<f32>(len).unwrap();
                let mut dz = st.alloc_zeros::<f32>(len).unwrap();
                let mut dw = st.alloc_zeros::<f32>(len).unwrap();
                for round in 0..3 {
                    st.memcpy_htod(&randn_f32(&mut rng, len, 1.0), &mut dx).unwrap();
                    st.memcpy_htod(&vec![f32::NAN; len], &mut dy).unwrap();
                    st.memcpy_htod(&vec![f32::NAN; len], &mut dw).unwrap();
                    graphed.execute_c64(&gpu, &dx, &mut dy).unwrap();
                    plain.execute_c64(&gpu, &dx, &mut dz).unwrap();
                    first.execute_c64(&gpu, &dx, &mut dw).unwrap();
                    let (a, b): (Vec<f32>, Vec<f32>) = (st.clone_dtoh(&dy).unwrap(), st.clone_dtoh(&dz).unwrap());
                    let w: Vec<f32> = st.clone_dtoh(&dw).unwrap();
                    assert!(
                        a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()),
                        "c64 n={n} round {round}: graph ≠ direct"
                    );
                    assert!(
                        w.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()),
                        "c64 n={n} round {round}: wait_first ≠ direct"
                    );
                }
            }
            Precision::C128 => {
                let mut dx = st.alloc_zeros::<f64>(len).unwrap();
                let mut dy = st.alloc_zeros::<f64>(len).unwrap();
                let mut dz = st.alloc_zeros::<f64>(len).unwrap();
                let mut dw = st.alloc_zeros::<f64>(len).unwrap();
                for round in 0..3 {
                    let x: Vec<f64> = randn_f32(&mut rng, len, 1.0).iter().map(|&v| v as f64).collect();
                    st.memcpy_htod(&x, &mut dx).unwrap();
                    st.memcpy_htod(&vec![f64::NAN; len], &mut dy).unwrap();
                    st.memcpy_htod(&vec![f64::NAN; len], &mut dw).unwrap();
                    graphed.execute_c128(&gpu, &dx, &mut dy).unwrap();
                    plain.execute_c128(&gpu, &dx, &mut dz).unwrap();
                    first.execute_c128(&gpu, &dx, &mut dw).unwrap();
                    let (a, b): (Vec<f64>, Vec<f64>) = (st.clone_dtoh(&dy).unwrap(), st.clone_dtoh(&dz).unwrap());
                    let w: Vec<f64> = st.clone_dtoh(&dw).unwrap();
                    assert!(
                        a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()),
                        "c128 n={n} round {round}: graph ≠ direct"
                    );
                    assert!(
                        w.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()),
                        "c128 n={n} round {round}: wait_first ≠ direct"
                    );
                }
            }
        }
    }
}

#[test]
fn plan_reuse_and_sub_views() {
    let Some(gpu) = gpu_or_skip("fft::plan_reuse_and_sub_views") else { return };
    let mut rng = fresh_rng("fft::plan_reuse_and_sub_views");
    let st = gpu.stream();
    for (n, batch) in [(4096, 3), (1 << 15, 2)] {
        let len = 2 * n * batch;
        let mut plan = FftPlan::new(&gpu, n, batch, Precision::C64).unwrap();
        let mut xs = vec![f32::NAN; 2];
        xs.extend(randn_f32(&mut rng, len, 1.0));
        let dx = st.clone_htod(&xs).unwrap();
        let mut dy = st.clone_htod(&vec![f32::NAN; len + 6]).unwrap();
        let mut first: Option<Vec<f32>> = None;
        for _ in 0..3 {
            {
                let mut yv = dy.slice_mut(4..4 + len);
                plan.execute_c64(&gpu, &dx.slice(2..), &mut yv).unwrap();
            }
            let all: Vec<f32> = st.clone_dtoh(&dy).unwrap();
            assert!(all[..4].iter().chain(&all[4 + len..]).all(|v| v.is_nan()), "write outside y");
            let out = all[4..4 + len].to_vec();
            match &first {
                None => first = Some(out),
                Some(f) => assert!(f.iter().zip(&out).all(|(a, b)| a.to_bits() == b.to_bits()), "not reproducible"),
            }
        }
        let x64: Vec<f64> = xs[2..].iter().map(|&v| v as f64).collect();
        let ours: Vec<f64> = first.unwrap().iter().map(|&v| v as f64).collect();
        let (rel, _) = fft_error(&ours, &fft_c2c_fwd(n, batch, &x64));
        assert!(rel <= fft_error_bound(n, false), "n={n}: {rel:e}");
    }
}

#[test]
fn argument_errors() {
    let Some(gpu) = gpu_or_skip("fft::argument_errors") else { return };
    let shape_arg = |r: Result<FftPlan, Error>| match r {
        Err(Error::Shape { arg, .. }) => arg,
        Err(e) => panic!("expected a shape error, got {e}"),
        Ok(_) => panic!("expected an error"),
    };
    assert_eq!(shape_arg(FftPlan::new(&gpu, 0, 1, Precision::C64)), "n");
    assert_eq!(shape_arg(FftPlan::new(&gpu, 12, 1, Precision::C64)), "n");
    assert_eq!(shape_arg(FftPlan::new(&gpu, 1 << 25, 1, Precision::C128)), "n");
    assert_eq!(shape_arg(FftPlan::new(&gpu, 1 << 27, 1, Precision::C64)), "n");
    assert_eq!(shape_arg(FftPlan::new(&gpu, 8, 0, Precision::C64)), "batch");
    assert!(matches!(
        FftPlan::new(&gpu, 1 << 20, usize::MAX / 1024, Precision::C64),
        Err(Error::Overflow { arg: "batch", .. })
    ));
    let st = gpu.stream();
    let mut plan = FftPlan::new(&gpu, 64, 2, Precision::C64).unwrap();
    let small = st.alloc_zeros::<f32>(255).unwrap();
    let ok = st.alloc_zeros::<f32>(256).unwrap();
    let mut out = st.alloc_zeros::<f32>(256).unwrap();
    let mut out_small = st.alloc_zeros::<f32>(200).unwrap();
    assert!(matches!(plan.execute_c64(&gpu, &small, &mut out), Err(Error::BufferTooSmall { arg: "x", .. })));
    assert!(matches!(plan.execute_c64(&gpu, &ok, &mut out_small), Err(Error::BufferTooSmall { arg: "y", .. })));
    let x128 = st.alloc_zeros::<f64>(256).unwrap();
    let mut y128 = st.alloc_zeros::<f64>(256).unwrap();
    assert!(matches!(plan.execute_c128(&gpu, &x128, &mut y128), Err(Error::Shape { arg: "x", .. })));
    // A sub-view half an element in: not aligned to the 8-byte element.
    let big = st.alloc_zeros::<f32>(300).unwrap();
    assert!(matches!(plan.execute_c64(&gpu, &big.slice(1..), &mut out), Err(Error::Shape { arg: "x", .. })));
    // Partially overlapping buffers through the raw entry.
    let buf = st.alloc_zeros::<f32>(600).unwrap();
    let (p, _g) = rgk::cudarc::driver::DevicePtr::device_ptr(&buf, st);
    let r = unsafe { plan.execute_raw(&gpu, p, p + 16, st.cu_stream()) };
    assert!(matches!(r, Err(Error::Shape { arg: "y", .. })));
}

/// The bench's copy-chain floor (`CopyChain`): one copy for one-pass plans, two through the
/// scratch for two-pass plans (graph + PDL as the plan); `y` is bitwise `x` on the seed rows'
/// plans (c64 and c128), nothing outside `y` is written, and the argument errors name the
/// buffer.
#[test]
fn copy_chain_floor() {
    let Some(gpu) = gpu_or_skip("fft::copy_chain_floor") else { return };
    let mut rng = fresh_rng("fft::copy_chain_floor");
    let st = gpu.stream();
    for (batch, n, prec) in SEED_ROWS {
        let plan = FftPlan::new(&gpu, n, batch, prec).unwrap();
        let mut chain = rgk::fft::CopyChain::for_plan(&gpu, &plan).unwrap();
        assert_eq!(chain.passes(), plan.launches().clamp(1, 2), "n={n} batch={batch}");
        // Bit patterns of the storage type; c128 as pairs of f32 words is the same bytes.
        let words = 2 * n * batch * prec.element_bytes() / 8;
        let x = randn_f32(&mut rng, words, 1.0);
        let dx = st.clone_htod(&x).unwrap();
        let mut dy = st.clone_htod(&vec![f32::NAN; words + 8]).unwrap();
        for _ in 0..2 {
            {
                let mut yv = dy.slice_mut(4..4 + words);
                chain.run(&gpu, &dx, &mut yv).unwrap();
            }
            let all: Vec<f32> = st.clone_dtoh(&dy).unwrap();
            assert!(all[..4].iter().chain(&all[4 + words..]).all(|v| v.is_nan()), "write outside y");
            assert!(
                all[4..4 + words].iter().zip(&x).all(|(a, b)| a.to_bits() == b.to_bits()),
                "n={n} batch={batch} {prec:?}: y is not x"
            );
        }
    }
    let plan = FftPlan::new(&gpu, 64, 2, Precision::C64).unwrap();
    let mut chain = rgk::fft::CopyChain::for_plan(&gpu, &plan).unwrap();
    let ok = st.alloc_zeros::<f32>(256).unwrap();
    let mut out = st.alloc_zeros::<f32>(256).unwrap();
    let small = st.alloc_zeros::<f32>(255).unwrap();
    assert!(matches!(chain.run(&gpu, &small, &mut out), Err(Error::BufferTooSmall { arg: "x", .. })));
    let big = st.alloc_zeros::<f32>(300).unwrap();
    assert!(matches!(chain.run(&gpu, &big.slice(2..), &mut out), Err(Error::Shape { arg: "x", .. })));
    assert!(matches!(chain.run(&gpu, &ok, &mut out.slice_mut(0..255)), Err(Error::BufferTooSmall { arg: "y", .. })));
    let one = FftPlan::new(&gpu, 1, 1, Precision::C64).unwrap();
    assert!(matches!(rgk::fft::CopyChain::for_plan(&gpu, &one), Err(Error::Shape { arg: "n", .. })));
}
