//! EngramGateConvFwd / EngramGateConvBwd kernels (docs/ops.md §4–§5).
//!
//! Both ops are row-local except the causal depthwise conv (kernel 4), which reads `u` of rows
//! t−3..t (forward) and, in the backward, `dconv` of rows t..t+3. A block owns a tile of `R`
//! consecutive rows of one sequence `m` and recomputes the halo rows' per-row scalars itself
//! (3 rows before the tile in the forward; 3 before and 3 after in the backward), so one launch
//! needs no exchange between blocks and nothing crosses the `m` boundary (a halo row with
//! t < 0 or t ≥ T does not exist and contributes zero).
//!
//! Block layout: one warp per tile row including the halo (`R+3` warps forward, `R+6`
//! backward); warp `i` owns row `t = t0 − 3 + i`. A lane owns 8-element chunks
//! `c = lane + 32·n` of the row. With `NV > 0` ("resident") the row's inputs stay in
//! registers between the phases (needs `ceil(d/8) ≤ 32·NV`, `d % 8 == 0`, 16-byte aligned
//! rows); with `NV = 0` ("streaming") every phase reloads them (L1 hits), which works for any
//! `d`. `FAST` selects 16-byte vector accesses (`d % 8 == 0`, aligned) or scalar ones (any `d`,
//! any alignment). Row reductions are warp butterflies (fixed order).
//!
//! Halo rows recompute exactly what their owner computes (the same instructions on the same
//! data), so `q(alpha·v)` of a halo row is bitwise the `vhat` its owner writes.
use crate::prim::*;
use kernel_abi::engram::gate::layout::*;
use kernel_abi::engram::gate::{CHUNK_ROW_SHIFT, WARP_ROW_SHIFT};
use kernel_abi::{GateBwdArgs, GateBwdReduceArgs, GateBwdSplitArgs, GateFwdArgs, GateFwdSmemArgs};

// ---------------------------------------------------------------- storage dtypes

/// The 16-bit storage type of a kernel instance.
use crate::prim::Half16 as Dt;

type Raw = [u32; 4];
type F8 = [f32; 8];

/// Loads the raw 16 bytes of chunk `c` (elements 8c..8c+8) of `row` (FAST layout only).
#[inline(always)]
unsafe fn ld_raw(row: *const u16, c: u32) -> Raw {
    ld_nc_v4(row.add(c as usize * 8) as *const u32)
}

#[inline(always)]
fn unpack8<D: Dt>(r: Raw) -> F8 {
    let mut o = [0f32; 8];
    let mut q = 0;
    while q < 4 {
        let (a, b) = D::unpack2(r[q]);
        o[2 * q] = a;
        o[2 * q + 1] = b;
        q += 1;
    }
    o
}

/// Chunk `c` of `row` as f32; elements at or beyond `d` read as 0 (scalar path).
#[inline(always)]
unsafe fn ld8<D: Dt, const FAST: bool>(row: *const u16, c: u32, d: u32) -> F8 {
    if FAST {
        unpack8::<D>(ld_raw(row, c))
    } else {
        let mut o = [0f32; 8];
        let j0 = c * 8;
        let mut e = 0;
        while e < 8 {
            if j0 + e < d {
                o[e as usize] = D::to_f32(*row.add((j0 + e) as usize));
            }
            e += 1;
        }
        o
    }
}

/// Chunk `c` of an f32 row in scratch (generic address: shared or global); scratch rows are
/// padded to a multiple of 8 elements, so the whole chunk is always addressable.
#[inline(always)]
unsafe fn ld8_f32(row: *const f32, c: u32) -> F8 {
    let p = row.add(c as usize * 8);
    let mut o = [0f32; 8];
    let mut e = 0;
    while e < 8 {
        o[e] = *p.add(e);
        e += 1;
    }
    o
}

#[inline(always)]
unsafe fn st8_f32(row: *mut f32, c: u32, v: F8) {
    let p = row.add(c as usize * 8);
    let mut e = 0;
    while e < 8 {
        *p.add(e) = v[e];
        e += 1;
    }
}

/// Rounds 8 values to the dtype and stores chunk `c` of `row` (elements ≥ d are skipped).
#[inline(always)]
unsafe fn st8<D: Dt, const FAST: bool>(row: *mut u16, c: u32, d: u32, v: F8) {
    if FAST {
        let w = [D::pack2(v[0], v[1]), D::pack2(v[2], v[3]), D::pack2(v[4], v[5]), D::pack2(v[6], v[7])];
        st_v4(row.add(c as usize * 8) as *mut u32, w);
    } else {
        let j0 = c * 8;
        let mut e = 0;
        while e < 8 {
            if j0 + e < d {
                *row.add((j0 + e) as usize) = D::from_f32(v[e as usize]);
            }
            e += 1;
        }
    }
}

/// Prefetches into L1 the lines of chunk `c` of `conv_w` (4 rows) and of `rms_w_v`, which the
/// conv phase reads after the block barrier (their first touch after an L2 flush is a DRAM
/// round trip that would otherwise sit on the critical path).
#[inline(always)]
unsafe fn prefetch_conv_weights(cw: *const u16, wv: *const u16, c: u32, d: u32) {
    let j = (c * 8) as usize;
    if j < d as usize {
        prefetch_l1(wv.add(j) as *const u8);
        for p in 0..CONV_TAPS {
            prefetch_l1(cw.add(p * d as usize + j) as *const u8);
        }
    }
}

/// `q(x)` as f32: round to the dtype and back.
#[inline(always)]
fn qf<D: Dt>(x: f32) -> f32 {
    D::to_f32(D::from_f32(x))
}

/// `1/sqrt(sum/d + eps)` with correctly rounded steps.
#[inline(always)]
fn rrms(sum: f32, d: f32, eps: f32) -> f32 {
    rcp_rn(sqrt_rn(div_rn(sum, d) + eps))
}

/// [`rrms`] by `rsqrt.approx` and one Newton step (≈ 1–2 ulp f32), `inv_d` = 1/d.
#[inline(always)]
fn rrms_fast(sum: f32, inv_d: f32, eps: f32) -> f32 {
    let x = fma(sum, inv_d, eps);
    let r = rsqrt_approx(x);
    let n = r * fma(-0.5 * x, r * r, 1.5);
    if r == f32::INFINITY {
        r
    } else {
        n
    }
}

/// Runs `$body` for each chunk `$c` of this lane with its resident index `$n`: unrolled over
/// `n < NV` (constant indices, so resident arrays stay in registers) when `NV > 0`, a loop
/// over `c = lane + 32·n < nch` otherwise.
macro_rules! each_chunk {
    ($nv:expr, $lane:expr, $nch:expr, |$n:ident, $c:ident| $body:block) => {{
        if $nv > 0 {
            each_chunk!(@one $nv, $lane, $nch, 0, $n, $c, $body);
            each_chunk!(@one $nv, $lane, $nch, 1, $n, $c, $body);
            each_chunk!(@one $nv, $lane, $nch, 2, $n, $c, $body);
            each_chunk!(@one $nv, $lane, $nch, 3, $n, $c, $body);
        } else {
            let mut $c = $lane;
            #[allow(unused_variables)]
            let $n = 0usize;
            while $c < $nch {
                $body
                $c += 32;
            }
        }
    }};
    (@one $nv:expr, $lane:expr, $nch:expr, $k:expr, $n:ident, $c:ident, $body:block) => {
        if $k < $nv {
            #[allow(unused_variables)]
            let $n: usize = $k;
            let $c = $lane + 32 * $k as u32;
            if $c < $nch $body
        }
    };
}

/// Resident chunk `n` (requires n < NV).
#[inline(always)]
unsafe fn res<const NV: usize>(a: &[Raw; NV], n: usize) -> Raw {
    *a.get_unchecked(n)
}

// ---------------------------------------------------------------- forward

/// EngramGateConvFwd, rows streamed (launch contract: [`GateFwdArgs`]); block `b` owns tile
/// `b % ntiles` of sequence `b / ntiles`. `wh, wv, cw` are `rms_w_h, rms_w_v, conv_w`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn fwd<D: Dt, const FAST: bool, const NV: usize>(
    h: *const u16,
    k: *const u16,
    v: *const u16,
    wh: *const u16,
    wv: *const u16,
    cw: *const u16,
    y: *mut u16,
    vhat: *mut u16,
    alpha_o: *mut f32,
    rh_o: *mut f32,
    rk_o: *mut f32,
    rv_o: *mut f32,
    t_len: u32,
    d: u32,
    r: u32,
    ntiles: u32,
    eps: f32,
) {
    let lane = lane_id();
    let i = thread_idx_x() / 32;
    let m = block_idx_x() / ntiles;
    let t0 = (block_idx_x() - m * ntiles) * r;
    let nch = d.div_ceil(8);
    let df = d as f32;
    let sm = dyn_smem::<f32>();
    let (s_alpha, s_rv) = (sm, sm.add((r + 3) as usize));

    // ---- phase 1: per-row scalars of every tile row (warp i ↔ t = t0 − 3 + i)
    let t = (t0 + i) as i32 - 3;
    if i < r + 3 && t >= 0 && (t as u32) < t_len {
        let row = (m * t_len + t as u32) as usize * d as usize;
        let (hr, kr, vr) = (h.add(row), k.add(row), v.add(row));
        let owned = i >= 3;
        let (mut shh, mut skk, mut shk) = (0f32, 0f32, 0f32);
        let mut vres: [Raw; NV] = [[0; 4]; NV];
        let mut hres: [Raw; NV] = [[0; 4]; NV];
        let mut kres: [Raw; NV] = [[0; 4]; NV];
        let mut wres: [Raw; NV] = [[0; 4]; NV];
        // resident: issue every load of the row first
        each_chunk!(NV, lane, nch, |n, c| {
            if NV > 0 {
                *hres.get_unchecked_mut(n) = ld_raw(hr, c);
                *kres.get_unchecked_mut(n) = ld_raw(kr, c);
                *vres.get_unchecked_mut(n) = ld_raw(vr, c);
                *wres.get_unchecked_mut(n) = ld_raw(wh, c);
            }
        });
        // the conv weights for phase 2 (one warp suffices: L1 is per SM)
        if i == 3 {
            let mut c = lane;
            while c < nch {
                prefetch_conv_weights(cw, wv, c, d);
                c += 32;
            }
        }
        each_chunk!(NV, lane, nch, |n, c| {
            let (hh, kk, ww) = if NV > 0 {
                (unpack8::<D>(res(&hres, n)), unpack8::<D>(res(&kres, n)), unpack8::<D>(res(&wres, n)))
            } else {
                (ld8::<D, FAST>(hr, c, d), ld8::<D, FAST>(kr, c, d), ld8::<D, FAST>(wh, c, d))
            };
            for e in 0..8 {
                shh = fma(hh[e], hh[e], shh);
                skk = fma(kk[e], kk[e], skk);
                shk = fma(hh[e] * kk[e], ww[e] * ww[e], shk);
            }
        });
        let (shh, skk, shk) = (warp_sum_f32(shh), warp_sum_f32(skk), warp_sum_f32(shk));
        let rh = rrms(shh, df, eps);
        let rk = rrms(skk, df, eps);
        let alpha = sigmoid(div_rn(shk * rh * rk, sqrt_rn(df)));
        let vq_out = vhat.add(row);
        let mut svv = 0f32;
        each_chunk!(NV, lane, nch, |n, c| {
            let vv = if NV > 0 { unpack8::<D>(res(&vres, n)) } else { ld8::<D, FAST>(vr, c, d) };
            let mut o = [0f32; 8];
            for e in 0..8 {
                o[e] = qf::<D>(alpha * vv[e]);
                svv = fma(o[e], o[e], svv);
            }
            if owned {
                st8::<D, FAST>(vq_out, c, d, o);
            }
        });
        let rv = rrms(warp_sum_f32(svv), df, eps);
        if lane == 0 {
            *s_alpha.add(i as usize) = alpha;
            *s_rv.add(i as usize) = rv;
            if owned {
                let rix = (m * t_len + t as u32) as usize;
                *alpha_o.add(rix) = alpha;
                *rh_o.add(rix) = rh;
                *rk_o.add(rix) = rk;
                *rv_o.add(rix) = rv;
            }
        }
    }
    sync_threads();

    // ---- phase 2: conv and Y, element chunks of the R owned rows spread over the block
    let total = r * nch;
    let mut e = thread_idx_x();
    while e < total {
        let io = e / nch; // owned row index 0..R (tile row io + 3)
        let c = e - io * nch;
        let t = t0 + io;
        if t < t_len {
            let base = (m * t_len) as usize;
            let wvv = ld8::<D, FAST>(wv, c, d);
            let mut conv = [0f32; 8];
            let mut vt = [0f32; 8];
            for p in 0..CONV_TAPS as u32 {
                // u of row t − 3 + p (tile row io + p)
                if t + p >= 3 {
                    let tp = t + p - 3;
                    let ip = (io + p) as usize;
                    let (a, rv) = (*s_alpha.add(ip), *s_rv.add(ip));
                    let vv = ld8::<D, FAST>(v.add((base + tp as usize) * d as usize), c, d);
                    let cwp = ld8::<D, FAST>(cw.add(p as usize * d as usize), c, d);
                    for q in 0..8 {
                        let u = qf::<D>(a * vv[q]) * rv * wvv[q];
                        conv[q] = fma(cwp[q], u, conv[q]);
                    }
                    if p == 3 {
                        for q in 0..8 {
                            vt[q] = a * vv[q];
                        }
                    }
                }
            }
            let mut out = [0f32; 8];
            for q in 0..8 {
                out[q] = conv[q] * sigmoid(conv[q]) + vt[q];
            }
            st8::<D, FAST>(y.add((base + t as usize) * d as usize), c, d, out);
        }
        e += block_dim_x();
    }
}

// ---------------------------------------------------------------- forward, `u` in shared memory

/// `(wq / nch, wq % nch)` for `wq < 5·nch`, by at most 4 subtractions (no division, so no
/// division-by-zero panic path).
#[inline(always)]
fn split5(wq: u32, nch: u32) -> (u32, u32) {
    let (mut p, mut c) = (0, wq);
    while p < 4 && c >= nch {
        c -= nch;
        p += 1;
    }
    (p, c)
}

/// σ(x)·x with `rcp.approx` (≈1 ulp) instead of the correctly rounded division.
#[inline(always)]
fn silu_approx(x: f32) -> f32 {
    x * rcp_approx(1.0 + exp_f32(-x))
}

/// Per-launch constants of the 2-D-grid forward, computed on the host: `1/d`, `1/√d`
/// (correctly rounded, the bits of the other kernels' `div.rn`), `ceil(2^32 / ceil(d/8))`.
#[derive(Clone, Copy)]
struct FwdHostConsts {
    inv_d: f32,
    inv_sqrt_d: f32,
    nch_magic: u32,
}

const NO_HOST_CONSTS: FwdHostConsts = FwdHostConsts { inv_d: 0.0, inv_sqrt_d: 0.0, nch_magic: 0 };

/// [`rrms_fast`] with `rsqrt.approx.ftz` (the same bits: its argument is ≥ eps, normal).
#[inline(always)]
fn rrms_ftz(sum: f32, inv_d: f32, eps: f32) -> f32 {
    let x = fma(sum, inv_d, eps);
    let r = rsqrt_approx_ftz(x);
    let n = r * fma(-0.5 * x, r * r, 1.5);
    if r == f32::INFINITY {
        r
    } else {
        n
    }
}

/// [`silu_approx`] through the ftz forms of `ex2`/`rcp` (the same bits for x > −87).
#[inline(always)]
fn silu_ftz(x: f32) -> f32 {
    x * rcp_approx_ftz(1.0 + ex2_approx_ftz(-x * core::f32::consts::LOG2_E))
}

/// 8 f32 from shared-window address `a` (32-byte aligned).
#[inline(always)]
unsafe fn lds8(a: u32) -> F8 {
    let (p, q) = (lds_v4(a), lds_v4(a + 16));
    [
        f32::from_bits(p[0]),
        f32::from_bits(p[1]),
        f32::from_bits(p[2]),
        f32::from_bits(p[3]),
        f32::from_bits(q[0]),
        f32::from_bits(q[1]),
        f32::from_bits(q[2]),
        f32::from_bits(q[3]),
    ]
}

/// 8 f32 to shared-window address `a` (32-byte aligned).
#[inline(always)]
unsafe fn sts8(a: u32, v: F8) {
    sts_v4(a, [v[0].to_bits(), v[1].to_bits(), v[2].to_bits(), v[3].to_bits()]);
    sts_v4(a + 16, [v[4].to_bits(), v[5].to_bits(), v[6].to_bits(), v[7].to_bits()]);
}

/// EngramGateConvFwd with `u` in shared memory (resident, 16-byte layout only: `d % 8 == 0`,
/// `ceil(d/8) ≤ 32·NV`, aligned; launch contracts: [`GateFwdArgs`], [`GateFwdSmemArgs`]).
/// Differences from the streaming [`fwd`]: (1) the block loads `rms_w_v` and `conv_w` for real
/// (16-byte loads, into smem) instead of prefetching them; (2) phase 1 writes
/// `u = q(alpha·v)·rv·wv` of its row (and `vh` of owned rows) to smem, so phase 2 is 4 FMAs
/// from smem and the silu per element (no global loads after the barrier); (3) approximate
/// per-row scalars (`rrms` by `rsqrt.approx` + one Newton step, σ by `rcp.approx`, no divisions
/// on the chain; ≈ 1–2 ulp f32 in `alpha`, `rrms_*`, within the tolerances) and silu by
/// `rcp.approx`. A zero `u` row before t = 0 adds `fma(cw, 0, +0) = +0`.
///
/// `GRID_2D`: grid `(ntiles, M)` (no division for the block's sequence; M ≤ 65535), the
/// per-launch constants from the host ([`FwdHostConsts`]; phase 2's row index by a
/// multiply-high, d ≥ 16), every shared-memory access through 32-bit shared-window addresses,
/// the weights copied by `cp.async` after the row loads, the ftz forms of `ex2`/`rcp`/`rsqrt`
/// (bitwise the non-ftz forms where |conv| and |alpha's logit| < 87). Otherwise grid
/// `M·ntiles` (1-D) and the constants computed in the kernel.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn fwd_smem<D: Dt, const NV: usize, const GRID_2D: bool>(
    h: *const u16,
    k: *const u16,
    v: *const u16,
    wh: *const u16,
    wv: *const u16,
    cw: *const u16,
    y: *mut u16,
    vhat: *mut u16,
    alpha_o: *mut f32,
    rh_o: *mut f32,
    rk_o: *mut f32,
    rv_o: *mut f32,
    t_len: u32,
    d: u32,
    r: u32,
    ntiles: u32,
    eps: f32,
    lc: FwdHostConsts,
) {
    let tid = thread_idx_x();
    let lane = lane_id();
    let i = tid / 32;
    // GRID_2D: grid (ntiles, M), no division
    let (m, t0) = if GRID_2D {
        (block_idx_y(), block_idx_x() * r)
    } else {
        let m = block_idx_x() / ntiles;
        (m, (block_idx_x() - m * ntiles) * r)
    };
    let nch = d.div_ceil(8);
    let dpad = (nch * 8) as usize;
    let df = d as f32;
    let sm = dyn_smem::<f32>();
    let s_u = sm;
    let s_vh = sm.add((r as usize + 3) * dpad);
    let s_w = sm.add((2 * r as usize + 3) * dpad) as *mut u16;
    // GRID_2D: the same regions through 32-bit shared-window addresses
    let sm32 = if GRID_2D { dyn_smem_u32() } else { 0 };
    let a_u = sm32;
    let a_vh = sm32 + 4 * (r + 3) * dpad as u32;
    let a_w = sm32 + 4 * (2 * r + 3) * dpad as u32;
    // FS: 1/d and 1/sqrt(d) once (off the loads' critical path) for the approximate scalars;
    // GRID_2D: from the host (the same correctly rounded bits)
    let (inv_d, inv_sqrt_d) =
        if GRID_2D { (lc.inv_d, lc.inv_sqrt_d) } else { (div_rn(1.0, df), div_rn(1.0, sqrt_rn(df))) };

    // ---- weights: every thread issues its (≤ FWD_SMEM_WL) 16-byte chunks first
    let nw = 5 * nch;
    let nthr = block_dim_x();
    let mut wraw: [Raw; FWD_SMEM_WL] = [[0; 4]; FWD_SMEM_WL];
    if !GRID_2D {
        let mut q = 0;
        while q < FWD_SMEM_WL {
            let wq = tid + q as u32 * nthr;
            if wq < nw {
                let (p, c) = split5(wq, nch);
                let src = if p == 0 { wv } else { cw.add((p - 1) as usize * d as usize) };
                wraw[q] = ld_raw(src, c);
            }
            q += 1;
        }
    }
    // GRID_2D: the weights straight into shared memory by `cp.async` (no registers), issued after
    // the row loads (phase 1's chain waits on those; the weights are read after the barrier)
    // (thread `tid` copies chunk `c = tid + k·nthr < nch` of all 5 rows: no index arithmetic
    // beyond one compare per chunk)
    let issue_w = || {
        if GRID_2D {
            let mut c = tid;
            while c < nch {
                let dst = a_w + 16 * c;
                cp_async_16_s(dst, wv.add(8 * c as usize) as *const u8);
                let mut p = 0;
                while p < 4 {
                    let src = cw.add(p as usize * d as usize + 8 * c as usize);
                    cp_async_16_s(dst + 2 * (p + 1) * dpad as u32, src as *const u8);
                    p += 1;
                }
                c += nthr;
            }
        }
    };

    // ---- phase 1: per-row scalars of every tile row (warp i ↔ t = t0 − 3 + i), then u (and vh)
    let t = (t0 + i) as i32 - 3;
    let urow = s_u.add(i as usize * dpad);
    // warps past the tile (`extra_warps` of the launch) only load weights and run phase 2
    let in_tile = i < r + 3;
    if in_tile && t < 0 {
        issue_w();
        each_chunk!(NV, lane, nch, |n, c| {
            if GRID_2D {
                sts8(a_u + 4 * (i * dpad as u32 + 8 * c), [0f32; 8]);
            } else {
                st8_f32(urow, c, [0f32; 8]);
            }
        });
    } else if in_tile && (t as u32) < t_len {
        let row = (m * t_len + t as u32) as usize * d as usize;
        let (hr, kr, vr) = (h.add(row), k.add(row), v.add(row));
        let owned = i >= 3;
        let (mut shh, mut skk, mut shk) = (0f32, 0f32, 0f32);
        let mut vres: [Raw; NV] = [[0; 4]; NV];
        let mut hres: [Raw; NV] = [[0; 4]; NV];
        let mut kres: [Raw; NV] = [[0; 4]; NV];
        let mut wres: [Raw; NV] = [[0; 4]; NV];
        let mut wvres: [Raw; NV] = [[0; 4]; NV];
        each_chunk!(NV, lane, nch, |n, c| {
            *hres.get_unchecked_mut(n) = ld_raw(hr, c);
            *kres.get_unchecked_mut(n) = ld_raw(kr, c);
            *vres.get_unchecked_mut(n) = ld_raw(vr, c);
            *wres.get_unchecked_mut(n) = ld_raw(wh, c);
            *wvres.get_unchecked_mut(n) = ld_raw(wv, c);
        });
        issue_w();
        each_chunk!(NV, lane, nch, |n, c| {
            let (hh, kk, ww) = (unpack8::<D>(res(&hres, n)), unpack8::<D>(res(&kres, n)), unpack8::<D>(res(&wres, n)));
            for e in 0..8 {
                shh = fma(hh[e], hh[e], shh);
                skk = fma(kk[e], kk[e], skk);
                shk = fma(hh[e] * kk[e], ww[e] * ww[e], shk);
            }
        });
        let (shh, skk, shk) = (warp_sum_f32(shh), warp_sum_f32(skk), warp_sum_f32(shk));
        let (rh, rk, alpha) = if GRID_2D {
            let (rh, rk) = (rrms_ftz(shh, inv_d, eps), rrms_ftz(skk, inv_d, eps));
            (rh, rk, rcp_approx_ftz(1.0 + ex2_approx_ftz(-(shk * rh * rk * inv_sqrt_d) * core::f32::consts::LOG2_E)))
        } else {
            let (rh, rk) = (rrms_fast(shh, inv_d, eps), rrms_fast(skk, inv_d, eps));
            (rh, rk, rcp_approx(1.0 + exp_f32(-(shk * rh * rk * inv_sqrt_d))))
        };
        let vq_out = vhat.add(row);
        let mut svv = 0f32;
        each_chunk!(NV, lane, nch, |n, c| {
            let vv = unpack8::<D>(res(&vres, n));
            let mut o = [0f32; 8];
            for e in 0..8 {
                o[e] = qf::<D>(alpha * vv[e]);
                svv = fma(o[e], o[e], svv);
            }
            if owned {
                st8::<D, true>(vq_out, c, d, o);
            }
        });
        let rv =
            if GRID_2D { rrms_ftz(warp_sum_f32(svv), inv_d, eps) } else { rrms_fast(warp_sum_f32(svv), inv_d, eps) };
        let vhrow = s_vh.add(if owned { (i - 3) as usize * dpad } else { 0 });
        each_chunk!(NV, lane, nch, |n, c| {
            let (vv, wvv) = (unpack8::<D>(res(&vres, n)), unpack8::<D>(res(&wvres, n)));
            let mut u = [0f32; 8];
            let mut vh = [0f32; 8];
            for e in 0..8 {
                vh[e] = alpha * vv[e];
                u[e] = qf::<D>(vh[e]) * rv * wvv[e];
            }
            if GRID_2D {
                sts8(a_u + 4 * (i * dpad as u32 + 8 * c), u);
                if owned {
                    sts8(a_vh + 4 * ((i - 3) * dpad as u32 + 8 * c), vh);
                }
            } else {
                st8_f32(urow, c, u);
                if owned {
                    st8_f32(vhrow, c, vh);
                }
            }
        });
        if lane == 0 && owned {
            let rix = (m * t_len + t as u32) as usize;
            *alpha_o.add(rix) = alpha;
            *rh_o.add(rix) = rh;
            *rk_o.add(rix) = rk;
            *rv_o.add(rix) = rv;
        }
    } else {
        issue_w();
    }
    // the weights into smem (raw 16-bit)
    let mut q = 0;
    while q < FWD_SMEM_WL && !GRID_2D {
        let wq = tid + q as u32 * nthr;
        if wq < nw {
            let (p, c) = split5(wq, nch);
            let dst = s_w.add(p as usize * dpad + c as usize * 8) as *mut u32;
            for e in 0..4 {
                *dst.add(e) = wraw[q][e];
            }
        }
        q += 1;
    }
    if GRID_2D {
        cp_async_wait_all();
    }
    sync_threads();

    // ---- phase 2: conv and Y from smem, element chunks of the R owned rows over the block
    let total = r * nch;
    let mut e = tid;
    while e < total {
        // owned row index 0..R (tile row io + 3); GRID_2D: e / nch by a multiply-high with the
        // host's ceil(2^32 / nch) (exact for e·nch < 2^32)
        let io = if GRID_2D { ((e as u64 * lc.nch_magic as u64) >> CHUNK_ROW_SHIFT) as u32 } else { e / nch };
        let c = e - io * nch;
        let t = t0 + io;
        if t < t_len {
            let mut conv = [0f32; 8];
            for p in 0..CONV_TAPS as u32 {
                let (cwp, uu) = if GRID_2D {
                    (
                        unpack8::<D>(lds_v4(a_w + 2 * ((p + 1) * dpad as u32 + 8 * c))),
                        lds8(a_u + 4 * ((io + p) * dpad as u32 + 8 * c)),
                    )
                } else {
                    (
                        unpack8::<D>(*(s_w.add((p as usize + 1) * dpad + c as usize * 8) as *const Raw)),
                        ld8_f32(s_u.add((io + p) as usize * dpad), c),
                    )
                };
                for q in 0..8 {
                    conv[q] = fma(cwp[q], uu[q], conv[q]);
                }
            }
            let vt = if GRID_2D {
                lds8(a_vh + 4 * (io * dpad as u32 + 8 * c))
            } else {
                ld8_f32(s_vh.add(io as usize * dpad), c)
            };
            let mut out = [0f32; 8];
            for q in 0..8 {
                out[q] = if GRID_2D { silu_ftz(conv[q]) } else { silu_approx(conv[q]) } + vt[q];
            }
            st8::<D, true>(y.add((m * t_len + t) as usize * d as usize), c, d, out);
        }
        e += nthr;
    }
}

// ---------------------------------------------------------------- backward

/// `(wq / nch, wq % nch)` for `wq < 6·nch`, by at most 5 subtractions.
#[inline(always)]
fn split6(wq: u32, nch: u32) -> (u32, u32) {
    let (mut p, mut c) = (0, wq);
    while p < 5 && c >= nch {
        c -= nch;
        p += 1;
    }
    (p, c)
}

/// Global weight row `wr` of the backward: 0 = `rms_w_v`, 1 = `rms_w_h`, 2 + p = `conv_w[p]`.
#[inline(always)]
fn wrow_g(wv: *const u16, wh: *const u16, cw: *const u16, d: u32, wr: u32) -> *const u16 {
    if wr == 0 {
        wv
    } else if wr == 1 {
        wh
    } else {
        cw.wrapping_add((wr - 2) as usize * d as usize)
    }
}

/// EngramGateConvBwd, main kernel, one warp per tile row (launch contract, `scratch` and
/// `part`: [`GateBwdArgs`]); block `b` owns tile `b % ntiles` of sequence `b / ntiles`. `g` is
/// `dy`; `wh, wv, cw` are `rms_w_h, rms_w_v, conv_w`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn bwd<D: Dt, const FAST: bool, const NV: usize>(
    g: *const u16,
    h: *const u16,
    k: *const u16,
    v: *const u16,
    wh: *const u16,
    wv: *const u16,
    cw: *const u16,
    alpha: *const f32,
    rh_i: *const f32,
    rk_i: *const f32,
    dh: *mut u16,
    dk: *mut u16,
    dv: *mut u16,
    part: *mut f32,
    scratch: *mut f32,
    t_len: u32,
    d: u32,
    r: u32,
    ntiles: u32,
    eps: f32,
) {
    // The reduce kernel (launched as a programmatic dependent) may start now: it only waits
    // (`grid_dependency_wait`) and then reads `part`, so its launch overlaps this kernel.
    grid_launch_dependents();
    let lane = lane_id();
    let i = thread_idx_x() / 32;
    let m = block_idx_x() / ntiles;
    let t0 = (block_idx_x() - m * ntiles) * r;
    let blk = block_idx_x() as usize;
    let nch = d.div_ceil(8);
    let dpad = (nch * 8) as usize;
    let df = d as f32;
    let s = div_rn(1.0, sqrt_rn(df));
    let sm = dyn_smem::<f32>();
    let s_rv = sm;
    let s_ch = sm.add((r + 6) as usize);
    let s_u = sm.add(bwd_smem_scalar_floats(r) as usize);
    let scr = if scratch.is_null() { s_u } else { scratch.add(blk * (r as usize + 3) * dpad) };
    let base = (m * t_len) as usize; // first row of sequence m
    let rowp = |p: *const u16, t: u32| p.wrapping_add((base + t as usize) * d as usize);
    // weight row `wr` (0 = rms_w_v, 1 = rms_w_h, 2 + p = conv_w[p]), global
    let wrow = |wr: u32| -> *const u16 {
        if wr == 0 {
            wv
        } else if wr == 1 {
            wh
        } else {
            cw.add((wr - 2) as usize * d as usize)
        }
    };
    // a chunk of a weight row
    let wld8 = |wr: u32, c: u32| -> F8 { ld8::<D, FAST>(wrow(wr), c, d) };

    let t = (t0 + i) as i32 - 3;
    let valid = i < r + 6 && t >= 0 && (t as u32) < t_len;
    let tu = t as u32;
    let owned = valid && i >= 3 && i < r + 3;
    let has_g = valid && i >= 3;

    // ---- stage 1: rrms_v' of every tile row (from the unrounded vh = alpha·v); P = Σ H·k·wh²
    let mut vres: [Raw; NV] = [[0; 4]; NV];
    let mut gres: [Raw; NV] = [[0; 4]; NV];
    let mut hres: [Raw; NV] = [[0; 4]; NV];
    let mut kres: [Raw; NV] = [[0; 4]; NV];
    let mut a = 0f32;
    let mut p_sum = 0f32;
    // the forward's rrms of owned rows, loaded now so stage 3 does not wait on DRAM
    let (mut rh, mut rk) = (0f32, 0f32);
    if valid {
        a = *alpha.add(base + tu as usize);
        if owned {
            (rh, rk) = (*rh_i.add(base + tu as usize), *rk_i.add(base + tu as usize));
        }
        let (vr, gr, hr, kr) = (rowp(v, tu), rowp(g, tu), rowp(h, tu), rowp(k, tu));
        let mut svv = 0f32;
        let mut wres: [Raw; NV] = [[0; 4]; NV];
        each_chunk!(NV, lane, nch, |n, c| {
            if NV > 0 {
                *vres.get_unchecked_mut(n) = ld_raw(vr, c);
                if has_g {
                    *gres.get_unchecked_mut(n) = ld_raw(gr, c);
                }
                if owned {
                    *hres.get_unchecked_mut(n) = ld_raw(hr, c);
                    *kres.get_unchecked_mut(n) = ld_raw(kr, c);
                    *wres.get_unchecked_mut(n) = ld_raw(wh, c);
                }
            }
        });
        // the conv weights for stage 2 (one warp suffices: L1 is per SM)
        if i == 3 {
            let mut c = lane;
            while c < nch {
                prefetch_conv_weights(cw, wv, c, d);
                c += 32;
            }
        }
        each_chunk!(NV, lane, nch, |n, c| {
            let vv = if NV > 0 { unpack8::<D>(res(&vres, n)) } else { ld8::<D, FAST>(vr, c, d) };
            for e in 0..8 {
                let vh = a * vv[e];
                svv = fma(vh, vh, svv);
            }
            if owned {
                let (hh, kk, ww) = if NV > 0 {
                    (unpack8::<D>(res(&hres, n)), unpack8::<D>(res(&kres, n)), unpack8::<D>(res(&wres, n)))
                } else {
                    (ld8::<D, FAST>(hr, c, d), ld8::<D, FAST>(kr, c, d), ld8::<D, FAST>(wh, c, d))
                };
                for e in 0..8 {
                    p_sum = fma(hh[e] * kk[e], ww[e] * ww[e], p_sum);
                }
            }
        });
        let rv = rrms(warp_sum_f32(svv), df, eps);
        p_sum = warp_sum_f32(p_sum);
        if lane == 0 {
            *s_rv.add(i as usize) = rv;
        }
    }
    sync_threads();

    // u of tile row `ip` (t' = t0 − 3 + ip ≥ 0, < T), chunk c: (alpha·v)·rv'·wv
    let u_of = |ip: u32, c: u32, wvv: &F8| -> F8 {
        let tp = t0 + ip - 3;
        let ap = *alpha.add(base + tp as usize);
        let rvp = *s_rv.add(ip as usize);
        let vv = ld8::<D, FAST>(rowp(v, tp), c, d);
        let mut o = [0f32; 8];
        for q in 0..8 {
            o[q] = (ap * vv[q]) * rvp * wvv[q];
        }
        o
    };

    // ---- stage 2: dconv = g·silu'(conv) of tile rows 3..R+6 (t0..t0+R+2) into scratch row i−3
    if i >= 3 && i < r + 6 {
        let srow = scr.add((i - 3) as usize * dpad);
        let gr = rowp(g, tu);
        each_chunk!(NV, lane, nch, |n, c| {
            let mut dc = [0f32; 8];
            if has_g {
                let wvv = ld8::<D, FAST>(wv, c, d);
                let mut conv = [0f32; 8];
                for p in 0..CONV_TAPS as u32 {
                    if tu + p >= 3 {
                        let uu = u_of(i - 3 + p, c, &wvv);
                        let cwp = wld8(2 + p, c);
                        for q in 0..8 {
                            conv[q] = fma(cwp[q], uu[q], conv[q]);
                        }
                    }
                }
                let gg = if NV > 0 { unpack8::<D>(res(&gres, n)) } else { ld8::<D, FAST>(gr, c, d) };
                for q in 0..8 {
                    let sg = sigmoid(conv[q]);
                    dc[q] = gg[q] * (sg * (1.0 + conv[q] * (1.0 - sg)));
                }
            }
            st8_f32(srow, c, dc);
        });
    }
    sync_threads();

    // du of tile row i (scratch rows i−3..i hold dconv of t..t+3): Σ_p cw[p]·dconv[t+3−p]
    let du_of = |ii: u32, c: u32| -> F8 {
        let mut o = [0f32; 8];
        for p in 0..CONV_TAPS as u32 {
            let cwp = wld8(2 + p, c);
            let dc = ld8_f32(scr.add((ii - p) as usize * dpad), c);
            for q in 0..8 {
                o[q] = fma(cwp[q], dc[q], o[q]);
            }
        }
        o
    };

    // ---- stage 3: owned rows: u-norm backward, gate backward, the two rmsnorm backwards
    if owned {
        let rv = *s_rv.add(i as usize);
        let (vr, gr, hr, kr) = (rowp(v, tu), rowp(g, tu), rowp(h, tu), rowp(k, tu));
        let get = |ra: &[Raw; NV], p: *const u16, n: usize, c: u32| -> F8 {
            if NV > 0 {
                unpack8::<D>(res(ra, n))
            } else {
                ld8::<D, FAST>(p, c, d)
            }
        };
        // s1 = Σ du·wv·vh
        let mut s1 = 0f32;
        each_chunk!(NV, lane, nch, |n, c| {
            let du = du_of(i, c);
            let (wvv, vv) = (wld8(0, c), get(&vres, vr, n, c));
            for q in 0..8 {
                s1 = fma(du[q] * wvv[q], a * vv[q], s1);
            }
        });
        let s1 = warp_sum_f32(s1);
        let c1 = rv * rv * rv * div_rn(s1, df);
        // dvh = g + rv·du·wv − vh·c1; dv = alpha·dvh; s2 = Σ dvh·v
        let mut s2 = 0f32;
        let dvr = rowp(dv, tu) as *mut u16;
        each_chunk!(NV, lane, nch, |n, c| {
            let du = du_of(i, c);
            let (wvv, vv, gg) = (wld8(0, c), get(&vres, vr, n, c), get(&gres, gr, n, c));
            let mut o = [0f32; 8];
            for q in 0..8 {
                let dvh = gg[q] + (rv * (du[q] * wvv[q]) - (a * vv[q]) * c1);
                o[q] = a * dvh;
                s2 = fma(dvh, vv[q], s2);
            }
            st8::<D, FAST>(dvr, c, d, o);
        });
        let s2 = warp_sum_f32(s2);
        let dz = a * (1.0 - a) * s2;
        let aa = dz * s * rh * rk;
        let pd = div_rn(p_sum, df);
        let (ch, ck) = (rh * rh * pd, rk * rk * pd);
        let (dhr, dkr) = (rowp(dh, tu) as *mut u16, rowp(dk, tu) as *mut u16);
        each_chunk!(NV, lane, nch, |n, c| {
            let (hh, kk, ww) = (get(&hres, hr, n, c), get(&kres, kr, n, c), wld8(1, c));
            let (mut oh, mut ok) = ([0f32; 8], [0f32; 8]);
            for q in 0..8 {
                let w2 = ww[q] * ww[q];
                oh[q] = aa * (kk[q] * w2 - hh[q] * ch);
                ok[q] = aa * (hh[q] * w2 - kk[q] * ck);
            }
            st8::<D, FAST>(dhr, c, d, oh);
            st8::<D, FAST>(dkr, c, d, ok);
        });
        if lane == 0 {
            *s_ch.add((i - 3) as usize) = 2.0 * aa;
        }
    }
    sync_threads();

    // ---- stage 4: this block's partial weight gradients, column chunks over the owned rows
    // in increasing t (fixed order).
    let nown = if t0 + r <= t_len { r } else { t_len - t0 };
    let pb = part.add(blk * GRAD_ROWS * d as usize);
    let s_w = core::ptr::null::<u16>();
    bwd_weight_partials::<D, false, false>(
        pb, d, dpad, t0, nown, base, wrow, s_w, s_u, scr, s_rv, s_ch, alpha, v, h, k,
    );
}

/// Backward stage 4 of [`bwd`]: this block's partial weight gradients `pb[e·d + j]`
/// (e = rms_w_h, rms_w_v, conv_w[0..4]), a thread per column j, the `nown` owned rows in
/// increasing t (fixed order). `SU`: u of the tile rows from `s_u` (else recomputed from v);
/// `SW`: the weights from `s_w` (else global, through `wrow`). ([`bwd`] runs it with neither;
/// the parameters stay because dropping them changes the PTX of the kernels that run it.)
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn bwd_weight_partials<D: Dt, const SU: bool, const SW: bool>(
    pb: *mut f32,
    d: u32,
    dpad: usize,
    t0: u32,
    nown: u32,
    base: usize,
    wrow: impl Fn(u32) -> *const u16,
    s_w: *const u16,
    s_u: *const f32,
    scr: *const f32,
    s_rv: *const f32,
    s_ch: *const f32,
    alpha: *const f32,
    v: *const u16,
    h: *const u16,
    k: *const u16,
) {
    let rowp = |p: *const u16, t: u32| p.wrapping_add((base + t as usize) * d as usize);
    let ld1 = |p: *const u16, j: u32| D::to_f32(*p.add(j as usize));
    let mut j = thread_idx_x();
    while j < d {
        let wj = |wr: u32| -> f32 {
            if SW {
                D::to_f32(*s_w.add(wr as usize * dpad + j as usize))
            } else {
                ld1(wrow(wr), j)
            }
        };
        let (wvj, whj) = (wj(0), wj(1));
        let cwj = [wj(2), wj(3), wj(4), wj(5)];
        // u of tile row ip (t' = t0 − 3 + ip, 0 ≤ t' < T), column j
        let u1 = |ip: u32| -> f32 {
            if SU {
                return *s_u.add(ip as usize * dpad + j as usize);
            }
            let tp = t0 + ip - 3;
            let ap = *alpha.add(base + tp as usize);
            ((ap * ld1(rowp(v, tp), j)) * *s_rv.add(ip as usize)) * wvj
        };
        let (mut a_h, mut a_v, mut a_c0, mut a_c1, mut a_c2, mut a_c3) = (0f32, 0f32, 0f32, 0f32, 0f32, 0f32);
        // window of u over t−3..t and of dconv over t..t+3 (scratch rows io..io+3)
        let (mut w0, mut w1, mut w2) = (0f32, 0f32, 0f32);
        if t0 >= 3 {
            w0 = u1(0);
        }
        if t0 >= 2 {
            w1 = u1(1);
        }
        if t0 >= 1 {
            w2 = u1(2);
        }
        let sc = |row: u32| *scr.add(row as usize * dpad + j as usize);
        let (mut e0, mut e1, mut e2) = (sc(0), sc(1), sc(2));
        let mut io = 0;
        while io < nown {
            let ii = io + 3;
            let tt = t0 + io;
            let w3 = u1(ii);
            let e3 = sc(io + 3);
            // du[t] = Σ_p cw[p]·dconv[t+3−p] (same order as du_of)
            let mut du = 0f32;
            du = fma(cwj[0], e3, du);
            du = fma(cwj[1], e2, du);
            du = fma(cwj[2], e1, du);
            du = fma(cwj[3], e0, du);
            let at = *alpha.add(base + tt as usize);
            let rvt = *s_rv.add(ii as usize);
            let cht = *s_ch.add(io as usize);
            let (vv, hh, kk) = (ld1(rowp(v, tt), j), ld1(rowp(h, tt), j), ld1(rowp(k, tt), j));
            a_h = fma(cht * whj, hh * kk, a_h);
            a_v = fma(du, (at * vv) * rvt, a_v);
            a_c0 = fma(e0, w0, a_c0);
            a_c1 = fma(e0, w1, a_c1);
            a_c2 = fma(e0, w2, a_c2);
            a_c3 = fma(e0, w3, a_c3);
            (w0, w1, w2) = (w1, w2, w3);
            (e0, e1, e2) = (e1, e2, e3);
            io += 1;
        }
        let dd = d as usize;
        let pj = pb.add(j as usize);
        *pj = a_h;
        *pj.add(dd) = a_v;
        *pj.add(2 * dd) = a_c0;
        *pj.add(3 * dd) = a_c1;
        *pj.add(4 * dd) = a_c2;
        *pj.add(5 * dd) = a_c3;
        j += block_dim_x();
    }
}

/// Runs `$body` for each chunk `$c = $c0 + $cs·n` (`n < NV`, unrolled with constant `n`, so
/// resident arrays stay in registers) below `$nch`: the split backward's chunks of a lane.
macro_rules! each_chunk_s {
    ($nv:expr, $c0:expr, $cs:expr, $nch:expr, |$n:ident, $c:ident| $body:block) => {{
        each_chunk_s!(@one $nv, $c0, $cs, $nch, 0, $n, $c, $body);
        each_chunk_s!(@one $nv, $c0, $cs, $nch, 1, $n, $c, $body);
        each_chunk_s!(@one $nv, $c0, $cs, $nch, 2, $n, $c, $body);
        each_chunk_s!(@one $nv, $c0, $cs, $nch, 3, $n, $c, $body);
    }};
    (@one $nv:expr, $c0:expr, $cs:expr, $nch:expr, $k:expr, $n:ident, $c:ident, $body:block) => {
        if $k < $nv {
            #[allow(unused_variables)]
            let $n: usize = $k;
            let $c = $c0 + $cs * $k as u32;
            if $c < $nch $body
        }
    };
}

// ---------------------------------------------------------------- backward, tile rows split over warps

/// 8 f32 from shared-window address `a` (16-byte aligned).
#[inline(always)]
unsafe fn lds8_f32(a: u32) -> F8 {
    let (x, y) = (lds_v4(a), lds_v4(a + 16));
    let mut o = [0f32; 8];
    let mut e = 0;
    while e < 4 {
        o[e] = f32::from_bits(x[e]);
        o[e + 4] = f32::from_bits(y[e]);
        e += 1;
    }
    o
}

/// 8 f32 to shared-window address `a` (16-byte aligned).
#[inline(always)]
unsafe fn sts8_f32(a: u32, v: F8) {
    sts_v4(a, [v[0].to_bits(), v[1].to_bits(), v[2].to_bits(), v[3].to_bits()]);
    sts_v4(a + 16, [v[4].to_bits(), v[5].to_bits(), v[6].to_bits(), v[7].to_bits()]);
}

/// [`rrms_fast`] with `rsqrt.approx.ftz` (bitwise the same: its argument is ≥ eps, normal).
#[inline(always)]
fn rrms_fast_ftz(sum: f32, inv_d: f32, eps: f32) -> f32 {
    let x = fma(sum, inv_d, eps);
    let r = rsqrt_approx_ftz(x);
    let n = r * fma(-0.5 * x, r * r, 1.5);
    if r == f32::INFINITY {
        r
    } else {
        n
    }
}

/// EngramGateConvBwd main kernel with the tile rows split over warps (the planner's kernel
/// wherever it fits): `u`, `dconv` and the raw 16-bit weights (`rms_w_v`, `rms_w_h`, `conv_w[0..4]`) in
/// shared memory, approximate σ in `silu'`, `rrms_v'` by `rsqrt.approx` + one Newton step,
/// the per-row divisions by d as products with 1/d (each ≈ 1–2 ulp f32, within the
/// tolerances), and every tile row spread over `wpr` warps: warp `w` works on row
/// `i = w / wpr`, its lane on chunks `(w % wpr)·32 + lane + 32·wpr·n` (`n < NV`), so a lane
/// holds `ceil(ceil(d/8) / (32·wpr))` chunks instead of `ceil(d/8)/32` — the per-warp serial
/// chain (which is the kernel's time) shrinks by that factor at d = 512 / 768. Row sums
/// (`Σ vh²`, `P`, `s1`, `s2`) are a warp butterfly per warp, then (`wpr > 1`) the `wpr` warp
/// sums added in increasing warp order from shared memory after a block barrier (those
/// barriers run at every `wpr`; deterministic). The row loads are issued first, the weights
/// are copied by `cp.async` straight into shared memory (no registers). The kernel is a
/// per-warp dependent chain and, at W = 2–3 (16–27 warps on one SM), also instruction-issue
/// bound, hence:
/// 1. every shared-memory access (`u`, `dconv`, the raw weights, the row scalars and split
///    sums, stage 4's column reads) through 32-bit shared-window addresses (`LDS`/`STS`,
///    32-bit address arithmetic) instead of generic 64-bit loads and stores;
/// 2. σ in `silu'` by `ex2.approx.ftz` / `rcp.approx.ftz` (`rcp(1 + ex2(−x·log2 e))`) and
///    `rrms_v'` by `rsqrt.approx.ftz`: the same results as the non-ftz forms wherever
///    |conv| < 87 (the non-ftz forms only add subnormal-range fix-ups: ≈ 9 instructions per
///    element);
/// 3. the per-launch constants `s = 1/√d`, `inv_d = 1/d` from the host (correctly rounded
///    there, so the same bits as `div.rn`/`sqrt.rn`), no u32 division for the block's
///    sequence (grid `(ntiles, M)`: m = blockIdx.y) and none for the warp's row
///    (`i = (w·wmagic) >> 16` with `wmagic = ceil(2^16 / wpr)`, exact for w < 32).
///
/// Stage 3 in one pass: `s2 = Σ dvh·v` without its own pass, butterfly, barrier and cross-warp
/// sum: with `rv'² = 1/(Σvh²/d + eps)` the rmsnorm backward gives exactly
/// `Σ dvh·v = Σ g·v + eps·rv'³·Σ du·wv·v`, so `dz = alpha(1−alpha)·s2 =
/// (1−alpha)·(alpha·Σ g·v + eps·rv'³·s1)` with `s1` as before and `Σ g·v` summed in stage 1
/// (its butterfly beside the other two). The closed form has no cancellation (checked against
/// the f64 reference, and in f64 against the two-pass form by a CPU test). One barrier fewer;
/// the dv/dH/dk stores in one pass.
/// Launch contract: [`GateBwdSplitArgs`]. Dynamic smem: the scalars
/// ([`bwd_smem_scalar_floats`]), `u` `[R+6][dpad]` and `dconv` `[R+3][dpad]` f32, the weights
/// `[6][dpad]` u16, then [`bwd_split_sum_floats`] f32. Deterministic.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn bwd_split<D: Dt, const NV: usize>(
    g: *const u16,
    h: *const u16,
    k: *const u16,
    v: *const u16,
    wh: *const u16,
    wv: *const u16,
    cw: *const u16,
    alpha: *const f32,
    rh_i: *const f32,
    rk_i: *const f32,
    dh: *mut u16,
    dk: *mut u16,
    dv: *mut u16,
    part: *mut f32,
    t_len: u32,
    d: u32,
    r: u32,
    wpr: u32,
    wmagic: u32,
    s: f32,
    inv_d: f32,
    eps: f32,
) {
    grid_launch_dependents();
    let lane = lane_id();
    let wi = thread_idx_x() / 32;
    let i = (wi * wmagic) >> WARP_ROW_SHIFT;
    let sub = wi - i * wpr;
    let m = block_idx_y();
    let t0 = block_idx_x() * r;
    let blk = (m * grid_dim_x() + block_idx_x()) as usize;
    let nch = d.div_ceil(8);
    let dpad = nch * 8;
    let c0 = sub * 32 + lane;
    let cs = 32 * wpr;
    let split = wpr > 1;
    // shared-window addresses (bytes): scalars, u [R+6][dpad] f32, dconv [R+3][dpad] f32,
    // weights [6][dpad] u16, split sums [(R+6)·wpr][4] f32
    let a_sm = dyn_smem_u32();
    let a_rv = a_sm;
    let a_ch = a_sm + 4 * (r + 6);
    let a_u = a_sm + 4 * bwd_smem_scalar_floats(r);
    let a_scr = a_u + 4 * (r + 6) * dpad;
    let a_w = a_scr + 4 * (r + 3) * dpad;
    let a_sp = a_w + 2 * 6 * dpad;
    // the generic address of the weights, for cp.async
    let s_w = (dyn_smem::<u8>()).add((a_w - a_sm) as usize);
    let base = (m * t_len) as usize;
    let rowp = |p: *const u16, t: u32| p.wrapping_add((base + t as usize) * d as usize);
    let wld8 = |wr: u32, c: u32| -> F8 { unpack8::<D>(lds_v4(a_w + 2 * (wr * dpad + c * 8))) };
    // the `wpr` warp partials of row `ii`, slot `q`, added in increasing warp order (wpr ≤ 4:
    // (R+6)·wpr ≤ 32 warps with R ≥ 1, checked by the host; no loop)
    let row_sum = |ii: u32, q: u32| -> f32 {
        let pp = a_sp + 4 * (ii * wpr * 4 + q);
        let mut acc = lds_f32(pp);
        if wpr > 1 {
            acc += lds_f32(pp + 16);
        }
        if wpr > 2 {
            acc += lds_f32(pp + 32);
        }
        if wpr > 3 {
            acc += lds_f32(pp + 48);
        }
        acc
    };

    let t = (t0 + i) as i32 - 3;
    let valid = i < r + 6 && t >= 0 && (t as u32) < t_len;
    let tu = t as u32;
    let owned = valid && i >= 3 && i < r + 3;
    let has_g = valid && i >= 3;

    // ---- row loads first (the longest DRAM round trip), then the weights
    let mut vres: [Raw; NV] = [[0; 4]; NV];
    let mut gres: [Raw; NV] = [[0; 4]; NV];
    let mut hres: [Raw; NV] = [[0; 4]; NV];
    let mut kres: [Raw; NV] = [[0; 4]; NV];
    let mut wres: [Raw; NV] = [[0; 4]; NV];
    let mut wvres: [Raw; NV] = [[0; 4]; NV];
    let (mut a, mut rh, mut rk) = (0f32, 0f32, 0f32);
    if valid {
        a = *alpha.add(base + tu as usize);
        if owned {
            (rh, rk) = (*rh_i.add(base + tu as usize), *rk_i.add(base + tu as usize));
        }
        let (vr, gr, hr, kr) = (rowp(v, tu), rowp(g, tu), rowp(h, tu), rowp(k, tu));
        each_chunk_s!(NV, c0, cs, nch, |n, c| {
            *vres.get_unchecked_mut(n) = ld_raw(vr, c);
            *wvres.get_unchecked_mut(n) = ld_raw(wv, c);
            if has_g {
                *gres.get_unchecked_mut(n) = ld_raw(gr, c);
            }
            if owned {
                *hres.get_unchecked_mut(n) = ld_raw(hr, c);
                *kres.get_unchecked_mut(n) = ld_raw(kr, c);
                *wres.get_unchecked_mut(n) = ld_raw(wh, c);
            }
        });
    }
    // the weights straight into shared memory (`cp.async`: no registers hold them)
    let nthr = block_dim_x();
    let nw = 6 * nch;
    let mut wq = thread_idx_x();
    while wq < nw {
        let (p, c) = split6(wq, nch);
        let src = wrow_g(wv, wh, cw, d, p).add(c as usize * 8);
        cp_async_16(s_w.add(2 * (p * dpad + c * 8) as usize), src as *const u8);
        wq += nthr;
    }

    // ---- stage 1: Σ vh² (vh = alpha·v unrounded) of every tile row, P = Σ H·k·wh² of owned rows
    let (mut svv, mut p_sum, mut sgv) = (0f32, 0f32, 0f32);
    if valid {
        each_chunk_s!(NV, c0, cs, nch, |n, c| {
            let vv = unpack8::<D>(res(&vres, n));
            for e in 0..8 {
                let vh = a * vv[e];
                svv = fma(vh, vh, svv);
            }
            if owned {
                let (hh, kk, ww) =
                    (unpack8::<D>(res(&hres, n)), unpack8::<D>(res(&kres, n)), unpack8::<D>(res(&wres, n)));
                for e in 0..8 {
                    p_sum = fma(hh[e] * kk[e], ww[e] * ww[e], p_sum);
                }
                let gg = unpack8::<D>(res(&gres, n));
                for e in 0..8 {
                    sgv = fma(gg[e], vv[e], sgv);
                }
            }
        });
        svv = warp_sum_f32(svv);
        p_sum = warp_sum_f32(p_sum);
        sgv = warp_sum_f32(sgv);
        if split && lane == 0 {
            sts_f32(a_sp + 16 * wi, svv);
            sts_f32(a_sp + 16 * wi + 4, p_sum);
            sts_f32(a_sp + 16 * wi + 8, sgv);
        }
    }
    // unconditional (a barrier under `if split` reads as warp-divergent to the PTX checker
    // once LLVM merges it into the `valid` branches; at W = 1 it only costs the wait)
    sync_threads();
    let mut rv = 0f32;
    if valid {
        if split {
            svv = row_sum(i, 0);
            p_sum = row_sum(i, 1);
            sgv = row_sum(i, 2);
        }
        rv = rrms_fast_ftz(svv, inv_d, eps);
        if lane == 0 && sub == 0 {
            sts_f32(a_rv + 4 * i, rv);
        }
        // u = (alpha·v)·rv'·wv of this row
        let urow = a_u + 4 * i * dpad;
        each_chunk_s!(NV, c0, cs, nch, |n, c| {
            let (vv, wvv) = (unpack8::<D>(res(&vres, n)), unpack8::<D>(res(&wvres, n)));
            let mut o = [0f32; 8];
            for q in 0..8 {
                o[q] = (a * vv[q]) * rv * wvv[q];
            }
            sts8_f32(urow + 32 * c, o);
        });
    }
    cp_async_wait_all();
    sync_threads();

    // ---- stage 2: dconv = g·silu'(conv) of tile rows 3..R+6 into scratch row i−3
    if i >= 3 && i < r + 6 {
        let srow = a_scr + 4 * (i - 3) * dpad;
        each_chunk_s!(NV, c0, cs, nch, |n, c| {
            let mut dc = [0f32; 8];
            if has_g {
                let mut conv = [0f32; 8];
                for p in 0..CONV_TAPS as u32 {
                    if tu + p >= 3 {
                        let uu = lds8_f32(a_u + 4 * ((i - 3 + p) * dpad + c * 8));
                        let cwp = wld8(2 + p, c);
                        for q in 0..8 {
                            conv[q] = fma(cwp[q], uu[q], conv[q]);
                        }
                    }
                }
                let gg = unpack8::<D>(res(&gres, n));
                for q in 0..8 {
                    // exp_f32 / rcp_approx with the ftz forms (same bits for |conv| < 87)
                    let sg = rcp_approx_ftz(1.0 + ex2_approx_ftz(-conv[q] * core::f32::consts::LOG2_E));
                    dc[q] = gg[q] * (sg * (1.0 + conv[q] * (1.0 - sg)));
                }
            }
            sts8_f32(srow + 32 * c, dc);
        });
    }
    sync_threads();

    // ---- stage 3: owned rows (u-norm backward, gate backward, the two rmsnorm backwards)
    let mut dus: [F8; NV] = [[0f32; 8]; NV];
    let mut s1 = 0f32;
    if owned {
        // s1 = Σ du·wv·vh, du[t] = Σ_p cw[p]·dconv[t+3−p]
        each_chunk_s!(NV, c0, cs, nch, |n, c| {
            let mut du = [0f32; 8];
            for p in 0..CONV_TAPS as u32 {
                let cwp = wld8(2 + p, c);
                let dc = lds8_f32(a_scr + 4 * ((i - p) * dpad + c * 8));
                for q in 0..8 {
                    du[q] = fma(cwp[q], dc[q], du[q]);
                }
            }
            *dus.get_unchecked_mut(n) = du;
            let (wvv, vv) = (wld8(0, c), unpack8::<D>(res(&vres, n)));
            for q in 0..8 {
                s1 = fma(du[q] * wvv[q], a * vv[q], s1);
            }
        });
        s1 = warp_sum_f32(s1);
        if split && lane == 0 {
            sts_f32(a_sp + 16 * wi, s1);
        }
    }
    sync_threads();
    if owned {
        if split {
            s1 = row_sum(i, 0);
        }
        let c1 = rv * rv * rv * (s1 * inv_d);
        // Σ dvh·v in closed form (see above): dz = (1−a)·(a·Σg·v + eps·rv'³·s1)
        let dz = (1.0 - a) * fma(a, sgv, eps * (rv * rv * rv) * s1);
        let aa = dz * s * rh * rk;
        let pd = p_sum * inv_d;
        let (ch, ck) = (rh * rh * pd, rk * rk * pd);
        let (dvr, dhr, dkr) = (rowp(dv, tu) as *mut u16, rowp(dh, tu) as *mut u16, rowp(dk, tu) as *mut u16);
        each_chunk_s!(NV, c0, cs, nch, |n, c| {
            let du = *dus.get_unchecked(n);
            let (wvv, vv, gg) = (wld8(0, c), unpack8::<D>(res(&vres, n)), unpack8::<D>(res(&gres, n)));
            let mut o = [0f32; 8];
            for q in 0..8 {
                let dvh = gg[q] + (rv * (du[q] * wvv[q]) - (a * vv[q]) * c1);
                o[q] = a * dvh;
            }
            st8::<D, true>(dvr, c, d, o);
            let (hh, kk, ww) = (unpack8::<D>(res(&hres, n)), unpack8::<D>(res(&kres, n)), wld8(1, c));
            let (mut oh, mut ok) = ([0f32; 8], [0f32; 8]);
            for q in 0..8 {
                let w2 = ww[q] * ww[q];
                oh[q] = aa * (kk[q] * w2 - hh[q] * ch);
                ok[q] = aa * (hh[q] * w2 - kk[q] * ck);
            }
            st8::<D, true>(dhr, c, d, oh);
            st8::<D, true>(dkr, c, d, ok);
        });
        if lane == 0 && sub == 0 {
            sts_f32(a_ch + 4 * (i - 3), 2.0 * aa);
        }
    }
    sync_threads();

    // ---- stage 4: this block's partial weight gradients, as bwd_weight_partials (a thread
    // per column, the owned rows in increasing t, the same operations) with shared-window reads
    let nown = if t0 + r <= t_len { r } else { t_len - t0 };
    let pb = part.add(blk * GRAD_ROWS * d as usize);
    let ld1 = |p: *const u16, j: u32| D::to_f32(*p.add(j as usize));
    let mut j = thread_idx_x();
    while j < d {
        let wj = |wr: u32| -> f32 { D::to_f32(lds_u16(a_w + 2 * (wr * dpad + j))) };
        let whj = wj(1);
        let cwj = [wj(2), wj(3), wj(4), wj(5)];
        let u1 = |ip: u32| -> f32 { lds_f32(a_u + 4 * (ip * dpad + j)) };
        let (mut a_h, mut a_v, mut a_c0, mut a_c1, mut a_c2, mut a_c3) = (0f32, 0f32, 0f32, 0f32, 0f32, 0f32);
        let (mut w0, mut w1, mut w2) = (0f32, 0f32, 0f32);
        if t0 >= 3 {
            w0 = u1(0);
        }
        if t0 >= 2 {
            w1 = u1(1);
        }
        if t0 >= 1 {
            w2 = u1(2);
        }
        let sc = |row: u32| lds_f32(a_scr + 4 * (row * dpad + j));
        let (mut e0, mut e1, mut e2) = (sc(0), sc(1), sc(2));
        let mut io = 0;
        while io < nown {
            let ii = io + 3;
            let tt = t0 + io;
            let w3 = u1(ii);
            let e3 = sc(io + 3);
            let mut du = 0f32;
            du = fma(cwj[0], e3, du);
            du = fma(cwj[1], e2, du);
            du = fma(cwj[2], e1, du);
            du = fma(cwj[3], e0, du);
            let at = *alpha.add(base + tt as usize);
            let rvt = lds_f32(a_rv + 4 * ii);
            let cht = lds_f32(a_ch + 4 * io);
            let (vv, hh, kk) = (ld1(rowp(v, tt), j), ld1(rowp(h, tt), j), ld1(rowp(k, tt), j));
            a_h = fma(cht * whj, hh * kk, a_h);
            a_v = fma(du, (at * vv) * rvt, a_v);
            a_c0 = fma(e0, w0, a_c0);
            a_c1 = fma(e0, w1, a_c1);
            a_c2 = fma(e0, w2, a_c2);
            a_c3 = fma(e0, w3, a_c3);
            (w0, w1, w2) = (w1, w2, w3);
            (e0, e1, e2) = (e1, e2, e3);
            io += 1;
        }
        let dd = d as usize;
        let pj = pb.add(j as usize);
        *pj = a_h;
        *pj.add(dd) = a_v;
        *pj.add(2 * dd) = a_c0;
        *pj.add(3 * dd) = a_c1;
        *pj.add(4 * dd) = a_c2;
        *pj.add(5 * dd) = a_c3;
        j += block_dim_x();
    }
}

// Deterministic reduction of the per-block partials (launch contract: [`GateBwdReduceArgs`]):
// `out[e] = Σ_b part[b, e]` over `e < 6·d`, written to `drms_w_h` (e < d), `drms_w_v`
// (d ≤ e < 2d), `dconv_w` (2d ≤ e). Thread (x, y) of block `(32, S)` sums blocks
// `b ≡ y (mod S)` in increasing b; then y = 0 adds the S partial sums in order.
#[inline(always)]
unsafe fn bwd_reduce_scalar(a: GateBwdReduceArgs) {
    let GateBwdReduceArgs { part, drms_w_h, drms_w_v, dconv_w, nblocks, d } = a;
    let x = thread_idx_x();
    let yy = thread_idx_y();
    let sgs = block_dim_y();
    let e = block_idx_x() * 32 + x;
    let n6 = GRAD_ROWS as u32 * d;
    let sm = dyn_smem::<f32>();
    // launched as a programmatic dependent of the main kernel: its partials are complete and
    // visible after this (returns at once under an ordinary launch)
    grid_dependency_wait();
    let mut acc = 0f32;
    if e < n6 {
        // 4 loads in flight, then added in increasing b (the same order as one at a time)
        let at = |b: u32| *part.add(b as usize * n6 as usize + e as usize);
        let mut b = yy;
        while b + 3 * sgs < nblocks {
            let (x0, x1, x2, x3) = (at(b), at(b + sgs), at(b + 2 * sgs), at(b + 3 * sgs));
            acc += x0;
            acc += x1;
            acc += x2;
            acc += x3;
            b += 4 * sgs;
        }
        while b < nblocks {
            acc += at(b);
            b += sgs;
        }
    }
    *sm.add((yy * 32 + x) as usize) = acc;
    sync_threads();
    if yy == 0 && e < n6 {
        let mut tot = 0f32;
        for q in 0..sgs {
            tot += *sm.add((q * 32 + x) as usize);
        }
        if e < d {
            *drms_w_h.add(e as usize) = tot;
        } else if e < 2 * d {
            *drms_w_v.add((e - d) as usize) = tot;
        } else {
            *dconv_w.add((e - 2 * d) as usize) = tot;
        }
    }
}

// `engram_gate_bwd_reduce` with 16-byte loads, bitwise its result for the same `S`: thread `(x, y)` of
// block `(XW, S)` owns the 4 outputs `e = 4·(blockIdx.x·XW + x) .. +4` and sums blocks
// `b ≡ y (mod S)` in increasing b, issuing up to 4 of its 16-byte loads at once (the last
// batch padded with +0, which leaves a sum begun at +0 bitwise unchanged: such a sum is never
// −0); then y = 0 adds the S sums in increasing y. `d % 4 == 0`: a group of 4 never straddles
// two outputs.
#[inline(always)]
unsafe fn bwd_reduce_vec4(a: GateBwdReduceArgs) {
    let GateBwdReduceArgs { part, drms_w_h, drms_w_v, dconv_w, nblocks, d } = a;
    let x = thread_idx_x();
    let yy = thread_idx_y();
    let xw = block_dim_x();
    let sgs = block_dim_y();
    let g = block_idx_x() * xw + x;
    let e = 4 * g;
    let n6 = GRAD_ROWS as u32 * d;
    let sm = dyn_smem_u32();
    grid_dependency_wait();
    let mut acc = [0f32; 4];
    if e < n6 {
        let at = |b: u32| -> [u32; 4] {
            if b < nblocks {
                ld_cg_v4_u32(part.add(b as usize * n6 as usize + e as usize) as *const u32)
            } else {
                [0; 4]
            }
        };
        let mut b = yy;
        while b < nblocks {
            let xs = [at(b), at(b + sgs), at(b + 2 * sgs), at(b + 3 * sgs)];
            for xq in xs {
                for c in 0..4 {
                    acc[c] += f32::from_bits(xq[c]);
                }
            }
            b += 4 * sgs;
        }
    }
    let slot = |q: u32| sm + 16 * (q * xw + x);
    sts_v4(slot(yy), [acc[0].to_bits(), acc[1].to_bits(), acc[2].to_bits(), acc[3].to_bits()]);
    sync_threads();
    if yy == 0 && e < n6 {
        let mut tot = [0f32; 4];
        let mut q = 0;
        while q + 4 <= sgs {
            let xs = [lds_v4(slot(q)), lds_v4(slot(q + 1)), lds_v4(slot(q + 2)), lds_v4(slot(q + 3))];
            for xq in xs {
                for c in 0..4 {
                    tot[c] += f32::from_bits(xq[c]);
                }
            }
            q += 4;
        }
        while q < sgs {
            let xq = lds_v4(slot(q));
            for c in 0..4 {
                tot[c] += f32::from_bits(xq[c]);
            }
            q += 1;
        }
        let (o, j) = if e < d {
            (drms_w_h, e)
        } else if e < 2 * d {
            (drms_w_v, e - d)
        } else {
            (dconv_w, e - 2 * d)
        };
        for c in 0..4 {
            *o.add((j + c as u32) as usize) = tot[c];
        }
    }
}

// ---------------------------------------------------------------- entries
//
// Names: `engram_gate_{fwd,bwd}_<kernel>_<dtype>[_r<NV>]`; `_r<NV>` = the row resident in
// registers as NV chunks of 8 per lane (`ceil(d/8) ≤ 32·NV`); the backward's reductions
// `engram_gate_bwd_reduce[_vec4]` (f32). The host's planner
// (`host/src/engram/gate_conv.rs`) launches each of them for some valid shape.

macro_rules! fwd_stream_entry {
    ($name:ident, $dt:ty, $fast:expr) => {
        // EngramGateConvFwd, streaming rows (see [`fwd`]).
        kernel_abi::gate_fwd_entry!($name, a => {
            let GateFwdArgs {
                h, k, v, rms_w_h, rms_w_v, conv_w, y, vhat, alpha, rrms_h, rrms_k, rrms_v, t_len, d, rows_per_block,
                ntiles, eps
            } = a;
            fwd::<$dt, $fast, 0>(
                h, k, v, rms_w_h, rms_w_v, conv_w, y, vhat, alpha, rrms_h, rrms_k, rrms_v, t_len, d, rows_per_block,
                ntiles, eps
            )
        });
    };
}

macro_rules! fwd_smem_grid1d_entry {
    ($name:ident, $dt:ty, $nv:expr) => {
        // EngramGateConvFwd, `u` in shared memory, 1-D grid, constants computed in the kernel
        // (see [`fwd_smem`]).
        kernel_abi::gate_fwd_entry!($name, a => {
            let GateFwdArgs {
                h, k, v, rms_w_h, rms_w_v, conv_w, y, vhat, alpha, rrms_h, rrms_k, rrms_v, t_len, d, rows_per_block,
                ntiles, eps
            } = a;
            fwd_smem::<$dt, $nv, false>(
                h, k, v, rms_w_h, rms_w_v, conv_w, y, vhat, alpha, rrms_h, rrms_k, rrms_v, t_len, d, rows_per_block,
                ntiles, eps, NO_HOST_CONSTS
            )
        });
    };
}

macro_rules! fwd_smem_entry {
    ($name:ident, $dt:ty, $nv:expr) => {
        // EngramGateConvFwd, `u` in shared memory: [`fwd_smem`] with `GRID_2D` — grid
        // `(ntiles, M)` (no tile count: blockIdx.x is the tile), the per-launch constants from
        // the host, shared memory through 32-bit addresses, the ftz `ex2`/`rcp`/`rsqrt` forms;
        // bitwise the 1-D-grid kernel where |conv| and |alpha's logit| < 87.
        kernel_abi::gate_fwd_smem_entry!($name, a => {
            let GateFwdSmemArgs {
                h, k, v, rms_w_h, rms_w_v, conv_w, y, vhat, alpha, rrms_h, rrms_k, rrms_v, t_len, d, rows_per_block,
                inv_d, inv_sqrt_d, chunk_magic: nch_magic, eps
            } = a;
            let lc = FwdHostConsts { inv_d, inv_sqrt_d, nch_magic };
            fwd_smem::<$dt, $nv, true>(
                h, k, v, rms_w_h, rms_w_v, conv_w, y, vhat, alpha, rrms_h, rrms_k, rrms_v, t_len, d, rows_per_block, 0,
                eps, lc
            )
        });
    };
}

macro_rules! bwd_entry {
    ($name:ident, $dt:ty, $fast:expr, $nv:expr) => {
        // EngramGateConvBwd main entry, one warp per tile row (see [`bwd`]).
        kernel_abi::gate_bwd_entry!($name, a => {
            let GateBwdArgs {
                dy, h, k, v, rms_w_h, rms_w_v, conv_w, alpha, rrms_h, rrms_k, dh, dk, dv, part, scratch, t_len, d,
                rows_per_block, ntiles, eps
            } = a;
            bwd::<$dt, $fast, $nv>(
                dy, h, k, v, rms_w_h, rms_w_v, conv_w, alpha, rrms_h, rrms_k, dh, dk, dv, part, scratch, t_len, d,
                rows_per_block, ntiles, eps
            )
        });
    };
}

macro_rules! bwd_split_entry {
    ($name:ident, $dt:ty, $nv:expr) => {
        // EngramGateConvBwd main entry, tile rows split over warps (see [`bwd_split`]).
        kernel_abi::gate_bwd_split_entry!($name, a => {
            let GateBwdSplitArgs {
                dy, h, k, v, rms_w_h, rms_w_v, conv_w, alpha, rrms_h, rrms_k, dh, dk, dv, part, t_len, d,
                rows_per_block, warps_per_row, warp_row_magic, inv_sqrt_d, inv_d, eps
            } = a;
            bwd_split::<$dt, $nv>(
                dy, h, k, v, rms_w_h, rms_w_v, conv_w, alpha, rrms_h, rrms_k, dh, dk, dv, part, t_len, d,
                rows_per_block, warps_per_row, warp_row_magic, inv_sqrt_d, inv_d, eps
            )
        });
    };
}

/// One entry per row of `kernel_abi::gate_kernels!` (the list the host derives its entry names
/// from), its chunks per lane from the row's policy type (`kernel_abi::gate_policies`).
macro_rules! gate_entries {
    ($($name:ident: $kind:ident, $dt:ident, $nv:literal;)*) => {
        $(gate_entries!(
            @ $kind $name,
            gate_entries!(@t $dt),
            { <kernel_abi::gate_policies::$name as kernel_abi::GatePolicy>::NV as usize }
        );)*
    };
    (@ FwdSmem $name:ident, $dt:ty, $nv:expr) => { fwd_smem_entry!($name, $dt, $nv); };
    (@ FwdSmemGrid1d $name:ident, $dt:ty, $nv:expr) => { fwd_smem_grid1d_entry!($name, $dt, $nv); };
    (@ FwdStreamVec8 $name:ident, $dt:ty, $nv:expr) => { fwd_stream_entry!($name, $dt, true); };
    (@ FwdStreamScalar $name:ident, $dt:ty, $nv:expr) => { fwd_stream_entry!($name, $dt, false); };
    (@ BwdSplit $name:ident, $dt:ty, $nv:expr) => { bwd_split_entry!($name, $dt, $nv); };
    (@ BwdRowWarp $name:ident, $dt:ty, $nv:expr) => { bwd_entry!($name, $dt, true, $nv); };
    (@ BwdStreamVec8 $name:ident, $dt:ty, $nv:expr) => { bwd_entry!($name, $dt, true, $nv); };
    (@ BwdStreamScalar $name:ident, $dt:ty, $nv:expr) => { bwd_entry!($name, $dt, false, $nv); };
    (@ BwdReduceScalar $name:ident, $dt:ty, $nv:expr) => {
        kernel_abi::gate_bwd_reduce_entry!($name, a => { bwd_reduce_scalar(a) });
    };
    (@ BwdReduceVec4 $name:ident, $dt:ty, $nv:expr) => {
        kernel_abi::gate_bwd_reduce_entry!($name, a => { bwd_reduce_vec4(a) });
    };
    (@t bf16) => { Bf16 };
    (@t f16) => { F16 };
    (@t f32) => { f32 };
}

kernel_abi::gate_kernels!(gate_entries);
