//! MHCPreFwd kernel (SPEC.md §2).
