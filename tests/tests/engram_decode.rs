//! EngramDecodeFwd on the GPU against the f64 CPU reference (docs/ops.md §6).
//!
//! Every step is checked as a chain (see host/src/reference/engram_decode.rs):
//! 1. the kernel's `q(kk)` is within 1 ulp (+ the sum slack) of the correctly rounded exact `kk`;
//! 2. its `q(vh)` is within 1 ulp (+ slack) of the reference's `vh` evaluated on the kernel's
//!    `q(kk)`;
//! 3. `y_t` and the new state are within 2 ulp (+ slack) of the reference evaluated on the
//!    kernel's `q(kk)` and `q(vh)`; the shifted state rows are bit copies.
//!
//! Outputs are poisoned first, with guard elements behind them, and every element is checked.
use rand::rngs::StdRng;
use rgk::cudarc::driver::CudaSlice;
use rgk::engram::{
    decode_planned_kernels, plan_decode_steps, DecodeDtype, DecodeElem, DecodeInputs, DecodeOutputs, EngramDecodePlan,
    EngramDecodeShape,
};
use rgk::reference::{self as rf, DecodeGiven, DecodeRefInputs};
use rgk::verify::{check_half, poisoned, Half};
use rgk::{bf16, f16, Error, Gpu};
use rgk_tests::{fresh_rng, gpu_or_skip, randn_f32, randn_half};
use std::collections::BTreeSet;

/// Standard deviations of the generated inputs (`rms_w_* = 1 + rms_sd·N(0,1)`).
#[derive(Clone, Copy, Debug)]
struct Scales {
    e: f32,
    h: f32,
    state: f32,
    w: f32,
    rms_sd: f32,
    conv: f32,
}

/// the seed's input distribution (unit rms weights).
const SEED_SCALES: Scales = Scales { e: 0.1, h: 1.0, state: 0.1, w: 0.02, rms_sd: 0.0, conv: 0.02 };
/// Other scales, non-unit rms weights, a conv that matters.
const VARIED: Scales = Scales { e: 1.0, h: 3.0, state: 1.0, w: 0.05, rms_sd: 0.5, conv: 0.5 };

struct Host<T> {
    s: EngramDecodeShape,
    e: Vec<T>,
    h: Vec<T>,
    state: Vec<T>,
    wk: Vec<T>,
    wv: Vec<T>,
    rwh: Vec<T>,
    rwv: Vec<T>,
    cw: Vec<T>,
}

fn around_one<T: Half>(rng: &mut StdRng, n: usize, sd: f32) -> Vec<T> {
    randn_f32(rng, n, sd).into_iter().map(|v| T::round_f64(1.0 + v as f64)).collect()
}

fn gen<T: Half>(rng: &mut StdRng, s: EngramDecodeShape, sc: Scales) -> Host<T> {
    let l = s.lens().unwrap();
    Host {
        s,
        e: randn_half(rng, l.e, sc.e),
        h: randn_half(rng, l.h, sc.h),
        state: randn_half(rng, l.state, sc.state),
        wk: randn_half(rng, l.w, sc.w),
        wv: randn_half(rng, l.w, sc.w),
        rwh: around_one(rng, l.rms, sc.rms_sd),
        rwv: around_one(rng, l.rms, sc.rms_sd),
        cw: randn_half(rng, l.conv_w, sc.conv),
    }
}

impl<T: Half> Host<T> {
    fn refs<'a>(&'a self, state: &'a [T]) -> DecodeRefInputs<'a, T> {
        DecodeRefInputs {
            e_t: &self.e,
            h_t: &self.h,
            conv_state: state,
            w_k: &self.wk,
            w_v: &self.wv,
            rms_w_h: &self.rwh,
            rms_w_v: &self.rwv,
            conv_w: &self.cw,
        }
    }
}

struct Dev<T> {
    e: CudaSlice<T>,
    h: CudaSlice<T>,
    wk: CudaSlice<T>,
    wv: CudaSlice<T>,
    rwh: CudaSlice<T>,
    rwv: CudaSlice<T>,
    cw: CudaSlice<T>,
}

fn upload<T: DecodeElem>(gpu: &Gpu, c: &Host<T>) -> Dev<T> {
    let st = gpu.stream();
    Dev {
        e: st.clone_htod(&c.e).unwrap(),
        h: st.clone_htod(&c.h).unwrap(),
        wk: st.clone_htod(&c.wk).unwrap(),
        wv: st.clone_htod(&c.wv).unwrap(),
        rwh: st.clone_htod(&c.rwh).unwrap(),
        rwv: st.clone_htod(&c.rwv).unwrap(),
        cw: st.clone_htod(&c.cw).unwrap(),
    }
}

impl<T: DecodeElem> Dev<T> {
    fn inputs(&self) -> DecodeInputs<'_, T> {
        DecodeInputs {
            e_t: &self.e,
            h_t: &self.h,
            w_k: &self.wk,
            w_v: &self.wv,
            rms_w_h: &self.rwh,
            rms_w_v: &self.rwv,
            conv_w: &self.cw,
        }
    }
}

/// One step's outputs and the kernel's rounded intermediates.
struct Out<T> {
    y: Vec<T>,
    state: Vec<T>,
    qkk: Vec<T>,
    qvh: Vec<T>,
}

const GUARD: usize = 8;

fn bits<T: Half>(v: T) -> u64 {
    v.to_f64().to_bits()
}

/// Downloads `buf`, checks its `GUARD` trailing elements are still poison, returns the rest.
fn take<T: DecodeElem>(gpu: &Gpu, buf: &CudaSlice<T>, n: usize, what: &str) -> Vec<T> {
    let all: Vec<T> = gpu.stream().clone_dtoh(buf).unwrap();
    for (i, v) in all[n..].iter().enumerate() {
        assert!(v.to_f64().is_nan(), "{what}: write past the end at guard element {i}");
    }
    all[..n].to_vec()
}

/// One seed-contract step (`forward`) with capture on.
fn step_copy<T: DecodeElem>(gpu: &Gpu, plan: &mut EngramDecodePlan, dev: &Dev<T>, state_in: &[T]) -> Out<T> {
    let l = plan.lens();
    let st = gpu.stream();
    let ds = st.clone_htod(state_in).unwrap();
    let mut y = st.clone_htod(&poisoned::<T>(l.h + GUARD)).unwrap();
    let mut ns = st.clone_htod(&poisoned::<T>(l.state + GUARD)).unwrap();
    let outputs = DecodeOutputs { y_t: &mut y.slice_mut(0..l.h), new_conv_state: &mut ns.slice_mut(0..l.state) };
    plan.forward(gpu, dev.inputs(), &ds, outputs).unwrap();
    let (qkk, qvh) = plan.intermediates::<T>(gpu).unwrap();
    Out { y: take(gpu, &y, l.h, "y_t"), state: take(gpu, &ns, l.state, "new_conv_state"), qkk, qvh }
}

/// Worst ulp errors of one checked step.
#[derive(Clone, Copy, Debug, Default)]
struct Worst {
    kk: f64,
    vh: f64,
    y: f64,
    state: f64,
    /// `y_t` against the reference with its own roundings (informational).
    y_plain: f64,
}

impl Worst {
    fn max(self, o: Worst) -> Worst {
        Worst {
            kk: self.kk.max(o.kk),
            vh: self.vh.max(o.vh),
            y: self.y.max(o.y),
            state: self.state.max(o.state),
            y_plain: self.y_plain.max(o.y_plain),
        }
    }
}

/// The chain of checks of the module docs; panics with `what` on a failure.
fn check<T: DecodeElem>(c: &Host<T>, state_in: &[T], o: &Out<T>, what: &str) -> Worst {
    let s = &c.s;
    let x = c.refs(state_in);
    let proj = rf::decode_projections(s, &x);
    let own = rf::engram_decode_fwd_from(s, &x, &proj, DecodeGiven::default());
    let rk = check_half(&o.qkk, &own.kk, 1.0);
    assert!(rk.passed(), "{what} {s:?}: q(kk): {rk}");
    let g1 = rf::engram_decode_fwd_from(s, &x, &proj, DecodeGiven { q_kk: Some(&o.qkk), q_vh: None });
    let rv = check_half(&o.qvh, &g1.vh, 1.0);
    assert!(rv.passed(), "{what} {s:?}: q(vh): {rv}");
    let g2 = rf::engram_decode_fwd_from(s, &x, &proj, DecodeGiven { q_kk: Some(&o.qkk), q_vh: Some(&o.qvh) });
    let ry = check_half(&o.y, &g2.y_t, 2.0);
    assert!(ry.passed(), "{what} {s:?}: y_t: {ry}");
    let rs = check_half(&o.state, &g2.new_conv_state, 2.0);
    assert!(rs.passed(), "{what} {s:?}: new_conv_state: {rs}");
    let (l, d) = (s.max_conv_len, s.d);
    for b in 0..s.batch {
        for t in 0..l - 1 {
            for j in 0..d {
                let (n, old) = (o.state[(b * l + t) * d + j], state_in[(b * l + t + 1) * d + j]);
                assert_eq!(bits(n), bits(old), "{what} {s:?}: shifted state [{b},{t},{j}] is not a bit copy");
            }
        }
    }
    let plain = check_half(&o.y, &own.y_t, 2.0);
    Worst { kk: rk.max_ulp, vh: rv.max_ulp, y: ry.max_ulp, state: rs.max_ulp, y_plain: plain.max_ulp }
}

fn plan_for(gpu: &Gpu, s: EngramDecodeShape) -> EngramDecodePlan {
    let mut p = EngramDecodePlan::new(gpu, s).unwrap();
    p.capture_intermediates(gpu, true).unwrap();
    p
}

/// Generates, runs one step through the planner, checks it; returns the worst errors.
fn one<T: DecodeElem>(gpu: &Gpu, rng: &mut StdRng, s: EngramDecodeShape, sc: Scales) -> Worst {
    let c = gen::<T>(rng, s, sc);
    let dev = upload(gpu, &c);
    let mut plan = plan_for(gpu, s);
    let o = step_copy(gpu, &mut plan, &dev, &c.state);
    check(&c, &c.state, &o, T::NAME)
}

#[test]
fn seed_workloads() {
    let Some(gpu) = gpu_or_skip("engram_decode::seed_workloads") else { return };
    let mut rng = fresh_rng("engram_decode::seed_workloads");
    let (s1, s4, s8) = (
        EngramDecodeShape::new(1, 512, 256, 12, 4, 3),
        EngramDecodeShape::new(4, 1024, 512, 20, 4, 5),
        EngramDecodeShape::new(8, 512, 256, 18, 4, 3),
    );
    for sc in [SEED_SCALES, VARIED] {
        let w1 = one::<f16>(&gpu, &mut rng, s1, sc);
        let w4 = one::<f16>(&gpu, &mut rng, s4, sc);
        let w8 = one::<bf16>(&gpu, &mut rng, s8, sc);
        println!("{sc:?}\n  serving-b1 {w1:?}\n  serving-b4 {w4:?}\n  serving-b8 {w8:?}");
    }
}

#[test]
fn shape_sweep() {
    let Some(gpu) = gpu_or_skip("engram_decode::shape_sweep") else { return };
    let mut rng = fresh_rng("engram_decode::shape_sweep");
    let mut worst = Worst::default();
    let mut n = 0usize;
    for batch in [1, 3, 64] {
        for d_mem in [1, 100, 4096] {
            for d in [8, 256, 1000] {
                let k = [1, 2, 4][n % 3];
                let dil = [1, 2, 3, 5][n % 4];
                let l = ((k - 1) * dil).max(1) + [0, 1, 6][(n / 3) % 3];
                let s = EngramDecodeShape::new(batch, d_mem, d, l, k, dil);
                let sc = if n.is_multiple_of(2) { SEED_SCALES } else { VARIED };
                let w = if n.is_multiple_of(2) {
                    one::<f16>(&gpu, &mut rng, s, sc)
                } else {
                    one::<bf16>(&gpu, &mut rng, s, sc)
                };
                worst = worst.max(w);
                n += 1;
            }
        }
    }
    println!("shape sweep ({n} shapes): worst {worst:?}");
}

#[test]
fn kernel_sizes_and_dilations() {
    let Some(gpu) = gpu_or_skip("engram_decode::kernel_sizes_and_dilations") else { return };
    let mut rng = fresh_rng("engram_decode::kernel_sizes_and_dilations");
    let mut worst = Worst::default();
    for k in [1, 2, 3, 4, 5] {
        for dil in [1, 2, 3, 5, 7] {
            for extra in [0, 3] {
                let l = ((k - 1) * dil).max(1) + extra;
                let s = EngramDecodeShape::new(3, 100, 256, l, k, dil);
                worst = worst.max(one::<f16>(&gpu, &mut rng, s, VARIED));
                worst = worst.max(one::<bf16>(&gpu, &mut rng, s, VARIED));
            }
        }
    }
    println!("K × dilation sweep: worst {worst:?}");
}

/// `d % 8 ≠ 0`, and `d % 8 == 0` with every buffer one element into its allocation (2-byte
/// aligned only): the scalar projection with the 1-column block finish (`d ≤ 512`) or the
/// 1-column warp finish (wider rows).
#[test]
fn any_d_and_unaligned_buffers_take_the_general_path() {
    let Some(gpu) = gpu_or_skip("engram_decode::general_path") else { return };
    let mut rng = fresh_rng("engram_decode::general_path");
    for d in [1, 7, 100, 300, 1001] {
        let s = EngramDecodeShape::new(3, 37, d, 7, 3, 2);
        one::<f16>(&gpu, &mut rng, s, VARIED);
        one::<bf16>(&gpu, &mut rng, s, SEED_SCALES);
    }
    for d in [64, 264, 520] {
        let s = EngramDecodeShape::new(2, 64, d, 9, 4, 3);
        let c = gen::<f16>(&mut rng, s, VARIED);
        let st = gpu.stream();
        let up = |v: &[f16]| {
            let mut p = poisoned::<f16>(1);
            p.extend_from_slice(v);
            st.clone_htod(&p).unwrap()
        };
        let (e, h, wk, wv, rwh, rwv, cw, ds) =
            (up(&c.e), up(&c.h), up(&c.wk), up(&c.wv), up(&c.rwh), up(&c.rwv), up(&c.cw), up(&c.state));
        let l = s.lens().unwrap();
        let mut y = st.clone_htod(&poisoned::<f16>(1 + l.h + GUARD)).unwrap();
        let mut ns = st.clone_htod(&poisoned::<f16>(1 + l.state + GUARD)).unwrap();
        let mut plan = plan_for(&gpu, s);
        {
            let (ev, hv, wkv, wvv, rwhv, rwvv, cwv) = (
                e.slice(1..),
                h.slice(1..),
                wk.slice(1..),
                wv.slice(1..),
                rwh.slice(1..),
                rwv.slice(1..),
                cw.slice(1..),
            );
            let inputs =
                DecodeInputs { e_t: &ev, h_t: &hv, w_k: &wkv, w_v: &wvv, rms_w_h: &rwhv, rms_w_v: &rwvv, conv_w: &cwv };
            let outputs =
                DecodeOutputs { y_t: &mut y.slice_mut(1..1 + l.h), new_conv_state: &mut ns.slice_mut(1..1 + l.state) };
            plan.forward(&gpu, inputs, &ds.slice(1..), outputs).unwrap();
        }
        let (qkk, qvh) = plan.intermediates::<f16>(&gpu).unwrap();
        let yy = take(&gpu, &y, 1 + l.h, "y_t");
        let nn = take(&gpu, &ns, 1 + l.state, "new_conv_state");
        assert!(yy[0].is_nan() && nn[0].is_nan(), "write before the output views");
        let o = Out { y: yy[1..].to_vec(), state: nn[1..].to_vec(), qkk, qvh };
        check(&c, &c.state, &o, "unaligned");
    }
}

/// Shapes that together reach every row of the tuning table and every fallback on the
/// vectorised layout (the tests' allocations are 16-byte aligned): `(batch, d_mem, d, L, K, δ)`.
const PLAN_SHAPES: [(usize, usize, usize, usize, usize, usize); 14] = [
    // MMA b8k16 projection, block finish 1 / 2 / 4 columns.
    (1, 512, 256, 12, 4, 3),
    (4, 1024, 512, 20, 4, 5),
    (8, 512, 256, 18, 4, 3),
    (3, 320, 40, 4, 3, 1),
    (2, 100 * 16, 1000, 9, 4, 3),
    // batch > 8 and d_mem % 16 ≠ 0: the bounded MMA projection.
    (9, 512, 256, 6, 4, 1),
    (64, 100, 256, 3, 2, 1),
    (5, 300, 24, 3, 2, 3),
    (4, 520, 264, 5, 3, 2),
    // K > 4, many splits (> 16 partials per column), one split.
    (3, 64, 256, 12, 5, 2),
    (3, 4096, 64, 7, 1, 1),
    (2, 16, 8, 2, 2, 1),
    // Rows wider than the block finish: the 8-column warp finish, staged in shared memory and
    // in the workspace.
    (2, 40, 2056, 5, 3, 2),
    (2, 40, 4104, 5, 3, 2),
];

/// Every planned kernel against the reference (each plan's kernels printed), both dtypes and
/// both input scales, and the ring step over a few steps on each.
#[test]
fn every_planned_kernel_matches_reference() {
    let Some(gpu) = gpu_or_skip("engram_decode::every_planned_kernel") else { return };
    let mut rng = fresh_rng("engram_decode::every_planned_kernel");
    let mut worst = Worst::default();
    for (batch, d_mem, d, l, k, dil) in PLAN_SHAPES {
        let s = EngramDecodeShape::new(batch, d_mem, d, l, k, dil);
        let steps = plan_decode_steps(&s).unwrap();
        println!("{s:?}: {:?}", steps.vectorised.unwrap().entries(DecodeDtype::F16).unwrap());
        worst = worst.max(one::<f16>(&gpu, &mut rng, s, VARIED));
        worst = worst.max(one::<bf16>(&gpu, &mut rng, s, SEED_SCALES));
        worst = worst.max(one::<bf16>(&gpu, &mut rng, s, VARIED));
        ring_vs_copy::<f16>(&gpu, &mut rng, s, 2 * l + 1);
    }
    println!("planned kernels: worst {worst:?}");
}

/// The planner's sweep ([`decode_planned_kernels`]) launches exactly the decode entries of the
/// module: none unreachable, none missing.
#[test]
fn planned_kernels_are_the_module_entries() {
    let Some(gpu) = gpu_or_skip("engram_decode::planned_kernels") else { return };
    let planned = decode_planned_kernels(&gpu).unwrap();
    let in_module: BTreeSet<&str> =
        rgk_tests::module_entries().into_iter().filter(|name| name.starts_with("engram_decode_")).collect();
    assert_eq!(planned, in_module);
}

#[test]
fn repeated_calls_are_bitwise_identical() {
    let Some(gpu) = gpu_or_skip("engram_decode::deterministic") else { return };
    let mut rng = fresh_rng("engram_decode::deterministic");
    for s in [EngramDecodeShape::new(4, 1024, 512, 20, 4, 5), EngramDecodeShape::new(2, 40, 2056, 5, 3, 2)] {
        let c = gen::<f16>(&mut rng, s, VARIED);
        let dev = upload(&gpu, &c);
        let mut plan = plan_for(&gpu, s);
        let a = step_copy(&gpu, &mut plan, &dev, &c.state);
        for _ in 0..20 {
            let b = step_copy(&gpu, &mut plan, &dev, &c.state);
            assert!(a.y.iter().zip(&b.y).all(|(p, q)| bits(*p) == bits(*q)), "y_t differs between calls");
            assert!(a.state.iter().zip(&b.state).all(|(p, q)| bits(*p) == bits(*q)), "state differs between calls");
        }
    }
}

/// One plan stepping alternately on two streams of the context, with no host synchronisation
/// between the steps, gives the bits it gives on one stream (the plan's workspace is reused
/// by every step: the second stream waits for the first); so do the calls on the legacy
/// default stream.
#[test]
fn plan_alternating_streams_matches_one_stream() {
    let Some(gpu) = gpu_or_skip("engram_decode::alternating_streams") else { return };
    let mut rng = fresh_rng("engram_decode::alternating_streams");
    let other = gpu.new_stream().unwrap();
    // The legacy default stream (PyTorch's default) cannot be captured: the plan captures its
    // graph on a stream of its own and launches it there.
    let legacy = gpu.with_stream(gpu.context().default_stream()).unwrap();
    let st = gpu.stream();
    for s in [EngramDecodeShape::new(4, 1024, 512, 20, 4, 5), EngramDecodeShape::new(8, 512, 256, 18, 4, 3)] {
        let mut plan = plan_for(&gpu, s);
        let l = plan.lens();
        let calls: Vec<(Dev<f16>, CudaSlice<f16>)> = (0..6)
            .map(|_| {
                let c = gen::<f16>(&mut rng, s, VARIED);
                (upload(&gpu, &c), st.clone_htod(&c.state).unwrap())
            })
            .collect();
        // 0: every call on `gpu`'s stream; 1: alternating with `other`; 2: the legacy stream.
        let mut outputs = |mode: u32| -> Vec<(Vec<f16>, Vec<f16>)> {
            let mut bufs: Vec<_> = calls
                .iter()
                .map(|_| {
                    (st.clone_htod(&poisoned::<f16>(l.h)).unwrap(), st.clone_htod(&poisoned::<f16>(l.state)).unwrap())
                })
                .collect();
            for (i, ((dev, state), (y, ns))) in calls.iter().zip(bufs.iter_mut()).enumerate() {
                let handle = match mode {
                    1 if i % 2 == 0 => &other,
                    2 => &legacy,
                    _ => &gpu,
                };
                plan.forward(handle, dev.inputs(), state, DecodeOutputs { y_t: y, new_conv_state: ns }).unwrap();
            }
            bufs.iter().map(|(y, ns)| (st.clone_dtoh(y).unwrap(), st.clone_dtoh(ns).unwrap())).collect()
        };
        let one = outputs(0);
        for mode in [1, 2] {
            for (i, (a, b)) in one.iter().zip(&outputs(mode)).enumerate() {
                assert!(
                    a.0.iter().zip(&b.0).all(|(p, q)| bits(*p) == bits(*q)),
                    "{s:?} call {i}: y_t differs (stream mode {mode})"
                );
                assert!(
                    a.1.iter().zip(&b.1).all(|(p, q)| bits(*p) == bits(*q)),
                    "{s:?} call {i}: state differs (stream mode {mode})"
                );
            }
        }
    }
}

/// A step's graph is captured on the first call and replayed on the same buffers with new
/// data: every round matches the reference, at every seed shape.
#[test]
fn graph_replays_with_new_data_match_reference() {
    let Some(gpu) = gpu_or_skip("engram_decode::graph_replay") else { return };
    let mut rng = fresh_rng("engram_decode::graph_replay");
    for s in [
        EngramDecodeShape::new(1, 512, 256, 12, 4, 3),
        EngramDecodeShape::new(4, 1024, 512, 20, 4, 5),
        EngramDecodeShape::new(8, 512, 256, 18, 4, 3),
        EngramDecodeShape::new(3, 100, 40, 7, 2, 2),
    ] {
        let st = gpu.stream();
        let mut plan = plan_for(&gpu, s);
        let l = plan.lens();
        let c0 = gen::<f16>(&mut rng, s, VARIED);
        let mut dev = upload(&gpu, &c0);
        let mut ds = st.clone_htod(&c0.state).unwrap();
        let mut y = st.alloc_zeros::<f16>(l.h).unwrap();
        let mut ns = st.alloc_zeros::<f16>(l.state).unwrap();
        for round in 0..3 {
            let mut c = gen::<f16>(&mut rng, s, VARIED);
            c.rwh = c0.rwh.clone();
            c.rwv = c0.rwv.clone();
            c.cw = c0.cw.clone();
            for (d, h) in [(&mut dev.e, &c.e), (&mut dev.h, &c.h), (&mut dev.wk, &c.wk), (&mut dev.wv, &c.wv)] {
                st.memcpy_htod(h, d).unwrap();
            }
            st.memcpy_htod(&c.state, &mut ds).unwrap();
            st.memcpy_htod(&poisoned::<f16>(l.h), &mut y).unwrap();
            st.memcpy_htod(&poisoned::<f16>(l.state), &mut ns).unwrap();
            plan.forward(&gpu, dev.inputs(), &ds, DecodeOutputs { y_t: &mut y, new_conv_state: &mut ns }).unwrap();
            let (qkk, qvh) = plan.intermediates::<f16>(&gpu).unwrap();
            let o = Out { y: st.clone_dtoh(&y).unwrap(), state: st.clone_dtoh(&ns).unwrap(), qkk, qvh };
            check(&c, &c.state, &o, &format!("graph replay round {round}"));
        }
    }
}

/// The ring-buffer step and the seed contract agree bit for bit, step after step.
fn ring_vs_copy<T: DecodeElem>(gpu: &Gpu, rng: &mut StdRng, s: EngramDecodeShape, steps: usize) {
    let mut c = gen::<T>(rng, s, VARIED);
    let l = s.lens().unwrap();
    let st = gpu.stream();
    let mut plan = plan_for(gpu, s);
    let mut copy_a = st.clone_htod(&c.state).unwrap();
    let mut copy_b = st.clone_htod(&poisoned::<T>(l.state)).unwrap();
    let mut ring = st.clone_htod(&c.state).unwrap();
    let mut y_copy = st.clone_htod(&poisoned::<T>(l.h)).unwrap();
    let mut y_ring = st.clone_htod(&poisoned::<T>(l.h)).unwrap();
    let mut pos = 0;
    for step in 0..steps {
        c.e = randn_half(rng, l.e, VARIED.e);
        c.h = randn_half(rng, l.h, VARIED.h);
        let dev = upload(gpu, &c);
        let state_before: Vec<T> = st.clone_dtoh(&copy_a).unwrap();
        let outputs = DecodeOutputs { y_t: &mut y_copy, new_conv_state: &mut copy_b };
        plan.forward(gpu, dev.inputs(), &copy_a, outputs).unwrap();
        let (qkk, qvh) = plan.intermediates::<T>(gpu).unwrap();
        pos = plan.step_ring(gpu, dev.inputs(), &mut ring, pos, &mut y_ring).unwrap();
        std::mem::swap(&mut copy_a, &mut copy_b);
        let yc: Vec<T> = st.clone_dtoh(&y_copy).unwrap();
        let yr: Vec<T> = st.clone_dtoh(&y_ring).unwrap();
        let sc: Vec<T> = st.clone_dtoh(&copy_a).unwrap();
        let sr: Vec<T> = rf::ring_logical(&s, &st.clone_dtoh(&ring).unwrap(), pos);
        for (i, (a, b)) in yc.iter().zip(&yr).enumerate() {
            assert_eq!(bits(*a), bits(*b), "{s:?} step {step}: y_t[{i}] ring ≠ copy");
        }
        for (i, (a, b)) in sc.iter().zip(&sr).enumerate() {
            assert_eq!(bits(*a), bits(*b), "{s:?} step {step}: state[{i}] ring ≠ copy (pos {pos})");
        }
        if step % 7 == 0 {
            check(&c, &state_before, &Out { y: yc, state: sc, qkk, qvh }, "ring_vs_copy");
        }
    }
    assert_eq!(pos, steps % s.max_conv_len);
}

#[test]
fn ring_buffer_step_matches_seed_contract_over_many_steps() {
    let Some(gpu) = gpu_or_skip("engram_decode::ring_vs_copy") else { return };
    let mut rng = fresh_rng("engram_decode::ring_vs_copy");
    ring_vs_copy::<f16>(&gpu, &mut rng, EngramDecodeShape::new(1, 512, 256, 12, 4, 3), 60);
    ring_vs_copy::<f16>(&gpu, &mut rng, EngramDecodeShape::new(3, 100, 256, 12, 4, 3), 60);
    // L = (K−1)·δ: the oldest row is a tap and the slot the step overwrites.
    ring_vs_copy::<bf16>(&gpu, &mut rng, EngramDecodeShape::new(2, 64, 64, 6, 4, 2), 40);
    ring_vs_copy::<bf16>(&gpu, &mut rng, EngramDecodeShape::new(8, 512, 256, 18, 4, 3), 40);
    // The general (unvectorised) kernel, K = 1 and L = 1.
    ring_vs_copy::<f16>(&gpu, &mut rng, EngramDecodeShape::new(3, 50, 100, 5, 2, 5), 30);
    ring_vs_copy::<bf16>(&gpu, &mut rng, EngramDecodeShape::new(2, 16, 16, 1, 1, 1), 5);
}

/// Relative L2 error of 16-bit outputs against f64 values.
fn rel_l2<T: Half>(ours: &[T], reference: &[f64]) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for (o, r) in ours.iter().zip(reference) {
        num += (o.to_f64() - r).powi(2);
        den += r * r;
    }
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
}

/// 50 steps, each fed the previous step's state. Every step passes the chain of checks on its
/// own input state, and against an independent f64 rollout (the reference's own roundings and
/// states throughout) the normwise error stays under a fixed bound at every step: it does not
/// grow with the number of steps.
fn rollout<T: DecodeElem>(gpu: &Gpu, rng: &mut StdRng, s: EngramDecodeShape, bound: f64) {
    let steps = 50;
    let mut c = gen::<T>(rng, s, VARIED);
    let l = s.lens().unwrap();
    let mut plan = plan_for(gpu, s);
    let mut state = c.state.clone();
    let mut ref_state = c.state.clone();
    let mut worst = Worst::default();
    let mut errs = Vec::new();
    for step in 0..steps {
        c.e = randn_half(rng, l.e, VARIED.e);
        c.h = randn_half(rng, l.h, VARIED.h);
        let dev = upload(gpu, &c);
        let o = step_copy(gpu, &mut plan, &dev, &state);
        worst = worst.max(check(&c, &state, &o, &format!("rollout step {step}")));
        let r = rf::engram_decode_fwd(&s, &c.refs(&ref_state), DecodeGiven::default());
        let (ey, es) = (rel_l2(&o.y, &r.y_t.value), rel_l2(&o.state, &r.new_conv_state.value));
        assert!(ey <= bound && es <= bound, "{s:?} step {step}: rel_l2 y {ey:.3e}, state {es:.3e} > {bound:.1e}");
        errs.push((ey, es));
        state = o.state;
        ref_state = r.new_conv_state.value.iter().map(|&v| T::round_f64(v)).collect();
    }
    let head = errs[..10].iter().fold(0f64, |m, e| m.max(e.0).max(e.1));
    let tail = errs[steps - 10..].iter().fold(0f64, |m, e| m.max(e.0).max(e.1));
    println!(
        "{} {s:?}: worst {worst:?}; rel_l2 vs f64 rollout: steps 0-9 ≤ {head:.3e}, steps 40-49 ≤ {tail:.3e}",
        T::NAME
    );
}

#[test]
fn rollout_50_steps_errors_do_not_grow() {
    let Some(gpu) = gpu_or_skip("engram_decode::rollout") else { return };
    let mut rng = fresh_rng("engram_decode::rollout");
    // Bounds: a few times the rounding error of the dtype (unit roundoff 2^-11 / 2^-8).
    rollout::<f16>(&gpu, &mut rng, EngramDecodeShape::new(4, 1024, 512, 20, 4, 5), 2f64.powi(-8));
    rollout::<bf16>(&gpu, &mut rng, EngramDecodeShape::new(8, 512, 256, 18, 4, 3), 2f64.powi(-5));
    rollout::<f16>(&gpu, &mut rng, EngramDecodeShape::new(3, 100, 1000, 6, 4, 2), 2f64.powi(-8));
}

#[test]
fn zero_and_large_inputs_stay_finite() {
    let Some(gpu) = gpu_or_skip("engram_decode::extremes") else { return };
    let mut rng = fresh_rng("engram_decode::extremes");
    let s = EngramDecodeShape::new(3, 256, 256, 12, 4, 3);
    let mut c = gen::<f16>(&mut rng, s, VARIED);
    // Row 0: e = 0 (kk = vv = 0, so q(vh) = 0 and u = 0); row 1: h = 0; row 2: large h.
    for v in &mut c.e[..256] {
        *v = f16::ZERO;
    }
    for v in &mut c.h[256..512] {
        *v = f16::ZERO;
    }
    for (i, v) in c.h[512..].iter_mut().enumerate() {
        *v = f16::from_f32(if i % 2 == 0 { 3.0e4 } else { -1.0e4 });
    }
    let dev = upload(&gpu, &c);
    let mut plan = plan_for(&gpu, s);
    let o = step_copy(&gpu, &mut plan, &dev, &c.state);
    check(&c, &c.state, &o, "extremes");
    assert!(o.y.iter().chain(&o.state).all(|v| v.to_f64().is_finite()));
}

#[test]
fn bad_input_is_an_error_naming_the_argument() {
    for (s, arg) in [
        (EngramDecodeShape::new(0, 8, 8, 4, 4, 1), "batch"),
        (EngramDecodeShape::new(1, 0, 8, 4, 4, 1), "d_mem"),
        (EngramDecodeShape::new(1, 8, 0, 4, 4, 1), "d"),
        (EngramDecodeShape::new(1, 8, 8, 0, 1, 1), "max_conv_len"),
        (EngramDecodeShape::new(1, 8, 8, 4, 0, 1), "kernel_size"),
        (EngramDecodeShape::new(1, 8, 8, 4, 4, 0), "dilation"),
        (EngramDecodeShape::new(1, 8, 8, 8, 4, 3), "max_conv_len"),
        (EngramDecodeShape::new(1, 8, 8, 4, 6, 1), "max_conv_len"),
        (EngramDecodeShape { eps: f32::NAN, ..EngramDecodeShape::new(1, 8, 8, 4, 4, 1) }, "eps"),
        (EngramDecodeShape::new(1 << 20, 1 << 12, 8, 4, 4, 1), "e_t"),
        (EngramDecodeShape::new(1, 1 << 16, 1 << 16, 4, 4, 1), "w_k"),
        (EngramDecodeShape::new(64, 8, 1 << 20, 64, 4, 1), "conv_state"),
        (EngramDecodeShape::new(usize::MAX, 8, 8, 4, 4, 1), "e_t"),
    ] {
        match s.lens() {
            Err(Error::Shape { arg: a, .. }) | Err(Error::Overflow { arg: a, .. }) => assert_eq!(a, arg, "{s:?}"),
            other => panic!("{s:?}: expected an error naming {arg}, got {other:?}"),
        }
    }
    // The smallest valid shapes are accepted.
    EngramDecodeShape::new(1, 1, 1, 1, 1, 1).lens().unwrap();
    EngramDecodeShape::new(1, 1, 1, 3, 4, 1).lens().unwrap();

    let Some(gpu) = gpu_or_skip("engram_decode::bad_input") else { return };
    let s = EngramDecodeShape::new(2, 16, 8, 4, 2, 2);
    let l = s.lens().unwrap();
    let st = gpu.stream();
    let ok = |n: usize| st.alloc_zeros::<bf16>(n).unwrap();
    let small = |n: usize| st.alloc_zeros::<bf16>(n - 1).unwrap();
    let mut plan = EngramDecodePlan::new(&gpu, s).unwrap();
    let sizes = [l.e, l.h, l.w, l.w, l.rms, l.rms, l.conv_w];
    let names = ["e_t", "h_t", "w_k", "w_v", "rms_w_h", "rms_w_v", "conv_w"];
    let expect = |r: rgk::Result<()>, arg: &str| match r {
        Err(Error::BufferTooSmall { arg: a, .. }) => assert_eq!(a, arg),
        other => panic!("expected BufferTooSmall({arg}), got {other:?}"),
    };
    for (bad, name) in names.iter().enumerate() {
        let bufs: Vec<CudaSlice<bf16>> =
            sizes.iter().enumerate().map(|(i, &n)| if i == bad { small(n) } else { ok(n) }).collect();
        let inputs = decode_inputs(&bufs);
        let (cs, mut y, mut ns) = (ok(l.state), ok(l.h), ok(l.state));
        let r = plan.forward(&gpu, inputs, &cs, DecodeOutputs { y_t: &mut y, new_conv_state: &mut ns });
        assert_eq!(r.as_ref().err().and_then(|e| e.arg()), Some(*name));
        expect(r, name);
    }
    let bufs: Vec<CudaSlice<bf16>> = sizes.iter().map(|&n| ok(n)).collect();
    let inputs = decode_inputs(&bufs);
    expect(
        plan.forward(
            &gpu,
            inputs,
            &small(l.state),
            DecodeOutputs { y_t: &mut ok(l.h), new_conv_state: &mut ok(l.state) },
        ),
        "conv_state",
    );
    expect(
        plan.forward(
            &gpu,
            inputs,
            &ok(l.state),
            DecodeOutputs { y_t: &mut small(l.h), new_conv_state: &mut ok(l.state) },
        ),
        "y_t",
    );
    expect(
        plan.forward(
            &gpu,
            inputs,
            &ok(l.state),
            DecodeOutputs { y_t: &mut ok(l.h), new_conv_state: &mut small(l.state) },
        ),
        "new_conv_state",
    );
    match plan.step_ring(&gpu, inputs, &mut small(l.state), 0, &mut ok(l.h)) {
        Err(Error::BufferTooSmall { arg: "state", .. }) => {}
        other => panic!("expected BufferTooSmall(state), got {other:?}"),
    }
    match plan.step_ring(&gpu, inputs, &mut ok(l.state), 4, &mut ok(l.h)) {
        Err(Error::Shape { arg: "pos", .. }) => {}
        other => panic!("expected Shape(pos), got {other:?}"),
    }
    // A valid call still works after the rejected ones (no launch happened).
    plan.forward(&gpu, inputs, &ok(l.state), DecodeOutputs { y_t: &mut ok(l.h), new_conv_state: &mut ok(l.state) })
        .unwrap();
    assert_eq!(plan.step_ring(&gpu, inputs, &mut ok(l.state), 3, &mut ok(l.h)).unwrap(), 0);
    st.synchronize().unwrap();
}

/// The seven read-only inputs from buffers in the order of docs/ops.md.
fn decode_inputs<T>(b: &[CudaSlice<T>]) -> DecodeInputs<'_, T> {
    DecodeInputs { e_t: &b[0], h_t: &b[1], w_k: &b[2], w_v: &b[3], rms_w_h: &b[4], rms_w_v: &b[5], conv_w: &b[6] }
}
