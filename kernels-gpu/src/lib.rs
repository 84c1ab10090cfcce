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
