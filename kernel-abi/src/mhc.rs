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
