//! EngramGateConvBwd on the GPU against the q-free f64 gradients (docs/ops.md §5): dtype outputs
//! within 2 ulp of the correctly rounded value plus the magnitude slack, f32 outputs within
//! 1e-4 relative (per element, plus slack, and in relative L2). Every output is poisoned first
//! and every element checked; guard elements past each output must stay untouched.
//!
//! The saved tensors (`alpha, rrms_h, rrms_k`) come from the f64 forward reference rounded to
//! f32, so these tests do not depend on the forward kernel (which has its own file,
//! `engram_gate_fwd.rs`); `seed_workloads` also runs the real chain (GPU forward → backward).
//! Every test runs under a watchdog that names the step in progress if a kernel never finishes.
mod engram_gate_common;

use engram_gate_common::gpu::*;
use engram_gate_common::*;
use rand::rngs::StdRng;
use rgk::engram::{self, bwd_workspace_len, EngramGateShape, GateConvBwdInputs, GateConvBwdOutputs};
use rgk::verify::Half;
use rgk::{bf16, f16, Error, Gpu};
use rgk_tests::gpu_or_skip;

/// The backward of one problem (saved tensors from the reference), checked.
fn case<T: Half + rgk::cudarc::driver::DeviceRepr>(
    gpu: &Gpu,
    wd: &Watchdog,
    rng: &mut StdRng,
    s: EngramGateShape,
    scale: f32,
    unit: bool,
) -> Worst {
    let x = gen::<T>(rng, s, scale, unit);
    let what = format!("bwd {} {s:?} scale {scale} unit_w {unit}", T::NAME);
    wd.step(&what);
    let f = saved_from_reference(&x);
    let b = run_bwd(gpu, &x, &f, 0, 0.0);
    check_bwd(&what, &x, &b)
}

#[test]
fn seed_workloads() {
    let Some((gpu, wd, mut rng)) = start("engram_gate_bwd::seed_workloads") else { return };
    for (name, m, t, d, is_f16) in [
        ("train-s32", 1, 32, 256, true),
        ("train-s64", 2, 64, 512, true),
        ("train-s128", 1, 128, 256, false),
        ("train-s96", 3, 96, 768, false),
    ] {
        let s = EngramGateShape { m, t, d };
        for (scale, unit) in [(1.0, true), (1.0, false), (100.0, false)] {
            let w = if is_f16 {
                case::<f16>(&gpu, &wd, &mut rng, s, scale, unit)
            } else {
                case::<bf16>(&gpu, &wd, &mut rng, s, scale, unit)
            };
            println!("bwd {name} scale {scale} unit_w {unit}: {w:?}");
        }
        // the real chain: the GPU forward's saved tensors feed the backward
        let w = if is_f16 { chain::<f16>(&gpu, &wd, &mut rng, s) } else { chain::<bf16>(&gpu, &wd, &mut rng, s) };
        println!("bwd {name} after the GPU forward: {w:?}");
    }
}

fn chain<T: Half + rgk::cudarc::driver::DeviceRepr>(
    gpu: &Gpu,
    wd: &Watchdog,
    rng: &mut StdRng,
    s: EngramGateShape,
) -> Worst {
    let x = gen::<T>(rng, s, 1.0, false);
    let what = format!("fwd→bwd {} {s:?}", T::NAME);
    wd.step(&what);
    let f = run_fwd(gpu, &x, 0);
    let b = run_bwd(gpu, &x, &f, 0, 0.0);
    check_bwd(&what, &x, &b)
}

#[test]
fn shape_sweep() {
    let Some((gpu, wd, mut rng)) = start("engram_gate_bwd::shape_sweep") else { return };
    let mut worst = Worst::default();
    let cases = sweep_cases();
    for &(s, scale, is_f16) in &cases {
        let w = if is_f16 {
            case::<f16>(&gpu, &wd, &mut rng, s, scale, false)
        } else {
            case::<bf16>(&gpu, &wd, &mut rng, s, scale, false)
        };
        worst.merge(&w);
    }
    let n = cases.len();
    println!("bwd shape sweep ({n} shapes): {worst:?}");
}

#[test]
fn both_dtypes_both_scales_every_path() {
    let Some((gpu, wd, mut rng)) = start("engram_gate_bwd::every_path") else { return };
    for d in PATH_DS {
        let s = EngramGateShape { m: 2, t: 11, d };
        for scale in [1.0, 100.0] {
            case::<f16>(&gpu, &wd, &mut rng, s, scale, false);
            case::<bf16>(&gpu, &wd, &mut rng, s, scale, false);
        }
    }
}

#[test]
fn misaligned_inputs_take_the_scalar_path() {
    let Some((gpu, wd, mut rng)) = start("engram_gate_bwd::misaligned") else { return };
    for (m, t, d) in [(2, 9, 256), (1, 5, 768), (3, 4, 8), (1, 6, 4100)] {
        let s = EngramGateShape { m, t, d };
        for off in [1, 3] {
            let x = gen::<bf16>(&mut rng, s, 1.0, false);
            let what = format!("bwd bf16 {s:?} offset {off}");
            wd.step(&what);
            let f = saved_from_reference(&x);
            check_bwd(&what, &x, &run_bwd(&gpu, &x, &f, off, 0.0));
        }
    }
}

/// One shape per kernel the planner can launch (both dtypes, scales 1 and 100, the workspace
/// filled with NaN first): the plan takes the main and reduce kernels the shape is meant to
/// reach, and the outputs match the reference.
#[test]
fn every_planned_kernel_matches_reference() {
    let Some((gpu, wd, mut rng)) = start("engram_gate_bwd::every_planned_kernel") else { return };
    for (m, t, d, main, reduce) in [
        (2, 7, 8, "engram_gate_bwd_split_{}_r1", "engram_gate_bwd_reduce"),
        (2, 13, 256, "engram_gate_bwd_split_{}_r1", "engram_gate_bwd_reduce"),
        (3, 96, 768, "engram_gate_bwd_split_{}_r1", "engram_gate_bwd_reduce_vec4"),
        (2, 13, 800, "engram_gate_bwd_split_{}_r2", "engram_gate_bwd_reduce_vec4"),
        (2, 13, 1000, "engram_gate_bwd_rowwarp_{}_r4", "engram_gate_bwd_reduce_vec4"),
        (65536, 1, 16, "engram_gate_bwd_rowwarp_{}_r1", "engram_gate_bwd_reduce"),
        (1, 9, 4096, "engram_gate_bwd_stream_vec8_{}", "engram_gate_bwd_reduce_vec4"),
        (2, 7, 13, "engram_gate_bwd_stream_scalar_{}", "engram_gate_bwd_reduce"),
        (1, 5, 770, "engram_gate_bwd_stream_scalar_{}", "engram_gate_bwd_reduce"),
    ] {
        let s = EngramGateShape { m, t, d };
        for (is_f16, dt) in [(true, "f16"), (false, "bf16")] {
            let [_, pm, pr] = engram::gate_conv_planned_entries(s, !is_f16, true, true).unwrap();
            assert_eq!((pm, pr), (main.replace("{}", dt).as_str(), reduce), "{s:?}");
            for scale in [1.0, 100.0] {
                let w = if is_f16 {
                    nan_workspace_case::<f16>(&gpu, &wd, &mut rng, s, scale)
                } else {
                    nan_workspace_case::<bf16>(&gpu, &wd, &mut rng, s, scale)
                };
                println!("bwd {s:?} {dt} scale {scale}: {w:?}");
            }
        }
    }
}

/// [`case`] with the workspace filled with NaN before the call.
fn nan_workspace_case<T: Half + rgk::cudarc::driver::DeviceRepr>(
    gpu: &Gpu,
    wd: &Watchdog,
    rng: &mut StdRng,
    s: EngramGateShape,
    scale: f32,
) -> Worst {
    let x = gen::<T>(rng, s, scale, false);
    let what = format!("bwd {} {s:?} scale {scale} NaN workspace", T::NAME);
    wd.step(&what);
    let f = saved_from_reference(&x);
    check_bwd(&what, &x, &run_bwd(gpu, &x, &f, 0, f32::NAN))
}

fn bits_h<T: Half>(v: &[T]) -> Vec<u64> {
    v.iter().map(|x| x.to_f64().to_bits()).collect()
}
fn bits_f(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn assert_bwd_bitwise<T: Half>(what: &str, b1: &BwdOut<T>, b2: &BwdOut<T>) {
    assert_eq!(bits_h(&b1.dh), bits_h(&b2.dh), "{what}: dH differs");
    assert_eq!(bits_h(&b1.dk), bits_h(&b2.dk), "{what}: dk differs");
    assert_eq!(bits_h(&b1.dv), bits_h(&b2.dv), "{what}: dv differs");
    assert_eq!(bits_f(&b1.drms_w_h), bits_f(&b2.drms_w_h), "{what}: drms_w_h differs");
    assert_eq!(bits_f(&b1.drms_w_v), bits_f(&b2.drms_w_v), "{what}: drms_w_v differs");
    assert_eq!(bits_f(&b1.dconv_w), bits_f(&b2.dconv_w), "{what}: dconv_w differs");
}

/// `GateConvBwdPlan` (graph submission of the two launches, the reduce kernel's dependent
/// launch inside the graph): bitwise the direct launches, on the capturing call and on replays.
#[test]
fn graph_plan_is_bitwise_direct_launches() {
    let Some((gpu, wd, mut rng)) = start("engram_gate_bwd::graph_plan") else { return };
    for &(m, t, d) in &[(1, 32, 256), (2, 64, 512), (1, 128, 256), (3, 96, 768), (2, 7, 8), (2, 13, 1000)] {
        let s = EngramGateShape { m, t, d };
        let x = gen::<bf16>(&mut rng, s, 1.0, false);
        let what = format!("graph {s:?}");
        wd.step(&what);
        let f = saved_from_reference(&x);
        let direct = run_bwd(&gpu, &x, &f, 0, 0.0);
        let mut plan = engram::GateConvBwdPlan::new(s).unwrap();
        let graphed = run_bwd_plan(&gpu, &x, &f, &mut plan, 2, false);
        check_bwd(&what, &x, &graphed);
        assert_bwd_bitwise(&what, &direct, &graphed);
    }
}

/// PyTorch's warm-up-then-capture pattern on a `GateConvBwdPlan` whose graph for these buffers is
/// cached: inside the caller's capture the plan launches into that capture (it must not replay
/// its own graph into a capturing stream); one replay of the caller's graph computes outputs
/// poisoned before the capture, bitwise those of direct launches, on the seed shapes.
#[test]
fn plan_inside_a_caller_capture() {
    let Some((gpu, wd, mut rng)) = start("engram_gate_bwd::plan_inside_a_caller_capture") else { return };
    for &(m, t, d) in &[(1, 32, 256), (2, 64, 512), (1, 128, 256), (3, 96, 768)] {
        let s = EngramGateShape { m, t, d };
        let x = gen::<f16>(&mut rng, s, 1.0, false);
        let what = format!("caller capture {s:?}");
        wd.step(&what);
        let f = saved_from_reference(&x);
        let direct = run_bwd(&gpu, &x, &f, 0, 0.0);
        let mut plan = engram::GateConvBwdPlan::new(s).unwrap();
        let captured = run_bwd_plan(&gpu, &x, &f, &mut plan, 1, true);
        check_bwd(&what, &x, &captured);
        assert_bwd_bitwise(&what, &direct, &captured);
    }
}

#[test]
fn backward_is_bitwise_deterministic() {
    let Some((gpu, wd, mut rng)) = start("engram_gate_bwd::deterministic") else { return };
    for (m, t, d) in [(3, 96, 768), (7, 257, 1000), (1, 33, 4096)] {
        let s = EngramGateShape { m, t, d };
        let x = gen::<bf16>(&mut rng, s, 1.0, false);
        wd.step(format!("bwd twice {s:?}"));
        let f1 = run_fwd(&gpu, &x, 0);
        let b1 = run_bwd(&gpu, &x, &f1, 0, 0.0);
        let b2 = run_bwd(&gpu, &x, &f1, 0, f32::NAN);
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
    let Some(gpu) = gpu_or_skip("engram_gate_bwd::bad_input") else { return };
    let s = EngramGateShape { m: 2, t: 5, d: 16 };
    let (n, rows) = s.lens().unwrap();
    let st = gpu.stream();
    let z = |len: usize| st.alloc_zeros::<f16>(len).unwrap();
    let zf = |len: usize| st.alloc_zeros::<f32>(len).unwrap();
    let expect = |r: rgk::Result<()>, arg: &str| match r {
        Err(Error::BufferTooSmall { arg: a, .. }) => assert_eq!(a, arg),
        other => panic!("expected BufferTooSmall({arg}), got {other:?}"),
    };
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
        let inputs = GateConvBwdInputs {
            dy: &g,
            h: &h,
            k: &k,
            v: &v,
            vhat: &q,
            rms_w_h: &wh,
            rms_w_v: &wv,
            conv_w: &cw,
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
        let r = engram::gate_conv_bwd(&gpu, s, inputs, &mut ws, outputs);
        assert_eq!(r.as_ref().err().and_then(|e| e.arg()), Some(*name));
        expect(r, name);
    }
    st.synchronize().unwrap();
}
