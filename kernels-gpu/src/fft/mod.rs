//! FFTC2CFwd kernels (SPEC.md §1).
