//! Manifold-constrained hyper-connections (mHC), SPEC.md §2–§3.
mod post;

pub use post::{post_fwd, post_fwd_raw, post_fwd_raw_with, MhcPostShape, PostConfig, PostVariant};

/// PTX entries of this family.
pub(crate) const KERNELS: &[&str] =
    &[post::KERNEL_V8, post::KERNEL_ROWS, post::KERNEL_ROWS2, post::KERNEL_ROWS_L2, post::KERNEL_ANY];
