//! FFTC2CFwd on the GPU against the f64 CPU reference (docs/ops.md §1), through the shipped
//! planner (`FftPlan::new`): every power-of-two length 2^0..2^22 in c64 and c128, the ten seed
//! shapes, odd batches, in place, long batches (persistent grids), plan reuse, graph replays
//! and the argument errors. Each case reports its relative L2 error; the bar
//! (`rgk::reference::fft_error_bound`) grows like √log2 n. Outputs are poisoned (NaN) first.
use rand::rngs::StdRng;
use rand_distr::{Distribution, Normal};
use rgk::fft::{self, FftPlan, Precision};
use rgk::reference::{fft_c2c_fwd, fft_error, fft_error_bound};
use rgk::{Complex, Error, Gpu};
use rgk_tests::{fresh_rng, gpu_or_skip, randn_f32};

/// Interleaved reals `(re, im, re, im, …)` as complex elements.
fn complex<R: Copy>(reals: &[R]) -> Vec<Complex<R>> {
    reals.chunks_exact(2).map(|p| Complex::new(p[0], p[1])).collect()
}

/// Complex elements as interleaved reals.
fn reals<R: Copy>(v: &[Complex<R>]) -> Vec<R> {
    v.iter().flat_map(|c| [c.re, c.im]).collect()
}

/// Runs the plan of `FftPlan::new` out of place (or in place) on fresh randn input; returns the
/// rel L2 error after asserting it is within the bar.
fn run(gpu: &Gpu, rng: &mut StdRng, n: usize, batch: usize, prec: Precision, in_place: bool) -> f64 {
    let len = 2 * n * batch;
    let st = gpu.stream();
    let mut plan = FftPlan::new(gpu, n, batch, prec).unwrap_or_else(|e| panic!("plan n={n} batch={batch}: {e}"));
    let (ours, x64): (Vec<f64>, Vec<f64>) = match prec {
        Precision::C64 => {
            let x = randn_f32(rng, len, 1.0);
            let dx = fft::clone_htod(st, &complex(&x)).unwrap();
            let out: Vec<Complex<f32>> = if in_place {
                let mut d = dx;
                plan.execute_c64_inplace(gpu, &mut d).unwrap();
                fft::clone_dtoh(st, &d).unwrap()
            } else {
                let mut dy = fft::clone_htod(st, &vec![Complex::new(f32::NAN, f32::NAN); len / 2]).unwrap();
                plan.execute_c64(gpu, &dx, &mut dy).unwrap();
                fft::clone_dtoh(st, &dy).unwrap()
            };
            let out = reals(&out);
            (out.iter().map(|&v| v as f64).collect(), x.iter().map(|&v| v as f64).collect())
        }
        Precision::C128 => {
            let d = Normal::new(0f64, 1f64).unwrap();
            let x: Vec<f64> = (0..len).map(|_| d.sample(rng)).collect();
            let dx = fft::clone_htod(st, &complex(&x)).unwrap();
            let out: Vec<Complex<f64>> = if in_place {
                let mut d = dx;
                plan.execute_c128_inplace(gpu, &mut d).unwrap();
                fft::clone_dtoh(st, &d).unwrap()
            } else {
                let mut dy = fft::clone_htod(st, &vec![Complex::new(f64::NAN, f64::NAN); len / 2]).unwrap();
                plan.execute_c128(gpu, &dx, &mut dy).unwrap();
                fft::clone_dtoh(st, &dy).unwrap()
            };
            (reals(&out), x)
        }
    };
    let reference = fft_c2c_fwd(n, batch, &x64);
    let (rel, max_abs) = fft_error(&ours, &reference);
    let bound = fft_error_bound(n, prec == Precision::C128);
    println!(
        "{prec:?} n=2^{} batch={batch}{}: rel_l2 {rel:.3e} (bar {bound:.1e}), max_abs {max_abs:.3e}, kernels {:?}",
        n.trailing_zeros(),
        if in_place { " in place" } else { "" },
        plan.pass_kernels()
    );
    assert!(rel <= bound, "{prec:?} n={n} batch={batch} in_place={in_place}: rel_l2 {rel:e} above {bound:e}");
    rel
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

/// The ten workloads of the seed table of docs/ops.md (printing each plan's kernels).
#[test]
fn seed_shapes() {
    let Some(gpu) = gpu_or_skip("fft::seed_shapes") else { return };
    let mut rng = fresh_rng("fft::seed_shapes");
    for (batch, n, prec) in SEED_ROWS {
        run(&gpu, &mut rng, n, batch, prec, false);
    }
}

#[test]
fn odd_batches() {
    let Some(gpu) = gpu_or_skip("fft::odd_batches") else { return };
    let mut rng = fresh_rng("fft::odd_batches");
    for prec in [Precision::C64, Precision::C128] {
        for n in [2, 16, 64, 512, 1024, 4096, 1 << 13, 1 << 14, 1 << 15] {
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

/// Batches long enough that the row passes run persistent grids (blocks looping over groups
/// of transforms; the staged kernels' double-buffered copies), with a partial last group.
#[test]
fn long_batches_persistent_grids() {
    let Some(gpu) = gpu_or_skip("fft::long_batches_persistent_grids") else { return };
    let mut rng = fresh_rng("fft::long_batches_persistent_grids");
    for (n, batch) in [(64, 100_001), (128, 40_001), (512, 5001), (1024, 3001), (2048, 1501), (4096, 1001)] {
        run(&gpu, &mut rng, n, batch, Precision::C64, false);
        run(&gpu, &mut rng, n, batch, Precision::C128, false);
    }
    run(&gpu, &mut rng, 512, 5001, Precision::C64, true);
    run(&gpu, &mut rng, 64, 100_001, Precision::C64, true);
}

/// Multi-pass plans submit a call's passes as one CUDA graph with programmatic dependent
/// launches; the graph (the capturing call and replays with new data in the same buffers)
/// gives bitwise the output of the same passes launched directly (`execute_raw`).
#[test]
fn graph_replays_match_direct_launches() {
    use rgk::cudarc::driver::DevicePtr;
    let Some(gpu) = gpu_or_skip("fft::graph_replays_match_direct_launches") else { return };
    let mut rng = fresh_rng("fft::graph_replays_match_direct_launches");
    let st = gpu.stream();
    for (n, batch, prec) in [
        (1 << 14, 3, Precision::C64),
        (1 << 16, 2, Precision::C64),
        (1 << 20, 1, Precision::C128),
        (1 << 13, 5, Precision::C128),
    ] {
        let mut graphed = FftPlan::new(&gpu, n, batch, prec).unwrap();
        let direct = FftPlan::new(&gpu, n, batch, prec).unwrap();
        let len = 2 * n * batch;
        for round in 0..3 {
            let x = randn_f32(&mut rng, len, 1.0);
            let (a, b): (Vec<u64>, Vec<u64>) = match prec {
                Precision::C64 => {
                    let nan = vec![Complex::new(f32::NAN, f32::NAN); len / 2];
                    let dx = fft::clone_htod(st, &complex(&x)).unwrap();
                    let mut dy = fft::clone_htod(st, &nan).unwrap();
                    let dz = fft::clone_htod(st, &nan).unwrap();
                    graphed.execute_c64(&gpu, &dx, &mut dy).unwrap();
                    {
                        let ((xp, _g1), (zp, _g2)) = (dx.device_ptr(st), dz.device_ptr(st));
                        // SAFETY: both buffers hold the plan's elements; `direct` runs only here.
                        unsafe { direct.execute_raw(&gpu, xp, zp, st.cu_stream()) }.unwrap();
                    }
                    let (a, b) = (reals(&fft::clone_dtoh(st, &dy).unwrap()), reals(&fft::clone_dtoh(st, &dz).unwrap()));
                    (a.iter().map(|v| v.to_bits() as u64).collect(), b.iter().map(|v| v.to_bits() as u64).collect())
                }
                Precision::C128 => {
                    let x: Vec<f64> = x.iter().map(|&v| v as f64).collect();
                    let nan = vec![Complex::new(f64::NAN, f64::NAN); len / 2];
                    let dx = fft::clone_htod(st, &complex(&x)).unwrap();
                    let mut dy = fft::clone_htod(st, &nan).unwrap();
                    let dz = fft::clone_htod(st, &nan).unwrap();
                    graphed.execute_c128(&gpu, &dx, &mut dy).unwrap();
                    {
                        let ((xp, _g1), (zp, _g2)) = (dx.device_ptr(st), dz.device_ptr(st));
                        // SAFETY: as above.
                        unsafe { direct.execute_raw(&gpu, xp, zp, st.cu_stream()) }.unwrap();
                    }
                    let (a, b) = (reals(&fft::clone_dtoh(st, &dy).unwrap()), reals(&fft::clone_dtoh(st, &dz).unwrap()));
                    (a.iter().map(|v| v.to_bits()).collect(), b.iter().map(|v| v.to_bits()).collect())
                }
            };
            assert!(a == b, "{prec:?} n={n} round {round}: graph ≠ direct");
        }
    }
}

#[test]
fn plan_reuse_and_sub_views() {
    let Some(gpu) = gpu_or_skip("fft::plan_reuse_and_sub_views") else { return };
    let mut rng = fresh_rng("fft::plan_reuse_and_sub_views");
    let st = gpu.stream();
    // 512 and 64: staged row passes, whose 8-byte aligned `x` takes the unstaged kernel.
    for (n, batch) in [(4096, 3), (1 << 15, 2), (512, 333), (64, 1001)] {
        let len = 2 * n * batch;
        let mut plan = FftPlan::new(&gpu, n, batch, Precision::C64).unwrap();
        let mut xs = vec![f32::NAN; 2];
        xs.extend(randn_f32(&mut rng, len, 1.0));
        let dx = st.clone_htod(&xs).unwrap();
        let mut dy = st.clone_htod(&vec![f32::NAN; len + 6]).unwrap();
        let mut first: Option<Vec<f32>> = None;
        for _ in 0..3 {
            {
                // Interleaved real buffers viewed as complex (no copy), at element offsets 1 and 2.
                let mut yv = dy.slice_mut(4..4 + len);
                plan.execute_c64(&gpu, &fft::view_as_complex(&dx.slice(2..)), &mut fft::view_as_complex_mut(&mut yv))
                    .unwrap();
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

/// The complex buffer helpers: uploads and downloads round-trip bit for bit, `alloc_zeros`
/// is zero, and a real buffer viewed as complex addresses the same memory (`len / 2`
/// elements), so a transform through the view equals one through a complex upload.
#[test]
fn complex_buffers_round_trip() {
    let Some(gpu) = gpu_or_skip("fft::complex_buffers_round_trip") else { return };
    let mut rng = fresh_rng("fft::complex_buffers_round_trip");
    let st = gpu.stream();
    let x = randn_f32(&mut rng, 2 * 512 * 3, 1.0);
    let cx = complex(&x);
    let d = fft::clone_htod(st, &cx).unwrap();
    assert_eq!(d.len(), cx.len());
    let back = fft::clone_dtoh(st, &d).unwrap();
    assert!(back.iter().zip(&cx).all(|(a, b)| a.re.to_bits() == b.re.to_bits() && a.im.to_bits() == b.im.to_bits()));
    let z = fft::alloc_zeros::<f64>(st, 7).unwrap();
    assert_eq!(fft::clone_dtoh(st, &z).unwrap(), vec![Complex::new(0.0, 0.0); 7]);
    let dreals = st.clone_htod(&x).unwrap();
    let odd = dreals.slice(0..x.len() - 1);
    assert_eq!(fft::view_as_complex(&odd).len(), cx.len() - 1);
    let mut plan = FftPlan::new(&gpu, 512, 3, Precision::C64).unwrap();
    let mut y1 = fft::alloc_zeros::<f32>(st, cx.len()).unwrap();
    plan.execute_c64(&gpu, &d, &mut y1).unwrap();
    let mut y2 = st.alloc_zeros::<f32>(x.len()).unwrap();
    plan.execute_c64(
        &gpu,
        &fft::view_as_complex(&dreals.slice(..)),
        &mut fft::view_as_complex_mut(&mut y2.slice_mut(..)),
    )
    .unwrap();
    let (a, b): (Vec<f32>, Vec<f32>) = (reals(&fft::clone_dtoh(st, &y1).unwrap()), st.clone_dtoh(&y2).unwrap());
    assert!(a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()), "view ≠ complex upload");
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
    let small = fft::alloc_zeros::<f32>(st, 127).unwrap();
    let ok = fft::alloc_zeros::<f32>(st, 128).unwrap();
    let mut out = fft::alloc_zeros::<f32>(st, 128).unwrap();
    let mut out_small = fft::alloc_zeros::<f32>(st, 100).unwrap();
    let e = plan.execute_c64(&gpu, &small, &mut out).unwrap_err();
    assert!(matches!(e, Error::BufferTooSmall { arg: "x", .. }) && e.arg() == Some("x"));
    assert!(matches!(plan.execute_c64(&gpu, &ok, &mut out_small), Err(Error::BufferTooSmall { arg: "y", .. })));
    let x128 = fft::alloc_zeros::<f64>(st, 128).unwrap();
    let mut y128 = fft::alloc_zeros::<f64>(st, 128).unwrap();
    assert!(matches!(plan.execute_c128(&gpu, &x128, &mut y128), Err(Error::Shape { arg: "x", .. })));
    // A real buffer viewed as complex half an element in: not aligned to the 8-byte element.
    let big = st.alloc_zeros::<f32>(300).unwrap();
    let r = plan.execute_c64(&gpu, &fft::view_as_complex(&big.slice(1..)), &mut out);
    assert!(matches!(r, Err(Error::Shape { arg: "x", .. })));
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

/// Every FFT entry of the loaded PTX (and the copy-chain floor's kernel) is one the planner
/// launches for some shape, and every kernel it launches is in the PTX.
#[test]
fn planned_kernels_are_the_ptx_entries() {
    let Some(gpu) = gpu_or_skip("fft::planned_kernels_are_the_ptx_entries") else { return };
    let planned = rgk::fft::planned_kernels(&gpu).unwrap();
    let entries: std::collections::BTreeSet<&str> =
        rgk_tests::module_entries().into_iter().filter(|n| n.starts_with("fft_") || *n == "device_copy_16b").collect();
    assert_eq!(planned, entries);
}

/// The kernel table's `max_threads` (the planner's block-size limit per kernel) is the largest
/// power of two, at most 512, that the driver allows for the kernel's registers on this GPU.
#[test]
fn kernel_thread_limits_match_the_device() {
    let Some(gpu) = gpu_or_skip("fft::kernel_thread_limits_match_the_device") else { return };
    for (name, planned, driver) in rgk::fft::kernel_thread_limits(&gpu).unwrap() {
        let want = 512.min(1 << (31 - (driver as u32).leading_zeros()));
        println!("{name}: driver {driver}, planner {planned}");
        assert_eq!(planned, want, "{name}: driver allows {driver} threads per block");
    }
}

/// One plan executed alternately on two streams of the context, with no host synchronisation
/// between the calls, gives the bits it gives on one stream: the second stream waits for the
/// first before reusing the plan's workspace (two-pass lengths) and tables. So do its calls
/// on the legacy default stream.
#[test]
fn plan_alternating_streams_matches_one_stream() {
    let Some(gpu) = gpu_or_skip("fft::plan_alternating_streams_matches_one_stream") else { return };
    let mut rng = fresh_rng("fft::plan_alternating_streams_matches_one_stream");
    let other = gpu.new_stream().unwrap();
    // The legacy default stream (PyTorch's default) cannot be captured: the multi-pass plans
    // capture their graph on a stream of their own and launch it there.
    let legacy = gpu.with_stream(gpu.context().default_stream()).unwrap();
    let st = gpu.stream();
    for (n, batch) in [(1 << 16, 4), (1 << 20, 1), (4096, 64)] {
        let len = n * batch;
        let xs: Vec<_> =
            (0..6).map(|_| fft::clone_htod(st, &complex(&randn_f32(&mut rng, 2 * len, 1.0))).unwrap()).collect();
        let nan = vec![Complex::new(f32::NAN, f32::NAN); len];
        let mut one: Vec<_> = xs.iter().map(|_| fft::clone_htod(st, &nan).unwrap()).collect();
        let mut plan = FftPlan::new(&gpu, n, batch, Precision::C64).unwrap();
        for (x, y) in xs.iter().zip(one.iter_mut()) {
            plan.execute_c64(&gpu, x, y).unwrap();
        }
        for (what, pick) in [("two streams", 0), ("the legacy stream", 1)] {
            let mut two: Vec<_> = xs.iter().map(|_| fft::clone_htod(st, &nan).unwrap()).collect();
            for (i, (x, y)) in xs.iter().zip(two.iter_mut()).enumerate() {
                let handle = match pick {
                    0 if i % 2 == 0 => &other,
                    1 => &legacy,
                    _ => &gpu,
                };
                plan.execute_c64(handle, x, y).unwrap();
            }
            for (i, (a, b)) in one.iter().zip(&two).enumerate() {
                let (a, b) = (fft::clone_dtoh(st, a).unwrap(), fft::clone_dtoh(other.stream(), b).unwrap());
                let same =
                    a.iter().zip(&b).all(|(p, q)| p.re.to_bits() == q.re.to_bits() && p.im.to_bits() == q.im.to_bits());
                assert!(same, "n={n} batch={batch} call {i}: {what} ≠ one stream");
            }
        }
        println!(
            "n=2^{} batch={batch}: 6 calls on alternating streams and on the legacy stream, bitwise equal",
            n.trailing_zeros()
        );
    }
}
