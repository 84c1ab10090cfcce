//! EngramGateConvFwd / EngramGateConvBwd kernels (SPEC.md §4–§5).
