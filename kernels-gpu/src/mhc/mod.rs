//! Manifold-constrained hyper-connections (mHC): SPEC.md §2 (pre) and §3 (post).
pub mod post;
pub mod pre;
