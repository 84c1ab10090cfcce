//! FFTC2CFwd workloads (docs/ops.md §1 and the seed table), with cuFFT called from Rust
//! (`cufft-rs`, cudarc's `cufft` feature) as a native alternative.
use cudarc::cufft::{result as cufft_result, sys as cufft_sys, CudaFft};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use rand::rngs::StdRng;
use rand_distr::{Distribution, Normal};
use rgk::fft::{self, CopyChain, FftPlan, Precision};
use rgk::reference::{fft_c2c_fwd, fft_error, fft_error_bound};
use rgk::{Error, Gpu};

use crate::case::{Case, Tensor, Verification, Workload};

/// FP32 / FP64 non-tensor peaks of the H200 (datasheet), FLOP/s.
pub const FP32_PEAK: f64 = 67e12;
pub const FP64_PEAK: f64 = 34e12;

const NATIVE: &str = "cufft-rs";

/// The seed's ten workloads: (name, batch dims, n, precision).
const ROWS: [(&str, &[usize], usize, Precision); 10] = [
    ("latency-4k", &[], 4096, Precision::C64),
    ("throughput-4k", &[64], 4096, Precision::C64),
    ("throughput-4k", &[64], 4096, Precision::C128),
    ("longconv-16k", &[64], 16384, Precision::C64),
    ("longconv-64k", &[8], 65536, Precision::C64),
    ("spectrogram-1k", &[256], 1024, Precision::C64),
    ("fnet-512", &[4096], 512, Precision::C64),
    ("shortconv-64", &[65536], 64, Precision::C64),
    ("scientific-1m", &[4], 1 << 20, Precision::C128),
    ("spectrogram-1k-b300", &[300], 1024, Precision::C64),
];

/// The ten rows, each on the plan `FftPlan::new` ships. No variant rows: every alternative of
/// the tuning table was measured and lost (docs/decisions/fft.md); `_variants_too` is ignored.
pub fn workloads(_variants_too: bool) -> Vec<Workload> {
    ROWS.iter()
        .map(|&(name, bdims, n, prec)| {
            let batch: usize = bdims.iter().product();
            let mut dims = bdims.to_vec();
            dims.push(n);
            let c128 = prec == Precision::C128;
            Workload {
                op: "FFTC2CFwd",
                name,
                dtype: if c128 { "c128" } else { "c64" },
                shapes: format!("{dims:?}"),
                flops: 5.0 * n as f64 * (n as f64).log2() * batch as f64,
                bytes: (2 * n * batch * prec.element_bytes()) as f64,
                peak_flops: if c128 { FP64_PEAK } else { FP32_PEAK },
                prepare: Box::new(move |gpu, rng| {
                    Ok(Box::new(FftCase::new(gpu, rng, bdims, n, prec)?) as Box<dyn Case>)
                }),
            }
        })
        .collect()
}

/// Device buffers in the storage type (interleaved reals).
enum Bufs {
    C64 { x: CudaSlice<f32>, y: CudaSlice<f32>, y_native: CudaSlice<f32> },
    C128 { x: CudaSlice<f64>, y: CudaSlice<f64>, y_native: CudaSlice<f64> },
}

struct FftCase {
    dims: Vec<usize>,
    n: usize,
    batch: usize,
    prec: Precision,
    plan: FftPlan,
    /// The input as stored (f32 values widened for c64), and the f64 reference.
    x: Vec<f64>,
    reference: Vec<f64>,
    bufs: Bufs,
    cufft: Option<CudaFft>,
    /// The copy chain of the plan's bytes and passes (the floor column).
    floor: CopyChain,
}

fn cufft_err(e: cufft_result::CufftError) -> Error {
    Error::Shape { arg: "cufft", msg: format!("{e:?}") }
}

impl FftCase {
    fn new(gpu: &Gpu, rng: &mut StdRng, bdims: &[usize], n: usize, prec: Precision) -> rgk::Result<Self> {
        let batch: usize = bdims.iter().product();
        let len = 2 * n * batch;
        let st = gpu.stream();
        let (x, bufs) = match prec {
            Precision::C64 => {
                let d = Normal::new(0f32, 1f32).unwrap();
                let x32: Vec<f32> = (0..len).map(|_| d.sample(rng)).collect();
                let bufs =
                    Bufs::C64 { x: st.clone_htod(&x32)?, y: st.alloc_zeros(len)?, y_native: st.alloc_zeros(len)? };
                (x32.iter().map(|&v| v as f64).collect::<Vec<f64>>(), bufs)
            }
            Precision::C128 => {
                let d = Normal::new(0f64, 1f64).unwrap();
                let x: Vec<f64> = (0..len).map(|_| d.sample(rng)).collect();
                let bufs =
                    Bufs::C128 { x: st.clone_htod(&x)?, y: st.alloc_zeros(len)?, y_native: st.alloc_zeros(len)? };
                (x, bufs)
            }
        };
        let reference = fft_c2c_fwd(n, batch, &x);
        let plan = FftPlan::new(gpu, n, batch, prec)?;
        let floor = CopyChain::for_plan(gpu, &plan)?;
        // cuFFT's plan is made here, outside the timed calls (as ours).
        let cufft = if unsafe { cufft_sys::is_culib_present() } {
            let ty = match prec {
                Precision::C64 => cufft_sys::cufftType::CUFFT_C2C,
                Precision::C128 => cufft_sys::cufftType::CUFFT_Z2Z,
            };
            Some(CudaFft::plan_1d(n as i32, ty, batch as i32, st.clone()).map_err(cufft_err)?)
        } else {
            None
        };
        let mut dims = bdims.to_vec();
        dims.push(n);
        Ok(Self { dims, n, batch, prec, plan, x, reference, bufs, cufft, floor })
    }

    fn read(&self, gpu: &Gpu, native: bool) -> rgk::Result<Vec<f64>> {
        let st = gpu.stream();
        Ok(match &self.bufs {
            Bufs::C64 { y, y_native, .. } => {
                let v: Vec<f32> = st.clone_dtoh(if native { y_native } else { y })?;
                v.into_iter().map(|a| a as f64).collect()
            }
            Bufs::C128 { y, y_native, .. } => st.clone_dtoh(if native { y_native } else { y })?,
        })
    }

    fn poison(&mut self, gpu: &Gpu, native: bool) -> rgk::Result<()> {
        let st = gpu.stream();
        let len = 2 * self.n * self.batch;
        match &mut self.bufs {
            Bufs::C64 { y, y_native, .. } => st.memcpy_htod(&vec![f32::NAN; len], if native { y_native } else { y })?,
            Bufs::C128 { y, y_native, .. } => {
                st.memcpy_htod(&vec![f64::NAN; len], if native { y_native } else { y })?
            }
        }
        Ok(())
    }
}

impl Case for FftCase {
    fn launch(&mut self, gpu: &Gpu) -> rgk::Result<()> {
        match &mut self.bufs {
            // The interleaved real buffers (shared with cuFFT) viewed as complex, no copy.
            Bufs::C64 { x, y, .. } => self.plan.execute_c64(
                gpu,
                &fft::view_as_complex(&x.as_view()),
                &mut fft::view_as_complex_mut(&mut y.as_view_mut()),
            ),
            Bufs::C128 { x, y, .. } => self.plan.execute_c128(
                gpu,
                &fft::view_as_complex(&x.as_view()),
                &mut fft::view_as_complex_mut(&mut y.as_view_mut()),
            ),
        }
    }

    fn verify(&mut self, gpu: &Gpu) -> rgk::Result<Verification> {
        self.poison(gpu, false)?;
        self.launch(gpu)?;
        let out = self.read(gpu, false)?;
        let (rel, max_abs) = fft_error(&out, &self.reference);
        let bound = fft_error_bound(self.n, self.prec == Precision::C128);
        Ok(Verification {
            verified: rel <= bound,
            max_abs_err: max_abs,
            rel_l2_err: rel,
            detail: format!(
                "y: rel_l2 {rel:.3e} (bar {bound:.1e}), max_abs {max_abs:.3e}, bits {:016x}, {} launch(es), kernels {:?}",
                rgk::verify::digest(out.iter().copied()),
                self.plan.launches(),
                self.plan.pass_kernels()
            ),
        })
    }

    fn tensors(&self) -> Vec<(String, Tensor)> {
        let mut shape = self.dims.clone();
        shape.push(2);
        let x = match self.prec {
            Precision::C64 => Tensor::f32(&shape, &self.x.iter().map(|&v| v as f32).collect::<Vec<f32>>()),
            Precision::C128 => Tensor::f64(&shape, &self.x),
        };
        vec![("x".into(), x), ("ref.y".into(), Tensor::f64(&shape, &self.reference))]
    }

    fn params(&self) -> serde_json::Value {
        serde_json::json!({ "n": self.n, "batch": self.batch })
    }

    fn native_alternatives(&self) -> Vec<&'static str> {
        if self.cufft.is_some() {
            vec![NATIVE]
        } else {
            Vec::new()
        }
    }

    fn launch_native(&mut self, gpu: &Gpu, name: &str) -> rgk::Result<()> {
        assert_eq!(name, NATIVE, "no native alternative {name}");
        let Some(plan) = &self.cufft else {
            return Err(Error::NoDevice("libcufft was not found".into()));
        };
        let st = gpu.stream();
        let h = plan.handle();
        let fwd = -1; // CUFFT_FORWARD
                      // SAFETY: the plan was made for exactly these buffers' length; out of place.
        unsafe {
            match &mut self.bufs {
                Bufs::C64 { x, y_native, .. } => {
                    let (xp, _g1) = x.device_ptr(st);
                    let (yp, _g2) = y_native.device_ptr_mut(st);
                    cufft_result::exec_c2c(h, xp as *mut _, yp as *mut _, fwd)
                }
                Bufs::C128 { x, y_native, .. } => {
                    let (xp, _g1) = x.device_ptr(st);
                    let (yp, _g2) = y_native.device_ptr_mut(st);
                    cufft_result::exec_z2z(h, xp as *mut _, yp as *mut _, fwd)
                }
            }
        }
        .map_err(cufft_err)
    }

    fn has_floor(&self) -> bool {
        true
    }

    fn launch_floor(&mut self, gpu: &Gpu) -> rgk::Result<()> {
        // Into cuFFT's output buffer: every use of it writes all of it first.
        match &mut self.bufs {
            Bufs::C64 { x, y_native, .. } => self.floor.run(gpu, x, y_native),
            Bufs::C128 { x, y_native, .. } => self.floor.run(gpu, x, y_native),
        }
    }

    fn error_native(&mut self, gpu: &Gpu, name: &str) -> rgk::Result<(f64, f64)> {
        self.poison(gpu, true)?;
        self.launch_native(gpu, name)?;
        let out = self.read(gpu, true)?;
        Ok(fft_error(&out, &self.reference))
    }
}
