//! `rgk`: pure-Rust GPU kernels for NVIDIA GPUs (sm_90), launched from Rust through `cudarc`.
//!
//! Every kernel is written in Rust (the `#![no_std]` crate `kernels-gpu`, compiled to PTX by
//! the build script and embedded here). This crate loads that module once per [`Gpu`],
//! validates every call's shapes and buffer sizes before launching, and returns typed results.
//!
//! The operators and their formulas are defined in `docs/ops.md`:
//! - [`fft::FftPlan`] — FFTC2CFwd (§1), batched power-of-two complex forward FFT, c64/c128.
//! - [`mhc::MhcPre`] — MHCPreFwd (§2).
//! - [`mhc::post_fwd`] — MHCPostFwd (§3).
//! - [`engram::gate_conv_fwd`], [`engram::gate_conv_bwd`] — EngramGateConvFwd / EngramGateConvBwd (§4–§5).
//! - [`engram::EngramDecodePlan`] — EngramDecodeFwd (§6), seed contract and in-place ring step.
//!
//! Each op has a safe entry taking `cudarc` device buffers (slices or sub-views) and an
//! `unsafe` `*_raw` entry taking raw device pointers and a `CUstream`, for use from PyTorch,
//! candle or any CUDA code. The f64 CPU references that tests and the benchmark use are public
//! in [`reference`](mod@reference); tolerance checks in [`verify`].
//!
//! Each op takes an inputs struct and an outputs struct whose fields are the tensors of
//! `docs/ops.md` (any `cudarc` buffer or view fits a field); FFT buffers hold
//! [`Complex<f32>`] or [`Complex<f64>`] elements ([`fft`] moves and views them). Invalid input
//! is an [`Error`] whose [`Error::arg`] names the field or parameter.
//!
//! ```no_run
//! use rgk::{bf16, Gpu, mhc::{self, MhcPostInputs, MhcPostOutputs, MhcPostShape}};
//! # fn main() -> Result<(), rgk::Error> {
//! let gpu = Gpu::new(0)?;
//! let s = MhcPostShape { batch: 2, n: 4, c: 1920 };
//! let stream = gpu.stream();
//! let y = stream.clone_htod(&vec![bf16::from_f32(0.5); s.batch * s.c])?;
//! let h = stream.clone_htod(&vec![1.5f32; s.batch * s.n])?;
//! let r = stream.clone_htod(&vec![bf16::from_f32(0.25); s.batch * s.n * s.c])?;
//! let mut out = stream.alloc_zeros::<bf16>(s.batch * s.n * s.c)?;
//! let inputs = MhcPostInputs { x_layer_out: &y, h_post: &h, x_res: &r };
//! mhc::post_fwd(&gpu, s, inputs, MhcPostOutputs { x_out: &mut out })?;
//! let host: Vec<bf16> = stream.clone_dtoh(&out)?;
//! # Ok(()) }
//! ```

pub mod engram;
mod error;
pub mod fft;
pub mod mhc;
pub mod reference;
mod runtime;
pub mod verify;

pub use error::{Error, Result};
/// CUDA graphs each two-kernel plan keeps, one per set of buffers and parameters (tests).
#[doc(hidden)]
pub use runtime::GRAPH_CACHE;
pub use runtime::{cuda_available, Gpu, KERNELS_CUBIN, KERNELS_CUBIN_REPORT, KERNELS_PTX};
#[doc(hidden)]
pub use runtime::{LaunchDims, Planned};

/// Every op family and its PTX entry names; a [`Gpu`] looks up a family's functions on its
/// first launch.
pub(crate) const KERNEL_FAMILIES: &[(&str, &[&str])] = &[
    ("mhc_post", mhc::POST_KERNELS),
    ("mhc_pre", mhc::PRE_KERNELS),
    ("fft", fft::KERNELS),
    ("engram_gate_conv", engram::GATE_CONV_KERNELS),
    ("engram_decode", engram::DECODE_KERNELS),
];

/// Re-exports of the `cudarc`, `half` and `num-complex` types the API uses.
pub use cudarc;
pub use half::{bf16, f16};
pub use num_complex::{self, Complex};

// Plans and handles move between threads (a serving thread pool, PyTorch's autograd threads).
const _: fn() = || {
    fn send<T: Send>() {}
    send::<Gpu>();
    send::<fft::FftPlan>();
    send::<engram::EngramDecodePlan>();
    send::<engram::GateConvBwdPlan>();
    send::<mhc::MhcPre>();
};
