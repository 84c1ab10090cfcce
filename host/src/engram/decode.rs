//! EngramDecodeFwd (SPEC.md §6).

pub(crate) const KERNELS: &[&str] = &[];
