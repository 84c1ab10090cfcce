//! f64 CPU references of every op, used by the tests and the benchmark.
//!
//! Each returns the exact-as-f64 value of the formula (before the final rounding `q` to the
//! storage dtype) and, per element, the magnitude `Σ|terms|` of the sum that formed it: the
//! `slack` of SPEC.md "Tolerances" is `2^-16 · magnitude`.
use half::bf16;

use crate::mhc::MhcPostShape;

/// A reference output: the value of each element and the magnitude of its summed terms.
#[derive(Clone, Debug, Default)]
pub struct RefOutput {
    pub value: Vec<f64>,
    pub magnitude: Vec<f64>,
}

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
