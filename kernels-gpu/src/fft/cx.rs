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
}

impl Mem for f64 {
    #[inline(always)]
    unsafe fn ld(p: *const Cx<Self>) -> Cx<Self> {
        let v = *(p as *const V2f64);
        Cx { re: v.0, im: v.1 }
    }
    #[inline(always)]
    unsafe fn st(p: *mut Cx<Self>, v: Cx<Self>) {
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
}
