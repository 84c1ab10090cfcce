//! Builds the device crate to PTX and leaves it at `$OUT_DIR/kernels.ptx`, and, when `ptxas` is
//! found (`$PTXAS`, PATH, /usr/local/cuda, or the `nvidia-cuda-nvcc` wheel), its sm_90 machine
//! code at `$OUT_DIR/kernels.cubin` (empty without ptxas). `src/runtime.rs` embeds both: a plain
//! `cargo build` gives a library that carries its kernels, loaded without a JIT on sm_90.
use std::path::PathBuf;

fn main() {
    for p in ptx_build::inputs() {
        println!("cargo:rerun-if-changed={}", p.display());
    }
    println!("cargo:rerun-if-env-changed=PTXAS");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let ptx = match ptx_build::build(&out.join("ptx")) {
        Ok(ptx) => ptx,
        Err(e) => {
            eprintln!("{e}");
            panic!("building the GPU kernels failed: {e}");
        }
    };
    let embedded = out.join("kernels.ptx");
    std::fs::copy(&ptx, &embedded).expect("copying the PTX into OUT_DIR");
    let cubin = out.join("kernels.cubin");
    // The report of the ptxas that made the embedded cubin (its version line first): the tests
    // check the shipped machine code's registers and spills from it.
    let report = out.join("kernels.ptxas.txt");
    let assembled = match ptx_build::find_ptxas() {
        Some(ptxas) => match ptx_build::ptxas_report(&ptxas, &embedded, &cubin) {
            Ok(text) => {
                let version = ptx_build::ptxas_version(&ptxas).unwrap_or_default();
                std::fs::write(&report, format!("{version}\n{text}")).expect("writing the ptxas report into OUT_DIR");
                true
            }
            Err(e) => {
                println!("cargo:warning=no sm_90 machine code embedded (the driver will compile the PTX at load): {e}");
                false
            }
        },
        None => false,
    };
    if !assembled {
        std::fs::write(&cubin, b"").expect("writing an empty cubin into OUT_DIR");
        std::fs::write(&report, b"").expect("writing an empty ptxas report into OUT_DIR");
    }
}
