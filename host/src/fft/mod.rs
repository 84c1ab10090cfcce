//! FFTC2CFwd: batched 1-D complex-to-complex forward FFT (SPEC.md §1).

/// PTX entries of the FFT.
pub(crate) const KERNELS: &[&str] = &[];
