//! mHC: MHCPostFwd's two kernels and MHCPreFwd's kernel pairs.

kernel_args! {
    /// `mhc_post_fwd_bf16`: the general MHCPostFwd kernel (any `n`, `c`, alignment), one
    /// element per thread over `total = batch·n·c`, grid-stride.
    pub struct PostAnyArgs / post_any_entry {
        pub x_layer_out: *const u16,
        pub h_post: *const f32,
        pub x_res: *const u16,
        pub x_out: *mut u16,
        pub n: u64,
        pub c: u64,
        pub total: u64,
    }
}

kernel_args! {
    /// `mhc_post_fwd_bf16_rows`: grid `(ceil(c/8/block), n, batch)`, 8 elements per thread;
    /// needs `c % 8 == 0` and 16-byte aligned `x_layer_out`, `x_res`, `x_out`.
    pub struct PostRowsArgs / post_rows_entry {
        pub x_layer_out: *const u16,
        pub h_post: *const f32,
        pub x_res: *const u16,
        pub x_out: *mut u16,
        pub n: u32,
        pub c: u32,
    }
}

/// MHCPostFwd's kernels, one row per PTX entry: `name: kernel, body, entry_macro;` (`Rows`:
/// 8 elements per thread on a `(chunks, n, batch)` grid, needs `c % 8 == 0` and 16-byte
/// alignment; `Any`: one element per thread, any shape). Expands to `$cb! { rows }` for the
/// device's entries and the host's names.
#[macro_export]
macro_rules! mhc_post_kernels {
    ($cb:ident) => {
        $cb! {
            mhc_post_fwd_bf16_rows: Rows, post_rows, post_rows_entry;
            mhc_post_fwd_bf16: Any, post_any, post_any_entry;
        }
    };
}

// ---------------------------------------------------------------- MHCPreFwd

/// Batch rows per group of `mhc_pre_partial_fma` (its register slab holds four rows).
pub const BT: u32 = 4;
/// Loads in flight per thread in kernel 1's split-K walk and staging, and the x elements per
/// thread of the `mhc_pre_mix` / `mhc_pre_mix_small_n` tile (the host sizes tiles so that
/// `n·jt ≤ UN·block`).
pub const UN: u32 = 8;
/// Batch rows per group of the slab kernels 1 (one x tile in shared memory per group).
pub const BTF: u32 = 8;
/// Largest n of the slab kernels 1 and of `mhc_pre_mix_small_n` /
/// `mhc_pre_mix_fixed_point` (one warp holds a padded 4×4 R, one element per lane).
pub const NMAX_SMALL_N: u32 = 4;
/// Kernel 2's block for n ≤ 4 with stored partials (`mhc_pre_mix_small_n`; the fixed-point
/// kernel 2 takes 128, the host planner's choice); also the thread count whose order kernel 1's
/// row blocks follow for Σx², so that the fused op's outputs have MHCPreFwd's bits.
pub const MIX_BLOCK_SMALL_N: u32 = 256;
/// Least dynamic shared memory of the fixed-point kernel 1, bytes: its row blocks' warp sums of
/// Σx² (one f64 per warp of [`MIX_BLOCK_SMALL_N`] threads) share the slab's memory.
pub const ROW_BLOCK_SMEM: u32 = 8 * (MIX_BLOCK_SMALL_N / 32);
/// Bytes of `mhc_pre_mix_small_n`'s shared memory before its x tile (`tot[32]` f64, `hs[4]`
/// f32, `ra[16]` f32, padded).
pub const MIX_SMALL_N_SMEM_HEAD: u32 = 336;
/// Limbs per (batch row, logit) accumulator of the fixed-point pair: limb `k` holds bits
/// `[48k − 64, 48k − 16)` of `|partial|`, each a signed 64-bit sum over the kernel-1 blocks.
pub const ACC_LIMBS: u32 = 4;
/// u64 words per accumulator: the [`ACC_LIMBS`] limbs, then a count of partials that were not
/// finite or not below 2^128 (the logit is then NaN).
pub const ACC_WORDS: u32 = ACC_LIMBS + 1;
/// Copies of the accumulators per epoch half in the `…_acc2` fixed-point kernels (the others
/// keep one): kernel-1 block `g` adds into copy `g mod 2` and kernel 2 sums the copies, integers,
/// so the sum has the bits of one copy while each accumulator line takes half the limb adds.
pub const ACC_COPIES_MAX: u32 = 2;

/// The u64 word of `part_ws` that holds word `k < ACC_WORDS` of copy `copy < copies` of the
/// fixed-point accumulator `acc = β·m + q` (batch row β, logit q, `m` logits per row) in epoch
/// half `half`, with `accs = batch·m` accumulators: `((half·copies + copy)·ACC_WORDS + k)·accs + acc`. Word-major, so
/// that kernel 2's load of one word for a warp's logits reads 2 lines (24 consecutive words)
/// rather than 8 (a stride of ACC_WORDS): MHCPreFwd −0.06…−0.16 µs at the seed shapes against
/// the accumulator-major layout (same device call, outputs bitwise equal).
pub const fn acc_word(half: u32, copy: u32, k: u32, acc: u32, copies: u32, accs: u32) -> u32 {
    ((half * copies + copy) * ACC_WORDS + k) * accs + acc
}
/// f64 words per batch row after the fixed-point pair's epoch word: the logit scales
/// `alpha_pre/r`, `alpha_post/r`, `alpha_res/r` that kernel 1's row block of the row stores.
pub const ROW_SCALES: u32 = 3;

/// The magic of the kernels' division by a divisor fixed per launch: `⌊2^32/d⌋ + 1`, with which
/// `(a·magic) >> 32 = a / d` exactly for every `a, d ≤ 2^16` (the error
/// `a·(magic − 2^32/d)/2^32 < 2^-16 ≤ 1/d`). `d ≥ 1`.
pub const fn fastdiv_magic(d: u32) -> u64 {
    (1u64 << 32) / d as u64 + 1
}

/// `mhc_pre_mix_fixed_point`'s dynamic shared memory as launched, bytes: 256 + 8 per thread,
/// none of which the kernel touches (the measured launch configuration; it had held the Σx²
/// pass's warp sums before kernel 1's row blocks took that pass over).
pub const fn mix_fixed_point_smem(block: u32) -> u32 {
    256 + 8 * block
}

kernel_args! {
    /// `mhc_pre_partial_fma` (kernel 1 on FMA pipes, any n): grid `(G, 1, 1)`, block `(T, 1,
    /// 1)`. Block `b` walks its split-K slice of the `n·c` reduction for batch groups of `bg`
    /// rows in column chunks of `jc`, and stores the f64 partials
    /// `part_ws[b, β, q]` (`q < n²+2n` logits, `q = n²+2n` the Σx²). Requires
    /// `batch·(m+1)·G < 2^31`, `bg ≤ BT`, `jc ≤ cols`, `bg·n·jc ≤ 2^16`.
    pub struct PrePartialFmaArgs / pre_partial_fma_entry {
        pub phi: *const f32,
        pub x: *const u16,
        pub part_ws: *mut f64,
        pub batch: u32,
        pub n: u32,
        pub c: u32,
        /// Columns of `n·c` per block (the split-K slice).
        pub cols: u32,
        /// Columns per staged chunk.
        pub jc: u32,
        /// Batch rows per group (≤ [`BT`]).
        pub bg: u32,
        pub ngroups: u32,
        /// Full `jc` chunks per block slice.
        pub njc_full: u32,
        /// Logit columns handled per pass, `min(m + 1, block)`.
        pub mc: u32,
        /// [`fastdiv_magic`] of `mc`.
        pub mc_magic: u64,
        /// [`fastdiv_magic`] of `jc`.
        pub jc_magic: u64,
    }
}

kernel_args! {
    /// `mhc_pre_partial_slab`, `mhc_pre_partial_slab_fixed_point` and its `_acc2` twin (two
    /// accumulator copies per half, [`ACC_COPIES_MAX`]) (kernel 1 from a phi slab in
    /// shared memory, f32 FMAs, n ≤ [`NMAX_SMALL_N`]): grid `(G, groups)`, block `(T, 1, 1)`; block `g` owns the
    /// channel columns `[g·cw, min((g+1)·cw, c))` of every batch row of its group of `bpc`
    /// rows. The plain kernel stores f64 partials to `part_ws`; the fixed-point kernel adds them
    /// as [`ACC_LIMBS`] integer limbs into the accumulators (see `pre_fwd_raw`'s workspace).
    pub struct PrePartialSlabArgs / pre_partial_slab_entry {
        pub phi: *const f32,
        pub x: *const u16,
        pub part_ws: *mut f64,
        pub batch: u32,
        pub n: u32,
        pub c: u32,
        /// Channel columns per block.
        pub cw: u32,
        /// Batch rows per group (a multiple of [`BTF`]).
        pub bpc: u32,
        /// The fixed-point kernel's row blocks (grid `(G + bpc, groups)`: block `G + i` takes
        /// batch row i of its group) store the row's three logit scales `alpha/r` (f64) at
        /// u64 words `2·copies·batch·m·ACC_WORDS + 1 + 3β ..` of `part_ws` (`copies`: 2 in the
        /// `_acc2` kernel, [`ACC_COPIES_MAX`], else 1; [`acc_word`]); unused by the plain kernel.
        pub alpha_pre: f32,
        pub alpha_post: f32,
        pub alpha_res: f32,
        pub inv_sqrt_nc: f64,
    }
}

kernel_args! {
    /// `mhc_pre_mix` (any n) and `mhc_pre_mix_small_n` (n ≤ [`NMAX_SMALL_N`]): kernel 2,
    /// launched as a programmatic dependent of kernel 1. Grid `(batch·tiles, 1, 1)`, block
    /// `(T, 1, 1)`; block `b` handles batch row `β = b / tiles` and the columns
    /// `[tile·jt, min((tile+1)·jt, c))`. Requires `n·jt ≤ UN·T`, `jt ≤ 2^16`.
    pub struct PreMixArgs / pre_mix_entry {
        pub x: *const u16,
        pub bias: *const f32,
        pub part_ws: *const f64,
        pub x_res: *mut u16,
        pub x_layer: *mut u16,
        pub h_post: *mut f32,
        pub n: u32,
        pub c: u32,
        /// Kernel 1's grid `G` (partials per batch row and logit).
        pub grid1: u32,
        pub tiles: u32,
        /// Columns per tile.
        pub jt: u32,
        /// [`fastdiv_magic`] of `jt`.
        pub jt_magic: u64,
        /// [`fastdiv_magic`] of the last tile's width.
        pub jl_magic: u64,
        /// `log2` of the reduction slices of `mhc_pre_mix`, `(m+1)·2^ls ≤ max(T, m+1)` (unused
        /// by `mhc_pre_mix_small_n`).
        pub ls: u32,
        pub alpha_pre: f32,
        pub alpha_post: f32,
        pub alpha_res: f32,
        /// Sinkhorn iterations.
        pub repeat: u32,
        /// Sinkhorn epsilon.
        pub eps: f32,
        /// `1/√(n·c)`.
        pub inv_sqrt_nc: f64,
    }
}

kernel_args! {
    /// `mhc_pre_mix_fixed_point` and its `_acc2` twin (kernel 2 of the fixed-point pair, n ≤
    /// [`NMAX_SMALL_N`]), launched as a programmatic dependent of kernel 1: grid `(tiles,
    /// batch)`, block `(T, 1, 1)`, dynamic shared memory [`mix_fixed_point_smem`]`(T)`. Reads and
    /// adds the accumulators of both halves of `part_ws` (this call's sums, and the half kernel 1
    /// zeroed), every copy ([`acc_word`]), and the row's logit scales that kernel 1's row blocks
    /// stored; block (0, 0) flips the epoch.
    pub struct PreMixFixedPointArgs / pre_mix_fixed_point_entry {
        pub x: *const u16,
        pub bias: *const f32,
        pub part_ws: *const f64,
        pub x_res: *mut u16,
        pub x_layer: *mut u16,
        pub h_post: *mut f32,
        pub batch: u32,
        pub n: u32,
        pub c: u32,
        /// Unused by the kernel (kernel 1's grid; the accumulators need no partial count).
        pub grid1: u32,
        pub repeat: u32,
        pub eps: f32,
    }
}

kernel_args! {
    /// `mhc_post_pre_partial_slab_fixed_point` and its `_acc2` twin: kernel 1 of the fused
    /// post→pre op (MHCPostPreFwd),
    /// [`PrePartialSlabArgs`]'s kernel with `x` computed from the post half's inputs,
    /// `x[β, k·c + j] = q(h_post_in[β, k]·x_layer_out[β, j] + x_res_in[β, k·c + j])`, and
    /// written to `x_out` where that is not null (each element by the block that stages it).
    /// Grid `(⌈c/cw⌉ + bpc, groups)`: the last `bpc` blocks of each group are row blocks, one per
    /// batch row of the group, each summing its row's Σx² and storing the row's three logit
    /// scales `alpha/r` (f64) at u64 words `2·copies·batch·m·ACC_WORDS + 1 + 3β ..` of `part_ws`
    /// (`copies`: 2 in the `_acc2` kernel, [`ACC_COPIES_MAX`], else 1; [`acc_word`]).
    pub struct PostPrePartialArgs / post_pre_partial_entry {
        pub phi: *const f32,
        pub x_layer_out: *const u16,
        pub h_post_in: *const f32,
        pub x_res_in: *const u16,
        /// Null: x_out is not written.
        pub x_out: *mut u16,
        pub part_ws: *mut f64,
        pub batch: u32,
        pub n: u32,
        pub c: u32,
        pub cw: u32,
        pub bpc: u32,
        pub alpha_pre: f32,
        pub alpha_post: f32,
        pub alpha_res: f32,
        pub inv_sqrt_nc: f64,
    }
}

kernel_args! {
    /// `mhc_post_pre_mix_fixed_point` and its `_acc2` twin: kernel 2 of the fused post→pre op, [`PreMixFixedPointArgs`]'s
    /// kernel with `x` computed from the post half's inputs as in [`PostPrePartialArgs`].
    pub struct PostPreMixArgs / post_pre_mix_entry {
        pub x_layer_out: *const u16,
        pub h_post_in: *const f32,
        pub x_res_in: *const u16,
        pub bias: *const f32,
        pub part_ws: *const f64,
        pub x_res: *mut u16,
        pub x_layer: *mut u16,
        pub h_post: *mut f32,
        pub batch: u32,
        pub n: u32,
        pub c: u32,
        pub repeat: u32,
        pub eps: f32,
    }
}

/// MHCPreFwd's kernels, one row per PTX entry: `name: kernel, body, entry_macro;` (`body`: the
/// device function the entry runs; `entry_macro`: the argument struct's entry macro). Kernel 1
/// (split-K partials of the logits and Σx²): `PartialFma` (FMA pipes, any n), `PartialSlab`
/// (phi slab in shared memory, f32 FMAs, n ≤ 4), `PartialSlabFixedPoint` (the same, accumulating integer limbs);
/// kernel 2 (coefficients and mixing): `Mix` (any n), `MixSmallN` (coefficients in registers,
/// n ≤ 4), `MixFixedPoint` (reads the limb accumulators); `PostPre…`: the fixed-point pair of
/// the fused post→pre op (MHCPostPreFwd), x computed from the post half's inputs. Expands to `$cb! { rows }`: the device
/// crate declares each entry from it, the host names its kernels from it.
#[macro_export]
macro_rules! mhc_pre_kernels {
    ($cb:ident) => {
        $cb! {
            mhc_pre_partial_fma: PartialFma, partial_fma, pre_partial_fma_entry;
            mhc_pre_partial_slab: PartialSlab, partial_slab, pre_partial_slab_entry;
            mhc_pre_partial_slab_fixed_point: PartialSlabFixedPoint, partial_slab_fixed_point, pre_partial_slab_entry;
            mhc_pre_partial_slab_fixed_point_acc2: PartialSlabFixedPointAcc2, partial_slab_fixed_point_acc2, pre_partial_slab_entry;
            mhc_pre_mix: Mix, mix, pre_mix_entry;
            mhc_pre_mix_small_n: MixSmallN, mix_small_n, pre_mix_entry;
            mhc_pre_mix_fixed_point: MixFixedPoint, mix_fixed_point, pre_mix_fixed_point_entry;
            mhc_pre_mix_fixed_point_acc2: MixFixedPointAcc2, mix_fixed_point_acc2, pre_mix_fixed_point_entry;
            mhc_post_pre_partial_slab_fixed_point: PostPrePartialSlabFixedPoint, post_pre_partial_slab_fixed_point, post_pre_partial_entry;
            mhc_post_pre_partial_slab_fixed_point_acc2: PostPrePartialSlabFixedPointAcc2, post_pre_partial_slab_fixed_point_acc2, post_pre_partial_entry;
            mhc_post_pre_mix_fixed_point: PostPreMixFixedPoint, post_pre_mix_fixed_point, post_pre_mix_entry;
            mhc_post_pre_mix_fixed_point_acc2: PostPreMixFixedPointAcc2, post_pre_mix_fixed_point_acc2, post_pre_mix_entry;
        }
    };
}
