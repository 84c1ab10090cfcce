//! Per-op registrations: each op family adds its workloads here.
use crate::case::Workload;

pub mod mhc;

/// Every registered workload, in SPEC's table order.
pub fn registry() -> Vec<Workload> {
    let mut v = Vec::new();
    v.extend(mhc::workloads());
    v
}
