//! MHCPreFwd (SPEC.md §2) in two ordinary launches on one stream. No inter-block
//! communication inside a launch: no atomics, fences, polling or co-residency assumptions,
//! and the workspace carries no state between calls.
//!
//! **Kernel 1, [`mhc_pre_partial`]** (grid `G ≤ #SMs`): split-K. Block `g` owns the channel
//! columns `j ∈ [g·cols, min((g+1)·cols, c))` of every stream `k` and every batch row. For each
//! group of ≤ [`BT`] batch rows it stages `x[β, k·c + j]` of its columns in shared memory (bf16)
//! and reads the matching rows `k·c + j` of `phi` (n segments of `cols·m` contiguous floats,
//! `m = n²+2n`). Thread `(slot p, column col)` walks rows `ρ = p, p + P, …` of the slab at a fixed
//! `col` (coalesced), accumulating `phi·x` exactly in f64 (an f32·bf16 product is exact in f64);
//! the extra column `col = m` accumulates `x²` (for r). The `P` slot partials are summed in
//! shared memory in slot order and stored with plain stores to
//! `part[(β·(m+1) + col)·G + g]` (f64). Every word of `part` is written by exactly one block.
//!
//! **Kernel 2, [`mhc_pre_mix`]** (grid `batch·tiles`, block `(β, tile)`): prologue issues the
//! loads of its x tile (`x[β, k·c + j]`, `j` in the tile, all k) and of the bias; then sums the
//! `G` partials of each of β's `m+1` quantities in a fixed order (thread `(q, s)` adds
//! `g = s, s+S, s+2S, …` sequentially in f64, then thread `q` adds the `S` slice sums in `s`
//! order); then the coefficients (redundantly per tile, identically): `r` and the logits in f64,
//! exponentials as `ex2.approx` of the f64-reduced fraction times an exact power of two,
//! σ and Sinkhorn in f32 (`div.rn`, one element per thread, ping-pong buffers); then the mixing
//! of the staged tile: `x_res = q(Σ_k R[i,k]·x_k)`, `x_layer = q(Σ_k H_pre[k]·x_k)`, f32 FMAs in
//! k order. Tile 0 of each β writes `h_post`.
//!
//! Every sum has a fixed order, so the outputs are bitwise reproducible.
use crate::prim::*;

/// Batch rows per group in kernel 1 (f64 accumulators per thread).
pub const BT: u32 = 4;
const _: () = assert!(BT == 4, "Slab::fma is written out for four rows");
/// Loads in flight per thread in kernel 1's split-K walk and staging, and the x elements per
/// thread of kernel 2's tile (the host sizes tiles so that `n·jt ≤ UN·block`).
pub const UN: usize = 8;
/// Partial loads in flight per thread in kernel 2's reduction.
pub const UP: usize = 16;

/// Division by a divisor fixed per tile, as a multiply-high: `magic = ⌊2^32/d⌋ + 1` gives the
/// exact quotient for every `a, d ≤ 2^16` (the error `a·(magic − 2^32/d)/2^32 < 2^-16 ≤ 1/d`).
/// The host passes the magic of the common divisors; others are computed on the device.
#[derive(Clone, Copy)]
struct FastDiv {
    d: u32,
    magic: u64,
}

impl FastDiv {
    #[inline(always)]
    fn new(d: u32) -> Self {
        Self { d, magic: (1u64 << 32) / d as u64 + 1 }
    }
    /// `a / d` (exact for `a, d ≤ 2^16`).
    #[inline(always)]
    fn div(self, a: u32) -> u32 {
        ((a as u64 * self.magic) >> 32) as u32
    }
    /// `(a / d, a % d)`.
    #[inline(always)]
    fn divrem(self, a: u32) -> (u32, u32) {
        let q = self.div(a);
        (q, a - q * self.d)
    }
}

#[inline(always)]
fn min_u32(a: u32, b: u32) -> u32 {
    if a < b {
        a
    } else {
        b
    }
}

/// e^d in f32 for d ≤ 1 (f64 argument): the f64 product d·log2(e) is split into an integer `k`
/// and a fraction `f ∈ [-½, ½]`, `2^f` by `ex2.approx` (2^-22.5), times the exact `2^k`
/// (one final rounding where the result is subnormal). Relative error ≈ 2^-22 for every d whose
/// result is a normal f32, unlike `ex2.approx(d·log2 e)` whose argument rounding costs
/// `2^-24·|d·log2 e|`.
#[inline(always)]
pub fn exp_le1(d: f64) -> f32 {
    const MAGIC: f64 = 6755399441055744.0; // 2^52 + 2^51: round-to-nearest-integer trick
    let t = d * core::f64::consts::LOG2_E;
    if t < -160.0 {
        return 0.0;
    }
    let kf = (t + MAGIC) - MAGIC;
    let p = ex2_approx((t - kf) as f32);
    let k = kf as i32;
    if k >= -126 {
        p * f32::from_bits(((k + 127) as u32) << 23)
    } else {
        // k ∈ [-160, -127]: 2^(k+64) is normal and exact, then one rounding into the subnormals.
        (p * f32::from_bits(((k + 64 + 127) as u32) << 23)) * f32::from_bits((127 - 64) << 23)
    }
}

/// σ(z) = 1/(1+e^-z) in f32 from an f64 logit, never overflowing: e = e^-|z|, then
/// 1/(1+e) for z ≥ 0 and e/(1+e) for z < 0.
#[inline(always)]
pub fn sigmoid_f64_arg(z: f64) -> f32 {
    let e = exp_le1(if z >= 0.0 { -z } else { z });
    if z >= 0.0 {
        div_rn(1.0, 1.0 + e)
    } else {
        div_rn(e, 1.0 + e)
    }
}

/// Stages `x[b0 + βl, k·c + col0 + jj]` for βl < bga, k < n, jj < jca into `xs[(βl·n + k)·jca + jj]`:
/// all of a thread's loads are issued before its first shared store.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn stage(
    x: *const u16,
    xs: *mut u16,
    b0: u32,
    bga: u32,
    n: u32,
    c: u32,
    col0: u32,
    fj: FastDiv,
    t: u32,
    nt: u32,
) {
    let jca = fj.d;
    let total = bga * n * jca;
    // Element e = row·jca + jj, stepped by nt without dividing per element.
    let (drow, djj) = fj.divrem(nt);
    let (mut row, mut jj) = fj.divrem(t);
    let mut e = t;
    while e < total {
        let mut v = [0u16; UN];
        let mut u = 0;
        while u < UN {
            if e + (u as u32) * nt < total {
                v[u] = *x.add(((b0 * n + row) * c + col0 + jj) as usize);
            }
            row += drow;
            jj += djj;
            if jj >= jca {
                jj -= jca;
                row += 1;
            }
            u += 1;
        }
        let mut u = 0;
        while u < UN {
            let eu = e + u as u32 * nt;
            if eu < total {
                *xs.add(eu as usize) = v[u];
            }
            u += 1;
        }
        e += UN as u32 * nt;
    }
}

/// A thread's position in the split-K walk over the block's slab rows `ρ = k·jca + jj`.
#[derive(Clone, Copy)]
struct Walk {
    rho: u32,
    k: u32,
    jj: u32,
}

/// Geometry of one tile's walk (fixed per thread and tile).
#[derive(Clone, Copy)]
struct Slab {
    phi: *const f32,
    rows: u32,
    slots: u32,
    jca: u32,
    fj: FastDiv,
    dk: u32,
    djj: u32,
    c: u32,
    colbase: u32,
    m: u32,
    col: u32,
    is_sq: bool,
}

impl Slab {
    #[inline(always)]
    fn start(&self, p: u32) -> Walk {
        let (k, jj) = self.fj.divrem(p);
        Walk { rho: p, k, jj }
    }

    /// Loads the next `UN` rows' `phi[(k·c + colbase + jj)·m + col]` (none for the x² column);
    /// returns the values and their row indices (`≥ rows` = past the end).
    #[inline(always)]
    unsafe fn load(&self, w: &mut Walk) -> ([f32; UN], [u32; UN]) {
        let mut v = [0f32; UN];
        let mut rr = [u32::MAX; UN];
        let mut u = 0;
        while u < UN {
            if w.rho < self.rows {
                rr[u] = w.rho;
                if !self.is_sq {
                    v[u] = *self.phi.add(((w.k * self.c + self.colbase + w.jj) * self.m + self.col) as usize);
                }
            }
            w.rho += self.slots;
            w.jj += self.djj;
            w.k += self.dk;
            if w.jj >= self.jca {
                w.jj -= self.jca;
                w.k += 1;
            }
            u += 1;
        }
        (v, rr)
    }

    /// `acc += w·x[ρ]` over one batch row's staged x (`xr = xs + βl·rows`), with `w = phi` (or
    /// `x` itself for the x² column): exactly-multiplied f64 FMAs in row order.
    #[inline(always)]
    unsafe fn fma_row(&self, mut acc: f64, v: &[f32; UN], rr: &[u32; UN], xr: *const u16) -> f64 {
        let mut u = 0;
        while u < UN {
            if rr[u] < self.rows {
                let xv = bf16_to_f32(*xr.add(rr[u] as usize));
                let w = if self.is_sq { xv } else { v[u] };
                acc = fma_f64(w as f64, xv as f64, acc);
            }
            u += 1;
        }
        acc
    }

    /// [`Slab::fma_row`] for the `bga ≤ BT` rows of the group (constant indices: registers).
    #[inline(always)]
    unsafe fn fma(&self, acc: &mut [f64; BT as usize], v: &[f32; UN], rr: &[u32; UN], xs: *const u16, bga: u32) {
        let r = self.rows as usize;
        acc[0] = self.fma_row(acc[0], v, rr, xs);
        if bga > 1 {
            acc[1] = self.fma_row(acc[1], v, rr, xs.add(r));
        }
        if bga > 2 {
            acc[2] = self.fma_row(acc[2], v, rr, xs.add(2 * r));
        }
        if bga > 3 {
            acc[3] = self.fma_row(acc[3], v, rr, xs.add(3 * r));
        }
    }
}

/// Kernel 1's shared memory (bytes), mirrored by the host (`rgk::mhc::pre::partial_smem_bytes`):
/// red BT·T f64 | part bg·mq f64 | xs bg·n·jc u16.
struct Smem1 {
    red: *mut f64,
    part: *mut f64,
    xs: *mut u16,
}

#[inline(always)]
unsafe fn layout1(nt: u32, bg: u32, mq: u32) -> Smem1 {
    let base = dyn_smem::<u8>();
    let part = 8 * (BT * nt) as usize;
    let xs = part + 8 * (bg * mq) as usize;
    Smem1 { red: base as *mut f64, part: base.add(part) as *mut f64, xs: base.add(xs) as *mut u16 }
}

/// Kernel 1: split-K partial logits and Σx². Grid `(G,1,1)` with `G = ceil(c/cols)`; block
/// `(T,1,1)`, `T` a multiple of 32; dynamic shared memory per [`layout1`]. Writes every word of
/// `part[0 .. batch·(m+1)·G]` (f64), nothing else. Requires `n·c·m < 2^31`, `batch·n·c < 2^31`,
/// `batch·(m+1)·G < 2^31`, `bg ≤ BT`, `jc ≤ cols`, `bg·n·jc ≤ 2^16`.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "ptx-kernel" fn mhc_pre_partial(
    phi: *const f32,
    x: *const u16,
    part_ws: *mut f64,
    batch: u32,
    n: u32,
    c: u32,
    cols: u32,
    jc: u32,
    bg: u32,
    ngroups: u32,
    njc_full: u32,
    mc: u32,
    mc_magic: u64,
    jc_magic: u64,
) {
    let t = thread_idx_x();
    let nt = block_dim_x();
    let g = block_idx_x();
    let grid = grid_dim_x();
    let m = n * n + 2 * n;
    let mq = m + 1;
    let sm = layout1(nt, bg, mq);
    let j0 = g * cols;
    let jb = min_u32(cols, c - j0);
    let njc = if jb == cols { njc_full } else { jb.div_ceil(jc) };
    // Grid-uniform constants from the host: mc = min(m+1, T) columns per q-chunk, and the
    // magics of mc and jc (no u32 division before the first phi load).
    let fmc = FastDiv { d: mc, magic: mc_magic };
    let fjc = FastDiv { d: jc, magic: jc_magic };
    let slots = fmc.div(nt);
    let (p, cl) = fmc.divrem(t);

    let mut gi = 0;
    while gi < ngroups {
        let b0 = gi * bg;
        let bga = min_u32(bg, batch - b0);
        let mut i = t;
        while i < bga * mq {
            *sm.part.add(i as usize) = 0.0;
            i += nt;
        }
        let mut jci = 0;
        while jci < njc {
            let jc0 = jci * jc;
            let jca = min_u32(jc, jb - jc0);
            let rows = n * jca;
            let mut qc0 = 0;
            while qc0 < mq {
                let mca = min_u32(mc, mq - qc0);
                let col = qc0 + cl;
                let fj = if jca == jc { fjc } else { FastDiv::new(jca) };
                let (dk, djj) = fj.divrem(slots);
                let slab = Slab { phi, rows, slots, jca, fj, dk, djj, c, colbase: j0 + jc0, m, col, is_sq: col == m };
                let active = p < slots && cl < mca;
                let mut w = slab.start(p);
                // First batch of phi loads before the staging waits on x.
                let (mut v, mut rr) = if active { slab.load(&mut w) } else { ([0.0; UN], [u32::MAX; UN]) };
                if qc0 == 0 {
                    // The previous tile's readers of xs passed the barrier after the slot sums.
                    stage(x, sm.xs, b0, bga, n, c, j0 + jc0, fj, t, nt);
                    sync_threads();
                }
                let mut acc = [0f64; BT as usize];
                if active {
                    loop {
                        slab.fma(&mut acc, &v, &rr, sm.xs, bga);
                        if w.rho >= rows {
                            break;
                        }
                        (v, rr) = slab.load(&mut w);
                    }
                }
                let mut bl = 0;
                while bl < BT {
                    *sm.red.add((bl * nt + t) as usize) = acc[bl as usize];
                    bl += 1;
                }
                sync_threads();
                // Fixed-order sum over the slots of each (βl, col).
                let fmca = if mca == mc { fmc } else { FastDiv::new(mca) };
                let mut i = t;
                while i < bga * mca {
                    let (bl, cc) = fmca.divrem(i);
                    let dst = sm.part.add((bl * mq + qc0 + cc) as usize);
                    let src = sm.red.add((bl * nt + cc) as usize);
                    let mut s = *dst;
                    let mut pp = 0;
                    while pp < slots {
                        let mut r = [0f64; UN];
                        let mut u = 0;
                        while u < UN {
                            if pp + (u as u32) < slots {
                                r[u] = *src.add(((pp + u as u32) * mc) as usize);
                            }
                            u += 1;
                        }
                        let mut u = 0;
                        while u < UN {
                            if pp + (u as u32) < slots {
                                s += r[u];
                            }
                            u += 1;
                        }
                        pp += UN as u32;
                    }
                    *dst = s;
                    i += nt;
                }
                sync_threads();
                qc0 += mc;
            }
            jci += 1;
        }
        // This group's block partials: quantity (b0·mq + i) of block g.
        let mut i = t;
        while i < bga * mq {
            *part_ws.add(((b0 * mq + i) * grid + g) as usize) = *sm.part.add(i as usize);
            i += nt;
        }
        // The next group zeroes sm.part only after every thread has published it.
        sync_threads();
        gi += 1;
    }
}

/// Kernel 2's shared memory (bytes), mirrored by the host (`rgk::mhc::pre::mix_smem_bytes`):
/// red mq·S f64 | tot mq f64 | zr n² f64 | ra n² f32 | rb n² f32 | hs n f32 | xs n·jt u16.
struct Smem2 {
    red: *mut f64,
    tot: *mut f64,
    zr: *mut f64,
    ra: *mut f32,
    rb: *mut f32,
    hs: *mut f32,
    xs: *mut u16,
}

#[inline(always)]
unsafe fn layout2(mq: u32, slices: u32, n: u32) -> Smem2 {
    let base = dyn_smem::<u8>();
    let nn = n * n;
    let tot = 8 * (mq * slices) as usize;
    let zr = tot + 8 * mq as usize;
    let ra = zr + 8 * nn as usize;
    let rb = ra + 4 * nn as usize;
    let hs = rb + 4 * nn as usize;
    let xs = hs + 4 * n as usize;
    Smem2 {
        red: base as *mut f64,
        tot: base.add(tot) as *mut f64,
        zr: base.add(zr) as *mut f64,
        ra: base.add(ra) as *mut f32,
        rb: base.add(rb) as *mut f32,
        hs: base.add(hs) as *mut f32,
        xs: base.add(xs) as *mut u16,
    }
}

/// Kernel 2: reduction of kernel 1's partials, coefficients, mixing. Grid `(batch·tiles,1,1)`,
/// block `(T,1,1)`; block `b` handles batch row `β = b / tiles` and the columns
/// `[tile·jt, min((tile+1)·jt, c))`, `tile = b mod tiles`. `grid1` = kernel 1's grid `G`,
/// `slices = 2^ls` with `(m+1)·slices ≤ max(T, m+1)`; `jt_magic`, `jl_magic`: the FastDiv
/// magics of `jt` and of the last tile's width. Requires `n·jt ≤ UN·T`, `jt ≤ 2^16`.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "ptx-kernel" fn mhc_pre_mix(
    x: *const u16,
    bias: *const f32,
    part_ws: *const f64,
    x_res: *mut u16,
    x_layer: *mut u16,
    h_post: *mut f32,
    n: u32,
    c: u32,
    grid1: u32,
    tiles: u32,
    jt: u32,
    jt_magic: u64,
    jl_magic: u64,
    ls: u32,
    alpha_pre: f32,
    alpha_post: f32,
    alpha_res: f32,
    repeat: u32,
    eps: f32,
    inv_sqrt_nc: f64,
) {
    let t = thread_idx_x();
    let nt = block_dim_x();
    let b = block_idx_x();
    let beta = b / tiles;
    let tile = b - beta * tiles;
    let m = n * n + 2 * n;
    let mq = m + 1;
    let nn = n * n;
    let slices = 1u32 << ls;
    let sm = layout2(mq, slices, n);
    let col0 = tile * jt;
    let jta = min_u32(jt, c - col0);
    // Only the last tile can be narrower: its width `c − (tiles−1)·jt` comes with its magic.
    let fj = if jta == jt { FastDiv { d: jt, magic: jt_magic } } else { FastDiv { d: jta, magic: jl_magic } };

    // ---- prologue: x tile loads (DRAM) and the bias, issued before anything waits.
    let total = n * jta; // ≤ UN·T: one batch per thread
    let xrow = x.add((beta * n * c + col0) as usize);
    let mut xv = [0u16; UN];
    let mut u = 0;
    while u < UN {
        let e = t + u as u32 * nt;
        if e < total {
            let (k, jj) = fj.divrem(e);
            xv[u] = *xrow.add((k * c + jj) as usize);
        }
        u += 1;
    }
    let bias_t = if t < m { *bias.add(t as usize) } else { 0.0 };

    // ---- reduction of the G partials of each quantity: thread (q, s) sums g = s, s+S, ...
    let part_b = part_ws.add((beta * mq * grid1) as usize);
    let mut i = t;
    while i < mq * slices {
        let q = i >> ls;
        let s = i & (slices - 1);
        let src = part_b.add((q * grid1) as usize);
        let mut acc = 0f64;
        let mut g0 = s;
        while g0 < grid1 {
            let mut r = [0f64; UP];
            let mut u = 0;
            while u < UP {
                let g = g0 + u as u32 * slices;
                if g < grid1 {
                    r[u] = *src.add(g as usize);
                }
                u += 1;
            }
            let mut u = 0;
            while u < UP {
                if g0 + (u as u32) * slices < grid1 {
                    acc += r[u];
                }
                u += 1;
            }
            g0 += UP as u32 * slices;
        }
        *sm.red.add(i as usize) = acc;
        i += nt;
    }
    // The staged x: xs[k·jta + jj].
    let mut u = 0;
    while u < UN {
        let e = t + u as u32 * nt;
        if e < total {
            *sm.xs.add(e as usize) = xv[u];
        }
        u += 1;
    }
    sync_threads();
    let mut q = t;
    while q < mq {
        let src = sm.red.add((q * slices) as usize);
        let mut s = 0f64;
        let mut k = 0;
        while k < slices {
            s += *src.add(k as usize);
            k += 1;
        }
        *sm.tot.add(q as usize) = s;
        q += nt;
    }
    sync_threads();

    // ---- coefficients: logits z = alpha·h/r + b in f64; H_pre, h_post; residual logits to zr.
    let r = sqrt_rn_f64(*sm.tot.add(m as usize)) * inv_sqrt_nc + 1e-4;
    let mut e = t;
    while e < m {
        let alpha = if e < n {
            alpha_pre
        } else if e < 2 * n {
            alpha_post
        } else {
            alpha_res
        };
        let bq = if e == t { bias_t } else { *bias.add(e as usize) };
        let z = alpha as f64 * *sm.tot.add(e as usize) / r + bq as f64;
        if e < n {
            *sm.hs.add(e as usize) = sigmoid_f64_arg(z);
        } else if e < 2 * n {
            if tile == 0 {
                *h_post.add((beta * n + e - n) as usize) = 2.0 * sigmoid_f64_arg(z);
            }
        } else {
            *sm.zr.add((e - 2 * n) as usize) = z;
        }
        e += nt;
    }
    sync_threads();
    // R = exp(z − row max), one element per thread.
    let mut e = t;
    while e < nn {
        let i = e / n;
        let row = sm.zr.add((i * n) as usize);
        let mut zmax = *row;
        let mut k = 1;
        while k < n {
            let zk = *row.add(k as usize);
            if zk > zmax {
                zmax = zk;
            }
            k += 1;
        }
        *sm.ra.add(e as usize) = exp_le1(*sm.zr.add(e as usize) - zmax);
        e += nt;
    }
    sync_threads();
    // Sinkhorn: rows (ra → rb), then columns (rb → ra); sums in index order.
    let mut rep = 0;
    while rep < repeat {
        let mut e = t;
        while e < nn {
            let i = e / n;
            let row = sm.ra.add((i * n) as usize);
            let mut s = 0f32;
            let mut k = 0;
            while k < n {
                s += *row.add(k as usize);
                k += 1;
            }
            *sm.rb.add(e as usize) = div_rn(*sm.ra.add(e as usize), s + eps);
            e += nt;
        }
        sync_threads();
        let mut e = t;
        while e < nn {
            let i = e / n;
            let col = sm.rb.add((e - i * n) as usize);
            let mut s = 0f32;
            let mut ii = 0;
            while ii < n {
                s += *col.add((ii * n) as usize);
                ii += 1;
            }
            *sm.ra.add(e as usize) = div_rn(*sm.rb.add(e as usize), s + eps);
            e += nt;
        }
        sync_threads();
        rep += 1;
    }

    // ---- mixing of the staged tile.
    let mut jj = t;
    while jj < jta {
        let xb = sm.xs.add(jj as usize);
        let col = col0 + jj;
        let mut s = 0f32;
        let mut k = 0;
        while k < n {
            s = fma(*sm.hs.add(k as usize), bf16_to_f32(*xb.add((k * jta) as usize)), s);
            k += 1;
        }
        *x_layer.add((beta * c + col) as usize) = f32_to_bf16(s);
        let mut i = 0;
        while i < n {
            let rrow = sm.ra.add((i * n) as usize);
            let mut s = 0f32;
            let mut k = 0;
            while k < n {
                s = fma(*rrow.add(k as usize), bf16_to_f32(*xb.add((k * jta) as usize)), s);
                k += 1;
            }
            *x_res.add(((beta * n + i) * c + col) as usize) = f32_to_bf16(s);
            i += 1;
        }
        jj += nt;
    }
}

// ================================================================ one launch: a cluster

/// [`mhc_pre_fused`]'s shared memory (bytes), mirrored by the host
/// (`rgk::mhc::pre::fused_smem_bytes`): phis n·cw·m f32 (16-byte padded) | red BT·T f64 |
/// part BT·mq f64 | tot BT·mq f64 | zr BT·n² f64 | xs BT·n·cw f64 | ra BT·n² f32 |
/// rb BT·n² f32 | hs BT·n f32 | bs m f32.
struct SmemF {
    phis: *mut f32,
    red: *mut f64,
    part: *mut f64,
    tot: *mut f64,
    zr: *mut f64,
    xs: *mut f64,
    ra: *mut f32,
    rb: *mut f32,
    hs: *mut f32,
    bs: *mut f32,
}

#[inline(always)]
unsafe fn layout_fused(nt: u32, m: u32, n: u32, cw: u32) -> SmemF {
    let base = dyn_smem::<u8>();
    let bt = BT as usize;
    let nn = (n * n) as usize;
    let mq = (m + 1) as usize;
    let rows = (n * cw) as usize;
    let red = (4 * rows * m as usize).next_multiple_of(16);
    let part = red + 8 * bt * nt as usize;
    let tot = part + 8 * bt * mq;
    let zr = tot + 8 * bt * mq;
    let xs = zr + 8 * bt * nn;
    let ra = xs + 8 * bt * rows;
    let rb = ra + 4 * bt * nn;
    let hs = rb + 4 * bt * nn;
    let bs = hs + 4 * bt * n as usize;
    SmemF {
        phis: base as *mut f32,
        red: base.add(red) as *mut f64,
        part: base.add(part) as *mut f64,
        tot: base.add(tot) as *mut f64,
        zr: base.add(zr) as *mut f64,
        xs: base.add(xs) as *mut f64,
        ra: base.add(ra) as *mut f32,
        rb: base.add(rb) as *mut f32,
        hs: base.add(hs) as *mut f32,
        bs: base.add(bs) as *mut f32,
    }
}

crate::entry_directive!("mhc_pre_fused", ".maxntid 1024, 1, 1");

/// MHCPreFwd in one launch of thread-block clusters (SPEC.md §2). Grid `(cs, groups, 1)`,
/// cluster `(cs, 1, 1)`, block `(T, 1, 1)` with `m+1 ≤ T ≤ 1024`, `m = n²+2n`. Cluster `y`
/// owns the batch rows `[y·bpc, min((y+1)·bpc, batch))`, processed in groups of ≤ [`BT`];
/// block (rank) `ρ` of a cluster owns the channel columns `[ρ·cw, min((ρ+1)·cw, c))` of every
/// stream, i.e. the phi rows `k·c + j` of those columns (n contiguous segments).
///
/// The block copies its phi rows into shared memory with `cp.async` (no registers hold them;
/// 16-byte copies where a segment is 16-byte aligned) while it stages its x columns of the
/// group's rows as f64. Thread `(p, q)` (`q ≤ m`) walks slab rows `p, p+P, …` at column `q`
/// with exact f64 FMAs (column `q = m` accumulates x² for r); the P slot partials are summed in
/// a fixed order (4 interleaved slices + a butterfly) into the block partial; a cluster barrier
/// publishes the partials; every block sums the cluster's partials in rank order through
/// distributed shared memory (so every block holds bitwise the same totals); one warp per batch
/// row computes r, the logits, H_pre, h_post (rank 0 writes it) and the Sinkhorn of R; the
/// block mixes its staged columns: `x_res = q(Σ_k R[i,k]·x_k)`, `x_layer = q(Σ_k H_pre[k]·x_k)`
/// (f32 FMAs in k order). No global workspace, atomics or polling: the only inter-block
/// synchronisation is the hardware cluster barrier.
///
/// Requires: `cw·(cs−1) < c ≤ cw·cs`, `cs ≤ 16`, `BT·n·cw ≤ 2^16`, dynamic shared memory per
/// [`layout_fused`], `n·c·m < 2^31`, `batch·n·c < 2^31`; `cw_magic` is the `FastDiv` magic
/// of `cw`.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "ptx-kernel" fn mhc_pre_fused(
    phi: *const f32,
    x: *const u16,
    bias: *const f32,
    x_res: *mut u16,
    x_layer: *mut u16,
    h_post: *mut f32,
    batch: u32,
    n: u32,
    c: u32,
    cw: u32,
    cw_magic: u64,
    bpc: u32,
    alpha_pre: f32,
    alpha_post: f32,
    alpha_res: f32,
    repeat: u32,
    eps: f32,
    inv_sqrt_nc: f64,
) {
    let t = thread_idx_x();
    let nt = block_dim_x();
    let rank = cluster_ctarank();
    let cs = cluster_nctarank();
    let m = n * n + 2 * n;
    let mq = m + 1;
    let nn = n * n;
    let sm = layout_fused(nt, m, n, cw);
    let j0 = rank * cw;
    let cwa = min_u32(cw, c - j0);
    let fj = if cwa == cw { FastDiv { d: cw, magic: cw_magic } } else { FastDiv::new(cwa) };
    let rows = n * cwa;
    let b_lo = block_idx_y() * bpc;
    let b_hi = min_u32(batch, b_lo + bpc);

    // ---- phi slab → shared memory, asynchronously: segment k = phi rows k·c + j0 .. + cwa.
    let seg = cwa * m; // floats per segment
    let mut k = 0;
    while k < n {
        let src = phi.add(((k * c + j0) * m) as usize) as *const u8;
        let dst = sm.phis.add((k * seg) as usize) as *mut u8;
        if (src as u64 | dst as u64 | (4 * seg) as u64) & 15 == 0 {
            let mut i = t;
            while i < seg / 4 {
                cp_async_16(dst.add(16 * i as usize), src.add(16 * i as usize));
                i += nt;
            }
        } else {
            let mut i = t;
            while i < seg {
                cp_async_4(dst.add(4 * i as usize), src.add(4 * i as usize));
                i += nt;
            }
        }
        k += 1;
    }
    if t < m {
        *sm.bs.add(t as usize) = *bias.add(t as usize);
    }
    // Thread (p, q) of the walk: P = ⌊T/(m+1)⌋ slots.
    let slots = nt / mq;
    let p = t / mq;
    let q = t - p * mq;
    let active = p < slots;
    let is_sq = q == m;

    let mut b0 = b_lo;
    while b0 < b_hi {
        let bga = min_u32(BT, b_hi - b0);
        // ---- stage x[b0+β, k·c + j0 + jj] → xs[β·rows + k·cwa + jj] as f64 (loads first).
        let total = bga * rows;
        let xg = x.add((b0 * n * c + j0) as usize);
        let mut e = t;
        while e < total {
            let mut xv = [0u16; 8];
            let mut w = 0;
            while w < 8 {
                let e2 = e + w as u32 * nt;
                if e2 < total {
                    let (row, j) = fj.divrem(e2);
                    xv[w] = *xg.add((row * c + j) as usize);
                }
                w += 1;
            }
            let mut w = 0;
            while w < 8 {
                let e2 = e + w as u32 * nt;
                if e2 < total {
                    *sm.xs.add(e2 as usize) = bf16_to_f32(xv[w]) as f64;
                }
                w += 1;
            }
            e += 8 * nt;
        }
        cp_async_wait_all();
        sync_threads();

        // ---- exact f64 FMAs over this thread's slab rows (phi and x from shared memory).
        if active {
            let mut acc = [0f64; BT as usize];
            let mut rho = p;
            while rho < rows {
                let xr = sm.xs.add(rho as usize);
                let x0 = *xr;
                let w = if is_sq { x0 } else { *sm.phis.add((rho * m + q) as usize) as f64 };
                acc[0] = fma_f64(w, x0, acc[0]);
                if bga > 1 {
                    let x1 = *xr.add(rows as usize);
                    acc[1] = fma_f64(if is_sq { x1 } else { w }, x1, acc[1]);
                }
                if bga > 2 {
                    let x2 = *xr.add(2 * rows as usize);
                    acc[2] = fma_f64(if is_sq { x2 } else { w }, x2, acc[2]);
                }
                if bga > 3 {
                    let x3 = *xr.add(3 * rows as usize);
                    acc[3] = fma_f64(if is_sq { x3 } else { w }, x3, acc[3]);
                }
                rho += slots;
            }
            let mut bl = 0;
            while bl < BT {
                *sm.red.add((bl * nt + t) as usize) = acc[bl as usize];
                bl += 1;
            }
        }
        sync_threads();
        // ---- block partial of item (β, q): 4 slices s sum slots p ≡ s (mod 4) in order, then
        // (s0 + s1) + (s2 + s3) by butterfly. Every thread runs the same number of rounds.
        let items = bga * mq;
        let mut i0 = 0;
        while i0 < 4 * items {
            let i = i0 + t;
            let mut s = 0f64;
            if i < 4 * items {
                let item = i >> 2;
                let bl = item / mq;
                let qq = item - bl * mq;
                let src = sm.red.add((bl * nt + qq) as usize);
                let mut pp = i & 3;
                while pp < slots {
                    s += *src.add((pp * mq) as usize);
                    pp += 4;
                }
            }
            s += shfl_xor_f64(s, 1);
            s += shfl_xor_f64(s, 2);
            if i < 4 * items && i & 3 == 0 {
                *sm.part.add((i >> 2) as usize) = s;
            }
            i0 += nt;
        }
        // ---- the cluster's partials, summed in rank order by every block.
        cluster_arrive();
        cluster_wait();
        let mut i = t;
        while i < items {
            // Eight remote loads in flight per round (cs ≤ 16: two rounds at most).
            let pi = sm.part.add(i as usize) as *const f64;
            let mut tot = 0f64;
            let mut r0 = 0;
            while r0 < cs {
                let mut r = [0f64; 8];
                let mut u = 0;
                while u < 8 {
                    let rr = r0 + u as u32;
                    let val = *mapa(pi, if rr < cs { rr } else { 0 });
                    r[u] = if rr < cs { val } else { 0.0 };
                    u += 1;
                }
                let mut u = 0;
                while u < 8 {
                    if r0 + (u as u32) < cs {
                        tot += r[u];
                    }
                    u += 1;
                }
                r0 += 8;
            }
            *sm.tot.add(i as usize) = tot;
            i += nt;
        }
        // Done reading the other blocks' partials (the matching wait precedes the next write).
        cluster_arrive();
        sync_threads();

        // ---- coefficients: warp β handles batch row b0 + β.
        let warp = t >> 5;
        let lane = t & 31;
        let mut bl = warp;
        while bl < bga {
            let tot = sm.tot.add((bl * mq) as usize);
            let zr = sm.zr.add((bl * nn) as usize);
            let ra = sm.ra.add((bl * nn) as usize);
            let rb = sm.rb.add((bl * nn) as usize);
            let hs = sm.hs.add((bl * n) as usize);
            let r = sqrt_rn_f64(*tot.add(m as usize)) * inv_sqrt_nc + 1e-4;
            let mut e = lane;
            while e < m {
                let alpha = if e < n {
                    alpha_pre
                } else if e < 2 * n {
                    alpha_post
                } else {
                    alpha_res
                };
                let z = alpha as f64 * *tot.add(e as usize) / r + *sm.bs.add(e as usize) as f64;
                if e < n {
                    *hs.add(e as usize) = sigmoid_f64_arg(z);
                } else if e < 2 * n {
                    if rank == 0 {
                        *h_post.add(((b0 + bl) * n + e - n) as usize) = 2.0 * sigmoid_f64_arg(z);
                    }
                } else {
                    *zr.add((e - 2 * n) as usize) = z;
                }
                e += 32;
            }
            sync_warp();
            let mut e = lane;
            while e < nn {
                let i = e / n;
                let row = zr.add((i * n) as usize);
                let mut zmax = *row;
                let mut k = 1;
                while k < n {
                    let zk = *row.add(k as usize);
                    if zk > zmax {
                        zmax = zk;
                    }
                    k += 1;
                }
                *ra.add(e as usize) = exp_le1(*zr.add(e as usize) - zmax);
                e += 32;
            }
            sync_warp();
            let mut rep = 0;
            while rep < repeat {
                let mut e = lane;
                while e < nn {
                    let i = e / n;
                    let row = ra.add((i * n) as usize);
                    let mut s = 0f32;
                    let mut k = 0;
                    while k < n {
                        s += *row.add(k as usize);
                        k += 1;
                    }
                    *rb.add(e as usize) = div_rn(*ra.add(e as usize), s + eps);
                    e += 32;
                }
                sync_warp();
                let mut e = lane;
                while e < nn {
                    let i = e / n;
                    let col = rb.add((e - i * n) as usize);
                    let mut s = 0f32;
                    let mut ii = 0;
                    while ii < n {
                        s += *col.add((ii * n) as usize);
                        ii += 1;
                    }
                    *ra.add(e as usize) = div_rn(*rb.add(e as usize), s + eps);
                    e += 32;
                }
                sync_warp();
                rep += 1;
            }
            bl += nt >> 5;
        }
        sync_threads();

        // ---- mixing of the staged columns: item (β, jj).
        let mut it = t;
        while it < bga * cwa {
            let (bl, jj) = fj.divrem(it);
            let xb = sm.xs.add((bl * rows + jj) as usize);
            let hs = sm.hs.add((bl * n) as usize);
            let ra = sm.ra.add((bl * nn) as usize);
            let col = j0 + jj;
            let b = b0 + bl;
            let mut s = 0f32;
            let mut k = 0;
            while k < n {
                s = fma(*hs.add(k as usize), *xb.add((k * cwa) as usize) as f32, s);
                k += 1;
            }
            *x_layer.add((b * c + col) as usize) = f32_to_bf16(s);
            let mut i = 0;
            while i < n {
                let rrow = ra.add((i * n) as usize);
                let mut s = 0f32;
                let mut k = 0;
                while k < n {
                    s = fma(*rrow.add(k as usize), *xb.add((k * cwa) as usize) as f32, s);
                    k += 1;
                }
                *x_res.add(((b * n + i) * c + col) as usize) = f32_to_bf16(s);
                i += 1;
            }
            it += nt;
        }
        // The other blocks are done with this block's partials; local readers of xs/hs/ra too.
        cluster_wait();
        sync_threads();
        b0 += bga;
    }
}
