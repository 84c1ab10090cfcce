//! The table and `bench/results/h200.json`.
use std::path::Path;

use comfy_table::{presets::UTF8_FULL_CONDENSED, Cell, CellAlignment, Table};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::case::{Verification, Workload};

/// Copy bandwidth measured on the H200 (bytes read + written per second), docs/ops.md.
pub const HBM_BYTES_PER_S: f64 = 4.26e12;

/// Median and spread of a sample, in ms.
#[derive(Clone, Copy, Debug, Default)]
pub struct Stats {
    pub median: f64,
    pub p10: f64,
    pub p90: f64,
    pub calls: usize,
}

impl Stats {
    pub fn of(samples: &[f64]) -> Self {
        let mut s = samples.to_vec();
        s.sort_by(|a, b| a.total_cmp(b));
        if s.is_empty() {
            return Self::default();
        }
        let q = |p: f64| {
            let x = p * (s.len() - 1) as f64;
            let (lo, hi) = (x.floor() as usize, x.ceil() as usize);
            s[lo] + (s[hi] - s[lo]) * (x - lo as f64)
        };
        Self { median: q(0.5), p10: q(0.1), p90: q(0.9), calls: s.len() }
    }
}

/// One alternative's result on one workload, as the script reports it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Alternative {
    pub op: String,
    pub workload: String,
    #[serde(rename = "impl")]
    pub name: String,
    #[serde(default)]
    pub dtype: Option<String>,
    pub ms: Option<f64>,
    #[serde(default)]
    pub p10_ms: Option<f64>,
    #[serde(default)]
    pub p90_ms: Option<f64>,
    #[serde(default)]
    pub calls: Option<usize>,
    #[serde(default)]
    pub kernels_per_call: Option<f64>,
    #[serde(default)]
    pub rel_l2_err: Option<f64>,
    #[serde(default)]
    pub max_abs_err: Option<f64>,
    #[serde(default)]
    pub error: Option<String>,
    /// Set when the output is far less accurate than the eager torch alternative's on the same
    /// inputs (a different function, not a rounding difference): timed, shown, never the
    /// fastest.
    #[serde(default)]
    pub mismatch: Option<String>,
    /// Host time of one eager call in µs (`rgk-torch` only: our kernels through the Python
    /// package).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_us: Option<f64>,
    /// Timed by this process beside ours (cuFFT from Rust, our two ops back to back), not by the
    /// alternatives' Python process.
    #[serde(default)]
    pub native: bool,
}

/// The alternative that is our own kernels called through the Python package: timed and
/// shown, never "the fastest alternative".
pub const RGK_TORCH: &str = "rgk-torch";

impl Alternative {
    /// Whether this alternative competes for "fastest": timed, no error, no semantic mismatch,
    /// not our own kernels ([`RGK_TORCH`]).
    pub fn counts(&self) -> Option<f64> {
        if self.error.is_some() || self.mismatch.is_some() || self.name == RGK_TORCH {
            return None;
        }
        self.ms
    }
}

/// The copy-chain floor of a row (FFT): the same bytes copied in as many passes as our plan.
#[derive(Clone, Copy, Debug)]
pub struct Floor {
    /// Device span per call (union of the copies' intervals).
    pub span: Stats,
    /// Summed kernel time per call.
    pub sum: Stats,
    /// Copies per call.
    pub kernels: usize,
}

pub fn parse_alternatives(text: &str) -> Result<Vec<Alternative>, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let rows = v.get("rows").cloned().unwrap_or(Value::Array(vec![]));
    serde_json::from_value(rows).map_err(|e| e.to_string())
}

/// One row of the table and of the JSON file.
pub struct Row {
    pub op: &'static str,
    pub workload: &'static str,
    pub dtype: &'static str,
    pub shapes: String,
    pub ours: Stats,
    /// Names of the kernels one call launched.
    pub kernels: Vec<String>,
    /// Median duration (ms) of each of those kernels on its own.
    pub kernel_ms: Vec<f64>,
    pub verification: Verification,
    pub alternatives: Vec<Alternative>,
    pub flops: f64,
    pub bytes: f64,
    pub peak_flops: f64,
    pub floor: Option<Floor>,
}

impl Row {
    pub fn new(
        w: &Workload,
        v: &Verification,
        ours: Stats,
        kernels: Vec<String>,
        kernel_ms: Vec<f64>,
        alternatives: Vec<Alternative>,
        floor: Option<Floor>,
    ) -> Self {
        Self {
            op: w.op,
            workload: w.name,
            dtype: w.dtype,
            shapes: w.shapes.clone(),
            ours,
            kernels,
            kernel_ms,
            verification: v.clone(),
            alternatives,
            flops: w.flops,
            bytes: w.bytes,
            peak_flops: w.peak_flops,
            floor,
        }
    }

    /// The fastest alternative that counts ([`Alternative::counts`]): (name, ms).
    pub fn fastest_alternative(&self) -> Option<(&str, f64)> {
        self.alternatives
            .iter()
            .filter_map(|a| a.counts().map(|ms| (a.name.as_str(), ms)))
            .min_by(|a, b| a.1.total_cmp(&b.1))
    }

    /// Ours ÷ the copy-chain floor's span (1: as fast as copying the bytes in as many passes;
    /// a row can land just under 1 where our kernel moves the bytes better than the plain copy).
    pub fn floor_ratio(&self) -> Option<f64> {
        self.floor.map(|f| self.ours.median / f.span.median)
    }

    /// Fastest alternative / ours (> 1: we are faster).
    pub fn ratio(&self) -> Option<f64> {
        self.fastest_alternative().map(|(_, ms)| ms / self.ours.median)
    }

    /// The fastest alternative the Python process timed ÷ our kernels timed there too
    /// ([`RGK_TORCH`]): the comparison made entirely inside one process. The same kernels
    /// measure up to ≈ 10 % slower in the torch process than in this one (README, "Benchmark
    /// method"), so [`Row::ratio`] alone would favour us against alternatives only Python runs.
    pub fn torch_process_ratio(&self) -> Option<f64> {
        torch_process_ratio(&self.alternatives)
    }

    pub fn tflops(&self) -> f64 {
        self.flops / (self.ours.median * 1e-3) / 1e12
    }

    /// (SOL fraction, bound) as docs/ops.md defines them: SOL = max(FLOP/s ÷ peak, bytes/s ÷ 4.26 TB/s); "mem" where
    /// the byte term dominates, "lat" where neither reaches 10 %, else "compute".
    pub fn sol(&self) -> (f64, &'static str) {
        let t = self.ours.median * 1e-3;
        let f = self.flops / t / self.peak_flops;
        let b = self.bytes / t / HBM_BYTES_PER_S;
        let bound = if f.max(b) < 0.1 {
            "lat"
        } else if b >= f {
            "mem"
        } else {
            "compute"
        };
        (f.max(b), bound)
    }
}

/// [`Row::torch_process_ratio`] of a row's alternatives: the fastest that counts and is not
/// native ÷ [`RGK_TORCH`]'s time; `None` without either.
fn torch_process_ratio(alternatives: &[Alternative]) -> Option<f64> {
    let ours = alternatives.iter().find(|a| a.name == RGK_TORCH && a.error.is_none())?.ms?;
    alternatives.iter().filter(|a| !a.native).filter_map(Alternative::counts).min_by(f64::total_cmp).map(|ms| ms / ours)
}

fn alt_names(rows: &[Row]) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for r in rows {
        for a in &r.alternatives {
            if !names.contains(&a.name) {
                names.push(a.name.clone());
            }
        }
    }
    names
}

pub fn print_table(rows: &[Row]) {
    let names = alt_names(rows);
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    let mut header = vec!["op", "workload", "dtype", "ratio", "ratio in torch", "ours ms", "p10–p90 ms"];
    let alt_headers: Vec<String> = names.iter().map(|n| format!("{n} ms")).collect();
    header.extend(alt_headers.iter().map(|s| s.as_str()));
    header.extend(["floor ms", "ours/floor", "TFLOP/s", "SOL", "bound", "rel_l2 ours", "verified"]);
    t.set_header(header);
    for r in rows {
        let (sol, bound) = r.sol();
        let mut cells = vec![
            Cell::new(r.op),
            Cell::new(r.workload),
            Cell::new(r.dtype),
            Cell::new(r.ratio().map_or("—".into(), |x| format!("{x:.2}"))).set_alignment(CellAlignment::Right),
            Cell::new(r.torch_process_ratio().map_or("—".into(), |x| format!("{x:.2}")))
                .set_alignment(CellAlignment::Right),
            Cell::new(format!("{:.5}", r.ours.median)).set_alignment(CellAlignment::Right),
            Cell::new(format!("{:.5}–{:.5}", r.ours.p10, r.ours.p90)),
        ];
        for n in &names {
            let a = r.alternatives.iter().find(|a| &a.name == n);
            let s = match a {
                Some(Alternative { ms: Some(ms), mismatch: Some(_), .. }) => format!("{ms:.5} mismatch"),
                Some(Alternative { ms: Some(ms), .. }) => format!("{ms:.5}"),
                Some(Alternative { error: Some(_), .. }) => "error".into(),
                _ => "—".into(),
            };
            cells.push(Cell::new(s).set_alignment(CellAlignment::Right));
        }
        cells.extend([
            Cell::new(r.floor.map_or("—".into(), |f| format!("{:.5}", f.span.median)))
                .set_alignment(CellAlignment::Right),
            Cell::new(r.floor_ratio().map_or("—".into(), |x| format!("{x:.2}"))).set_alignment(CellAlignment::Right),
            Cell::new(format!("{:.3}", r.tflops())).set_alignment(CellAlignment::Right),
            Cell::new(format!("{:.1}%", sol * 100.0)).set_alignment(CellAlignment::Right),
            Cell::new(bound),
            Cell::new(format!("{:.2e}", r.verification.rel_l2_err)),
            Cell::new(if r.verification.verified { "yes" } else { "NO" }),
        ]);
        t.add_row(cells);
    }
    println!("{t}");
    for r in rows.iter().filter(|r| r.kernels.len() > 1) {
        let parts: Vec<String> =
            r.kernels.iter().zip(&r.kernel_ms).map(|(k, ms)| format!("{k} {:.2} µs", ms * 1e3)).collect();
        println!("kernels: {} {} {}: {}", r.op, r.workload, r.dtype, parts.join(" + "));
    }
    for r in rows {
        for a in &r.alternatives {
            if let Some(e) = &a.error {
                println!("note: {} {} {}: {}", r.op, r.workload, a.name, e.lines().next().unwrap_or(""));
            }
            if let Some(m) = &a.mismatch {
                println!("mismatch: {} {} {} {}: {m}", r.op, r.workload, r.dtype, a.name);
            }
        }
    }
}

/// An alternative's entry in a row of the results file (its op, workload and name are the
/// row's and the key's).
fn alternative_json(a: &Alternative) -> Value {
    let mut v = serde_json::json!({
        "ms": a.ms, "p10_ms": a.p10_ms, "p90_ms": a.p90_ms, "calls": a.calls,
        "kernels_per_call": a.kernels_per_call, "rel_l2_err": a.rel_l2_err,
        "max_abs_err": a.max_abs_err, "error": a.error, "mismatch": a.mismatch,
    });
    if let Some(h) = a.host_us {
        v["host_us"] = h.into();
    }
    if a.native {
        v["native"] = true.into();
    }
    v
}

fn row_json(r: &Row, commit: &str) -> Value {
    let mut alts = serde_json::Map::new();
    for a in &r.alternatives {
        alts.insert(a.name.clone(), alternative_json(a));
    }
    let (sol, bound) = r.sol();
    serde_json::json!({
        "op": r.op, "workload": r.workload, "dtype": r.dtype, "shapes": r.shapes, "commit": commit,
        "ours_ms": r.ours.median, "ours_p10_ms": r.ours.p10, "ours_p90_ms": r.ours.p90,
        "calls": r.ours.calls, "kernels_per_call": r.kernels.len(), "kernels": r.kernels,
        "kernel_ms": r.kernel_ms,
        "verified": r.verification.verified, "max_abs_err": r.verification.max_abs_err,
        "rel_l2_err": r.verification.rel_l2_err, "check": r.verification.detail,
        "fastest_alternative": r.fastest_alternative().map(|(n, _)| n), "ratio": r.ratio(),
        "torch_process_ratio": r.torch_process_ratio(),
        "tflops": r.tflops(), "sol": sol, "bound": bound,
        "flops": r.flops, "bytes": r.bytes,
        "floor_ms": r.floor.map(|f| f.span.median), "floor_sum_ms": r.floor.map(|f| f.sum.median),
        "floor_p10_ms": r.floor.map(|f| f.span.p10), "floor_p90_ms": r.floor.map(|f| f.span.p90),
        "floor_kernels": r.floor.map(|f| f.kernels), "floor_ratio": r.floor_ratio(),
        "alternatives": Value::Object(alts),
    })
}

/// Writes the results file; rows of other ops/workloads already in it are kept.
pub fn write_json(path: &Path, gpu: &str, commit: &str, startup_ms: f64, rows: &[Row]) -> Result<(), String> {
    let mut kept: Vec<Value> = std::fs::read_to_string(path)
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .and_then(|v| v.get("rows").and_then(|r| r.as_array().cloned()))
        .unwrap_or_default();
    kept.retain(|old| {
        !rows.iter().any(|r| old["op"] == r.op && old["workload"] == r.workload && old["dtype"] == r.dtype)
    });
    kept.extend(rows.iter().map(|r| row_json(r, commit)));
    let date = std::process::Command::new("date")
        .arg("-u")
        .arg("+%Y-%m-%d")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let doc = serde_json::json!({
        "gpu": gpu, "date": date, "commit": commit, "startup_ms": startup_ms,
        "method": "CUPTI kernel records, union of one call's kernel intervals; L2 flushed (256 MiB write) and device idle before each call; warm-up excluded; median, p10, p90",
        "rows": kept,
    });
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    }
    std::fs::write(path, serde_json::to_string_pretty(&doc).unwrap() + "\n")
        .map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every field the script reports reaches the results file, the package's host time included.
    #[test]
    fn alternative_entries_keep_the_scripts_fields() {
        let text = r#"{"rows": [
            {"op": "FFTC2CFwd", "workload": "latency-4k", "impl": "rgk-torch", "ms": 0.0035, "p10_ms": 0.0034,
             "p90_ms": 0.0036, "calls": 200, "kernels_per_call": 1, "rel_l2_err": 1.3e-7, "max_abs_err": 3.5e-5,
             "error": null, "mismatch": null, "host_us": 10.6},
            {"op": "FFTC2CFwd", "workload": "latency-4k", "impl": "tileops", "ms": 0.0029, "mismatch": "far off"}
        ]}"#;
        let alts = parse_alternatives(text).unwrap();
        let ours = alternative_json(&alts[0]);
        assert_eq!(ours["host_us"], 10.6);
        assert_eq!(ours["calls"], 200);
        assert_eq!(ours["kernels_per_call"], 1.0);
        assert_eq!(ours["p90_ms"], 0.0036);
        let peer = alternative_json(&alts[1]);
        assert!(peer.get("host_us").is_none());
        assert_eq!(peer["mismatch"], "far off");
        assert_eq!(alts[0].counts(), None, "our own package never counts as the fastest");
        assert_eq!(alts[1].counts(), None, "a mismatch never counts as the fastest");
    }

    /// The in-process ratio compares the Python process's fastest with our kernels timed there:
    /// a faster native alternative (timed by the Rust process) and our own package never count.
    #[test]
    fn torch_process_ratio_stays_inside_the_python_process() {
        let text = r#"{"rows": [
            {"op": "FFTC2CFwd", "workload": "w", "impl": "rgk-torch", "ms": 0.0040},
            {"op": "FFTC2CFwd", "workload": "w", "impl": "tileops", "ms": 0.0036},
            {"op": "FFTC2CFwd", "workload": "w", "impl": "torch-cufft", "ms": 0.0050},
            {"op": "FFTC2CFwd", "workload": "w", "impl": "slow-but-wrong", "ms": 0.0010, "mismatch": "far off"}
        ]}"#;
        let mut alts = parse_alternatives(text).unwrap();
        assert!((torch_process_ratio(&alts).unwrap() - 0.9).abs() < 1e-12);
        let mut native = alts[1].clone();
        native.name = "cufft-rs".into();
        native.ms = Some(0.0020);
        native.native = true;
        alts.push(native);
        assert!((torch_process_ratio(&alts).unwrap() - 0.9).abs() < 1e-12, "a native alternative never enters it");
        assert_eq!(alternative_json(&alts[4])["native"], true);
        assert!(alternative_json(&alts[1]).get("native").is_none());
        alts.remove(0);
        assert_eq!(torch_process_ratio(&alts), None, "no rgk-torch time, no ratio");
    }
}
