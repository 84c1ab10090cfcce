//! The embedded PTX is self-contained, every kernel assembles for sm_90 without spills, and an
//! sm_90 device loads the embedded machine code.
use std::collections::BTreeSet;

#[test]
fn ptx_is_self_contained() {
    let ptx = rgk::KERNELS_PTX;
    assert!(ptx.contains(".target sm_90"), "PTX does not target sm_90");
    let mut declared = BTreeSet::new();
    let mut defined = BTreeSet::new();
    let lines: Vec<&str> = ptx.lines().collect();
    for (i, l) in lines.iter().enumerate() {
        let t = l.trim_start();
        assert!(!t.starts_with(".extern .func"), "external function: {t}");
        for kw in [".func ", ".visible .func ", ".weak .func "] {
            if let Some(rest) = t.strip_prefix(kw) {
                // `.func (ret) name(` or `.func name(`; a definition is followed by `{`.
                let rest = rest.trim_start();
                let rest = if rest.starts_with('(') { rest.split_once(')').unwrap().1.trim_start() } else { rest };
                let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '$').collect();
                let body = lines[i..].iter().take(40).find(|l| l.trim() == "{" || l.trim().ends_with(';'));
                if body.is_some_and(|l| l.trim() == "{") {
                    defined.insert(name);
                } else {
                    declared.insert(name);
                }
            }
        }
    }
    let missing: Vec<_> = declared.difference(&defined).collect();
    assert!(missing.is_empty(), "declared but not defined in the PTX: {missing:?}");
}

/// Checks one `ptxas -v` report of the embedded PTX: every entry compiled; `Err` with the report's
/// lines that spill (none allowed).
fn check_report(report: &str) -> Result<(), String> {
    let entries = rgk::KERNELS_PTX.matches(".entry ").count();
    let compiled = report.matches("Compiling entry function").count();
    assert_eq!(entries, compiled, "ptxas compiled {compiled} of {entries} entries:\n{report}");
    // ptxas prints `Function properties for NAME`, then the line with its stack and spills.
    let mut kernel = "";
    let mut spills = Vec::new();
    for l in report.lines() {
        if let Some(name) = l.split("Function properties for ").nth(1) {
            kernel = name.trim();
        } else if l.contains("spill") && !l.contains("0 bytes spill stores, 0 bytes spill loads") {
            spills.push(format!("{kernel}: {}", l.trim()));
        }
    }
    if spills.is_empty() {
        Ok(())
    } else {
        Err(spills.join("\n"))
    }
}

/// The shipped machine code (the build's cubin) has no spills, and every kernel assembles for
/// sm_90 with the `ptxas` found here. Spills are an error for the ptxas release that built the
/// cubin; another release's are printed, not failed: an sm_90 device runs the build's cubin
/// (`sm90_loads_the_embedded_machine_code`), and releases allocate registers differently
/// (measured: ptxas 13.0.88 spills 4 bytes in `fft_c128_l11_tw_per_stage_rows2_out512`, fitted to
/// 128 registers, where 13.5.37 spills none).
#[test]
fn every_kernel_assembles_for_sm90() {
    let built = rgk::KERNELS_CUBIN_REPORT;
    let built_release = built.lines().next().unwrap_or("");
    if rgk::KERNELS_CUBIN.is_empty() {
        println!("every_kernel_assembles_for_sm90: no embedded cubin (the build found no ptxas)");
    } else {
        assert!(!built.is_empty(), "an embedded cubin without its ptxas report");
        if let Err(spills) = check_report(built) {
            panic!("the embedded cubin ({built_release}) spills:\n{spills}");
        }
    }
    let Some(ptxas) = ptx_build::find_ptxas() else {
        println!("every_kernel_assembles_for_sm90: skipped: ptxas not found (pip install nvidia-cuda-nvcc)");
        return;
    };
    let release = ptx_build::ptxas_version(&ptxas).unwrap_or_default();
    let dir = std::env::temp_dir().join(format!("rgk-ptxas-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ptx = dir.join("kernels.ptx");
    std::fs::write(&ptx, rgk::KERNELS_PTX).unwrap();
    let report = ptx_build::ptxas_report(&ptxas, &ptx, &dir.join("kernels.cubin")).unwrap_or_else(|e| panic!("{e}"));
    std::fs::remove_dir_all(&dir).ok();
    match check_report(&report) {
        Ok(()) => println!("every_kernel_assembles_for_sm90: {release}: every entry, no spills"),
        Err(spills) if rgk::KERNELS_CUBIN.is_empty() || release == built_release => {
            panic!("{release} (the build's ptxas) spills:\n{spills}")
        }
        Err(spills) => println!(
            "every_kernel_assembles_for_sm90: {release} (not the build's {built_release}, whose cubin the device runs) spills:\n{spills}"
        ),
    }
}

/// Where the build embedded sm_90 machine code (it found ptxas), an sm_90 device loads it — no
/// JIT compilation of the PTX at start-up; prints how long `Gpu::new` took.
#[test]
fn sm90_loads_the_embedded_machine_code() {
    if !rgk::cuda_available() {
        println!("sm90_loads_the_embedded_machine_code: skipped: no CUDA device");
        return;
    }
    let t = std::time::Instant::now();
    let gpu = rgk::Gpu::new(0).expect("opening the device");
    let ms = t.elapsed().as_secs_f64() * 1e3;
    use rgk::cudarc::driver::sys::CUdevice_attribute as A;
    let cc = |a| gpu.context().attribute(a).unwrap();
    let (major, minor) =
        (cc(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR), cc(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR));
    println!(
        "Gpu::new: {ms:.0} ms on sm_{major}{minor}, kernels from {} ({} bytes of cubin embedded)",
        if gpu.kernels_from_cubin() { "the cubin" } else { "the PTX" },
        rgk::KERNELS_CUBIN.len()
    );
    if (major, minor) == (9, 0) && !rgk::KERNELS_CUBIN.is_empty() {
        assert!(gpu.kernels_from_cubin(), "an sm_90 device did not load the embedded sm_90 cubin");
    }
}

/// A new `Gpu` looks up no kernel; each op family's functions are looked up on its first use,
/// once per context, and handles on other streams share them and run the same kernels.
#[test]
fn kernel_families_load_on_first_use_and_stream_handles_share_them() {
    use rgk::fft::{self, FftPlan, Precision};
    use rgk::mhc::{self, MhcPostInputs, MhcPostOutputs, MhcPostShape};
    use rgk::{bf16, Complex};
    let Some(gpu) = rgk_tests::gpu_or_skip("ptx::kernel_families_load_on_first_use") else { return };
    assert!(gpu.loaded_kernel_families().is_empty(), "Gpu::new looked up {:?}", gpu.loaded_kernel_families());
    let other = gpu.new_stream().unwrap();
    let mut plan = FftPlan::new(&other, 4096, 2, Precision::C64).unwrap();
    assert_eq!(gpu.loaded_kernel_families(), ["fft"]);
    let x = fft::clone_htod(other.stream(), &vec![Complex::new(1.0f32, 0.0); 8192]).unwrap();
    let mut y = fft::alloc_zeros::<f32>(other.stream(), 8192).unwrap();
    plan.execute_c64(&other, &x, &mut y).unwrap();
    let y = fft::clone_dtoh(other.stream(), &y).unwrap();
    // The transform of a constant row of ones is 4096 at frequency 0, zero elsewhere.
    for row in y.chunks(4096) {
        assert_eq!(row[0], Complex::new(4096.0, 0.0));
        assert!(row[1..].iter().all(|v| v.norm() == 0.0), "FFT of ones on a second stream");
    }
    let s = MhcPostShape { batch: 2, n: 4, c: 64 };
    let st = gpu.stream();
    let yl = st.clone_htod(&vec![bf16::from_f32(0.5); s.batch * s.c]).unwrap();
    let h = st.clone_htod(&vec![2.0f32; s.batch * s.n]).unwrap();
    let r = st.clone_htod(&vec![bf16::from_f32(0.25); s.batch * s.n * s.c]).unwrap();
    let mut out = st.alloc_zeros::<bf16>(s.batch * s.n * s.c).unwrap();
    let inputs = MhcPostInputs { x_layer_out: &yl, h_post: &h, x_res: &r };
    mhc::post_fwd(&gpu, s, inputs, MhcPostOutputs { x_out: &mut out }).unwrap();
    assert_eq!(other.loaded_kernel_families(), ["mhc_post", "fft"]);
    let out: Vec<bf16> = st.clone_dtoh(&out).unwrap();
    // x_out = q(h_post·x_layer_out + x_res) = 2·0.5 + 0.25, exact in bf16.
    assert!(out.iter().all(|v| v.to_f32() == 1.25), "MHCPostFwd after FFT on another stream");
    let foreign = gpu.with_stream(other.stream().clone()).unwrap();
    assert_eq!(foreign.loaded_kernel_families(), ["mhc_post", "fft"]);
}

/// Kernels whose collectives the conservative analysis of [`ptx_build::divergence`] cannot
/// prove uniform. Its findings here are all of one shape: a barrier or shuffle after a
/// thread-strided loop (`for i in (tid..n).step_by(blockDim)`) nested in an outer loop, which
/// the analysis does not see reconverge. Not known bugs: every one runs in the sanitizer set
/// under synccheck (`tests/sanitize.list`, `run.sh sanitize`) and in its op's GPU tests. A
/// kernel joins this list only with that evidence; a finding in any other kernel fails.
const UNPROVEN_BY_THE_DIVERGENCE_ANALYSIS: &[&str] = &[
    "engram_decode_bf16_project_mma",
    "engram_decode_f16_project_mma",
    "mhc_pre_mix",
    "mhc_pre_partial_slab",
    "mhc_pre_partial_slab_fixed_point",
    // The same body, adding into two copies of the accumulators.
    "mhc_pre_partial_slab_fixed_point_acc2",
    // The same body as mhc_pre_partial_slab_fixed_point, x computed from the post half's inputs.
    "mhc_post_pre_partial_slab_fixed_point",
    // That body again, adding into two copies of the accumulators.
    "mhc_post_pre_partial_slab_fixed_point_acc2",
];

/// Every warp collective runs on all lanes of its warp and every CTA barrier on all threads of
/// its block, in every kernel of the module (LLVM can sink a `pure` shuffle into a lane branch:
/// a deadlock on the GPU that the Rust source does not show).
#[test]
fn no_kernel_has_divergent_collectives() {
    let all = ptx_build::divergence::check_module(rgk::KERNELS_PTX);
    assert_eq!(all.len(), rgk_tests::module_entries().len());
    let mut bad = vec![];
    for (name, findings) in &all {
        let allowed = UNPROVEN_BY_THE_DIVERGENCE_ANALYSIS.contains(&name.as_str());
        if allowed {
            println!("{name}: {} unproven sites (allowed: see the list's comment)", findings.len());
            continue;
        }
        for f in findings {
            bad.push(format!("{name}: PTX line {}: {}", f.line, f.msg));
        }
    }
    assert!(bad.is_empty(), "divergent collectives:\n{}", bad.join("\n"));
    for name in UNPROVEN_BY_THE_DIVERGENCE_ANALYSIS {
        assert!(all.iter().any(|(n, _)| n == name), "{name} is allow-listed but not in the module");
    }
}

/// Every PTX entry of the module is launched by some op's planner for some valid shape, and
/// every kernel a planner launches is in the module: the module ships no kernel that nothing
/// can run.
#[test]
fn module_entries_are_exactly_the_planned_kernels() {
    let Some(gpu) = rgk_tests::gpu_or_skip("module_entries_are_exactly_the_planned_kernels") else {
        return;
    };
    let entries = rgk_tests::module_entries();
    let mut planned: BTreeSet<&'static str> = BTreeSet::new();
    let mut add = |family: &str, names: BTreeSet<&'static str>| {
        assert!(!names.is_empty(), "{family}: the planner sweep found no kernel");
        planned.extend(names);
    };
    add("fft", rgk::fft::planned_kernels(&gpu).unwrap());
    add("mhc", rgk::mhc::planned_kernels(&gpu).unwrap());
    add("engram gate conv", rgk::engram::gate_conv_planned_kernels(&gpu).unwrap());
    add("engram decode", rgk::engram::decode_planned_kernels(&gpu).unwrap());
    let unplanned: Vec<_> = entries.difference(&planned).collect();
    let missing: Vec<_> = planned.difference(&entries).collect();
    assert!(unplanned.is_empty(), "PTX entries no planner launches: {unplanned:?}");
    assert!(missing.is_empty(), "planned kernels missing from the module: {missing:?}");
}

/// `(name, log_l, e, form)` of every FFT pass kernel, from the list the entries are declared
/// from.
macro_rules! fft_pass_rows {
    ($($name:ident: $prec:ident, $log_l:literal, $e:literal, $form:ident, $max:literal, $layout:expr;)*) => {
        &[$((stringify!($name), $log_l, $e, stringify!($form)),)*]
    };
}

/// Per function of the embedded cubin's SASS (`nvdisasm`), its instruction lines.
fn sass_functions(nvdisasm: &std::path::Path) -> std::collections::BTreeMap<String, Vec<String>> {
    let dir = std::env::temp_dir().join(format!("rgk-sass-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cubin = dir.join("kernels.cubin");
    std::fs::write(&cubin, rgk::KERNELS_CUBIN).unwrap();
    let out = std::process::Command::new(nvdisasm).arg("-c").arg(&cubin).output().expect("running nvdisasm");
    assert!(out.status.success(), "nvdisasm failed: {}", String::from_utf8_lossy(&out.stderr));
    std::fs::remove_dir_all(&dir).ok();
    let mut funcs = std::collections::BTreeMap::new();
    let mut cur: Option<String> = None;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        if let Some(name) = line.strip_prefix(".text.").and_then(|l| l.strip_suffix(':')) {
            cur = Some(name.to_string());
            funcs.insert(name.to_string(), Vec::new());
        } else if let (Some(c), Some(i)) = (&cur, line.trim_start().strip_prefix("/*")) {
            if let Some((_, ins)) = i.split_once("*/") {
                funcs.get_mut(c).unwrap().push(ins.trim().to_string());
            }
        }
    }
    funcs
}

/// Every FFT pass whose stage twiddles are loaded at kernel entry (`Hoisted`, `PingPong`, more
/// than one stage) issues some of those loads before it waits for the previous pass
/// (`griddepcontrol.wait`, SASS `ACQBULK`), so their DRAM trips overlap the previous pass's
/// tail. The order is ptxas's: an unconditional wait gets hoisted above the loads, the
/// measured-slower schedule (longconv-64k +0.43 µs); the wait's runtime branch prevents it.
/// (The single-pass ping-pong kernels wait unconditionally, a no-op for them, and ptxas still
/// issues their twiddle loads first.)
#[test]
fn fft_hoisted_twiddle_loads_precede_the_grid_dependency_wait() {
    if rgk::KERNELS_CUBIN.is_empty() {
        println!(
            "fft_hoisted_twiddle_loads_precede_the_grid_dependency_wait: skipped: no cubin (the build found no ptxas)"
        );
        return;
    }
    let Some(nvdisasm) = ptx_build::find_cuda_tool("nvdisasm") else {
        println!("fft_hoisted_twiddle_loads_precede_the_grid_dependency_wait: skipped: no nvdisasm (pip install nvidia-cuda-nvdisasm)");
        return;
    };
    let funcs = sass_functions(&nvdisasm);
    let rows: &[(&str, u32, u32, &str)] = kernel_abi::fft_pass_kernels!(fft_pass_rows);
    let mut checked = 0;
    for &(name, log_l, e, form) in rows {
        let sass = funcs.get(name).unwrap_or_else(|| panic!("{name} is not in the cubin"));
        let wait = sass.iter().rposition(|i| i.starts_with("ACQBULK")).unwrap_or_else(|| panic!("{name}: no ACQBULK"));
        let loads_before = sass[..wait].iter().filter(|i| i.contains("LDG.") && !i.contains("LDGSTS")).count();
        if matches!(form, "Hoisted" | "PingPong") && log_l > e.trailing_zeros() {
            assert!(loads_before > 0, "{name}: no twiddle load is issued before the grid dependency wait");
            checked += 1;
        }
        println!("{name}: {loads_before} global loads before the wait");
    }
    assert!(checked >= 15, "only {checked} hoisted multi-stage kernels found");
}
