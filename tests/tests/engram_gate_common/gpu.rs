//! GPU helpers of the EngramGateConv tests: poisoned uploads, runs of the forward and the
//! backward through the public entry points (any element offset), read-back with guard
//! checks, the saved tensors of the backward from the f64 reference, and a watchdog that turns
//! a hung kernel into a named failure instead of silence.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::*;
use rgk::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use rgk::cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use rgk::engram::{
    self, bwd_workspace_len, GateConvBwdInputs, GateConvBwdOutputs, GateConvFwdInputs, GateConvFwdOutputs,
};
use rgk::reference::engram_gate_fwd;
use rgk::verify::{poisoned, Half};
use rgk::Gpu;

pub const GUARD: usize = 5;

/// What every GPU test starts with: the GPU (or `None` after printing the skip), a watchdog
/// and a fresh generator, all named after `test`.
pub fn start(test: &str) -> Option<(Gpu, Watchdog, rand::rngs::StdRng)> {
    let gpu = rgk_tests::gpu_or_skip(test)?;
    Some((gpu, Watchdog::new(test), rgk_tests::fresh_rng(test)))
}

pub fn up<T: Half + rgk::cudarc::driver::DeviceRepr>(gpu: &Gpu, x: &[T], off: usize) -> CudaSlice<T> {
    let mut p = poisoned::<T>(off);
    p.extend_from_slice(x);
    gpu.stream().clone_htod(&p).unwrap()
}

pub fn out_half<T: Half + rgk::cudarc::driver::DeviceRepr>(gpu: &Gpu, len: usize) -> CudaSlice<T> {
    gpu.stream().clone_htod(&poisoned::<T>(len + GUARD)).unwrap()
}

pub fn out_f32(gpu: &Gpu, len: usize) -> CudaSlice<f32> {
    gpu.stream().clone_htod(&vec![f32::NAN; len + GUARD]).unwrap()
}

pub fn down_half<T: Half + rgk::cudarc::driver::DeviceRepr>(
    gpu: &Gpu,
    b: &CudaSlice<T>,
    len: usize,
    name: &str,
) -> Vec<T> {
    let all: Vec<T> = gpu.stream().clone_dtoh(b).unwrap();
    let p = T::poison().to_f64().to_bits();
    assert!(all[len..].iter().all(|v| v.to_f64().to_bits() == p), "{name}: write past the end");
    all[..len].to_vec()
}

pub fn down_f32(gpu: &Gpu, b: &CudaSlice<f32>, len: usize, name: &str) -> Vec<f32> {
    let all: Vec<f32> = gpu.stream().clone_dtoh(b).unwrap();
    assert!(all[len..].iter().all(|v| v.is_nan()), "{name}: write past the end");
    all[..len].to_vec()
}

/// Runs the forward; `off` = element offset of every input inside its buffer (≠ 0 takes the
/// scalar kernel).
pub fn run_fwd<T: Half + rgk::cudarc::driver::DeviceRepr>(gpu: &Gpu, x: &GateInputs<T>, off: usize) -> FwdOut<T> {
    let (n, rows) = x.s.lens().unwrap();
    let (h, k, v) = (up(gpu, &x.h, off), up(gpu, &x.k, off), up(gpu, &x.v, off));
    let (wh, wv, cw) = (up(gpu, &x.wh, off), up(gpu, &x.wv, off), up(gpu, &x.cw, off));
    let (mut y, mut vq) = (out_half::<T>(gpu, n), out_half::<T>(gpu, n));
    let (mut a, mut rh, mut rk, mut rv) =
        (out_f32(gpu, rows), out_f32(gpu, rows), out_f32(gpu, rows), out_f32(gpu, rows));
    let inputs = GateConvFwdInputs {
        h: &h.slice(off..),
        k: &k.slice(off..),
        v: &v.slice(off..),
        rms_w_h: &wh.slice(off..),
        rms_w_v: &wv.slice(off..),
        conv_w: &cw.slice(off..),
    };
    let outputs = GateConvFwdOutputs {
        y: &mut y,
        vhat: &mut vq,
        alpha: &mut a,
        rrms_h: &mut rh,
        rrms_k: &mut rk,
        rrms_v: &mut rv,
    };
    engram::gate_conv_fwd::<T>(gpu, x.s, inputs, outputs).unwrap();
    FwdOut {
        y: down_half(gpu, &y, n, "Y"),
        vhat: down_half(gpu, &vq, n, "vhat"),
        alpha: down_f32(gpu, &a, rows, "alpha"),
        rrms_h: down_f32(gpu, &rh, rows, "rrms_h"),
        rrms_k: down_f32(gpu, &rk, rows, "rrms_k"),
        rrms_v: down_f32(gpu, &rv, rows, "rrms_v"),
    }
}

/// Runs the backward on the forward's saved tensors `f`. The workspace is filled with
/// `ws_fill` first (its contents must not matter).
pub fn run_bwd<T: Half + rgk::cudarc::driver::DeviceRepr>(
    gpu: &Gpu,
    x: &GateInputs<T>,
    f: &FwdOut<T>,
    off: usize,
    ws_fill: f32,
) -> BwdOut<T> {
    let (n, _) = x.s.lens().unwrap();
    let d = x.s.d;
    let st = gpu.stream();
    let (g, h, k, v) = (up(gpu, &x.dy, off), up(gpu, &x.h, off), up(gpu, &x.k, off), up(gpu, &x.v, off));
    let (wh, wv, cw) = (up(gpu, &x.wh, off), up(gpu, &x.wv, off), up(gpu, &x.cw, off));
    let vq = up(gpu, &f.vhat, off);
    let (a, rh, rk, rv) = (
        st.clone_htod(&f.alpha).unwrap(),
        st.clone_htod(&f.rrms_h).unwrap(),
        st.clone_htod(&f.rrms_k).unwrap(),
        st.clone_htod(&f.rrms_v).unwrap(),
    );
    let mut ws = st.clone_htod(&vec![ws_fill; bwd_workspace_len(x.s).unwrap()]).unwrap();
    let (mut dh, mut dk, mut dv) = (out_half::<T>(gpu, n), out_half::<T>(gpu, n), out_half::<T>(gpu, n));
    let (mut dwh, mut dwv, mut dcw) = (out_f32(gpu, d), out_f32(gpu, d), out_f32(gpu, 4 * d));
    let inputs = GateConvBwdInputs {
        dy: &g.slice(off..),
        h: &h.slice(off..),
        k: &k.slice(off..),
        v: &v.slice(off..),
        vhat: &vq.slice(off..),
        rms_w_h: &wh.slice(off..),
        rms_w_v: &wv.slice(off..),
        conv_w: &cw.slice(off..),
        alpha: &a,
        rrms_h: &rh,
        rrms_k: &rk,
        rrms_v: &rv,
    };
    let outputs = GateConvBwdOutputs {
        dh: &mut dh,
        dk: &mut dk,
        dv: &mut dv,
        drms_w_h: &mut dwh,
        drms_w_v: &mut dwv,
        dconv_w: &mut dcw,
    };
    engram::gate_conv_bwd::<T>(gpu, x.s, inputs, &mut ws, outputs).unwrap();
    BwdOut {
        dh: down_half(gpu, &dh, n, "dH"),
        dk: down_half(gpu, &dk, n, "dk"),
        dv: down_half(gpu, &dv, n, "dv"),
        drms_w_h: down_f32(gpu, &dwh, d, "drms_w_h"),
        drms_w_v: down_f32(gpu, &dwv, d, "drms_w_v"),
        dconv_w: down_f32(gpu, &dcw, 4 * d, "dconv_w"),
    }
}

/// The backward's saved tensors (`alpha, rrms_h, rrms_k`; `vhat`, `rrms_v` too, which it
/// validates but does not read) from the f64 forward reference rounded to the storage types,
/// so the backward tests do not depend on the forward kernel.
pub fn saved_from_reference<T: Half>(x: &GateInputs<T>) -> FwdOut<T> {
    let r = engram_gate_fwd(x.s, &x.h, &x.k, &x.v, &x.wh, &x.wv, &x.cw, None);
    let f = |o: &rgk::reference::RefOutput| o.value.iter().map(|&v| v as f32).collect::<Vec<f32>>();
    FwdOut {
        y: r.y.value.iter().map(|&v| T::round_f64(v)).collect(),
        vhat: r.vhat.value.iter().map(|&v| T::round_f64(v)).collect(),
        alpha: f(&r.alpha),
        rrms_h: f(&r.rrms_h),
        rrms_k: f(&r.rrms_k),
        rrms_v: f(&r.rrms_v),
    }
}

/// Aborts the test process with a message naming the step in progress when no step finishes
/// within the limit (`RGK_TEST_STEP_LIMIT_S`, default 60 s): a kernel that never finishes
/// blocks the read-back forever, and a silent hang hides every other result. A step is one
/// launch plus its read-back and CPU reference check (the largest reference, 1.8 M elements,
/// takes a few seconds in a release build).
pub struct Watchdog {
    state: Arc<Mutex<(String, Instant)>>,
    stop: Arc<AtomicBool>,
}

impl Watchdog {
    pub fn new(test: &str) -> Self {
        let limit = std::env::var("RGK_TEST_STEP_LIMIT_S").ok().and_then(|s| s.parse().ok()).unwrap_or(60u64);
        let limit = Duration::from_secs(limit);
        let state = Arc::new(Mutex::new(("start".to_string(), Instant::now())));
        let stop = Arc::new(AtomicBool::new(false));
        let (st, sp, test) = (state.clone(), stop.clone(), test.to_string());
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_millis(250));
            if sp.load(Ordering::Relaxed) {
                return;
            }
            let (what, since) = st.lock().unwrap().clone();
            if since.elapsed() > limit {
                eprintln!(
                    "{test}: no progress for {limit:?} in step `{what}`: a kernel probably never finishes; aborting the test process"
                );
                std::process::exit(3);
            }
        });
        Self { state, stop }
    }

    /// Marks the start of a new step.
    pub fn step(&self, what: impl Into<String>) {
        *self.state.lock().unwrap() = (what.into(), Instant::now());
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The backward through a [`rgk::engram::GateConvBwdPlan`] (graph submission): captured on the
/// first call, replayed on the next `replays` calls on the same buffers. With `caller_capture`,
/// then PyTorch's warm-up-then-capture pattern: the outputs are poisoned, the caller captures
/// the stream around one more call (whose pointers the plan has cached), and the outputs are
/// those of one replay of the caller's graph.
pub fn run_bwd_plan<T: Half + rgk::cudarc::driver::DeviceRepr>(
    gpu: &Gpu,
    x: &GateInputs<T>,
    f: &FwdOut<T>,
    plan: &mut rgk::engram::GateConvBwdPlan,
    replays: usize,
    caller_capture: bool,
) -> BwdOut<T> {
    let (n, _) = x.s.lens().unwrap();
    let d = x.s.d;
    let st = gpu.stream();
    let (g, h, k, v) = (up(gpu, &x.dy, 0), up(gpu, &x.h, 0), up(gpu, &x.k, 0), up(gpu, &x.v, 0));
    let (wh, wv, cw) = (up(gpu, &x.wh, 0), up(gpu, &x.wv, 0), up(gpu, &x.cw, 0));
    let (a, rh, rk) =
        (st.clone_htod(&f.alpha).unwrap(), st.clone_htod(&f.rrms_h).unwrap(), st.clone_htod(&f.rrms_k).unwrap());
    let mut ws = st.clone_htod(&vec![f32::NAN; bwd_workspace_len(x.s).unwrap()]).unwrap();
    let (mut dh, mut dk, mut dv) = (out_half::<T>(gpu, n), out_half::<T>(gpu, n), out_half::<T>(gpu, n));
    let (mut dwh, mut dwv, mut dcw) = (out_f32(gpu, d), out_f32(gpu, d), out_f32(gpu, 4 * d));
    let ins = [&g, &h, &k, &v, &wh, &wv, &cw].map(|b| b.device_ptr(st).0);
    let saved = [&a, &rh, &rk].map(|b| b.device_ptr(st).0);
    let o1 = [&mut dh, &mut dk, &mut dv].map(|b| b.device_ptr_mut(st).0);
    let o2 = [&mut dwh, &mut dwv, &mut dcw].map(|b| b.device_ptr_mut(st).0);
    let pws = ws.device_ptr_mut(st).0;
    let outs = [o1[0], o1[1], o1[2], o2[0], o2[1], o2[2]];
    for _ in 0..=replays {
        unsafe { plan.run_raw::<T>(gpu, ins, saved, pws, outs, st.cu_stream()) }.unwrap();
    }
    if caller_capture {
        for b in [&mut dh, &mut dk, &mut dv] {
            st.memcpy_htod(&poisoned::<T>(n), b).unwrap();
        }
        for b in [&mut dwh, &mut dwv, &mut dcw] {
            let len = b.len();
            st.memcpy_htod(&vec![f32::NAN; len], b).unwrap();
        }
        st.synchronize().unwrap();
        st.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
        let r = unsafe { plan.run_raw::<T>(gpu, ins, saved, pws, outs, st.cu_stream()) };
        let graph = st.end_capture(CUgraphInstantiate_flags(0));
        r.expect("a plan call inside the caller's capture");
        let graph = graph.expect("the caller's capture survives the plan call").expect("a captured graph");
        graph.launch().unwrap();
    }
    BwdOut {
        dh: down_half(gpu, &dh, n, "dH"),
        dk: down_half(gpu, &dk, n, "dk"),
        dv: down_half(gpu, &dv, n, "dv"),
        drms_w_h: down_f32(gpu, &dwh, d, "drms_w_h"),
        drms_w_v: down_f32(gpu, &dwv, d, "drms_w_v"),
        dconv_w: down_f32(gpu, &dcw, 4 * d, "dconv_w"),
    }
}
