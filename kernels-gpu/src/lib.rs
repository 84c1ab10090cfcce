//! Every GPU kernel of the library, in Rust, compiled to PTX (`nvptx64-nvidia-cuda`, sm_90).
//!
//! Layering: [`prim`] is the only module with `asm!` and `core::arch::nvptx`; the op families
//! ([`mhc`]) are written against it. Each kernel is an `extern "ptx-kernel"` function whose name
//! is its PTX entry; the host crate (`rgk`) loads the module and launches them.
//!
//! On any other target the crate is an ordinary library: [`prim`] is then a software GPU
//! (`prim::cpu`), each kernel a plain `unsafe fn` of the same name, and the tests run the kernels'
//! own code on the CPU through `prim::cpu::launch`.
#![no_std]
#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx, stdarch_nvptx, asm_experimental_arch))]
#![allow(clippy::missing_safety_doc)]

/// `body` for `$i` = 0, 1, … while `$i < $n` (at most 8), each copy with a constant index:
/// fully unrolled whatever LLVM's unroll threshold, so small arrays stay in registers.
macro_rules! unroll8 {
    ($i:ident, $n:expr, $body:block) => {
        unroll8!(@ $i, $n, $body, 0, 1, 2, 3, 4, 5, 6, 7)
    };
    (@ $i:ident, $n:expr, $body:block, $($k:literal),*) => {
        $(
            if $k < $n {
                #[allow(unused_variables)]
                let $i: usize = $k;
                $body
            }
        )*
    };
}

pub mod copy;
pub mod engram;
pub mod fft;
pub mod mhc;
pub mod prim;

#[cfg(not(target_arch = "nvptx64"))]
extern crate std;

#[cfg(target_arch = "nvptx64")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    prim::trap()
}
