//! The one error type of the library.
use cudarc::driver::DriverError;

/// Everything a call can fail with. Invalid input is reported before any launch and names the
/// offending argument.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No usable CUDA driver or device (the library needs an NVIDIA GPU to run kernels).
    #[error("no CUDA device: {0}")]
    NoDevice(String),
    /// An argument's shape or a size parameter is invalid.
    #[error("invalid `{arg}`: {msg}")]
    Shape { arg: &'static str, msg: String },
    /// A buffer holds fewer elements than the shape needs.
    #[error("buffer `{arg}` too small: needs {needed} elements, has {got}")]
    BufferTooSmall { arg: &'static str, needed: usize, got: usize },
    /// A size computation overflowed `usize` (or the kernel's index type).
    #[error("`{arg}`: size overflow ({msg})")]
    Overflow { arg: &'static str, msg: String },
    /// An error from the CUDA driver (launch failure, out of memory, ...).
    #[error("CUDA driver: {0}")]
    Driver(#[from] DriverError),
    /// A kernel missing from the embedded PTX module (a build problem).
    #[error("kernel `{0}` not found in the PTX module")]
    MissingKernel(String),
}

impl Error {
    /// The argument an invalid-input error names (a parameter or buffer name of `docs/ops.md`,
    /// as the field of the op's inputs/outputs struct); `None` for driver and device errors.
    ///
    /// ```
    /// let e = rgk::Error::BufferTooSmall { arg: "x_res", needed: 8, got: 4 };
    /// assert_eq!(e.arg(), Some("x_res"));
    /// assert_eq!(rgk::Error::NoDevice("no driver".into()).arg(), None);
    /// ```
    pub fn arg(&self) -> Option<&'static str> {
        match self {
            Error::Shape { arg, .. } | Error::BufferTooSmall { arg, .. } | Error::Overflow { arg, .. } => Some(arg),
            Error::NoDevice(_) | Error::Driver(_) | Error::MissingKernel(_) => None,
        }
    }
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Checks that a buffer of `got` elements holds `needed`.
pub(crate) fn check_len(arg: &'static str, needed: usize, got: usize) -> Result<()> {
    if got < needed {
        return Err(Error::BufferTooSmall { arg, needed, got });
    }
    Ok(())
}

/// Checks a size parameter is at least 1.
pub(crate) fn check_positive(arg: &'static str, v: usize) -> Result<()> {
    if v == 0 {
        return Err(Error::Shape { arg, msg: "must be at least 1".into() });
    }
    Ok(())
}

/// `a·b·…` with overflow reported against `arg`.
pub(crate) fn checked_product(arg: &'static str, dims: &[usize]) -> Result<usize> {
    dims.iter().try_fold(1usize, |acc, &d| {
        acc.checked_mul(d).ok_or_else(|| Error::Overflow { arg, msg: format!("product of {dims:?}") })
    })
}
