//! EngramGateConvFwd on the GPU against the f64 reference (docs/ops.md §4): dtype outputs within
//! 2 ulp of the correctly rounded value plus the magnitude slack (`rgk::reference::
//! engram_gate_fwd` documents it), f32 outputs within 1e-4 relative (per element, plus slack,
//! and in relative L2). Every output is poisoned first and every element checked; guard
//! elements past each output must stay untouched. The backward has its own test file
//! (`engram_gate_bwd.rs`) so a failure or hang of one cannot hide the other's results; every
//! test runs under a watchdog that names the step in progress if a kernel never finishes.
mod engram_gate_common;

use engram_gate_common::gpu::*;
use engram_gate_common::*;
use rand::rngs::StdRng;
use rgk::engram::{self, EngramGateShape, GateConvFwdInputs, GateConvFwdOutputs};
use rgk::verify::Half;
use rgk::{bf16, f16, Error, Gpu};
use rgk_tests::gpu_or_skip;

/// The forward of one problem, checked; returns the worst errors.
fn case<T: Half + rgk::cudarc::driver::DeviceRepr>(
    gpu: &Gpu,
    wd: &Watchdog,
    rng: &mut StdRng,
    s: EngramGateShape,
    scale: f32,
    unit: bool,
) -> Worst {
    let x = gen::<T>(rng, s, scale, unit);
    let what = format!("fwd {} {s:?} scale {scale} unit_w {unit}", T::NAME);
    wd.step(&what);
    let f = run_fwd(gpu, &x, 0);
    check_fwd(&what, &x, &f)
}

#[test]
fn seed_workloads() {
    let Some((gpu, wd, mut rng)) = start("engram_gate_fwd::seed_workloads") else { return };
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
            println!("fwd {name} scale {scale} unit_w {unit}: {w:?}");
        }
    }
}

#[test]
fn shape_sweep() {
    let Some((gpu, wd, mut rng)) = start("engram_gate_fwd::shape_sweep") else { return };
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
    println!("fwd shape sweep ({n} shapes): {worst:?}");
}

#[test]
fn both_dtypes_both_scales_every_path() {
    let Some((gpu, wd, mut rng)) = start("engram_gate_fwd::every_path") else { return };
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
    let Some((gpu, wd, mut rng)) = start("engram_gate_fwd::misaligned") else { return };
    for (m, t, d) in [(2, 9, 256), (1, 5, 768), (3, 4, 8), (1, 6, 4100)] {
        let s = EngramGateShape { m, t, d };
        for off in [1, 3] {
            let x = gen::<bf16>(&mut rng, s, 1.0, false);
            let what = format!("fwd bf16 {s:?} offset {off}");
            wd.step(&what);
            let f = run_fwd(&gpu, &x, off);
            check_fwd(&what, &x, &f);
        }
    }
}

/// One shape per kernel the planner can launch (both dtypes, scales 1 and 100): the plan
/// takes the kernel the shape is meant to reach, and the outputs match the reference.
#[test]
fn every_planned_kernel_matches_reference() {
    let Some((gpu, wd, mut rng)) = start("engram_gate_fwd::every_planned_kernel") else { return };
    for (m, t, d, kernel) in [
        (2, 7, 8, "engram_gate_fwd_smem_grid1d_{}_r1"),
        (65536, 1, 16, "engram_gate_fwd_smem_grid1d_{}_r1"),
        (2, 13, 256, "engram_gate_fwd_smem_{}_r1"),
        (2, 13, 512, "engram_gate_fwd_smem_{}_r2"),
        (3, 96, 768, "engram_gate_fwd_smem_{}_r3"),
        (2, 13, 1000, "engram_gate_fwd_smem_{}_r4"),
        (1, 9, 4096, "engram_gate_fwd_stream_vec8_{}"),
        (2, 7, 13, "engram_gate_fwd_stream_scalar_{}"),
    ] {
        let s = EngramGateShape { m, t, d };
        for (is_f16, dt) in [(true, "f16"), (false, "bf16")] {
            let [planned, _, _] = engram::gate_conv_planned_entries(s, !is_f16, true, true).unwrap();
            assert_eq!(planned, kernel.replace("{}", dt), "{s:?}");
            for scale in [1.0, 100.0] {
                if is_f16 {
                    case::<f16>(&gpu, &wd, &mut rng, s, scale, false);
                } else {
                    case::<bf16>(&gpu, &wd, &mut rng, s, scale, false);
                }
            }
        }
    }
}

/// The PTX entries of the family are exactly those the planners launch over the shape grid
/// of `planned_kernels` (no entry is unreachable, no planned entry is missing).
#[test]
fn planned_kernels_are_the_module_entries() {
    let Some(gpu) = gpu_or_skip("engram_gate_fwd::planned_kernels") else { return };
    let planned = engram::gate_conv_planned_kernels(&gpu).unwrap();
    let entries: std::collections::BTreeSet<&str> =
        rgk_tests::module_entries().into_iter().filter(|n| n.starts_with("engram_gate_")).collect();
    assert_eq!(planned, entries);
}

fn bits_h<T: Half>(v: &[T]) -> Vec<u64> {
    v.iter().map(|x| x.to_f64().to_bits()).collect()
}

fn bits_f(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn forward_is_bitwise_deterministic() {
    let Some((gpu, wd, mut rng)) = start("engram_gate_fwd::deterministic") else { return };
    for (m, t, d) in [(3, 96, 768), (7, 257, 1000), (1, 33, 4096), (2, 64, 512)] {
        let s = EngramGateShape { m, t, d };
        let x = gen::<bf16>(&mut rng, s, 1.0, false);
        wd.step(format!("fwd twice {s:?}"));
        let f1 = run_fwd(&gpu, &x, 0);
        let f2 = run_fwd(&gpu, &x, 0);
        assert_eq!(bits_h(&f1.y), bits_h(&f2.y), "{s:?}: Y differs between runs");
        assert_eq!(bits_h(&f1.vhat), bits_h(&f2.vhat), "{s:?}: vhat differs between runs");
        for (a, b, n) in [
            (&f1.alpha, &f2.alpha, "alpha"),
            (&f1.rrms_h, &f2.rrms_h, "rrms_h"),
            (&f1.rrms_k, &f2.rrms_k, "rrms_k"),
            (&f1.rrms_v, &f2.rrms_v, "rrms_v"),
        ] {
            assert_eq!(bits_f(a), bits_f(b), "{s:?}: {n} differs between runs");
        }
        check_fwd(&format!("{s:?}"), &x, &f1);
    }
}

#[test]
fn bad_input_is_an_error_naming_the_argument() {
    let Some(gpu) = gpu_or_skip("engram_gate_fwd::bad_input") else { return };
    let s = EngramGateShape { m: 2, t: 5, d: 16 };
    let (n, rows) = s.lens().unwrap();
    let st = gpu.stream();
    let z = |len: usize| st.alloc_zeros::<f16>(len).unwrap();
    let zf = |len: usize| st.alloc_zeros::<f32>(len).unwrap();
    let expect = |r: rgk::Result<()>, arg: &str| match r {
        Err(Error::BufferTooSmall { arg: a, .. }) => assert_eq!(a, arg),
        other => panic!("expected BufferTooSmall({arg}), got {other:?}"),
    };
    // shrink one buffer at a time
    let names = ["h", "k", "v", "rms_w_h", "rms_w_v", "conv_w", "y", "vhat", "alpha", "rrms_h", "rrms_k", "rrms_v"];
    let full = [n, n, n, 16, 16, 64, n, n, rows, rows, rows, rows];
    for (bad, name) in names.iter().enumerate() {
        let len = |i: usize| if i == bad { full[i] - 1 } else { full[i] };
        let (h, k, v, wh, wv, cw) = (z(len(0)), z(len(1)), z(len(2)), z(len(3)), z(len(4)), z(len(5)));
        let (mut y, mut q) = (z(len(6)), z(len(7)));
        let (mut a, mut rh, mut rk, mut rv) = (zf(len(8)), zf(len(9)), zf(len(10)), zf(len(11)));
        let inputs = GateConvFwdInputs { h: &h, k: &k, v: &v, rms_w_h: &wh, rms_w_v: &wv, conv_w: &cw };
        let outputs = GateConvFwdOutputs {
            y: &mut y,
            vhat: &mut q,
            alpha: &mut a,
            rrms_h: &mut rh,
            rrms_k: &mut rk,
            rrms_v: &mut rv,
        };
        let r = engram::gate_conv_fwd(&gpu, s, inputs, outputs);
        assert_eq!(r.as_ref().err().and_then(|e| e.arg()), Some(*name));
        expect(r, name);
    }
    st.synchronize().unwrap();
}
