//! EngramGateConvFwd / EngramGateConvBwd kernels (docs/ops.md §4–§5): their argument structs,
//! shared-memory layouts ([`layout`]) and the index multipliers the host computes for them.
//!
//! Tensor names are those of docs/ops.md (`h` is the op's `H`, `dy` its `dY`). Every
//! `[M,T,d]` tensor and `[d]`/`[4,d]` weight is the kernel's 16-bit dtype (as `u16` bits),
//! row-major and contiguous; per-row tensors (`alpha`, `rrms_*`) are `[M,T]` f32. A block owns
//! `rows_per_block` (`R`) consecutive rows of one sequence; `ntiles = ceil(T/R)`.
pub mod layout;

/// Right shift of the split backward's warp → row map: tile row `i = (w·magic) >> 16` of warp
/// `w`, with `magic` = [`warp_row_magic`].
pub const WARP_ROW_SHIFT: u32 = 16;

/// `ceil(2^16 / wpr)` (`wpr` ≥ 1; 0 reads as 1): `(w·magic) >> WARP_ROW_SHIFT` equals
/// `w / wpr` for every warp `w < 32` and `1 ≤ wpr ≤ 32` (the error `w·(magic − 2^16/wpr)/2^16 <
/// 2^-11` never reaches the next multiple of `1/wpr`; checked exhaustively by a CPU test).
pub const fn warp_row_magic(wpr: u32) -> u32 {
    let wpr = if wpr < 1 { 1 } else { wpr };
    (1u32 << WARP_ROW_SHIFT).div_ceil(wpr)
}

/// Right shift of the 2-D-grid forward's chunk → row map: the row of element chunk `e` is
/// `(e·magic) >> 32`, with `magic` = [`chunk_row_magic`].
pub const CHUNK_ROW_SHIFT: u32 = 32;

/// `ceil(2^32 / ceil(d/8))` (`d ≥ 16`): `(e·magic) >> CHUNK_ROW_SHIFT` equals `e / ceil(d/8)`
/// whenever `e·ceil(d/8) < 2^32` (always in the forward: `e < 29·128`).
pub const fn chunk_row_magic(d: usize) -> u32 {
    let nch = d.div_ceil(8) as u64;
    let nch = if nch < 2 { 2 } else { nch };
    (1u64 << CHUNK_ROW_SHIFT).div_ceil(nch) as u32
}

kernel_args! {
    /// EngramGateConvFwd with the per-row constants computed in the kernel, grid `M·ntiles`
    /// (block `b`: sequence `b / ntiles`, tile `b % ntiles`). Taken by:
    /// - `engram_gate_fwd_stream_{vec8,scalar}_{bf16,f16}` (rows streamed through L1): block
    ///   `(R+3)·32` threads (a warp per tile row, 3 halo rows), dynamic shared memory
    ///   `4·`[`layout::fwd_stream_smem_floats`]`(R)` bytes. `vec8`: `d % 8 == 0` and every
    ///   16-bit tensor 16-byte aligned; `scalar`: any `d`, any alignment.
    /// - `engram_gate_fwd_smem_grid1d_{bf16,f16}_r{NV}` (`u` in shared memory): `d % 8 == 0`,
    ///   `ceil(d/8) ≤ 32·NV`, 16-byte aligned; block `(R+3+extra)·32` threads with
    ///   `5·ceil(d/8) ≤ `[`layout::FWD_SMEM_WL`]`·threads`, dynamic shared memory
    ///   [`layout::fwd_smem_bytes`]`(d, R)` bytes.
    pub struct GateFwdArgs / gate_fwd_entry {
        pub h: *const u16,
        pub k: *const u16,
        pub v: *const u16,
        pub rms_w_h: *const u16,
        pub rms_w_v: *const u16,
        /// `[4,d]`: tap `p` multiplies `u` of row `t−3+p`.
        pub conv_w: *const u16,
        pub y: *mut u16,
        pub vhat: *mut u16,
        pub alpha: *mut f32,
        pub rrms_h: *mut f32,
        pub rrms_k: *mut f32,
        pub rrms_v: *mut f32,
        /// `T`: rows per sequence.
        pub t_len: u32,
        pub d: u32,
        /// `R`.
        pub rows_per_block: u32,
        /// `ceil(T/R)`: tiles per sequence.
        pub ntiles: u32,
        pub eps: f32,
    }
}

kernel_args! {
    /// EngramGateConvFwd with `u` in shared memory on a 2-D grid, the per-launch constants from
    /// the host: `engram_gate_fwd_smem_{bf16,f16}_r{NV}`. Grid `(ntiles, M)` (`M ≤ 65535`),
    /// block `(R+3+extra)·32` threads, dynamic shared memory [`layout::fwd_smem_bytes`]`(d, R)`
    /// bytes; `d % 8 == 0`, `16 ≤ d`, `ceil(d/8) ≤ 32·NV`, every 16-bit tensor 16-byte aligned.
    /// Bitwise [`GateFwdArgs`]' `smem_grid1d` kernel where |conv| and |alpha's logit| < 87.
    pub struct GateFwdSmemArgs / gate_fwd_smem_entry {
        pub h: *const u16,
        pub k: *const u16,
        pub v: *const u16,
        pub rms_w_h: *const u16,
        pub rms_w_v: *const u16,
        /// `[4,d]`: tap `p` multiplies `u` of row `t−3+p`.
        pub conv_w: *const u16,
        pub y: *mut u16,
        pub vhat: *mut u16,
        pub alpha: *mut f32,
        pub rrms_h: *mut f32,
        pub rrms_k: *mut f32,
        pub rrms_v: *mut f32,
        /// `T`: rows per sequence.
        pub t_len: u32,
        pub d: u32,
        /// `R`.
        pub rows_per_block: u32,
        /// `1/d`, correctly rounded (the bits of `div.rn(1, d)`).
        pub inv_d: f32,
        /// `1/√d`, correctly rounded (the bits of `div.rn(1, sqrt.rn(d))`).
        pub inv_sqrt_d: f32,
        /// [`chunk_row_magic`]`(d)`.
        pub chunk_magic: u32,
        pub eps: f32,
    }
}

kernel_args! {
    /// EngramGateConvBwd's main kernel with one warp per tile row, grid `M·ntiles` (block `b`:
    /// sequence `b / ntiles`, tile `b % ntiles`), block `(R+6)·32` threads (3 halo rows each
    /// side), dynamic shared memory [`layout::bwd_smem_bytes`]`(d, R, scratch.is_null())`
    /// bytes. Taken by `engram_gate_bwd_rowwarp_{bf16,f16}_r{NV}` (`d % 8 == 0`, `ceil(d/8) ≤
    /// 32·NV`, 16-byte aligned) and `engram_gate_bwd_stream_{vec8,scalar}_{bf16,f16}` (rows
    /// streamed; `vec8`: `d % 8 == 0`, aligned; `scalar`: any `d`, any alignment). Its partials
    /// are reduced by a kernel taking [`GateBwdReduceArgs`].
    pub struct GateBwdArgs / gate_bwd_entry {
        /// `dY`.
        pub dy: *const u16,
        pub h: *const u16,
        pub k: *const u16,
        pub v: *const u16,
        pub rms_w_h: *const u16,
        pub rms_w_v: *const u16,
        pub conv_w: *const u16,
        /// The forward's `alpha`.
        pub alpha: *const f32,
        /// The forward's `rrms_h`.
        pub rrms_h: *const f32,
        /// The forward's `rrms_k`.
        pub rrms_k: *const f32,
        pub dh: *mut u16,
        pub dk: *mut u16,
        pub dv: *mut u16,
        /// `[blocks, 6, d]` f32: each block's partial `drms_w_h`, `drms_w_v`, `dconv_w[0..4]`.
        pub part: *mut f32,
        /// Where `dconv` of the tile lives: [`DconvScratch::arg`].
        pub scratch: *mut f32,
        /// `T`: rows per sequence.
        pub t_len: u32,
        pub d: u32,
        /// `R`.
        pub rows_per_block: u32,
        /// `ceil(T/R)`: tiles per sequence.
        pub ntiles: u32,
        pub eps: f32,
    }
}

/// Where the kernels taking [`GateBwdArgs`] keep `dconv` of a block's tile (its `scratch`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DconvScratch {
    /// Dynamic shared memory after the row scalars ([`layout::bwd_smem_bytes`] with
    /// `with_dconv`).
    Shared,
    /// Global f32 `[blocks, R+3, ceil(d/8)·8]`, each block using its own slice.
    Global(*mut f32),
}

impl DconvScratch {
    /// The `scratch` argument: null for [`DconvScratch::Shared`], the buffer otherwise.
    pub const fn arg(self) -> *mut f32 {
        match self {
            Self::Shared => core::ptr::null_mut(),
            Self::Global(p) => p,
        }
    }
}

kernel_args! {
    /// EngramGateConvBwd's main kernel with every tile row split over `warps_per_row` warps
    /// (`W`): `engram_gate_bwd_split_{bf16,f16}_r{NV}` (`NV = ceil(ceil(d/8) / (32·W))`).
    /// Needs `d % 8 == 0` and every 16-bit tensor 16-byte aligned. Grid `(ntiles, M)` (`M ≤
    /// 65535`), block `(R+6)·W·32` threads (at most 32 warps), dynamic shared memory
    /// [`layout::bwd_split_smem_bytes`]`(d, R, W)` bytes (above 48 KiB needs the function's
    /// opt-in). Its partials are reduced by a kernel taking [`GateBwdReduceArgs`].
    pub struct GateBwdSplitArgs / gate_bwd_split_entry {
        /// `dY`.
        pub dy: *const u16,
        pub h: *const u16,
        pub k: *const u16,
        pub v: *const u16,
        pub rms_w_h: *const u16,
        pub rms_w_v: *const u16,
        pub conv_w: *const u16,
        /// The forward's `alpha`.
        pub alpha: *const f32,
        /// The forward's `rrms_h`.
        pub rrms_h: *const f32,
        /// The forward's `rrms_k`.
        pub rrms_k: *const f32,
        pub dh: *mut u16,
        pub dk: *mut u16,
        pub dv: *mut u16,
        /// `[blocks, 6, d]` f32 (`blocks = M·ntiles`, block `(x, m)` at `m·ntiles + x`): each
        /// block's partial `drms_w_h`, `drms_w_v`, `dconv_w[0..4]`.
        pub part: *mut f32,
        /// `T`: rows per sequence.
        pub t_len: u32,
        pub d: u32,
        /// `R`.
        pub rows_per_block: u32,
        /// `W` (1..=4).
        pub warps_per_row: u32,
        /// [`warp_row_magic`]`(W)`.
        pub warp_row_magic: u32,
        /// `s = 1/√d`, correctly rounded (the bits of `div.rn(1, sqrt.rn(d))`).
        pub inv_sqrt_d: f32,
        /// `1/d`, correctly rounded.
        pub inv_d: f32,
        pub eps: f32,
    }
}

kernel_args! {
    /// EngramGateConvBwd's reduction of the main kernel's per-block partials, launched as its
    /// programmatic dependent: `out[e] = Σ_b part[b, e]` over `e < 6·d` in increasing `b`,
    /// deterministic. Taken by:
    /// - `engram_gate_bwd_reduce`: block `(32, S)`, grid `ceil(6d/32)`, dynamic shared memory
    ///   `4·32·S` bytes.
    /// - `engram_gate_bwd_reduce_vec4` (bitwise the scalar kernel at the same `S`): `d % 4 ==
    ///   0`, `part` 16-byte aligned; block `(XW, S)`, grid `ceil(6d/4/XW)`, dynamic shared
    ///   memory `16·XW·S` bytes.
    pub struct GateBwdReduceArgs / gate_bwd_reduce_entry {
        /// `[nblocks, 6, d]` f32, the main kernel's `part`.
        pub part: *const f32,
        pub drms_w_h: *mut f32,
        pub drms_w_v: *mut f32,
        /// `[4,d]`.
        pub dconv_w: *mut f32,
        /// Blocks of the main kernel (`M·ntiles`).
        pub nblocks: u32,
        pub d: u32,
    }
}

/// The kernel column of [`gate_kernels!`](crate::gate_kernels): the gated conv's kernel bodies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GateKernel {
    /// Forward, `u` in shared memory, grid `(ntiles, M)`, constants from the host.
    FwdSmem,
    /// [`GateKernel::FwdSmem`] on a 1-D grid, constants computed in the kernel.
    FwdSmemGrid1d,
    /// Forward, rows streamed with 16-byte accesses.
    FwdStreamVec8,
    /// Forward, rows streamed with scalar accesses.
    FwdStreamScalar,
    /// Backward, tile rows split over warps.
    BwdSplit,
    /// Backward, one warp per row resident in registers.
    BwdRowWarp,
    /// Backward, one warp per streamed row, 16-byte accesses.
    BwdStreamVec8,
    /// Backward, one warp per streamed row, scalar accesses.
    BwdStreamScalar,
    /// The backward's partial-sum reduction ([`GateBwdReduceArgs`]).
    BwdReduceScalar,
    /// The same reduction with 16-byte accesses (bitwise the scalar one).
    BwdReduceVec4,
}

impl GateKernel {
    /// Whether a row of [`gate_kernels!`](crate::gate_kernels) instantiates this kernel validly: the reductions in
    /// f32 with no resident row, every other kernel in a 16-bit dtype; `nv` in 1..=4 for the
    /// kernels holding a row (the bodies unroll at most four chunks per lane), 0 for the others.
    pub const fn accepts(self, dtype: crate::Elem, nv: u32) -> bool {
        let resident = matches!(self, Self::FwdSmem | Self::FwdSmemGrid1d | Self::BwdSplit | Self::BwdRowWarp);
        let reduce = matches!(self, Self::BwdReduceScalar | Self::BwdReduceVec4);
        let dtype_ok = if reduce { matches!(dtype, crate::Elem::F32) } else { dtype.is_half() };
        dtype_ok && if resident { nv >= 1 && nv <= 4 } else { nv == 0 }
    }
}

impl GateKernel {
    /// One line: what the body does.
    pub const fn about(self) -> &'static str {
        match self {
            Self::FwdSmem => "forward, u in shared memory, grid (ntiles, M), constants from the host",
            Self::FwdSmemGrid1d => "forward, u in shared memory, 1-D grid, constants computed in the kernel",
            Self::FwdStreamVec8 => "forward, rows streamed with 16-byte accesses",
            Self::FwdStreamScalar => "forward, rows streamed with scalar accesses",
            Self::BwdSplit => "backward, tile rows split over warps",
            Self::BwdRowWarp => "backward, one warp per row resident in registers",
            Self::BwdStreamVec8 => "backward, one warp per streamed row, 16-byte accesses",
            Self::BwdStreamScalar => "backward, one warp per streamed row, scalar accesses",
            Self::BwdReduceScalar => "backward's partial-sum reduction",
            Self::BwdReduceVec4 => "backward's partial-sum reduction, 16-byte accesses",
        }
    }
}

/// A gated-conv kernel variant (a type of [`gate_policies`]).
pub trait GatePolicy: crate::Policy {
    /// The kernel body.
    const KERNEL: GateKernel;
    /// The 16-bit element type (`F32` for the reductions).
    const ELEM: crate::Elem;
    /// 8-element chunks per lane of a register-resident row (`ceil(d/8) ≤ 32·NV`; 0 where the
    /// row is not resident).
    const NV: u32;
    /// Evaluates to `()`, or stops the build where [`GateKernel::accepts`] rejects the policy
    /// (every generated policy is checked; the error names the type):
    ///
    /// ```compile_fail,E0080
    /// use kernel_abi::{Elem, GateKernel, GatePolicy, Policy};
    /// struct FwdSmemNv5;
    /// impl Policy for FwdSmemNv5 {
    ///     const ENTRY: &'static str = "fwd_smem_nv5";
    ///     const ABOUT: &'static str = "five chunks per lane";
    /// }
    /// impl GatePolicy for FwdSmemNv5 {
    ///     const KERNEL: GateKernel = GateKernel::FwdSmem;
    ///     const ELEM: Elem = Elem::Bf16;
    ///     const NV: u32 = 5;
    /// }
    /// const _: () = <FwdSmemNv5 as GatePolicy>::VALID;
    /// ```
    const VALID: () =
        assert!(Self::KERNEL.accepts(Self::ELEM, Self::NV), "the gate policy's kernel does not take its dtype and nv");
}

/// Declares the policy type of each row of [`gate_kernels!`](crate::gate_kernels), rejecting
/// at compile time a row its kernel does not accept.
macro_rules! gate_policy_types {
    ($($name:ident: $kind:ident, $dt:ident, $nv:literal;)*) => {
        $(policy_type!(
            $name,
            concat!("[`", stringify!($kind), "`](crate::GateKernel::", stringify!($kind), "), ", stringify!($dt), ", nv ", stringify!($nv), "."),
            $crate::GateKernel::$kind.about(),
            GatePolicy {
                const KERNEL: $crate::GateKernel = $crate::GateKernel::$kind;
                const ELEM: $crate::Elem = $crate::elem!($dt);
                const NV: u32 = $nv;
            }
        );)*
    };
}

/// The gated-conv kernel variants, one type per row of [`gate_kernels!`](crate::gate_kernels)
/// (named after its PTX entry).
pub mod gate_policies {
    crate::gate_kernels!(gate_policy_types);
}

/// The gated-conv kernels, one row per PTX entry: `name: kernel, dtype, nv;`. `kernel`: a
/// [`GateKernel`]; `dtype`: the 16-bit element type (`f32` for the reductions); `nv`: the
/// 8-element chunks per lane of a register-resident row (`ceil(d/8) ≤ 32·nv`; 0 where the row
/// is not resident). Each row is a type of [`gate_policies`], checked
/// against [`GateKernel::accepts`] at compile time.
/// Expands to `$cb! { rows }`: the device crate declares each entry from it
/// (`kernels-gpu/src/engram/gate_conv.rs`), the host derives its entry names from it
/// (`host/src/engram/gate_conv.rs`).
#[macro_export]
macro_rules! gate_kernels {
    ($cb:ident) => {
        $cb! {
            engram_gate_fwd_smem_bf16_r1: FwdSmem, bf16, 1;
            engram_gate_fwd_smem_bf16_r2: FwdSmem, bf16, 2;
            engram_gate_fwd_smem_bf16_r3: FwdSmem, bf16, 3;
            engram_gate_fwd_smem_bf16_r4: FwdSmem, bf16, 4;
            engram_gate_fwd_smem_f16_r1: FwdSmem, f16, 1;
            engram_gate_fwd_smem_f16_r2: FwdSmem, f16, 2;
            engram_gate_fwd_smem_f16_r3: FwdSmem, f16, 3;
            engram_gate_fwd_smem_f16_r4: FwdSmem, f16, 4;
            engram_gate_fwd_smem_grid1d_bf16_r1: FwdSmemGrid1d, bf16, 1;
            engram_gate_fwd_smem_grid1d_bf16_r2: FwdSmemGrid1d, bf16, 2;
            engram_gate_fwd_smem_grid1d_bf16_r3: FwdSmemGrid1d, bf16, 3;
            engram_gate_fwd_smem_grid1d_bf16_r4: FwdSmemGrid1d, bf16, 4;
            engram_gate_fwd_smem_grid1d_f16_r1: FwdSmemGrid1d, f16, 1;
            engram_gate_fwd_smem_grid1d_f16_r2: FwdSmemGrid1d, f16, 2;
            engram_gate_fwd_smem_grid1d_f16_r3: FwdSmemGrid1d, f16, 3;
            engram_gate_fwd_smem_grid1d_f16_r4: FwdSmemGrid1d, f16, 4;
            engram_gate_fwd_stream_vec8_bf16: FwdStreamVec8, bf16, 0;
            engram_gate_fwd_stream_scalar_bf16: FwdStreamScalar, bf16, 0;
            engram_gate_fwd_stream_vec8_f16: FwdStreamVec8, f16, 0;
            engram_gate_fwd_stream_scalar_f16: FwdStreamScalar, f16, 0;
            engram_gate_bwd_split_bf16_r1: BwdSplit, bf16, 1;
            engram_gate_bwd_split_bf16_r2: BwdSplit, bf16, 2;
            engram_gate_bwd_split_f16_r1: BwdSplit, f16, 1;
            engram_gate_bwd_split_f16_r2: BwdSplit, f16, 2;
            engram_gate_bwd_rowwarp_bf16_r1: BwdRowWarp, bf16, 1;
            engram_gate_bwd_rowwarp_bf16_r2: BwdRowWarp, bf16, 2;
            engram_gate_bwd_rowwarp_bf16_r3: BwdRowWarp, bf16, 3;
            engram_gate_bwd_rowwarp_bf16_r4: BwdRowWarp, bf16, 4;
            engram_gate_bwd_rowwarp_f16_r1: BwdRowWarp, f16, 1;
            engram_gate_bwd_rowwarp_f16_r2: BwdRowWarp, f16, 2;
            engram_gate_bwd_rowwarp_f16_r3: BwdRowWarp, f16, 3;
            engram_gate_bwd_rowwarp_f16_r4: BwdRowWarp, f16, 4;
            engram_gate_bwd_stream_vec8_bf16: BwdStreamVec8, bf16, 0;
            engram_gate_bwd_stream_scalar_bf16: BwdStreamScalar, bf16, 0;
            engram_gate_bwd_stream_vec8_f16: BwdStreamVec8, f16, 0;
            engram_gate_bwd_stream_scalar_f16: BwdStreamScalar, f16, 0;
            engram_gate_bwd_reduce: BwdReduceScalar, f32, 0;
            engram_gate_bwd_reduce_vec4: BwdReduceVec4, f32, 0;
        }
    };
}
