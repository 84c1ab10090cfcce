//! `rgk-bench`: the main job. For each registered workload (the seed table of docs/ops.md): generate seeded
//! inputs, run our kernel and verify it against the f64 CPU reference, time it with CUPTI
//! (L2 flushed before every call, warm-up, median/p10/p90), time the PyTorch alternatives on
//! the same inputs in the same run (`bench/torch_alternatives.py`), print the table and write
//! `bench/results/h200.json`.
//!
//! Order: ours (pass 1), the alternatives (forward then reverse, inside the script), ours
//! (pass 2); our samples from both passes are pooled, so drift favours no one.
mod case;
mod cupti;
mod ops;
mod report;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use clap::Parser;
use cudarc::driver::CudaSlice;
use rand::rngs::StdRng;
use rand::SeedableRng;
use rgk::Gpu;

use case::{Case, Verification, Workload};
use report::{Alternative, Floor, Row, Stats};

/// The results file (README's table): only runs with the bench's method write it.
const RESULTS: &str = "bench/results/h200.json";

#[derive(Parser, Debug)]
#[command(about = "Benchmark our kernels against the PyTorch alternatives (CUPTI device time)")]
struct Args {
    /// Only this op (e.g. MHCPostFwd); repeatable.
    #[arg(long)]
    op: Vec<String>,
    /// Only workloads whose name contains this (e.g. hidden-1280); repeatable.
    #[arg(long)]
    workload: Vec<String>,
    /// Timed calls per pass (two passes of ours; the alternatives take as many in all).
    #[arg(long, default_value_t = 50)]
    min_calls: usize,
    /// Timed calls at most per pass.
    #[arg(long, default_value_t = 200)]
    max_calls: usize,
    /// Time budget per workload and pass, seconds (calls stop at max_calls or here, after min_calls).
    #[arg(long, default_value_t = 1.0)]
    budget_s: f64,
    /// The results file: rows of this run replace rows of the same op and workload.
    #[arg(long, default_value = RESULTS)]
    out: PathBuf,
    /// Where inputs for the alternatives go.
    #[arg(long, default_value = "target/bench-work")]
    work_dir: PathBuf,
    /// The alternatives script; `--no-alternatives` skips it.
    #[arg(long, default_value = "bench/torch_alternatives.py")]
    alternatives: PathBuf,
    #[arg(long)]
    no_alternatives: bool,
    /// Also time every launch-configuration variant of each op (tuning; not for the results file).
    #[arg(long)]
    variants: bool,
    /// Python interpreter with torch.
    #[arg(long, default_value = "python3")]
    python: String,
    /// Seed of the input generator.
    #[arg(long, default_value_t = 20261129)]
    seed: u64,
    /// Diagnostic only (never for the results file): skip the L2 flush before each timed call, ours
    /// and the alternatives', so code and data may still sit in L2. Comparing against a normal run
    /// separates each implementation's cold-cache cost.
    #[arg(long)]
    no_flush: bool,
    /// Diagnostic only (never for the results file): allocate this many MiB of device memory
    /// before the cases, which moves every buffer and table to other addresses; comparing runs
    /// with different pads measures how much a row's time depends on placement alone.
    #[arg(long, default_value_t = 0)]
    pad_mib: usize,
    /// Print the selected workloads (one JSON object per line: op, workload, dtype, shapes) and
    /// exit; needs no GPU.
    #[arg(long)]
    list: bool,
}

/// The exit status of a run in which some workload's outputs failed verification (its rows are
/// timed and written all the same).
const VERIFICATION_FAILED: u8 = 3;

fn main() -> ExitCode {
    let started = Instant::now();
    let args = Args::parse();
    match run(&args, started) {
        Ok(true) => ExitCode::SUCCESS,
        // Not 2, which clap returns for a bad argument: `run.sh abn` keeps the rows of a run
        // whose outputs fail verification (a diagnostic build's) and of no other failure.
        Ok(false) => ExitCode::from(VERIFICATION_FAILED),
        Err(e) => {
            eprintln!("rgk-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A user's first result: plan a 4096-point c64 FFT, run it on ones and copy it back; the
/// instant the result is on the host (checked: 4096 at frequency 0).
fn first_result(gpu: &Gpu) -> Result<Instant, rgk::Error> {
    use rgk::fft::{self, FftPlan, Precision};
    use rgk::Complex;
    let mut plan = FftPlan::new(gpu, 4096, 1, Precision::C64)?;
    let x = fft::clone_htod(gpu.stream(), &vec![Complex::new(1.0f32, 0.0); 4096])?;
    let mut y = fft::alloc_zeros::<f32>(gpu.stream(), 4096)?;
    plan.execute_c64(gpu, &x, &mut y)?;
    let y = fft::clone_dtoh(gpu.stream(), &y)?;
    let done = Instant::now();
    if y[0] != Complex::new(4096.0, 0.0) {
        return Err(rgk::Error::Shape { arg: "y", msg: format!("FFT of ones gave {} at frequency 0", y[0]) });
    }
    Ok(done)
}

fn selected(args: &Args) -> Vec<Workload> {
    ops::registry(args.variants)
        .into_iter()
        .filter(|w| args.op.is_empty() || args.op.iter().any(|o| o.eq_ignore_ascii_case(w.op)))
        .filter(|w| args.workload.is_empty() || args.workload.iter().any(|s| w.name.contains(s.as_str())))
        .collect()
}

/// Returns Ok(false) when a workload failed verification.
fn run(args: &Args, started: Instant) -> Result<bool, String> {
    let workloads = selected(args);
    if workloads.is_empty() {
        let mut ops: Vec<&str> = ops::registry(args.variants).iter().map(|w| w.op).collect();
        ops.dedup();
        return Err(format!(
            "no workload matches --op/--workload (ops: {}; --workload matches part of a workload's name)",
            ops.join(", ")
        ));
    }
    if args.list {
        for w in &workloads {
            let line = serde_json::json!({"op": w.op, "workload": w.name, "dtype": w.dtype, "shapes": w.shapes});
            println!("{line}");
        }
        return Ok(true);
    }
    // The diagnostics must not overwrite the results file (the listing above writes none).
    if (args.no_flush || args.pad_mib > 0) && args.out == Path::new(RESULTS) {
        return Err(format!("--no-flush and --pad-mib are diagnostics: give --out a file other than {RESULTS}"));
    }
    if !rgk::cuda_available() {
        println!(
            "no CUDA device: the benchmark needs an NVIDIA GPU (sm_90); {} workload(s) selected, built and ready, nothing timed",
            workloads.len()
        );
        return Err("no CUDA device".into());
    }
    if !cupti::available() {
        return Err("libcupti not found: add /usr/local/cuda/lib64 (or your CUDA's lib64) to LD_LIBRARY_PATH".into());
    }
    cupti::start()?;
    let t_new = Instant::now();
    let gpu = Gpu::new(0).map_err(|e| e.to_string())?;
    let new_ms = t_new.elapsed().as_secs_f64() * 1e3;
    let startup_ms =
        first_result(&gpu).map_err(|e| format!("start-up FFT: {e}"))?.duration_since(started).as_secs_f64() * 1e3;
    println!(
        "startup: first op result {startup_ms:.0} ms after the bench started (Gpu::new {new_ms:.0} ms, kernels from {}; then a 4096-point FFT planned, run and copied back; CUPTI on)",
        if gpu.kernels_from_cubin() { "the embedded cubin" } else { "the PTX, compiled by the driver" }
    );
    cupti::drain()?;
    let gpu_name = gpu.context().name().unwrap_or_default();
    let st = gpu.stream().clone();
    // A buffer well over the 60 MB L2, written before every timed call.
    let mut flush: CudaSlice<u8> = st.alloc_zeros(256 << 20).map_err(|e| e.to_string())?;

    let _pad: Option<CudaSlice<u8>> =
        if args.pad_mib > 0 { Some(st.alloc_zeros(args.pad_mib << 20).map_err(|e| e.to_string())?) } else { None };
    std::fs::create_dir_all(&args.work_dir).map_err(|e| e.to_string())?;
    let mut cases: Vec<Box<dyn Case>> = Vec::new();
    let mut verifications: Vec<Verification> = Vec::new();
    let mut manifest = Vec::new();
    for (i, w) in workloads.iter().enumerate() {
        let mut rng = StdRng::seed_from_u64(args.seed.wrapping_add(i as u64));
        let mut case = (w.prepare)(&gpu, &mut rng).map_err(|e| format!("{} {}: {e}", w.op, w.name))?;
        let v = case.verify(&gpu).map_err(|e| format!("{} {}: {e}", w.op, w.name))?;
        println!("{} {}: verified={} ({})", w.op, w.name, v.verified, v.detail);
        // The dtype is part of the key: FFT throughput-4k exists in c64 and c128.
        let file = format!("{}__{}__{}.safetensors", w.op, w.name, w.dtype);
        let tensors = case.tensors();
        safetensors::serialize_to_file(tensors.iter().map(|(k, t)| (k.clone(), t)), None, &args.work_dir.join(&file))
            .map_err(|e| e.to_string())?;
        manifest.push(serde_json::json!({
            "op": w.op, "workload": w.name, "dtype": w.dtype, "file": file, "params": case.params(),
        }));
        cases.push(case);
        verifications.push(v);
    }
    let manifest_path = args.work_dir.join("manifest.json");
    std::fs::write(&manifest_path, serde_json::to_string_pretty(&serde_json::json!({ "entries": manifest })).unwrap())
        .map_err(|e| e.to_string())?;

    // Pass 1 of ours (and the native alternatives, forward order), the Python alternatives,
    // pass 2 (reverse order).
    let mut timings: Vec<Vec<Timing>> = cases.iter().map(|c| impls(c.as_ref())).collect();
    time_rust(args, &gpu, &mut flush, &mut cases, &mut timings, false)?;
    let mut alternatives = if args.no_alternatives { Vec::new() } else { run_alternatives(args, &manifest_path) };
    time_rust(args, &gpu, &mut flush, &mut cases, &mut timings, true)?;
    if std::env::var_os("RGK_BENCH_GAPS").is_some() {
        // Diagnostic: how our kernels of one call sit in time (launch latency, overlap).
        for (w, t) in workloads.iter().zip(&timings) {
            let gaps: Vec<String> =
                t[0].gap_samples.iter().skip(1).map(|g| format!("{:+.2} µs", 1e3 * Stats::of(g).median)).collect();
            println!(
                "gaps: {} {}: host launch call {:.1} µs; next kernel's start − previous kernel's end (median): {}",
                w.op,
                w.name,
                1e3 * Stats::of(&t[0].host_samples).median,
                gaps.join(", ")
            );
        }
    }
    for ((w, case), t) in workloads.iter().zip(cases.iter_mut()).zip(&timings) {
        for native in t.iter() {
            let Impl::Native(name) = native.what else { continue };
            let (rel, abs) = case.error_native(&gpu, name).map_err(|e| e.to_string())?;
            let st = Stats::of(&native.samples);
            alternatives.push(Alternative {
                op: w.op.to_string(),
                workload: w.name.to_string(),
                name: name.to_string(),
                dtype: Some(w.dtype.to_string()),
                ms: Some(st.median),
                p10_ms: Some(st.p10),
                p90_ms: Some(st.p90),
                calls: Some(st.calls),
                kernels_per_call: Some(native.kernels.len() as f64),
                rel_l2_err: Some(rel),
                max_abs_err: Some(abs),
                error: None,
                mismatch: None,
                host_us: None,
                native: true,
            });
        }
    }

    let rows: Vec<Row> = workloads
        .iter()
        .zip(&verifications)
        .zip(&timings)
        .map(|((w, v), t)| {
            let alts = alternatives
                .iter()
                .filter(|a| a.op == w.op && a.workload == w.name && a.dtype.as_deref().is_none_or(|d| d == w.dtype))
                .cloned()
                .collect();
            let kernel_ms = t[0].kernel_samples.iter().map(|k| Stats::of(k).median).collect();
            let floor = t.iter().find(|x| x.what == Impl::Floor).map(|f| Floor {
                span: Stats::of(&f.samples),
                sum: Stats::of(&f.sum_samples),
                kernels: f.kernels.len(),
            });
            Row::new(w, v, Stats::of(&t[0].samples), t[0].kernels.clone(), kernel_ms, alts, floor)
        })
        .collect();
    report::print_table(&rows);
    let commit = std::env::var("RGK_COMMIT").ok().or_else(git_commit).unwrap_or_else(|| "unknown".into());
    report::write_json(&args.out, &gpu_name, &commit, startup_ms, &rows)?;
    println!("wrote {}", args.out.display());
    let all_ok = verifications.iter().all(|v| v.verified);
    if !all_ok {
        eprintln!("rgk-bench: a workload FAILED verification (see above)");
    }
    Ok(all_ok)
}

/// What one [`Timing`] times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Impl {
    Ours,
    /// An alternative callable from Rust (cuFFT).
    Native(&'static str),
    /// The workload's copy-chain floor (FFT rows): the same bytes copied in as many passes.
    Floor,
}

/// The samples of one implementation on one workload: ours (index 0), a native alternative or
/// the floor.
struct Timing {
    what: Impl,
    /// Per call, the union of its kernels' intervals (ms).
    samples: Vec<f64>,
    /// Per call, the sum of its kernels' durations (ms).
    sum_samples: Vec<f64>,
    kernels: Vec<String>,
    /// Per call, each kernel's own duration (ms), in launch order.
    kernel_samples: Vec<Vec<f64>>,
    /// Per call, each kernel's start minus the previous kernel's end (ms; negative = overlap).
    gap_samples: Vec<Vec<f64>>,
    /// Per call, the host time of the launch call itself (ms).
    host_samples: Vec<f64>,
}

fn impls(case: &dyn Case) -> Vec<Timing> {
    std::iter::once(Impl::Ours)
        .chain(case.native_alternatives().into_iter().map(Impl::Native))
        .chain(case.has_floor().then_some(Impl::Floor))
        .map(|what| Timing {
            what,
            samples: Vec::new(),
            sum_samples: Vec::new(),
            kernels: Vec::new(),
            kernel_samples: Vec::new(),
            gap_samples: Vec::new(),
            host_samples: Vec::new(),
        })
        .collect()
}

/// Times ours and the native alternatives of every case (in reverse order when `reverse`):
/// per call, flush L2, sync, launch, sync, and read that call's kernel records.
fn time_rust(
    args: &Args,
    gpu: &Gpu,
    flush: &mut CudaSlice<u8>,
    cases: &mut [Box<dyn Case>],
    timings: &mut [Vec<Timing>],
    reverse: bool,
) -> Result<(), String> {
    let st = gpu.stream().clone();
    let e = |e: &dyn std::fmt::Display| e.to_string();
    for (case, timing) in cases.iter_mut().zip(timings.iter_mut()) {
        let mut order: Vec<usize> = (0..timing.len()).collect();
        if reverse {
            order.reverse();
        }
        for k in order {
            let what = timing[k].what;
            let launch = |case: &mut Box<dyn Case>| match what {
                Impl::Ours => case.launch(gpu),
                Impl::Native(name) => case.launch_native(gpu, name),
                Impl::Floor => case.launch_floor(gpu),
            };
            // Warm-up: first launches, plan caches of the driver.
            for _ in 0..5 {
                launch(case).map_err(|x| e(&x))?;
            }
            st.synchronize().map_err(|x| e(&x))?;
            cupti::drain()?;
            let t0 = Instant::now();
            let mut n = 0;
            while n < args.min_calls || (n < args.max_calls && t0.elapsed() < Duration::from_secs_f64(args.budget_s)) {
                if !args.no_flush {
                    flush_l2(gpu, flush, n as u8)?;
                }
                st.synchronize().map_err(|x| e(&x))?;
                cupti::drain()?;
                let h0 = Instant::now();
                launch(case).map_err(|x| e(&x))?;
                timing[k].host_samples.push(h0.elapsed().as_secs_f64() * 1e3);
                st.synchronize().map_err(|x| e(&x))?;
                let recs = cupti::drain()?;
                if recs.is_empty() {
                    return Err(format!("CUPTI delivered no kernel record for a timed call of {what:?}"));
                }
                let mut recs = recs;
                recs.sort_by_key(|r| r.start);
                timing[k].kernels = recs.iter().map(|r| r.name.clone()).collect();
                if timing[k].kernel_samples.len() < recs.len() {
                    timing[k].kernel_samples.resize(recs.len(), Vec::new());
                }
                for (i, r) in recs.iter().enumerate() {
                    timing[k].kernel_samples[i].push(r.end.saturating_sub(r.start) as f64 * 1e-6);
                }
                if timing[k].gap_samples.len() < recs.len() {
                    timing[k].gap_samples.resize(recs.len(), Vec::new());
                }
                for i in 1..recs.len() {
                    timing[k].gap_samples[i].push((recs[i].start as f64 - recs[i - 1].end as f64) * 1e-6);
                }
                timing[k].samples.push(cupti::union_ns(&recs) as f64 * 1e-6);
                timing[k]
                    .sum_samples
                    .push(recs.iter().map(|r| r.end.saturating_sub(r.start)).sum::<u64>() as f64 * 1e-6);
                n += 1;
            }
        }
    }
    Ok(())
}

/// Writes the whole flush buffer (a memset: no kernel record) so no input stays in L2.
fn flush_l2(gpu: &Gpu, flush: &mut CudaSlice<u8>, value: u8) -> Result<(), String> {
    use cudarc::driver::DevicePtrMut;
    let st = gpu.stream();
    let n = flush.len();
    let (p, _g) = flush.device_ptr_mut(st);
    unsafe { cudarc::driver::result::memset_d8_async(p, value, n, st.cu_stream()) }.map_err(|e| e.to_string())
}

/// Runs the PyTorch alternatives on the manifest; a failure there is reported, not fatal.
fn run_alternatives(args: &Args, manifest: &Path) -> Vec<Alternative> {
    let out = args.work_dir.join("alternatives.json");
    let _ = std::fs::remove_file(&out);
    let status = Command::new(&args.python)
        .arg(&args.alternatives)
        .arg("--manifest")
        .arg(manifest)
        .arg("--out")
        .arg(&out)
        .arg("--min-calls")
        .arg(args.min_calls.to_string())
        .arg("--max-calls")
        .arg(args.max_calls.to_string())
        .arg("--budget-s")
        .arg(args.budget_s.to_string())
        .args(args.no_flush.then_some("--no-flush"))
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => eprintln!("rgk-bench: the alternatives script exited with {s}"),
        Err(e) => eprintln!("rgk-bench: could not run {} {}: {e}", args.python, args.alternatives.display()),
    }
    match std::fs::read_to_string(&out) {
        Ok(text) => report::parse_alternatives(&text).unwrap_or_else(|e| {
            eprintln!("rgk-bench: {}: {e}", out.display());
            Vec::new()
        }),
        Err(_) => {
            eprintln!("rgk-bench: no alternatives timed (no {})", out.display());
            Vec::new()
        }
    }
}

fn git_commit() -> Option<String> {
    let out = Command::new("git").args(["rev-parse", "--short=12", "HEAD"]).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}
