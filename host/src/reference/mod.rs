//! f64 CPU references of every op, used by the tests and the benchmark.
//!
//! Each returns the exact-as-f64 value of the formula (before the final rounding `q` to the
//! storage dtype) and, per element, the magnitude `Σ|terms|` of the sum that formed it: the
//! `slack` of docs/ops.md "Tolerances" is `2^-16 · magnitude`.

/// A reference output: the value of each element and the magnitude of its summed terms.
#[derive(Clone, Debug, Default)]
pub struct RefOutput {
    pub value: Vec<f64>,
    pub magnitude: Vec<f64>,
}

mod engram_decode;
mod engram_gate;
mod fft;
mod mhc;

#[allow(unused_imports)]
pub use engram_decode::*;
#[allow(unused_imports)]
pub use engram_gate::*;
#[allow(unused_imports)]
pub use fft::*;
pub use mhc::*;
