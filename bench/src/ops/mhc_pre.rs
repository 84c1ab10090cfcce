//! MHCPreFwd workloads (docs/ops.md §2 and the seed table).
use cudarc::driver::CudaSlice;
use rand::rngs::StdRng;
use rgk::mhc::{MhcPre, MhcPreParams, MhcPreShape, PreConfig};
use rgk::reference::MhcPreRef;
use rgk::verify::{check_float, check_half, poisoned};
use rgk::{bf16, Gpu};

use crate::case::{variant_name, Case, Tensor, Verification, Workload};
use crate::ops::mhc::FP32_PEAK;
use rgk_tests::{randn_f32, randn_half};

/// The seed's workloads; with `variants`, also launch-configuration variants on each (rows
/// named `WORKLOAD@variant`, for tuning).
pub fn workloads(variants: bool) -> Vec<Workload> {
    let mut configs = vec![(None, PreConfig::default())];
    if variants {
        use rgk::mhc::PrePath;
        configs.push((Some("nopdl".into()), PreConfig { pdl: false, ..PreConfig::default() }));
        configs.push((Some("mix0".into()), PreConfig { lean_mix: false, ..PreConfig::default() }));
        configs.push((Some("nograph".into()), PreConfig { graph: false, ..PreConfig::default() }));
        configs.push((Some("graph-nopdl".into()), PreConfig { graph: true, pdl: false, ..PreConfig::default() }));
        // `partial_cluster` applies to the v4 pair only.
        configs.push((Some("pc8".into()), PreConfig { partial_cluster: 8, v5: false, ..PreConfig::default() }));
        // Session 7: 96 / 128 kernel-1 blocks (fewer rows per block; kernel 2's loads stay one
        // round up to 8·W blocks), alone and with 128-thread kernel-1 blocks; 1024-thread kernel 2.
        for max_grid in [96, 128] {
            let g = PreConfig { max_grid: Some(max_grid), ..PreConfig::default() };
            configs.push((Some(format!("g{max_grid}-mb128")), PreConfig { mma_block: 128, ..g }));
        }
        configs.push((Some("k2b1024".into()), PreConfig { mix_block: 1024, ..PreConfig::default() }));
        for max_grid in [32, 64, 96, 128] {
            configs
                .push((Some(format!("g{max_grid}")), PreConfig { max_grid: Some(max_grid), ..PreConfig::default() }));
        }
        for mix_block in [128, 256] {
            configs.push((Some(format!("k2b{mix_block}")), PreConfig { mix_block, ..PreConfig::default() }));
        }
        configs.push((Some("fma1".into()), PreConfig { mma_partials: false, ..PreConfig::default() }));
        for mma_block in [128, 256, 512] {
            configs.push((Some(format!("mb{mma_block}")), PreConfig { mma_block, ..PreConfig::default() }));
        }
        // Session 5: the v5 pair (block-major partials; r, x column and bias before the wait;
        // one barrier; coefficients in every warp's registers) is the default, so the rows above
        // vary it; `v4` is the session-4 pair (`mhc_pre_mix4`).
        configs.push((Some("v4".into()), PreConfig { v5: false, ..PreConfig::default() }));
        // v6: one cooperative launch with a grid barrier (kernel-1 grid and block variants).
        let coop = PreConfig { coop: true, ..PreConfig::default() };
        configs.push((Some("v6".into()), coop));
        for max_grid in [32, 128] {
            configs.push((Some(format!("v6-g{max_grid}")), PreConfig { max_grid: Some(max_grid), ..coop }));
        }
        for mma_block in [128, 256, 512] {
            configs.push((Some(format!("v6-b{mma_block}")), PreConfig { mma_block, ..coop }));
        }
        // Session 8: the default is the v8 pair (fixed-point split-K sums, kernel-2 block 256,
        // kernel-1 block by rule); `v5` is the session-7 default (partials, 512, 256).
        let v5 = PreConfig { fixed_point: false, mix_block: 512, mma_block: 256, ..PreConfig::default() };
        configs.push((Some("v5".into()), v5));
        configs.push((Some("k2b512".into()), PreConfig { mix_block: 512, ..PreConfig::default() }));
        configs.push((Some("fx-nograph".into()), PreConfig { graph: false, ..PreConfig::default() }));
        let fused = PreConfig { path: PrePath::Fused, ..PreConfig::default() };
        configs.push((Some("fused".into()), fused));
    }
    [("hidden-1280", 1, 1280), ("hidden-1920", 2, 1920), ("hidden-2560", 4, 2560)]
        .into_iter()
        .flat_map(|w| configs.iter().map(move |c| (w, c.clone())))
        .map(|((name, batch, c), (tag, config))| {
            let name = variant_name(name, tag.as_deref());
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
                prepare: Box::new(move |gpu, rng| Ok(Box::new(PreCase::new(gpu, rng, s, config)?) as Box<dyn Case>)),
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
    fn new(gpu: &Gpu, rng: &mut StdRng, s: MhcPreShape, config: PreConfig) -> rgk::Result<Self> {
        let l = s.lens()?;
        let p = MhcPreParams::default();
        // The seed's inputs: phi, x, b ~ randn.
        let phi = randn_f32(rng, l.phi, 1.0);
        let x = randn_half(rng, l.x, 1.0);
        let b = randn_f32(rng, l.b, 1.0);
        let reference = rgk::reference::mhc_pre_fwd(s, p, &phi, &x, &b);
        let st = gpu.stream();
        Ok(Self {
            op: MhcPre::with_config(gpu, s, config)?,
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
        self.op.run(gpu, self.p, &self.dphi, &self.dx, &self.db, &mut self.dres, &mut self.dlayer, &mut self.dpost)
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
        let p = self.p;
        serde_json::json!({
            "n": self.s.n,
            "c": self.s.c,
            "alpha_pre": p.alpha_pre,
            "alpha_post": p.alpha_post,
            "alpha_res": p.alpha_res,
            "sinkhorn_repeat": p.sinkhorn_repeat,
            "sinkhorn_eps": p.sinkhorn_eps,
        })
    }
}
