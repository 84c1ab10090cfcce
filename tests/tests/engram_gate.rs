//! EngramGateConvFwd / EngramGateConvBwd on the GPU against the f64 references (SPEC.md §4–§5):
//! dtype outputs within 2 ulp of the correctly rounded value plus the magnitude slack
//! (`rgk::reference::engram_gate_fwd` documents it), f32 outputs within 1e-4 relative (per
//! element, plus slack, and in relative L2). Every output is poisoned first and every element
//! checked; guard elements past each output must stay untouched. The backward is fed the
//! GPU forward's `alpha, rrms_h, rrms_k` and run twice to compare bits (determinism).
mod engram_gate_common;

use engram_gate_common::*;
use rand::rngs::StdRng;
use rgk::cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use rgk::engram::{self, bwd_workspace_len, bwd_workspace_len_with, EngramGateShape, GateBwdConfig, GateFwdConfig};
use rgk::verify::{poisoned, Half};
use rgk::{bf16, f16, Error, Gpu};
use rgk_tests::{fresh_rng, gpu_or_skip};

const GUARD: usize = 5;

fn up<T: Half + rgk::cudarc::driver::DeviceRepr>(gpu: &Gpu, x: &[T], off: usize) -> CudaSlice<T> {
    let mut p = poisoned::<T>(off);
    p.extend_from_slice(x);
    gpu.stream().clone_htod(&p).unwrap()
}

fn out_half<T: Half + rgk::cudarc::driver::DeviceRepr>(gpu: &Gpu, len: usize) -> CudaSlice<T> {
    gpu.stream().clone_htod(&poisoned::<T>(len + GUARD)).unwrap()
}

fn out_f32(gpu: &Gpu, len: usize) -> CudaSlice<f32> {
    gpu.stream().clone_htod(&vec![f32::NAN; len + GUARD]).unwrap()
}

fn down_half<T: Half + rgk::cudarc::driver::DeviceRepr>(gpu: &Gpu, b: &CudaSlice<T>, len: usize, name: &str) -> Vec<T> {
    let all: Vec<T> = gpu.stream().clone_dtoh(b).unwrap();
    let p = T::poison().to_f64().to_bits();
    assert!(all[len..].iter().all(|v| v.to_f64().to_bits() == p), "{name}: write past the end");
    all[..len].to_vec()
}

fn down_f32(gpu: &Gpu, b: &CudaSlice<f32>, len: usize, name: &str) -> Vec<f32> {
    let all: Vec<f32> = gpu.stream().clone_dtoh(b).unwrap();
    assert!(all[len..].iter().all(|v| v.is_nan()), "{name}: write past the end");
    all[..len].to_vec()
}

/// `Ok` → true; a configuration the kernel cannot run (too many threads for its registers) →
/// false after printing it; any other error panics.
fn config_ok(r: rgk::Result<()>) -> bool {
    match r {
        Ok(()) => true,
        Err(Error::Shape { arg: "config.rows_per_block", msg }) => {
            println!("configuration refused (expected for large blocks): {msg}");
            false
        }
        Err(e) => panic!("launch failed: {e}"),
    }
}

/// Runs the forward; `off` = element offset of every input inside its buffer (≠ 0 takes the
/// scalar kernel); `cfg` = explicit configuration through the raw entry.
fn run_fwd<T: Half + rgk::cudarc::driver::DeviceRepr>(
    gpu: &Gpu,
    x: &GateInputs<T>,
    off: usize,
    cfg: Option<GateFwdConfig>,
) -> Option<FwdOut<T>> {
    let (n, rows) = x.s.lens().unwrap();
    let (h, k, v) = (up(gpu, &x.h, off), up(gpu, &x.k, off), up(gpu, &x.v, off));
    let (wh, wv, cw) = (up(gpu, &x.wh, off), up(gpu, &x.wv, off), up(gpu, &x.cw, off));
    let (mut y, mut vq) = (out_half::<T>(gpu, n), out_half::<T>(gpu, n));
    let (mut a, mut rh, mut rk, mut rv) =
        (out_f32(gpu, rows), out_f32(gpu, rows), out_f32(gpu, rows), out_f32(gpu, rows));
    match cfg {
        None => engram::gate_conv_fwd::<T>(
            gpu,
            x.s,
            &h.slice(off..),
            &k.slice(off..),
            &v.slice(off..),
            &wh.slice(off..),
            &wv.slice(off..),
            &cw.slice(off..),
            &mut y,
            &mut vq,
            &mut a,
            &mut rh,
            &mut rk,
            &mut rv,
        )
        .unwrap(),
        Some(c) => {
            let st = gpu.stream();
            let ins = [&h, &k, &v, &wh, &wv, &cw].map(|b| b.device_ptr(st).0 + (off * 2) as u64);
            let outs = [y.device_ptr_mut(st).0, vq.device_ptr_mut(st).0];
            let outs2 = [&mut a, &mut rh, &mut rk, &mut rv].map(|b| b.device_ptr_mut(st).0);
            let r = unsafe {
                engram::gate_conv_fwd_raw_with::<T>(
                    gpu,
                    x.s,
                    c,
                    ins,
                    [outs[0], outs[1], outs2[0], outs2[1], outs2[2], outs2[3]],
                    st.cu_stream(),
                )
            };
            if !config_ok(r) {
                return None;
            }
        }
    }
    Some(FwdOut {
        y: down_half(gpu, &y, n, "Y"),
        vhat: down_half(gpu, &vq, n, "vhat"),
        alpha: down_f32(gpu, &a, rows, "alpha"),
        rrms_h: down_f32(gpu, &rh, rows, "rrms_h"),
        rrms_k: down_f32(gpu, &rk, rows, "rrms_k"),
        rrms_v: down_f32(gpu, &rv, rows, "rrms_v"),
    })
}

/// Runs the backward on the forward's saved tensors `f`. The workspace is filled with
/// `ws_fill` first (its contents must not matter).
fn run_bwd<T: Half + rgk::cudarc::driver::DeviceRepr>(
    gpu: &Gpu,
    x: &GateInputs<T>,
    f: &FwdOut<T>,
    off: usize,
    cfg: Option<GateBwdConfig>,
    ws_fill: f32,
) -> Option<BwdOut<T>> {
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
    let wl = match cfg {
        None => bwd_workspace_len(x.s).unwrap(),
        Some(c) => bwd_workspace_len_with(x.s, c).unwrap(),
    };
    let mut ws = st.clone_htod(&vec![ws_fill; wl]).unwrap();
    let (mut dh, mut dk, mut dv) = (out_half::<T>(gpu, n), out_half::<T>(gpu, n), out_half::<T>(gpu, n));
    let (mut dwh, mut dwv, mut dcw) = (out_f32(gpu, d), out_f32(gpu, d), out_f32(gpu, 4 * d));
    match cfg {
        None => engram::gate_conv_bwd::<T>(
            gpu,
            x.s,
            &g.slice(off..),
            &h.slice(off..),
            &k.slice(off..),
            &v.slice(off..),
            &vq.slice(off..),
            &wh.slice(off..),
            &wv.slice(off..),
            &cw.slice(off..),
            &a,
            &rh,
            &rk,
            &rv,
            &mut ws,
            &mut dh,
            &mut dk,
            &mut dv,
            &mut dwh,
            &mut dwv,
            &mut dcw,
        )
        .unwrap(),
        Some(c) => {
            let ins = [&g, &h, &k, &v, &wh, &wv, &cw].map(|b| b.device_ptr(st).0 + (off * 2) as u64);
            let saved = [&a, &rh, &rk].map(|b| b.device_ptr(st).0);
            let o1 = [&mut dh, &mut dk, &mut dv].map(|b| b.device_ptr_mut(st).0);
            let o2 = [&mut dwh, &mut dwv, &mut dcw].map(|b| b.device_ptr_mut(st).0);
            let pws = ws.device_ptr_mut(st).0;
            let r = unsafe {
                engram::gate_conv_bwd_raw_with::<T>(
                    gpu,
                    x.s,
                    c,
                    ins,
                    saved,
                    pws,
                    [o1[0], o1[1], o1[2], o2[0], o2[1], o2[2]],
                    st.cu_stream(),
                )
            };
            if !config_ok(r) {
                return None;
            }
        }
    }
    Some(BwdOut {
        dh: down_half(gpu, &dh, n, "dH"),
        dk: down_half(gpu, &dk, n, "dk"),
        dv: down_half(gpu, &dv, n, "dv"),
        drms_w_h: down_f32(gpu, &dwh, d, "drms_w_h"),
        drms_w_v: down_f32(gpu, &dwv, d, "drms_w_v"),
        dconv_w: down_f32(gpu, &dcw, 4 * d, "dconv_w"),
    })
}

/// Forward and backward of one problem, both checked; returns the worst errors.
fn case<T: Half + rgk::cudarc::driver::DeviceRepr>(
    gpu: &Gpu,
    rng: &mut StdRng,
    s: EngramGateShape,
    scale: f32,
    unit: bool,
) -> Worst {
    let x = gen::<T>(rng, s, scale, unit);
    let what = format!("{} {s:?} scale {scale} unit_w {unit}", T::NAME);
    let f = run_fwd(gpu, &x, 0, None).unwrap();
    let mut w = check_fwd(&what, &x, &f);
    let b = run_bwd(gpu, &x, &f, 0, None, 0.0).unwrap();
    w.merge(&check_bwd(&what, &x, &b));
    w
}

#[test]
fn seed_workloads() {
    let Some(gpu) = gpu_or_skip("engram_gate::seed_workloads") else { return };
    let mut rng = fresh_rng("engram_gate::seed_workloads");
    for (name, m, t, d, is_f16) in [
        ("train-s32", 1, 32, 256, true),
        ("train-s64", 2, 64, 512, true),
        ("train-s128", 1, 128, 256, false),
        ("train-s96", 3, 96, 768, false),
    ] {
        let s = EngramGateShape { m, t, d };
        for (scale, unit) in [(1.0, true), (1.0, false), (100.0, false)] {
            let w = if is_f16 {
                case::<f16>(&gpu, &mut rng, s, scale, unit)
            } else {
                case::<bf16>(&gpu, &mut rng, s, scale, unit)
            };
            println!("{name} scale {scale} unit_w {unit}: {w:?}");
        }
    }
}

#[test]
fn shape_sweep() {
    let Some(gpu) = gpu_or_skip("engram_gate::shape_sweep") else { return };
    let mut rng = fresh_rng("engram_gate::shape_sweep");
    let mut worst = Worst::default();
    let mut n = 0;
    for t in [1, 2, 3, 4, 5, 257] {
        for m in [1, 7] {
            for d in [8, 256, 1000, 4096] {
                if m * t * d > 2_000_000 {
                    continue; // M=7, T=257, d=4096: covered with M=1 (CPU reference time)
                }
                let s = EngramGateShape { m, t, d };
                let scale = if n % 2 == 0 { 1.0 } else { 100.0 };
                let w = if n % 3 == 0 {
                    case::<f16>(&gpu, &mut rng, s, scale, false)
                } else {
                    case::<bf16>(&gpu, &mut rng, s, scale, false)
                };
                worst.merge(&w);
                n += 1;
            }
        }
    }
    println!("shape sweep ({n} shapes): {worst:?}");
}

#[test]
fn both_dtypes_both_scales_every_path() {
    let Some(gpu) = gpu_or_skip("engram_gate::every_path") else { return };
    let mut rng = fresh_rng("engram_gate::every_path");
    // resident NV = 1..4, streaming vectorised (d > 1024), scalar (d % 8 != 0)
    for d in [8, 200, 256, 264, 512, 768, 1024, 1032, 2048, 13, 1000] {
        let s = EngramGateShape { m: 2, t: 11, d };
        for scale in [1.0, 100.0] {
            case::<f16>(&gpu, &mut rng, s, scale, false);
            case::<bf16>(&gpu, &mut rng, s, scale, false);
        }
    }
}

#[test]
fn misaligned_inputs_take_the_scalar_path() {
    let Some(gpu) = gpu_or_skip("engram_gate::misaligned") else { return };
    let mut rng = fresh_rng("engram_gate::misaligned");
    for (m, t, d) in [(2, 9, 256), (1, 5, 768), (3, 4, 8)] {
        let s = EngramGateShape { m, t, d };
        for off in [1, 3] {
            let x = gen::<bf16>(&mut rng, s, 1.0, false);
            let what = format!("bf16 {s:?} offset {off}");
            let f = run_fwd(&gpu, &x, off, None).unwrap();
            check_fwd(&what, &x, &f);
            check_bwd(&what, &x, &run_bwd(&gpu, &x, &f, off, None, 0.0).unwrap());
        }
    }
}

#[test]
fn every_launch_config_matches_reference() {
    let Some(gpu) = gpu_or_skip("engram_gate::every_launch_config") else { return };
    let mut rng = fresh_rng("engram_gate::every_launch_config");
    for (m, t, d) in [(3, 96, 768), (2, 13, 1000), (1, 9, 4096), (2, 7, 256)] {
        let s = EngramGateShape { m, t, d };
        let x = gen::<f16>(&mut rng, s, 1.0, false);
        let f0 = run_fwd(&gpu, &x, 0, None).unwrap();
        for r in [1, 2, 3, 5, 8, 13, 29] {
            let Some(f) = run_fwd(&gpu, &x, 0, Some(GateFwdConfig { rows_per_block: r })) else { continue };
            check_fwd(&format!("{s:?} fwd R {r}"), &x, &f);
        }
        for r in [1, 2, 4, 6, 10, 19, 26] {
            for sg in [1, 8, 32] {
                let c = GateBwdConfig { rows_per_block: r, reduce_segments: sg };
                let Some(b) = run_bwd(&gpu, &x, &f0, 0, Some(c), 0.0) else { continue };
                check_bwd(&format!("{s:?} bwd {c:?}"), &x, &b);
            }
        }
    }
}

fn bits_h<T: Half>(v: &[T]) -> Vec<u64> {
    v.iter().map(|x| x.to_f64().to_bits()).collect()
}
fn bits_f(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn backward_is_bitwise_deterministic() {
    let Some(gpu) = gpu_or_skip("engram_gate::deterministic") else { return };
    let mut rng = fresh_rng("engram_gate::deterministic");
    for (m, t, d) in [(3, 96, 768), (7, 257, 1000), (1, 33, 4096)] {
        let s = EngramGateShape { m, t, d };
        let x = gen::<bf16>(&mut rng, s, 1.0, false);
        let f1 = run_fwd(&gpu, &x, 0, None).unwrap();
        let f2 = run_fwd(&gpu, &x, 0, None).unwrap();
        assert_eq!(bits_h(&f1.y), bits_h(&f2.y), "{s:?}: Y differs between runs");
        assert_eq!(bits_h(&f1.vhat), bits_h(&f2.vhat), "{s:?}: vhat differs between runs");
        assert_eq!(bits_f(&f1.alpha), bits_f(&f2.alpha), "{s:?}: alpha differs between runs");
        let b1 = run_bwd(&gpu, &x, &f1, 0, None, 0.0).unwrap();
        let b2 = run_bwd(&gpu, &x, &f1, 0, None, f32::NAN).unwrap();
        assert_eq!(bits_h(&b1.dh), bits_h(&b2.dh), "{s:?}: dH differs between runs");
        assert_eq!(bits_h(&b1.dk), bits_h(&b2.dk), "{s:?}: dk differs between runs");
        assert_eq!(bits_h(&b1.dv), bits_h(&b2.dv), "{s:?}: dv differs between runs");
        assert_eq!(bits_f(&b1.drms_w_h), bits_f(&b2.drms_w_h), "{s:?}: drms_w_h differs between runs");
        assert_eq!(bits_f(&b1.drms_w_v), bits_f(&b2.drms_w_v), "{s:?}: drms_w_v differs between runs");
        assert_eq!(bits_f(&b1.dconv_w), bits_f(&b2.dconv_w), "{s:?}: dconv_w differs between runs");
        check_bwd(&format!("{s:?}"), &x, &b1);
        println!("{s:?}: two backward runs bitwise identical");
    }
}

#[test]
fn bad_input_is_an_error_naming_the_argument() {
    let Some(gpu) = gpu_or_skip("engram_gate::bad_input") else { return };
    let s = EngramGateShape { m: 2, t: 5, d: 16 };
    let (n, rows) = s.lens().unwrap();
    let st = gpu.stream();
    let z = |len: usize| st.alloc_zeros::<f16>(len).unwrap();
    let zf = |len: usize| st.alloc_zeros::<f32>(len).unwrap();
    let expect = |r: rgk::Result<()>, arg: &str| match r {
        Err(Error::BufferTooSmall { arg: a, .. }) => assert_eq!(a, arg),
        other => panic!("expected BufferTooSmall({arg}), got {other:?}"),
    };
    // forward: shrink one buffer at a time
    let names = ["h", "k", "v", "rms_w_h", "rms_w_v", "conv_w", "y", "vhat", "alpha", "rrms_h", "rrms_k", "rrms_v"];
    let full = [n, n, n, 16, 16, 64, n, n, rows, rows, rows, rows];
    for (bad, name) in names.iter().enumerate() {
        let len = |i: usize| if i == bad { full[i] - 1 } else { full[i] };
        let (h, k, v, wh, wv, cw) = (z(len(0)), z(len(1)), z(len(2)), z(len(3)), z(len(4)), z(len(5)));
        let (mut y, mut q) = (z(len(6)), z(len(7)));
        let (mut a, mut rh, mut rk, mut rv) = (zf(len(8)), zf(len(9)), zf(len(10)), zf(len(11)));
        expect(
            engram::gate_conv_fwd(
                &gpu, s, &h, &k, &v, &wh, &wv, &cw, &mut y, &mut q, &mut a, &mut rh, &mut rk, &mut rv,
            ),
            name,
        );
    }
    // backward
    let wl = bwd_workspace_len(s).unwrap();
    let names = [
        "dy",
        "h",
        "k",
        "v",
        "vhat",
        "rms_w_h",
        "rms_w_v",
        "conv_w",
        "alpha",
        "rrms_h",
        "rrms_k",
        "rrms_v",
        "workspace",
        "dh",
        "dk",
        "dv",
        "drms_w_h",
        "drms_w_v",
        "dconv_w",
    ];
    let full = [n, n, n, n, n, 16, 16, 64, rows, rows, rows, rows, wl, n, n, n, 16, 16, 64];
    for (bad, name) in names.iter().enumerate() {
        let len = |i: usize| if i == bad { full[i] - 1 } else { full[i] };
        let (g, h, k, v, q) = (z(len(0)), z(len(1)), z(len(2)), z(len(3)), z(len(4)));
        let (wh, wv, cw) = (z(len(5)), z(len(6)), z(len(7)));
        let (a, rh, rk, rv) = (zf(len(8)), zf(len(9)), zf(len(10)), zf(len(11)));
        let mut ws = zf(len(12));
        let (mut dh, mut dk, mut dv) = (z(len(13)), z(len(14)), z(len(15)));
        let (mut dwh, mut dwv, mut dcw) = (zf(len(16)), zf(len(17)), zf(len(18)));
        expect(
            engram::gate_conv_bwd(
                &gpu, s, &g, &h, &k, &v, &q, &wh, &wv, &cw, &a, &rh, &rk, &rv, &mut ws, &mut dh, &mut dk, &mut dv,
                &mut dwh, &mut dwv, &mut dcw,
            ),
            name,
        );
    }
    st.synchronize().unwrap();
}
