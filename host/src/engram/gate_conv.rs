//! EngramGateConvFwd / EngramGateConvBwd (SPEC.md §4–§5).

pub(crate) const KERNELS: &[&str] = &[];
