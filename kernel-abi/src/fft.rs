//! FFTC2CFwd pass kernels.
