//! Every GPU kernel of the library, in Rust, compiled to PTX (`nvptx64-nvidia-cuda`, sm_90).
//!
//! Layering: [`prim`] is the only module with `asm!` and `core::arch::nvptx`; the op families
//! ([`mhc`]) are written against it. Each kernel is an `extern "ptx-kernel"` function whose name
//! is its PTX entry; the host crate (`rgk`) loads the module and launches them.
#![no_std]
#![feature(abi_ptx, stdarch_nvptx, asm_experimental_arch)]
#![allow(clippy::missing_safety_doc)]

pub mod copy;
pub mod engram;
pub mod fft;
pub mod mhc;
pub mod prim;

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    prim::trap()
}
