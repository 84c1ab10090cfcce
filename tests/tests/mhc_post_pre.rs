//! MHCPostPreFwd (docs/ops.md §7) through its public entry point: the stored `x_out` bit for bit
//! against the CPU's f32 FMA and bf16 rounding; the pre half's outputs within 1 ulp (bf16) and
//! 1e-5 (h_post) of the f64 reference on that `x_out`, every element, outputs poisoned first;
//! and every output bitwise equal to MHCPostFwd then MHCPreFwd run back to back. Seed shapes,
//! odd and unaligned shapes (the scalar paths), several calls on one workspace, `x_out` asked
//! for and not, and the shapes that run the two ops back to back.
use rand::rngs::StdRng;
use rgk::cudarc::driver::CudaSlice;
use rgk::mhc::{
    post_fwd, MhcPostInputs, MhcPostOutputs, MhcPostPre, MhcPostPreInputs, MhcPostPreOutputs, MhcPostShape, MhcPre,
    MhcPreInputs, MhcPreOutputs, MhcPreParams, MhcPreShape,
};
use rgk::reference::mhc_post_pre_fwd;
use rgk::verify::{check_float, check_half, poisoned};
use rgk::{bf16, Error, Gpu};
use rgk_tests::{fresh_rng, gpu_or_skip, randn_f32, randn_half};

#[derive(Clone)]
struct Inputs {
    x_layer_out: Vec<bf16>,
    h_post: Vec<f32>,
    x_res: Vec<bf16>,
    phi: Vec<f32>,
    b: Vec<f32>,
}

fn inputs(rng: &mut StdRng, s: MhcPreShape, phi_scale: f32) -> Inputs {
    let l = s.lens().unwrap();
    Inputs {
        x_layer_out: randn_half(rng, l.x_layer, 1.0),
        // h_post = 2·σ(·) as the previous layer's pre half makes it: values in (0, 2).
        h_post: randn_f32(rng, l.h_post, 1.0).into_iter().map(|v| 2.0 / (1.0 + (-v).exp())).collect(),
        x_res: randn_half(rng, l.x, 1.0),
        phi: randn_f32(rng, l.phi, phi_scale),
        b: randn_f32(rng, l.b, 1.0),
    }
}

#[derive(Debug, PartialEq)]
struct Outputs {
    x_out: Option<Vec<bf16>>,
    x_res: Vec<bf16>,
    x_layer: Vec<bf16>,
    h_post: Vec<f32>,
}

/// Element offsets of a case's buffers: `x_layer_out`, `x_res`, and the first call's `x_out`
/// (0: 256-byte aligned; 1: the vector paths that touch the buffer fall back to scalar ones).
#[derive(Clone, Copy, Debug)]
struct Offsets {
    y: usize,
    r: usize,
    x_out: usize,
}

const ALIGNED: Offsets = Offsets { y: 0, r: 0, x_out: 0 };

/// The device buffers of one call, the inputs at their offsets.
struct Dev {
    x_layer_out: CudaSlice<bf16>,
    h_post: CudaSlice<f32>,
    x_res: CudaSlice<bf16>,
    phi: CudaSlice<f32>,
    b: CudaSlice<f32>,
    off: Offsets,
}

fn upload(gpu: &Gpu, inp: &Inputs, off: Offsets) -> Dev {
    let st = gpu.stream();
    let pad = |v: &[bf16], o: usize| [vec![bf16::ZERO; o], v.to_vec()].concat();
    Dev {
        x_layer_out: st.clone_htod(&pad(&inp.x_layer_out, off.y)).unwrap(),
        h_post: st.clone_htod(&inp.h_post).unwrap(),
        x_res: st.clone_htod(&pad(&inp.x_res, off.r)).unwrap(),
        phi: st.clone_htod(&inp.phi).unwrap(),
        b: st.clone_htod(&inp.b).unwrap(),
        off,
    }
}

/// One fused call with poisoned outputs, read back: `x_out` into `xo` (one element longer than
/// x_out, kept across calls) at element offset `xo_off`, or, with `xo_off` None, not asked for —
/// then `xo`, which earlier calls wrote, must keep its poison (a replayed graph of an earlier
/// call would write it).
fn run_fused(
    gpu: &Gpu,
    op: &mut MhcPostPre,
    p: MhcPreParams,
    d: &Dev,
    xo: &mut CudaSlice<bf16>,
    xo_off: Option<usize>,
) -> Outputs {
    let l = op.plan().shape.lens().unwrap();
    let st = gpu.stream();
    st.memcpy_htod(&poisoned::<bf16>(l.x + 1), xo).unwrap();
    let mut r = st.clone_htod(&poisoned::<bf16>(l.x)).unwrap();
    let mut y = st.clone_htod(&poisoned::<bf16>(l.x_layer)).unwrap();
    let mut h = st.clone_htod(&vec![f32::NAN; l.h_post]).unwrap();
    let inputs = MhcPostPreInputs {
        x_layer_out: &d.x_layer_out.slice(d.off.y..),
        h_post: &d.h_post,
        x_res: &d.x_res.slice(d.off.r..),
        phi: &d.phi,
        b: &d.b,
    };
    let o = xo_off.unwrap_or(0);
    let mut xo_view = xo.slice_mut(o..o + l.x);
    let x_out = xo_off.map(|_| &mut xo_view as &mut dyn rgk::cudarc::driver::DevicePtrMut<bf16>);
    op.run(gpu, p, inputs, MhcPostPreOutputs { x_out, x_res: &mut r, x_layer: &mut y, h_post: &mut h }).unwrap();
    let xo_host: Vec<bf16> = st.clone_dtoh(&*xo).unwrap();
    if xo_off.is_none() {
        let poison = poisoned::<bf16>(1)[0].to_bits();
        assert!(xo_host.iter().all(|v| v.to_bits() == poison), "x_out written unasked");
    }
    Outputs {
        x_out: xo_off.map(|o| xo_host[o..o + l.x].to_vec()),
        x_res: st.clone_dtoh(&r).unwrap(),
        x_layer: st.clone_dtoh(&y).unwrap(),
        h_post: st.clone_dtoh(&h).unwrap(),
    }
}

/// MHCPostFwd then MHCPreFwd, our two ops back to back.
fn run_back_to_back(gpu: &Gpu, pre: &mut MhcPre, p: MhcPreParams, d: &Dev) -> Outputs {
    let s = pre.plan().shape;
    let l = s.lens().unwrap();
    let st = gpu.stream();
    let mut xo = st.clone_htod(&poisoned::<bf16>(l.x)).unwrap();
    let post_in = MhcPostInputs {
        x_layer_out: &d.x_layer_out.slice(d.off.y..),
        h_post: &d.h_post,
        x_res: &d.x_res.slice(d.off.r..),
    };
    let post_shape = MhcPostShape { batch: s.batch, n: s.n, c: s.c };
    post_fwd(gpu, post_shape, post_in, MhcPostOutputs { x_out: &mut xo }).unwrap();
    let mut r = st.clone_htod(&poisoned::<bf16>(l.x)).unwrap();
    let mut y = st.clone_htod(&poisoned::<bf16>(l.x_layer)).unwrap();
    let mut h = st.clone_htod(&vec![f32::NAN; l.h_post]).unwrap();
    let pre_in = MhcPreInputs { phi: &d.phi, x: &xo, b: &d.b };
    pre.run(gpu, p, pre_in, MhcPreOutputs { x_res: &mut r, x_layer: &mut y, h_post: &mut h }).unwrap();
    Outputs {
        x_out: Some(st.clone_dtoh(&xo).unwrap()),
        x_res: st.clone_dtoh(&r).unwrap(),
        x_layer: st.clone_dtoh(&y).unwrap(),
        h_post: st.clone_dtoh(&h).unwrap(),
    }
}

fn bits<T: Copy, U>(v: &[T], f: impl Fn(T) -> U) -> Vec<U> {
    v.iter().map(|&x| f(x)).collect()
}

/// Checks one shape: three calls (new inputs on the second), `x_out` asked for on the first
/// two (the first at `off.x_out`, the second aligned) and not on the third; the reference and
/// the back-to-back ops on every call. Returns whether it ran fused.
fn check_shape(gpu: &Gpu, rng: &mut StdRng, s: MhcPreShape, p: MhcPreParams, phi_scale: f32, off: Offsets) -> bool {
    let mut op = MhcPostPre::new(gpu, s).unwrap();
    let mut pre = MhcPre::new(gpu, s).unwrap();
    let mut inp = inputs(rng, s, phi_scale);
    let mut xo = gpu.stream().alloc_zeros::<bf16>(s.lens().unwrap().x + 1).unwrap();
    for call in 0..3 {
        if call == 1 {
            inp = inputs(rng, s, phi_scale);
        }
        let d = upload(gpu, &inp, off);
        let xo_off = [Some(off.x_out), Some(0), None][call];
        let ours = run_fused(gpu, &mut op, p, &d, &mut xo, xo_off);
        let what = format!("{s:?} {p:?} {off:?} call {call} fused {}", op.is_fused());
        let (x_out, r) = mhc_post_pre_fwd(s, p, &inp.x_layer_out, &inp.h_post, &inp.x_res, &inp.phi, &inp.b);
        if let Some(xo) = &ours.x_out {
            assert_eq!(bits(xo, bf16::to_bits), bits(&x_out, bf16::to_bits), "{what}: x_out");
        }
        let a = check_half(&ours.x_res, &r.x_res, 1.0);
        let b = check_half(&ours.x_layer, &r.x_layer, 1.0);
        let h: Vec<f64> = ours.h_post.iter().map(|&v| v as f64).collect();
        let c = check_float(&h, &r.h_post, 1e-5);
        assert!(a.passed() && b.passed() && c.passed(), "{what}:\n  x_res: {a}\n  x_layer: {b}\n  h_post: {c}");
        let theirs = run_back_to_back(gpu, &mut pre, p, &d);
        assert_eq!(bits(&ours.x_res, bf16::to_bits), bits(&theirs.x_res, bf16::to_bits), "{what}: x_res bits");
        assert_eq!(bits(&ours.x_layer, bf16::to_bits), bits(&theirs.x_layer, bf16::to_bits), "{what}: x_layer bits");
        assert_eq!(bits(&ours.h_post, f32::to_bits), bits(&theirs.h_post, f32::to_bits), "{what}: h_post bits");
        println!("{what}: x_res {:.3} ulp, x_layer {:.3} ulp, h_post {:.2e}", a.max_ulp, b.max_ulp, c.rel_l2_err);
    }
    op.is_fused()
}

#[test]
fn seed_workloads() {
    let Some(gpu) = gpu_or_skip("mhc_post_pre::seed_workloads") else { return };
    let mut rng = fresh_rng("mhc_post_pre::seed_workloads");
    for (batch, c) in [(1, 1280), (2, 1920), (4, 2560)] {
        let s = MhcPreShape { batch, n: 4, c };
        assert!(check_shape(&gpu, &mut rng, s, MhcPreParams::default(), 1.0, ALIGNED), "{s:?} not fused");
        // hidden-2560 runs the `_acc2` pair (64 kernel-1 blocks × 2 groups) wherever the grid
        // reaches 64 blocks (64 SMs or more, as the H200's 132).
        let plan = *MhcPostPre::new(&gpu, s).unwrap().plan();
        if batch == 4 && plan.partials.grid() == 64 {
            assert_eq!(plan.partials.acc_copies(), 2, "{plan:?}");
        }
    }
}

/// Odd c, c not a multiple of 8, batch over one MMA group, n from 1 to 4, unaligned inputs (the
/// scalar staging and Σx² paths), several parameter sets; and shapes outside the fused class
/// (n > 4; a phi slab beyond shared memory), which run the two ops back to back.
#[test]
fn shape_sweep() {
    let Some(gpu) = gpu_or_skip("mhc_post_pre::shape_sweep") else { return };
    let mut rng = fresh_rng("mhc_post_pre::shape_sweep");
    let params = [
        MhcPreParams { alpha_pre: 0.7, alpha_post: 1.3, alpha_res: 1.9, sinkhorn_repeat: 0, sinkhorn_eps: 0.02 },
        MhcPreParams::default(),
        MhcPreParams { alpha_pre: 1.4, alpha_post: 0.6, alpha_res: 0.8, sinkhorn_repeat: 20, sinkhorn_eps: 0.02 },
    ];
    let unaligned = Offsets { y: 1, r: 1, x_out: 1 };
    let cases = [
        ((1, 4, 1280), unaligned, true),
        ((3, 4, 7), ALIGNED, true),
        ((2, 2, 100), ALIGNED, true),
        ((9, 3, 40), ALIGNED, true),
        ((5, 1, 4099), unaligned, true),
        ((17, 4, 256), ALIGNED, true),
        // 8 columns per block: kernel 1's 16-byte path, then each buffer misaligned alone.
        ((9, 4, 512), ALIGNED, true),
        ((9, 4, 512), Offsets { y: 0, r: 0, x_out: 1 }, true),
        ((2, 4, 512), Offsets { y: 1, r: 0, x_out: 0 }, true),
        ((2, 4, 512), Offsets { y: 0, r: 1, x_out: 0 }, true),
        ((2, 8, 64), ALIGNED, false),
        ((1, 4, 70_000), ALIGNED, false),
    ];
    for (i, ((batch, n, c), off, fused)) in cases.into_iter().enumerate() {
        let s = MhcPreShape { batch, n, c };
        let phi_scale = if c % 2 == 1 { 1.0 / ((n * c) as f32).sqrt() } else { 1.0 };
        let ran_fused = check_shape(&gpu, &mut rng, s, params[i % 3], phi_scale, off);
        assert_eq!(ran_fused, fused, "{s:?}");
    }
}

/// Short buffers are errors naming the buffer, before any launch.
#[test]
fn short_buffers_are_errors() {
    let Some(gpu) = gpu_or_skip("mhc_post_pre::short_buffers_are_errors") else { return };
    let s = MhcPreShape { batch: 2, n: 4, c: 64 };
    let l = s.lens().unwrap();
    let st = gpu.stream();
    let mut op = MhcPostPre::new(&gpu, s).unwrap();
    let (y, h, r) = (
        st.alloc_zeros::<bf16>(l.x_layer).unwrap(),
        st.alloc_zeros::<f32>(l.h_post).unwrap(),
        st.alloc_zeros::<bf16>(l.x).unwrap(),
    );
    let (phi, b) = (st.alloc_zeros::<f32>(l.phi).unwrap(), st.alloc_zeros::<f32>(l.b).unwrap());
    let mut nr = st.alloc_zeros::<bf16>(l.x).unwrap();
    let mut nl = st.alloc_zeros::<bf16>(l.x_layer).unwrap();
    let mut nh = st.alloc_zeros::<f32>(l.h_post).unwrap();
    let mut xo = st.alloc_zeros::<bf16>(l.x - 1).unwrap();
    let p = MhcPreParams::default();
    let res = op.run(
        &gpu,
        p,
        MhcPostPreInputs { x_layer_out: &y.slice(1..), h_post: &h, x_res: &r, phi: &phi, b: &b },
        MhcPostPreOutputs { x_out: None, x_res: &mut nr, x_layer: &mut nl, h_post: &mut nh },
    );
    assert!(matches!(res, Err(Error::BufferTooSmall { arg: "x_layer_out", .. })), "{res:?}");
    let res = op.run(
        &gpu,
        p,
        MhcPostPreInputs { x_layer_out: &y, h_post: &h, x_res: &r, phi: &phi, b: &b },
        MhcPostPreOutputs { x_out: Some(&mut xo), x_res: &mut nr, x_layer: &mut nl, h_post: &mut nh },
    );
    assert!(matches!(res, Err(Error::BufferTooSmall { arg: "x_out", .. })), "{res:?}");
    let bad = MhcPreParams { sinkhorn_eps: 0.0, ..p };
    let res = op.run(
        &gpu,
        bad,
        MhcPostPreInputs { x_layer_out: &y, h_post: &h, x_res: &r, phi: &phi, b: &b },
        MhcPostPreOutputs { x_out: None, x_res: &mut nr, x_layer: &mut nl, h_post: &mut nh },
    );
    assert!(matches!(res, Err(Error::Shape { arg: "sinkhorn_eps", .. })), "{res:?}");
    st.synchronize().unwrap();
}
