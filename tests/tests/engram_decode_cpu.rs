//! EngramDecodeFwd checks that need no GPU: the launch geometry covers every row and column
//! exactly once, the f64 reference against a literal transcription of docs/ops.md §6, the ring-buffer
//! addressing against the shifting state, the finishes' staging and geometry (the kernels
//! themselves run on the CPU in `sim/tests/engram_decode.rs`, through the GPU tests' chain of
//! checks).
use rand::rngs::StdRng;
use rand::SeedableRng;
use rgk::engram::{
    plan_decode_steps, DecodeDtype, DecodeFinishKernel, DecodeGeometry, DecodeProjectionKernel, DecodeStepPlan,
    EngramDecodeShape,
};
use rgk::reference::{self as rf, DecodeGiven, DecodeRefInputs};
use rgk::verify::Half;
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
