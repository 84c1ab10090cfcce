//! `cargo xtask <command>` — project automation, no product logic.
//!
//! - `build`: builds the kernels to `target/ptx/kernels.ptx` and prints each kernel's registers,
//!   stack and spills from `ptxas -v` (when ptxas is found: `$PTXAS`, PATH, /usr/local/cuda,
//!   or the `nvidia-cuda-nvcc` wheel).
//! - `test [ARGS]`: `cargo test --workspace [ARGS]` (GPU tests print `skipped: no CUDA device`
//!   without a GPU), then `python-test`.
//! - `python-test`: builds the `rgk` Python package's wheel (`python/`, maturin) into
//!   `target/wheels`, installs it into the virtual environment `./x setup` makes
//!   (`target/pyenv`, with torch and pytest), and runs `python/tests` (the GPU tests skip without
//!   a GPU), then the CPU tests of the bench's Python parts (`bench/test_torch_alternatives.py`:
//!   the alternatives script; `bench/test_bench_tools.py`: the A/B table and the profiling
//!   script's workload names).
//! - `wheel [OUT]`: builds the release wheel for distribution into OUT (default
//!   `target/dist`): tagged `manylinux_2_28` (glibc ≥ 2.28, what PyPI accepts), linked through zig
//!   so that no newer glibc symbol slips in; needs `ziglang` in `target/pyenv`
//!   (`target/pyenv/bin/python -m pip install ziglang`).
//! - `bench [ARGS]`: builds `rgk-bench` (release) and runs it with ARGS (`--op`, `--workload`, ...;
//!   `--help` lists them), with `/usr/local/cuda/lib64` on `LD_LIBRARY_PATH`.
//! - `table [FILE]`: prints the README's results table (markdown) from `bench/results/h200.json`.
//! - `peers`: downloads the peer alternative (TileOPs 0.1.0 and its pinned dependencies, from
//!   PyPI) and packs it as `target/peers/peers.tar.xz` for a GPU machine without a network
//!   (`xtask/peers.py`).
//! - `device-pack`: builds every test executable (release, so CPU references are fast) and the bench into `.device/` (git-ignored)
//!   with `.device/run.sh`, which runs on a GPU machine without Rust: the GPU tests, the
//!   sanitizer set (`tests/sanitize.list`) under compute-sanitizer memcheck, racecheck,
//!   synccheck and initcheck, then the bench; the peers' pack
//!   travels with it (made by `peers` first when missing). `device-pack --base REV` also builds
//!   the bench at git revision REV (in a worktree under `target/ab-base`, its own target
//!   directory) as `.device/base-rgk-bench`, for `run.sh ab`: the two binaries timed A B B A on
//!   the same inputs, their output digests compared (`bench/ab_compare.py`). `--variant TAG=SPEC`
//!   (repeatable) builds the bench of a revision, or of `HEAD`'s commit with patch files applied
//!   in order (`a.diff+b.diff`; made by `git diff > a.diff`; paths relative to the caller's
//!   directory), in the same worktree, into `.device/variants.tar.xz` (each tag's spec in
//!   `.device/variants.txt`), for `run.sh abn "ORDER"`: the binaries named by ORDER (`cur`,
//!   `base`, the tags) timed in that order on the same inputs, compared by
//!   `bench/ab_compare.py`; and for `RGK_BENCH_TAG=TAG run.sh bench`: one variant's bench with
//!   the alternatives. Every revision and patch is checked before `.device` is rebuilt.
//!   `--bench-only` leaves out the test executables, the wheels and the peers (a pack for A/B
//!   runs only).
use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{exit, Command, Stdio};

fn main() {
    let args: Vec<String> = env::args().skip(1).collect();
    let root = ptx_build::workspace_root();
    // Paths given on the command line (device-pack's patch files) are the caller's.
    let caller_dir = env::current_dir().unwrap_or_else(|_| root.clone());
    env::set_current_dir(&root).expect("cd to the workspace root");
    let result = match args.first().map(String::as_str) {
        Some("build") => build(&root),
        Some("test") => cargo(&[&["test", "--workspace"], &strs(&args[1..])[..]].concat()).and_then(|()| {
            if !has_gpu() {
                // cargo counts a skipped GPU test as passed; say so once.
                println!(
                    "xtask: no GPU here (nvidia-smi failed): every GPU test above passed by printing `skipped: no \
                     CUDA device` (cargo test -- --nocapture shows them); the kernels run for real in the CPU \
                     simulation's tests (sim/) and on a GPU machine (README \"Running on a GPU machine without Rust\")"
                );
            }
            python_test(&root)
        }),
        Some("python-test") => python_test(&root),
        Some("wheel") => dist_wheel(&root, args.get(1).map(String::as_str)),
        Some("bench") => bench(&root, &args[1..]),
        Some("device-pack") => pack_args(&args[1..]).and_then(|o| {
            // Every revision and patch is checked before `.device` is rebuilt.
            let base = o.base.as_deref().map(|rev| resolve_rev(&root, rev)).transpose()?;
            let variants = o
                .variants
                .iter()
                .map(|(tag, spec)| Ok((tag.clone(), resolve_spec(&root, &caller_dir, spec)?)))
                .collect::<Result<Vec<_>, String>>()?;
            device_pack(&root, o.bench_only)?;
            if let Some(hash) = base {
                let bin = build_bench_at(&root, &Spec::Rev(hash))?;
                install_bench(&bin, &root.join(".device/base-rgk-bench"))?;
            }
            pack_variants(&root, &variants)?;
            print_packed(&root, o.bench_only)
        }),
        Some("peers") => peers(&root),
        Some("table") => table(&root, args.get(1).map(String::as_str)),
        _ => {
            eprintln!(
                "usage: cargo xtask build | test [ARGS] | python-test | wheel [OUT] | bench [ARGS] | peers | device-pack [--bench-only] [--base REV] [--variant TAG=REV|PATCH[+PATCH...]]... | table [RESULTS.json]"
            );
            exit(2);
        }
    };
    if let Err(e) = result {
        eprintln!("xtask: {e}");
        exit(1);
    }
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn cargo(args: &[&str]) -> Result<(), String> {
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo).args(args).status().map_err(|e| e.to_string())?;
    if !status.success() {
        return Err(format!("cargo {} failed", args.join(" ")));
    }
    Ok(())
}

/// The virtual environment `./x setup` makes for the Python package (torch, maturin, pytest).
fn pyenv_python(root: &Path) -> PathBuf {
    root.join("target/pyenv/bin/python")
}

/// Builds the `rgk` wheel with maturin into `out` (emptied first), `options` added to `maturin
/// build`; returns its path. The environment's folder leads `PATH`: maturin runs `python -m
/// ziglang` (`--zig`) with the first `python` there.
fn build_wheel(root: &Path, options: &[&str], out: &Path) -> Result<PathBuf, String> {
    let py = pyenv_python(root);
    let _ = fs::remove_dir_all(out);
    let bin = py.parent().expect("the interpreter's folder");
    let path = env::join_paths(
        std::iter::once(bin.to_path_buf()).chain(env::split_paths(&env::var_os("PATH").unwrap_or_default())),
    )
    .map_err(|e| e.to_string())?;
    let status = Command::new(&py)
        .args(["-m", "maturin", "build"])
        .args(options)
        .args(["-m", "python/Cargo.toml", "-o"])
        .arg(out)
        .env("PATH", path)
        .status()
        .map_err(|e| format!("{} -m maturin: {e} (run ./x setup)", py.display()))?;
    if !status.success() {
        return Err("maturin build of the rgk wheel failed".into());
    }
    walk(out).into_iter().find(|p| p.extension().is_some_and(|e| e == "whl")).ok_or("maturin wrote no wheel".into())
}

/// The wheel for tests and the GPU machine (`profile`: cargo's). `linux`: it installs wherever
/// this machine's glibc or a newer one runs (the GPU machine's Python among them); no
/// manylinux audit.
fn test_wheel(root: &Path, profile: &str, out: &Path) -> Result<PathBuf, String> {
    build_wheel(root, &["--quiet", "--profile", profile, "--compatibility", "linux"], out)
}

/// The distributable wheel: release, `manylinux_2_28`, linked with zig against glibc 2.28.
fn dist_wheel(root: &Path, out: Option<&str>) -> Result<(), String> {
    let py = pyenv_python(root);
    let zig = Command::new(&py).args(["-m", "ziglang", "version"]).stdout(Stdio::null()).stderr(Stdio::null()).status();
    if !zig.is_ok_and(|s| s.success()) {
        return Err(format!("no zig: {} -m pip install ziglang (./x setup makes the environment)", py.display()));
    }
    let out = out.map_or_else(|| root.join("target/dist"), PathBuf::from);
    let wheel = build_wheel(root, &["--release", "--zig", "--compatibility", "manylinux_2_28"], &out)?;
    // The tag is maturin's promise; check the shared library itself: no symbol may need a glibc
    // newer than 2.28.
    let check = r#"
import re, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
libs = [n for n in z.namelist() if n.endswith(".so")]
need = {int(v) for n in libs for v in re.findall(rb"GLIBC_2\.(\d+)", z.read(n))}
if not libs or not need or max(need) > 28:
    sys.exit(f"{sys.argv[1]}: libraries {libs}, glibc versions needed 2.{sorted(need)}")
print(f"{len(libs)} shared library, newest glibc symbol version 2.{max(need)} (manylinux_2_28 allows 2.28)")
"#;
    let status = Command::new(&py).args(["-c", check]).arg(&wheel).status().map_err(|e| e.to_string())?;
    if !status.success() {
        return Err("the wheel needs a glibc newer than manylinux_2_28 allows".into());
    }
    println!("{}", wheel.display());
    Ok(())
}

fn python_test(root: &Path) -> Result<(), String> {
    let py = pyenv_python(root);
    if !py.is_file() {
        return Err(format!("{} is missing: ./x setup makes it (torch, maturin, pytest)", py.display()));
    }
    let wheel = test_wheel(root, "dev", &root.join("target/wheels"))?;
    let run = |args: &[&str], what: &str| -> Result<(), String> {
        // From target/: the source tree's `python/rgk` (no native module) must not shadow the
        // installed package.
        let status =
            Command::new(&py).args(args).current_dir(root.join("target")).status().map_err(|e| e.to_string())?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("{what} failed"))
        }
    };
    let wheel = wheel.to_string_lossy().to_string();
    run(&["-m", "pip", "install", "--quiet", "--no-deps", "--force-reinstall", &wheel], "installing the rgk wheel")?;
    let tests = root.join("python/tests").to_string_lossy().to_string();
    run(&["-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", &tests], "python/tests")?;
    // The bench's Python parts on the CPU: the alternatives script (its eager alternatives
    // against a numpy f64 reference, its CUPTI record parsing and bookkeeping), the A/B table and
    // the profiling script's workload names.
    for test in ["bench/test_torch_alternatives.py", "bench/test_bench_tools.py"] {
        run(&[&root.join(test).to_string_lossy()], test)?;
    }
    Ok(())
}

fn build(root: &Path) -> Result<(), String> {
    let ptx = ptx_build::build(&root.join("target/ptx-build"))?;
    let dest = root.join("target/ptx/kernels.ptx");
    fs::create_dir_all(dest.parent().unwrap()).map_err(|e| e.to_string())?;
    fs::copy(&ptx, &dest).map_err(|e| e.to_string())?;
    println!("PTX: {}", dest.display());
    match ptx_build::find_ptxas() {
        None => println!("ptxas not found (pip install nvidia-cuda-nvcc, or set PTXAS): no register report"),
        Some(ptxas) => {
            let report = ptx_build::ptxas_report(&ptxas, &dest, &root.join("target/ptx/kernels.cubin"))?;
            print_resources(&report);
        }
    }
    Ok(())
}

/// One line per kernel entry: registers, stack frame, spills, shared memory.
fn print_resources(report: &str) {
    let mut current: Option<String> = None;
    let mut props = String::new();
    for line in report.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            current = Some(rest.split('\'').next().unwrap_or("").to_string());
            props.clear();
        } else if current.is_some() && line.contains("bytes stack frame") {
            props = line.trim().to_string();
        } else if let (Some(name), true) = (&current, line.contains("Used ")) {
            let used = line.split("Used ").nth(1).unwrap_or("").trim();
            println!("{name:32} {used}; {props}");
            current = None;
        }
    }
}

/// `device-pack`'s options.
struct PackOptions {
    bench_only: bool,
    base: Option<String>,
    /// `(tag, spec)`: a git revision, or a patch file applied on top of `HEAD`.
    variants: Vec<(String, String)>,
}

fn pack_args(args: &[String]) -> Result<PackOptions, String> {
    let mut o = PackOptions { bench_only: false, base: None, variants: Vec::new() };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--bench-only" => o.bench_only = true,
            "--base" => o.base = Some(it.next().ok_or("device-pack --base needs a revision")?.clone()),
            "--variant" => {
                let v = it.next().ok_or("device-pack --variant needs TAG=REV or TAG=PATCH")?;
                let (tag, spec) =
                    v.split_once('=').ok_or(format!("device-pack --variant {v}: expected TAG=REV or TAG=PATCH"))?;
                let reserved = ["cur", "base"].contains(&tag);
                if tag.is_empty() || reserved || !tag.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
                {
                    return Err(format!(
                        "device-pack --variant {v}: TAG must be letters, digits, '-' or '_', and not cur or base"
                    ));
                }
                if o.variants.iter().any(|(t, _)| t == tag) {
                    return Err(format!("device-pack --variant: tag {tag} given twice"));
                }
                o.variants.push((tag.to_string(), spec.to_string()));
            }
            other => return Err(format!("device-pack: unknown argument {other}")),
        }
    }
    Ok(o)
}

/// A build of the bench: a revision (its commit hash), or `HEAD`'s commit with patch files
/// (absolute paths) applied in order.
#[derive(Clone, Debug, PartialEq)]
enum Spec {
    Rev(String),
    Patch(String, Vec<PathBuf>),
}

impl Spec {
    /// One line for logs and `.device/variants.txt`: the commit, then each patch's file name.
    fn describe(&self) -> String {
        match self {
            Spec::Rev(h) => h[..12].to_string(),
            Spec::Patch(h, ps) => {
                let names: Vec<String> =
                    ps.iter().map(|p| p.file_name().map_or(String::new(), |n| n.to_string_lossy().into())).collect();
                format!("{} + {}", &h[..12], names.join(" + "))
            }
        }
    }
}

/// The commit hash of `rev` in this repository.
fn resolve_rev(root: &Path, rev: &str) -> Result<String, String> {
    // Resolved here: inside the worktree, a relative name such as `HEAD` would name the
    // worktree's own checkout, not this repository's.
    let out = Command::new("git")
        .args(["rev-parse", "--verify", "--quiet", &format!("{rev}^{{commit}}")])
        .current_dir(root)
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!("{rev} is not a commit of this repository"));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Whether `git ARGS` succeeds in `dir`.
fn git_succeeds(dir: &Path, args: &[&str]) -> Result<bool, String> {
    Command::new("git").args(args).current_dir(dir).status().map(|s| s.success()).map_err(|e| format!("git: {e}"))
}

/// A `--variant` SPEC: an existing file (relative to `caller_dir`), or files joined by `+`, are
/// patches on `HEAD`'s commit applied in that order, checked against HEAD's tree (not the
/// working tree); anything else must be a revision.
fn resolve_spec(root: &Path, caller_dir: &Path, spec: &str) -> Result<Spec, String> {
    let parts: Vec<&str> = if caller_dir.join(spec).is_file() { vec![spec] } else { spec.split('+').collect() };
    let is_file = |p: &&str| !p.is_empty() && caller_dir.join(p).is_file();
    if parts.len() > 1 && parts.iter().any(is_file) {
        if let Some(missing) = parts.iter().find(|p| !is_file(p)) {
            return Err(format!("{spec}: no patch file {missing:?} (relative to {})", caller_dir.display()));
        }
    }
    if parts.iter().all(is_file) {
        let paths = parts
            .iter()
            .map(|p| fs::canonicalize(caller_dir.join(p)).map_err(|e| format!("{p}: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        let head = resolve_rev(root, "HEAD")?;
        // `git apply --cached` into a scratch index holding HEAD's tree, one patch after the
        // other, so each is checked on the tree the ones before it leave.
        let _ = fs::create_dir_all(root.join("target"));
        let index = root.join("target/ab-check.index");
        let git = |args: &[&str]| {
            Command::new("git")
                .args(args)
                .current_dir(root)
                .env("GIT_INDEX_FILE", &index)
                .output()
                .map_err(|e| format!("git: {e}"))
        };
        let check = || -> Result<(), String> {
            let read = git(&["read-tree", &head])?;
            if !read.status.success() {
                return Err(format!("git read-tree {head}: {}", String::from_utf8_lossy(&read.stderr).trim()));
            }
            for (i, (name, path)) in parts.iter().zip(&paths).enumerate() {
                let apply = git(&["apply", "--cached", &path.to_string_lossy()])?;
                if !apply.status.success() {
                    let after = if i > 0 { " after the patches before it" } else { "" };
                    return Err(format!(
                        "{name}: the patch does not apply on HEAD ({}){after}: {}",
                        &head[..12],
                        String::from_utf8_lossy(&apply.stderr).trim()
                    ));
                }
            }
            Ok(())
        };
        // The scratch index goes whatever the check found.
        let result = check();
        let _ = fs::remove_file(&index);
        return result.map(|()| Spec::Patch(head, paths));
    }
    resolve_rev(root, spec)
        .map(Spec::Rev)
        .map_err(|_| format!("{spec} is neither a file, nor files joined by '+', nor a commit of this repository"))
}

/// Builds `rgk-bench` of `spec` in the worktree `target/ab-base` (its own target directory, kept
/// between builds so a second variant builds incrementally); returns the binary's path there.
fn build_bench_at(root: &Path, spec: &Spec) -> Result<PathBuf, String> {
    let wt = root.join("target/ab-base");
    let git = |args: &[&str], dir: &Path| -> Result<(), String> {
        if git_succeeds(dir, args)? {
            Ok(())
        } else {
            Err(format!("git {} failed", args.join(" ")))
        }
    };
    let (hash, patches) = match spec {
        Spec::Rev(h) => (h.as_str(), &[][..]),
        Spec::Patch(h, ps) => (h.as_str(), &ps[..]),
    };
    // A clean checkout of the revision: `--force` drops changed files, `clean` the files an
    // earlier patch (or an interrupted build) added; the ignored target directory stays.
    let reset = || -> Result<(), String> {
        git(&["checkout", "--quiet", "--force", "--detach", hash], &wt)?;
        git(&["clean", "-fdq"], &wt)
    };
    if wt.join(".git").exists() {
        reset()?;
    } else {
        git(&["worktree", "add", "--quiet", "--detach", &wt.to_string_lossy(), hash], root)?;
    }
    for patch in patches {
        git(&["apply", &patch.to_string_lossy()], &wt)?;
    }
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "--release", "--quiet", "-p", "rgk-bench"])
        .current_dir(&wt)
        .env("CARGO_TARGET_DIR", wt.join("target"))
        .status()
        .map_err(|e| e.to_string())?;
    if !patches.is_empty() {
        // Leave the worktree at the revision for the next build.
        reset()?;
    }
    let what = spec.describe();
    if !status.success() {
        return Err(format!("building rgk-bench at {what} failed"));
    }
    println!("rgk-bench at {what}");
    Ok(wt.join("target/release/rgk-bench"))
}

/// Copies a bench binary to `dest`, stripped.
fn install_bench(bin: &Path, dest: &Path) -> Result<(), String> {
    fs::copy(bin, dest).map_err(|e| format!("{} → {}: {e}", bin.display(), dest.display()))?;
    let _ = Command::new("strip").arg(dest).status();
    Ok(())
}

/// Builds each `--variant TAG=SPEC` (resolved by [`resolve_spec`]) and packs the binaries as
/// `.device/variants.tar.xz` (one xz stream, so their shared embedded module is stored once),
/// for `run.sh abn` and `RGK_BENCH_TAG=TAG run.sh bench`; `.device/variants.txt` names each
/// tag's build.
fn pack_variants(root: &Path, variants: &[(String, Spec)]) -> Result<(), String> {
    if variants.is_empty() {
        return Ok(());
    }
    let dir = root.join(".device/variants");
    fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let mut specs = String::new();
    for (tag, spec) in variants {
        let bin = build_bench_at(root, spec)?;
        install_bench(&bin, &dir.join(tag))?;
        specs += &format!("{tag} {}\n", spec.describe());
    }
    // Each tag's build, for the results' commit label of `RGK_BENCH_TAG=TAG run.sh bench`.
    fs::write(root.join(".device/variants.txt"), specs).map_err(|e| e.to_string())?;
    xz_pack(&root.join(".device/variants.tar.xz"), &dir, "variants")?;
    fs::remove_dir_all(&dir).map_err(|e| e.to_string())
}

/// The pack's size and how to run it.
fn print_packed(root: &Path, bench_only: bool) -> Result<(), String> {
    let dir = root.join(".device");
    let size: u64 = walk(&dir).iter().map(|p| fs::metadata(p).map(|m| m.len()).unwrap_or(0)).sum();
    let modes = if bench_only { "bench|ab|abn" } else { "tests|sanitize|python|bench|all|ab|abn" };
    println!(
        "packed {} ({:.1} MiB): run it on the GPU machine with `bash .device/run.sh {modes} [ARGS]`",
        dir.display(),
        size as f64 / (1 << 20) as f64
    );
    Ok(())
}

/// `src` (a directory) as `arcname` in the tar.xz `dest`, one xz stream with a 64 MiB dictionary
/// (executables that embed the same module dedupe).
fn xz_pack(dest: &Path, src: &Path, arcname: &str) -> Result<(), String> {
    let status = Command::new("python3")
        .args([
            "-c",
            "import lzma, tarfile, sys; f = lzma.open(sys.argv[1], 'w', filters=[{'id': lzma.FILTER_LZMA2, \
             'preset': 6, 'dict_size': 1 << 26}]); t = tarfile.open(fileobj=f, mode='w'); t.add(sys.argv[2], \
             arcname=sys.argv[3]); t.close(); f.close()",
        ])
        .arg(dest)
        .arg(src)
        .arg(arcname)
        .status()
        .map_err(|e| format!("python3 (packing {}): {e}", src.display()))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("packing {} failed", src.display()))
    }
}

fn bench(root: &Path, args: &[String]) -> Result<(), String> {
    cargo(&["build", "--release", "--quiet", "-p", "rgk-bench"])?;
    let bin = root.join("target/release/rgk-bench");
    let mut cmd = Command::new(bin);
    if let Some(site) = bench_site(root, args) {
        let old = env::var("PYTHONPATH").unwrap_or_default();
        cmd.env("PYTHONPATH", if old.is_empty() { site.clone() } else { format!("{site}:{old}") });
    }
    let path = format!("/usr/local/cuda/bin:{}", env::var("PATH").unwrap_or_default());
    let status =
        cmd.args(args).env("LD_LIBRARY_PATH", ld_path()).env("PATH", path).status().map_err(|e| e.to_string())?;
    if !status.success() {
        return Err(format!("rgk-bench exited with {status}"));
    }
    Ok(())
}

/// A folder for the bench's alternatives' `PYTHONPATH`, unless `args` say `--no-alternatives`
/// or the machine has no GPU (`nvidia-smi` fails: the bench then says so and times nothing):
/// our wheel (the `rgk-torch` column, our kernels timed through the package in that process)
/// and TileOPs at the versions `xtask/peers.py --pins` names, installed with `pip --target` for
/// the bench's interpreter (`--python`, default `python3`, which brings torch) into
/// `target/bench-site/<its version>`, so no environment is modified. A step that fails is
/// reported in one line and the bench times what it can.
fn bench_site(root: &Path, args: &[String]) -> Option<String> {
    if args.iter().any(|a| a == "--no-alternatives") {
        return None;
    }
    if !has_gpu() {
        return None;
    }
    let py = args
        .iter()
        .position(|a| a == "--python")
        .and_then(|i| args.get(i + 1).cloned())
        .or_else(|| args.iter().find_map(|a| a.strip_prefix("--python=").map(String::from)))
        .unwrap_or_else(|| "python3".into());
    let version = Command::new(&py)
        .args(["-c", "import sys; print(f'py{sys.version_info[0]}{sys.version_info[1]}')"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())?;
    let site = root.join("target/bench-site").join(version);
    let pip = |what: &str, extra: &[String]| -> bool {
        let ok = Command::new(&py)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--no-deps",
                "--upgrade",
                "--target",
            ])
            .arg(&site)
            .args(extra)
            .env("PIP_ROOT_USER_ACTION", "ignore")
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            eprintln!("xtask: installing {what} for {py} failed: the bench runs without it");
        }
        ok
    };
    match test_wheel(root, "release", &root.join("target/wheels-bench")) {
        Ok(w) => {
            pip("the rgk wheel", &[w.to_string_lossy().to_string()]);
        }
        Err(e) => eprintln!("xtask: {e}: the rgk-torch column stays empty"),
    }
    let marker = site.join(".tileops-pins");
    let pins = Command::new("python3").arg(root.join("xtask/peers.py")).arg("--pins").output();
    match pins {
        Ok(o) if o.status.success() => {
            let text = String::from_utf8_lossy(&o.stdout).trim().to_string();
            if fs::read_to_string(&marker).ok().as_deref() != Some(text.as_str()) {
                let pins: Vec<String> = text.split_whitespace().map(String::from).collect();
                if pip("TileOPs", &pins) {
                    let _ = fs::write(&marker, &text);
                }
            }
        }
        _ => eprintln!("xtask: python3 xtask/peers.py --pins failed: the bench runs without TileOPs"),
    }
    Some(site.to_string_lossy().to_string())
}

/// Whether this machine has an NVIDIA GPU (`nvidia-smi` runs and succeeds).
fn has_gpu() -> bool {
    Command::new("nvidia-smi").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
}

fn ld_path() -> String {
    let mut p = String::from("/usr/local/cuda/lib64");
    if let Ok(old) = env::var("LD_LIBRARY_PATH") {
        p = format!("{p}:{old}");
    }
    p
}

/// `cargo test --no-run` JSON messages → the test executables, each with its target's source
/// file.
fn test_executables() -> Result<Vec<(PathBuf, PathBuf)>, String> {
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["test", "--workspace", "--release", "--no-run", "--message-format=json"])
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err("building the tests failed".into());
    }
    let mut exes = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        if v["reason"] == "compiler-artifact" && v["profile"]["test"] == true {
            if let (Some(exe), Some(src)) = (v["executable"].as_str(), v["target"]["src_path"].as_str()) {
                exes.push((PathBuf::from(exe), PathBuf::from(src)));
            }
        }
    }
    Ok(exes)
}

/// The peers' pack (`xtask/peers.py`).
fn peers_pack(root: &Path) -> PathBuf {
    root.join("target/peers/peers.tar.xz")
}

fn peers(root: &Path) -> Result<(), String> {
    let status = Command::new("python3")
        .arg(root.join("xtask/peers.py"))
        .arg(root.join("target/peers"))
        .status()
        .map_err(|e| format!("python3 xtask/peers.py: {e}"))?;
    if !status.success() {
        return Err("packing the peers failed (pip download from PyPI)".into());
    }
    Ok(())
}

/// `.device/`: the test executables (unless `bench_only`), the bench, run.sh, the Python
/// package's wheels and the peers' pack.
fn device_pack(root: &Path, bench_only: bool) -> Result<(), String> {
    let dir = root.join(".device");
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(dir.join("tests")).map_err(|e| e.to_string())?;
    let tests = if bench_only { Vec::new() } else { test_executables()? };
    for (exe, src) in tests {
        // target/release/deps/mhc_post-0123abcd → .device/tests/mhc_post
        let name = exe.file_name().unwrap().to_string_lossy().to_string();
        let short = name.rsplit_once('-').map_or(name.as_str(), |(a, _)| a).to_string();
        // CPU-only test executables run here (and in CI); the GPU machine gets the rest. The
        // CPU simulation's tests (`sim/`) share their names with the GPU tests of `tests/`.
        if ["nvptx_link", "ptx_build", "xtask", "rgk_tests", "rgk_bench"].contains(&short.as_str())
            || short.ends_with("_cpu")
            || src.starts_with(root.join("sim"))
        {
            continue;
        }
        let dest = dir.join("tests").join(&short);
        if dest.exists() {
            return Err(format!(
                "two test executables named {short}; the second: {} ({})",
                exe.display(),
                src.display()
            ));
        }
        fs::copy(&exe, &dest).map_err(|e| e.to_string())?;
        // Debug info makes each test executable ~50 MB; the device tool carries 64 MiB in all.
        let _ = Command::new("strip").arg(&dest).status();
    }
    cargo(&["build", "--release", "--quiet", "-p", "rgk-bench"])?;
    fs::copy(root.join("target/release/rgk-bench"), dir.join("rgk-bench")).map_err(|e| e.to_string())?;
    let _ = Command::new("strip").arg(dir.join("rgk-bench")).status();
    let commit = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let dirty = Command::new("git").args(["status", "--porcelain", "--untracked-files=no"]).output().ok();
    let dirty = dirty.is_some_and(|o| !o.stdout.is_empty());
    fs::write(dir.join("COMMIT"), format!("{commit}{}\n", if dirty { "-dirty" } else { "" }))
        .map_err(|e| e.to_string())?;
    fs::copy(root.join("xtask/run-device.sh"), dir.join("run.sh")).map_err(|e| e.to_string())?;
    // The Python package for `run.sh python`: the wheel (release) and pytest's wheels (the GPU
    // machine has torch but no pytest and no network).
    if bench_only {
        // An A/B pack: the bench alone (`--no-alternatives`), no Python side.
    } else if pyenv_python(root).is_file() {
        let wheels = dir.join("wheels");
        test_wheel(root, "release", &wheels)?;
        let status = Command::new(pyenv_python(root))
            .args(["-m", "pip", "download", "--quiet", "--no-deps", "-d"])
            .arg(&wheels)
            .args(["pytest", "pluggy", "iniconfig", "packaging"])
            .status()
            .map_err(|e| e.to_string())?;
        if !status.success() {
            eprintln!("xtask: could not download pytest's wheels; run.sh python needs pytest on the GPU machine");
        }
    } else {
        eprintln!("xtask: no target/pyenv (./x setup): the pack has no Python package");
    }
    if !bench_only && !peers_pack(root).is_file() {
        if let Err(e) = peers(root) {
            eprintln!("xtask: {e}; the bench will run without TileOPs");
        }
    }
    if !bench_only && peers_pack(root).is_file() {
        fs::copy(peers_pack(root), dir.join("peers.tar.xz")).map_err(|e| e.to_string())?;
    }
    // Every executable embeds the same PTX: one xz stream of all of them dedupes it, so the
    // pack stays under the device tool's 64 MiB. run.sh unpacks it.
    if !bench_only {
        xz_pack(&dir.join("tests.tar.xz"), &dir.join("tests"), "tests")?;
    }
    fs::remove_dir_all(dir.join("tests")).map_err(|e| e.to_string())?;
    Ok(())
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

/// Markdown table of a results file: per row ours, TileOPs, the best other alternative, the
/// fastest of all (ratio = its time ÷ ours), the same inside the alternatives' Python process
/// (their fastest ÷ rgk-torch), the copy-chain floor ratio and the errors.
fn table(root: &Path, file: Option<&str>) -> Result<(), String> {
    let path = file.map(PathBuf::from).unwrap_or_else(|| root.join("bench/results/h200.json"));
    let text = fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let doc: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    // Rows of a later run of some ops replace theirs: name each op's commit.
    let mut commits: Vec<(String, String)> = Vec::new();
    for r in doc["rows"].as_array().into_iter().flatten() {
        let (op, commit) = (r["op"].as_str().unwrap_or("?"), r["commit"].as_str().unwrap_or("?"));
        if !commits.iter().any(|(o, c)| o == op && c == commit) {
            commits.push((op.to_string(), commit.to_string()));
        }
    }
    let commits: Vec<String> = commits.iter().map(|(o, c)| format!("{o} {c}")).collect();
    println!(
        "Measured {} on {} (commit per op: {}).\n",
        doc["date"].as_str().unwrap_or("?"),
        doc["gpu"].as_str().unwrap_or("?"),
        commits.join(", ")
    );
    println!(
        "| op | workload | dtype | ours µs | rgk-torch µs (host µs/call) | TileOPs µs (host µs/call) | best other µs | fastest | ratio | ratio in torch | ours/floor | rel_l2 ours | rel_l2 TileOPs | rel_l2 best other | verified |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let us = |v: &serde_json::Value| v.as_f64().map_or("—".to_string(), |ms| format!("{:.2}", ms * 1e3));
    let e = |v: &serde_json::Value| v.as_f64().map_or("—".to_string(), |x| format!("{x:.1e}"));
    // The ops in the order of docs/ops.md (a later run's rows sit at the end of the file).
    const OPS: [&str; 7] = [
        "FFTC2CFwd",
        "MHCPreFwd",
        "MHCPostFwd",
        "MHCPostPreFwd",
        "EngramGateConvFwd",
        "EngramGateConvBwd",
        "EngramDecodeFwd",
    ];
    let mut rows: Vec<&serde_json::Value> = doc["rows"].as_array().into_iter().flatten().collect();
    rows.sort_by_key(|r| OPS.iter().position(|o| r["op"].as_str() == Some(o)).unwrap_or(OPS.len()));
    for r in rows {
        let alts = r["alternatives"].as_object().cloned().unwrap_or_default();
        // An alternative counts when it was timed without error or semantic mismatch.
        let counts = |a: &serde_json::Value| a["error"].is_null() && a["mismatch"].is_null() && a["ms"].is_number();
        let tileops = alts.get("tileops");
        // The host time of an eager call, where the bench measured one (the Python packages).
        let host = |a: &serde_json::Value| a["host_us"].as_f64().map_or(String::new(), |h| format!(" ({h:.1})"));
        let tileops_us = match tileops {
            Some(a) if counts(a) => format!("{}{}", us(&a["ms"]), host(a)),
            Some(a) if a["mismatch"].is_string() => format!("{} (mismatch)", us(&a["ms"])),
            Some(a) if a["error"].is_string() => "error".into(),
            Some(_) => "untimed".into(),
            None => "—".into(),
        };
        // Our kernels through the Python package: shown, never an alternative.
        let via_torch = match alts.get("rgk-torch") {
            Some(a) if a["ms"].is_number() => format!("{}{}", us(&a["ms"]), host(a)),
            Some(a) if a["error"].is_string() => "error".into(),
            _ => "—".into(),
        };
        // The fastest alternative the Python process timed ÷ our kernels timed there (the
        // bench's `Row::torch_process_ratio`).
        let same_process = r["torch_process_ratio"].as_f64().map_or("—".to_string(), |x| format!("{x:.2}"));
        let other = alts
            .iter()
            .filter(|(n, a)| !["tileops", "rgk-torch"].contains(&n.as_str()) && counts(a))
            .min_by(|a, b| a.1["ms"].as_f64().unwrap().total_cmp(&b.1["ms"].as_f64().unwrap()));
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r["op"].as_str().unwrap_or(""),
            r["workload"].as_str().unwrap_or(""),
            r["dtype"].as_str().unwrap_or(""),
            us(&r["ours_ms"]),
            via_torch,
            tileops_us,
            other.map_or("—".to_string(), |(n, a)| format!("{} ({n})", us(&a["ms"]))),
            r["fastest_alternative"].as_str().unwrap_or("—"),
            r["ratio"].as_f64().map_or("—".to_string(), |x| format!("{x:.2}")),
            same_process,
            r["floor_ratio"].as_f64().map_or("—".to_string(), |x| format!("{x:.2}")),
            e(&r["rel_l2_err"]),
            tileops.map_or("—".to_string(), |a| e(&a["rel_l2_err"])),
            other.map_or("—".to_string(), |(_, a)| e(&a["rel_l2_err"])),
            if r["verified"] == true { "yes" } else { "NO" },
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{pack_args, resolve_spec, Spec};

    fn args(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn pack_args_take_variants_and_reject_bad_tags() {
        let o =
            pack_args(&args(&["--bench-only", "--base", "HEAD~1", "--variant", "D=d.diff", "--variant", "E=abc123"]))
                .unwrap();
        assert!(o.bench_only);
        assert_eq!(o.base.as_deref(), Some("HEAD~1"));
        assert_eq!(o.variants, vec![("D".to_string(), "d.diff".to_string()), ("E".to_string(), "abc123".to_string())]);
        let o = pack_args(&[]).unwrap();
        assert!(!o.bench_only && o.base.is_none() && o.variants.is_empty());
        for bad in [
            &["--variant", "cur=x"][..],
            &["--variant", "base=x"],
            &["--variant", "=x"],
            &["--variant", "a b=x"],
            &["--variant", "D"],
            &["--variant"],
            &["--base"],
            &["--variant", "D=x", "--variant", "D=y"],
            &["--frobnicate"],
        ] {
            assert!(pack_args(&args(bad)).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn variant_specs_are_checked_before_any_build() {
        let root = ptx_build::workspace_root();
        // A patch that applies on any tree: it adds a file the repository does not have.
        let dir = std::env::temp_dir().join(format!("rgk-xtask-specs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("adds-a-file.diff");
        std::fs::write(
            &good,
            "diff --git a/rgk-xtask-added b/rgk-xtask-added\nnew file mode 100644\n--- /dev/null\n+++ b/rgk-xtask-added\n@@ -0,0 +1 @@\n+x\n",
        )
        .unwrap();
        // A second patch that changes the file the first adds: it applies only after it.
        std::fs::write(
            dir.join("changes-the-added-file.diff"),
            "diff --git a/rgk-xtask-added b/rgk-xtask-added\n--- a/rgk-xtask-added\n+++ b/rgk-xtask-added\n@@ -1 +1 @@\n-x\n+y\n",
        )
        .unwrap();
        let resolved = resolve_spec(&root, &root, &good.to_string_lossy());
        // Paths relative to the caller's directory.
        let relative = resolve_spec(&root, &dir, "adds-a-file.diff");
        let both = resolve_spec(&root, &dir, "adds-a-file.diff+changes-the-added-file.diff");
        let reversed = resolve_spec(&root, &dir, "changes-the-added-file.diff+adds-a-file.diff");
        let missing = resolve_spec(&root, &dir, "adds-a-file.diff+no-such.diff");
        let _ = std::fs::remove_dir_all(&dir);
        match resolved {
            Ok(Spec::Patch(hash, paths)) => {
                assert!(hash.len() == 40 && paths.len() == 1 && paths[0].is_absolute(), "{hash} {paths:?}")
            }
            other => panic!("{}: {other:?}", good.display()),
        }
        assert!(matches!(relative, Ok(Spec::Patch(..))), "{relative:?}");
        match both {
            Ok(spec @ Spec::Patch(..)) => {
                assert!(spec.describe().ends_with(" + adds-a-file.diff + changes-the-added-file.diff"), "{spec:?}")
            }
            other => panic!("two patches in order: {other:?}"),
        }
        let err = reversed.unwrap_err();
        assert!(err.contains("changes-the-added-file.diff: the patch does not apply"), "{err}");
        let err = missing.unwrap_err();
        assert!(err.contains("no patch file \"no-such.diff\""), "{err}");
        assert!(matches!(resolve_spec(&root, &root, "HEAD"), Ok(Spec::Rev(h)) if h.len() == 40));
        let err = resolve_spec(&root, &root, "no-such-file-or-rev").unwrap_err();
        assert!(err.contains("neither a file"), "{err}");
        let bad = std::env::temp_dir().join(format!("rgk-xtask-bad-{}.diff", std::process::id()));
        std::fs::write(&bad, "--- a/no/such/file\n+++ b/no/such/file\n@@ -1 +1 @@\n-x\n+y\n").unwrap();
        let err = resolve_spec(&root, &root, &bad.to_string_lossy()).unwrap_err();
        let _ = std::fs::remove_file(&bad);
        assert!(err.contains("does not apply on HEAD"), "{err}");
    }
}
