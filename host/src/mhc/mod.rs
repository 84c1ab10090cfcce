//! Manifold-constrained hyper-connections (mHC), docs/ops.md §2–§3.
mod post;
mod post_pre;
mod pre;

use std::collections::BTreeSet;

pub use post::{post_fwd, post_fwd_raw, MhcPostInputs, MhcPostOutputs, MhcPostShape};
#[doc(hidden)]
pub use post::{post_fwd_plan, PostLaunch};
pub use post_pre::{MhcPostPre, MhcPostPreInputs, MhcPostPreOutputs};
pub use pre::{pre_fwd_raw, MhcPre, MhcPreInputs, MhcPreLens, MhcPreOutputs, MhcPreParams, MhcPreShape, PrePlan};

// Planner internals the tests and the bench inspect: not part of the API.
#[doc(hidden)]
pub use kernel_abi::mhc::fastdiv_magic;
#[doc(hidden)]
pub use post::PostKernel;
#[doc(hidden)]
pub use post_pre::post_pre_fwd_launches;
#[doc(hidden)]
pub use pre::{
    mix_smem_bytes as pre_mix_smem_bytes, partial_smem_bytes as pre_partial_smem_bytes,
    slab_batch_per_group as pre_slab_batch_per_group, slab_block as pre_slab_block, slab_fits as pre_slab_fits,
    slab_partial_smem_bytes as pre_slab_partial_smem_bytes, ColumnMix, FmaPartialGrid, Mix, Partials, PreClass,
    SlabPartialGrid, TileMix, ACC_WORDS, ROW_SCALES,
};
#[doc(hidden)]
pub use pre::{pre_fwd_launches, PreMixLaunch, PrePartialsLaunch};

use crate::{Gpu, Result};

/// PTX entries of MHCPostFwd.
pub(crate) const POST_KERNELS: &[&str] = post::KERNELS;
/// PTX entries of MHCPreFwd.
pub(crate) const PRE_KERNELS: &[&str] = pre::KERNELS;

/// Every PTX entry the mHC planners launch over a grid of valid shapes that reaches every row
/// of their tuning tables and every fallback (MHCPreFwd: each kernel pair, on `gpu`'s SM count
/// and shared memory, and MHCPostPreFwd's fused pair; MHCPostFwd: aligned and unaligned buffers, `c % 8` zero and not). Equal
/// to [`POST_KERNELS`] ∪ [`PRE_KERNELS`] when every shipped entry is reachable.
#[doc(hidden)]
pub fn planned_kernels(gpu: &Gpu) -> Result<BTreeSet<&'static str>> {
    let mut set = BTreeSet::new();
    for &s in pre::SWEEP_SHAPES {
        let plan = PrePlan::new(gpu, s)?;
        set.extend(plan.kernels());
        set.extend(post_pre::planned_kernels(&plan));
    }
    for (batch, n, c) in [(1, 4, 1280), (2, 4, 1920), (4, 4, 2560), (3, 3, 7), (70_000, 1, 8)] {
        for aligned in [true, false] {
            set.insert(PostKernel::plan(MhcPostShape { batch, n, c }, aligned)?.kernel());
        }
    }
    Ok(set)
}
