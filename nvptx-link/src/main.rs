//! `nvptx-link`: the linker rustc calls (`-C linker-flavor=llbc -C linker=nvptx-link`) when the
//! device crate is built for `nvptx64-nvidia-cuda`.
//!
//! rustc hands it the LTO'd bitcode object of the kernel crate, the `compiler_builtins` rlib,
//! `--export-symbol NAME` once per kernel and `-o out.ptx`. It then runs the LLVM tools that the
//! pinned toolchain ships in its `llvm-tools` component:
//!
//! 1. `llvm-ar x` on each rlib, keeping its bitcode members;
//! 2. `llvm-link`: the kernel object first (linked whole), then the rlib members with
//!    `--only-needed`, so only the builtins the kernels call come in;
//! 3. `opt --internalize-public-api-list=<kernels> -passes=internalize,globaldce,default<O3>`;
//! 4. `llc -mcpu=<target-cpu> -O3` to PTX;
//! 5. entry directives: a module-level comment `// rgk-entry-directive NAME .maxntid 1024, 1, 1`
//!    (emitted by the `entry_directive!` macro of `kernels-gpu`'s prim module through
//!    `global_asm!`) puts that performance-tuning directive on `.entry NAME` (between its
//!    parameter list and its body), which Rust cannot express as an attribute.
//!
//! The result defines every function it calls (checked at the end: a `.extern .func` is an error).
//! The tools are found in `$NVPTX_LLVM_BIN` or else under `$(rustc --print sysroot)`.
//! std only, no dependencies, so the build can compile it with one `rustc` call.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{exit, Command};

fn main() {
    if let Err(e) = run() {
        eprintln!("nvptx-link: error: {e}");
        exit(1);
    }
}

struct Args {
    exports: Vec<String>,
    inputs: Vec<PathBuf>,
    output: PathBuf,
    cpu: String,
}

fn parse_args() -> Result<Args, String> {
    let mut exports = Vec::new();
    let mut inputs = Vec::new();
    let mut output = None;
    let mut cpu = String::from("sm_90");
    let mut it = env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |flag: &str| it.next().ok_or_else(|| format!("{flag} needs a value"));
        match a.as_str() {
            "--export-symbol" => exports.push(value("--export-symbol")?),
            "-o" => output = Some(PathBuf::from(value("-o")?)),
            "--target-cpu" => cpu = value("--target-cpu")?,
            "--target" | "-L" | "--linker-plugin-lto" => {
                let _ = value(&a)?;
            }
            s if s.starts_with('-') => {} // -O3, --debug, --fallback-arch ...: llc gets -O3 anyway
            _ => inputs.push(PathBuf::from(a)),
        }
    }
    let output = output.ok_or("no -o given")?;
    if exports.is_empty() {
        return Err("no --export-symbol given: the crate exports no kernel".into());
    }
    Ok(Args { exports, inputs, output, cpu })
}

fn llvm_bin() -> Result<PathBuf, String> {
    if let Some(dir) = env::var_os("NVPTX_LLVM_BIN") {
        return Ok(PathBuf::from(dir));
    }
    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let out = Command::new(&rustc)
        .args(["--print", "sysroot"])
        .output()
        .map_err(|e| format!("running {rustc} --print sysroot: {e}"))?;
    let sysroot = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let host = env::var("NVPTX_LINK_HOST").unwrap_or_else(|_| "x86_64-unknown-linux-gnu".into());
    Ok(Path::new(&sysroot).join("lib/rustlib").join(host).join("bin"))
}

fn tool(bin: &Path, name: &str) -> Result<PathBuf, String> {
    let p = bin.join(name);
    if p.exists() {
        Ok(p)
    } else {
        Err(format!(
            "{} not found: install the toolchain's llvm-tools component (rustup component add llvm-tools)",
            p.display()
        ))
    }
}

fn sh(cmd: &mut Command) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{cmd:?} failed ({}):\n{}", out.status, String::from_utf8_lossy(&out.stderr)));
    }
    Ok(())
}

fn run() -> Result<(), String> {
    let args = parse_args()?;
    let bin = llvm_bin()?;
    let (ar, link, opt, llc) =
        (tool(&bin, "llvm-ar")?, tool(&bin, "llvm-link")?, tool(&bin, "opt")?, tool(&bin, "llc")?);
    let work = args.output.with_extension("nvptx-link.d");
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work).map_err(|e| format!("creating {}: {e}", work.display()))?;

    // Kernel objects first (linked whole), then library members (only what is needed).
    let mut objects = Vec::new();
    let mut members = Vec::new();
    for (i, input) in args.inputs.iter().enumerate() {
        if input.extension().is_some_and(|e| e == "rlib" || e == "a") {
            let dir = work.join(format!("lib{i}"));
            fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
            sh(Command::new(&ar).arg("x").arg(fs::canonicalize(input).map_err(|e| e.to_string())?).current_dir(&dir))?;
            let mut found: Vec<PathBuf> = fs::read_dir(&dir)
                .map_err(|e| e.to_string())?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| is_bitcode(p))
                .collect();
            found.sort();
            members.extend(found);
        } else if is_bitcode(input) {
            objects.push(input.clone());
        }
    }
    if objects.is_empty() {
        return Err("no bitcode object among the inputs (is lto = \"fat\" set for the kernel crate?)".into());
    }

    let linked = work.join("linked.bc");
    let mut cmd = Command::new(&link);
    cmd.args(&objects);
    if !members.is_empty() {
        cmd.arg("--only-needed").args(&members);
    }
    sh(cmd.arg("-o").arg(&linked))?;

    let optimized = work.join("opt.bc");
    sh(Command::new(&opt)
        .arg(format!("--internalize-public-api-list={}", args.exports.join(",")))
        .arg("-passes=internalize,globaldce,default<O3>")
        .arg(&linked)
        .arg("-o")
        .arg(&optimized))?;

    sh(Command::new(&llc)
        .arg("-mtriple=nvptx64-nvidia-cuda")
        .arg(format!("-mcpu={}", args.cpu))
        .arg("-O3")
        .arg(&optimized)
        .arg("-o")
        .arg(&args.output))?;

    let ptx = apply_entry_directives(&fs::read_to_string(&args.output).map_err(|e| e.to_string())?)?;
    fs::write(&args.output, &ptx).map_err(|e| e.to_string())?;
    if let Some(line) = ptx.lines().find(|l| l.contains(".extern .func")) {
        return Err(format!("PTX is not self-contained, it declares: {line}"));
    }
    for k in &args.exports {
        if !ptx.contains(&format!(".entry {k}(")) {
            return Err(format!("kernel {k} is missing from the PTX"));
        }
    }
    let _ = fs::remove_dir_all(&work);
    Ok(())
}

/// Step 5: every `// rgk-entry-directive NAME DIRECTIVE` line adds `DIRECTIVE` after the
/// parameter list of `.entry NAME(`. Errors name a directive whose entry is missing.
fn apply_entry_directives(ptx: &str) -> Result<String, String> {
    const TAG: &str = "// rgk-entry-directive ";
    let mut out = ptx.to_string();
    for line in ptx.lines() {
        let Some(rest) = line.trim().strip_prefix(TAG) else { continue };
        let (name, directive) = rest.trim().split_once(' ').ok_or_else(|| format!("malformed: {line}"))?;
        let head = format!(".entry {name}(");
        let start = out.find(&head).ok_or_else(|| format!("{line}: no `.entry {name}` in the PTX"))?;
        // The parameter list ends on the first line after the head that starts with ")"; the
        // directive goes on its own line after that one (before the body's "{").
        let close = out[start..].find("\n)").ok_or_else(|| format!("{line}: no parameter list end"))? + start + 1;
        let eol = out[close..].find('\n').ok_or_else(|| format!("{line}: no body"))? + close;
        out.insert_str(eol, &format!("\n{}", directive.trim()));
    }
    Ok(out)
}

/// LLVM bitcode starts with `BC\xC0\xDE` (or the wrapper magic `0x0B17C0DE`).
fn is_bitcode(p: &Path) -> bool {
    let Ok(bytes) = fs::read(p) else { return false };
    bytes.starts_with(b"BC\xC0\xDE") || bytes.starts_with(&[0xDE, 0xC0, 0x17, 0x0B])
}
