//! Manifold-constrained hyper-connections (mHC): docs/ops.md §2 (pre) and §3 (post).
pub mod post;
pub mod pre;
