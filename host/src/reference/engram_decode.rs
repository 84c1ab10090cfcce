//! EngramDecodeFwd (SPEC.md §6) reference.
