//! Builds the `#![no_std]` device crate `kernels-gpu` into one self-contained PTX module.
//!
//! Route: rustc's NVPTX backend with `-Zbuild-std=core`, fat LTO,
//! and the project's own linker `nvptx-link` (compiled here with one `rustc` call), which drives
//! `llvm-link`/`opt`/`llc` from the pinned toolchain's `llvm-tools` component.
//!
//! Used by `host/build.rs` (so `cargo build` embeds the PTX) and by `cargo xtask build`.
//! [`divergence`] checks the synchronisation structure of the module it builds.

pub mod divergence;

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The GPU architecture the PTX targets (the H200 is sm_90).
pub const TARGET_CPU: &str = "sm_90";
const NVPTX_TARGET: &str = "nvptx64-nvidia-cuda";

/// Root of the workspace (the folder holding `kernels-gpu/` and `nvptx-link/`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// Paths whose change must rebuild the PTX (for `cargo:rerun-if-changed`).
pub fn inputs() -> Vec<PathBuf> {
    let root = workspace_root();
    vec![
        root.join("kernels-gpu/src"),
        root.join("kernels-gpu/Cargo.toml"),
        root.join("kernel-abi/src"),
        root.join("kernel-abi/Cargo.toml"),
        root.join("nvptx-link/src/main.rs"),
        root.join("rust-toolchain.toml"),
    ]
}

fn rustc() -> String {
    env::var("RUSTC").unwrap_or_else(|_| "rustc".into())
}

fn capture(cmd: &mut Command) -> Result<String, String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{cmd:?} failed:\n{}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The folder of `llvm-link`, `opt`, `llc`, `llvm-ar` in the active toolchain.
pub fn llvm_bin() -> Result<PathBuf, String> {
    let sysroot = capture(Command::new(rustc()).args(["--print", "sysroot"]))?;
    let vv = capture(Command::new(rustc()).arg("-vV"))?;
    let host = vv.lines().find_map(|l| l.strip_prefix("host: ")).ok_or("rustc -vV printed no host triple")?;
    let bin = Path::new(&sysroot).join("lib/rustlib").join(host).join("bin");
    if !bin.join("llc").exists() {
        return Err(format!(
            "{} has no llc: the kernels build with rgk's pinned toolchain (its rust-toolchain.toml: \
             nightly with llvm-tools), the one that compiles the crate depending on rgk; in rgk's \
             repository `rustup toolchain install` installs it, from another crate build with \
             `cargo +<that nightly>` or name it in that crate's rust-toolchain.toml",
            bin.display()
        ));
    }
    Ok(bin)
}

/// Compiles the linker and the kernel crate under `work_dir`; returns the path of the PTX file.
pub fn build(work_dir: &Path) -> Result<PathBuf, String> {
    let root = workspace_root();
    fs::create_dir_all(work_dir).map_err(|e| e.to_string())?;
    let llvm = llvm_bin()?;

    // 1. The linker: one std-only source file.
    let linker = work_dir.join("nvptx-link");
    let status = Command::new(rustc())
        .args(["--edition", "2021", "-O", "--crate-name", "nvptx_link"])
        .arg(root.join("nvptx-link/src/main.rs"))
        .arg("-o")
        .arg(&linker)
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .status()
        .map_err(|e| format!("compiling nvptx-link: {e}"))?;
    if !status.success() {
        return Err("compiling nvptx-link failed".into());
    }

    // 2. The kernel crate, by an inner cargo with its own target dir and a clean environment.
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let target_dir = work_dir.join("kernels-target");
    let flags = [
        "-Zunstable-options".to_string(),
        "-Clinker-flavor=llbc".to_string(),
        format!("-Clinker={}", linker.display()),
        format!("-Ctarget-cpu={TARGET_CPU}"),
    ]
    .join("\x1f");
    let mut cmd = Command::new(cargo);
    cmd.current_dir(root.join("kernels-gpu"))
        .args(["rustc", "--lib", "--crate-type", "cdylib", "--release", "--quiet", "-Zbuild-std=core"])
        .args(["--target", NVPTX_TARGET])
        .arg("--target-dir")
        .arg(&target_dir);
    for (k, _) in env::vars_os() {
        let k = k.to_string_lossy().to_string();
        if k.starts_with("CARGO_PROFILE_")
            || k.starts_with("CARGO_BUILD_")
            || k.starts_with("CARGO_TARGET_")
            || k.starts_with("CARGO_CFG_")
            || k.starts_with("CARGO_FEATURE_")
            || k.starts_with("CARGO_PKG_")
            || k.starts_with("CARGO_MANIFEST_")
            || matches!(
                k.as_str(),
                "RUSTFLAGS"
                    | "RUSTDOCFLAGS"
                    | "RUSTC_WRAPPER"
                    | "RUSTC_WORKSPACE_WRAPPER"
                    | "CLIPPY_ARGS"
                    | "CLIPPY_CONF_DIR"
                    | "CARGO_MAKEFLAGS"
                    | "MAKEFLAGS"
                    | "MFLAGS"
                    | "OUT_DIR"
                    | "TARGET"
                    | "HOST"
                    | "PROFILE"
                    | "OPT_LEVEL"
                    | "DEBUG"
                    | "NUM_JOBS"
                    | "CARGO_PRIMARY_PACKAGE"
            )
        {
            cmd.env_remove(&k);
        }
    }
    cmd.env("CARGO_ENCODED_RUSTFLAGS", flags).env("NVPTX_LLVM_BIN", &llvm);
    let status = cmd.status().map_err(|e| format!("running cargo for kernels-gpu: {e}"))?;
    if !status.success() {
        return Err("building kernels-gpu for nvptx64-nvidia-cuda failed (see the errors above)".into());
    }
    let ptx = target_dir.join(NVPTX_TARGET).join("release/kernels_gpu.ptx");
    if !ptx.exists() {
        return Err(format!("{} was not produced", ptx.display()));
    }
    Ok(ptx)
}

/// Finds `ptxas`: `$PTXAS`, then `ptxas` on `PATH`, then `/usr/local/cuda/bin/ptxas`, then the
/// one the `nvidia-cuda-nvcc` wheel installs for `python3`. `None` when there is none.
pub fn find_ptxas() -> Option<PathBuf> {
    if let Some(p) = env::var_os("PTXAS") {
        let p = PathBuf::from(p);
        return p.exists().then_some(p);
    }
    find_cuda_tool("ptxas")
}

/// A CUDA command-line tool (`ptxas`, `cuobjdump`, `nvdisasm`): on `PATH`, in
/// `/usr/local/cuda/bin`, or in an `nvidia-cuda-*` wheel of the `python3` on `PATH`.
pub fn find_cuda_tool(name: &str) -> Option<PathBuf> {
    if let Some(path) = env::var_os("PATH") {
        for dir in env::split_paths(&path) {
            let p = dir.join(name);
            if p.is_file() {
                return Some(p);
            }
        }
    }
    let cuda = PathBuf::from("/usr/local/cuda/bin").join(name);
    if cuda.is_file() {
        return Some(cuda);
    }
    let py = format!(
        "import nvidia, os\nfor d in nvidia.__path__:\n  for sub in ('cu13', 'cuda_nvcc', 'cuda_cuobjdump', 'cuda_nvdisasm'):\n    p = os.path.join(d, sub, 'bin', '{name}')\n    if os.path.isfile(p): print(p)"
    );
    let out = Command::new("python3").args(["-c", &py]).output().ok()?;
    let s = String::from_utf8_lossy(&out.stdout);
    s.lines().next().map(PathBuf::from).filter(|p| p.is_file())
}

/// `ptxas --version`'s release line (e.g. `Cuda compilation tools, release 13.5, V13.5.37`);
/// `None` when it does not run.
pub fn ptxas_version(ptxas: &Path) -> Option<String> {
    let out = Command::new(ptxas).arg("--version").output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    text.lines().find(|l| l.contains("release")).map(|l| l.trim().to_string())
}

/// Runs `ptxas -arch=sm_90 -v` on a PTX file; returns its report (registers, spills per kernel).
pub fn ptxas_report(ptxas: &Path, ptx: &Path, out_cubin: &Path) -> Result<String, String> {
    let out = Command::new(ptxas)
        .arg(format!("-arch={TARGET_CPU}"))
        .arg("-v")
        .arg(ptx)
        .arg("-o")
        .arg(out_cubin)
        .output()
        .map_err(|e| format!("running {}: {e}", ptxas.display()))?;
    let text = String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!("ptxas rejected {}:\n{text}", ptx.display()));
    }
    Ok(text)
}
