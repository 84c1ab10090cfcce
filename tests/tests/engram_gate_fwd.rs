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
use rgk::engram::{self, EngramGateShape, GateFwdConfig, GateFwdKernel};
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
    let f = run_fwd(gpu, &x, 0, None).unwrap();
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
            let f = run_fwd(&gpu, &x, off, None).unwrap();
            check_fwd(&what, &x, &f);
        }
    }
}

#[test]
fn every_launch_config_matches_reference() {
    let Some((gpu, wd, mut rng)) = start("engram_gate_fwd::every_launch_config") else { return };
    for (m, t, d) in [(3, 96, 768), (2, 13, 1000), (1, 9, 4096), (2, 7, 256)] {
        let s = EngramGateShape { m, t, d };
        let x = gen::<f16>(&mut rng, s, 1.0, false);
        for r in [1, 2, 3, 5, 8, 13, 29] {
            for kernel in KERNELS {
                // extra warps (v2 kernels: weight loads and phase 2 only)
                for extra_warps in [0, 3] {
                    if extra_warps > 0 && kernel == GateFwdKernel::V1 {
                        continue;
                    }
                    let c = GateFwdConfig { rows_per_block: r, kernel, extra_warps };
                    let what = format!("fwd {s:?} {c:?}");
                    wd.step(&what);
                    let Some(f) = run_fwd(&gpu, &x, 0, Some(c)) else { continue };
                    check_fwd(&what, &x, &f);
                }
            }
        }
    }
}

const KERNELS: [GateFwdKernel; 5] = [
    GateFwdKernel::V1,
    GateFwdKernel::SmemU,
    GateFwdKernel::SmemUApprox,
    GateFwdKernel::SmemUFast,
    GateFwdKernel::SmemULean,
];

fn bits_h<T: Half>(v: &[T]) -> Vec<u64> {
    v.iter().map(|x| x.to_f64().to_bits()).collect()
}

fn bits_f(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The v2 kernels (`u` in shared memory) on the seed shapes, odd shapes and both dtypes:
/// `SmemU` bitwise equal to v1 at the same R; `SmemUApprox` equal except `Y` (rounding
/// flips counted), and both within the reference's tolerances.
fn v2_case<T: Half + rgk::cudarc::driver::DeviceRepr>(
    gpu: &Gpu,
    wd: &Watchdog,
    rng: &mut StdRng,
    s: EngramGateShape,
    scale: f32,
) {
    let x = gen::<T>(rng, s, scale, false);
    for r in [1, 2, 3, 5, 8] {
        let run = |kernel| run_fwd(gpu, &x, 0, Some(GateFwdConfig { rows_per_block: r, kernel, extra_warps: 0 }));
        let what = format!("fwd v2 {} {s:?} scale {scale} R {r}", T::NAME);
        wd.step(&what);
        let Some(f1) = run(GateFwdKernel::V1) else { continue };
        let (Some(f2), Some(f3)) = (run(GateFwdKernel::SmemU), run(GateFwdKernel::SmemUApprox)) else { continue };
        for (f, name) in [(&f2, "SmemU"), (&f3, "SmemUApprox")] {
            check_fwd(&format!("{what} {name}"), &x, f);
            assert_eq!(bits_h(&f1.vhat), bits_h(&f.vhat), "{what} {name}: vhat differs from v1");
            for (a, b, n) in [
                (&f1.alpha, &f.alpha, "alpha"),
                (&f1.rrms_h, &f.rrms_h, "rrms_h"),
                (&f1.rrms_k, &f.rrms_k, "rrms_k"),
                (&f1.rrms_v, &f.rrms_v, "rrms_v"),
            ] {
                assert_eq!(bits_f(a), bits_f(b), "{what} {name}: {n} differs from v1");
            }
        }
        assert_eq!(bits_h(&f1.y), bits_h(&f2.y), "{what}: SmemU Y differs from v1");
        let flips = f1.y.iter().zip(&f3.y).filter(|(a, b)| a.to_f64() != b.to_f64()).count();
        println!("{what}: SmemUApprox Y differs from v1 in {flips} of {} elements", f1.y.len());
        // SmemUFast (approximate scalars): within the tolerances
        let Some(f4) = run(GateFwdKernel::SmemUFast) else { continue };
        check_fwd(&format!("{what} SmemUFast"), &x, &f4);
        let flips = f1.vhat.iter().zip(&f4.vhat).filter(|(a, b)| a.to_f64() != b.to_f64()).count();
        println!("{what}: SmemUFast vhat differs from v1 in {flips} of {} elements", f1.vhat.len());
        // SmemULean (the bench's `lean`): checked, and bitwise SmemUFast on these inputs (the
        // ftz MUFU forms agree wherever |conv| and |alpha's logit| < 87)
        let Some(f5) = run(GateFwdKernel::SmemULean) else { continue };
        check_fwd(&format!("{what} SmemULean"), &x, &f5);
        assert_eq!(bits_h(&f4.y), bits_h(&f5.y), "{what}: SmemULean Y differs from SmemUFast");
        assert_eq!(bits_h(&f4.vhat), bits_h(&f5.vhat), "{what}: SmemULean vhat differs from SmemUFast");
        for (a, b, n) in [
            (&f4.alpha, &f5.alpha, "alpha"),
            (&f4.rrms_h, &f5.rrms_h, "rrms_h"),
            (&f4.rrms_k, &f5.rrms_k, "rrms_k"),
            (&f4.rrms_v, &f5.rrms_v, "rrms_v"),
        ] {
            assert_eq!(bits_f(a), bits_f(b), "{what}: SmemULean {n} differs from SmemUFast");
        }
        // extra warps: bitwise the same outputs as without
        for (kernel, f0) in
            [(GateFwdKernel::SmemUApprox, &f3), (GateFwdKernel::SmemUFast, &f4), (GateFwdKernel::SmemULean, &f5)]
        {
            for extra_warps in [1, 3, 6] {
                let c = GateFwdConfig { rows_per_block: r, kernel, extra_warps };
                let Some(f) = run_fwd(gpu, &x, 0, Some(c)) else { continue };
                let what = format!("{what} {c:?}");
                assert_eq!(bits_h(&f0.y), bits_h(&f.y), "{what}: Y differs");
                assert_eq!(bits_h(&f0.vhat), bits_h(&f.vhat), "{what}: vhat differs");
                for (a, b, n) in [
                    (&f0.alpha, &f.alpha, "alpha"),
                    (&f0.rrms_h, &f.rrms_h, "rrms_h"),
                    (&f0.rrms_k, &f.rrms_k, "rrms_k"),
                    (&f0.rrms_v, &f.rrms_v, "rrms_v"),
                ] {
                    assert_eq!(bits_f(a), bits_f(b), "{what}: {n} differs");
                }
            }
        }
    }
}

#[test]
fn v2_kernels_match_v1() {
    let Some((gpu, wd, mut rng)) = start("engram_gate_fwd::v2_kernels") else { return };
    for (m, t, d, is_f16) in [
        (1, 32, 256, true),
        (2, 64, 512, true),
        (1, 128, 256, false),
        (3, 96, 768, false),
        (2, 7, 8, true),
        (7, 5, 1000, false),
        (1, 1, 1024, true),
        (3, 4, 264, false),
        (1, 2, 16, true),
    ] {
        let s = EngramGateShape { m, t, d };
        for scale in [1.0, 100.0] {
            if is_f16 {
                v2_case::<f16>(&gpu, &wd, &mut rng, s, scale);
            } else {
                v2_case::<bf16>(&gpu, &wd, &mut rng, s, scale);
            }
        }
    }
}

#[test]
fn forward_is_bitwise_deterministic() {
    let Some((gpu, wd, mut rng)) = start("engram_gate_fwd::deterministic") else { return };
    for (m, t, d) in [(3, 96, 768), (7, 257, 1000), (1, 33, 4096), (2, 64, 512)] {
        let s = EngramGateShape { m, t, d };
        let x = gen::<bf16>(&mut rng, s, 1.0, false);
        wd.step(format!("fwd twice {s:?}"));
        let f1 = run_fwd(&gpu, &x, 0, None).unwrap();
        let f2 = run_fwd(&gpu, &x, 0, None).unwrap();
        // the lean kernel at the planner's R: twice, bitwise
        let cl = GateFwdConfig { kernel: GateFwdKernel::SmemULean, ..GateFwdConfig::for_shape(s) };
        let (l1, l2) = (run_fwd(&gpu, &x, 0, Some(cl)).unwrap(), run_fwd(&gpu, &x, 0, Some(cl)).unwrap());
        assert_eq!(bits_h(&l1.y), bits_h(&l2.y), "{s:?}: lean Y differs between runs");
        assert_eq!(bits_f(&l1.alpha), bits_f(&l2.alpha), "{s:?}: lean alpha differs between runs");
        check_fwd(&format!("{s:?} lean"), &x, &l1);
        assert_eq!(bits_h(&f1.y), bits_h(&f2.y), "{s:?}: Y differs between runs");
        assert_eq!(bits_h(&f1.vhat), bits_h(&f2.vhat), "{s:?}: vhat differs between runs");
        for (a, b, n) in [
            (&f1.alpha, &f2.alpha, "alpha"),
            (&f1.rrms_h, &f2.rrms_h, "rrms_h"),
            (&f1.rrms_k, &f2.rrms_k, "rrms_k"),
            (&f1.rrms_v, &f2.rrms_v, "rrms_v"),
        ] {
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(a), bits(b), "{s:?}: {n} differs between runs");
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
        expect(
            engram::gate_conv_fwd(
                &gpu, s, &h, &k, &v, &wh, &wv, &cw, &mut y, &mut q, &mut a, &mut rh, &mut rk, &mut rv,
            ),
            name,
        );
    }
    st.synchronize().unwrap();
}
