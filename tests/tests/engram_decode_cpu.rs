//! EngramDecodeFwd checks that need no GPU: the launch geometry covers every row and column
//! exactly once, the f64 reference against a literal transcription of docs/ops.md §6, the ring-buffer
//! addressing against the shifting state, and an f32 CPU model of the kernel (same partition,
//! same summation order) passing the same chain of tolerance checks the GPU tests apply.
use rand::rngs::StdRng;
use rand::SeedableRng;
use rgk::engram::{
    plan_decode_steps, DecodeDtype, DecodeFinishKernel, DecodeGeometry, DecodeProjectionKernel, DecodeStepPlan,
    EngramDecodeShape,
};
use rgk::reference::{self as rf, DecodeGiven, DecodeRefInputs};
use rgk::verify::{check_half, Half};
use rgk::{bf16, f16};
use rgk_tests::{randn_f32, randn_half};

/// The eight input tensors in the order of docs/ops.md (`e_t, h_t, conv_state, W_K, W_V, rms_w_h,
/// rms_w_v, conv_w`).
struct Host<T> {
    v: [Vec<T>; 8],
}

impl<T: Half> Host<T> {
    fn gen(rng: &mut StdRng, s: EngramDecodeShape) -> Self {
        let l = s.lens().unwrap();
        let one = |rng: &mut StdRng, n| -> Vec<T> {
            randn_f32(rng, n, 0.4).into_iter().map(|v| T::round_f64(1.0 + v as f64)).collect()
        };
        Self {
            v: [
                randn_half(rng, l.e, 1.0),
                randn_half(rng, l.h, 2.0),
                randn_half(rng, l.state, 0.5),
                randn_half(rng, l.w, 0.05),
                randn_half(rng, l.w, 0.05),
                one(rng, l.rms),
                one(rng, l.rms),
                randn_half(rng, l.conv_w, 0.3),
            ],
        }
    }
    fn refs<'a>(&'a self, state: &'a [T]) -> DecodeRefInputs<'a, T> {
        let v = &self.v;
        DecodeRefInputs {
            e_t: &v[0],
            h_t: &v[1],
            conv_state: state,
            w_k: &v[3],
            w_v: &v[4],
            rms_w_h: &v[5],
            rms_w_v: &v[6],
            conv_w: &v[7],
        }
    }
}

/// The planner's step plans for `shape` on both layouts.
fn plans(s: &EngramDecodeShape) -> Vec<DecodeStepPlan> {
    let p = plan_decode_steps(s).unwrap();
    p.vectorised.into_iter().chain([p.any_layout]).collect()
}

/// Which (row, column chunk) pairs of W each thread of the grid streams, as the kernel's
/// `project` computes them: every pair must be visited exactly once.
#[test]
fn geometry_covers_every_row_and_column_once() {
    let shapes = [
        (1, 512, 256),
        (4, 1024, 512),
        (8, 512, 256),
        (64, 4096, 1000),
        (3, 1, 8),
        (1, 100, 7),
        (2, 37, 1),
        (5, 300, 24),
        (9, 520, 264),
        (2, 40, 2056),
    ];
    for (batch, d_mem, d) in shapes {
        let s = EngramDecodeShape::new(batch, d_mem, d, 4, 2, 1);
        let planned = plans(&s).into_iter().map(|p| p.geometry);
        // Both planned block sizes on both partitions, whatever the shape class.
        let mut both = Vec::new();
        for block in [128, 256] {
            both.push(DecodeGeometry::new(&s, block, false).unwrap());
            if d % 8 == 0 {
                both.push(DecodeGeometry::new(&s, block, true).unwrap());
            }
        }
        for g in planned.chain(both) {
            let vec = g.vec;
            assert_eq!(g.mma, vec == 8);
            let (cl, nt) = (g.col_lanes(), g.block);
            assert!(cl <= nt && nt % cl == 0 && nt % 32 == 0, "{g:?}");
            assert!(g.shared_bytes() <= 48 * 1024, "{g:?}");
            let nch = d as u32 / vec;
            assert!(g.tiles * cl >= nch && (g.tiles - 1) * cl < nch, "{s:?} {g:?}");
            let rs = g.rows_per_split;
            assert!(g.splits * rs >= d_mem as u32 && (g.splits - 1) * rs < d_mem as u32, "{s:?} {g:?}");
            assert!(g.tiles * g.splits <= 264u32.max(g.tiles), "{s:?} {g:?}");
            if d_mem * d > 1 << 22 {
                continue; // the coverage walk below is for the smaller shapes
            }
            let mut seen = vec![0u8; d_mem * nch as usize];
            if g.mma {
                mma_visits(&g, d_mem as u32, nch, &mut seen);
                assert!(seen.iter().all(|&n| n == 1), "{s:?} {g:?}: mma visits {:?}", seen.iter().max());
                continue;
            }
            let rl = nt / cl;
            for tile in 0..g.tiles {
                for split in 0..g.splits {
                    for tid in 0..nt {
                        let (lc, lr) = (tid & (cl - 1), tid >> g.cl_log);
                        let c = tile * cl + lc;
                        if c >= nch {
                            continue;
                        }
                        let r0 = split * rs;
                        let r1 = (r0 + rs).min(d_mem as u32);
                        let mut i = r0 + lr;
                        while i < r1 {
                            seen[i as usize * nch as usize + c as usize] += 1;
                            i += rl;
                        }
                    }
                }
            }
            assert!(seen.iter().all(|&n| n == 1), "{s:?} {g:?}: a pair is visited {:?} times", seen.iter().max());
        }
    }
}

/// The (row, column chunk) pairs of W that `project_mma` loads: lane `(g, t)` of warp `w`
/// loads rows `i0 + {2t, 2t+1, 2t+8, 2t+9}` of columns `tile·64 + 8g..+8` for each of its
/// 16-row steps `i0 = r0 + 16·(w + warps·k)` below the split's end.
fn mma_visits(g: &DecodeGeometry, d_mem: u32, nch: u32, seen: &mut [u8]) {
    let warps = g.block / 32;
    for tile in 0..g.tiles {
        for split in 0..g.splits {
            let r0 = split * g.rows_per_split;
            let r1 = (r0 + g.rows_per_split).min(d_mem);
            for w in 0..warps {
                for lane in 0..32 {
                    let (gr, t) = (lane >> 2, lane & 3);
                    let c = tile * 8 + gr;
                    if c >= nch {
                        continue;
                    }
                    let mut i0 = r0 + 16 * w;
                    while i0 < r1 {
                        for s in 0..2 {
                            let base = i0 + s * 16 * warps;
                            for row in [base + 2 * t, base + 2 * t + 1, base + 2 * t + 8, base + 2 * t + 9] {
                                if row < r1 {
                                    seen[(row * nch + c) as usize] += 1;
                                }
                            }
                        }
                        i0 += 32 * warps;
                    }
                }
            }
        }
    }
}

/// docs/ops.md §6 transcribed literally (explicit hn, kn, state rows, concat), in f64.
fn literal<T: Half>(s: &EngramDecodeShape, x: &DecodeRefInputs<'_, T>) -> (Vec<f64>, Vec<f64>) {
    let EngramDecodeShape { batch, d_mem, d, max_conv_len: l, kernel_size: k, dilation, eps } = *s;
    let eps = eps as f64;
    let g = |v: &[T], i: usize| v[i].to_f64();
    let q = |v: f64| T::round_f64(v).to_f64();
    let rmsnorm = |x: &[f64], w: &[f64]| -> Vec<f64> {
        let r = 1.0 / (x.iter().map(|a| a * a).sum::<f64>() / d as f64 + eps).sqrt();
        x.iter().zip(w).map(|(a, b)| a * r * b).collect()
    };
    let wh: Vec<f64> = (0..d).map(|j| g(x.rms_w_h, j)).collect();
    let wv: Vec<f64> = (0..d).map(|j| g(x.rms_w_v, j)).collect();
    let (mut y, mut ns) = (Vec::new(), Vec::new());
    for b in 0..batch {
        let kk: Vec<f64> =
            (0..d).map(|j| (0..d_mem).map(|i| g(x.e_t, b * d_mem + i) * g(x.w_k, i * d + j)).sum()).collect();
        let vv: Vec<f64> =
            (0..d).map(|j| (0..d_mem).map(|i| g(x.e_t, b * d_mem + i) * g(x.w_v, i * d + j)).sum()).collect();
        let h: Vec<f64> = (0..d).map(|j| g(x.h_t, b * d + j)).collect();
        let hn = rmsnorm(&h, &wh);
        let kn = rmsnorm(&kk.iter().map(|&v| q(v)).collect::<Vec<_>>(), &wh);
        let z: f64 = hn.iter().zip(&kn).map(|(a, b)| a * b).sum::<f64>() / (d as f64).sqrt();
        let alpha = 1.0 / (1.0 + (-z).exp());
        let vh: Vec<f64> = vv.iter().map(|v| alpha * v).collect();
        let u = rmsnorm(&vh.iter().map(|&v| q(v)).collect::<Vec<_>>(), &wv);
        let rows: Vec<Vec<f64>> =
            (0..l).map(|t| (0..d).map(|j| g(x.conv_state, (b * l + t) * d + j)).collect()).collect();
        for j in 0..d {
            let mut conv = g(x.conv_w, (k - 1) * d + j) * u[j];
            for p in 0..k - 1 {
                conv += g(x.conv_w, p * d + j) * rows[l - (k - 1 - p) * dilation][j];
            }
            y.push(conv / (1.0 + (-conv).exp()) + vh[j]);
        }
        let mut new_rows = rows[1..].to_vec();
        new_rows.push(u);
        ns.extend(new_rows.into_iter().flatten());
    }
    (y, ns)
}

fn close(a: &[f64], b: &[f64], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= 1e-9 * (1.0 + y.abs()), "{what}[{i}]: {x} vs {y}");
    }
}

#[test]
fn reference_matches_spec_transcription() {
    let mut rng = StdRng::seed_from_u64(6);
    for (batch, d_mem, d, l, k, dil) in
        [(1, 16, 8, 12, 4, 3), (3, 7, 5, 6, 4, 2), (2, 1, 3, 1, 1, 1), (2, 9, 16, 10, 3, 5), (4, 33, 12, 20, 4, 5)]
    {
        let s = EngramDecodeShape::new(batch, d_mem, d, l, k, dil);
        let c16 = Host::<f16>::gen(&mut rng, s);
        let r = rf::engram_decode_fwd(&s, &c16.refs(&c16.v[2]), DecodeGiven::default());
        let (y, ns) = literal(&s, &c16.refs(&c16.v[2]));
        close(&r.y_t.value, &y, "y_t f16");
        close(&r.new_conv_state.value, &ns, "state f16");
        let cb = Host::<bf16>::gen(&mut rng, s);
        let r = rf::engram_decode_fwd(&s, &cb.refs(&cb.v[2]), DecodeGiven::default());
        let (y, ns) = literal(&s, &cb.refs(&cb.v[2]));
        close(&r.y_t.value, &y, "y_t bf16");
        close(&r.new_conv_state.value, &ns, "state bf16");
        // Giving the reference its own roundings changes nothing.
        let own_k: Vec<bf16> = r.kk.value.iter().map(|&v| bf16::round_f64(v)).collect();
        let own_v: Vec<bf16> = r.vh.value.iter().map(|&v| bf16::round_f64(v)).collect();
        let g = rf::engram_decode_fwd(&s, &cb.refs(&cb.v[2]), DecodeGiven { q_kk: Some(&own_k), q_vh: Some(&own_v) });
        assert_eq!(g.y_t.value, r.y_t.value);
    }
}

/// Writing `q(u)` over physical row `pos` and advancing `pos` is the shift of the seed
/// contract, seen through `ring_logical`, over many wraps (the kernel's `phys_row` is the
/// same map).
#[test]
fn ring_addressing_is_the_shift() {
    let mut rng = StdRng::seed_from_u64(7);
    for (l, k, dil) in [(12, 4, 3), (6, 4, 2), (1, 1, 1), (5, 2, 5), (9, 1, 4)] {
        let s = EngramDecodeShape::new(2, 8, 8, l, k, dil);
        let mut c = Host::<f16>::gen(&mut rng, s);
        let mut copy = c.v[2].clone();
        let mut ring = c.v[2].clone();
        let mut pos = 0;
        for step in 0..3 * l + 2 {
            c.v[0] = randn_half(&mut rng, 16, 1.0);
            let rc = rf::engram_decode_fwd(&s, &c.refs(&copy), DecodeGiven::default());
            let logical = rf::ring_logical(&s, &ring, pos);
            let rr = rf::engram_decode_fwd(&s, &c.refs(&logical), DecodeGiven::default());
            assert_eq!(rc.y_t.value, rr.y_t.value, "step {step}");
            copy = rc.new_conv_state.value.iter().map(|&v| f16::round_f64(v)).collect();
            for b in 0..2 {
                for j in 0..8 {
                    ring[(b * l + pos) * 8 + j] = f16::round_f64(rc.new_conv_state.value[(b * l + l - 1) * 8 + j]);
                }
            }
            pos = (pos + 1) % l;
            let view = rf::ring_logical(&s, &ring, pos);
            assert!(view.iter().zip(&copy).all(|(a, b)| a.to_bits() == b.to_bits()), "L={l} step {step}");
        }
    }
}

/// The kernels' arithmetic in f32 on the CPU: the scalar projection's row partition and
/// summation order (per-thread fma over its rows, the block's row lanes in order, the splits in
/// order) and the finish's formulas — the warp finish (`finish = None`: `fin_vec`-column
/// chunks strided over the lanes, one butterfly, correctly rounded sqrt and division) or the
/// block finish (`Some(cols)`). Returns `(y, new_state, q(kk), q(vh))`.
#[allow(clippy::needless_range_loop)] // index math mirrors the kernel's
fn kernel_model<T: Half>(
    s: &EngramDecodeShape,
    x: &DecodeRefInputs<'_, T>,
    g: &DecodeGeometry,
    fin_vec: usize,
    wide: Option<usize>,
) -> [Vec<T>; 4] {
    let EngramDecodeShape { batch, d_mem, d, max_conv_len: l, kernel_size: k, dilation, eps } = *s;
    let f = |v: &[T], i: usize| v[i].to_f64() as f32;
    let q = |v: f32| T::round_f64(v as f64);
    let qf = |v: f32| q(v).to_f64() as f32;
    let (vec, cl) = (g.vec as usize, g.col_lanes() as usize);
    let rl = g.block as usize / cl;
    let nch = d / vec;
    let rs = g.rows_per_split as usize;
    let mut kv = vec![0f32; batch * 2 * d];
    for tile in 0..g.tiles as usize {
        for lc in 0..cl {
            let c = tile * cl + lc;
            if c >= nch {
                continue;
            }
            for b in 0..batch {
                for m in 0..2 {
                    let w = if m == 0 { x.w_k } else { x.w_v };
                    for v in 0..vec {
                        let j = c * vec + v;
                        let mut total = 0f32;
                        for split in 0..g.splits as usize {
                            let (r0, r1) = (split * rs, ((split + 1) * rs).min(d_mem));
                            let mut block = 0f32;
                            for lr in 0..rl {
                                let mut acc = 0f32;
                                let mut i = r0 + lr;
                                while i < r1 {
                                    acc = f(x.e_t, b * d_mem + i).mul_add(f(w, i * d + j), acc);
                                    i += rl;
                                }
                                block += acc;
                            }
                            total += block;
                        }
                        kv[(b * 2 + m) * d + j] = total;
                    }
                }
            }
        }
    }
    let warp_sum = |lanes: [f32; 32]| {
        let mut a = lanes;
        for m in [16, 8, 4, 2, 1] {
            let b = a;
            for i in 0..32 {
                a[i] = b[i] + b[i ^ m];
            }
        }
        a[0]
    };
    let inv_d = 1.0 / d as f32;
    let inv_sqrt_d = 1.0 / (d as f32).sqrt();
    // The block finish's approx chain (rsqrt.approx + Newton, rcp.approx) is modelled by a
    // pessimistic relative perturbation of 2^-21 on every rrms and sigmoid.
    let approx = if wide.is_some() { 2f32.powi(-21) } else { 0.0 };
    let rrms = |sum: f32| 1.0 / sum.mul_add(inv_d, eps).sqrt() * (1.0 + approx);
    let sigmoid = |v: f32| 1.0 / (1.0 + (-v * std::f32::consts::LOG2_E).exp2()) * (1.0 - approx);
    // A row sum in the kernel's order: the warp finish's lane-strided chunks and one butterfly,
    // or the block finish's columns per thread, a butterfly per warp, the warps in order.
    let row_sum = |term: &dyn Fn(usize, f32) -> f32| -> f32 {
        match wide {
            None => {
                let mut lanes = [0f32; 32];
                for (lane, acc) in lanes.iter_mut().enumerate() {
                    for c in (lane..d / fin_vec).step_by(32) {
                        for j in c * fin_vec..(c + 1) * fin_vec {
                            *acc = term(j, *acc);
                        }
                    }
                }
                warp_sum(lanes)
            }
            Some(e) => {
                let threads = d.div_ceil(e).div_ceil(32) * 32;
                let mut total = 0f32;
                for w in 0..threads / 32 {
                    let mut lanes = [0f32; 32];
                    for (lane, acc) in lanes.iter_mut().enumerate() {
                        let j0 = (w * 32 + lane) * e;
                        for j in j0..(j0 + e).min(d) {
                            *acc = term(j, *acc);
                        }
                    }
                    total += warp_sum(lanes);
                }
                total
            }
        }
    };
    let (mut y, mut ns) = (vec![T::round_f64(0.0); batch * d], Vec::new());
    let (mut qkk, mut qvh) = (Vec::new(), Vec::new());
    for b in 0..batch {
        let kk = &kv[b * 2 * d..b * 2 * d + d];
        let vv = &kv[b * 2 * d + d..(b + 1) * 2 * d];
        let sh = row_sum(&|j, a| {
            let h = f(x.h_t, b * d + j);
            h.mul_add(h, a)
        });
        let sk = row_sum(&|j, a| {
            let qk = qf(kk[j]);
            qk.mul_add(qk, a)
        });
        let dot = row_sum(&|j, a| {
            let (h, w) = (f(x.h_t, b * d + j), f(x.rms_w_h, j));
            (h * w * w).mul_add(qf(kk[j]), a)
        });
        let alpha = sigmoid(dot * rrms(sh) * rrms(sk) * inv_sqrt_d);
        let rv = rrms(row_sum(&|j, a| {
            let qv = qf(alpha * vv[j]);
            qv.mul_add(qv, a)
        }));
        let mut u_row = Vec::new();
        for j in 0..d {
            let vh = alpha * vv[j];
            let u = qf(vh) * rv * f(x.rms_w_v, j);
            let mut conv = f(x.conv_w, (k - 1) * d + j) * u;
            for p in 0..k - 1 {
                let t = l - (k - 1 - p) * dilation;
                conv = f(x.conv_w, p * d + j).mul_add(f(x.conv_state, (b * l + t) * d + j), conv);
            }
            y[b * d + j] = q(conv * sigmoid(conv) + vh);
            u_row.push(q(u));
            qkk.push(q(kk[j]));
            qvh.push(q(vh));
        }
        ns.extend_from_slice(&x.conv_state[b * l * d + d..(b + 1) * l * d]);
        ns.extend_from_slice(&u_row);
    }
    [y, ns, qkk, qvh]
}

/// The GPU tests' chain of checks, applied to the CPU model of the kernel: the tolerance
/// argument holds for kernel-like f32 arithmetic, including 1-ulp flips of q(kk) and q(vh)
/// (counted and printed).
#[test]
fn f32_kernel_model_passes_the_chain_of_checks() {
    let mut rng = StdRng::seed_from_u64(8);
    let mut flips = (0usize, 0usize, 0usize);
    for (batch, d_mem, d, l, k, dil) in [
        (1, 512, 256, 12, 4, 3),
        (4, 1024, 512, 20, 4, 5),
        (8, 512, 256, 18, 4, 3),
        (3, 100, 1000, 6, 2, 3),
        (2, 4096, 8, 1, 1, 1),
        (3, 37, 7, 5, 3, 2),
        (2, 64, 1032, 4, 2, 1),
        (2, 40, 300, 5, 3, 2),
    ] {
        let s = EngramDecodeShape::new(batch, d_mem, d, l, k, dil);
        for bf in [false, true] {
            let steps = plan_decode_steps(&s).unwrap();
            let g = steps.any_layout.geometry;
            assert!(!g.mma);
            // Every finish the planner takes for the shape, plus the warp finish on its layout.
            let mut finishes: Vec<(usize, Option<usize>)> = vec![(if d % 8 == 0 { 8 } else { 1 }, None)];
            for p in steps.vectorised.iter().chain([&steps.any_layout]) {
                finishes.push(match p.finish {
                    DecodeFinishKernel::Block { cols, .. } => (1, Some(cols as usize)),
                    DecodeFinishKernel::Warp { cols, .. } => (cols as usize, None),
                });
            }
            for &(fin_vec, wide) in &finishes {
                macro_rules! run {
                    ($t:ty) => {{
                        let c = Host::<$t>::gen(&mut rng, s);
                        let x = c.refs(&c.v[2]);
                        let [y, ns, qkk, qvh] = kernel_model(&s, &x, &g, fin_vec, wide);
                        let proj = rf::decode_projections(&s, &x);
                        let own = rf::engram_decode_fwd_from(&s, &x, &proj, DecodeGiven::default());
                        let rk = check_half(&qkk, &own.kk, 1.0);
                        assert!(rk.passed(), "{s:?}: q(kk) {rk}");
                        let g1 =
                            rf::engram_decode_fwd_from(&s, &x, &proj, DecodeGiven { q_kk: Some(&qkk), q_vh: None });
                        let rv = check_half(&qvh, &g1.vh, 1.0);
                        assert!(rv.passed(), "{s:?}: q(vh) {rv}");
                        let g2 = rf::engram_decode_fwd_from(
                            &s,
                            &x,
                            &proj,
                            DecodeGiven { q_kk: Some(&qkk), q_vh: Some(&qvh) },
                        );
                        let ry = check_half(&y, &g2.y_t, 2.0);
                        assert!(ry.passed(), "{s:?}: y_t {ry}");
                        let rs = check_half(&ns, &g2.new_conv_state, 2.0);
                        assert!(rs.passed(), "{s:?}: state {rs}");
                        flips.0 += qkk
                            .iter()
                            .zip(&own.kk.value)
                            .filter(|(a, &r)| a.to_f64() != <$t>::round_f64(r).to_f64())
                            .count();
                        flips.1 += qvh
                            .iter()
                            .zip(&g1.vh.value)
                            .filter(|(a, &r)| a.to_f64() != <$t>::round_f64(r).to_f64())
                            .count();
                        flips.2 += qkk.len();
                    }};
                }
                if bf {
                    run!(bf16)
                } else {
                    run!(f16)
                }
            }
        }
    }
    println!("f32 model: {} of {} q(kk) and {} q(vh) differ by 1 ulp from the f64 rounding", flips.0, flips.2, flips.1);
}

/// `prmt.b32` (default mode): result byte `i` is byte `sel[4i..4i+3]` of `b:a`.
fn prmt(a: u32, b: u32, sel: u32) -> u32 {
    let bytes = [a.to_le_bytes(), b.to_le_bytes()].concat();
    (0..4).fold(0, |r, i| r | (bytes[((sel >> (4 * i)) & 7) as usize] as u32) << (8 * i))
}

/// `mma.m16n8k16.row.col` with the fragment layouts of the PTX ISA (lane = 4·groupID +
/// threadID_in_group), in f64: `a_i` at row `groupID (+8 for i ∈ {2,3,6,7})`, column
/// `2·tig + (i & 1) (+8 for i ≥ 4)`; `b_i` at row `2·tig + (i & 1) (+8 for i ≥ 2)`, column
/// `groupID`; `c_i` at row `groupID (+8 for i ≥ 2)`, column `2·tig + (i & 1)`; register `r`
/// holds elements `2r` (low half) and `2r + 1`.
fn mma_emulated(
    a: &[[u32; 4]; 32],
    b: &[[u32; 2]; 32],
    c: &[[f64; 4]; 32],
    widen: &dyn Fn(u16) -> f64,
) -> [[f64; 4]; 32] {
    let half = |r: u32, i: usize| ((r >> (16 * (i & 1))) & 0xffff) as u16;
    let (mut am, mut bm, mut cm) = ([[0f64; 16]; 16], [[0f64; 8]; 16], [[0f64; 8]; 16]);
    for lane in 0..32 {
        let (gid, tig) = (lane / 4, lane % 4);
        for i in 0..8 {
            let row = if matches!(i, 0 | 1 | 4 | 5) { gid } else { gid + 8 };
            let col = 2 * tig + (i & 1) + if i >= 4 { 8 } else { 0 };
            am[row][col] = widen(half(a[lane][i / 2], i));
        }
        for i in 0..4 {
            let row = 2 * tig + (i & 1) + if i >= 2 { 8 } else { 0 };
            bm[row][gid] = widen(half(b[lane][i / 2], i));
        }
        for i in 0..4 {
            cm[if i < 2 { gid } else { gid + 8 }][2 * tig + (i & 1)] = c[lane][i];
        }
    }
    let mut d = [[0f64; 4]; 32];
    for (lane, out) in d.iter_mut().enumerate() {
        let (gid, tig) = (lane / 4, lane % 4);
        for (i, o) in out.iter_mut().enumerate() {
            let (row, col) = (if i < 2 { gid } else { gid + 8 }, 2 * tig + (i & 1));
            *o = cm[row][col] + (0..16).map(|k| am[row][k] * bm[k][col]).sum::<f64>();
        }
    }
    d
}

/// A transcription of the kernel's `project_mma` (loads, `prmt` pairing, fragment assembly,
/// shared-memory layout and warp-order sum) run on [`mma_emulated`]: every split's partial
/// equals the direct sum over the split's rows. This checks the column map and selectors
/// against the PTX ISA's documented fragment layouts.
#[allow(clippy::needless_range_loop)] // index math mirrors the kernel's
fn mma_projection<T: Half>(s: &EngramDecodeShape, block: u32, widen: &dyn Fn(u16) -> f64, bits: &dyn Fn(T) -> u16) {
    let mut rng = StdRng::seed_from_u64(9);
    let (batch, d_mem, d) = (s.batch, s.d_mem, s.d);
    let e: Vec<T> = randn_half(&mut rng, batch * d_mem, 1.0);
    let w: [Vec<T>; 2] = [randn_half(&mut rng, d_mem * d, 1.0), randn_half(&mut rng, d_mem * d, 1.0)];
    let g = DecodeGeometry::new(s, block, true).unwrap();
    assert!(g.mma);
    let nw = (block / 32) as usize;
    let ld16 = |m: usize, row: usize, col: usize| -> [u32; 4] {
        let mut v = [0u32; 4];
        for (k, word) in v.iter_mut().enumerate() {
            *word = bits(w[m][row * d + col + 2 * k]) as u32 | (bits(w[m][row * d + col + 2 * k + 1]) as u32) << 16;
        }
        v
    };
    let rs = g.rows_per_split as usize;
    for tile in 0..g.tiles as usize {
        for split in 0..g.splits as usize {
            let (c0, r0) = (tile * 64, split * rs);
            let r1 = (r0 + rs).min(d_mem);
            for b0 in (0..batch).step_by(8) {
                let mut smem = vec![0f64; nw * 1024];
                // The b8k16 kernel's slab: [warp][m][u][lane][4], the accumulators in fragment order.
                let mut slab = vec![[0f64; 4]; nw * 256];
                for warp in 0..nw {
                    let mut acc = [[[[0f64; 4]; 32]; 4]; 2]; // [k|v][u][lane][4]
                    let mut i0 = r0 + 16 * warp;
                    while i0 < r1 {
                        for step in 0..2 {
                            let base = i0 + step * 16 * nw;
                            let mut frag = [[[[0u32; 4]; 32]; 4]; 2];
                            let mut ef = [[0u32; 2]; 32];
                            for lane in 0..32 {
                                let (gr, tq) = (lane >> 2, lane & 3);
                                let col = c0 + 8 * gr;
                                let rows = [base + 2 * tq, base + 2 * tq + 1, base + 2 * tq + 8, base + 2 * tq + 9];
                                let mut wr = [[[0u32; 4]; 4]; 2];
                                for (r, &row) in rows.iter().enumerate() {
                                    if col < d && row < r1 {
                                        wr[0][r] = ld16(0, row, col);
                                        wr[1][r] = ld16(1, row, col);
                                    }
                                }
                                let b = b0 + gr;
                                let ew: Vec<u32> = rows
                                    .iter()
                                    .map(|&row| if b < batch && row < r1 { bits(e[b * d_mem + row]) as u32 } else { 0 })
                                    .collect();
                                ef[lane] = [ew[0] | ew[1] << 16, ew[2] | ew[3] << 16];
                                for m in 0..2 {
                                    for u in 0..4 {
                                        let (k0, k1, k8, k9) = (wr[m][0][u], wr[m][1][u], wr[m][2][u], wr[m][3][u]);
                                        frag[m][u][lane] = [
                                            prmt(k0, k1, 0x5410),
                                            prmt(k0, k1, 0x7632),
                                            prmt(k8, k9, 0x5410),
                                            prmt(k8, k9, 0x7632),
                                        ];
                                    }
                                }
                            }
                            for m in 0..2 {
                                for u in 0..4 {
                                    acc[m][u] = mma_emulated(&frag[m][u], &ef, &acc[m][u], widen);
                                }
                            }
                        }
                        i0 += 32 * nw;
                    }
                    for lane in 0..32 {
                        let (gr, tq) = (lane >> 2, lane & 3);
                        for m in 0..2 {
                            for u in 0..4 {
                                slab[warp * 256 + (m * 4 + u) * 32 + lane] = acc[m][u][lane];
                                let p = warp * 1024 + m * 512 + 8 * gr + 2 * u;
                                let (a, b) = (2 * tq * 64, (2 * tq + 1) * 64);
                                smem[p + a] = acc[m][u][lane][0];
                                smem[p + b] = acc[m][u][lane][1];
                                smem[p + a + 1] = acc[m][u][lane][2];
                                smem[p + b + 1] = acc[m][u][lane][3];
                            }
                        }
                    }
                }
                // `project_mma_b8k16`'s reduction: item `it` = (m, u, lane) summed over the warps in
                // warp order, then `store_partial_pair`'s (batch, column) placement: it must give
                // the same value as the `_mma` layout for every (b, m, column) exactly once.
                let mut b8k16 = vec![None; 2 * 8 * 64];
                for it in 0..256 {
                    let (m, u, ln) = (it >> 7, (it >> 5) & 3, it & 31);
                    let (gq, tq) = (ln >> 2, ln & 3);
                    let mut sum = [0f64; 4];
                    for w in 0..nw {
                        for (i, v) in sum.iter_mut().enumerate() {
                            *v += slab[w * 256 + it][i];
                        }
                    }
                    let c = 8 * gq + 2 * u;
                    for (i, (bl, cc)) in
                        [(2 * tq, c), (2 * tq + 1, c), (2 * tq, c + 1), (2 * tq + 1, c + 1)].into_iter().enumerate()
                    {
                        let slot = &mut b8k16[(m * 8 + bl) * 64 + cc];
                        assert!(slot.is_none(), "b8k16 item {it} writes (m {m}, b {bl}, col {cc}) twice");
                        *slot = Some(sum[i]);
                    }
                }
                for o in 0..1024 {
                    let (m, bl, c) = (o >> 9, (o >> 6) & 7, c0 + (o & 63));
                    let old: f64 = (0..nw).map(|w| smem[w * 1024 + o]).sum();
                    assert_eq!(
                        b8k16[(m * 8 + bl) * 64 + (o & 63)],
                        Some(old),
                        "b8k16 ≠ mma layout at (m {m}, b {bl}, col {c})"
                    );
                    let b = b0 + bl;
                    if b < batch && c < d {
                        let got: f64 = (0..nw).map(|w| smem[w * 1024 + o]).sum();
                        let want: f64 = (r0..r1).map(|i| e[b * d_mem + i].to_f64() * w[m][i * d + c].to_f64()).sum();
                        let mag: f64 =
                            (r0..r1).map(|i| (e[b * d_mem + i].to_f64() * w[m][i * d + c].to_f64()).abs()).sum();
                        assert!(
                            (got - want).abs() <= 1e-12 * (1.0 + mag),
                            "{s:?} block {block}: split {split} b {b} m {m} col {c}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn mma_fragment_mapping_computes_the_projection() {
    for (shape, block) in [
        (EngramDecodeShape::new(11, 50, 136, 4, 2, 1), 64),
        (EngramDecodeShape::new(3, 1024, 512, 20, 4, 5), 128),
        (EngramDecodeShape::new(8, 33, 8, 4, 2, 1), 256),
        (EngramDecodeShape::new(1, 512, 256, 12, 4, 3), 128),
    ] {
        mma_projection::<f16>(&shape, block, &|h| f16::from_bits(h).to_f64(), &|v| v.to_bits());
        mma_projection::<bf16>(&shape, block, &|h| bf16::from_bits(h).to_f64(), &|v| v.to_bits());
    }
}

/// The warp finish: its row staging fits the default shared memory (or goes through the
/// workspace), and its row `b` of the partials `[split][b][k|v][d]` is the slice the kernel
/// reads (element `e < 2d` of split `sp` at `(sp·batch + b)·2d + e`).
#[test]
fn warp_finish_staging() {
    for d in [513, 1001, 1032, 2056, 4096, 4097, 4104, 1 << 20] {
        let s = EngramDecodeShape::new(3, 10, d, 4, 2, 1);
        for p in plans(&s) {
            let DecodeFinishKernel::Warp { cols, threads, staged_in_shared } = p.finish else {
                assert!(d <= 1024 && (d <= 512 || p.geometry.mma), "d {d}: {p:?}");
                continue;
            };
            assert_eq!(cols, p.geometry.vec, "d {d}");
            assert_eq!(threads, p.geometry.block, "d {d}");
            assert_eq!(staged_in_shared, d <= 4096, "d {d}");
            if staged_in_shared {
                assert!(8 * d <= 48 * 1024, "d {d}: {} bytes", 8 * d);
            }
        }
    }
    for (batch, splits, d) in [(1, 8, 256), (4, 16, 512), (8, 8, 256), (3, 5, 24)] {
        let mut seen = vec![0u8; splits * batch * 2 * d];
        for b in 0..batch {
            for sp in 0..splits {
                for e in 0..2 * d {
                    let (m, col) = (e / d, e % d);
                    let k = (sp * batch + b) * 2 * d + e;
                    assert_eq!(k, ((sp * batch + b) * 2 + m) * d + col);
                    seen[k] += 1;
                }
            }
        }
        assert!(seen.iter().all(|&n| n == 1));
    }
}

/// The block finish: every column owned by exactly one thread (`cols·t`, `cols` columns),
/// blocks a multiple of 32 within the kernel's register limit (512 threads at 1 column, 256 at
/// 2 and 4), 2 and 4 columns only on the vectorised layout, the smallest width whose block has
/// ≤ 256 threads; rows no width takes get the warp finish. Block 128 for d ≤ 256, else 256.
#[test]
fn block_finish_geometry() {
    for d in [1, 7, 8, 24, 64, 100, 256, 264, 300, 512, 520, 1000, 1024, 1032, 2048, 2056, 4096] {
        let s = EngramDecodeShape::new(2, 10, d, 4, 2, 1);
        for p in plans(&s) {
            let vectorised = p.geometry.mma;
            assert_eq!(p.geometry.block, if d <= 256 { 128 } else { 256 }, "d {d}");
            let limit = |e: usize| if e == 1 { 512 } else { 256 };
            let fits = |e: usize| (e == 1 || vectorised) && d.div_ceil(e).div_ceil(32) * 32 <= limit(e);
            let DecodeFinishKernel::Block { cols, threads } = p.finish else {
                assert!(![1, 2, 4].into_iter().any(fits), "d {d}: warp finish but a block width fits");
                continue;
            };
            let e = cols as usize;
            assert!(fits(e), "d {d} cols {e} threads {threads}");
            assert_eq!(threads as usize, d.div_ceil(e).div_ceil(32) * 32);
            let smaller_within_256 =
                [1, 2, 4].into_iter().filter(|&w| w < e && fits(w) && d.div_ceil(w).div_ceil(32) * 32 <= 256).count();
            assert_eq!(smaller_within_256, 0, "d {d}: a narrower width fits 256 threads");
            if threads > 256 {
                assert!(
                    ![1, 2, 4].into_iter().any(|w| fits(w) && d.div_ceil(w).div_ceil(32) * 32 <= 256),
                    "d {d}: {threads} threads where a width fits 256"
                );
            }
            let mut seen = vec![0u8; d];
            for t in 0..threads as usize {
                let j0 = t * e;
                if j0 < d {
                    assert!(j0 + e <= d, "d {d} cols {e}: a partial group");
                    for n in &mut seen[j0..j0 + e] {
                        *n += 1;
                    }
                }
            }
            assert!(seen.iter().all(|&n| n == 1), "d {d} cols {e}");
        }
    }
}

/// The projection kernel: the bounds-free MMA kernel on the vectorised layout with `batch ≤ 8`
/// and whole 16-row k-steps (every seed row), the bounded MMA kernel for the other vectorised
/// shapes, the scalar kernel on any other layout.
#[test]
fn projection_kernel_follows_its_limits() {
    let vec_kernel = |b, dm, d| plan_decode_steps(&EngramDecodeShape::new(b, dm, d, 18, 4, 3)).unwrap();
    for (b, dm, d) in [(1, 512, 256), (4, 1024, 512), (8, 512, 256), (3, 16, 8)] {
        assert_eq!(vec_kernel(b, dm, d).vectorised.unwrap().projection, DecodeProjectionKernel::MmaB8K16);
    }
    assert_eq!(vec_kernel(9, 512, 256).vectorised.unwrap().projection, DecodeProjectionKernel::Mma, "batch > 8");
    assert_eq!(vec_kernel(8, 520, 256).vectorised.unwrap().projection, DecodeProjectionKernel::Mma, "d_mem % 16");
    assert!(vec_kernel(8, 512, 252).vectorised.is_none(), "d % 8");
    for (b, dm, d) in [(1, 512, 256), (9, 520, 264), (8, 512, 252)] {
        assert_eq!(vec_kernel(b, dm, d).any_layout.projection, DecodeProjectionKernel::Scalar);
    }
}

/// Every decode entry of the module is launched by some plan, and every planned entry exists:
/// the planner swept over shapes covering each tuning row and fallback (the GPU test
/// `planned_kernels_are_the_module_entries` checks the host's own sweep the same way).
#[test]
fn planner_reaches_every_decode_entry() {
    let mut planned = std::collections::BTreeSet::new();
    for batch in [1, 8, 9] {
        for d_mem in [16, 520] {
            for d in [7, 8, 256, 264, 512, 520, 1024, 1032, 4096, 4104] {
                for p in plans(&EngramDecodeShape::new(batch, d_mem, d, 4, 2, 1)) {
                    for dtype in [DecodeDtype::F16, DecodeDtype::Bf16] {
                        planned.extend(p.entries(dtype).unwrap());
                    }
                }
            }
        }
    }
    let in_module: std::collections::BTreeSet<&str> =
        rgk_tests::module_entries().into_iter().filter(|name| name.starts_with("engram_decode_")).collect();
    assert_eq!(planned, in_module);
}

/// Every plan of a wide grid of shapes (d = 1..1100 and streaming widths, several batches and
/// `d_mem`), on both layouts and in both dtypes, names a kernel of `kernel_abi::decode_kernels!`
/// (the list the PTX entries are declared from) that the module holds.
#[test]
fn every_plan_names_a_declared_kernel() {
    let module = rgk_tests::module_entries();
    let mut seen = std::collections::BTreeSet::new();
    for batch in [1, 2, 4, 8, 9, 16] {
        for d_mem in [16, 40, 512, 520] {
            for d in (1..=1100).chain([2048, 4096, 4104, 8192]) {
                let s = EngramDecodeShape::new(batch, d_mem, d, 4, 2, 1);
                let steps = plan_decode_steps(&s).unwrap_or_else(|e| panic!("{s:?}: {e}"));
                for p in steps.vectorised.iter().chain([&steps.any_layout]) {
                    for dtype in [DecodeDtype::F16, DecodeDtype::Bf16] {
                        for n in p.entries(dtype).unwrap_or_else(|e| panic!("{s:?} {dtype:?}: {e}")) {
                            assert!(module.contains(n), "{n} is planned but not in the PTX module");
                            seen.insert(n);
                        }
                    }
                }
            }
        }
    }
    println!("{} of the module's decode entries planned", seen.len());
}
