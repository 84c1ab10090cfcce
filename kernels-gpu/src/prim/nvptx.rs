//! The nvptx64 primitives: inline PTX and `core::arch::nvptx` intrinsics.

use core::arch::asm;
use core::arch::nvptx;

// ---------------------------------------------------------------- indices

#[inline(always)]
pub fn thread_idx_x() -> u32 {
    unsafe { nvptx::_thread_idx_x() as u32 }
}
#[inline(always)]
pub fn block_idx_x() -> u32 {
    unsafe { nvptx::_block_idx_x() as u32 }
}
#[inline(always)]
pub fn block_idx_y() -> u32 {
    unsafe { nvptx::_block_idx_y() as u32 }
}
#[inline(always)]
pub fn block_idx_z() -> u32 {
    unsafe { nvptx::_block_idx_z() as u32 }
}
#[inline(always)]
pub fn thread_idx_y() -> u32 {
    unsafe { nvptx::_thread_idx_y() as u32 }
}
#[inline(always)]
pub fn block_dim_y() -> u32 {
    unsafe { nvptx::_block_dim_y() as u32 }
}
#[inline(always)]
pub fn grid_dim_y() -> u32 {
    unsafe { nvptx::_grid_dim_y() as u32 }
}
#[inline(always)]
pub fn block_dim_x() -> u32 {
    unsafe { nvptx::_block_dim_x() as u32 }
}
#[inline(always)]
pub fn grid_dim_x() -> u32 {
    unsafe { nvptx::_grid_dim_x() as u32 }
}
/// Lane index within the warp (0..32).
#[inline(always)]
pub fn lane_id() -> u32 {
    let r: u32;
    unsafe { asm!("mov.u32 {}, %laneid;", out(reg32) r, options(pure, nomem, nostack)) };
    r
}

// ---------------------------------------------------------------- control

/// `bar.sync 0`: every thread of the block waits here.
#[inline(always)]
pub fn sync_threads() {
    unsafe { nvptx::_syncthreads() }
}

/// Aborts the kernel (the launch then fails with an error on the host).
#[inline(always)]
pub fn trap() -> ! {
    unsafe { nvptx::trap() }
}

/// `membar.gl` / `fence.acq_rel.gpu`: orders this thread's global writes before later ones,
/// device-wide (for last-block-done patterns).
#[inline(always)]
pub fn fence_gpu() {
    unsafe { asm!("fence.acq_rel.gpu;", options(nostack)) };
}

// ---------------------------------------------------------------- warp

/// `shfl.sync.bfly.b32` with all 32 lanes taking part.
///
/// Deliberately not `pure`: a warp-collective must stay where every lane executes it. A `pure`
/// asm lets LLVM sink it into a branch that only some lanes take (seen: a reduction whose result
/// was used only under `lane == 0` was moved there, and the kernel deadlocked).
#[inline(always)]
pub fn shfl_xor_f32(v: f32, lane_mask: u32) -> f32 {
    let r: f32;
    unsafe {
        asm!("shfl.sync.bfly.b32 {r}, {v}, {m}, 0x1f, 0xffffffff;",
             r = out(reg32) r, v = in(reg32) v, m = in(reg32) lane_mask,
             options(nomem, nostack))
    };
    r
}

// ---------------------------------------------------------------- math (f32)

/// `sqrt.rn.f32`: correctly rounded square root.
#[inline(always)]
pub fn sqrt_rn(v: f32) -> f32 {
    let r: f32;
    unsafe { asm!("sqrt.rn.f32 {}, {};", out(reg32) r, in(reg32) v, options(pure, nomem, nostack)) };
    r
}

/// `div.rn.f32`: correctly rounded division.
#[inline(always)]
pub fn div_rn(a: f32, b: f32) -> f32 {
    let r: f32;
    unsafe { asm!("div.rn.f32 {}, {}, {};", out(reg32) r, in(reg32) a, in(reg32) b, options(pure, nomem, nostack)) };
    r
}

/// `rcp.rn.f32`: correctly rounded reciprocal.
#[inline(always)]
pub fn rcp_rn(v: f32) -> f32 {
    let r: f32;
    unsafe { asm!("rcp.rn.f32 {}, {};", out(reg32) r, in(reg32) v, options(pure, nomem, nostack)) };
    r
}

/// `ex2.approx.f32`: 2^x (max relative error 2^-22.5 over the full range, ftz off).
#[inline(always)]
pub fn ex2_approx(v: f32) -> f32 {
    let r: f32;
    unsafe { asm!("ex2.approx.f32 {}, {};", out(reg32) r, in(reg32) v, options(pure, nomem, nostack)) };
    r
}

/// `fma.rn.f64`.
#[inline(always)]
pub fn fma_f64(a: f64, b: f64, c: f64) -> f64 {
    let r: f64;
    unsafe {
        asm!("fma.rn.f64 {}, {}, {}, {};", out(reg64) r, in(reg64) a, in(reg64) b, in(reg64) c, options(pure, nomem, nostack))
    };
    r
}

/// f32 → bf16 bits, round to nearest even (`cvt.rn.bf16.f32`, sm_80+).
#[inline(always)]
pub fn f32_to_bf16(v: f32) -> u16 {
    let r: u16;
    unsafe { asm!("cvt.rn.bf16.f32 {}, {};", out(reg16) r, in(reg32) v, options(pure, nomem, nostack)) };
    r
}

/// f16 bits → f32 (exact).
#[inline(always)]
pub fn f16_to_f32(h: u16) -> f32 {
    let r: f32;
    unsafe { asm!("cvt.f32.f16 {}, {};", out(reg32) r, in(reg16) h, options(pure, nomem, nostack)) };
    r
}

/// f32 → f16 bits, round to nearest even.
#[inline(always)]
pub fn f32_to_f16(v: f32) -> u16 {
    let r: u16;
    unsafe { asm!("cvt.rn.f16.f32 {}, {};", out(reg16) r, in(reg32) v, options(pure, nomem, nostack)) };
    r
}

/// Two f32 → two bf16 packed in a u32 (`a` in the low half), round to nearest even.
#[inline(always)]
pub fn f32_to_bf16x2(a: f32, b: f32) -> u32 {
    let r: u32;
    unsafe {
        asm!("cvt.rn.bf16x2.f32 {}, {}, {};", out(reg32) r, in(reg32) b, in(reg32) a, options(pure, nomem, nostack))
    };
    r
}

/// `fma.rn.f32`: a·b + c with one rounding.
#[inline(always)]
pub fn fma(a: f32, b: f32, c: f32) -> f32 {
    let r: f32;
    unsafe {
        asm!("fma.rn.f32 {}, {}, {}, {};", out(reg32) r, in(reg32) a, in(reg32) b, in(reg32) c, options(pure, nomem, nostack))
    };
    r
}

// ---------------------------------------------------------------- memory

/// 16-byte load through the read-only (non-coherent) path. `p` must be 16-byte aligned and the
/// data must not be written during the kernel.
#[inline(always)]
pub unsafe fn ld_nc_v4(p: *const u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    asm!("ld.global.nc.v4.u32 {{{}, {}, {}, {}}}, [{}];",
         out(reg32) a, out(reg32) b, out(reg32) c, out(reg32) d, in(reg64) p,
         options(readonly, nostack));
    [a, b, c, d]
}

/// 16-byte store. `p` must be 16-byte aligned.
#[inline(always)]
pub unsafe fn st_v4(p: *mut u32, v: [u32; 4]) {
    asm!("st.global.v4.u32 [{}], {{{}, {}, {}, {}}};",
         in(reg64) p, in(reg32) v[0], in(reg32) v[1], in(reg32) v[2], in(reg32) v[3],
         options(nostack));
}

/// `atom.global.add.u32` (relaxed, gpu scope); returns the old value.
#[inline(always)]
pub unsafe fn atomic_add_u32(p: *mut u32, v: u32) -> u32 {
    let r: u32;
    asm!("atom.global.add.u32 {}, [{}], {};", out(reg32) r, in(reg64) p, in(reg32) v, options(nostack));
    r
}

/// Start of the block's dynamic (launch-sized) shared memory, 16-byte aligned.
#[inline(always)]
pub fn dyn_smem<T>() -> *mut T {
    let p: u64;
    unsafe { asm!("cvta.shared.u64 {}, rgk_dyn_smem;", out(reg64) p, options(pure, nomem, nostack)) };
    p as *mut T
}

core::arch::global_asm!(".extern .shared .align 16 .b8 rgk_dyn_smem[];");

// ---------------------------------------------------------------- EngramGateConvFwd/Bwd

/// `prefetch.global.L1 [p]`: brings the line holding `p` into this SM's L1 (no register
/// written, nothing waits on it). `p` must be a global address.
#[inline(always)]
pub unsafe fn prefetch_l1(p: *const u8) {
    asm!("prefetch.global.L1 [{}];", in(reg64) p, options(nostack, readonly));
}

// ---------------------------------------------------------------- FFTC2CFwd (fft)

/// 8-byte load through the read-only (non-coherent) path. `p` must be 8-byte aligned and the
/// data must not be written during the kernel.
#[inline(always)]
pub unsafe fn ld_nc_v2_u32(p: *const u32) -> (u32, u32) {
    let (a, b): (u32, u32);
    asm!("ld.global.nc.v2.u32 {{{}, {}}}, [{}];",
         out(reg32) a, out(reg32) b, in(reg64) p,
         options(readonly, nostack));
    (a, b)
}

/// `prefetch.global.L2::evict_last`: start bringing the line of `p` into L2 (no result, no wait).
#[inline(always)]
pub unsafe fn prefetch_l2_evict_last(p: *const u8) {
    asm!("prefetch.global.L2::evict_last [{}];", in(reg64) p, options(nostack, readonly));
}

// ---------------------------------------------------------------- MHCPreFwd (mhc/pre.rs)

/// `sqrt.rn.f64`: correctly rounded square root.
#[inline(always)]
pub fn sqrt_rn_f64(v: f64) -> f64 {
    let r: f64;
    unsafe { asm!("sqrt.rn.f64 {}, {};", out(reg64) r, in(reg64) v, options(pure, nomem, nostack)) };
    r
}

/// `prefetch.global.L2`: start bringing the line holding `p` into L2 (no register result).
#[inline(always)]
pub unsafe fn prefetch_l2<T>(p: *const T) {
    asm!("prefetch.global.L2 [{}];", in(reg64) p, options(nostack, readonly));
}
// ---------------------------------------------------------------- EngramDecodeFwd (engram/decode)

/// 16-byte load through L2 only (`ld.global.cg.v4.u32`, bypassing L1): coherent with writes
/// other blocks made visible by a fence (last-block-done reads). `p` must be 16-byte aligned.
#[inline(always)]
pub unsafe fn ld_cg_v4_u32(p: *const u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    asm!("ld.global.cg.v4.u32 {{{}, {}, {}, {}}}, [{}];",
         out(reg32) a, out(reg32) b, out(reg32) c, out(reg32) d, in(reg64) p,
         options(readonly, nostack));
    [a, b, c, d]
}

/// `ld.global.cg.f32`: a 4-byte load through L2 only (see [`ld_cg_v4_u32`]).
#[inline(always)]
pub unsafe fn ld_cg_f32(p: *const f32) -> f32 {
    let r: f32;
    asm!("ld.global.cg.f32 {}, [{}];", out(reg32) r, in(reg64) p, options(readonly, nostack));
    r
}

/// `ld.global.cg.u16`: a 2-byte load through L2 only (see [`ld_cg_v4_u32`]).
#[inline(always)]
pub unsafe fn ld_cg_u16(p: *const u16) -> u16 {
    let r: u16;
    asm!("ld.global.cg.u16 {}, [{}];", out(reg16) r, in(reg64) p, options(readonly, nostack));
    r
}

/// `prefetch.global.L2`: asks L2 to fetch the line holding `p` (no register result, no wait).
#[inline(always)]
pub unsafe fn prefetch_global_l2(p: *const u8) {
    asm!("prefetch.global.L2 [{}];", in(reg64) p, options(nostack, readonly));
}

/// `prmt.b32`: byte permute of the pair `(b:a)` by selector `sel` (nibble i of `sel` picks the
/// source byte of result byte i; bytes 0–3 are `a`, 4–7 are `b`). `0x5410` packs the low
/// halves of `a` and `b` (a's in the low half), `0x7632` the high halves.
#[inline(always)]
pub fn prmt_b32(a: u32, b: u32, sel: u32) -> u32 {
    let r: u32;
    unsafe {
        asm!("prmt.b32 {}, {}, {}, {};", out(reg32) r, in(reg32) a, in(reg32) b, in(reg32) sel,
             options(pure, nomem, nostack))
    };
    r
}

/// `mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32`: D = A·B + C on one warp's fragments
/// (every lane must execute it). Lane `l`, `g = l/4`, `t = l%4`: `a[0]` = A[g][2t..2t+1],
/// `a[1]` = A[g+8][2t..2t+1], `a[2]` = A[g][2t+8..], `a[3]` = A[g+8][2t+8..]; `b[0]` =
/// B[2t..2t+1][g], `b[1]` = B[2t+8..2t+9][g]; `c`/result = (C[g][2t], C[g][2t+1],
/// C[g+8][2t], C[g+8][2t+1]). Pairs are packed low element first.
#[inline(always)]
pub unsafe fn mma_m16n8k16_f16_f32(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
    let (d0, d1, d2, d3): (f32, f32, f32, f32);
    asm!("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {{{}, {}, {}, {}}}, {{{}, {}, {}, {}}}, {{{}, {}}}, {{{}, {}, {}, {}}};",
         out(reg32) d0, out(reg32) d1, out(reg32) d2, out(reg32) d3,
         in(reg32) a[0], in(reg32) a[1], in(reg32) a[2], in(reg32) a[3],
         in(reg32) b[0], in(reg32) b[1],
         in(reg32) c[0], in(reg32) c[1], in(reg32) c[2], in(reg32) c[3],
         options(nomem, nostack));
    [d0, d1, d2, d3]
}

/// As [`mma_m16n8k16_f16_f32`] with bf16 A and B (`...f32.bf16.bf16.f32`).
#[inline(always)]
pub unsafe fn mma_m16n8k16_bf16_f32(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
    let (d0, d1, d2, d3): (f32, f32, f32, f32);
    asm!("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {{{}, {}, {}, {}}}, {{{}, {}, {}, {}}}, {{{}, {}}}, {{{}, {}, {}, {}}};",
         out(reg32) d0, out(reg32) d1, out(reg32) d2, out(reg32) d3,
         in(reg32) a[0], in(reg32) a[1], in(reg32) a[2], in(reg32) a[3],
         in(reg32) b[0], in(reg32) b[1],
         in(reg32) c[0], in(reg32) c[1], in(reg32) c[2], in(reg32) c[3],
         options(nomem, nostack));
    [d0, d1, d2, d3]
}

// ---------------------------------------------------------------- FFTC2CFwd (fft), continued

/// `v`, through a `mov` the compiler must treat as an unknown side-effecting instruction: values
/// derived from it are recomputed where used instead of hoisted out of a loop (and held in
/// registers across it).
#[inline(always)]
pub fn opaque_u32(v: u32) -> u32 {
    let r: u32;
    unsafe { asm!("mov.u32 {}, {};", out(reg32) r, in(reg32) v, options(nomem, nostack)) };
    r
}

// ---------------------------------------------------------------- MHCPreFwd (thread-block clusters)

/// `%cluster_ctarank`: this block's rank in its thread-block cluster (0 when launched without
/// clusters).
#[inline(always)]
pub fn cluster_ctarank() -> u32 {
    let r: u32;
    unsafe { asm!("mov.u32 {}, %cluster_ctarank;", out(reg32) r, options(pure, nomem, nostack)) };
    r
}

/// `%cluster_nctarank`: the number of blocks in this block's cluster.
#[inline(always)]
pub fn cluster_nctarank() -> u32 {
    let r: u32;
    unsafe { asm!("mov.u32 {}, %cluster_nctarank;", out(reg32) r, options(pure, nomem, nostack)) };
    r
}

/// `barrier.cluster.arrive.aligned` (release semantics by default): this thread's prior shared/global writes become
/// visible to the cluster's threads that pass the matching [`cluster_wait`]. Every thread of
/// every block of the cluster must execute it (convergently per warp), alternating with
/// [`cluster_wait`].
#[inline(always)]
pub fn cluster_arrive() {
    unsafe { asm!("barrier.cluster.arrive.aligned;", options(nostack)) };
}

/// `barrier.cluster.wait.aligned` (acquire semantics by default): waits until every thread of the cluster has passed
/// its [`cluster_arrive`] of this phase.
#[inline(always)]
pub fn cluster_wait() {
    unsafe { asm!("barrier.cluster.wait.aligned;", options(nostack)) };
}

/// `mapa.u64`: the generic address of the same shared-memory location as `p` (a generic
/// address of this block's shared memory) in the block of rank `rank` of this cluster
/// (distributed shared memory; ordinary generic loads then read it).
#[inline(always)]
pub fn mapa<T>(p: *const T, rank: u32) -> *const T {
    let r: u64;
    unsafe {
        asm!("mapa.u64 {}, {}, {};", out(reg64) r, in(reg64) p as u64, in(reg32) rank, options(pure, nomem, nostack))
    };
    r as *const T
}

/// `bar.warp.sync 0xffffffff`: the warp's lanes wait for each other and their shared-memory
/// accesses before it are visible to the warp after it.
#[inline(always)]
pub fn sync_warp() {
    unsafe { asm!("bar.warp.sync 0xffffffff;", options(nostack)) };
}

/// `cp.async.cg.shared.global` of 16 bytes: `dst` (a generic address of this block's shared
/// memory, 16-byte aligned) ← `src` (global, 16-byte aligned), asynchronously, through L2 only;
/// no register holds the data. Complete after [`cp_async_wait_all`].
#[inline(always)]
pub unsafe fn cp_async_16(dst: *mut u8, src: *const u8) {
    asm!("{{ .reg .u64 s; cvta.to.shared.u64 s, {d}; cp.async.cg.shared.global [s], [{g}], 16; }}",
         d = in(reg64) dst as u64, g = in(reg64) src as u64, options(nostack));
}

/// [`cp_async_16`] with an L2 evict-first policy: data read once, whose lines L2 should give
/// up before others when it needs room.
#[inline(always)]
pub unsafe fn cp_async_16_evict_first(dst: *mut u8, src: *const u8) {
    asm!("{{ .reg .u64 s; .reg .b64 pol; cvta.to.shared.u64 s, {d}; createpolicy.fractional.L2::evict_first.b64 pol, 1.0; cp.async.cg.shared.global.L2::cache_hint [s], [{g}], 16, pol; }}",
         d = in(reg64) dst as u64, g = in(reg64) src as u64, options(nostack));
}

/// `cp.async.ca.shared.global` of 4 bytes (both addresses 4-byte aligned); see [`cp_async_16`].
#[inline(always)]
pub unsafe fn cp_async_4(dst: *mut u8, src: *const u8) {
    asm!("{{ .reg .u64 s; cvta.to.shared.u64 s, {d}; cp.async.ca.shared.global [s], [{g}], 4; }}",
         d = in(reg64) dst as u64, g = in(reg64) src as u64, options(nostack));
}

/// `cp.async.wait_all`: this thread's `cp.async` copies have landed in shared memory (other
/// threads see them after a barrier).
#[inline(always)]
pub fn cp_async_wait_all() {
    unsafe { asm!("cp.async.wait_all;", options(nostack)) };
}

/// 16-byte load through a generic address (e.g. shared memory), 16-byte aligned.
#[inline(always)]
pub unsafe fn ld_v4(p: *const u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    asm!("ld.v4.u32 {{{}, {}, {}, {}}}, [{}];", out(reg32) a, out(reg32) b, out(reg32) c, out(reg32) d,
         in(reg64) p as u64, options(readonly, nostack));
    [a, b, c, d]
}

/// 16-byte store through a generic address (e.g. shared memory), 16-byte aligned.
#[inline(always)]
pub unsafe fn st_v4_generic(p: *mut u32, v: [u32; 4]) {
    asm!("st.v4.u32 [{}], {{{}, {}, {}, {}}};",
         in(reg64) p, in(reg32) v[0], in(reg32) v[1], in(reg32) v[2], in(reg32) v[3],
         options(nostack));
}
// ---------------------------------------------------------------- EngramGateConvFwd/Bwd

/// `rcp.approx.f32`: 1/x to about 1 ulp (no subnormal flush); 1/±inf = ±0.
// ---------------------------------------------------------------- EngramDecodeFwd (engram/decode), wide finish

/// `ld.global.cg.v2.u32`: an 8-byte load through L2 only (see [`ld_cg_v4_u32`]). `p` must be
/// 8-byte aligned.
#[inline(always)]
pub unsafe fn ld_cg_v2_u32(p: *const u32) -> [u32; 2] {
    let (a, b): (u32, u32);
    asm!("ld.global.cg.v2.u32 {{{}, {}}}, [{}];",
         out(reg32) a, out(reg32) b, in(reg64) p,
         options(readonly, nostack));
    [a, b]
}

/// `rsqrt.approx.f32`: 1/sqrt(x), max relative error about 2^-22.9 (ftz off).
#[inline(always)]
pub fn rsqrt_approx(v: f32) -> f32 {
    let r: f32;
    unsafe { asm!("rsqrt.approx.f32 {}, {};", out(reg32) r, in(reg32) v, options(pure, nomem, nostack)) };
    r
}

/// `rcp.approx.f32`: 1/x, max relative error about 1 ulp (ftz off).
#[inline(always)]
pub fn rcp_approx(v: f32) -> f32 {
    let r: f32;
    unsafe { asm!("rcp.approx.f32 {}, {};", out(reg32) r, in(reg32) v, options(pure, nomem, nostack)) };
    r
}

// ---------------------------------------------------------------- programmatic dependent launch

/// `griddepcontrol.launch_dependents`: lets the next kernel on the stream, if launched as a
/// programmatic dependent launch, start now (it still waits in [`grid_dependency_wait`] for
/// this grid's completion before reading its results). No effect otherwise.
#[inline(always)]
pub fn grid_launch_dependents() {
    unsafe { asm!("griddepcontrol.launch_dependents;", options(nostack)) };
}

/// `griddepcontrol.wait`: waits until the grids this one depends on (programmatic dependent
/// launch) have completed and their memory is visible. Returns at once without such grids.
#[inline(always)]
pub fn grid_dependency_wait() {
    unsafe { asm!("griddepcontrol.wait;", options(nostack)) };
}

// ---------------------------------------------------------------- MHCPre: f64 approximations

/// `rsqrt.approx.ftz.f64`: 1/√x to about 2^-22 relative (refine with Newton steps for more).
#[inline(always)]
pub fn rsqrt_approx_f64(v: f64) -> f64 {
    let r: f64;
    unsafe { asm!("rsqrt.approx.ftz.f64 {}, {};", out(reg64) r, in(reg64) v, options(pure, nomem, nostack)) };
    r
}

/// `rcp.approx.ftz.f64`: 1/x to about 2^-22 relative (refine with Newton steps for more).
#[inline(always)]
pub fn rcp_approx_f64(v: f64) -> f64 {
    let r: f64;
    unsafe { asm!("rcp.approx.ftz.f64 {}, {};", out(reg64) r, in(reg64) v, options(pure, nomem, nostack)) };
    r
}

// ---------------------------------------------------------------- FFTC2CFwd (fft), staged loads

/// `cp.async.commit_group`: closes this thread's outstanding [`cp_async_16`] copies into one
/// group (waited for by [`cp_async_wait_group_1`]).
#[inline(always)]
pub fn cp_async_commit_group() {
    unsafe { asm!("cp.async.commit_group;", options(nostack)) };
}

/// `cp.async.wait_group 1`: all but this thread's most recent committed copy group have landed
/// in shared memory (other threads see them after a barrier).
#[inline(always)]
pub fn cp_async_wait_group_1() {
    unsafe { asm!("cp.async.wait_group 1;", options(nostack)) };
}

// ---------------------------------------------------------------- MHCPre: broadcast shuffle

/// `shfl.sync.idx.b32` of an f32 with all 32 lanes taking part: every lane receives lane
/// `src`'s `v` (not `pure`, see [`shfl_xor_f32`]).
#[inline(always)]
pub fn shfl_idx_f32(v: f32, src: u32) -> f32 {
    let r: f32;
    unsafe {
        asm!("shfl.sync.idx.b32 {r}, {v}, {s}, 0x1f, 0xffffffff;",
             r = out(reg32) r, v = in(reg32) v, s = in(reg32) src,
             options(nomem, nostack))
    };
    r
}

// ---------------------------------------------------------------- EngramGateConvBwd: shared-window accesses, ftz approximations

/// The shared-window (32-bit) address of the block's dynamic shared memory (the same bytes as
/// [`dyn_smem`]). With [`lds_v4`] and its siblings the accesses compile to `LDS`/`STS` with
/// 32-bit address arithmetic instead of generic loads through 64-bit addresses.
#[inline(always)]
pub fn dyn_smem_u32() -> u32 {
    let r: u32;
    unsafe { asm!("mov.u32 {}, rgk_dyn_smem;", out(reg32) r, options(pure, nomem, nostack)) };
    r
}

/// `ld.shared.v4.u32` at shared-window address `a` (16-byte aligned).
#[inline(always)]
pub unsafe fn lds_v4(a: u32) -> [u32; 4] {
    let (x, y, z, w): (u32, u32, u32, u32);
    asm!("ld.shared.v4.u32 {{{}, {}, {}, {}}}, [{}];", out(reg32) x, out(reg32) y, out(reg32) z, out(reg32) w,
         in(reg32) a, options(readonly, nostack));
    [x, y, z, w]
}

/// `st.shared.v4.u32` at shared-window address `a` (16-byte aligned).
#[inline(always)]
pub unsafe fn sts_v4(a: u32, v: [u32; 4]) {
    asm!("st.shared.v4.u32 [{}], {{{}, {}, {}, {}}};",
         in(reg32) a, in(reg32) v[0], in(reg32) v[1], in(reg32) v[2], in(reg32) v[3], options(nostack));
}

/// `ld.shared.f32` at shared-window address `a`.
#[inline(always)]
pub unsafe fn lds_f32(a: u32) -> f32 {
    let r: f32;
    asm!("ld.shared.f32 {}, [{}];", out(reg32) r, in(reg32) a, options(readonly, nostack));
    r
}

/// `st.shared.f32` at shared-window address `a`.
#[inline(always)]
pub unsafe fn sts_f32(a: u32, v: f32) {
    asm!("st.shared.f32 [{}], {};", in(reg32) a, in(reg32) v, options(nostack));
}

/// `ld.shared.u16` at shared-window address `a` (2-byte aligned).
#[inline(always)]
pub unsafe fn lds_u16(a: u32) -> u16 {
    let r: u16;
    asm!("ld.shared.u16 {}, [{}];", out(reg16) r, in(reg32) a, options(readonly, nostack));
    r
}

/// `ex2.approx.ftz.f32`: 2^x; the same result as [`ex2_approx`] wherever x ≥ −126 (below,
/// subnormal results flush to 0), without its subnormal-range fix-up instructions.
#[inline(always)]
pub fn ex2_approx_ftz(v: f32) -> f32 {
    let r: f32;
    unsafe { asm!("ex2.approx.ftz.f32 {}, {};", out(reg32) r, in(reg32) v, options(pure, nomem, nostack)) };
    r
}

/// `rcp.approx.ftz.f32`: 1/x; the same result as [`rcp_approx`] wherever 2^-126 ≤ |x| ≤ 2^126
/// (outside, subnormal inputs/results flush to 0), without its range fix-up instructions.
#[inline(always)]
pub fn rcp_approx_ftz(v: f32) -> f32 {
    let r: f32;
    unsafe { asm!("rcp.approx.ftz.f32 {}, {};", out(reg32) r, in(reg32) v, options(pure, nomem, nostack)) };
    r
}

/// `rsqrt.approx.ftz.f32`: 1/√x; the same result as [`rsqrt_approx`] for normal x ≥ 2^-126.
#[inline(always)]
pub fn rsqrt_approx_ftz(v: f32) -> f32 {
    let r: f32;
    unsafe { asm!("rsqrt.approx.ftz.f32 {}, {};", out(reg32) r, in(reg32) v, options(pure, nomem, nostack)) };
    r
}

// ---------------------------------------------------------------- FFTC2CFwd
// The FFT's shared-memory exchanges at 32-bit shared-window addresses ([`dyn_smem_u32`] plus a
// byte offset): `LDS`/`STS` with 32-bit address arithmetic instead of generic `LD`/`ST` through
// 64-bit `cvta` pointers. The loads are `readonly`, not `pure`: a barrier ([`sync_threads`], a
// call that may write any memory) orders them, and a store between two of them is not skipped.

/// `ld.shared.v2.f32` at shared-window address `a` (8-byte aligned): one c64 element.
///
/// # Safety
/// `a` must be an 8-byte aligned address inside this block's shared memory.
#[inline(always)]
pub unsafe fn lds_v2_f32(a: u32) -> (f32, f32) {
    let (x, y): (f32, f32);
    asm!("ld.shared.v2.f32 {{{}, {}}}, [{}];", out(reg32) x, out(reg32) y, in(reg32) a, options(readonly, nostack));
    (x, y)
}

/// `st.shared.v2.f32` at shared-window address `a` (8-byte aligned).
///
/// # Safety
/// As [`lds_v2_f32`].
#[inline(always)]
pub unsafe fn sts_v2_f32(a: u32, x: f32, y: f32) {
    asm!("st.shared.v2.f32 [{}], {{{}, {}}};", in(reg32) a, in(reg32) x, in(reg32) y, options(nostack));
}

/// `ld.shared.v2.f64` at shared-window address `a` (16-byte aligned): one c128 element.
///
/// # Safety
/// `a` must be a 16-byte aligned address inside this block's shared memory.
#[inline(always)]
pub unsafe fn lds_v2_f64(a: u32) -> (f64, f64) {
    let (x, y): (f64, f64);
    asm!("ld.shared.v2.f64 {{{}, {}}}, [{}];", out(reg64) x, out(reg64) y, in(reg32) a, options(readonly, nostack));
    (x, y)
}

/// `st.shared.v2.f64` at shared-window address `a` (16-byte aligned).
///
/// # Safety
/// As [`lds_v2_f64`].
#[inline(always)]
pub unsafe fn sts_v2_f64(a: u32, x: f64, y: f64) {
    asm!("st.shared.v2.f64 [{}], {{{}, {}}};", in(reg32) a, in(reg64) x, in(reg64) y, options(nostack));
}

// ---------------------------------------------------------------- EngramGateConvFwd: shared-memory forward

/// `cp.async.cg.shared.global` of 16 bytes to the shared-window address `dst` (32-bit, as from
/// [`dyn_smem_u32`], 16-byte aligned) from `src` (global, 16-byte aligned); see [`cp_async_16`].
#[inline(always)]
pub unsafe fn cp_async_16_s(dst: u32, src: *const u8) {
    asm!("cp.async.cg.shared.global [{d}], [{g}], 16;", d = in(reg32) dst, g = in(reg64) src as u64, options(nostack));
}

// ---------------------------------------------------------------- MHCPreFwd: fixed-point split-K sums

/// `red.global.add.u64` (relaxed, gpu scope; two's-complement, so also a signed add): no result.
#[inline(always)]
pub unsafe fn red_add_u64(p: *mut u64, v: u64) {
    asm!("red.global.add.u64 [{}], {};", in(reg64) p, in(reg64) v, options(nostack));
}

/// `red.global.add.u32` (relaxed, gpu scope): no result.
#[inline(always)]
pub unsafe fn red_add_u32(p: *mut u32, v: u32) {
    asm!("red.global.add.u32 [{}], {};", in(reg64) p, in(reg32) v, options(nostack));
}
