//! EngramGateConvFwd / EngramGateConvBwd (SPEC.md §4–§5) reference.
