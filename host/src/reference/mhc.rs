//! mHC references (SPEC.md §2–§3).
use half::bf16;

use super::RefOutput;
use crate::mhc::MhcPostShape;

/// MHCPostFwd (SPEC.md §3): `h_post[β,i]·x_layer_out[β,j] + x_res[β,i·c+j]` in f64, for
/// `x_out` `[batch, n·c]`. Panics if a slice is shorter than `shape` needs (test helper).
pub fn mhc_post_fwd(shape: MhcPostShape, x_layer_out: &[bf16], h_post: &[f32], x_res: &[bf16]) -> RefOutput {
    let MhcPostShape { batch, n, c } = shape;
    let mut out = RefOutput { value: Vec::with_capacity(batch * n * c), magnitude: Vec::with_capacity(batch * n * c) };
    for b in 0..batch {
        for i in 0..n {
            let h = h_post[b * n + i] as f64;
            for j in 0..c {
                let p = h * x_layer_out[b * c + j].to_f64();
                let r = x_res[b * n * c + i * c + j].to_f64();
                out.value.push(p + r);
                out.magnitude.push(p.abs() + r.abs());
            }
        }
    }
    out
}
