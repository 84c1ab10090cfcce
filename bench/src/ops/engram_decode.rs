//! Bench workloads of this op (SPEC.md table).
use crate::case::Workload;

/// The seed's workloads; `variants` adds launch-configuration variants (tuning rows).
pub fn workloads(_variants: bool) -> Vec<Workload> {
    Vec::new()
}
