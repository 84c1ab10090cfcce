//! The launch contract between the host library (`rgk`) and the kernels (`kernels-gpu`).
//!
//! Each kernel's arguments are one struct, declared once here with [`kernel_args!`]. The
//! declaration also generates the entry macro the device crate declares the kernel with: the
//! PTX entry takes the struct's fields as its parameters, in declaration order, and rebuilds
//! the struct for the kernel body; the host fills the same struct and passes
//! [`KernelArgs::params`] (a pointer to each field, in the same order) to `cuLaunchKernel`.
//! The two sides therefore cannot disagree on the number, order or type of the arguments.
//!
//! The parameters stay separate in PTX (not one by-value aggregate) on purpose: LLVM's NVPTX
//! back end knows a kernel's pointer parameters address global memory and emits `ld.global` /
//! `st.global` through them (and `cvta.to.global` once); a pointer read out of a by-value
//! struct parameter is generic, and every access through it becomes a generic `ld`/`st`.
//!
//! Each op family's variants are one kernel list here (`fft_pass_kernels!`, `gate_kernels!`,
//! `decode_kernels!`, `mhc_pre_kernels!`, `mhc_post_kernels!`): one named row per PTX entry
//! giving its kernel body (an enum such as [`GateKernel`], one documented variant per body) and
//! its parameters (element type, sizes). Where a body takes parameters, each row is also a
//! **policy type** ([`gate_policies`], [`decode_policies`], [`pass_policies`]): a zero-sized
//! type named after its entry, implementing [`Policy`] (entry name, one-line description) and
//! its family's trait ([`GatePolicy`], [`DecodePolicy`], [`FftPassPolicy`]) whose associated
//! consts are the row's body and parameters. A combination the body does not take
//! ([`GateKernel::accepts`], [`DecodeKernel::accepts`], [`pass_row_is_valid`]) stops the build
//! of both crates. The device crate instantiates each entry's body with its policy's consts;
//! the host builds its kernel tables from the same policies, so the two cannot name different
//! kernels or disagree on a kernel's parameters. The planners choose among the policies per
//! shape at run time, through those tables.
//!
//! Sizes and constants both sides use (shared-memory layouts, per-thread chunk counts) live
//! here too. `no_std`, no dependencies: the device crate compiles it for
//! `nvptx64-nvidia-cuda`, the host for the CPU. Pointers are device addresses, typed by what
//! the kernel reads or writes through them (16-bit floats as their `u16` bits).
#![no_std]

pub use core::ffi::c_void;

/// The element type of a row in a kernel list (`gate_kernels!`, `decode_kernels!`, ...): a
/// policy's `ELEM` / `PRECISION`, checked at compile time and read by the host's tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    F16,
    Bf16,
    F32,
    /// Complex f32 (interleaved).
    C64,
    /// Complex f64 (interleaved).
    C128,
}

impl Elem {
    /// f16 or bf16.
    pub const fn is_half(self) -> bool {
        matches!(self, Self::F16 | Self::Bf16)
    }
}

/// The [`Elem`] of a kernel list's dtype column (`f16`, `bf16`, `f32`, `c64`, `c128`).
#[doc(hidden)]
#[macro_export]
macro_rules! elem {
    (f16) => {
        $crate::Elem::F16
    };
    (bf16) => {
        $crate::Elem::Bf16
    };
    (f32) => {
        $crate::Elem::F32
    };
    (c64) => {
        $crate::Elem::C64
    };
    (c128) => {
        $crate::Elem::C128
    };
}

/// A kernel variant as a type: a kernel body with its parameters (one row of a family's kernel
/// list). Each family adds a trait with the parameters as associated consts.
pub trait Policy {
    /// The PTX entry (the type's own name).
    const ENTRY: &'static str;
    /// One line: the kernel body this variant runs.
    const ABOUT: &'static str;
}

/// Declares policy type `$name` of family trait `$family`: the zero-sized type (documented by
/// `$doc`), its [`Policy`] (entry = the type's name, description `$about`), the family's
/// associated consts, and the compile-time check of the family's `VALID`.
macro_rules! policy_type {
    ($name:ident, $doc:expr, $about:expr, $family:ident { $(const $c:ident: $t:ty = $v:expr;)* }) => {
        #[doc = $doc]
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy, Debug)]
        pub struct $name;
        impl $crate::Policy for $name {
            const ENTRY: &'static str = stringify!($name);
            const ABOUT: &'static str = $about;
        }
        impl $crate::$family for $name {
            $(const $c: $t = $v;)*
        }
        const _: () = <$name as $crate::$family>::VALID;
    };
}

/// A kernel's argument struct, declared by [`kernel_args!`].
///
/// # Safety
/// Implemented only by [`kernel_args!`]: `params` points at every field, in the order of the
/// kernel's parameters.
pub unsafe trait KernelArgs: Copy {
    /// `[*mut c_void; number of fields]`.
    type Params: AsMut<[*mut c_void]>;
    /// A pointer to each field in parameter order, valid while `self` is borrowed (the
    /// `kernelParams` of `cuLaunchKernel`).
    fn params(&mut self) -> Self::Params;
}

/// Declares a kernel argument struct and the macro that declares kernels taking it:
///
/// ```ignore
/// kernel_args! {
///     /// What the kernel computes, its launch contract.
///     pub struct CopyArgs / copy_entry { pub src: *const u32, pub dst: *mut u32, pub n: u64, }
/// }
/// // In the device crate: a PTX entry `my_copy(src, dst, n)` whose body sees `a: CopyArgs`.
/// kernel_abi::copy_entry!(my_copy, a => { body(a) });
/// ```
///
/// On targets other than nvptx64 the entry is a plain `unsafe fn` of the same name (the CPU
/// simulation of the kernels, `kernels-gpu`'s `prim::cpu`, calls it).
#[macro_export]
macro_rules! kernel_args {
    (
        $(#[$m:meta])*
        pub struct $name:ident / $entry:ident { $($(#[$fm:meta])* pub $f:ident: $t:ty,)* }
    ) => {
        $crate::kernel_args!(@emit ($) $(#[$m])* $name $entry { $($(#[$fm])* $f: $t,)* });
    };
    (@emit ($d:tt) $(#[$m:meta])* $name:ident $entry:ident { $($(#[$fm:meta])* $f:ident: $t:ty,)* }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug)]
        pub struct $name {
            $($(#[$fm])* pub $f: $t,)*
        }

        // SAFETY: one pointer per field, in declaration order, which is the entry's parameter
        // order (the entry macro below lists the same fields in the same order).
        unsafe impl $crate::KernelArgs for $name {
            type Params = [*mut $crate::c_void; [$(stringify!($f)),*].len()];
            fn params(&mut self) -> Self::Params {
                [$(&mut self.$f as *mut $t as *mut $crate::c_void),*]
            }
        }

        #[doc = concat!("Declares a kernel taking [`", stringify!($name), "`]: `", stringify!($entry), "!(entry_name, args => { body })`.")]
        #[macro_export]
        macro_rules! $entry {
            ($d kernel:ident, $d args:ident => $d body:block) => {
                #[cfg(target_arch = "nvptx64")]
                #[no_mangle]
                #[allow(clippy::too_many_arguments)]
                pub unsafe extern "ptx-kernel" fn $d kernel($($f: $t),*) {
                    let $d args = $crate::$name { $($f),* };
                    $d body
                }
                #[cfg(not(target_arch = "nvptx64"))]
                #[allow(clippy::too_many_arguments, dead_code)]
                pub unsafe fn $d kernel($d args: $crate::$name) $d body
            };
        }
    };
}

pub mod copy;
pub mod engram;
pub mod fft;
pub mod mhc;

// The entry macros name their struct from the crate root.
pub use copy::*;
pub use engram::{decode::*, gate::*};
pub use fft::*;
pub use mhc::*;
