//! Builds the device crate to PTX and leaves it at `$OUT_DIR/kernels.ptx`, which `src/runtime.rs`
//! embeds: a plain `cargo build` gives a library that carries its kernels.
use std::path::PathBuf;

fn main() {
    for p in ptx_build::inputs() {
        println!("cargo:rerun-if-changed={}", p.display());
    }
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    match ptx_build::build(&out.join("ptx")) {
        Ok(ptx) => {
            std::fs::copy(&ptx, out.join("kernels.ptx")).expect("copying the PTX into OUT_DIR");
        }
        Err(e) => {
            eprintln!("{e}");
            panic!("building the GPU kernels failed: {e}");
        }
    }
}
