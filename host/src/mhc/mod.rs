//! Manifold-constrained hyper-connections (mHC), docs/ops.md §2–§3.
mod post;
mod pre;

pub use post::{post_fwd, post_fwd_raw, post_fwd_raw_with, MhcPostShape, PostConfig};
pub use pre::{
    auto_mma_block, fastdiv_magic, fused_smem_bytes as pre_fused_smem_bytes, mix_smem_bytes as pre_mix_smem_bytes,
    partial_smem_bytes as pre_partial_smem_bytes, pre_fwd_raw, CoopGeometry, FusedGeometry, MhcPre, MhcPreLens,
    MhcPreParams, MhcPreShape, PreConfig, PreGeometry, PrePath, PrePlan, FX_WORDS, MIX5_STAMPS, MMA5_STAMPS,
};

/// PTX entries of MHCPostFwd.
pub(crate) const POST_KERNELS: &[&str] = &[post::KERNEL_ROWS, post::KERNEL_ANY];
/// PTX entries of MHCPreFwd.
pub(crate) const PRE_KERNELS: &[&str] = pre::KERNELS;
