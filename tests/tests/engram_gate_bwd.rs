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
use rgk::engram::{self, bwd_workspace_len, EngramGateShape, GateBwdConfig};
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
    let b = run_bwd(gpu, &x, &f, 0, None, 0.0).unwrap();
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
    let f = run_fwd(gpu, &x, 0, None).unwrap();
    let b = run_bwd(gpu, &x, &f, 0, None, 0.0).unwrap();
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
            check_bwd(&what, &x, &run_bwd(&gpu, &x, &f, off, None, 0.0).unwrap());
        }
    }
}

#[test]
fn every_launch_config_matches_reference() {
    let Some((gpu, wd, mut rng)) = start("engram_gate_bwd::every_launch_config") else { return };
    for (m, t, d) in [(3, 96, 768), (2, 13, 1000), (1, 9, 4096), (2, 7, 256)] {
        let s = EngramGateShape { m, t, d };
        let x = gen::<f16>(&mut rng, s, 1.0, false);
        let f0 = saved_from_reference(&x);
        for r in [1, 2, 4, 6, 10, 19, 26] {
            for sg in [1, 8, 16, 32] {
                // the reduce kernel with and without programmatic dependent launch (both S parities)
                let pdl = sg % 16 == 0;
                let c = GateBwdConfig { rows_per_block: r, reduce_segments: sg, pdl, ..GateBwdConfig::default() };
                let what = format!("bwd {s:?} {c:?}");
                wd.step(&what);
                let Some(b) = run_bwd(&gpu, &x, &f0, 0, Some(c), 0.0) else { continue };
                check_bwd(&what, &x, &b);
                // extra warps (stage 4 and the weight loads only): bitwise the same, up to the
                // 32-warp / register limit (a refused block size returns None)
                for xw in [1, 32 - (r + 6).min(32)] {
                    if xw == 0 || r + 6 + xw > 32 {
                        continue;
                    }
                    let c6 = GateBwdConfig { extra_warps: xw, ..c };
                    if let Some(b6) = run_bwd(&gpu, &x, &f0, 0, Some(c6), f32::NAN) {
                        assert_bwd_bitwise(&format!("{what} v1 extra_warps {xw}"), &b, &b6);
                    }
                }
                // v5 (split rows) at W = 1, 2 and the planner's W for this R: checked against the
                // reference, the other PDL mode bitwise, extra warps bitwise
                for w in [1, 2, engram::bwd_split_warps(d, r)] {
                    if (r + 6) * w > 32 {
                        continue;
                    }
                    let c7 = GateBwdConfig { split_warps: w, ..c };
                    let Some(b7) = run_bwd(&gpu, &x, &f0, 0, Some(c7), f32::NAN) else { continue };
                    check_bwd(&format!("{what} v5 W {w}"), &x, &b7);
                    let c7p = GateBwdConfig { pdl: !pdl, ..c7 };
                    let b7p = run_bwd(&gpu, &x, &f0, 0, Some(c7p), 0.0).unwrap();
                    assert_bwd_bitwise(&format!("{what} v5 W {w} pdl/nopdl"), &b7, &b7p);
                    // v5m (stage 3 in one pass): checked, dv bitwise v5
                    let c10 = GateBwdConfig { merge_s2: true, ..c7 };
                    if let Some(b10) = run_bwd(&gpu, &x, &f0, 0, Some(c10), f32::NAN) {
                        check_bwd(&format!("{what} v5m W {w}"), &x, &b10);
                        assert_eq!(bits_h(&b7.dv), bits_h(&b10.dv), "{what} v5m W {w}: dv differs from v5");
                        // the 16-byte reduce kernel: bitwise the scalar one at the same S
                        for rv in [8, 32] {
                            let c11 = GateBwdConfig { reduce_vec: rv, ..c10 };
                            let b11 = run_bwd(&gpu, &x, &f0, 0, Some(c11), f32::NAN).unwrap();
                            assert_bwd_bitwise(&format!("{what} v5m W {w} reduce_vec {rv}"), &b10, &b11);
                        }
                    }
                    let xw = 32 - (r + 6) * w;
                    if xw > 0 {
                        let c5 = GateBwdConfig { extra_warps: xw, ..c7 };
                        if let Some(b5) = run_bwd(&gpu, &x, &f0, 0, Some(c5), f32::NAN) {
                            assert_bwd_bitwise(&format!("{what} v5 W {w} extra_warps {xw}"), &b7, &b5);
                        }
                    }
                }
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

fn assert_bwd_bitwise<T: Half>(what: &str, b1: &BwdOut<T>, b2: &BwdOut<T>) {
    assert_eq!(bits_h(&b1.dh), bits_h(&b2.dh), "{what}: dH differs");
    assert_eq!(bits_h(&b1.dk), bits_h(&b2.dk), "{what}: dk differs");
    assert_eq!(bits_h(&b1.dv), bits_h(&b2.dv), "{what}: dv differs");
    assert_eq!(bits_f(&b1.drms_w_h), bits_f(&b2.drms_w_h), "{what}: drms_w_h differs");
    assert_eq!(bits_f(&b1.drms_w_v), bits_f(&b2.drms_w_v), "{what}: drms_w_v differs");
    assert_eq!(bits_f(&b1.dconv_w), bits_f(&b2.dconv_w), "{what}: dconv_w differs");
}

/// The main-kernel versions at one configuration `c` (v1, reduce without PDL): v1 checked;
/// v5 and v5m at W = 1, 2, 3 and the planner's W checked against the f64 reference, a second
/// run (other PDL mode) bitwise the first, v5m's dv bitwise v5's, extra warps bitwise none.
/// (v5 and v1 differ by design: approximate σ and rsqrt in v5, so they are compared through
/// the reference, not bitwise; v5m's dH/dk differ from v5's in rounding.)
fn versions_match<T: Half + rgk::cudarc::driver::DeviceRepr>(
    gpu: &Gpu,
    what: &str,
    x: &GateInputs<T>,
    c: GateBwdConfig,
) {
    let f0 = saved_from_reference(x);
    let b1 = run_bwd(gpu, x, &f0, 0, Some(c), 0.0).unwrap();
    check_bwd(&format!("{what} v1"), x, &b1);
    let b1p = run_bwd(gpu, x, &f0, 0, Some(GateBwdConfig { pdl: true, ..c }), f32::NAN).unwrap();
    assert_bwd_bitwise(&format!("{what} v1 pdl/nopdl"), &b1, &b1p);
    let r = c.rows_per_block;
    let mut ws = vec![1, 2, 3, engram::bwd_split_warps(x.s.d, r)];
    ws.sort();
    ws.dedup();
    for w in ws {
        if (r + 6) * w > 32 {
            continue;
        }
        // v5 (the bench's `v5`): checked, a second run (other PDL mode) bitwise the first
        let c5 = GateBwdConfig { split_warps: w, pdl: true, ..c };
        let Some(b5) = run_bwd(gpu, x, &f0, 0, Some(c5), f32::NAN) else { continue };
        check_bwd(&format!("{what} v5 W {w}"), x, &b5);
        let again = run_bwd(gpu, x, &f0, 0, Some(GateBwdConfig { pdl: false, ..c5 }), 0.0).unwrap();
        assert_bwd_bitwise(&format!("{what} v5 W {w} twice"), &b5, &again);
        // v5m (`v5m`, the planner's): checked, dv bitwise v5, a second run (other PDL mode)
        // bitwise
        let c5m = GateBwdConfig { merge_s2: true, ..c5 };
        // (v5m has more registers than v5: at 30 warps it may be refused where v5 runs)
        let Some(b5m) = run_bwd(gpu, x, &f0, 0, Some(c5m), f32::NAN) else { continue };
        check_bwd(&format!("{what} v5m W {w}"), x, &b5m);
        assert_eq!(bits_h(&b5.dv), bits_h(&b5m.dv), "{what} v5m W {w}: dv differs from v5");
        let b5m2 = run_bwd(gpu, x, &f0, 0, Some(GateBwdConfig { pdl: false, ..c5m }), 0.0).unwrap();
        assert_bwd_bitwise(&format!("{what} v5m W {w} twice"), &b5m, &b5m2);
        // the 16-byte reduce kernel (the bench's `rvX`): checked, bitwise the scalar reduce at
        // the same S, with and without PDL
        for rv in [8, 16, 32] {
            let cr = GateBwdConfig { reduce_vec: rv, ..c5m };
            let br = run_bwd(gpu, x, &f0, 0, Some(cr), f32::NAN).unwrap();
            check_bwd(&format!("{what} v5m W {w} reduce_vec {rv}"), x, &br);
            assert_bwd_bitwise(&format!("{what} v5m W {w} reduce_vec {rv}"), &b5m, &br);
            let br2 = run_bwd(gpu, x, &f0, 0, Some(GateBwdConfig { pdl: false, ..cr }), 0.0).unwrap();
            assert_bwd_bitwise(&format!("{what} v5m W {w} reduce_vec {rv} twice"), &b5m, &br2);
        }
        // extra warps (1, and up to 12 / 16 warps per block): bitwise none
        let tile = (r + 6) * w;
        let mut xws = vec![1, 12u32.saturating_sub(tile), 16u32.saturating_sub(tile)];
        xws.retain(|&xw| xw > 0 && tile + xw <= 32);
        xws.dedup();
        for xw in xws {
            for (name, cl, want) in [("v5", c5, &b5), ("v5m", c5m, &b5m)] {
                let cx = GateBwdConfig { extra_warps: xw, ..cl };
                if let Some(bx) = run_bwd(gpu, x, &f0, 0, Some(cx), f32::NAN) {
                    assert_bwd_bitwise(&format!("{what} {name} W {w} extra_warps {xw}"), want, &bx);
                }
            }
        }
    }
    for xw in [3, 12u32.saturating_sub(r + 6), 16u32.saturating_sub(r + 6)] {
        let cx = GateBwdConfig { extra_warps: xw, ..c };
        if let Some(bx) = run_bwd(gpu, x, &f0, 0, Some(cx), f32::NAN) {
            check_bwd(&format!("{what} v1 extra_warps {xw}"), x, &bx);
            assert_bwd_bitwise(&format!("{what} v1 extra_warps {xw}"), &b1, &bx);
        }
    }
}

/// The main-kernel versions (v1, v5 and v5m at several W) on the seed shapes
/// and odd shapes, both dtypes, both scales, R 1–4: each checked against the f64 reference,
/// reruns and extra warps bitwise.
#[test]
fn main_kernel_versions_match_reference() {
    let Some((gpu, wd, mut rng)) = start("engram_gate_bwd::main_kernel_versions") else { return };
    for (m, t, d, is_f16) in [
        (1, 32, 256, true),
        (2, 64, 512, true),
        (1, 128, 256, false),
        (3, 96, 768, false),
        (2, 7, 8, true),
        (7, 5, 1000, false),
        (1, 1, 1024, true),
        (3, 4, 264, false),
    ] {
        let s = EngramGateShape { m, t, d };
        for scale in [1.0, 100.0] {
            for r in [1, 2, 3, 4] {
                let c =
                    GateBwdConfig { rows_per_block: r, reduce_segments: 16, pdl: false, ..GateBwdConfig::default() };
                let what = format!("bwd versions {s:?} scale {scale} R {r}");
                wd.step(&what);
                if is_f16 {
                    let x = gen::<f16>(&mut rng, s, scale, false);
                    versions_match(&gpu, &what, &x, c);
                } else {
                    let x = gen::<bf16>(&mut rng, s, scale, false);
                    versions_match(&gpu, &what, &x, c);
                }
            }
        }
    }
}

/// `GateConvBwdPlan` (graph submission of the two launches, the reduce kernel's dependent
/// launch inside the graph): bitwise the direct launches of the same configuration, on the
/// capturing call and on replays, for the planner's, the v5 and the v5m configurations.
#[test]
fn graph_plan_is_bitwise_direct_launches() {
    let Some((gpu, wd, mut rng)) = start("engram_gate_bwd::graph_plan") else { return };
    for &(m, t, d) in &[(1, 32, 256), (2, 64, 512), (1, 128, 256), (3, 96, 768), (2, 7, 8)] {
        let s = EngramGateShape { m, t, d };
        let p = GateBwdConfig::for_shape(s);
        let v5 = GateBwdConfig { split_warps: engram::bwd_split_warps(d, p.rows_per_block), merge_s2: false, ..p };
        let v5m = GateBwdConfig { merge_s2: true, ..v5 };
        for (name, c) in [
            ("planner", p),
            ("nopdl", GateBwdConfig { pdl: false, ..p }),
            ("v5", v5),
            ("v5m", v5m),
            ("rv8", GateBwdConfig { reduce_vec: 8, ..p }),
            ("rv32", GateBwdConfig { reduce_vec: 32, ..p }),
            ("rv8-s32", GateBwdConfig { reduce_vec: 8, reduce_segments: 32, ..p }),
        ] {
            let x = gen::<bf16>(&mut rng, s, 1.0, false);
            let what = format!("graph {name} {s:?}");
            wd.step(&what);
            let f = saved_from_reference(&x);
            let Some(direct) = run_bwd(&gpu, &x, &f, 0, Some(c), 0.0) else { continue };
            let mut plan = engram::GateConvBwdPlan::new(s, c).unwrap();
            let graphed = run_bwd_plan(&gpu, &x, &f, &mut plan, 2, false);
            check_bwd(&what, &x, &graphed);
            assert_bwd_bitwise(&what, &direct, &graphed);
        }
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
        let c = GateBwdConfig::for_shape(s);
        let x = gen::<f16>(&mut rng, s, 1.0, false);
        let what = format!("caller capture {s:?}");
        wd.step(&what);
        let f = saved_from_reference(&x);
        let direct = run_bwd(&gpu, &x, &f, 0, Some(c), 0.0).expect("the planner's configuration runs");
        let mut plan = engram::GateConvBwdPlan::new(s, c).unwrap();
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
        let f1 = run_fwd(&gpu, &x, 0, None).unwrap();
        let b1 = run_bwd(&gpu, &x, &f1, 0, None, 0.0).unwrap();
        let b2 = run_bwd(&gpu, &x, &f1, 0, None, f32::NAN).unwrap();
        // the 16-byte reduce kernel at the planner's S: bitwise the planner's outputs
        let cr = GateBwdConfig { reduce_vec: 8, ..GateBwdConfig::for_shape(s) };
        let b3 = run_bwd(&gpu, &x, &f1, 0, Some(cr), f32::NAN).unwrap();
        assert_eq!(bits_f(&b1.dconv_w), bits_f(&b3.dconv_w), "{s:?}: reduce_vec 8 dconv_w differs");
        assert_eq!(bits_f(&b1.drms_w_h), bits_f(&b3.drms_w_h), "{s:?}: reduce_vec 8 drms_w_h differs");
        assert_eq!(bits_f(&b1.drms_w_v), bits_f(&b3.drms_w_v), "{s:?}: reduce_vec 8 drms_w_v differs");
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
