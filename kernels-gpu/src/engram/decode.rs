//! EngramDecodeFwd kernels (docs/ops.md §6): one fused decode step in two launches.
//!
//! Projection launch (`project_*` entries), grid `(tiles, splits)`: block `(x, y)` owns the
//! output columns of tile `x` and the `W_K`/`W_V` rows `[y·rows_per_split, (y+1)·rows_per_split)` of split `y`, and
//! writes the split's f32 partial `[split][b][k|v][d]` (or `kv [b][k|v][d]` with one split):
//! - `project_mma` (16-byte aligned layout, `d % 8 == 0`): `mma.sync.m16n8k16` over 64-column
//!   tiles, the k-reduction inside the MMA, the warps summed through shared memory in order;
//! - `project_mma_b8k16` (the same, `batch ≤ 8`, `d_mem % 16 == 0`): the same MMAs on the same
//!   fragments, hence bitwise the same partials, without per-row bounds and with a shorter
//!   per-warp chain;
//! - `project_scalar` (any layout): each thread streams its rows for one column, accumulating
//!   `e_t[b,i]·W[i,j]` in f32 for 4 batch rows at a time; the block's row lanes are summed
//!   through shared memory in a fixed order.
//!
//! Finishing launch (`finish_*` entries), one block per batch row, launched as a programmatic
//! dependent (the block finish loads its inputs while the projection runs): it waits in
//! `griddepcontrol.wait`, sums the row's split partials in split order, then the rmsnorms of `h_t` and `q(kk)`, the
//! gate `alpha`, `vh = alpha·vv`, `u = rmsnorm(q(vh))`, the dilated conv over the state taps,
//! `y_t = q(silu(conv) + vh)` and the state row `q(u)`:
//! - `finish_block_{1,2,4}col`: every thread owns 1, 2 or 4 columns, block reductions, the
//!   scalar chain through `rsqrt.approx` + Newton and `rcp.approx`;
//! - `finish_warp_{8,1}col_{shared,kv}` (rows wider than the block finish takes): the block
//!   sums the partials into shared memory (`_shared`) or `kv` (`_kv`, rows too wide for the
//!   staging) and warp 0 finishes the row with correctly rounded sqrt and division.
//!
//! The state shift of the seed contract (`new_conv_state[:, :L-1] = conv_state[:, 1:]`) is
//! spread over every thread of the projection grid: its first two units are loaded at kernel
//! start and stored when the thread leaves, so its DRAM latency overlaps the projection. The
//! ring-buffer step (`shift_state = 0`) reads the taps at physical rows `(pos + t) mod L` and
//! writes `q(u)` over slot `write_row = pos` in place.
//!
//! Every entry takes [`EngramDecodeArgs`] (its fields and the launch contract of each entry
//! are documented there).
use crate::prim::*;
use kernel_abi::{EngramDecodeArgs, DECODE_MMA_TILE_COLS, DECODE_MMA_WARP_SLAB_F32};

/// The 16-bit storage type of a kernel instance.
use crate::prim::Half16 as Dt;

/// `q(v)` as an f32 value.
#[inline(always)]
fn q<D: Dt>(v: f32) -> f32 {
    D::to_f32(D::from_f32(v))
}

/// `VEC` read-only elements (16-byte `ld.global.nc` when `VEC = 8`), widened to f32.
#[inline(always)]
unsafe fn ld_in<D: Dt, const VEC: usize>(p: *const u16) -> [f32; VEC] {
    let mut o = [0f32; VEC];
    if VEC == 8 {
        let w = ld_nc_v4(p as *const u32);
        let mut k = 0;
        while k < 4 {
            o[2 * k] = D::to_f32(w[k] as u16);
            o[2 * k + 1] = D::to_f32((w[k] >> 16) as u16);
            k += 1;
        }
    } else {
        let mut v = 0;
        while v < VEC {
            o[v] = D::to_f32(*p.add(v));
            v += 1;
        }
    }
    o
}

/// The raw words of `VEC` read-only elements: one 16-byte `ld.global.nc` when `VEC = 8`
/// (element `2k` in the low half of word `k`); the single element in word 0 when `VEC = 1`.
#[inline(always)]
unsafe fn ld_raw<const VEC: usize>(p: *const u16) -> [u32; 4] {
    if VEC == 8 {
        ld_nc_v4(p as *const u32)
    } else {
        [*p as u32, 0, 0, 0]
    }
}

/// Element `v` of [`ld_raw`]'s words, widened to f32.
#[inline(always)]
fn widen<D: Dt, const VEC: usize>(w: &[u32; 4], v: usize) -> f32 {
    if VEC == 8 {
        D::to_f32((w[v >> 1] >> (16 * (v & 1))) as u16)
    } else {
        D::to_f32(w[0] as u16)
    }
}

/// As [`ld_in`] through L2 only (data another thread of this launch may write: the state).
#[inline(always)]
unsafe fn ld_state<D: Dt, const VEC: usize>(p: *const u16) -> [f32; VEC] {
    let mut o = [0f32; VEC];
    if VEC == 8 {
        let w = ld_cg_v4_u32(p as *const u32);
        let mut k = 0;
        while k < 4 {
            o[2 * k] = D::to_f32(w[k] as u16);
            o[2 * k + 1] = D::to_f32((w[k] >> 16) as u16);
            k += 1;
        }
    } else {
        let mut v = 0;
        while v < VEC {
            o[v] = D::to_f32(ld_cg_u16(p.add(v)));
            v += 1;
        }
    }
    o
}

/// `VEC` f32 of the workspace, through L2 only (written by other blocks of this launch).
#[inline(always)]
unsafe fn ld_ws<const VEC: usize>(p: *const f32) -> [f32; VEC] {
    let mut o = [0f32; VEC];
    if VEC == 8 {
        let a = ld_cg_v4_u32(p as *const u32);
        let b = ld_cg_v4_u32(p.add(4) as *const u32);
        let mut k = 0;
        while k < 4 {
            o[k] = f32::from_bits(a[k]);
            o[4 + k] = f32::from_bits(b[k]);
            k += 1;
        }
    } else {
        let mut v = 0;
        while v < VEC {
            o[v] = ld_cg_f32(p.add(v));
            v += 1;
        }
    }
    o
}

/// `VEC` f32 of a reduced projection row: from shared memory (generic loads, after a block
/// barrier) or from the workspace through L2.
#[inline(always)]
unsafe fn ld_kv<const VEC: usize>(p: *const f32, shared: bool) -> [f32; VEC] {
    if shared {
        let mut o = [0f32; VEC];
        let mut v = 0;
        while v < VEC {
            o[v] = *p.add(v);
            v += 1;
        }
        o
    } else {
        ld_ws::<VEC>(p)
    }
}

/// Stores `VEC` values rounded to the dtype (one 16-byte store when `VEC = 8`).
#[inline(always)]
unsafe fn st_out<D: Dt, const VEC: usize>(p: *mut u16, v: &[f32; VEC]) {
    if VEC == 8 {
        let mut w = [0u32; 4];
        let mut k = 0;
        while k < 4 {
            w[k] = D::from_f32(v[2 * k]) as u32 | (D::from_f32(v[2 * k + 1]) as u32) << 16;
            k += 1;
        }
        st_v4(p as *mut u32, w);
    } else {
        let mut k = 0;
        while k < VEC {
            *p.add(k) = D::from_f32(v[k]);
            k += 1;
        }
    }
}

/// Raw 16-bit copy unit of the state shift: `VEC` elements.
#[derive(Clone, Copy)]
struct Unit<const VEC: usize> {
    dst: usize,
    w: [u32; 4],
    s: [u16; VEC],
}

/// Loads copy unit `g` of the seed contract's shift: `new[b, t] = old[b, t + 1]` for
/// `t < L − 1`, in units of `VEC` elements along `d`.
#[inline(always)]
unsafe fn copy_load<const VEC: usize>(a: &EngramDecodeArgs, g: u32) -> Unit<VEC> {
    let nch = a.d / VEC as u32;
    let per = (a.max_conv_len - 1) * nch;
    // `per > 0` whenever a unit exists (L ≥ 2); `checked_div` keeps the kernel free of a panic path.
    let b = g.checked_div(per).unwrap_or(0);
    let r = g - b * per;
    let dst = (b * a.max_conv_len * a.d) as usize + (r as usize) * VEC;
    let src = dst + a.d as usize;
    let mut u = Unit { dst, w: [0; 4], s: [0; VEC] };
    if VEC == 8 {
        u.w = ld_nc_v4(a.conv_state.add(src) as *const u32);
    } else {
        let mut v = 0;
        while v < VEC {
            u.s[v] = *a.conv_state.add(src + v);
            v += 1;
        }
    }
    u
}

#[inline(always)]
unsafe fn copy_store<const VEC: usize>(a: &EngramDecodeArgs, u: &Unit<VEC>) {
    if VEC == 8 {
        st_v4(a.new_conv_state.add(u.dst) as *mut u32, u.w);
    } else {
        let mut v = 0;
        while v < VEC {
            *a.new_conv_state.add(u.dst + v) = u.s[v];
            v += 1;
        }
    }
}

/// Stores this thread's preloaded copy units (`first` = unit `g`, `second` = unit `g + total`)
/// and does any further units (grid-stride), then the thread is done with the shift.
#[inline(always)]
unsafe fn copy_finish<const VEC: usize>(
    a: &EngramDecodeArgs,
    pre: &[(Unit<VEC>, bool); 2],
    g: u32,
    total: u32,
    n: u32,
) {
    if pre[0].1 {
        copy_store(a, &pre[0].0);
    }
    if pre[1].1 {
        copy_store(a, &pre[1].0);
    }
    let mut k = g as u64 + 2 * total as u64;
    while k < n as u64 {
        let u = copy_load::<VEC>(a, k as u32);
        copy_store(a, &u);
        k += total as u64;
    }
}

/// Physical state row of logical row `t` (0 = oldest) for a ring whose oldest row is `pos`.
#[inline(always)]
fn phys_row(pos: u32, t: u32, l: u32) -> u32 {
    let r = pos + t;
    if r >= l {
        r - l
    } else {
        r
    }
}

/// Phase 1: this block's partial projections for its tile's columns over its split's rows.
/// Writes `part[split][b][k|v][col]` (or `kv[b][k|v][col]` when there is one split).
#[inline(always)]
unsafe fn project<D: Dt, const VEC: usize, const BB: usize, const U: usize>(
    a: &EngramDecodeArgs,
    smem: *mut f32,
    hook: &mut impl FnMut(),
) {
    let mut hooked = false;
    let nt = block_dim_x();
    let tid = thread_idx_x();
    let cl = 1u32 << a.col_lanes_log2;
    let rl = nt >> a.col_lanes_log2;
    let lc = tid & (cl - 1);
    let lr = tid >> a.col_lanes_log2;
    let tile = block_idx_x();
    let split = block_idx_y();
    let nch = a.d / VEC as u32;
    let c = tile * cl + lc;
    let col_ok = c < nch;
    let j0 = (c as usize) * VEC;
    let r0 = split * a.rows_per_split;
    let r1 = if r0 + a.rows_per_split < a.d_mem { r0 + a.rows_per_split } else { a.d_mem };
    let clv = cl * VEC as u32;
    let clv_log = a.col_lanes_log2 + VEC.trailing_zeros();
    let d = a.d as usize;
    let dm = a.d_mem as usize;
    let mut b0 = 0u32;
    while b0 < a.batch {
        let mut ak = [[0f32; VEC]; BB];
        let mut av = [[0f32; VEC]; BB];
        if col_ok {
            let mut i = r0 + lr;
            while i < r1 {
                // U rows per round: every load issued before the first FMA; the loaded words
                // stay packed (4 registers per 16 bytes) until their FMAs.
                let mut wk = [[0u32; 4]; U];
                let mut wv = [[0u32; 4]; U];
                let mut ev = [[0f32; BB]; U];
                let mut u = 0;
                while u < U {
                    let r = i + u as u32 * rl;
                    if r < r1 {
                        wk[u] = ld_raw::<VEC>(a.w_k.add(r as usize * d + j0));
                        wv[u] = ld_raw::<VEC>(a.w_v.add(r as usize * d + j0));
                        let mut bb = 0;
                        while bb < BB {
                            if b0 + (bb as u32) < a.batch {
                                ev[u][bb] = D::to_f32(*a.e_t.add((b0 as usize + bb) * dm + r as usize));
                            }
                            bb += 1;
                        }
                    }
                    u += 1;
                }
                if !hooked {
                    // The first round's loads are out: the caller's independent loads next.
                    hook();
                    hooked = true;
                }
                unroll8!(u, U, {
                    unroll8!(v, VEC, {
                        let xk = widen::<D, VEC>(&wk[u], v);
                        let xv = widen::<D, VEC>(&wv[u], v);
                        unroll8!(bb, BB, {
                            ak[bb][v] = fma(ev[u][bb], xk, ak[bb][v]);
                            av[bb][v] = fma(ev[u][bb], xv, av[bb][v]);
                        });
                    });
                });
                i += U as u32 * rl;
            }
        }
        if !hooked {
            hook();
            hooked = true;
        }
        // Sum the rl row lanes, one batch row at a time, through shared memory (fixed order).
        let mut bb = 0;
        while bb < BB {
            let b = b0 + bb as u32;
            if b >= a.batch {
                break;
            }
            sync_threads();
            let base = smem.add((lr * 2 * clv + lc * VEC as u32) as usize);
            let (pk, pv) = (pick(&ak, bb), pick(&av, bb));
            let mut v = 0;
            while v < VEC {
                *base.add(v) = pk[v];
                *base.add(clv as usize + v) = pv[v];
                v += 1;
            }
            sync_threads();
            let mut o = tid;
            while o < 2 * clv {
                let m = o >> clv_log;
                let jj = o & (clv - 1);
                let col = tile * clv + jj;
                if col < a.d {
                    let mut s = 0f32;
                    let mut r = 0;
                    while r < rl {
                        s += *smem.add(((r * 2 + m) * clv + jj) as usize);
                        r += 1;
                    }
                    let dst = if a.splits > 1 {
                        a.partials.add((((split * a.batch + b) * 2 + m) * a.d + col) as usize)
                    } else {
                        a.kv.add(((b * 2 + m) * a.d + col) as usize)
                    };
                    *dst = s;
                }
                o += nt;
            }
            bb += 1;
        }
        b0 += BB as u32;
    }
}

/// Phase 1 on tensor cores (`VEC = 8` layouts): the same partials as [`project`], from
/// `mma.sync.m16n8k16` (f32 accumulate). A block's tile is 64 columns; its warps take the
/// split's 16-row k-steps in turn (warp `w`: steps `w, w + nw, …`, two per round with all 16
/// loads issued first). Per k-step and 8 batch rows, the warp computes `D[16 × 8] += A·B`
/// four times (four column pairs per thread) for W_K and again for W_V, with
/// `A[m][k] = W[i0 + k][col(m)]`, `B[k][n] = e[b0 + n][i0 + k]` and the column map
/// `col(m) = 8m + 2u` (`m < 8`), `8(m − 8) + 2u + 1` (`m ≥ 8`) for mma `u`: lane `(g, t)` then
/// needs exactly W rows `i0 + {2t, 2t+1, 2t+8, 2t+9}` × columns `8g..8g+8` (one 16-byte load
/// each), and `prmt` pairs the rows' halves into A fragments. The k-reduction happens inside
/// the MMA; the warps are summed through shared memory in warp order.
#[inline(always)]
unsafe fn project_mma<D: Dt>(a: &EngramDecodeArgs, smem: *mut f32, hook: &mut impl FnMut()) {
    let mut hooked = false;
    let nt = block_dim_x();
    let nw = nt >> 5;
    let warp = thread_idx_x() >> 5;
    let lane = lane_id();
    let g = lane >> 2;
    let tq = lane & 3;
    let tile = block_idx_x();
    let split = block_idx_y();
    let c0 = tile * DECODE_MMA_TILE_COLS;
    let col = c0 + 8 * g;
    let col_ok = col < a.d;
    let r0 = split * a.rows_per_split;
    let r1 = if r0 + a.rows_per_split < a.d_mem { r0 + a.rows_per_split } else { a.d_mem };
    let d = a.d as usize;
    let dm = a.d_mem as usize;
    let mut b0 = 0u32;
    while b0 < a.batch {
        let mut acc = [[[0f32; 4]; 4]; 2];
        let b = b0 + g;
        let b_ok = b < a.batch;
        let erow = a.e_t.add(if b_ok { b as usize * dm } else { 0 });
        let mut i0 = r0 + 16 * warp;
        while i0 < r1 {
            let mut wk = [[0u32; 4]; 8];
            let mut wv = [[0u32; 4]; 8];
            let mut ef = [[0u32; 2]; 2];
            unroll8!(s, 2, {
                let base = i0 + s as u32 * 16 * nw;
                let rows = [base + 2 * tq, base + 2 * tq + 1, base + 2 * tq + 8, base + 2 * tq + 9];
                unroll8!(r, 4, {
                    let row = rows[r];
                    if col_ok && row < r1 {
                        let off = row as usize * d + col as usize;
                        wk[4 * s + r] = ld_nc_v4(a.w_k.add(off) as *const u32);
                        wv[4 * s + r] = ld_nc_v4(a.w_v.add(off) as *const u32);
                    }
                });
                let mut ew = [0u32; 4];
                unroll8!(r, 4, {
                    if b_ok && rows[r] < r1 {
                        ew[r] = *erow.add(rows[r] as usize) as u32;
                    }
                });
                ef[s] = [ew[0] | ew[1] << 16, ew[2] | ew[3] << 16];
            });
            if !hooked {
                // The first round's loads are out: the caller's independent loads next.
                hook();
                hooked = true;
            }
            unroll8!(s, 2, {
                unroll8!(u, 4, {
                    let (k0, k1, k8, k9) = (wk[4 * s][u], wk[4 * s + 1][u], wk[4 * s + 2][u], wk[4 * s + 3][u]);
                    let fk = [
                        prmt_b32(k0, k1, 0x5410),
                        prmt_b32(k0, k1, 0x7632),
                        prmt_b32(k8, k9, 0x5410),
                        prmt_b32(k8, k9, 0x7632),
                    ];
                    acc[0][u] = D::mma(fk, ef[s], acc[0][u]);
                    let (v0, v1, v8, v9) = (wv[4 * s][u], wv[4 * s + 1][u], wv[4 * s + 2][u], wv[4 * s + 3][u]);
                    let fv = [
                        prmt_b32(v0, v1, 0x5410),
                        prmt_b32(v0, v1, 0x7632),
                        prmt_b32(v8, v9, 0x5410),
                        prmt_b32(v8, v9, 0x7632),
                    ];
                    acc[1][u] = D::mma(fv, ef[s], acc[1][u]);
                });
            });
            i0 += 32 * nw;
        }
        if !hooked {
            hook();
            hooked = true;
        }
        // Warp partials → shared [warp][k|v][b 0..8][col 0..64], then summed in warp order.
        sync_threads();
        let wbase = smem.add((warp * DECODE_MMA_WARP_SLAB_F32) as usize);
        unroll8!(m, 2, {
            unroll8!(u, 4, {
                let p = wbase.add(m * 512 + (8 * g + 2 * u as u32) as usize);
                let (r0w, r1w) = ((2 * tq * 64) as usize, ((2 * tq + 1) * 64) as usize);
                *p.add(r0w) = acc[m][u][0];
                *p.add(r1w) = acc[m][u][1];
                *p.add(r0w + 1) = acc[m][u][2];
                *p.add(r1w + 1) = acc[m][u][3];
            });
        });
        sync_threads();
        let mut o = thread_idx_x();
        while o < DECODE_MMA_WARP_SLAB_F32 {
            let m = o >> 9;
            let bl = (o >> 6) & 7;
            let c = c0 + (o & 63);
            let b = b0 + bl;
            if b < a.batch && c < a.d {
                let mut sum = 0f32;
                let mut w = 0;
                while w < nw {
                    sum += *smem.add((w * DECODE_MMA_WARP_SLAB_F32 + o) as usize);
                    w += 1;
                }
                let dst = if a.splits > 1 {
                    a.partials.add((((split * a.batch + b) * 2 + m) * a.d + c) as usize)
                } else {
                    a.kv.add(((b * 2 + m) * a.d + c) as usize)
                };
                *dst = sum;
            }
            o += nt;
        }
        b0 += 8;
    }
}

/// One lane's (or one reduced item's) four MMA accumulators of mma `u` → the partial rows:
/// `s[0]` = (batch `2t`, column `c`), `s[1]` = (`2t + 1`, `c`), `s[2]` = (`2t`, `c + 1`),
/// `s[3]` = (`2t + 1`, `c + 1`) with `c = c0 + 8g + 2u` (the D fragment under the column map of
/// [`project_mma`]); two 8-byte stores, batch rows `≥ B` and columns `≥ d` skipped.
#[inline(always)]
unsafe fn store_partial_pair(a: &EngramDecodeArgs, split: u32, m: u32, c: u32, tq: u32, s: [f32; 4]) {
    if c >= a.d {
        return;
    }
    let (ba, bb) = (2 * tq, 2 * tq + 1);
    let base = if a.splits > 1 { a.partials.add((split * a.batch * 2 * a.d) as usize) } else { a.kv };
    if ba < a.batch {
        let p = base.add(((ba * 2 + m) * a.d + c) as usize) as *mut u64;
        *p = s[0].to_bits() as u64 | (s[2].to_bits() as u64) << 32;
    }
    if bb < a.batch {
        let p = base.add(((bb * 2 + m) * a.d + c) as usize) as *mut u64;
        *p = s[1].to_bits() as u64 | (s[3].to_bits() as u64) << 32;
    }
}

/// The MMA projection for `B ≤ 8`, `d_mem % 16 == 0` on the vectorised layout: the same MMAs on the same fragments
/// as [`project_mma`], hence bitwise its partials, with a short chain per warp:
/// - the first k-step's `W` loads are the kernel's first instructions (32-bit offsets, no
///   bounds: every k-step is whole; a lane past `d` or `B` loads column 0 / batch row 0 instead
///   and its D entries, which only feed unstored outputs, are dropped); the state-shift units
///   are issued after them;
/// - `e_t` pairs come as one 4-byte load each (rows `2t, 2t+1` and `2t+8, 2t+9` of the B
///   fragment are adjacent in memory);
/// - the warp partials go through shared memory as eight 16-byte stores per lane in fragment
///   order (`[warp][m][u][lane]`); after one barrier thread `i` sums fragment item `i` (and
///   `i + block`, …; 256 items) over the warps in warp order with 16-byte loads and writes it
///   as two 8-byte stores. The block has at least two warps (blocks of 128 or 256 threads).
#[inline(always)]
unsafe fn project_mma_b8k16<D: Dt>(a: EngramDecodeArgs) {
    grid_launch_dependents();
    let nt = block_dim_x();
    let nw = nt >> 5;
    let tid = thread_idx_x();
    let warp = tid >> 5;
    let lane = tid & 31;
    let g = lane >> 2;
    let tq = lane & 3;
    let (tile, split) = (block_idx_x(), block_idx_y());
    let c0 = tile * DECODE_MMA_TILE_COLS;
    let col = c0 + 8 * g;
    let r0 = split * a.rows_per_split;
    let r1 = if r0 + a.rows_per_split < a.d_mem { r0 + a.rows_per_split } else { a.d_mem };
    let d = a.d;
    // Lanes past the row or the batch read valid data whose products are never stored.
    let colc = if col < d { col } else { 0 };
    let bc = if g < a.batch { g } else { 0 };
    let wkp = a.w_k.add(colc as usize);
    let wvp = a.w_v.add(colc as usize);
    let ep = a.e_t.add((bc * a.d_mem + 2 * tq) as usize);
    let offs = [0, d, 8 * d, 9 * d];
    // One 16-row k-step: W rows base + {2t, 2t+1, 2t+8, 2t+9} × 8 columns, e pairs.
    let load = |base: u32| -> ([[u32; 4]; 4], [[u32; 4]; 4], [u32; 2]) {
        let mut wk = [[0u32; 4]; 4];
        let mut wv = [[0u32; 4]; 4];
        let off = (base + 2 * tq) * d;
        unroll8!(r, 4, {
            wk[r] = ld_nc_v4(wkp.add((off + offs[r]) as usize) as *const u32);
            wv[r] = ld_nc_v4(wvp.add((off + offs[r]) as usize) as *const u32);
        });
        let e2 = ep.add(base as usize) as *const u32;
        (wk, wv, [*e2, *e2.add(4)])
    };
    let mma_step = |acc: &mut [[[f32; 4]; 4]; 2], wk: &[[u32; 4]; 4], wv: &[[u32; 4]; 4], ef: [u32; 2]| {
        unroll8!(u, 4, {
            let (k0, k1, k8, k9) = (wk[0][u], wk[1][u], wk[2][u], wk[3][u]);
            let fk = [
                prmt_b32(k0, k1, 0x5410),
                prmt_b32(k0, k1, 0x7632),
                prmt_b32(k8, k9, 0x5410),
                prmt_b32(k8, k9, 0x7632),
            ];
            acc[0][u] = D::mma(fk, ef, acc[0][u]);
            let (v0, v1, v8, v9) = (wv[0][u], wv[1][u], wv[2][u], wv[3][u]);
            let fv = [
                prmt_b32(v0, v1, 0x5410),
                prmt_b32(v0, v1, 0x7632),
                prmt_b32(v8, v9, 0x5410),
                prmt_b32(v8, v9, 0x7632),
            ];
            acc[1][u] = D::mma(fv, ef, acc[1][u]);
        });
    };
    let mut acc = [[[0f32; 4]; 4]; 2];
    // Warp `w` takes k-steps w, w + nw, …; the first step's loads go out before anything else
    // (a split of `16·nw·k` rows gives every warp at least one step when `d_mem` allows).
    let i0 = r0 + 16 * warp;
    let first = i0 < r1;
    let (wk0, wv0, e0) = if first { load(i0) } else { ([[0; 4]; 4], [[0; 4]; 4], [0; 2]) };
    // The state shift's units (stored on the way out), behind the W loads.
    let tiles = grid_dim_x();
    let blocks = tiles * grid_dim_y();
    let gt = (split * tiles + tile) * nt + tid;
    let total = blocks * nt;
    let ncopy = if a.shift_state != 0 { a.batch * (a.max_conv_len - 1) * (a.d / 8) } else { 0 };
    let none = Unit { dst: 0, w: [0; 4], s: [0; 8] };
    let g2 = gt as u64 + total as u64;
    let pre = [
        if gt < ncopy { (copy_load::<8>(&a, gt), true) } else { (none, false) },
        if g2 < ncopy as u64 { (copy_load::<8>(&a, g2 as u32), true) } else { (none, false) },
    ];
    if first {
        // Further steps (rare: deeper splits) two at a time, the next pair's loads issued before
        // the current pair's MMAs; MMA order = step order (bitwise `project_mma`'s chain).
        let z = ([[0u32; 4]; 4], [[0u32; 4]; 4], [0u32; 2]);
        let pair = |i: u32| {
            let x = if i < r1 { load(i) } else { z };
            let y = if i + 16 * nw < r1 { load(i + 16 * nw) } else { z };
            (x, y)
        };
        let mut i = i0 + 16 * nw;
        let mut p = if i < r1 { pair(i) } else { (z, z) };
        mma_step(&mut acc, &wk0, &wv0, e0);
        while i < r1 {
            let (x, y) = p;
            let next = i + 32 * nw;
            if next < r1 {
                p = pair(next);
            }
            mma_step(&mut acc, &x.0, &x.1, x.2);
            if i + 16 * nw < r1 {
                mma_step(&mut acc, &y.0, &y.1, y.2);
            }
            i = next;
        }
    }
    let smem = dyn_smem::<f32>();
    // Fragment order: item (m, u, lane) at float4 index (m·4 + u)·32 + lane of the warp's slab.
    let wbase = smem.add((warp * DECODE_MMA_WARP_SLAB_F32 + lane * 4) as usize);
    unroll8!(m, 2, {
        unroll8!(u, 4, {
            let v = acc[m][u];
            let w = [v[0].to_bits(), v[1].to_bits(), v[2].to_bits(), v[3].to_bits()];
            st_v4_generic(wbase.add((m * 4 + u) * 128) as *mut u32, w);
        });
    });
    sync_threads();
    let mut it = tid;
    while it < 256 {
        let ln = it & 31;
        let tq2 = ln & 3;
        if 2 * tq2 < a.batch {
            let mut sum = [0f32; 4];
            let mut w = 0;
            while w < nw {
                let v = ld_v4(smem.add((w * DECODE_MMA_WARP_SLAB_F32 + it * 4) as usize) as *const u32);
                unroll8!(i, 4, {
                    sum[i] += f32::from_bits(v[i]);
                });
                w += 1;
            }
            let (m, u) = (it >> 7, (it >> 5) & 3);
            store_partial_pair(&a, split, m, c0 + 8 * (ln >> 2) + 2 * u, tq2, sum);
        }
        it += nt;
    }
    copy_finish(&a, &pre, gt, total, ncopy);
}

/// `arr[bb]` through compile-time indices only (a runtime index would put `arr` on the stack).
#[inline(always)]
fn pick<const BB: usize, const VEC: usize>(arr: &[[f32; VEC]; BB], bb: usize) -> [f32; VEC] {
    let mut o = [0f32; VEC];
    let mut x = 0;
    while x < BB {
        if x == bb {
            o = arr[x];
        }
        x += 1;
    }
    o
}

/// `1/sqrt(mean + eps)` with correctly rounded sqrt and division.
#[inline(always)]
fn rrms(sum_sq: f32, inv_d: f32, eps: f32) -> f32 {
    div_rn(1.0, sqrt_rn(fma(sum_sq, inv_d, eps)))
}

/// `1/d` and `1/sqrt(d)`, correctly rounded.
#[inline(always)]
fn row_scales(a: &EngramDecodeArgs) -> (f32, f32) {
    (div_rn(1.0, a.d as f32), div_rn(1.0, sqrt_rn(a.d as f32)))
}

/// One batch row of the warp finish in three passes over the columns (any `d`, `K`, layout): one warp.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn finish_row_passes<D: Dt, const VEC: usize>(
    a: &EngramDecodeArgs,
    bu: usize,
    lane: u32,
    inv_d: f32,
    inv_sqrt_d: f32,
    kk_row: *const f32,
    vv_row: *const f32,
    shared: bool,
) {
    let nch = a.d / VEC as u32;
    let d = a.d as usize;
    let l = a.max_conv_len as usize;
    let taps = a.kernel_size - 1;
    // Pass 1: Σh², Σq(kk)², Σ h·q(kk)·w_h² (the hn·kn dot without its two rrms factors).
    let (mut sh, mut sk, mut dot) = (0f32, 0f32, 0f32);
    let mut c = lane;
    while c < nch {
        let j = c as usize * VEC;
        let kk = ld_kv::<VEC>(kk_row.add(j), shared);
        let hv = ld_in::<D, VEC>(a.h_t.add(bu * d + j));
        let wh = ld_in::<D, VEC>(a.rms_w_h.add(j));
        let mut qk = [0f32; VEC];
        let mut v = 0;
        while v < VEC {
            qk[v] = q::<D>(kk[v]);
            sh = fma(hv[v], hv[v], sh);
            sk = fma(qk[v], qk[v], sk);
            dot = fma(hv[v] * wh[v] * wh[v], qk[v], dot);
            v += 1;
        }
        if !a.intermediates.is_null() {
            st_out::<D, VEC>(a.intermediates.add(bu * d + j), &qk);
        }
        c += 32;
    }
    let sh = warp_sum_f32(sh);
    let sk = warp_sum_f32(sk);
    let dot = warp_sum_f32(dot);
    let rh = rrms(sh, inv_d, a.eps);
    let rk = rrms(sk, inv_d, a.eps);
    let alpha = sigmoid(dot * rh * rk * inv_sqrt_d);
    // Pass 2: Σ q(vh)².
    let mut sv = 0f32;
    let mut c = lane;
    while c < nch {
        let j = c as usize * VEC;
        let vv = ld_kv::<VEC>(vv_row.add(j), shared);
        let mut vh = [0f32; VEC];
        let mut v = 0;
        while v < VEC {
            vh[v] = alpha * vv[v];
            let qv = q::<D>(vh[v]);
            sv = fma(qv, qv, sv);
            v += 1;
        }
        if !a.intermediates.is_null() {
            st_out::<D, VEC>(a.intermediates.add((a.batch as usize + bu) * d + j), &vh);
        }
        c += 32;
    }
    let rv = rrms(warp_sum_f32(sv), inv_d, a.eps);
    // Pass 3: u, the conv over the taps, y_t and the state row q(u).
    let mut c = lane;
    while c < nch {
        let j = c as usize * VEC;
        let vv = ld_kv::<VEC>(vv_row.add(j), shared);
        let wv = ld_in::<D, VEC>(a.rms_w_v.add(j));
        let cl = ld_in::<D, VEC>(a.conv_w.add(taps as usize * d + j));
        let mut vh = [0f32; VEC];
        let mut u = [0f32; VEC];
        let mut conv = [0f32; VEC];
        let mut v = 0;
        while v < VEC {
            vh[v] = alpha * vv[v];
            u[v] = q::<D>(vh[v]) * rv * wv[v];
            conv[v] = cl[v] * u[v];
            v += 1;
        }
        let mut p = 0u32;
        while p < taps {
            let t = a.max_conv_len - (taps - p) * a.dilation;
            let row = phys_row(a.pos, t, a.max_conv_len) as usize;
            let sv = ld_state::<D, VEC>(a.conv_state.add((bu * l + row) * d + j));
            let cp = ld_in::<D, VEC>(a.conv_w.add(p as usize * d + j));
            let mut v = 0;
            while v < VEC {
                conv[v] = fma(cp[v], sv[v], conv[v]);
                v += 1;
            }
            p += 1;
        }
        let mut out = [0f32; VEC];
        let mut v = 0;
        while v < VEC {
            out[v] = conv[v] * sigmoid(conv[v]) + vh[v];
            v += 1;
        }
        st_out::<D, VEC>(a.y_t.add(bu * d + j), &out);
        st_out::<D, VEC>(a.new_conv_state.add((bu * l + a.write_row as usize) * d + j), &u);
        c += 32;
    }
}

/// The projection launch (`project_scalar`, `project_mma`): the partials of [`project`] or
/// [`project_mma`] and the seed contract's state shift; the finishing launch, a programmatic
/// dependent, sums the partials.
#[inline(always)]
unsafe fn project_launch<D: Dt, const VEC: usize, const BB: usize, const U: usize, const MMA: bool>(
    a: EngramDecodeArgs,
) {
    // The finishing kernel, launched as a programmatic dependent, may start its prologue now; it
    // waits in `griddepcontrol.wait` before reading this launch's partials.
    grid_launch_dependents();
    let nt = block_dim_x();
    let tiles = grid_dim_x();
    let blocks = tiles * grid_dim_y();
    let g = (block_idx_y() * tiles + block_idx_x()) * nt + thread_idx_x();
    let total = blocks * nt;
    // The state shift: this thread's first two units are loaded now and stored on the way out.
    let ncopy = if a.shift_state != 0 { a.batch * (a.max_conv_len - 1) * (a.d / VEC as u32) } else { 0 };
    // Up to two units per thread are loaded up front (serving-b8 has 4352 units for 4096
    // threads: a second unit loaded only on the way out would be a serial DRAM round trip).
    // They are issued right after the projection's first W loads (`hook`).
    let none = Unit { dst: 0, w: [0; 4], s: [0; VEC] };
    let g2 = g as u64 + total as u64;
    let mut pre = [(none, false), (none, false)];
    let mut hook = || {
        pre = [
            if g < ncopy { (copy_load::<VEC>(&a, g), true) } else { (none, false) },
            if g2 < ncopy as u64 { (copy_load::<VEC>(&a, g2 as u32), true) } else { (none, false) },
        ];
    };
    let smem = dyn_smem::<f32>();
    if MMA {
        project_mma::<D>(&a, smem, &mut hook);
    } else {
        project::<D, VEC, BB, U>(&a, smem, &mut hook);
    }
    copy_finish(&a, &pre, g, total, ncopy);
}

/// The finishing kernel's phase A: `kv` row `b` (`[k|v][d]`, f32) into `dst` as the sum of
/// the split partials in split order from 0, by the whole block. With one split the projection
/// wrote `kv` itself, which is copied unchanged.
#[inline(always)]
unsafe fn sum_splits_row<const VEC: usize>(a: &EngramDecodeArgs, b: u32, dst: *mut f32) {
    let nt = block_dim_x();
    let n2 = (2 * a.d) as usize;
    let (src, splits) = if a.splits > 1 { (a.partials as *const f32, a.splits) } else { (a.kv as *const f32, 1) };
    let row = src.add(b as usize * n2);
    let stride = a.batch as usize * n2;
    if VEC == 8 {
        // 4 floats per item (d % 8 == 0: 16-byte aligned), up to 16 splits in flight.
        let items = (2 * a.d) >> 2;
        let mut o = thread_idx_x();
        while o < items {
            let e = (o as usize) << 2;
            let p = row.add(e);
            let mut sum = [0f32; 4];
            let mut sp = 0u32;
            while sp < splits {
                let mut t = [[0u32; 4]; 16];
                unroll8!(k, 8, {
                    if sp + (k as u32) < splits {
                        t[k] = ld_cg_v4_u32(p.add((sp as usize + k) * stride) as *const u32);
                    }
                });
                unroll8!(k, 8, {
                    if sp + (k as u32) + 8 < splits {
                        t[k + 8] = ld_cg_v4_u32(p.add((sp as usize + k + 8) * stride) as *const u32);
                    }
                });
                let mut k = 0;
                while k < 16 {
                    if sp + (k as u32) < splits {
                        unroll8!(i, 4, {
                            sum[i] =
                                if a.splits == 1 { f32::from_bits(t[k][i]) } else { sum[i] + f32::from_bits(t[k][i]) };
                        });
                    }
                    k += 1;
                }
                sp += 16;
            }
            unroll8!(i, 4, {
                *dst.add(e + i) = sum[i];
            });
            o += nt;
        }
        return;
    }
    let mut o = thread_idx_x() as usize;
    while o < n2 {
        let p = row.add(o);
        let mut sum = 0f32;
        let mut sp = 0u32;
        while sp < splits {
            let mut t = [0f32; 8];
            unroll8!(k, 8, {
                if sp + (k as u32) < splits {
                    t[k] = ld_cg_f32(p.add((sp as usize + k) * stride));
                }
            });
            unroll8!(k, 8, {
                if sp + (k as u32) < splits {
                    sum = if a.splits == 1 { t[k] } else { sum + t[k] };
                }
            });
            sp += 8;
        }
        *dst.add(o) = sum;
        o += nt as usize;
    }
}

/// The warp finishing launch (`finish_warp_{8,1}col_{shared,kv}`): block `b` finishes batch row
/// `b`. After the dependent wait the whole block sums the split partials of the row into
/// `2·d` f32 of dynamic shared memory (`SHARED`) or into the row of `kv` (which a one-split
/// projection wrote itself); after one barrier warp 0 finishes the row in three passes.
#[inline(always)]
unsafe fn finish_launch<D: Dt, const VEC: usize, const SHARED: bool>(a: EngramDecodeArgs) {
    let b = block_idx_x();
    let bu = b as usize;
    let d = a.d as usize;
    let lane = lane_id();
    let warp0 = thread_idx_x() < 32;
    let row = if SHARED { dyn_smem::<f32>() } else { a.kv.add(bu * 2 * d) };
    // Launched as a programmatic dependent: the partials are read only after the projection
    // launch has completed.
    grid_dependency_wait();
    if SHARED || a.splits > 1 {
        sum_splits_row::<VEC>(&a, b, row);
    }
    sync_threads();
    if !warp0 {
        return;
    }
    let (inv_d, inv_sqrt_d) = row_scales(&a);
    let (kk_row, vv_row) = (row as *const f32, row.add(d) as *const f32);
    // Rows of d ≤ 512 with every input loaded into registers before the wait: never planned (the
    // 8-column warp finish takes d > 1024).
    finish_row_passes::<D, VEC>(&a, bu, lane, inv_d, inv_sqrt_d, kk_row, vv_row, SHARED);
}

// ---------------------------------------------------------------- block finish

/// `E` (1, 2, 4) consecutive 16-bit inputs as raw words (element `v` in half `v & 1` of word
/// `v >> 1`), through the read-only path.
#[inline(always)]
unsafe fn ld_e_nc<const E: usize>(p: *const u16) -> [u32; 2] {
    if E == 4 {
        let (x, y) = ld_nc_v2_u32(p as *const u32);
        [x, y]
    } else if E == 2 {
        [*(p as *const u32), 0]
    } else {
        [*p as u32, 0]
    }
}

/// As [`ld_e_nc`] through L2 only (the state, which this launch writes).
#[inline(always)]
unsafe fn ld_e_cg<const E: usize>(p: *const u16) -> [u32; 2] {
    if E == 4 {
        ld_cg_v2_u32(p as *const u32)
    } else if E == 2 {
        [ld_cg_f32(p as *const f32).to_bits(), 0]
    } else {
        [ld_cg_u16(p) as u32, 0]
    }
}

/// Element `v` of [`ld_e_nc`]'s words, widened to f32.
#[inline(always)]
fn wide_e<D: Dt>(w: &[u32; 2], v: usize) -> f32 {
    D::to_f32((w[v >> 1] >> (16 * (v & 1))) as u16)
}

/// `E` f32 of the workspace through L2 only (one 16-, 8- or 4-byte load).
#[inline(always)]
unsafe fn ld_part_e<const E: usize>(p: *const f32) -> [f32; E] {
    let mut o = [0f32; E];
    if E == 4 {
        let w = ld_cg_v4_u32(p as *const u32);
        let mut k = 0;
        while k < 4 {
            o[k] = f32::from_bits(w[k]);
            k += 1;
        }
    } else if E == 2 {
        let w = ld_cg_v2_u32(p as *const u32);
        o[0] = f32::from_bits(w[0]);
        o[1] = f32::from_bits(w[1]);
    } else {
        o[0] = ld_cg_f32(p);
    }
    o
}

/// Stores `E` values rounded to the dtype (one 8-, 4- or 2-byte store).
#[inline(always)]
unsafe fn st_e<D: Dt, const E: usize>(p: *mut u16, v: &[f32; E]) {
    if E == 4 {
        let lo = D::from_f32(v[0]) as u32 | (D::from_f32(v[1]) as u32) << 16;
        let hi = D::from_f32(v[2]) as u32 | (D::from_f32(v[3]) as u32) << 16;
        *(p as *mut u64) = lo as u64 | (hi as u64) << 32;
    } else if E == 2 {
        *(p as *mut u32) = D::from_f32(v[0]) as u32 | (D::from_f32(v[1]) as u32) << 16;
    } else {
        *p = D::from_f32(v[0]);
    }
}

/// `1/sqrt(sum_sq·inv_d + eps)`: `rsqrt.approx` and one Newton step (≲ 2 ulp of f32; an
/// infinite estimate, mean + eps = 0, is kept as is).
#[inline(always)]
fn rrms_fast(sum_sq: f32, inv_d: f32, eps: f32) -> f32 {
    let x = fma(sum_sq, inv_d, eps);
    let r = rsqrt_approx(x);
    let n = r * fma(-0.5 * x, r * r, 1.5);
    if r == f32::INFINITY {
        r
    } else {
        n
    }
}

/// σ(x) through `ex2.approx` and `rcp.approx` (a few ulp of f32).
#[inline(always)]
fn sigmoid_fast(v: f32) -> f32 {
    rcp_approx(1.0 + exp_f32(-v))
}

/// Block sum of three values: warp butterflies (interleaved), one shared-memory slot of four
/// floats per warp at `red`, one barrier, then every thread adds the warps' sums in warp order.
#[inline(always)]
unsafe fn block_sum3(red: *mut f32, mut x: f32, mut y: f32, mut z: f32) -> (f32, f32, f32) {
    let mut m = 16;
    while m > 0 {
        let (sx, sy, sz) = (shfl_xor_f32(x, m), shfl_xor_f32(y, m), shfl_xor_f32(z, m));
        x += sx;
        y += sy;
        z += sz;
        m >>= 1;
    }
    let warp = thread_idx_x() >> 5;
    if lane_id() == 0 {
        let p = red.add(4 * warp as usize);
        *p = x;
        *p.add(1) = y;
        *p.add(2) = z;
    }
    sync_threads();
    let nw = block_dim_x() >> 5;
    let (mut sx, mut sy, mut sz) = (0f32, 0f32, 0f32);
    let mut w = 0;
    while w < nw {
        let p = red.add(4 * w as usize);
        sx += *p;
        sy += *p.add(1);
        sz += *p.add(2);
        w += 1;
    }
    (sx, sy, sz)
}

/// Block sum of one value (as [`block_sum3`], one float per warp at `red`).
#[inline(always)]
unsafe fn block_sum1(red: *mut f32, mut x: f32) -> f32 {
    x = warp_sum_f32(x);
    let warp = thread_idx_x() >> 5;
    if lane_id() == 0 {
        *red.add(warp as usize) = x;
    }
    sync_threads();
    let nw = block_dim_x() >> 5;
    let mut s = 0f32;
    let mut w = 0;
    while w < nw {
        s += *red.add(w as usize);
        w += 1;
    }
    s
}

/// The block finishing launch (`finish_block_*`): block `b` finishes batch row `b` with all
/// its threads; thread `t` owns columns `[E·t, E·t + E)` (`block·E ≥ d`, `d % E == 0`, the
/// inputs `2E`-byte aligned). Every load of the thread's columns (the split partials of `kk` and
/// `vv`, up to 16 splits; `h_t`, the weights, the state taps for `K ≤ 4`) is issued up front;
/// the partials are summed in split order from 0 (bitwise [`sum_splits_row`]'s `kv`), the three
/// row sums and `Σ q(vh)²` are block reductions (warp butterflies + one barrier each), and the
/// scalar chain uses `rsqrt.approx` + Newton and `rcp.approx`. Dynamic shared memory: 640 bytes.
#[inline(always)]
unsafe fn finish_wide<D: Dt, const E: usize>(a: EngramDecodeArgs) {
    let bu = block_idx_x() as usize;
    let d = a.d as usize;
    let l = a.max_conv_len as usize;
    let j0 = thread_idx_x() as usize * E;
    let on = j0 < d;
    let taps = a.kernel_size - 1;
    let (src, splits) = if a.splits > 1 { (a.partials as *const f32, a.splits) } else { (a.kv as *const f32, 1) };
    let stride = a.batch as usize * 2 * d;
    let krow = src.add(bu * 2 * d + j0);
    let vrow = krow.add(d);
    // 1. The loads that do not depend on the projection launch (inputs only), up front.
    let z = [0u32; 2];
    let (mut hw, mut whw, mut wvw, mut clw) = (z, z, z, z);
    let mut sw = [z; 3];
    let mut cww = [z; 3];
    if on {
        hw = ld_e_nc::<E>(a.h_t.add(bu * d + j0));
        whw = ld_e_nc::<E>(a.rms_w_h.add(j0));
        wvw = ld_e_nc::<E>(a.rms_w_v.add(j0));
        clw = ld_e_nc::<E>(a.conv_w.add(taps as usize * d + j0));
        unroll8!(p, 3, {
            if (p as u32) < taps {
                let t = a.max_conv_len - (taps - p as u32) * a.dilation;
                let row = phys_row(a.pos, t, a.max_conv_len) as usize;
                sw[p] = ld_e_cg::<E>(a.conv_state.add((bu * l + row) * d + j0));
                cww[p] = ld_e_nc::<E>(a.conv_w.add(p * d + j0));
            }
        });
    }
    let (inv_d, inv_sqrt_d) = row_scales(&a);
    // Σh² and h·w_h² need only the inputs: computed before the wait.
    let mut sh = 0f32;
    let mut hww = [0f32; E];
    if on {
        unroll8!(v, E, {
            let h = wide_e::<D>(&hw, v);
            let w = wide_e::<D>(&whw, v);
            sh = fma(h, h, sh);
            hww[v] = h * w * w;
        });
    }
    // Launched as a programmatic dependent: everything above overlapped the projection launch;
    // its partials are read only after it has completed (a no-op for an ordinary launch).
    grid_dependency_wait();
    // 2. kk, vv: the partials in split order from 0, 16 splits' loads in flight per round.
    let mut kk = [0f32; E];
    let mut vv = [0f32; E];
    if on {
        let mut sp = 0u32;
        while sp < splits {
            let mut pk = [[0f32; E]; 16];
            let mut pv = [[0f32; E]; 16];
            let (kr, vr) = (krow.add(sp as usize * stride), vrow.add(sp as usize * stride));
            unroll8!(s, 8, {
                if sp + (s as u32) < splits {
                    pk[s] = ld_part_e::<E>(kr.add(s * stride));
                    pv[s] = ld_part_e::<E>(vr.add(s * stride));
                }
            });
            unroll8!(s, 8, {
                if sp + (s as u32) + 8 < splits {
                    pk[s + 8] = ld_part_e::<E>(kr.add((s + 8) * stride));
                    pv[s + 8] = ld_part_e::<E>(vr.add((s + 8) * stride));
                }
            });
            unroll8!(s, 8, {
                if sp + (s as u32) < splits {
                    unroll8!(v, E, {
                        kk[v] += pk[s][v];
                        vv[v] += pv[s][v];
                    });
                }
            });
            unroll8!(s, 8, {
                if sp + (s as u32) + 8 < splits {
                    unroll8!(v, E, {
                        kk[v] += pk[s + 8][v];
                        vv[v] += pv[s + 8][v];
                    });
                }
            });
            sp += 16;
        }
    }
    // 3. Σh², Σq(kk)², Σ h·w_h²·q(kk) → alpha.
    let (mut sk, mut dot) = (0f32, 0f32);
    let mut qk = [0f32; E];
    if on {
        unroll8!(v, E, {
            qk[v] = q::<D>(kk[v]);
            sk = fma(qk[v], qk[v], sk);
            dot = fma(hww[v], qk[v], dot);
        });
        if !a.intermediates.is_null() {
            st_e::<D, E>(a.intermediates.add(bu * d + j0), &qk);
        }
    }
    let red = dyn_smem::<f32>();
    let (sh, sk, dot) = block_sum3(red, sh, sk, dot);
    let rh = rrms_fast(sh, inv_d, a.eps);
    let rk = rrms_fast(sk, inv_d, a.eps);
    let alpha = sigmoid_fast(dot * rh * rk * inv_sqrt_d);
    // 4. vh, Σ q(vh)² → rrms_v.
    let mut vh = [0f32; E];
    let mut sv = 0f32;
    unroll8!(v, E, {
        vh[v] = alpha * vv[v];
        let qv = q::<D>(vh[v]);
        sv = fma(qv, qv, sv);
    });
    if on && !a.intermediates.is_null() {
        st_e::<D, E>(a.intermediates.add((a.batch as usize + bu) * d + j0), &vh);
    }
    let ssv = block_sum1(red.add(128), sv);
    let rv = rrms_fast(ssv, inv_d, a.eps);
    if !on {
        return;
    }
    // 5. u, the conv over the taps, y_t and the state row q(u).
    let mut u = [0f32; E];
    let mut out = [0f32; E];
    unroll8!(v, E, {
        u[v] = q::<D>(vh[v]) * rv * wide_e::<D>(&wvw, v);
        let mut conv = wide_e::<D>(&clw, v) * u[v];
        unroll8!(p, 3, {
            if (p as u32) < taps {
                conv = fma(wide_e::<D>(&cww[p], v), wide_e::<D>(&sw[p], v), conv);
            }
        });
        out[v] = conv;
    });
    let mut p = 3u32;
    while p < taps {
        let t = a.max_conv_len - (taps - p) * a.dilation;
        let row = phys_row(a.pos, t, a.max_conv_len) as usize;
        let s = ld_e_cg::<E>(a.conv_state.add((bu * l + row) * d + j0));
        let c = ld_e_nc::<E>(a.conv_w.add(p as usize * d + j0));
        unroll8!(v, E, {
            out[v] = fma(wide_e::<D>(&c, v), wide_e::<D>(&s, v), out[v]);
        });
        p += 1;
    }
    unroll8!(v, E, {
        out[v] = out[v] * sigmoid_fast(out[v]) + vh[v];
    });
    st_e::<D, E>(a.y_t.add(bu * d + j0), &out);
    st_e::<D, E>(a.new_conv_state.add((bu * l + a.write_row as usize) * d + j0), &u);
}

/// One entry per row of `kernel_abi::decode_kernels!` (the list the host derives its entry
/// names from), its columns per lane or thread from the row's policy type
/// (`kernel_abi::decode_policies`).
macro_rules! decode_entries {
    ($($name:ident: $kind:ident, $dt:ident, $cols:literal;)*) => {
        $(decode_entries!(
            @ $kind $name,
            decode_entries!(@t $dt),
            { <kernel_abi::decode_policies::$name as kernel_abi::DecodePolicy>::COLS as usize }
        );)*
    };
    (@ ProjectScalar $name:ident, $t:ty, $cols:expr) => {
        kernel_abi::engram_decode_entry!($name, a => { project_launch::<$t, $cols, 4, 4, false>(a) });
    };
    (@ ProjectMma $name:ident, $t:ty, $cols:expr) => {
        kernel_abi::engram_decode_entry!($name, a => { project_launch::<$t, $cols, 8, 2, true>(a) });
    };
    (@ ProjectMmaB8K16 $name:ident, $t:ty, $cols:expr) => {
        kernel_abi::engram_decode_entry!($name, a => { project_mma_b8k16::<$t>(a) });
    };
    (@ FinishWarpShared $name:ident, $t:ty, $cols:expr) => {
        kernel_abi::engram_decode_entry!($name, a => { finish_launch::<$t, $cols, true>(a) });
    };
    (@ FinishWarpKv $name:ident, $t:ty, $cols:expr) => {
        kernel_abi::engram_decode_entry!($name, a => { finish_launch::<$t, $cols, false>(a) });
    };
    (@ FinishBlock $name:ident, $t:ty, $cols:expr) => {
        kernel_abi::engram_decode_entry!($name, a => { finish_wide::<$t, $cols>(a) });
    };
    (@t f16) => { F16 };
    (@t bf16) => { Bf16 };
}
kernel_abi::decode_kernels!(decode_entries);
