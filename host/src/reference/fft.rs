//! FFTC2CFwd (SPEC.md §1) reference.
