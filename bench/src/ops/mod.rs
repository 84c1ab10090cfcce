//! Per-op registrations: each op family adds its workloads here.
use crate::case::Workload;

pub mod mhc;

/// Every registered workload, in SPEC's table order; `variants` adds each op's launch-config
/// variants (tuning rows).
pub fn registry(variants: bool) -> Vec<Workload> {
    let mut v = Vec::new();
    v.extend(mhc::workloads(variants));
    v
}
