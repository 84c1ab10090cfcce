//! FFTC2CFwd kernels (docs/ops.md §1): batched power-of-two complex forward FFTs, c64 and c128.
//!
//! [`stockham`] is the general pass (shared-memory Stockham, one or two passes per plan);
//! [`dft`] the complex arithmetic and in-register butterflies it is built from, [`cx`] the
//! element loads and stores.
pub mod cx;
// The primitives the kernels use, as `super::prim`.
use crate::prim;

pub mod dft;
pub mod stockham;
