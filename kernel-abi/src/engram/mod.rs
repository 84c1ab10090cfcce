//! Engram: the gated causal conv (forward, backward) and the decode step.
pub mod decode;
pub mod gate;
