//! EngramGateConvFwd / EngramGateConvBwd (docs/ops.md §4–§5): Engram context gating fused with
//! the causal depthwise conv (kernel size 4), training forward and its backward.
//!
//! Kernels: `kernels-gpu/src/engram/gate_conv.rs`. The forward is one launch; the backward is
//! two (row-parallel gradients with per-block partial weight gradients, then a fixed-order
//! reduction of the partials: bitwise deterministic).
use cudarc::driver::{sys::CUdeviceptr, sys::CUstream, DevicePtr, DevicePtrMut};

use crate::error::{check_len, check_positive, checked_product};
use crate::runtime::{launch, launch_pdl, GraphReplay, LaunchDims};
use crate::verify::Half;
use crate::{Error, Gpu, Result};

/// `eps` of the three rmsnorms (docs/ops.md §4).
pub const EPS: f32 = 1e-6;
/// Causal conv kernel size (docs/ops.md §4).
pub const KERNEL_SIZE: usize = 4;

/// Forward kernels, `[dtype][variant]`: dtype 0 = bf16, 1 = f16; variant 0..4 = resident
/// (`NV` = variant + 1 chunks of 8 per lane), 4 = streaming vectorised, 5 = scalar (any d).
const FWD: [[&str; 6]; 2] = [
    [
        "engram_gate_fwd_bf16_r1",
        "engram_gate_fwd_bf16_r2",
        "engram_gate_fwd_bf16_r3",
        "engram_gate_fwd_bf16_r4",
        "engram_gate_fwd_bf16_v8",
        "engram_gate_fwd_bf16_any",
    ],
    [
        "engram_gate_fwd_f16_r1",
        "engram_gate_fwd_f16_r2",
        "engram_gate_fwd_f16_r3",
        "engram_gate_fwd_f16_r4",
        "engram_gate_fwd_f16_v8",
        "engram_gate_fwd_f16_any",
    ],
];
/// Backward main kernels, laid out as [`FWD`].
const BWD: [[&str; 6]; 2] = [
    [
        "engram_gate_bwd_bf16_r1",
        "engram_gate_bwd_bf16_r2",
        "engram_gate_bwd_bf16_r3",
        "engram_gate_bwd_bf16_r4",
        "engram_gate_bwd_bf16_v8",
        "engram_gate_bwd_bf16_any",
    ],
    [
        "engram_gate_bwd_f16_r1",
        "engram_gate_bwd_f16_r2",
        "engram_gate_bwd_f16_r3",
        "engram_gate_bwd_f16_r4",
        "engram_gate_bwd_f16_v8",
        "engram_gate_bwd_f16_any",
    ],
];
/// Forward v2 kernels (`u` in shared memory), `[approx][dtype][NV−1]`: approx 0 = correctly
/// rounded silu (bitwise v1), 1 = `rcp.approx` silu.
const FWD2: [[[&str; 4]; 2]; 3] = [
    [
        [
            "engram_gate_fwd2s_bf16_r1",
            "engram_gate_fwd2s_bf16_r2",
            "engram_gate_fwd2s_bf16_r3",
            "engram_gate_fwd2s_bf16_r4",
        ],
        [
            "engram_gate_fwd2s_f16_r1",
            "engram_gate_fwd2s_f16_r2",
            "engram_gate_fwd2s_f16_r3",
            "engram_gate_fwd2s_f16_r4",
        ],
    ],
    [
        [
            "engram_gate_fwd2a_bf16_r1",
            "engram_gate_fwd2a_bf16_r2",
            "engram_gate_fwd2a_bf16_r3",
            "engram_gate_fwd2a_bf16_r4",
        ],
        [
            "engram_gate_fwd2a_f16_r1",
            "engram_gate_fwd2a_f16_r2",
            "engram_gate_fwd2a_f16_r3",
            "engram_gate_fwd2a_f16_r4",
        ],
    ],
    [
        [
            "engram_gate_fwd2f_bf16_r1",
            "engram_gate_fwd2f_bf16_r2",
            "engram_gate_fwd2f_bf16_r3",
            "engram_gate_fwd2f_bf16_r4",
        ],
        [
            "engram_gate_fwd2f_f16_r1",
            "engram_gate_fwd2f_f16_r2",
            "engram_gate_fwd2f_f16_r3",
            "engram_gate_fwd2f_f16_r4",
        ],
    ],
];
/// Backward v5 main kernels (weights, `u`, `dconv` in shared memory, each tile row split over
/// several warps; `[0]` v5, `[1]` v5m: merged stage 3), `[merged][dtype][NV−1]`.
const BWD5: [[[&str; 4]; 2]; 2] = [
    [
        [
            "engram_gate_bwd5_bf16_r1",
            "engram_gate_bwd5_bf16_r2",
            "engram_gate_bwd5_bf16_r3",
            "engram_gate_bwd5_bf16_r4",
        ],
        ["engram_gate_bwd5_f16_r1", "engram_gate_bwd5_f16_r2", "engram_gate_bwd5_f16_r3", "engram_gate_bwd5_f16_r4"],
    ],
    [
        [
            "engram_gate_bwd5m_bf16_r1",
            "engram_gate_bwd5m_bf16_r2",
            "engram_gate_bwd5m_bf16_r3",
            "engram_gate_bwd5m_bf16_r4",
        ],
        [
            "engram_gate_bwd5m_f16_r1",
            "engram_gate_bwd5m_f16_r2",
            "engram_gate_bwd5m_f16_r3",
            "engram_gate_bwd5m_f16_r4",
        ],
    ],
];
const BWD_REDUCE: &str = "engram_gate_bwd_reduce";
/// The reduce kernel with 16-byte loads ([`GateBwdConfig::reduce_vec`]).
const BWD_REDUCE4: &str = "engram_gate_bwd_reduce4";
/// Forward v2 lean kernels ([`GateFwdKernel::SmemULean`]), `[dtype][NV−1]`.
const FWD2L: [[&str; 4]; 2] = [
    [
        "engram_gate_fwd2l_bf16_r1",
        "engram_gate_fwd2l_bf16_r2",
        "engram_gate_fwd2l_bf16_r3",
        "engram_gate_fwd2l_bf16_r4",
    ],
    ["engram_gate_fwd2l_f16_r1", "engram_gate_fwd2l_f16_r2", "engram_gate_fwd2l_f16_r3", "engram_gate_fwd2l_f16_r4"],
];

pub(crate) const KERNELS: &[&str] = &[
    FWD[0][0],
    FWD[0][1],
    FWD[0][2],
    FWD[0][3],
    FWD[0][4],
    FWD[0][5],
    FWD[1][0],
    FWD[1][1],
    FWD[1][2],
    FWD[1][3],
    FWD[1][4],
    FWD[1][5],
    BWD[0][0],
    BWD[0][1],
    BWD[0][2],
    BWD[0][3],
    BWD[0][4],
    BWD[0][5],
    BWD[1][0],
    BWD[1][1],
    BWD[1][2],
    BWD[1][3],
    BWD[1][4],
    BWD[1][5],
    BWD_REDUCE,
    FWD2[0][0][0],
    FWD2[0][0][1],
    FWD2[0][0][2],
    FWD2[0][0][3],
    FWD2[0][1][0],
    FWD2[0][1][1],
    FWD2[0][1][2],
    FWD2[0][1][3],
    FWD2[1][0][0],
    FWD2[1][0][1],
    FWD2[1][0][2],
    FWD2[1][0][3],
    FWD2[1][1][0],
    FWD2[1][1][1],
    FWD2[1][1][2],
    FWD2[1][1][3],
    FWD2[2][0][0],
    FWD2[2][0][1],
    FWD2[2][0][2],
    FWD2[2][0][3],
    FWD2[2][1][0],
    FWD2[2][1][1],
    FWD2[2][1][2],
    FWD2[2][1][3],
    BWD5[0][0][0],
    BWD5[0][0][1],
    BWD5[0][0][2],
    BWD5[0][0][3],
    BWD5[0][1][0],
    BWD5[0][1][1],
    BWD5[0][1][2],
    BWD5[0][1][3],
    BWD5[1][0][0],
    BWD5[1][0][1],
    BWD5[1][0][2],
    BWD5[1][0][3],
    BWD5[1][1][0],
    BWD5[1][1][1],
    BWD5[1][1][2],
    BWD5[1][1][3],
    BWD_REDUCE4,
    FWD2L[0][0],
    FWD2L[0][1],
    FWD2L[0][2],
    FWD2L[0][3],
    FWD2L[1][0],
    FWD2L[1][1],
    FWD2L[1][2],
    FWD2L[1][3],
];

/// Weight chunks per thread of the v2 forward (`kernels-gpu` `FWD2_WL`).
const FWD2_WL: usize = 5;

/// Largest dynamic shared memory used without opting in (bytes).
const SMEM_DEFAULT: usize = 48 * 1024;

/// Largest dynamic shared memory of the v5 backward main kernel (opted in above 48 KiB; well
/// inside sm_90's 227 KiB, leaving room for the reduce kernel's blocks beside it under PDL).
const BWD5_SMEM_MAX: usize = 64 * 1024;

/// Sizes of one EngramGateConv call: `m` sequences of `t` rows of `d` channels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngramGateShape {
    pub m: usize,
    pub t: usize,
    pub d: usize,
}

impl EngramGateShape {
    /// Checks every size is ≥ 1 and the index ranges of the kernels (`M·T < 2^31`,
    /// `d < 2^28`); returns `(M·T·d, M·T)`: the element counts of a `[M,T,d]` tensor and of a
    /// `[M,T]` per-row tensor.
    pub fn lens(&self) -> Result<(usize, usize)> {
        check_positive("m", self.m)?;
        check_positive("t", self.t)?;
        check_positive("d", self.d)?;
        let rows = checked_product("t", &[self.m, self.t])?;
        if rows >= 1 << 31 {
            return Err(Error::Overflow { arg: "t", msg: format!("M·T = {rows} rows ≥ 2^31") });
        }
        if self.d >= 1 << 28 {
            return Err(Error::Overflow { arg: "d", msg: format!("d = {} ≥ 2^28", self.d) });
        }
        Ok((checked_product("d", &[self.m, self.t, self.d])?, rows))
    }
}

/// Which forward kernel runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GateFwdKernel {
    /// v1: phase 2 recomputes `u` of 4 rows per element from `v` and prefetched weights.
    V1,
    /// v2: weights loaded into shared memory in phase 1, `u` once per element into shared
    /// memory; bitwise the same outputs as `V1`. Resident layouts only (`d % 8 == 0`,
    /// `d ≤ 1024`, aligned, shared memory ≤ 48 KiB); other calls run `V1`.
    SmemU,
    /// `SmemU` with the silu's division by `rcp.approx` (≈ 1 ulp f32; `Y` may differ from
    /// `V1` by a 16-bit rounding flip).
    SmemUApprox,
    /// `SmemUApprox` with approximate per-row scalars too: `rrms` by `rsqrt.approx` + one
    /// Newton step, `alpha`'s σ by `rcp.approx`, no divisions on the chain (≈ 1–2 ulp f32 in
    /// `alpha`, `rrms_*`; `vhat` may flip at a 16-bit rounding tie).
    SmemUFast,
    /// `SmemUFast` with fewer instructions (v2 "lean"): grid `(ntiles, M)` instead of a
    /// division, `1/d`, `1/√d` and phase 2's `e / ceil(d/8)` multiplier from the host, shared
    /// memory through 32-bit shared-window addresses, the ftz forms of `ex2`/`rcp`/`rsqrt`.
    /// Bitwise `SmemUFast` wherever |conv| and |alpha's logit| < 87 (beyond, σ's subnormal range
    /// flushes to 0). Runs where `SmemUFast` runs with `d ≥ 16` and `M ≤ 65535`; elsewhere
    /// `SmemUFast` (or `V1`) runs.
    SmemULean,
}

/// Launch configuration of the forward. Blocks above 512 threads may exceed what a kernel's
/// register use allows: such a configuration is an [`Error::Shape`] naming
/// `config.rows_per_block`, checked before the launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GateFwdConfig {
    /// Rows of one sequence per block (`R`); the block has `R+3` warps (3 halo rows).
    pub rows_per_block: u32,
    /// The kernel.
    pub kernel: GateFwdKernel,
    /// v2 kernels only (ignored by `V1`): warps added to the block beyond the `R+3` row warps;
    /// they take part in the weight loads and phase 2 (more threads for phase 2's
    /// `R·ceil(d/8)` chunks: one round instead of two at d = 768, R = 3 with 3 extra warps).
    pub extra_warps: u32,
}

impl Default for GateFwdConfig {
    fn default() -> Self {
        Self { rows_per_block: 5, kernel: GateFwdKernel::V1, extra_warps: 0 }
    }
}

impl GateFwdConfig {
    /// The planner's choice for `shape` (what [`gate_conv_fwd`] runs): the v2 kernel with the
    /// approximate silu, R = 3 at d ≥ 768, else 2 (measured sweep, 2026-11-29, H200).
    pub fn for_shape(shape: EngramGateShape) -> Self {
        // Measured on the H200 (2026-11-29 session 3, `--variants`): v2f (approximate per-row
        // scalars and silu) is fastest on every seed row, R = 2 (d ≤ 512) or 3 (d = 768), with
        // extra phase-2 warps at d ≥ 512 (s64 x2: 3.49 µs against 3.68; s96 x5: 4.54 against 4.70).
        let rows_per_block = if shape.d >= 768 { 3 } else { 2 };
        let extra_warps = if shape.d >= 768 {
            5
        } else if shape.d >= 512 {
            2
        } else {
            0
        };
        // Session 6 (H200, `--variants`): the lean v2 kernel (32-bit shared addresses, ftz MUFU
        // forms, host constants; bitwise v2f where |conv| < 87) on every row: 2.30 / 2.91 / 2.50
        // / 3.65 µs against v2f's 3.01 / 3.68 / 3.10 / 4.77.
        Self { rows_per_block, kernel: GateFwdKernel::SmemULean, extra_warps }
    }
}

/// Launch configuration of the backward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GateBwdConfig {
    /// Rows of one sequence per block (`R`); the block has `R+6` warps (3 halo rows each side).
    pub rows_per_block: u32,
    /// Warps per output column group in the partial reduction (`S`, 1..=32).
    pub reduce_segments: u32,
    /// Launch the reduce kernel as a programmatic dependent of the main kernel (its launch
    /// and start-up overlap the main kernel; it waits for the main kernel's partials with
    /// `griddepcontrol.wait`). Bitwise the same outputs either way.
    pub pdl: bool,
    /// Warps beyond the tile's `(R+6)·W` (every main kernel): they skip stages 1–3 and only
    /// take part in the weight loads (v5) and stage 4's column loop, which strides by the
    /// block size (d = 768 at R = 3: 3 rounds of 288 columns → 2 with 3–7 extra warps; d = 512
    /// at R = 2: 2 rounds → 1 with 8). Bitwise the same outputs as 0. At most 32 warps in all
    /// and what the kernel's registers allow (checked before the launch).
    pub extra_warps: u32,
    /// v5 main kernel when ≥ 1 ("split rows"; 0 = the v1 kernel): every tile row is worked on
    /// by this many warps (`W`), each lane holding `ceil(ceil(d/8) / (32·W))` chunks of 8
    /// elements instead of `ceil(d/8)/32`; row sums are per-warp butterflies added over the
    /// `W` warps in a fixed order after a block barrier. Weights, `u` and `dconv` in shared
    /// memory (32-bit shared-window addresses), approximate σ in `silu'` and `rrms_v'` (the ftz
    /// forms of `ex2`/`rcp`/`rsqrt.approx`, ≈ 1–2 ulp f32), the per-launch constants from the
    /// host, no integer divisions. Runs on resident layouts (`d % 8 == 0`, `d ≤ 1024`, 16-byte
    /// aligned) whose `u` + `dconv` fit in 48 KiB and whole shared memory in 64 KiB, with
    /// `M` ≤ 65535 (a 2-D grid); elsewhere the v1 kernel runs (correctly rounded σ, weights
    /// through L1, `dconv` in global scratch where it does not fit). The block has
    /// `(R+6)·W + extra_warps` warps (at most 32 and what the kernel's registers allow:
    /// checked before the launch). [`bwd_split_warps`] picks `W` for a shape. (Up to session 7
    /// a v4 kernel with the same arithmetic and a one-launch cluster-reduction variant ran
    /// here; v5 was bitwise v4 wherever |conv| < 87.)
    pub split_warps: u32,
    /// With v5 running (`split_warps` ≥ 1): v5m, stage 3 in one pass — `Σ dvh·v` in closed
    /// form (`Σ g·v + eps·rv'³·Σ du·wv·v`, `Σ g·v` summed in stage 1), one barrier, butterfly
    /// and cross-warp sum fewer. `dv` bitwise v5; `dH`, `dk` differ in rounding (checked
    /// against the reference).
    pub merge_s2: bool,
    /// The reduce kernel with 16-byte loads when ≥ 1 (`engram_gate_bwd_reduce4`): block
    /// `(reduce_vec, S)`, thread x owning 4 consecutive outputs, up to 4 loads in flight per
    /// thread (the last batch padded), the S segment sums added by 16-byte shared loads in
    /// increasing order — bitwise the scalar reduce kernel at the same S (same order of every
    /// sum), with 4× fewer threads and loads. Applies where `d % 4 == 0` and the workspace is
    /// 16-byte aligned, else the scalar kernel runs. `reduce_vec` ∈ {0, 8, 16, 32} (threads
    /// per segment row: 8 = 128-byte rows of a segment, more smaller blocks).
    pub reduce_vec: u32,
}

impl Default for GateBwdConfig {
    fn default() -> Self {
        Self {
            rows_per_block: 4,
            reduce_segments: 8,
            pdl: true,
            extra_warps: 0,
            split_warps: 0,
            merge_s2: false,
            reduce_vec: 0,
        }
    }
}

/// Warps per tile row for the v5 backward ([`GateBwdConfig::split_warps`]) at `R` rows per
/// block: enough for one 8-element chunk per lane (`ceil(ceil(d/8)/32)`), as many as fit in
/// 32 warps (`(R+6)·W ≤ 32`), at least 1.
pub fn bwd_split_warps(d: usize, rows_per_block: u32) -> u32 {
    let want = d.div_ceil(8).div_ceil(32).max(1) as u32;
    want.min(32 / (rows_per_block + 6)).max(1)
}

/// `ceil(2^16 / wpr)`: the v5 kernels' warp → row map `i = (w·magic) >> 16` equals `w / wpr`
/// for every warp `w < 32` and `1 ≤ wpr ≤ 32` (the error `w·(magic − 2^16/wpr)/2^16 < 2^-11`
/// never reaches the next multiple of `1/wpr`; checked exhaustively by a CPU test).
pub fn bwd_warp_row_magic(wpr: u32) -> u32 {
    65536u32.div_ceil(wpr.max(1))
}

impl GateBwdConfig {
    /// The planner's choice for `shape` (what [`gate_conv_bwd`] runs and
    /// [`bwd_workspace_len`] sizes). From the measured sweep (2026-11-29, H200): S = 16 best
    /// or tied everywhere; R = 3 for T ≥ 96, else 2.
    pub fn for_shape(shape: EngramGateShape) -> Self {
        // Measured on the H200 (session 3): the v3a main kernel (u and the weights in shared
        // memory, approximate σ in silu') with R = 2 (d ≤ 512) or 3 (d = 768) and S = 16 is
        // fastest on every seed row (5.95 / 8.77 / 5.89 / 12.8 µs against v2's 6.5 / 10.5 /
        // 6.6 / 15.1). The dependent launch of the reduce kernel measured no gain (the reduce
        // kernel's own interval is unchanged) but costs nothing.
        // Session 4 (H200, graph submission, `--variants`): the v4 main kernel (each tile row
        // split over `bwd_split_warps` warps) on every row: 5.31 / 6.98 / 5.41 / 10.43 µs
        // against v3a's 5.79 / 8.85 / 5.79 / 12.77; S = 32 at d = 768 (10.02).
        // Session 6 (H200, `--variants`): v5m (the lean v4 with stage 3 in one pass) on every
        // row: 4.93 / 6.11 / 5.15 / 9.03 µs against v4's 5.38 / 7.10 / 5.38 / 10.11.
        // Session 7: v4 and its cluster reduction retired (v5 is v4's arithmetic, leaner).
        let rows_per_block = if shape.d >= 768 { 3 } else { 2 };
        Self {
            rows_per_block,
            reduce_segments: if shape.d >= 768 { 32 } else { 16 },
            pdl: true,
            extra_warps: 0,
            split_warps: bwd_split_warps(shape.d, rows_per_block),
            merge_s2: true,
            // Session 6: the 16-byte reduce at d = 768 (s96 8.90 → 8.67–8.77 µs, bitwise the
            // same sums); neutral to slower at d ≤ 512.
            reduce_vec: if shape.d >= 768 { 8 } else { 0 },
        }
    }
}

fn check_rows(arg: &'static str, r: u32, halo: u32) -> Result<()> {
    if r == 0 || (r + halo) * 32 > 1024 {
        return Err(Error::Shape { arg, msg: format!("{r} rows per block: needs 1..={}", 32 - halo) });
    }
    Ok(())
}

/// Checks the kernel can run `threads` per block (its register use may allow fewer than 1024:
/// the v2 kernels with `NV` = 4 use up to 163 registers, i.e. at most 384 threads; blocks of
/// at most 256 threads fit every kernel here and skip the driver query).
fn check_block_fits(f: &cudarc::driver::CudaFunction, threads: u32, halo: u32) -> Result<()> {
    if threads <= 256 {
        return Ok(());
    }
    let max = f.max_threads_per_block()? as u32;
    if threads > max {
        return Err(Error::Shape {
            arg: "config.rows_per_block",
            msg: format!(
                "{} rows per block need {threads} threads; this kernel allows {max} (at most {} rows)",
                threads / 32 - halo,
                max / 32 - halo
            ),
        });
    }
    Ok(())
}

fn dtype_index<T: Half>() -> Result<usize> {
    match T::NAME {
        "bf16" => Ok(0),
        "f16" => Ok(1),
        other => Err(Error::Shape { arg: "dtype", msg: format!("{other} is not f16 or bf16") }),
    }
}

/// Kernel variant: resident (NV−1) when `d ≤ 1024`, vectorised streaming (4) for larger `d`,
/// both when `d % 8 == 0` and every 16-bit pointer is 16-byte aligned; scalar (5) otherwise.
fn variant(d: usize, ptrs: &[CUdeviceptr]) -> usize {
    if d.is_multiple_of(8) && ptrs.iter().all(|p| p % 16 == 0) {
        let nv = d.div_ceil(256);
        if nv <= 4 {
            nv - 1
        } else {
            4
        }
    } else {
        5
    }
}

/// EngramGateConvFwd (docs/ops.md §4), for `T` = [`crate::f16`] or [`crate::bf16`].
///
/// Inputs (row-major, contiguous, dtype `T`): `h, k, v` `[M,T,d]`; `rms_w_h, rms_w_v` `[d]`;
/// `conv_w` `[4,d]`. Outputs: `y, vhat` `[M,T,d]` (`T`), `alpha, rrms_h, rrms_k, rrms_v`
/// `[M,T]` f32. All arithmetic f32, `eps` = [`EPS`]; `y = q(silu(conv) + vh)` with the
/// unrounded `vh`, `u` formed from the rounded `vhat`. Buffers may be larger than needed; a
/// 16-byte-aligned layout with `d % 8 == 0` takes the vectorised kernels. One launch on
/// [`Gpu::stream`]; asynchronous.
///
/// Errors: [`Error::Shape`] for a zero size, [`Error::BufferTooSmall`] naming the buffer,
/// [`Error::Overflow`], or a driver error from the launch.
#[allow(clippy::too_many_arguments)]
pub fn gate_conv_fwd<T: Half>(
    gpu: &Gpu,
    shape: EngramGateShape,
    h: &impl DevicePtr<T>,
    k: &impl DevicePtr<T>,
    v: &impl DevicePtr<T>,
    rms_w_h: &impl DevicePtr<T>,
    rms_w_v: &impl DevicePtr<T>,
    conv_w: &impl DevicePtr<T>,
    y: &mut impl DevicePtrMut<T>,
    vhat: &mut impl DevicePtrMut<T>,
    alpha: &mut impl DevicePtrMut<f32>,
    rrms_h: &mut impl DevicePtrMut<f32>,
    rrms_k: &mut impl DevicePtrMut<f32>,
    rrms_v: &mut impl DevicePtrMut<f32>,
) -> Result<()> {
    let (n, rows) = shape.lens()?;
    let d = shape.d;
    check_len("h", n, h.len())?;
    check_len("k", n, k.len())?;
    check_len("v", n, v.len())?;
    check_len("rms_w_h", d, rms_w_h.len())?;
    check_len("rms_w_v", d, rms_w_v.len())?;
    check_len("conv_w", KERNEL_SIZE * d, conv_w.len())?;
    check_len("y", n, y.len())?;
    check_len("vhat", n, vhat.len())?;
    check_len("alpha", rows, alpha.len())?;
    check_len("rrms_h", rows, rrms_h.len())?;
    check_len("rrms_k", rows, rrms_k.len())?;
    check_len("rrms_v", rows, rrms_v.len())?;
    let st = gpu.stream();
    let (ph, _g0) = h.device_ptr(st);
    let (pk, _g1) = k.device_ptr(st);
    let (pv, _g2) = v.device_ptr(st);
    let (pwh, _g3) = rms_w_h.device_ptr(st);
    let (pwv, _g4) = rms_w_v.device_ptr(st);
    let (pcw, _g5) = conv_w.device_ptr(st);
    let (py, _g6) = y.device_ptr_mut(st);
    let (pq, _g7) = vhat.device_ptr_mut(st);
    let (pa, _g8) = alpha.device_ptr_mut(st);
    let (prh, _g9) = rrms_h.device_ptr_mut(st);
    let (prk, _g10) = rrms_k.device_ptr_mut(st);
    let (prv, _g11) = rrms_v.device_ptr_mut(st);
    // SAFETY: every buffer was checked to hold the elements the shape addresses.
    unsafe { gate_conv_fwd_raw::<T>(gpu, shape, ph, pk, pv, pwh, pwv, pcw, py, pq, pa, prh, prk, prv, st.cu_stream()) }
}

/// [`gate_conv_fwd`] on raw device pointers, launched on `stream`.
///
/// # Safety
/// Each pointer must address device memory of `gpu`'s context holding at least the elements
/// [`gate_conv_fwd`] lists for `shape`, valid until the kernel finishes; outputs must not
/// overlap each other or the inputs. Shapes are still validated.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gate_conv_fwd_raw<T: Half>(
    gpu: &Gpu,
    shape: EngramGateShape,
    h: CUdeviceptr,
    k: CUdeviceptr,
    v: CUdeviceptr,
    rms_w_h: CUdeviceptr,
    rms_w_v: CUdeviceptr,
    conv_w: CUdeviceptr,
    y: CUdeviceptr,
    vhat: CUdeviceptr,
    alpha: CUdeviceptr,
    rrms_h: CUdeviceptr,
    rrms_k: CUdeviceptr,
    rrms_v: CUdeviceptr,
    stream: CUstream,
) -> Result<()> {
    gate_conv_fwd_raw_with::<T>(
        gpu,
        shape,
        GateFwdConfig::for_shape(shape),
        [h, k, v, rms_w_h, rms_w_v, conv_w],
        [y, vhat, alpha, rrms_h, rrms_k, rrms_v],
        stream,
    )
}

/// [`gate_conv_fwd_raw`] with an explicit configuration; `inputs` = `[h, k, v, rms_w_h,
/// rms_w_v, conv_w]`, `outputs` = `[y, vhat, alpha, rrms_h, rrms_k, rrms_v]`.
///
/// # Safety
/// As [`gate_conv_fwd_raw`].
#[doc(hidden)]
pub unsafe fn gate_conv_fwd_raw_with<T: Half>(
    gpu: &Gpu,
    shape: EngramGateShape,
    config: GateFwdConfig,
    inputs: [CUdeviceptr; 6],
    outputs: [CUdeviceptr; 6],
    stream: CUstream,
) -> Result<()> {
    shape.lens()?;
    let r = config.rows_per_block;
    check_rows("config.rows_per_block", r, 3)?;
    let dt = dtype_index::<T>()?;
    let var =
        variant(shape.d, &[inputs[0], inputs[1], inputs[2], inputs[3], inputs[4], inputs[5], outputs[0], outputs[1]]);
    let v2 = fwd2_applies(shape.d, r, var).then_some(config.kernel).and_then(|k| match k {
        GateFwdKernel::V1 => None,
        GateFwdKernel::SmemU => Some(0),
        GateFwdKernel::SmemUApprox => Some(1),
        GateFwdKernel::SmemUFast | GateFwdKernel::SmemULean => Some(2),
    });
    let lean = v2.is_some() && config.kernel == GateFwdKernel::SmemULean && shape.d >= 16 && shape.m <= 65535;
    let (f, shared_bytes) = match v2 {
        Some(_) if lean => (gpu.function(FWD2L[dt][var])?, fwd2_smem_bytes(shape.d, r) as u32),
        Some(ap) => (gpu.function(FWD2[ap][dt][var])?, fwd2_smem_bytes(shape.d, r) as u32),
        None => (gpu.function(FWD[dt][var])?, 8 * (r + 3)),
    };
    let warps = if v2.is_some() { r + 3 + config.extra_warps } else { r + 3 };
    if warps > 32 {
        return Err(Error::Shape {
            arg: "config.extra_warps",
            msg: format!("{} extra warps with {r} rows per block: more than 32 warps", config.extra_warps),
        });
    }
    check_block_fits(f, warps * 32, 3)?;
    let ntiles = shape.t.div_ceil(r as usize);
    let blocks = u32::try_from(shape.m * ntiles)
        .map_err(|_| Error::Overflow { arg: "m", msg: format!("{} blocks", shape.m * ntiles) })?;
    let dims = LaunchDims { grid: (blocks, 1, 1), block: (warps * 32, 1, 1), shared_bytes };
    let [mut a0, mut a1, mut a2, mut a3, mut a4, mut a5] = inputs;
    let [mut o0, mut o1, mut o2, mut o3, mut o4, mut o5] = outputs;
    let (mut tl, mut d, mut rr, mut nt, mut eps) = (shape.t as u32, shape.d as u32, r, ntiles as u32, EPS);
    if lean {
        // grid (ntiles, M); 1/d and 1/√d correctly rounded (the bits of the kernels'
        // `div.rn(1, d)`, `div.rn(1, sqrt.rn(d))`); ceil(2^32 / ceil(d/8)) for phase 2's row
        // index (d ≥ 16: at least 2 chunks, so it fits in u32)
        let dims_l = LaunchDims { grid: (ntiles as u32, shape.m as u32, 1), ..dims };
        let df = shape.d as f32;
        let (mut inv_d, mut inv_sqrt_d) = (1.0f32 / df, 1.0f32 / df.sqrt());
        let mut magic = fwd_chunk_magic(shape.d);
        return launch(
            f,
            dims_l,
            stream,
            &mut [
                &mut a0,
                &mut a1,
                &mut a2,
                &mut a3,
                &mut a4,
                &mut a5,
                &mut o0,
                &mut o1,
                &mut o2,
                &mut o3,
                &mut o4,
                &mut o5,
                &mut tl,
                &mut d,
                &mut rr,
                &mut inv_d,
                &mut inv_sqrt_d,
                &mut magic,
                &mut eps,
            ],
        );
    }
    launch(
        f,
        dims,
        stream,
        &mut [
            &mut a0, &mut a1, &mut a2, &mut a3, &mut a4, &mut a5, &mut o0, &mut o1, &mut o2, &mut o3, &mut o4, &mut o5,
            &mut tl, &mut d, &mut rr, &mut nt, &mut eps,
        ],
    )
}

/// `ceil(2^32 / ceil(d/8))` (d ≥ 16): the lean forward's phase 2 takes the row index of
/// element chunk `e` as the high word of `e·magic`, which equals `e / ceil(d/8)` whenever
/// `e·ceil(d/8) < 2^32` (always here: `e < 29·128`).
pub fn fwd_chunk_magic(d: usize) -> u32 {
    let nch = d.div_ceil(8).max(2) as u64;
    (1u64 << 32).div_ceil(nch) as u32
}

/// Bytes of dynamic shared memory of the v2 forward (`kernels-gpu` `fwd2_smem_bytes`).
fn fwd2_smem_bytes(d: usize, r: u32) -> usize {
    let dpad = d.div_ceil(8) * 8;
    4 * (2 * r as usize + 3) * dpad + 2 * 5 * dpad
}

/// Whether the v2 forward can run: a resident variant (`var` < 4), its shared memory within
/// 48 KiB, and the block's threads enough for the weight chunks (≤ `FWD2_WL` each).
fn fwd2_applies(d: usize, r: u32, var: usize) -> bool {
    var < 4 && fwd2_smem_bytes(d, r) <= SMEM_DEFAULT && 5 * d.div_ceil(8) <= FWD2_WL * (r as usize + 3) * 32
}

/// Where the backward keeps `dconv` of a block's tile: shared memory when it fits in 48 KiB.
fn bwd_scratch_in_smem(d: usize, r: u32) -> bool {
    bwd_smem_bytes(d, r, true) <= SMEM_DEFAULT
}

fn bwd_smem_bytes(d: usize, r: u32, with_scratch: bool) -> usize {
    let scalars = (2 * r as usize + 6).div_ceil(4) * 4;
    let scratch = if with_scratch { (r as usize + 3) * d.div_ceil(8) * 8 } else { 0 };
    4 * (scalars + scratch)
}

/// f32 elements of the workspace [`gate_conv_bwd`] needs for `shape` (the planner's
/// configuration, [`GateBwdConfig::for_shape`]).
pub fn bwd_workspace_len(shape: EngramGateShape) -> Result<usize> {
    shape.lens()?;
    bwd_workspace_len_with(shape, GateBwdConfig::for_shape(shape))
}

/// f32 elements of the backward's workspace under `config`: per-block partial weight
/// gradients `[blocks, 6, d]`, plus `[blocks, R+3, ceil(d/8)·8]` for `dconv` when it does not fit
/// in shared memory (large `d`).
pub fn bwd_workspace_len_with(shape: EngramGateShape, config: GateBwdConfig) -> Result<usize> {
    shape.lens()?;
    let r = config.rows_per_block;
    check_rows("config.rows_per_block", r, 6)?;
    let blocks = shape.m * shape.t.div_ceil(r as usize);
    let mut len = checked_product("workspace", &[blocks, 6, shape.d])?;
    if !bwd_scratch_in_smem(shape.d, r) {
        len += checked_product("workspace", &[blocks, r as usize + 3, shape.d.div_ceil(8) * 8])?;
    }
    Ok(len)
}

/// EngramGateConvBwd (docs/ops.md §5), for `T` = [`crate::f16`] or [`crate::bf16`]: the exact
/// gradients of `L = Σ dY·Y` with `Y` the f32 forward, the rounding `q` taken as the identity.
///
/// Inputs (dtype `T` unless said): `dy, h, k, v, vhat` `[M,T,d]`; `rms_w_h, rms_w_v` `[d]`;
/// `conv_w` `[4,d]`; `alpha, rrms_h, rrms_k, rrms_v` `[M,T]` f32 as the forward returned them.
/// Because `q` is the identity here, `vh = alpha·v` and its rrms are recomputed in f32 from
/// `v` and `alpha`: `vhat` and `rrms_v` (which carry the forward's rounding) are validated but
/// not read. `workspace`: at least [`bwd_workspace_len`] f32 (contents ignored, overwritten).
/// Outputs: `dh, dk, dv` `[M,T,d]` (`T`); `drms_w_h, drms_w_v` `[d]`, `dconv_w` `[4,d]` f32,
/// sums over all M·T rows reduced in a fixed order (bitwise deterministic). Two launches on
/// [`Gpu::stream`]; asynchronous.
///
/// Errors: as [`gate_conv_fwd`], and [`Error::BufferTooSmall`] for `workspace`.
#[allow(clippy::too_many_arguments)]
pub fn gate_conv_bwd<T: Half>(
    gpu: &Gpu,
    shape: EngramGateShape,
    dy: &impl DevicePtr<T>,
    h: &impl DevicePtr<T>,
    k: &impl DevicePtr<T>,
    v: &impl DevicePtr<T>,
    vhat: &impl DevicePtr<T>,
    rms_w_h: &impl DevicePtr<T>,
    rms_w_v: &impl DevicePtr<T>,
    conv_w: &impl DevicePtr<T>,
    alpha: &impl DevicePtr<f32>,
    rrms_h: &impl DevicePtr<f32>,
    rrms_k: &impl DevicePtr<f32>,
    rrms_v: &impl DevicePtr<f32>,
    workspace: &mut impl DevicePtrMut<f32>,
    dh: &mut impl DevicePtrMut<T>,
    dk: &mut impl DevicePtrMut<T>,
    dv: &mut impl DevicePtrMut<T>,
    drms_w_h: &mut impl DevicePtrMut<f32>,
    drms_w_v: &mut impl DevicePtrMut<f32>,
    dconv_w: &mut impl DevicePtrMut<f32>,
) -> Result<()> {
    let (n, rows) = shape.lens()?;
    let d = shape.d;
    check_len("dy", n, dy.len())?;
    check_len("h", n, h.len())?;
    check_len("k", n, k.len())?;
    check_len("v", n, v.len())?;
    check_len("vhat", n, vhat.len())?;
    check_len("rms_w_h", d, rms_w_h.len())?;
    check_len("rms_w_v", d, rms_w_v.len())?;
    check_len("conv_w", KERNEL_SIZE * d, conv_w.len())?;
    check_len("alpha", rows, alpha.len())?;
    check_len("rrms_h", rows, rrms_h.len())?;
    check_len("rrms_k", rows, rrms_k.len())?;
    check_len("rrms_v", rows, rrms_v.len())?;
    check_len("workspace", bwd_workspace_len(shape)?, workspace.len())?;
    check_len("dh", n, dh.len())?;
    check_len("dk", n, dk.len())?;
    check_len("dv", n, dv.len())?;
    check_len("drms_w_h", d, drms_w_h.len())?;
    check_len("drms_w_v", d, drms_w_v.len())?;
    check_len("dconv_w", KERNEL_SIZE * d, dconv_w.len())?;
    let st = gpu.stream();
    let (pg, _g0) = dy.device_ptr(st);
    let (ph, _g1) = h.device_ptr(st);
    let (pk, _g2) = k.device_ptr(st);
    let (pv, _g3) = v.device_ptr(st);
    let (pwh, _g4) = rms_w_h.device_ptr(st);
    let (pwv, _g5) = rms_w_v.device_ptr(st);
    let (pcw, _g6) = conv_w.device_ptr(st);
    let (pa, _g7) = alpha.device_ptr(st);
    let (prh, _g8) = rrms_h.device_ptr(st);
    let (prk, _g9) = rrms_k.device_ptr(st);
    let (pws, _g10) = workspace.device_ptr_mut(st);
    let (pdh, _g11) = dh.device_ptr_mut(st);
    let (pdk, _g12) = dk.device_ptr_mut(st);
    let (pdv, _g13) = dv.device_ptr_mut(st);
    let (pdwh, _g14) = drms_w_h.device_ptr_mut(st);
    let (pdwv, _g15) = drms_w_v.device_ptr_mut(st);
    let (pdcw, _g16) = dconv_w.device_ptr_mut(st);
    // SAFETY: every buffer was checked to hold the elements the shape addresses.
    unsafe {
        gate_conv_bwd_raw_with::<T>(
            gpu,
            shape,
            GateBwdConfig::for_shape(shape),
            [pg, ph, pk, pv, pwh, pwv, pcw],
            [pa, prh, prk],
            pws,
            [pdh, pdk, pdv, pdwh, pdwv, pdcw],
            st.cu_stream(),
        )
    }
}

/// EngramGateConvBwd for one shape and configuration, submitting each call's two launches as
/// one CUDA graph: captured on the first call with a set of pointers, replayed when the same
/// pointers recur (up to 32 sets cached), so the reduce kernel's programmatic dependent launch
/// overlaps the main kernel (separate host launches reach the device too far apart for that).
/// Inside a caller's own stream capture the launches go straight into that capture.
pub struct GateConvBwdPlan {
    shape: EngramGateShape,
    config: GateBwdConfig,
    graph: GraphReplay,
}

impl GateConvBwdPlan {
    /// Errors: those of [`EngramGateShape::lens`].
    pub fn new(shape: EngramGateShape, config: GateBwdConfig) -> Result<Self> {
        shape.lens()?;
        Ok(Self { shape, config, graph: GraphReplay::new() })
    }

    /// The planner's configuration for `shape` ([`GateBwdConfig::for_shape`]).
    pub fn for_shape(shape: EngramGateShape) -> Result<Self> {
        Self::new(shape, GateBwdConfig::for_shape(shape))
    }

    /// The configuration this plan launches.
    pub fn config(&self) -> GateBwdConfig {
        self.config
    }

    /// [`gate_conv_bwd_raw_with`] with this plan's shape and configuration, through the
    /// plan's graph. Errors: those of [`gate_conv_bwd_raw_with`], or a driver error.
    ///
    /// # Safety
    /// As [`gate_conv_bwd_raw_with`]; calls with one plan must be stream-ordered.
    pub unsafe fn run_raw<T: Half>(
        &mut self,
        gpu: &Gpu,
        inputs: [CUdeviceptr; 7],
        saved: [CUdeviceptr; 3],
        workspace: CUdeviceptr,
        outputs: [CUdeviceptr; 6],
        stream: CUstream,
    ) -> Result<()> {
        let (shape, config) = (self.shape, self.config);
        let call = || gate_conv_bwd_raw_with::<T>(gpu, shape, config, inputs, saved, workspace, outputs, stream);
        let mut key = vec![dtype_index::<T>()? as u64, workspace];
        key.extend(inputs.iter().chain(&saved).chain(&outputs));
        self.graph.run(stream, key, call)
    }
}

/// [`gate_conv_bwd`] on raw device pointers, launched on `stream`. `vhat` and `rrms_v` are not
/// read (see [`gate_conv_bwd`]) and are not taken.
///
/// # Safety
/// Each pointer must address device memory of `gpu`'s context holding at least the elements
/// [`gate_conv_bwd`] lists for `shape` (`workspace`: [`bwd_workspace_len`] f32), valid until
/// the kernels finish; outputs and workspace must not overlap each other or the inputs.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gate_conv_bwd_raw<T: Half>(
    gpu: &Gpu,
    shape: EngramGateShape,
    dy: CUdeviceptr,
    h: CUdeviceptr,
    k: CUdeviceptr,
    v: CUdeviceptr,
    rms_w_h: CUdeviceptr,
    rms_w_v: CUdeviceptr,
    conv_w: CUdeviceptr,
    alpha: CUdeviceptr,
    rrms_h: CUdeviceptr,
    rrms_k: CUdeviceptr,
    workspace: CUdeviceptr,
    dh: CUdeviceptr,
    dk: CUdeviceptr,
    dv: CUdeviceptr,
    drms_w_h: CUdeviceptr,
    drms_w_v: CUdeviceptr,
    dconv_w: CUdeviceptr,
    stream: CUstream,
) -> Result<()> {
    gate_conv_bwd_raw_with::<T>(
        gpu,
        shape,
        GateBwdConfig::for_shape(shape),
        [dy, h, k, v, rms_w_h, rms_w_v, conv_w],
        [alpha, rrms_h, rrms_k],
        workspace,
        [dh, dk, dv, drms_w_h, drms_w_v, dconv_w],
        stream,
    )
}

/// [`gate_conv_bwd_raw`] with an explicit configuration: `inputs` = `[dy, h, k, v, rms_w_h,
/// rms_w_v, conv_w]`, `saved` = `[alpha, rrms_h, rrms_k]`, `outputs` = `[dh, dk, dv,
/// drms_w_h, drms_w_v, dconv_w]`; `workspace` holds [`bwd_workspace_len_with`] f32.
///
/// # Safety
/// As [`gate_conv_bwd_raw`].
#[doc(hidden)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn gate_conv_bwd_raw_with<T: Half>(
    gpu: &Gpu,
    shape: EngramGateShape,
    config: GateBwdConfig,
    inputs: [CUdeviceptr; 7],
    saved: [CUdeviceptr; 3],
    workspace: CUdeviceptr,
    outputs: [CUdeviceptr; 6],
    stream: CUstream,
) -> Result<()> {
    shape.lens()?;
    let r = config.rows_per_block;
    check_rows("config.rows_per_block", r, 6)?;
    let sg = config.reduce_segments;
    if sg == 0 || sg > 32 {
        return Err(Error::Shape { arg: "config.reduce_segments", msg: format!("{sg} is not in 1..=32") });
    }
    if !matches!(config.reduce_vec, 0 | 8 | 16 | 32) {
        return Err(Error::Shape {
            arg: "config.reduce_vec",
            msg: format!("{} is not 0, 8, 16 or 32", config.reduce_vec),
        });
    }
    let dt = dtype_index::<T>()?;
    let d = shape.d;
    let mut ptrs = inputs.to_vec();
    ptrs.extend_from_slice(&outputs[..3]);
    let var = variant(d, &ptrs);
    let ntiles = shape.t.div_ceil(r as usize);
    let nblocks = shape.m * ntiles;
    let blocks = u32::try_from(nblocks).map_err(|_| Error::Overflow { arg: "m", msg: format!("{nblocks} blocks") })?;
    let in_smem = bwd_scratch_in_smem(d, r);
    let part = workspace;
    let scratch: CUdeviceptr = if in_smem { 0 } else { workspace + (nblocks * 6 * d * 4) as u64 };
    let u_bytes = 4 * (r as usize + 6) * d.div_ceil(8) * 8;
    let w_bytes = 2 * 6 * d.div_ceil(8) * 8;
    // v5: resident layouts whose u + dconv fit in 48 KiB; the weights and the split sums
    // (4 slots per warp) may take it past 48 KiB (d = 768, R = 3: ≈ 54 KiB): opted in up to
    // BWD5_SMEM_MAX; a 2-D grid (ntiles, M)
    let wpr = config.split_warps;
    let v5_bytes = bwd_smem_bytes(d, r, true) + u_bytes + w_bytes + 4 * 4 * (r as usize + 6) * wpr as usize;
    let u_fits = var < 4 && in_smem && bwd_smem_bytes(d, r, true) + u_bytes <= SMEM_DEFAULT;
    let v5 = wpr >= 1 && u_fits && shape.m <= 65535 && v5_bytes <= BWD5_SMEM_MAX;
    let tile_warps = if v5 { (r + 6).saturating_mul(wpr) } else { r + 6 };
    let (f, dims_grid, shared_bytes) = if v5 {
        // NV of the split row: ceil(ceil(d/8) / (32·W)) ≤ 4 (var < 4 means ceil(d/8) ≤ 128)
        let nv = d.div_ceil(8).div_ceil(32 * wpr as usize).clamp(1, 4);
        let f = gpu.function(BWD5[config.merge_s2 as usize][dt][nv - 1])?;
        let attr = cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
        if v5_bytes > SMEM_DEFAULT && f.get_attribute(attr)? < v5_bytes as i32 {
            f.set_attribute(attr, v5_bytes as i32)?;
        }
        (f, (ntiles as u32, shape.m as u32, 1), v5_bytes)
    } else {
        (gpu.function(BWD[dt][var])?, (blocks, 1, 1), bwd_smem_bytes(d, r, in_smem))
    };
    let warps = tile_warps.saturating_add(config.extra_warps);
    if v5 && tile_warps > 32 {
        return Err(Error::Shape {
            arg: "config.split_warps",
            msg: format!("{wpr} warps per row with {r} rows per block: more than 32 warps"),
        });
    }
    if warps > 32 {
        return Err(Error::Shape {
            arg: "config.extra_warps",
            msg: format!("{} extra warps with {r} rows per block: more than 32 warps", config.extra_warps),
        });
    }
    check_block_fits(f, warps * 32, 6)?;
    let dims = LaunchDims { grid: dims_grid, block: (warps * 32, 1, 1), shared_bytes: shared_bytes as u32 };
    let [mut g, mut h, mut k, mut v, mut wh, mut wv, mut cw] = inputs;
    let [mut a, mut rh, mut rk] = saved;
    let [mut dh, mut dk, mut dv, mut dwh, mut dwv, mut dcw] = outputs;
    let (mut pt, mut sc) = (part, scratch);
    let (mut tl, mut dd, mut rr, mut nt, mut eps) = (shape.t as u32, d as u32, r, ntiles as u32, EPS);
    if v5 {
        let (mut w, mut wm) = (wpr, bwd_warp_row_magic(wpr));
        // s = 1/√d and 1/d correctly rounded (the bits of the kernels' `div.rn(1, sqrt.rn(d))`)
        let df = d as f32;
        let (mut s, mut inv_d) = (1.0f32 / df.sqrt(), 1.0f32 / df);
        launch(
            f,
            dims,
            stream,
            &mut [
                &mut g, &mut h, &mut k, &mut v, &mut wh, &mut wv, &mut cw, &mut a, &mut rh, &mut rk, &mut dh, &mut dk,
                &mut dv, &mut pt, &mut tl, &mut dd, &mut rr, &mut w, &mut wm, &mut s, &mut inv_d, &mut eps,
            ],
        )?;
    } else {
        launch(
            f,
            dims,
            stream,
            &mut [
                &mut g, &mut h, &mut k, &mut v, &mut wh, &mut wv, &mut cw, &mut a, &mut rh, &mut rk, &mut dh, &mut dk,
                &mut dv, &mut pt, &mut sc, &mut tl, &mut dd, &mut rr, &mut nt, &mut eps,
            ],
        )?;
    }
    let xw = config.reduce_vec;
    let (f2, dims2) = if xw >= 1 && d.is_multiple_of(4) && part.is_multiple_of(16) {
        let grid = ((6 * d / 4).div_ceil(xw as usize) as u32, 1, 1);
        (gpu.function(BWD_REDUCE4)?, LaunchDims { grid, block: (xw, sg, 1), shared_bytes: 16 * xw * sg })
    } else {
        let grid = ((6 * d).div_ceil(32) as u32, 1, 1);
        (gpu.function(BWD_REDUCE)?, LaunchDims { grid, block: (32, sg, 1), shared_bytes: 4 * 32 * sg })
    };
    let (mut pt2, mut nb, mut d2) = (part, blocks, d as u32);
    let launch2 = if config.pdl { launch_pdl } else { launch };
    launch2(f2, dims2, stream, &mut [&mut pt2, &mut dwh, &mut dwv, &mut dcw, &mut nb, &mut d2])
}
