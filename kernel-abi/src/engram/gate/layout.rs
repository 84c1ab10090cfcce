//! Launch-contract sizes of the gated-conv kernels: dynamic shared memory layouts and the
//! forward's per-thread weight chunks. The kernels lay out their shared memory by these
//! functions and the host launches with them. Byte counts are `usize` (the host evaluates them
//! for any valid `d`); `dpad = ceil(d/8)·8`.

/// Taps of the causal depthwise conv (docs/ops.md §4: kernel size 4): `conv_w` is
/// `[CONV_TAPS, d]`, and a tile reads `CONV_TAPS − 1` halo rows on each side it needs.
pub const CONV_TAPS: usize = 4;

/// Rows of the backward's per-block partial weight gradients `part` `[blocks, GRAD_ROWS, d]`:
/// `drms_w_h`, `drms_w_v`, `dconv_w[0..CONV_TAPS]`, in this order (also the order of the
/// reduced outputs).
pub const GRAD_ROWS: usize = 2 + CONV_TAPS;

/// Weight chunks (16 B) one thread of the 1-D-grid shared-memory forward holds while phase 1
/// runs: a block needs `5·ceil(d/8) ≤ FWD_SMEM_WL·threads`.
pub const FWD_SMEM_WL: usize = 5;

/// `ceil(d/8)·8`: a row padded to whole 8-element chunks.
pub const fn dpad(d: usize) -> usize {
    d.div_ceil(8) * 8
}

/// Smem (f32) of the streaming forward: `alpha[R+3]`, `rrms_v[R+3]` of the tile's rows including
/// the 3 halo rows.
pub const fn fwd_stream_smem_floats(r: u32) -> u32 {
    2 * (r + 3)
}

/// Dynamic smem of the shared-memory forward in bytes: `u` f32 `[R+3][dpad]` (the halo rows'
/// too, zeros before t = 0), the owned rows' unrounded `vh` f32 `[R][dpad]`, then the raw 16-bit
/// weights `[5][dpad]` (`rms_w_v`, `conv_w[0..4]`).
pub const fn fwd_smem_bytes(d: usize, r: u32) -> usize {
    4 * (2 * r as usize + 3) * dpad(d) + 2 * 5 * dpad(d)
}

/// Smem (f32) of the backward's per-row scalars: `rrms_v'[R+6]`, `2·dz·s·rh·rk [R]`, padded to 4.
pub const fn bwd_smem_scalar_floats(r: u32) -> u32 {
    (2 * r + 6).div_ceil(4) * 4
}

/// Dynamic smem of the one-warp-per-row backward in bytes: the scalars, then (`with_dconv`:
/// where it is not in global scratch) `dconv` f32 `[R+3][dpad]`.
pub const fn bwd_smem_bytes(d: usize, r: u32, with_dconv: bool) -> usize {
    let dconv = if with_dconv { (r as usize + 3) * dpad(d) } else { 0 };
    4 * (bwd_smem_scalar_floats(r) as usize + dconv)
}

/// Floats of the split backward's per-warp partial row sums: `[(R+6)·wpr][4]` (`Σ vh²`, `P`,
/// `Σ g·v`, one slot of padding).
pub const fn bwd_split_sum_floats(r: u32, wpr: u32) -> u32 {
    4 * (r + 6) * wpr
}

/// Dynamic smem of the split backward in bytes: the scalars, `u` f32 `[R+6][dpad]`, `dconv` f32
/// `[R+3][dpad]`, the weights u16 `[6][dpad]`, the split row sums.
pub const fn bwd_split_smem_bytes(d: usize, r: u32, wpr: u32) -> usize {
    bwd_smem_bytes(d, r, true)
        + 4 * (r as usize + 6) * dpad(d)
        + 2 * 6 * dpad(d)
        + 4 * bwd_split_sum_floats(r, wpr) as usize
}
