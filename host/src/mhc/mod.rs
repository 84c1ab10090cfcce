//! Manifold-constrained hyper-connections (mHC), SPEC.md §2–§3.
mod post;

pub use post::{post_fwd, post_fwd_raw, MhcPostShape};

/// PTX entries of this family.
pub(crate) const KERNELS: &[&str] = &[post::KERNEL_V8, post::KERNEL_ANY];
