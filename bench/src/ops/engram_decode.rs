//! EngramDecodeFwd workloads (docs/ops.md §6 and the seed table).
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use rand::rngs::StdRng;
use rgk::engram::{DecodeElem, DecodeInputsRaw, EngramDecodePlan, EngramDecodeShape};
use rgk::reference::{self as rf, DecodeGiven, DecodeRef, DecodeRefInputs};
use rgk::verify::{check_half, poisoned, Report};
use rgk::{bf16, f16, Gpu};

use crate::case::{variant_name, Case, Tensor, Verification, Workload};
use crate::ops::mhc::FP32_PEAK;
use rgk_tests::randn_half;

/// A 16-bit dtype the bench exchanges with the alternatives.
trait BenchElem: DecodeElem {
    fn tensor(shape: &[usize], v: &[Self]) -> Tensor;
}
impl BenchElem for f16 {
    fn tensor(shape: &[usize], v: &[Self]) -> Tensor {
        Tensor::f16(shape, v)
    }
}
impl BenchElem for bf16 {
    fn tensor(shape: &[usize], v: &[Self]) -> Tensor {
        Tensor::bf16(shape, v)
    }
}

/// The seed's workloads through [`EngramDecodePlan::new`]; with `variants`, also the in-place
/// ring step (rows named `WORKLOAD@ring`).
pub fn workloads(variants: bool) -> Vec<Workload> {
    let mut modes: Vec<(Option<&str>, bool)> = vec![(None, false)];
    if variants {
        modes.push((Some("ring"), true));
    }
    let seeds = [
        ("serving-b1", EngramDecodeShape::new(1, 512, 256, 12, 4, 3), false),
        ("serving-b4", EngramDecodeShape::new(4, 1024, 512, 20, 4, 5), false),
        ("serving-b8", EngramDecodeShape::new(8, 512, 256, 18, 4, 3), true),
    ];
    let mut out = Vec::new();
    for (name, s, is_bf16) in seeds {
        for &(tag, ring) in &modes {
            let name = variant_name(name, tag);
            let EngramDecodeShape { batch: b, d_mem: dm, d, max_conv_len: l, kernel_size: k, dilation: dil, .. } = s;
            out.push(Workload {
                op: "EngramDecodeFwd",
                name,
                dtype: if is_bf16 { "bf16" } else { "f16" },
                shapes: format!("B={b}, d_mem={dm}, d={d}, L={l}, δ={dil}, K={k}"),
                // Two projections, then per output column: 2 rmsnorms + dot (≈ 8), gate and
                // norm of vh (≈ 6), conv (2K), silu and sum (≈ 6).
                flops: (2 * 2 * b * dm * d + b * d * (20 + 2 * k)) as f64,
                bytes: (2 * (b * dm + b * d + b * l * d + 2 * dm * d + 2 * d + k * d + b * d + b * l * d)) as f64,
                peak_flops: FP32_PEAK,
                prepare: Box::new(move |gpu, rng| {
                    Ok(if is_bf16 {
                        Box::new(DecodeCase::<bf16>::new(gpu, rng, s, ring)?) as Box<dyn Case>
                    } else {
                        Box::new(DecodeCase::<f16>::new(gpu, rng, s, ring)?) as Box<dyn Case>
                    })
                }),
            });
        }
    }
    out
}

struct DecodeCase<T> {
    s: EngramDecodeShape,
    ring: bool,
    /// `e_t, h_t, conv_state, W_K, W_V, rms_w_h, rms_w_v, conv_w`.
    host: [Vec<T>; 8],
    reference: DecodeRef,
    plan: EngramDecodePlan,
    dev: [CudaSlice<T>; 8],
    y: CudaSlice<T>,
    new_state: CudaSlice<T>,
    pos: usize,
}

impl<T: BenchElem> DecodeCase<T> {
    fn new(gpu: &Gpu, rng: &mut StdRng, s: EngramDecodeShape, ring: bool) -> rgk::Result<Self> {
        let l = s.lens()?;
        // the seed's input distribution.
        let host: [Vec<T>; 8] = [
            randn_half(rng, l.e, 0.1),
            randn_half(rng, l.h, 1.0),
            randn_half(rng, l.state, 0.1),
            randn_half(rng, l.w, 0.02),
            randn_half(rng, l.w, 0.02),
            vec![T::round_f64(1.0); l.rms],
            vec![T::round_f64(1.0); l.rms],
            randn_half(rng, l.conv_w, 0.02),
        ];
        let reference = rf::engram_decode_fwd(&s, &refs(&host), DecodeGiven::default());
        let st = gpu.stream();
        let mut dev = Vec::new();
        for v in &host {
            dev.push(st.clone_htod(v)?);
        }
        Ok(Self {
            s,
            ring,
            reference,
            plan: EngramDecodePlan::new(gpu, s)?,
            dev: dev.try_into().ok().expect("eight buffers"),
            y: st.clone_htod(&poisoned::<T>(l.h))?,
            new_state: st.clone_htod(&poisoned::<T>(l.state))?,
            host,
            pos: 0,
        })
    }
}

fn refs<T>(h: &[Vec<T>; 8]) -> DecodeRefInputs<'_, T> {
    DecodeRefInputs {
        e_t: &h[0],
        h_t: &h[1],
        conv_state: &h[2],
        w_k: &h[3],
        w_v: &h[4],
        rms_w_h: &h[5],
        rms_w_v: &h[6],
        conv_w: &h[7],
    }
}

impl<T: BenchElem> Case for DecodeCase<T> {
    fn launch(&mut self, gpu: &Gpu) -> rgk::Result<()> {
        let st = gpu.stream();
        let [e, h, cs, wk, wv, rwh, rwv, cw] = &mut self.dev;
        let (e, _g0) = e.device_ptr(st);
        let (h, _g1) = h.device_ptr(st);
        let (wk, _g3) = wk.device_ptr(st);
        let (wv, _g4) = wv.device_ptr(st);
        let (rwh, _g5) = rwh.device_ptr(st);
        let (rwv, _g6) = rwv.device_ptr(st);
        let (cw, _g7) = cw.device_ptr(st);
        let (y, _g8) = self.y.device_ptr_mut(st);
        let inputs = DecodeInputsRaw { e_t: e, h_t: h, w_k: wk, w_v: wv, rms_w_h: rwh, rms_w_v: rwv, conv_w: cw };
        // SAFETY: every buffer was allocated for exactly this shape.
        unsafe {
            if self.ring {
                let (s, _g2) = cs.device_ptr_mut(st);
                self.pos = self.plan.step_ring_raw(gpu, T::DTYPE, inputs, s, self.pos, y, st.cu_stream())?;
            } else {
                let (s, _g2) = cs.device_ptr(st);
                let (ns, _g9) = self.new_state.device_ptr_mut(st);
                self.plan.forward_raw(gpu, T::DTYPE, inputs, s, y, ns, st.cu_stream())?;
            }
        }
        Ok(())
    }

    fn verify(&mut self, gpu: &Gpu) -> rgk::Result<Verification> {
        let st = gpu.stream();
        let l = self.s.lens()?;
        st.memcpy_htod(&poisoned::<T>(l.h), &mut self.y)?;
        st.memcpy_htod(&poisoned::<T>(l.state), &mut self.new_state)?;
        // The ring step starts from the original state at pos 0 (its logical state then equals
        // the seed contract's new state).
        st.memcpy_htod(&self.host[2], &mut self.dev[2])?;
        self.pos = 0;
        self.plan.capture_intermediates(gpu, true)?;
        self.launch(gpu)?;
        let (qkk, qvh) = self.plan.intermediates::<T>(gpu)?;
        self.plan.capture_intermediates(gpu, false)?;
        let y: Vec<T> = st.clone_dtoh(&self.y)?;
        let state: Vec<T> = if self.ring {
            rf::ring_logical(&self.s, &st.clone_dtoh(&self.dev[2])?, self.pos)
        } else {
            st.clone_dtoh(&self.new_state)?
        };
        if self.ring {
            // Leave the state as the timed calls expect it (any valid state will do).
            st.memcpy_htod(&self.host[2], &mut self.dev[2])?;
            self.pos = 0;
        }
        // The chain of checks of tests/tests/engram_decode.rs.
        let x = refs(&self.host);
        let proj = rf::decode_projections(&self.s, &x);
        let rk = check_half(&qkk, &self.reference.kk, 1.0);
        let g1 = rf::engram_decode_fwd_from(&self.s, &x, &proj, DecodeGiven { q_kk: Some(&qkk), q_vh: None });
        let rv = check_half(&qvh, &g1.vh, 1.0);
        let g2 = rf::engram_decode_fwd_from(&self.s, &x, &proj, DecodeGiven { q_kk: Some(&qkk), q_vh: Some(&qvh) });
        let ry = check_half(&y, &g2.y_t, 2.0);
        let rs = check_half(&state, &g2.new_conv_state, 2.0);
        // Normwise errors against the plain reference, as for every alternative.
        let py = check_half(&y, &self.reference.y_t, 2.0);
        let ps = check_half(&state, &self.reference.new_conv_state, 2.0);
        let all: [&Report; 4] = [&rk, &rv, &ry, &rs];
        Ok(Verification {
            verified: all.iter().all(|r| r.passed()),
            max_abs_err: py.max_abs_err.max(ps.max_abs_err),
            rel_l2_err: py.rel_l2_err.max(ps.rel_l2_err),
            detail: format!(
                "q(kk): {rk}\nq(vh) | q(kk): {rv}\ny_t | q(kk), q(vh): {ry}\nnew_conv_state | q(kk), q(vh): {rs}\n\
                 y_t vs plain reference: {py}\nnew_conv_state vs plain reference: {ps}"
            ),
        })
    }

    fn tensors(&self) -> Vec<(String, Tensor)> {
        let EngramDecodeShape { batch: b, d_mem: dm, d, max_conv_len: l, kernel_size: k, .. } = self.s;
        let h = &self.host;
        vec![
            ("e_t".into(), T::tensor(&[b, dm], &h[0])),
            ("h_t".into(), T::tensor(&[b, d], &h[1])),
            ("conv_state".into(), T::tensor(&[b, l, d], &h[2])),
            ("W_K".into(), T::tensor(&[dm, d], &h[3])),
            ("W_V".into(), T::tensor(&[dm, d], &h[4])),
            ("rms_w_h".into(), T::tensor(&[d], &h[5])),
            ("rms_w_v".into(), T::tensor(&[d], &h[6])),
            ("conv_w".into(), T::tensor(&[k, d], &h[7])),
            ("ref.y_t".into(), Tensor::f64(&[b, d], &self.reference.y_t.value)),
            ("ref.new_conv_state".into(), Tensor::f64(&[b, l, d], &self.reference.new_conv_state.value)),
        ]
    }

    fn params(&self) -> serde_json::Value {
        serde_json::json!({
            "max_conv_len": self.s.max_conv_len,
            "dilation": self.s.dilation,
            "kernel_size": self.s.kernel_size,
            "eps": self.s.eps,
            "dtype": <T as rgk::verify::Half>::NAME,
        })
    }
}
