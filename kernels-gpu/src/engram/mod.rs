//! Engram kernels: gated causal conv forward/backward (docs/ops.md §4–§5), decode step (§6).
pub mod decode;
pub mod gate_conv;
