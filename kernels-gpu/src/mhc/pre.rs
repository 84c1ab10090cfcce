//! MHCPreFwd (SPEC.md §2) in one launch: split-K logits, grid-wide reduction through tagged
//! workspace words, per-block coefficients (r, H_pre, h_post, Sinkhorn R), then the mixing.
//!
//! Grid: `G ≤ #SMs` blocks, all co-resident (the host launches cooperatively). Block `g` owns
//! the channel columns `j ∈ [g·cols, min((g+1)·cols, c))` of every stream `k` and every batch row.
//!
//! 1. **Split-K.** For each group of ≤ [`BT`] batch rows, the block stages `x[β, k·c + j]` of its
//!    columns in shared memory (bf16) and reads the matching rows `k·c + j` of `phi` (n segments
//!    of `cols·m` contiguous floats, `m = n²+2n`). Thread `(slot p, column col)` walks rows
//!    `ρ = p, p + P, …` of the slab at a fixed `col` (coalesced), accumulating `phi·x` exactly in
//!    f64 (an f32·bf16 product is exact in f64); the extra column `col = m` accumulates `x²`
//!    (for r). The `P` slot partials are summed in shared memory in a fixed order.
//! 2. **Tagged exchange.** The block partial of quantity `q = β·(m+1) + col` goes to
//!    `ws_part[q·G + g]` as one 64-bit word: the f64 with its low [`TAG_BITS`] mantissa bits
//!    replaced by the call's tag (derived from the epoch word `ws[0]`). One warp per `q` (spread
//!    over all blocks) polls the `G` words until every tag is current, sums them in `g` order in
//!    f64 and writes the tagged total to `ws_tot[q]`. Every block polls the totals it needs. No
//!    atomics, no fences: a word is valid exactly when its tag is current, and a 64-bit store is
//!    single-copy atomic. Block 0 advances the epoch at its very end (after it has seen every
//!    total, which every block's epoch read precedes through data dependencies), so the next call
//!    uses a new tag and the workspace needs no reset.
//! 3. **Coefficients** (every block, redundantly and identically): `r` and the logits `z` in f64,
//!    exponentials as `ex2.approx` of the f64-reduced fraction times an exact power of two
//!    (≈ 2^-22 relative for any argument), sigmoid and Sinkhorn in f32 (`div.rn`). For
//!    n ∈ {1, 2, 4} one warp per batch row does it all in registers (lane = quantity, Sinkhorn
//!    sums by butterflies, one barrier); otherwise a block-wide path through shared memory.
//! 4. **Mixing** from the staged x (no second read of x when one tile holds the block's columns):
//!    `x_res = q(Σ_k R[i,k]·x_k)`, `x_layer = q(Σ_k H_pre[k]·x_k)`, f32 FMAs in k order.
//!
//! Every sum has a fixed order, so the outputs are bitwise reproducible.
use crate::prim::*;

/// Batch rows per group (f64 accumulators per thread).
pub const BT: u32 = 4;
const _: () = assert!(BT == 4, "Slab::fma is written out for four rows");
/// Loads in flight per thread in the split-K walk and the staging.
const UN: usize = 8;
/// Partial words per lane in a reduction: the grid is at most `32·GL` blocks.
pub const GL: u32 = 8;
/// Low mantissa bits of an exchanged f64 that carry the call's tag.
pub const TAG_BITS: u32 = 20;
const TAG_MASK: u64 = (1 << TAG_BITS) - 1;
/// Polls of one word (or one warp's words) before the kernel traps instead of hanging (a broken
/// co-residency or workspace would otherwise spin forever); ≈ 30 s of polling.
const SPIN_LIMIT: u32 = 1 << 26;

/// Traps once a poll loop has spun [`SPIN_LIMIT`] times.
#[inline(always)]
fn spin_guard(spins: &mut u32) {
    *spins += 1;
    if *spins > SPIN_LIMIT {
        trap();
    }
}

/// Workspace words before the partials (the epoch word, alone in its 128-byte line).
pub const WS_HEADER: u32 = 16;

#[inline(always)]
fn tagged(v: f64, tag: u32) -> u64 {
    (v.to_bits() & !TAG_MASK) | tag as u64
}
#[inline(always)]
fn untag(w: u64) -> f64 {
    f64::from_bits(w & !TAG_MASK)
}
#[inline(always)]
fn tag_of(w: u64) -> u32 {
    (w & TAG_MASK) as u32
}
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

/// The call's tag, never 0 (a zeroed workspace holds tag 0), different for consecutive epochs.
#[inline(always)]
fn tag_of_epoch(e: u32) -> u32 {
    e % ((1 << TAG_BITS) - 1) + 1
}
#[inline(always)]
fn min_u32(a: u32, b: u32) -> u32 {
    if a < b {
        a
    } else {
        b
    }
}

/// Shared-memory layout (bytes), mirrored by the host (`rgk::mhc::pre::smem_bytes`):
/// misc 16 | red BT·T f64 | part bg·mq f64 | tot bg·mq f64 | rs bg·n² f32 | hs bg·n f32 |
/// bs m f32 | xs bg·n·jc u16.
struct Smem {
    misc: *mut u32,
    red: *mut f64,
    part: *mut f64,
    tot: *mut f64,
    rs: *mut f32,
    hs: *mut f32,
    bs: *mut f32,
    xs: *mut u16,
}

#[inline(always)]
unsafe fn layout(nt: u32, bg: u32, mq: u32, n: u32) -> Smem {
    let base = dyn_smem::<u8>();
    let red = 16usize;
    let part = red + 8 * (BT * nt) as usize;
    let tot = part + 8 * (bg * mq) as usize;
    let rs = tot + 8 * (bg * mq) as usize;
    let hs = rs + 4 * (bg * n * n) as usize;
    let bs = hs + 4 * (bg * n) as usize;
    let xs = bs + 4 * (mq - 1) as usize;
    Smem {
        misc: base as *mut u32,
        red: base.add(red) as *mut f64,
        part: base.add(part) as *mut f64,
        tot: base.add(tot) as *mut f64,
        rs: base.add(rs) as *mut f32,
        hs: base.add(hs) as *mut f32,
        bs: base.add(bs) as *mut f32,
        xs: base.add(xs) as *mut u16,
    }
}

/// Butterfly exchange of an f64 (two 32-bit shuffles).
#[inline(always)]
fn shfl_xor_f64(v: f64, m: u32) -> f64 {
    let b = v.to_bits();
    let lo = shfl_xor_u32(b as u32, m);
    let hi = shfl_xor_u32((b >> 32) as u32, m);
    f64::from_bits(((hi as u64) << 32) | lo as u64)
}

/// `shfl.sync.idx` of an f64 (two 32-bit shuffles).
#[inline(always)]
fn shfl_idx_f64(v: f64, src: u32) -> f64 {
    let b = v.to_bits();
    let lo = shfl_idx_f32(f32::from_bits(b as u32), src).to_bits();
    let hi = shfl_idx_f32(f32::from_bits((b >> 32) as u32), src).to_bits();
    f64::from_bits(((hi as u64) << 32) | lo as u64)
}

/// Sum over the warp, fixed butterfly order; every lane gets the same bits.
#[inline(always)]
fn warp_sum_f64(mut v: f64) -> f64 {
    let mut m = 16;
    while m > 0 {
        v += shfl_xor_f64(v, m);
        m >>= 1;
    }
    v
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

/// MHCPreFwd, one cooperative launch. Grid `(G,1,1)`, `G = ceil(c/cols) ≤ 32·GL`, all blocks
/// co-resident; block `(T,1,1)` with `T` a multiple of 32; dynamic shared memory per [`layout`].
/// `ws`: `WS_HEADER + Q·G + Q` u64 words (`Q = batch·(m+1)`), zeroed before first use, then left to this
/// op. Requires `n·c·m < 2^31`, `batch·n·c < 2^31`, `bg ≤ BT`.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "ptx-kernel" fn mhc_pre_fwd(
    phi: *const f32,
    x: *const u16,
    bias: *const f32,
    x_res: *mut u16,
    x_layer: *mut u16,
    h_post: *mut f32,
    ws: *mut u64,
    batch: u32,
    n: u32,
    c: u32,
    cols: u32,
    jc: u32,
    bg: u32,
    alpha_pre: f32,
    alpha_post: f32,
    alpha_res: f32,
    repeat: u32,
    eps: f32,
    inv_sqrt_nc: f64,
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
    let nn = n * n;
    let sm = layout(nt, bg, mq, n);
    let j0 = g * cols;
    let jb = min_u32(cols, c - j0);
    let q_all = batch * mq;
    let part_ws = ws.add(WS_HEADER as usize);
    let tot_ws = part_ws.add((q_all * grid) as usize);
    let warps = nt / 32;
    let warp = t / 32;
    let lane = t & 31;

    // ---- start: every global read that is not on a dependency chain is issued first.
    let epoch = if t == 0 { ld_relaxed_u64(ws) } else { 0 };
    let bias0 = if t < m { *bias.add(t as usize) } else { 0.0 };
    // Bring the words this block will poll into L2 now (the flush evicted them).
    {
        let mut q = warp * grid + g;
        while q < q_all {
            if lane * 16 < grid {
                prefetch_l2(part_ws.add((q * grid + lane * 16) as usize));
            }
            q += warps * grid;
        }
        let mut i = t * 16;
        while i < q_all {
            prefetch_l2(tot_ws.add(i as usize));
            i += nt * 16;
        }
    }

    let njc = if jb == cols { njc_full } else { jb.div_ceil(jc) };
    let single_tile = ngroups == 1 && njc == 1;
    // Grid-uniform constants from the host: mc = min(m+1, T) columns per q-chunk, and the
    // magics of mc and jc (divisions cost ~50 cycles each before the first phi load).
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
                    stage(x, sm.xs, b0, bga, n, c, j0 + jc0, fj, t, nt);
                    if gi == 0 && jci == 0 {
                        if t == 0 {
                            let e = epoch as u32;
                            // Only stored here: nothing before the first barrier waits on it.
                            *sm.misc = e;
                        }
                        if t < m {
                            *sm.bs.add(t as usize) = bias0;
                        }
                        let mut i = t + nt;
                        while i < m {
                            *sm.bs.add(i as usize) = *bias.add(i as usize);
                            i += nt;
                        }
                    }
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
        // Publish this group's block partials.
        let tag = tag_of_epoch(*sm.misc);
        let mut i = t;
        while i < bga * mq {
            st_relaxed_u64(part_ws.add(((b0 * mq + i) * grid + g) as usize), tagged(*sm.part.add(i as usize), tag));
            i += nt;
        }
        sync_threads();
        gi += 1;
    }

    // ---- reduction duties: warp (warp, g) sums quantity q = warp·G + g (+ multiples of warps·G).
    let tag = tag_of_epoch(*sm.misc);
    let mut q = warp * grid + g;
    while q < q_all {
        let base = part_ws.add((q * grid) as usize);
        let mut v = [0f64; GL as usize];
        let mut spins = 0;
        loop {
            let mut ok = true;
            let mut i = 0;
            while i < GL {
                let gg = lane + 32 * i;
                if gg < grid {
                    let w = ld_relaxed_u64(base.add(gg as usize));
                    ok &= tag_of(w) == tag;
                    v[i as usize] = untag(w);
                }
                i += 1;
            }
            if vote_all(ok) {
                break;
            }
            spin_guard(&mut spins);
        }
        let mut s = 0f64;
        let mut i = 0;
        while i < GL as usize {
            s += v[i];
            i += 1;
        }
        let s = warp_sum_f64(s);
        if lane == 0 {
            st_relaxed_u64(tot_ws.add(q as usize), tagged(s, tag));
        }
        q += warps * grid;
    }

    // ---- coefficients and mixing, per batch group.
    // Warp-level coefficients when a row's n²+2n+1 quantities fit one warp with power-of-two
    // lane groups (n ∈ {1, 2, 4}) and the block has a warp per batch row of the group.
    let fast = (n == 1 || n == 2 || n == 4) && bg <= warps;
    let mut gi = 0;
    while gi < ngroups {
        let b0 = gi * bg;
        let bga = min_u32(bg, batch - b0);
        if fast {
            // One warp per batch row: lane ↔ quantity (R entries at lanes i·n + k, then pre, post,
            // Σx²), totals polled straight into registers, Sinkhorn sums by butterflies within
            // aligned lane groups (rows: xor 1..n/2, columns: xor n..n²/2). Every lane runs
            // every shuffle (full-warp masks); only the owners store.
            if warp < bga {
                let bl = warp;
                let beta = b0 + bl;
                let l = lane;
                let q = if l < nn {
                    2 * n + l
                } else if l < nn + 2 * n {
                    l - nn
                } else {
                    m
                };
                let mut v = 0f64;
                if l <= nn + 2 * n {
                    let src = tot_ws.add((beta * mq + q) as usize);
                    let mut w = ld_relaxed_u64(src);
                    let mut spins = 0;
                    while tag_of(w) != tag {
                        spin_guard(&mut spins);
                        w = ld_relaxed_u64(src);
                    }
                    v = untag(w);
                }
                let sq = shfl_idx_f64(v, nn + 2 * n);
                let r = sqrt_rn_f64(sq) * inv_sqrt_nc + 1e-4;
                let alpha = if l < nn {
                    alpha_res
                } else if l < nn + n {
                    alpha_pre
                } else {
                    alpha_post
                };
                let bq = if q < m { *sm.bs.add(q as usize) } else { 0.0 };
                let z = alpha as f64 * v / r + bq as f64;
                // Residual: row max, exp, Sinkhorn.
                let mut zmax = z;
                let mut sh = 1;
                while sh < n {
                    let o = shfl_xor_f64(zmax, sh);
                    if o > zmax {
                        zmax = o;
                    }
                    sh <<= 1;
                }
                let mut e = exp_le1(z - zmax);
                let mut rep = 0;
                while rep < repeat {
                    let mut s = e;
                    let mut sh = 1;
                    while sh < n {
                        s += shfl_xor_f32(s, sh);
                        sh <<= 1;
                    }
                    e = div_rn(e, s + eps);
                    let mut s = e;
                    let mut sh = n;
                    while sh < nn {
                        s += shfl_xor_f32(s, sh);
                        sh <<= 1;
                    }
                    e = div_rn(e, s + eps);
                    rep += 1;
                }
                let sig = sigmoid_f64_arg(z);
                if l < nn {
                    *sm.rs.add((bl * nn + l) as usize) = e;
                } else if l < nn + n {
                    *sm.hs.add((bl * n + l - nn) as usize) = sig;
                } else if l < nn + 2 * n && g == 0 {
                    *h_post.add((beta * n + l - nn - n) as usize) = 2.0 * sig;
                }
            }
            sync_threads();
        } else {
            let qg = bga * mq;
            let mut i = t;
            while i < qg {
                let src = tot_ws.add((b0 * mq + i) as usize);
                let mut w = ld_relaxed_u64(src);
                let mut spins = 0;
                while tag_of(w) != tag {
                    spin_guard(&mut spins);
                    w = ld_relaxed_u64(src);
                }
                *sm.tot.add(i as usize) = untag(w);
                i += nt;
            }
            sync_threads();
            // Logits z = alpha·h/r + b (f64); H_pre, h_post; residual logits stay in `tot`.
            let mut i = t;
            while i < bga * m {
                let bl = i / m;
                let col = i - bl * m;
                let row = sm.tot.add((bl * mq) as usize);
                let r = sqrt_rn_f64(*row.add(m as usize)) * inv_sqrt_nc + 1e-4;
                let alpha = if col < n {
                    alpha_pre
                } else if col < 2 * n {
                    alpha_post
                } else {
                    alpha_res
                };
                let z = alpha as f64 * *row.add(col as usize) / r + *sm.bs.add(col as usize) as f64;
                if col < n {
                    *sm.hs.add((bl * n + col) as usize) = sigmoid_f64_arg(z);
                } else if col < 2 * n {
                    if g == 0 {
                        *h_post.add(((b0 + bl) * n + col - n) as usize) = 2.0 * sigmoid_f64_arg(z);
                    }
                } else {
                    *row.add(col as usize) = z;
                }
                i += nt;
            }
            sync_threads();
            // R = exp(z − row max), fused with the first row normalisation.
            let mut i = t;
            while i < bga * n {
                let bl = i / n;
                let ii = i - bl * n;
                let z = sm.tot.add((bl * mq + 2 * n + ii * n) as usize);
                let mut zmax = *z;
                let mut k = 1;
                while k < n {
                    let zk = *z.add(k as usize);
                    if zk > zmax {
                        zmax = zk;
                    }
                    k += 1;
                }
                let row = sm.rs.add((bl * nn + ii * n) as usize);
                let mut s = 0f32;
                let mut k = 0;
                while k < n {
                    let e = exp_le1(*z.add(k as usize) - zmax);
                    *row.add(k as usize) = e;
                    s += e;
                    k += 1;
                }
                if repeat > 0 {
                    let d = s + eps;
                    let mut k = 0;
                    while k < n {
                        *row.add(k as usize) = div_rn(*row.add(k as usize), d);
                        k += 1;
                    }
                }
                i += nt;
            }
            sync_threads();
            let mut rep = 0;
            while rep < repeat {
                if rep > 0 {
                    let mut i = t;
                    while i < bga * n {
                        let row = sm.rs.add((i * n) as usize); // (bl·n + ii)·n
                        let mut s = 0f32;
                        let mut k = 0;
                        while k < n {
                            s += *row.add(k as usize);
                            k += 1;
                        }
                        let d = s + eps;
                        let mut k = 0;
                        while k < n {
                            *row.add(k as usize) = div_rn(*row.add(k as usize), d);
                            k += 1;
                        }
                        i += nt;
                    }
                    sync_threads();
                }
                let mut i = t;
                while i < bga * n {
                    let bl = i / n;
                    let kk = i - bl * n;
                    let colp = sm.rs.add((bl * nn + kk) as usize);
                    let mut s = 0f32;
                    let mut ii = 0;
                    while ii < n {
                        s += *colp.add((ii * n) as usize);
                        ii += 1;
                    }
                    let d = s + eps;
                    let mut ii = 0;
                    while ii < n {
                        let e = colp.add((ii * n) as usize);
                        *e = div_rn(*e, d);
                        ii += 1;
                    }
                    i += nt;
                }
                sync_threads();
                rep += 1;
            }
        }
        // Mixing.
        let mut jci = 0;
        while jci < njc {
            let jc0 = jci * jc;
            let jca = min_u32(jc, jb - jc0);
            let fj = if jca == jc { fjc } else { FastDiv::new(jca) };
            if !single_tile {
                stage(x, sm.xs, b0, bga, n, c, j0 + jc0, fj, t, nt);
                sync_threads();
            }
            let mut i = t;
            while i < bga * jca {
                let (bl, jj) = fj.divrem(i);
                let xb = sm.xs.add((bl * n * jca + jj) as usize);
                let col = j0 + jc0 + jj;
                let beta = b0 + bl;
                let h = sm.hs.add((bl * n) as usize);
                let mut s = 0f32;
                let mut k = 0;
                while k < n {
                    s = fma(*h.add(k as usize), bf16_to_f32(*xb.add((k * jca) as usize)), s);
                    k += 1;
                }
                *x_layer.add((beta * c + col) as usize) = f32_to_bf16(s);
                let mut ii = 0;
                while ii < n {
                    let r = sm.rs.add((bl * nn + ii * n) as usize);
                    let mut s = 0f32;
                    let mut k = 0;
                    while k < n {
                        s = fma(*r.add(k as usize), bf16_to_f32(*xb.add((k * jca) as usize)), s);
                        k += 1;
                    }
                    *x_res.add(((beta * n + ii) * c + col) as usize) = f32_to_bf16(s);
                    ii += 1;
                }
                i += nt;
            }
            if !single_tile {
                sync_threads();
            }
            jci += 1;
        }
        sync_threads();
        gi += 1;
    }
    // Every block's epoch read precedes (by data dependence) a partial that block 0 has seen
    // summed into a total: advancing the epoch now cannot race with any read of it.
    if g == 0 && t == 0 {
        st_relaxed_u64(ws, (*sm.misc).wrapping_add(1) as u64);
    }
}
