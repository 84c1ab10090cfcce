//! EngramDecodeFwd kernel (SPEC.md §6).
