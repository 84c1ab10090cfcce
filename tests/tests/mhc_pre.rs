//! MHCPreFwd (docs/ops.md §2) against the f64 CPU reference: bf16 outputs within 1 ulp of the
//! correctly rounded value (+ the slack of `reference::mhc_pre_fwd_from_logits`), h_post to
//! 1e-5 relative (+ its slack), every element, outputs poisoned first; bitwise determinism.
//!
//! CPU tests (run everywhere): a Rust model of both kernels' index math and arithmetic (same
//! tiles, walks, summation orders and f32 coefficient code) checked for exact coverage (every
//! phi/x read, workspace word and output written exactly once, every partial read by each
//! kernel-2 block) and against the reference with the same tolerances; validation errors; the
//! reference against an independent formulation.
#![allow(clippy::needless_range_loop)] // the model mirrors the kernel's index arithmetic
use rand::rngs::StdRng;
use rgk::mhc::{FusedGeometry, MhcPre, MhcPreParams, MhcPreShape, PreConfig, PreGeometry, PrePath};
use rgk::reference::{mhc_pre_fwd, mhc_pre_fwd_from_logits, mhc_pre_logits, MhcPreRef};
use rgk::verify::{check_float, check_half, poisoned, Report};
use rgk::{bf16, Error, Gpu};
use rgk_tests::{fresh_rng, gpu_or_skip, randn_f32, randn_half};

#[derive(Clone)]
struct Inputs {
    phi: Vec<f32>,
    x: Vec<bf16>,
    b: Vec<f32>,
}

fn inputs(rng: &mut StdRng, s: MhcPreShape, phi_scale: f32, x_scale: f32) -> Inputs {
    let l = s.lens().unwrap();
    Inputs { phi: randn_f32(rng, l.phi, phi_scale), x: randn_half(rng, l.x, x_scale), b: randn_f32(rng, l.b, 1.0) }
}

struct Outputs {
    x_res: Vec<bf16>,
    x_layer: Vec<bf16>,
    h_post: Vec<f32>,
}

/// The largest `|ours − q(ref)|` in ulps of `q(ref)` among the elements whose slack is below
/// one ulp (elsewhere the slack, not the ulp, judges: results formed by cancellation), and the
/// largest fraction of the tolerance `ulp + slack` used by any element.
fn usage(ours: &[bf16], r: &rgk::reference::RefOutput) -> (f64, f64) {
    let (mut ulps, mut used) = (0f64, 0f64);
    for (o, (v, m)) in ours.iter().zip(r.value.iter().zip(&r.magnitude)) {
        let q = bf16::from_f64(*v);
        let ulp = rgk::verify::Half::ulp(q);
        let (err, slack) = ((o.to_f64() - q.to_f64()).abs(), m * 2f64.powi(-16));
        if slack < ulp {
            ulps = ulps.max(err / ulp);
        }
        used = used.max(err / (ulp + slack));
    }
    (ulps, used)
}

/// The three checks; panics with the reports on failure. Returns the worst ulp error (among
/// elements not judged by their slack) and the worst fraction of the tolerance used.
fn check(what: &str, out: &Outputs, r: &MhcPreRef) -> (f64, f64) {
    let a = check_half(&out.x_res, &r.x_res, 1.0);
    let b = check_half(&out.x_layer, &r.x_layer, 1.0);
    let h: Vec<f64> = out.h_post.iter().map(|&v| v as f64).collect();
    let c = check_float(&h, &r.h_post, 1e-5);
    let ok = |r: &Report| r.passed();
    assert!(ok(&a) && ok(&b) && ok(&c), "{what}:\n  x_res: {a}\n  x_layer: {b}\n  h_post: {c}");
    let (ua, fa) = usage(&out.x_res, &r.x_res);
    let (ub, fb) = usage(&out.x_layer, &r.x_layer);
    (ua.max(ub), fa.max(fb))
}

fn worse(a: (f64, f64), b: (f64, f64)) -> (f64, f64) {
    (a.0.max(b.0), a.1.max(b.1))
}

/// Runs `op` once with poisoned outputs and reads them back.
fn run(gpu: &Gpu, op: &mut MhcPre, p: MhcPreParams, inp: &Inputs) -> Outputs {
    let l = op.plan().shape.lens().unwrap();
    let st = gpu.stream();
    let (dphi, dx, db) =
        (st.clone_htod(&inp.phi).unwrap(), st.clone_htod(&inp.x).unwrap(), st.clone_htod(&inp.b).unwrap());
    let mut dr = st.clone_htod(&poisoned::<bf16>(l.x)).unwrap();
    let mut dy = st.clone_htod(&poisoned::<bf16>(l.x_layer)).unwrap();
    let mut dh = st.clone_htod(&vec![f32::NAN; l.h_post]).unwrap();
    op.run(gpu, p, &dphi, &dx, &db, &mut dr, &mut dy, &mut dh).unwrap();
    Outputs {
        x_res: st.clone_dtoh(&dr).unwrap(),
        x_layer: st.clone_dtoh(&dy).unwrap(),
        h_post: st.clone_dtoh(&dh).unwrap(),
    }
}

const SEEDS: [(usize, usize); 3] = [(1, 1280), (2, 1920), (4, 2560)];

#[test]
fn seed_workloads() {
    let Some(gpu) = gpu_or_skip("mhc_pre::seed_workloads") else { return };
    let mut rng = fresh_rng("mhc_pre::seed_workloads");
    for (batch, c) in SEEDS {
        let s = MhcPreShape { batch, n: 4, c };
        let inp = inputs(&mut rng, s, 1.0, 1.0);
        let p = MhcPreParams::default();
        let mut op = MhcPre::new(&gpu, s).unwrap();
        let out = run(&gpu, &mut op, p, &inp);
        let (ulps, used) = check(&format!("{s:?}"), &out, &mhc_pre_fwd(s, p, &inp.phi, &inp.x, &inp.b));
        println!("B={batch} n=4 c={c} {:?}: worst {ulps:.3} ulp, {used:.3} of the tolerance", op.plan().geometry);
        // The one-launch cluster path fits every seed row on an H200.
        let auto = PreConfig { path: PrePath::Auto, ..PreConfig::default() };
        let mut fused = MhcPre::with_config(&gpu, s, auto).unwrap();
        assert!(fused.plan().fused.is_some(), "{s:?}: the one-launch path does not fit");
        let out = run(&gpu, &mut fused, p, &inp);
        let (ulps, used) = check(&format!("{s:?} one launch"), &out, &mhc_pre_fwd(s, p, &inp.phi, &inp.x, &inp.b));
        println!("  one launch {:?}: worst {ulps:.3} ulp, {used:.3} of the tolerance", fused.plan().fused);
        // The default is the v8 pair (fixed-point sums, checked above and over three calls below);
        // the v5 pair (partials) and the v4 pair (`mhc_pre_mix4`) too.
        assert!(op.plan().geometry.v5 && op.plan().geometry.fx, "{s:?}: the default does not run the v8 pair");
        let mut v5 = MhcPre::with_config(&gpu, s, PreConfig { fixed_point: false, ..PreConfig::default() }).unwrap();
        assert!(v5.plan().geometry.v5 && !v5.plan().geometry.fx, "{s:?}: not the v5 pair");
        let out = run(&gpu, &mut v5, p, &inp);
        let (ulps, used) = check(&format!("{s:?} v5"), &out, &mhc_pre_fwd(s, p, &inp.phi, &inp.x, &inp.b));
        println!("  v5: worst {ulps:.3} ulp, {used:.3} of the tolerance");
        let mut v4 = MhcPre::with_config(&gpu, s, PreConfig { v5: false, ..PreConfig::default() }).unwrap();
        assert!(!v4.plan().geometry.v5, "{s:?}: v5 still on");
        let out = run(&gpu, &mut v4, p, &inp);
        let (ulps, used) = check(&format!("{s:?} v4"), &out, &mhc_pre_fwd(s, p, &inp.phi, &inp.x, &inp.b));
        println!("  v4 {:?}: worst {ulps:.3} ulp, {used:.3} of the tolerance", v4.plan().geometry);
        // v6: one cooperative launch (grid barrier) fits every seed row.
        let mut coop = MhcPre::with_config(&gpu, s, PreConfig { coop: true, ..PreConfig::default() }).unwrap();
        assert!(coop.plan().geometry.coop.is_some(), "{s:?}: the cooperative path does not fit");
        for call in 0..3 {
            let out = run(&gpu, &mut coop, p, &inp);
            let (ulps, used) =
                check(&format!("{s:?} v6 call {call}"), &out, &mhc_pre_fwd(s, p, &inp.phi, &inp.x, &inp.b));
            println!("  v6 {:?}: worst {ulps:.3} ulp, {used:.3} of the tolerance", coop.plan().geometry.coop);
        }
        // v8: fixed-point split-K sums; the accumulators carry state between calls (epoch parity).
        let mut fx = MhcPre::new(&gpu, s).unwrap();
        for call in 0..3 {
            let inp = if call == 1 { inputs(&mut rng, s, 1.0, 1.0) } else { inp.clone() };
            let out = run(&gpu, &mut fx, p, &inp);
            let (ulps, used) =
                check(&format!("{s:?} v8 call {call}"), &out, &mhc_pre_fwd(s, p, &inp.phi, &inp.x, &inp.b));
            println!("  v8 call {call}: worst {ulps:.3} ulp, {used:.3} of the tolerance");
        }
    }
}

#[test]
fn shape_sweep() {
    let Some(gpu) = gpu_or_skip("mhc_pre::shape_sweep") else { return };
    let mut rng = fresh_rng("mhc_pre::shape_sweep");
    let mut worst = (0f64, 0f64);
    for batch in [1, 5, 32] {
        for n in [1, 2, 4, 8] {
            for c in [1, 7, 1280, 4099] {
                let s = MhcPreShape { batch, n, c };
                // Logits O(1) (dense R, Sinkhorn matters) on odd c, O(√(n·c)) (the seed regime) else.
                let phi_scale = if c % 2 == 1 { 1.0 / ((n * c) as f32).sqrt() } else { 1.0 };
                let inp = inputs(&mut rng, s, phi_scale, 1.0);
                let logits = mhc_pre_logits(s, &inp.phi, &inp.x);
                let auto = PreConfig { path: PrePath::Auto, ..PreConfig::default() };
                // The default (v5 where n ≤ 4), the one-launch path where it fits, the v4 pair.
                let v4 = PreConfig { v5: false, ..PreConfig::default() };
                let coop = PreConfig { coop: true, ..PreConfig::default() };
                let fx = PreConfig { fixed_point: true, ..PreConfig::default() };
                let v5 = PreConfig { fixed_point: false, ..PreConfig::default() };
                let mut ops = [
                    MhcPre::with_config(&gpu, s, v5).unwrap(),
                    MhcPre::with_config(&gpu, s, auto).unwrap(),
                    MhcPre::with_config(&gpu, s, v4).unwrap(),
                    MhcPre::with_config(&gpu, s, coop).unwrap(),
                    MhcPre::with_config(&gpu, s, fx).unwrap(),
                ];
                for ((repeat, alphas), i) in [(0, (0.7, 1.3, 1.9)), (1, (1.0, 1.0, 1.0)), (20, (1.4, 0.6, 0.8))]
                    .into_iter()
                    .flat_map(|a| [(a, 0), (a, 1), (a, 2), (a, 3), (a, 4)])
                {
                    let op = &mut ops[i];
                    let p = MhcPreParams {
                        alpha_pre: alphas.0,
                        alpha_post: alphas.1,
                        alpha_res: alphas.2,
                        sinkhorn_repeat: repeat,
                        sinkhorn_eps: 0.02,
                    };
                    let out = run(&gpu, op, p, &inp);
                    let r = mhc_pre_fwd_from_logits(s, p, &logits, &inp.b, &inp.x);
                    let what = format!(
                        "{s:?} repeat {repeat} fused {} v5 {} v6 {} v8 {}",
                        op.plan().fused.is_some(),
                        op.plan().geometry.v5,
                        op.plan().geometry.coop.is_some(),
                        op.plan().geometry.fx
                    );
                    worst = worse(worst, check(&what, &out, &r));
                }
            }
        }
    }
    println!("shape sweep: worst {:.3} ulp, {:.3} of the tolerance", worst.0, worst.1);
}

#[test]
fn extreme_inputs_are_finite_and_match() {
    let Some(gpu) = gpu_or_skip("mhc_pre::extreme_inputs") else { return };
    let mut rng = fresh_rng("mhc_pre::extreme_inputs");
    for (s, fixed_point) in [
        (MhcPreShape { batch: 4, n: 4, c: 2560 }, false),
        (MhcPreShape { batch: 4, n: 4, c: 2560 }, true),
        (MhcPreShape { batch: 5, n: 3, c: 7 }, false),
        (MhcPreShape { batch: 5, n: 3, c: 7 }, true),
    ] {
        let p = MhcPreParams::default();
        let mut op = MhcPre::with_config(&gpu, s, PreConfig { fixed_point, ..PreConfig::default() }).unwrap();
        let mut inp = inputs(&mut rng, s, 1.0, 1.0);
        inp.x.iter_mut().for_each(|v| *v = bf16::ZERO);
        let out = run(&gpu, &mut op, p, &inp);
        assert!(out.h_post.iter().all(|v| v.is_finite()));
        check(&format!("{s:?} x = 0"), &out, &mhc_pre_fwd(s, p, &inp.phi, &inp.x, &inp.b));
        let inp = inputs(&mut rng, s, 1.0, 1.0e4);
        let out = run(&gpu, &mut op, p, &inp);
        assert!(out.x_res.iter().chain(&out.x_layer).all(|v| v.to_f32().is_finite()));
        check(&format!("{s:?} x·1e4"), &out, &mhc_pre_fwd(s, p, &inp.phi, &inp.x, &inp.b));
    }
}

#[test]
fn bitwise_deterministic() {
    let Some(gpu) = gpu_or_skip("mhc_pre::bitwise_deterministic") else { return };
    let mut rng = fresh_rng("mhc_pre::bitwise_deterministic");
    for s in [MhcPreShape { batch: 4, n: 4, c: 2560 }, MhcPreShape { batch: 32, n: 8, c: 4099 }] {
        let inp = inputs(&mut rng, s, 1.0 / ((s.n * s.c) as f32).sqrt(), 1.0);
        let p = MhcPreParams { sinkhorn_repeat: 20, ..MhcPreParams::default() };
        for (v5, coop, fixed_point) in
            [(false, false, false), (true, false, false), (true, true, false), (true, false, true)]
        {
            let config = PreConfig { v5, coop, fixed_point, ..PreConfig::default() };
            let mut op = MhcPre::with_config(&gpu, s, config).unwrap();
            let first = run(&gpu, &mut op, p, &inp);
            check(&format!("{s:?}"), &first, &mhc_pre_fwd(s, p, &inp.phi, &inp.x, &inp.b));
            let bits = |o: &Outputs| {
                (
                    o.x_res.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    o.x_layer.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    o.h_post.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                )
            };
            let want = bits(&first);
            let mut other = MhcPre::with_config(&gpu, s, config).unwrap();
            for i in 0..8 {
                let op = if i % 2 == 0 { &mut op } else { &mut other };
                assert!(
                    bits(&run(&gpu, op, p, &inp)) == want,
                    "{s:?} v5 {v5} v6 {coop} v8 {fixed_point}: run {i} differs from the first"
                );
            }
        }
    }
}

/// `PreConfig::graph`: the call's kernels submitted as one captured CUDA graph give the same
/// bits as direct launches — on the capturing call, on replays with new data in the same
/// buffers (the graph reads memory when it runs), and after the buffers change (re-capture).
#[test]
fn graph_replay_matches_direct_launches() {
    let Some(gpu) = gpu_or_skip("mhc_pre::graph_replay") else { return };
    let mut rng = fresh_rng("mhc_pre::graph_replay");
    let bits = |o: &Outputs| {
        (
            o.x_res.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            o.x_layer.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            o.h_post.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        )
    };
    let shapes = [(1, 4, 1280), (2, 4, 1920), (4, 4, 2560), (3, 3, 77), (5, 8, 1030)];
    for (batch, n, c) in shapes {
        let s = MhcPreShape { batch, n, c };
        let l = s.lens().unwrap();
        let st = gpu.stream();
        for (pdl, v5, fixed_point) in [
            (true, false, false),
            (false, false, false),
            (true, true, false),
            (false, true, false),
            (true, true, true),
            (false, true, true),
        ] {
            let direct_config = PreConfig { graph: false, v5, fixed_point, ..PreConfig::default() };
            let mut direct = MhcPre::with_config(&gpu, s, direct_config).unwrap();
            let config = PreConfig { graph: true, pdl, v5, fixed_point, ..PreConfig::default() };
            let mut graphed = MhcPre::with_config(&gpu, s, config).unwrap();
            let mut dphi = st.alloc_zeros::<f32>(l.phi).unwrap();
            let mut dx = st.alloc_zeros::<bf16>(l.x).unwrap();
            let mut db = st.alloc_zeros::<f32>(l.b).unwrap();
            let mut dr = st.alloc_zeros::<bf16>(l.x).unwrap();
            let mut dy = st.alloc_zeros::<bf16>(l.x_layer).unwrap();
            let mut dh = st.alloc_zeros::<f32>(l.h_post).unwrap();
            for round in 0..3 {
                let inp = inputs(&mut rng, s, 1.0 / ((n * c) as f32).sqrt(), 1.0);
                let p = MhcPreParams { sinkhorn_repeat: round, ..MhcPreParams::default() };
                st.memcpy_htod(&inp.phi, &mut dphi).unwrap();
                st.memcpy_htod(&inp.x, &mut dx).unwrap();
                st.memcpy_htod(&inp.b, &mut db).unwrap();
                st.memcpy_htod(&poisoned::<bf16>(l.x), &mut dr).unwrap();
                st.memcpy_htod(&poisoned::<bf16>(l.x_layer), &mut dy).unwrap();
                st.memcpy_htod(&vec![f32::NAN; l.h_post], &mut dh).unwrap();
                // Round 0 captures, round 1 replays (same key), round 2 re-captures (repeat 2).
                for _ in 0..if round == 1 { 2 } else { 1 } {
                    graphed.run(&gpu, p, &dphi, &dx, &db, &mut dr, &mut dy, &mut dh).unwrap();
                }
                let got = Outputs {
                    x_res: st.clone_dtoh(&dr).unwrap(),
                    x_layer: st.clone_dtoh(&dy).unwrap(),
                    h_post: st.clone_dtoh(&dh).unwrap(),
                };
                let want = run(&gpu, &mut direct, p, &inp);
                check(
                    &format!("{s:?} graph pdl {pdl} v5 {v5} v8 {fixed_point} round {round}"),
                    &got,
                    &mhc_pre_fwd(s, p, &inp.phi, &inp.x, &inp.b),
                );
                assert!(
                    bits(&got) == bits(&want),
                    "{s:?} pdl {pdl} v5 {v5} v8 {fixed_point} round {round}: graph differs from direct launches"
                );
            }
            // New buffers: a new key, a new capture.
            let inp = inputs(&mut rng, s, 1.0, 1.0);
            let p = MhcPreParams::default();
            let got = run(&gpu, &mut graphed, p, &inp);
            assert!(bits(&got) == bits(&run(&gpu, &mut direct, p, &inp)), "{s:?}: re-captured graph differs");
        }
    }
}

#[test]
fn every_launch_config_matches_reference() {
    let Some(gpu) = gpu_or_skip("mhc_pre::every_launch_config") else { return };
    let mut rng = fresh_rng("mhc_pre::every_launch_config");
    for s in [
        MhcPreShape { batch: 4, n: 4, c: 2560 },
        MhcPreShape { batch: 9, n: 8, c: 1030 },
        MhcPreShape { batch: 11, n: 6, c: 1030 },
        MhcPreShape { batch: 3, n: 3, c: 77 },
    ] {
        let inp = inputs(&mut rng, s, 1.0 / ((s.n * s.c) as f32).sqrt(), 1.0);
        let p = MhcPreParams { sinkhorn_repeat: 3, ..MhcPreParams::default() };
        let r = mhc_pre_fwd(s, p, &inp.phi, &inp.x, &inp.b);
        for block in [32, 64, 128, 256, 512, 1024] {
            for max_grid in [None, Some(1), Some(7), Some(64)] {
                for mix_block in [32, 96, 256, 1024] {
                    let pdl = block != 64; // both launch modes of kernel 2
                                           // Both kernel-1 versions (tensor-core where n ≤ 4, FMA), every block size.
                    let (mma_partials, mma_block) = (block != 256, block.min(512));
                    // Both kernel-2 versions where n ≤ 4 (lean `mhc_pre_mix4`, v2 `mhc_pre_mix`).
                    let lean_mix = max_grid != Some(7);
                    // Kernel 1 (tensor cores) alone and in clusters of 2–16 blocks.
                    let partial_cluster = match mix_block {
                        32 => 1,
                        96 => 16,
                        256 => 8,
                        _ => 2,
                    };
                    // The v5 pair (block-major partials, mhc_pre_mix5) on two of the kernel-1 blocks.
                    let v5 = block == 128 || block == 512;
                    let config = PreConfig {
                        v5,
                        lean_mix,
                        partial_cluster,
                        path: PrePath::TwoLaunch,
                        block,
                        max_grid,
                        mix_block,
                        pdl,
                        mma_partials,
                        mma_block,
                        ..PreConfig::default()
                    };
                    let mut op = match MhcPre::with_config(&gpu, s, config) {
                        Ok(op) => op,
                        // 1024 threads may exceed the register file: a clean error, no launch.
                        Err(Error::Shape { arg: "config.block", .. }) if block == 1024 => continue,
                        Err(Error::Shape { arg: "config.mix_block", .. }) if mix_block == 1024 => continue,
                        Err(e) => panic!("{s:?} {config:?}: {e}"),
                    };
                    let out = run(&gpu, &mut op, p, &inp);
                    check(&format!("{s:?} {config:?}"), &out, &r);
                }
            }
        }
        // v6, one cooperative launch: block sizes and grids (n ≤ 4; else the v5 pair or v4).
        for mma_block in [32, 96, 256, 512] {
            for max_grid in [None, Some(1), Some(7), Some(64), Some(132)] {
                let config = PreConfig { coop: true, mma_block, max_grid, ..PreConfig::default() };
                let mut op = MhcPre::with_config(&gpu, s, config).unwrap();
                let out = run(&gpu, &mut op, p, &inp);
                check(&format!("{s:?} {config:?} {:?}", op.plan().geometry.coop), &out, &r);
            }
        }
        // v8, fixed-point sums: kernel-1 grids and blocks, kernel-2 blocks, with and without PDL.
        for mma_block in [32, 96, 256, 512] {
            for max_grid in [None, Some(1), Some(7), Some(64), Some(132)] {
                for (mix_block, pdl) in [(32, true), (256, false), (1024, true)] {
                    let config =
                        PreConfig { fixed_point: true, mma_block, max_grid, mix_block, pdl, ..PreConfig::default() };
                    let mut op = match MhcPre::with_config(&gpu, s, config) {
                        Ok(op) => op,
                        Err(Error::Shape { arg: "config.mix_block", .. }) if mix_block == 1024 => continue,
                        Err(e) => panic!("{s:?} {config:?}: {e}"),
                    };
                    // Fixed-point sums wherever the v5 pair applies (n ≤ 4, kernel 1's slab fits).
                    assert_eq!(op.plan().geometry.fx, op.plan().geometry.v5, "{s:?} {config:?}");
                    for call in 0..2 {
                        let out = run(&gpu, &mut op, p, &inp);
                        check(&format!("{s:?} {config:?} call {call}"), &out, &r);
                    }
                }
            }
        }
        // The one-launch path: cluster sizes, batch rows per cluster, block sizes.
        for cluster in [1, 2, 3, 4, 8, 16] {
            for batch_per_cluster in [0, 1, 2, 3] {
                for fused_block in [32, 96, 512, 1024] {
                    let config = PreConfig {
                        path: PrePath::Fused,
                        cluster,
                        batch_per_cluster,
                        fused_block,
                        ..PreConfig::default()
                    };
                    let mut op = match MhcPre::with_config(&gpu, s, config) {
                        Ok(op) => op,
                        Err(Error::Shape { arg: "config.fused_block", .. }) if fused_block > 512 => continue,
                        Err(Error::Shape { arg: "n", .. }) if s.n > 4 => continue,
                        // A block's phi slab does not fit shared memory with few blocks per cluster.
                        Err(Error::Shape { arg: "c", .. }) if cluster < 16 => continue,
                        Err(e) => panic!("{s:?} {config:?}: {e}"),
                    };
                    let out = run(&gpu, &mut op, p, &inp);
                    check(&format!("{s:?} {config:?} {:?}", op.plan().fused), &out, &r);
                }
            }
        }
    }
}

/// The raw entry with a caller-owned workspace: for the partials pair, full of garbage (NaN
/// bits, then the previous call's partials) — the first kernel overwrites every word the second
/// reads, so no reset is needed; for the fixed-point pair, zeroed once and then left to the
/// kernels across five calls. Also: a short or misaligned workspace is an error before any
/// launch, and the word past the workspace is never written.
#[test]
fn raw_entry_with_a_dirty_workspace() {
    use rgk::cudarc::driver::{DevicePtr, DevicePtrMut};
    let Some(gpu) = gpu_or_skip("mhc_pre::raw_entry_with_a_dirty_workspace") else { return };
    let mut rng = fresh_rng("mhc_pre::raw_entry_with_a_dirty_workspace");
    let s = MhcPreShape { batch: 2, n: 4, c: 1920 };
    for fixed_point in [false, true] {
        let two = PreConfig { path: PrePath::TwoLaunch, fixed_point, ..PreConfig::default() };
        let plan = rgk::mhc::PrePlan::new(&gpu, s, two).unwrap();
        assert_eq!(plan.geometry.fx, fixed_point);
        let l = s.lens().unwrap();
        let st = gpu.stream();
        // Scratch partials: garbage is fine. Fixed-point accumulators: zero before the first call.
        let mut init = vec![if fixed_point { 0 } else { u64::MAX }; plan.geometry.workspace + 1];
        *init.last_mut().unwrap() = u64::MAX;
        let mut ws = st.clone_htod(&init).unwrap();
        for call in 0..5 {
            let inp = inputs(&mut rng, s, 1.0, 1.0);
            let p = MhcPreParams::default();
            let (dphi, dx, db) =
                (st.clone_htod(&inp.phi).unwrap(), st.clone_htod(&inp.x).unwrap(), st.clone_htod(&inp.b).unwrap());
            let mut dr = st.clone_htod(&poisoned::<bf16>(l.x)).unwrap();
            let mut dy = st.clone_htod(&poisoned::<bf16>(l.x_layer)).unwrap();
            let mut dh = st.clone_htod(&vec![f32::NAN; l.h_post]).unwrap();
            {
                let (a, _ga) = dphi.device_ptr(st);
                let (b, _gb) = dx.device_ptr(st);
                let (c, _gc) = db.device_ptr(st);
                let (d, _gd) = dr.device_ptr_mut(st);
                let (e, _ge) = dy.device_ptr_mut(st);
                let (f, _gf) = dh.device_ptr_mut(st);
                let wl = ws.len() - 1;
                let (w, _gw) = ws.device_ptr_mut(st);
                unsafe { rgk::mhc::pre_fwd_raw(&gpu, &plan, p, a, b, c, d, e, f, w, wl, st.cu_stream()) }.unwrap();
                let short =
                    unsafe { rgk::mhc::pre_fwd_raw(&gpu, &plan, p, a, b, c, d, e, f, w, wl - 1, st.cu_stream()) };
                assert!(matches!(short, Err(Error::BufferTooSmall { arg: "workspace", .. })), "{short:?}");
                let odd = unsafe { rgk::mhc::pre_fwd_raw(&gpu, &plan, p, a, b, c, d, e, f, w + 4, wl, st.cu_stream()) };
                assert!(matches!(odd, Err(Error::Shape { arg: "workspace", .. })), "{odd:?}");
            }
            let out = Outputs {
                x_res: st.clone_dtoh(&dr).unwrap(),
                x_layer: st.clone_dtoh(&dy).unwrap(),
                h_post: st.clone_dtoh(&dh).unwrap(),
            };
            check(&format!("v8 {fixed_point} call {call}"), &out, &mhc_pre_fwd(s, p, &inp.phi, &inp.x, &inp.b));
        }
        // The word past the workspace is never touched.
        let tail: Vec<u64> = st.clone_dtoh(&ws.slice(plan.geometry.workspace..)).unwrap();
        assert_eq!(tail, [u64::MAX], "the kernels wrote past the workspace");
    }
}

#[test]
fn bad_input_is_an_error_naming_the_argument() {
    // Shape and parameter errors need no GPU.
    let shape_err = |r: rgk::Result<MhcPreShape>, arg: &str| match r {
        Err(Error::Shape { arg: a, .. }) => assert_eq!(a, arg),
        other => panic!("expected Shape({arg}), got {other:?}"),
    };
    shape_err(MhcPreShape::from_phi(1, 5120, 23), "phi");
    shape_err(MhcPreShape::from_phi(1, 5121, 24), "phi");
    shape_err(MhcPreShape::from_phi(1, 0, 24), "phi");
    shape_err(MhcPreShape::from_phi(0, 5120, 24), "batch");
    assert_eq!(MhcPreShape::from_phi(3, 5120, 24).unwrap(), MhcPreShape { batch: 3, n: 4, c: 1280 });
    for n in 1..40 {
        assert_eq!(MhcPreShape::from_phi(1, 7 * n, n * n + 2 * n).unwrap(), MhcPreShape { batch: 1, n, c: 7 });
    }
    for (s, arg) in [
        (MhcPreShape { batch: 0, n: 4, c: 8 }, "batch"),
        (MhcPreShape { batch: 1, n: 0, c: 8 }, "n"),
        (MhcPreShape { batch: 1, n: 4, c: 0 }, "c"),
        (MhcPreShape { batch: 1, n: 4, c: 1 << 30 }, "phi"),
        (MhcPreShape { batch: 1 << 20, n: 4, c: 1 << 12 }, "x"),
    ] {
        match s.lens() {
            Err(Error::Shape { arg: a, .. }) | Err(Error::Overflow { arg: a, .. }) => assert_eq!(a, arg, "{s:?}"),
            other => panic!("{s:?}: expected an error naming {arg}, got {other:?}"),
        }
    }
    let geo = |block| {
        PreGeometry::new(
            MhcPreShape { batch: 1, n: 4, c: 64 },
            132,
            227 * 1024,
            PreConfig { block, ..PreConfig::default() },
        )
    };
    for block in [0, 48, 2048] {
        assert!(matches!(geo(block), Err(Error::Shape { arg: "config.block", .. })), "block {block}");
        if block == 0 {
            // mix_block 0 is the rule (256 for the fixed-point pair, else 512), not an error.
            let g = |fixed_point| {
                let config = PreConfig { mix_block: 0, fixed_point, ..PreConfig::default() };
                PreGeometry::new(MhcPreShape { batch: 1, n: 4, c: 64 }, 132, 227 * 1024, config).unwrap().mix_block
            };
            assert_eq!((g(true), g(false)), (256, 512));
            continue;
        }
        let g = PreGeometry::new(
            MhcPreShape { batch: 1, n: 4, c: 64 },
            132,
            227 * 1024,
            PreConfig { mix_block: block, ..PreConfig::default() },
        );
        assert!(matches!(g, Err(Error::Shape { arg: "config.mix_block", .. })), "mix_block {block}");
    }
    let huge_n = PreGeometry::new(MhcPreShape { batch: 1, n: 200, c: 1 }, 132, 227 * 1024, PreConfig::default());
    assert!(matches!(huge_n, Err(Error::Shape { arg: "n", .. })), "{huge_n:?}");
    for (p, arg) in [
        (MhcPreParams { sinkhorn_eps: 0.0, ..MhcPreParams::default() }, "sinkhorn_eps"),
        (MhcPreParams { sinkhorn_eps: -1.0, ..MhcPreParams::default() }, "sinkhorn_eps"),
        (MhcPreParams { sinkhorn_eps: f32::NAN, ..MhcPreParams::default() }, "sinkhorn_eps"),
        (MhcPreParams { alpha_pre: f32::INFINITY, ..MhcPreParams::default() }, "alpha_pre"),
        (MhcPreParams { alpha_post: f32::NAN, ..MhcPreParams::default() }, "alpha_post"),
        (MhcPreParams { alpha_res: f32::NEG_INFINITY, ..MhcPreParams::default() }, "alpha_res"),
    ] {
        match p.validate() {
            Err(Error::Shape { arg: a, .. }) => assert_eq!(a, arg),
            other => panic!("{p:?}: expected Shape({arg}), got {other:?}"),
        }
    }

    let Some(gpu) = gpu_or_skip("mhc_pre::bad_input") else { return };
    let s = MhcPreShape { batch: 2, n: 4, c: 16 };
    let l = s.lens().unwrap();
    let st = gpu.stream();
    let mut op = MhcPre::new(&gpu, s).unwrap();
    let p = MhcPreParams::default();
    let phi = st.alloc_zeros::<f32>(l.phi).unwrap();
    let x = st.alloc_zeros::<bf16>(l.x).unwrap();
    let b = st.alloc_zeros::<f32>(l.b).unwrap();
    let mut r = st.alloc_zeros::<bf16>(l.x).unwrap();
    let mut y = st.alloc_zeros::<bf16>(l.x_layer).unwrap();
    let mut h = st.alloc_zeros::<f32>(l.h_post).unwrap();
    let phi_s = st.alloc_zeros::<f32>(l.phi - 1).unwrap();
    let x_s = st.alloc_zeros::<bf16>(l.x - 1).unwrap();
    let b_s = st.alloc_zeros::<f32>(l.b - 1).unwrap();
    let mut r_s = st.alloc_zeros::<bf16>(l.x - 1).unwrap();
    let mut y_s = st.alloc_zeros::<bf16>(l.x_layer - 1).unwrap();
    let mut h_s = st.alloc_zeros::<f32>(l.h_post - 1).unwrap();
    let expect = |res: rgk::Result<()>, arg: &str| match res {
        Err(Error::BufferTooSmall { arg: a, .. }) => assert_eq!(a, arg),
        other => panic!("expected BufferTooSmall({arg}), got {other:?}"),
    };
    expect(op.run(&gpu, p, &phi_s, &x, &b, &mut r, &mut y, &mut h), "phi");
    expect(op.run(&gpu, p, &phi, &x_s, &b, &mut r, &mut y, &mut h), "x");
    expect(op.run(&gpu, p, &phi, &x, &b_s, &mut r, &mut y, &mut h), "b");
    expect(op.run(&gpu, p, &phi, &x, &b, &mut r_s, &mut y, &mut h), "x_res");
    expect(op.run(&gpu, p, &phi, &x, &b, &mut r, &mut y_s, &mut h), "x_layer");
    expect(op.run(&gpu, p, &phi, &x, &b, &mut r, &mut y, &mut h_s), "h_post");
    let bad = MhcPreParams { sinkhorn_eps: 0.0, ..p };
    assert!(matches!(
        op.run(&gpu, bad, &phi, &x, &b, &mut r, &mut y, &mut h),
        Err(Error::Shape { arg: "sinkhorn_eps", .. })
    ));
    op.run(&gpu, p, &phi, &x, &b, &mut r, &mut y, &mut h).unwrap();
    st.synchronize().unwrap();
}

// ------------------------------------------------------------------ CPU model of the kernels

const BT: usize = 4;
const UN: usize = 8;

fn exp_le1(d: f64) -> f32 {
    const MAGIC: f64 = 6755399441055744.0;
    let t = d * std::f64::consts::LOG2_E;
    if t < -160.0 {
        return 0.0;
    }
    let kf = (t + MAGIC) - MAGIC;
    let p = 2f64.powf((t - kf) as f32 as f64) as f32; // ex2.approx, here correctly rounded
    let k = kf as i32;
    if k >= -126 {
        p * f32::from_bits(((k + 127) as u32) << 23)
    } else {
        (p * f32::from_bits(((k + 64 + 127) as u32) << 23)) * f32::from_bits((127 - 64) << 23)
    }
}

fn sigmoid(z: f64) -> f32 {
    let e = exp_le1(if z >= 0.0 { -z } else { z });
    if z >= 0.0 {
        1.0 / (1.0 + e)
    } else {
        e / (1.0 + e)
    }
}

/// Kernel 1 (`mhc_pre_partial`), block by block and thread by thread: returns the workspace
/// `part[(β·mq + q)·G + g]`. Asserts that the split-K walk reads every (β, phi row, column)
/// exactly once and that every workspace word is written exactly once.
fn model_partial(s: MhcPreShape, geo: PreGeometry, inp: &Inputs) -> Vec<f64> {
    let MhcPreShape { batch, n, c } = s;
    let (grid, nt, cols, jc, bg) =
        (geo.grid as usize, geo.block as usize, geo.cols as usize, geo.jc as usize, geo.bg as usize);
    let m = n * n + 2 * n;
    let mq = m + 1;
    let q_all = batch * mq;
    let mut reads = vec![0u8; batch * n * c * mq]; // (β, phi row, col incl. the x² column)
    let mut part_ws = vec![f64::NAN; q_all * grid];
    let mut written = vec![0u8; q_all * grid];
    let ngroups = batch.div_ceil(bg);
    let mc = mq.min(nt);
    let slots = nt / mc;
    assert!(bg <= BT && grid * cols >= c && (grid - 1) * cols < c && jc <= cols && bg * n * jc <= 1 << 16);
    assert_eq!(geo.smem as usize, rgk::mhc::pre_partial_smem_bytes(nt, bg, n, jc));
    for g in 0..grid {
        let j0 = g * cols;
        let jb = cols.min(c - j0);
        for gi in 0..ngroups {
            let b0 = gi * bg;
            let bga = bg.min(batch - b0);
            let mut part = vec![0f64; bga * mq];
            for jc0 in (0..jb).step_by(jc) {
                let jca = jc.min(jb - jc0);
                let rows = n * jca;
                // The kernel's staging steps (row, jj) by (nt / jca, nt % jca) per element.
                for t in 0..nt {
                    let (mut row, mut jj) = (t / jca, t % jca);
                    for e in (t..bga * n * jca).step_by(nt) {
                        assert_eq!((row, jj), (e / jca, e % jca));
                        row += nt / jca;
                        jj += nt % jca;
                        if jj >= jca {
                            jj -= jca;
                            row += 1;
                        }
                    }
                }
                // staged x: xs[(βl·n + k)·jca + jj]
                let xs: Vec<f32> = (0..bga * n * jca)
                    .map(|e| {
                        let (row, jj) = (e / jca, e % jca);
                        inp.x[(b0 * n + row) * c + j0 + jc0 + jj].to_f32()
                    })
                    .collect();
                for qc0 in (0..mq).step_by(mc) {
                    let mca = mc.min(mq - qc0);
                    let mut red = vec![[0f64; BT]; nt];
                    for (t, acc) in red.iter_mut().enumerate() {
                        let (pp, cl) = (t / mc, t % mc);
                        if pp >= slots || cl >= mca {
                            continue;
                        }
                        let col = qc0 + cl;
                        let (dk, djj) = (slots / jca, slots % jca);
                        let (mut rho, mut k, mut jj) = (pp, pp / jca, pp % jca);
                        while rho < rows {
                            assert_eq!(rho, k * jca + jj);
                            for (bl, a) in acc.iter_mut().enumerate().take(bga) {
                                let xv = xs[bl * rows + rho];
                                let w = if col == m { xv } else { inp.phi[(k * c + j0 + jc0 + jj) * m + col] };
                                *a = (w as f64).mul_add(xv as f64, *a);
                                reads[(((b0 + bl) * n * c) + k * c + j0 + jc0 + jj) * mq + col] += 1;
                            }
                            rho += slots;
                            jj += djj;
                            k += dk;
                            if jj >= jca {
                                jj -= jca;
                                k += 1;
                            }
                        }
                    }
                    for bl in 0..bga {
                        for cc in 0..mca {
                            let mut sum = part[bl * mq + qc0 + cc];
                            for pp in 0..slots {
                                sum += red[pp * mc + cc][bl];
                            }
                            part[bl * mq + qc0 + cc] = sum;
                        }
                    }
                }
            }
            for i in 0..bga * mq {
                part_ws[(b0 * mq + i) * grid + g] = part[i];
                written[(b0 * mq + i) * grid + g] += 1;
            }
        }
    }
    assert!(reads.iter().all(|&r| r == 1), "the split-K walk must read every (β, row, column) exactly once");
    assert!(written.iter().all(|&w| w == 1), "every workspace word must be written exactly once");
    part_ws
}

/// Kernel 2 (`mhc_pre_mix`), block by block: the partial reduction in the kernel's order
/// (thread (q, s) sums g = s, s+S, …; then the S slices in order), the coefficients, the
/// mixing. Asserts that each block reads all of its β's partials once and its x tile once,
/// that every x element is read by exactly one block, and every output is written once.
fn model_mix(s: MhcPreShape, p: MhcPreParams, geo: PreGeometry, inp: &Inputs, part_ws: &[f64]) -> Outputs {
    let MhcPreShape { batch, n, c } = s;
    let (grid1, mb, jt, tiles) = (geo.grid as usize, geo.mix_block as usize, geo.jt as usize, geo.tiles as usize);
    let ls = geo.slices_log2 as usize;
    let slices = 1usize << ls;
    let m = n * n + 2 * n;
    let mq = m + 1;
    let nn = n * n;
    assert!(n * jt <= UN * mb && jt <= mb && tiles * jt >= c && (tiles - 1) * jt < c);
    assert!(slices <= 32 && slices <= grid1.next_power_of_two() && (mq * slices <= mb || slices == 1));
    assert_eq!(geo.mix_smem as usize, rgk::mhc::pre_mix_smem_bytes(slices, n, jt));
    assert_eq!(geo.workspace, batch * mq * grid1);
    let mut out = Outputs {
        x_res: vec![bf16::NAN; batch * n * c],
        x_layer: vec![bf16::NAN; batch * c],
        h_post: vec![f32::NAN; batch * n],
    };
    let mut writes = vec![0u8; batch * n * c + batch * c + batch * n];
    let mut xreads = vec![0u8; batch * n * c];
    let inv_sqrt_nc = 1.0 / ((n * c) as f64).sqrt();
    let eps = p.sinkhorn_eps;
    for b in 0..batch * tiles {
        let (beta, tile) = (b / tiles, b % tiles);
        let col0 = tile * jt;
        let jta = jt.min(c - col0);
        // Prologue: thread t loads elements e = t + u·T (u < UN) of the tile: all of them.
        let mut xs = vec![f32::NAN; n * jta];
        for t in 0..mb {
            for u in 0..UN {
                let e = t + u * mb;
                if e < n * jta {
                    let (k, jj) = (e / jta, e % jta);
                    let i = beta * n * c + k * c + col0 + jj;
                    xs[e] = inp.x[i].to_f32();
                    xreads[i] += 1;
                }
            }
        }
        assert!(xs.iter().all(|v| !v.is_nan()), "the tile's x must be staged completely");
        // Partial reduction.
        let mut preads = vec![0u8; mq * grid1];
        let mut red = vec![f64::NAN; mq * slices];
        for i in 0..mq * slices {
            let (q, sl) = (i >> ls, i & (slices - 1));
            let mut acc = 0f64;
            for g in (sl..grid1).step_by(slices) {
                acc += part_ws[(beta * mq + q) * grid1 + g];
                preads[q * grid1 + g] += 1;
            }
            red[i] = acc;
        }
        assert!(preads.iter().all(|&r| r == 1), "each block reads each of its partials once");
        let tot: Vec<f64> = (0..mq).map(|q| (0..slices).fold(0f64, |a, sl| a + red[q * slices + sl])).collect();
        // Coefficients.
        let r = tot[m].sqrt() * inv_sqrt_nc + 1e-4;
        let mut hs = vec![0f32; n];
        let mut zr = vec![0f64; nn];
        for e in 0..m {
            let a = if e < n {
                p.alpha_pre
            } else if e < 2 * n {
                p.alpha_post
            } else {
                p.alpha_res
            };
            let z = a as f64 * tot[e] / r + inp.b[e] as f64;
            if e < n {
                hs[e] = sigmoid(z);
            } else if e < 2 * n {
                if tile == 0 {
                    out.h_post[beta * n + e - n] = 2.0 * sigmoid(z);
                    writes[batch * n * c + batch * c + beta * n + e - n] += 1;
                }
            } else {
                zr[e - 2 * n] = z;
            }
        }
        let mut ra: Vec<f32> = (0..nn)
            .map(|e| {
                let row = &zr[(e / n) * n..(e / n + 1) * n];
                let zmax = row.iter().skip(1).fold(row[0], |a, &v| if v > a { v } else { a });
                exp_le1(zr[e] - zmax)
            })
            .collect();
        for _ in 0..p.sinkhorn_repeat {
            let rb: Vec<f32> = (0..nn)
                .map(|e| {
                    let i = e / n;
                    let sum = (0..n).fold(0f32, |a, k| a + ra[i * n + k]);
                    ra[e] / (sum + eps)
                })
                .collect();
            ra = (0..nn)
                .map(|e| {
                    let k = e % n;
                    let sum = (0..n).fold(0f32, |a, ii| a + rb[ii * n + k]);
                    rb[e] / (sum + eps)
                })
                .collect();
        }
        // Mixing.
        for jj in 0..jta {
            let col = col0 + jj;
            let y = (0..n).fold(0f32, |a, k| hs[k].mul_add(xs[k * jta + jj], a));
            out.x_layer[beta * c + col] = bf16::from_f32(y);
            writes[batch * n * c + beta * c + col] += 1;
            for i in 0..n {
                let v = (0..n).fold(0f32, |a, k| ra[i * n + k].mul_add(xs[k * jta + jj], a));
                out.x_res[(beta * n + i) * c + col] = bf16::from_f32(v);
                writes[(beta * n + i) * c + col] += 1;
            }
        }
    }
    assert!(xreads.iter().all(|&v| v == 1), "kernel 2 reads every x element exactly once");
    assert!(writes.iter().all(|&v| v == 1), "every output is written exactly once");
    out
}

#[test]
fn cpu_model_of_the_kernels_covers_and_matches_reference() {
    let mut rng = fresh_rng("mhc_pre::cpu_model");
    // (shape, SMs, block, mix_block): several groups, several staged tiles (sms small),
    // q-chunks (mq > block), slices S from 1 to 32, partial last tiles, mq > mix_block.
    let cases = [
        (MhcPreShape { batch: 1, n: 4, c: 1280 }, 132, 256, 256),
        (MhcPreShape { batch: 2, n: 4, c: 1920 }, 132, 256, 256),
        (MhcPreShape { batch: 4, n: 4, c: 2560 }, 132, 256, 256),
        (MhcPreShape { batch: 5, n: 3, c: 7 }, 132, 256, 1024),
        (MhcPreShape { batch: 9, n: 8, c: 4099 }, 3, 64, 96),
        (MhcPreShape { batch: 2, n: 1, c: 1 }, 132, 32, 32),
        (MhcPreShape { batch: 3, n: 2, c: 97 }, 5, 96, 64),
        (MhcPreShape { batch: 6, n: 16, c: 40 }, 4, 256, 256),
        (MhcPreShape { batch: 2, n: 16, c: 300 }, 132, 1024, 32),
        (MhcPreShape { batch: 33, n: 1, c: 5000 }, 132, 128, 1024),
    ];
    let mut worst = (0f64, 0f64);
    for (s, sms, block, mix_block) in cases {
        // The model mirrors the v2 kernel 2 (`mhc_pre_mix`); the lean `mhc_pre_mix4` is judged on the GPU.
        let config = PreConfig { block, mix_block, lean_mix: false, partial_cluster: 1, ..PreConfig::default() };
        let geo = PreGeometry::new(s, sms, 227 * 1024, config).unwrap();
        for (phi_scale, repeat) in [(1.0, 1), (1.0 / ((s.n * s.c) as f32).sqrt(), 20), (0.3, 0)] {
            let inp = inputs(&mut rng, s, phi_scale, 1.0);
            let p = MhcPreParams { sinkhorn_repeat: repeat, alpha_res: 1.3, ..MhcPreParams::default() };
            let part = model_partial(s, geo, &inp);
            let out = model_mix(s, p, geo, &inp, &part);
            let r = mhc_pre_fwd(s, p, &inp.phi, &inp.x, &inp.b);
            worst = worse(worst, check(&format!("model {s:?} {geo:?} repeat {repeat}"), &out, &r));
        }
    }
    println!("CPU model: worst {:.3} ulp, {:.3} of the tolerance", worst.0, worst.1);
}

/// The geometry's invariants (the kernels' preconditions) over many shapes and configurations.
#[test]
fn geometry_invariants() {
    for n in [1, 2, 3, 4, 8, 16, 31] {
        for c in [1, 2, 7, 100, 1280, 2560, 4099, 70000] {
            for batch in [1, 3, 4, 5, 32] {
                for (sms, block, mix_block) in [(132, 256, 256), (3, 32, 32), (132, 1024, 1024), (64, 96, 160)] {
                    let s = MhcPreShape { batch, n, c };
                    let config = PreConfig { block, mix_block, max_grid: None, ..PreConfig::default() };
                    let Ok(g) = PreGeometry::new(s, sms, 227 * 1024, config) else { continue };
                    let (grid, cols, jt, tiles) = (g.grid as usize, g.cols as usize, g.jt as usize, g.tiles as usize);
                    let mq = n * n + 2 * n + 1;
                    assert!(
                        grid >= 1 && grid <= sms.min(256) && grid * cols >= c && (grid - 1) * cols < c,
                        "{s:?} {g:?}"
                    );
                    assert!(g.jc as usize <= cols && g.bg >= 1 && g.bg as usize <= BT.min(batch), "{s:?} {g:?}");
                    assert!((g.bg as usize) * n * (g.jc as usize) <= 1 << 16, "{s:?} {g:?}");
                    assert!(jt >= 1 && jt <= mix_block as usize && n * jt <= UN * mix_block as usize, "{s:?} {g:?}");
                    assert!(tiles * jt >= c && (tiles - 1) * jt < c, "{s:?} {g:?}");
                    // Kernel 1's clusters: a power of two ≤ 16 dividing the grid, only on tensor cores.
                    let k = g.k1_cluster as usize;
                    assert!(k.is_power_of_two() && k <= 16 && grid % k == 0, "{s:?} {g:?}");
                    assert!(k == 1 || g.mma.is_some(), "{s:?} {g:?}");
                    let sl = 1usize << g.slices_log2;
                    assert!(sl <= 32 && sl <= grid && (mq * sl <= mix_block as usize || sl == 1), "{s:?} {g:?}");
                    assert!(g.smem <= 227 * 1024 && g.mix_smem <= 227 * 1024);
                    if g.fx {
                        // v8: two halves of 5 words per (batch row, logit), then the epoch word.
                        assert!(g.v5 && g.mma.is_some(), "{s:?} {g:?}");
                        assert_eq!(g.workspace, 2 * batch * (mq - 1) * rgk::mhc::FX_WORDS + 1);
                    } else {
                        assert_eq!(g.workspace, batch * mq * grid);
                    }
                }
            }
        }
    }
}

/// The lane → logit map of `mhc_pre_mix4` / `mhc_pre_mix5` (the kernels' `mix4_logit`).
fn mix4_logit(l: usize, n: usize) -> Option<usize> {
    match l {
        0..=3 if l < n => Some(l),
        4..=7 if l - 4 < n => Some(n + l - 4),
        16..=31 if (l - 16) / 4 < n && (l - 16) % 4 < n => Some(2 * n + (l - 16) / 4 * n + (l - 16) % 4),
        _ => None,
    }
}

/// The v5 pair's workspace indices, mirrored from the kernels: `mhc_pre_partial_mma5` writes
/// every word `(g·batch + β)·(m+1) + q` exactly once (slot-sum thread `i` of y-block `by`, item
/// `i/4`), and every block of `mhc_pre_mix5` reads, for each logit (one lane each), the partial
/// of every kernel-1 block exactly once (warp w, rounds of 8 loads at stride W) — all of them
/// written words; the geometry selects the pair exactly where it applies.
#[test]
fn v5_partial_layout_covers_every_read() {
    const GL5: usize = 8;
    for n in [1, 2, 3, 4] {
        for (batch, c) in [(1, 1280), (2, 1920), (4, 2560), (5, 7), (11, 77), (32, 4099), (9, 1)] {
            for (max_grid, mix_block) in [(None, 512), (Some(64), 32), (Some(7), 96), (Some(32), 1024), (Some(1), 256)]
            {
                let s = MhcPreShape { batch, n, c };
                let config = PreConfig { v5: true, fixed_point: false, max_grid, mix_block, ..PreConfig::default() };
                let g = PreGeometry::new(s, 132, 227 * 1024, config).unwrap();
                if g.mma.is_none() {
                    // One block's slab exceeds shared memory (e.g. grid 1): the FMA kernel 1, no v5.
                    assert!(!g.v5, "{s:?} {g:?}");
                    continue;
                }
                assert!(g.v5 && g.mix4 && g.k1_cluster == 1, "{s:?} {g:?}");
                let (grid, m) = (g.grid as usize, s.logits());
                let mq = m + 1;
                assert!(g.jt as usize == c.min(mix_block as usize) && (g.tiles as usize) * (g.jt as usize) >= c);
                assert!(
                    (g.tiles as usize - 1) * (g.jt as usize) < c && g.mix_smem as usize == 256 + 8 * mix_block as usize
                );
                // Kernel 1: y-blocks of bpc rows, one group of ≤ 8 rows each.
                let (_, _, bpc, groups) = g.mma.unwrap();
                let mut written = vec![0u32; g.workspace];
                for rank in 0..grid {
                    for by in 0..groups as usize {
                        let b0 = by * bpc as usize;
                        let bga = (batch - b0).min(8).min(bpc as usize);
                        let items = bga * mq;
                        for i in (0..4 * items).step_by(4) {
                            written[(rank * batch + b0) * mq + i / 4] += 1;
                        }
                    }
                }
                assert!(
                    written.iter().all(|&w| w == 1),
                    "{s:?} {g:?}: a word written {:?} times",
                    written.iter().max()
                );
                // Kernel 2: every block of row β reads the same words.
                let nw = mix_block as usize / 32;
                for beta in 0..batch {
                    let mut seen = vec![0u32; grid * m];
                    for w in 0..nw {
                        for lane in 0..32 {
                            let Some(e) = mix4_logit(lane, n) else { continue };
                            let mut g0 = w;
                            while g0 < grid {
                                for u in 0..GL5 {
                                    let gi = g0 + u * nw;
                                    if gi < grid {
                                        let idx = beta * mq + e + gi * batch * mq;
                                        assert!(idx < g.workspace && written[idx] == 1);
                                        assert_eq!(idx, (gi * batch + beta) * mq + e);
                                        seen[gi * m + e] += 1;
                                    }
                                }
                                g0 += GL5 * nw;
                            }
                        }
                    }
                    assert!(seen.iter().all(|&v| v == 1), "{s:?} {g:?} β {beta}: partials read ≠ once");
                }
            }
        }
    }
    // Where the pair does not apply, the geometry falls back (n > 4, FMA kernel 1, no lean mix).
    for config in [
        PreConfig { v5: true, mma_partials: false, ..PreConfig::default() },
        PreConfig { v5: true, lean_mix: false, ..PreConfig::default() },
    ] {
        let g = PreGeometry::new(MhcPreShape { batch: 2, n: 4, c: 1920 }, 132, 227 * 1024, config).unwrap();
        assert!(!g.v5, "{g:?}");
    }
    let g = PreGeometry::new(
        MhcPreShape { batch: 2, n: 8, c: 100 },
        132,
        227 * 1024,
        PreConfig { v5: true, ..PreConfig::default() },
    );
    assert!(!g.unwrap().v5);
}

/// The one-launch geometry: columns cover c exactly once, clusters cover the batch, shared
/// memory within the budget (mirrors the kernel's layout), errors name the argument.
#[test]
fn fused_geometry_invariants() {
    const MAX_SMEM: usize = 227 * 1024;
    for n in [1, 2, 3, 4, 6, 8] {
        for c in [1, 2, 7, 100, 1280, 1920, 2560, 4099, 70000] {
            for batch in [1, 2, 4, 5, 32] {
                for (cluster, bpc, block) in [(16, 0, 512), (8, 1, 1024), (3, 2, 256), (1, 3, 96)] {
                    let s = MhcPreShape { batch, n, c };
                    let config =
                        PreConfig { cluster, batch_per_cluster: bpc, fused_block: block, ..PreConfig::default() };
                    let g = match FusedGeometry::new(s, MAX_SMEM, config, cluster) {
                        Ok(g) => g,
                        Err(Error::Shape { arg: "config.fused_block", .. }) => {
                            assert!(block > 512, "{s:?} {config:?}");
                            continue;
                        }
                        Err(Error::Shape { arg: "n", .. }) => {
                            assert!(n > 4, "{s:?} {config:?}");
                            continue;
                        }
                        Err(Error::Shape { arg: "c", .. }) => {
                            let cw = c.div_ceil((cluster as usize).min(c));
                            assert!(
                                rgk::mhc::pre_fused_smem_bytes(block as usize, n, cw) > MAX_SMEM
                                    || 4 * n * cw > 1 << 16
                            );
                            continue;
                        }
                        Err(e) => panic!("{s:?} {config:?}: {e}"),
                    };
                    let (cs, cw) = (g.cluster as usize, g.cw as usize);
                    assert!(cs >= 1 && cs <= cluster as usize && cs * cw >= c && (cs - 1) * cw < c, "{s:?} {g:?}");
                    let got = g.batch_per_cluster as usize;
                    let want = if bpc == 0 { batch.min(8) } else { (bpc as usize).min(batch) };
                    assert!(got == want && g.groups as usize == batch.div_ceil(got), "{s:?} {g:?}");
                    assert!(g.smem as usize <= MAX_SMEM && 8 * n * cw <= 1 << 16, "{s:?} {g:?}");
                    assert!(g.block <= 512 && g.block % 32 == 0);
                }
            }
        }
    }
    // The seed rows fit one cluster of 16 with 512 threads.
    for (batch, c) in SEEDS {
        let s = MhcPreShape { batch, n: 4, c };
        let g = FusedGeometry::new(s, MAX_SMEM, PreConfig::default(), 16).unwrap();
        assert_eq!((g.cluster, g.groups, g.block), (16, 1, 512), "{s:?} {g:?}");
    }
}

/// The reference's Sinkhorn and mixing against a direct matrix formulation.
#[test]
fn reference_matches_a_direct_formulation() {
    let mut rng = fresh_rng("mhc_pre::reference_direct");
    let s = MhcPreShape { batch: 3, n: 4, c: 33 };
    let inp = inputs(&mut rng, s, 0.2, 1.0);
    let p = MhcPreParams { alpha_pre: 0.5, alpha_post: 2.0, alpha_res: 1.5, sinkhorn_repeat: 7, sinkhorn_eps: 0.05 };
    let r = mhc_pre_fwd(s, p, &inp.phi, &inp.x, &inp.b);
    let (n, c, m) = (s.n, s.c, s.logits());
    for beta in 0..s.batch {
        let xb: Vec<f64> = inp.x[beta * n * c..(beta + 1) * n * c].iter().map(|v| v.to_f64()).collect();
        let rr = (xb.iter().map(|v| v * v).sum::<f64>() / (n * c) as f64).sqrt() + 1e-4;
        let h: Vec<f64> = (0..m).map(|q| (0..n * c).map(|i| xb[i] * inp.phi[i * m + q] as f64).sum()).collect();
        assert!((rr - r.r[beta]).abs() < 1e-12 * rr);
        let logit = |q: usize, a: f32| a as f64 * h[q] / rr + inp.b[q] as f64;
        let sig = |v: f64| 1.0 / (1.0 + (-v).exp());
        for k in 0..n {
            assert!((sig(logit(k, p.alpha_pre)) - r.h_pre[beta * n + k]).abs() < 1e-12);
            assert!((2.0 * sig(logit(n + k, p.alpha_post)) - r.h_post.value[beta * n + k]).abs() < 1e-12);
        }
        // Sinkhorn as alternating diagonal scalings of the row-max-shifted exponentials.
        let mut a = vec![vec![0.0; n]; n];
        for (i, row) in a.iter_mut().enumerate() {
            let l: Vec<f64> = (0..n).map(|k| logit(2 * n + i * n + k, p.alpha_res)).collect();
            let mx = l.iter().cloned().fold(f64::MIN, f64::max);
            for k in 0..n {
                row[k] = (l[k] - mx).exp();
            }
        }
        for _ in 0..p.sinkhorn_repeat {
            for row in a.iter_mut() {
                let d = row.iter().sum::<f64>() + p.sinkhorn_eps as f64;
                row.iter_mut().for_each(|v| *v /= d);
            }
            for k in 0..n {
                let d = (0..n).map(|i| a[i][k]).sum::<f64>() + p.sinkhorn_eps as f64;
                (0..n).for_each(|i| a[i][k] /= d);
            }
        }
        for i in 0..n {
            for k in 0..n {
                assert!((a[i][k] - r.res[beta * n * n + i * n + k]).abs() < 1e-12);
            }
            for j in 0..c {
                let v: f64 = (0..n).map(|k| a[i][k] * xb[k * c + j]).sum();
                assert!((v - r.x_res.value[(beta * n + i) * c + j]).abs() < 1e-9);
            }
        }
        // After many iterations the columns sum to 1/(1+eps)-ish and rows to ≤ 1.
        for k in 0..n {
            let col: f64 = (0..n).map(|i| a[i][k]).sum();
            assert!(col < 1.0 && col > 0.8, "column {k} sums to {col}");
        }
    }
}

/// The kernel's multiply-high division is exact on its whole domain (dividends and divisors
/// up to 2^16): exhaustive for divisors ≤ 1100 (mc, slots, thread ids), dense for the rest.
#[test]
fn fastdiv_magic_is_exact() {
    let check = |d: u32, a: u32| {
        let m = rgk::mhc::fastdiv_magic(d);
        assert_eq!(((a as u64 * m) >> 32) as u32, a / d, "{a} / {d}");
    };
    for d in 1..=1100 {
        for a in 0..=1100 {
            check(d, a);
        }
        for a in (0..=1 << 16).step_by(7) {
            check(d, a);
        }
        check(d, 1 << 16);
    }
    for d in (1100..=1 << 16).step_by(13).chain([1 << 14, 1 << 16]) {
        for a in (0..=1 << 16).step_by(97).chain([(1 << 16) - 1, 1 << 16, d - 1, d, (d + 1).min(1 << 16)]) {
            check(d, a);
        }
    }
}

/// Host cost of one call (printed, not asserted: a diagnostic for the notes), direct launches
/// against graph replay, 200 calls each on the same buffers; the last call's outputs are
/// checked against the reference so the loop computes what it claims.
#[test]
fn host_call_cost() {
    let Some(gpu) = gpu_or_skip("mhc_pre::host_call_cost") else { return };
    let mut rng = fresh_rng("mhc_pre::host_call_cost");
    let s = MhcPreShape { batch: 2, n: 4, c: 1920 };
    let l = s.lens().unwrap();
    let st = gpu.stream();
    let inp = inputs(&mut rng, s, 1.0, 1.0);
    let p = MhcPreParams::default();
    let (dphi, dx, db) =
        (st.clone_htod(&inp.phi).unwrap(), st.clone_htod(&inp.x).unwrap(), st.clone_htod(&inp.b).unwrap());
    for graph in [false, true] {
        let mut op = MhcPre::with_config(&gpu, s, PreConfig { graph, ..PreConfig::default() }).unwrap();
        let mut dr = st.clone_htod(&poisoned::<bf16>(l.x)).unwrap();
        let mut dy = st.clone_htod(&poisoned::<bf16>(l.x_layer)).unwrap();
        let mut dh = st.clone_htod(&vec![f32::NAN; l.h_post]).unwrap();
        op.run(&gpu, p, &dphi, &dx, &db, &mut dr, &mut dy, &mut dh).unwrap();
        st.synchronize().unwrap();
        let t0 = std::time::Instant::now();
        for _ in 0..200 {
            op.run(&gpu, p, &dphi, &dx, &db, &mut dr, &mut dy, &mut dh).unwrap();
        }
        let host = t0.elapsed().as_secs_f64() / 200.0;
        st.synchronize().unwrap();
        let wall = t0.elapsed().as_secs_f64() / 200.0;
        println!("graph {graph}: {:.1} µs host per call, {:.1} µs per call to completion", host * 1e6, wall * 1e6);
        let out = Outputs {
            x_res: st.clone_dtoh(&dr).unwrap(),
            x_layer: st.clone_dtoh(&dy).unwrap(),
            h_post: st.clone_dtoh(&dh).unwrap(),
        };
        check(&format!("{s:?} graph {graph}"), &out, &mhc_pre_fwd(s, p, &inp.phi, &inp.x, &inp.b));
    }
}

/// v6 (`mhc_pre_coop`): phase 1's blocks cover the columns exactly once, every phase-2 block
/// mixes a non-empty tile and the tiles of every batch row cover its columns exactly once, the
/// grid holds both phases, shared memory holds phase 1's layout and phase 2's warp sums, the
/// workspace holds every partial plus the barrier word; v6 only where it applies.
#[test]
fn coop_geometry_invariants() {
    use rgk::mhc::pre_fused_smem_bytes;
    for n in [1, 2, 3, 4, 6] {
        for (batch, c) in [(1, 1280), (2, 1920), (4, 2560), (5, 7), (11, 77), (32, 4099), (9, 1), (200, 3), (1, 70000)]
        {
            for (max_grid, block) in [(None, 256), (Some(64), 32), (Some(7), 96), (Some(1), 512), (Some(132), 256)] {
                let s = MhcPreShape { batch, n, c };
                let config = PreConfig { coop: true, max_grid, mma_block: block, ..PreConfig::default() };
                let g = PreGeometry::new(s, 132, 227 * 1024, config).unwrap();
                let Some(cg) = g.coop else {
                    assert!(n > 4 || g.mma.is_none(), "{s:?} {g:?}: v6 refused");
                    continue;
                };
                assert!(n <= 4 && g.mma.is_some());
                let (grid, grid1, cw, tiles, jt) =
                    (cg.grid as usize, cg.grid1 as usize, cg.cw as usize, cg.tiles as usize, cg.jt as usize);
                assert!(cw * (grid1 - 1) < c && c <= cw * grid1, "{s:?} {cg:?}");
                assert!((tiles - 1) * jt < c && c <= tiles * jt, "{s:?} {cg:?}");
                assert_eq!(grid, grid1.max(batch * tiles), "{s:?} {cg:?}");
                assert_eq!(cg.block, block);
                assert!(cg.smem as usize >= pre_fused_smem_bytes(block as usize, n, cw).max(8 * block as usize));
                assert_eq!(g.workspace, batch * (s.logits() + 1) * grid1 + 1, "{s:?} {cg:?}");
                // Phase 2: block g (< batch·tiles) mixes row g mod batch, tile g / batch.
                let mut cover = vec![0u32; batch * c];
                for gi in 0..grid {
                    let (beta, tile) = (gi % batch, gi / batch);
                    if tile * jt >= c {
                        assert!(gi >= batch * tiles);
                        continue;
                    }
                    for col in tile * jt..((tile + 1) * jt).min(c) {
                        cover[beta * c + col] += 1;
                    }
                }
                assert!(cover.iter().all(|&v| v == 1), "{s:?} {cg:?}: a column mixed ≠ once");
            }
        }
    }
    let g = PreGeometry::new(MhcPreShape { batch: 2, n: 4, c: 1920 }, 132, 227 * 1024, PreConfig::default()).unwrap();
    assert!(g.coop.is_none(), "v6 is not the default until measured");
}

/// Diagnostic timeline of the v5 pair (`PreConfig::stamps`): the `_ts` kernels' outputs equal the
/// default kernels' bit for bit, every block's stamps are ordered, and the medians over 25
/// graph replays (L2 flushed before each, as in the bench) of when each step ends, in µs after
/// the first kernel-1 block starts, are printed: kernel 1 (entry, slab staged, MMA done, own
/// last store issued) and
/// kernel 2 (entry, prologue done, `griddepcontrol.wait` returned, partials loaded, logits
/// summed, coefficients broadcast, stores issued).
#[test]
fn v5_stamped_timeline() {
    let Some(gpu) = gpu_or_skip("mhc_pre::v5_stamped_timeline") else { return };
    let mut rng = fresh_rng("mhc_pre::v5_stamped_timeline");
    let st = gpu.stream();
    let mut flush = st.alloc_zeros::<u8>(256 << 20).unwrap();
    for ((batch, c), fixed_point) in SEEDS.into_iter().flat_map(|sc| [(sc, true), (sc, false)]) {
        let s = MhcPreShape { batch, n: 4, c };
        let l = s.lens().unwrap();
        let inp = inputs(&mut rng, s, 1.0, 1.0);
        let p = MhcPreParams::default();
        let cfg = PreConfig { fixed_point, ..PreConfig::default() };
        let mut base = MhcPre::with_config(&gpu, s, cfg).unwrap();
        let want = run(&gpu, &mut base, p, &inp);
        let (k1w, k2w) = base.plan().geometry.stamp_words(batch).expect("the default is the v5 pair");
        let ts = st.alloc_zeros::<u64>(k1w + k2w).unwrap();
        let tsp = {
            use rgk::cudarc::driver::DevicePtr;
            let (ptr, _g) = ts.device_ptr(st);
            ptr
        };
        let mut op = MhcPre::with_config(&gpu, s, PreConfig { stamps: tsp, ..cfg }).unwrap();
        assert_eq!(op.plan().geometry.fx, fixed_point);
        let (dphi, dx, db) =
            (st.clone_htod(&inp.phi).unwrap(), st.clone_htod(&inp.x).unwrap(), st.clone_htod(&inp.b).unwrap());
        let mut dr = st.clone_htod(&poisoned::<bf16>(l.x)).unwrap();
        let mut dy = st.clone_htod(&poisoned::<bf16>(l.x_layer)).unwrap();
        let mut dh = st.clone_htod(&vec![f32::NAN; l.h_post]).unwrap();
        let names = [
            "k1 entry",
            "k1 staged",
            "k1 mma",
            "k1 stored",
            "k2 entry",
            "k2 prologue",
            "k2 wait",
            "k2 partials",
            "k2 logits",
            "k2 coef",
            "k2 stored",
        ];
        let mut cols: Vec<Vec<[f64; 3]>> = vec![Vec::new(); names.len()];
        for call in 0..26 {
            st.memset_zeros(&mut flush).unwrap();
            op.run(&gpu, p, &dphi, &dx, &db, &mut dr, &mut dy, &mut dh).unwrap();
            let v = st.clone_dtoh(&ts).unwrap();
            if call == 0 {
                let got = Outputs {
                    x_res: st.clone_dtoh(&dr).unwrap(),
                    x_layer: st.clone_dtoh(&dy).unwrap(),
                    h_post: st.clone_dtoh(&dh).unwrap(),
                };
                assert!(got.x_res == want.x_res && got.x_layer == want.x_layer, "{s:?}: stamped outputs differ");
                assert!(got.h_post.iter().zip(&want.h_post).all(|(a, b)| a.to_bits() == b.to_bits()), "{s:?}: h_post");
                continue;
            }
            let k1: Vec<&[u64]> = v[..k1w].chunks(4).collect();
            let k2: Vec<&[u64]> = v[k1w..].chunks(8).collect();
            for b in &k1 {
                assert!(b[0] > 0 && b.windows(2).all(|w| w[1] >= w[0]), "{s:?}: kernel-1 stamps {b:?}");
            }
            for b in &k2 {
                assert!(b[0] > 0 && b[..7].windows(2).all(|w| w[1] >= w[0]), "{s:?}: kernel-2 stamps {b:?}");
            }
            let t0 = k1.iter().map(|b| b[0]).min().unwrap();
            let us = |t: u64| (t as f64 - t0 as f64) / 1e3;
            let stat = |it: &mut dyn Iterator<Item = u64>| {
                let mut a: Vec<f64> = it.map(us).collect();
                a.sort_by(f64::total_cmp);
                [a[0], a[a.len() / 2], a[a.len() - 1]]
            };
            for q in 0..4 {
                cols[q].push(stat(&mut k1.iter().map(|b| b[q])));
            }
            for q in 0..7 {
                cols[4 + q].push(stat(&mut k2.iter().map(|b| b[q])));
            }
        }
        println!("{s:?} fixed-point {fixed_point}: k1 {} blocks, k2 {} blocks; µs after the first kernel-1 block's entry (median over 25 calls of min / median / max over blocks)", k1w / 4, k2w / 8);
        for (name, col) in names.iter().zip(&cols) {
            let med = |i: usize| {
                let mut a: Vec<f64> = col.iter().map(|r| r[i]).collect();
                a.sort_by(f64::total_cmp);
                a[a.len() / 2]
            };
            println!("  {name:12} {:7.3} {:7.3} {:7.3}", med(0), med(1), med(2));
        }
        let v = st.clone_dtoh(&ts).unwrap();
        let sms2: Vec<u64> = v[k1w..].chunks(8).map(|b| b[7]).collect();
        println!("  k2 SMs {sms2:?}");
    }
}

/// A CPU mirror of the v8 kernels' limb arithmetic (`fx_add` / `fx_value` in
/// `kernels-gpu/src/mhc/pre.rs`): the four 48-bit limbs of a partial are exact — they add up to
/// the partial truncated toward zero at 2^-64 — and the sum of many partials' limbs converts to
/// their exact (truncated) sum within f64 rounding, whatever the order of the additions.
#[test]
fn fixed_point_limbs_are_exact() {
    fn limbs(v: f64) -> Option<[i64; 4]> {
        let t = v.abs();
        // Not below 2^128, or NaN.
        if t.partial_cmp(&2f64.powi(128)) != Some(std::cmp::Ordering::Less) {
            return None;
        }
        let mut out = [0i64; 4];
        for (k, o) in out.iter_mut().enumerate() {
            let y = t * 2f64.powi(64 - 48 * k as i32);
            let (fl, hi) = (y.floor(), (y * 2f64.powi(-48)).floor());
            let q = fl - hi * 2f64.powi(48);
            assert!((0.0..2f64.powi(48)).contains(&q) && q.fract() == 0.0, "{v:e} limb {k}: {q}");
            *o = if v < 0.0 { -(q as i64) } else { q as i64 };
        }
        Some(out)
    }
    fn value(s: &[i64; 4]) -> f64 {
        (0..4).fold(0.0, |h, k| h + s[k] as f64 * 2f64.powi(48 * k as i32 - 64))
    }
    let mut rng = fresh_rng("mhc_pre::fixed_point_limbs_are_exact");
    use rand::Rng;
    for _ in 0..20000 {
        let e: i32 = rng.random_range(-70..62);
        let v = (rng.random::<f64>() - 0.5) * 2f64.powi(e);
        let l = limbs(v).unwrap();
        // Exact: |v|·2^64 < 2^126 fits u128; the limbs are its base-2^48 digits.
        let want = (v.abs() * 2f64.powi(64)).trunc() as u128;
        assert_eq!(l[3], 0, "{v:e}: |v| < 2^62 has no bits at 2^80 and above");
        let got: u128 = (0..3).map(|k| (l[k].unsigned_abs() as u128) << (48 * k)).sum();
        assert_eq!(got, want, "{v:e}");
        assert!(l.iter().all(|&q| q == 0 || (q < 0) == (v < 0.0)));
    }
    // Sums of 64 partials of mixed signs and magnitudes, in two orders: the same integer sums,
    // the same f64 value, within 2^-53 relative + 64·2^-64 absolute of the exact f64 sum.
    for _ in 0..2000 {
        let parts: Vec<f64> =
            (0..64).map(|_| (rng.random::<f64>() - 0.5) * 2f64.powi(rng.random_range(-40..40))).collect();
        let add = |order: &mut dyn Iterator<Item = &f64>| {
            let mut s = [0i64; 4];
            for &v in order {
                let l = limbs(v).unwrap();
                (0..4).for_each(|k| s[k] = s[k].wrapping_add(l[k]));
            }
            s
        };
        let (a, b) = (add(&mut parts.iter()), add(&mut parts.iter().rev()));
        assert_eq!(a, b);
        let exact: f64 = {
            // Two-sum compensated summation (the reference; 64 terms).
            let (mut s, mut c) = (0f64, 0f64);
            for &v in &parts {
                let t = s + v;
                c += if s.abs() >= v.abs() { (s - t) + v } else { (v - t) + s };
                s = t;
            }
            s + c
        };
        let got = value(&a);
        let tol = 4.0 * f64::EPSILON * parts.iter().map(|v| v.abs()).sum::<f64>() + 64.0 * 2f64.powi(-64);
        assert!((got - exact).abs() <= tol, "{got:e} vs {exact:e}");
    }
    // Non-finite and ≥ 2^128 partials are flagged (the kernel's count word → NaN logit).
    for v in [f64::NAN, f64::INFINITY, -f64::INFINITY, 2f64.powi(128), -3e40] {
        assert!(limbs(v).is_none(), "{v:e}");
    }
}

/// The v8 workspace, mirrored from the kernels: kernel 1's limb adds of every (batch row of its
/// y-block groups, logit) land in one half (`((β·m + q)·FX_WORDS + k`, k < FX_WORDS), its zeroing
/// loop (word `bid·T + t`, stride `blocks·T`) writes every word of the other half exactly once,
/// kernel 2's loads (one logit per lane, both halves) stay inside the halves, and the epoch word
/// is the workspace's last u64 word.
#[test]
fn v8_accumulator_layout() {
    use rgk::mhc::FX_WORDS;
    for n in [1, 2, 3, 4] {
        for (batch, c) in [(1, 1280), (2, 1920), (4, 2560), (5, 7), (11, 77), (32, 4099), (9, 1)] {
            for (max_grid, mma_block) in [(None, 0), (Some(64), 32), (Some(7), 96), (Some(1), 512), (Some(132), 0)] {
                let s = MhcPreShape { batch, n, c };
                let config = PreConfig { max_grid, mma_block, ..PreConfig::default() };
                let g = PreGeometry::new(s, 132, 227 * 1024, config).unwrap();
                assert_eq!(g.fx, g.v5, "{s:?} {g:?}");
                let Some((block, _, bpc, groups)) = g.mma.filter(|_| g.fx) else { continue };
                let m = s.logits();
                let words = batch * m * FX_WORDS;
                assert_eq!(g.workspace, 2 * words + 1, "{s:?} {g:?}");
                // Kernel 1's adds: every (β, q) of every y-block's group, limbs and count word.
                let mut added = vec![0u32; words];
                for by in 0..groups as usize {
                    let b0 = by * bpc as usize;
                    for bl in 0..(batch - b0).min(8).min(bpc as usize) {
                        for q in 0..m {
                            for k in 0..FX_WORDS {
                                added[((b0 + bl) * m + q) * FX_WORDS + k] += 1;
                            }
                        }
                    }
                }
                assert!(added.iter().all(|&a| a == 1), "{s:?} {g:?}: an accumulator no block adds to");
                // Kernel 1's zeroing of the other half, over all grid × groups blocks.
                let (nb, t) = (g.grid as usize * groups as usize, block as usize);
                let mut zeroed = vec![0u32; words];
                for bid in 0..nb {
                    for th in 0..t {
                        let mut i = bid * t + th;
                        while i < words {
                            zeroed[i] += 1;
                            i += nb * t;
                        }
                    }
                }
                assert!(zeroed.iter().all(|&z| z == 1), "{s:?} {g:?}: zeroing misses or repeats a word");
                // Kernel 2: lane logit e of row β reads words (β·m + e)·FX_WORDS + k of both halves.
                for beta in 0..batch {
                    for lane in 0..32 {
                        if let Some(e) = mix4_logit(lane, n) {
                            let hi = words + (beta * m + e) * FX_WORDS + FX_WORDS - 1;
                            assert!(hi < 2 * words, "{s:?} {g:?}");
                        }
                    }
                }
            }
        }
    }
}
