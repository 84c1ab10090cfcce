//! The device layer: the only place with inline PTX and `core::arch::nvptx` calls.
//!
//! Thread and block indices, barriers, warp shuffles, f16/bf16 conversions, 16-byte vector
//! loads and stores, dynamic shared memory. Kernels call these and contain no `asm!`.
//!
//! Two backends with the same functions: [`nvptx`] (inline PTX, the GPU build) and, on every
//! other target, `cpu` (a software GPU: one coroutine per GPU thread, launched by
//! `cpu::launch`), which runs the kernels' own code on the host for tests. The functions below
//! are written in terms of the backend's and are shared by both.
#![allow(clippy::missing_safety_doc)]

#[cfg(target_arch = "nvptx64")]
pub mod nvptx;
#[cfg(target_arch = "nvptx64")]
pub use nvptx::*;

#[cfg(not(target_arch = "nvptx64"))]
pub mod cpu;
#[cfg(not(target_arch = "nvptx64"))]
pub use cpu::*;

/// Sum over the 32 lanes of a warp; every lane receives the total (fixed butterfly order, so
/// the result is bitwise reproducible).
#[inline(always)]
pub fn warp_sum_f32(mut v: f32) -> f32 {
    let mut m = 16;
    while m > 0 {
        v += shfl_xor_f32(v, m);
        m >>= 1;
    }
    v
}

/// `shfl.sync.bfly.b32` on raw bits.
#[inline(always)]
pub fn shfl_xor_u32(v: u32, lane_mask: u32) -> u32 {
    f32::to_bits(shfl_xor_f32(f32::from_bits(v), lane_mask))
}

/// e^x through `ex2.approx` (a few ulp in f32).
#[inline(always)]
pub fn exp_f32(v: f32) -> f32 {
    ex2_approx(v * core::f32::consts::LOG2_E)
}

/// σ(x) = 1/(1+e^-x), correctly rounded division of an `ex2.approx` exponential.
#[inline(always)]
pub fn sigmoid(v: f32) -> f32 {
    div_rn(1.0, 1.0 + exp_f32(-v))
}

// ---------------------------------------------------------------- conversions

/// bf16 bits → f32 (exact).
#[inline(always)]
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// Two bf16 packed in a u32 (low half first in memory) → two f32.
#[inline(always)]
pub fn bf16x2_to_f32(w: u32) -> (f32, f32) {
    (f32::from_bits(w << 16), f32::from_bits(w & 0xffff_0000))
}

// ---------------------------------------------------------------- 16-bit storage types

/// A 16-bit float storage type (its bits in a `u16`): kernels generic over f16 and bf16 take
/// `D: Half16` and convert through it.
pub trait Half16 {
    /// Bits → f32 (exact).
    fn to_f32(h: u16) -> f32;
    /// f32 → bits, round to nearest even.
    fn from_f32(v: f32) -> u16;
    /// Two packed values (low half first in memory) → f32.
    fn unpack2(w: u32) -> (f32, f32);
    /// Two f32 → two packed values (`a` in the low half), round to nearest even.
    fn pack2(a: f32, b: f32) -> u32;
    /// `mma.sync.m16n8k16` with A and B of this type, f32 accumulate.
    ///
    /// # Safety
    /// A warp-collective: all 32 lanes must execute it with the fragment layout of the PTX ISA.
    unsafe fn mma(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4];
}

/// IEEE half.
pub struct F16;
/// bfloat16.
pub struct Bf16;

impl Half16 for F16 {
    #[inline(always)]
    fn to_f32(h: u16) -> f32 {
        f16_to_f32(h)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> u16 {
        f32_to_f16(v)
    }
    #[inline(always)]
    fn unpack2(w: u32) -> (f32, f32) {
        (f16_to_f32(w as u16), f16_to_f32((w >> 16) as u16))
    }
    #[inline(always)]
    fn pack2(a: f32, b: f32) -> u32 {
        (f32_to_f16(a) as u32) | ((f32_to_f16(b) as u32) << 16)
    }
    #[inline(always)]
    unsafe fn mma(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
        mma_m16n8k16_f16_f32(a, b, c)
    }
}

impl Half16 for Bf16 {
    #[inline(always)]
    fn to_f32(h: u16) -> f32 {
        bf16_to_f32(h)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> u16 {
        f32_to_bf16(v)
    }
    #[inline(always)]
    fn unpack2(w: u32) -> (f32, f32) {
        bf16x2_to_f32(w)
    }
    #[inline(always)]
    fn pack2(a: f32, b: f32) -> u32 {
        f32_to_bf16x2(a, b)
    }
    #[inline(always)]
    unsafe fn mma(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
        mma_m16n8k16_bf16_f32(a, b, c)
    }
}

/// `shfl.sync.bfly` of an f64 (two 32-bit shuffles; not `pure`, see [`shfl_xor_f32`]).
#[inline(always)]
pub fn shfl_xor_f64(v: f64, lane_mask: u32) -> f64 {
    let b = v.to_bits();
    let lo = shfl_xor_u32(b as u32, lane_mask);
    let hi = shfl_xor_u32((b >> 32) as u32, lane_mask);
    f64::from_bits(((hi as u64) << 32) | lo as u64)
}

/// Puts a PTX performance-tuning directive on a kernel entry, e.g.
/// `entry_directive!("mhc_pre_partial_slab", ".maxntid 512, 1, 1");` (ptxas then fits the registers
/// to that block size). Emits a module comment that `nvptx-link` applies after `llc`.
#[macro_export]
macro_rules! entry_directive {
    ($name:literal, $directive:literal) => {
        #[cfg(target_arch = "nvptx64")]
        core::arch::global_asm!(concat!("// rgk-entry-directive ", $name, " ", $directive));
    };
}
