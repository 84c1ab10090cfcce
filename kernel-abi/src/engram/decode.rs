//! EngramDecodeFwd kernels.
