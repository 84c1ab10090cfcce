//! MHCPreFwd (SPEC.md §2).

pub(crate) const KERNELS: &[&str] = &[];
