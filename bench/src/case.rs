//! What an op registers with the harness: workloads, and for each a prepared case that can
//! launch our kernel, verify it against the f64 CPU reference, and export its inputs and
//! reference outputs for the PyTorch alternatives.
use rand::rngs::StdRng;
use rgk::Gpu;
use safetensors::Dtype;

/// A tensor for the safetensors exchange file (row-major, little-endian bytes).
pub struct Tensor {
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

impl Tensor {
    pub fn bf16(shape: &[usize], v: &[half::bf16]) -> Self {
        Self { dtype: Dtype::BF16, shape: shape.to_vec(), data: v.iter().flat_map(|x| x.to_le_bytes()).collect() }
    }
    pub fn f16(shape: &[usize], v: &[half::f16]) -> Self {
        Self { dtype: Dtype::F16, shape: shape.to_vec(), data: v.iter().flat_map(|x| x.to_le_bytes()).collect() }
    }
    pub fn f32(shape: &[usize], v: &[f32]) -> Self {
        Self { dtype: Dtype::F32, shape: shape.to_vec(), data: v.iter().flat_map(|x| x.to_le_bytes()).collect() }
    }
    pub fn f64(shape: &[usize], v: &[f64]) -> Self {
        Self { dtype: Dtype::F64, shape: shape.to_vec(), data: v.iter().flat_map(|x| x.to_le_bytes()).collect() }
    }
}

impl safetensors::View for &Tensor {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        std::borrow::Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

/// Our result on one workload against the f64 reference.
#[derive(Clone, Debug)]
pub struct Verification {
    pub verified: bool,
    pub max_abs_err: f64,
    pub rel_l2_err: f64,
    /// One line per output: its check report.
    pub detail: String,
}

/// A workload prepared on the GPU: inputs uploaded, outputs allocated.
pub trait Case {
    /// Launches our implementation once on the harness's stream (asynchronous).
    fn launch(&mut self, gpu: &Gpu) -> rgk::Result<()>;
    /// Poisons the outputs, launches, reads back, and checks every element.
    fn verify(&mut self, gpu: &Gpu) -> rgk::Result<Verification>;
    /// The inputs under the names of docs/ops.md and the f64 references as `ref.<output>`.
    fn tensors(&self) -> Vec<(String, Tensor)>;
    /// Scalar parameters for the alternatives (n, c, eps, ...).
    fn params(&self) -> serde_json::Value;
    /// Alternatives callable from Rust (e.g. cuFFT through cudarc), timed by the harness
    /// exactly like ours and reported beside the Python ones.
    fn native_alternatives(&self) -> Vec<&'static str> {
        Vec::new()
    }
    /// Launches native alternative `name` once (asynchronous, on the harness's stream).
    fn launch_native(&mut self, _gpu: &Gpu, name: &str) -> rgk::Result<()> {
        unreachable!("no native alternative {name}")
    }
    /// Runs native alternative `name` once and measures its error against the reference:
    /// `(rel_l2_err, max_abs_err)`.
    fn error_native(&mut self, _gpu: &Gpu, name: &str) -> rgk::Result<(f64, f64)> {
        unreachable!("no native alternative {name}")
    }
    /// Whether the workload has a copy-chain floor ([`Case::launch_floor`]).
    fn has_floor(&self) -> bool {
        false
    }
    /// Launches the floor once: a plain device copy of the bytes the op must move, in as many
    /// passes as our plan makes, launched the way the plan launches them (asynchronous).
    fn launch_floor(&mut self, _gpu: &Gpu) -> rgk::Result<()> {
        unreachable!("no floor")
    }
}

/// The row name of a workload: the seed's `name`, or `name@tag` for a tuning variant.
pub fn variant_name(name: &'static str, tag: Option<&str>) -> &'static str {
    match tag {
        None => name,
        // Registered once per process: the few bytes live as long as the registry.
        Some(t) => Box::leak(format!("{name}@{t}").into_boxed_str()),
    }
}

/// Builds a workload's case: seeded inputs and the CPU reference, uploaded to the GPU.
pub type Prepare = Box<dyn Fn(&Gpu, &mut StdRng) -> rgk::Result<Box<dyn Case>>>;

/// The CPU-side description of a workload (no GPU needed).
pub struct Workload {
    pub op: &'static str,
    pub name: &'static str,
    /// c64, c128, f16 or bf16.
    pub dtype: &'static str,
    /// Human-readable shapes, as in the seed table of docs/ops.md.
    pub shapes: String,
    /// Analytic FLOP count of one call.
    pub flops: f64,
    /// Fewest bytes one call must move (inputs read once, outputs written once).
    pub bytes: f64,
    /// Arithmetic peak the FLOPs run on (FLOP/s), for SOL.
    pub peak_flops: f64,
    /// Generates seeded inputs and the CPU reference (no GPU), then uploads them.
    pub prepare: Prepare,
}
