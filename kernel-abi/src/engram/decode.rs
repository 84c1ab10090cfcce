//! EngramDecodeFwd kernels (docs/ops.md §6): the projection launch (`engram_decode_*_project_*`)
//! and the finishing launch (`engram_decode_*_finish_*`) of one decode step, all taking
//! [`EngramDecodeArgs`]; the dynamic shared memory sizes both sides use.

kernel_args! {
    /// Every `engram_decode_*` entry (`{f16,bf16}` × `project_scalar`, `project_mma`,
    /// `project_mma_b8k16`, `finish_warp_{8,1}col_{shared,kv}`, `finish_block_{4,2,1}col`).
    /// Tensors are
    /// row-major and contiguous in the entry's 16-bit dtype, sizes as in docs/ops.md §6.
    ///
    /// Launch contract:
    /// - `project_*`: the projection launch, grid `(tiles, splits)`, block a multiple of 32
    ///   with `block ≥ 2^col_lanes_log2`; dynamic shared memory
    ///   [`decode_project_shared_bytes`]. The MMA entries (`d % 8 == 0`, every tensor 16-byte
    ///   aligned) take [`DECODE_MMA_TILE_COLS`]-column tiles and splits of a multiple of
    ///   [`DECODE_MMA_K_STEP`] rows per warp; `project_mma_b8k16` also needs `batch ≤ 8`,
    ///   `d_mem % 16 == 0` and a block of at least two warps.
    /// - `finish_warp_{8,1}col_{shared,kv}`: grid `(batch)`, any block ≥ 32, launched as a
    ///   programmatic dependent of the projection; `_shared` (the row staged in shared memory)
    ///   needs [`decode_finish_warp_shared_bytes`] of dynamic shared memory, `_kv` (the row
    ///   staged in `kv`) none. `8col` needs the 16-byte aligned layout.
    /// - `finish_block_{4,2,1}col`: grid `(batch)`, one thread per `E` columns (`E` = 4, 2, 1;
    ///   `d % E == 0`, inputs `2E`-byte aligned), [`DECODE_FINISH_BLOCK_SHARED_BYTES`] of
    ///   dynamic shared memory, launched as a programmatic dependent of the projection.
    pub struct EngramDecodeArgs / engram_decode_entry {
        /// `e_t [batch, d_mem]`.
        pub e_t: *const u16,
        /// `h_t [batch, d]`.
        pub h_t: *const u16,
        /// The state read: `[batch, max_conv_len, d]`, physical row `(pos + t) mod L` holds
        /// logical row `t` (0 = oldest). In the ring step the same buffer as `new_conv_state`.
        pub conv_state: *const u16,
        /// `W_K [d_mem, d]`.
        pub w_k: *const u16,
        /// `W_V [d_mem, d]`.
        pub w_v: *const u16,
        /// `rms_w_h [d]`.
        pub rms_w_h: *const u16,
        /// `rms_w_v [d]`.
        pub rms_w_v: *const u16,
        /// `conv_w [kernel_size, d]`.
        pub conv_w: *const u16,
        /// `y_t [batch, d]`.
        pub y_t: *mut u16,
        /// The state written: `q(u)` goes to physical row `write_row`; with `shift_state` the
        /// projection launch also copies rows `1..L` of `conv_state` to rows `0..L−1` here.
        pub new_conv_state: *mut u16,
        /// The split partials, f32 `[splits, batch, k|v, d]` (unread and may be 0 when
        /// `splits == 1`: the projection then writes `kv` directly).
        pub partials: *mut f32,
        /// The reduced projections, f32 `[batch, k|v, d]`: written by a one-split projection,
        /// read by the finish in that case, and the row staging of `finish_warp_*_kv`.
        pub kv: *mut f32,
        /// Test capture: when not null, the finish also writes `q(kk)` and `q(vh)` as
        /// `[2, batch, d]` in the entry's dtype (`EngramDecodePlan::intermediates`).
        pub intermediates: *mut u16,
        /// `B`.
        pub batch: u32,
        pub d_mem: u32,
        pub d: u32,
        /// `L`: rows of the state.
        pub max_conv_len: u32,
        /// `K`: conv taps (the newest is `u`, the other `K − 1` are state rows).
        pub kernel_size: u32,
        /// `δ`: steps between taps.
        pub dilation: u32,
        /// Physical state row of the oldest logical row (0 for the seed contract).
        pub pos: u32,
        /// Physical state row `q(u)` is written to (`L − 1` for the seed contract, `pos` for
        /// the ring step).
        pub write_row: u32,
        /// 1: the projection launch does the seed contract's state shift into
        /// `new_conv_state`; 0: no shift (ring step). Read by the projection entries only.
        pub shift_state: u32,
        /// Row splits of the projection (`grid.y`); the finish sums this many partials per
        /// element (from `kv` when 1).
        pub splits: u32,
        /// `W` rows per split (read by the projection entries only).
        pub rows_per_split: u32,
        /// log2 of the column lanes per block (read by `project_scalar` only).
        pub col_lanes_log2: u32,
        /// The rmsnorm epsilon.
        pub eps: f32,
    }
}

/// Columns of one MMA projection tile (`grid.x = ceil(d / 64)`).
pub const DECODE_MMA_TILE_COLS: u32 = 64;
/// `W` rows of one warp's MMA k-step (`m16n8k16`).
pub const DECODE_MMA_K_STEP: u32 = 16;
/// f32 of one warp's partials in shared memory in the MMA projections:
/// `[k|v][8 batch rows][64 columns]`.
pub const DECODE_MMA_WARP_SLAB_F32: u32 = 1024;
/// Dynamic shared memory of a `finish_block_*` launch: the 3-value block sum's slots (4 f32
/// per warp, up to 32 warps) then the 1-value block sum's (1 f32 per warp).
pub const DECODE_FINISH_BLOCK_SHARED_BYTES: u32 = (4 * 32 + 32) * 4;

/// Dynamic shared memory of a projection block of `block` threads, bytes: the MMA entries
/// one [`DECODE_MMA_WARP_SLAB_F32`] per warp, `project_scalar` (`vec` = 1 column per lane)
/// `2·vec` f32 per thread.
pub const fn decode_project_shared_bytes(block: u32, vec: u32, mma: bool) -> u32 {
    if mma {
        block / 32 * DECODE_MMA_WARP_SLAB_F32 * 4
    } else {
        block * 2 * vec * 4
    }
}

/// Dynamic shared memory of a `finish_warp_*_shared` launch, bytes: the row's `kk, vv` (`2·d`
/// f32).
pub const fn decode_finish_warp_shared_bytes(d: u32) -> u32 {
    2 * d * 4
}

/// The kernel column of [`decode_kernels!`](crate::decode_kernels): the decode step's kernel bodies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeKernel {
    /// The projection on CUDA-core FMAs, one column per lane.
    ProjectScalar,
    /// The projection on tensor cores, any batch, 8 columns per warp tile.
    ProjectMma,
    /// The projection on tensor cores for batch ≤ 8 and `d_mem % 16 == 0`.
    ProjectMmaB8K16,
    /// One block per batch row summing the split partials into shared memory, warp 0
    /// finishing the row.
    FinishWarpShared,
    /// As [`DecodeKernel::FinishWarpShared`], the partials summed into the `kv` workspace.
    FinishWarpKv,
    /// The whole block finishing the row.
    FinishBlock,
}

impl DecodeKernel {
    /// Whether a row of [`decode_kernels!`](crate::decode_kernels) instantiates this kernel validly: a 16-bit dtype,
    /// and the columns per lane or thread the body is written for (the projections fix theirs:
    /// 1 for the scalar one, 8 for the tensor-core ones; the warp finishers take 1 or 8, the
    /// block finisher 1, 2 or 4).
    pub const fn accepts(self, dtype: crate::Elem, cols: u32) -> bool {
        dtype.is_half()
            && match self {
                Self::ProjectScalar => cols == 1,
                Self::ProjectMma | Self::ProjectMmaB8K16 => cols == 8,
                Self::FinishWarpShared | Self::FinishWarpKv => cols == 1 || cols == 8,
                Self::FinishBlock => cols == 1 || cols == 2 || cols == 4,
            }
    }
}

impl DecodeKernel {
    /// One line: what the body does.
    pub const fn about(self) -> &'static str {
        match self {
            Self::ProjectScalar => "projection on CUDA-core FMAs, one column per lane",
            Self::ProjectMma => "projection on tensor cores, any batch, 8 columns per warp tile",
            Self::ProjectMmaB8K16 => "projection on tensor cores for batch <= 8 and d_mem % 16 == 0",
            Self::FinishWarpShared => "finish: partials summed into shared memory, warp 0 finishing the row",
            Self::FinishWarpKv => "finish: partials summed into the kv workspace, warp 0 finishing the row",
            Self::FinishBlock => "finish: the whole block finishing the row",
        }
    }
}

/// A decode-step kernel variant (a type of [`decode_policies`]).
pub trait DecodePolicy: crate::Policy {
    /// The kernel body.
    const KERNEL: DecodeKernel;
    /// The 16-bit element type.
    const ELEM: crate::Elem;
    /// Columns per lane or thread.
    const COLS: u32;
    /// Evaluates to `()`, or stops the build where [`DecodeKernel::accepts`] rejects the
    /// policy (every generated policy is checked; the error names the type).
    const VALID: () = assert!(
        Self::KERNEL.accepts(Self::ELEM, Self::COLS),
        "the decode policy's kernel does not take its dtype and cols"
    );
}

/// Declares the policy type of each row of [`decode_kernels!`](crate::decode_kernels),
/// rejecting at compile time a row its kernel does not accept.
macro_rules! decode_policy_types {
    ($($name:ident: $kind:ident, $dt:ident, $cols:literal;)*) => {
        $(policy_type!(
            $name,
            concat!("[`", stringify!($kind), "`](crate::DecodeKernel::", stringify!($kind), "), ", stringify!($dt), ", ", stringify!($cols), " columns."),
            $crate::DecodeKernel::$kind.about(),
            DecodePolicy {
                const KERNEL: $crate::DecodeKernel = $crate::DecodeKernel::$kind;
                const ELEM: $crate::Elem = $crate::elem!($dt);
                const COLS: u32 = $cols;
            }
        );)*
    };
}

/// The decode step's kernel variants, one type per row of
/// [`decode_kernels!`](crate::decode_kernels) (named after its PTX entry).
pub mod decode_policies {
    crate::decode_kernels!(decode_policy_types);
}

/// The decode kernels, one row per PTX entry: `name: kernel, dtype, cols;`. `kernel`: a
/// [`DecodeKernel`]; `cols`: columns per lane or thread. Each row is a type of
/// [`decode_policies`], checked against [`DecodeKernel::accepts`] at
/// compile time. Expands to `$cb! { rows }`: the device crate
/// declares each entry from it (`kernels-gpu/src/engram/decode.rs`), the host derives its entry
/// names from it (`host/src/engram/decode.rs`).
#[macro_export]
macro_rules! decode_kernels {
    ($cb:ident) => {
        $cb! {
            engram_decode_f16_project_scalar: ProjectScalar, f16, 1;
            engram_decode_bf16_project_scalar: ProjectScalar, bf16, 1;
            engram_decode_f16_project_mma: ProjectMma, f16, 8;
            engram_decode_bf16_project_mma: ProjectMma, bf16, 8;
            engram_decode_f16_project_mma_b8k16: ProjectMmaB8K16, f16, 8;
            engram_decode_bf16_project_mma_b8k16: ProjectMmaB8K16, bf16, 8;
            engram_decode_f16_finish_warp_8col_shared: FinishWarpShared, f16, 8;
            engram_decode_f16_finish_warp_8col_kv: FinishWarpKv, f16, 8;
            engram_decode_f16_finish_warp_1col_shared: FinishWarpShared, f16, 1;
            engram_decode_f16_finish_warp_1col_kv: FinishWarpKv, f16, 1;
            engram_decode_bf16_finish_warp_8col_shared: FinishWarpShared, bf16, 8;
            engram_decode_bf16_finish_warp_8col_kv: FinishWarpKv, bf16, 8;
            engram_decode_bf16_finish_warp_1col_shared: FinishWarpShared, bf16, 1;
            engram_decode_bf16_finish_warp_1col_kv: FinishWarpKv, bf16, 1;
            engram_decode_f16_finish_block_4col: FinishBlock, f16, 4;
            engram_decode_f16_finish_block_2col: FinishBlock, f16, 2;
            engram_decode_f16_finish_block_1col: FinishBlock, f16, 1;
            engram_decode_bf16_finish_block_4col: FinishBlock, bf16, 4;
            engram_decode_bf16_finish_block_2col: FinishBlock, bf16, 2;
            engram_decode_bf16_finish_block_1col: FinishBlock, bf16, 1;
        }
    };
}
