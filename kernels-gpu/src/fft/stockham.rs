//! The general FFT pass: `C` transforms of length `L` (powers of two) per block, Stockham
//! autosort in shared memory, `E` elements per thread held in registers.
//!
//! Stage `s` (radix `R = 2^lr`, `Ns` = product of the earlier radices) computes, for every
//! butterfly `j < L/R` (with `k = j mod Ns`):
//! `a_r = src[j + r·L/R] · W_{Ns·R}^{r·k}`, `b = DFT_R(a)`, `dst[(j − k)·R + k + r·Ns] = b_r`.
//! After the last stage `dst` is in natural order (no bit reversal). The first stage reads
//! global memory directly and the last writes it directly (both coalesced: consecutive
//! threads take consecutive `j`); the stages between exchange through shared memory.
//!
//! Addressing (one launch = one pass of a plan): transform `t` of the launch reads element `j`
//! at `base(t, M_in) + j·M_in` and writes output `k` at `base(t, M_out) + k·M_out`, with
//! `base(t, M) = (t / M)·L·M + t mod M`. `M = 1` is a contiguous row; `M > 1` are the columns of
//! an `[L, M]` matrix (the first pass of a four-step plan), or the transposed store of its
//! second pass. With `TW4` the output `k` of transform `t` is multiplied by
//! `W_n^{(t mod M_in)·k}` (the four-step twiddle: computed in registers for c64, [`Mem::twiddle`];
//! for c128 from a two-level table `lo[p mod S]·hi[p/S]`).

use super::cx::{dft, unroll, Cx, Mem};
use super::prim::*;
use kernel_abi::FftPassPolicy;

pub use kernel_abi::fft::{pad_shift, COL_MAP, OUT_SMEM, REVERSE_GROUPS, TW4, WAIT_FIRST};

struct Ctx<T: Mem> {
    x: *const Cx<T>,
    y: *mut Cx<T>,
    twlo: *const Cx<T>,
    twhi: *const Cx<T>,
    log_l: u32,
    log_tpt: u32,
    log_split: u32,
    log_mout: u32,
    flags: u32,
    jt: u32,
    t: u32,
    min_mask: u32,
    valid: bool,
    base_in: u32,
    base_out: u32,
    log_min: u32,
    /// Shared-window byte address (32-bit, `dyn_smem_u32`-based) of this transform's slot in
    /// the first Stockham buffer.
    smc: u32,
    /// log2 of the elements between pad elements ([`sidx`]).
    ps: u32,
}

/// Shared-memory slot of element `i` of a transform: one pad element after every `2^ps`
/// (`kernel_abi::fft::pad_shift`: 16, or 8 for the c128 kernels whose first stage has radix
/// ≤ 8), so the stride-`R` accesses of a Stockham stage fall in distinct banks.
#[inline(always)]
fn sidx(i: u32, ps: u32) -> u32 {
    i + (i >> ps)
}

/// Shared-window byte address of slot `i` of the `T` elements at `at` (all shared-memory
/// accesses are `ld.shared`/`st.shared` at 32-bit addresses: `LDS`/`STS`, 32-bit arithmetic).
#[inline(always)]
fn saddr<T: Mem>(at: u32, i: u32) -> u32 {
    at + i * core::mem::size_of::<Cx<T>>() as u32
}

/// `sidx(a + d)` as `sidx(a) + sidx(d)` where that is exact: when `(a mod P) + (d mod P) < P`
/// (`P = 2^ps`) for every `a mod P ≤ amax` (then `(a + d) >> ps = (a >> ps) + (d >> ps)`). `d`
/// and `amax` are compile-time constants in the unrolled stages, so the branch folds and the
/// access becomes one shared-memory instruction at `at_a + constant` (`sa = saddr(at,
/// sidx(a))`); otherwise the full index arithmetic. The address is the same either way.
#[inline(always)]
fn saddr_off<T: Mem>(at: u32, sa: u32, a: u32, d: u32, amax: u32, ps: u32) -> u32 {
    let m = (1u32 << ps) - 1;
    if (d & m) + amax.min(m) <= m {
        saddr::<T>(sa, sidx(d, ps))
    } else {
        saddr::<T>(at, sidx(a + d, ps))
    }
}

#[inline(always)]
fn base(t: u32, log_l: u32, log_m: u32) -> u32 {
    ((t >> log_m) << (log_l + log_m)) + (t & ((1 << log_m) - 1))
}

/// `v · W_n^{m·k}`: computed where the precision has [`Mem::twiddle`] (c64: no load at the end
/// of the column pass; from the two-level table longconv-16k 13.04 µs, -64k 10.08, computed
/// 12.43 / 9.52), else from the two-level table.
#[inline(always)]
unsafe fn tw4<T: Mem>(c: &Ctx<T>, v: Cx<T>, m: u32, k: u32) -> Cx<T> {
    let p = m * k;
    if T::COMPUTED_TWIDDLES {
        return v.cmul(T::twiddle(p, c.log_l + c.log_min));
    }
    let lo = T::ld_ro(c.twlo.add((p & ((1 << c.log_split) - 1)) as usize));
    let hi = T::ld_ro(c.twhi.add((p >> c.log_split) as usize));
    v.cmul(lo.cmul(hi))
}

/// Prefetches `bytes` from `p` into L2 (kept there preferentially when `keep`), one 128-byte
/// line per thread and step.
#[inline(always)]
unsafe fn prefetch_table(p: *const u8, bytes: u32, tid: u32, nthreads: u32, keep: bool) {
    let mut off = tid * 128;
    while off < bytes {
        if keep {
            prefetch_l2_evict_last(p.add(off as usize));
        } else {
            prefetch_l2(p.add(off as usize));
        }
        off += nthreads * 128;
    }
}

/// Prefetches group `g`'s rows into L2 (a persistent row pass's next group: `2^log_c` rows of
/// `2^log_l` elements, contiguous in `x`, rows past `count` left out).
#[inline(always)]
unsafe fn prefetch_rows<T: Mem>(x: *const Cx<T>, g: u32, log_c: u32, log_l: u32, count: u32, tid: u32, nthreads: u32) {
    let tn = g << log_c;
    let rows = (count - tn).min(1 << log_c);
    let bytes = (rows << log_l) * core::mem::size_of::<Cx<T>>() as u32;
    prefetch_table(x.add((tn << log_l) as usize) as *const u8, bytes, tid, nthreads, false);
}

/// The shared memory one stage uses (32-bit shared-window byte addresses): it reads its
/// inputs at `rd` (a transform's slot, `sidx` layout) and writes its outputs at `wr`. With
/// `ping_pong` the two differ (alternating buffers), so a stage needs no barrier between its
/// reads and its writes. The first stage reads global memory, or with `staged` the transform's
/// staged input at `stg` (natural order, unpadded; `cp.async`-copied by the block, see
/// `fft_block`).
#[derive(Clone, Copy)]
struct Bufs {
    rd: u32,
    wr: u32,
    stg: u32,
    staged: bool,
    ping_pong: bool,
}

/// Copies the `2^log_c` rows of group `g` (contiguous in `x`, rows past `count` left out) into
/// the staging buffer `dst` with 16-byte `cp.async` copies (`x` and `dst` 16-byte aligned),
/// and commits them as one group. `evict_first`: the copies carry an L2 evict-first policy.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn stage_copy<T: Mem>(
    evict_first: bool,
    x: *const Cx<T>,
    g: u32,
    log_c: u32,
    log_l: u32,
    count: u32,
    dst: *mut Cx<T>,
    tid: u32,
    nthreads: u32,
) {
    let t0 = g << log_c;
    let rows = (count - t0).min(1 << log_c);
    let esz = core::mem::size_of::<Cx<T>>() as u32;
    let chunks = ((rows << log_l) * esz) >> 4;
    let src = x.add((t0 << log_l) as usize) as *const u8;
    let d = dst as *mut u8;
    let mut i = tid;
    while i < chunks {
        if evict_first {
            cp_async_16_evict_first(d.add((i << 4) as usize), src.add((i << 4) as usize));
        } else {
            cp_async_16(d.add((i << 4) as usize), src.add((i << 4) as usize));
        }
        i += nthreads;
    }
    cp_async_commit_group();
}

/// Stage-table twiddles of a stage with `R = E` (one butterfly per thread, `j = jt`): element
/// `r` is `W_{Ns·E}^{r·k}` (`k = jt mod Ns`, `Ns = 2^ls`) from the per-stage table at `off`,
/// laid out `[r − 1][k]` so consecutive threads read consecutive entries (coalesced); element
/// 0 is unused. (Loading r = 1, 2, 4, 8 only and forming the rest as products lost on every c64
/// row, e.g. longconv-16k 13.15 against 10.76 µs: docs/decisions/fft.md.)
#[inline(always)]
unsafe fn stage_twiddles<T: Mem, const E: usize>(tw: *const Cx<T>, jt: u32, ls: u32, off: u32) -> [Cx<T>; E] {
    let mut w = [Cx::<T>::zero(); E];
    let k = jt & ((1u32 << ls) - 1);
    unroll!(E, r, {
        if r != 0 {
            w[r] = T::ld_ro(tw.add((off + ((r as u32 - 1) << ls) + k) as usize));
        }
    });
    w
}

/// [`stage_twiddles`] of the per-stage c128 kernels, from fewer loads: `W^{r·k}` is loaded for
/// `r = 1, 2, 3` and `r = 4, 8, 12` (as far as `E` goes) and formed as `W^{4b·k} · W^{a·k}` for
/// the other `r = 4b + a`; the table and its layout are the same.
#[inline(always)]
unsafe fn stage_twiddles_products<T: Mem, const E: usize>(tw: *const Cx<T>, jt: u32, ls: u32, off: u32) -> [Cx<T>; E] {
    let mut w = [Cx::<T>::zero(); E];
    let k = jt & ((1u32 << ls) - 1);
    unroll!(E, r, {
        if r != 0 && (r < 4 || r % 4 == 0) {
            w[r] = T::ld_ro(tw.add((off + ((r as u32 - 1) << ls) + k) as usize));
        }
    });
    unroll!(E, r, {
        if r > 4 && r % 4 != 0 {
            w[r] = w[r - r % 4].cmul(w[r % 4]);
        }
    });
    w
}

/// One Stockham stage of radix `R` (a no-op unless `R ≤ E`); `ls = log2 Ns`. `w` holds this
/// stage's twiddles from the pass's stage table (`stage_twiddles`; `R = E` for every stage with
/// `ls > 0`). (A per-launch `W_Lt` table indexed in the stage lost to the stage tables:
/// docs/decisions/fft.md.)
#[inline(always)]
unsafe fn stage<T: Mem, const E: usize, const R: usize>(
    c: &Ctx<T>,
    v: &mut [Cx<T>; E],
    ls: u32,
    from_global: bool,
    to_global: bool,
    w: &[Cx<T>; E],
    bufs: Bufs,
) {
    if R > E {
        return;
    }
    let lr = R.trailing_zeros();
    let tpt = 1u32 << c.log_tpt;
    // L/R.
    let quarter = 1u32 << (c.log_l - lr);
    // Read: element e of the thread is input r = e mod R of its butterfly q = e / R. The
    // shared-memory addresses are a per-thread base plus constants where exact (`saddr_off`):
    // reads at `jt + off` (`jt < tpt`), writes at `o0 + d` (see below).
    let rd_jt = saddr::<T>(bufs.rd, sidx(c.jt, c.ps));
    unroll!(E, e, {
        let off = (e / R) as u32 * tpt + (e % R) as u32 * quarter;
        let idx = c.jt + off;
        v[e] = if from_global {
            if !c.valid {
                Cx::zero()
            } else if bufs.staged {
                T::lds(saddr::<T>(bufs.stg, idx))
            } else {
                T::ld_ro(c.x.add((c.base_in + (idx << c.log_min)) as usize))
            }
        } else {
            T::lds(saddr_off::<T>(bufs.rd, rd_jt, c.jt, off, tpt - 1, c.ps))
        };
    });
    if !from_global && !to_global && !bufs.ping_pong {
        // Every thread has read this stage's inputs before any overwrites them.
        sync_threads();
    }
    // Twiddle and butterfly.
    let ns_mask = (1u32 << ls) - 1;
    if ls > 0 {
        unroll!(E, e, {
            if e % R != 0 {
                v[e] = v[e].cmul(w[e]);
            }
        });
    }
    unroll!(E / R, q, {
        dft::<T, R>(&mut *(v.as_mut_ptr().add(q * R) as *mut [Cx<T>; R]));
    });
    // Write. When `q·tpt` is a multiple of `Ns`, `k = jt mod Ns` for every butterfly q of the
    // thread and `o = o0 + d` with `o0 = ((jt − k) << lr) + k` and the constant
    // `d = (q·tpt << lr) + (r << ls)`; `o0 mod 2^(ls + lr) = k < Ns`, so `o0 mod 2^ps < Ns` when
    // `ls + lr ≥ ps` (any value below 2^ps otherwise).
    let k0 = c.jt & ns_mask;
    let o0 = ((c.jt - k0) << lr) + k0;
    let wr_o0 = saddr::<T>(bufs.wr, sidx(o0, c.ps));
    let o0max = if ls + lr >= c.ps { ns_mask } else { (1 << c.ps) - 1 };
    unroll!(E, e, {
        let j = c.jt + (e / R) as u32 * tpt;
        let k = j & ns_mask;
        let o = ((j - k) << lr) + k + (((e % R) as u32) << ls);
        let qt = (e / R) as u32 * tpt;
        if to_global {
            if c.valid {
                let mut val = v[e];
                if c.flags & TW4 != 0 {
                    val = tw4(c, val, c.t & c.min_mask, o);
                }
                T::st(c.y.add((c.base_out + (o << c.log_mout)) as usize), val);
            }
        } else {
            let a = if qt & ns_mask == 0 {
                saddr_off::<T>(bufs.wr, wr_o0, o0, (qt << lr) + (((e % R) as u32) << ls), o0max, c.ps)
            } else {
                saddr::<T>(bufs.wr, sidx(o, c.ps))
            };
            T::sts(a, v[e]);
        }
    });
    if !to_global {
        sync_threads();
    }
}

/// The whole pass for one block (see the module doc): `L = 2^LOG_L`, `E ≤ L` elements per
/// thread, block size `C·L/E` threads.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn fft_block<
    T: Mem,
    const LOG_L: u32,
    const E: usize,
    const HOIST: bool,
    const PP: bool,
    const STG: bool,
    const EVF: bool,
>(
    x: *const Cx<T>,
    y: *mut Cx<T>,
    tw: *const Cx<T>,
    twlo: *const Cx<T>,
    twhi: *const Cx<T>,
    log_c: u32,
    log_min: u32,
    log_mout: u32,
    count: u32,
    log_split: u32,
    flags: u32,
    sm_stride: u32,
) {
    // The ping-pong form serves single-pass plans only (`Form::single_pass_only`: rows in
    // natural order in and out, no four-step twiddle, no shared-memory store; never a
    // dependent launch, so its unconditional wait below is a no-op): its layout parameters are
    // compile-time constants, which removes the general pass's index arithmetic and uniform
    // branches (latency-4k 3.46 → 2.98 µs, spectrogram-1k 3.42 → 3.02). The same for the
    // staged form lost on fnet-512 (9.70 → 10.48) although it gained on shortconv-64 (18.95 →
    // 18.43), and is not kept.
    let (log_min, log_mout, flags) = if PP { (0, 0, 0) } else { (log_min, log_mout, flags) };
    let log_l = LOG_L;
    let tid = thread_idx_x();
    let log_e = E.trailing_zeros();
    let log_tpt = log_l - log_e;
    let (ci, jt) = if flags & COL_MAP != 0 {
        (tid & ((1 << log_c) - 1), tid >> log_c)
    } else {
        (tid >> log_tpt, tid & ((1 << log_tpt) - 1))
    };
    // Shared memory: the generic pointer only for the `cp.async` staging copies; every load
    // and store at 32-bit shared-window addresses from `sm32`.
    let sm = dyn_smem::<Cx<T>>();
    let sm32 = dyn_smem_u32();
    // Start the twiddle tables on their way into L2 while the data loads are in flight (after
    // an L2 flush they would otherwise cost one DRAM round trip per stage).
    let nthreads = block_dim_x();
    let esz = core::mem::size_of::<Cx<T>>() as u32;
    if flags & TW4 != 0 && !T::COMPUTED_TWIDDLES {
        let log_n = log_l + log_min;
        prefetch_table(twlo as *const u8, esz << log_split, tid, nthreads, true);
        prefetch_table(twhi as *const u8, esz << log_n.saturating_sub(log_split), tid, nthreads, true);
    }
    // The persistent column pass's prefetch (below) is compiled into the per-stage 8-element
    // kernels only (c128 512- and 1024-point: the planned persistent column pass); in the other
    // kernels its code alone cost time through their register allocation (throughput-4k c128
    // 5.98 → 6.34 µs, longconv-16k and -64k +0.07).
    let prefetch_columns = !HOIST && !STG && !PP && E == 8;
    // The hoisted kernels issue a persistent row pass's prefetch of its next group's rows after
    // the group's first stage instead of before its data loads, where it competed with them:
    // longconv-16k 10.82 → 10.59 µs, -64k level (both row passes hoisted; same device call,
    // outputs bitwise equal). Not because of a taken branch before the loads (the ping-pong
    // kernels with every branch after their loads measured level). In every form it took the
    // c128 per-stage rows +0.3 / +0.5 µs (throughput-4k, scientific-1m), and the ping-pong
    // 1024-point rows +0.07.
    let late_row_prefetch = HOIST && !PP && !STG;
    let nst = (LOG_L as usize).div_ceil(log_e as usize);
    let first = log_l - log_e * (nst as u32 - 1);
    let out_smem = flags & OUT_SMEM != 0;
    let ps = pad_shift(esz, LOG_L, E as u32);
    // Stage tables: stage s ≥ 1 (radix E, Ns = 2^(first + log_e·(s−1))) starts at
    // `off[s − 1] = Σ_{s' < s} (E − 1)·Ns'`. With `HOIST` every stage's twiddles are loaded here,
    // once, before any data: no twiddle load waits behind a barrier (they depend only on `jt`).
    // (Issued after stage 0's data loads instead, ptxas sinks the later stages' loads below
    // the barriers: latency-4k 2.98 → 3.55–3.94 µs, fnet-512 9.6 → 13.4–21.0.)
    let mut off = [0u32; 3];
    unroll!(3, s, {
        if s >= 1 {
            off[s] = off[s - 1] + (((E as u32) - 1) << (first + log_e * (s as u32 - 1)));
        }
    });
    let mut tws = [[Cx::<T>::zero(); E]; 3];
    if HOIST {
        unroll!(nst, s, {
            if s >= 1 && s <= 3 {
                tws[s - 1] = stage_twiddles::<T, E>(tw, jt, first + log_e * (s as u32 - 1), off[s - 1]);
            }
        });
    }
    // Shared memory: the Stockham buffer of the block's transforms (`C·sm_stride` elements;
    // with `PP` a second one after it, the stages alternating between them), then with `STG`
    // two staging buffers of `C·L` elements (natural order) that receive the block's next group
    // of rows by `cp.async` while the current group computes (row passes only: `log_min = 0`).
    let area = sm_stride << log_c;
    let sm_b = if PP { saddr::<T>(sm32, area) } else { sm32 };
    let stg_at = if PP { 2 * area } else { area };
    let stg0 = sm.add(stg_at as usize);
    let stg0_32 = saddr::<T>(sm32, stg_at);
    let stg_len = 1u32 << (log_c + log_l);
    // Groups of 2^log_c transforms; a grid smaller than the group count loops (persistent
    // blocks), prefetching the next group's rows (into L2, or with `STG` into shared memory)
    // while this one computes and stores; a persistent column pass prefetches the next
    // group's tile into L2 once this group's loads have landed (after the first stage).
    let ngroups = (count + (1 << log_c) - 1) >> log_c;
    let mut g = if flags & REVERSE_GROUPS != 0 { grid_dim_x() - 1 - block_idx_x() } else { block_idx_x() };
    let mut sbuf = 0u32;
    // Programmatic dependent launch: the twiddle tables (written at plan time, never by a
    // pass) are already on their way; wait for the previous pass before touching `x` or `y`.
    if flags & WAIT_FIRST == 0 {
        grid_dependency_wait();
    }
    if STG && g < ngroups {
        stage_copy(EVF, x, g, log_c, log_l, count, stg0, tid, nthreads);
    }
    while g < ngroups {
        // Loop-variant copies: the per-thread addresses derived from them (twiddle, shared
        // memory) are recomputed per group rather than hoisted and held in registers.
        let (ci, jt) = (opaque_u32(ci), opaque_u32(jt));
        let t0 = g << log_c;
        let t = t0 + ci;
        let next = g + grid_dim_x();
        if STG {
            // The next group's copies go into the other staging buffer (last read in the
            // previous group's first stage, before its first barrier); then this group's rows
            // (committed one group earlier) must have landed, and everyone's must be visible.
            if next < ngroups {
                stage_copy(EVF, x, next, log_c, log_l, count, stg0.add(((sbuf ^ 1) * stg_len) as usize), tid, nthreads);
                cp_async_wait_group_1();
            } else {
                cp_async_wait_all();
            }
            sync_threads();
        } else if !late_row_prefetch && next < ngroups && log_min == 0 {
            prefetch_rows(x, next, log_c, log_l, count, tid, nthreads);
        }
        let c = Ctx {
            x,
            y,
            twlo,
            twhi,
            log_l,
            log_tpt,
            log_split,
            log_mout,
            flags,
            jt,
            t,
            min_mask: (1 << log_min) - 1,
            valid: t < count,
            base_in: base(t, log_l, log_min),
            base_out: base(t, log_l, log_mout),
            log_min,
            smc: saddr::<T>(sm32, ci * sm_stride),
            ps,
        };
        let smc_b = saddr::<T>(sm_b, ci * sm_stride);
        let stg = if STG { saddr::<T>(stg0_32, sbuf * stg_len + (ci << log_l)) } else { 0 };
        let mut v = [Cx::<T>::zero(); E];
        unroll!(nst, s, {
            let lr = if s == 0 { first } else { log_e };
            let ls = if s == 0 { 0 } else { first + log_e * (s as u32 - 1) };
            let from_global = s == 0;
            let to_global = s == nst - 1 && !out_smem;
            let w = if !HOIST && s >= 1 && s <= 3 && !T::COMPUTED_TWIDDLES {
                stage_twiddles_products::<T, E>(tw, jt, ls, off[s - 1])
            } else if !HOIST && s >= 1 && s <= 3 {
                stage_twiddles::<T, E>(tw, jt, ls, off[s - 1])
            } else if s >= 1 && s <= 3 {
                tws[s - 1]
            } else {
                tws[0]
            };
            // Stage s writes buffer s mod 2 and reads buffer (s − 1) mod 2 (`PP`), else both A.
            let (rd, wr) = if PP && s % 2 == 1 {
                (c.smc, smc_b)
            } else if PP && s >= 1 {
                (smc_b, c.smc)
            } else {
                (c.smc, c.smc)
            };
            let b = Bufs { rd, wr, stg, staged: STG, ping_pong: PP };
            match lr {
                1 => stage::<T, E, 2>(&c, &mut v, ls, from_global, to_global, &w, b),
                2 => stage::<T, E, 4>(&c, &mut v, ls, from_global, to_global, &w, b),
                3 => stage::<T, E, 8>(&c, &mut v, ls, from_global, to_global, &w, b),
                4 => stage::<T, E, 16>(&c, &mut v, ls, from_global, to_global, &w, b),
                _ => stage::<T, E, 32>(&c, &mut v, ls, from_global, to_global, &w, b),
            }
            if late_row_prefetch && s == 0 && log_min == 0 && next < ngroups {
                // The hoisted kernels' persistent row prefetch (see `late_row_prefetch`).
                prefetch_rows(x, next, log_c, log_l, count, tid, nthreads);
            }
            if prefetch_columns && s == 0 && log_min > 0 && next < ngroups {
                // Persistent column pass: the next group's tile (2^log_l row segments of 2^log_c
                // elements, stride 2^log_min) into L2, one 128-byte line per thread and step.
                // Issued after this group's loads so the two do not compete (scientific-1m's
                // column pass 53.8 → 49.5 µs with one block per SM looping).
                let tn = next << log_c;
                let log_seg = log_c + esz.trailing_zeros();
                let log_lines = log_seg.saturating_sub(7);
                let total = 1u32 << (log_l + log_lines);
                let b0 = x.add(base(tn, log_l, log_min) as usize) as *const u8;
                let mut i = tid;
                while i < total {
                    let j = i >> log_lines;
                    let q = i & ((1 << log_lines) - 1);
                    prefetch_l2(b0.add(((j << log_min) * esz + (q << 7)) as usize));
                    i += nthreads;
                }
            }
        });
        if out_smem {
            // The result is in shared memory (the last stage ended with a barrier): store it
            // with consecutive threads on consecutive columns. (It is in buffer (nst − 1) mod 2.)
            let fin = if PP && (nst - 1) % 2 == 1 { sm_b } else { sm32 };
            let mut q = 0;
            while q < E {
                let e = tid + q as u32 * nthreads;
                let c2 = e & ((1 << log_c) - 1);
                let k = e >> log_c;
                let t2 = t0 + c2;
                if t2 < count {
                    let mut val = T::lds(saddr::<T>(fin, c2 * sm_stride + sidx(k, ps)));
                    if flags & TW4 != 0 {
                        val = tw4(&c, val, t2 & c.min_mask, k);
                    }
                    T::st(y.add((base(t2, log_l, log_mout) + (k << log_mout)) as usize), val);
                }
                q += 1;
            }
        }
        g = next;
        sbuf ^= 1;
        if g < ngroups && (nst > 1 || out_smem) {
            // This group's last shared-memory reads are done before the next group's first
            // shared-memory writes.
            sync_threads();
        }
    }
}

/// One PTX entry per row of `kernel_abi::fft_pass_kernels!` (the list the host planner's kernel
/// table is built from), its body instantiated from the row's policy type
/// (`kernel_abi::pass_policies`): the precision gives the element type, the form the pass's
/// code paths (on the host, for the CPU simulation in `sim/tests/fft.rs`: plain functions of
/// the same names taking the same [`kernel_abi::FftPassArgs`]).
macro_rules! pass_entries {
    ($($name:ident: $prec:ident, $log_l:literal, $e:literal, $form:ident, $max:literal, $layout:expr;)*) => {
        $(pass_entries!(@entry $name, pass_entries!(@t $prec));)*
    };
    (@t c64) => { f32 };
    (@t c128) => { f64 };
    (@entry $name:ident, $t:ty) => {
        kernel_abi::fft_pass_entry!($name, a => {
            type P = kernel_abi::pass_policies::$name;
            // Programmatic dependent launch: let the next pass start its blocks now. The wait
            // for the previous pass (a no-op when not launched as its dependent) is in
            // `fft_block`, after the twiddle loads and before any access to `x` or `y`.
            grid_launch_dependents();
            if a.flags & WAIT_FIRST != 0 {
                grid_dependency_wait();
            }
            // A fixed layout's parameters are constants here, so they fold through the inlined
            // body; `WAIT_FIRST` stays the argument's (its runtime branch is what keeps ptxas
            // from hoisting the wait above the twiddle loads).
            let (log_c, log_min, log_mout, flags) = match <P as FftPassPolicy>::LAYOUT.fixed() {
                Some((c, mi, mo, f)) => (c, mi, mo, f | (a.flags & WAIT_FIRST)),
                None => (a.log_c, a.log_min, a.log_mout, a.flags),
            };
            fft_block::<
                $t,
                { <P as FftPassPolicy>::LOG_L },
                { <P as FftPassPolicy>::E as usize },
                { <P as FftPassPolicy>::FORM.hoists_twiddles() },
                { <P as FftPassPolicy>::FORM.ping_pong() },
                { <P as FftPassPolicy>::FORM.staged() },
                { <P as FftPassPolicy>::FORM.stages_evict_first() },
            >(
                a.x as *const Cx<$t>,
                a.y as *mut Cx<$t>,
                a.tw as *const Cx<$t>,
                a.twlo as *const Cx<$t>,
                a.twhi as *const Cx<$t>,
                log_c,
                log_min,
                log_mout,
                a.count,
                a.log_split,
                flags,
                a.sm_stride,
            )
        });
    };
}

kernel_abi::fft_pass_kernels!(pass_entries);

// The 2048-point c128 per-stage kernel (16 elements per thread: three stages, two exchanges of
// the tile, against four stages and three at 8) fitted to two 256-thread blocks per SM: 128
// registers, no spills (151 unconstrained). Scientific-1m's row pass: 8 elements 114.9 µs,
// 16 elements 108.1, 16 in two blocks per SM 100.6–101.1 (same device call).
// (4 rows per 512-thread block, one block per SM, 64-byte output runs: 99.4 against 95.5.)
crate::entry_directive!("fft_c128_l11_tw_per_stage", ".maxntid 256, 1, 1 .minnctapersm 2");
crate::entry_directive!("fft_c128_l11_tw_per_stage_rows2_out512", ".maxntid 256, 1, 1 .minnctapersm 2");

// scientific-1m's column pass (the 512-point c128 per-stage kernel, one 512-thread block per
// SM): declared for its launch, ptxas gives it 118 registers instead of the 82 it picks
// unbounded, 992 → 920 SASS instructions; 92.83–93.06 µs against 93.76–93.86 (column pass
// 47.4 → 46.5; same device call, A B B A, outputs bitwise equal). The same directive on every
// other FFT kernel lost or tied on every other row (docs/decisions/fft.md).
crate::entry_directive!("fft_c128_l9_tw_per_stage", ".maxntid 512, 1, 1 .minnctapersm 1");
