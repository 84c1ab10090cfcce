//! MHCPreFwd (docs/ops.md §2) in two ordinary launches on one stream: split-K partial logits
//! (kernel 1), then reduction, coefficients and mixing (kernel 2, a programmatic dependent
//! launch that waits in `griddepcontrol.wait`). No inter-block communication inside a launch —
//! no fences, polling or co-residency assumptions. Three pairs, chosen by the host planner
//! (`rgk::mhc::PreClass`):
//! - n ≤ 4 (the usual case): [`mhc_pre_partial_slab_fixed_point`] + [`mhc_pre_mix_fixed_point`]:
//!   kernel 1 stages a phi slab and sums its block partials by f32 FMAs, then adds them as
//!   integer fixed-point limbs with
//!   `red.global.add` into one accumulator per logit (integer addition is associative: the
//!   result does not depend on the order); one row block per batch row (after the partial
//!   blocks) sums the row's Σx² and stores its logit scales `alpha/r`, so kernel 2 has no pass
//!   over x before its wait; the workspace keeps two accumulator halves and an epoch word
//!   between calls;
//! - n ≤ 4 with a batch beyond kernel 2's grid: [`mhc_pre_partial_slab`] (partials stored) +
//!   [`mhc_pre_mix_small_n`]; where the phi slab does not fit shared memory,
//!   [`mhc_pre_partial_fma`] + [`mhc_pre_mix_small_n`];
//! - n > 4: [`mhc_pre_partial_fma`] + [`mhc_pre_mix`] (below), whose workspace carries no state.
//!
//! **Kernel 1, [`mhc_pre_partial_fma`]** (grid `G ≤ #SMs`): split-K. Block `g` owns the channel
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
use super::post::{fma8, post_elem};
use crate::prim::*;
use kernel_abi::{
    PostPreMixArgs, PostPrePartialArgs, PreMixArgs, PreMixFixedPointArgs, PrePartialFmaArgs, PrePartialSlabArgs,
};

/// The PTX entries: one per row of `kernel_abi::mhc_pre_kernels!` (the list the host names
/// its kernels from).
macro_rules! pre_entries {
    ($($name:ident: $kind:ident, $body:ident, $entry:ident;)*) => {
        $(kernel_abi::$entry!($name, a => { $body(a) });)*
    };
}
kernel_abi::mhc_pre_kernels!(pre_entries);

/// Batch rows per group in kernel 1 (f64 accumulators per thread).
pub use kernel_abi::mhc::BT;
const _: () = assert!(BT == 4, "Slab::fma is written out for four rows");
/// Loads in flight per thread in kernel 1's split-K walk and staging, and the x elements per
/// thread of kernel 2's tile (the host sizes tiles so that `n·jt ≤ UN·block`).
pub const UN: usize = kernel_abi::mhc::UN as usize;
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

/// Where the slab kernel 1 and the fixed-point kernel 2 read x: the stored `x`
/// (MHCPreFwd), or, in the fused post→pre op (MHCPostPreFwd), the post half computed on the fly
/// from its inputs — `x[β, k·c + j] = q(h_post_in[β·n + k]·x_layer_out[β·c + j] + x[β, k·c + j])`
/// with `x` then the post half's `x_res` (the same layout) — by MHCPostFwd's arithmetic
/// ([`post_elem`], [`fma8`]), so the bits equal a stored x_out's. `post` is a constant at each
/// entry: the plain entries compile as before.
#[derive(Clone, Copy)]
struct XSrc {
    /// `x`, or the post half's `x_res`.
    x: *const u16,
    post: bool,
    x_layer_out: *const u16,
    h_post_in: *const f32,
    /// Where kernel 1 writes the post half's output (null: not written).
    x_out: *mut u16,
}

impl XSrc {
    fn plain(x: *const u16) -> Self {
        Self {
            x,
            post: false,
            x_layer_out: core::ptr::null(),
            h_post_in: core::ptr::null(),
            x_out: core::ptr::null_mut(),
        }
    }

    /// Element `(β, k, j)` with `r = β·n + k` (post mode).
    #[inline(always)]
    unsafe fn post_elem_at(self, r: u32, beta: u32, c: u32, j: u32) -> u16 {
        let xr = bf16_to_f32(*self.x.add((r * c + j) as usize));
        let y = bf16_to_f32(*self.x_layer_out.add((beta * c + j) as usize));
        post_elem(*self.h_post_in.add(r as usize), y, xr)
    }
}

/// e^d in f32 for d ≤ 1 (f64 argument): the f64 product d·log2(e) is split into an integer `k`
/// and a fraction `f ∈ [-½, ½]`, `2^f` by `ex2.approx` (2^-22.5), times the exact `2^k`
/// (one final rounding where the result is subnormal). Relative error ≈ 2^-22 for every d whose
/// result is a normal f32, unlike `ex2.approx(d·log2 e)` whose argument rounding costs
/// `2^-24·|d·log2 e|`. Branch-free, and `k` is read from the low word of `t + 1.5·2^52` (whose
/// ulp is 1) instead of a saturating f64 → i32 conversion; `f` is never subnormal-sensitive
/// (2^f ∈ [2^-½, 2^½]), so the `.ftz` form gives the same bits without the range fix-up.
#[inline(always)]
pub fn exp_le1(d: f64) -> f32 {
    const MAGIC: f64 = 6755399441055744.0; // 2^52 + 2^51: round-to-nearest-integer trick
    let t = d * core::f64::consts::LOG2_E;
    let tm = t + MAGIC;
    let kf = tm - MAGIC;
    let p = ex2_approx_ftz((t - kf) as f32);
    // |t| < 2^31 wherever the result is used (t ≥ -160, t ≤ log2 e), so the low word is k.
    let k = tm.to_bits() as u32 as i32;
    let normal = p * f32::from_bits((k.wrapping_add(127) as u32) << 23);
    // k ∈ [-160, -127]: 2^(k+64) is normal and exact, then one rounding into the subnormals.
    let sub = (p * f32::from_bits((k.wrapping_add(64 + 127) as u32) << 23)) * f32::from_bits((127 - 64) << 23);
    let r = if k >= -126 { normal } else { sub };
    if t < -160.0 {
        0.0
    } else {
        r
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
#[inline(always)]
unsafe fn partial_fma(a: PrePartialFmaArgs) {
    let PrePartialFmaArgs { phi, x, part_ws, batch, n, c, cols, jc, bg, ngroups, njc_full, mc, mc_magic, jc_magic } = a;
    // Kernel 2 (launched as a programmatic dependent) may start its prologue now.
    grid_launch_dependents();
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

/// Kernel 2's x-tile prologue: thread `t`'s elements `e = t + u·nt < total` of the tile,
/// `(k, jj) = (e / jta, e mod jta)` (`fj` divides by `jta`), i.e. `xrow[k·c + jj]` with
/// `xrow = x + β·n·c + col0`; every load issued before any use.
#[inline(always)]
unsafe fn tile_load(xrow: *const u16, c: u32, fj: FastDiv, total: u32, t: u32, nt: u32) -> [u16; UN] {
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
    xv
}

/// Stores [`tile_load`]'s values to the staged tile: `xs[e] = xs[k·jta + jj]`.
#[inline(always)]
unsafe fn tile_stage(xs: *mut u16, xv: &[u16; UN], total: u32, t: u32, nt: u32) {
    let mut u = 0;
    while u < UN {
        let e = t + u as u32 * nt;
        if e < total {
            *xs.add(e as usize) = xv[u];
        }
        u += 1;
    }
}

/// `Σ_{k<n} coef(k)·xk(k)`: f32 FMAs in k order from 0. `KMAX = 0`: a loop of `n` terms;
/// `KMAX ≥ n`: unrolled to `KMAX` terms, each predicated on `k < n`.
#[inline(always)]
fn dot_n<const KMAX: u32>(n: u32, coef: impl Fn(u32) -> f32, xk: impl Fn(u32) -> f32) -> f32 {
    let kend = if KMAX == 0 { n } else { KMAX };
    let mut s = 0f32;
    let mut k = 0;
    while k < kend {
        if k < n {
            s = fma(coef(k), xk(k), s);
        }
        k += 1;
    }
    s
}

/// Where kernel 2 writes one batch row's tile: `x_layer[β·c + col]`, `x_res[(β·n + i)·c + col]`
/// for the columns `col = col0 + jj`.
#[derive(Clone, Copy)]
struct TileOut {
    x_res: *mut u16,
    x_layer: *mut u16,
    beta: u32,
    n: u32,
    c: u32,
    col0: u32,
}

impl TileOut {
    /// Column `jj`'s outputs from its x values `xk(k)`: `x_layer = q(Σ_k hs[k]·x_k)`,
    /// `x_res[i] = q(Σ_k ra[i·rs + k]·x_k)` ([`dot_n`]).
    #[inline(always)]
    unsafe fn column<const KMAX: u32>(
        &self,
        jj: u32,
        hs: *const f32,
        ra: *const f32,
        rs: u32,
        xk: impl Fn(u32) -> f32,
    ) {
        let TileOut { x_res, x_layer, beta, n, c, col0 } = *self;
        let col = col0 + jj;
        *x_layer.add((beta * c + col) as usize) = f32_to_bf16(dot_n::<KMAX>(n, |k| *hs.add(k as usize), &xk));
        let mut i = 0;
        while i < n {
            let rrow = ra.add((i * rs) as usize);
            let s = dot_n::<KMAX>(n, |k| *rrow.add(k as usize), &xk);
            *x_res.add(((beta * n + i) * c + col) as usize) = f32_to_bf16(s);
            i += 1;
        }
    }
}

/// Kernel 2's mixing of the staged tile `xs[k·jta + jj]` (coefficients `hs[k]`, `ra[i·rs + k]`):
/// thread `t` takes the columns `jj = t, t+nt, …` ([`TileOut::column`]). `KMAX > 0`
/// ([`mhc_pre_mix_small_n`], `n ≤ KMAX = NMAX_SMALL_N`): the column's x values go to registers first.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn mix_tile<const KMAX: u32>(
    out: TileOut,
    xs: *const u16,
    jta: u32,
    hs: *const f32,
    ra: *const f32,
    rs: u32,
    t: u32,
    nt: u32,
) {
    const { assert!(KMAX == 0 || KMAX == NMAX_SMALL_N) };
    let n = out.n;
    let mut jj = t;
    while jj < jta {
        let xb = xs.add(jj as usize);
        let mut xk = [0f32; NMAX_SMALL_N as usize];
        if KMAX > 0 {
            let mut k = 0;
            while k < NMAX_SMALL_N {
                if k < n {
                    xk[k as usize] = bf16_to_f32(*xb.add((k * jta) as usize));
                }
                k += 1;
            }
        }
        out.column::<KMAX>(jj, hs, ra, rs, |k| {
            if KMAX > 0 {
                xk[k as usize]
            } else {
                bf16_to_f32(*xb.add((k * jta) as usize))
            }
        });
        jj += nt;
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
#[inline(always)]
unsafe fn mix(a: PreMixArgs) {
    let PreMixArgs {
        x,
        bias,
        part_ws,
        x_res,
        x_layer,
        h_post,
        n,
        c,
        grid1,
        tiles,
        jt,
        jt_magic,
        jl_magic,
        ls,
        alpha_pre,
        alpha_post,
        alpha_res,
        repeat,
        eps,
        inv_sqrt_nc,
    } = a;
    let t = thread_idx_x();
    let nt = block_dim_x();
    let b = block_idx_x();
    let beta = b / tiles;
    let tile = b - beta * tiles;
    let m = n * n + 2 * n;
    let mq = m + 1;
    let slices = 1u32 << ls;
    let sm = layout2(mq, slices, n);
    let col0 = tile * jt;
    let jta = min_u32(jt, c - col0);
    // Only the last tile can be narrower: its width `c − (tiles−1)·jt` comes with its magic.
    let fj = if jta == jt { FastDiv { d: jt, magic: jt_magic } } else { FastDiv { d: jta, magic: jl_magic } };

    // ---- prologue: x tile loads (DRAM) and the bias, issued before anything waits.
    let total = n * jta; // ≤ UN·T: one batch per thread
    let xv = tile_load(x.add((beta * n * c + col0) as usize), c, fj, total, t, nt);
    let bias_t = if t < m { *bias.add(t as usize) } else { 0.0 };
    // Everything above is independent of kernel 1; its partials are read only after it is done.
    grid_dependency_wait();

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
    tile_stage(sm.xs, &xv, total, t, nt);
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

    // ---- coefficients, by warp 0 (warp barriers only; the other warps wait once).
    if t < 32 {
        let hp = if tile == 0 { h_post.add((beta * n) as usize) } else { core::ptr::null_mut() };
        let out = CoefOut { hs: sm.hs, zr: sm.zr, ra: sm.ra, rb: sm.rb, h_post: hp };
        let coef = PreCoef { alpha_pre, alpha_post, alpha_res, repeat, eps, inv_sqrt_nc };
        coefficients_warp(sm.tot, |e| if e == t { bias_t } else { *bias.add(e as usize) }, n, coef, out, t);
    }
    sync_threads();

    // ---- mixing of the staged tile.
    let out = TileOut { x_res, x_layer, beta, n, c, col0 };
    mix_tile::<0>(out, sm.xs, jta, sm.hs, sm.ra, n, t, nt);
}

// ================================================================ kernel 2, register coefficients (n ≤ 4)

use kernel_abi::mhc::MIX_BLOCK_SMALL_N;
/// Largest n of [`mhc_pre_mix_small_n`] (one warp holds a padded 4×4 R, one element per lane).
pub use kernel_abi::mhc::NMAX_SMALL_N;
/// Partial loads per lane and quantity in flight in [`mhc_pre_mix_small_n`] (`G ≤ 32·GL` in one round).
const GL: usize = 4;
/// Quantities per warp in flight in [`mhc_pre_mix_small_n`].
const QL: usize = 4;

/// The logit index held by lane `l` of the coefficient warp of [`mhc_pre_mix_small_n`], or `None`:
/// lanes 0–3 the pre logits, 4–7 the post logits, 16–31 the residual matrix padded to 4×4
/// (lane `16 + 4i + k` holds `R[i][k]`).
#[inline(always)]
fn lane_logit(l: u32, n: u32) -> Option<u32> {
    if l < 4 {
        if l < n {
            return Some(l);
        }
    } else if l < 8 {
        if l - 4 < n {
            return Some(n + l - 4);
        }
    } else if l >= 16 {
        let (i, k) = ((l - 16) >> 2, (l - 16) & 3);
        if i < n && k < n {
            return Some(2 * n + i * n + k);
        }
    }
    None
}

/// The coefficient chain of one batch row in one warp's registers, lane `lane` holding the
/// logit [`lane_logit`] (`z` in f64; `valid` false and `z = −∞` on the padding lanes): the row
/// max by two butterfly levels, one exponential per lane (`e^-|z|` for σ on lanes < 8,
/// `e^(z − max)` for R on lanes ≥ 16), σ(z) = 1/(1+e) (z ≥ 0) or e/(1+e) by a reciprocal
/// estimate and one Newton step, then `repeat` Sinkhorn rounds (rows: lanes ^1, ^2, ^3;
/// columns: ^4, ^8, ^12), each division a Newton-refined reciprocal. Returns `(σ, R)`: σ is meaningful on the
/// valid lanes < 8 (every lane computes it, unbranched, so its arithmetic fills the Sinkhorn
/// shuffles' latency instead of running before them), R on lanes ≥ 16 (0 elsewhere). Every
/// lane of the warp must call it.
#[inline(always)]
unsafe fn lane_coefficients(z: f64, valid: bool, lane: u32, repeat: u32, eps: f32) -> (f32, f32) {
    // Row max over lanes 4i..4i+3 (padding −∞; lanes < 16 compute a max they do not use).
    let mut zmax = z;
    let o = shfl_xor_f64(zmax, 1);
    if o > zmax {
        zmax = o;
    }
    let o = shfl_xor_f64(zmax, 2);
    if o > zmax {
        zmax = o;
    }
    // One exponential per lane: e^-|z| for σ (lanes < 8), e^(z − max) for R (lanes ≥ 16), e^−∞
    // = 0 on the padding lanes (selects, no divergent branch).
    let arg = if !valid {
        f64::NEG_INFINITY
    } else if lane < 8 {
        f64::from_bits(z.to_bits() | (1 << 63))
    } else {
        z - zmax
    };
    let ex = exp_le1(arg);
    // σ(z) = 1/(1+e) (z ≥ 0) or e/(1+e): reciprocal estimate + one Newton step. 1 + e ∈ [1, 2]
    // is normal, so `rcp.approx.ftz` has `rcp.approx`'s bits without its range fix-up.
    let d = 1.0 + ex;
    let mut q = rcp_approx_ftz(d);
    q = fma(q, fma(-d, q, 1.0), q);
    let sg = if z >= 0.0 { q } else { ex * q };
    let v = if lane >= 16 { ex } else { 0.0 };
    // Each Sinkhorn divisor is a sum of entries in [0, 1] plus eps: normal and below 2^126
    // whenever eps is, so the `.ftz` reciprocal gives the same bits there (a uniform branch).
    let v = if (f32::MIN_POSITIVE..=f32::from_bits(0x7D80_0000)).contains(&eps) {
        sinkhorn::<true>(v, repeat, eps)
    } else {
        sinkhorn::<false>(v, repeat, eps)
    };
    (sg, v)
}

/// `repeat` Sinkhorn rounds of [`lane_coefficients`] over the 4×4 matrix on lanes 16–31 (lane
/// `16 + 4i + k` holds `R[i][k]`); `FTZ` selects `rcp.approx.ftz` (exact only for divisors in
/// [2^-126, 2^126]).
#[inline(always)]
fn sinkhorn<const FTZ: bool>(mut v: f32, repeat: u32, eps: f32) -> f32 {
    let rcp = |d: f32| if FTZ { rcp_approx_ftz(d) } else { rcp_approx(d) };
    // One half-step: the sum of the four lanes `l ^ a·{0, 1, 2, 3}` as (v_l + v_l^a) + (v_l^2a +
    // v_l^3a) — the bits of a two-level butterfly in every lane (IEEE addition commutes), from
    // three independent shuffles instead of two dependent ones.
    let half = |v: f32, a: u32| {
        let (x1, x2, x3) = (shfl_xor_f32(v, a), shfl_xor_f32(v, 2 * a), shfl_xor_f32(v, 3 * a));
        let d = (v + x1) + (x2 + x3) + eps;
        let mut q = rcp(d);
        q = fma(q, fma(-d, q, 1.0), q);
        v * q
    };
    // The first round outside the loop: the usual single round runs straight through.
    if repeat > 0 {
        v = half(half(v, 1), 4);
    }
    let mut rep = 1;
    while rep < repeat {
        v = half(half(v, 1), 4);
        rep += 1;
    }
    v
}

/// Kernel 2 for n ≤ 4 ([`NMAX_SMALL_N`]), the same arguments and grid as [`mhc_pre_mix`] (`ls` is
/// unused) with a short dependent chain:
/// - every quantity's `G` partials are summed by one warp: lane `l` adds `g = l, l+32, …` in
///   order, then a 5-level `shfl.bfly` butterfly (IEEE addition is commutative, so every lane
///   ends with the same bits); each warp holds up to [`QL`]·[`GL`] loads in flight;
/// - the coefficients live in registers of warp 0, one logit per lane ([`lane_logit`]): `r` and
///   the logits in f64, σ as in [`mhc_pre_mix`], the row max by two butterfly levels, `R = exp`, and each
///   Sinkhorn half-step as three shuffles (row: lanes ^1, ^2, ^3; column: ^4, ^8, ^12) and one
///   `div.rn` per lane — no shared-memory round trips, no index divisions;
/// - shared memory: `tot[32]` f64 | `hs[4]` f32 | `ra[16]` f32 (4×4) | x tile (`n·jt` bf16),
///   [`MIX_SMALL_N_SMEM_HEAD`] bytes before the tile.
///
/// Sums in fixed orders: bitwise reproducible (not bitwise equal to [`mhc_pre_mix`]: the
/// butterfly orders differ).
#[inline(always)]
unsafe fn mix_small_n(a: PreMixArgs) {
    let PreMixArgs {
        x,
        bias,
        part_ws,
        x_res,
        x_layer,
        h_post,
        n,
        c,
        grid1,
        tiles,
        jt,
        jt_magic,
        jl_magic,
        ls: _,
        alpha_pre,
        alpha_post,
        alpha_res,
        repeat,
        eps,
        inv_sqrt_nc,
    } = a;
    let t = thread_idx_x();
    let nt = block_dim_x();
    let lane = t & 31;
    let w = t >> 5;
    let nw = nt >> 5;
    let b = block_idx_x();
    let beta = b / tiles;
    let tile = b - beta * tiles;
    let m = n * n + 2 * n;
    let mq = m + 1;
    let base = dyn_smem::<u8>();
    let tot = base as *mut f64;
    let hs = base.add(256) as *mut f32;
    let ra = base.add(272) as *mut f32;
    let xs = base.add(MIX_SMALL_N_SMEM_HEAD as usize) as *mut u16;
    let col0 = tile * jt;
    let jta = min_u32(jt, c - col0);
    let fj = if jta == jt { FastDiv { d: jt, magic: jt_magic } } else { FastDiv { d: jta, magic: jl_magic } };

    // ---- prologue (independent of kernel 1): x tile and the coefficient lanes' bias.
    let total = n * jta;
    let xv = tile_load(x.add((beta * n * c + col0) as usize), c, fj, total, t, nt);
    let my_logit = lane_logit(lane, n);
    let bias_l = match my_logit {
        Some(e) if w == 0 => *bias.add(e as usize),
        _ => 0.0,
    };
    grid_dependency_wait();

    // ---- partial sums: warp w owns quantities q = w + nw·j.
    let part_b = part_ws.add((beta * mq * grid1) as usize);
    let mut q0 = w;
    while q0 < mq {
        let mut acc = [0f64; QL];
        let mut g0 = 0;
        while g0 < grid1 {
            let mut r = [[0f64; GL]; QL];
            let mut j = 0;
            while j < QL {
                let q = q0 + j as u32 * nw;
                let mut u = 0;
                while u < GL {
                    let g = g0 + lane + 32 * u as u32;
                    if q < mq && g < grid1 {
                        r[j][u] = *part_b.add((q * grid1 + g) as usize);
                    }
                    u += 1;
                }
                j += 1;
            }
            let mut j = 0;
            while j < QL {
                let mut u = 0;
                while u < GL {
                    if g0 + lane + 32 * (u as u32) < grid1 {
                        acc[j] += r[j][u];
                    }
                    u += 1;
                }
                j += 1;
            }
            g0 += 32 * GL as u32;
        }
        // Butterfly, the QL quantities interleaved (independent shuffles in flight).
        let mut k = 16;
        while k > 0 {
            let mut j = 0;
            while j < QL {
                acc[j] += shfl_xor_f64(acc[j], k);
                j += 1;
            }
            k >>= 1;
        }
        let mut j = 0;
        while j < QL {
            let q = q0 + j as u32 * nw;
            if lane == 0 && q < mq {
                *tot.add(q as usize) = acc[j];
            }
            j += 1;
        }
        q0 += QL as u32 * nw;
    }
    tile_stage(xs, &xv, total, t, nt);
    sync_threads();

    // ---- coefficients in warp 0's registers (short chain: Newton-refined MUFU reciprocals in
    // place of the f64 `sqrt`/`div` and f32 `div.rn` subroutines, one exp per lane).
    if w == 0 {
        let ss = *tot.add(m as usize);
        let inv_r = inv_r_of(ss, inv_sqrt_nc);
        let (e, valid) = match my_logit {
            Some(e) => (e, true),
            None => (0, false),
        };
        let alpha = if lane < 4 {
            alpha_pre
        } else if lane < 8 {
            alpha_post
        } else {
            alpha_res
        };
        let z = if valid { alpha as f64 * *tot.add(e as usize) * inv_r + bias_l as f64 } else { f64::NEG_INFINITY };
        let (sg, v) = lane_coefficients(z, valid, lane, repeat, eps);
        if valid && lane < 4 {
            *hs.add(lane as usize) = sg;
        } else if valid && lane < 8 && tile == 0 {
            *h_post.add((beta * n + lane - 4) as usize) = 2.0 * sg;
        }
        if lane >= 16 {
            *ra.add((lane - 16) as usize) = v;
        }
    }
    sync_threads();

    // ---- mixing of the staged tile.
    let out = TileOut { x_res, x_layer, beta, n, c, col0 };
    mix_tile::<NMAX_SMALL_N>(out, xs, jta, hs, ra, 4, t, nt);
}

/// `1/r` for `r = √ss·inv_sqrt_nc + 1e-4` to f64 accuracy: rsqrt and rcp estimates (≈ 2^-22)
/// with two Newton steps each (the error squares per step: 2^-44, then below f64 rounding).
#[inline(always)]
fn inv_r_of(ss: f64, inv_sqrt_nc: f64) -> f64 {
    let mut y = rsqrt_approx_f64(ss);
    let mut k = 0;
    while k < 2 {
        y = y * (1.5 - 0.5 * ss * y * y);
        k += 1;
    }
    let root = if ss > 0.0 { ss * y } else { 0.0 };
    let r = root * inv_sqrt_nc + 1e-4;
    let mut inv_r = rcp_approx_f64(r);
    let mut k = 0;
    while k < 2 {
        inv_r = inv_r + inv_r * (1.0 - r * inv_r);
        k += 1;
    }
    inv_r
}

/// H_pre (lanes 0..4's σ, `sg`) and the 4×4 R (lanes 16..32's `v`) of [`lane_coefficients`]
/// broadcast to every lane by 20 `shfl.idx`.
#[inline(always)]
fn broadcast_coefficients(sg: f32, v: f32) -> ([f32; NMAX_SMALL_N as usize], [f32; 16]) {
    let mut hs = [0f32; NMAX_SMALL_N as usize];
    let mut k = 0;
    while k < NMAX_SMALL_N {
        hs[k as usize] = shfl_idx_f32(sg, k);
        k += 1;
    }
    let mut ra = [0f32; 16];
    let mut q = 0;
    while q < 16 {
        ra[q as usize] = shfl_idx_f32(v, 16 + q);
        q += 1;
    }
    (hs, ra)
}

/// Bytes of [`mhc_pre_mix_small_n`]'s shared memory before the x tile.
pub use kernel_abi::mhc::MIX_SMALL_N_SMEM_HEAD;

// ================================================================ kernel 2 of the fixed-point pair (n ≤ 4)

/// 16-byte x chunks loaded per thread and round in [`row_sumsq`], all before their first use:
/// one round up to 8·256 chunks (n·c ≤ 16384). At 4, hidden-2560's five chunks per thread took
/// two rounds and (in the fused kernel) three DRAM trips: with groups of 2 rows the row blocks
/// were then the end of kernel 1 (docs/decisions/mhc.md, Shipped 2026-12-04, fifth).
const XR: usize = 8;
// `unroll8!` runs at most 8 copies: a larger XR would skip chunks.
const _: () = assert!(XR <= 8);
/// `Σ_{i<count} p[i·stride]` in a fixed order: rounds of 16 independent loads, added into four
/// interleaved chains (i mod 4), then `(s0 + s1) + (s2 + s3)`.
#[inline(always)]
unsafe fn sum4(p: *const f64, count: u32, stride: u32) -> f64 {
    let mut s = [0f64; 4];
    let mut i = 0;
    while i < count {
        let mut v = [0f64; 16];
        let mut u = 0;
        while u < 16 {
            if i + (u as u32) < count {
                v[u] = *p.add(((i + u as u32) * stride) as usize);
            }
            u += 1;
        }
        let mut u = 0;
        while u < 16 {
            if i + (u as u32) < count {
                s[u & 3] += v[u];
            }
            u += 1;
        }
        i += 16;
    }
    (s[0] + s[1]) + (s[2] + s[3])
}

/// Kernel 2 of the fixed-point pair (n ≤ 4, after [`mhc_pre_partial_slab_fixed_point`]): grid
/// `(tiles, batch)`, block `(T, 1, 1)`; block `(tile, β)` mixes the columns `col = tile·T + t`
/// of batch row β, one per thread. Before `griddepcontrol.wait`: the thread's column
/// `x[β, k·c + col]` (k < n) into registers (no staged tile) and its lane's bias, then one pass
/// of the post-wait code below on zero logits, without its loads and stores, so that the
/// instructions are cached when the wait returns (measured −0.03…−0.1 µs on five of the six seed
/// rows of MHCPreFwd and MHCPostPreFwd, 0 on MHCPreFwd hidden-2560);
/// after the wait, one dependent chain per warp and no barrier:
/// - lane l loads its logit's ([`lane_logit`]) accumulator words from both halves of `part_ws`
///   (one half holds this call's sums, kernel 1 zeroed the other; each half `acc_copies`
///   copies, [`ACC_COPIES_MAX`]), adds them as integers and
///   converts ([`accumulator_value`]), and loads its `alpha/r`, which kernel 1's row block of β
///   stored ([`row_scales`]); block (0, 0) flips the epoch word;
/// - every warp runs [`lane_coefficients`] itself (identical bits in every warp) and takes
///   H_pre and R by 20 broadcast shuffles — no shared round trip;
/// - mixing from registers: `x_layer = q(Σ_k H_pre[k]·x_k)`, `x_res[i] = q(Σ_k R[i,k]·x_k)`.
///
/// Tile 0, warp 0 writes h_post. Shared memory [`mix_fixed_point_smem`] (untouched).
/// Fixed summation orders: bitwise reproducible.
#[inline(always)]
unsafe fn mix_fixed_point(a: PreMixFixedPointArgs) {
    mix_fixed_point_copies(a, 1);
}

/// [`mhc_pre_mix_fixed_point`] after [`mhc_pre_partial_slab_fixed_point_acc2`]: the accumulators
/// in [`ACC_COPIES_MAX`] copies per half, summed here.
#[inline(always)]
unsafe fn mix_fixed_point_acc2(a: PreMixFixedPointArgs) {
    mix_fixed_point_copies(a, ACC_COPIES_MAX);
}

#[inline(always)]
unsafe fn mix_fixed_point_copies(a: PreMixFixedPointArgs, acc_copies: u32) {
    let PreMixFixedPointArgs { x, bias, part_ws, x_res, x_layer, h_post, batch, n, c, grid1: _, repeat, eps } = a;
    let outs = (x_res, x_layer, h_post);
    fixed_point_mix(XSrc::plain(x), bias, part_ws, outs, (batch, n, c), acc_copies, repeat, eps);
}

/// Kernel 2 of the fused post→pre op (MHCPostPreFwd): [`mhc_pre_mix_fixed_point`] with x
/// computed from the post half's inputs ([`XSrc`]).
#[inline(always)]
unsafe fn post_pre_mix_fixed_point(a: PostPreMixArgs) {
    post_pre_mix_fixed_point_copies(a, 1);
}

/// [`mhc_post_pre_mix_fixed_point`] after [`mhc_post_pre_partial_slab_fixed_point_acc2`]: the
/// accumulators in [`ACC_COPIES_MAX`] copies per half, summed here.
#[inline(always)]
unsafe fn post_pre_mix_fixed_point_acc2(a: PostPreMixArgs) {
    post_pre_mix_fixed_point_copies(a, ACC_COPIES_MAX);
}

#[inline(always)]
unsafe fn post_pre_mix_fixed_point_copies(a: PostPreMixArgs, acc_copies: u32) {
    let PostPreMixArgs {
        x_layer_out,
        h_post_in,
        x_res_in,
        bias,
        part_ws,
        x_res,
        x_layer,
        h_post,
        batch,
        n,
        c,
        repeat,
        eps,
    } = a;
    let src = XSrc { x: x_res_in, post: true, x_layer_out, h_post_in, x_out: core::ptr::null_mut() };
    let outs = (x_res, x_layer, h_post);
    fixed_point_mix(src, bias, part_ws, outs, (batch, n, c), acc_copies, repeat, eps);
}

/// Σx² of batch row β in f64 (products of bf16 values exact, added in a fixed order), by the
/// first `nt` threads of the block (the other threads add nothing): each thread's chunks
/// `t, t + nt, …` in turn, then a warp butterfly; lane 0 of warp `w < nt/32` stores its warp's
/// sum to `ssw[w]`, then a block barrier (every thread of the block must call it;
/// [`sum4`]`(ssw, nt/32, 1)` is the row's Σx²). The post half's x (`src.post`) is taken in the
/// order of a stored, 16-byte aligned x_out, so that the fused op's Σx² has MHCPreFwd's bits
/// (f64 sums of squares round once the row's sum outgrows small squares: the order matters).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn row_sumsq(src: XSrc, beta: u32, n: u32, c: u32, t: u32, nt: u32, ssw: *mut f64) {
    let x = src.x;
    let xrow = x.add((beta * n * c) as usize);
    let (lane, w) = (t & 31, t >> 5);
    // A thread beyond `nt` (of a 512-thread kernel-1 block) starts past every loop's end.
    let t = if t < nt { t } else { u32::MAX - nt };

    let len = n * c;
    let mut ss = 0f64;
    let yvec = c % 8 == 0 && (src.x_layer_out as u64 + 2 * (beta * c) as u64) & 15 == 0;
    if src.post && !((xrow as u64) & 15 == 0 && yvec) {
        // The post half's x without vector loads, in the order MHCPreFwd takes a stored,
        // 16-byte aligned x_out (chunks of 8 at t, t+T, … when len % 8 == 0), so that Σx² has
        // its bits (f64 sums of squares round once the row's sum outgrows small squares: the
        // order matters).
        let vector_order = len % 8 == 0;
        let (unit, count) = if vector_order { (8, len / 8) } else { (1, len) };
        let mut i = t;
        while i < count {
            let mut q = 0;
            while q < unit {
                let el = unit * i + q;
                let (k, j) = divrem_u32(el, c);
                let f = bf16_to_f32(src.post_elem_at(beta * n + k, beta, c, j)) as f64;
                ss = fma_f64(f, f, ss);
                q += 1;
            }
            i += nt;
        }
    } else if (xrow as u64) & 15 == 0 && len % 8 == 0 {
        let nch = len / 8;
        let p = xrow as *const u32;
        let mut i0 = t;
        while i0 < nch {
            let mut v = [[0u32; 4]; XR];
            let mut y = [[0u32; 4]; XR];
            let mut h = [0f32; XR];
            // Every load of the round issued before any use, unbranched. Chunk `i0 + u·nt` lies in
            // stream row `k` (c % 8 == 0), column `j`, stepped from the round's first chunk. A
            // chunk past the row re-reads the row's last x chunk, its y and h stay in row β
            // (`j < c`, `k` clamped to `n − 1`), and none of it is summed.
            let (mut k, mut j) = if src.post { divrem_u32(8 * i0, c) } else { (0, 0) };
            let (dk, dj) = if src.post { divrem_u32(8 * nt, c) } else { (0, 0) };
            unroll8!(u, XR, {
                let i = min_u32(i0 + u as u32 * nt, nch - 1);
                v[u] = ld_nc_v4(p.add(4 * i as usize));
                if src.post {
                    if u > 0 {
                        (k, j) = (k + dk, j + dj);
                        if j >= c {
                            (k, j) = (k + 1, j - c);
                        }
                    }
                    y[u] = ld_nc_v4(src.x_layer_out.add((beta * c + j) as usize) as *const u32);
                    h[u] = *src.h_post_in.add((beta * n + min_u32(k, n - 1)) as usize);
                }
            });
            if src.post {
                unroll8!(u, XR, {
                    v[u] = fma8(h[u], y[u], v[u]);
                });
            }
            unroll8!(u, XR, {
                if i0 + (u as u32) * nt < nch {
                    let mut q = 0;
                    while q < 4 {
                        let (lo, hi) = bf16x2_to_f32(v[u][q]);
                        ss = fma_f64(lo as f64, lo as f64, ss);
                        ss = fma_f64(hi as f64, hi as f64, ss);
                        q += 1;
                    }
                }
            });
            i0 += XR as u32 * nt;
        }
    } else {
        let mut i0 = t;
        while i0 < len {
            let mut v = [0u16; UN];
            let mut u = 0;
            while u < UN {
                let i = i0 + u as u32 * nt;
                if i < len {
                    v[u] = *xrow.add(i as usize);
                }
                u += 1;
            }
            let mut u = 0;
            while u < UN {
                if i0 + (u as u32) * nt < len {
                    let f = bf16_to_f32(v[u]) as f64;
                    ss = fma_f64(f, f, ss);
                }
                u += 1;
            }
            i0 += UN as u32 * nt;
        }
    }
    let mut k = 16;
    while k > 0 {
        ss += shfl_xor_f64(ss, k);
        k >>= 1;
    }
    if lane == 0 && w < nt >> 5 {
        *ssw.add(w as usize) = ss;
    }
    sync_threads();
}

/// The body of the fixed-point kernels 2 (see [`mhc_pre_mix_fixed_point`]).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn fixed_point_mix(
    src: XSrc,
    bias: *const f32,
    part_ws: *const f64,
    (x_res, x_layer, h_post): (*mut u16, *mut u16, *mut f32),
    (batch, n, c): (u32, u32, u32),
    acc_copies: u32,
    repeat: u32,
    eps: f32,
) {
    let x = src.x;
    let t = thread_idx_x();
    let nt = block_dim_x();
    let lane = t & 31;
    let w = t >> 5;
    let tile = block_idx_x();
    let beta = block_idx_y();
    let m = n * n + 2 * n;
    let col = tile * nt + t;
    let active = col < c;

    // ---- prologue (independent of kernel 1).
    let xrow = x.add((beta * n * c) as usize);
    let mut xk = [0f32; NMAX_SMALL_N as usize];
    let mut k = 0;
    while k < NMAX_SMALL_N {
        if k < n && active {
            let v =
                if src.post { src.post_elem_at(beta * n + k, beta, c, col) } else { *xrow.add((k * c + col) as usize) };
            xk[k as usize] = bf16_to_f32(v);
        }
        k += 1;
    }
    let (e, valid) = match lane_logit(lane, n) {
        Some(e) => (e, true),
        None => (0, false),
    };
    let bias_l = if valid { *bias.add(e as usize) } else { 0.0 };
    let cls = if lane < 4 {
        0
    } else if lane < 8 {
        1
    } else {
        2
    };
    // Accumulator layout ([`acc_word`]): half, copy, word, then (β, logit).
    let bm = batch * m;
    let words = acc_copies * ACC_WORDS * bm;
    let a = part_ws as *const u64;
    // Kernel 1's row blocks stored the row's scales ([`row_scales`]): no Σx² pass here. (The
    // fused op's kernel 2 had recomputed the post half over the whole row for it, and that
    // prologue ended the op's chain; MHCPreFwd's pass cost its x reads.)
    // Two passes through the same code: the first, before the wait, with zero logits and no
    // loads or stores, only brings the post-wait code into the instruction cache (in 128-thread
    // blocks it gains within a tick; kept).
    let rounds = opaque_u32(2);
    let mut pass = 1;
    while pass <= rounds {
        let last = pass == rounds;
        let mut scale = 0f64;
        const CW: usize = (ACC_COPIES_MAX * ACC_WORDS) as usize;
        let mut v = [0u64; 2 * CW];
        if last {
            grid_dependency_wait();
            scale = *(a.add((2 * words + 1 + ROW_SCALES * beta + cls) as usize) as *const f64);
            if valid {
                // Every word of both halves, one round of independent loads.
                let p0 = a.add((beta * m + e) as usize);
                let mut r = 0;
                while r < 2 * CW {
                    let (half, cw) = ((r / CW) as u32, (r % CW) as u32);
                    if cw < acc_copies * ACC_WORDS {
                        v[r] = *p0.add((half * words + cw * bm) as usize);
                    }
                    r += 1;
                }
            }
            if tile == 0 && beta == 0 && t == 0 {
                // Every kernel-1 block read the epoch before this grid's wait returned: flip it.
                red_add_u32(a.add(2 * words as usize) as *mut u32, 1);
            }
        }
        // Integer sums of every half and copy (the words not loaded are 0).
        let mut sw = [0u64; ACC_WORDS as usize];
        let mut r = 0;
        while r < 2 * CW {
            let k = r % ACC_WORDS as usize;
            sw[k] = sw[k].wrapping_add(v[r]);
            r += 1;
        }
        let h = accumulator_value(&sw);

        // ---- coefficients, redundantly in every warp (the same bits everywhere).
        let z = if valid { fma_f64(scale, h, bias_l as f64) } else { f64::NEG_INFINITY };
        let (sg, v) = lane_coefficients(z, valid, lane, repeat, eps);
        if last && tile == 0 && w == 0 && valid && (4..8).contains(&lane) {
            *h_post.add((beta * n + lane - 4) as usize) = 2.0 * sg;
        }
        // The 20 shuffles through the warp's own 128 bytes of shared memory instead (one store,
        // five 16-byte loads): within one CUPTI tick (same device call, A B … B A).
        let (hs, ra) = broadcast_coefficients(sg, v);

        // ---- mixing from registers.
        if active {
            let xv = |k: u32| xk[k as usize];
            let s = dot_n::<NMAX_SMALL_N>(n, |k| hs[k as usize], xv);
            if last {
                *x_layer.add((beta * c + col) as usize) = f32_to_bf16(s);
            }
            let mut i = 0;
            while i < NMAX_SMALL_N {
                if i < n {
                    let s = dot_n::<NMAX_SMALL_N>(n, |k| ra[(4 * i + k) as usize], xv);
                    if last {
                        *x_res.add(((beta * n + i) * c + col) as usize) = f32_to_bf16(s);
                    }
                }
                i += 1;
            }
        }
        pass += 1;
    }
}

// ================================================================ fixed-point split-K sums (n ≤ 4)

use kernel_abi::mhc::acc_word;
pub use kernel_abi::mhc::ACC_COPIES_MAX;
/// Limbs per (batch row, logit) accumulator of the fixed-point pair: limb `k` holds bits
/// `[48k − 64, 48k − 16)` of `|partial|` (so `2^-64 ≤` resolution, range `< 2^128`, the f32
/// range), each as a signed 64-bit sum over the kernel-1 blocks (≤ 2^15 blocks cannot overflow).
pub use kernel_abi::mhc::ACC_LIMBS;
/// u64 words per accumulator: the [`ACC_LIMBS`] limbs, then a count of partials that were not
/// finite or not below 2^128 (the logit is then NaN).
pub use kernel_abi::mhc::ACC_WORDS;

/// The fixed-point kernels' arguments to [`pre_slab_body`]: the row blocks' logit-scale factors
/// (`alpha_pre`, `alpha_post`, `alpha_res`; `1/√(n·c)`) and the accumulator copies per half.
#[derive(Clone, Copy)]
struct FixedPoint {
    alpha: [f32; 3],
    inv_sqrt_nc: f64,
    acc_copies: u32,
}
use kernel_abi::mhc::ROW_SCALES;

/// Adds limb `k < ACC_LIMBS` of the f32 block partial `v` to the accumulator at `p`, whose
/// words lie `ws` u64 apart ([`acc_word`]) (`red.global.add`, no result): `⌊|v|·2^(64−48k)⌋ mod
/// 2^48`, negated for `v < 0`; limb 0 also counts a non-finite `v` in word [`ACC_LIMBS`]. From `v`'s exponent and mantissa by integer
/// shifts (the f64 scaling, two floors and a conversion it replaces were ≈ 25 dependent
/// instructions). The limbs are exact: the sum of the limbs is `v` truncated toward zero to a
/// multiple of 2^-64, and integer addition is associative, so the total does not depend on the
/// order in which blocks arrive.
#[inline(always)]
unsafe fn add_limb(p: *mut u64, v: f32, k: u32, ws: u32) {
    let bits = v.to_bits();
    let e = (bits >> 23) & 0xff;
    if e == 0xff {
        // NaN or ±∞ (every finite f32 is below 2^128).
        if k == 0 {
            red_add_u64(p.add((ACC_LIMBS * ws) as usize), 1);
        }
        return;
    }
    // |v| = mant·2^(max(e, 1) − 150), so the limb ⌊|v|·2^(64 − 48k)⌋ mod 2^48 is mant shifted by
    // sh = max(e, 1) − 86 − 48k: left and masked to 48 bits, or right (⌊⌋ of a positive value),
    // in integers, exact.
    let mant = (bits & 0x7f_ffff) | if e != 0 { 0x80_0000 } else { 0 };
    let sh = e.max(1) as i32 - 86 - 48 * k as i32;
    let q = if sh >= 0 {
        if sh < 48 {
            ((mant as u64) << sh) & ((1u64 << 48) - 1)
        } else {
            0
        }
    } else if sh > -24 {
        (mant >> -sh) as u64
    } else {
        0
    };
    if q != 0 {
        let sq = if bits >> 31 != 0 { q.wrapping_neg() } else { q };
        red_add_u64(p.add((k * ws) as usize), sq);
    }
}

/// The logit of one fixed-point accumulator (limb sums as signed integers, from the lowest limb up, in
/// f64); NaN when a partial was counted as non-finite.
#[inline(always)]
fn accumulator_value(s: &[u64; ACC_WORDS as usize]) -> f64 {
    // Each limb times its power of two is exact, so the FMA is the rounded sum (the same bits
    // as the product then the addition), and the NaN case is a select, not a branch.
    let mut h = 0f64;
    let mut k = 0;
    while k < ACC_LIMBS {
        h = fma_f64((s[k as usize] as i64) as f64, f64::from_bits(((959 + 48 * k) as u64) << 52), h);
        k += 1;
    }
    if s[ACC_LIMBS as usize] != 0 {
        f64::NAN
    } else {
        h
    }
}

crate::entry_directive!("mhc_pre_partial_slab_fixed_point", ".maxntid 512, 1, 1 .minnctapersm 1");
crate::entry_directive!("mhc_pre_partial_slab_fixed_point_acc2", ".maxntid 512, 1, 1 .minnctapersm 1");
crate::entry_directive!("mhc_post_pre_partial_slab_fixed_point", ".maxntid 512, 1, 1 .minnctapersm 1");
crate::entry_directive!("mhc_post_pre_partial_slab_fixed_point_acc2", ".maxntid 512, 1, 1 .minnctapersm 1");

/// Kernel 1 of the fixed-point pair ([`pre_slab_body`]): grid `(G + bpc, groups)`, block `(T, 1, 1)`;
/// the last `bpc` blocks of each group are row blocks ([`row_scales`]: Σx² and the logit scales
/// of one batch row, in parallel with the partial blocks, where kernel 2 had summed the whole
/// row before its wait);
/// block `g` owns the channel columns `[g·cw, min((g+1)·cw, c))` and adds each of its block
/// partials as [`ACC_LIMBS`] integer limbs ([`add_limb`]) into the accumulators of epoch half
/// `par` ([`acc_word`], one copy), where `m = n²+2n` and `par` is the parity of the u32 epoch
/// word at u64 word `2·batch·m·ACC_WORDS` of `part_ws`; the other half is zeroed. `part_ws` must be all zero before
/// the first call of a workspace and is then left to the kernels ([`mhc_pre_mix_fixed_point`]
/// flips the epoch). Every block adds to every accumulator of its batch rows; the integer sums
/// do not depend on the order. Triggers the dependent launch of kernel 2 at entry.
#[inline(always)]
unsafe fn partial_slab_fixed_point(a: PrePartialSlabArgs) {
    partial_slab_fixed_point_copies(a, 1);
}

/// [`mhc_pre_partial_slab_fixed_point`] adding into [`ACC_COPIES_MAX`] copies of the
/// accumulators per half (block `g` into copy `g mod 2`; [`mhc_pre_mix_fixed_point_acc2`] sums
/// them).
#[inline(always)]
unsafe fn partial_slab_fixed_point_acc2(a: PrePartialSlabArgs) {
    partial_slab_fixed_point_copies(a, ACC_COPIES_MAX);
}

#[inline(always)]
unsafe fn partial_slab_fixed_point_copies(a: PrePartialSlabArgs, acc_copies: u32) {
    let PrePartialSlabArgs { phi, x, part_ws, batch, n, c, cw, bpc, alpha_pre, alpha_post, alpha_res, inv_sqrt_nc } = a;
    let scales = Some(FixedPoint { alpha: [alpha_pre, alpha_post, alpha_res], inv_sqrt_nc, acc_copies });
    grid_launch_dependents();
    pre_slab_body(phi, XSrc::plain(x), batch, n, c, cw, bpc, part_ws, scales);
}

/// [`mhc_pre_mix_fixed_point`]'s dynamic shared memory as launched, bytes: `ssw[32]` f64, then
/// 8 bytes per thread that the kernel does not touch (the measured launch configuration).
pub use kernel_abi::mhc::mix_fixed_point_smem;

// ================================================================ kernel 1 from a staged phi slab (n ≤ 4)

/// `(a / d, a % d)` by the hardware-free u32 division sequence (`d ≥ 1`; 0 for `d = 0`, no
/// panic path). Used off the hot loops, where a multiply-high `FastDiv` gained nothing.
#[inline(always)]
fn divrem_u32(a: u32, d: u32) -> (u32, u32) {
    let q = a.checked_div(d).unwrap_or(0);
    (q, a - q * d)
}

/// Batch rows per group of the slab kernels 1 (one x tile in shared memory per group).
pub use kernel_abi::mhc::BTF;
/// [`pre_slab_body`]'s shared memory (bytes): phis n·cw·m f32 | xs BTF·n·cw u16 | part BTF·mq
/// f64 (each 16-byte aligned); `rgk::mhc::pre_slab_partial_smem_bytes` is the host's mirror.
#[derive(Clone, Copy)]
struct SmemF {
    phis: *mut f32,
    xs: *mut u16,
    part: *mut f64,
    /// `phis` and `xs` as shared-window addresses (the block partials' `ld.shared` loads).
    phis32: u32,
    xs32: u32,
}

#[inline(always)]
unsafe fn layout_slab(m: u32, n: u32, cw: u32) -> SmemF {
    let base = dyn_smem::<u8>();
    let base32 = dyn_smem_u32();
    let bt = BTF as usize;
    let rows = (n * cw) as usize;
    let xs = (4 * rows * m as usize).next_multiple_of(16);
    let part = xs + (2 * bt * rows).next_multiple_of(16);
    SmemF {
        phis: base as *mut f32,
        xs: base.add(xs) as *mut u16,
        part: base.add(part) as *mut f64,
        phis32: base32,
        xs32: base32 + xs as u32,
    }
}

crate::entry_directive!("mhc_pre_partial_slab", ".maxntid 512, 1, 1 .minnctapersm 1");

/// Kernel 1 from the phi slab with stored partials (n ≤ [`NMAX_SMALL_N`], for batches whose
/// [`mhc_pre_mix_fixed_point`] grid does not fit): grid `(G, groups)`, block `(T, 1, 1)`; block
/// `g` owns the channel columns `[g·cw, min((g+1)·cw, c))` and writes its partial logits and Σx²
/// of every batch row of its y range to `part[(β·(m+1) + q)·G + g]` (f64), the layout
/// [`mhc_pre_mix`] and [`mhc_pre_mix_small_n`] read; slab staging and block partials of
/// [`pre_slab_body`]. Triggers the dependent launch of kernel 2 at entry.
#[inline(always)]
unsafe fn partial_slab(a: PrePartialSlabArgs) {
    let PrePartialSlabArgs { phi, x, part_ws, batch, n, c, cw, bpc, .. } = a;
    grid_launch_dependents();
    pre_slab_body(phi, XSrc::plain(x), batch, n, c, cw, bpc, part_ws, None);
}

/// Kernel 1 of the fused post→pre op (MHCPostPreFwd): [`mhc_pre_partial_slab_fixed_point`] with x
/// computed from the post half's inputs and written to `x_out` unless it is null ([`XSrc`]).
/// Triggers the dependent launch of kernel 2 at entry.
#[inline(always)]
unsafe fn post_pre_partial_slab_fixed_point(a: PostPrePartialArgs) {
    post_pre_partial_slab_fixed_point_copies(a, 1);
}

/// [`mhc_post_pre_partial_slab_fixed_point`] adding into [`ACC_COPIES_MAX`] copies of the
/// accumulators per half (block `g` into copy `g mod 2`; [`mhc_post_pre_mix_fixed_point_acc2`]
/// sums them).
#[inline(always)]
unsafe fn post_pre_partial_slab_fixed_point_acc2(a: PostPrePartialArgs) {
    post_pre_partial_slab_fixed_point_copies(a, ACC_COPIES_MAX);
}

#[inline(always)]
unsafe fn post_pre_partial_slab_fixed_point_copies(a: PostPrePartialArgs, acc_copies: u32) {
    let PostPrePartialArgs {
        phi,
        x_layer_out,
        h_post_in,
        x_res_in,
        x_out,
        part_ws,
        batch,
        n,
        c,
        cw,
        bpc,
        alpha_pre,
        alpha_post,
        alpha_res,
        inv_sqrt_nc,
    } = a;
    grid_launch_dependents();
    let src = XSrc { x: x_res_in, post: true, x_layer_out, h_post_in, x_out };
    let scales = Some(FixedPoint { alpha: [alpha_pre, alpha_post, alpha_res], inv_sqrt_nc, acc_copies });
    pre_slab_body(phi, src, batch, n, c, cw, bpc, part_ws, scales);
}

/// Zeroes the accumulator half that the epoch parity `par` does not name (`acc_words` u64 words
/// from `part_ws`), the words spread over every thread of the grid (each block calls it once).
#[inline(always)]
unsafe fn zero_other_half(part_ws: *mut f64, par: u32, acc_words: u32) {
    let nt = block_dim_x();
    let other = (part_ws as *mut u64).add((((par & 1) ^ 1) * acc_words) as usize);
    let step = grid_dim_x() * grid_dim_y() * nt;
    let mut i = (block_idx_y() * grid_dim_x() + block_idx_x()) * nt + thread_idx_x();
    while i < acc_words {
        *other.add(i as usize) = 0;
        i += step;
    }
}

/// A row block of the fixed-point kernel 1 (MHCPreFwd's and the fused op's): Σx² of batch row β
/// (of x, or of the post half's output) by [`row_sumsq`] in the order of [`MIX_BLOCK_SMALL_N`]
/// threads (the same bits for both ops), then thread 0 stores the three logit scales
/// `alpha_k/r` (f64) at u64 words `at + 3β ..` of `part_ws`, which kernel 2 reads after its
/// wait. The block needs ≥ 256 threads (the slab kernel's are 256 or 512) and
/// `kernel_abi::mhc::ROW_BLOCK_SMEM` bytes of shared memory (the host launches at least that).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn row_scales(
    src: XSrc,
    part_ws: *mut f64,
    at: u32,
    beta: u32,
    n: u32,
    c: u32,
    alpha: [f32; 3],
    inv_sqrt_nc: f64,
) {
    let ssw = dyn_smem::<f64>();
    let t = thread_idx_x();
    row_sumsq(src, beta, n, c, t, MIX_BLOCK_SMALL_N, ssw);
    if t == 0 {
        let inv_r = inv_r_of(sum4(ssw, MIX_BLOCK_SMALL_N >> 5, 1), inv_sqrt_nc);
        let out = part_ws.add((at + ROW_SCALES * beta) as usize);
        let mut k = 0;
        while k < ROW_SCALES as usize {
            *out.add(k) = alpha[k] as f64 * inv_r;
            k += 1;
        }
    }
}

/// The scalar parameters of the coefficient phase.
#[derive(Clone, Copy)]
struct PreCoef {
    alpha_pre: f32,
    alpha_post: f32,
    alpha_res: f32,
    repeat: u32,
    eps: f32,
    inv_sqrt_nc: f64,
}

/// Where [`coefficients_warp`] puts one batch row's coefficients: `hs[n]` H_pre, `zr[n²]`
/// residual logits (f64), `ra[n²]` R (after Sinkhorn), `rb[n²]` scratch; `h_post[n]` (global,
/// null: not written).
struct CoefOut {
    hs: *mut f32,
    zr: *mut f64,
    ra: *mut f32,
    rb: *mut f32,
    h_post: *mut f32,
}

/// One batch row's coefficients by one warp (lane `lane`), from the totals `tot[0..m]` (logits)
/// and `tot[m]` (Σx²): `r` and the logits in f64, H_pre and h_post = 2σ, R = exp(z − row max)
/// then `repeat` Sinkhorn rounds (`div.rn`, sums in index order). Element-parallel over the
/// lanes with warp barriers only; the same arithmetic as [`mhc_pre_mix`]'s block-parallel code, so the same
/// bits. Every lane of the warp must call it.
#[inline(always)]
unsafe fn coefficients_warp(
    tot: *const f64,
    bias: impl Fn(u32) -> f32,
    n: u32,
    coef: PreCoef,
    out: CoefOut,
    lane: u32,
) {
    let PreCoef { alpha_pre, alpha_post, alpha_res, repeat, eps, inv_sqrt_nc } = coef;
    let m = n * n + 2 * n;
    let nn = n * n;
    let CoefOut { hs, zr, ra, rb, h_post } = out;
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
        let z = alpha as f64 * *tot.add(e as usize) / r + bias(e) as f64;
        if e < n {
            *hs.add(e as usize) = sigmoid_f64_arg(z);
        } else if e < 2 * n {
            if !h_post.is_null() {
                *h_post.add((e - n) as usize) = 2.0 * sigmoid_f64_arg(z);
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
}

/// The four interleaved f32 FMA chains of one block partial: chain `k` sums
/// `x[r]·phi[r]` over the slab rows `r = slot + 4k, slot + 4k + 16, …` below `rows` (`sq`:
/// `x[r]²` instead, the Σx² item), x (bf16) at shared-window address `xa + 2r`, phi at
/// `pa + 4·m·r`. `M` is `m` as a constant (row offsets as immediates), or 0: `m` at run time.
#[inline(always)]
unsafe fn slab_chains<const M: u32>(xa: u32, pa: u32, m: u32, rows: u32, slot: u32, sq: bool) -> [f32; 4] {
    let m = if M != 0 { M } else { m };
    // Byte steps from row r to row r + 4.
    let (dx, dp) = (8u32, 16 * m);
    let mut xa = xa + 2 * slot;
    let mut pa = pa + 4 * m * slot;
    let term = |xa: u32, pa: u32| -> (f32, f32) {
        let xv = bf16_to_f32(lds_u16(xa));
        (xv, if sq { xv } else { lds_f32(pa) })
    };
    let mut a = [0f32; 4];
    let mut r = slot;
    while r + 12 < rows {
        let v = [term(xa, pa), term(xa + dx, pa + dp), term(xa + 2 * dx, pa + 2 * dp), term(xa + 3 * dx, pa + 3 * dp)];
        a[0] = fma(v[0].0, v[0].1, a[0]);
        a[1] = fma(v[1].0, v[1].1, a[1]);
        a[2] = fma(v[2].0, v[2].1, a[2]);
        a[3] = fma(v[3].0, v[3].1, a[3]);
        xa += 4 * dx;
        pa += 4 * dp;
        r += 16;
    }
    if r < rows {
        let (x0, f0) = term(xa, pa);
        a[0] = fma(x0, f0, a[0]);
    }
    if r + 4 < rows {
        let (x1, f1) = term(xa + dx, pa + dp);
        a[1] = fma(x1, f1, a[1]);
    }
    if r + 8 < rows {
        let (x2, f2) = term(xa + 2 * dx, pa + 2 * dp);
        a[2] = fma(x2, f2, a[2]);
    }
    a
}

/// Slots (threads) per (batch row, group of four logits) in [`slab_logit_quads`].
const QS: u32 = 16;
/// Slab rows per round of [`slab_quad`] (a round's rows past the slab predicated off). Same device
/// call, A B … B A, MHCPreFwd / MHCPostPreFwd hidden-1280, -1920, -2560 (µs): 4 rows 3.97 / 4.16 /
/// 4.77 and 4.06 / 4.48 / 4.96 against 2 rows 4.00 / 4.19–4.22 / 4.77–4.80 and 4.10–4.13 / 4.54 /
/// 4.96; 8 rows keep their loads in local memory (a 160-byte stack frame).
const QU: u32 = 4;

/// The fixed-point block partials of one group of `bga` batch rows: thread `i` takes batch row
/// `i / (G4·QS)` (G4 = ⌈m/4⌉), the four logits `4g .. 4g+3` (`g = (i / QS) mod G4`) and the slab
/// rows `s, s + QS, …` (`s = i mod QS`), one f32 FMA chain per logit with phi's four columns
/// by one 16-byte shared load per row (`m % 4 == 0`); then the QS lanes' sums by a
/// reduce-scatter butterfly ([`reduce_scatter16`]: lane `s` ends with logit `4g + (s >> 2 & 3)`
/// summed over the QS slots in a fixed order, the same bits on its four lanes `s & 3`), and lane
/// `s & 3` adds limb `s & 3` of it. Every thread runs the same number of rounds, and `s` is the
/// thread's lane mod QS (`G4·QS` and the block are multiples of QS), so the QS threads of one
/// (batch row, g) are consecutive lanes of one warp, as the butterfly needs. Against four
/// threads per logit, each four chains of one column by 4-byte loads (23 SASS instructions per
/// four products against 9 here): MHCPreFwd 4.99–5.02 → 4.80–4.86 µs at hidden-2560, the other
/// seed rows of both ops within one CUPTI tick (same device call, A B … B A).
/// `M` is `m` as a constant (at n = 4 the item division is then by a constant), or 0: `m` at run
/// time.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn slab_logit_quads<const M: u32>(
    sm: SmemF,
    part_ws: *mut f64,
    par: u32,
    (bm, acc_copies): (u32, u32),
    b0: u32,
    bga: u32,
    m: u32,
    rows: u32,
    t: u32,
    nt: u32,
) {
    let m = if M != 0 { M } else { m };
    let g4 = m.div_ceil(4);
    let per_row = g4 * QS;
    let total = bga * per_row;
    // Block g adds into copy g mod acc_copies (a power of two) of this half ([`acc_word`]),
    // whose words lie `bm = batch·m` apart.
    let at = acc_word(par & 1, block_idx_x() & (acc_copies - 1), 0, 0, acc_copies, bm);
    let acc = (part_ws as *mut u64).add(at as usize);
    let mut i0 = 0;
    while i0 < total {
        let i = i0 + t;
        let (bl, rem) = divrem_u32(i, per_row);
        let g = rem / QS;
        let s = rem & (QS - 1);
        let mut a = [0f32; 4];
        if i < total {
            let xa = sm.xs32 + 2 * bl * rows;
            a = slab_quad::<M>(xa, sm.phis32, m, rows, s, g);
        }
        let (sum, k) = reduce_scatter16(a, s);
        let q = 4 * g + k;
        if i < total && q < m {
            // The group's limbs staged in shared memory and added by one bulk reduction
            // (`cp.reduce.async.bulk … .add.u64`) instead: +0.10…+0.22 µs. Pairs of blocks in a
            // 2-block cluster adding their limbs as integers before one add: +0.16…+0.41 µs.
            add_limb(acc.add(((b0 + bl) * m + q) as usize), sum, s & 3, bm);
        }
        i0 += nt;
    }
}

/// One thread's four f32 FMA chains of [`slab_logit_quads`]: chain `k` sums `x[r]·phi[r][4g+k]`
/// over the slab rows `r = slot, slot + QS, …` below `rows` (x bf16 at `xa + 2r`, phi row `r` at
/// `pa + 4·m·r`; columns past `m` are 0). `M` is `m` as a constant, or 0: `m` at run time.
#[inline(always)]
unsafe fn slab_quad<const M: u32>(xa: u32, pa: u32, m: u32, rows: u32, slot: u32, g: u32) -> [f32; 4] {
    let m = if M != 0 { M } else { m };
    let (dx, dp) = (2 * QS, 4 * m * QS);
    let mut xa = xa + 2 * slot;
    let mut pa = pa + 4 * (m * slot + 4 * g);
    let load = |pa: u32| -> [f32; 4] {
        if m % 4 == 0 {
            let v = lds_v4(pa);
            [f32::from_bits(v[0]), f32::from_bits(v[1]), f32::from_bits(v[2]), f32::from_bits(v[3])]
        } else {
            let mut v = [0f32; 4];
            let mut k = 0;
            while k < 4 {
                if 4 * g + k < m {
                    v[k as usize] = lds_f32(pa + 4 * k);
                }
                k += 1;
            }
            v
        }
    };
    let mut a = [0f32; 4];
    let mut r = slot;
    // QU rows per round, the round's loads issued before its FMAs; a round's rows past the slab
    // load nothing and add nothing (predicated: no remainder loop).
    while r < rows {
        let mut xv = [0f32; QU as usize];
        let mut pv = [[0f32; 4]; QU as usize];
        let mut u = 0;
        while u < QU {
            if r + u * QS < rows {
                xv[u as usize] = bf16_to_f32(lds_u16(xa + u * dx));
                pv[u as usize] = load(pa + u * dp);
            }
            u += 1;
        }
        let mut u = 0;
        while u < QU {
            if r + u * QS < rows {
                let mut k = 0;
                while k < 4 {
                    a[k] = fma(xv[u as usize], pv[u as usize][k], a[k]);
                    k += 1;
                }
            }
            u += 1;
        }
        xa += QU * dx;
        pa += QU * dp;
        r += QU * QS;
    }
    a
}

/// The sums over the 16 lanes `s` of a lane group of four values each: lane `s` returns value
/// `k = 2·(s >> 3 & 1) + (s >> 2 & 1)` summed over all 16 lanes, and `k`. Levels: lane bit 3
/// keeps two values and sends two, bit 2 one and one, then bits 1 and 0 a full butterfly (the
/// four lanes `s & 3` end with the same bits). A fixed order: bitwise reproducible.
#[inline(always)]
fn reduce_scatter16(a: [f32; 4], s: u32) -> (f32, u32) {
    let hi = s & 8 != 0;
    let (k0, k1, s0, s1) = if hi { (a[2], a[3], a[0], a[1]) } else { (a[0], a[1], a[2], a[3]) };
    let b0 = k0 + shfl_xor_f32(s0, 8);
    let b1 = k1 + shfl_xor_f32(s1, 8);
    let mid = s & 4 != 0;
    let (kk, ss) = if mid { (b1, b0) } else { (b0, b1) };
    let mut c = kk + shfl_xor_f32(ss, 4);
    c += shfl_xor_f32(c, 2);
    c += shfl_xor_f32(c, 1);
    (c, 2 * hi as u32 + mid as u32)
}

/// One thread's item of a group's x tile as loaded (before the post half's arithmetic): x's (or
/// x_res's) 8 elements, or 1 (in word 0), and in the fused op x_layer_out's and h_post's.
#[derive(Clone, Copy)]
struct XRaw {
    xr: [u32; 4],
    y: [u32; 4],
    h: f32,
    /// The item's stream row `r = β·n + k` (global β) and column `j`.
    r: u32,
    j: u32,
}

/// The staging of one group's x tile, `x[b0+β, k·c + j0 + jj] → xs[(β·n + k)·cwa + jj]` (bf16):
/// item (row segment `β·n + k`, column) is 8 elements by 16-byte loads where every row segment is
/// 16-byte aligned (`xvec`), else one. Loads and stores are separate, so that kernel 1 issues its
/// first item's loads before the phi slab's copies and stores them after.
#[derive(Clone, Copy)]
struct XStage {
    src: XSrc,
    sm: SmemF,
    n: u32,
    c: u32,
    j0: u32,
    cwa: u32,
    xvec: bool,
}

impl XStage {
    /// Items per row segment: 8-element chunks (`xvec`) or elements.
    fn cols(self) -> u32 {
        if self.xvec {
            self.cwa / 8
        } else {
            self.cwa
        }
    }

    /// The loads of item `col` of row segment `row` (stream row `b0·n + row`); none past the
    /// group's `nrow` segments.
    #[inline(always)]
    unsafe fn load(self, b0: u32, nrow: u32, row: u32, col: u32) -> XRaw {
        let mut v = XRaw { xr: [0; 4], y: [0; 4], h: 0.0, r: 0, j: 0 };
        if row < nrow && col < self.cols() {
            let r = b0 * self.n + row;
            let j = self.j0 + if self.xvec { 8 * col } else { col };
            (v.r, v.j) = (r, j);
            let e = (r * self.c + j) as usize;
            let src = self.src;
            let ye = if src.post { (divrem_u32(r, self.n).0 * self.c + j) as usize } else { 0 };
            if self.xvec {
                v.xr = ld_nc_v4(src.x.add(e) as *const u32);
                if src.post {
                    v.y = ld_nc_v4(src.x_layer_out.add(ye) as *const u32);
                }
            } else {
                v.xr[0] = *src.x.add(e) as u32;
                if src.post {
                    v.y[0] = *src.x_layer_out.add(ye) as u32;
                }
            }
            if src.post {
                v.h = *src.h_post_in.add(r as usize);
            }
        }
        v
    }

    /// An item loaded by [`XStage::load`] into the x tile (nothing for one past the group): the
    /// post half's arithmetic first in the fused op, whose output also goes to `x_out` when asked
    /// (this block is the only one staging these elements).
    #[inline(always)]
    unsafe fn store(self, b0: u32, nrow: u32, row: u32, col: u32, v: XRaw) {
        if row >= nrow || col >= self.cols() {
            return;
        }
        let src = self.src;
        let (r, j) = (v.r, v.j);
        let e = (r * self.c + j) as usize;
        let t = ((r - b0 * self.n) * self.cwa + j - self.j0) as usize;
        if self.xvec {
            let o = if src.post { fma8(v.h, v.y, v.xr) } else { v.xr };
            if src.post && !src.x_out.is_null() {
                st_v4(src.x_out.add(e) as *mut u32, o);
            }
            st_v4_generic(self.sm.xs.add(t) as *mut u32, o);
        } else {
            let o = if src.post {
                post_elem(v.h, bf16_to_f32(v.y[0] as u16), bf16_to_f32(v.xr[0] as u16))
            } else {
                v.xr[0] as u16
            };
            if src.post && !src.x_out.is_null() {
                *src.x_out.add(e) = o;
            }
            *self.sm.xs.add(t) = o;
        }
    }
}

/// The body of the slab kernels 1: phi slab (`cp.async`) and x staged in shared memory, then
/// the block partials. Fixed point ([`slab_logit_quads`]): 16 threads per (batch row, four
/// logits), each four f32 FMA chains over every 16th row of the slab with phi's four columns
/// by one 16-byte shared load, a reduce-scatter butterfly, then limb adds into the fixed-point
/// accumulators. Stored partials: each item (batch row, quantity) by four threads, each four
/// f32 FMA chains over every fourth row, a fixed-order quad butterfly, the partials stored to
/// `part_ws`. An FMA rounds once; the products are f32: a block partial carries f32 rounding
/// (relative error ≈ 2^-24·√(rows/16) of the summed magnitudes), the sum over blocks none.
/// Measured slower (`docs/decisions/mhc.md`): an fp64 tensor-core product on the same slab, the products straight from global memory, f64 FMAs with two
/// conversions per product, one launch of a thread-block cluster doing the coefficients and
/// mixing too, and a cluster launch of kernel 1 summing partials through DSMEM.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn pre_slab_body(
    phi: *const f32,
    xsrc: XSrc,
    batch: u32,
    n: u32,
    c: u32,
    cw: u32,
    bpc: u32,
    part_ws: *mut f64,
    scales: Option<FixedPoint>,
) {
    // The fixed-point kernels pass their logit scales' factors (for the row blocks); the
    // stored-partials kernel passes none.
    let fixed_point = scales.is_some();
    let t = thread_idx_x();
    let nt = block_dim_x();
    let rank = block_idx_x();
    let cs = grid_dim_x();
    let m = n * n + 2 * n;
    let mq = m + 1;
    let sm = layout_slab(m, n, cw);
    let j0 = rank * cw;
    // 0 for the row blocks (past the last column).
    let cwa = min_u32(cw, c.saturating_sub(j0));
    let rows = n * cwa;
    let b_lo = block_idx_y() * bpc;
    let b_hi = min_u32(batch, b_lo + bpc);
    // 16-byte copies of x into shared memory when every row segment is 16-byte aligned.
    let x = xsrc.x;
    let xvec = (x as u64) & 15 == 0
        && c % 8 == 0
        && cw % 8 == 0
        && cwa % 8 == 0
        && (!xsrc.post || ((xsrc.x_layer_out as u64) | (xsrc.x_out as u64)) & 15 == 0);
    // Fixed point: this call's accumulators are the half of `part_ws` that the epoch word's
    // parity names; the other half (read by the previous call's kernel 2, which has completed) is
    // zeroed here for the next call, the words spread over every block of the grid.
    // The epoch load is issued here and first used after the staging barrier (its DRAM trip
    // overlaps the phi and x loads); the zeroing stores follow that barrier.
    // This half's words: `acc_copies` copies of ACC_WORDS words per (batch row, logit).
    let acc_copies = if let Some(f) = scales { f.acc_copies } else { 1 };
    let acc_words = acc_copies * ACC_WORDS * batch * m;
    let par = if fixed_point {
        core::ptr::read_volatile((part_ws as *const u64).add(2 * acc_words as usize) as *const u32)
    } else {
        0
    };
    if fixed_point {
        // Both accumulator halves and the epoch word into L2 while the slab loads: after a cold
        // start (the bench's L2 flush) the limb adds and zeroing stores would otherwise wait for
        // DRAM at the end of the kernel.
        let bytes = (2 * acc_words + 1) * 8;
        let i = (block_idx_y() * grid_dim_x() + block_idx_x()) * nt + t;
        // Every 128-byte line the words touch, also with an unaligned `part_ws` (the last
        // thread asks for the line of the last byte).
        if i * 128 < bytes + 127 {
            prefetch_global_l2((part_ws as *const u8).add(min_u32(i * 128, bytes - 1) as usize));
        }
    }

    // ---- the first group's first x item: its loads issued before the slab's copies (the
    // tile's DRAM trip starts as early as the slab's).
    // Item (row segment, column) of the tile by (warp, lane): rows w, w + warps, …; columns
    // lane, lane + 32, … (no index division).
    let stage = XStage { src: xsrc, sm, n, c, j0, cwa, xvec };
    let (w, lane, warps) = (t >> 5, t & 31, nt >> 5);
    let first = stage.load(b_lo, n * min_u32(BTF, b_hi - b_lo), w, lane);

    // ---- phi slab → shared memory, asynchronously: segment k = phi rows k·c + j0 .. + cwa, at
    // a stride of c·m floats in phi and seg in the slab.
    let seg = cwa * m; // floats per segment

    // (A row block's `j0` is past phi's columns: its addresses are formed, never used.)
    let src0 = phi.wrapping_add((j0 * m) as usize) as *const u8;
    let dst0 = sm.phis as *mut u8;
    if (src0 as u64 | (4 * seg) as u64 | (4 * c * m) as u64) & 15 == 0 {
        let mut k = 0;
        while k < n {
            let (src, dst) = (src0.wrapping_add((4 * k * c * m) as usize), sm.phis32 + 4 * k * seg);
            let mut i = t;
            while i < seg / 4 {
                cp_async_16_s(dst + 16 * i, src.add(16 * i as usize));
                i += nt;
            }
            k += 1;
        }
    } else {
        let mut k = 0;
        while k < n {
            let (src, dst) = (src0.wrapping_add((4 * k * c * m) as usize), dst0.add((4 * k * seg) as usize));
            let mut i = t;
            while i < seg {
                cp_async_4(dst.add(4 * i as usize), src.add(4 * i as usize));
                i += nt;
            }
            k += 1;
        }
    }

    if let Some(FixedPoint { alpha, inv_sqrt_nc, .. }) = scales {
        // Row blocks (fixed point): after the ⌈c/cw⌉ partial blocks, block ⌈c/cw⌉ + i takes
        // batch row b_lo + i of the group (rows past the batch only zero their share). They
        // branch off only here, after the partial blocks' first loads and copies (a row block
        // has no columns, `cwa = 0`, so it issues none of them): ptxas lays the row blocks'
        // code out first, and the partial blocks' loads sat behind it (from `0x2430` to
        // `0x500`; MHCPreFwd −0.03 / −0.10 / −0.03 µs, the fused op's hidden-1920 −0.07, same
        // device call, outputs bitwise equal).
        let gp = c.div_ceil(cw);
        if rank >= gp {
            let beta = b_lo + (rank - gp);
            if beta < b_hi {
                row_scales(xsrc, part_ws, 2 * acc_words + 1, beta, n, c, alpha, inv_sqrt_nc);
            }
            zero_other_half(part_ws, par, acc_words);
            return;
        }
    }

    let mut b0 = b_lo;
    while b0 < b_hi {
        let bga = min_u32(BTF, b_hi - b0);
        // ---- x[b0+β, k·c + j0 + jj] → xs[(β·n + k)·cwa + jj] (bf16), row segments of cwa.
        // Measured and dropped: each item's successor loaded before the item's stores, +0…+0.04
        // µs (every seed row stages at most one item per thread).
        let nrow = bga * n;
        let (mut row, mut col) = (w, lane);
        if b0 == b_lo {
            stage.store(b0, nrow, row, col, first);
            col += 32;
        }
        while row < nrow {
            while col < stage.cols() {
                stage.store(b0, nrow, row, col, stage.load(b0, nrow, row, col));
                col += 32;
            }
            row += warps;
            col = lane;
        }
        cp_async_wait_all();
        sync_threads();
        if fixed_point && b0 == b_lo {
            zero_other_half(part_ws, par, acc_words);
        }

        let items = bga * mq;
        if fixed_point {
            // n = 4 (m = 24) with m a constant.
            if m == 24 {
                slab_logit_quads::<24>(sm, part_ws, par, (batch * m, acc_copies), b0, bga, m, rows, t, nt);
            } else {
                slab_logit_quads::<0>(sm, part_ws, par, (batch * m, acc_copies), b0, bga, m, rows, t, nt);
            }
        } else {
            // ---- block partial of item (βl, q) by f32 FMAs from the slab: thread i < 4·items owns
            // item i >> 2 and the rows slot, slot + 4, … (slot = i & 3) in four interleaved chains,
            // then the quad's (s0 + s1) + (s2 + s3) by butterfly (every lane the same bits). Every
            // thread runs the same number of rounds.
            let mut i0 = 0;
            while i0 < 4 * items {
                let i = i0 + t;
                let mut sum = 0f32;
                let item = i >> 2;
                let bl = item / mq;
                let q = item - bl * mq;
                if i < 4 * items {
                    // Row r's x at `xa + 2r`, its phi at `pa + 4·m·r` (shared-window addresses,
                    // stepped per round: no 64-bit address per load). n = 4 (m = 24) takes the
                    // rows' offsets as immediates.
                    let xa = sm.xs32 + 2 * bl * rows;
                    let pa = sm.phis32 + 4 * min_u32(q, m - 1);
                    let a = if m == 24 {
                        slab_chains::<24>(xa, pa, m, rows, i & 3, q == m)
                    } else {
                        slab_chains::<0>(xa, pa, m, rows, i & 3, q == m)
                    };
                    sum = (a[0] + a[1]) + (a[2] + a[3]);
                }
                sum += shfl_xor_f32(sum, 1);
                sum += shfl_xor_f32(sum, 2);
                if i < 4 * items && i & 3 == 0 {
                    *sm.part.add(item as usize) = sum as f64;
                }
                i0 += nt;
            }
        }
        if fixed_point {
            // The next group stages its x tile once every thread has read this one.
            if b0 + bga < b_hi {
                sync_threads();
            }
            b0 += bga;
            continue;
        }
        // This block's partials of the group, then the next group.
        sync_threads();
        let mut i = t;
        while i < items {
            let (bl, q) = divrem_u32(i, mq);
            *part_ws.add((((b0 + bl) * mq + q) * cs + rank) as usize) = *sm.part.add(i as usize);
            i += nt;
        }
        sync_threads();
        b0 += bga;
    }
}
