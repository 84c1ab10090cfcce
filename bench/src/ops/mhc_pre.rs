//! MHCPreFwd workloads (docs/ops.md §2 and the seed table).
use cudarc::driver::CudaSlice;
use rand::rngs::StdRng;
use rgk::mhc::{MhcPre, MhcPreInputs, MhcPreOutputs, MhcPreParams, MhcPreShape};
use rgk::reference::MhcPreRef;
use rgk::verify::{check_float, check_half, poisoned};
use rgk::{bf16, Gpu};

use crate::case::{Case, Tensor, Verification, Workload};
use crate::ops::mhc::{FP32_PEAK, SEED_ROWS};
use rgk_tests::{randn_f32, randn_half};

/// The seed's workloads. No tuning rows: every seed row is the tuning table's fixed-point
/// class (docs/decisions/mhc.md lists the measured alternatives).
pub fn workloads(_variants: bool) -> Vec<Workload> {
    SEED_ROWS
        .into_iter()
        .map(|(name, batch, c)| {
            let s = MhcPreShape { batch, n: 4, c };
            let (b, n, m) = (batch, 4, s.logits());
            let nc = n * c;
            Workload {
                op: "MHCPreFwd",
                name,
                dtype: "bf16",
                shapes: format!("phi [{nc},{m}], x [{b},{nc}], b [{m}]"),
                // logits 2·B·nc·m, Σx² 2·B·nc, mixing 2·B·nc·(n+1)
                flops: (2 * b * nc * m + 2 * b * nc + 2 * b * nc * (n + 1)) as f64,
                // phi, x and b in; x_res, x_layer, h_post out
                bytes: (4 * nc * m + 2 * b * nc + 4 * m + 2 * b * nc + 2 * b * c + 4 * b * n) as f64,
                peak_flops: FP32_PEAK,
                prepare: Box::new(move |gpu, rng| Ok(Box::new(PreCase::new(gpu, rng, s)?) as Box<dyn Case>)),
            }
        })
        .collect()
}

struct PreCase {
    s: MhcPreShape,
    p: MhcPreParams,
    op: MhcPre,
    phi: Vec<f32>,
    x: Vec<bf16>,
    b: Vec<f32>,
    reference: MhcPreRef,
    dphi: CudaSlice<f32>,
    dx: CudaSlice<bf16>,
    db: CudaSlice<f32>,
    dres: CudaSlice<bf16>,
    dlayer: CudaSlice<bf16>,
    dpost: CudaSlice<f32>,
}

impl PreCase {
    fn new(gpu: &Gpu, rng: &mut StdRng, s: MhcPreShape) -> rgk::Result<Self> {
        let l = s.lens()?;
        let p = MhcPreParams::default();
        // The seed's inputs: phi, x, b ~ randn.
        let phi = randn_f32(rng, l.phi, 1.0);
        let x = randn_half(rng, l.x, 1.0);
        let b = randn_f32(rng, l.b, 1.0);
        let reference = rgk::reference::mhc_pre_fwd(s, p, &phi, &x, &b);
        let st = gpu.stream();
        Ok(Self {
            op: MhcPre::new(gpu, s)?,
            dphi: st.clone_htod(&phi)?,
            dx: st.clone_htod(&x)?,
            db: st.clone_htod(&b)?,
            dres: st.clone_htod(&poisoned::<bf16>(l.x))?,
            dlayer: st.clone_htod(&poisoned::<bf16>(l.x_layer))?,
            dpost: st.clone_htod(&vec![f32::NAN; l.h_post])?,
            s,
            p,
            phi,
            x,
            b,
            reference,
        })
    }
}

impl Case for PreCase {
    fn launch(&mut self, gpu: &Gpu) -> rgk::Result<()> {
        let inputs = MhcPreInputs { phi: &self.dphi, x: &self.dx, b: &self.db };
        let outputs = MhcPreOutputs { x_res: &mut self.dres, x_layer: &mut self.dlayer, h_post: &mut self.dpost };
        self.op.run(gpu, self.p, inputs, outputs)
    }

    fn verify(&mut self, gpu: &Gpu) -> rgk::Result<Verification> {
        let st = gpu.stream();
        st.memcpy_htod(&poisoned::<bf16>(self.dres.len()), &mut self.dres)?;
        st.memcpy_htod(&poisoned::<bf16>(self.dlayer.len()), &mut self.dlayer)?;
        st.memcpy_htod(&vec![f32::NAN; self.dpost.len()], &mut self.dpost)?;
        self.launch(gpu)?;
        let res: Vec<bf16> = st.clone_dtoh(&self.dres)?;
        let layer: Vec<bf16> = st.clone_dtoh(&self.dlayer)?;
        let post: Vec<f64> = st.clone_dtoh(&self.dpost)?.into_iter().map(|v: f32| v as f64).collect();
        let reps = [
            ("x_res", check_half(&res, &self.reference.x_res, 1.0)),
            ("x_layer", check_half(&layer, &self.reference.x_layer, 1.0)),
            ("h_post", check_float(&post, &self.reference.h_post, 1e-5)),
        ];
        Ok(Verification {
            verified: reps.iter().all(|(_, r)| r.passed()),
            max_abs_err: reps.iter().map(|(_, r)| r.max_abs_err).fold(0.0, f64::max),
            rel_l2_err: reps.iter().map(|(_, r)| r.rel_l2_err).fold(0.0, f64::max),
            detail: reps.iter().map(|(n, r)| format!("{n}: {r}")).collect::<Vec<_>>().join("\n"),
        })
    }

    fn tensors(&self) -> Vec<(String, Tensor)> {
        let MhcPreShape { batch: b, n, c } = self.s;
        let m = self.s.logits();
        vec![
            ("phi".into(), Tensor::f32(&[n * c, m], &self.phi)),
            ("x".into(), Tensor::bf16(&[b, n * c], &self.x)),
            ("b".into(), Tensor::f32(&[m], &self.b)),
            ("ref.x_res".into(), Tensor::f64(&[b, n * c], &self.reference.x_res.value)),
            ("ref.x_layer".into(), Tensor::f64(&[b, c], &self.reference.x_layer.value)),
            ("ref.h_post".into(), Tensor::f64(&[b, n], &self.reference.h_post.value)),
        ]
    }

    fn params(&self) -> serde_json::Value {
        params_json(self.s, self.p)
    }
}

/// The scalar parameters the alternatives of a pre half take (MHCPreFwd, MHCPostPreFwd).
pub fn params_json(s: MhcPreShape, p: MhcPreParams) -> serde_json::Value {
    serde_json::json!({
        "n": s.n,
        "c": s.c,
        "alpha_pre": p.alpha_pre,
        "alpha_post": p.alpha_post,
        "alpha_res": p.alpha_res,
        "sinkhorn_repeat": p.sinkhorn_repeat,
        "sinkhorn_eps": p.sinkhorn_eps,
    })
}
