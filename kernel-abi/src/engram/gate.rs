//! EngramGateConvFwd / EngramGateConvBwd kernels.
