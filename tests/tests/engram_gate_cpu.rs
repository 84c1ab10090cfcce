//! EngramGateConv CPU tests (run everywhere):
//! - the backward reference against central finite differences of the f64 forward (q = id);
//! - validation errors.
//!
//! The kernels themselves run on the CPU in `sim/tests/engram_gate.rs`, judged by the same
//! checks as on the GPU.
use rand::rngs::StdRng;
use rgk::engram::{bwd_workspace_len, EngramGateShape};
use rgk::reference::{engram_gate_bwd_exact, engram_gate_fwd_exact};
use rgk::Error;
use rgk_tests::{fresh_rng, randn_f32};

// ---------------------------------------------------------------- finite differences

fn fd_case(rng: &mut StdRng, s: EngramGateShape) -> f64 {
    let n = s.m * s.t * s.d;
    let r = |rng: &mut StdRng, len: usize, sc: f32| -> Vec<f64> {
        randn_f32(rng, len, sc).into_iter().map(|x| x as f64).collect()
    };
    let h = r(rng, n, 1.0);
    let k = r(rng, n, 1.0);
    let v = r(rng, n, 0.5);
    let wh: Vec<f64> = r(rng, s.d, 0.3).into_iter().map(|x| 1.0 + x).collect();
    let wv: Vec<f64> = r(rng, s.d, 0.3).into_iter().map(|x| 1.0 + x).collect();
    // a strong conv so its gradient paths matter
    let cw = r(rng, 4 * s.d, 0.7);
    let dy = r(rng, n, 1.0);
    let g = engram_gate_bwd_exact(s, &dy, &h, &k, &v, &wh, &wv, &cw);
    let params: [(&str, &Vec<f64>, &Vec<f64>); 6] = [
        ("H", &h, &g.dh.value),
        ("k", &k, &g.dk.value),
        ("v", &v, &g.dv.value),
        ("rms_w_h", &wh, &g.drms_w_h.value),
        ("rms_w_v", &wv, &g.drms_w_v.value),
        ("conv_w", &cw, &g.dconv_w.value),
    ];
    let loss = |which: usize, idx: usize, delta: f64| -> f64 {
        let mut p = [h.clone(), k.clone(), v.clone(), wh.clone(), wv.clone(), cw.clone()];
        p[which][idx] += delta;
        let y = engram_gate_fwd_exact(s, &p[0], &p[1], &p[2], &p[3], &p[4], &p[5]);
        y.iter().zip(&dy).map(|(a, b)| a * b).sum()
    };
    let mut worst = 0f64;
    for (which, (name, x, an)) in params.iter().enumerate() {
        assert_eq!(an.len(), x.len(), "{name}: gradient length");
        for idx in 0..x.len() {
            // Five-point central stencil: truncation O(step⁴) (the three-point one's O(step²)
            // occasionally exceeded the tolerance on strongly curved random draws; step 1e-4 did
            // once at d = 1, where the RMS norm of one element is nearly a step function).
            let step = 1e-5 * x[idx].abs().max(1.0);
            let f = |k: f64| loss(which, idx, k * step);
            let fd = (8.0 * (f(1.0) - f(-1.0)) - (f(2.0) - f(-2.0))) / (12.0 * step);
            let err = (fd - an[idx]).abs();
            let tol = 1e-7 + 1e-5 * an[idx].abs();
            assert!(err <= tol, "{s:?} d{name}[{idx}]: analytic {:e}, finite difference {fd:e}", an[idx]);
            worst = worst.max(err / (1e-7 + an[idx].abs()));
        }
    }
    worst
}

#[test]
fn backward_reference_matches_finite_differences() {
    let mut rng = fresh_rng("engram_gate::backward_reference_fd");
    let mut worst = 0f64;
    for (m, t, d) in [(1, 1, 1), (1, 2, 3), (2, 5, 3), (1, 4, 8), (3, 7, 2), (1, 9, 5)] {
        worst = worst.max(fd_case(&mut rng, EngramGateShape { m, t, d }));
    }
    println!("finite differences: worst relative deviation {worst:.3e}");
}

// ---------------------------------------------------------------- validation

#[test]
fn bad_shapes_are_errors_naming_the_argument() {
    for (s, arg) in [
        (EngramGateShape { m: 0, t: 4, d: 8 }, "m"),
        (EngramGateShape { m: 1, t: 0, d: 8 }, "t"),
        (EngramGateShape { m: 1, t: 4, d: 0 }, "d"),
        (EngramGateShape { m: 1 << 20, t: 1 << 12, d: 8 }, "t"),
        (EngramGateShape { m: 1, t: 4, d: 1 << 28 }, "d"),
        (EngramGateShape { m: usize::MAX, t: 2, d: 8 }, "t"),
    ] {
        match s.lens() {
            Err(Error::Shape { arg: a, .. }) | Err(Error::Overflow { arg: a, .. }) => assert_eq!(a, arg, "{s:?}"),
            other => panic!("{s:?}: expected an error naming {arg}, got {other:?}"),
        }
    }
    let s = EngramGateShape { m: 3, t: 96, d: 768 };
    // the planner's R = 3 (d ≥ 768): 96 blocks · 6 · 768 partials; dconv fits in shared memory.
    assert_eq!(bwd_workspace_len(s).unwrap(), 96 * 6 * 768);
    // d = 4100 does not fit: global dconv scratch of (R+3) padded rows per block (R = 3:
    // ceil(5/3) = 2 blocks).
    let big = EngramGateShape { m: 1, t: 5, d: 4100 };
    assert_eq!(bwd_workspace_len(big).unwrap(), 2 * 6 * 4100 + 2 * 6 * 4104);
}

/// The split-rows backward's warp → row map `(w·magic) >> 16` equals `w / wpr` for every warp
/// of a block (w < 32) and every warps-per-row count.
#[test]
fn split_rows_warp_row_map_is_exact() {
    for wpr in 1..=32u32 {
        let m = rgk::engram::bwd_warp_row_magic(wpr);
        for w in 0..32u32 {
            assert_eq!((w * m) >> 16, w / wpr, "wpr {wpr} warp {w}");
        }
    }
}

/// The 2-D-grid forward's phase-2 row index: the high word of `e·fwd_chunk_magic(d)` equals
/// `e / ceil(d/8)` for every element chunk `e < R·ceil(d/8)` (R ≤ 29) of every d the kernel
/// takes (16 ≤ d ≤ 1024, d % 8 == 0).
#[test]
fn fwd_chunk_index_multiplier_is_exact() {
    for d in (16..=1024usize).step_by(8) {
        let (nch, m) = (d.div_ceil(8) as u64, rgk::engram::fwd_chunk_magic(d) as u64);
        for e in 0..29 * nch {
            assert_eq!((e * m) >> 32, e / nch, "d {d} e {e}");
        }
    }
}

/// The split-rows backward's one-pass stage 3: the closed form of the u-norm backward's `Σ dvh·v` (docs/ops.md §5: `dvh = g + rv·du·wv −
/// vh·rv³·mean(du·wv·vh)`, `vh = a·v`, `rv = (mean vh² + eps)^−½`):
/// `a·Σ dvh·v = a·Σ g·v + eps·rv³·Σ du·wv·vh`, checked in f64 against the two-pass form on
/// random rows at several scales (the identity is exact; only rounding separates them).
#[test]
fn one_pass_stage3_closed_form_matches_two_passes() {
    use rand::{Rng, SeedableRng};
    let mut rng = StdRng::seed_from_u64(7);
    let eps = 1e-6f64;
    for &(d, scale) in &[(8usize, 1.0f64), (256, 0.1), (768, 1.0), (1000, 100.0), (64, 1e-3)] {
        for _ in 0..20 {
            let a: f64 = rng.random_range(0.01..0.99);
            let v: Vec<f64> = (0..d).map(|_| scale * rng.random_range(-1.0..1.0)).collect();
            let g: Vec<f64> = (0..d).map(|_| rng.random_range(-0.1..0.1)).collect();
            let du: Vec<f64> = (0..d).map(|_| rng.random_range(-0.1..0.1)).collect();
            let wv: Vec<f64> = (0..d).map(|_| rng.random_range(0.5..1.5)).collect();
            let df = d as f64;
            let rv = 1.0 / ((v.iter().map(|x| (a * x) * (a * x)).sum::<f64>() / df) + eps).sqrt();
            let s1: f64 = (0..d).map(|j| du[j] * wv[j] * a * v[j]).sum();
            let c1 = rv * rv * rv * s1 / df;
            let terms: Vec<f64> = (0..d).map(|j| (g[j] + rv * du[j] * wv[j] - a * v[j] * c1) * v[j]).collect();
            let two_pass = a * terms.iter().sum::<f64>();
            let mag = a * terms.iter().map(|t| t.abs()).sum::<f64>()
                + a * (0..d).map(|j| (rv * du[j] * wv[j] * v[j]).abs()).sum::<f64>();
            let gv: f64 = (0..d).map(|j| g[j] * v[j]).sum();
            let closed = a * gv + eps * rv * rv * rv * s1;
            assert!((closed - two_pass).abs() <= 1e-12 * mag, "d {d} scale {scale}: {closed} vs {two_pass}");
        }
    }
}

// ---------------------------------------------------------------- planner ↔ kernel list

/// Every plan of every valid width `d ≤ 1100` (and a few streaming widths), both layouts,
/// both dtypes, one and 65536 sequences, names an entry of `kernel_abi::gate_kernels!` (the
/// list the PTX entries are declared from), and every name is one of the module's entries.
#[test]
fn every_plan_names_a_declared_kernel() {
    let module = rgk_tests::module_entries();
    let mut seen = std::collections::BTreeSet::new();
    for d in (1..=1100).chain([2048, 4096, 4100, 8192]) {
        for m in [1, 65536] {
            let s = EngramGateShape { m, t: 5, d };
            for (aligned, workspace_aligned, bf16) in itertools_product() {
                let names = rgk::engram::gate_conv_planned_entries(s, bf16, aligned, workspace_aligned)
                    .unwrap_or_else(|e| panic!("{s:?} aligned={aligned} bf16={bf16}: {e}"));
                for n in names {
                    assert!(module.contains(n), "{n} is planned but not in the PTX module");
                    seen.insert(n);
                }
            }
        }
    }
    println!("{} of the module's gate entries planned", seen.len());
}

/// `(aligned, workspace_aligned, bf16)` over all eight combinations.
fn itertools_product() -> impl Iterator<Item = (bool, bool, bool)> {
    (0..8).map(|i| (i & 1 != 0, i & 2 != 0, i & 4 != 0))
}
