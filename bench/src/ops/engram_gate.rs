//! EngramGateConvFwd / EngramGateConvBwd workloads (docs/ops.md §4–§5 and the seed table).
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, DeviceRepr};
use rand::rngs::StdRng;
use rgk::engram::{self, bwd_workspace_len, EngramGateShape};
use rgk::reference::{engram_gate_bwd, engram_gate_fwd, EngramGateBwdRef, EngramGateFwdRef, RefOutput};
use rgk::verify::{check_float, check_half, poisoned, Half, Report};
use rgk::{bf16, f16, Gpu};
use safetensors::Dtype;

use crate::case::{variant_name, Case, Tensor, Verification, Workload};
use crate::ops::mhc::FP32_PEAK;
use rgk_tests::randn_half;

/// The seed's rows: (name, M, T, d, f16?).
const SEED: [(&str, usize, usize, usize, bool); 4] = [
    ("train-s32", 1, 32, 256, true),
    ("train-s64", 2, 64, 512, true),
    ("train-s128", 1, 128, 256, false),
    ("train-s96", 3, 96, 768, false),
];

/// dtype outputs: ulp bound (plus the reference's magnitude slack); f32 outputs: relative.
const MAX_ULP: f64 = 2.0;
const F32_REL: f64 = 1e-4;

/// Forward rows then backward rows, each what the planner launches for the shape; with
/// `variants`, also `WORKLOAD@nograph` for the backward (its two launches submitted directly
/// instead of as one CUDA graph: the reduce kernel's dependent launch then reaches the device
/// too late to overlap the main kernel). The tuning table's measured alternatives are in
/// docs/decisions/engram_gate.md.
pub fn workloads(variants: bool) -> Vec<Workload> {
    let mut v = Vec::new();
    let mut bwd_tags: Vec<Option<&'static str>> = vec![None];
    if variants {
        bwd_tags.push(Some("nograph"));
    }
    for &(name, m, t, d, is_f16) in &SEED {
        let s = EngramGateShape { m, t, d };
        let (n, rows) = ((m * t * d) as f64, (m * t) as f64);
        v.push(Workload {
            op: "EngramGateConvFwd",
            name: variant_name(name, None),
            dtype: if is_f16 { "f16" } else { "bf16" },
            shapes: format!("H, k, v [{m},{t},{d}]; rms_w_h, rms_w_v [{d}]; conv_w [4,{d}]"),
            // 3 squares/products of the gate (6), vh, q, vhat² (3), u (2), conv (8), silu (4), + (1)
            flops: 24.0 * n,
            // H, k, v, weights in; Y, vhat, four [M,T] f32 out
            bytes: 2.0 * 3.0 * n + 2.0 * 6.0 * d as f64 + 2.0 * 2.0 * n + 4.0 * 4.0 * rows,
            peak_flops: FP32_PEAK,
            prepare: Box::new(move |gpu, rng| {
                Ok(if is_f16 {
                    Box::new(FwdCase::<f16>::new(gpu, rng, s)?) as Box<dyn Case>
                } else {
                    Box::new(FwdCase::<bf16>::new(gpu, rng, s)?) as Box<dyn Case>
                })
            }),
        });
    }
    for &(name, m, t, d, is_f16) in &SEED {
        let s = EngramGateShape { m, t, d };
        let (n, rows) = ((m * t * d) as f64, (m * t) as f64);
        for &tag in &bwd_tags {
            let graph = tag != Some("nograph");
            v.push(Workload {
                op: "EngramGateConvBwd",
                name: variant_name(name, tag),
                dtype: if is_f16 { "f16" } else { "bf16" },
                shapes: format!("dY, H, k, v [{m},{t},{d}]; rms_w_h, rms_w_v [{d}]; conv_w [4,{d}]"),
                flops: 60.0 * n,
                // dY, H, k, v, weights, alpha/rrms_h/rrms_k in; dH, dk, dv, 6·d f32 out
                bytes: 2.0 * 4.0 * n + 2.0 * 6.0 * d as f64 + 3.0 * 4.0 * rows + 2.0 * 3.0 * n + 4.0 * 6.0 * d as f64,
                peak_flops: FP32_PEAK,
                prepare: Box::new(move |gpu, rng| {
                    Ok(if is_f16 {
                        Box::new(BwdCase::<f16>::new(gpu, rng, s, graph)?) as Box<dyn Case>
                    } else {
                        Box::new(BwdCase::<bf16>::new(gpu, rng, s, graph)?) as Box<dyn Case>
                    })
                }),
            });
        }
    }
    v
}

/// A 16-bit tensor for the exchange file.
fn th<T: Half>(shape: &[usize], v: &[T]) -> Tensor {
    assert_eq!(std::mem::size_of::<T>(), 2);
    // SAFETY: f16/bf16 are 2-byte plain-old-data.
    let bytes = unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, v.len() * 2) };
    Tensor {
        dtype: if T::NAME == "f16" { Dtype::F16 } else { Dtype::BF16 },
        shape: shape.to_vec(),
        data: bytes.to_vec(),
    }
}

fn tref(shape: &[usize], r: &RefOutput) -> Tensor {
    Tensor::f64(shape, &r.value)
}

/// The seed's inputs: H ~ randn, k, v ~ 0.1·randn, rms weights 1, conv_w ~ 0.02·randn.
struct Inputs<T> {
    s: EngramGateShape,
    h: Vec<T>,
    k: Vec<T>,
    v: Vec<T>,
    wh: Vec<T>,
    wv: Vec<T>,
    cw: Vec<T>,
}

impl<T: Half> Inputs<T> {
    fn new(rng: &mut StdRng, s: EngramGateShape) -> rgk::Result<Self> {
        let (n, _) = s.lens()?;
        Ok(Self {
            s,
            h: randn_half(rng, n, 1.0),
            k: randn_half(rng, n, 0.1),
            v: randn_half(rng, n, 0.1),
            wh: vec![T::round_f64(1.0); s.d],
            wv: vec![T::round_f64(1.0); s.d],
            cw: randn_half(rng, 4 * s.d, 0.02),
        })
    }
    fn tensors(&self) -> Vec<(String, Tensor)> {
        let EngramGateShape { m, t, d } = self.s;
        vec![
            ("H".into(), th(&[m, t, d], &self.h)),
            ("k".into(), th(&[m, t, d], &self.k)),
            ("v".into(), th(&[m, t, d], &self.v)),
            ("rms_w_h".into(), th(&[d], &self.wh)),
            ("rms_w_v".into(), th(&[d], &self.wv)),
            ("conv_w".into(), th(&[4, d], &self.cw)),
        ]
    }
}

fn summarize(reps: Vec<(&str, Report, bool)>) -> Verification {
    let verified = reps.iter().all(|(_, r, ok)| *ok && r.passed());
    let max_abs_err = reps.iter().map(|(_, r, _)| r.max_abs_err).fold(0.0, f64::max);
    let rel_l2_err = reps.iter().map(|(_, r, _)| r.rel_l2_err).fold(0.0, f64::max);
    let detail = reps.iter().map(|(n, r, _)| format!("{n}: {r}")).collect::<Vec<_>>().join("\n");
    Verification { verified, max_abs_err, rel_l2_err, detail }
}

fn f32_check(ours: &[f32], r: &RefOutput) -> (Report, bool) {
    let o: Vec<f64> = ours.iter().map(|&x| x as f64).collect();
    let rep = check_float(&o, r, F32_REL);
    let ok = rep.rel_l2_err <= F32_REL;
    (rep, ok)
}

struct FwdCase<T: Half + DeviceRepr> {
    x: Inputs<T>,
    reference: EngramGateFwdRef,
    ins: [CudaSlice<T>; 6],
    y: CudaSlice<T>,
    vhat: CudaSlice<T>,
    rows: [CudaSlice<f32>; 4],
}

impl<T: Half + DeviceRepr> FwdCase<T> {
    fn new(gpu: &Gpu, rng: &mut StdRng, s: EngramGateShape) -> rgk::Result<Self> {
        let x = Inputs::<T>::new(rng, s)?;
        let reference = engram_gate_fwd(s, &x.h, &x.k, &x.v, &x.wh, &x.wv, &x.cw, None);
        let (n, rows) = s.lens()?;
        let st = gpu.stream();
        let ins = [
            st.clone_htod(&x.h)?,
            st.clone_htod(&x.k)?,
            st.clone_htod(&x.v)?,
            st.clone_htod(&x.wh)?,
            st.clone_htod(&x.wv)?,
            st.clone_htod(&x.cw)?,
        ];
        let f = || st.clone_htod(&vec![f32::NAN; rows]);
        Ok(Self {
            y: st.clone_htod(&poisoned::<T>(n))?,
            vhat: st.clone_htod(&poisoned::<T>(n))?,
            rows: [f()?, f()?, f()?, f()?],
            x,
            reference,
            ins,
        })
    }
}

impl<T: Half + DeviceRepr> Case for FwdCase<T> {
    fn launch(&mut self, gpu: &Gpu) -> rgk::Result<()> {
        let st = gpu.stream();
        let i: Vec<_> = self.ins.iter().map(|b| b.device_ptr(st)).collect();
        let ins = [i[0].0, i[1].0, i[2].0, i[3].0, i[4].0, i[5].0];
        let (y, _g1) = self.y.device_ptr_mut(st);
        let (q, _g2) = self.vhat.device_ptr_mut(st);
        let [r0, r1, r2, r3] = &mut self.rows;
        let (a, _g3) = r0.device_ptr_mut(st);
        let (rh, _g4) = r1.device_ptr_mut(st);
        let (rk, _g5) = r2.device_ptr_mut(st);
        let (rv, _g6) = r3.device_ptr_mut(st);
        // SAFETY: buffers allocated for exactly this shape.
        unsafe {
            let [h, k, v, wh, wv, cw] = ins;
            engram::gate_conv_fwd_raw::<T>(gpu, self.x.s, h, k, v, wh, wv, cw, y, q, a, rh, rk, rv, st.cu_stream())
        }
    }

    fn verify(&mut self, gpu: &Gpu) -> rgk::Result<Verification> {
        let st = gpu.stream();
        st.memcpy_htod(&poisoned::<T>(self.y.len()), &mut self.y)?;
        st.memcpy_htod(&poisoned::<T>(self.vhat.len()), &mut self.vhat)?;
        for r in &mut self.rows {
            st.memcpy_htod(&vec![f32::NAN; r.len()], r)?;
        }
        self.launch(gpu)?;
        let y: Vec<T> = st.clone_dtoh(&self.y)?;
        let vhat: Vec<T> = st.clone_dtoh(&self.vhat)?;
        let rows: Vec<Vec<f32>> = self.rows.iter().map(|r| st.clone_dtoh(r)).collect::<Result<_, _>>()?;
        let x = &self.x;
        // Y judged against the reference formed from our own vhat (checked first).
        let r_used = engram_gate_fwd(x.s, &x.h, &x.k, &x.v, &x.wh, &x.wv, &x.cw, Some(&vhat));
        let r = &self.reference;
        let mut reps = vec![("vhat", check_half(&vhat, &r.vhat, MAX_ULP), true)];
        reps.push(("Y", check_half(&y, &r_used.y, MAX_ULP), true));
        for (name, ours, rf) in [
            ("alpha", &rows[0], &r.alpha),
            ("rrms_h", &rows[1], &r.rrms_h),
            ("rrms_k", &rows[2], &r.rrms_k),
            ("rrms_v", &rows[3], &r_used.rrms_v),
        ] {
            let (rep, ok) = f32_check(ours, rf);
            reps.push((name, rep, ok));
        }
        Ok(summarize(reps))
    }

    fn tensors(&self) -> Vec<(String, Tensor)> {
        let EngramGateShape { m, t, d } = self.x.s;
        let r = &self.reference;
        let mut v = self.x.tensors();
        v.push(("ref.Y".into(), tref(&[m, t, d], &r.y)));
        v.push(("ref.vhat".into(), tref(&[m, t, d], &r.vhat)));
        v.push(("ref.alpha".into(), tref(&[m, t], &r.alpha)));
        v.push(("ref.rrms_h".into(), tref(&[m, t], &r.rrms_h)));
        v.push(("ref.rrms_k".into(), tref(&[m, t], &r.rrms_k)));
        v.push(("ref.rrms_v".into(), tref(&[m, t], &r.rrms_v)));
        v
    }

    fn params(&self) -> serde_json::Value {
        serde_json::json!({ "eps": 1e-6, "kernel_size": 4 })
    }
}

struct BwdCase<T: Half + DeviceRepr> {
    x: Inputs<T>,
    dy: Vec<T>,
    reference: EngramGateBwdRef,
    /// dY, H, k, v, rms_w_h, rms_w_v, conv_w
    ins: [CudaSlice<T>; 7],
    /// alpha, rrms_h, rrms_k (the forward's, rounded to f32 from the f64 reference)
    saved: [CudaSlice<f32>; 3],
    ws: CudaSlice<f32>,
    outs: [CudaSlice<T>; 3],
    wouts: [CudaSlice<f32>; 3],
    /// What a forward saves for the backward, from the f64 forward reference: `vhat` (rounded
    /// to the dtype) and alpha, rrms_h, rrms_k, rrms_v (f32); exported for the alternatives
    /// whose backward takes them (TileOPs).
    fwd_vhat: Vec<T>,
    fwd_saved: [Vec<f32>; 4],
    /// Graph submission (`GateConvBwdPlan`), or direct launches when `None`.
    plan: Option<engram::GateConvBwdPlan>,
}

impl<T: Half + DeviceRepr> BwdCase<T> {
    fn new(gpu: &Gpu, rng: &mut StdRng, s: EngramGateShape, graph: bool) -> rgk::Result<Self> {
        let plan = if graph { Some(engram::GateConvBwdPlan::new(s)?) } else { None };
        let x = Inputs::<T>::new(rng, s)?;
        let (n, _) = s.lens()?;
        let dy: Vec<T> = randn_half(rng, n, 0.1);
        let fr = engram_gate_fwd(s, &x.h, &x.k, &x.v, &x.wh, &x.wv, &x.cw, None);
        let reference = engram_gate_bwd(s, &dy, &x.h, &x.k, &x.v, &x.wh, &x.wv, &x.cw);
        let st = gpu.stream();
        let f32v = |r: &RefOutput| r.value.iter().map(|&v| v as f32).collect::<Vec<f32>>();
        let d = s.d;
        Ok(Self {
            ins: [
                st.clone_htod(&dy)?,
                st.clone_htod(&x.h)?,
                st.clone_htod(&x.k)?,
                st.clone_htod(&x.v)?,
                st.clone_htod(&x.wh)?,
                st.clone_htod(&x.wv)?,
                st.clone_htod(&x.cw)?,
            ],
            saved: [
                st.clone_htod(&f32v(&fr.alpha))?,
                st.clone_htod(&f32v(&fr.rrms_h))?,
                st.clone_htod(&f32v(&fr.rrms_k))?,
            ],
            ws: st.alloc_zeros::<f32>(bwd_workspace_len(s)?)?,
            outs: [
                st.clone_htod(&poisoned::<T>(n))?,
                st.clone_htod(&poisoned::<T>(n))?,
                st.clone_htod(&poisoned::<T>(n))?,
            ],
            wouts: [
                st.clone_htod(&vec![f32::NAN; d])?,
                st.clone_htod(&vec![f32::NAN; d])?,
                st.clone_htod(&vec![f32::NAN; 4 * d])?,
            ],
            fwd_vhat: fr.vhat.value.iter().map(|&v| T::round_f64(v)).collect(),
            fwd_saved: [f32v(&fr.alpha), f32v(&fr.rrms_h), f32v(&fr.rrms_k), f32v(&fr.rrms_v)],
            x,
            dy,
            reference,
            plan,
        })
    }
}

impl<T: Half + DeviceRepr> Case for BwdCase<T> {
    fn launch(&mut self, gpu: &Gpu) -> rgk::Result<()> {
        let st = gpu.stream();
        let i: Vec<_> = self.ins.iter().map(|b| b.device_ptr(st)).collect();
        let ins = [i[0].0, i[1].0, i[2].0, i[3].0, i[4].0, i[5].0, i[6].0];
        let sv: Vec<_> = self.saved.iter().map(|b| b.device_ptr(st)).collect();
        let saved = [sv[0].0, sv[1].0, sv[2].0];
        let (ws, _g0) = self.ws.device_ptr_mut(st);
        let [o0, o1, o2] = &mut self.outs;
        let [w0, w1, w2] = &mut self.wouts;
        let (dh, _g1) = o0.device_ptr_mut(st);
        let (dk, _g2) = o1.device_ptr_mut(st);
        let (dv, _g3) = o2.device_ptr_mut(st);
        let (dwh, _g4) = w0.device_ptr_mut(st);
        let (dwv, _g5) = w1.device_ptr_mut(st);
        let (dcw, _g6) = w2.device_ptr_mut(st);
        // SAFETY: buffers allocated for exactly this shape.
        let outs = [dh, dk, dv, dwh, dwv, dcw];
        unsafe {
            match &mut self.plan {
                Some(p) => p.run_raw::<T>(gpu, ins, saved, ws, outs, st.cu_stream()),
                None => {
                    let [g, h, k, v, wh, wv, cw] = ins;
                    let [a, rh, rk] = saved;
                    let [dh, dk, dv, dwh, dwv, dcw] = outs;
                    engram::gate_conv_bwd_raw::<T>(
                        gpu,
                        self.x.s,
                        g,
                        h,
                        k,
                        v,
                        wh,
                        wv,
                        cw,
                        a,
                        rh,
                        rk,
                        ws,
                        dh,
                        dk,
                        dv,
                        dwh,
                        dwv,
                        dcw,
                        st.cu_stream(),
                    )
                }
            }
        }
    }

    fn verify(&mut self, gpu: &Gpu) -> rgk::Result<Verification> {
        let st = gpu.stream();
        for o in &mut self.outs {
            st.memcpy_htod(&poisoned::<T>(o.len()), o)?;
        }
        for o in &mut self.wouts {
            st.memcpy_htod(&vec![f32::NAN; o.len()], o)?;
        }
        self.launch(gpu)?;
        let o: Vec<Vec<T>> = self.outs.iter().map(|b| st.clone_dtoh(b)).collect::<Result<_, _>>()?;
        let w: Vec<Vec<f32>> = self.wouts.iter().map(|b| st.clone_dtoh(b)).collect::<Result<_, _>>()?;
        let r = &self.reference;
        let mut reps = vec![
            ("dH", check_half(&o[0], &r.dh, MAX_ULP), true),
            ("dk", check_half(&o[1], &r.dk, MAX_ULP), true),
            ("dv", check_half(&o[2], &r.dv, MAX_ULP), true),
        ];
        for (name, ours, rf) in
            [("drms_w_h", &w[0], &r.drms_w_h), ("drms_w_v", &w[1], &r.drms_w_v), ("dconv_w", &w[2], &r.dconv_w)]
        {
            let (rep, ok) = f32_check(ours, rf);
            reps.push((name, rep, ok));
        }
        Ok(summarize(reps))
    }

    fn tensors(&self) -> Vec<(String, Tensor)> {
        let EngramGateShape { m, t, d } = self.x.s;
        let r = &self.reference;
        let mut v = self.x.tensors();
        v.push(("dY".into(), th(&[m, t, d], &self.dy)));
        v.push(("vhat".into(), th(&[m, t, d], &self.fwd_vhat)));
        for (name, x) in ["alpha", "rrms_h", "rrms_k", "rrms_v"].into_iter().zip(&self.fwd_saved) {
            v.push((name.into(), Tensor::f32(&[m, t], x)));
        }
        v.push(("ref.dH".into(), tref(&[m, t, d], &r.dh)));
        v.push(("ref.dk".into(), tref(&[m, t, d], &r.dk)));
        v.push(("ref.dv".into(), tref(&[m, t, d], &r.dv)));
        v.push(("ref.drms_w_h".into(), tref(&[d], &r.drms_w_h)));
        v.push(("ref.drms_w_v".into(), tref(&[d], &r.drms_w_v)));
        v.push(("ref.dconv_w".into(), tref(&[4, d], &r.dconv_w)));
        v
    }

    fn params(&self) -> serde_json::Value {
        serde_json::json!({ "eps": 1e-6, "kernel_size": 4 })
    }
}
