//! EngramGateConv CPU tests (run everywhere):
//! - the backward reference against central finite differences of the f64 forward (q = id);
//! - a CPU model of the kernels (the same tiles, halo rows, scratch rows, per-block partials
//!   and fixed-order reduction, in f32) judged by the same checks as the GPU kernels, which
//!   tests the kernels' index logic and that the tolerances hold for an f32 implementation;
//! - validation errors.
mod engram_gate_common;

use engram_gate_common::*;
use rand::rngs::StdRng;
use rgk::engram::{bwd_workspace_len, EngramGateShape};
use rgk::reference::{engram_gate_bwd_exact, engram_gate_fwd_exact};
use rgk::verify::Half;
use rgk::{bf16, f16, Error};
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
            // occasionally exceeded the tolerance on strongly curved random draws).
            let step = 1e-4 * x[idx].abs().max(1.0);
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

// ---------------------------------------------------------------- CPU model of the kernels

fn q<T: Half>(x: f32) -> f32 {
    T::round_f64(x as f64).to_f64() as f32
}
fn sigm(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}
fn rrms(sum: f32, d: usize) -> f32 {
    1.0 / (sum / d as f32 + 1e-6).sqrt()
}
/// A warp's row reduction: lane partials over chunks c = lane + 32n (8 elements each, in
/// order, by fma of `f(j)`), then the xor butterfly 16, 8, 4, 2, 1.
fn warp_reduce(d: usize, f: impl Fn(usize) -> (f32, f32)) -> f32 {
    let nch = d.div_ceil(8);
    let mut lanes = [0f32; 32];
    for (lane, acc) in lanes.iter_mut().enumerate() {
        let mut c = lane;
        while c < nch {
            for e in 0..8 {
                let j = c * 8 + e;
                let (a, b) = if j < d { f(j) } else { (0.0, 0.0) };
                *acc = a.mul_add(b, *acc);
            }
            c += 32;
        }
    }
    let mut m = 16;
    while m > 0 {
        let prev = lanes;
        for l in 0..32 {
            lanes[l] = prev[l] + prev[l ^ m];
        }
        m >>= 1;
    }
    lanes[0]
}

fn f32s<T: Half>(x: &[T]) -> Vec<f32> {
    x.iter().map(|v| v.to_f64() as f32).collect()
}

/// The forward kernel's algorithm, tile by tile (`r` rows per block).
fn model_fwd<T: Half>(x: &GateInputs<T>, r: usize) -> FwdOut<T> {
    let EngramGateShape { m: m_len, t: t_len, d } = x.s;
    let (h, k, v, wh, wv, cw) = (f32s(&x.h), f32s(&x.k), f32s(&x.v), f32s(&x.wh), f32s(&x.wv), f32s(&x.cw));
    let n = m_len * t_len * d;
    let mut o = FwdOut {
        y: vec![T::poison(); n],
        vhat: vec![T::poison(); n],
        alpha: vec![f32::NAN; m_len * t_len],
        rrms_h: vec![f32::NAN; m_len * t_len],
        rrms_k: vec![f32::NAN; m_len * t_len],
        rrms_v: vec![f32::NAN; m_len * t_len],
    };
    let ntiles = t_len.div_ceil(r);
    for b in 0..m_len * ntiles {
        let (m, t0) = (b / ntiles, (b % ntiles) * r);
        let mut s_alpha = vec![f32::NAN; r + 3];
        let mut s_rv = vec![f32::NAN; r + 3];
        for i in 0..r + 3 {
            let t = (t0 + i) as i64 - 3;
            if t < 0 || t >= t_len as i64 {
                continue;
            }
            let row = m * t_len + t as usize;
            let o0 = row * d;
            let shh = warp_reduce(d, |j| (h[o0 + j], h[o0 + j]));
            let skk = warp_reduce(d, |j| (k[o0 + j], k[o0 + j]));
            let shk = warp_reduce(d, |j| (h[o0 + j] * k[o0 + j], wh[j] * wh[j]));
            let (rh, rk) = (rrms(shh, d), rrms(skk, d));
            let alpha = sigm(shk * rh * rk / (d as f32).sqrt());
            let svv = warp_reduce(d, |j| {
                let qv = q::<T>(alpha * v[o0 + j]);
                (qv, qv)
            });
            let rv = rrms(svv, d);
            (s_alpha[i], s_rv[i]) = (alpha, rv);
            if i >= 3 {
                for j in 0..d {
                    o.vhat[o0 + j] = T::round_f64((alpha * v[o0 + j]) as f64);
                }
                (o.alpha[row], o.rrms_h[row], o.rrms_k[row], o.rrms_v[row]) = (alpha, rh, rk, rv);
            }
        }
        for io in 0..r {
            let t = t0 + io;
            if t >= t_len {
                continue;
            }
            let row = m * t_len + t;
            for j in 0..d {
                let mut conv = 0f32;
                for p in 0..4 {
                    if t + p >= 3 {
                        let ip = io + p;
                        let u = q::<T>(s_alpha[ip] * v[(row + p - 3) * d + j]) * s_rv[ip] * wv[j];
                        conv = cw[p * d + j].mul_add(u, conv);
                    }
                }
                let vt = s_alpha[io + 3] * v[row * d + j];
                o.y[row * d + j] = T::round_f64((conv * sigm(conv) + vt) as f64);
            }
        }
    }
    o
}

/// The backward kernels' algorithm: tiles with 3 halo rows each side, dconv scratch rows,
/// per-block partials, then the segmented fixed-order reduction.
fn model_bwd<T: Half>(x: &GateInputs<T>, f: &FwdOut<T>, r: usize, segs: usize) -> BwdOut<T> {
    let EngramGateShape { m: m_len, t: t_len, d } = x.s;
    let (g, h, k, v, wh, wv, cw) =
        (f32s(&x.dy), f32s(&x.h), f32s(&x.k), f32s(&x.v), f32s(&x.wh), f32s(&x.wv), f32s(&x.cw));
    let n = m_len * t_len * d;
    let mut o = BwdOut {
        dh: vec![T::poison(); n],
        dk: vec![T::poison(); n],
        dv: vec![T::poison(); n],
        drms_w_h: vec![f32::NAN; d],
        drms_w_v: vec![f32::NAN; d],
        dconv_w: vec![f32::NAN; 4 * d],
    };
    let ntiles = t_len.div_ceil(r);
    let nb = m_len * ntiles;
    let s = 1.0 / (d as f32).sqrt();
    let mut part = vec![f32::NAN; nb * 6 * d];
    for b in 0..nb {
        let (m, t0) = (b / ntiles, (b % ntiles) * r);
        let base = m * t_len;
        let mut s_rv = vec![f32::NAN; r + 6];
        let mut p_sum = vec![f32::NAN; r + 6];
        let mut s_ch = vec![f32::NAN; r];
        let mut scr = vec![f32::NAN; (r + 3) * d];
        // stage 1
        for i in 0..r + 6 {
            let t = (t0 + i) as i64 - 3;
            if t < 0 || t >= t_len as i64 {
                continue;
            }
            let row = base + t as usize;
            let a = f.alpha[row];
            s_rv[i] = rrms(warp_reduce(d, |j| (a * v[row * d + j], a * v[row * d + j])), d);
            if (3..r + 3).contains(&i) {
                p_sum[i] = warp_reduce(d, |j| (h[row * d + j] * k[row * d + j], wh[j] * wh[j]));
            }
        }
        let u_of = |ip: usize, j: usize| {
            let tp = t0 + ip - 3;
            let ap = f.alpha[base + tp];
            (ap * v[(base + tp) * d + j]) * s_rv[ip] * wv[j]
        };
        // stage 2
        for i in 3..r + 6 {
            let t = t0 + i - 3;
            for j in 0..d {
                let mut dc = 0f32;
                if t < t_len {
                    let mut conv = 0f32;
                    for p in 0..4 {
                        if t + p >= 3 {
                            conv = cw[p * d + j].mul_add(u_of(i - 3 + p, j), conv);
                        }
                    }
                    let sg = sigm(conv);
                    dc = g[(base + t) * d + j] * (sg * (1.0 + conv * (1.0 - sg)));
                }
                scr[(i - 3) * d + j] = dc;
            }
        }
        let du_of = |ii: usize, j: usize| {
            let mut acc = 0f32;
            for p in 0..4 {
                acc = cw[p * d + j].mul_add(scr[(ii - p) * d + j], acc);
            }
            acc
        };
        // stage 3
        for i in 3..r + 3 {
            let t = t0 + i - 3;
            if t >= t_len {
                continue;
            }
            let row = base + t;
            let o0 = row * d;
            let (a, rv) = (f.alpha[row], s_rv[i]);
            let s1 = warp_reduce(d, |j| (du_of(i, j) * wv[j], a * v[o0 + j]));
            let c1 = rv * rv * rv * (s1 / d as f32);
            let dvh = |j: usize| g[o0 + j] + (rv * (du_of(i, j) * wv[j]) - (a * v[o0 + j]) * c1);
            for j in 0..d {
                o.dv[o0 + j] = T::round_f64((a * dvh(j)) as f64);
            }
            let s2 = warp_reduce(d, |j| (dvh(j), v[o0 + j]));
            let dz = a * (1.0 - a) * s2;
            let (rh, rk) = (f.rrms_h[row], f.rrms_k[row]);
            let aa = dz * s * rh * rk;
            let pd = p_sum[i] / d as f32;
            let (ch, ck) = (rh * rh * pd, rk * rk * pd);
            for j in 0..d {
                let w2 = wh[j] * wh[j];
                o.dh[o0 + j] = T::round_f64((aa * (k[o0 + j] * w2 - h[o0 + j] * ch)) as f64);
                o.dk[o0 + j] = T::round_f64((aa * (h[o0 + j] * w2 - k[o0 + j] * ck)) as f64);
            }
            s_ch[i - 3] = 2.0 * aa;
        }
        // stage 4
        let nown = r.min(t_len - t0);
        for j in 0..d {
            let mut acc = [0f32; 6];
            let mut win = [0f32; 4];
            for ip in 0..3 {
                if t0 + ip >= 3 {
                    win[ip + 1] = u_of(ip, j);
                }
            }
            for io in 0..nown {
                let (ii, tt) = (io + 3, t0 + io);
                win = [win[1], win[2], win[3], u_of(ii, j)];
                let dc = scr[io * d + j];
                let du = du_of(ii, j);
                let row = base + tt;
                let (at, vv, hh, kk) = (f.alpha[row], v[row * d + j], h[row * d + j], k[row * d + j]);
                acc[0] = (s_ch[io] * wh[j]).mul_add(hh * kk, acc[0]);
                acc[1] = du.mul_add((at * vv) * s_rv[ii], acc[1]);
                for p in 0..4 {
                    acc[2 + p] = dc.mul_add(win[p], acc[2 + p]);
                }
            }
            for (q, a) in acc.iter().enumerate() {
                part[(b * 6 + q) * d + j] = *a;
            }
        }
    }
    for e in 0..6 * d {
        let mut tot = 0f32;
        for y in 0..segs {
            let mut acc = 0f32;
            let mut b = y;
            while b < nb {
                acc += part[b * 6 * d + e];
                b += segs;
            }
            tot += acc;
        }
        match e / d {
            0 => o.drms_w_h[e] = tot,
            1 => o.drms_w_v[e - d] = tot,
            _ => o.dconv_w[e - 2 * d] = tot,
        }
    }
    o
}

fn model_case<T: Half>(rng: &mut StdRng, s: EngramGateShape, scale: f32, unit: bool, rf: usize, rb: usize) -> Worst {
    let x = gen::<T>(rng, s, scale, unit);
    let what = format!("model {} {s:?} scale {scale} unit_w {unit} R {rf}/{rb}", T::NAME);
    let f = model_fwd(&x, rf);
    let mut w = check_fwd(&what, &x, &f);
    let b = model_bwd(&x, &f, rb, 8);
    w.merge(&check_bwd(&what, &x, &b));
    w
}

#[test]
fn kernel_model_matches_references() {
    let mut rng = fresh_rng("engram_gate::kernel_model");
    let mut worst = Worst::default();
    for (m, t, d) in [(1, 1, 8), (1, 2, 3), (2, 3, 16), (1, 4, 8), (7, 5, 24), (2, 13, 40), (1, 32, 256), (3, 9, 1000)]
    {
        for (rf, rb) in [(1, 1), (2, 3), (5, 4), (13, 26)] {
            let s = EngramGateShape { m, t, d };
            worst.merge(&model_case::<bf16>(&mut rng, s, 1.0, true, rf, rb));
            worst.merge(&model_case::<f16>(&mut rng, s, 1.0, false, rf, rb));
            worst.merge(&model_case::<bf16>(&mut rng, s, 100.0, false, rf, rb));
            worst.merge(&model_case::<f16>(&mut rng, s, 100.0, true, rf, rb));
        }
    }
    println!("CPU model worst: {worst:?}");
}

#[test]
fn seed_shapes_model() {
    let mut rng = fresh_rng("engram_gate::seed_shapes_model");
    for (m, t, d, is_f16) in [(1, 32, 256, true), (2, 64, 512, true), (1, 128, 256, false), (3, 96, 768, false)] {
        let s = EngramGateShape { m, t, d };
        let w = if is_f16 {
            model_case::<f16>(&mut rng, s, 1.0, true, 5, 4)
        } else {
            model_case::<bf16>(&mut rng, s, 1.0, true, 5, 4)
        };
        println!("{s:?}: {w:?}");
    }
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
