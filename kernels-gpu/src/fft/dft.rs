//! Complex arithmetic and the in-register power-of-two DFTs (radix 2..32) used as Stockham
//! butterflies, generic over f32 (c64) and f64 (c128).

use core::ops::{Add, Mul, Neg, Sub};

/// `unroll!(N, i, { body })`: the body for `i = 0, 1, ..., N-1` (N ≤ 32 a constant
/// expression), expanded textually so every index into a register array is a constant (LLVM's
/// unroller does not always fully unroll these loops, and a dynamic index sends the array to
/// local memory).
macro_rules! unroll {
    ($n:expr, $i:ident, $body:block) => {
        unroll!(@ $n, $i, $body; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31)
    };
    (@ $n:expr, $i:ident, $body:block; $($k:literal)*) => {
        $( if $k < $n { let $i: usize = $k; $body } )*
    };
}
pub(crate) use unroll;

/// A real scalar of a complex storage type (f32 for c64, f64 for c128).
pub trait Real: Copy + Add<Output = Self> + Sub<Output = Self> + Mul<Output = Self> + Neg<Output = Self> {
    const ZERO: Self;
    /// Rounds an f64 constant to this type (folded at compile time for literals).
    fn from_f64(v: f64) -> Self;
    /// The complex product `(ar + i·ai)(br + i·bi)` as `(re, im)`. In f32 one product is
    /// rounded and each part ends in a fused multiply-add: four instructions instead of six,
    /// and a normwise error bound of 2u instead of √5·u. f64 keeps the unfused form, as the
    /// fused one measured slower there (docs/decisions/fft.md).
    fn cmul(ar: Self, ai: Self, br: Self, bi: Self) -> (Self, Self);
}

impl Real for f32 {
    const ZERO: Self = 0.0;
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    #[inline(always)]
    fn cmul(ar: Self, ai: Self, br: Self, bi: Self) -> (Self, Self) {
        (super::prim::fma(ar, br, -(ai * bi)), super::prim::fma(ar, bi, ai * br))
    }
}

impl Real for f64 {
    const ZERO: Self = 0.0;
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v
    }
    #[inline(always)]
    fn cmul(ar: Self, ai: Self, br: Self, bi: Self) -> (Self, Self) {
        (ar * br - ai * bi, ar * bi + ai * br)
    }
}

/// Interleaved complex value: `re`, then `im`.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct Cx<T> {
    pub re: T,
    pub im: T,
}

impl<T: Real> Cx<T> {
    #[inline(always)]
    pub fn zero() -> Self {
        Cx { re: T::ZERO, im: T::ZERO }
    }
    #[inline(always)]
    pub fn cadd(self, o: Self) -> Self {
        Cx { re: self.re + o.re, im: self.im + o.im }
    }
    #[inline(always)]
    pub fn csub(self, o: Self) -> Self {
        Cx { re: self.re - o.re, im: self.im - o.im }
    }
    #[inline(always)]
    pub fn cmul(self, o: Self) -> Self {
        let (re, im) = T::cmul(self.re, self.im, o.re, o.im);
        Cx { re, im }
    }
    /// `self · (-i)`.
    #[inline(always)]
    pub fn mul_neg_i(self) -> Self {
        Cx { re: self.im, im: -self.re }
    }
}

/// cos(πk/16) for k = 0..=8 (correctly rounded f64 literals).
const C16: [f64; 9] = [
    1.0,
    0.980_785_280_403_230_4,
    0.923_879_532_511_286_7,
    0.831_469_612_302_545_2,
    core::f64::consts::FRAC_1_SQRT_2,
    0.555_570_233_019_602_2,
    0.382_683_432_365_089_8,
    0.195_090_322_016_128_27,
    0.0,
];

/// `x · W_N^i` with `W_N = exp(-2πi/N)`, `N ≤ 32` a power of two and `i < N/2` compile-time
/// constants after inlining: exact for the multiples of π/2, one scaled add for ±π/4.
#[inline(always)]
pub fn twc<T: Real>(x: Cx<T>, i: usize, n: usize) -> Cx<T> {
    let k = i * (32 / n); // the angle in units of 2π/32 = π/16, k < 16
    match k {
        0 => x,
        8 => x.mul_neg_i(),
        4 => {
            let s = T::from_f64(C16[4]);
            Cx { re: (x.re + x.im) * s, im: (x.im - x.re) * s }
        }
        12 => {
            let s = T::from_f64(C16[4]);
            Cx { re: (x.im - x.re) * s, im: -(x.re + x.im) * s }
        }
        _ => {
            let (c, s) = if k <= 8 { (C16[k], C16[8 - k]) } else { (-C16[16 - k], C16[k - 8]) };
            // W = cos - i·sin
            x.cmul(Cx { re: T::from_f64(c), im: T::from_f64(-s) })
        }
    }
}

#[inline(always)]
fn dft1<T: Real>(_a: &mut [Cx<T>; 1]) {}

macro_rules! dft_fn {
    ($name:ident, $half:ident, $n:literal) => {
        /// In-register forward DFT of the array, natural order in and out (one radix-2 DIF
        /// level, two half-size DFTs, interleave).
        #[inline(always)]
        pub fn $name<T: Real>(a: &mut [Cx<T>; $n]) {
            let mut lo = [Cx::<T>::zero(); $n / 2];
            let mut hi = [Cx::<T>::zero(); $n / 2];
            unroll!($n / 2, i, {
                let x = a[i];
                let y = a[i + $n / 2];
                lo[i] = x.cadd(y);
                hi[i] = twc(x.csub(y), i, $n);
            });
            $half(&mut lo);
            $half(&mut hi);
            unroll!($n / 2, k, {
                a[2 * k] = lo[k];
                a[2 * k + 1] = hi[k];
            });
        }
    };
}
dft_fn!(dft2, dft1, 2);
dft_fn!(dft4, dft2, 4);
dft_fn!(dft8, dft4, 8);
dft_fn!(dft16, dft8, 16);
dft_fn!(dft32, dft16, 32);

/// The forward DFT of `R` (1, 2, 4, ..., 32) values in registers.
#[inline(always)]
pub fn dft<T: Real, const R: usize>(a: &mut [Cx<T>; R]) {
    // SAFETY: each cast is to an array of exactly R elements.
    unsafe {
        match R {
            2 => dft2(&mut *(a as *mut _ as *mut [Cx<T>; 2])),
            4 => dft4(&mut *(a as *mut _ as *mut [Cx<T>; 4])),
            8 => dft8(&mut *(a as *mut _ as *mut [Cx<T>; 8])),
            16 => dft16(&mut *(a as *mut _ as *mut [Cx<T>; 16])),
            32 => dft32(&mut *(a as *mut _ as *mut [Cx<T>; 32])),
            _ => {}
        }
    }
}
