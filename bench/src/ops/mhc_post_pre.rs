//! MHCPostPreFwd workloads (docs/ops.md §7): the layer transition on the mHC seed shapes —
//! the post half of layer L (the MHCPostFwd seed row's shapes) and the pre half of layer L+1
//! with the same n and c (a fresh phi and b). `x_out` is written (the alternatives all store
//! it). Native alternative: our MHCPostFwd and MHCPreFwd back to back.
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use rand::rngs::StdRng;
use rgk::mhc::{
    post_fwd_raw, MhcPostPre, MhcPostPreInputs, MhcPostPreOutputs, MhcPostShape, MhcPre, MhcPreParams, MhcPreShape,
};
use rgk::reference::MhcPreRef;
use rgk::verify::{check_float, check_half, poisoned, Report};
use rgk::{bf16, Gpu};

use crate::case::{Case, Tensor, Verification, Workload};
use crate::ops::mhc::{FP32_PEAK, SEED_ROWS};
use rgk_tests::{randn_f32, randn_half};

/// Our two ops back to back (MHCPostFwd into `x_out`, then MHCPreFwd of it).
const BACK_TO_BACK: &str = "rgk-post+pre";

pub fn workloads(_variants: bool) -> Vec<Workload> {
    SEED_ROWS
        .into_iter()
        .map(|(name, batch, c)| {
            let s = MhcPreShape { batch, n: 4, c };
            let (b, n, m) = (batch, 4, s.logits());
            let nc = n * c;
            Workload {
                op: "MHCPostPreFwd",
                name,
                dtype: "bf16",
                shapes: format!("x_layer_out [{b},{c}], h_post [{b},{n}], x_res [{b},{nc}]; phi [{nc},{m}], b [{m}]"),
                // post 2·B·nc; pre: logits 2·B·nc·m, Σx² 2·B·nc, mixing 2·B·nc·(n+1)
                flops: (2 * b * nc + 2 * b * nc * m + 2 * b * nc + 2 * b * nc * (n + 1)) as f64,
                // x_layer_out, h_post, x_res, phi, b in; x_out, x_res, x_layer, h_post out
                bytes: (2 * b * c
                    + 4 * b * n
                    + 2 * b * nc
                    + 4 * nc * m
                    + 4 * m
                    + 2 * b * nc
                    + 2 * b * nc
                    + 2 * b * c
                    + 4 * b * n) as f64,
                peak_flops: FP32_PEAK,
                prepare: Box::new(move |gpu, rng| Ok(Box::new(PostPreCase::new(gpu, rng, s)?) as Box<dyn Case>)),
            }
        })
        .collect()
}

struct Host {
    x_layer_out: Vec<bf16>,
    h_post: Vec<f32>,
    x_res: Vec<bf16>,
    phi: Vec<f32>,
    b: Vec<f32>,
}

struct Dev {
    x_layer_out: CudaSlice<bf16>,
    h_post: CudaSlice<f32>,
    x_res: CudaSlice<bf16>,
    phi: CudaSlice<f32>,
    b: CudaSlice<f32>,
    x_out: CudaSlice<bf16>,
    next_res: CudaSlice<bf16>,
    next_layer: CudaSlice<bf16>,
    next_h_post: CudaSlice<f32>,
}

struct PostPreCase {
    s: MhcPreShape,
    p: MhcPreParams,
    op: MhcPostPre,
    pre: MhcPre,
    host: Host,
    x_out: Vec<bf16>,
    reference: MhcPreRef,
    d: Dev,
}

impl PostPreCase {
    fn new(gpu: &Gpu, rng: &mut StdRng, s: MhcPreShape) -> rgk::Result<Self> {
        let l = s.lens()?;
        let p = MhcPreParams::default();
        // The seeds' inputs: post's x_layer_out, x_res ~ randn and h_post = 2σ(randn) (a pre
        // half's output); pre's phi, b ~ randn.
        let host = Host {
            x_layer_out: randn_half(rng, l.x_layer, 1.0),
            h_post: randn_f32(rng, l.h_post, 1.0).into_iter().map(|v| 2.0 / (1.0 + (-v).exp())).collect(),
            x_res: randn_half(rng, l.x, 1.0),
            phi: randn_f32(rng, l.phi, 1.0),
            b: randn_f32(rng, l.b, 1.0),
        };
        let (x_out, reference) =
            rgk::reference::mhc_post_pre_fwd(s, p, &host.x_layer_out, &host.h_post, &host.x_res, &host.phi, &host.b);
        let st = gpu.stream();
        let d = Dev {
            x_layer_out: st.clone_htod(&host.x_layer_out)?,
            h_post: st.clone_htod(&host.h_post)?,
            x_res: st.clone_htod(&host.x_res)?,
            phi: st.clone_htod(&host.phi)?,
            b: st.clone_htod(&host.b)?,
            x_out: st.clone_htod(&poisoned::<bf16>(l.x))?,
            next_res: st.clone_htod(&poisoned::<bf16>(l.x))?,
            next_layer: st.clone_htod(&poisoned::<bf16>(l.x_layer))?,
            next_h_post: st.clone_htod(&vec![f32::NAN; l.h_post])?,
        };
        Ok(Self { op: MhcPostPre::new(gpu, s)?, pre: MhcPre::new(gpu, s)?, s, p, host, x_out, reference, d })
    }

    fn poison(&mut self, gpu: &Gpu) -> rgk::Result<()> {
        let st = gpu.stream();
        st.memcpy_htod(&poisoned::<bf16>(self.d.x_out.len()), &mut self.d.x_out)?;
        st.memcpy_htod(&poisoned::<bf16>(self.d.next_res.len()), &mut self.d.next_res)?;
        st.memcpy_htod(&poisoned::<bf16>(self.d.next_layer.len()), &mut self.d.next_layer)?;
        st.memcpy_htod(&vec![f32::NAN; self.d.next_h_post.len()], &mut self.d.next_h_post)?;
        Ok(())
    }

    /// Every output read back against the reference (`x_out` as the exact stored bits).
    fn check(&self, gpu: &Gpu) -> rgk::Result<Vec<(&'static str, Report)>> {
        let st = gpu.stream();
        let xo: Vec<bf16> = st.clone_dtoh(&self.d.x_out)?;
        let res: Vec<bf16> = st.clone_dtoh(&self.d.next_res)?;
        let layer: Vec<bf16> = st.clone_dtoh(&self.d.next_layer)?;
        let post: Vec<f64> = st.clone_dtoh(&self.d.next_h_post)?.into_iter().map(|v: f32| v as f64).collect();
        let exact = rgk::reference::RefOutput {
            value: self.x_out.iter().map(|v| v.to_f64()).collect(),
            magnitude: vec![0.0; self.x_out.len()],
        };
        Ok(vec![
            ("x_out", check_half(&xo, &exact, 0.0)),
            ("x_res", check_half(&res, &self.reference.x_res, 1.0)),
            ("x_layer", check_half(&layer, &self.reference.x_layer, 1.0)),
            ("h_post", check_float(&post, &self.reference.h_post, 1e-5)),
        ])
    }
}

fn verification(reps: &[(&'static str, Report)]) -> Verification {
    Verification {
        verified: reps.iter().all(|(_, r)| r.passed()),
        max_abs_err: reps.iter().map(|(_, r)| r.max_abs_err).fold(0.0, f64::max),
        rel_l2_err: reps.iter().map(|(_, r)| r.rel_l2_err).fold(0.0, f64::max),
        detail: reps.iter().map(|(n, r)| format!("{n}: {r}")).collect::<Vec<_>>().join("\n"),
    }
}

impl Case for PostPreCase {
    fn launch(&mut self, gpu: &Gpu) -> rgk::Result<()> {
        let d = &mut self.d;
        let inputs =
            MhcPostPreInputs { x_layer_out: &d.x_layer_out, h_post: &d.h_post, x_res: &d.x_res, phi: &d.phi, b: &d.b };
        let outputs = MhcPostPreOutputs {
            x_out: Some(&mut d.x_out),
            x_res: &mut d.next_res,
            x_layer: &mut d.next_layer,
            h_post: &mut d.next_h_post,
        };
        self.op.run(gpu, self.p, inputs, outputs)
    }

    fn verify(&mut self, gpu: &Gpu) -> rgk::Result<Verification> {
        self.poison(gpu)?;
        self.launch(gpu)?;
        Ok(verification(&self.check(gpu)?))
    }

    fn tensors(&self) -> Vec<(String, Tensor)> {
        let MhcPreShape { batch: b, n, c } = self.s;
        let m = self.s.logits();
        let h = &self.host;
        vec![
            ("x_layer_out".into(), Tensor::bf16(&[b, c], &h.x_layer_out)),
            ("h_post".into(), Tensor::f32(&[b, n], &h.h_post)),
            ("x_res".into(), Tensor::bf16(&[b, n * c], &h.x_res)),
            ("phi".into(), Tensor::f32(&[n * c, m], &h.phi)),
            ("b".into(), Tensor::f32(&[m], &h.b)),
            ("ref.x_out".into(), Tensor::f64(&[b, n * c], &self.x_out.iter().map(|v| v.to_f64()).collect::<Vec<_>>())),
            ("ref.x_res".into(), Tensor::f64(&[b, n * c], &self.reference.x_res.value)),
            ("ref.x_layer".into(), Tensor::f64(&[b, c], &self.reference.x_layer.value)),
            ("ref.h_post".into(), Tensor::f64(&[b, n], &self.reference.h_post.value)),
        ]
    }

    fn params(&self) -> serde_json::Value {
        crate::ops::mhc_pre::params_json(self.s, self.p)
    }

    fn native_alternatives(&self) -> Vec<&'static str> {
        vec![BACK_TO_BACK]
    }

    fn launch_native(&mut self, gpu: &Gpu, name: &str) -> rgk::Result<()> {
        assert_eq!(name, BACK_TO_BACK, "no native alternative {name}");
        let s = self.s;
        let st = gpu.stream();
        let d = &mut self.d;
        let (y, _g1) = d.x_layer_out.device_ptr(st);
        let (h, _g2) = d.h_post.device_ptr(st);
        let (r, _g3) = d.x_res.device_ptr(st);
        let (p, _g4) = d.phi.device_ptr(st);
        let (b, _g5) = d.b.device_ptr(st);
        let (xo, _g6) = d.x_out.device_ptr_mut(st);
        let (nr, _g7) = d.next_res.device_ptr_mut(st);
        let (nl, _g8) = d.next_layer.device_ptr_mut(st);
        let (nh, _g9) = d.next_h_post.device_ptr_mut(st);
        let post = MhcPostShape { batch: s.batch, n: s.n, c: s.c };
        // SAFETY: the buffers were allocated for exactly this shape; ordered on this stream.
        unsafe {
            post_fwd_raw(gpu, post, y, h, r, xo, st.cu_stream())?;
            self.pre.run_raw(gpu, self.p, [p, xo, b], [nr, nl, nh], st.cu_stream())
        }
    }

    fn error_native(&mut self, gpu: &Gpu, name: &str) -> rgk::Result<(f64, f64)> {
        self.poison(gpu)?;
        self.launch_native(gpu, name)?;
        let v = verification(&self.check(gpu)?);
        Ok((v.rel_l2_err, v.max_abs_err))
    }
}
