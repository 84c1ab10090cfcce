//! Memory access of complex elements for the FFT kernels (vector loads and stores).

pub(crate) use super::dft::unroll;
pub use super::dft::{dft, Cx, Real};

/// Loads and stores of one complex element of a [`Real`] type.
pub trait Mem: Real {
    /// One complex element from global memory (one vector access).
    ///
    /// # Safety
    /// `p` must be valid and naturally aligned for two `Self` (8 or 16 bytes).
    unsafe fn ld(p: *const Cx<Self>) -> Cx<Self>;
    /// # Safety
    /// As [`Mem::ld`].
    unsafe fn st(p: *mut Cx<Self>, v: Cx<Self>);
    /// Read-only-path load of an element that no thread writes during the kernel.
    ///
    /// # Safety
    /// As [`Mem::ld`].
    unsafe fn ld_ro(p: *const Cx<Self>) -> Cx<Self>;
    /// One complex element from shared memory at the 32-bit shared-window address `a`
    /// (`prim::dyn_smem_u32` plus a byte offset): one `ld.shared` vector access.
    ///
    /// # Safety
    /// `a` must lie in the block's shared memory, naturally aligned (8 or 16 bytes).
    unsafe fn lds(a: u32) -> Cx<Self>;
    /// # Safety
    /// As [`Mem::lds`].
    unsafe fn sts(a: u32, v: Cx<Self>);
    /// Whether [`Mem::twiddle`] computes the four-step twiddles (no table reads).
    const COMPUTED_TWIDDLES: bool;
    /// `W_n^q = exp(−2πi·q/n)` for `n = 2^log_n ≥ 8`, `q < n`, computed in registers where
    /// [`Mem::COMPUTED_TWIDDLES`] (else a placeholder: the tables are read instead).
    fn twiddle(q: u32, log_n: u32) -> Cx<Self>;
}

/// `sin(π/4·u)` and `cos(π/4·u)` for `u ∈ [0, 1]`: Taylor polynomials to `u⁹` and `u¹⁰`
/// (truncation below 2e-9), Horner with single-rounding FMAs.
#[inline(always)]
fn sincos_quarter_pi(u: f32) -> (f32, f32) {
    use super::prim::fma;
    let u2 = u * u;
    let s = fma(u2, 3.133_616_8e-7, -3.657_620_3e-5);
    let s = fma(u2, s, 2.490_394_5e-3);
    let s = fma(u2, s, -8.074_551e-2);
    let s = fma(u2, s, 7.853_982e-1);
    let c = fma(u2, -2.461_136_9e-8, 3.590_860_4e-6);
    let c = fma(u2, c, -3.259_918_9e-4);
    let c = fma(u2, c, 1.585_434_4e-2);
    let c = fma(u2, c, -3.084_251_3e-1);
    let c = fma(u2, c, 1.0);
    (u * s, c)
}

#[derive(Clone, Copy)]
#[repr(C, align(8))]
struct V2f32(f32, f32);
#[derive(Clone, Copy)]
#[repr(C, align(16))]
struct V2f64(f64, f64);

impl Mem for f32 {
    #[inline(always)]
    unsafe fn ld(p: *const Cx<Self>) -> Cx<Self> {
        let v = *(p as *const V2f32);
        Cx { re: v.0, im: v.1 }
    }
    #[inline(always)]
    unsafe fn st(p: *mut Cx<Self>, v: Cx<Self>) {
        #[cfg(not(target_arch = "nvptx64"))]
        super::prim::global(p, 8);
        *(p as *mut V2f32) = V2f32(v.re, v.im);
    }
    #[inline(always)]
    unsafe fn ld_ro(p: *const Cx<Self>) -> Cx<Self> {
        let (a, b) = super::prim::ld_nc_v2_u32(p as *const u32);
        Cx { re: f32::from_bits(a), im: f32::from_bits(b) }
    }
    #[inline(always)]
    unsafe fn lds(a: u32) -> Cx<Self> {
        let (re, im) = super::prim::lds_v2_f32(a);
        Cx { re, im }
    }
    #[inline(always)]
    unsafe fn sts(a: u32, v: Cx<Self>) {
        super::prim::sts_v2_f32(a, v.re, v.im)
    }
    const COMPUTED_TWIDDLES: bool = true;
    /// The angle `2π·q/n` reduced exactly on the integer `q` to an octant and `u = r/(n/8)`
    /// (exact in f32 for `n ≤ 2^26`), then [`sincos_quarter_pi`] and the octant's symmetry (as
    /// the host's f64 `twiddle`).
    #[inline(always)]
    fn twiddle(q: u32, log_n: u32) -> Cx<Self> {
        let sh = log_n - 3;
        let oct = q >> sh;
        let r = q & ((1 << sh) - 1);
        let odd = oct & 1 != 0;
        let rr = if odd { (1 << sh) - r } else { r };
        let u = rr as f32 * f32::from_bits((127 - sh) << 23);
        let (s, c) = sincos_quarter_pi(u);
        // cos and sin of the angle within the quadrant.
        let (cq, sq) = if odd { (s, c) } else { (c, s) };
        let (cos, sin) = match oct >> 1 {
            0 => (cq, sq),
            1 => (-sq, cq),
            2 => (-cq, -sq),
            _ => (sq, -cq),
        };
        Cx { re: cos + 0.0, im: -sin + 0.0 }
    }
}

impl Mem for f64 {
    #[inline(always)]
    unsafe fn ld(p: *const Cx<Self>) -> Cx<Self> {
        let v = *(p as *const V2f64);
        Cx { re: v.0, im: v.1 }
    }
    #[inline(always)]
    unsafe fn st(p: *mut Cx<Self>, v: Cx<Self>) {
        #[cfg(not(target_arch = "nvptx64"))]
        super::prim::global(p, 16);
        *(p as *mut V2f64) = V2f64(v.re, v.im);
    }
    #[inline(always)]
    unsafe fn ld_ro(p: *const Cx<Self>) -> Cx<Self> {
        let w = super::prim::ld_nc_v4(p as *const u32);
        Cx {
            re: f64::from_bits(w[0] as u64 | ((w[1] as u64) << 32)),
            im: f64::from_bits(w[2] as u64 | ((w[3] as u64) << 32)),
        }
    }
    #[inline(always)]
    unsafe fn lds(a: u32) -> Cx<Self> {
        let (re, im) = super::prim::lds_v2_f64(a);
        Cx { re, im }
    }
    #[inline(always)]
    unsafe fn sts(a: u32, v: Cx<Self>) {
        super::prim::sts_v2_f64(a, v.re, v.im)
    }
    const COMPUTED_TWIDDLES: bool = false;
    #[inline(always)]
    fn twiddle(_q: u32, _log_n: u32) -> Cx<Self> {
        Cx { re: 1.0, im: 0.0 }
    }
}
