//! Manifold-constrained hyper-connections (mHC), SPEC.md §2–§3.
mod post;
mod pre;

pub use post::{post_fwd, post_fwd_raw, post_fwd_raw_with, MhcPostShape, PostConfig, PostVariant};

/// PTX entries of MHCPostFwd.
pub(crate) const POST_KERNELS: &[&str] =
    &[post::KERNEL_V8, post::KERNEL_ROWS, post::KERNEL_ROWS2, post::KERNEL_ROWS_L2, post::KERNEL_ANY];
/// PTX entries of MHCPreFwd.
pub(crate) const PRE_KERNELS: &[&str] = pre::KERNELS;
