//! Shared helpers of the integration tests: the GPU (or a skip), fresh seeded randomness.
use rand::rngs::StdRng;
use rand::SeedableRng;
use rand_distr::{Distribution, Normal};
use rgk::verify::Half;
use rgk::Gpu;

/// The GPU, or `None` after printing `skipped: no CUDA device` (the test then passes).
pub fn gpu_or_skip(test: &str) -> Option<Gpu> {
    if !rgk::cuda_available() {
        println!("{test}: skipped: no CUDA device");
        return None;
    }
    Some(Gpu::new(0).expect("a CUDA device is present but the library failed to open it"))
}

/// A fresh generator, seeded from `RGK_SEED` or the clock; the seed is printed so a failure
/// can be replayed.
pub fn fresh_rng(test: &str) -> StdRng {
    let seed = std::env::var("RGK_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    println!("{test}: seed {seed} (replay with RGK_SEED={seed})");
    StdRng::seed_from_u64(seed)
}

/// `len` values of `scale·N(0,1)` in f32.
pub fn randn_f32(rng: &mut StdRng, len: usize, scale: f32) -> Vec<f32> {
    let d = Normal::new(0f32, 1f32).unwrap();
    (0..len).map(|_| scale * d.sample(rng)).collect()
}

/// `len` values of `scale·N(0,1)`, rounded to the 16-bit type `T`.
pub fn randn_half<T: Half>(rng: &mut StdRng, len: usize, scale: f32) -> Vec<T> {
    randn_f32(rng, len, scale).into_iter().map(|v| T::round_f64(v as f64)).collect()
}

/// The `.entry` names of the PTX module the library embeds.
pub fn module_entries() -> std::collections::BTreeSet<&'static str> {
    rgk::KERNELS_PTX
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix(".visible .entry "))
        .map(|rest| rest.split(|c: char| c == '(' || c.is_whitespace()).next().unwrap_or(rest))
        .collect()
}
