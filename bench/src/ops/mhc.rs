//! MHCPostFwd workloads (docs/ops.md §3 and the seed table).
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use rand::rngs::StdRng;
use rgk::mhc::{self, MhcPostShape};
use rgk::reference::RefOutput;
use rgk::verify::{check_half, poisoned};
use rgk::{bf16, Gpu};

use crate::case::{Case, Tensor, Verification, Workload};
use rgk_tests::{randn_f32, randn_half};

/// FP32 non-tensor peak of the H200 (datasheet), FLOP/s.
pub const FP32_PEAK: f64 = 67e12;

/// The mHC seed rows (name, batch, c), n = 4: MHCPostFwd's, MHCPreFwd's and MHCPostPreFwd's.
pub const SEED_ROWS: [(&str, usize, usize); 3] =
    [("hidden-1280", 1, 1280), ("hidden-1920", 2, 1920), ("hidden-2560", 4, 2560)];

/// The seed's workloads (no tuning rows: the block size is fixed, docs/decisions/mhc.md).
pub fn workloads(_variants: bool) -> Vec<Workload> {
    SEED_ROWS
        .into_iter()
        .map(|(name, batch, c)| {
            let s = MhcPostShape { batch, n: 4, c };
            let (b, n) = (batch, 4);
            Workload {
                op: "MHCPostFwd",
                name,
                dtype: "bf16",
                shapes: format!("x_layer_out [{b},{c}], h_post [{b},{n}], x_res [{b},{}]", n * c),
                flops: 2.0 * (b * n * c) as f64,
                bytes: (2 * b * c + 4 * b * n + 2 * 2 * b * n * c) as f64,
                peak_flops: FP32_PEAK,
                prepare: Box::new(move |gpu, rng| Ok(Box::new(PostCase::new(gpu, rng, s)?) as Box<dyn Case>)),
            }
        })
        .collect()
}

struct PostCase {
    s: MhcPostShape,
    y: Vec<bf16>,
    h: Vec<f32>,
    r: Vec<bf16>,
    reference: RefOutput,
    dy: CudaSlice<bf16>,
    dh: CudaSlice<f32>,
    dr: CudaSlice<bf16>,
    dout: CudaSlice<bf16>,
}

impl PostCase {
    fn new(gpu: &Gpu, rng: &mut StdRng, s: MhcPostShape) -> rgk::Result<Self> {
        let (ly, lh, lr) = s.lens()?;
        let y = randn_half(rng, ly, 1.0);
        // h_post = 2·σ(·) in the real layer: values in (0, 2).
        let h: Vec<f32> = randn_f32(rng, lh, 1.0).into_iter().map(|v| 2.0 / (1.0 + (-v).exp())).collect();
        let r = randn_half(rng, lr, 1.0);
        let reference = rgk::reference::mhc_post_fwd(s, &y, &h, &r);
        let st = gpu.stream();
        Ok(Self {
            dy: st.clone_htod(&y)?,
            dh: st.clone_htod(&h)?,
            dr: st.clone_htod(&r)?,
            dout: st.clone_htod(&poisoned::<bf16>(lr))?,
            s,
            y,
            h,
            r,
            reference,
        })
    }
}

impl Case for PostCase {
    fn launch(&mut self, gpu: &Gpu) -> rgk::Result<()> {
        let st = gpu.stream();
        let (y, _g1) = self.dy.device_ptr(st);
        let (h, _g2) = self.dh.device_ptr(st);
        let (r, _g3) = self.dr.device_ptr(st);
        let (o, _g4) = self.dout.device_ptr_mut(st);
        // SAFETY: the buffers were allocated for exactly this shape.
        unsafe { mhc::post_fwd_raw(gpu, self.s, y, h, r, o, st.cu_stream()) }
    }

    fn verify(&mut self, gpu: &Gpu) -> rgk::Result<Verification> {
        let st = gpu.stream();
        st.memcpy_htod(&poisoned::<bf16>(self.dout.len()), &mut self.dout)?;
        self.launch(gpu)?;
        let out: Vec<bf16> = st.clone_dtoh(&self.dout)?;
        let rep = check_half(&out, &self.reference, 1.0);
        Ok(Verification {
            verified: rep.passed(),
            max_abs_err: rep.max_abs_err,
            rel_l2_err: rep.rel_l2_err,
            detail: format!("x_out: {rep}"),
        })
    }

    fn tensors(&self) -> Vec<(String, Tensor)> {
        let MhcPostShape { batch: b, n, c } = self.s;
        vec![
            ("x_layer_out".into(), Tensor::bf16(&[b, c], &self.y)),
            ("h_post".into(), Tensor::f32(&[b, n], &self.h)),
            ("x_res".into(), Tensor::bf16(&[b, n * c], &self.r)),
            ("ref.x_out".into(), Tensor::f64(&[b, n * c], &self.reference.value)),
        ]
    }

    fn params(&self) -> serde_json::Value {
        serde_json::json!({ "n": self.s.n, "c": self.s.c })
    }
}
