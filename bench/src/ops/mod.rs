//! Per-op registrations: each op family adds its workloads here.
use crate::case::Workload;

pub mod engram_decode;
pub mod engram_gate;
pub mod fft;
pub mod mhc;
pub mod mhc_post_pre;
pub mod mhc_pre;

/// Every registered workload, in the order of the seed table (docs/ops.md); `variants` adds each op's launch-config
/// variants (tuning rows).
pub fn registry(variants: bool) -> Vec<Workload> {
    let mut v = Vec::new();
    v.extend(fft::workloads(variants));
    v.extend(mhc_pre::workloads(variants));
    v.extend(mhc::workloads(variants));
    v.extend(mhc_post_pre::workloads(variants));
    v.extend(engram_gate::workloads(variants));
    v.extend(engram_decode::workloads(variants));
    v
}
