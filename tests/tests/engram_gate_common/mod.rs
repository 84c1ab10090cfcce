//! Shared by the EngramGateConv tests: input generation, the checks of every output against
//! the f64 references (the same checks judge the kernels on the GPU and on the CPU, in
//! `sim/tests/engram_gate.rs`).
#![allow(dead_code)]
use rand::rngs::StdRng;
use rgk::engram::EngramGateShape;
use rgk::reference::{engram_gate_bwd, engram_gate_fwd, RefOutput};
use rgk::verify::{check_float, check_half, Half, Report};
use rgk_tests::{randn_f32, randn_half};

/// dtype outputs: ulp bound on top of the magnitude slack (docs/ops.md "Tolerances").
pub const MAX_ULP: f64 = 2.0;
/// f32 outputs: relative error per element (plus `2^-20·magnitude`) and relative L2 bound.
pub const F32_REL: f64 = 1e-4;

/// One problem: inputs of the forward and backward (`dy` for the backward).
pub struct GateInputs<T> {
    pub s: EngramGateShape,
    pub h: Vec<T>,
    pub k: Vec<T>,
    pub v: Vec<T>,
    pub wh: Vec<T>,
    pub wv: Vec<T>,
    pub cw: Vec<T>,
    pub dy: Vec<T>,
}

/// The seed's distributions times `scale` (H ~ randn, k, v ~ 0.1·randn, conv_w ~ 0.02·randn,
/// dY ~ 0.1·randn); rms weights 1, or `1 + 0.2·randn` when `unit_weights` is false.
pub fn gen<T: Half>(rng: &mut StdRng, s: EngramGateShape, scale: f32, unit_weights: bool) -> GateInputs<T> {
    let (n, _) = s.lens().unwrap();
    let w = |rng: &mut StdRng| -> Vec<T> {
        if unit_weights {
            vec![T::round_f64(1.0); s.d]
        } else {
            randn_f32(rng, s.d, 0.2).into_iter().map(|x| T::round_f64(1.0 + x as f64)).collect()
        }
    };
    GateInputs {
        s,
        h: randn_half(rng, n, scale),
        k: randn_half(rng, n, 0.1 * scale),
        v: randn_half(rng, n, 0.1 * scale),
        wh: w(rng),
        wv: w(rng),
        cw: randn_half(rng, 4 * s.d, 0.02),
        dy: randn_half(rng, n, 0.1),
    }
}

/// Forward outputs as read back.
pub struct FwdOut<T> {
    pub y: Vec<T>,
    pub vhat: Vec<T>,
    pub alpha: Vec<f32>,
    pub rrms_h: Vec<f32>,
    pub rrms_k: Vec<f32>,
    pub rrms_v: Vec<f32>,
}

/// Backward outputs as read back.
pub struct BwdOut<T> {
    pub dh: Vec<T>,
    pub dk: Vec<T>,
    pub dv: Vec<T>,
    pub drms_w_h: Vec<f32>,
    pub drms_w_v: Vec<f32>,
    pub dconv_w: Vec<f32>,
}

/// Worst errors seen over the checked outputs: (output, max ulp or rel_l2).
#[derive(Default, Debug, Clone)]
pub struct Worst {
    pub ulp: Vec<(&'static str, f64)>,
    pub rel_l2: Vec<(&'static str, f64)>,
}

impl Worst {
    pub fn merge(&mut self, o: &Worst) {
        for (n, v) in &o.ulp {
            upd(&mut self.ulp, n, *v);
        }
        for (n, v) in &o.rel_l2 {
            upd(&mut self.rel_l2, n, *v);
        }
    }
}

fn upd(list: &mut Vec<(&'static str, f64)>, n: &'static str, v: f64) {
    match list.iter_mut().find(|e| e.0 == n) {
        Some(e) => e.1 = e.1.max(v),
        None => list.push((n, v)),
    }
}

fn half(w: &mut Worst, what: &str, name: &'static str, ours: &[impl Half], r: &RefOutput) -> Report {
    let rep = check_half(ours, r, MAX_ULP);
    assert!(rep.passed(), "{what}: {name}: {rep}");
    upd(&mut w.ulp, name, rep.max_ulp);
    upd(&mut w.rel_l2, name, rep.rel_l2_err);
    rep
}

fn float(w: &mut Worst, what: &str, name: &'static str, ours: &[f32], r: &RefOutput) -> Report {
    let o: Vec<f64> = ours.iter().map(|&x| x as f64).collect();
    let rep = check_float(&o, r, F32_REL);
    assert!(rep.passed() && rep.rel_l2_err <= F32_REL, "{what}: {name}: {rep}");
    upd(&mut w.rel_l2, name, rep.rel_l2_err);
    rep
}

/// Checks every forward output. `vhat` first; then the reference for `y`, `rrms_v` is formed
/// from our `vhat` (see `engram_gate_fwd`).
pub fn check_fwd<T: Half>(what: &str, x: &GateInputs<T>, o: &FwdOut<T>) -> Worst {
    let mut w = Worst::default();
    let r0 = engram_gate_fwd(x.s, &x.h, &x.k, &x.v, &x.wh, &x.wv, &x.cw, None);
    half(&mut w, what, "vhat", &o.vhat, &r0.vhat);
    let r = engram_gate_fwd(x.s, &x.h, &x.k, &x.v, &x.wh, &x.wv, &x.cw, Some(&o.vhat));
    half(&mut w, what, "Y", &o.y, &r.y);
    float(&mut w, what, "alpha", &o.alpha, &r.alpha);
    float(&mut w, what, "rrms_h", &o.rrms_h, &r.rrms_h);
    float(&mut w, what, "rrms_k", &o.rrms_k, &r.rrms_k);
    float(&mut w, what, "rrms_v", &o.rrms_v, &r.rrms_v);
    w
}

/// Checks every backward output against the q-free f64 gradients.
pub fn check_bwd<T: Half>(what: &str, x: &GateInputs<T>, o: &BwdOut<T>) -> Worst {
    let mut w = Worst::default();
    let r = engram_gate_bwd(x.s, &x.dy, &x.h, &x.k, &x.v, &x.wh, &x.wv, &x.cw);
    half(&mut w, what, "dH", &o.dh, &r.dh);
    half(&mut w, what, "dk", &o.dk, &r.dk);
    half(&mut w, what, "dv", &o.dv, &r.dv);
    float(&mut w, what, "drms_w_h", &o.drms_w_h, &r.drms_w_h);
    float(&mut w, what, "drms_w_v", &o.drms_w_v, &r.drms_w_v);
    float(&mut w, what, "dconv_w", &o.dconv_w, &r.dconv_w);
    w
}
pub mod gpu;

/// The shape sweep, T ∈ {1,2,3,4,5,257} × M ∈ {1,7} × d ∈ {8,256,1000,4096} (M = 7,
/// T = 257, d = 4096 is left to M = 1: CPU reference time), each with its scale (1 or 100,
/// alternating) and dtype (`true`: f16 every third case, else bf16).
pub fn sweep_cases() -> Vec<(EngramGateShape, f32, bool)> {
    let mut v = Vec::new();
    for t in [1, 2, 3, 4, 5, 257] {
        for m in [1, 7] {
            for d in [8, 256, 1000, 4096] {
                if m * t * d > 2_000_000 {
                    continue;
                }
                let n = v.len();
                v.push((EngramGateShape { m, t, d }, if n % 2 == 0 { 1.0 } else { 100.0 }, n % 3 == 0));
            }
        }
    }
    v
}

/// Feature sizes that take every kernel path: register-resident NV = 1..4, streaming vectorised
/// (d > 1024; d = 8192 puts the backward's dconv scratch in global memory), scalar (d % 8 ≠ 0).
pub const PATH_DS: [usize; 12] = [8, 200, 256, 264, 512, 768, 1024, 1032, 2048, 8192, 13, 1000];
