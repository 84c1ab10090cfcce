//! MHCPreFwd (docs/ops.md §2) through its public entry points against the f64 CPU reference:
//! bf16 outputs within 1 ulp of the correctly rounded value (+ the slack of
//! `reference::mhc_pre_fwd_from_logits`), h_post to 1e-5 relative (+ its slack), every element,
//! outputs poisoned first; bitwise determinism; every kernel pair of the tuning table.
//!
//! CPU tests (run everywhere): the planner's classes and geometry invariants; the fixed-point
//! limbs and accumulator layout; validation errors; the reference against an independent
//! formulation. The kernels themselves run on the CPU in `sim/tests/mhc_pre.rs`.
#![allow(clippy::needless_range_loop)] // the direct formulation's matrix index loops
use rand::rngs::StdRng;
use rgk::cudarc::driver::CudaSlice;
use rgk::mhc::{MhcPre, MhcPreInputs, MhcPreOutputs, MhcPreParams, MhcPreShape, Mix, Partials, PreClass, PrePlan};
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
    op.run(gpu, p, pre_in(&dphi, &dx, &db), pre_out(&mut dr, &mut dy, &mut dh)).unwrap();
    Outputs {
        x_res: st.clone_dtoh(&dr).unwrap(),
        x_layer: st.clone_dtoh(&dy).unwrap(),
        h_post: st.clone_dtoh(&dh).unwrap(),
    }
}

const SEEDS: [(usize, usize); 3] = [(1, 1280), (2, 1920), (4, 2560)];

/// Raw launches of `plan` with a caller-owned workspace (zeroed once by the caller and then
/// left to the kernels), poisoned outputs, read back.
fn run_raw(
    gpu: &Gpu,
    plan: &PrePlan,
    ws: &mut rgk::cudarc::driver::CudaSlice<u64>,
    p: MhcPreParams,
    inp: &Inputs,
) -> Outputs {
    use rgk::cudarc::driver::{DevicePtr, DevicePtrMut};
    let l = plan.shape.lens().unwrap();
    let st = gpu.stream();
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
        let wl = ws.len();
        let (w, _gw) = ws.device_ptr_mut(st);
        unsafe { rgk::mhc::pre_fwd_raw(gpu, plan, p, a, b, c, d, e, f, w, wl, st.cu_stream()) }.unwrap();
    }
    Outputs {
        x_res: st.clone_dtoh(&dr).unwrap(),
        x_layer: st.clone_dtoh(&dy).unwrap(),
        h_post: st.clone_dtoh(&dh).unwrap(),
    }
}

fn bits(o: &Outputs) -> (Vec<u16>, Vec<u16>, Vec<u32>) {
    (
        o.x_res.iter().map(|v| v.to_bits()).collect(),
        o.x_layer.iter().map(|v| v.to_bits()).collect(),
        o.h_post.iter().map(|v| v.to_bits()).collect(),
    )
}

/// The planner's class of a plan, read back from its kernels.
fn class_of(plan: &PrePlan) -> PreClass {
    match (plan.partials, plan.mix) {
        (Partials::SlabFixedPoint(_), Mix::FixedPoint(_)) => PreClass::FixedPoint,
        (Partials::Slab(_), Mix::SmallN(_)) => PreClass::SlabPartials,
        (Partials::Fma(_), Mix::SmallN(_)) => PreClass::FmaSmallN,
        (Partials::Fma(_), Mix::AnyN(_)) => PreClass::FmaAnyN,
        _ => panic!("{plan:?}: a kernel pair outside the tuning table"),
    }
}

#[test]
fn seed_workloads() {
    let Some(gpu) = gpu_or_skip("mhc_pre::seed_workloads") else { return };
    let mut rng = fresh_rng("mhc_pre::seed_workloads");
    for (batch, c) in SEEDS {
        let s = MhcPreShape { batch, n: 4, c };
        let inp = inputs(&mut rng, s, 1.0, 1.0);
        let p = MhcPreParams::default();
        let mut op = MhcPre::new(&gpu, s).unwrap();
        assert_eq!(class_of(op.plan()), PreClass::FixedPoint, "{s:?}");
        // The fixed-point accumulators carry state between calls (epoch parity): three calls,
        // the second with new inputs.
        for call in 0..3 {
            let inp = if call == 1 { inputs(&mut rng, s, 1.0, 1.0) } else { inp.clone() };
            let out = run(&gpu, &mut op, p, &inp);
            let (ulps, used) = check(&format!("{s:?} call {call}"), &out, &mhc_pre_fwd(s, p, &inp.phi, &inp.x, &inp.b));
            println!("B={batch} n=4 c={c} call {call}: worst {ulps:.3} ulp, {used:.3} of the tolerance");
        }
    }
}

/// Shapes across every class of the tuning table, three parameter sets each (Sinkhorn 0, 1 and
/// 20 rounds, several alphas).
#[test]
fn shape_sweep() {
    let Some(gpu) = gpu_or_skip("mhc_pre::shape_sweep") else { return };
    let mut rng = fresh_rng("mhc_pre::shape_sweep");
    let mut worst = (0f64, 0f64);
    let grid = [1, 5, 32].into_iter().flat_map(|batch| {
        [1, 2, 4, 8].into_iter().flat_map(move |n| [1, 7, 1280, 4099].into_iter().map(move |c| (batch, n, c)))
    });
    // One block's phi slab exceeds shared memory: FMA partials for n ≤ 4.
    let fallbacks = [(1, 4, 70_000), (2, 2, 200_000), (3, 1, 600_000)];
    for (batch, n, c) in grid.chain(fallbacks) {
        let s = MhcPreShape { batch, n, c };
        // Logits O(1) (dense R, Sinkhorn matters) on odd c, O(√(n·c)) (the seed regime) else.
        let phi_scale = if c % 2 == 1 { 1.0 / ((n * c) as f32).sqrt() } else { 1.0 };
        let inp = inputs(&mut rng, s, phi_scale, 1.0);
        let logits = mhc_pre_logits(s, &inp.phi, &inp.x);
        let mut op = MhcPre::new(&gpu, s).unwrap();
        let class = class_of(op.plan());
        if c >= 70_000 {
            assert_eq!(class, PreClass::FmaSmallN, "{s:?}");
        }
        for (repeat, alphas) in [(0, (0.7, 1.3, 1.9)), (1, (1.0, 1.0, 1.0)), (20, (1.4, 0.6, 0.8))] {
            let p = MhcPreParams {
                alpha_pre: alphas.0,
                alpha_post: alphas.1,
                alpha_res: alphas.2,
                sinkhorn_repeat: repeat,
                sinkhorn_eps: 0.02,
            };
            let out = run(&gpu, &mut op, p, &inp);
            let r = mhc_pre_fwd_from_logits(s, p, &logits, &inp.b, &inp.x);
            worst = worse(worst, check(&format!("{s:?} {class:?} repeat {repeat}"), &out, &r));
        }
    }
    println!("shape sweep: worst {:.3} ulp, {:.3} of the tolerance", worst.0, worst.1);
}

/// Batches beyond the fixed-point kernel 2's grid (batch > 65535: slab partials, staged
/// tiles) and beyond the slab kernel 1's grid (batch > 524280: FMA partials).
#[test]
fn large_batches_take_their_fallbacks() {
    let Some(gpu) = gpu_or_skip("mhc_pre::large_batches") else { return };
    let mut rng = fresh_rng("mhc_pre::large_batches");
    for (batch, n, c, class) in [
        (65_535, 4, 8, PreClass::FixedPoint),
        (70_000, 4, 8, PreClass::SlabPartials),
        (600_000, 1, 1, PreClass::FmaSmallN),
    ] {
        let s = MhcPreShape { batch, n, c };
        let mut op = MhcPre::new(&gpu, s).unwrap();
        assert_eq!(class_of(op.plan()), class, "{s:?}");
        let inp = inputs(&mut rng, s, 1.0, 1.0);
        let p = MhcPreParams::default();
        for call in 0..2 {
            let out = run(&gpu, &mut op, p, &inp);
            check(&format!("{s:?} call {call}"), &out, &mhc_pre_fwd(s, p, &inp.phi, &inp.x, &inp.b));
        }
    }
}

#[test]
fn extreme_inputs_are_finite_and_match() {
    let Some(gpu) = gpu_or_skip("mhc_pre::extreme_inputs") else { return };
    let mut rng = fresh_rng("mhc_pre::extreme_inputs");
    for s in [
        MhcPreShape { batch: 4, n: 4, c: 2560 },
        MhcPreShape { batch: 5, n: 3, c: 7 },
        MhcPreShape { batch: 3, n: 8, c: 100 },
    ] {
        let p = MhcPreParams::default();
        let mut op = MhcPre::new(&gpu, s).unwrap();
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
    for s in [
        MhcPreShape { batch: 4, n: 4, c: 2560 },
        MhcPreShape { batch: 32, n: 8, c: 4099 },
        MhcPreShape { batch: 2, n: 4, c: 70_000 },
    ] {
        let inp = inputs(&mut rng, s, 1.0 / ((s.n * s.c) as f32).sqrt(), 1.0);
        let p = MhcPreParams { sinkhorn_repeat: 20, ..MhcPreParams::default() };
        let mut op = MhcPre::new(&gpu, s).unwrap();
        let first = run(&gpu, &mut op, p, &inp);
        check(&format!("{s:?}"), &first, &mhc_pre_fwd(s, p, &inp.phi, &inp.x, &inp.b));
        let want = bits(&first);
        let mut other = MhcPre::new(&gpu, s).unwrap();
        for i in 0..8 {
            let op = if i % 2 == 0 { &mut op } else { &mut other };
            assert!(bits(&run(&gpu, op, p, &inp)) == want, "{s:?}: run {i} differs from the first");
        }
    }
}

/// [`MhcPre::run`] submits the call's kernels as one captured CUDA graph: the same bits as
/// direct launches of the same plan ([`rgk::mhc::pre_fwd_raw`]) — on the capturing call, on
/// replays with new data in the same buffers (the graph reads memory when it runs), after the
/// buffers change (re-capture), and on the legacy default stream.
#[test]
fn graph_replay_matches_direct_launches() {
    let Some(gpu) = gpu_or_skip("mhc_pre::graph_replay") else { return };
    let mut rng = fresh_rng("mhc_pre::graph_replay");
    let shapes = [(1, 4, 1280), (2, 4, 1920), (4, 4, 2560), (3, 3, 77), (5, 8, 1030), (1, 4, 70_000)];
    for (batch, n, c) in shapes {
        let s = MhcPreShape { batch, n, c };
        let l = s.lens().unwrap();
        let st = gpu.stream();
        let mut graphed = MhcPre::new(&gpu, s).unwrap();
        let plan = *graphed.plan();
        let mut ws = st.alloc_zeros::<u64>(plan.workspace).unwrap();
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
                graphed.run(&gpu, p, pre_in(&dphi, &dx, &db), pre_out(&mut dr, &mut dy, &mut dh)).unwrap();
            }
            let got = Outputs {
                x_res: st.clone_dtoh(&dr).unwrap(),
                x_layer: st.clone_dtoh(&dy).unwrap(),
                h_post: st.clone_dtoh(&dh).unwrap(),
            };
            let want = run_raw(&gpu, &plan, &mut ws, p, &inp);
            check(&format!("{s:?} graph round {round}"), &got, &mhc_pre_fwd(s, p, &inp.phi, &inp.x, &inp.b));
            assert!(bits(&got) == bits(&want), "{s:?} round {round}: graph differs from direct launches");
        }
        // New buffers: a new key, a new capture.
        let inp = inputs(&mut rng, s, 1.0, 1.0);
        let p = MhcPreParams::default();
        let got = run(&gpu, &mut graphed, p, &inp);
        assert!(bits(&got) == bits(&run_raw(&gpu, &plan, &mut ws, p, &inp)), "{s:?}: re-captured graph differs");
        // The legacy default stream (PyTorch's default) cannot be captured: the graph is
        // captured on a stream of the op's own and launched there.
        let legacy = gpu.with_stream(gpu.context().default_stream()).unwrap();
        let inp = inputs(&mut rng, s, 1.0, 1.0);
        let want = run_raw(&gpu, &plan, &mut ws, p, &inp);
        for _ in 0..2 {
            assert!(bits(&run(&legacy, &mut graphed, p, &inp)) == bits(&want), "{s:?}: legacy-stream graph differs");
        }
    }
}

/// A plan serving more output sets than its graph cache keeps (`rgk::GRAPH_CACHE`; e.g. one
/// plan for many layers of one shape): every call of the second cycle misses and replaces the
/// least recently used graph. Two cycles over `GRAPH_CACHE + 8` output sets, each output poisoned before its call and
/// bitwise equal to direct launches after it.
#[test]
fn graph_cache_beyond_its_capacity_stays_bitwise_direct_launches() {
    let Some(gpu) = gpu_or_skip("mhc_pre::graph_cache_beyond_its_capacity") else { return };
    let mut rng = fresh_rng("mhc_pre::graph_cache_beyond_its_capacity");
    let s = MhcPreShape { batch: 2, n: 4, c: 1280 };
    let l = s.lens().unwrap();
    let st = gpu.stream();
    let mut graphed = MhcPre::new(&gpu, s).unwrap();
    let plan = *graphed.plan();
    let mut ws = st.alloc_zeros::<u64>(plan.workspace).unwrap();
    let inp = inputs(&mut rng, s, 1.0 / ((s.n * s.c) as f32).sqrt(), 1.0);
    let p = MhcPreParams::default();
    let want = run_raw(&gpu, &plan, &mut ws, p, &inp);
    let dphi = st.clone_htod(&inp.phi).unwrap();
    let dx = st.clone_htod(&inp.x).unwrap();
    let db = st.clone_htod(&inp.b).unwrap();
    let mut outs: Vec<_> = (0..rgk::GRAPH_CACHE + 8)
        .map(|_| {
            let dr = st.alloc_zeros::<bf16>(l.x).unwrap();
            let dy = st.alloc_zeros::<bf16>(l.x_layer).unwrap();
            let dh = st.alloc_zeros::<f32>(l.h_post).unwrap();
            (dr, dy, dh)
        })
        .collect();
    // Host time of the calls that fill the cache (the first 32) and of those that evict.
    let (mut filling, mut full) = (Vec::new(), Vec::new());
    for cycle in 0..2 {
        for (i, (dr, dy, dh)) in outs.iter_mut().enumerate() {
            st.memcpy_htod(&poisoned::<bf16>(l.x), dr).unwrap();
            st.memcpy_htod(&poisoned::<bf16>(l.x_layer), dy).unwrap();
            st.memcpy_htod(&vec![f32::NAN; l.h_post], dh).unwrap();
            st.synchronize().unwrap();
            let t = std::time::Instant::now();
            graphed.run(&gpu, p, pre_in(&dphi, &dx, &db), pre_out(dr, dy, dh)).unwrap();
            let us = t.elapsed().as_secs_f64() * 1e6;
            if cycle == 0 && i < rgk::GRAPH_CACHE {
                filling.push(us)
            } else {
                full.push(us)
            }
            let got = Outputs {
                x_res: st.clone_dtoh(dr).unwrap(),
                x_layer: st.clone_dtoh(dy).unwrap(),
                h_post: st.clone_dtoh(dh).unwrap(),
            };
            assert!(bits(&got) == bits(&want), "cycle {cycle}, output set {i}: graph differs from direct launches");
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!(
        "graph cache: a new key costs {:.1} µs while the cache fills and {:.1} µs once it is full (capture + instantiate), host time, median",
        median(&mut filling),
        median(&mut full)
    );
}

/// The raw entry with a caller-owned workspace: the fixed-point pair's workspace zeroed once
/// and then left to the kernels across five calls; the stored-partials pair's (n > 4) full of
/// garbage (NaN bits, then the previous call's partials) — kernel 1 overwrites every word
/// kernel 2 reads. Also: a short or misaligned workspace is an error before any launch, and
/// the word past the workspace is never written.
#[test]
fn raw_entry_with_a_dirty_workspace() {
    use rgk::cudarc::driver::{DevicePtr, DevicePtrMut};
    let Some(gpu) = gpu_or_skip("mhc_pre::raw_entry_with_a_dirty_workspace") else { return };
    let mut rng = fresh_rng("mhc_pre::raw_entry_with_a_dirty_workspace");
    for (s, class) in [
        (MhcPreShape { batch: 2, n: 4, c: 1920 }, PreClass::FixedPoint),
        (MhcPreShape { batch: 3, n: 8, c: 100 }, PreClass::FmaAnyN),
    ] {
        let plan = PrePlan::new(&gpu, s).unwrap();
        assert_eq!(class_of(&plan), class, "{s:?}");
        let fixed_point = class == PreClass::FixedPoint;
        let l = s.lens().unwrap();
        let st = gpu.stream();
        let mut init = vec![if fixed_point { 0 } else { u64::MAX }; plan.workspace + 1];
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
            check(&format!("{s:?} call {call}"), &out, &mhc_pre_fwd(s, p, &inp.phi, &inp.x, &inp.b));
        }
        // The word past the workspace is never touched.
        let tail: Vec<u64> = st.clone_dtoh(&ws.slice(plan.workspace..)).unwrap();
        assert_eq!(tail, [u64::MAX], "{s:?}: the kernels wrote past the workspace");
    }
}

/// Every mHC PTX entry of the module is launched by some plan of the planners' sweep, and every
/// planned kernel is an entry of the module.
#[test]
fn planned_kernels_are_the_module_entries() {
    let Some(gpu) = gpu_or_skip("mhc_pre::planned_kernels") else { return };
    let planned = rgk::mhc::planned_kernels(&gpu).unwrap();
    let entries: std::collections::BTreeSet<&str> =
        rgk_tests::module_entries().into_iter().filter(|name| name.starts_with("mhc_")).collect();
    assert_eq!(planned, entries);
}

/// Host cost of one call (printed, not asserted: a diagnostic), direct launches
/// ([`rgk::mhc::pre_fwd_raw`]) against graph replay ([`MhcPre::run`]), 200 calls each on the
/// same buffers; the last call's outputs are checked against the reference.
#[test]
fn host_call_cost() {
    use rgk::cudarc::driver::{DevicePtr, DevicePtrMut};
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
        let mut op = MhcPre::new(&gpu, s).unwrap();
        let plan = *op.plan();
        let mut ws = st.alloc_zeros::<u64>(plan.workspace).unwrap();
        let mut dr = st.clone_htod(&poisoned::<bf16>(l.x)).unwrap();
        let mut dy = st.clone_htod(&poisoned::<bf16>(l.x_layer)).unwrap();
        let mut dh = st.clone_htod(&vec![f32::NAN; l.h_post]).unwrap();
        let mut call = |dr: &mut CudaSlice<bf16>, dy: &mut CudaSlice<bf16>, dh: &mut CudaSlice<f32>| {
            if graph {
                op.run(&gpu, p, pre_in(&dphi, &dx, &db), pre_out(dr, dy, dh)).unwrap();
                return;
            }
            let (a, _ga) = dphi.device_ptr(st);
            let (b, _gb) = dx.device_ptr(st);
            let (c, _gc) = db.device_ptr(st);
            let (d, _gd) = dr.device_ptr_mut(st);
            let (e, _ge) = dy.device_ptr_mut(st);
            let (f, _gf) = dh.device_ptr_mut(st);
            let wl = ws.len();
            let (w, _gw) = ws.device_ptr_mut(st);
            unsafe { rgk::mhc::pre_fwd_raw(&gpu, &plan, p, a, b, c, d, e, f, w, wl, st.cu_stream()) }.unwrap();
        };
        call(&mut dr, &mut dy, &mut dh);
        st.synchronize().unwrap();
        let t0 = std::time::Instant::now();
        for _ in 0..200 {
            call(&mut dr, &mut dy, &mut dh);
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
    let huge_n = PrePlan::for_device(MhcPreShape { batch: 1, n: 200, c: 1 }, 132, 227 * 1024);
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
    expect(op.run(&gpu, p, pre_in(&phi_s, &x, &b), pre_out(&mut r, &mut y, &mut h)), "phi");
    expect(op.run(&gpu, p, pre_in(&phi, &x_s, &b), pre_out(&mut r, &mut y, &mut h)), "x");
    expect(op.run(&gpu, p, pre_in(&phi, &x, &b_s), pre_out(&mut r, &mut y, &mut h)), "b");
    expect(op.run(&gpu, p, pre_in(&phi, &x, &b), pre_out(&mut r_s, &mut y, &mut h)), "x_res");
    expect(op.run(&gpu, p, pre_in(&phi, &x, &b), pre_out(&mut r, &mut y_s, &mut h)), "x_layer");
    expect(op.run(&gpu, p, pre_in(&phi, &x, &b), pre_out(&mut r, &mut y, &mut h_s)), "h_post");
    let bad = MhcPreParams { sinkhorn_eps: 0.0, ..p };
    assert!(matches!(
        op.run(&gpu, bad, pre_in(&phi, &x, &b), pre_out(&mut r, &mut y, &mut h)),
        Err(Error::Shape { arg: "sinkhorn_eps", .. })
    ));
    op.run(&gpu, p, pre_in(&phi, &x, &b), pre_out(&mut r, &mut y, &mut h)).unwrap();
    st.synchronize().unwrap();
}

/// The tuning table's rows on an H200 (132 SMs, 227 KiB of opt-in shared memory per block).
#[test]
fn tuning_table_picks_each_class() {
    const SMEM: usize = 227 * 1024;
    let class = |batch, n, c| class_of(&PrePlan::for_device(MhcPreShape { batch, n, c }, 132, SMEM).unwrap());
    for (batch, c) in SEEDS {
        assert_eq!(class(batch, 4, c), PreClass::FixedPoint);
    }
    assert_eq!(class(5, 3, 7), PreClass::FixedPoint);
    assert_eq!(class(65_535, 4, 8), PreClass::FixedPoint);
    assert_eq!(class(65_536, 4, 8), PreClass::SlabPartials);
    assert_eq!(class(524_280, 1, 1), PreClass::SlabPartials);
    assert_eq!(class(524_281, 1, 1), PreClass::FmaSmallN);
    assert_eq!(class(1, 4, 70_000), PreClass::FmaSmallN);
    assert_eq!(class(2, 2, 200_000), PreClass::FmaSmallN);
    assert_eq!(class(9, 5, 1), PreClass::FmaAnyN);
    assert_eq!(class(2, 16, 300), PreClass::FmaAnyN);
    // The seed rows' geometry (MHCPreFwd's and the fused MHCPostPreFwd's): 64 kernel-1 blocks
    // (48 at batch ≤ 2) of 256 threads over groups of ≤ 2 batch rows, kernel 2 one 128-thread
    // block per 128 columns of a batch row.
    for (batch, c) in SEEDS {
        let s = MhcPreShape { batch, n: 4, c };
        let plan = PrePlan::for_device(s, 132, SMEM).unwrap();
        let (Partials::SlabFixedPoint(k1), Mix::FixedPoint(k2)) = (plan.partials, plan.mix) else { unreachable!() };
        let bpc = batch.min(2);
        let grid = if batch <= 2 { 48 } else { 64 };
        assert_eq!((k1.grid, k1.block, k1.batch_per_group as usize), (grid, 256, bpc), "{plan:?}");
        assert_eq!(k1.groups as usize, batch / bpc, "{plan:?}");
        assert_eq!((k2.block, k2.tiles as usize), (128, c.div_ceil(128)), "{plan:?}");
        // Two accumulator copies from 128 partial blocks (hidden-2560 only).
        let copies = if batch == 4 { 2 } else { 1 };
        assert_eq!((k1.acc_copies, k2.acc_copies), (copies, copies), "{plan:?}");
    }
}

/// Batch rows per group of `mhc_pre_partial_fma` (`kernel_abi::mhc::BT`).
const BT: usize = 4;
/// x elements per thread in the staged tile of `mhc_pre_mix` (`kernel_abi::mhc::UN`).
const UN: usize = 8;

/// The plans' invariants (the kernels' preconditions) over many shapes and SM counts.
#[test]
fn plan_invariants() {
    const SMEM: usize = 227 * 1024;
    for n in [1, 2, 3, 4, 5, 8, 16, 31] {
        for c in [1, 2, 7, 100, 1280, 2560, 4099, 70000] {
            for batch in [1, 3, 4, 5, 32, 70_000, 524_280] {
                for sms in [132, 3, 64] {
                    let s = MhcPreShape { batch, n, c };
                    let Ok(plan) = PrePlan::for_device(s, sms, SMEM) else { continue };
                    let class = class_of(&plan);
                    let mq = n * n + 2 * n + 1;
                    let grid = plan.partials.grid() as usize;
                    assert!(grid >= 1 && grid <= sms.min(64), "{s:?} {plan:?}");
                    match plan.partials {
                        Partials::SlabFixedPoint(g) | Partials::Slab(g) => {
                            let cols = g.cols as usize;
                            assert!(n <= 4 && grid * cols >= c && (grid - 1) * cols < c, "{s:?} {plan:?}");
                            assert!(8 * n * cols <= 1 << 16 && g.smem as usize <= SMEM, "{s:?} {plan:?}");
                            assert_eq!(g.smem as usize, rgk::mhc::pre_slab_partial_smem_bytes(n, cols));
                            let bpc = g.batch_per_group as usize;
                            let want = if batch <= 2 || batch > 8 { batch.min(8) } else { 2 };
                            assert!(bpc == want && g.groups as usize == batch.div_ceil(bpc), "{s:?} {plan:?}");
                            assert_eq!(bpc, rgk::mhc::pre_slab_batch_per_group(batch));
                            assert!(g.groups <= 65535 && g.block == rgk::mhc::pre_slab_block(s, bpc), "{s:?} {plan:?}");
                            assert_eq!(g.block, if 4 * bpc * mq > 256 { 512 } else { 256 }, "{s:?} {plan:?}");
                        }
                        Partials::Fma(g) => {
                            let cols = g.cols as usize;
                            assert!(grid * cols >= c && (grid - 1) * cols < c, "{s:?} {plan:?}");
                            assert!(g.jc as usize <= cols && g.bg >= 1 && g.bg as usize <= BT.min(batch), "{s:?}");
                            assert!((g.bg as usize) * n * (g.jc as usize) <= 1 << 16, "{s:?} {plan:?}");
                            assert!(g.smem as usize <= SMEM, "{s:?} {plan:?}");
                            // FMA partials for n ≤ 4 only where the slab kernel does not fit.
                            assert!(n > 4 || !rgk::mhc::pre_slab_fits(s, cols, SMEM) || batch > 524_280);
                        }
                    }
                    match plan.mix {
                        Mix::FixedPoint(g) => {
                            assert!(batch <= 65535 && g.block == 128 && (g.tiles as usize) == c.div_ceil(c.min(128)));
                            // Two halves of `copies` × 5 words per (batch row, logit), the
                            // epoch word, then three logit scales per batch row.
                            let copies = plan.partials.acc_copies() as usize;
                            let Partials::SlabFixedPoint(k1) = plan.partials else { unreachable!() };
                            let blocks = (k1.grid * k1.groups) as usize;
                            assert!(copies == 1 || copies == 2, "{s:?} {plan:?}");
                            assert!(copies == 1 || (blocks >= 128 && k1.grid >= 2), "{s:?} {plan:?}");
                            assert_eq!(g.acc_copies as usize, copies);
                            assert_eq!(
                                plan.workspace,
                                2 * copies * batch * (mq - 1) * rgk::mhc::ACC_WORDS + 1 + rgk::mhc::ROW_SCALES * batch
                            );
                        }
                        Mix::SmallN(g) | Mix::AnyN(g) => {
                            let (jt, tiles, mb) = (g.jt as usize, g.tiles as usize, g.block as usize);
                            assert_eq!(mb, if n <= 4 { 256 } else { 512 });
                            assert!(jt >= 1 && jt <= mb && n * jt <= UN * mb, "{s:?} {plan:?}");
                            assert!(tiles * jt >= c && (tiles - 1) * jt < c, "{s:?} {plan:?}");
                            let sl = 1usize << g.slices_log2;
                            assert!(sl <= 32 && sl <= grid && (mq * sl <= mb || sl == 1), "{s:?} {plan:?}");
                            assert!(g.smem as usize <= SMEM);
                            assert_eq!(plan.workspace, batch * mq * grid);
                        }
                    }
                    assert_eq!(class == PreClass::FmaAnyN, n > 4, "{s:?} {plan:?}");
                }
            }
        }
    }
}

/// The lane → logit map of `mhc_pre_mix_small_n` / `mhc_pre_mix_fixed_point` (the kernels'
/// `lane_logit`).
fn lane_logit(l: usize, n: usize) -> Option<usize> {
    match l {
        0..=3 if l < n => Some(l),
        4..=7 if l - 4 < n => Some(n + l - 4),
        16..=31 if (l - 16) / 4 < n && (l - 16) % 4 < n => Some(2 * n + (l - 16) / 4 * n + (l - 16) % 4),
        _ => None,
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

/// A CPU mirror of the fixed-point kernels' limb arithmetic (`add_limb` / `accumulator_value` in
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

/// The fixed-point workspace, mirrored from the kernels: each half holds `copies` copies of
/// ACC_WORDS words per (batch row, logit), word-major (word `k` of copy `p` of (β, q) in half `h`
/// at `((h·copies + p)·ACC_WORDS + k)·batch·m + β·m + q`); kernel 1's partial block `g` adds every
/// (batch row of its group, logit) into copy `g mod copies` of one half, so every word of that
/// half takes the adds of the blocks of its copy; its zeroing loop (word `bid·T + t`, stride
/// `blocks·T`) writes every word of the other half exactly once; kernel 2's loads (one logit per
/// lane, every copy of both halves) stay inside the halves, the epoch word follows them, and the
/// row blocks (one per batch row of a group, after the partial blocks) store each batch row's
/// three logit scales exactly once, in the workspace's last words.
#[test]
fn fixed_point_accumulator_layout() {
    use rgk::mhc::{ACC_WORDS, ROW_SCALES};
    for n in [1, 2, 3, 4] {
        for (batch, c) in [(1, 1280), (2, 1920), (4, 2560), (5, 7), (11, 77), (32, 4099), (9, 1), (300, 3)] {
            for sms in [132, 64, 7, 1] {
                let s = MhcPreShape { batch, n, c };
                let plan = PrePlan::for_device(s, sms, 227 * 1024).unwrap();
                let Partials::SlabFixedPoint(k1) = plan.partials else { continue };
                let (block, bpc, groups, grid) = (k1.block, k1.batch_per_group, k1.groups, k1.grid as usize);
                let copies = k1.acc_copies as usize;
                let g = plan;
                let m = s.logits();
                let word = |half: usize, copy: usize, k: usize, beta: usize, q: usize| {
                    ((half * copies + copy) * ACC_WORDS + k) * batch * m + beta * m + q
                };
                let words = copies * batch * m * ACC_WORDS;
                assert_eq!(g.workspace, 2 * words + 1 + ROW_SCALES * batch, "{s:?} {g:?}");
                // Kernel 1's adds: every (β, q) of every y-block's group, limbs and count word,
                // block x into copy x mod copies.
                let mut added = vec![0u32; words];
                for by in 0..groups as usize {
                    let b0 = by * bpc as usize;
                    for x in 0..grid {
                        for bl in 0..(batch - b0).min(8).min(bpc as usize) {
                            for q in 0..m {
                                for k in 0..ACC_WORDS {
                                    added[word(0, x % copies, k, b0 + bl, q)] += 1;
                                }
                            }
                        }
                    }
                }
                for (i, &a) in added.iter().enumerate() {
                    let copy = i / (ACC_WORDS * batch * m);
                    let want = (copy..grid).step_by(copies).count() as u32;
                    assert!(want >= 1 && a == want, "{s:?} {g:?}: word {i} takes {a} adds, not {want}");
                }
                // The row blocks: block grid + i of group by takes batch row by·bpc + i.
                let mut scaled = vec![0u32; batch];
                for by in 0..groups as usize {
                    for i in 0..bpc as usize {
                        let beta = by * bpc as usize + i;
                        if beta < batch {
                            scaled[beta] += 1;
                            assert!(2 * words + 1 + ROW_SCALES * (beta + 1) <= g.workspace, "{s:?} {g:?}");
                        }
                    }
                }
                assert!(scaled.iter().all(|&a| a == 1), "{s:?} {g:?}: a batch row without one row block");
                // Kernel 1's zeroing of the other half, over all (grid + bpc) × groups blocks.
                let (nb, t) = ((k1.grid + bpc) as usize * groups as usize, block as usize);
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
                // Kernel 2: lane logit e of row β reads word k of every copy of both halves.
                for beta in 0..batch {
                    for lane in 0..32 {
                        if let Some(e) = lane_logit(lane, n) {
                            assert!(word(1, copies - 1, ACC_WORDS - 1, beta, e) < 2 * words, "{s:?} {g:?}");
                        }
                    }
                }
            }
        }
    }
}

/// The inputs struct of [`MhcPre::run`].
fn pre_in<'a>(phi: &'a CudaSlice<f32>, x: &'a CudaSlice<bf16>, b: &'a CudaSlice<f32>) -> MhcPreInputs<'a> {
    MhcPreInputs { phi, x, b }
}

/// The outputs struct of [`MhcPre::run`].
fn pre_out<'a>(
    x_res: &'a mut CudaSlice<bf16>,
    x_layer: &'a mut CudaSlice<bf16>,
    h_post: &'a mut CudaSlice<f32>,
) -> MhcPreOutputs<'a> {
    MhcPreOutputs { x_res, x_layer, h_post }
}
