//! MHCPostFwd (docs/ops.md §3):
//! `x_out[β, i·c + j] = q(h_post[β, i] · x_layer_out[β, j] + x_res[β, i·c + j])`, bf16 out.
//!
//! Pure streaming: each output element reads one `x_res` element, one `x_layer_out` element
//! (re-read n times, from L1/L2) and one `h_post` scalar. The arithmetic is one f32 FMA, then
//! round-to-nearest-even to bf16.

use crate::prim::*;
use kernel_abi::{PostAnyArgs, PostRowsArgs};

/// The PTX entries: one per row of `kernel_abi::mhc_post_kernels!` (the list the host names its
/// kernels from).
macro_rules! post_entries {
    ($($name:ident: $kind:ident, $body:ident, $entry:ident;)*) => {
        $(kernel_abi::$entry!($name, a => { $body(a) });)*
    };
}
kernel_abi::mhc_post_kernels!(post_entries);

/// General path: any `n`, `c`, alignment and size; one element per thread, grid-stride loop.
#[inline(always)]
unsafe fn post_any(a: PostAnyArgs) {
    let PostAnyArgs { x_layer_out, h_post, x_res, x_out: out, n, c, total } = a;
    let stride = (grid_dim_x() * block_dim_x()) as u64;
    let mut e = (block_idx_x() * block_dim_x() + thread_idx_x()) as u64;
    let row = n * c;
    while e < total {
        let beta = e / row;
        let r = e - beta * row;
        let i = r / c;
        let j = r - i * c;
        let xr = bf16_to_f32(*x_res.add(e as usize));
        let y = bf16_to_f32(*x_layer_out.add((beta * c + j) as usize));
        let h = *h_post.add((beta * n + i) as usize);
        *out.add(e as usize) = post_elem(h, y, xr);
        e += stride;
    }
}

/// One output element: `q(h·y + xr)`, one f32 FMA.
#[inline(always)]
pub(crate) fn post_elem(h: f32, y: f32, xr: f32) -> u16 {
    f32_to_bf16(fma(h, y, xr))
}

/// 8 elements of one x_res row, with `h` and 8 elements of `x_layer_out`: one FMA each (also
/// the fused post→pre op's x, `pre::XSrc`: the same bits as this op's output).
#[inline(always)]
pub(crate) unsafe fn fma8(h: f32, y: [u32; 4], xr: [u32; 4]) -> [u32; 4] {
    let mut o = [0u32; 4];
    let mut k = 0;
    while k < 4 {
        let (r0, r1) = bf16x2_to_f32(xr[k]);
        let (y0, y1) = bf16x2_to_f32(y[k]);
        o[k] = f32_to_bf16x2(fma(h, y0, r0), fma(h, y1, r1));
        k += 1;
    }
    o
}

/// Vectorised path, division-free 3-D grid: `blockIdx.z = β`, `blockIdx.y = i`, x over the `c/8` chunks of one
/// row. Requires `c % 8 == 0` and 16-byte aligned pointers.
#[inline(always)]
unsafe fn post_rows(a: PostRowsArgs) {
    let PostRowsArgs { x_layer_out, h_post, x_res, x_out: out, n, c } = a;
    let j = (block_idx_x() * block_dim_x() + thread_idx_x()) * 8;
    if j >= c {
        return;
    }
    let (i, beta) = (block_idx_y(), block_idx_z());
    let row = beta * n + i;
    let e = (row * c + j) as usize;
    let xr = ld_nc_v4(x_res.add(e) as *const u32);
    let y = ld_nc_v4(x_layer_out.add((beta * c + j) as usize) as *const u32);
    let h = *h_post.add(row as usize);
    st_v4(out.add(e) as *mut u32, fma8(h, y, xr));
}
